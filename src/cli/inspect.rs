//! `k3s-control-plane inspect NAMESPACE/NAME`: what the controller sees of one
//! KThreesControlPlane (members <-> Machines <-> Nodes, quorum arithmetic) and
//! what it would do next, and why. Reads only: the same `observe` and `plan`
//! as the controller, never `act`, never a status write.

use std::path::PathBuf;
use std::process::ExitCode;

use kube::Api;
use prometheus_client::registry::Registry;
use serde::Serialize;

use crate::api::KThreesControlPlane;
use crate::api::Machine;
use crate::api::names::{HEALTH_CHECK_SUCCEEDED_CONDITION, OWNER_REMEDIATED_CONDITION};
use crate::controller::etcd_pool::EtcdPool;
use crate::controller::metrics::Metrics;
use crate::controller::observe::observe;
use crate::controller::plan::{Refusal, plan};
use crate::controller::view::mapping;
use crate::controller::world::{EtcdObservation, WorkloadState, World};
use crate::controller::{Context, Settings};
use crate::membership::{Ambiguity, MatchRule, MembershipMap};
use crate::quorum::Assessment;

use super::run::management_client;

#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    /// The KThreesControlPlane to inspect.
    #[arg(value_name = "NAMESPACE/NAME")]
    pub target: String,

    /// Kubeconfig of the management cluster (default: $KUBECONFIG, then
    /// ~/.kube/config, then in-cluster config).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,

    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
}

/// Why `inspect` could not produce a report; one line each, naming the
/// argument or the object.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error("NAMESPACE/NAME {given:?}: {reason}")]
    BadTarget { given: String, reason: String },
    #[error("{0}")]
    Client(String),
    #[error("KThreesControlPlane {namespace}/{name} not found")]
    NotFound { namespace: String, name: String },
    #[error("cannot read KThreesControlPlane {namespace}/{name}: {source}")]
    Read {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("{0}")]
    Observe(#[from] crate::controller::Error),
}

/// `NAMESPACE/NAME` split and checked (DNS-1123 characters, both parts present).
pub fn parse_target(given: &str) -> Result<(String, String), InspectError> {
    let bad = |reason: &str| InspectError::BadTarget {
        given: given.to_string(),
        reason: reason.to_string(),
    };
    let Some((namespace, name)) = given.split_once('/') else {
        return Err(bad(
            "expected <namespace>/<name>, e.g. default/my-control-plane",
        ));
    };
    if namespace.is_empty() || name.is_empty() || name.contains('/') {
        return Err(bad(
            "expected <namespace>/<name>, e.g. default/my-control-plane",
        ));
    }
    let valid = |s: &str| {
        s.len() <= 253
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
            && s.starts_with(|c: char| c.is_ascii_alphanumeric())
            && s.ends_with(|c: char| c.is_ascii_alphanumeric())
    };
    if !valid(namespace) {
        return Err(bad(&format!(
            "namespace {namespace:?} is not a valid name (lowercase letters, digits, '-', '.')"
        )));
    }
    if !valid(name) {
        return Err(bad(&format!(
            "name {name:?} is not a valid name (lowercase letters, digits, '-', '.')"
        )));
    }
    Ok((namespace.to_string(), name.to_string()))
}

/// Logging for interactive commands: warnings only unless `RUST_LOG` says
/// otherwise, on stderr so stdout stays the report.
pub fn init_quiet_logging() {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// A read-only controller context on `client` (production settings; it is
/// only used to observe).
pub fn read_only_context(client: kube::Client) -> std::sync::Arc<Context> {
    let metrics = Metrics::register(&mut Registry::default());
    Context::new(client, metrics, EtcdPool::default(), Settings::default())
}

pub async fn run(args: InspectArgs) -> ExitCode {
    crate::install_crypto_provider();
    init_quiet_logging();
    match execute(&args).await {
        Ok(report) => {
            match args.output {
                Output::Text => print!("{}", render_text(&report)),
                Output::Json => match serde_json::to_string_pretty(&report) {
                    Ok(text) => println!("{text}"),
                    Err(err) => {
                        eprintln!("error: cannot encode JSON: {err}");
                        return ExitCode::FAILURE;
                    }
                },
            }
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("error: {}", one_line(&err.to_string()));
            ExitCode::FAILURE
        }
    }
}

async fn execute(args: &InspectArgs) -> Result<Report, InspectError> {
    // The argument is checked before any cluster is contacted.
    let (namespace, name) = parse_target(&args.target)?;
    let client = management_client(args.kubeconfig.as_ref())
        .await
        .map_err(InspectError::Client)?;
    let ctx = read_only_context(client);
    inspect(&ctx, &namespace, &name).await
}

/// Observe the control plane and decide, as one reconcile would, without acting.
pub async fn inspect(ctx: &Context, namespace: &str, name: &str) -> Result<Report, InspectError> {
    let kcps: Api<KThreesControlPlane> = Api::namespaced(ctx.client.clone(), namespace);
    let kcp = kcps
        .get_opt(name)
        .await
        .map_err(|source| InspectError::Read {
            namespace: namespace.to_string(),
            name: name.to_string(),
            source,
        })?
        .ok_or_else(|| InspectError::NotFound {
            namespace: namespace.to_string(),
            name: name.to_string(),
        })?;
    let (world, _etcd) = observe(ctx, kcp).await?;
    Ok(Report::from_world(&world))
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Everything `inspect` shows; `--output json` prints it as is (camelCase keys).
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// `namespace/name` of the KThreesControlPlane.
    pub control_plane: String,
    pub cluster: Option<String>,
    pub workload: WorkloadReport,
    pub etcd: EtcdReport,
    pub members: Vec<MemberRow>,
    pub members_without_machine: Vec<String>,
    pub members_without_machine_count: usize,
    pub machines: Vec<MachineRow>,
    pub machines_without_member: Vec<String>,
    pub ambiguities: Vec<AmbiguityReport>,
    /// The cluster as it stands (no removal); absent without a membership.
    pub quorum: Option<QuorumReport>,
    pub next: NextReport,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadReport {
    pub available: bool,
    pub control_plane_nodes: usize,
    pub reason: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdReport {
    /// `observed`, `notManaged` or `unreachable`.
    pub state: &'static str,
    pub reason: Option<String>,
    pub cluster_id: Option<String>,
    pub leader: Option<String>,
    pub alarms_error: Option<String>,
}

/// One etcd member, its health and what it maps to.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberRow {
    pub name: String,
    pub id: String,
    pub leader: bool,
    pub learner: bool,
    pub healthy: bool,
    /// Why it is not healthy (probe error, reported errors, alarms).
    pub error: Option<String>,
    pub alarms: Vec<String>,
    pub machine: Option<String>,
    pub node: Option<String>,
    /// The mapping rule that paired it with its Machine.
    pub matched_by: Option<MatchRule>,
}

/// One control-plane Machine as remediation sees it.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineRow {
    pub name: String,
    pub node: Option<String>,
    pub member: Option<String>,
    pub deleting: bool,
    pub health_check_succeeded: Option<bool>,
    pub owner_remediated: Option<bool>,
    /// `Type=Status (Reason)` of the MHC conditions, for people.
    pub conditions: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AmbiguityReport {
    pub message: String,
    #[serde(flatten)]
    pub detail: Ambiguity,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QuorumReport {
    pub summary: String,
    #[serde(flatten)]
    pub assessment: Assessment,
}

/// What the controller would do next, and the rule that decided it.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NextReport {
    /// True when the controller refuses to decide at all (then `action` is absent).
    pub refused: bool,
    pub action: Option<String>,
    pub rule: String,
    pub message: String,
}

fn condition_status(machine: &Machine, type_: &str) -> Option<bool> {
    let c = machine.condition(type_)?;
    if c.is_true() {
        Some(true)
    } else if c.is_false() {
        Some(false)
    } else {
        None
    }
}

fn refusal_rule(refusal: &Refusal) -> &'static str {
    match refusal {
        Refusal::Invalid(_) => "refused.invalid-spec",
        Refusal::View(_) => "refused.invalid-object",
        Refusal::AmbiguousMembership(_) => "refused.ambiguous-membership",
        Refusal::NoCluster => "refused.no-cluster",
    }
}

impl Report {
    /// The report of one observation: the mapping and the plan are computed
    /// by the controller's own pure functions.
    pub fn from_world(world: &World) -> Self {
        let map: MembershipMap = mapping(world).unwrap_or_default();
        let snapshot = world.snapshot();
        let node_of_machine = |machine: &str| {
            world
                .machine(machine)
                .and_then(|m| m.node_name())
                .map(str::to_string)
        };
        // A member without a Machine may still have its Node (k3s annotation).
        let node_of_member = |member: &str| {
            world
                .nodes()
                .iter()
                .find(|n| n.etcd_member_name.as_deref() == Some(member))
                .map(|n| n.name.clone())
        };
        let members = snapshot
            .map(|snap| {
                snap.members
                    .iter()
                    .map(|m| {
                        let pairing = map.pairs.iter().find(|p| p.member.id == m.id);
                        let machine = pairing.map(|p| p.machine.clone());
                        MemberRow {
                            name: m.label(),
                            id: format!("{:016x}", m.id),
                            leader: snap.leader == Some(m.id),
                            learner: m.learner,
                            healthy: m.is_healthy(),
                            error: m.unhealthy_reason(),
                            alarms: m.alarms.clone(),
                            node: machine
                                .as_deref()
                                .and_then(node_of_machine)
                                .or_else(|| node_of_member(&m.name)),
                            machine,
                            matched_by: pairing.map(|p| p.rule),
                        }
                    })
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        // etcd lists members by id; people look them up by name.
        let mut members = members;
        members.sort_by(|a, b| a.name.cmp(&b.name));
        let machines = world
            .machines
            .iter()
            .map(|m| {
                let name = m.metadata.name.clone().unwrap_or_default();
                let conditions = [HEALTH_CHECK_SUCCEEDED_CONDITION, OWNER_REMEDIATED_CONDITION]
                    .iter()
                    .filter_map(|t| m.condition(t))
                    .map(|c| {
                        if c.reason.is_empty() {
                            format!("{}={}", c.type_, c.status)
                        } else {
                            format!("{}={} ({})", c.type_, c.status, c.reason)
                        }
                    })
                    .collect();
                MachineRow {
                    node: m.node_name().map(str::to_string),
                    member: map.member_of(&name).map(|p| p.member.label()),
                    deleting: m.is_deleting(),
                    health_check_succeeded: condition_status(m, HEALTH_CHECK_SUCCEEDED_CONDITION),
                    owner_remediated: condition_status(m, OWNER_REMEDIATED_CONDITION),
                    conditions,
                    name,
                }
            })
            .collect();
        let etcd = match &world.etcd {
            EtcdObservation::NotManaged => EtcdReport {
                state: "notManaged",
                reason: Some("no <cluster>-etcd Secret: etcd is not managed".into()),
                cluster_id: None,
                leader: None,
                alarms_error: None,
            },
            EtcdObservation::Unreachable { reason } => EtcdReport {
                state: "unreachable",
                reason: Some(reason.clone()),
                cluster_id: None,
                leader: None,
                alarms_error: None,
            },
            EtcdObservation::Observed(snap) => EtcdReport {
                state: "observed",
                reason: None,
                cluster_id: Some(format!("{:016x}", snap.cluster_id)),
                leader: snap.leader_member().map(|m| m.label()),
                alarms_error: snap.alarms_error.clone(),
            },
        };
        let next = match plan(world) {
            Ok(plan) => {
                let summary = plan.summary();
                NextReport {
                    refused: false,
                    action: Some(summary.action),
                    rule: summary.rule,
                    message: summary.message,
                }
            }
            Err(refusal) => NextReport {
                refused: true,
                action: None,
                rule: refusal_rule(&refusal).to_string(),
                message: refusal.to_string(),
            },
        };
        Report {
            control_plane: format!(
                "{}/{}",
                world.kcp.metadata.namespace.as_deref().unwrap_or_default(),
                world.kcp.metadata.name.as_deref().unwrap_or_default()
            ),
            cluster: world.cluster_name.clone(),
            workload: match &world.workload {
                WorkloadState::Nodes(nodes) => WorkloadReport {
                    available: true,
                    control_plane_nodes: nodes.len(),
                    reason: None,
                },
                WorkloadState::Unavailable { reason } => WorkloadReport {
                    available: false,
                    control_plane_nodes: 0,
                    reason: Some(reason.clone()),
                },
            },
            etcd,
            members,
            members_without_machine_count: map.members_without_machine.len(),
            members_without_machine: map
                .members_without_machine
                .iter()
                .map(|m| m.label())
                .collect(),
            machines,
            machines_without_member: map.machines_without_member.clone(),
            ambiguities: map
                .ambiguities
                .iter()
                .map(|a| AmbiguityReport {
                    message: a.to_string(),
                    detail: a.clone(),
                })
                .collect(),
            quorum: snapshot.map(|snap| {
                let assessment = snap.assess_cluster();
                QuorumReport {
                    summary: assessment.to_string(),
                    assessment,
                }
            }),
            next,
        }
    }
}

fn match_rule_name(rule: MatchRule) -> &'static str {
    match rule {
        MatchRule::NodeAnnotation => "node annotation",
        MatchRule::NamePattern => "name pattern",
        MatchRule::PeerAddress => "peer address",
    }
}

fn yes_no(flag: Option<bool>) -> &'static str {
    match flag {
        Some(true) => "True",
        Some(false) => "False",
        None => "-",
    }
}

/// A left-aligned text table with a header row.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    let mut out = String::new();
    for row in std::iter::once(&header).chain(rows) {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// The membership table alone (members <-> machines <-> nodes).
pub fn render_members(report: &Report) -> String {
    let rows: Vec<Vec<String>> = report
        .members
        .iter()
        .map(|m| {
            vec![
                m.name.clone(),
                m.id.clone(),
                if m.leader { "leader" } else { "-" }.to_string(),
                if m.learner { "learner" } else { "-" }.to_string(),
                match &m.error {
                    None => "healthy".to_string(),
                    Some(reason) => format!("UNHEALTHY: {reason}"),
                },
                if m.alarms.is_empty() {
                    "-".to_string()
                } else {
                    m.alarms.join(",")
                },
                m.machine.clone().unwrap_or_else(|| "(none)".into()),
                m.node.clone().unwrap_or_else(|| "-".into()),
                m.matched_by.map_or("-", match_rule_name).to_string(),
            ]
        })
        .collect();
    table(
        &[
            "MEMBER",
            "ID",
            "LEADER",
            "LEARNER",
            "HEALTH",
            "ALARMS",
            "MACHINE",
            "NODE",
            "MATCHED BY",
        ],
        &rows,
    )
}

/// The whole report for people.
pub fn render_text(report: &Report) -> String {
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    line(format!(
        "KThreesControlPlane {} (Cluster {})",
        report.control_plane,
        report.cluster.as_deref().unwrap_or("none")
    ));
    line(match &report.workload.reason {
        None => format!(
            "workload cluster: {} control-plane node(s)",
            report.workload.control_plane_nodes
        ),
        Some(reason) => format!("workload cluster: unavailable: {reason}"),
    });
    let etcd = &report.etcd;
    line(match etcd.state {
        "observed" => format!(
            "etcd: cluster {}, {} member(s), leader {}",
            etcd.cluster_id.as_deref().unwrap_or("?"),
            report.members.len(),
            etcd.leader.as_deref().unwrap_or("none")
        ),
        state => format!(
            "etcd: {state}: {}",
            etcd.reason.as_deref().unwrap_or_default()
        ),
    });
    if let Some(reason) = &etcd.alarms_error {
        line(format!("etcd alarms: unknown ({reason})"));
    }
    if !report.members.is_empty() {
        line(String::new());
        out.push_str(&render_members(report));
    }
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    line(format!(
        "members without a machine: {}{}",
        report.members_without_machine_count,
        list_suffix(&report.members_without_machine)
    ));
    line(format!(
        "machines without a member: {}{}",
        report.machines_without_member.len(),
        list_suffix(&report.machines_without_member)
    ));
    if report.ambiguities.is_empty() {
        line("ambiguities: none".into());
    } else {
        line(format!("ambiguities: {}", report.ambiguities.len()));
        for a in &report.ambiguities {
            line(format!("  - {}", a.message));
        }
    }
    let rows: Vec<Vec<String>> = report
        .machines
        .iter()
        .map(|m| {
            vec![
                m.name.clone(),
                m.node.clone().unwrap_or_else(|| "(none)".into()),
                m.member.clone().unwrap_or_else(|| "(none)".into()),
                if m.deleting { "yes" } else { "-" }.to_string(),
                yes_no(m.health_check_succeeded).to_string(),
                yes_no(m.owner_remediated).to_string(),
            ]
        })
        .collect();
    line(String::new());
    out.push_str(&table(
        &[
            "MACHINE",
            "NODE",
            "MEMBER",
            "DELETING",
            "HEALTHCHECK",
            "OWNERREMEDIATED",
        ],
        &rows,
    ));
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    line(String::new());
    line(match &report.quorum {
        Some(q) => format!("quorum: {}", q.summary),
        None => "quorum: unknown (no etcd membership observed)".into(),
    });
    let next = &report.next;
    line(match &next.action {
        Some(action) => format!("next: {action} (rule {}): {}", next.rule, next.message),
        None => format!("next: refused (rule {}): {}", next.rule, next.message),
    });
    out
}

fn list_suffix(items: &[String]) -> String {
    if items.is_empty() {
        String::new()
    } else {
        format!(" ({})", items.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_is_namespace_slash_name() {
        assert_eq!(
            parse_target("default/demo-control-plane").unwrap(),
            ("default".to_string(), "demo-control-plane".to_string())
        );
    }

    #[test]
    fn malformed_targets_name_the_argument() {
        for bad in [
            "demo",
            "/demo",
            "default/",
            "a/b/c",
            "Default/x",
            "ns/x_y",
            "",
        ] {
            let err = parse_target(bad).unwrap_err().to_string();
            assert!(err.starts_with("NAMESPACE/NAME"), "{bad:?} gave {err:?}");
            assert!(!err.contains('\n'), "one line: {err:?}");
        }
    }

    #[test]
    fn table_aligns_columns() {
        let text = table(
            &["A", "BB"],
            &[vec!["xxx".into(), "y".into()], vec!["z".into(), "w".into()]],
        );
        assert_eq!(text, "A    BB\nxxx  y\nz    w\n");
    }
}

/// The report of hand-built worlds: pure, no cluster needed.
#[cfg(test)]
mod report_tests {
    use std::net::IpAddr;

    use serde_json::json;

    use super::*;
    use crate::etcd::{MemberSnapshot, MemberStatus, MembershipSnapshot};
    use crate::workload::ControlPlaneNode;

    fn kcp() -> KThreesControlPlane {
        serde_json::from_value(json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta2", "kind": "KThreesControlPlane",
            "metadata": {"name": "cp", "namespace": "ns", "uid": "u1", "generation": 1},
            "spec": {
                "replicas": 3, "version": "v1.30.2+k3s2",
                "machineTemplate": {"infrastructureRef": {
                    "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
                    "kind": "DockerMachineTemplate", "name": "t", "namespace": "ns"
                }}
            },
            "status": {"initialized": true}
        }))
        .unwrap()
    }

    fn machine(name: &str, node: &str, ip: &str) -> Machine {
        serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": name, "namespace": "ns", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {
                "clusterName": "c",
                "bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "KThreesConfig", "name": name}},
                "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": name},
                "version": "v1.30.2+k3s2"
            },
            "status": {"nodeRef": {"name": node}, "addresses": [{"type": "InternalIP", "address": ip}]}
        }))
        .unwrap()
    }

    fn node(name: &str, ip: &str, member: Option<&str>) -> ControlPlaneNode {
        ControlPlaneNode {
            name: name.into(),
            etcd_member_name: member.map(Into::into),
            etcd_node_address: member.map(|_| ip.into()),
            etcd_role: member.is_some(),
            internal_ips: vec![ip.parse::<IpAddr>().unwrap()],
            addresses: vec![("InternalIP".into(), ip.into())],
            ready: Some(true),
        }
    }

    fn member(id: u64, name: &str, ip: &str, leader: u64) -> MemberSnapshot {
        MemberSnapshot {
            id,
            name: name.into(),
            peer_urls: vec![format!("https://{ip}:2380")],
            client_urls: vec![format!("https://{ip}:2379")],
            learner: false,
            status: Some(MemberStatus {
                leader,
                raft_term: 2,
                raft_index: 10,
                raft_applied_index: 10,
                db_size: 1,
                version: "3.4.23".into(),
                errors: vec![],
                is_learner: false,
            }),
            probe_error: None,
            alarms: vec![],
        }
    }

    fn world(
        machines: Vec<Machine>,
        nodes: Vec<ControlPlaneNode>,
        members: Vec<MemberSnapshot>,
    ) -> World {
        World {
            kcp: kcp(),
            cluster_name: Some("c".into()),
            cluster: None,
            machines,
            workload: WorkloadState::Nodes(nodes),
            etcd: EtcdObservation::Observed(MembershipSnapshot {
                cluster_id: 7,
                leader: Some(1),
                members,
                listed_by: "https://10.0.0.1:2379".into(),
                alarms_error: None,
            }),
            now: chrono::Utc::now(),
        }
    }

    #[test]
    fn member_without_machine_and_machine_without_member_are_counted_and_named() {
        // cp-2 runs k3s --disable-etcd (no member); cp-9's member has no Machine
        // and is down: it still counts as a voter.
        let mut orphan = member(9, "cp-9-0a0b0c0d", "10.0.0.9", 0);
        orphan.status = None;
        orphan.probe_error = Some("connection refused".into());
        let w = world(
            vec![
                machine("m0", "cp-0", "10.0.0.1"),
                machine("m1", "cp-1", "10.0.0.2"),
                machine("m2", "cp-2", "10.0.0.3"),
            ],
            vec![
                node("cp-0", "10.0.0.1", Some("cp-0-00000001")),
                node("cp-1", "10.0.0.2", Some("cp-1-00000002")),
                node("cp-2", "10.0.0.3", None),
            ],
            vec![
                member(1, "cp-0-00000001", "10.0.0.1", 1),
                member(2, "cp-1-00000002", "10.0.0.2", 1),
                orphan,
            ],
        );
        let report = Report::from_world(&w);
        assert_eq!(report.members_without_machine, vec!["cp-9-0a0b0c0d"]);
        assert_eq!(report.members_without_machine_count, 1);
        assert_eq!(report.machines_without_member, vec!["m2"]);
        let orphan = report
            .members
            .iter()
            .find(|m| m.id == format!("{:016x}", 9))
            .unwrap();
        assert_eq!(orphan.machine, None);
        assert!(!orphan.healthy);
        let q = report.quorum.as_ref().unwrap();
        assert_eq!(
            (q.assessment.voters, q.assessment.healthy, q.assessment.size),
            (3, 2, 2)
        );
        assert!(!report.next.refused);

        let text = render_text(&report);
        assert!(
            text.contains("members without a machine: 1 (cp-9-0a0b0c0d)"),
            "{text}"
        );
        assert!(text.contains("machines without a member: 1 (m2)"), "{text}");
        assert!(text.contains("UNHEALTHY: connection refused"), "{text}");
        assert!(
            text.contains("quorum: 2 of 3 voters healthy, quorum needs 2, fault tolerance 0"),
            "{text}"
        );
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["membersWithoutMachineCount"], 1);
        assert_eq!(json["members"][0]["matchedBy"], "nodeAnnotation");
    }

    #[test]
    fn ambiguous_membership_is_shown_and_the_controller_refuses() {
        // Two Nodes claim the same member name: nothing may be decided.
        let w = world(
            vec![
                machine("m0", "cp-0", "10.0.0.1"),
                machine("m1", "cp-1", "10.0.0.2"),
            ],
            vec![
                node("cp-0", "10.0.0.1", Some("cp-0-00000001")),
                node("cp-1", "10.0.0.2", Some("cp-0-00000001")),
            ],
            vec![member(1, "cp-0-00000001", "10.0.0.1", 1)],
        );
        let report = Report::from_world(&w);
        assert_eq!(report.ambiguities.len(), 1);
        assert!(report.next.refused);
        assert_eq!(report.next.action, None);
        assert_eq!(report.next.rule, "refused.ambiguous-membership");
        let text = render_text(&report);
        assert!(text.contains("ambiguities: 1"), "{text}");
        assert!(
            text.contains("member cp-0-00000001 matches machines m0, m1"),
            "{text}"
        );
        assert!(
            text.contains(
                "next: refused (rule refused.ambiguous-membership): etcd membership is ambiguous"
            ),
            "{text}"
        );
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(
            json["ambiguities"][0]["kind"],
            "memberMatchesSeveralMachines"
        );
        assert_eq!(json["next"]["refused"], true);
    }

    #[test]
    fn unreachable_etcd_has_no_quorum_numbers() {
        let mut w = world(vec![machine("m0", "cp-0", "10.0.0.1")], vec![], vec![]);
        w.etcd = EtcdObservation::Unreachable {
            reason: "no control-plane Node with an InternalIP to reach etcd at".into(),
        };
        let report = Report::from_world(&w);
        assert!(report.quorum.is_none());
        assert_eq!(report.etcd.state, "unreachable");
        let text = render_text(&report);
        assert!(
            text.contains("etcd: unreachable: no control-plane Node"),
            "{text}"
        );
        assert!(text.contains("quorum: unknown"), "{text}");
    }
}
