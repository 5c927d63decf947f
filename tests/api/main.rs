//! Our API and what serves it: round trips of our types, the generated CRDs
//! (current, their CEL cost), the validator against CEL and a real API server
//! where one is given, the conversion webhook and the test API server's
//! conversion and TLS, the clusterctl components, workload-cluster access
//! built from Secrets and Nodes, and Cluster API's real Machine controller
//! where one is given. One test binary, one module per former test file (as
//! tests/conformance.rs), so the crate is linked once for all of them.
//!
//! Run one area with a name filter, e.g. `cargo test --test api -- validate::`.

#[path = "../docker_support/mod.rs"]
mod docker_support;

/// Taken, for their whole run, by the tests that change what a real API
/// server serves (they skip without one): validate's `api_server_*` (our
/// CRD applied), webhook's `api_server_converts_through_the_webhook` (the
/// CRD's conversion webhook pointed at the test's own address, then back)
/// and real_capi's scenarios (our CRDs installed; each also runs a real etcd
/// cluster, and the machines have 2 cores). As separate test binaries they
/// never overlapped; in one process, one's CRD apply would undo another's
/// webhook address.
static REAL_API_SERVER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

mod apiserver_conversion;
mod apiserver_tls;
mod components;
mod crd_cost;
mod crds;
mod real_capi;
mod types;
mod validate;
mod webhook;
mod workload;
