//! Test support that runs real things locally, and stands in for what a
//! management cluster would run: etcd clusters on loopback with a k3s-like PKI
//! and member names, and what CAPI's Machine controller does on deletion.
//! Lives in `src/` (not `tests/`) because the demo uses it too.

pub mod bringup;
pub mod capi_sim;
pub mod defrag_sampler;
pub mod etcd;
pub mod etcd_binary;
pub mod infra_sim;
pub mod k3s_agent;
pub mod k3s_supervisor;
pub mod our_crds;
pub mod pki;
pub mod restore;
pub mod restore_record;
pub mod rollout;
pub mod s3;
pub mod sandbox;
pub mod topology_sim;

pub use etcd::{EtcdTestCluster, EtcdTestClusterBuilder, HarnessError, TestMember};
pub use pki::{CertPair, TestCa, TestPki};
