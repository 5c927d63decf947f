//! k3s-control-plane: a Cluster API control-plane provider for k3s that keeps the
//! workload cluster's embedded etcd safe while it replaces or removes
//! control-plane machines.
//!
//! Layout (one concept per module):
//! - [`backup`]: etcd snapshots into S3 or a directory: names, retention, verification.
//! - [`etcd`]: mutual-TLS connections to each member, membership snapshot, operations.
//! - [`membership`]: pure mapping of etcd members to Machines and Nodes.
//! - [`quorum`]: pure safety arithmetic on the real membership.
//! - [`space_rule`]: pure rule on etcd's backend space (defragment, compact, disarm NOSPACE).
//! - [`api`]: our CRDs, the CAPI and bootstrap types we read and write, validation.
//! - [`workload`]: access to a workload cluster (kubeconfig and etcd CA Secrets, Nodes).
//! - [`pki`]: pure generation of the cluster Secrets (CAs, join token, admin kubeconfig).
//! - [`remediation`]: the pure decision (which machine, which rule) and its steps.
//! - [`lifecycle`]: pure lifecycle decisions (teardown, pause, cluster Secrets, mixed management).
//! - [`rollout`]: pure rollout rules (which Machines are outdated and why, the next rollout step).
//! - [`components`]: the clusterctl provider artifacts (components YAML, metadata), generated.
//! - [`controller`]: kube-runtime wiring, status, conditions, events, metrics.
//! - `h2_connection` (crate-private): one HTTP/2 connection over verified TLS
//!   with no request queue, for etcd members and the workload Node reads.
//! - [`yaml`]: YAML in and out with one set of options (any module may use it).
//! - `apiserver`: an in-process Kubernetes API server for tests and the demo.
//! - `harness`: local real-etcd clusters with a k3s-like PKI (tests and demo).
//!
//! The last two (and the `demo` command) exist only with the `sandbox`
//! feature, on by default; the shipped controller is built without it.

pub mod api;
#[cfg(feature = "sandbox")]
pub mod apiserver;
pub mod backup;
pub mod cli;
pub mod components;
pub mod controller;
pub mod decision;
pub mod etcd;
pub(crate) mod h2_connection;
#[cfg(feature = "sandbox")]
pub mod harness;
pub mod lifecycle;
pub mod membership;
pub mod pki;
pub mod quorum;
pub mod remediation;
pub mod rollout;
pub mod space_rule;
pub mod webhook;
pub mod workload;
pub mod yaml;

/// Install ring as the process-wide rustls provider. Every TLS user in this
/// binary (kube, etcd-client, our own config) must agree on one provider, and
/// rustls panics at run time when it cannot pick one. Safe to call repeatedly.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
