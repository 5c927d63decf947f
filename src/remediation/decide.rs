//! MHC remediation: which machine, whether now, and why (DESIGN section 2).
//!
//! Pure: [`decide_remediation`] reads a [`ControlPlaneView`] and a time, and returns a
//! [`RemediationDecision`] naming the rule that fired with a message carrying the numbers.
//! The rules are CAPI KubeadmControlPlane's (v1.10, with v1.13's safety checks),
//! on the real etcd membership instead of "every control-plane node is an etcd
//! member".

use std::fmt;

use chrono::{DateTime, Utc};

use super::model::{
    ControlPlaneView, EtcdState, MachineView, Membership, RemediationData, TargetMember,
};
use super::pick::pick_machine_to_remediate;
use super::retry::{RetryVerdict, check_retry_limits};
use crate::quorum::{self, Assessment};

use crate::api::condition_names::owner_remediated::{
    REASON_CANNOT_BE_REMEDIATED, REASON_INTERNAL_ERROR, REASON_MACHINE_DELETING,
    REASON_REMEDIATION_DEFERRED,
};
use crate::api::condition_names::{OWNER_REMEDIATED, REMEDIATING, remediating};

/// The rule that decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    NoMachineToRemediate,
    TargetAlreadyDeleting,
    AnotherRemediationInProgress,
    TopologyUpgradePending,
    RetryPeriodNotExpired,
    MaxRetryReached,
    TooFewMachines,
    MachineProvisioning,
    MachineDeleting,
    NoHealthyControlPlaneLeft,
    EtcdMembershipUnknown,
    EtcdQuorumAtRisk,
    /// Quorum looks at risk only because etcd is settling after a change of
    /// leader or voters: deferred, looked at again shortly.
    EtcdSettling,
    /// The target maps to no member while some member is claimed by no
    /// Machine: it may be the target's.
    EtcdTargetUnmapped,
    NoLeadershipTransferee,
    Remediate,
}

impl Rule {
    pub const ALL: [Rule; 16] = [
        Rule::NoMachineToRemediate,
        Rule::TargetAlreadyDeleting,
        Rule::AnotherRemediationInProgress,
        Rule::TopologyUpgradePending,
        Rule::RetryPeriodNotExpired,
        Rule::MaxRetryReached,
        Rule::TooFewMachines,
        Rule::MachineProvisioning,
        Rule::MachineDeleting,
        Rule::NoHealthyControlPlaneLeft,
        Rule::EtcdMembershipUnknown,
        Rule::EtcdQuorumAtRisk,
        Rule::EtcdSettling,
        Rule::EtcdTargetUnmapped,
        Rule::NoLeadershipTransferee,
        Rule::Remediate,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Rule::NoMachineToRemediate => "no-machine-to-remediate",
            Rule::TargetAlreadyDeleting => "target.already-deleting",
            Rule::AnotherRemediationInProgress => "in-progress.another-remediation",
            Rule::TopologyUpgradePending => "topology.upgrade-pending",
            Rule::RetryPeriodNotExpired => "retry.period-not-expired",
            Rule::MaxRetryReached => "retry.max-retry-reached",
            Rule::TooFewMachines => "initialized.too-few-machines",
            Rule::MachineProvisioning => "initialized.machine-provisioning",
            Rule::MachineDeleting => "initialized.machine-deleting",
            Rule::NoHealthyControlPlaneLeft => "initialized.no-healthy-control-plane-left",
            Rule::EtcdMembershipUnknown => "etcd.membership-unknown",
            Rule::EtcdQuorumAtRisk => "etcd.quorum-at-risk",
            Rule::EtcdSettling => "etcd.etcd-settling",
            Rule::EtcdTargetUnmapped => "etcd.target-member-unknown",
            Rule::NoLeadershipTransferee => "etcd.no-leadership-transferee",
            Rule::Remediate => "remediate",
        }
    }

    /// The `OwnerRemediated=False` reason this rule sets on the picked Machine;
    /// `None` when the rule leaves the condition alone.
    pub fn owner_remediated_reason(self) -> Option<&'static str> {
        match self {
            Rule::NoMachineToRemediate
            | Rule::TargetAlreadyDeleting
            | Rule::AnotherRemediationInProgress => None,
            Rule::TopologyUpgradePending
            | Rule::RetryPeriodNotExpired
            | Rule::MachineProvisioning
            | Rule::MachineDeleting
            | Rule::EtcdSettling => Some(REASON_REMEDIATION_DEFERRED),
            Rule::MaxRetryReached
            | Rule::TooFewMachines
            | Rule::NoHealthyControlPlaneLeft
            | Rule::EtcdQuorumAtRisk
            | Rule::EtcdTargetUnmapped
            | Rule::NoLeadershipTransferee => Some(REASON_CANNOT_BE_REMEDIATED),
            Rule::EtcdMembershipUnknown => Some(REASON_INTERNAL_ERROR),
            Rule::Remediate => Some(REASON_MACHINE_DELETING),
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// "Go": what to remediate and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Remediate {
    pub machine: String,
    /// The target's etcd member (None: it has none, or the control plane is not
    /// initialized yet: no etcd step then).
    pub member: Option<u64>,
    /// A healthy voter to take leadership if the target leads (now or later).
    pub transferee: Option<u64>,
    /// The new `remediation-in-progress` value.
    pub retry: RemediationData,
    /// The quorum arithmetic that allowed it (initialized control planes with
    /// managed etcd only).
    pub assessment: Option<Assessment>,
}

/// The outcome for the picked machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing of ours to remediate.
    Idle,
    /// Leave everything as is (the condition is not touched).
    Skip { machine: String, message: String },
    /// Not now; `OwnerRemediated=False` with the rule's reason.
    Wait { machine: String, message: String },
    /// Go.
    Remediate(Remediate),
}

/// The full decision of one reconcile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemediationDecision {
    /// Machines whose stale `OwnerRemediated=False` is to be removed.
    pub cleanup_owner_remediated: Vec<String>,
    /// The `remediation-in-progress` annotation is stale and is to be removed.
    pub clear_stale_in_progress: bool,
    pub rule: Rule,
    pub outcome: Outcome,
    /// One line, with the numbers.
    pub message: String,
}

/// A condition to set, as plain values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConditionValue {
    pub type_: &'static str,
    pub status: bool,
    pub reason: &'static str,
    pub message: String,
}

impl RemediationDecision {
    /// The picked machine, if any.
    pub fn machine(&self) -> Option<&str> {
        match &self.outcome {
            Outcome::Idle => None,
            Outcome::Skip { machine, .. } | Outcome::Wait { machine, .. } => Some(machine),
            Outcome::Remediate(r) => Some(&r.machine),
        }
    }

    /// `OwnerRemediated` for the picked machine: (machine, condition).
    pub fn owner_remediated(&self) -> Option<(&str, ConditionValue)> {
        let reason = self.rule.owner_remediated_reason()?;
        let message = match &self.outcome {
            Outcome::Remediate(_) => "Machine is deleting".to_string(),
            _ => self.message.clone(),
        };
        Some((
            self.machine()?,
            ConditionValue {
                type_: OWNER_REMEDIATED,
                status: false,
                reason,
                message,
            },
        ))
    }

    /// The KThreesControlPlane's `Remediating` condition.
    pub fn kcp_remediating(&self) -> ConditionValue {
        match self.machine() {
            None => ConditionValue {
                type_: REMEDIATING,
                status: false,
                reason: remediating::REASON_NOT_REMEDIATING,
                message: String::new(),
            },
            Some(machine) => ConditionValue {
                type_: REMEDIATING,
                status: true,
                reason: remediating::REASON_REMEDIATING,
                message: format!("Machine {machine}: {}", self.message),
            },
        }
    }
}

/// Decide MHC remediation for `view` at time `now`.
pub fn decide_remediation(view: &ControlPlaneView, now: DateTime<Utc>) -> RemediationDecision {
    let cleanup_owner_remediated = view
        .machines
        .iter()
        .filter(|m| m.has_stale_owner_remediated())
        .map(|m| m.name.clone())
        .collect();
    // Stale: a Machine was created after the remediation started, i.e. the
    // replacement exists and only the annotation removal was lost (a crash).
    let clear_stale_in_progress = view.remediation_in_progress.as_ref().is_some_and(|data| {
        view.machines
            .iter()
            .any(|m| data.timestamp.is_none_or(|t| m.created > t))
    });
    let (rule, outcome, message) = decide_outcome(view, now, clear_stale_in_progress);
    RemediationDecision {
        cleanup_owner_remediated,
        clear_stale_in_progress,
        rule,
        outcome,
        message,
    }
}

fn wait(rule: Rule, machine: &MachineView, message: String) -> (Rule, Outcome, String) {
    (
        rule,
        Outcome::Wait {
            machine: machine.name.clone(),
            message: message.clone(),
        },
        message,
    )
}

fn decide_outcome(
    view: &ControlPlaneView,
    now: DateTime<Utc>,
    in_progress_is_stale: bool,
) -> (Rule, Outcome, String) {
    let candidates: Vec<&MachineView> = view
        .machines
        .iter()
        .filter(|m| m.needs_owner_remediation())
        .collect();
    let Some((target, why)) = pick_machine_to_remediate(view, &candidates) else {
        return (
            Rule::NoMachineToRemediate,
            Outcome::Idle,
            "no machine has HealthCheckSucceeded=False and OwnerRemediated=False".into(),
        );
    };

    if target.is_deleting() {
        let message = format!("{} is already being deleted", target.name);
        return (
            Rule::TargetAlreadyDeleting,
            Outcome::Skip {
                machine: target.name.clone(),
                message: message.clone(),
            },
            message,
        );
    }
    if let Some(data) = &view.remediation_in_progress
        && !in_progress_is_stale
    {
        let since = data
            .timestamp
            .map(|t| t.to_rfc3339())
            .unwrap_or_else(|| "an unknown time".into());
        let message = format!(
            "another remediation is in progress ({} since {since}, no replacement Machine yet)",
            data.machine
        );
        return (
            Rule::AnotherRemediationInProgress,
            Outcome::Skip {
                machine: target.name.clone(),
                message: message.clone(),
            },
            message,
        );
    }

    if let Some(version) = &view.pending_topology_version {
        return wait(
            Rule::TopologyUpgradePending,
            target,
            format!(
                "KThreesControlPlane can't remediate while waiting for a version upgrade to {version} to be propagated from Cluster.spec.topology"
            ),
        );
    }

    let retry = match check_retry_limits(target, &view.strategy, now) {
        RetryVerdict::Go(data) => data,
        RetryVerdict::Defer { message } => {
            return wait(Rule::RetryPeriodNotExpired, target, message);
        }
        RetryVerdict::Refuse { message } => return wait(Rule::MaxRetryReached, target, message),
    };

    if !view.initialized {
        // The first machine may be remediated: there is no cluster to protect yet.
        let message = format!(
            "remediating {} ({why}); control plane not initialized, retry {}",
            target.name, retry.retry_count
        );
        return (
            Rule::Remediate,
            Outcome::Remediate(Remediate {
                machine: target.name.clone(),
                member: None,
                transferee: None,
                retry,
                assessment: None,
            }),
            message,
        );
    }

    if let Some(rule_and_message) = initialized_preflight(view, target) {
        let (rule, message) = rule_and_message;
        return wait(rule, target, message);
    }

    let (member, transferee, assessment) = match etcd_removal_plan(view, target) {
        Ok(plan) => plan,
        Err((rule, message)) => return wait(rule, target, message),
    };

    let mut message = format!(
        "remediating {} ({why}), retry {}",
        target.name, retry.retry_count
    );
    if let Some(a) = &assessment {
        message.push_str(&format!("; {a}"));
    }
    if let (Some(t), Some(m)) = (transferee, view.membership()) {
        message.push_str(&format!("; leadership goes to {}", member_label(m, t)));
    }
    (
        Rule::Remediate,
        Outcome::Remediate(Remediate {
            machine: target.name.clone(),
            member,
            transferee,
            retry,
            assessment,
        }),
        message,
    )
}

/// The checks that apply once the control plane is initialized, before etcd.
fn initialized_preflight(view: &ControlPlaneView, target: &MachineView) -> Option<(Rule, String)> {
    let n = view.machines.len();
    if n <= 1 {
        return Some((
            Rule::TooFewMachines,
            format!(
                "KThreesControlPlane can't remediate if current replicas are less or equal to 1 ({n} machine)"
            ),
        ));
    }
    let provisioning: Vec<&str> = view
        .machines
        .iter()
        .filter(|m| !m.is_mhc_unhealthy() && m.node_ref.is_none())
        .map(|m| m.name.as_str())
        .collect();
    if !provisioning.is_empty() && !join_blocked_by(view, target) {
        return Some((
            Rule::MachineProvisioning,
            format!(
                "KThreesControlPlane waiting for control plane Machine provisioning to complete before triggering remediation (no node yet: {})",
                provisioning.join(", ")
            ),
        ));
    }
    let deleting = view.deleting_machine_names();
    if !deleting.is_empty() {
        return Some((
            Rule::MachineDeleting,
            format!(
                "KThreesControlPlane waiting for control plane Machine deletion to complete before triggering remediation (deleting: {})",
                deleting.join(", ")
            ),
        ));
    }
    // CAPI v1.13: at least one full set of healthy control-plane components must remain.
    let others: Vec<&MachineView> = view
        .machines
        .iter()
        .filter(|m| m.name != target.name)
        .collect();
    let healthy = others
        .iter()
        .filter(|m| m.components_healthy == Some(true))
        .count();
    if healthy == 0 {
        return Some((
            Rule::NoHealthyControlPlaneLeft,
            format!(
                "KThreesControlPlane can't remediate this Machine because no other Machine has healthy control-plane components (0 of {} healthy)",
                others.len()
            ),
        ));
    }
    None
}

/// Whether `target`'s member is a voter etcd cannot reach while no member
/// is joining (no learner, no unnamed member). etcd refuses every MemberAdd,
/// a learner's too, while its leader is not connected to every voter (the
/// strict reconfiguration check, `isConnectedFullySince`; seen here with 3.4):
/// a Machine still provisioning cannot join until that member is removed, so
/// deferring the remediation for it would wait forever (Cluster API issue
/// #10125: 5 servers, 2 dead, the first replacement never joins). The quorum
/// check that follows still decides whether the removal is safe.
fn join_blocked_by(view: &ControlPlaneView, target: &MachineView) -> bool {
    let (Some(membership), Some(id)) = (view.membership(), view.current_member(target)) else {
        return false;
    };
    membership
        .members
        .iter()
        .all(|m| !m.learner && !m.name.is_empty())
        && membership
            .member(id)
            .is_some_and(|m| m.probe_error.is_some())
}

type EtcdPlan = (Option<u64>, Option<u64>, Option<Assessment>);

/// Quorum check and leadership plan for removing `target`'s member; shared by
/// remediation and scale-down. `Err` carries the refusing rule and why.
pub fn etcd_removal_plan(
    view: &ControlPlaneView,
    target: &MachineView,
) -> Result<EtcdPlan, (Rule, String)> {
    let membership = match &view.etcd {
        EtcdState::NotManaged => return Ok((None, None, None)),
        EtcdState::Unreachable { reason } => {
            return Err((
                Rule::EtcdMembershipUnknown,
                format!(
                    "KThreesControlPlane can't remove {} because the etcd membership could not be read: {reason}",
                    target.name
                ),
            ));
        }
        EtcdState::Observed(m) => m,
    };
    let at_risk = |assessment: &Assessment| {
        if assessment.only_settling(membership.leader.is_some()) {
            Rule::EtcdSettling
        } else {
            Rule::EtcdQuorumAtRisk
        }
    };
    if let Some(standing) = quorum::quorum_lost(&membership.members) {
        return Err((
            at_risk(&standing),
            format!(
                "KThreesControlPlane can't remove {} because etcd has lost quorum: {standing}",
                target.name
            ),
        ));
    }
    let member = match view.target_member(target) {
        TargetMember::Member(id) => Some(id),
        TargetMember::None => None,
        TargetMember::Unknown { unclaimed } => {
            // Counted as a voter, the worst case among the unclaimed ones.
            let assessment =
                quorum::assess_unmapped_removal(&membership.members, &target.name, &unclaimed);
            return Err((
                Rule::EtcdTargetUnmapped,
                format!(
                    "KThreesControlPlane can't remove {} because its etcd member is unknown: {assessment}; {}",
                    target.name,
                    TargetMember::how_to_map(target)
                ),
            ));
        }
    };
    let assessment = match member {
        Some(id) => quorum::assess_removal(&membership.members, id),
        None => Assessment {
            // Named so the explanation says the target costs nothing.
            target: Some(target.name.clone()),
            ..quorum::assess_cluster(&membership.members)
        },
    };
    if !assessment.is_safe() {
        let what = match member {
            Some(_) => assessment.to_string(),
            None => format!(
                "{} has no etcd member, but the cluster as it stands is not safe: {assessment}",
                target.name
            ),
        };
        return Err((
            at_risk(&assessment),
            format!(
                "KThreesControlPlane can't remove {} because this could result in etcd losing quorum: {what}",
                target.name
            ),
        ));
    }
    let Some(member_id) = member else {
        // Costs nothing: no member to remove, no leadership to move.
        return Ok((None, None, Some(assessment)));
    };
    let transferee = leadership_transferee(view, membership, target, member_id);
    let target_may_lead = membership.leader.is_none_or(|leader| leader == member_id);
    if transferee.is_none() && target_may_lead {
        let who = match membership.leader {
            Some(_) => "it is the etcd leader",
            None => "no etcd leader was observed",
        };
        return Err((
            Rule::NoLeadershipTransferee,
            format!(
                "KThreesControlPlane can't remove {} because {who} and there is no healthy etcd member to take leadership",
                target.name
            ),
        ));
    }
    Ok((Some(member_id), transferee, Some(assessment)))
}

/// The member to receive leadership from `target_member`: a healthy voter on the
/// newest healthy Machine (as CAPI does), else a healthy voter with no Machine.
/// Members of Machines that an MHC marked unhealthy, or that are deleting, are
/// never chosen: they are about to go too.
pub fn leadership_transferee(
    view: &ControlPlaneView,
    membership: &Membership,
    target: &MachineView,
    target_member: u64,
) -> Option<u64> {
    let fit = |id: u64| id != target_member && membership.is_healthy_voter(id);
    let on_healthy_machine = view
        .machines
        .iter()
        .filter(|m| m.name != target.name && !m.is_deleting() && !m.is_mhc_unhealthy())
        .filter_map(|m| {
            m.etcd_member
                .filter(|id| fit(*id))
                .map(|id| (m.age_key(), id))
        })
        .max_by(|a, b| a.0.cmp(&b.0))
        .map(|(_, id)| id);
    on_healthy_machine.or_else(|| {
        membership
            .members
            .iter()
            .filter(|m| fit(m.id))
            .filter(|m| !view.machines.iter().any(|mv| mv.etcd_member == Some(m.id)))
            .map(|m| m.id)
            .min()
    })
}

fn member_label(membership: &Membership, id: u64) -> String {
    membership
        .member(id)
        .map(|m| m.label())
        .unwrap_or_else(|| format!("{id:016x}"))
}
