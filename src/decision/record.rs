//! The decision record: everything one reconcile decides, computed once from
//! the observed world. The controller acts on it and writes the status and
//! conditions it carries; `inspect` and the demo render it.
//!
//! Two stages, because the second needs I/O the first may forbid: the
//! [`decide_lifecycle`] gate says whether the reconcile goes on to look at the
//! workload cluster (not while paused, deleting, or writing Secrets), and
//! [`decide`] takes the world as then observed to the whole record.

use std::collections::BTreeMap;

use kube::runtime::events::EventType;

use crate::api::RemediationData;
use crate::api::kcp::KThreesControlPlaneStatus;
use crate::lifecycle::{CaPurpose, Lifecycle, decide_lifecycle_step, plan_secrets};
use crate::membership::MembershipMap;
use crate::rollout::certificates::{Expiry, annotation_to_write, expiries};
use crate::rollout::{Desired, OutdatedMachines, outdated_machines};

use super::conditions::backup::{set_backup_condition, set_condition, set_restore_condition};
use super::conditions::certificates::{certificates_expiring, expiring_cas};
use super::conditions::machine::{MachineConditions, machine_conditions};
use super::events::wait_event;
use super::plan::{Action, Plan, Refusal, plan_on};
use super::replicas::{Replicas, replicas};
use super::status::kcp_status;
use super::view::{lifecycle_view, mapping, observed_expiries};
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
    /// Each Machine's certificates expiry, where known, and where it came from.
    pub certificates: BTreeMap<String, Expiry>,
    /// When each usable cluster CA expires (generated or brought).
    pub cluster_cas: BTreeMap<CaPurpose, chrono::DateTime<chrono::Utc>>,
    /// Bootstrap configs that get our observed expiry as their
    /// `machine.cluster.x-k8s.io/certificates-expiry` annotation: (Machine, value).
    pub certificate_annotations: Vec<(String, String)>,
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
    /// etcd's space: every member's sizes against its quota and, with
    /// `run --etcd-space-care`, the space rule's verdict (absent while etcd
    /// is not observed).
    pub etcd_space: Option<super::etcd_space::EtcdSpace>,
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
        decide_lifecycle_step(&lifecycle_view(world))
    } else {
        Lifecycle::Proceed {
            secrets: plan_secrets(&world.secrets),
        }
    }
}

/// The whole record for `world` under the `lifecycle` its first stage decided.
pub fn decide(world: &World, lifecycle: Lifecycle) -> Decision {
    let desired = crate::rollout::desired(&world.kcp);
    let mapping = mapping(world);
    let observed = observed_expiries(world, mapping.as_ref());
    let certificates = expiries(&world.machines, &observed);
    let outdated = outdated_machines(&desired, &world.machines, &observed, world.now);
    let replicas = replicas(world, &outdated);
    let etcd_space = super::etcd_space::etcd_space(world);
    let plan = matches!(lifecycle, Lifecycle::Proceed { .. })
        .then(|| plan_on(world, mapping.clone(), &outdated, etcd_space.as_ref()));
    let mut status = kcp_status(
        world,
        &lifecycle,
        plan.as_ref().map(|p| p.as_ref()),
        &replicas,
        etcd_space.as_ref(),
    );
    if !matches!(lifecycle, Lifecycle::Paused { .. }) {
        let condition = certificates_expiring(
            &certificates,
            desired.certificates_expiry_days,
            &expiring_cas(
                world.cluster_name.as_deref(),
                &world.secrets.ca_not_after,
                world.now,
            ),
            world.now,
        );
        set_condition(
            &mut status,
            condition.to_condition(world.kcp.metadata.generation),
        );
    }
    if !matches!(lifecycle, Lifecycle::Paused { .. }) {
        set_backup_condition(world, &mut status);
        let restore = plan
            .as_ref()
            .and_then(|p| p.as_ref().ok())
            .and_then(|p| p.restore.as_ref());
        set_restore_condition(world, &mut status, restore, None);
    }
    let certificate_annotations = world
        .machines
        .iter()
        .filter(|m| !m.is_deleting())
        .filter_map(|m| {
            let name = m.metadata.name.clone().unwrap_or_default();
            let value = annotation_to_write(m, observed.get(&name).map(|e| e.at))?;
            Some((name, value))
        })
        .collect();
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
        certificates,
        cluster_cas: world.secrets.ca_not_after.clone(),
        certificate_annotations,
        replicas,
        plan,
        status,
        machine_conditions,
        etcd_space,
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
                Action::Step { .. }
                    | Action::CreateMachine
                    | Action::RemoveOrphan { .. }
                    | Action::EtcdSpace { .. }
                    | Action::EtcdSnapshot { .. }
                    | Action::EtcdRestore { .. }
            ),
            Some(Err(_)) => false,
        }
    }

    /// The status to write once acting returned `last_remediation` (the
    /// remediation it recorded, if any).
    pub fn status_after(
        &self,
        world: &World,
        last_remediation: Option<RemediationData>,
        snapshot: Option<super::etcd_backup::SnapshotOutcome>,
        restore: Option<super::etcd_restore::RestoreOutcome>,
    ) -> KThreesControlPlaneStatus {
        use super::etcd_restore::RestoreOutcome;
        let mut status = self.status.clone();
        if let Some(recorded) = last_remediation {
            status.last_remediation = Some(recorded);
        }
        if let Some(outcome) = snapshot {
            super::etcd_backup::record_outcome(&mut status.etcd_backup, outcome);
            set_backup_condition(world, &mut status);
        }
        match restore {
            Some(RestoreOutcome::Finished(record)) => {
                status.etcd_backup.get_or_insert_default().last_restore = Some(record);
                set_restore_condition(world, &mut status, None, None);
            }
            Some(RestoreOutcome::Unusable(message)) => {
                let decision = self.planned().and_then(|p| p.restore.as_ref());
                set_restore_condition(world, &mut status, decision, Some(&message));
            }
            None => {}
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::api::condition_names::CERTIFICATES_EXPIRING;
    use crate::decision::fixtures::WorldBuilder;

    fn proceed(w: &World) -> Lifecycle {
        Lifecycle::Proceed {
            secrets: plan_secrets(&w.secrets),
        }
    }

    #[test]
    fn an_invalid_spec_is_a_refusal_with_a_warning_and_acts_on_nothing() {
        let w = WorldBuilder::new()
            .with_spec(
                json!({"replicas": 2, "version": "v1.30.2+k3s2",
                       "machineTemplate": {"spec": {"infrastructureRef": {"kind": "T", "name": "t"}}}}),
            )
            .build();
        let decision = decide(&w, proceed(&w));
        assert_eq!(decision.rule(), "refused.invalid-spec");
        assert!(
            decision.message().contains("spec.replicas"),
            "{}",
            decision.message()
        );
        assert!(!decision.acts());
        assert!(decision.machine_conditions.is_empty());
        let event = decision.event().expect("a refusal is announced");
        assert_eq!(
            (event.type_, event.reason),
            (EventType::Warning, "InvalidSpec")
        );
        // The status it implies says so.
        let spec_valid = decision
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == crate::api::condition_names::SPEC_VALID)
            .expect("SpecValid condition");
        assert_eq!(spec_valid.status, "False");
    }

    #[test]
    fn without_a_cluster_the_record_says_so_and_waits_to_be_told() {
        let w = WorldBuilder::new().without_cluster().build();
        let lifecycle = decide_lifecycle(&w);
        assert!(
            matches!(lifecycle, Lifecycle::Proceed { .. }),
            "{lifecycle:?}"
        );
        let decision = decide(&w, lifecycle);
        assert_eq!(decision.rule(), "refused.no-cluster");
        let event = decision.event().expect("announced");
        assert_eq!(
            (event.type_, event.reason),
            (EventType::Warning, "CannotDecide")
        );
    }

    #[test]
    fn a_lifecycle_stop_has_no_plan_and_carries_the_lifecycle_rule() {
        let mut w = WorldBuilder::new().build();
        w.kcp.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        let lifecycle = decide_lifecycle(&w);
        assert!(
            !matches!(lifecycle, Lifecycle::Proceed { .. }),
            "{lifecycle:?}"
        );
        let rule = lifecycle.rule();
        let decision = decide(&w, lifecycle);
        assert!(decision.plan.is_none());
        assert_eq!(decision.rule(), rule);
        assert_eq!(decision.event(), None);
    }

    /// A cluster CA is reported a year ahead (no rollout renews it); one
    /// further out is not; the record carries every CA's expiry for the
    /// metric and inspect.
    #[test]
    fn a_cluster_ca_is_reported_a_year_before_it_expires() {
        let condition = |ca_days: i64| {
            let mut w = WorldBuilder::new().build();
            w.secrets
                .ca_not_after
                .insert(CaPurpose::Etcd, w.now + chrono::Duration::days(ca_days));
            w.secrets
                .ca_not_after
                .insert(CaPurpose::Server, w.now + chrono::Duration::days(3650));
            let decision = decide(&w, proceed(&w));
            assert_eq!(decision.cluster_cas.len(), 2);
            decision
                .status
                .conditions
                .iter()
                .find(|c| c.type_ == CERTIFICATES_EXPIRING)
                .cloned()
                .expect("CertificatesExpiring")
        };
        let soon = condition(200);
        assert_eq!(
            (soon.status.as_str(), soon.reason.as_str()),
            ("True", "CAExpiringSoon")
        );
        assert!(
            soon.message.contains("cluster CA c-etcd")
                && (soon.message.contains("(in 199 days)")
                    || soon.message.contains("(in 200 days)"))
                && soon.message.contains("rotate")
                && !soon.message.contains("c-ca "),
            "{}",
            soon.message
        );
        let later = condition(400);
        assert_eq!(
            (later.status.as_str(), later.reason.as_str()),
            ("False", "NotExpiring"),
            "{}",
            later.message
        );
    }

    #[test]
    fn the_status_after_acting_adds_the_recorded_remediation_only() {
        let w = WorldBuilder::new().build();
        let decision = decide(&w, proceed(&w));
        assert_eq!(decision.status_after(&w, None, None, None), decision.status);
        let recorded = RemediationData {
            machine: "m1".into(),
            timestamp: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
            retry_count: 1,
        };
        let after = decision.status_after(&w, Some(recorded.clone()), None, None);
        assert_eq!(after.last_remediation, Some(recorded));
        assert_eq!(after.conditions, decision.status.conditions);
    }
}
