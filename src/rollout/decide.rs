//! The next step of a rollout. Pure.
//!
//! As CAPI's KCP `rollingUpdate`, one Machine at a time:
//! - maxSurge 1 (default): with `replicas` live Machines and some outdated,
//!   add one up-to-date Machine; once it runs a healthy voting member and its
//!   Node is ready, remove the oldest outdated Machine through the safe removal
//!   steps (leadership off, member removed, then the Machine goes).
//! - maxSurge 0: remove an outdated Machine first, only while at least 3 voters
//!   are healthy (2 stay, and still hold a quorum of 2), then scale up again.
//!
//! Fewer live Machines than `replicas` is ordinary scale-up (the rollout's
//! replacement after a remove-first); that is the caller's rule.

use super::preflight::{self, Failure};
use crate::remediation::model::ControlPlaneView;

/// Fewest healthy voters before a remove-first (maxSurge 0) step.
pub const MIN_HEALTHY_VOTERS_FOR_REMOVE_FIRST: usize = 3;

/// What the rollout does now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RolloutStep {
    /// Create one Machine above `replicas`.
    Surge,
    /// Remove one outdated Machine (selection and etcd safety as a scale-down).
    RemoveOutdated,
    /// Not now; `progress` tells ordinary progress from a problem.
    Wait { progress: bool },
}

/// The rollout's decision, explainable: the rule that fired and the numbers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolloutDecision {
    pub step: RolloutStep,
    pub rule: String,
    pub message: String,
}

/// The next rollout step for `view`, or `None` when nothing live is outdated
/// or fewer Machines than `replicas` run (scale-up comes first).
pub fn decide_rollout(view: &ControlPlaneView, max_surge: u32) -> Option<RolloutDecision> {
    let live: Vec<_> = view.machines.iter().filter(|m| !m.is_deleting()).collect();
    let outdated: Vec<_> = live.iter().filter(|m| m.outdated).collect();
    let desired = view.desired_replicas as usize;
    if outdated.is_empty() || live.len() < desired {
        return None;
    }
    let progress = format!(
        "rolling out: {} of {} machines outdated (maxSurge {max_surge})",
        outdated.len(),
        live.len()
    );
    let wait = |f: Failure| RolloutDecision {
        step: RolloutStep::Wait {
            progress: f.check.is_progress(),
        },
        rule: format!("rollout.{}", f.check.as_str()),
        message: format!("{progress}; {f}"),
    };
    if live.len() > desired {
        // The surge is up (or replicas went down meanwhile): an outdated
        // Machine goes once the newcomer carries its share of quorum.
        if let Err(f) = preflight::before_removing_outdated(view) {
            return Some(wait(f));
        }
        return Some(RolloutDecision {
            step: RolloutStep::RemoveOutdated,
            rule: "rollout.remove-outdated".into(),
            message: format!("{progress}; removing an outdated machine"),
        });
    }
    if max_surge >= 1 {
        if let Err(f) = preflight::before_adding(view) {
            return Some(wait(f));
        }
        return Some(RolloutDecision {
            step: RolloutStep::Surge,
            rule: "rollout.surge".into(),
            message: format!(
                "{progress}; creating an up-to-date machine before an outdated one goes"
            ),
        });
    }
    if let Err(f) = preflight::before_removing_outdated(view) {
        return Some(wait(f));
    }
    if let Some(membership) = view.membership() {
        let healthy = membership
            .members
            .iter()
            .filter(|m| membership.is_healthy_voter(m.id))
            .count();
        if healthy < MIN_HEALTHY_VOTERS_FOR_REMOVE_FIRST {
            return Some(RolloutDecision {
                step: RolloutStep::Wait { progress: false },
                rule: "rollout.too-few-voters-to-remove-first".into(),
                message: format!(
                    "{progress}; maxSurge 0 removes a machine before its replacement exists, which needs at least {MIN_HEALTHY_VOTERS_FOR_REMOVE_FIRST} healthy voters ({healthy} healthy); set spec.rollout.strategy.rollingUpdate.maxSurge to 1"
                ),
            });
        }
    }
    Some(RolloutDecision {
        step: RolloutStep::RemoveOutdated,
        rule: "rollout.remove-first".into(),
        message: format!(
            "{progress}; removing an outdated machine before creating its replacement"
        ),
    })
}
