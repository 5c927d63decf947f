//! Status: what the KThreesControlPlane and its Machines report after a
//! reconcile, computed from the world and the decision ([`kcp_status`],
//! [`machine_conditions`]). Pure; the controller writes it
//! (`controller::status`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;

use crate::api::Machine;
use crate::api::conditions::{self, V1Beta1Condition};
use crate::api::kcp::{
    ControlPlaneInitializationStatus, EtcdQuorumStatus, KThreesControlPlaneStatus,
};
use crate::api::names::{CLUSTER_NAME_LABEL, CONTROL_PLANE_LABEL, OWNER_REMEDIATED_CONDITION};
use crate::etcd::MembershipSnapshot;
use crate::remediation::decide::{ConditionValue, Outcome};
use crate::remediation::steps::Step;

use super::contract_conditions::{self, Replicas, contract_conditions, v1beta1_mirror};
use super::plan::{Action, Plan, Refusal};
use super::world::{EtcdObservation, World};
use crate::lifecycle::Lifecycle;

pub const ETCD_CLUSTER_HEALTHY: &str = "EtcdClusterHealthy";
pub const ETCD_MEMBER_HEALTHY: &str = "EtcdMemberHealthy";
/// With `run --etcd-space-care`: whether etcd has room (False while NOSPACE
/// is raised), and what the space rule does or why it cannot.
pub const ETCD_SPACE_HEALTHY: &str = "EtcdSpaceHealthy";
pub const SPEC_VALID: &str = "SpecValid";
/// A Machine's condition: made from the current spec (CAPI v1beta2).
pub const UP_TO_DATE: &str = "UpToDate";

fn condition(
    type_: &str,
    status: Option<bool>,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
) -> Condition {
    Condition {
        type_: type_.to_string(),
        status: match status {
            Some(true) => "True",
            Some(false) => "False",
            None => "Unknown",
        }
        .to_string(),
        reason: reason.to_string(),
        message: message.into(),
        observed_generation: generation,
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
    }
}

fn from_value(value: &ConditionValue, generation: Option<i64>) -> Condition {
    condition(
        value.type_,
        Some(value.status),
        value.reason,
        value.message.clone(),
        generation,
    )
}

/// The KThreesControlPlane's status after this reconcile. `plan` is `None`
/// when the lifecycle stopped the reconcile before remediation and scaling
/// (deletion, secrets, mixed management, waiting for the Cluster), and `Err`
/// when the reconcile refused to decide (then conditions say why).
pub fn kcp_status(
    world: &World,
    lifecycle: &Lifecycle,
    plan: Option<std::result::Result<&Plan, &Refusal>>,
    counts: &Replicas,
    space: Option<&super::space::EtcdSpace>,
) -> KThreesControlPlaneStatus {
    let kcp = &world.kcp;
    let generation = kcp.metadata.generation;
    let mut status = kcp.status.clone().unwrap_or_default();
    // Only what was read this reconcile: a margin kept from an earlier read
    // would look healthy while nobody knows.
    status.etcd = etcd_status(world);
    if let Lifecycle::Paused { .. } = lifecycle {
        // Paused: nothing is reconciled, only the Paused condition is written.
        for value in contract_conditions(world, lifecycle, None, counts) {
            if value.type_ == contract_conditions::PAUSED {
                conditions::set(&mut status.conditions, value.to_condition(generation));
            }
        }
        return status;
    }
    let machines = &world.machines;
    status.replicas = machines.len() as i32;
    status.ready_replicas = counts.ready;
    status.available_replicas = Some(counts.available);
    status.up_to_date_replicas = Some(counts.up_to_date);
    status.updated_replicas = counts.up_to_date;
    status.unavailable_replicas = (status.replicas - counts.available).max(0);
    // The lowest version running: Machines that have a Node.
    status.version = machines
        .iter()
        .filter(|m| m.node_name().is_some())
        .filter_map(|m| m.spec.version.clone())
        .min_by(|a, b| compare_versions(a, b));
    if let Some(cluster) = &world.cluster_name {
        status.selector = format!("{CLUSTER_NAME_LABEL}={cluster},{CONTROL_PLANE_LABEL}");
    }
    // Initialized once a first server joined and its API answered; it never goes back.
    let initialized = world.control_plane_initialized();
    status.initialized = initialized;
    status.initialization = Some(ControlPlaneInitializationStatus {
        control_plane_initialized: Some(initialized),
    });
    status.ready = initialized && counts.ready > 0;
    status.observed_generation = generation;

    let conds = &mut status.conditions;
    match plan {
        Some(Err(Refusal::Invalid(errors))) => {
            conditions::set(
                conds,
                condition(
                    SPEC_VALID,
                    Some(false),
                    "InvalidSpec",
                    errors.to_string(),
                    generation,
                ),
            );
        }
        _ => {
            conditions::set(
                conds,
                condition(SPEC_VALID, Some(true), "Valid", "", generation),
            );
        }
    }
    let ok_plan = plan.and_then(|p| p.ok());
    conditions::set(conds, etcd_cluster_condition(world, ok_plan, generation));
    match etcd_space_condition(world, space, generation) {
        Some(c) => {
            conditions::set(conds, c);
        }
        None => {
            conditions::remove(conds, ETCD_SPACE_HEALTHY);
        }
    }
    match plan {
        Some(Ok(plan)) => {
            conditions::set(conds, remediating_condition(plan, generation));
        }
        Some(Err(refusal)) if !matches!(refusal, Refusal::Invalid(_)) => {
            conditions::set(
                conds,
                condition(
                    "Remediating",
                    Some(false),
                    "CannotDecide",
                    refusal.to_string(),
                    generation,
                ),
            );
        }
        Some(Err(_)) => {}
        None => {
            let (reason, message) = match lifecycle {
                Lifecycle::MixedManagement { .. } => ("CannotDecide", lifecycle.message()),
                Lifecycle::Secrets { plan } if plan.blocked.is_some() => {
                    ("CannotDecide", lifecycle.message())
                }
                _ => ("NotRemediating", String::new()),
            };
            conditions::set(
                conds,
                condition("Remediating", Some(false), reason, message, generation),
            );
        }
    }
    for value in contract_conditions(world, lifecycle, ok_plan, counts) {
        conditions::set(conds, value.to_condition(generation));
    }
    let mirror = v1beta1_mirror(conds);
    let deprecated = status
        .deprecated
        .get_or_insert_with(Default::default)
        .v1beta1
        .get_or_insert_with(Default::default);
    for c in mirror {
        conditions::set_v1beta1(&mut deprecated.conditions, c);
    }
    deprecated.ready_replicas = Some(counts.ready);
    deprecated.updated_replicas = Some(counts.up_to_date);
    deprecated.unavailable_replicas = Some((status.replicas - counts.ready).max(0));
    status
}

/// `status.etcd` of this observation: the membership's quorum arithmetic,
/// or `None` when etcd was not read (or not ours).
pub fn etcd_status(world: &World) -> Option<EtcdQuorumStatus> {
    world.snapshot().map(etcd_quorum_status)
}

/// The quorum numbers of `snapshot` as it stands, from the same rule every
/// decision uses ([`MembershipSnapshot::assess_cluster`]).
pub fn etcd_quorum_status(snapshot: &MembershipSnapshot) -> EtcdQuorumStatus {
    let a = snapshot.assess_cluster();
    let n = |v: usize| i32::try_from(v).unwrap_or(i32::MAX);
    EtcdQuorumStatus {
        members: n(snapshot.members.len()),
        voters: n(a.voters),
        healthy_voters: n(a.healthy),
        quorum: n(a.size),
        quorum_margin: n(a.healthy) - n(a.size),
        voter_health: format!("{}/{}", a.healthy, a.voters),
    }
}

fn remediating_condition(plan: &Plan, generation: Option<i64>) -> Condition {
    if let Action::Step { removal, step } = &plan.action {
        return condition(
            "Remediating",
            Some(true),
            "Remediating",
            format!("{}: {step} ({})", removal.machine, plan.rule),
            generation,
        );
    }
    if matches!(plan.action, Action::Wait)
        && let Some(machine) = plan.remediation.machine()
    {
        return condition(
            "Remediating",
            Some(true),
            "RemediationBlocked",
            format!("Machine {machine}: {} ({})", plan.message, plan.rule),
            generation,
        );
    }
    from_value(&plan.remediation.kcp_remediating(), generation)
}

/// `EtcdSpaceHealthy`, with `run --etcd-space-care` only (absent without):
/// False while NOSPACE is raised, with what the space rule does or why it
/// cannot; True otherwise, its reason saying whether a routine
/// defragmentation runs or waits; Unknown while etcd is not read.
fn etcd_space_condition(
    world: &World,
    space: Option<&super::space::EtcdSpace>,
    generation: Option<i64>,
) -> Option<Condition> {
    use crate::space::SpaceDecision;
    if !world.etcd_space.care {
        return None;
    }
    let Some(decision) = space.and_then(|s| s.decision.as_ref()) else {
        return Some(condition(
            ETCD_SPACE_HEALTHY,
            None,
            "EtcdNotRead",
            "etcd was not read this time (see EtcdClusterHealthy)",
            generation,
        ));
    };
    let recovery = decision.is_recovery();
    let reason = match decision {
        SpaceDecision::Fine { .. } => "Healthy",
        SpaceDecision::Act { .. } if recovery => "RecoveringFromNoSpace",
        SpaceDecision::Act { .. } => "Defragmenting",
        SpaceDecision::Blocked { .. } if recovery => "NoSpace",
        SpaceDecision::Blocked { why, .. } if why.is_wait() => "DefragmentationWaiting",
        SpaceDecision::Blocked { .. } => "DefragmentationBlocked",
    };
    let message = match decision {
        SpaceDecision::Fine { message } => message.clone(),
        other => other.to_string(),
    };
    Some(condition(
        ETCD_SPACE_HEALTHY,
        Some(!recovery),
        reason,
        message,
        generation,
    ))
}

fn etcd_cluster_condition(
    world: &World,
    plan: Option<&Plan>,
    generation: Option<i64>,
) -> Condition {
    match &world.etcd {
        EtcdObservation::NotManaged => condition(
            ETCD_CLUSTER_HEALTHY,
            None,
            "EtcdNotManaged",
            "spec.externalDatastore is set and no workload Node shows embedded etcd: no etcd of ours",
            generation,
        ),
        EtcdObservation::NoCredentials { reason } => condition(
            ETCD_CLUSTER_HEALTHY,
            None,
            "EtcdCredentialsUnavailable",
            reason.clone(),
            generation,
        ),
        EtcdObservation::Unreachable { reason } => condition(
            ETCD_CLUSTER_HEALTHY,
            None,
            "EtcdUnreachable",
            reason.clone(),
            generation,
        ),
        EtcdObservation::Observed(snapshot) => {
            let assessment = snapshot.assess_cluster();
            let mut message = assessment.to_string();
            let unmapped: Vec<String> = plan
                .and_then(|p| p.mapping.as_ref())
                .map(|m| {
                    m.members_without_machine
                        .iter()
                        .map(|r| r.label())
                        .collect()
                })
                .unwrap_or_default();
            if !unmapped.is_empty() {
                message.push_str(&format!(
                    "; members without a Machine (counted): {}",
                    unmapped.join(", ")
                ));
            }
            if let Some(crate::remediation::orphans::OrphanDecision::Wait { member, reason }) =
                plan.map(|p| &p.orphans)
            {
                message.push_str(&format!("; {member} is not removed yet: {reason}"));
            }
            if let Some(err) = &snapshot.alarms_error {
                message.push_str(&format!("; alarms could not be read: {err}"));
            }
            if !world.kcp.etcd_is_embedded()
                && let Some(node) = world.embedded_etcd_node()
            {
                message.push_str(&format!(
                    "; spec.externalDatastore is set, but Node {} carries k3s's etcd marks: \
                     etcd is managed",
                    node.name
                ));
            }
            // Direct is the plain case (inspect and the metric say it);
            // a tunnel is worth telling where the health is read.
            if let Some(transport) = world
                .etcd_transport
                .as_ref()
                .filter(|t| t.starts_with("port-forward"))
            {
                message.push_str(&format!("; reached by {transport}"));
            }
            let healthy = assessment.unhealthy.is_empty()
                && assessment.is_safe()
                && snapshot.alarms_error.is_none();
            let reason = if healthy { "Healthy" } else { "Unhealthy" };
            condition(
                ETCD_CLUSTER_HEALTHY,
                Some(healthy),
                reason,
                message,
                generation,
            )
        }
    }
}

/// Compare k3s versions numerically (`v1.30.10+k3s1` > `v1.30.2+k3s2`).
pub fn compare_versions(a: &str, b: &str) -> std::cmp::Ordering {
    let key = |v: &str| -> Vec<u64> {
        v.trim_start_matches('v')
            .split(|c: char| !c.is_ascii_digit())
            .filter(|p| !p.is_empty())
            .map(|p| p.parse().unwrap_or(0))
            .collect()
    };
    key(a).cmp(&key(b))
}

/// The conditions we own on one Machine, as (to set, to remove).
#[derive(Debug)]
pub struct MachineConditions {
    pub set: Vec<Condition>,
    pub set_v1beta1: Vec<V1Beta1Condition>,
    pub remove: Vec<&'static str>,
}

/// What this reconcile says on `machine`: `EtcdMemberHealthy` from the real
/// membership, and `OwnerRemediated` from the decision or the removal in flight.
pub fn machine_conditions(world: &World, plan: &Plan, machine: &Machine) -> MachineConditions {
    let name = machine.name_any();
    let generation = machine.metadata.generation;
    let mut out = MachineConditions {
        set: vec![],
        set_v1beta1: vec![],
        remove: vec![],
    };
    let view = plan.view.machine(&name);
    if let (Some(snapshot), Some(view)) = (world.snapshot(), view) {
        let member = view.etcd_member.and_then(|id| snapshot.member(id));
        out.set.push(match member {
            Some(m) => match m.unhealthy_reason() {
                None => condition(
                    ETCD_MEMBER_HEALTHY,
                    Some(true),
                    "Healthy",
                    format!("member {} is healthy", m.label()),
                    generation,
                ),
                Some(why) => condition(
                    ETCD_MEMBER_HEALTHY,
                    Some(false),
                    "Unhealthy",
                    format!("member {}: {why}", m.label()),
                    generation,
                ),
            },
            None => match &view.etcd_member_missing {
                Some(missing) if missing.confirmed => condition(
                    ETCD_MEMBER_HEALTHY,
                    Some(false),
                    "EtcdMemberMissing",
                    format!(
                        "Node {} shows embedded etcd ({}) but no etcd member maps to it since {}: \
                         its member was removed or evicted",
                        missing.node,
                        missing.marks,
                        missing
                            .since
                            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                    ),
                    generation,
                ),
                Some(missing) => condition(
                    ETCD_MEMBER_HEALTHY,
                    None,
                    "WaitingForEtcdMember",
                    format!(
                        "Node {} shows embedded etcd ({}) but no etcd member maps to it since {}; \
                         a restarting server rejoins as a learner within the grace period",
                        missing.node,
                        missing.marks,
                        missing
                            .since
                            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                    ),
                    generation,
                ),
                None => condition(
                    ETCD_MEMBER_HEALTHY,
                    None,
                    "NoEtcdMember",
                    "no etcd member maps to this Machine and its Node shows no embedded etcd \
                     (a server without etcd, or no Node yet)",
                    generation,
                ),
            },
        });
    }
    if let Some(view) = view {
        // CAPI v1beta2: the owner of a Machine reports whether it is up to date.
        out.set
            .push(if view.outdated_reasons.is_empty() && !view.outdated {
                condition(UP_TO_DATE, Some(true), "UpToDate", "", generation)
            } else {
                condition(
                    UP_TO_DATE,
                    Some(false),
                    "NotUpToDate",
                    crate::rollout::describe(&view.outdated_reasons),
                    generation,
                )
            });
    }
    if plan.remediation.cleanup_owner_remediated.contains(&name) {
        out.remove.push(OWNER_REMEDIATED_CONDITION);
        return out;
    }
    let owner_remediated = match &plan.action {
        Action::Step { removal, step }
            if removal.machine == name && view.is_some_and(|v| v.needs_owner_remediation()) =>
        {
            let (reason, message) = match step {
                Step::DeleteMachine { .. } => {
                    ("MachineDeleting", "Machine is deleting".to_string())
                }
                _ if machine.is_deleting() => {
                    ("MachineDeleting", format!("Machine is deleting: {step}"))
                }
                _ => ("RemediationInProgress", format!("{step} ({})", plan.rule)),
            };
            Some(ConditionValue {
                type_: "OwnerRemediated",
                status: false,
                reason,
                message,
            })
        }
        _ => match plan.remediation.owner_remediated() {
            Some((target, value))
                if target == name && !matches!(plan.remediation.outcome, Outcome::Remediate(_)) =>
            {
                Some(value)
            }
            _ => None,
        },
    };
    if let Some(value) = owner_remediated {
        out.set_v1beta1.push(V1Beta1Condition {
            type_: value.type_.to_string(),
            status: "False".into(),
            severity: Some("Warning".into()),
            reason: Some(value.reason.to_string()),
            message: Some(value.message.clone()),
            last_transition_time: Some(Time(k8s_openapi::jiff::Timestamp::now())),
        });
        out.set.push(from_value(&value, generation));
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::decision::fixtures::WorldBuilder;
    use crate::lifecycle::plan_secrets;

    /// What an earlier reconcile wrote: 3 of 3 healthy.
    fn written_before() -> WorldBuilder {
        WorldBuilder::new().with_status(json!({"etcd": {
            "members": 3, "voters": 3, "healthyVoters": 3, "quorum": 2,
            "quorumMargin": 1, "voterHealth": "3/3"}}))
    }

    fn status_of(world: &World) -> KThreesControlPlaneStatus {
        let lifecycle = Lifecycle::Proceed {
            secrets: plan_secrets(&world.secrets),
        };
        let counts = super::contract_conditions::replicas(
            world,
            &crate::rollout::outdated_machines(
                &crate::rollout::desired(&world.kcp),
                &world.machines,
                &Default::default(),
                world.now,
            ),
        );
        kcp_status(world, &lifecycle, None, &counts, None)
    }

    #[test]
    fn etcd_status_is_the_quorum_of_the_membership_read_now() {
        let w = written_before()
            .with_healthy_servers(3)
            .with_unhealthy_member("m2", "connection refused")
            .build();
        let etcd = status_of(&w).etcd.expect("etcd was read");
        assert_eq!(
            etcd,
            EtcdQuorumStatus {
                members: 3,
                voters: 3,
                healthy_voters: 2,
                quorum: 2,
                quorum_margin: 0,
                voter_health: "2/3".into(),
            }
        );
        // Quorum lost: the margin goes negative (fault tolerance stays 0).
        let w = written_before()
            .with_healthy_servers(3)
            .with_unhealthy_member("m1", "timeout")
            .with_unhealthy_member("m2", "connection refused")
            .build();
        assert_eq!(status_of(&w).etcd.unwrap().quorum_margin, -1);
        // A learner is a member, not a voter.
        let w = written_before()
            .with_healthy_servers(2)
            .with_learner("m1")
            .build();
        let etcd = status_of(&w).etcd.unwrap();
        assert_eq!((etcd.members, etcd.voters, etcd.quorum_margin), (2, 1, 0));
    }

    #[test]
    fn etcd_status_is_absent_not_stale_when_etcd_is_not_read() {
        for etcd in [
            EtcdObservation::Unreachable {
                reason: "connection refused".into(),
            },
            EtcdObservation::NoCredentials {
                reason: "Secret ns/c-etcd not found".into(),
            },
            EtcdObservation::NotManaged,
        ] {
            let w = written_before().with_etcd(etcd.clone()).build();
            let status = status_of(&w);
            assert_eq!(status.etcd, None, "{etcd:?}");
            // The condition says why.
            let c = status
                .conditions
                .iter()
                .find(|c| c.type_ == ETCD_CLUSTER_HEALTHY)
                .unwrap();
            assert_eq!(c.status, "Unknown", "{etcd:?}");
        }
        // Paused: nothing is read, so nothing is claimed.
        let w = written_before().build();
        let paused = kcp_status(
            &w,
            &Lifecycle::Paused {
                by: "the Cluster".into(),
            },
            None,
            &super::contract_conditions::replicas(
                &w,
                &crate::rollout::outdated_machines(
                    &crate::rollout::desired(&w.kcp),
                    &w.machines,
                    &Default::default(),
                    w.now,
                ),
            ),
            None,
        );
        assert_eq!(paused.etcd, None);
    }
}
