package ddbstore

// ShardOf, HomeBucket, OwnerShard, QueueShardOf and PausedPK expose
// shardOf, homeBucket, ownerShard, queueShardOf and pausedPK to the tests.
var (
	ShardOf      = shardOf
	HomeBucket   = homeBucket
	OwnerShard   = ownerShard
	QueueShardOf = queueShardOf
	PausedPK     = pausedPK
)

// QueueShards is queueShards.
const QueueShards = queueShards
