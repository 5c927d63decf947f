//! Conditions: the metav1 `Condition` list (CAPI v1beta2 `status.conditions`), the
//! deprecated CAPI v1beta1 list (`status.deprecated.v1beta1.conditions`), and helpers
//! to read and write them by type.
//!
//! `lastTransitionTime` changes only when a condition's status changes, as
//! Kubernetes API conventions require; reason and message updates keep it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `status` value of a condition.
pub const TRUE: &str = "True";
/// `status` value of a condition.
pub const FALSE: &str = "False";
/// `status` value of a condition.
pub const UNKNOWN: &str = "Unknown";

/// A CAPI v1beta1 condition (`sigs.k8s.io/cluster-api/api/core/v1beta1.Condition`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct V1Beta1Condition {
    /// Condition type, e.g. `HealthCheckSucceeded`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// `Error`, `Warning` or `Info`; only meaningful when status is False.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub severity: Option<String>,
    /// Last time the condition changed status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    /// CamelCase reason of the last transition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Human-readable details.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The fields of a condition, independent of which list it was read from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConditionView<'a> {
    pub type_: &'a str,
    pub status: &'a str,
    pub reason: &'a str,
    pub message: &'a str,
    /// Which list the condition came from.
    pub source: ConditionSource,
}

/// Where a condition was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConditionSource {
    /// `status.conditions` (metav1, CAPI v1beta2).
    V1Beta2,
    /// `status.deprecated.v1beta1.conditions` (CAPI v1beta1).
    V1Beta1,
}

impl ConditionView<'_> {
    pub fn is_true(&self) -> bool {
        self.status == TRUE
    }
    pub fn is_false(&self) -> bool {
        self.status == FALSE
    }
}

/// The condition of `type_` in a metav1 list.
pub fn get<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the metav1 condition `type_` is present with status `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    get(conditions, type_).is_some_and(|c| c.status == TRUE)
}

/// Whether the metav1 condition `type_` is present with status `False`.
pub fn is_false(conditions: &[Condition], type_: &str) -> bool {
    get(conditions, type_).is_some_and(|c| c.status == FALSE)
}

/// Insert or update `new` (matched by type). The stored `lastTransitionTime` is
/// kept when the status does not change, and taken from `new` when it does.
/// Returns true when anything changed (so callers can skip a no-op status write).
pub fn set(conditions: &mut Vec<Condition>, new: Condition) -> bool {
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        None => {
            conditions.push(new);
            true
        }
        Some(existing) => {
            let status_changed = existing.status != new.status;
            let mut merged = new;
            if !status_changed {
                merged.last_transition_time = existing.last_transition_time.clone();
            }
            if *existing == merged {
                return false;
            }
            *existing = merged;
            true
        }
    }
}

/// Build a metav1 condition stamped `now`.
pub fn new_condition(
    type_: &str,
    status: &str,
    reason: &str,
    message: impl Into<String>,
    observed_generation: Option<i64>,
    now: Time,
) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: message.into(),
        observed_generation,
        last_transition_time: now,
    }
}

/// Remove the condition of `type_`; returns true if one was removed.
pub fn remove(conditions: &mut Vec<Condition>, type_: &str) -> bool {
    let before = conditions.len();
    conditions.retain(|c| c.type_ != type_);
    conditions.len() != before
}

/// The v1beta1 condition of `type_`.
pub fn get_v1beta1<'a>(
    conditions: &'a [V1Beta1Condition],
    type_: &str,
) -> Option<&'a V1Beta1Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Insert or update a v1beta1 condition with the same transition-time rule as [`set`].
pub fn set_v1beta1(conditions: &mut Vec<V1Beta1Condition>, new: V1Beta1Condition) -> bool {
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        None => {
            conditions.push(new);
            true
        }
        Some(existing) => {
            let mut merged = new;
            if existing.status == merged.status {
                merged.last_transition_time = existing.last_transition_time.clone();
            }
            if *existing == merged {
                return false;
            }
            *existing = merged;
            true
        }
    }
}

/// Remove the v1beta1 condition of `type_`; returns true if one was removed.
pub fn remove_v1beta1(conditions: &mut Vec<V1Beta1Condition>, type_: &str) -> bool {
    let before = conditions.len();
    conditions.retain(|c| c.type_ != type_);
    conditions.len() != before
}

/// Read condition `type_` from the v1beta2 list first, then from the deprecated
/// v1beta1 list. A MachineHealthCheck of CAPI v1.10 writes only v1beta1-style
/// conditions on v1beta1 objects (seen by us under `deprecated.v1beta1` after
/// conversion), a newer one writes both; either must be understood.
pub fn find<'a>(
    v1beta2: &'a [Condition],
    v1beta1: &'a [V1Beta1Condition],
    type_: &str,
) -> Option<ConditionView<'a>> {
    if let Some(c) = get(v1beta2, type_) {
        return Some(ConditionView {
            type_: &c.type_,
            status: &c.status,
            reason: &c.reason,
            message: &c.message,
            source: ConditionSource::V1Beta2,
        });
    }
    get_v1beta1(v1beta1, type_).map(|c| ConditionView {
        type_: &c.type_,
        status: &c.status,
        reason: c.reason.as_deref().unwrap_or(""),
        message: c.message.as_deref().unwrap_or(""),
        source: ConditionSource::V1Beta1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap())
    }

    #[test]
    fn set_adds_a_missing_condition() {
        let mut list = vec![];
        assert!(set(
            &mut list,
            new_condition("Ready", TRUE, "Ready", "", None, at(10))
        ));
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].last_transition_time, at(10));
    }

    #[test]
    fn same_status_keeps_transition_time_but_takes_new_reason() {
        let mut list = vec![new_condition("Ready", FALSE, "A", "first", None, at(10))];
        assert!(set(
            &mut list,
            new_condition("Ready", FALSE, "B", "second", None, at(20))
        ));
        assert_eq!(list[0].last_transition_time, at(10));
        assert_eq!(list[0].reason, "B");
        assert_eq!(list[0].message, "second");
    }

    #[test]
    fn status_change_moves_transition_time() {
        let mut list = vec![new_condition("Ready", FALSE, "A", "", None, at(10))];
        assert!(set(
            &mut list,
            new_condition("Ready", TRUE, "A", "", None, at(20))
        ));
        assert_eq!(list[0].last_transition_time, at(20));
    }

    #[test]
    fn identical_update_reports_no_change() {
        let mut list = vec![new_condition("Ready", TRUE, "A", "m", Some(2), at(10))];
        assert!(!set(
            &mut list,
            new_condition("Ready", TRUE, "A", "m", Some(2), at(99))
        ));
    }

    #[test]
    fn remove_only_the_named_type() {
        let mut list = vec![
            new_condition("A", TRUE, "r", "", None, at(1)),
            new_condition("B", TRUE, "r", "", None, at(1)),
        ];
        assert!(remove(&mut list, "A"));
        assert!(!remove(&mut list, "A"));
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].type_, "B");
    }

    #[test]
    fn v1beta1_set_keeps_transition_time_on_same_status() {
        let c = |status: &str, reason: &str, t| V1Beta1Condition {
            type_: "OwnerRemediated".into(),
            status: status.into(),
            severity: Some("Warning".into()),
            last_transition_time: Some(at(t)),
            reason: Some(reason.into()),
            message: None,
        };
        let mut list = vec![c(FALSE, "WaitingForRemediation", 10)];
        assert!(set_v1beta1(
            &mut list,
            c(FALSE, "RemediationInProgress", 20)
        ));
        assert_eq!(list[0].last_transition_time, Some(at(10)));
        assert!(set_v1beta1(&mut list, c(TRUE, "", 30)));
        assert_eq!(list[0].last_transition_time, Some(at(30)));
        assert!(remove_v1beta1(&mut list, "OwnerRemediated"));
        assert!(list.is_empty());
    }

    #[test]
    fn find_prefers_v1beta2_and_falls_back_to_v1beta1() {
        let v2 = vec![new_condition(
            "HealthCheckSucceeded",
            FALSE,
            "UnhealthyNode",
            "x",
            None,
            at(1),
        )];
        let v1 = vec![
            V1Beta1Condition {
                type_: "HealthCheckSucceeded".into(),
                status: TRUE.into(),
                severity: None,
                last_transition_time: None,
                reason: None,
                message: None,
            },
            V1Beta1Condition {
                type_: "OwnerRemediated".into(),
                status: FALSE.into(),
                severity: Some("Warning".into()),
                last_transition_time: None,
                reason: Some("WaitingForRemediation".into()),
                message: None,
            },
        ];
        let hc = find(&v2, &v1, "HealthCheckSucceeded").unwrap();
        assert!(hc.is_false());
        assert_eq!(hc.source, ConditionSource::V1Beta2);
        let or = find(&v2, &v1, "OwnerRemediated").unwrap();
        assert!(or.is_false());
        assert_eq!(or.reason, "WaitingForRemediation");
        assert_eq!(or.source, ConditionSource::V1Beta1);
        assert!(find(&v2, &v1, "Ready").is_none());
    }
}
