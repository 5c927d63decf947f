//! From API objects to the remediation model: the observed [`World`] becomes a
//! [`ControlPlaneView`] the pure rules decide on. Pure.

use std::collections::BTreeMap;

use crate::api::conditions::ConditionView;
use crate::api::names::{
    CAPI_PRE_TERMINATE_HOOK_PREFIX, DELETE_MACHINE_ANNOTATION, EXTERNALLY_REMEDIATED_CONDITION,
    HEALTH_CHECK_SUCCEEDED_CONDITION, K3S_ETCD_NODE_NAME_ANNOTATION, K3S_NOT_A_MEMBER_REASON,
    OWNER_REMEDIATED_CONDITION, PRE_TERMINATE_HOOK_ANNOTATION, REMEDIATE_MACHINE_ANNOTATION,
    REMEDIATION_FOR_ANNOTATION, REMEDIATION_IN_PROGRESS_ANNOTATION,
    UPSTREAM_PRE_TERMINATE_HOOK_ANNOTATION, UPSTREAM_PRE_TERMINATE_HOOK_VALUE,
};
use crate::api::names::{KCP_FINALIZER, PAUSED_ANNOTATION};
use crate::api::{KThreesControlPlane, Machine};
use crate::lifecycle::{ClusterState, LifecycleView, OwnedMachine};
use crate::membership::{self, MachineRef, MemberRef, MembershipMap};
use crate::remediation::model::{
    ControlPlaneView, EtcdState, MachineView, MemberMissing, Membership, RemediationData,
    RemediationStrategy,
};
use crate::remediation::steps::parse_hook_value;

use super::world::{EtcdObservation, World};
use crate::api::time::to_chrono;

/// Bad observed input that must stop the reconcile: named by object and field.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{object}: {field}: {reason}")]
pub struct ViewError {
    pub object: String,
    pub field: String,
    pub reason: String,
}

/// The member <-> Machine mapping for this world (empty without a snapshot).
pub fn mapping(world: &World) -> Option<MembershipMap> {
    let snapshot = world.snapshot()?;
    let machines: Vec<MachineRef> = world
        .machines
        .iter()
        .map(|m| machine_ref(world, m))
        .collect();
    let members: Vec<MemberRef> = snapshot
        .members
        .iter()
        .map(|m| MemberRef {
            id: m.id,
            name: m.name.clone(),
            peer_urls: m.peer_urls.clone(),
        })
        .collect();
    Some(membership::map_members(&machines, &members))
}

fn machine_ref(world: &World, machine: &Machine) -> MachineRef {
    let node = machine.node_name().and_then(|n| world.node(n));
    let mut addresses: Vec<String> = machine
        .addresses()
        .iter()
        .map(|a| a.address.clone())
        .collect();
    if let Some(node) = node {
        addresses.extend(node.internal_ips.iter().map(ToString::to_string));
    }
    addresses.sort();
    addresses.dedup();
    MachineRef {
        machine: name_of(machine),
        node_name: machine.node_name().map(str::to_string),
        addresses,
        node_annotations: node
            .and_then(|n| n.etcd_member_name.clone())
            .map(|member| BTreeMap::from([(K3S_ETCD_NODE_NAME_ANNOTATION.to_string(), member)]))
            .unwrap_or_default(),
    }
}

fn name_of(machine: &Machine) -> String {
    machine.metadata.name.clone().unwrap_or_default()
}

fn condition_status(view: Option<ConditionView<'_>>) -> Option<bool> {
    let view = view?;
    if view.is_true() {
        Some(true)
    } else if view.is_false() {
        Some(false)
    } else {
        None
    }
}

fn remediation_data(
    annotations: &BTreeMap<String, String>,
    key: &'static str,
    object: &str,
) -> Result<Option<RemediationData>, ViewError> {
    annotations
        .get(key)
        .map(|v| {
            RemediationData::parse(v, object, key).map_err(|e| ViewError {
                object: object.to_string(),
                field: format!("metadata.annotations[{key}]"),
                reason: e.to_string(),
            })
        })
        .transpose()
}

/// What our handshakes saw of each Machine's certificates, by Machine name:
/// the earlier of its etcd member's serving certificate (the member
/// `mapping` pairs with it) and its k3s serving certificate (the daily probe).
pub fn observed_expiries(
    world: &World,
    mapping: Option<&MembershipMap>,
) -> BTreeMap<String, crate::rollout::certificates::Expiry> {
    let etcd: BTreeMap<&str, chrono::DateTime<chrono::Utc>> = mapping
        .map(|mapping| {
            mapping
                .pairs
                .iter()
                .filter_map(|p| Some((p.machine.as_str(), *world.serving_certs.get(&p.member.id)?)))
                .collect()
        })
        .unwrap_or_default();
    world
        .machines
        .iter()
        .filter_map(|m| {
            let name = m.metadata.name.as_deref()?;
            let found = crate::rollout::certificates::earliest_observed(
                etcd.get(name).copied(),
                world.k3s_serving_certs.get(name).copied(),
            )?;
            Some((name.to_string(), found))
        })
        .collect()
}

/// The remediation model of `world`.
pub fn control_plane_view(
    world: &World,
    mapping: Option<&MembershipMap>,
    outdated: &crate::rollout::OutdatedMachines,
) -> Result<ControlPlaneView, ViewError> {
    let kcp = &world.kcp;
    let kcp_name = format!(
        "KThreesControlPlane {}/{}",
        kcp.metadata.namespace.as_deref().unwrap_or_default(),
        kcp.metadata.name.as_deref().unwrap_or_default()
    );
    let empty = BTreeMap::new();
    let kcp_annotations = kcp.metadata.annotations.as_ref().unwrap_or(&empty);
    let mut machines = Vec::with_capacity(world.machines.len());
    for machine in &world.machines {
        machines.push(machine_view(world, machine, mapping, outdated)?);
    }
    Ok(ControlPlaneView {
        name: kcp.metadata.name.clone().unwrap_or_default(),
        initialized: control_plane_started(world),
        desired_replicas: kcp.desired_replicas().max(0) as u32,
        strategy: strategy(kcp),
        remediation_in_progress: remediation_data(
            kcp_annotations,
            REMEDIATION_IN_PROGRESS_ANNOTATION,
            &kcp_name,
        )?,
        etcd: match &world.etcd {
            EtcdObservation::NotManaged => EtcdState::NotManaged,
            EtcdObservation::Unreachable { reason } | EtcdObservation::NoCredentials { reason } => {
                EtcdState::Unreachable {
                    reason: reason.clone(),
                }
            }
            // Unknown alarms are not "no alarms": nothing may be removed on a
            // guess. Unless quorum is lost: then the rules refuse every removal
            // on that ground, and say so with the numbers.
            EtcdObservation::Observed(s)
                if s.alarms_error.is_some()
                    && crate::quorum::quorum_lost(&s.member_views()).is_none() =>
            {
                EtcdState::Unreachable {
                    reason: format!(
                        "etcd alarms could not be read: {}",
                        s.alarms_error.as_deref().unwrap_or_default()
                    ),
                }
            }
            EtcdObservation::Observed(s) => EtcdState::Observed(Membership {
                members: s.member_views(),
                leader: s.leader,
            }),
        },
        failure_domains: world
            .cluster
            .as_ref()
            .map(|c| {
                c.control_plane_failure_domains()
                    .into_iter()
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default(),
        pending_topology_version: pending_topology_version(world),
        machines,
    })
}

/// The Cluster topology's version while it differs from ours: CAPI's topology
/// controller has yet to carry it to `spec.version` (it waits for the control
/// plane to be stable first), and remediating now would make a Machine of the
/// version about to be replaced (KCP's rule).
fn pending_topology_version(world: &World) -> Option<String> {
    let topology = world.cluster.as_ref()?.topology_version()?;
    (topology != world.kcp.spec.version).then(|| topology.to_string())
}

/// Whether the rules must treat the control plane as initialized, so that
/// etcd is consulted before anything is removed: from what is observed, never
/// from our own status alone (a KThreesControlPlane re-created by
/// `clusterctl move` has no status; a workload API that is down hides the
/// Nodes). Our status says so, a Machine has a nodeRef (its server
/// registered a Node), a Node was read, or etcd answered with members.
fn control_plane_started(world: &World) -> bool {
    world.control_plane_initialized()
        || world.machines.iter().any(|m| m.node_name().is_some())
        || world.snapshot().is_some_and(|s| !s.members.is_empty())
}

/// The lifecycle decision's input, from `world`.
pub fn lifecycle_view(world: &World) -> LifecycleView {
    let kcp = &world.kcp;
    let has = |annotations: Option<&BTreeMap<String, String>>, key: &str| {
        annotations.is_some_and(|a| a.contains_key(key))
    };
    LifecycleView {
        kcp_deleting: kcp.metadata.deletion_timestamp.is_some(),
        kcp_paused: has(kcp.metadata.annotations.as_ref(), PAUSED_ANNOTATION),
        has_finalizer: kcp
            .metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| f.iter().any(|f| f == KCP_FINALIZER)),
        cluster: match &world.cluster {
            None => ClusterState::Missing,
            Some(c) => ClusterState::Present {
                deleting: c.is_deleting(),
                paused: c.spec.paused == Some(true)
                    || has(c.metadata.annotations.as_ref(), PAUSED_ANNOTATION),
                infrastructure_provisioned: c.infrastructure_provisioned(),
            },
        },
        secrets: world.secrets.clone(),
        machines: world
            .machines
            .iter()
            .map(|m| OwnedMachine {
                name: name_of(m),
                deleting: m.is_deleting(),
                // cluster-api-k3s's hook on a Machine it left is ours to
                // release too, or a teardown would wait on it forever.
                has_our_hook: has(
                    m.metadata.annotations.as_ref(),
                    PRE_TERMINATE_HOOK_ANNOTATION,
                ) || m
                    .metadata
                    .annotations
                    .as_ref()
                    .is_some_and(has_upstream_hook),
            })
            .collect(),
        foreign_machines: world.foreign_machines.clone(),
        workers: world.workers.clone(),
    }
}

fn strategy(kcp: &KThreesControlPlane) -> RemediationStrategy {
    // The validator has already refused invalid durations; defaults otherwise.
    let defaults = RemediationStrategy::default();
    RemediationStrategy {
        max_retry: kcp.max_retry().map(|n| n.max(0) as u32),
        retry_period: kcp.retry_period().unwrap_or(defaults.retry_period),
        min_healthy_period: kcp
            .min_healthy_period()
            .unwrap_or(defaults.min_healthy_period),
    }
}

fn machine_view(
    world: &World,
    machine: &Machine,
    mapping: Option<&MembershipMap>,
    outdated: &crate::rollout::OutdatedMachines,
) -> Result<MachineView, ViewError> {
    let name = name_of(machine);
    let object = format!(
        "Machine {}/{}",
        machine.metadata.namespace.as_deref().unwrap_or_default(),
        name
    );
    let empty = BTreeMap::new();
    let annotations = machine.metadata.annotations.as_ref().unwrap_or(&empty);
    let hook = match annotations.get(PRE_TERMINATE_HOOK_ANNOTATION) {
        Some(value) => Some(parse_hook_value(value).map_err(|reason| ViewError {
            object: object.clone(),
            field: format!("metadata.annotations[{PRE_TERMINATE_HOOK_ANNOTATION}]"),
            reason,
        })?),
        None => None,
    };
    let waiting_v1beta2 = machine
        .condition("Deleting")
        .is_some_and(|c| c.is_true() && c.reason == "WaitingForPreTerminateHook");
    let waiting_v1beta1 = crate::api::conditions::get_v1beta1(
        machine.v1beta1_conditions(),
        "PreTerminateDeleteHookSucceeded",
    )
    .is_some_and(|c| c.status == "False");
    let node = machine.node_name().and_then(|n| world.node(n));
    let outdated_reasons = outdated
        .get(machine.metadata.name.as_deref().unwrap_or_default())
        .cloned()
        .unwrap_or_default();
    Ok(MachineView {
        name: name.clone(),
        created: machine
            .metadata
            .creation_timestamp
            .as_ref()
            .map(to_chrono)
            .unwrap_or(world.now),
        deleting: machine.metadata.deletion_timestamp.as_ref().map(to_chrono),
        node_ref: machine.node_name().map(str::to_string),
        failure_domain: machine.spec.failure_domain.clone(),
        health_check_succeeded: condition_status(
            machine.condition(HEALTH_CHECK_SUCCEEDED_CONDITION),
        ),
        owner_remediated: condition_status(machine.condition(OWNER_REMEDIATED_CONDITION)),
        externally_remediated: machine.condition(EXTERNALLY_REMEDIATED_CONDITION).is_some(),
        remediate_requested: annotations.contains_key(REMEDIATE_MACHINE_ANNOTATION),
        remediation_for: remediation_data(annotations, REMEDIATION_FOR_ANNOTATION, &object)?,
        delete_requested: annotations.contains_key(DELETE_MACHINE_ANNOTATION),
        outdated: !outdated_reasons.is_empty(),
        outdated_reasons,
        etcd_member: mapping
            .and_then(|m| m.member_of(&name))
            .map(|p| p.member.id),
        etcd_member_missing: member_missing(world, machine, mapping),
        components_healthy: node.and_then(|n| n.ready),
        has_our_hook: annotations.contains_key(PRE_TERMINATE_HOOK_ANNOTATION),
        hook_member: hook.and_then(|h| h.member),
        removal_chosen: hook.is_some_and(|h| h.removal_chosen),
        has_upstream_hook: has_upstream_hook(annotations),
        other_pre_terminate_hooks: other_pre_terminate_hooks(annotations),
        waiting_for_pre_terminate_hook: waiting_v1beta2 || waiting_v1beta1,
        leadership_move: world
            .leadership_move
            .as_ref()
            .filter(|m| m.machine == name)
            .map(|m| crate::remediation::model::MoveInFlight {
                from: m.from,
                to: m.to,
                in_time: world.now < m.deadline,
            }),
    })
}

/// `machine`'s Node shows embedded etcd but the membership read this time maps
/// no member to it. Judged only on a membership that was read, and never for
/// a deleting Machine (its member is being removed on purpose).
fn member_missing(
    world: &World,
    machine: &Machine,
    mapping: Option<&MembershipMap>,
) -> Option<MemberMissing> {
    let mapping = mapping?;
    world.snapshot()?;
    if machine.is_deleting() {
        return None;
    }
    let name = name_of(machine);
    if mapping.member_of(&name).is_some() {
        return None;
    }
    let node = machine.node_name().and_then(|n| world.node(n))?;
    if !node.shows_embedded_etcd() {
        return None;
    }
    let since = node
        .etcd_voter
        .as_ref()
        .filter(|v| !v.voter && v.reason == K3S_NOT_A_MEMBER_REASON)
        .and_then(|v| v.since)
        .or(node.created)
        .unwrap_or(world.now);
    let waited = (world.now - since).to_std().unwrap_or_default();
    Some(MemberMissing {
        node: node.name.clone(),
        marks: node.etcd_marks(),
        since,
        confirmed: waited >= world.member_missing_grace,
    })
}

/// cluster-api-k3s's hook is on the Machine: its key with its value, exactly
/// as its Machine controller tests for it before releasing it.
pub fn has_upstream_hook(annotations: &BTreeMap<String, String>) -> bool {
    annotations
        .get(UPSTREAM_PRE_TERMINATE_HOOK_ANNOTATION)
        .is_some_and(|v| v == UPSTREAM_PRE_TERMINATE_HOOK_VALUE)
}

/// The annotations a merge patch sets to null to release our hold on a
/// Machine: our hook, and cluster-api-k3s's when it is on the Machine with its
/// own value (the bare key under another value is someone else's). Every
/// release, by the removal steps or by a teardown, writes exactly this.
pub fn hooks_to_release(
    annotations: Option<&BTreeMap<String, String>>,
) -> serde_json::Map<String, serde_json::Value> {
    let mut release = serde_json::Map::new();
    release.insert(
        PRE_TERMINATE_HOOK_ANNOTATION.into(),
        serde_json::Value::Null,
    );
    if annotations.is_some_and(has_upstream_hook) {
        release.insert(
            UPSTREAM_PRE_TERMINATE_HOOK_ANNOTATION.into(),
            serde_json::Value::Null,
        );
    }
    release
}

/// The pre-terminate hooks of other owners: every key CAPI counts as a hook
/// (prefix match without a trailing `/`, as CAPI's Machine controller does),
/// but ours and cluster-api-k3s's (which is ours to release after a takeover).
/// The bare key under any other value is someone else's.
pub fn other_pre_terminate_hooks(annotations: &BTreeMap<String, String>) -> Vec<String> {
    annotations
        .keys()
        .filter(|k| k.starts_with(CAPI_PRE_TERMINATE_HOOK_PREFIX))
        .filter(|k| k.as_str() != PRE_TERMINATE_HOOK_ANNOTATION)
        .filter(|k| {
            k.as_str() != UPSTREAM_PRE_TERMINATE_HOOK_ANNOTATION || !has_upstream_hook(annotations)
        })
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The view of `w` under its own KThreesControlPlane's desired state.
    fn view_of(w: &World, mapping: Option<&MembershipMap>) -> Result<ControlPlaneView, ViewError> {
        let desired = crate::rollout::desired(&w.kcp);
        let outdated = crate::rollout::outdated_machines(
            &desired,
            &w.machines,
            &observed_expiries(w, mapping),
            w.now,
        );
        control_plane_view(w, mapping, &outdated)
    }
    use crate::decision::fixtures::{self, WorldBuilder};
    use crate::etcd::MembershipSnapshot;

    /// etcd answered: server 0's member alone, a healthy voter.
    fn answered() -> WorldBuilder {
        WorldBuilder::new().with_member(fixtures::member(0))
    }

    fn alarms_unreadable(why: &str) -> impl FnOnce(&mut MembershipSnapshot) {
        move |s| s.alarms_error = Some(why.into())
    }

    /// A KThreesControlPlane re-created by `clusterctl move` has no status;
    /// while the workload API is down no Node is read either. Whether the
    /// removal rules consult etcd comes from what is observed: a Machine with
    /// a nodeRef, or a membership that answered with members.
    #[test]
    fn a_dropped_status_does_not_switch_etcd_off() {
        let machine = fixtures::server_machine(0);
        let answered = || answered().build().etcd;
        let cases: [(&str, Option<Machine>, EtcdObservation, bool); 4] = [
            (
                "no status, Nodes unread, a Machine with a nodeRef",
                Some(machine.clone()),
                EtcdObservation::Unreachable {
                    reason: "timeout".into(),
                },
                true,
            ),
            (
                "no status, Nodes unread, etcd answered with members",
                None,
                answered(),
                true,
            ),
            (
                "no status, Nodes unread, no nodeRef, etcd unreachable: nothing has started",
                None,
                EtcdObservation::Unreachable {
                    reason: "timeout".into(),
                },
                false,
            ),
            (
                "no status, a Machine with a nodeRef and etcd answered",
                Some(machine.clone()),
                answered(),
                true,
            ),
        ];
        for (name, machine, etcd, initialized) in cases {
            let w = WorldBuilder::new()
                .with_etcd(etcd)
                .nodes_unreadable("x509: certificate has expired")
                .with_machines(machine)
                .build();
            assert!(w.kcp.status.is_none(), "{name}: the status was dropped");
            let view = view_of(&w, None).unwrap();
            assert_eq!(view.initialized, initialized, "{name}");
        }
    }

    /// Machines created by an earlier version, taken over from
    /// cluster-api-k3s or restored by `clusterctl move` lack our hook: they
    /// get it before anything else, so that a deletion anyone starts waits
    /// for etcd. A deleting Machine is left alone (its hook may have been
    /// released by us, or removed by a person on purpose).
    #[test]
    fn live_machines_without_our_hook_get_it_before_anything_else() {
        use crate::decision::plan::{Action, plan};
        let machines = |names: &[&str]| {
            names
                .iter()
                .map(|n| fixtures::machine(n))
                .collect::<Vec<_>>()
        };
        let w = WorldBuilder::new()
            .with_machines(machines(&["m0", "m1", "m2", "m3"]))
            .without_our_hook("m0")
            .without_our_hook("m2")
            .without_our_hook("m3")
            .deleting("m3")
            .build();
        let p = plan(&w).unwrap();
        assert_eq!(p.rule, "hooks.adopt", "{}", p.message);
        match &p.action {
            Action::AddHooks { machines } => assert_eq!(machines, &["m0", "m2"]),
            other => panic!("expected AddHooks, got {other:?}"),
        }
        let w = WorldBuilder::new()
            .with_machines(machines(&["m0", "m1", "m3"]))
            .without_our_hook("m3")
            .deleting("m3")
            .build();
        let p = plan(&w).unwrap();
        assert!(!matches!(p.action, Action::AddHooks { .. }), "{}", p.rule);
    }

    #[test]
    fn unreadable_alarms_make_the_membership_unknown_not_alarm_free() {
        // A healthy voter alone: quorum holds, so only the alarms are unknown.
        let w = answered()
            .edit_membership(alarms_unreadable("etcdserver: request timed out"))
            .build();
        let view = view_of(&w, None).unwrap();
        match view.etcd {
            EtcdState::Unreachable { reason } => {
                assert!(reason.contains("request timed out"), "{reason}")
            }
            other => panic!("expected Unreachable, got {other:?}"),
        }
        let view = view_of(&answered().build(), None).unwrap();
        assert!(matches!(view.etcd, EtcdState::Observed(_)));
    }

    #[test]
    fn with_quorum_lost_the_rules_see_the_membership_even_if_alarms_are_unreadable() {
        let lost = WorldBuilder::new()
            .with_member(fixtures::unhealthy(
                fixtures::member(0),
                "cannot serve a linearizable read",
            ))
            .edit_membership(alarms_unreadable("no voter can reach a quorum"))
            .build();
        let view = view_of(&lost, None).unwrap();
        // Observed: the quorum rule refuses every removal, with the numbers.
        assert!(
            matches!(view.etcd, EtcdState::Observed(_)),
            "{:?}",
            view.etcd
        );
    }

    /// EtcdMemberMissing: a server whose Node shows embedded etcd but whose
    /// member is gone; never for a `--disable-etcd` server, a deleting Machine,
    /// or while the grace period runs (a restart rejoins as a learner).
    #[test]
    fn a_member_is_missing_only_where_the_node_shows_embedded_etcd() {
        use crate::workload::nodes::EtcdVoterCondition;
        type Marks = fn(&mut crate::workload::ControlPlaneNode);
        let cases: Vec<(&str, Marks, bool, Option<bool>)> = vec![
            ("disable_etcd_server_has_no_marks", |_| {}, false, None),
            (
                "etcd_label_without_member",
                |n| n.etcd_role = true,
                false,
                Some(true),
            ),
            (
                "member_annotation_without_member",
                |n| n.etcd_member_name = Some("cp-1-0000000a".into()),
                false,
                Some(true),
            ),
            (
                "not_a_member_for_an_hour",
                |n| {
                    n.etcd_role = true;
                    n.etcd_voter = Some(EtcdVoterCondition {
                        voter: false,
                        reason: "NotAMember".into(),
                        message: String::new(),
                        since: Some(chrono::Utc::now() - chrono::Duration::hours(1)),
                    });
                },
                false,
                Some(true),
            ),
            (
                "a_stale_voter_condition_alone_is_no_etcd_mark",
                |n| {
                    n.etcd_voter = Some(EtcdVoterCondition {
                        voter: false,
                        reason: "NotAMember".into(),
                        message: String::new(),
                        since: Some(chrono::Utc::now() - chrono::Duration::hours(1)),
                    });
                },
                false,
                None,
            ),
            (
                "not_a_member_within_the_grace_period",
                |n| {
                    n.etcd_role = true;
                    n.etcd_voter = Some(EtcdVoterCondition {
                        voter: false,
                        reason: "NotAMember".into(),
                        message: String::new(),
                        since: Some(chrono::Utc::now() - chrono::Duration::seconds(10)),
                    });
                },
                false,
                Some(false),
            ),
            (
                "deleting_machine_is_never_missing",
                |n| n.etcd_role = true,
                true,
                None,
            ),
        ];
        for (name, marks, deleting, want) in cases {
            // Server 1, up an hour, marked as the case says; etcd lists
            // only server 0's member.
            let mut server = WorldBuilder::new()
                .with_member(fixtures::member(0))
                .with_machine(fixtures::server_machine(1))
                .with_node(fixtures::node_without_etcd(1))
                .edit_node("cp-1", |n| {
                    n.created = Some(chrono::Utc::now() - chrono::Duration::hours(1));
                    marks(n);
                });
            if deleting {
                server = server.deleting("m1");
            }
            let w = server.build();
            let map = mapping(&w);
            let view = view_of(&w, map.as_ref()).unwrap();
            let got = view.machines[0]
                .etcd_member_missing
                .as_ref()
                .map(|m| m.confirmed);
            assert_eq!(
                got, want,
                "{name}: {:?}",
                view.machines[0].etcd_member_missing
            );
            assert_eq!(
                view.etcd_member_unhealthy(&view.machines[0]),
                want == Some(true),
                "{name}"
            );
        }
    }

    #[test]
    fn a_release_clears_ours_and_upstreams_hook_but_not_someone_elses_bare_key() {
        let keys = |pairs: &[(&str, &str)]| -> Vec<String> {
            hooks_to_release(Some(&annotations(pairs)))
                .keys()
                .cloned()
                .collect()
        };
        assert_eq!(keys(&[]), [PRE_TERMINATE_HOOK_ANNOTATION]);
        let mut both = keys(&[(UPSTREAM_PRE_TERMINATE_HOOK_ANNOTATION, "k3s")]);
        both.sort();
        let mut expected = vec![
            PRE_TERMINATE_HOOK_ANNOTATION.to_string(),
            UPSTREAM_PRE_TERMINATE_HOOK_ANNOTATION.to_string(),
        ];
        expected.sort();
        assert_eq!(both, expected);
        assert_eq!(
            keys(&[(UPSTREAM_PRE_TERMINATE_HOOK_ANNOTATION, "someone-else")]),
            [PRE_TERMINATE_HOOK_ANNOTATION]
        );
        assert!(hooks_to_release(None).values().all(|v| v.is_null()));
    }

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_upstream_hook_is_not_another_owners_hook() {
        let a = annotations(&[
            ("pre-terminate.delete.hook.machine.cluster.x-k8s.io", "k3s"),
            (PRE_TERMINATE_HOOK_ANNOTATION, "member=1"),
        ]);
        assert!(has_upstream_hook(&a));
        assert!(other_pre_terminate_hooks(&a).is_empty());
    }

    #[test]
    fn foreign_hooks_still_block_including_the_bare_key_under_another_value() {
        // CAPI matches the prefix without `/`: these all hold the Machine.
        let a = annotations(&[
            (
                "pre-terminate.delete.hook.machine.cluster.x-k8s.io/backup",
                "",
            ),
            (
                "pre-terminate.delete.hook.machine.cluster.x-k8s.ioextra",
                "",
            ),
            ("pre-drain.delete.hook.machine.cluster.x-k8s.io/x", ""),
        ]);
        assert_eq!(
            other_pre_terminate_hooks(&a),
            vec![
                "pre-terminate.delete.hook.machine.cluster.x-k8s.io/backup".to_string(),
                "pre-terminate.delete.hook.machine.cluster.x-k8s.ioextra".to_string(),
            ]
        );
        let a = annotations(&[(
            "pre-terminate.delete.hook.machine.cluster.x-k8s.io",
            "backup",
        )]);
        assert!(!has_upstream_hook(&a));
        assert_eq!(
            other_pre_terminate_hooks(&a),
            vec!["pre-terminate.delete.hook.machine.cluster.x-k8s.io".to_string()]
        );
    }

    #[test]
    fn a_bad_remediation_annotation_names_the_object_and_field() {
        let w = WorldBuilder::new()
            .etcd_not_managed()
            .with_annotations(&[(REMEDIATION_IN_PROGRESS_ANNOTATION, "{not json")])
            .build();
        let err = view_of(&w, None).unwrap_err();
        assert_eq!(err.object, "KThreesControlPlane ns/cp");
        assert!(
            err.field.contains(REMEDIATION_IN_PROGRESS_ANNOTATION),
            "{err}"
        );
    }
}
