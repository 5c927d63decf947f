//! The tests on real etcd clusters (the harness's loopback members, and
//! containers where a Docker engine answers): the etcd engine (membership,
//! leadership moves, removals, learners), its TLS, a partitioned containerised
//! world, the backup engine (with a real S3 server) and the simulated k3s
//! restore. One test binary, one module per former test file (as
//! tests/conformance.rs), so the crate is linked once for all of them; at most
//! `harness::etcd::MAX_CLUSTERS_PER_PROCESS` clusters run at once in it.
//!
//! Run one area with a name filter, e.g. `cargo test --test etcd -- membership::`
//! (.ci/run runs `membership::` and `tls::` again on etcd 3.4).

#[path = "../docker_support/mod.rs"]
mod docker_support;

mod backup;
mod containers;
mod k3s_restore;
mod membership;
mod tls;
