// Package core is the lifecycle engine of sandbox-broker: acquire, release,
// sync and reconcile of sandboxes bound to (tenant, user, thread), over small
// interfaces for the sandbox provider (Provider), the state store (Store) and
// the output sink (OutputSyncer).
//
// The engine holds no state between calls: every fact lives in the Store,
// every transition is a conditional write guarded by a fencing token, and any
// invocation may die between two lines; reconcile settles what it leaves.
package core
