//! `k3s-control-plane etcd status | move-leader | remove-member | defrag |
//! compact | alarm disarm | snapshot save|list|verify`: inspect and operate
//! on a k3s embedded etcd directly, over verified mutual TLS.
//!
//! Exit codes: 0 done, 1 bad input or etcd error, 2 refused as unsafe or
//! quorum lost (the quorum assessment explains why; `status` prints what it
//! read, then exits 2 if quorum is lost).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde::Serialize;

use crate::etcd::tls::{DEFAULT_MINTED_LIFETIME, read_pem_file};
use crate::etcd::{
    ClientTls, Compacted, Defragmented, Disarmed, EtcdCluster, EtcdError, LeaderMove,
    MembershipSnapshot, Removal, SafeRemoval, TlsError, Transport,
};
use crate::quorum::Assessment;
use crate::space_rule::{ConfiguredQuota, Thresholds, bytes, parse_quota};

#[derive(Debug, clap::Args)]
pub struct EtcdArgs {
    #[command(subcommand)]
    pub command: EtcdCommand,

    /// etcd client URLs, comma separated (https://<node-ip>:2379).
    #[arg(
        long,
        global = true,
        value_delimiter = ',',
        value_name = "URL[,URL...]"
    )]
    pub endpoints: Vec<String>,

    /// etcd server CA certificate (k3s: server/tls/etcd/server-ca.crt).
    #[arg(long, global = true, value_name = "FILE")]
    pub cacert: Option<PathBuf>,

    /// Client certificate (k3s: server/tls/etcd/client.crt).
    #[arg(long, global = true, value_name = "FILE")]
    pub cert: Option<PathBuf>,

    /// Client key (PKCS#8, SEC1 EC or PKCS#1 RSA).
    #[arg(long, global = true, value_name = "FILE")]
    pub key: Option<PathBuf>,

    /// etcd CA key: mint a short-lived client certificate from --cacert and this
    /// key instead of --cert/--key (what the `<cluster>-etcd` Secret holds).
    #[arg(long, global = true, value_name = "FILE", conflicts_with_all = ["cert", "key"])]
    pub ca_key: Option<PathBuf>,

    #[arg(long, global = true, value_enum, default_value_t = Output::Text)]
    pub output: Output,

    /// The members' backend quota, for those that do not report theirs
    /// (etcd < 3.6): bytes, or with Ki, Mi, Gi. k3s sets none, so etcd's
    /// default applies (2Gi) unless the servers run with
    /// `--etcd-arg=quota-backend-bytes=...`.
    #[arg(long, global = true, value_name = "BYTES", default_value = "2Gi", value_parser = parse_quota)]
    pub quota_backend_bytes: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
}

#[derive(Debug, clap::Subcommand)]
pub enum EtcdCommand {
    /// Members, health of each on its own endpoint, alarms, leader and quorum.
    Status,
    /// Move leadership off a member (a no-op if it does not lead).
    MoveLeader {
        /// The member to move leadership off (name or 16-hex id).
        #[arg(long, value_name = "NAME|ID")]
        from: String,
        /// The member to hand leadership to (default: the most up-to-date healthy voter).
        #[arg(long, value_name = "NAME|ID")]
        to: Option<String>,
    },
    /// Remove a member if quorum allows it, moving leadership off it first.
    RemoveMember {
        /// The member to remove (name or 16-hex id).
        #[arg(value_name = "NAME|ID")]
        member: String,
    },
    /// Defragment members one at a time: followers first, the leader last
    /// after its leadership moved, each confirmed healthy before the next;
    /// refused while any other member is unhealthy (NOSPACE aside).
    Defrag {
        /// Only this member (name or 16-hex id; repeat for more). Default: every member.
        #[arg(long = "member", value_name = "NAME|ID")]
        members: Vec<String>,
    },
    /// Compact the keyspace history to the current revision (frees pages
    /// inside each member's backend; `defrag` gives them back).
    Compact,
    /// etcd alarms.
    Alarm {
        #[command(subcommand)]
        command: AlarmCommand,
    },
    /// etcd snapshots in a directory or an S3 bucket, named as k3s names its
    /// own (`capi-on-demand-<node>-<unix seconds>`).
    Snapshot {
        #[command(subcommand)]
        command: snapshot::SnapshotCommand,
    },
}

#[path = "etcd_snapshot.rs"]
mod snapshot;

#[derive(Debug, clap::Subcommand)]
pub enum AlarmCommand {
    /// Disarm NOSPACE, only when every member has room below its quota
    /// (at most 90% of it): says the numbers either way. Other alarms
    /// (CORRUPT) are left alone.
    Disarm,
}

/// Why the command failed; each message is one line naming the flag or argument.
#[derive(Debug, thiserror::Error)]
pub(super) enum CliError {
    #[error("{0} is required")]
    Missing(&'static str),
    #[error("{0}")]
    Tls(#[from] TlsError),
    #[error("--endpoints {url:?}: {reason}")]
    Endpoint { url: String, reason: String },
    #[error("{arg} {given:?}: no such etcd member (members: {known})")]
    UnknownMember {
        arg: &'static str,
        given: String,
        known: String,
    },
    #[error("{0}")]
    Etcd(EtcdError),
}

impl CliError {
    pub(super) fn exit_code(&self) -> u8 {
        match self {
            CliError::Etcd(
                EtcdError::UnsafeRemoval { .. }
                | EtcdError::QuorumLost { .. }
                | EtcdError::AlarmsUnknown { .. }
                | EtcdError::OperationRefused { .. },
            ) => 2,
            _ => 1,
        }
    }
}

impl From<EtcdError> for CliError {
    fn from(err: EtcdError) -> Self {
        CliError::Etcd(err)
    }
}

pub async fn run(args: EtcdArgs) -> ExitCode {
    crate::install_crypto_provider();
    if let EtcdCommand::Snapshot { command } = &args.command {
        return snapshot::run(&args, command).await;
    }
    let output = args.output;
    let err_is_status = matches!(args.command, EtcdCommand::Status);
    match execute(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            match (output, &err) {
                (Output::Json, CliError::Etcd(EtcdError::UnsafeRemoval { assessment })) => {
                    print_json(&Refusal {
                        refused: true,
                        quorum_lost: false,
                        assessment: assessment.as_ref(),
                    })
                }
                // `status` has printed its JSON already.
                (Output::Json, CliError::Etcd(EtcdError::QuorumLost { assessment }))
                    if !err_is_status =>
                {
                    print_json(&Refusal {
                        refused: true,
                        quorum_lost: true,
                        assessment: assessment.as_ref(),
                    })
                }
                _ => {}
            }
            eprintln!("error: {}", one_line(&err.to_string()));
            ExitCode::from(err.exit_code())
        }
    }
}

pub(super) fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn flag(name: &str, path: &Path) -> String {
    format!("{name} {}", path.display())
}

/// TLS from the flags; every problem names its flag.
pub(super) fn client_tls(args: &EtcdArgs) -> Result<ClientTls, CliError> {
    let cacert = args.cacert.as_ref().ok_or(CliError::Missing("--cacert"))?;
    let ca_field = flag("--cacert", cacert);
    let ca_pem = read_pem_file(&ca_field, cacert)?;
    if let Some(ca_key) = &args.ca_key {
        let key_field = flag("--ca-key", ca_key);
        let key_pem = read_pem_file(&key_field, ca_key)?;
        return Ok(ClientTls::minted_from_ca(
            (&ca_field, &ca_pem),
            (&key_field, &key_pem),
            DEFAULT_MINTED_LIFETIME,
        )?);
    }
    let (cert, key) = match (&args.cert, &args.key) {
        (Some(cert), Some(key)) => (cert, key),
        (Some(_), None) => return Err(CliError::Missing("--key (with --cert)")),
        (None, Some(_)) => return Err(CliError::Missing("--cert (with --key)")),
        (None, None) => return Err(CliError::Missing("--cert and --key, or --ca-key,")),
    };
    let cert_field = flag("--cert", cert);
    let key_field = flag("--key", key);
    let cert_pem = read_pem_file(&cert_field, cert)?;
    let key_pem = read_pem_file(&key_field, key)?;
    Ok(ClientTls::from_pem(
        (&ca_field, &ca_pem),
        (&cert_field, &cert_pem),
        (&key_field, &key_pem),
    )?)
}

pub(super) fn endpoints(args: &EtcdArgs) -> Result<Vec<String>, CliError> {
    let urls: Vec<String> = args
        .endpoints
        .iter()
        .map(|u| u.trim().to_string())
        .filter(|u| !u.is_empty())
        .collect();
    if urls.is_empty() {
        return Err(CliError::Missing("--endpoints"));
    }
    for url in &urls {
        if let Err(err) = Transport::Direct.resolve(url) {
            let reason = match err {
                EtcdError::InvalidEndpoint { reason, .. } => reason,
                other => other.to_string(),
            };
            return Err(CliError::Endpoint {
                url: url.clone(),
                reason,
            });
        }
    }
    Ok(urls)
}

async fn execute(args: EtcdArgs) -> Result<(), CliError> {
    // All input is checked before etcd is contacted.
    let seeds = endpoints(&args)?;
    let tls = client_tls(&args)?;
    let etcd = EtcdCluster::new(&seeds, tls)?;
    match &args.command {
        EtcdCommand::Status => {
            let snap = etcd.snapshot().await?;
            let quota = ConfiguredQuota::Default(args.quota_backend_bytes);
            match args.output {
                Output::Json => print_json(&StatusJson::of(&snap, &quota)),
                Output::Text => print_status(&snap, &quota),
            }
            let cluster = snap.assess_cluster();
            if !cluster.has_quorum() {
                return Err(EtcdError::QuorumLost {
                    assessment: Box::new(cluster),
                }
                .into());
            }
        }
        EtcdCommand::MoveLeader { from, to } => {
            let snap = etcd.snapshot().await?;
            let from = resolve(&snap, "--from", from)?;
            let to = to
                .as_deref()
                .map(|to| resolve(&snap, "--to", to))
                .transpose()?;
            let moved = etcd.move_leader_off_in(&snap, from, to).await?;
            match args.output {
                Output::Json => print_json(&moved),
                Output::Text => println!("{}", describe_move(&moved)),
            }
        }
        EtcdCommand::RemoveMember { member } => {
            let snap = etcd.snapshot().await?;
            let id = resolve(&snap, "NAME|ID", member)?;
            // Decides on the snapshot just taken: without quorum this answers
            // at once instead of observing the cluster a second time.
            let outcome = etcd.safe_remove_in(&snap, id).await?;
            match args.output {
                Output::Json => print_json(&outcome),
                Output::Text => print_removal(&outcome),
            }
        }
        EtcdCommand::Defrag { members } => {
            let outcome = defrag(&etcd, members, args.output).await?;
            if args.output == Output::Json {
                print_json(&outcome);
            }
        }
        EtcdCommand::Compact => {
            let compacted = etcd.compact().await?;
            match args.output {
                Output::Json => print_json(&compacted),
                Output::Text => println!("{}", describe_compaction(&compacted)),
            }
        }
        EtcdCommand::Snapshot { .. } => unreachable!("dispatched in run"),
        EtcdCommand::Alarm {
            command: AlarmCommand::Disarm,
        } => {
            let quota = ConfiguredQuota::Default(args.quota_backend_bytes);
            let disarmed = etcd.disarm_nospace(&quota, &Thresholds::default()).await?;
            match args.output {
                Output::Json => print_json(&disarmed),
                Output::Text => println!("{}", describe_disarm(&disarmed)),
            }
        }
    }
    Ok(())
}

/// What `defrag` did, in order.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
struct DefragOutcome {
    defragmented: Vec<Defragmented>,
    leader_moves: Vec<LeaderMove>,
}

/// Defragment `members` (all when empty) one at a time on fresh snapshots:
/// followers first by name, the leader last once its leadership moved; the
/// engine refuses a member while another one is unhealthy, naming it.
async fn defrag(
    etcd: &EtcdCluster,
    members: &[String],
    output: Output,
) -> Result<DefragOutcome, CliError> {
    let first = etcd.snapshot().await?;
    let targets: Vec<u64> = if members.is_empty() {
        first.members.iter().map(|m| m.id).collect()
    } else {
        members
            .iter()
            .map(|m| resolve(&first, "--member", m))
            .collect::<Result<_, _>>()?
    };
    let mut outcome = DefragOutcome::default();
    // Each member once, plus one leadership move each at most.
    for _ in 0..targets.len() * 2 + 1 {
        let snap = etcd.snapshot().await?;
        let view = snap.ignoring_nospace();
        let cluster = view.assess_cluster();
        if !cluster.has_quorum() {
            return Err(EtcdError::QuorumLost {
                assessment: Box::new(cluster),
            }
            .into());
        }
        let done = |id: u64| outcome.defragmented.iter().any(|d| d.id == id);
        let mut pending: Vec<_> = view
            .members
            .iter()
            .filter(|m| targets.contains(&m.id) && !done(m.id))
            .collect();
        pending.sort_by_key(|m| (view.leader == Some(m.id), m.label()));
        let Some(next) = pending.first() else {
            return Ok(outcome);
        };
        let voters = view.members.iter().filter(|m| !m.learner).count();
        if view.leader == Some(next.id) && voters > 1 {
            let moved = etcd.move_leader_off_in(&view, next.id, None).await?;
            if output == Output::Text {
                println!("{} (so that it can be defragmented)", describe_move(&moved));
            }
            outcome.leader_moves.push(moved);
            continue;
        }
        let d = etcd.defragment_in(&snap, next.id).await?;
        if output == Output::Text {
            println!("defragmented {}", d.describe());
        }
        outcome.defragmented.push(d);
    }
    Err(EtcdError::NotConfirmed {
        what: "defragmentation of every member".into(),
        after: std::time::Duration::ZERO,
        last: "leadership kept returning to a member still to defragment".into(),
    }
    .into())
}

fn describe_compaction(c: &Compacted) -> String {
    if c.already {
        format!(
            "the history is compacted to revision {} already; nothing to do",
            c.revision
        )
    } else {
        format!(
            "compacted the history to revision {} (request sent to {}, {} ms); `etcd defrag` gives the freed pages back",
            c.revision, c.via, c.elapsed_ms
        )
    }
}

fn describe_disarm(d: &Disarmed) -> String {
    if d.members.is_empty() {
        format!("no NOSPACE alarm was raised; {}", d.room)
    } else {
        format!("disarmed NOSPACE on {}: {}", d.members.join(", "), d.room)
    }
}

pub(super) fn resolve(
    snap: &MembershipSnapshot,
    arg: &'static str,
    given: &str,
) -> Result<u64, CliError> {
    snap.find(given)
        .map(|m| m.id)
        .ok_or_else(|| CliError::UnknownMember {
            arg,
            given: given.to_string(),
            known: snap
                .members
                .iter()
                .map(|m| format!("{} ({:016x})", m.label(), m.id))
                .collect::<Vec<_>>()
                .join(", "),
        })
}

pub(super) fn print_json<T: Serialize>(value: &T) {
    match serde_json::to_string_pretty(value) {
        Ok(text) => println!("{text}"),
        Err(err) => eprintln!("error: cannot encode JSON: {err}"),
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Refusal<'a> {
    refused: bool,
    /// The cluster as it stands has no quorum (`assessment` is then of the
    /// cluster, not of the removal).
    quorum_lost: bool,
    assessment: &'a Assessment,
}

/// `status --output json`, a stable shape for scripts.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StatusJson {
    cluster_id: String,
    leader: Option<String>,
    members: Vec<MemberJson>,
    quorum: QuorumJson,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct MemberJson {
    id: String,
    name: String,
    #[serde(rename = "peerURLs")]
    peer_urls: Vec<String>,
    #[serde(rename = "clientURLs")]
    client_urls: Vec<String>,
    learner: bool,
    leader: bool,
    healthy: bool,
    error: Option<String>,
    alarms: Vec<String>,
    raft_term: Option<u64>,
    raft_index: Option<u64>,
    db_size: Option<i64>,
    db_size_in_use: Option<i64>,
    /// Its quota: its own (etcd >= 3.6), else `--quota-backend-bytes`.
    quota: Option<u64>,
    quota_source: &'static str,
    /// 1 - dbSizeInUse / dbSize.
    fragmentation: Option<f64>,
    version: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct QuorumJson {
    /// Fewer healthy voters than quorum needs: etcd can commit nothing.
    lost: bool,
    voters: usize,
    healthy: usize,
    size: usize,
    fault_tolerance: usize,
    summary: String,
}

impl StatusJson {
    fn of(snap: &MembershipSnapshot, quota: &ConfiguredQuota) -> Self {
        let q = snap.assess_cluster();
        let space = snap.space(quota);
        StatusJson {
            cluster_id: format!("{:016x}", snap.cluster_id),
            leader: snap.leader_member().map(|m| m.label()),
            members: snap
                .members
                .iter()
                .zip(&space.members)
                .map(|(m, sp)| MemberJson {
                    id: format!("{:016x}", m.id),
                    name: m.name.clone(),
                    peer_urls: m.peer_urls.clone(),
                    client_urls: m.client_urls.clone(),
                    learner: m.learner,
                    leader: snap.leader == Some(m.id),
                    healthy: m.is_healthy(),
                    error: m.view().probe_error,
                    alarms: m.alarms.clone(),
                    raft_term: m.status.as_ref().map(|s| s.raft_term),
                    raft_index: m.status.as_ref().map(|s| s.raft_index),
                    db_size: m.status.as_ref().map(|s| s.db_size),
                    db_size_in_use: m.status.as_ref().map(|s| s.db_size_in_use),
                    quota: sp.quota,
                    quota_source: sp.quota_source.as_str(),
                    fragmentation: sp.sizes.map(|s| s.fragmentation()),
                    version: m.status.as_ref().map(|s| s.version.clone()),
                })
                .collect(),
            quorum: QuorumJson {
                lost: !q.has_quorum(),
                voters: q.voters,
                healthy: q.healthy,
                size: q.size,
                fault_tolerance: q.fault_tolerance,
                summary: q.to_string(),
            },
        }
    }
}

fn print_status(snap: &MembershipSnapshot, quota: &ConfiguredQuota) {
    let space = snap.space(quota);
    println!(
        "cluster {:016x}, leader {}",
        snap.cluster_id,
        snap.leader_member()
            .map_or_else(|| "none".to_string(), |m| m.label())
    );
    let rows: Vec<[String; 10]> = snap
        .members
        .iter()
        .zip(&space.members)
        .map(|(m, sp)| {
            let role = match (snap.leader == Some(m.id), m.learner) {
                (true, _) => "leader",
                (false, true) => "learner",
                (false, false) => "follower",
            };
            let health = match m.unhealthy_reason() {
                None => "healthy".to_string(),
                Some(reason) => format!("UNHEALTHY: {reason}"),
            };
            let raft = m
                .status
                .as_ref()
                .map_or("-".into(), |s| format!("{}/{}", s.raft_term, s.raft_index));
            let (db, in_use, free) = sp.sizes.map_or(("-".into(), "-".into(), "-".into()), |s| {
                (
                    bytes(s.db_size),
                    bytes(s.in_use),
                    format!("{:.0}%", s.fragmentation() * 100.0),
                )
            });
            [
                m.label(),
                format!("{:016x}", m.id),
                m.client_urls.join(","),
                role.to_string(),
                raft,
                db,
                in_use,
                free,
                sp.quota.map_or_else(|| "?".into(), bytes),
                health,
            ]
        })
        .collect();
    let header = [
        "NAME",
        "ID",
        "CLIENT URL",
        "ROLE",
        "TERM/INDEX",
        "DB SIZE",
        "IN USE",
        "FREE",
        "QUOTA",
        "HEALTH",
    ]
    .map(String::from);
    let mut widths = header.clone().map(|h| h.len());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    for row in std::iter::once(&header).chain(&rows) {
        let cells: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        println!("{}", cells.join("  ").trim_end());
    }
    if let Some(reason) = &snap.alarms_error {
        println!("alarms: unknown ({reason})");
    }
    let cluster = snap.assess_cluster();
    if cluster.has_quorum() {
        println!("quorum: {cluster}");
    } else {
        println!("quorum lost: {cluster}");
    }
    if space.nospace {
        let raised: Vec<String> = space
            .members
            .iter()
            .filter(|m| m.nospace)
            .map(|m| m.label.clone())
            .collect();
        println!(
            "NOSPACE raised against {}: etcd refuses writes (every member reports the alarm, so each counts unhealthy above); recover with `etcd compact` when the in-use size is at the quota, `etcd defrag`, then `etcd alarm disarm`",
            if raised.is_empty() {
                "a member".to_string()
            } else {
                raised.join(", ")
            }
        );
    }
}

fn describe_move(moved: &LeaderMove) -> String {
    match moved {
        LeaderMove::NotLeader { member, leader } => format!(
            "{member} is not the leader (leader: {}); nothing to do",
            leader.as_deref().unwrap_or("none")
        ),
        LeaderMove::Moved {
            from,
            to,
            elapsed_ms,
        } => format!("moved leadership from {from} to {to} in {elapsed_ms} ms"),
    }
}

fn print_removal(outcome: &SafeRemoval) {
    println!("quorum: {}", outcome.assessment);
    if let Some(moved) = &outcome.leader_move {
        println!("{}", describe_move(moved));
    }
    match &outcome.removal {
        Removal::Removed {
            member,
            via,
            attempts,
        } => println!("removed member {member} (request sent to {via}, {attempts} attempt(s))"),
        Removal::AlreadyGone { member } => {
            println!("member {member} is not in the cluster; nothing to do")
        }
    }
}
