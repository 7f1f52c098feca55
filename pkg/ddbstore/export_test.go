package ddbstore

// ShardOf, HomeBucket and OwnerShard expose shardOf, homeBucket and
// ownerShard to the tests.
var (
	ShardOf    = shardOf
	HomeBucket = homeBucket
	OwnerShard = ownerShard
)
