//! The conditions we own on each control-plane Machine: `EtcdMemberHealthy`
//! ([`super::etcd`]), `UpToDate` (here) and `OwnerRemediated`
//! ([`super::remediation`]), with its v1beta1 copy.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;

use crate::api::Machine;
use crate::api::condition_names::{OWNER_REMEDIATED, UP_TO_DATE, up_to_date};
use crate::api::conditions::V1Beta1Condition;
use crate::rollout::OutdatedReason;

use super::super::plan::Plan;
use super::super::world::World;
use super::etcd::etcd_member_healthy;
use super::remediation::{RemovalStep, owner_remediated};
use super::{PlanNote, Value, value};

/// The conditions we own on one Machine, as (to set, to remove).
#[derive(Debug)]
pub struct MachineConditions {
    pub set: Vec<Condition>,
    pub set_v1beta1: Vec<V1Beta1Condition>,
    pub remove: Vec<&'static str>,
}

/// `UpToDate` (CAPI v1beta2: the owner of a Machine reports whether it is
/// up to date): False with why it needs a rollout.
pub fn up_to_date(outdated: bool, reasons: &[OutdatedReason]) -> Value {
    if reasons.is_empty() && !outdated {
        value(UP_TO_DATE, Some(true), up_to_date::REASON_UP_TO_DATE, "")
    } else {
        value(
            UP_TO_DATE,
            Some(false),
            up_to_date::REASON_NOT_UP_TO_DATE,
            crate::rollout::describe(reasons),
        )
    }
}

/// What this reconcile says on `machine`: `EtcdMemberHealthy` from the real
/// membership, `UpToDate` from the spec, and `OwnerRemediated` from the
/// decision or the removal in flight (removed once the Machine recovered).
pub fn machine_conditions(world: &World, plan: &Plan, machine: &Machine) -> MachineConditions {
    let name = machine.name_any();
    let generation = machine.metadata.generation;
    let mut out = MachineConditions {
        set: vec![],
        set_v1beta1: vec![],
        remove: vec![],
    };
    let view = plan.view.machine(&name);
    if let (Some(snapshot), Some(view)) = (world.snapshot(), view) {
        let member = view.etcd_member.and_then(|id| snapshot.member(id));
        out.set.push(
            etcd_member_healthy(member, view.etcd_member_missing.as_ref()).to_condition(generation),
        );
    }
    if let Some(view) = view {
        out.set
            .push(up_to_date(view.outdated, &view.outdated_reasons).to_condition(generation));
    }
    if plan.remediation.cleanup_owner_remediated.contains(&name) {
        out.remove.push(OWNER_REMEDIATED);
        return out;
    }
    let owner_remediated = owner_remediated(
        &name,
        machine.is_deleting(),
        view.is_some_and(|v| v.needs_owner_remediation()),
        RemovalStep::of(plan),
        PlanNote::of(plan),
        &plan.remediation,
    );
    if let Some(value) = owner_remediated {
        out.set_v1beta1.push(V1Beta1Condition {
            type_: value.type_.to_string(),
            status: "False".into(),
            severity: Some("Warning".into()),
            reason: Some(value.reason.to_string()),
            message: Some(value.message.clone()),
            last_transition_time: Some(Time(k8s_openapi::jiff::Timestamp::now())),
        });
        out.set.push(value.to_condition(generation));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn up_to_date_condition() {
        let version = OutdatedReason::Version {
            has: Some("v1.30.1+k3s1".into()),
            wants: "v1.30.2+k3s2".into(),
        };
        let cases = [
            (
                "made from the current spec",
                false,
                vec![],
                Some(true),
                up_to_date::REASON_UP_TO_DATE,
                "",
            ),
            (
                "another version",
                true,
                vec![version.clone()],
                Some(false),
                up_to_date::REASON_NOT_UP_TO_DATE,
                "v1.30.2+k3s2",
            ),
            (
                "outdated for no reason told",
                true,
                vec![],
                Some(false),
                up_to_date::REASON_NOT_UP_TO_DATE,
                "",
            ),
            (
                "a reason without the flag still counts",
                false,
                vec![version],
                Some(false),
                up_to_date::REASON_NOT_UP_TO_DATE,
                "v1.30.1+k3s1",
            ),
        ];
        for (name, outdated, reasons, status, reason, message) in cases {
            let got = up_to_date(outdated, &reasons);
            assert_eq!(got.type_, UP_TO_DATE, "{name}");
            assert_eq!((got.status, got.reason), (status, reason), "{name}");
            assert!(got.message.contains(message), "{name}: {}", got.message);
        }
    }
}
