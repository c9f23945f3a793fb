package faults

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// dynamoStore is the DynamoDB emulator (internal/testenv/ddbemu), one
// table; each candidate reaches it through a proxy of its own, so that
// stalling or resetting its proxy cuts its renewals, its polls and its
// grants alike, and no one else's.
type dynamoStore struct {
	emu   *testenv.DynamoDB
	table string
}

func newDynamoStore(t testing.TB) *dynamoStore {
	// The candidates inherit the test's environment: static credentials
	// and the Region of the emulator, nothing from the host's AWS files.
	// Only leaderrun's DynamoDB backend reads them.
	for _, kv := range testenv.DynamoDBEnv("admin") {
		k, v, _ := strings.Cut(kv, "=")
		if err := os.Setenv(k, v); err != nil {
			t.Fatal(err)
		}
	}
	return &dynamoStore{emu: testenv.StartDynamoDB(t), table: fmt.Sprintf("faults_%d", time.Now().UnixNano()%1e9)}
}

func (s *dynamoStore) name() string { return "dynamodb" }

// The same timings as etcd's and PostgreSQL's; the holder renews, and
// waiters and the holder poll the lock item, every 500 ms. DynamoDB has no
// server clock: a waiter takes over a whole lease after it last saw the
// record change, on its own clock.
func (s *dynamoStore) timings() timing {
	return timing{lease: 5 * time.Second, deadline: 3 * time.Second, retry: 500 * time.Millisecond, grace: time.Second}
}

func (s *dynamoStore) candidate(t testing.TB) ([]string, []*testenv.Proxy) {
	p := testenv.NewProxy(t, s.emu.Addr())
	return []string{"--dynamodb-endpoint", "http://" + p.Addr(), "--dynamodb-table", s.table}, []*testenv.Proxy{p}
}

// restartNode is never called (the scenario excepts dynamodb): the
// emulator keeps its tables in memory, and a restart that lost them would
// prove nothing about DynamoDB, which keeps its data.
func (s *dynamoStore) restartNode(t testing.TB) {
	t.Errorf("dynamodb: the emulator cannot restart without losing its tables")
}

// killRaftLeader: the emulator is one process, DynamoDB's replication is
// out of sight.
func (s *dynamoStore) killRaftLeader(t testing.TB) bool { return false }
