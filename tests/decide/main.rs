//! The cheap tests, without etcd: the decisions (remediation, scale-down,
//! the resumable removal's steps, rollout, etcd space) as table tests, the
//! layering rule checked on the source, and the watch filter on an in-process
//! management API server. One test binary, one module per former test file
//! (as tests/conformance.rs), so the crate is linked once for all of them.
//!
//! Run one area with a name filter, e.g. `cargo test --test decide -- rollout::`.

mod etcd_space;
mod layering;
mod remediation;
mod remediation_scale_down;
mod remediation_steps;
mod rollout;
mod watch_filter;
