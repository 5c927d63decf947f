//! Access to a workload cluster from the management cluster: a `kube::Client`
//! built from the `<cluster>-kubeconfig` Secret, the etcd CA from the
//! `<cluster>-etcd` Secret (absent = no etcd access: the membership is unknown), the control-plane Nodes
//! with their k3s etcd annotations, and how each etcd member is reached.
//!
//! A kubeconfig is used only after its trust policy ([`trust`]): no credential
//! plugins, no files read from the controller's disk, TLS verification on.
//!
//! Parsing is pure and works on Secret and Node objects, so it is unit-tested
//! without an API server; [`cache::WorkloadCache`] keeps one client per cluster
//! and rebuilds it only when a Secret's uid or resourceVersion changes.

pub mod cache;
pub mod client;
pub mod error;
pub mod nodes;
pub mod portforward;
pub mod reads;
pub mod secrets;
pub mod serving_probe;
pub mod trust;

pub use cache::{ClusterKey, ClusterSecrets, WorkloadAccess, WorkloadCache};
pub use error::Error;
pub use nodes::ControlPlaneNode;
pub use reads::WorkloadReads;
pub use secrets::{EtcdAccess, EtcdCa};
