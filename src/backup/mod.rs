//! Backups of etcd: a snapshot streamed from one member into a target,
//! verified on the way and read back, named as k3s names its own, and pruned
//! by a retention rule that never touches what is not ours.
//!
//! - [`name`]: `<prefix>-<node>-<unix seconds>`, a prefix per reason (pure).
//! - [`retention`]: which of ours to prune, and why (pure).
//! - etcd's trailing SHA-256, checked as the bytes pass, is
//!   [`crate::etcd::snapshot_verify`] (the etcd floor streams through it).
//! - [`target`]: S3-compatible storage or a directory, one interface.
//! - [`engine`]: save, prune, verify a stored snapshot.
//! - [`restore_boot`]: what the Machine that restores a snapshot runs (pure).
//! - [`error`]: what can go wrong ([`BackupError`]).
//!
//! The etcd side (streaming `Maintenance.Snapshot` from one chosen member,
//! refused unless it is a healthy voter) is [`crate::etcd::save`].

pub mod engine;
pub mod error;
pub mod name;
pub mod restore_boot;
pub mod retention;
pub mod target;

pub use crate::etcd::snapshot_verify::{StreamVerifier, Verified, VerifyError};
pub use engine::{Pruned, Saved, prune, save, verify_stored};
pub use error::BackupError;
pub use name::{Prefix, SnapshotName, SnapshotReason};
pub use retention::{Prune, PruneReason, Retention, StoredSnapshot, to_prune};
pub use target::{FieldNames, S3Config, Target, TargetConfig, Upload};
