//! `Remediating` on the KThreesControlPlane and `OwnerRemediated` on the
//! Machine a MachineHealthCheck marked: what remediation does, or why not.

use crate::api::condition_names::{OWNER_REMEDIATED, REMEDIATING, owner_remediated, remediating};
use crate::lifecycle::Lifecycle;
use crate::remediation::decide::{Outcome, RemediationDecision};
use crate::remediation::steps::Step;

use super::super::plan::{Action, Plan, Refusal};
use super::{PlanNote, Value, value};

/// The removal step the plan takes now, on which Machine.
#[derive(Clone, Copy, Debug)]
pub struct RemovalStep<'a> {
    pub machine: &'a str,
    pub step: &'a Step,
}

impl<'a> RemovalStep<'a> {
    pub fn of(plan: &'a Plan) -> Option<Self> {
        match &plan.action {
            Action::Step { removal, step } => Some(RemovalStep {
                machine: &removal.machine,
                step,
            }),
            _ => None,
        }
    }
}

/// `Remediating`, or `None` when the spec is invalid (`SpecValid` says
/// why and this condition is left as it was). Without a plan: False,
/// `CannotDecide` when the lifecycle refuses to act.
pub fn remediating(lifecycle: &Lifecycle, plan: Option<Result<&Plan, &Refusal>>) -> Option<Value> {
    match plan {
        Some(Ok(plan)) => Some(remediating_under_plan(
            RemovalStep::of(plan),
            &plan.remediation,
            PlanNote::of(plan),
        )),
        Some(Err(Refusal::Invalid(_))) => None,
        Some(Err(refusal)) => Some(value(
            REMEDIATING,
            Some(false),
            remediating::REASON_CANNOT_DECIDE,
            refusal.to_string(),
        )),
        None => Some(match lifecycle {
            Lifecycle::MixedManagement { .. } => value(
                REMEDIATING,
                Some(false),
                remediating::REASON_CANNOT_DECIDE,
                lifecycle.message(),
            ),
            Lifecycle::Secrets { plan } if plan.blocked.is_some() => value(
                REMEDIATING,
                Some(false),
                remediating::REASON_CANNOT_DECIDE,
                lifecycle.message(),
            ),
            _ => value(
                REMEDIATING,
                Some(false),
                remediating::REASON_NOT_REMEDIATING,
                "",
            ),
        }),
    }
}

/// `Remediating` once a plan was made: True while a removal step runs (any
/// removal: a scale-down's too), True `RemediationBlocked` while the plan
/// waits and remediation picked a Machine; else what the remediation
/// decision says.
pub fn remediating_under_plan(
    removal: Option<RemovalStep>,
    remediation: &RemediationDecision,
    plan: PlanNote,
) -> Value {
    if let Some(RemovalStep { machine, step }) = removal {
        return value(
            REMEDIATING,
            Some(true),
            remediating::REASON_REMEDIATING,
            format!("{machine}: {step} ({})", plan.rule),
        );
    }
    if plan.waits
        && let Some(machine) = remediation.machine()
    {
        return value(
            REMEDIATING,
            Some(true),
            remediating::REASON_REMEDIATION_BLOCKED,
            format!("Machine {machine}: {} ({})", plan.message, plan.rule),
        );
    }
    remediation.kcp_remediating().into()
}

/// `OwnerRemediated` on `machine` (always False: True is never written, the
/// condition is removed once the Machine recovered), or `None` to leave it.
/// While a removal step of ours runs on it and its MachineHealthCheck asked
/// (`needs_owner_remediation`): the step; otherwise what the remediation
/// decision says of it, unless it is the one being remediated now.
pub fn owner_remediated(
    machine: &str,
    machine_deleting: bool,
    needs_owner_remediation: bool,
    removal: Option<RemovalStep>,
    plan: PlanNote,
    remediation: &RemediationDecision,
) -> Option<Value> {
    match removal {
        Some(RemovalStep { machine: m, step }) if m == machine && needs_owner_remediation => {
            let (reason, message) = match step {
                Step::DeleteMachine { .. } => (
                    owner_remediated::REASON_MACHINE_DELETING,
                    "Machine is deleting".to_string(),
                ),
                _ if machine_deleting => (
                    owner_remediated::REASON_MACHINE_DELETING,
                    format!("Machine is deleting: {step}"),
                ),
                _ => (
                    owner_remediated::REASON_REMEDIATION_IN_PROGRESS,
                    format!("{step} ({})", plan.rule),
                ),
            };
            Some(value(OWNER_REMEDIATED, Some(false), reason, message))
        }
        _ => match remediation.owner_remediated() {
            Some((target, v))
                if target == machine && !matches!(remediation.outcome, Outcome::Remediate(_)) =>
            {
                Some(v.into())
            }
            _ => None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::SecretPlan;
    use crate::remediation::decide::Rule;
    use crate::remediation::steps::WaitReason;

    fn decision(rule: Rule, outcome: Outcome, message: &str) -> RemediationDecision {
        RemediationDecision {
            cleanup_owner_remediated: vec![],
            clear_stale_in_progress: false,
            rule,
            outcome,
            message: message.into(),
        }
    }

    fn idle() -> RemediationDecision {
        decision(
            Rule::NoMachineToRemediate,
            Outcome::Idle,
            "nothing to remediate",
        )
    }

    /// Remediation picked `cp-2` but waits for the retry period.
    fn deferred() -> RemediationDecision {
        decision(
            Rule::RetryPeriodNotExpired,
            Outcome::Wait {
                machine: "cp-2".into(),
                message: "retry period not expired".into(),
            },
            "retry period of 5m not expired",
        )
    }

    const WAIT: PlanNote = PlanNote {
        message: "waiting for etcd to settle",
        rule: "remediation.wait.etcd-settling",
        waits: true,
    };
    const STEP: PlanNote = PlanNote {
        message: "removing cp-2",
        rule: "remediation.remediate",
        waits: false,
    };

    #[test]
    fn remediating_condition() {
        let proceed = Lifecycle::Proceed {
            secrets: SecretPlan {
                writes: vec![],
                blocked: None,
                certificates_available: true,
                kubeconfig_pending: None,
            },
        };
        let blocked_secrets = Lifecycle::Secrets {
            plan: SecretPlan {
                writes: vec![],
                blocked: Some("Secret ns/c-ca has no tls.key".into()),
                certificates_available: false,
                kubeconfig_pending: None,
            },
        };
        let mixed = Lifecycle::MixedManagement {
            foreign: vec!["old-cp-1".into()],
        };
        let invalid = Refusal::Invalid(crate::api::ValidationErrors(vec![]));
        /// The plan, a refusal, or neither (the lifecycle stopped first).
        type PlanOrRefusal<'a> = Option<Result<&'a Plan, &'a Refusal>>;
        /// Status, reason, part of the message; `None`: left as it was.
        type Want = Option<(Option<bool>, &'static str, &'static str)>;
        let cases: [(&str, &Lifecycle, PlanOrRefusal, Want); 5] = [
            (
                "an invalid spec leaves it to SpecValid",
                &proceed,
                Some(Err(&invalid)),
                None,
            ),
            (
                "another refusal cannot decide",
                &proceed,
                Some(Err(&Refusal::NoCluster)),
                Some((
                    Some(false),
                    remediating::REASON_CANNOT_DECIDE,
                    "waiting for the Cluster controller",
                )),
            ),
            (
                "Machines of another owner",
                &mixed,
                None,
                Some((Some(false), remediating::REASON_CANNOT_DECIDE, "old-cp-1")),
            ),
            (
                "an unusable Secret",
                &blocked_secrets,
                None,
                Some((
                    Some(false),
                    remediating::REASON_CANNOT_DECIDE,
                    "Secret ns/c-ca has no tls.key",
                )),
            ),
            (
                "the lifecycle stopped before a plan",
                &proceed,
                None,
                Some((Some(false), remediating::REASON_NOT_REMEDIATING, "")),
            ),
        ];
        for (name, lifecycle, plan, want) in cases {
            let got = remediating(lifecycle, plan);
            match (got, want) {
                (None, None) => {}
                (Some(got), Some((status, reason, message))) => {
                    assert_eq!(got.type_, REMEDIATING, "{name}");
                    assert_eq!((got.status, got.reason), (status, reason), "{name}");
                    assert!(got.message.contains(message), "{name}: {}", got.message);
                }
                (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn remediating_under_plan_condition() {
        let delete = Step::DeleteMachine {
            machine: "cp-2".into(),
        };
        let cases = [
            (
                "a removal step runs",
                Some(RemovalStep {
                    machine: "cp-2",
                    step: &delete,
                }),
                deferred(),
                STEP,
                Some(true),
                remediating::REASON_REMEDIATING,
                "cp-2: delete Machine cp-2 (remediation.remediate)",
            ),
            (
                "the plan waits with a Machine picked",
                None,
                deferred(),
                WAIT,
                Some(true),
                remediating::REASON_REMEDIATION_BLOCKED,
                "Machine cp-2: waiting for etcd to settle (remediation.wait.etcd-settling)",
            ),
            (
                "the plan waits, nothing picked",
                None,
                idle(),
                WAIT,
                Some(false),
                remediating::REASON_NOT_REMEDIATING,
                "",
            ),
            (
                "another action, a Machine picked: the remediation decision",
                None,
                deferred(),
                STEP,
                Some(true),
                remediating::REASON_REMEDIATING,
                "Machine cp-2: retry period of 5m not expired",
            ),
        ];
        for (name, removal, remediation, plan, status, reason, message) in cases {
            let got = remediating_under_plan(removal, &remediation, plan);
            assert_eq!(got.type_, REMEDIATING, "{name}");
            assert_eq!((got.status, got.reason), (status, reason), "{name}");
            assert_eq!(got.message, message, "{name}");
        }
    }

    #[test]
    fn owner_remediated_condition() {
        let delete = Step::DeleteMachine {
            machine: "cp-2".into(),
        };
        let wait = Step::Wait {
            reason: WaitReason::EtcdUnreachable,
            message: "etcd did not answer".into(),
        };
        let on = |step| {
            Some(RemovalStep {
                machine: "cp-2",
                step,
            })
        };
        // (situation, machine deleting, MHC asked, removal, remediation, expected)
        let cases = [
            (
                "our removal deletes it",
                false,
                true,
                on(&delete),
                idle(),
                Some((
                    owner_remediated::REASON_MACHINE_DELETING,
                    "Machine is deleting",
                )),
            ),
            (
                "our removal waits on a deleting Machine",
                true,
                true,
                on(&wait),
                idle(),
                Some((
                    owner_remediated::REASON_MACHINE_DELETING,
                    "Machine is deleting: ",
                )),
            ),
            (
                "our removal waits before deleting it",
                false,
                true,
                on(&wait),
                idle(),
                Some((
                    owner_remediated::REASON_REMEDIATION_IN_PROGRESS,
                    "(remediation.remediate)",
                )),
            ),
            (
                "a removal its MachineHealthCheck did not ask for",
                false,
                false,
                on(&delete),
                idle(),
                None,
            ),
            (
                "remediation defers it",
                false,
                true,
                None,
                deferred(),
                Some((
                    owner_remediated::REASON_REMEDIATION_DEFERRED,
                    "retry period of 5m not expired",
                )),
            ),
        ];
        for (name, deleting, asked, removal, remediation, want) in cases {
            let got = owner_remediated("cp-2", deleting, asked, removal, STEP, &remediation);
            match (got, want) {
                (None, None) => {}
                (Some(got), Some((reason, message))) => {
                    assert_eq!(got.type_, OWNER_REMEDIATED, "{name}");
                    assert_eq!((got.status, got.reason), (Some(false), reason), "{name}");
                    assert!(got.message.contains(message), "{name}: {}", got.message);
                }
                (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
            }
        }
        // Another Machine's decision says nothing of this one.
        assert_eq!(
            owner_remediated("cp-1", false, true, None, STEP, &deferred()),
            None
        );
    }
}
