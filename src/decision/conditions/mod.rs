//! The rule of each condition we write, one function per condition type,
//! named after it; the types and reasons are in [`crate::api::condition_names`].
//! Each function takes the few facts its rule reads, so that its table test
//! states them directly. Pure.
//!
//! | condition | where |
//! | --- | --- |
//! | `Paused`, `Deleting` | [`lifecycle`] |
//! | `Initialized`, `Available`, `CertificatesAvailable` | [`availability`] |
//! | `MachinesReady`, `MachinesUpToDate` | [`machines`] |
//! | `RollingOut`, `ScalingUp`, `ScalingDown` | [`scaling`] |
//! | all of the CAPI contract, in order | [`contract::contract_conditions`] |
//! | `SpecValid` | [`spec_valid`] |
//! | `Remediating`; `OwnerRemediated` (Machine) | [`remediation`] |
//! | `EtcdClusterHealthy`, `EtcdSpaceHealthy`; `EtcdMemberHealthy` (Machine) | [`etcd`] |
//! | `CertificatesExpiring` | [`certificates`] |
//! | `EtcdBackupReady`, `EtcdRestoring` (set or removed) | [`backup`] (rules: `decision::etcd_backup`, `decision::etcd_restore`) |
//! | the conditions of one Machine (`UpToDate` and the above) | [`machine`] |
//! | the v1beta1 mirror | [`v1beta1`] |

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::remediation::decide::ConditionValue;

pub mod availability;
pub mod backup;
pub mod certificates;
pub mod contract;
pub mod etcd;
pub mod lifecycle;
pub mod machine;
pub mod machines;
pub mod remediation;
pub mod scaling;
pub mod spec_valid;
pub mod v1beta1;

/// A condition's value before it is stamped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Value {
    pub type_: &'static str,
    pub status: Option<bool>,
    pub reason: &'static str,
    pub message: String,
}

pub(crate) fn value(
    type_: &'static str,
    status: Option<bool>,
    reason: &'static str,
    message: impl Into<String>,
) -> Value {
    Value {
        type_,
        status,
        reason,
        message: message.into(),
    }
}

impl Value {
    /// The condition, stamped now (`conditions::set` keeps the old time
    /// while the status is unchanged).
    pub fn to_condition(&self, generation: Option<i64>) -> Condition {
        Condition {
            type_: self.type_.to_string(),
            status: status_text(self.status).to_string(),
            reason: self.reason.to_string(),
            message: self.message.clone(),
            observed_generation: generation,
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
        }
    }
}

impl From<ConditionValue> for Value {
    fn from(v: ConditionValue) -> Self {
        value(v.type_, Some(v.status), v.reason, v.message)
    }
}

fn status_text(status: Option<bool>) -> &'static str {
    match status {
        Some(true) => "True",
        Some(false) => "False",
        None => "Unknown",
    }
}

/// What the plan says, for the conditions that quote it.
#[derive(Clone, Copy, Debug)]
pub struct PlanNote<'a> {
    pub message: &'a str,
    pub rule: &'a str,
    /// The plan waits (`Action::Wait`).
    pub waits: bool,
}

impl<'a> PlanNote<'a> {
    pub fn of(plan: &'a super::plan::Plan) -> Self {
        PlanNote {
            message: &plan.message,
            rule: &plan.rule,
            waits: matches!(plan.action, super::plan::Action::Wait),
        }
    }
}

/// Facts the table tests share: etcd members as a probe saw them.
#[cfg(test)]
pub(crate) mod test_facts {
    use crate::decision::fixtures;
    use crate::decision::world::EtcdObservation;
    use crate::etcd::{MemberSnapshot, MembershipSnapshot};

    /// Voter `id` (the fixtures' server `id - 1`), healthy unless `probe_error`.
    pub fn member(id: u64, probe_error: Option<&str>) -> MemberSnapshot {
        let member = fixtures::member(id - 1);
        match probe_error {
            Some(why) => fixtures::unhealthy(member, why),
            None => member,
        }
    }

    pub fn snapshot(members: Vec<MemberSnapshot>) -> MembershipSnapshot {
        MembershipSnapshot {
            cluster_id: 7,
            leader: Some(1),
            members,
            listed_by: "https://10.0.0.1:2379".into(),
            alarms_error: None,
            foreign_clusters: Vec::new(),
        }
    }

    pub fn observed(members: Vec<MemberSnapshot>) -> EtcdObservation {
        EtcdObservation::Observed(snapshot(members))
    }
}
