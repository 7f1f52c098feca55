package ddbstore

// ShardOf, HomeBucket, OwnerShard and QueueShardOf expose shardOf,
// homeBucket, ownerShard and queueShardOf to the tests.
var (
	ShardOf      = shardOf
	HomeBucket   = homeBucket
	OwnerShard   = ownerShard
	QueueShardOf = queueShardOf
)

// QueueShards is queueShards.
const QueueShards = queueShards
