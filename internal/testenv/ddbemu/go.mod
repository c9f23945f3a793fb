module github.com/leaderrun/leaderrun/internal/testenv/ddbemu

go 1.26.7

require github.com/truora/minidyn v0.8.2

require (
	github.com/aws/aws-sdk-go-v2 v1.36.3 // indirect
	github.com/aws/aws-sdk-go-v2/service/dynamodb v1.43.1 // indirect
	github.com/aws/smithy-go v1.22.3 // indirect
)
