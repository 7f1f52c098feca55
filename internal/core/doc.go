// Package core is the lifecycle engine of sandbox-broker: acquire, release,
// sync and reconcile of sandboxes bound to (tenant, user, thread), over small
// interfaces for the sandbox provider (Provider), the state store (Store) and
// the output sink (OutputSyncer).
//
// The engine holds no state between calls: every fact lives in the Store,
// every transition is a conditional write guarded by a fencing token, and any
// invocation may die between two lines; reconcile settles what it leaves.
//
// Invariants the engine keeps under any interleaving of invocations (the
// tests name them by number):
//
//  1. No more sandboxes hold running slots than the limit, nor paused
//     slots than the paused limit (pause.go).
//  2. A thread is handed at most one live sandbox; a duplicate is found by
//     reconcile and killed after a grace period.
//  3. A sandbox is killed only by the invocation holding its destroy claim.
//  4. A kill whose outcome is uncertain keeps the sandbox's slot (a
//     tombstone) until the kill is confirmed.
//  5. A create whose outcome is uncertain keeps its reservation (reconcile
//     settles it from the token in the sandbox's metadata); a certain
//     failure frees it.
//
// and (pause.go) a paused sandbox is never handed out before it was
// resumed, and an acquired one is never paused.
package core
