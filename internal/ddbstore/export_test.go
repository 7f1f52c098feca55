package ddbstore

import "context"

// ShardOf, ThreadHome, OwnerShard, QueueShardOf and ItemPK expose
// shardOf, threadHome, ownerShard, queueShardOf and itemPK to the tests.
var (
	ItemPK       = itemPK
	ShardOf      = shardOf
	ThreadHome   = threadHome
	OwnerShard   = ownerShard
	QueueShardOf = queueShardOf
)

// PausedPK is the key of paused-slot bucket b of deployment.
func PausedPK(deployment string, b int) string {
	return (&Store{deployment: deployment}).bucketPK(pausedSlots, b)
}

// SampleShards is sampleShards.
const SampleShards = sampleShards

// RecordScanSegments is recordScanSegments.
const RecordScanSegments = recordScanSegments

// SetQueueScan makes s's reads of the wait queue's head return n tickets
// (and a read of the whole queue, at most n).
func SetQueueScan(s *Store, n int) {
	if n < 1 {
		panic("SetQueueScan: a read returns at least one ticket")
	}
	s.scan = n
}

// SetSweepSegments makes s's counter repair sweep the table in n parts.
func SetSweepSegments(s *Store, n int32) {
	if n < 1 {
		panic("SetSweepSegments: at least one part")
	}
	s.sweep = n
}

// SlotStates is how many states hold slots (slotStates).
var SlotStates = len(slotStates)

// QueueShards is queueShards, for the tests that find the queue's tickets.
const QueueShards = queueShards

// PausedUsed reads the number of paused slots held (strongly consistent).
func (s *Store) PausedUsed(ctx context.Context) (int, error) {
	buckets, err := s.readLedger(ctx, pausedSlots, 0, true)
	used, _ := usedSum(buckets)
	return used, err
}

// capacityPK is the key of running-slot bucket 0 of deployment.
func capacityPK(deployment string) string { return "CAP#" + deployment }
