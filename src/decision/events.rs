//! Which Event a waiting plan gets: an expected wait is Normal and named after
//! what it waits for; a Warning only where something is wrong or a person may
//! have to act. Pure, by the rule that fired (docs/operations.md has the
//! table of every reason).

use kube::runtime::events::EventType;

use crate::remediation::decide::Rule as RemediationRule;
use crate::remediation::steps::WaitReason;
use crate::rollout::preflight::Check;

/// How one wait is announced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitEvent {
    pub type_: EventType,
    pub reason: &'static str,
    /// The MHC remediation outcome this wait counts as
    /// (`k3scp_remediations_total{outcome}`); `None` for every wait that is
    /// not the remediation decision itself.
    pub remediation_outcome: Option<&'static str>,
}

const fn normal(reason: &'static str) -> WaitEvent {
    WaitEvent {
        type_: EventType::Normal,
        reason,
        remediation_outcome: None,
    }
}

const fn warning(reason: &'static str) -> WaitEvent {
    WaitEvent {
        type_: EventType::Warning,
        reason,
        remediation_outcome: None,
    }
}

/// The Event of a plan that waits under `rule`.
pub fn wait_event(rule: &str) -> WaitEvent {
    if let Some(why) = rule.strip_prefix("etcd-space.") {
        return space_wait(why);
    }
    if let Some(why) = rule.strip_prefix("restore.") {
        // A restore under way waits on the world (Normal); a refused request
        // needs a person (Warning).
        return match why.strip_prefix("wait.") {
            Some(_) => normal("EtcdRestoreWaiting"),
            None => warning("EtcdRestoreRefused"),
        };
    }
    if let Some((_, wait)) = rule.split_once(".wait.") {
        return removal_wait(wait);
    }
    if rule == "scale-up.waiting-for-initialization" {
        return normal("WaitingForInitialization");
    }
    if let Some(check) = rule.strip_prefix("rollout.") {
        return preflight_wait(check, "RollingOutWaiting", "RolloutBlocked");
    }
    if let Some(check) = rule.strip_prefix("scale-up.") {
        return preflight_wait(check, "ScalingUpWaiting", "ScalingUpBlocked");
    }
    if let Some(why) = rule.strip_prefix("scale-down.") {
        return match why {
            "machine-deleting" | "etcd.etcd-settling" => normal("ScalingDownWaiting"),
            _ => warning("ScalingDownBlocked"),
        };
    }
    if let Some(why) = rule.strip_prefix("remediation.") {
        return remediation_wait(why);
    }
    warning("CannotDecide")
}

/// A removal under way waits on the world: the ordinary parts of a removal
/// are Normal, named after the wait; etcd's state blocking it is a Warning.
fn removal_wait(wait: &str) -> WaitEvent {
    let reason = WaitReason::ALL.into_iter().find(|r| r.as_str() == wait);
    match reason {
        Some(WaitReason::Drain) => normal("WaitingForDrain"),
        Some(WaitReason::OtherHooks) => normal("WaitingForOtherHooks"),
        Some(WaitReason::OlderDeletion) => normal("WaitingForOlderDeletion"),
        Some(WaitReason::MachineGoing) => normal("WaitingForMachineDeletion"),
        Some(WaitReason::AnotherRemediation) => normal("WaitingForAnotherRemediation"),
        Some(WaitReason::LeadershipMoving) => normal("WaitingForLeadershipMove"),
        Some(WaitReason::EtcdSettling) => normal("WaitingForEtcdToSettle"),
        Some(_) | None => warning("RemovalBlocked"),
    }
}

/// The space rule waits for a membership change to finish (Normal), or is
/// blocked by something a person may have to fix: an unhealthy member, a
/// quota or alarms unknown, not enough room (Warning).
fn space_wait(why: &str) -> WaitEvent {
    match why.strip_prefix("wait.") {
        Some(_) => normal("EtcdSpaceWaiting"),
        None => warning("EtcdSpaceBlocked"),
    }
}

fn preflight_wait(check: &str, progress: &'static str, blocked: &'static str) -> WaitEvent {
    match Check::from_name(check) {
        Some(c) if c.is_progress() => normal(progress),
        _ => warning(blocked),
    }
}

/// The MHC remediation decision waits: deferred by its own rules (retry
/// period, a Machine still provisioning or deleting) is Normal; refused
/// (retries used up, quorum, too few machines) or unable to read etcd is a
/// Warning: a person may have to act.
fn remediation_wait(why: &str) -> WaitEvent {
    let rule = RemediationRule::ALL.into_iter().find(|r| r.as_str() == why);
    match rule.and_then(RemediationRule::owner_remediated_reason) {
        Some(crate::api::condition_names::owner_remediated::REASON_REMEDIATION_DEFERRED) => {
            WaitEvent {
                remediation_outcome: Some("deferred"),
                ..normal("RemediationDeferred")
            }
        }
        Some(_) => WaitEvent {
            remediation_outcome: Some("refused"),
            ..warning("RemediationBlocked")
        },
        None => normal("RemediationWaiting"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every wait a healthy life goes through is Normal and counts no
    /// remediation; the waits that need a person are Warnings.
    #[test]
    fn table() {
        let cases: &[(&str, EventType, &str, Option<&str>)] = &[
            // A scale-down or rollout removal while CAPI drains: not a remediation.
            (
                "scale-down.wait.drain",
                EventType::Normal,
                "WaitingForDrain",
                None,
            ),
            (
                "rollout.wait.drain",
                EventType::Normal,
                "WaitingForDrain",
                None,
            ),
            (
                "removal.wait.drain",
                EventType::Normal,
                "WaitingForDrain",
                None,
            ),
            (
                "remediation.wait.drain",
                EventType::Normal,
                "WaitingForDrain",
                None,
            ),
            (
                "removal.wait.other-hooks",
                EventType::Normal,
                "WaitingForOtherHooks",
                None,
            ),
            // etcd settling after a leadership handover or a promotion: it
            // passes by itself, not a problem.
            (
                "removal.wait.etcd-settling",
                EventType::Normal,
                "WaitingForEtcdToSettle",
                None,
            ),
            (
                "scale-up.etcd-settling",
                EventType::Normal,
                "ScalingUpWaiting",
                None,
            ),
            (
                "rollout.etcd-settling",
                EventType::Normal,
                "RollingOutWaiting",
                None,
            ),
            (
                "scale-down.etcd.etcd-settling",
                EventType::Normal,
                "ScalingDownWaiting",
                None,
            ),
            (
                "remediation.etcd.etcd-settling",
                EventType::Normal,
                "RemediationDeferred",
                Some("deferred"),
            ),
            // A deletion held because removing the member would lose quorum,
            // or because its member cannot be told apart: a person may act.
            (
                "removal.wait.quorum-at-risk",
                EventType::Warning,
                "RemovalBlocked",
                None,
            ),
            (
                "removal.wait.target-member-unknown",
                EventType::Warning,
                "RemovalBlocked",
                None,
            ),
            (
                "scale-up.etcd-member-unhealthy",
                EventType::Warning,
                "ScalingUpBlocked",
                None,
            ),
            (
                "removal.wait.older-deletion",
                EventType::Normal,
                "WaitingForOlderDeletion",
                None,
            ),
            (
                "removal.wait.machine-going",
                EventType::Normal,
                "WaitingForMachineDeletion",
                None,
            ),
            (
                "remediation.wait.leadership-moving",
                EventType::Normal,
                "WaitingForLeadershipMove",
                None,
            ),
            (
                "removal.wait.quorum-at-risk",
                EventType::Warning,
                "RemovalBlocked",
                None,
            ),
            (
                "removal.wait.etcd-unreachable",
                EventType::Warning,
                "RemovalBlocked",
                None,
            ),
            (
                "removal.wait.no-transferee",
                EventType::Warning,
                "RemovalBlocked",
                None,
            ),
            (
                "scale-up.waiting-for-initialization",
                EventType::Normal,
                "WaitingForInitialization",
                None,
            ),
            (
                "scale-up.machine-provisioning",
                EventType::Normal,
                "ScalingUpWaiting",
                None,
            ),
            (
                "scale-up.etcd-learner",
                EventType::Normal,
                "ScalingUpWaiting",
                None,
            ),
            (
                "scale-up.etcd-member-unhealthy",
                EventType::Warning,
                "ScalingUpBlocked",
                None,
            ),
            (
                "scale-up.etcd-member-missing",
                EventType::Warning,
                "ScalingUpBlocked",
                None,
            ),
            (
                "rollout.machine-deleting",
                EventType::Normal,
                "RollingOutWaiting",
                None,
            ),
            (
                "rollout.replacement-not-voter",
                EventType::Normal,
                "RollingOutWaiting",
                None,
            ),
            (
                "rollout.etcd-unreachable",
                EventType::Warning,
                "RolloutBlocked",
                None,
            ),
            (
                "scale-down.machine-deleting",
                EventType::Normal,
                "ScalingDownWaiting",
                None,
            ),
            (
                "scale-down.other-machine-unhealthy",
                EventType::Warning,
                "ScalingDownBlocked",
                None,
            ),
            (
                "scale-down.etcd.quorum-at-risk",
                EventType::Warning,
                "ScalingDownBlocked",
                None,
            ),
            (
                "remediation.retry.period-not-expired",
                EventType::Normal,
                "RemediationDeferred",
                Some("deferred"),
            ),
            (
                "remediation.initialized.machine-deleting",
                EventType::Normal,
                "RemediationDeferred",
                Some("deferred"),
            ),
            (
                "remediation.retry.max-retry-reached",
                EventType::Warning,
                "RemediationBlocked",
                Some("refused"),
            ),
            (
                "remediation.etcd.quorum-at-risk",
                EventType::Warning,
                "RemediationBlocked",
                Some("refused"),
            ),
            (
                "remediation.etcd.membership-unknown",
                EventType::Warning,
                "RemediationBlocked",
                Some("refused"),
            ),
            // etcd's space: a membership change is waited for; the rest needs a person.
            (
                "etcd-space.wait.membership-change",
                EventType::Normal,
                "EtcdSpaceWaiting",
                None,
            ),
            (
                "etcd-space.blocked.unhealthy-member",
                EventType::Warning,
                "EtcdSpaceBlocked",
                None,
            ),
            (
                "etcd-space.blocked.not-enough-room",
                EventType::Warning,
                "EtcdSpaceBlocked",
                None,
            ),
        ];
        for (rule, type_, reason, outcome) in cases {
            let got = wait_event(rule);
            assert_eq!(
                (got.type_, got.reason, got.remediation_outcome),
                (*type_, *reason, *outcome),
                "{rule}"
            );
        }
    }
}
