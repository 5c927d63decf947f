//! The resumable removal of one control-plane machine: "what is the next step?".
//!
//! Pure: [`next_step`] maps the observed state of an in-flight removal to the ONE
//! next idempotent step. Every observable state maps to exactly one step, and
//! each step's effect is observable, so a controller restart between any two
//! steps resumes where it stopped, without repeating or skipping one:
//!
//! 1. record the remediation on the KCP (`remediation-in-progress`; MHC only);
//! 2. our pre-terminate hook is on the Machine from its creation (added here
//!    only to one that lacks it);
//! 3. move etcd leadership off the target's member, if it leads;
//! 4. re-check quorum, then delete the Machine (CAPI drains the node, then
//!    waits on hooks);
//! 5. wait until CAPI waits on pre-terminate hooks, no other hook remains, and
//!    this is the machine with the oldest deletionTimestamp;
//! 6. move leadership again if it came back to the target;
//! 7. record the target's member in the hook's value, re-check quorum, and
//!    remove the member through a member that stays; a target whose member
//!    cannot be told apart from one no Machine claims waits;
//! 8. (observation) the member is gone from the membership;
//! 9. release our hook so CAPI finishes the deletion (a scale-down is done here;
//!    a remediation waits until the Machine is gone);
//! 10. create the replacement with `remediation-for` (MHC only), then clear the
//!     KCP's `remediation-in-progress`.
//!
//! Steps 5-9 are the same for every deletion, whoever started it: a person's
//! `kubectl delete machine`, another controller, or one of ours.
//!
//! Scale-down runs the same steps without 1 and 10. [`resume`] rebuilds the
//! in-flight removal from what is observable (the KCP annotation, a deleting
//! Machine holding our hook).
//!
//! After a migration from cluster-api-k3s, a Machine that upstream left
//! deleting with only its own hook (`pre-terminate.delete.hook.machine.cluster.x-k8s.io: k3s`)
//! is a removal in flight too: we add our hook (recording the member the real
//! membership maps to it, or none when its member is already gone; refusing
//! when a member no Machine claims could be its own), then run steps 5-9,
//! and step 9 releases upstream's hook together with ours (rule
//! `upstream-hook.takeover`, docs/migration.md).

use std::fmt;

use super::decide::leadership_transferee;
use super::model::{
    ControlPlaneView, EtcdState, MachineView, Membership, PRE_TERMINATE_HOOK_ANNOTATION,
    RemediationData, TargetMember,
};
use crate::quorum::{self, Assessment};

/// Why a removal is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RemovalKind {
    /// MHC remediation; `record` is the `remediation-in-progress` value the
    /// decision produced (used only if the KCP does not carry it yet).
    Remediation {
        record: RemediationData,
    },
    ScaleDown,
}

/// One in-flight removal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Removal {
    pub machine: String,
    pub kind: RemovalKind,
}

/// Why the removal cannot progress right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitReason {
    /// The KCP records a remediation of another machine.
    AnotherRemediation,
    /// The etcd membership could not be read.
    EtcdUnreachable,
    /// The target leads and no healthy member can take over.
    NoTransferee,
    /// CAPI has not finished draining (not yet waiting on pre-terminate hooks).
    Drain,
    /// Other pre-terminate hooks must run first, while kubelet still works.
    OtherHooks,
    /// An older deleting machine goes first.
    OlderDeletion,
    /// Removing the member now would put quorum at risk.
    QuorumAtRisk,
    /// No healthy member that stays can take the MemberRemove request.
    NoMemberToAsk,
    /// Our hook is released; CAPI is finishing the deletion.
    MachineGoing,
    /// A Machine left deleting by cluster-api-k3s has no mapped member, but
    /// some member is claimed by no Machine: it could be this Machine's.
    UpstreamMemberUnknown,
    /// A leadership move off the target was started and is not confirmed
    /// yet (within its deadline): a later pass confirms it.
    LeadershipMoving,
    /// The target maps to no member, but some member is claimed by no
    /// Machine: it may be the target's. Nothing is removed on a guess.
    TargetMemberUnknown,
    /// Quorum would be at risk only because voters are settling after a
    /// change of leader or voters (a read that straddled a leadership
    /// change): looked at again shortly.
    EtcdSettling,
}

impl WaitReason {
    /// Its name in rules (`<family>.wait.<name>`).
    pub fn as_str(self) -> &'static str {
        match self {
            WaitReason::AnotherRemediation => "another-remediation",
            WaitReason::EtcdUnreachable => "etcd-unreachable",
            WaitReason::NoTransferee => "no-transferee",
            WaitReason::Drain => "drain",
            WaitReason::OtherHooks => "other-hooks",
            WaitReason::OlderDeletion => "older-deletion",
            WaitReason::QuorumAtRisk => "quorum-at-risk",
            WaitReason::NoMemberToAsk => "no-member-to-ask",
            WaitReason::MachineGoing => "machine-going",
            WaitReason::UpstreamMemberUnknown => "upstream-member-unknown",
            WaitReason::LeadershipMoving => "leadership-moving",
            WaitReason::TargetMemberUnknown => "target-member-unknown",
            WaitReason::EtcdSettling => "etcd-settling",
        }
    }

    pub const ALL: [WaitReason; 13] = [
        WaitReason::AnotherRemediation,
        WaitReason::EtcdUnreachable,
        WaitReason::NoTransferee,
        WaitReason::Drain,
        WaitReason::OtherHooks,
        WaitReason::OlderDeletion,
        WaitReason::QuorumAtRisk,
        WaitReason::NoMemberToAsk,
        WaitReason::MachineGoing,
        WaitReason::UpstreamMemberUnknown,
        WaitReason::LeadershipMoving,
        WaitReason::TargetMemberUnknown,
        WaitReason::EtcdSettling,
    ];

    /// An ordinary part of a removal (CAPI draining, hooks, the Machine
    /// going, one removal after another), as opposed to one the cluster's
    /// state forces (quorum, etcd unreadable, nobody to ask).
    pub fn is_progress(self) -> bool {
        matches!(
            self,
            WaitReason::AnotherRemediation
                | WaitReason::Drain
                | WaitReason::OtherHooks
                | WaitReason::OlderDeletion
                | WaitReason::MachineGoing
                | WaitReason::LeadershipMoving
                | WaitReason::EtcdSettling
        )
    }
}

/// The rule named in logs, Events and conditions when a hook of
/// cluster-api-k3s is taken over.
pub const UPSTREAM_TAKEOVER_RULE: &str = "upstream-hook.takeover";

/// The one next step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// 1. Annotate the KCP with `remediation-in-progress` = `value`.
    RecordRemediation { value: RemediationData },
    /// 2. Annotate the Machine with our hook, value [`hook_value`]`(member)`.
    AddHook {
        machine: String,
        member: Option<u64>,
    },
    /// Before its member is removed, record in our hook's value the member
    /// that is the deleting Machine's (the hook was added empty at creation).
    RecordHookMember { machine: String, member: u64 },
    /// 3 and 6. MoveLeader sent to `from` (the leader), to `to`.
    MoveLeadership { from: u64, to: u64 },
    /// 4. Delete the Machine.
    DeleteMachine { machine: String },
    /// 5 (and any other wait): nothing to do until the world changes.
    Wait { reason: WaitReason, message: String },
    /// 7. MemberRemove of `member`, sent to `via` (a member that stays).
    RemoveMember {
        member: u64,
        via: u64,
        assessment: Assessment,
    },
    /// 9. Remove our hook annotation from the Machine.
    ReleaseHook { machine: String },
    /// 10a. Create the replacement Machine with `remediation-for` = this value.
    CreateReplacement { remediation_for: RemediationData },
    /// 10b. Remove `remediation-in-progress` from the KCP.
    ClearRemediationInProgress,
    /// Nothing left to do.
    Done,
}

impl Step {
    /// A short name for logs and tests.
    pub fn name(&self) -> &'static str {
        match self {
            Step::RecordRemediation { .. } => "record-remediation",
            Step::AddHook { .. } => "add-hook",
            Step::RecordHookMember { .. } => "record-hook-member",
            Step::MoveLeadership { .. } => "move-leadership",
            Step::DeleteMachine { .. } => "delete-machine",
            Step::Wait { .. } => "wait",
            Step::RemoveMember { .. } => "remove-member",
            Step::ReleaseHook { .. } => "release-hook",
            Step::CreateReplacement { .. } => "create-replacement",
            Step::ClearRemediationInProgress => "clear-remediation-in-progress",
            Step::Done => "done",
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::RecordRemediation { value } => write!(
                f,
                "record remediation of {} (retry {}) on the control plane",
                value.machine, value.retry_count
            ),
            Step::AddHook { machine, member } => match member {
                Some(id) => write!(
                    f,
                    "mark {machine} for removal in its pre-terminate hook (member {id:016x})"
                ),
                None => write!(
                    f,
                    "mark {machine} for removal in its pre-terminate hook (no etcd member)"
                ),
            },
            Step::RecordHookMember { machine, member } => write!(
                f,
                "record etcd member {member:016x} in the pre-terminate hook of {machine}"
            ),
            Step::MoveLeadership { from, to } => {
                write!(f, "move etcd leadership from {from:016x} to {to:016x}")
            }
            Step::DeleteMachine { machine } => write!(f, "delete Machine {machine}"),
            Step::Wait { message, .. } => write!(f, "wait: {message}"),
            Step::RemoveMember {
                member,
                via,
                assessment,
            } => write!(
                f,
                "remove etcd member {member:016x} via {via:016x}: {assessment}"
            ),
            Step::ReleaseHook { machine } => write!(f, "release pre-terminate hook of {machine}"),
            Step::CreateReplacement { remediation_for } => write!(
                f,
                "create the replacement for {} (retry {})",
                remediation_for.machine, remediation_for.retry_count
            ),
            Step::ClearRemediationInProgress => {
                f.write_str("clear remediation-in-progress on the control plane")
            }
            Step::Done => f.write_str("done"),
        }
    }
}

/// Our hook's value on a Machine no removal of ours has chosen: it only
/// holds a deletion someone else starts until etcd consents.
pub const BORN_HOOK_VALUE: &str = "";

/// Our hook's value once a removal of ours chose the Machine: the member it
/// guards (`member=<hex id>`), or `member=none` when it has none.
pub fn hook_value(member: Option<u64>) -> String {
    member.map_or_else(|| "member=none".to_string(), |id| format!("member={id:x}"))
}

/// Our hook's value, read: whether a removal of ours chose the Machine, and
/// the member recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HookValue {
    pub removal_chosen: bool,
    pub member: Option<u64>,
}

/// Parse our hook annotation's value; the error names the annotation.
pub fn parse_hook_value(value: &str) -> Result<HookValue, String> {
    let chosen = |member| HookValue {
        removal_chosen: true,
        member,
    };
    match value.strip_prefix("member=") {
        _ if value == BORN_HOOK_VALUE => Ok(HookValue {
            removal_chosen: false,
            member: None,
        }),
        Some("none") => Ok(chosen(None)),
        Some(hex) => u64::from_str_radix(hex, 16)
            .map(|id| chosen(Some(id)))
            .map_err(|_| bad_hook_value(value)),
        None => Err(bad_hook_value(value)),
    }
}

fn bad_hook_value(value: &str) -> String {
    format!(
        "annotation {PRE_TERMINATE_HOOK_ANNOTATION}: expected empty, \"member=none\" or \"member=<hex id>\", got {value:?}"
    )
}

fn wait(reason: WaitReason, message: String) -> Step {
    Step::Wait { reason, message }
}

/// A wait on quorum: settling (progress) when only a leadership or voter
/// change in passing makes it unsafe, else quorum at risk.
fn quorum_wait(membership: &Membership, assessment: &quorum::Assessment, message: String) -> Step {
    if assessment.only_settling(membership.leader.is_some()) {
        wait(
            WaitReason::EtcdSettling,
            format!("{message} (etcd is settling after a change of leader or voters)"),
        )
    } else {
        wait(WaitReason::QuorumAtRisk, message)
    }
}

/// The next step of `removal` in the world `view`.
pub fn next_step(view: &ControlPlaneView, removal: &Removal) -> Step {
    let record = match &removal.kind {
        RemovalKind::Remediation { record } => Some(record),
        RemovalKind::ScaleDown => None,
    };
    let recorded = view.remediation_in_progress.as_ref();
    if record.is_some()
        && let Some(other) = recorded.filter(|d| d.machine != removal.machine)
    {
        return wait(
            WaitReason::AnotherRemediation,
            format!(
                "the control plane records a remediation of {}",
                other.machine
            ),
        );
    }

    let Some(target) = view.machine(&removal.machine) else {
        return after_machine_gone(view, removal, recorded);
    };

    if !target.is_deleting() {
        if let Some(record) = record
            && recorded.is_none()
        {
            return Step::RecordRemediation {
                value: record.clone(),
            };
        }
        if !target.has_our_hook || !target.removal_chosen {
            return Step::AddHook {
                machine: target.name.clone(),
                member: planned_member(view, target),
            };
        }
        if let Some(step) = leadership_step(view, target) {
            return step;
        }
        if let Some(step) = deletion_guard(view, target) {
            return step;
        }
        return Step::DeleteMachine {
            machine: target.name.clone(),
        };
    }

    if !target.has_our_hook {
        if target.has_upstream_hook {
            return take_over_upstream_hook(view, target);
        }
        if record.is_none() {
            // Scale-down: our part is over; the scale-down preflight waits for
            // deleting machines anyway.
            return Step::Done;
        }
        // Remediation: the replacement waits until the Machine is gone.
        return wait(
            WaitReason::MachineGoing,
            format!(
                "{} has no hook of ours left; CAPI is deleting it",
                target.name
            ),
        );
    }
    if !target.waiting_for_pre_terminate_hook {
        return wait(
            WaitReason::Drain,
            format!(
                "CAPI is draining {} (not yet waiting on pre-terminate hooks)",
                target.name
            ),
        );
    }
    if !target.other_pre_terminate_hooks.is_empty() {
        return wait(
            WaitReason::OtherHooks,
            format!(
                "other pre-terminate hooks on {} run first: {}",
                target.name,
                target.other_pre_terminate_hooks.join(", ")
            ),
        );
    }
    // Upstream acts on one hook at a time: the machine deleted first goes first.
    if let Some(older) = view
        .machines
        .iter()
        .filter_map(|m| m.deleting.map(|d| (d, m.name.as_str())))
        .min()
        .filter(|(_, name)| *name != target.name)
    {
        return wait(
            WaitReason::OlderDeletion,
            format!(
                "{} was marked for deletion before {}; it goes first",
                older.1, target.name
            ),
        );
    }
    if let Some(step) = leadership_step(view, target) {
        return step;
    }
    if let Some(step) = member_removal_step(view, target) {
        return step;
    }
    Step::ReleaseHook {
        machine: target.name.clone(),
    }
}

/// A deleting Machine that carries only cluster-api-k3s's hook: upstream was
/// scaled to 0 mid-deletion. Take it over by adding our hook, whose value
/// records the member the real membership maps to the Machine; the usual
/// steps then move leadership off it, remove that member and release both
/// hooks. Without a mapped member, the member is gone only if every member is
/// claimed by another Machine; otherwise refuse: never guess.
fn take_over_upstream_hook(view: &ControlPlaneView, target: &MachineView) -> Step {
    let add = |member| Step::AddHook {
        machine: target.name.clone(),
        member,
    };
    match etcd_in_scope(view) {
        Err(message) => {
            return wait(
                WaitReason::EtcdUnreachable,
                format!(
                    "{UPSTREAM_TAKEOVER_RULE}: not taking over the cluster-api-k3s hook of {}: {message}",
                    target.name
                ),
            );
        }
        Ok(None) => return add(None),
        Ok(Some(_)) => {}
    }
    match view.target_member(target) {
        TargetMember::Member(member) => add(Some(member)),
        // Every member belongs to another Machine: this one's is already gone.
        TargetMember::None => add(None),
        TargetMember::Unknown { unclaimed } => wait(
            WaitReason::UpstreamMemberUnknown,
            format!(
                "{UPSTREAM_TAKEOVER_RULE}: {} (deleting, cluster-api-k3s hook) maps to no etcd member, but {} claimed by no Machine ({}); it may be this Machine's: not releasing the hook on a guess ({})",
                target.name,
                if unclaimed.len() == 1 {
                    "a member is"
                } else {
                    "members are"
                },
                labels(view, &unclaimed),
                TargetMember::how_to_map(target)
            ),
        ),
    }
}

/// The members `ids` as named in messages.
fn labels(view: &ControlPlaneView, ids: &[u64]) -> String {
    let membership = view.membership();
    ids.iter()
        .map(|id| {
            membership
                .and_then(|m| m.member(*id))
                .map_or_else(|| format!("{id:016x}"), |m| m.label())
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Why `target` waits while its member is unknown, with the worst-case
/// arithmetic (it counts as one of the unclaimed members).
fn member_unknown(
    membership: &Membership,
    target: &MachineView,
    unclaimed: &[u64],
    doing: &str,
) -> Step {
    let assessment = quorum::assess_unmapped_removal(&membership.members, &target.name, unclaimed);
    wait(
        WaitReason::TargetMemberUnknown,
        format!(
            "not {doing} {} now: {assessment}; {}",
            target.name,
            TargetMember::how_to_map(target)
        ),
    )
}

fn after_machine_gone(
    view: &ControlPlaneView,
    removal: &Removal,
    recorded: Option<&RemediationData>,
) -> Step {
    let RemovalKind::Remediation { .. } = removal.kind else {
        return Step::Done;
    };
    let Some(data) = recorded.filter(|d| d.machine == removal.machine) else {
        return Step::Done;
    };
    let replaced = view
        .machines
        .iter()
        .any(|m| m.remediation_for.as_ref() == Some(data));
    if replaced {
        Step::ClearRemediationInProgress
    } else {
        Step::CreateReplacement {
            remediation_for: data.clone(),
        }
    }
}

/// Etcd steps apply only to an initialized control plane with managed etcd.
fn etcd_in_scope(view: &ControlPlaneView) -> Result<Option<&Membership>, String> {
    if !view.initialized {
        return Ok(None);
    }
    match &view.etcd {
        EtcdState::NotManaged => Ok(None),
        EtcdState::Unreachable { reason } => {
            Err(format!("the etcd membership could not be read: {reason}"))
        }
        EtcdState::Observed(m) => Ok(Some(m)),
    }
}

fn planned_member(view: &ControlPlaneView, target: &MachineView) -> Option<u64> {
    match etcd_in_scope(view) {
        Ok(Some(_)) => view.current_member(target),
        _ => None,
    }
}

/// The decision to remove `target` was taken some reconciles ago (record,
/// hook, leadership move since): before the Machine is deleted (CAPI then
/// drains its node), check quorum again on the membership as it is now, as the
/// member removal does. A target without a member costs nothing, but the
/// cluster as it stands must still have quorum.
fn deletion_guard(view: &ControlPlaneView, target: &MachineView) -> Option<Step> {
    let membership = match etcd_in_scope(view) {
        Err(message) => return Some(wait(WaitReason::EtcdUnreachable, message)),
        Ok(None) => return None,
        Ok(Some(m)) => m,
    };
    if let Some(standing) = quorum::quorum_lost(&membership.members) {
        return Some(quorum_wait(
            membership,
            &standing,
            format!(
                "not deleting {} now: etcd has lost quorum: {standing}",
                target.name
            ),
        ));
    }
    let assessment = match view.target_member(target) {
        TargetMember::Member(member) => quorum::assess_removal(&membership.members, member),
        TargetMember::None => quorum::assess_cluster(&membership.members),
        TargetMember::Unknown { unclaimed } => {
            return Some(member_unknown(membership, target, &unclaimed, "deleting"));
        }
    };
    if assessment.is_safe() {
        return None;
    }
    Some(quorum_wait(
        membership,
        &assessment,
        format!("not deleting {} now: {assessment}", target.name),
    ))
}

fn leadership_step(view: &ControlPlaneView, target: &MachineView) -> Option<Step> {
    let membership = match etcd_in_scope(view) {
        Err(message) => return Some(wait(WaitReason::EtcdUnreachable, message)),
        Ok(None) => return None,
        Ok(Some(m)) => m,
    };
    let member = view.current_member(target)?;
    // Started on an earlier pass and not confirmed yet (within its deadline):
    // wait for the confirmation, which needs a snapshot where the cluster
    // follows its new leader, rather than ask again or judge quorum on a
    // snapshot taken mid-handover (every member then fails its linearizable
    // read for a moment: "0 of 3 voters healthy" is the handover, not a
    // lost quorum). A move past its deadline is asked again if the target
    // still leads, as after a restart.
    if let Some(moving) = target
        .leadership_move
        .filter(|m| m.from == member && m.in_time)
    {
        return Some(wait(
            WaitReason::LeadershipMoving,
            format!(
                "etcd leadership is moving off {} (member {:x}) to member {:x}; confirmed on a later pass",
                target.name, moving.from, moving.to
            ),
        ));
    }
    if membership.leader != Some(member) {
        return None;
    }
    Some(
        match leadership_transferee(view, membership, target, member) {
            Some(to) => Step::MoveLeadership { from: member, to },
            None => wait(
                WaitReason::NoTransferee,
                format!(
                    "{} leads etcd and there is no healthy etcd member to take leadership",
                    target.name
                ),
            ),
        },
    )
}

fn member_removal_step(view: &ControlPlaneView, target: &MachineView) -> Option<Step> {
    let membership = match etcd_in_scope(view) {
        Err(message) => return Some(wait(WaitReason::EtcdUnreachable, message)),
        Ok(None) => return None,
        Ok(Some(m)) => m,
    };
    let member = match view.target_member(target) {
        TargetMember::Member(member) => member,
        TargetMember::None => return None,
        TargetMember::Unknown { unclaimed } => {
            return Some(member_unknown(
                membership,
                target,
                &unclaimed,
                "releasing the hook of",
            ));
        }
    };
    if target.hook_member != Some(member) {
        return Some(Step::RecordHookMember {
            machine: target.name.clone(),
            member,
        });
    }
    if let Some(standing) = quorum::quorum_lost(&membership.members) {
        return Some(quorum_wait(
            membership,
            &standing,
            format!(
                "not removing the member of {} now: etcd has lost quorum: {standing}",
                target.name
            ),
        ));
    }
    let assessment = quorum::assess_removal(&membership.members, member);
    if !assessment.is_safe() {
        return Some(quorum_wait(
            membership,
            &assessment,
            format!(
                "not removing the member of {} now: {assessment}",
                target.name
            ),
        ));
    }
    // Ask a member that stays: the leader if it is not the target, else any healthy voter.
    let via = membership
        .leader
        .filter(|l| *l != member && membership.is_healthy_voter(*l))
        .or_else(|| {
            membership
                .members
                .iter()
                .map(|m| m.id)
                .filter(|id| *id != member && membership.is_healthy_voter(*id))
                .min()
        });
    Some(match via {
        Some(via) => Step::RemoveMember {
            member,
            via,
            assessment,
        },
        None => wait(
            WaitReason::NoMemberToAsk,
            format!(
                "no healthy etcd member that stays can remove the member of {}",
                target.name
            ),
        ),
    })
}

/// The removal in flight, rebuilt from what is observable (after a restart, or
/// on any reconcile): the remediation recorded on the KCP, else a deleting
/// Machine that still carries our hook (every Machine carries it from its
/// creation, so this is any deletion, whoever started it: a removal of ours,
/// a person's `kubectl delete machine`, another controller) or
/// cluster-api-k3s's (a removal upstream started and did not finish), the
/// oldest deletion first, one at a time; else a live Machine whose hook says
/// a removal of ours chose it (not yet deleted). `None`: nothing in flight.
pub fn resume(view: &ControlPlaneView) -> Option<Removal> {
    if let Some(record) = &view.remediation_in_progress {
        return Some(Removal {
            machine: record.machine.clone(),
            kind: RemovalKind::Remediation {
                record: record.clone(),
            },
        });
    }
    view.machines
        .iter()
        .filter(|m| {
            if m.is_deleting() {
                m.has_our_hook || m.has_upstream_hook
            } else {
                m.has_our_hook && m.removal_chosen
            }
        })
        .min_by_key(|m| (m.deleting.is_none(), m.deleting, m.name.clone()))
        .map(|m| Removal {
            machine: m.name.clone(),
            kind: RemovalKind::ScaleDown,
        })
}

/// Machines cluster-api-k3s left behind: its hook is ours to release, after
/// the real membership says the member is gone.
#[cfg(test)]
mod upstream_hook_tests {
    use super::*;
    use crate::quorum::MemberView;
    use crate::remediation::model::RemediationStrategy;
    use chrono::{DateTime, Duration, TimeZone, Utc};

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 1, 12, 0, 0).unwrap()
    }

    fn machine(i: u64) -> MachineView {
        let mut m = MachineView::new(
            &format!("m{i}"),
            now() - Duration::hours(3) + Duration::minutes(i as i64),
        );
        m.etcd_member = Some(i);
        m.components_healthy = Some(true);
        m
    }

    fn member(id: u64) -> MemberView {
        MemberView::healthy_voter(id, format!("node-m{id}-{id:08x}"))
    }

    /// Three machines and members; m1 upstream left deleting, CAPI waiting on
    /// its hook; m1 leads etcd.
    fn left_deleting_by_upstream() -> ControlPlaneView {
        let mut m1 = machine(1);
        m1.deleting = Some(now() - Duration::minutes(10));
        m1.has_upstream_hook = true;
        m1.waiting_for_pre_terminate_hook = true;
        ControlPlaneView {
            name: "cp".into(),
            initialized: true,
            desired_replicas: 3,
            strategy: RemediationStrategy::default(),
            remediation_in_progress: None,
            etcd: EtcdState::Observed(Membership {
                members: vec![member(1), member(2), member(3)],
                leader: Some(1),
            }),
            failure_domains: vec![],
            pending_topology_version: None,
            machines: vec![m1, machine(2), machine(3)],
        }
    }

    fn membership(view: &mut ControlPlaneView) -> &mut Membership {
        match &mut view.etcd {
            EtcdState::Observed(m) => m,
            _ => unreachable!(),
        }
    }

    fn m1(view: &mut ControlPlaneView) -> &mut MachineView {
        &mut view.machines[0]
    }

    /// Execute a step in the simulated world (what etcd and CAPI do too).
    fn apply(view: &mut ControlPlaneView, step: &Step) {
        match step {
            Step::AddHook { member, .. } => {
                m1(view).has_our_hook = true;
                m1(view).removal_chosen = true;
                m1(view).hook_member = *member;
            }
            Step::RecordHookMember { member, .. } => m1(view).hook_member = Some(*member),
            Step::MoveLeadership { to, .. } => membership(view).leader = Some(*to),
            Step::RemoveMember { member, .. } => {
                membership(view).members.retain(|m| m.id != *member)
            }
            Step::ReleaseHook { .. } => {
                // Both hooks go in one patch; CAPI then deletes the Machine.
                view.machines.retain(|m| m.name != "m1");
            }
            other => panic!("unexpected step {other:?}"),
        }
    }

    fn walk(mut view: ControlPlaneView) -> Vec<Step> {
        let mut steps = Vec::new();
        for _ in 0..10 {
            // Rebuilt from the world every time, as after a restart.
            let Some(removal) = resume(&view) else {
                return steps;
            };
            let step = next_step(&view, &removal);
            if step == Step::Done {
                return steps;
            }
            apply(&mut view, &step);
            steps.push(step);
        }
        panic!("no end: {steps:?}");
    }

    #[test]
    fn a_machine_left_deleting_with_the_upstream_hook_is_a_removal_in_flight() {
        let view = left_deleting_by_upstream();
        assert_eq!(
            resume(&view),
            Some(Removal {
                machine: "m1".into(),
                kind: RemovalKind::ScaleDown
            })
        );
    }

    #[test]
    fn a_live_machine_with_the_upstream_hook_is_not_in_flight() {
        // Upstream adds its hook right before deleting; on a live Machine it is
        // a leftover that waits for a removal of ours.
        let mut view = left_deleting_by_upstream();
        m1(&mut view).deleting = None;
        m1(&mut view).waiting_for_pre_terminate_hook = false;
        assert_eq!(resume(&view), None);
    }

    #[test]
    fn upstream_leader_left_deleting_leadership_moves_then_member_removed_then_both_hooks_released()
    {
        let steps = walk(left_deleting_by_upstream());
        let names: Vec<&str> = steps.iter().map(Step::name).collect();
        assert_eq!(
            names,
            [
                "add-hook",
                "move-leadership",
                "remove-member",
                "release-hook"
            ]
        );
        assert_eq!(
            steps[0],
            Step::AddHook {
                machine: "m1".into(),
                member: Some(1)
            }
        );
        assert!(matches!(
            steps[1],
            Step::MoveLeadership { from: 1, to: 2 | 3 }
        ));
        assert!(matches!(steps[2], Step::RemoveMember { member: 1, via, .. } if via != 1));
    }

    /// The leader m1 is being removed: a move started and within its deadline
    /// is waited for (a later pass confirms it), a move past its deadline or
    /// one this process does not remember (a restart) is asked again, and
    /// once leadership left m1 the member is removed.
    #[test]
    fn a_leadership_move_in_flight_is_confirmed_later_not_asked_again() {
        use crate::remediation::model::MoveInFlight;
        let mut view = left_deleting_by_upstream();
        m1(&mut view).has_upstream_hook = false;
        m1(&mut view).has_our_hook = true;
        m1(&mut view).hook_member = Some(1);
        let removal = resume(&view).expect("in flight");
        let cases = [
            (
                "a_move_started_and_in_time_is_waited_for",
                Some(MoveInFlight {
                    from: 1,
                    to: 2,
                    in_time: true,
                }),
                Some(1),
                "wait:leadership-moving",
            ),
            (
                "a_move_past_its_deadline_is_asked_again",
                Some(MoveInFlight {
                    from: 1,
                    to: 2,
                    in_time: false,
                }),
                Some(1),
                "move-leadership",
            ),
            (
                "after_a_restart_nothing_is_remembered_and_the_move_is_asked_again",
                None,
                Some(1),
                "move-leadership",
            ),
            (
                "leadership_left_the_target_but_the_move_is_not_confirmed_so_it_waits",
                Some(MoveInFlight {
                    from: 1,
                    to: 2,
                    in_time: true,
                }),
                Some(2),
                "wait:leadership-moving",
            ),
            (
                "the_move_was_confirmed_so_its_member_is_removed",
                None,
                Some(2),
                "remove-member",
            ),
        ];
        for (name, moving, leader, want) in cases {
            let mut view = view.clone();
            m1(&mut view).leadership_move = moving;
            membership(&mut view).leader = leader;
            let got = match next_step(&view, &removal) {
                Step::Wait { reason, .. } => format!("wait:{}", reason.as_str()),
                step => step.name().to_string(),
            };
            assert_eq!(got, want, "{name}");
        }
    }

    /// k3s restarted on m1 after our removal of its member (the tombstone):
    /// the server joined again as a learner under a new name, mapped to m1.
    /// That learner is removed before the hook goes; the old member is not
    /// asked for again.
    #[test]
    fn a_member_rejoined_after_its_removal_is_removed_before_the_hook_is_released() {
        let mut view = left_deleting_by_upstream();
        m1(&mut view).has_upstream_hook = false;
        m1(&mut view).has_our_hook = true;
        m1(&mut view).hook_member = Some(1);
        membership(&mut view).members.retain(|m| m.id != 1);
        membership(&mut view).leader = Some(2);
        let mut rejoined = member(7);
        rejoined.name = "node-m1-0badc0de".into();
        rejoined.learner = true;
        membership(&mut view).members.push(rejoined);
        m1(&mut view).etcd_member = Some(7);
        let steps = walk(view);
        let names: Vec<&str> = steps.iter().map(Step::name).collect();
        assert_eq!(
            names,
            ["record-hook-member", "remove-member", "release-hook"]
        );
        assert!(
            matches!(
                steps[1],
                Step::RemoveMember {
                    member: 7,
                    via: 2,
                    ..
                }
            ),
            "{:?}",
            steps[1]
        );
    }

    #[test]
    fn upstream_follower_left_deleting_member_removed_without_leadership_move() {
        let mut view = left_deleting_by_upstream();
        membership(&mut view).leader = Some(2);
        let names: Vec<&'static str> = walk(view).iter().map(Step::name).collect();
        assert_eq!(names, ["add-hook", "remove-member", "release-hook"]);
    }

    #[test]
    fn upstream_left_deleting_member_already_gone_just_releases() {
        let mut view = left_deleting_by_upstream();
        membership(&mut view).members.retain(|m| m.id != 1);
        membership(&mut view).leader = Some(2);
        m1(&mut view).etcd_member = None;
        let steps = walk(view);
        assert_eq!(
            steps[0],
            Step::AddHook {
                machine: "m1".into(),
                member: None
            }
        );
        let names: Vec<&str> = steps.iter().map(Step::name).collect();
        assert_eq!(names, ["add-hook", "release-hook"]);
    }

    #[test]
    fn upstream_hook_is_never_released_before_the_member_is_gone() {
        // Whatever state, as long as m1's member is in the membership, the
        // next step is not a release.
        let mut view = left_deleting_by_upstream();
        m1(&mut view).has_our_hook = true;
        m1(&mut view).hook_member = Some(1);
        for leader in [Some(1), Some(2), None] {
            membership(&mut view).leader = leader;
            let step = next_step(&view, &resume(&view).unwrap());
            assert_ne!(step.name(), "release-hook", "leader {leader:?}: {step:?}");
        }
    }

    #[test]
    fn upstream_left_deleting_member_unmapped_refuses_naming_the_unclaimed_member() {
        let mut view = left_deleting_by_upstream();
        membership(&mut view).leader = Some(2);
        // m1's member is there but cannot be mapped (no Node annotation, no name).
        m1(&mut view).etcd_member = None;
        let step = next_step(&view, &resume(&view).unwrap());
        match step {
            Step::Wait {
                reason: WaitReason::UpstreamMemberUnknown,
                message,
            } => {
                assert!(message.contains(UPSTREAM_TAKEOVER_RULE), "{message}");
                assert!(message.contains("node-m1-00000001"), "{message}");
                assert!(message.contains("m1"), "{message}");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn upstream_left_deleting_with_an_unnamed_member_refuses() {
        let mut view = left_deleting_by_upstream();
        membership(&mut view).members.retain(|m| m.id != 1);
        membership(&mut view).members.push(MemberView {
            name: String::new(),
            ..member(9)
        });
        membership(&mut view).leader = Some(2);
        m1(&mut view).etcd_member = None;
        let step = next_step(&view, &resume(&view).unwrap());
        assert!(
            matches!(
                step,
                Step::Wait {
                    reason: WaitReason::UpstreamMemberUnknown,
                    ..
                }
            ),
            "{step:?}"
        );
    }

    #[test]
    fn upstream_left_deleting_quorum_at_risk_refuses_member_removal() {
        let mut view = left_deleting_by_upstream();
        membership(&mut view).leader = Some(2);
        membership(&mut view).members[2].probe_error = Some("connection refused".into());
        m1(&mut view).has_our_hook = true;
        m1(&mut view).hook_member = Some(1);
        let step = next_step(&view, &resume(&view).unwrap());
        assert!(
            matches!(
                step,
                Step::Wait {
                    reason: WaitReason::QuorumAtRisk,
                    ..
                }
            ),
            "{step:?}"
        );
    }

    #[test]
    fn upstream_left_deleting_etcd_unreachable_refuses_takeover() {
        let mut view = left_deleting_by_upstream();
        view.etcd = EtcdState::Unreachable {
            reason: "connection refused".into(),
        };
        let step = next_step(&view, &resume(&view).unwrap());
        match step {
            Step::Wait {
                reason: WaitReason::EtcdUnreachable,
                message,
            } => {
                assert!(message.contains(UPSTREAM_TAKEOVER_RULE), "{message}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn upstream_hook_does_not_count_as_another_owners_hook_but_foreign_ones_still_block() {
        let mut view = left_deleting_by_upstream();
        membership(&mut view).leader = Some(2);
        m1(&mut view).has_our_hook = true;
        m1(&mut view).hook_member = Some(1);
        // The view keeps upstream's hook out of the other hooks: removal goes on.
        assert_eq!(
            next_step(&view, &resume(&view).unwrap()).name(),
            "remove-member"
        );
        m1(&mut view).other_pre_terminate_hooks =
            vec!["pre-terminate.delete.hook.machine.cluster.x-k8s.io/backup".into()];
        let step = next_step(&view, &resume(&view).unwrap());
        assert!(
            matches!(
                step,
                Step::Wait {
                    reason: WaitReason::OtherHooks,
                    ..
                }
            ),
            "{step:?}"
        );
    }

    #[test]
    fn upstream_remediation_in_flight_is_continued_with_its_record() {
        // Upstream recorded the remediation of m1 (retry 1) and deleted it.
        let mut view = left_deleting_by_upstream();
        let record = RemediationData {
            machine: "m1".into(),
            timestamp: Some(now() - Duration::minutes(10)),
            retry_count: 1,
        };
        view.remediation_in_progress = Some(record.clone());
        let removal = resume(&view).unwrap();
        assert_eq!(
            removal.kind,
            RemovalKind::Remediation {
                record: record.clone()
            }
        );
        let mut names = Vec::new();
        for _ in 0..10 {
            let step = next_step(&view, &removal);
            names.push(step.name());
            match &step {
                Step::CreateReplacement { remediation_for } => {
                    assert_eq!(remediation_for, &record);
                    break;
                }
                Step::Wait {
                    reason: WaitReason::MachineGoing,
                    ..
                } => view.machines.retain(|m| m.name != "m1"),
                step => apply(&mut view, step),
            }
        }
        assert_eq!(
            names,
            [
                "add-hook",
                "move-leadership",
                "remove-member",
                "release-hook",
                "create-replacement"
            ]
        );
    }
}
