//! `MachinesReady` and `MachinesUpToDate`: the control-plane Machines as a
//! whole.

use crate::api::condition_names::{
    MACHINES_READY, MACHINES_UP_TO_DATE, machines_ready, machines_up_to_date,
};

use super::super::replicas::Replicas;
use super::{Value, value};

/// `MachinesReady`: every Machine not deleting has a ready Node; Unknown
/// without any Machine (`any_machine`, deleting ones included).
pub fn machines_ready(any_machine: bool, r: &Replicas) -> Value {
    if !any_machine {
        value(
            MACHINES_READY,
            None,
            machines_ready::REASON_NO_REPLICAS,
            "no control-plane Machine",
        )
    } else if r.not_ready.is_empty() {
        value(
            MACHINES_READY,
            Some(true),
            machines_ready::REASON_READY,
            format!("{} of {} ready", r.ready, r.live),
        )
    } else {
        value(
            MACHINES_READY,
            Some(false),
            machines_ready::REASON_NOT_READY,
            format!(
                "{} of {} ready; not ready: {}",
                r.ready,
                r.live,
                r.not_ready.join(", ")
            ),
        )
    }
}

/// `MachinesUpToDate`: no Machine not deleting needs a rollout.
pub fn machines_up_to_date(r: &Replicas) -> Value {
    if r.outdated.is_empty() {
        value(
            MACHINES_UP_TO_DATE,
            Some(true),
            machines_up_to_date::REASON_UP_TO_DATE,
            "",
        )
    } else {
        value(
            MACHINES_UP_TO_DATE,
            Some(false),
            machines_up_to_date::REASON_NOT_UP_TO_DATE,
            format!("outdated: {}", r.outdated.join(", ")),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machines_ready_condition() {
        let counts = |ready, live, not_ready: &[&str]| Replicas {
            ready,
            live,
            not_ready: not_ready.iter().map(ToString::to_string).collect(),
            ..Replicas::default()
        };
        let cases = [
            (
                "no Machine",
                false,
                counts(0, 0, &[]),
                None,
                machines_ready::REASON_NO_REPLICAS,
                "no control-plane Machine",
            ),
            (
                "all ready",
                true,
                counts(3, 3, &[]),
                Some(true),
                machines_ready::REASON_READY,
                "3 of 3 ready",
            ),
            (
                "only deleting Machines: none is not ready",
                true,
                counts(0, 0, &[]),
                Some(true),
                machines_ready::REASON_READY,
                "0 of 0 ready",
            ),
            (
                "one without a ready Node",
                true,
                counts(2, 3, &["cp-3"]),
                Some(false),
                machines_ready::REASON_NOT_READY,
                "2 of 3 ready; not ready: cp-3",
            ),
        ];
        for (name, any_machine, r, status, reason, message) in cases {
            let got = machines_ready(any_machine, &r);
            assert_eq!(got.type_, MACHINES_READY, "{name}");
            assert_eq!((got.status, got.reason), (status, reason), "{name}");
            assert_eq!(got.message, message, "{name}");
        }
    }

    #[test]
    fn machines_up_to_date_condition() {
        let outdated = |names: &[&str]| Replicas {
            outdated: names.iter().map(ToString::to_string).collect(),
            ..Replicas::default()
        };
        let cases = [
            (
                "all up to date",
                outdated(&[]),
                Some(true),
                machines_up_to_date::REASON_UP_TO_DATE,
                "",
            ),
            (
                "one outdated",
                outdated(&["cp-1 (version v1.30.1+k3s1 -> v1.30.2+k3s2)"]),
                Some(false),
                machines_up_to_date::REASON_NOT_UP_TO_DATE,
                "outdated: cp-1 (version v1.30.1+k3s1 -> v1.30.2+k3s2)",
            ),
            (
                "two outdated",
                outdated(&["cp-1 (a)", "cp-2 (b)"]),
                Some(false),
                machines_up_to_date::REASON_NOT_UP_TO_DATE,
                "outdated: cp-1 (a), cp-2 (b)",
            ),
        ];
        for (name, r, status, reason, message) in cases {
            let got = machines_up_to_date(&r);
            assert_eq!(got.type_, MACHINES_UP_TO_DATE, "{name}");
            assert_eq!((got.status, got.reason), (status, reason), "{name}");
            assert_eq!(got.message, message, "{name}");
        }
    }
}
