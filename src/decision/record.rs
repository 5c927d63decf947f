//! The decision record: everything one reconcile decides, computed once from
//! the observed world. The controller acts on it and writes the status and
//! conditions it carries; `inspect` and the demo render it.
//!
//! Two stages, because the second needs I/O the first may forbid: the
//! [`decide_lifecycle`] gate says whether the reconcile goes on to look at the
//! workload cluster (not while paused, deleting, or writing Secrets), and
//! [`decide`] takes the world as then observed to the whole record.

use kube::runtime::events::EventType;

use crate::api::RemediationData;
use crate::api::kcp::KThreesControlPlaneStatus;
use crate::lifecycle::{Lifecycle, decide as decide_lifecycle_view, plan_secrets};
use crate::membership::MembershipMap;
use crate::rollout::{Desired, OutdatedMachines, outdated_machines};

use super::contract_conditions::{Replicas, replicas};
use super::events::wait_event;
use super::plan::{Action, Plan, Refusal, plan_on};
use super::status::{MachineConditions, kcp_status, machine_conditions};
use super::view::{lifecycle_view, mapping};
use super::world::World;

/// What one reconcile pass decided, and everything that follows from it.
#[derive(Debug)]
pub struct Decision {
    /// The lifecycle step; only [`Lifecycle::Proceed`] lets the plan run.
    pub lifecycle: Lifecycle,
    /// What `spec` asks of every Machine now.
    pub desired: Desired,
    /// Why each Machine needs a rollout under `desired`, by name (empty: up to date).
    pub outdated: OutdatedMachines,
    /// Each etcd member paired with its Machine (absent without a membership).
    pub mapping: Option<MembershipMap>,
    /// The Machine counts status reports.
    pub replicas: Replicas,
    /// The plan, or why none could be made; `None` when the lifecycle stopped
    /// the reconcile before remediation and scaling.
    pub plan: Option<Result<Plan, Refusal>>,
    /// The KThreesControlPlane's status this decision implies (before acting:
    /// a remediation the act records is added by [`Decision::status_after`]).
    pub status: KThreesControlPlaneStatus,
    /// The conditions we own on each Machine, by Machine name (with a plan only).
    pub machine_conditions: Vec<(String, MachineConditions)>,
}

/// The Event a decision publishes when the status it implies is new.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecisionEvent {
    pub type_: EventType,
    pub reason: &'static str,
    pub note: String,
    /// The MHC remediation outcome this counts as, if it is one.
    pub remediation_outcome: Option<&'static str>,
}

/// The first stage: what the lifecycle asks of this reconcile. Without a
/// Cluster nothing can be set up (the plan then refuses, saying so), but a
/// deleted control plane still goes.
pub fn decide_lifecycle(world: &World) -> Lifecycle {
    if world.cluster_name.is_some() || world.kcp.metadata.deletion_timestamp.is_some() {
        decide_lifecycle_view(&lifecycle_view(world))
    } else {
        Lifecycle::Proceed {
            secrets: plan_secrets(&world.secrets),
        }
    }
}

/// The whole record for `world` under the `lifecycle` its first stage decided.
pub fn decide(world: &World, lifecycle: Lifecycle) -> Decision {
    let desired = crate::rollout::desired(&world.kcp);
    let outdated = outdated_machines(&desired, &world.machines, world.now);
    let mapping = mapping(world);
    let replicas = replicas(world, &outdated);
    let plan = matches!(lifecycle, Lifecycle::Proceed { .. })
        .then(|| plan_on(world, mapping.clone(), &outdated));
    let status = kcp_status(
        world,
        &lifecycle,
        plan.as_ref().map(|p| p.as_ref()),
        &replicas,
    );
    let machine_conditions = match &plan {
        Some(Ok(plan)) => world
            .machines
            .iter()
            .map(|m| {
                (
                    m.metadata.name.clone().unwrap_or_default(),
                    machine_conditions(world, plan, m),
                )
            })
            .collect(),
        _ => Vec::new(),
    };
    Decision {
        lifecycle,
        desired,
        outdated,
        mapping,
        replicas,
        plan,
        status,
        machine_conditions,
    }
}

impl Decision {
    /// The plan, when one was made.
    pub fn planned(&self) -> Option<&Plan> {
        self.plan.as_ref().and_then(|p| p.as_ref().ok())
    }

    /// The refusal, when the reconcile could not decide.
    pub fn refusal(&self) -> Option<&Refusal> {
        self.plan.as_ref().and_then(|p| p.as_ref().err())
    }

    /// The rule that fired: the lifecycle's, the plan's, or the refusal's.
    pub fn rule(&self) -> String {
        match &self.plan {
            None => self.lifecycle.rule(),
            Some(Ok(plan)) => plan.rule.clone(),
            Some(Err(refusal)) => refusal.rule().to_string(),
        }
    }

    /// What the rule says, with its numbers.
    pub fn message(&self) -> String {
        match &self.plan {
            None => self.lifecycle.message(),
            Some(Ok(plan)) => plan.message.clone(),
            Some(Err(refusal)) => refusal.to_string(),
        }
    }

    /// Whether carrying the decision out writes more than status and
    /// conditions (a finalizer, a Secret, a teardown step, a Machine, etcd).
    pub fn acts(&self) -> bool {
        match &self.plan {
            None => matches!(
                self.lifecycle,
                Lifecycle::AddFinalizer | Lifecycle::Secrets { .. } | Lifecycle::Delete { .. }
            ),
            Some(Ok(plan)) => matches!(
                plan.action,
                Action::Step { .. } | Action::CreateMachine | Action::RemoveOrphan { .. }
            ),
            Some(Err(_)) => false,
        }
    }

    /// The status to write once acting returned `last_remediation` (the
    /// remediation it recorded, if any).
    pub fn status_after(
        &self,
        last_remediation: Option<RemediationData>,
    ) -> KThreesControlPlaneStatus {
        let mut status = self.status.clone();
        if let Some(recorded) = last_remediation {
            status.last_remediation = Some(recorded);
        }
        status
    }

    /// The Event this decision publishes when its status is new: a refusal
    /// is a Warning, a wait is named after what it waits for; acting and
    /// idling publish their own (or none).
    pub fn event(&self) -> Option<DecisionEvent> {
        match self.plan.as_ref()? {
            Err(refusal) => Some(DecisionEvent {
                type_: EventType::Warning,
                reason: match refusal {
                    Refusal::Invalid(_) => "InvalidSpec",
                    _ => "CannotDecide",
                },
                note: refusal.to_string(),
                remediation_outcome: None,
            }),
            Ok(plan) if matches!(plan.action, Action::Wait) => {
                let event = wait_event(&plan.rule);
                Some(DecisionEvent {
                    type_: event.type_,
                    reason: event.reason,
                    note: format!("{} ({})", plan.message, plan.rule),
                    remediation_outcome: event.remediation_outcome,
                })
            }
            Ok(_) => None,
        }
    }
}
