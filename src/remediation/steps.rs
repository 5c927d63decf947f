//! The resumable removal of one control-plane machine: "what is the next step?".
//!
//! Pure: [`next_step`] maps the observed state of an in-flight removal to the ONE
//! next idempotent step. Every observable state maps to exactly one step, and
//! each step's effect is observable, so a controller restart between any two
//! steps resumes where it stopped, without repeating or skipping one:
//!
//! 1. record the remediation on the KCP (`remediation-in-progress`; MHC only);
//! 2. add our pre-terminate hook to the Machine (its value records the member);
//! 3. move etcd leadership off the target's member, if it leads;
//! 4. delete the Machine (CAPI drains the node, then waits on hooks);
//! 5. wait until CAPI waits on pre-terminate hooks, no other hook remains, and
//!    this is the machine with the oldest deletionTimestamp;
//! 6. move leadership again if it came back to the target;
//! 7. remove the member, through a member that stays, after re-checking quorum;
//! 8. (observation) the member is gone from the membership;
//! 9. release our hook so CAPI finishes the deletion (a scale-down is done here;
//!    a remediation waits until the Machine is gone);
//! 10. create the replacement with `remediation-for` (MHC only), then clear the
//!     KCP's `remediation-in-progress`.
//!
//! Scale-down runs the same steps without 1 and 10. [`resume`] rebuilds the
//! in-flight removal from what is observable (the KCP annotation, our hook).

use std::fmt;

use super::decide::leadership_transferee;
use super::model::{
    ControlPlaneView, EtcdState, MachineView, Membership, PRE_TERMINATE_HOOK_ANNOTATION,
    RemediationData,
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
}

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
                Some(id) => write!(f, "add pre-terminate hook to {machine} (member {id:016x})"),
                None => write!(f, "add pre-terminate hook to {machine} (no etcd member)"),
            },
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

/// Our hook annotation's value: the member it guards (`member=<hex id>`), or empty.
pub fn hook_value(member: Option<u64>) -> String {
    member
        .map(|id| format!("member={id:x}"))
        .unwrap_or_default()
}

/// Parse our hook annotation's value; the error names the annotation.
pub fn parse_hook_value(value: &str) -> Result<Option<u64>, String> {
    if value.is_empty() {
        return Ok(None);
    }
    value
        .strip_prefix("member=")
        .and_then(|hex| u64::from_str_radix(hex, 16).ok())
        .map(Some)
        .ok_or_else(|| {
            format!("annotation {PRE_TERMINATE_HOOK_ANNOTATION}: expected \"member=<hex id>\" or empty, got {value:?}")
        })
}

fn wait(reason: WaitReason, message: String) -> Step {
    Step::Wait { reason, message }
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
        if !target.has_our_hook {
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

/// The target's member: the one recorded in our hook, else the mapped one;
/// only if it is (still) in the membership.
fn current_member(view: &ControlPlaneView, target: &MachineView) -> Option<u64> {
    let membership = view.membership()?;
    target
        .hook_member
        .or(target.etcd_member)
        .filter(|id| membership.member(*id).is_some())
}

fn planned_member(view: &ControlPlaneView, target: &MachineView) -> Option<u64> {
    match etcd_in_scope(view) {
        Ok(Some(_)) => current_member(view, target),
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
        return Some(wait(
            WaitReason::QuorumAtRisk,
            format!(
                "not deleting {} now: etcd has lost quorum: {standing}",
                target.name
            ),
        ));
    }
    let assessment = match current_member(view, target) {
        Some(member) => quorum::assess_removal(&membership.members, member),
        None => quorum::assess_cluster(&membership.members),
    };
    if assessment.is_safe() {
        return None;
    }
    Some(wait(
        WaitReason::QuorumAtRisk,
        format!("not deleting {} now: {assessment}", target.name),
    ))
}

fn leadership_step(view: &ControlPlaneView, target: &MachineView) -> Option<Step> {
    let membership = match etcd_in_scope(view) {
        Err(message) => return Some(wait(WaitReason::EtcdUnreachable, message)),
        Ok(None) => return None,
        Ok(Some(m)) => m,
    };
    let member = current_member(view, target)?;
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
    let member = current_member(view, target)?;
    if let Some(standing) = quorum::quorum_lost(&membership.members) {
        return Some(wait(
            WaitReason::QuorumAtRisk,
            format!(
                "not removing the member of {} now: etcd has lost quorum: {standing}",
                target.name
            ),
        ));
    }
    let assessment = quorum::assess_removal(&membership.members, member);
    if !assessment.is_safe() {
        return Some(wait(
            WaitReason::QuorumAtRisk,
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
/// on any reconcile): the remediation recorded on the KCP, else a machine that
/// carries our hook (a scale-down). `None`: nothing in flight.
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
        .filter(|m| m.has_our_hook)
        .min_by_key(|m| (m.deleting.is_none(), m.deleting, m.name.clone()))
        .map(|m| Removal {
            machine: m.name.clone(),
            kind: RemovalKind::ScaleDown,
        })
}
