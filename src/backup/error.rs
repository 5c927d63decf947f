//! What can go wrong backing etcd up, naming the field or object at fault
//! and never a credential.

use std::time::Duration;

use crate::etcd::EtcdError;
use crate::etcd::snapshot_verify::VerifyError;

#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// A setting that cannot work, found before anything was reached.
    #[error("{field}: {reason}")]
    Config { field: &'static str, reason: String },

    #[error("{field}: bucket {bucket:?} does not exist at endpoint {endpoint}")]
    BucketNotFound {
        field: &'static str,
        bucket: String,
        endpoint: String,
    },

    /// The endpoint refused the credentials (unknown key, bad signature,
    /// no permission). Only the S3 error code and message are kept.
    #[error("{field}: the credentials were refused by {target}: {detail}")]
    Credentials {
        field: &'static str,
        target: String,
        detail: String,
    },

    #[error("{field}: the endpoint {endpoint} cannot be reached: {detail}")]
    Unreachable {
        field: &'static str,
        endpoint: String,
        detail: String,
    },

    #[error("{field}: the certificate of {endpoint} is not trusted: {detail}")]
    Tls {
        field: &'static str,
        endpoint: String,
        detail: String,
    },

    #[error("{object} not found on {target}")]
    NotFound { target: String, object: String },

    #[error("{object} already exists on {target}; not overwritten")]
    AlreadyExists { target: String, object: String },

    #[error("{op} on {target} failed{}: {detail}", object.as_ref().map(|o| format!(" for {o}")).unwrap_or_default())]
    Target {
        target: String,
        op: &'static str,
        object: Option<String>,
        detail: String,
    },

    /// The bytes are not a whole etcd snapshot (as streamed from etcd, or as
    /// read back from the target).
    #[error("{object}: {source}")]
    Invalid {
        object: String,
        #[source]
        source: VerifyError,
    },

    #[error("{object}: {stored} bytes stored, but {streamed} were streamed")]
    SizeMismatch {
        object: String,
        streamed: u64,
        stored: u64,
    },

    #[error("{what} did not finish within {after:?}")]
    TimedOut { what: String, after: Duration },

    #[error(transparent)]
    Etcd(#[from] EtcdError),
}
