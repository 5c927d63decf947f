//! The report `inspect` prints: built from the observed world, pure.

use serde::Serialize;

use crate::api::Machine;
use crate::api::names::{HEALTH_CHECK_SUCCEEDED_CONDITION, OWNER_REMEDIATED_CONDITION};
use crate::decision::world::{EtcdObservation, WorkloadState, World};
use crate::decision::{Decision, decide, decide_lifecycle};
use crate::lifecycle::Lifecycle;
use crate::membership::{Ambiguity, MatchRule, MembershipMap};
use crate::quorum::Assessment;

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
    pub rollout: RolloutReport,
    pub ambiguities: Vec<AmbiguityReport>,
    /// `spec.version`.
    pub version: String,
    /// Machine counts, as `status` reports them.
    pub replicas: ReplicasReport,
    /// The cluster as it stands (no removal); absent without a membership.
    pub quorum: Option<QuorumReport>,
    /// etcd's space; absent without a membership.
    pub space: Option<SpaceReport>,
    /// Each usable cluster CA: its Secret and when it expires.
    pub cluster_cas: Vec<CaReport>,
    /// `spec.etcdBackup`; absent without a target.
    pub backup: Option<BackupReport>,
    /// A restore asked for, under way or done (`EtcdRestoring`); absent
    /// when none ever was.
    pub restore: Option<RestoreReport>,
    pub next: NextReport,
}

/// A restore from a snapshot, as `EtcdRestoring` says.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RestoreReport {
    /// True while one is under way.
    pub restoring: bool,
    pub reason: String,
    pub message: String,
}

/// The snapshots of `spec.etcdBackup`, as `EtcdBackupReady` says.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupReport {
    /// `s3://bucket/folder at endpoint` or the directory.
    pub target: String,
    pub ready: bool,
    pub reason: String,
    pub message: String,
    /// The newest snapshot of each purpose.
    pub last_snapshots: Vec<crate::api::etcd_backup::SnapshotRecord>,
}

/// One cluster CA's expiry.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CaReport {
    pub secret: String,
    pub not_after: chrono::DateTime<chrono::Utc>,
}

/// etcd's space as the decision record has it.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SpaceReport {
    /// The quota of members that do not report theirs: `2.0 GiB (default)`,
    /// `8.0 GiB (annotation)`, or why the annotation is not one.
    pub quota: String,
    /// A NOSPACE alarm is raised: etcd refuses writes.
    pub nospace: bool,
    /// `run --etcd-space-care`: the rule that fired (absent when off).
    pub rule: Option<String>,
    pub message: Option<String>,
}

/// The Machine counts of `status` (the controller's own count).
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicasReport {
    /// `spec.replicas` (default 1).
    pub desired: i32,
    /// Machines, deleting ones included.
    pub machines: i32,
    /// Machines whose Node is ready.
    pub ready: i32,
    /// Machines made from the current spec.
    pub up_to_date: i32,
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
    /// How etcd was reached (`direct`, `port-forward`, with why for `auto`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transport: Option<String>,
    /// Other etcd clusters found on the seeds, never used (k3s T3).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub foreign_clusters: Vec<String>,
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
    /// Its backend file (`dbSize`), when its `Status` answered.
    pub db_size: Option<u64>,
    /// What is in use of it (`dbSizeInUse`).
    pub db_size_in_use: Option<u64>,
    /// 1 - dbSizeInUse / dbSize.
    pub fragmentation: Option<f64>,
    /// Its quota (its own from etcd 3.6, else the annotation or the default).
    pub quota: Option<u64>,
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
    /// `spec.version`.
    pub version: Option<String>,
    /// Made from the current spec (no outdated reason).
    pub up_to_date: bool,
    /// Why it needs a rollout.
    pub outdated: Vec<crate::rollout::OutdatedReason>,
    /// `Type=Status (Reason)` of the MHC conditions, for people.
    pub conditions: Vec<String>,
    /// When its certificates expire, and where that came from; absent when unknown.
    pub certificates_expiry: Option<crate::rollout::certificates::Expiry>,
}

/// Where a rollout stands: the outdated Machines (not deleting) and how they
/// are replaced; the next step is in [`NextReport`].
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutReport {
    /// `rollout.strategy.rollingUpdate.maxSurge`; `None` when invalid.
    pub max_surge: Option<u32>,
    /// `<machine> (<reasons>)` for each outdated Machine not deleting.
    pub outdated: Vec<String>,
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
    /// `status.etcd` as this observation would write it (members, voters,
    /// healthy voters, quorum, margin).
    pub status: crate::api::kcp::EtcdQuorumStatus,
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

/// One line of `inspect -n NAMESPACE`: the detailed [`Report`] in short.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SummaryRow {
    pub name: String,
    pub cluster: Option<String>,
    /// `ready/desired` Machines.
    pub replicas: String,
    pub version: String,
    /// `healthyVoters/voters`, or the etcd state when it was not read
    /// (`unreachable`, `unknown`, `notManaged`, `error`).
    pub etcd: String,
    pub quorum: Option<i32>,
    pub quorum_margin: Option<i32>,
    /// `upToDate/desired` Machines.
    pub up_to_date: String,
    /// `<action> (rule <rule>)`, or `refused (rule <rule>)`, as the detailed
    /// view's `next:` line.
    pub next: String,
    /// Why etcd (or the whole control plane) could not be read.
    pub reason: Option<String>,
}

impl SummaryRow {
    /// The line of one control plane's report.
    pub fn from_report(report: &Report) -> Self {
        let name = report
            .control_plane
            .split_once('/')
            .map_or(report.control_plane.as_str(), |(_, n)| n)
            .to_string();
        let quorum = report.quorum.as_ref().map(|q| &q.status);
        SummaryRow {
            name,
            cluster: report.cluster.clone(),
            replicas: format!("{}/{}", report.replicas.ready, report.replicas.desired),
            version: report.version.clone(),
            etcd: match quorum {
                Some(q) => q.voter_health.clone(),
                None => report.etcd.state.to_string(),
            },
            quorum: quorum.map(|q| q.quorum),
            quorum_margin: quorum.map(|q| q.quorum_margin),
            up_to_date: format!("{}/{}", report.replicas.up_to_date, report.replicas.desired),
            next: report.next.short(),
            reason: match quorum {
                Some(_) => None,
                None => report.etcd.reason.clone(),
            },
        }
    }

    /// The line of a control plane that could not be observed at all.
    pub fn failed(name: &str, cluster: Option<String>, version: &str, error: String) -> Self {
        SummaryRow {
            name: name.to_string(),
            cluster,
            replicas: "-".into(),
            version: version.to_string(),
            etcd: "error".into(),
            quorum: None,
            quorum_margin: None,
            up_to_date: "-".into(),
            next: "-".into(),
            reason: Some(error),
        }
    }
}

impl NextReport {
    /// `<action> (rule <rule>)` or `refused (rule <rule>)`: the `next:` line
    /// without its message.
    pub fn short(&self) -> String {
        match &self.action {
            Some(action) => format!("{action} (rule {})", self.rule),
            None => format!("refused (rule {})", self.rule),
        }
    }
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

/// The action word `inspect` shows for a lifecycle decision.
fn lifecycle_action(lifecycle: &Lifecycle) -> &'static str {
    match lifecycle {
        Lifecycle::Delete { step, .. } => step.name(),
        Lifecycle::AddFinalizer => "add-finalizer",
        Lifecycle::Secrets { plan } if plan.blocked.is_none() => "write-secrets",
        Lifecycle::Proceed { .. } => "proceed",
        _ => "wait",
    }
}

impl Report {
    /// The report of one observation, decided as the controller decides it.
    pub fn from_world(world: &World) -> Self {
        Self::of(world, &decide(world, decide_lifecycle(world)))
    }

    /// The report of `decision`, taken on `world`: every piece is the
    /// record's own, nothing is decided again.
    pub fn of(world: &World, decision: &Decision) -> Self {
        let map: MembershipMap = decision.mapping.clone().unwrap_or_default();
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
        let space = decision.etcd_space.as_ref();
        let member_space = |id: u64| space.and_then(|s| s.cluster.member(id));
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
                            db_size: member_space(m.id).and_then(|s| s.sizes).map(|s| s.db_size),
                            db_size_in_use: member_space(m.id)
                                .and_then(|s| s.sizes)
                                .map(|s| s.in_use),
                            fragmentation: member_space(m.id)
                                .and_then(|s| s.sizes)
                                .map(|s| s.fragmentation()),
                            quota: member_space(m.id).and_then(|s| s.quota),
                        }
                    })
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        // etcd lists members by id; people look them up by name.
        let mut members = members;
        members.sort_by(|a, b| a.name.cmp(&b.name));
        let machines: Vec<MachineRow> = world
            .machines
            .iter()
            .map(|m| {
                let name = m.metadata.name.clone().unwrap_or_default();
                let outdated = decision.outdated.get(&name).cloned().unwrap_or_default();
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
                    version: m.spec.version.clone(),
                    up_to_date: outdated.is_empty(),
                    outdated,
                    conditions,
                    certificates_expiry: decision.certificates.get(&name).copied(),
                    name,
                }
            })
            .collect();
        let etcd = match &world.etcd {
            EtcdObservation::NotManaged => EtcdReport {
                state: "notManaged",
                reason: Some(
                    "external datastore (spec.externalDatastore, and no Node shows embedded etcd): no etcd of ours".into(),
                ),
                cluster_id: None,
                leader: None,
                alarms_error: None,
                transport: world.etcd_transport.clone(),
                foreign_clusters: Vec::new(),
            },
            EtcdObservation::NoCredentials { reason } => EtcdReport {
                state: "unknown",
                reason: Some(reason.clone()),
                cluster_id: None,
                leader: None,
                alarms_error: None,
                transport: world.etcd_transport.clone(),
                foreign_clusters: Vec::new(),
            },
            EtcdObservation::Unreachable { reason } => EtcdReport {
                state: "unreachable",
                reason: Some(reason.clone()),
                cluster_id: None,
                leader: None,
                alarms_error: None,
                transport: world.etcd_transport.clone(),
                foreign_clusters: Vec::new(),
            },
            EtcdObservation::Observed(snap) => EtcdReport {
                state: "observed",
                reason: None,
                cluster_id: Some(format!("{:016x}", snap.cluster_id)),
                leader: snap.leader_member().map(|m| m.label()),
                alarms_error: snap.alarms_error.clone(),
                transport: world.etcd_transport.clone(),
                foreign_clusters: snap.foreign_clusters.iter().map(|f| f.to_string()).collect(),
            },
        };
        let next = match &decision.plan {
            None => NextReport {
                refused: match &decision.lifecycle {
                    Lifecycle::MixedManagement { .. } => true,
                    Lifecycle::Secrets { plan } => plan.blocked.is_some(),
                    _ => false,
                },
                action: Some(lifecycle_action(&decision.lifecycle).to_string()),
                rule: decision.rule(),
                message: decision.message(),
            },
            Some(Ok(plan)) => {
                let summary = plan.summary();
                NextReport {
                    refused: false,
                    action: Some(summary.action),
                    rule: summary.rule,
                    message: summary.message,
                }
            }
            Some(Err(_)) => NextReport {
                refused: true,
                action: None,
                rule: decision.rule(),
                message: decision.message(),
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
            machines_without_member: map.machines_without_member.clone(),
            rollout: RolloutReport {
                max_surge: world.kcp.max_surge(),
                outdated: machines
                    .iter()
                    .filter(|m| !m.up_to_date && !m.deleting)
                    .map(|m| format!("{} ({})", m.name, crate::rollout::describe(&m.outdated)))
                    .collect(),
            },
            machines,
            ambiguities: map
                .ambiguities
                .iter()
                .map(|a| AmbiguityReport {
                    message: a.to_string(),
                    detail: a.clone(),
                })
                .collect(),
            version: world.kcp.spec.version.clone(),
            replicas: {
                let r = &decision.replicas;
                ReplicasReport {
                    desired: r.desired,
                    machines: world.machines.len() as i32,
                    ready: r.ready,
                    up_to_date: r.up_to_date,
                }
            },
            space: space.map(|s| SpaceReport {
                quota: match &s.quota {
                    crate::space_rule::ConfiguredQuota::Default(q) => {
                        format!("{} (default)", crate::space_rule::bytes(*q))
                    }
                    crate::space_rule::ConfiguredQuota::Annotation(q) => {
                        format!("{} (annotation)", crate::space_rule::bytes(*q))
                    }
                    crate::space_rule::ConfiguredQuota::Invalid(why) => format!("unknown: {why}"),
                },
                nospace: s.cluster.nospace,
                rule: s.decision.as_ref().map(|d| d.rule()),
                message: s.decision.as_ref().map(|d| d.message().to_string()),
            }),
            cluster_cas: decision
                .cluster_cas
                .iter()
                .map(|(purpose, at)| CaReport {
                    secret: purpose.secret_name(world.cluster_name.as_deref().unwrap_or_default()),
                    not_after: *at,
                })
                .collect(),
            backup: backup_report(world),
            restore: crate::decision::etcd_restore::condition(
                decision.planned().and_then(|p| p.restore.as_ref()),
                world
                    .kcp
                    .status
                    .as_ref()
                    .and_then(|s| s.etcd_backup.as_ref()),
                None,
            )
            .map(|(restoring, reason, message)| RestoreReport {
                restoring,
                reason: reason.into(),
                message,
            }),
            quorum: snapshot.map(|snap| {
                let assessment = snap.assess_cluster();
                QuorumReport {
                    summary: assessment.to_string(),
                    status: crate::decision::status::etcd_quorum_status(snap),
                    assessment,
                }
            }),
            next,
        }
    }
}

/// The report of hand-built worlds: pure, no cluster needed.
fn backup_report(world: &World) -> Option<BackupReport> {
    let backup = world.kcp.spec.etcd_backup.as_ref()?;
    let status = world
        .kcp
        .status
        .as_ref()
        .and_then(|s| s.etcd_backup.as_ref());
    let (ready, reason, message) =
        crate::decision::etcd_backup::condition(Some(backup), status, world.now)?;
    let target = match (&backup.target.s3, &backup.target.filesystem) {
        (Some(s3), _) => format!(
            "s3://{}/{} at {}",
            s3.bucket,
            s3.folder.as_deref().unwrap_or_default(),
            s3.endpoint
        ),
        (None, Some(fs)) => fs.path.clone(),
        (None, None) => "(none)".into(),
    };
    Some(BackupReport {
        target,
        ready,
        reason: reason.into(),
        message,
        last_snapshots: status.map(|s| s.last_snapshots.clone()).unwrap_or_default(),
    })
}

#[cfg(test)]
mod report_tests {
    use crate::cli::inspect::render_text;

    use serde_json::json;

    use super::*;
    use crate::decision::fixtures::{self, WorldBuilder};
    use crate::etcd::MemberSnapshot;
    use crate::workload::ControlPlaneNode;

    #[test]
    fn a_lifecycle_step_is_the_next_thing_inspect_shows() {
        let mut w = WorldBuilder::new().running().build();
        w.foreign_machines = vec!["other-cp".into()];
        let report = Report::from_world(&w);
        assert!(report.next.refused);
        assert_eq!(report.next.rule, "lifecycle.mixed-management");
        assert!(
            report.next.message.contains("other-cp"),
            "{}",
            report.next.message
        );
        w.foreign_machines.clear();
        w.kcp.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        w.workers = vec!["w-1".into()];
        let report = Report::from_world(&w);
        assert_eq!(report.next.rule, "deletion.wait-for-workers");
        assert_eq!(report.next.action.as_deref(), Some("wait-for-workers"));
    }

    /// A restore asked for while quorum holds: the refusal is the next
    /// thing, and the `etcd restore:` line says why with the numbers.
    #[test]
    fn a_restore_request_and_its_refusal_are_shown() {
        let mut w = WorldBuilder::new().three_healthy_servers().build();
        assert!(Report::from_world(&w).restore.is_none());
        w.kcp.spec.etcd_backup = serde_json::from_value(json!({"target": {"s3": {
            "endpoint": "minio:9000", "bucket": "b", "credentialsSecret": {"name": "k"}}}}))
        .unwrap();
        w.kcp.metadata.annotations = Some(
            [(
                crate::api::names::ETCD_RESTORE_ANNOTATION.to_string(),
                "capi-scheduled-cp-0-1765000000".to_string(),
            )]
            .into(),
        );
        let report = Report::from_world(&w);
        assert_eq!(report.next.rule, "restore.refused.quorum-holds");
        let text = render_text(&report);
        assert!(
            text.contains("etcd restore: RestoreRefused: annotation controlplane.cluster.x-k8s.io/etcd-restore=capi-scheduled-cp-0-1765000000: etcd has quorum (voters 3, healthy 3, quorum 2)"),
            "{text}"
        );
    }

    #[test]
    fn outdated_machines_and_the_rollouts_next_step_are_shown() {
        let mut w = WorldBuilder::new().three_healthy_servers().build();
        let text = super::super::render::render_text(&Report::from_world(&w));
        assert!(
            text.contains("rollout: none, every machine is up to date (maxSurge 1)"),
            "{text}"
        );
        w.kcp.spec.version = "v1.31.4+k3s1".into();
        let report = Report::from_world(&w);
        assert_eq!(report.rollout.outdated.len(), 3);
        assert!(report.machines.iter().all(|m| !m.up_to_date));
        assert_eq!(report.next.rule, "rollout.surge", "{}", report.next.message);
        let text = super::super::render::render_text(&report);
        assert!(
            text.contains(
                "rollout: 3 outdated (maxSurge 1): m0 (version v1.30.2+k3s2 -> v1.31.4+k3s1)"
            ),
            "{text}"
        );
        assert!(
            text.contains("next: create-machine (rule rollout.surge)"),
            "{text}"
        );
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["machines"][0]["outdated"][0]["kind"], "version");
        assert_eq!(json["rollout"]["maxSurge"], 1);
    }

    #[test]
    fn each_members_sizes_and_what_space_care_would_do_are_shown() {
        let mut w = WorldBuilder::new().three_healthy_servers().build();
        if let EtcdObservation::Observed(snap) = &mut w.etcd {
            for m in &mut snap.members {
                let s = m.status.as_mut().unwrap();
                s.db_size = 8 << 20;
                s.db_size_in_use = 2 << 20;
                s.errors = vec!["memberID:3 alarm:NOSPACE ".into()];
            }
            snap.members[2].alarms = vec!["NOSPACE".into()];
        }
        w.kcp.metadata.annotations = Some(
            [(
                crate::api::names::ETCD_QUOTA_ANNOTATION.to_string(),
                "8Mi".to_string(),
            )]
            .into(),
        );
        let report = Report::from_world(&w);
        let text = render_text(&report);
        assert!(
            text.contains(
                "etcd space: quota 8.0 MiB (annotation); NOSPACE raised: etcd refuses writes"
            ),
            "{text}"
        );
        assert!(
            text.contains("etcd space care: off (run --etcd-space-care)"),
            "{text}"
        );
        assert!(text.contains("DB SIZE  IN USE   FREE  QUOTA"), "{text}");
        assert!(text.contains("8.0 MiB  2.0 MiB  75%   8.0 MiB"), "{text}");
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["members"][0]["dbSize"], 8 << 20);
        assert_eq!(json["members"][0]["dbSizeInUse"], 2 << 20);
        assert_eq!(json["members"][0]["quota"], 8 << 20);
        assert_eq!(json["space"]["nospace"], true);

        // With space care, the record's verdict: the full follower first.
        w.etcd_space.care = true;
        let report = Report::from_world(&w);
        assert_eq!(report.next.rule, "etcd-space.defragment");
        assert_eq!(report.next.action.as_deref(), Some("etcd-defragment"));
        let text = render_text(&report);
        assert!(
            text.contains("etcd space care: etcd is out of space (NOSPACE: it refuses writes): defragmenting cp-2-00000003"),
            "{text}"
        );
    }

    #[test]
    fn member_without_machine_and_machine_without_member_are_counted_and_named() {
        // cp-2 runs k3s --disable-etcd (no member); cp-9's member has no Machine
        // and is down: it still counts as a voter.
        let orphan = fixtures::unhealthy(
            MemberSnapshot {
                id: 9,
                name: "cp-9-0a0b0c0d".into(),
                ..fixtures::member(8)
            },
            "connection refused",
        );
        let w = WorldBuilder::new()
            .three_healthy_servers()
            .without_etcd_member("m2")
            .with_member(orphan)
            .build();
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
        let w = WorldBuilder::new()
            .running()
            .with_healthy_servers(2)
            .without_etcd_member("m1")
            .edit_node("cp-1", |n| {
                *n = ControlPlaneNode {
                    etcd_member_name: Some(fixtures::member_name(0)),
                    ..fixtures::node(1)
                }
            })
            .build();
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
    fn summary_lines_reuse_the_report_and_say_when_etcd_is_unknown() {
        use crate::cli::inspect::render_summary;
        let healthy = WorldBuilder::new()
            .three_healthy_servers()
            .with_unhealthy_member("m2", "connection refused")
            .build();
        let report = Report::from_world(&healthy);
        let q = &report.quorum.as_ref().unwrap().status;
        assert_eq!(
            (
                q.members,
                q.voters,
                q.healthy_voters,
                q.quorum,
                q.quorum_margin
            ),
            (3, 3, 2, 2, 0)
        );
        let row = SummaryRow::from_report(&report);
        assert_eq!(row.etcd, "2/3");
        assert_eq!(row.quorum_margin, Some(0));
        assert_eq!(row.next, report.next.short());

        let lost = WorldBuilder::new()
            .running()
            .named("lost")
            .with_machine(fixtures::server_machine(0))
            .etcd_unreachable("no control-plane Node with an InternalIP to reach etcd at")
            .build();
        let lost_row = SummaryRow::from_report(&Report::from_world(&lost));
        assert_eq!(lost_row.etcd, "unreachable");
        assert_eq!((lost_row.quorum, lost_row.quorum_margin), (None, None));
        let text = render_summary(&[row, lost_row]);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("NAME"), "{text}");
        assert!(
            lines[0].contains("ETCD") && lines[0].contains("MARGIN"),
            "{text}"
        );
        let cols = |l: &str| l.split_whitespace().map(String::from).collect::<Vec<_>>();
        assert_eq!(
            cols(lines[1])[..8],
            ["cp", "c", "3/3", "v1.30.2+k3s2", "2/3", "2", "0", "3/3"],
            "{text}"
        );
        assert_eq!(
            cols(lines[2])[..8],
            [
                "lost",
                "c",
                "0/3",
                "v1.30.2+k3s2",
                "unreachable",
                "-",
                "-",
                "1/3"
            ],
            "{text}"
        );
        assert!(
            text.contains("lost: etcd unreachable: no control-plane Node"),
            "{text}"
        );
    }

    #[test]
    fn unreachable_etcd_has_no_quorum_numbers() {
        let w = WorldBuilder::new()
            .running()
            .with_machine(fixtures::server_machine(0))
            .etcd_unreachable("no control-plane Node with an InternalIP to reach etcd at")
            .build();
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
