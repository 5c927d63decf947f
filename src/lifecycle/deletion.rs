//! Teardown of a whole control plane (its KThreesControlPlane or its Cluster is
//! being deleted), as CAPI's KubeadmControlPlane does it: wait until the
//! Cluster's worker Machines are gone, then delete every control-plane Machine
//! at once, release our pre-terminate hooks so CAPI never waits on us, and drop
//! the finalizer when no Machine is left. No etcd member is removed: the whole
//! cluster goes, and a member removal could only lose quorum on the way.

use serde::Serialize;

/// What teardown needs to know.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeletionView {
    /// Machines of the Cluster that are not control-plane Machines.
    pub workers: Vec<String>,
    /// Our control-plane Machines: (name, deleting, carries our pre-terminate hook).
    pub machines: Vec<(String, bool, bool)>,
    /// Our finalizer is still on the KThreesControlPlane.
    pub has_finalizer: bool,
}

/// The one teardown step of this reconcile.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "step", rename_all = "kebab-case")]
pub enum DeletionStep {
    /// Worker Machines still exist; they go first (their Nodes drain onto a
    /// control plane that still answers).
    WaitForWorkers { workers: Vec<String> },
    /// Delete these control-plane Machines (all that are not deleting yet).
    DeleteMachines { machines: Vec<String> },
    /// Remove our pre-terminate hook from these deleting Machines.
    ReleaseHooks { machines: Vec<String> },
    /// Deleting Machines that CAPI has not finished yet.
    WaitForMachines { machines: Vec<String> },
    /// Nothing is left: drop the finalizer so the object goes.
    RemoveFinalizer,
    /// Finalizer already gone; the API server deletes the object.
    Done,
}

impl DeletionStep {
    pub fn name(&self) -> &'static str {
        match self {
            DeletionStep::WaitForWorkers { .. } => "wait-for-workers",
            DeletionStep::DeleteMachines { .. } => "delete-machines",
            DeletionStep::ReleaseHooks { .. } => "release-hooks",
            DeletionStep::WaitForMachines { .. } => "wait-for-machines",
            DeletionStep::RemoveFinalizer => "remove-finalizer",
            DeletionStep::Done => "done",
        }
    }

    /// What the `Deleting` condition says.
    pub fn message(&self) -> String {
        let list = |names: &[String]| names.join(", ");
        match self {
            DeletionStep::WaitForWorkers { workers } => format!(
                "waiting for {} worker Machine(s) to be deleted first: {}",
                workers.len(),
                list(workers)
            ),
            DeletionStep::DeleteMachines { machines } => format!(
                "deleting {} control-plane Machine(s) (no etcd member is removed: the whole cluster goes): {}",
                machines.len(),
                list(machines)
            ),
            DeletionStep::ReleaseHooks { machines } => {
                format!("releasing our pre-terminate hook on {}", list(machines))
            }
            DeletionStep::WaitForMachines { machines } => format!(
                "waiting for {} control-plane Machine(s) to be gone: {}",
                machines.len(),
                list(machines)
            ),
            DeletionStep::RemoveFinalizer => {
                "every control-plane Machine is gone; removing the finalizer".to_string()
            }
            DeletionStep::Done => {
                "every control-plane Machine is gone; waiting for the KThreesControlPlane itself to be deleted".to_string()
            }
        }
    }
}

/// Decide the next teardown step.
pub fn decide_deletion(view: &DeletionView) -> DeletionStep {
    if !view.workers.is_empty() {
        let mut workers = view.workers.clone();
        workers.sort();
        return DeletionStep::WaitForWorkers { workers };
    }
    let collect = |keep: fn(&(String, bool, bool)) -> bool| -> Vec<String> {
        let mut names: Vec<String> = view
            .machines
            .iter()
            .filter(|m| keep(m))
            .map(|m| m.0.clone())
            .collect();
        names.sort();
        names
    };
    let not_deleting = collect(|m| !m.1);
    if !not_deleting.is_empty() {
        return DeletionStep::DeleteMachines {
            machines: not_deleting,
        };
    }
    let hooked = collect(|m| m.2);
    if !hooked.is_empty() {
        return DeletionStep::ReleaseHooks { machines: hooked };
    }
    let remaining = collect(|_| true);
    if !remaining.is_empty() {
        return DeletionStep::WaitForMachines {
            machines: remaining,
        };
    }
    if view.has_finalizer {
        DeletionStep::RemoveFinalizer
    } else {
        DeletionStep::Done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(name: &str, deleting: bool, hook: bool) -> (String, bool, bool) {
        (name.to_string(), deleting, hook)
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn table() {
        let cases: Vec<(&str, DeletionView, DeletionStep)> = vec![
            (
                "worker machines exist: wait for them, touch no control-plane machine",
                DeletionView {
                    workers: names(&["w-2", "w-1"]),
                    machines: vec![m("cp-1", false, false)],
                    has_finalizer: true,
                },
                DeletionStep::WaitForWorkers {
                    workers: names(&["w-1", "w-2"]),
                },
            ),
            (
                "no workers: every control-plane machine not yet deleting is deleted together",
                DeletionView {
                    workers: vec![],
                    machines: vec![
                        m("cp-3", false, false),
                        m("cp-1", false, true),
                        m("cp-2", true, false),
                    ],
                    has_finalizer: true,
                },
                DeletionStep::DeleteMachines {
                    machines: names(&["cp-1", "cp-3"]),
                },
            ),
            (
                "all deleting, one still holds our hook (a remediation was in flight): release it",
                DeletionView {
                    workers: vec![],
                    machines: vec![m("cp-1", true, true), m("cp-2", true, false)],
                    has_finalizer: true,
                },
                DeletionStep::ReleaseHooks {
                    machines: names(&["cp-1"]),
                },
            ),
            (
                "all deleting, no hook of ours: wait for CAPI",
                DeletionView {
                    workers: vec![],
                    machines: vec![m("cp-2", true, false), m("cp-1", true, false)],
                    has_finalizer: true,
                },
                DeletionStep::WaitForMachines {
                    machines: names(&["cp-1", "cp-2"]),
                },
            ),
            (
                "nothing left: remove the finalizer",
                DeletionView {
                    workers: vec![],
                    machines: vec![],
                    has_finalizer: true,
                },
                DeletionStep::RemoveFinalizer,
            ),
            (
                "nothing left and no finalizer: done",
                DeletionView::default(),
                DeletionStep::Done,
            ),
        ];
        for (situation, view, expected) in cases {
            assert_eq!(decide_deletion(&view), expected, "{situation}");
        }
    }

    #[test]
    fn messages_name_what_is_awaited() {
        let step = DeletionStep::WaitForWorkers {
            workers: names(&["w-1"]),
        };
        assert!(step.message().contains("w-1"), "{}", step.message());
        let step = DeletionStep::DeleteMachines {
            machines: names(&["cp-1", "cp-2"]),
        };
        assert!(step.message().contains("no etcd member is removed"));
        assert!(step.message().contains("cp-1, cp-2"));
    }
}
