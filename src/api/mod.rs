//! Our CRDs (`KThreesControlPlane`, `KThreesControlPlaneTemplate`), the bootstrap
//! and Cluster API types we create or read, condition helpers, contract names,
//! and the validator that repeats the CRD's CEL rules on every reconcile.

pub mod bootstrap;
pub mod cel;
pub mod cluster;
pub mod condition_names;
pub mod conditions;
pub mod contract;
pub mod conversion;
pub mod crds;
pub mod etcd_backup;
pub mod kcp;
pub mod machine;
pub mod machine_naming;
pub mod mhc;
pub mod names;
pub mod refs;
pub mod remediation_data;
pub mod template;
pub mod time;
pub mod v1beta1;
pub mod v1beta2;
pub mod validate;

pub use bootstrap::{KThreesConfig, KThreesConfigSpec, KThreesConfigTemplate};
pub use cluster::Cluster;
pub use kcp::{KThreesControlPlane, KThreesControlPlaneSpec, KThreesControlPlaneStatus};
pub use machine::Machine;
pub use mhc::MachineHealthCheck;
pub use remediation_data::RemediationData;
pub use template::KThreesControlPlaneTemplate;
pub use validate::{
    ValidationError, ValidationErrors, check_version_change, validate_kcp, validate_kcp_update,
};
