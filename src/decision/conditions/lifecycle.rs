//! `Paused` and `Deleting`: what the lifecycle step says.

use crate::api::condition_names::{DELETING, PAUSED, deleting, paused};
use crate::lifecycle::{DeletionStep, Lifecycle};

use super::{Value, value};

/// `Paused`: True while the Cluster or the KThreesControlPlane is paused.
pub fn paused(lifecycle: &Lifecycle) -> Value {
    match lifecycle {
        Lifecycle::Paused { by } => value(
            PAUSED,
            Some(true),
            paused::REASON_PAUSED,
            format!("paused by {by}"),
        ),
        _ => value(PAUSED, Some(false), paused::REASON_NOT_PAUSED, ""),
    }
}

/// `Deleting`: True while the control plane is torn down, its reason the
/// step it waits on.
pub fn deleting(lifecycle: &Lifecycle) -> Value {
    match lifecycle {
        Lifecycle::Delete { step, trigger } => value(
            DELETING,
            Some(true),
            match step {
                DeletionStep::WaitForWorkers { .. } => {
                    deleting::REASON_WAITING_FOR_WORKERS_DELETION
                }
                DeletionStep::ReleaseHooks { .. }
                | DeletionStep::DeleteMachines { .. }
                | DeletionStep::WaitForMachines { .. } => {
                    deleting::REASON_WAITING_FOR_MACHINE_DELETION
                }
                _ => deleting::REASON_DELETION_COMPLETED,
            },
            format!("{trigger}: {}", step.message()),
        ),
        _ => value(DELETING, Some(false), deleting::REASON_NOT_DELETING, ""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::SecretPlan;

    fn proceed() -> Lifecycle {
        Lifecycle::Proceed {
            secrets: SecretPlan {
                writes: vec![],
                blocked: None,
                certificates_available: true,
                kubeconfig_pending: None,
            },
        }
    }

    #[test]
    fn paused_condition() {
        let cases = [
            (
                "the Cluster is paused",
                Lifecycle::Paused {
                    by: "Cluster ns/c".into(),
                },
                Some(true),
                paused::REASON_PAUSED,
                "paused by Cluster ns/c",
            ),
            (
                "reconciling",
                proceed(),
                Some(false),
                paused::REASON_NOT_PAUSED,
                "",
            ),
            (
                "deleting is not pausing",
                Lifecycle::Delete {
                    step: DeletionStep::Done,
                    trigger: "the KThreesControlPlane is deleted".into(),
                },
                Some(false),
                paused::REASON_NOT_PAUSED,
                "",
            ),
        ];
        for (name, lifecycle, status, reason, message) in cases {
            let got = paused(&lifecycle);
            assert_eq!(got.type_, PAUSED, "{name}");
            assert_eq!((got.status, got.reason), (status, reason), "{name}");
            assert_eq!(got.message, message, "{name}");
        }
    }

    #[test]
    fn deleting_condition() {
        let delete = |step| Lifecycle::Delete {
            step,
            trigger: "the Cluster is deleted".into(),
        };
        let cases = [
            (
                "workers go first",
                delete(DeletionStep::WaitForWorkers {
                    workers: vec!["w-1".into()],
                }),
                Some(true),
                deleting::REASON_WAITING_FOR_WORKERS_DELETION,
                "the Cluster is deleted: waiting for 1 worker Machine(s)",
            ),
            (
                "control-plane Machines are deleted",
                delete(DeletionStep::DeleteMachines {
                    machines: vec!["cp-1".into()],
                }),
                Some(true),
                deleting::REASON_WAITING_FOR_MACHINE_DELETION,
                "deleting 1 control-plane Machine(s)",
            ),
            (
                "our hooks are released",
                delete(DeletionStep::ReleaseHooks {
                    machines: vec!["cp-1".into()],
                }),
                Some(true),
                deleting::REASON_WAITING_FOR_MACHINE_DELETION,
                "cp-1",
            ),
            (
                "CAPI finishes the Machines",
                delete(DeletionStep::WaitForMachines {
                    machines: vec!["cp-1".into()],
                }),
                Some(true),
                deleting::REASON_WAITING_FOR_MACHINE_DELETION,
                "cp-1",
            ),
            (
                "nothing is left",
                delete(DeletionStep::RemoveFinalizer),
                Some(true),
                deleting::REASON_DELETION_COMPLETED,
                "the Cluster is deleted: ",
            ),
            (
                "not deleting",
                proceed(),
                Some(false),
                deleting::REASON_NOT_DELETING,
                "",
            ),
        ];
        for (name, lifecycle, status, reason, message) in cases {
            let got = deleting(&lifecycle);
            assert_eq!(got.type_, DELETING, "{name}");
            assert_eq!((got.status, got.reason), (status, reason), "{name}");
            assert!(got.message.contains(message), "{name}: {}", got.message);
            if message.is_empty() {
                assert_eq!(got.message, "", "{name}");
            }
        }
    }
}
