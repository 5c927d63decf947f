//! Test support that runs real things locally: etcd clusters on loopback with a
//! k3s-like PKI and member names. Lives in `src/` (not `tests/`) because the
//! demo uses it too.

pub mod etcd;
pub mod pki;

pub use etcd::{EtcdTestCluster, EtcdTestClusterBuilder, HarnessError, TestMember};
pub use pki::{CertPair, TestCa, TestPki};
