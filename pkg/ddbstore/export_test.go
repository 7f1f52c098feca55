package ddbstore

// ShardOf and HomeBucket expose shardOf and homeBucket to the tests.
var (
	ShardOf    = shardOf
	HomeBucket = homeBucket
)
