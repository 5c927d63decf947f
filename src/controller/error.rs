//! The controller's errors, one variant per pipeline stage, so metrics and
//! conditions can say where a reconcile failed.

use crate::etcd::EtcdError;
use crate::workload::Error as WorkloadError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading the management cluster failed.
    #[error("observe: {context}: {source}")]
    Observe {
        context: String,
        #[source]
        source: kube::Error,
    },
    /// The workload cluster's Secrets or API could not be used.
    #[error("observe workload cluster: {0}")]
    Workload(#[from] WorkloadError),
    /// An action against the management cluster failed.
    #[error("act: {step}: {source}")]
    Act {
        step: String,
        #[source]
        source: kube::Error,
    },
    /// An etcd operation failed (the message says what is wrong).
    #[error("act: {step}: {source}")]
    Etcd {
        step: String,
        #[source]
        source: EtcdError,
    },
    /// The action needs something the world does not offer (e.g. a template).
    #[error("act: {step}: {reason}")]
    Precondition { step: String, reason: String },
    /// An etcd snapshot for `spec.etcdBackup` failed (recorded in
    /// `status.etcdBackup.lastFailure` and `EtcdBackupReady` first).
    #[error("act: etcd-snapshot: {0}")]
    Snapshot(String),
    /// A restore's snapshot could not be verified in the target (recorded in
    /// the `EtcdRestoring` condition first; nothing was deleted).
    #[error("act: etcd-restore: {0}")]
    Restore(String),
    /// Writing status or conditions failed.
    #[error("status: {context}: {source}")]
    Status {
        context: String,
        #[source]
        source: kube::Error,
    },
}

impl Error {
    /// A write lost an optimistic-concurrency race (409 Conflict): another
    /// writer (CAPI, an MHC) changed the object since we read it. Not a
    /// failure: observe again and redo the step.
    pub fn is_conflict(&self) -> bool {
        let source = match self {
            Error::Observe { source, .. }
            | Error::Act { source, .. }
            | Error::Status { source, .. } => source,
            _ => return false,
        };
        matches!(source, kube::Error::Api(s) if s.code == 409)
    }

    /// The pipeline stage, as a metric label.
    pub fn stage(&self) -> &'static str {
        match self {
            Error::Observe { .. } | Error::Workload(_) => "observe",
            Error::Act { .. } | Error::Precondition { .. } => "act",
            Error::Etcd { .. } => "etcd",
            Error::Snapshot(_) => "snapshot",
            Error::Restore(_) => "restore",
            Error::Status { .. } => "status",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
