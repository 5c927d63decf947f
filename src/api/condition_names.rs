//! The conditions we write: each condition's type, and, in a module named
//! after it, every reason it can give. Types and reasons are API: readers
//! (CAPI, clusterctl, alerts, people) match on them, so none changes.
//!
//! The rule that computes each condition lives in
//! [`crate::decision::conditions`], in a function of the same name.

// On the KThreesControlPlane: the CAPI v1beta2 control-plane contract.
pub const AVAILABLE: &str = "Available";
pub const INITIALIZED: &str = "Initialized";
pub const CERTIFICATES_AVAILABLE: &str = "CertificatesAvailable";
pub const MACHINES_READY: &str = "MachinesReady";
pub const MACHINES_UP_TO_DATE: &str = "MachinesUpToDate";
pub const SCALING_UP: &str = "ScalingUp";
pub const SCALING_DOWN: &str = "ScalingDown";
pub const DELETING: &str = "Deleting";
pub const PAUSED: &str = "Paused";
pub const ROLLING_OUT: &str = "RollingOut";

// On the KThreesControlPlane: ours.
pub const ETCD_CLUSTER_HEALTHY: &str = "EtcdClusterHealthy";
/// With `run --etcd-space-care`: whether etcd has room (False while NOSPACE
/// is raised), and what the space rule does or why it cannot.
pub const ETCD_SPACE_HEALTHY: &str = "EtcdSpaceHealthy";
pub const SPEC_VALID: &str = "SpecValid";
/// The KThreesControlPlane condition summarising remediation.
pub const REMEDIATING: &str = "Remediating";
/// Whether any Machine's certificates expire within the window:
/// `rollout.before.certificatesExpiryDays`, else 30 days.
pub const CERTIFICATES_EXPIRING: &str = "CertificatesExpiring";
/// `EtcdBackupReady`: whether the snapshots `spec.etcdBackup` asks for are
/// being taken (absent without a target).
pub const ETCD_BACKUP_READY: &str = "EtcdBackupReady";
/// The condition of a restore: True while one is under way, False once done
/// or refused; absent while none was ever asked for.
pub const ETCD_RESTORING: &str = "EtcdRestoring";

// On each control-plane Machine.
pub const ETCD_MEMBER_HEALTHY: &str = "EtcdMemberHealthy";
/// Made from the current spec (CAPI v1beta2: the owner of a Machine reports it).
pub const UP_TO_DATE: &str = "UpToDate";
/// CAPI's, set by the owner of a Machine a MachineHealthCheck marked.
pub use super::names::OWNER_REMEDIATED_CONDITION as OWNER_REMEDIATED;

pub mod available {
    pub const REASON_AVAILABLE: &str = "Available";
    pub const REASON_NOT_AVAILABLE: &str = "NotAvailable";
    /// etcd was not read: whether it has quorum is not known.
    pub const REASON_AVAILABLE_UNKNOWN: &str = "AvailableUnknown";
}

pub mod initialized {
    pub const REASON_INITIALIZED: &str = "Initialized";
    pub const REASON_NOT_INITIALIZED: &str = "NotInitialized";
}

pub mod certificates_available {
    pub const REASON_AVAILABLE: &str = "Available";
    /// A Secret exists but cannot be used.
    pub const REASON_CERTIFICATES_UNUSABLE: &str = "CertificatesUnusable";
    pub const REASON_WAITING_FOR_CLUSTER: &str = "WaitingForCluster";
    pub const REASON_NOT_AVAILABLE: &str = "NotAvailable";
}

pub mod machines_ready {
    pub const REASON_READY: &str = "Ready";
    pub const REASON_NOT_READY: &str = "NotReady";
    pub const REASON_NO_REPLICAS: &str = "NoReplicas";
}

pub mod machines_up_to_date {
    pub const REASON_UP_TO_DATE: &str = "UpToDate";
    pub const REASON_NOT_UP_TO_DATE: &str = "NotUpToDate";
}

pub mod scaling_up {
    pub const REASON_SCALING_UP: &str = "ScalingUp";
    pub const REASON_NOT_SCALING_UP: &str = "NotScalingUp";
}

pub mod scaling_down {
    pub const REASON_SCALING_DOWN: &str = "ScalingDown";
    pub const REASON_NOT_SCALING_DOWN: &str = "NotScalingDown";
}

pub mod deleting {
    pub const REASON_WAITING_FOR_WORKERS_DELETION: &str = "WaitingForWorkersDeletion";
    pub const REASON_WAITING_FOR_MACHINE_DELETION: &str = "WaitingForMachineDeletion";
    pub const REASON_DELETION_COMPLETED: &str = "DeletionCompleted";
    pub const REASON_NOT_DELETING: &str = "NotDeleting";
}

pub mod paused {
    pub const REASON_PAUSED: &str = "Paused";
    pub const REASON_NOT_PAUSED: &str = "NotPaused";
}

pub mod rolling_out {
    pub const REASON_ROLLING_OUT: &str = "RollingOut";
    pub const REASON_NOT_ROLLING_OUT: &str = "NotRollingOut";
}

pub mod etcd_cluster_healthy {
    pub const REASON_HEALTHY: &str = "Healthy";
    pub const REASON_UNHEALTHY: &str = "Unhealthy";
    /// An external datastore and no Node showing embedded etcd.
    pub const REASON_ETCD_NOT_MANAGED: &str = "EtcdNotManaged";
    pub const REASON_ETCD_CREDENTIALS_UNAVAILABLE: &str = "EtcdCredentialsUnavailable";
    pub const REASON_ETCD_UNREACHABLE: &str = "EtcdUnreachable";
}

pub mod etcd_space_healthy {
    pub const REASON_HEALTHY: &str = "Healthy";
    /// A routine defragmentation (or its compaction) runs.
    pub const REASON_DEFRAGMENTING: &str = "Defragmenting";
    /// A routine defragmentation waits for a membership change to end.
    pub const REASON_DEFRAGMENTATION_WAITING: &str = "DefragmentationWaiting";
    pub const REASON_DEFRAGMENTATION_BLOCKED: &str = "DefragmentationBlocked";
    /// NOSPACE is raised and the space rule acts on it.
    pub const REASON_RECOVERING_FROM_NO_SPACE: &str = "RecoveringFromNoSpace";
    /// NOSPACE is raised and the space rule cannot act.
    pub const REASON_NO_SPACE: &str = "NoSpace";
    pub const REASON_ETCD_NOT_READ: &str = "EtcdNotRead";
}

pub mod spec_valid {
    pub const REASON_VALID: &str = "Valid";
    pub const REASON_INVALID_SPEC: &str = "InvalidSpec";
}

pub mod remediating {
    pub const REASON_REMEDIATING: &str = "Remediating";
    pub const REASON_NOT_REMEDIATING: &str = "NotRemediating";
    /// The picked Machine waits: the plan's rule says for what.
    pub const REASON_REMEDIATION_BLOCKED: &str = "RemediationBlocked";
    /// No plan could be made (a refusal, mixed management, an unusable Secret).
    pub const REASON_CANNOT_DECIDE: &str = "CannotDecide";
}

/// `OwnerRemediated` reasons (CAPI v1beta2 names).
pub mod owner_remediated {
    pub const REASON_CANNOT_BE_REMEDIATED: &str = "CannotBeRemediated";
    pub const REASON_REMEDIATION_DEFERRED: &str = "RemediationDeferred";
    pub const REASON_INTERNAL_ERROR: &str = "InternalError";
    /// Set once the Machine has been deleted for remediation (v1beta2, CAPI >= 1.11).
    pub const REASON_MACHINE_DELETING: &str = "MachineDeleting";
    /// The v1beta1 reason for the same state.
    pub const REASON_REMEDIATION_IN_PROGRESS: &str = "RemediationInProgress";
}

pub mod certificates_expiring {
    pub const REASON_EXPIRING_SOON: &str = "ExpiringSoon";
    /// No Machine's certificates expire soon, but a cluster CA does.
    pub const REASON_CA_EXPIRING_SOON: &str = "CAExpiringSoon";
    pub const REASON_NOT_EXPIRING: &str = "NotExpiring";
}

pub mod etcd_member_healthy {
    pub const REASON_HEALTHY: &str = "Healthy";
    pub const REASON_UNHEALTHY: &str = "Unhealthy";
    /// Its Node shows embedded etcd, no member maps to it, past the grace period.
    pub const REASON_ETCD_MEMBER_MISSING: &str = "EtcdMemberMissing";
    /// The same within the grace period (a restarting server rejoins).
    pub const REASON_WAITING_FOR_ETCD_MEMBER: &str = "WaitingForEtcdMember";
    /// No member and no sign of embedded etcd.
    pub const REASON_NO_ETCD_MEMBER: &str = "NoEtcdMember";
}

pub mod up_to_date {
    pub const REASON_UP_TO_DATE: &str = "UpToDate";
    pub const REASON_NOT_UP_TO_DATE: &str = "NotUpToDate";
}

pub mod etcd_backup_ready {
    pub const REASON_READY: &str = "Ready";
    pub const REASON_SNAPSHOT_FAILED: &str = "SnapshotFailed";
    pub const REASON_SCHEDULE_LATE: &str = "ScheduleLate";
    pub const REASON_INVALID_SCHEDULE: &str = "InvalidSchedule";
}

pub mod etcd_restoring {
    pub const REASON_VERIFYING_SNAPSHOT: &str = "VerifyingSnapshot";
    pub const REASON_RETIRING_MACHINES: &str = "RetiringMachines";
    pub const REASON_RESTORING_SNAPSHOT: &str = "RestoringSnapshot";
    pub const REASON_RESTORE_REFUSED: &str = "RestoreRefused";
    pub const REASON_SNAPSHOT_UNUSABLE: &str = "SnapshotUnusable";
    pub const REASON_RESTORED: &str = "Restored";
}
