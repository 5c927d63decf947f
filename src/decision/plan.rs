//! Decide: from the observed [`World`] to the ONE next action, and the rule that
//! chose it. Pure; shared by the controller and `inspect`.
//!
//! Order, as CAPI's KubeadmControlPlane: validate; finish the removal in flight
//! (a Machine carrying our pre-terminate hook, or a recorded remediation);
//! MHC remediation; then scale-down or scale-up towards `spec.replicas`.
//! With `run --etcd-space-care`, etcd's space has its turn after the removals:
//! recovering from NOSPACE before any scaling (the cluster refuses writes),
//! routine defragmentation only when nothing else is to be done.

use serde::Serialize;

use crate::api::ValidationErrors;
use crate::api::validate_kcp;
use crate::membership::MembershipMap;
use crate::remediation::decide::{Outcome, RemediationDecision, decide_remediation};
use crate::remediation::model::ControlPlaneView;
use crate::remediation::orphans::{OrphanDecision, OrphanInput, decide_orphans};
use crate::remediation::scale_down::{
    ScaleDownDecision, decide_outdated_removal, decide_scale_down,
};
use crate::remediation::steps::{Removal, RemovalKind, Step, next_step, resume};
use crate::rollout::preflight;
use crate::rollout::{RolloutDecision, RolloutStep, decide_rollout};
use crate::space_rule::SpaceDecision;

use super::view::{ViewError, control_plane_view, mapping};
use super::world::World;

/// The one thing this reconcile does.
#[derive(Clone, Debug)]
pub enum Action {
    /// Put our pre-terminate hook on these live Machines, which lack it
    /// (created by an earlier version, taken over from cluster-api-k3s,
    /// restored by `clusterctl move`), so that a deletion anyone starts waits
    /// for etcd's consent.
    AddHooks { machines: Vec<String> },
    /// One step of a removal (remediation or scale-down).
    Step { removal: Removal, step: Step },
    /// Scale up by one Machine.
    CreateMachine,
    /// Remove a ghost or orphan etcd member (no Machine, no Node claims it).
    RemoveOrphan {
        member: u64,
        label: String,
        kind: &'static str,
        assessment: crate::quorum::Assessment,
    },
    /// One step on etcd's space (`run --etcd-space-care`).
    EtcdSpace { step: crate::space_rule::SpaceStep },
    /// Save a verified etcd snapshot, streamed from member `from`, to the
    /// target of `spec.etcdBackup`: before removing `before_removal_of`, or
    /// as the schedule asks.
    EtcdSnapshot {
        purpose: crate::api::etcd_backup::SnapshotPurpose,
        from: u64,
        before_removal_of: Option<u64>,
    },
    /// One step of a restore from a snapshot a person asked for
    /// ([`super::etcd_restore`]).
    EtcdRestore {
        step: super::etcd_restore::RestoreStep,
    },
    /// Nothing can be done now; the rule and message say why.
    Wait,
    /// Nothing to do.
    Idle,
}

impl Action {
    /// Whether this action changes etcd or its membership, now or once a
    /// new Machine joins (a leadership move, a member removal, a new
    /// Machine, a restore's step): it is decided on an etcd snapshot taken in
    /// its own pass, never on an earlier pass's.
    pub fn needs_its_own_etcd_snapshot(&self) -> bool {
        self.changes_etcd()
            || matches!(
                self,
                Action::CreateMachine
                    | Action::EtcdRestore { .. }
                    | Action::Step {
                        step: Step::CreateReplacement { .. },
                        ..
                    }
            )
    }

    /// Whether carrying it out changes etcd at once (leadership, members):
    /// the pass after it reads etcd again to see the effect.
    pub fn changes_etcd(&self) -> bool {
        match self {
            Action::Step { step, .. } => {
                matches!(
                    step,
                    Step::MoveLeadership { .. } | Step::RemoveMember { .. }
                )
            }
            Action::RemoveOrphan { .. } | Action::EtcdSpace { .. } => true,
            // A snapshot reads etcd and changes nothing in it; a restore's
            // steps change Machines, not the etcd the pass read.
            Action::CreateMachine
            | Action::AddHooks { .. }
            | Action::EtcdSnapshot { .. }
            | Action::EtcdRestore { .. }
            | Action::Wait
            | Action::Idle => false,
        }
    }
}

/// Why the reconcile cannot even decide.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("{0}")]
    Invalid(ValidationErrors),
    #[error("{0}")]
    View(ViewError),
    #[error("etcd membership is ambiguous: {0}")]
    AmbiguousMembership(String),
    #[error(
        "waiting for the Cluster controller to set the owner reference (or label cluster.x-k8s.io/cluster-name)"
    )]
    NoCluster,
}

impl Refusal {
    /// The rule a refusal is reported under.
    pub fn rule(&self) -> &'static str {
        match self {
            Refusal::Invalid(_) => "refused.invalid-spec",
            Refusal::View(_) => "refused.invalid-object",
            Refusal::AmbiguousMembership(_) => "refused.ambiguous-membership",
            Refusal::NoCluster => "refused.no-cluster",
        }
    }
}

/// The decision of one reconcile, explainable: `rule` names what fired and
/// `message` carries the numbers.
#[derive(Debug)]
pub struct Plan {
    pub view: ControlPlaneView,
    pub mapping: Option<MembershipMap>,
    /// The MHC remediation decision (its conditions are written even when
    /// another action runs).
    pub remediation: RemediationDecision,
    /// The ghost/orphan member rule's verdict (also when it waits).
    pub orphans: OrphanDecision,
    pub action: Action,
    pub rule: String,
    pub message: String,
    /// The restore rule's verdict, when a restore was asked for or is under
    /// way (it then chose `action`).
    pub restore: Option<super::etcd_restore::RestoreDecision>,
}

/// A small summary of the plan for `inspect --output json` and logs.
#[derive(Debug, Serialize)]
pub struct PlanSummary {
    pub action: String,
    pub rule: String,
    pub message: String,
}

impl Plan {
    pub fn summary(&self) -> PlanSummary {
        let action = match &self.action {
            Action::AddHooks { .. } => "add-hooks".to_string(),
            Action::Step { step, .. } => step.name().to_string(),
            Action::CreateMachine => "create-machine".to_string(),
            Action::RemoveOrphan { .. } => "remove-orphan-member".to_string(),
            Action::EtcdSpace { step } => format!("etcd-{}", step.name()),
            Action::EtcdSnapshot { .. } => "etcd-snapshot".to_string(),
            Action::EtcdRestore { step } => format!("etcd-restore-{}", step.name()),
            Action::Wait => "wait".to_string(),
            Action::Idle => "idle".to_string(),
        };
        PlanSummary {
            action,
            rule: self.rule.clone(),
            message: self.message.clone(),
        }
    }
}

/// Decide the next action for `world` on its own mapping and desired state
/// (table tests; the controller takes [`super::decide`]'s record).
pub fn plan(world: &World) -> Result<Plan, Refusal> {
    let desired = crate::rollout::desired(&world.kcp);
    let mapping = mapping(world);
    let observed = super::view::observed_expiries(world, mapping.as_ref());
    let outdated =
        crate::rollout::outdated_machines(&desired, &world.machines, &observed, world.now);
    let space = super::etcd_space::etcd_space(world);
    plan_on(world, mapping, &outdated, space.as_ref())
}

/// Decide the next action for `world`, whose membership maps to its Machines
/// as `mapping` says and whose Machines need a rollout as `outdated` says.
pub fn plan_on(
    world: &World,
    mapping: Option<MembershipMap>,
    outdated: &crate::rollout::OutdatedMachines,
    space: Option<&super::etcd_space::EtcdSpace>,
) -> Result<Plan, Refusal> {
    validate_kcp(&world.kcp).map_err(Refusal::Invalid)?;
    let machine_versions: Vec<(&str, Option<&str>)> = world
        .machines
        .iter()
        .filter(|m| !m.is_deleting())
        .map(|m| {
            (
                m.metadata.name.as_deref().unwrap_or_default(),
                m.spec.version.as_deref(),
            )
        })
        .collect();
    crate::rollout::version::check_against_machines(
        &format!(
            "{}/{}",
            world.kcp.metadata.namespace.as_deref().unwrap_or_default(),
            world.kcp.metadata.name.as_deref().unwrap_or_default()
        ),
        &world.kcp.spec.version,
        &machine_versions,
    )
    .map_err(Refusal::Invalid)?;
    if world.cluster_name.is_none() {
        return Err(Refusal::NoCluster);
    }
    // A restore a person asked for comes before everything else: it does not
    // need the membership mapped (the membership is what was lost).
    let restore = super::etcd_restore::decide_restore(world);
    if let Some(m) = &mapping
        && !m.ambiguities.is_empty()
        && restore.is_none()
    {
        let list: Vec<String> = m.ambiguities.iter().map(ToString::to_string).collect();
        return Err(Refusal::AmbiguousMembership(list.join("; ")));
    }
    let view = control_plane_view(world, mapping.as_ref(), outdated).map_err(Refusal::View)?;
    let remediation = decide_remediation(&view, world.now);
    let orphans = decide_orphans(&view, &orphan_input(world, mapping.as_ref()), world.now);
    if let Some(restore) = restore {
        let (rule, message) = (restore.rule(), restore.message().to_string());
        let action = match &restore {
            super::etcd_restore::RestoreDecision::Step { step, .. } => {
                Action::EtcdRestore { step: step.clone() }
            }
            _ => Action::Wait,
        };
        return Ok(Plan {
            view,
            mapping,
            remediation,
            orphans,
            action,
            rule,
            message,
            restore: Some(restore),
        });
    }
    // The validator refused anything but 0 or 1 above.
    let max_surge = world
        .kcp
        .max_surge()
        .unwrap_or(crate::api::kcp::DEFAULT_MAX_SURGE);
    let space = space.and_then(|s| s.decision.as_ref());
    let (action, rule, message) = backup_gate(
        world,
        choose(&view, &remediation, &orphans, space, max_surge),
    );
    Ok(Plan {
        view,
        mapping,
        remediation,
        orphans,
        action,
        rule,
        message,
        restore: None,
    })
}

/// A removal's next step as the plan's action. A wait is named after what it
/// waits for, in the family of the rule that chose the removal:
/// `<family>.wait.<reason>` (`removal` for one resumed).
fn step_action(removal: Removal, step: Step, family: &str) -> (Action, String, String) {
    let message = format!("{}: {step}", removal.machine);
    match step {
        Step::Wait { reason, .. } => (
            Action::Wait,
            format!("{family}.wait.{}", reason.as_str()),
            message,
        ),
        _ => {
            let rule = format!("removal.{}", step.name());
            (Action::Step { removal, step }, rule, message)
        }
    }
}

/// The orphan rule's input: members no Machine maps to, the member names the
/// workload Nodes claim (k3s annotation, or the `<node>-<8 hex>` name). A
/// Terminating Node claims nothing: k3s's finalizer is removing its member
/// (and holds the Node while it cannot), so the member is as good as orphaned.
fn orphan_input(world: &World, mapping: Option<&MembershipMap>) -> OrphanInput {
    let claiming_node = |member: &str, deleting: bool| {
        world
            .nodes()
            .iter()
            .filter(|n| n.deleting == deleting)
            .find(|n| {
                n.etcd_member_name.as_deref() == Some(member)
                    || crate::membership::node_of_member_name(member) == Some(n.name.as_str())
            })
            .map(|n| n.name.clone())
    };
    let named: Vec<&str> = world
        .snapshot()
        .map(|s| {
            s.members
                .iter()
                .map(|m| m.name.as_str())
                .filter(|n| !n.is_empty())
                .collect()
        })
        .unwrap_or_default();
    let claimed_by_nodes = named
        .iter()
        .filter(|m| claiming_node(m, false).is_some())
        .map(|m| m.to_string())
        .collect();
    let terminating_nodes = named
        .iter()
        .filter_map(|m| claiming_node(m, true).map(|node| (m.to_string(), node)))
        .collect();
    OrphanInput {
        members_without_machine: mapping
            .map(|m| m.members_without_machine.iter().map(|r| r.id).collect())
            .unwrap_or_default(),
        claimed_by_nodes,
        terminating_nodes,
        nodes_unread: match &world.workload {
            super::world::WorkloadState::Nodes(_) => None,
            super::world::WorkloadState::Unavailable { reason } => Some(reason.clone()),
        },
        first_seen: world.members_first_seen.clone(),
        grace: world.orphan_grace,
    }
}

/// The backup rule on the chosen action (`spec.etcdBackup`,
/// [`super::etcd_backup`]): a member removal waits for its snapshot; an
/// idle pass takes the scheduled one when due.
fn backup_gate(world: &World, chosen: (Action, String, String)) -> (Action, String, String) {
    use super::etcd_backup::{
        RULE_BEFORE_REMOVAL, RULE_NO_SOURCE, RULE_SCHEDULED, RemovalGate, before_removal,
        scheduled_snapshot, waiver,
    };
    use crate::api::etcd_backup::SnapshotPurpose;
    let backup = world.kcp.spec.etcd_backup.as_ref();
    if backup.is_none() {
        return chosen;
    }
    let status = world
        .kcp
        .status
        .as_ref()
        .and_then(|s| s.etcd_backup.as_ref());
    let (member, machine) = match &chosen.0 {
        Action::Step {
            removal,
            step: Step::RemoveMember { member, .. },
        } => (*member, Some(removal.machine.as_str())),
        Action::RemoveOrphan { member, .. } => (*member, None),
        Action::Idle => {
            return match scheduled_snapshot(backup, status, world.snapshot(), world.now) {
                Some((from, message)) => (
                    Action::EtcdSnapshot {
                        purpose: SnapshotPurpose::Scheduled,
                        from,
                        before_removal_of: None,
                    },
                    RULE_SCHEDULED.into(),
                    message,
                ),
                None => chosen,
            };
        }
        _ => return chosen,
    };
    let gate = before_removal(
        backup,
        status,
        waiver(&world.kcp),
        world.snapshot(),
        member,
        machine,
    );
    let (action, rule, message) = chosen;
    match gate {
        RemovalGate::NoTarget => (action, rule, message),
        RemovalGate::Passed { note } => (action, rule, format!("{message} ({note})")),
        RemovalGate::Take { from, message } => (
            Action::EtcdSnapshot {
                purpose: SnapshotPurpose::BeforeRemoval,
                from,
                before_removal_of: Some(member),
            },
            RULE_BEFORE_REMOVAL.into(),
            message,
        ),
        RemovalGate::Wait { message } => (Action::Wait, RULE_NO_SOURCE.into(), message),
    }
}

/// The space rule's verdict as the plan's action: a step, or a wait (a
/// refusal waits too, with its Warning); nothing when all is fine.
fn space_action(space: &SpaceDecision) -> Option<(Action, String, String)> {
    match space {
        SpaceDecision::Fine { .. } => None,
        SpaceDecision::Act { step, message, .. } => Some((
            Action::EtcdSpace { step: step.clone() },
            space.rule(),
            message.clone(),
        )),
        SpaceDecision::Blocked { message, .. } => {
            Some((Action::Wait, space.rule(), message.clone()))
        }
    }
}

fn choose(
    view: &ControlPlaneView,
    remediation: &RemediationDecision,
    orphans: &OrphanDecision,
    space: Option<&SpaceDecision>,
    max_surge: u32,
) -> (Action, String, String) {
    // etcd out of space refuses every write: recovering goes before any
    // scaling or rollout (removals in flight, orphans and a remediation that
    // goes ahead come first).
    let recovery = space.filter(|s| s.is_recovery()).and_then(space_action);
    // Before anything else, every live Machine carries our hook: a deletion
    // someone else starts (a person, another controller) then waits for the
    // removal steps, as KCP's hook on every Machine it creates makes it.
    let unhooked: Vec<String> = view
        .machines
        .iter()
        .filter(|m| !m.is_deleting() && !m.has_our_hook)
        .map(|m| m.name.clone())
        .collect();
    if !unhooked.is_empty() {
        let message = format!(
            "adding the pre-terminate hook to {} so that deleting {} waits for etcd's consent",
            unhooked.join(", "),
            if unhooked.len() == 1 { "it" } else { "them" }
        );
        return (
            Action::AddHooks { machines: unhooked },
            "hooks.adopt".into(),
            message,
        );
    }
    // 0. A stale record (a Machine was created after it) is cleared before
    // anything is resumed from it: resuming would replace a machine whose
    // replacement already exists, or that was never ours.
    if remediation.clear_stale_in_progress {
        let removal = Removal {
            machine: view
                .remediation_in_progress
                .as_ref()
                .map(|r| r.machine.clone())
                .unwrap_or_default(),
            kind: RemovalKind::ScaleDown,
        };
        return (
            Action::Step {
                removal,
                step: Step::ClearRemediationInProgress,
            },
            "remediation.stale-in-progress".into(),
            "a Machine was created after the recorded remediation: the record is stale".into(),
        );
    }
    // 1. A removal in flight goes first, to its end.
    if let Some(removal) = resume(view) {
        let step = next_step(view, &removal);
        if step != Step::Done {
            return step_action(removal, step, "removal");
        }
    }
    // 2. A ghost or orphan member nothing claims: it counts against quorum
    // (and an unnamed one blocks every removal), so it goes first.
    if let OrphanDecision::Remove {
        member,
        label,
        kind,
        assessment,
    } = orphans
    {
        return (
            Action::RemoveOrphan {
                member: *member,
                label: label.clone(),
                kind,
                assessment: assessment.clone(),
            },
            "etcd.orphan-member".into(),
            format!("removing {kind} etcd member {label}: {assessment}"),
        );
    }
    // 3. MHC remediation.
    let rule = format!("remediation.{}", remediation.rule.as_str());
    match &remediation.outcome {
        Outcome::Remediate(go) => {
            let removal = Removal {
                machine: go.machine.clone(),
                kind: RemovalKind::Remediation {
                    record: go.retry.clone(),
                },
            };
            let step = next_step(view, &removal);
            let (action, step_rule, message) = step_action(removal, step, "remediation");
            let rule = if matches!(action, Action::Wait) {
                step_rule
            } else {
                rule
            };
            return (action, rule, format!("{}; {message}", remediation.message));
        }
        Outcome::Wait { .. } | Outcome::Skip { .. } => {
            if let Some(recovery) = recovery {
                return recovery;
            }
            // Like upstream, a refused remediation does not block scaling; but
            // an unhealthy machine fails scale-down's preflight anyway.
            let (action, scale_rule, scale_message) = scale(view, max_surge);
            if matches!(action, Action::Idle | Action::Wait) {
                return (Action::Wait, rule, remediation.message.clone());
            }
            return (action, scale_rule, scale_message);
        }
        Outcome::Idle => {}
    }
    // 4. etcd out of space.
    if let Some(recovery) = recovery {
        return recovery;
    }
    // 5. Roll out outdated machines, or scale towards spec.replicas.
    let scaled = scale(view, max_surge);
    // 6. Routine defragmentation, when there is nothing else to do.
    if matches!(scaled.0, Action::Idle)
        && let Some(maintenance) = space.and_then(space_action)
    {
        return maintenance;
    }
    scaled
}

/// A removal picked by the scale-down rules, as the plan's action; `rule`
/// names it when it goes, `family` prefixes the rule when it waits.
fn removal_action(
    view: &ControlPlaneView,
    decision: ScaleDownDecision,
    rule: &str,
    family: &str,
    context: &str,
) -> (Action, String, String) {
    match decision {
        ScaleDownDecision::Go {
            scale_down,
            message,
        } => {
            let removal = Removal {
                machine: scale_down.machine.clone(),
                kind: RemovalKind::ScaleDown,
            };
            let step = next_step(view, &removal);
            let (action, step_rule, step_message) = step_action(removal, step, family);
            let rule = if matches!(action, Action::Wait) {
                step_rule
            } else {
                rule.to_string()
            };
            (action, rule, format!("{context}{message}; {step_message}"))
        }
        ScaleDownDecision::Wait { rule: why, message } => (
            Action::Wait,
            match why.as_str().strip_prefix("scale-down.") {
                Some(rest) => format!("{family}.{rest}"),
                // An etcd rule (quorum, leadership) keeps its own name.
                None => format!("{family}.{}", why.as_str()),
            },
            format!("{context}{message}"),
        ),
    }
}

fn rollout_action(view: &ControlPlaneView, d: RolloutDecision) -> (Action, String, String) {
    match d.step {
        RolloutStep::Surge => (Action::CreateMachine, d.rule, d.message),
        RolloutStep::Wait { .. } => (Action::Wait, d.rule, d.message),
        RolloutStep::RemoveOutdated => removal_action(
            view,
            decide_outdated_removal(view),
            &d.rule,
            "rollout",
            &format!("{}; ", d.message),
        ),
    }
}

fn scale(view: &ControlPlaneView, max_surge: u32) -> (Action, String, String) {
    let live = view.machines.iter().filter(|m| !m.is_deleting()).count() as u32;
    let desired = view.desired_replicas;
    if let Some(d) = decide_rollout(view, max_surge) {
        return rollout_action(view, d);
    }
    if live > desired {
        return removal_action(
            view,
            decide_scale_down(view),
            "scale-down",
            "scale-down",
            "",
        );
    }
    if live < desired {
        if live == 0 && view.machines.is_empty() {
            // The first server initializes the cluster (the bootstrap provider
            // renders it with cluster-init while the control plane is not
            // initialized); every other server joins it later.
            return (
                Action::CreateMachine,
                "init".into(),
                format!("0 of {desired} machines: creating the first server"),
            );
        }
        if live > 0 && !view.initialized {
            let first = view
                .machines
                .iter()
                .filter(|m| !m.is_deleting())
                .min_by(|a, b| a.age_key().cmp(&b.age_key()))
                .map(|m| m.name.as_str())
                .unwrap_or("?");
            return (
                Action::Wait,
                "scale-up.waiting-for-initialization".into(),
                format!(
                    "{live} of {desired} machines; waiting for the first server ({first}) to initialize the control plane (its API must answer) before others join"
                ),
            );
        }
        if let Err(f) = preflight::before_adding(view) {
            return (
                Action::Wait,
                format!("scale-up.{}", f.check.as_str()),
                format!("{live} of {desired} machines; {f}"),
            );
        }
        return (
            Action::CreateMachine,
            "scale-up".into(),
            format!("{live} of {desired} machines: creating one"),
        );
    }
    (
        Action::Idle,
        "steady".into(),
        format!("{live} of {desired} machines, nothing to remediate"),
    )
}

#[cfg(test)]
mod etcd_snapshot_needs {
    use super::*;
    use crate::remediation::steps::{Removal, RemovalKind, WaitReason};

    fn step(step: Step) -> Action {
        Action::Step {
            removal: Removal {
                machine: "cp-0".into(),
                kind: RemovalKind::ScaleDown,
            },
            step,
        }
    }

    /// Which actions need an etcd snapshot of their own pass (the others may
    /// be decided on the pass before's, after a management step), and after
    /// which the next pass must read etcd again.
    #[test]
    fn steps_that_change_etcd_or_its_membership_need_a_snapshot_of_their_own() {
        let assessment = crate::quorum::assess_cluster(&[]);
        let cases = [
            (step(Step::MoveLeadership { from: 1, to: 2 }), (true, true)),
            (
                step(Step::RemoveMember {
                    member: 1,
                    via: 2,
                    assessment: assessment.clone(),
                }),
                (true, true),
            ),
            (
                step(Step::CreateReplacement {
                    remediation_for: crate::remediation::model::RemediationData {
                        machine: "cp-0".into(),
                        timestamp: None,
                        retry_count: 0,
                    },
                }),
                (true, false),
            ),
            (
                Action::RemoveOrphan {
                    member: 1,
                    label: "m1".into(),
                    kind: "ghost",
                    assessment,
                },
                (true, true),
            ),
            (Action::CreateMachine, (true, false)),
            (
                Action::EtcdSpace {
                    step: crate::space_rule::SpaceStep::Defragment {
                        member: 1,
                        label: "m1".into(),
                    },
                },
                (true, true),
            ),
            (
                Action::EtcdSpace {
                    step: crate::space_rule::SpaceStep::DisarmNospace,
                },
                (true, true),
            ),
            (
                step(Step::AddHook {
                    machine: "cp-0".into(),
                    member: Some(1),
                }),
                (false, false),
            ),
            (
                step(Step::DeleteMachine {
                    machine: "cp-0".into(),
                }),
                (false, false),
            ),
            (
                step(Step::ReleaseHook {
                    machine: "cp-0".into(),
                }),
                (false, false),
            ),
            (step(Step::ClearRemediationInProgress), (false, false)),
            (
                step(Step::Wait {
                    reason: WaitReason::Drain,
                    message: String::new(),
                }),
                (false, false),
            ),
            (Action::Wait, (false, false)),
            (Action::Idle, (false, false)),
        ];
        for (action, (own_snapshot, touches)) in cases {
            assert_eq!(
                action.needs_its_own_etcd_snapshot(),
                own_snapshot,
                "{action:?}"
            );
            assert_eq!(action.changes_etcd(), touches, "{action:?}");
        }
    }
}

#[cfg(test)]
mod table;
