//! How soon a control plane is looked at again after a pass: soon after a
//! step (its effect is there to be observed), at the configured pace while
//! waiting (sooner for waits that pass within a heartbeat or a second), at
//! the idle pace when there is nothing to do, and only on a change when
//! nothing but a person or another controller can move it on. Pure.

use std::time::Duration;

use crate::lifecycle::{DeletionStep, Lifecycle};

use super::plan::{Action, Refusal};

/// When a control plane is looked at again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Only when it, its Cluster or one of its Machines changes.
    OnChange,
    /// After this long (or at a change before).
    After(Duration),
}

/// How soon after a step: its effect is observable at once.
pub const SOON: Duration = Duration::from_millis(200);

/// The paces `run` was configured with (`--wait-requeue`, `--idle-requeue`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Paces {
    pub wait: Duration,
    pub idle: Duration,
}

/// After a plan's `action`, taken or waited on under `rule`.
pub fn after_plan(action: &Action, rule: &str, paces: Paces) -> Next {
    match action {
        Action::Wait => Next::After(wait_pace(paces.wait, rule)),
        Action::Idle => Next::After(paces.idle),
        Action::Step { .. }
        | Action::CreateMachine
        | Action::AddHooks { .. }
        | Action::RemoveOrphan { .. }
        | Action::EtcdSpace { .. }
        | Action::EtcdSnapshot { .. }
        | Action::EtcdRestore { .. } => Next::After(SOON),
    }
}

/// After a refusal to decide: an invalid spec waits for the person to change
/// it; anything else (the view, an ambiguous membership, no Cluster yet) may
/// pass by itself, so it is looked at again at the wait pace.
pub fn after_refusal(refusal: &Refusal, paces: Paces) -> Next {
    match refusal {
        Refusal::Invalid(_) => Next::OnChange,
        Refusal::View(_) | Refusal::AmbiguousMembership(_) | Refusal::NoCluster => {
            Next::After(paces.wait)
        }
    }
}

/// After a lifecycle decision that stopped the pass before remediation and
/// scaling: a paused control plane waits for the change that unpauses it,
/// and a removed finalizer leaves nothing to look at; a lifecycle step that
/// acted is followed soon by the next; a wait (for the Cluster, for workers
/// or Machines to go, for a broken Secret to be fixed) at the wait pace.
pub fn after_lifecycle(lifecycle: &Lifecycle, paces: Paces) -> Next {
    match lifecycle {
        Lifecycle::Paused { .. }
        | Lifecycle::Delete {
            step: DeletionStep::RemoveFinalizer,
            ..
        } => Next::OnChange,
        Lifecycle::AddFinalizer
        | Lifecycle::Delete {
            step: DeletionStep::DeleteMachines { .. } | DeletionStep::ReleaseHooks { .. },
            ..
        } => Next::After(SOON),
        Lifecycle::Secrets { plan } if plan.blocked.is_none() => Next::After(SOON),
        Lifecycle::Secrets { .. }
        | Lifecycle::Delete { .. }
        | Lifecycle::WaitForCluster { .. }
        | Lifecycle::MixedManagement { .. }
        | Lifecycle::Proceed { .. } => Next::After(paces.wait),
    }
}

/// How soon a wait under `rule` is looked at again, `configured` being
/// `run`'s pace for waits: a leadership move under way is confirmed within
/// about a heartbeat, so soon; a new member waiting to be promoted from
/// learner (k3s's leader promotes on its 15 s tick) every second, so a
/// scale-up or rollout goes on within a second of it rather than up to a
/// whole wait later (measured: about 5.4 s of a bring-up of 3,
/// docs/bench-history.md fifth round); any other wait at the configured pace,
/// never slower.
pub fn wait_pace(configured: Duration, rule: &str) -> Duration {
    let moving = crate::remediation::steps::WaitReason::LeadershipMoving.as_str();
    let settling = crate::remediation::steps::WaitReason::EtcdSettling.as_str();
    let learner = crate::rollout::preflight::Check::EtcdLearner.as_str();
    // Settling passes within a few heartbeats (500 ms on k3s).
    if rule.ends_with(&format!(".wait.{moving}")) || rule.ends_with(&format!(".{settling}")) {
        configured.min(Duration::from_millis(250))
    } else if rule.ends_with(&format!(".{learner}")) {
        configured.min(Duration::from_secs(1))
    } else {
        configured
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::SecretPlan;
    use crate::remediation::steps::{Removal, RemovalKind, Step};

    const PACES: Paces = Paces {
        wait: Duration::from_secs(10),
        idle: Duration::from_secs(60),
    };

    #[test]
    fn after_a_plan_a_step_is_followed_soon_a_wait_at_its_pace_and_idle_at_the_idle_pace() {
        let step = Action::Step {
            removal: Removal {
                machine: "m1".into(),
                kind: RemovalKind::ScaleDown,
            },
            step: Step::DeleteMachine {
                machine: "m1".into(),
            },
        };
        let cases = [
            ("a_removal_step", step, "scale-down.remove", SOON),
            (
                "a_new_machine",
                Action::CreateMachine,
                "scale-up.create",
                SOON,
            ),
            (
                "hooks_added",
                Action::AddHooks {
                    machines: vec!["m1".into()],
                },
                "hooks.add",
                SOON,
            ),
            (
                "a_wait_at_the_configured_pace",
                Action::Wait,
                "scale-up.node-not-ready",
                PACES.wait,
            ),
            (
                "a_wait_for_a_learner_every_second",
                Action::Wait,
                "scale-up.etcd-learner",
                Duration::from_secs(1),
            ),
            ("nothing_to_do", Action::Idle, "idle", PACES.idle),
        ];
        for (name, action, rule, after) in cases {
            assert_eq!(
                after_plan(&action, rule, PACES),
                Next::After(after),
                "{name}"
            );
        }
    }

    #[test]
    fn after_a_refusal_only_an_invalid_spec_waits_for_a_change() {
        let cases = [
            (
                "an_invalid_spec",
                Refusal::Invalid(crate::api::validate::ValidationErrors(vec![])),
                Next::OnChange,
            ),
            (
                "an_ambiguous_membership",
                Refusal::AmbiguousMembership("two members on one node".into()),
                Next::After(PACES.wait),
            ),
            (
                "no_cluster_yet",
                Refusal::NoCluster,
                Next::After(PACES.wait),
            ),
        ];
        for (name, refusal, next) in cases {
            assert_eq!(after_refusal(&refusal, PACES), next, "{name}");
        }
    }

    #[test]
    fn after_a_lifecycle_decision_each_is_looked_at_again_at_its_pace() {
        let secrets = |blocked: Option<&str>| SecretPlan {
            writes: vec![],
            blocked: blocked.map(str::to_string),
            certificates_available: false,
            kubeconfig_pending: None,
        };
        let delete = |step| Lifecycle::Delete {
            step,
            trigger: "KThreesControlPlane deleted".into(),
        };
        let machines = vec!["m1".to_string()];
        let cases = [
            (
                "paused",
                Lifecycle::Paused {
                    by: "Cluster".into(),
                },
                Next::OnChange,
            ),
            (
                "finalizer_removed",
                delete(DeletionStep::RemoveFinalizer),
                Next::OnChange,
            ),
            (
                "finalizer_added",
                Lifecycle::AddFinalizer,
                Next::After(SOON),
            ),
            (
                "secrets_written",
                Lifecycle::Secrets {
                    plan: secrets(None),
                },
                Next::After(SOON),
            ),
            (
                "a_secret_unusable",
                Lifecycle::Secrets {
                    plan: secrets(Some("Secret ns/c-ca[tls.key]")),
                },
                Next::After(PACES.wait),
            ),
            (
                "machines_deleted",
                delete(DeletionStep::DeleteMachines {
                    machines: machines.clone(),
                }),
                Next::After(SOON),
            ),
            (
                "hooks_released",
                delete(DeletionStep::ReleaseHooks {
                    machines: machines.clone(),
                }),
                Next::After(SOON),
            ),
            (
                "waiting_for_workers",
                delete(DeletionStep::WaitForWorkers {
                    workers: vec!["w1".into()],
                }),
                Next::After(PACES.wait),
            ),
            (
                "waiting_for_machines",
                delete(DeletionStep::WaitForMachines { machines }),
                Next::After(PACES.wait),
            ),
            (
                "waiting_for_the_cluster",
                Lifecycle::WaitForCluster {
                    reason: "no infrastructure".into(),
                },
                Next::After(PACES.wait),
            ),
            (
                "mixed_management",
                Lifecycle::MixedManagement {
                    foreign: vec!["x1".into()],
                },
                Next::After(PACES.wait),
            ),
        ];
        for (name, lifecycle, next) in cases {
            assert_eq!(after_lifecycle(&lifecycle, PACES), next, "{name}");
        }
    }

    #[test]
    fn each_wait_is_looked_at_again_at_its_own_pace() {
        let configured = Duration::from_secs(10);
        let cases = [
            (
                "a_leadership_move_under_way",
                "remediation.wait.leadership-moving",
                250,
            ),
            (
                "a_scale_up_waiting_for_a_learner",
                "scale-up.etcd-learner",
                1000,
            ),
            (
                "a_rollout_waiting_for_a_learner",
                "rollout.etcd-learner",
                1000,
            ),
            ("a_drain", "remediation.wait.drain", 10_000),
            ("quorum_at_risk", "remediation.wait.quorum-at-risk", 10_000),
            ("a_node_not_ready", "scale-up.node-not-ready", 10_000),
        ];
        for (name, rule, millis) in cases {
            assert_eq!(
                wait_pace(configured, rule),
                Duration::from_millis(millis),
                "{name}"
            );
        }
        assert_eq!(
            wait_pace(Duration::from_millis(500), "scale-up.etcd-learner"),
            Duration::from_millis(500),
            "never slower than configured"
        );
    }
}
