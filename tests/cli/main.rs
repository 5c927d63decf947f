//! The built binary as a user and an operator run it: the `demo`, `etcd`
//! (with the space operations on real etcd clusters) and `inspect` commands,
//! `run` as a process (its probes and metrics, leader election between
//! replicas), the shipped controller image, a real k3s container (where a
//! Docker engine answers) and the Grafana dashboard against the exported
//! metrics. One test binary, one module per former test file (as
//! tests/conformance.rs), so the crate is linked once for all of them.
//!
//! Run one area with a name filter, e.g. `cargo test --test cli -- etcd_space::`
//! (.ci/run runs `etcd_space::` again on etcd 3.4).

#[path = "../docker_support/mod.rs"]
mod docker_support;

mod controller_image;
mod dashboard;
mod demo;
mod etcd;
mod etcd_space;
mod inspect;
mod k3s_container;
mod leader_election;
mod run;
