package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// ddbTimings: the fault suite's DynamoDB settings (faults/dynamodb_test.go).
var ddbTimings = timings{lease: 5 * time.Second, deadline: 3 * time.Second, retry: 500 * time.Millisecond, grace: time.Second}

// ddbTable is the benchmark's lock table, created before anything is timed.
const ddbTable = "bench_locks"

// lrDynamo is leaderrun on the DynamoDB emulator, with static credentials
// and nothing read from the host's AWS files.
var lrDynamo = func() *tool {
	tl := leaderrunOn("lrd", "leaderrun (DynamoDB)", "dynamodb", func(addr string) []string {
		return []string{"--dynamodb-endpoint", addr, "--dynamodb-table", ddbTable}
	}, ddbTimings)
	tl.env = testenv.DynamoDBEnv("admin")
	return tl
}()

// ddbStore is the DynamoDB emulator (internal/testenv/ddbemu: minidyn, in
// memory, over HTTP on loopback). Its column has the start-to-child and
// memory figures only: an emulator's latencies and request costs say
// nothing of DynamoDB's, and DynamoDB shows no candidates and sends no
// wake-ups (waiters poll).
type ddbStore struct{ emu *testenv.DynamoDB }

func (s *ddbStore) start(b *bench) {
	s.emu = testenv.StartDynamoDB(b.t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := s.emu.Client().CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            aws.String(ddbTable),
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("name"), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("name"), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	})
	if err != nil {
		b.t.Fatalf("create the benchmark's DynamoDB table: %v", err)
	}
}

func (s *ddbStore) addr(*tool) string { return s.emu.URL }
func (s *ddbStore) prepare(string)    {}
func (s *ddbStore) candidates(*tool, string, string, []*proc) (int, error) {
	return 0, fmt.Errorf("dynamodb: not measured")
}
func (s *ddbStore) drop(*tool, string, string) (time.Duration, error) {
	return 0, fmt.Errorf("dynamodb: not measured")
}
func (s *ddbStore) dropText() string          { return "" }
func (s *ddbStore) meter(*bench, *tool) meter { return nil }
