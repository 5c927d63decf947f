//! The end-to-end tests: the real controller against real etcd and test API
//! servers (the sandbox, the simulated infrastructure and k3s). One test
//! binary, one module per area (as tests/conformance.rs), so the crate is
//! linked once for all of them; `support` holds their shared helpers.
//!
//! Run one area with a name filter, e.g. `cargo test --test e2e -- remediation::`.
//! tests/e2e_logs.rs stays a binary of its own: it installs the process-wide
//! tracing subscriber and asserts that nothing in the process logs an ERROR,
//! which the deliberate faults of the tests here would break.

mod support;

mod backup;
mod caches;
mod certificates;
mod controller_reconcile;
mod deletion;
mod faults;
mod k3s;
mod lifecycle;
mod membership;
mod migration;
mod portforward;
mod rbac;
mod remediation;
mod restore;
mod resume;
mod rollout;
mod shards;
mod space_care;
mod sync;
mod topology;
