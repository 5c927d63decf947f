//! `RollingOut`, `ScalingUp` and `ScalingDown`: the replica count moving
//! towards `spec`, quoting the plan's next step or wait.

use crate::api::condition_names::{
    ROLLING_OUT, SCALING_DOWN, SCALING_UP, rolling_out, scaling_down, scaling_up,
};

use super::super::replicas::Replicas;
use super::{PlanNote, Value, value};

/// `; <message> (<rule>)` when the plan waits: why the scaling does not move.
fn waiting(plan: Option<PlanNote>) -> String {
    plan.filter(|p| p.waits)
        .map(|p| format!("; {} ({})", p.message, p.rule))
        .unwrap_or_default()
}

/// `RollingOut`: True while Machines not deleting are outdated, with the
/// surge (`max_surge`, `None`: it does not parse) and the plan's next step.
pub fn rolling_out(r: &Replicas, max_surge: Option<u32>, plan: Option<PlanNote>) -> Value {
    if r.rolling_out == 0 {
        return value(
            ROLLING_OUT,
            Some(false),
            rolling_out::REASON_NOT_ROLLING_OUT,
            "",
        );
    }
    let next = plan
        .map(|p| format!("; next: {} ({})", p.message, p.rule))
        .unwrap_or_default();
    value(
        ROLLING_OUT,
        Some(true),
        rolling_out::REASON_ROLLING_OUT,
        format!(
            "rolling out {} not up-to-date replicas (maxSurge {}): {}{next}",
            r.rolling_out,
            max_surge.map_or_else(|| "invalid".to_string(), |n| n.to_string()),
            r.outdated.join(", ")
        ),
    )
}

/// `ScalingUp`: fewer Machines not deleting than desired, unless the
/// control plane is being deleted (`deleting`).
pub fn scaling_up(r: &Replicas, deleting: bool, plan: Option<PlanNote>) -> Value {
    if r.live < r.desired && !deleting {
        value(
            SCALING_UP,
            Some(true),
            scaling_up::REASON_SCALING_UP,
            format!(
                "scaling up from {} to {} replicas{}",
                r.live,
                r.desired,
                waiting(plan)
            ),
        )
    } else {
        value(
            SCALING_UP,
            Some(false),
            scaling_up::REASON_NOT_SCALING_UP,
            "",
        )
    }
}

/// `ScalingDown`: more Machines not deleting than desired, unless the
/// control plane is being deleted (`deleting`).
pub fn scaling_down(r: &Replicas, deleting: bool, plan: Option<PlanNote>) -> Value {
    if r.live > r.desired && !deleting {
        value(
            SCALING_DOWN,
            Some(true),
            scaling_down::REASON_SCALING_DOWN,
            format!(
                "scaling down from {} to {} replicas{}",
                r.live,
                r.desired,
                waiting(plan)
            ),
        )
    } else {
        value(
            SCALING_DOWN,
            Some(false),
            scaling_down::REASON_NOT_SCALING_DOWN,
            "",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAIT: PlanNote = PlanNote {
        message: "Machine cp-4 is provisioning",
        rule: "scale.wait.provisioning",
        waits: true,
    };
    const CREATE: PlanNote = PlanNote {
        message: "creating a Machine",
        rule: "scale.up",
        waits: false,
    };

    fn counts(live: i32, desired: i32) -> Replicas {
        Replicas {
            live,
            desired,
            ..Replicas::default()
        }
    }

    #[test]
    fn scaling_up_condition() {
        let cases = [
            (
                "fewer than desired, the plan creates",
                counts(1, 3),
                false,
                Some(CREATE),
                Some(true),
                scaling_up::REASON_SCALING_UP,
                "scaling up from 1 to 3 replicas",
            ),
            (
                "fewer than desired, the plan waits",
                counts(2, 3),
                false,
                Some(WAIT),
                Some(true),
                scaling_up::REASON_SCALING_UP,
                "scaling up from 2 to 3 replicas; Machine cp-4 is provisioning (scale.wait.provisioning)",
            ),
            (
                "as desired",
                counts(3, 3),
                false,
                None,
                Some(false),
                scaling_up::REASON_NOT_SCALING_UP,
                "",
            ),
            (
                "fewer than desired while deleting",
                counts(1, 3),
                true,
                None,
                Some(false),
                scaling_up::REASON_NOT_SCALING_UP,
                "",
            ),
        ];
        for (name, r, deleting, plan, status, reason, message) in cases {
            let got = scaling_up(&r, deleting, plan);
            assert_eq!(got.type_, SCALING_UP, "{name}");
            assert_eq!((got.status, got.reason), (status, reason), "{name}");
            assert_eq!(got.message, message, "{name}");
        }
    }

    #[test]
    fn scaling_down_condition() {
        let cases = [
            (
                "more than desired, the plan removes",
                counts(4, 3),
                false,
                Some(CREATE),
                Some(true),
                scaling_down::REASON_SCALING_DOWN,
                "scaling down from 4 to 3 replicas",
            ),
            (
                "more than desired, the plan waits",
                counts(5, 3),
                false,
                Some(WAIT),
                Some(true),
                scaling_down::REASON_SCALING_DOWN,
                "scaling down from 5 to 3 replicas; Machine cp-4 is provisioning (scale.wait.provisioning)",
            ),
            (
                "as desired",
                counts(3, 3),
                false,
                None,
                Some(false),
                scaling_down::REASON_NOT_SCALING_DOWN,
                "",
            ),
            (
                "more than desired while deleting",
                counts(4, 3),
                true,
                None,
                Some(false),
                scaling_down::REASON_NOT_SCALING_DOWN,
                "",
            ),
        ];
        for (name, r, deleting, plan, status, reason, message) in cases {
            let got = scaling_down(&r, deleting, plan);
            assert_eq!(got.type_, SCALING_DOWN, "{name}");
            assert_eq!((got.status, got.reason), (status, reason), "{name}");
            assert_eq!(got.message, message, "{name}");
        }
    }

    #[test]
    fn rolling_out_condition() {
        let rolling = |n: i32, outdated: &[&str]| Replicas {
            rolling_out: n,
            outdated: outdated.iter().map(ToString::to_string).collect(),
            ..counts(3, 3)
        };
        let cases = [
            (
                "nothing outdated",
                rolling(0, &[]),
                Some(1),
                Some(CREATE),
                Some(false),
                rolling_out::REASON_NOT_ROLLING_OUT,
                "",
            ),
            (
                "one outdated, the plan's next step quoted",
                rolling(1, &["cp-1 (version)"]),
                Some(1),
                Some(CREATE),
                Some(true),
                rolling_out::REASON_ROLLING_OUT,
                "rolling out 1 not up-to-date replicas (maxSurge 1): cp-1 (version); next: creating a Machine (scale.up)",
            ),
            (
                "a wait is quoted as the next step too",
                rolling(2, &["cp-1 (a)", "cp-2 (b)"]),
                Some(0),
                Some(WAIT),
                Some(true),
                rolling_out::REASON_ROLLING_OUT,
                "rolling out 2 not up-to-date replicas (maxSurge 0): cp-1 (a), cp-2 (b); next: Machine cp-4 is provisioning (scale.wait.provisioning)",
            ),
            (
                "an invalid surge, no plan",
                rolling(1, &["cp-1 (a)"]),
                None,
                None,
                Some(true),
                rolling_out::REASON_ROLLING_OUT,
                "rolling out 1 not up-to-date replicas (maxSurge invalid): cp-1 (a)",
            ),
        ];
        for (name, r, surge, plan, status, reason, message) in cases {
            let got = rolling_out(&r, surge, plan);
            assert_eq!(got.type_, ROLLING_OUT, "{name}");
            assert_eq!((got.status, got.reason), (status, reason), "{name}");
            assert_eq!(got.message, message, "{name}");
        }
    }
}
