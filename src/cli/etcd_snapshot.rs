//! `k3s-control-plane etcd snapshot save | list | verify`: etcd snapshots in
//! a directory or an S3 bucket, through the same guarded engine as the
//! controller (one named member, refused unless it is a healthy voter; the
//! trailing SHA-256 checked on the way; nothing left behind on failure).
//!
//! The S3 credentials come from `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`
//! (and `AWS_SESSION_TOKEN`), the variables k3s reads for
//! `--etcd-s3-access-key` and `--etcd-s3-secret-key`. Exit codes as the other
//! etcd commands: 0 done, 1 bad input or failure, 2 refused.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use super::{CliError, EtcdArgs, Output, client_tls, endpoints, one_line, print_json, resolve};
use crate::backup::{
    BackupError, FieldNames, Retention, S3Config, Saved, SnapshotName, SnapshotReason,
    StoredSnapshot, Target, TargetConfig, prune, save, verify_stored,
};
use crate::etcd::{EtcdCluster, EtcdError, snapshot_source};
use crate::space_rule::bytes;

#[derive(Debug, clap::Subcommand)]
pub enum SnapshotCommand {
    /// Stream a snapshot from one member into the target, check it, then
    /// prune ours beyond --retention. Named `capi-on-demand-<node>-<unix seconds>`.
    Save {
        #[command(flatten)]
        target: TargetArgs,
        /// The member to take it from (name or 16-hex id). Default: a
        /// healthy voter that does not lead.
        #[arg(long, value_name = "NAME|ID")]
        member: Option<String>,
        /// Keep at most this many of our snapshots in the target (k3s's own
        /// are never counted nor pruned).
        #[arg(long, value_name = "N")]
        retention: Option<u32>,
        /// Give up after this many seconds, leaving nothing behind.
        #[arg(long, value_name = "SECONDS", default_value_t = 600)]
        timeout: u64,
    },
    /// The snapshots in the target, ours and k3s's.
    List {
        #[command(flatten)]
        target: TargetArgs,
    },
    /// Read a stored snapshot back and check its trailing SHA-256.
    Verify {
        #[command(flatten)]
        target: TargetArgs,
        /// The snapshot's name in the target.
        name: String,
    },
}

/// Where snapshots are: `--dir`, or an S3 bucket as k3s's `--etcd-s3-*`
/// flags describe one.
#[derive(Debug, clap::Args)]
pub struct TargetArgs {
    /// A directory (it must exist).
    #[arg(long, value_name = "PATH", conflicts_with_all = ["s3_endpoint", "s3_bucket"])]
    dir: Option<PathBuf>,
    /// S3 endpoint, host[:port] (k3s --etcd-s3-endpoint).
    #[arg(long, value_name = "HOST[:PORT]")]
    s3_endpoint: Option<String>,
    #[arg(long, value_name = "NAME")]
    s3_bucket: Option<String>,
    /// Key prefix: objects are <folder>/<name>.
    #[arg(long, value_name = "FOLDER", default_value = "")]
    s3_folder: String,
    #[arg(long, value_name = "REGION", default_value = crate::backup::target::DEFAULT_REGION)]
    s3_region: String,
    /// Plain HTTP instead of HTTPS.
    #[arg(long)]
    s3_insecure: bool,
    /// CA bundle (PEM) the endpoint's certificate chains to. TLS is always
    /// verified: there is no way to skip it.
    #[arg(long, value_name = "FILE")]
    s3_endpoint_ca: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
enum SnapshotCliError {
    #[error(transparent)]
    Cli(#[from] CliError),
    #[error(transparent)]
    Backup(#[from] BackupError),
    #[error("{0}")]
    Usage(String),
}

impl From<EtcdError> for SnapshotCliError {
    fn from(err: EtcdError) -> Self {
        SnapshotCliError::Cli(CliError::Etcd(err))
    }
}

impl SnapshotCliError {
    fn exit_code(&self) -> u8 {
        match self {
            SnapshotCliError::Cli(e) => e.exit_code(),
            SnapshotCliError::Backup(BackupError::Etcd(e)) => {
                CliError::Etcd(clone_refusal(e)).exit_code()
            }
            _ => 1,
        }
    }
}

/// Enough of an [`EtcdError`] to pick its exit code.
fn clone_refusal(err: &EtcdError) -> EtcdError {
    match err {
        EtcdError::OperationRefused { action, reason } => EtcdError::OperationRefused {
            action: action.clone(),
            reason: reason.clone(),
        },
        other => EtcdError::NoReceiver {
            reason: other.to_string(),
        },
    }
}

pub(super) async fn run(args: &EtcdArgs, command: &SnapshotCommand) -> ExitCode {
    match execute(args, command).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {}", one_line(&err.to_string()));
            ExitCode::from(err.exit_code())
        }
    }
}

fn target_config(args: &TargetArgs) -> Result<TargetConfig, SnapshotCliError> {
    if let Some(dir) = &args.dir {
        return Ok(TargetConfig::Filesystem { path: dir.clone() });
    }
    let (Some(endpoint), Some(bucket)) = (&args.s3_endpoint, &args.s3_bucket) else {
        return Err(SnapshotCliError::Usage(
            "a target is required: --dir PATH, or --s3-endpoint and --s3-bucket".into(),
        ));
    };
    let endpoint_ca_pem = match &args.s3_endpoint_ca {
        None => None,
        Some(path) => Some(std::fs::read_to_string(path).map_err(|e| {
            SnapshotCliError::Usage(format!("--s3-endpoint-ca {}: {e}", path.display()))
        })?),
    };
    let env = |name: &str| std::env::var(name).unwrap_or_default();
    Ok(TargetConfig::S3(S3Config {
        endpoint: endpoint.clone(),
        bucket: bucket.clone(),
        folder: args.s3_folder.clone(),
        region: args.s3_region.clone(),
        insecure: args.s3_insecure,
        skip_tls_verify: false,
        endpoint_ca_pem,
        access_key_id: env("AWS_ACCESS_KEY_ID"),
        secret_access_key: env("AWS_SECRET_ACCESS_KEY"),
        session_token: Some(env("AWS_SESSION_TOKEN")).filter(|t| !t.is_empty()),
    }))
}

fn open(args: &TargetArgs) -> Result<Target, SnapshotCliError> {
    Ok(Target::open_with(&target_config(args)?, FieldNames::Flags)?)
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SaveJson {
    saved: Saved,
    pruned: Vec<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ListedJson<'a> {
    #[serde(flatten)]
    stored: &'a StoredSnapshot,
    ours: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    node: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    taken_at: Option<i64>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct VerifiedJson<'a> {
    name: &'a str,
    location: String,
    size: u64,
    sha256: String,
}

async fn execute(args: &EtcdArgs, command: &SnapshotCommand) -> Result<(), SnapshotCliError> {
    match command {
        SnapshotCommand::Save {
            target,
            member,
            retention,
            timeout,
        } => {
            // All input is checked before etcd or the target is contacted.
            let target = open(target)?;
            let seeds = endpoints(args)?;
            let tls = client_tls(args)?;
            let etcd = EtcdCluster::new(&seeds, tls).map_err(CliError::Etcd)?;
            let snap = etcd.snapshot().await?;
            let source = match member {
                Some(given) => resolve(&snap, "--member", given)?,
                None => {
                    snapshot_source(&snap)
                        .ok_or_else(|| EtcdError::NoReceiver {
                            reason: "no started, healthy voter to take a snapshot from".into(),
                        })?
                        .id
                }
            };
            let member_name = snap
                .member(source)
                .map(|m| m.name.clone())
                .unwrap_or_default();
            // k3s names its snapshots after the node: `<node>-<8 hex>` is the member.
            let node = crate::membership::node_of_member_name(&member_name).unwrap_or(&member_name);
            let name = SnapshotName::ours(SnapshotReason::OnDemand, node, SystemTime::now())
                .map_err(|e| SnapshotCliError::Usage(format!("member {member_name:?}: {e}")))?;
            let saved = save(
                &etcd,
                &snap,
                source,
                &target,
                &name,
                Duration::from_secs(*timeout),
            )
            .await?;
            let pruned = match retention {
                Some(count) => {
                    let rule = Retention {
                        count: Some(*count),
                        max_age: None,
                    };
                    prune(&target, &rule, SystemTime::now()).await?.deleted
                }
                None => Vec::new(),
            };
            match args.output {
                Output::Json => print_json(&SaveJson {
                    saved,
                    pruned: pruned.iter().map(|p| p.name.clone()).collect(),
                }),
                Output::Text => {
                    println!(
                        "saved {} ({}, revision {}, sha256 {}) from {} in {} ms",
                        saved.location,
                        bytes(saved.size),
                        saved.revision,
                        saved.sha256,
                        saved.member,
                        saved.took.as_millis()
                    );
                    for p in &pruned {
                        println!("pruned {p}");
                    }
                }
            }
        }
        SnapshotCommand::List { target } => {
            let target = open(target)?;
            let listed = target.list().await?;
            match args.output {
                Output::Json => print_json(
                    &listed
                        .iter()
                        .map(|s| ListedJson {
                            stored: s,
                            ours: s.is_ours(),
                            reason: s
                                .parsed
                                .as_ref()
                                .and_then(|n| n.reason())
                                .map(|r| r.to_string()),
                            node: s
                                .parsed
                                .as_ref()
                                .filter(|n| !n.node.is_empty())
                                .map(|n| n.node.clone()),
                            taken_at: s.parsed.as_ref().map(|n| n.taken_at),
                        })
                        .collect::<Vec<_>>(),
                ),
                Output::Text => {
                    println!("{} in {}", plural(listed.len()), target.describe());
                    for s in &listed {
                        let whose = match s.parsed.as_ref() {
                            Some(n) => match n.reason() {
                                Some(reason) => format!("ours ({reason})"),
                                None => "not ours".into(),
                            },
                            None => "not a snapshot name".into(),
                        };
                        let when = chrono::DateTime::<chrono::Utc>::from(s.last_modified)
                            .format("%Y-%m-%dT%H:%M:%SZ");
                        println!("  {}  {}  {when}  {whose}", s.name, bytes(s.size));
                    }
                }
            }
        }
        SnapshotCommand::Verify { target, name } => {
            let target = open(target)?;
            let verified = verify_stored(&target, name).await?;
            match args.output {
                Output::Json => print_json(&VerifiedJson {
                    name,
                    location: target.location(name),
                    size: verified.size,
                    sha256: verified.sha256,
                }),
                Output::Text => println!(
                    "{}: a whole etcd snapshot ({}), sha256 {} matches",
                    target.location(name),
                    bytes(verified.size),
                    verified.sha256
                ),
            }
        }
    }
    Ok(())
}

fn plural(n: usize) -> String {
    if n == 1 {
        "1 object".into()
    } else {
        format!("{n} objects")
    }
}
