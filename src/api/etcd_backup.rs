//! `spec.etcdBackup` and `status.etcdBackup`: etcd snapshots this controller
//! takes before every member removal it starts or finishes, and on a
//! schedule, into a target named here. Our addition (no control-plane
//! provider has it); the names of the S3 settings follow k3s's
//! `--etcd-s3-*` flags so that a person can point k3s's own restore at the
//! same place (docs/k3s.md "Snapshots").

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// k3s's default retention (`--etcd-snapshot-retention`).
pub const DEFAULT_RETENTION_COUNT: i32 = 5;

/// How long one snapshot may take before it counts as failed.
pub const DEFAULT_SNAPSHOT_TIMEOUT_SECONDS: i64 = 300;

/// A 5-field cron expression (minute hour day-of-month month day-of-week),
/// checked for its shape here and in CEL; the fields themselves are parsed
/// when the schedule is evaluated.
pub const CRON_SHAPE_PATTERN: &str = r"^\s*\S+(\s+\S+){4}\s*$";

/// The keys of the credentials Secret: the environment variables k3s reads
/// its S3 keys from, so one Secret can serve both.
pub const ACCESS_KEY_ID_KEY: &str = "AWS_ACCESS_KEY_ID";
pub const SECRET_ACCESS_KEY_KEY: &str = "AWS_SECRET_ACCESS_KEY";
pub const SESSION_TOKEN_KEY: &str = "AWS_SESSION_TOKEN";

/// `spec.etcdBackup`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdBackup {
    /// Where snapshots go: exactly one of `s3` and `filesystem`.
    // Required, with no schema default: a real API server checks a default
    // against the node's CEL rules, and `{}` breaks the rule below (the CRD
    // was refused on kube-apiserver v1.34.9).
    #[x_kube(validation = kube::core::Rule::new("has(self.s3) != has(self.filesystem)").message("spec.etcdBackup.target: exactly one of s3 and filesystem"))]
    pub target: BackupTarget,
    /// When to take scheduled snapshots: 5-field cron, in UTC (k3s's
    /// `--etcd-snapshot-schedule-cron` format, e.g. `0 */12 * * *`). Unset:
    /// snapshots are taken only before member removals.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    #[x_kube(validation = kube::core::Rule::new(format!("self.matches({})", super::cel::cel_string(CRON_SHAPE_PATTERN))).message("spec.etcdBackup.schedule: must be a 5-field cron expression"))]
    pub schedule: Option<String>,
    /// Which of this controller's snapshots are kept.
    #[serde(default, skip_serializing_if = "BackupRetention::is_empty")]
    pub retention: BackupRetention,
    /// Seconds one snapshot may take (default 300); a removal waiting for
    /// its snapshot reports the target as failing after this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self >= 1").message("spec.etcdBackup.snapshotTimeoutSeconds: must be at least 1"))]
    pub snapshot_timeout_seconds: Option<i64>,
}

impl EtcdBackup {
    pub fn retention_count(&self) -> u32 {
        self.retention
            .count
            .unwrap_or(DEFAULT_RETENTION_COUNT)
            .max(1) as u32
    }

    pub fn snapshot_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(
            self.snapshot_timeout_seconds
                .unwrap_or(DEFAULT_SNAPSHOT_TIMEOUT_SECONDS)
                .max(1) as u64,
        )
    }
}

/// `spec.etcdBackup.target`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupTarget {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self.endpoint != '' && self.bucket != ''").message("spec.etcdBackup.target.s3: endpoint and bucket are required"))]
    pub s3: Option<S3BackupTarget>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self.path.startsWith('/')").message("spec.etcdBackup.target.filesystem.path: must be an absolute path"))]
    pub filesystem: Option<FilesystemBackupTarget>,
}

/// `spec.etcdBackup.target.s3`: S3-compatible object storage, as k3s's
/// `--etcd-s3-*` flags describe it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct S3BackupTarget {
    /// `host[:port]`, without scheme (k3s `--etcd-s3-endpoint`).
    #[serde(default)]
    #[schemars(length(max = 253))]
    pub endpoint: String,
    #[serde(default)]
    #[schemars(length(max = 63))]
    pub bucket: String,
    /// Folder (key prefix) in the bucket; each cluster's snapshots go under
    /// `<folder>/<namespace>/<cluster>/` (what k3s's `--etcd-s3-folder` then
    /// takes to restore one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub folder: Option<String>,
    /// k3s `--etcd-s3-region`; default `us-east-1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub region: Option<String>,
    /// Plain HTTP (k3s `--etcd-s3-insecure`). TLS is otherwise always
    /// verified: there is no skip-verify; give the endpoint's CA instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub insecure: Option<bool>,
    /// A Secret in this namespace with `AWS_ACCESS_KEY_ID` and
    /// `AWS_SECRET_ACCESS_KEY` (and optionally `AWS_SESSION_TOKEN`): the
    /// names k3s reads its S3 keys from. Required for an S3 target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret: Option<SecretName>,
    /// The endpoint's CA bundle (PEM), from a Secret key in this namespace.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "endpointCASecret"
    )]
    pub endpoint_ca_secret: Option<SecretKey>,
}

/// `spec.etcdBackup.target.filesystem`: a directory of the controller's
/// own (a mounted volume); each cluster's snapshots go under
/// `<path>/<namespace>/<cluster>/`. A restore needs the file on a server, so such
/// snapshots restore only where a person copies them.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct FilesystemBackupTarget {
    #[serde(default)]
    #[schemars(length(max = 4096))]
    pub path: String,
}

/// A Secret of the control plane's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretName {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// One key of a Secret of the control plane's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKey {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// `spec.etcdBackup.retention`: of this controller's snapshots of the
/// cluster (never k3s's own), keep the newest `count` (default 5) and none
/// older than `maxAgeSeconds`; the newest is never pruned.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupRetention {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self >= 1").message("spec.etcdBackup.retention.count: must be at least 1"))]
    pub count: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self >= 60").message("spec.etcdBackup.retention.maxAgeSeconds: must be at least 60"))]
    pub max_age_seconds: Option<i64>,
}

impl BackupRetention {
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// Why a snapshot was taken.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, schemars::JsonSchema,
)]
pub enum SnapshotPurpose {
    /// Before a member removal (remediation, scale-down, rollout, orphan,
    /// a deletion someone else started).
    BeforeRemoval,
    Scheduled,
}

/// `status.etcdBackup`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdBackupStatus {
    /// The newest verified snapshot of each purpose.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4))]
    pub last_snapshots: Vec<SnapshotRecord>,
    /// The last failed snapshot, while no later one succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<SnapshotFailure>,
    /// The last restore of the control plane from a snapshot, once done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_restore: Option<RestoreRecord>,
}

impl EtcdBackupStatus {
    pub fn last(&self, purpose: SnapshotPurpose) -> Option<&SnapshotRecord> {
        self.last_snapshots.iter().find(|s| s.purpose == purpose)
    }

    /// Record `snapshot` as the newest of its purpose; a success clears the failure.
    pub fn record(&mut self, snapshot: SnapshotRecord) {
        self.last_snapshots
            .retain(|s| s.purpose != snapshot.purpose);
        self.last_snapshots.push(snapshot);
        self.last_snapshots.sort_by_key(|s| s.purpose);
        self.last_failure = None;
    }
}

/// One verified snapshot in the target.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotRecord {
    pub purpose: SnapshotPurpose,
    /// Its name in the target (k3s's `<prefix>-<node>-<unix seconds>`).
    pub name: String,
    /// RFC 3339.
    pub taken_at: String,
    /// The store's revision when it was taken.
    pub revision: i64,
    pub size_bytes: i64,
    /// Where it is: `s3://<bucket>/<key>` or a file path.
    #[serde(default)]
    pub location: String,
    /// The member it was streamed from.
    pub source_member: String,
    /// BeforeRemoval: the member (hex id) whose removal it precedes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before_removal_of: Option<String>,
}

/// `status.etcdBackup.lastRestore`: a restore a person asked for
/// (annotation `controlplane.cluster.x-k8s.io/etcd-restore`), carried out.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestoreRecord {
    /// The snapshot's name in the target.
    pub snapshot: String,
    /// RFC 3339: when the request was accepted (the snapshot verified).
    pub accepted_at: String,
    /// RFC 3339: when the restored member answered as the only voter.
    pub completed_at: String,
    /// The Machine that restored it.
    pub machine: String,
    /// The restored member (hex id).
    pub member: String,
    /// Whether a person forced it while quorum held or could not be read.
    #[serde(default)]
    pub forced: bool,
}

/// `status.etcdBackup.lastFailure`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotFailure {
    pub purpose: SnapshotPurpose,
    /// RFC 3339.
    pub time: String,
    /// The target's error (never a secret).
    pub message: String,
}
