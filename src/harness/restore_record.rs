//! What a restoring server in the sandbox was asked to do (the parsed
//! `--cluster-reset-restore-path` and `--etcd-s3*` settings) and what it
//! did, step by step: the record [`super::restore`] keeps on the sandbox for
//! tests to assert on. Data only.

use std::path::PathBuf;

/// Where `--cluster-reset-restore-path` is restored from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoreRequest {
    /// A path on the node, or with `s3` the snapshot's name.
    pub restore_path: String,
    pub s3: Option<S3Settings>,
}

/// The `--etcd-s3*` settings of the restore command (docs/k3s.md SR6, SR7).
#[derive(Clone, PartialEq, Eq)]
pub struct S3Settings {
    /// `host[:port]`, no scheme (k3s's default `s3.amazonaws.com`).
    pub endpoint: String,
    pub bucket: String,
    pub folder: String,
    /// k3s's default `us-east-1`.
    pub region: String,
    /// `--etcd-s3-insecure`: plain HTTP.
    pub insecure: bool,
    pub skip_ssl_verify: bool,
    /// The content of the file `--etcd-s3-endpoint-ca` names.
    pub endpoint_ca_pem: Option<String>,
    pub access_key_id: String,
    pub secret_access_key: String,
}

impl std::fmt::Debug for S3Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The keys never go into test output or logs.
        f.debug_struct("S3Settings")
            .field("endpoint", &self.endpoint)
            .field("bucket", &self.bucket)
            .field("folder", &self.folder)
            .field("region", &self.region)
            .field("insecure", &self.insecure)
            .field("skip_ssl_verify", &self.skip_ssl_verify)
            .field(
                "endpoint_ca_pem",
                &self.endpoint_ca_pem.as_ref().map(|_| "<pem>"),
            )
            .field("access_key_id", &redacted(&self.access_key_id))
            .field("secret_access_key", &redacted(&self.secret_access_key))
            .finish()
    }
}

fn redacted(value: &str) -> &'static str {
    if value.is_empty() { "" } else { "<set>" }
}

impl S3Settings {
    /// The object `name` is downloaded from: `<folder>/<name>`, joined and
    /// cleaned as Go's `path.Join` does (k3s: `pkg/etcd/s3/s3.go
    /// (Download)`).
    pub fn object_key(&self, name: &str) -> String {
        object_key(&self.folder, name)
    }

    /// `http://` with `--etcd-s3-insecure`, else `https://`, then the endpoint.
    pub fn endpoint_url(&self) -> String {
        let scheme = if self.insecure { "http" } else { "https" };
        format!("{scheme}://{}", self.endpoint)
    }
}

/// Go's `path.Join(folder, name)`: the non-empty elements joined by `/`,
/// then cleaned (`//` collapsed, `.` dropped, `..` resolved, no trailing
/// `/`).
pub fn object_key(folder: &str, name: &str) -> String {
    let joined = [folder, name]
        .iter()
        .filter(|e| !e.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join("/");
    clean_path(&joined)
}

/// Go's `path.Clean`.
fn clean_path(p: &str) -> String {
    if p.is_empty() {
        return ".".into();
    }
    let rooted = p.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for part in p.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.last().is_some_and(|l| *l != "..") {
                    parts.pop();
                } else if !rooted {
                    parts.push("..");
                }
            }
            other => parts.push(other),
        }
    }
    let body = parts.join("/");
    match (rooted, body.is_empty()) {
        (true, _) => format!("/{body}"),
        (false, true) => ".".into(),
        (false, false) => body,
    }
}

/// One thing the restoring node did, in order, for tests to assert on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RestoreAction {
    /// The bootstrap provider rendered the k3s configuration: a join
    /// (`server: <url>`, once the Cluster is initialized) or a first
    /// server's (`cluster-init: true`).
    ConfigRendered {
        server: Option<String>,
    },
    /// [`super::restore::SERVER_TO_CLUSTER_INIT`] ran.
    ServerReplacedByClusterInit,
    /// The install script started k3s as a new first server: a one-member
    /// etcd cluster of its own under `member`.
    FirstStart {
        member: String,
    },
    /// The install script started k3s with `server:`: it tries to join
    /// `server`, whose cluster has no quorum; nothing else is simulated of it.
    FirstStartJoins {
        server: String,
    },
    Stopped,
    /// The snapshot, from `source` (a path, or `s3://bucket/key`), is at `path`.
    SnapshotFetched {
        source: String,
        path: PathBuf,
    },
    /// The data dir was moved aside (k3s: `db/etcd-old-<unix time>`).
    DataMovedAside {
        to: PathBuf,
    },
    /// etcd's restore tool wrote the snapshot under `member` (the name of
    /// the first start).
    SnapshotRestored {
        tool: String,
        member: String,
    },
    /// The reset run: etcd forced into a one-member cluster under the new
    /// name `member`, the reset flag written, k3s exited.
    ResetRun {
        member: String,
    },
    /// k3s refused a `k3s server` run (exit status 1) and changed nothing.
    Refused {
        command: String,
        message: String,
    },
    /// The restore failed part-way (the data dir is already moved aside).
    RestoreFailed {
        error: String,
    },
    /// k3s started normally: the reset flag removed, etcd up under `member`.
    Started {
        member: String,
    },
    /// A command the simulation did not run, and why.
    NotRun {
        command: String,
        why: String,
    },
    /// The Node registered with k3s's etcd annotations; the Machine got
    /// its nodeRef.
    NodeRegistered {
        node: String,
        member: String,
    },
}

/// A restore a Machine's boot carried out (or tried to).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoreRecord {
    pub machine: String,
    pub node: String,
    /// The restored member's index in `sandbox.etcd` (once it started).
    pub member_index: Option<usize>,
    pub request: RestoreRequest,
    pub actions: Vec<RestoreAction>,
    /// `Err` with what went wrong, as [`super::restore::provision_restore`] returned it.
    pub outcome: Result<String, String>,
}
