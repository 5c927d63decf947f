//! The v1beta1 mirror of our conditions, under
//! `status.deprecated.v1beta1.conditions`, for older readers.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::api::condition_names::{
    AVAILABLE, CERTIFICATES_AVAILABLE, ETCD_CLUSTER_HEALTHY, MACHINES_READY, MACHINES_UP_TO_DATE,
    SCALING_DOWN, SCALING_UP,
};
use crate::api::conditions::V1Beta1Condition;

/// The v1beta1 names of the conditions older readers (CAPI v1.10,
/// cluster-api-k3s tooling) look for, mirrored from the v1beta2 ones, and
/// `Resized` from the whole set.
pub fn v1beta1_mirror(conditions: &[Condition]) -> Vec<V1Beta1Condition> {
    let mut out = v1beta1_renamed(conditions);
    out.push(resized(conditions));
    out
}

/// Only the renamed ones: what setting some of the conditions may mirror.
/// `Resized` is a verdict on the whole set (no `ScalingUp` or
/// `ScalingDown` True), so a caller holding one condition must not write it.
pub fn v1beta1_renamed(conditions: &[Condition]) -> Vec<V1Beta1Condition> {
    const MIRROR: &[(&str, &str)] = &[
        (AVAILABLE, "Ready"),
        (AVAILABLE, "Available"),
        (CERTIFICATES_AVAILABLE, "CertificatesAvailable"),
        (MACHINES_READY, "MachinesReady"),
        (MACHINES_UP_TO_DATE, "MachinesSpecUpToDate"),
        (ETCD_CLUSTER_HEALTHY, "EtcdClusterHealthy"),
    ];
    MIRROR
        .iter()
        .filter_map(|(from, to)| {
            let c = conditions.iter().find(|c| c.type_ == *from)?;
            Some(V1Beta1Condition {
                type_: to.to_string(),
                status: c.status.clone(),
                severity: (c.status == "False").then(|| "Warning".to_string()),
                last_transition_time: Some(c.last_transition_time.clone()),
                reason: (!c.reason.is_empty()).then(|| c.reason.clone()),
                message: (!c.message.is_empty()).then(|| c.message.clone()),
            })
        })
        .collect()
}

/// v1beta1's `Resized`: the replica count is where it should be.
fn resized(conditions: &[Condition]) -> V1Beta1Condition {
    let scaling = conditions
        .iter()
        .find(|c| (c.type_ == SCALING_UP || c.type_ == SCALING_DOWN) && c.status == "True");
    V1Beta1Condition {
        type_: "Resized".into(),
        status: if scaling.is_some() { "False" } else { "True" }.into(),
        severity: scaling.map(|_| "Warning".to_string()),
        last_transition_time: scaling
            .map(|c| c.last_transition_time.clone())
            .or_else(|| Some(Time(k8s_openapi::jiff::Timestamp::now()))),
        reason: scaling.map(|c| c.reason.clone()),
        message: scaling.map(|c| c.message.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::condition_names::SPEC_VALID;

    fn condition(type_: &str, status: &str, reason: &str, message: &str) -> Condition {
        crate::api::conditions::new_condition(
            type_,
            status,
            reason,
            message,
            Some(1),
            Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        )
    }

    fn find<'a>(mirror: &'a [V1Beta1Condition], type_: &str) -> Option<&'a V1Beta1Condition> {
        mirror.iter().find(|c| c.type_ == type_)
    }

    #[test]
    fn v1beta1_mirror_names_and_resized() {
        let available = condition(AVAILABLE, "True", "Available", "3 of 3 Machines ready");
        let outdated = condition(
            MACHINES_UP_TO_DATE,
            "False",
            "NotUpToDate",
            "outdated: cp-1",
        );
        let scaling_up = condition(SCALING_UP, "True", "ScalingUp", "scaling up from 1 to 3");
        let not_scaling_down = condition(SCALING_DOWN, "False", "NotScalingDown", "");
        let spec_valid = condition(SPEC_VALID, "True", "Valid", "");

        let mirror = v1beta1_mirror(&[
            available,
            outdated,
            scaling_up,
            not_scaling_down.clone(),
            spec_valid,
        ]);
        // Available is both v1beta1's Ready and Available.
        for name in ["Ready", "Available"] {
            let c = find(&mirror, name).expect(name);
            assert_eq!((c.status.as_str(), c.severity.as_deref()), ("True", None));
            assert_eq!(c.message.as_deref(), Some("3 of 3 Machines ready"));
        }
        let c = find(&mirror, "MachinesSpecUpToDate").expect("renamed");
        assert_eq!(
            (
                c.status.as_str(),
                c.severity.as_deref(),
                c.reason.as_deref()
            ),
            ("False", Some("Warning"), Some("NotUpToDate"))
        );
        // Scaling: not resized, saying why.
        let c = find(&mirror, "Resized").expect("Resized");
        assert_eq!(
            (c.status.as_str(), c.reason.as_deref()),
            ("False", Some("ScalingUp"))
        );
        // Ours without a v1beta1 reader are not mirrored.
        assert!(find(&mirror, SPEC_VALID).is_none());
        assert!(find(&mirror, SCALING_UP).is_none());

        // Not scaling: resized, with an empty reason and message.
        let mirror = v1beta1_mirror(&[not_scaling_down]);
        let c = find(&mirror, "Resized").expect("Resized");
        assert_eq!(
            (c.status.as_str(), c.reason.as_deref(), c.message.as_deref()),
            ("True", None, None)
        );
    }
}
