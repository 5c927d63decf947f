//! The ordered lifecycle decision of one reconcile (see the module docs of
//! [`crate::lifecycle`] for the order and why).

use serde::Serialize;

use super::deletion::{DeletionStep, DeletionView, decide_deletion};
use super::secrets::{SecretPlan, SecretsView, plan_secrets};

/// The Cluster as the lifecycle sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClusterState {
    /// Named by the owner reference, but not found.
    Missing,
    Present {
        deleting: bool,
        /// `spec.paused` or the `cluster.x-k8s.io/paused` annotation.
        paused: bool,
        infrastructure_provisioned: bool,
    },
}

/// One of our control-plane Machines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnedMachine {
    pub name: String,
    pub deleting: bool,
    pub has_our_hook: bool,
}

/// Everything the lifecycle decision reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LifecycleView {
    pub kcp_deleting: bool,
    /// `cluster.x-k8s.io/paused` on the KThreesControlPlane.
    pub kcp_paused: bool,
    pub has_finalizer: bool,
    pub cluster: ClusterState,
    pub secrets: SecretsView,
    pub machines: Vec<OwnedMachine>,
    /// Control-plane Machines of the Cluster that this control plane does not own.
    pub foreign_machines: Vec<String>,
    /// Machines of the Cluster that are not control-plane Machines.
    pub workers: Vec<String>,
}

/// What the lifecycle says this reconcile does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "decision", rename_all = "kebab-case")]
pub enum Lifecycle {
    /// Write nothing but the `Paused` condition.
    Paused {
        by: String,
    },
    /// Tear the control plane down, one step; `trigger` says whose deletion.
    Delete {
        step: DeletionStep,
        trigger: String,
    },
    AddFinalizer,
    /// The Cluster is not there or its infrastructure is not provisioned.
    WaitForCluster {
        reason: String,
    },
    /// Write cluster Secrets (or, with `blocked`, refuse until a Secret is fixed).
    Secrets {
        plan: SecretPlan,
    },
    /// Control-plane Machines of the Cluster are not ours: act on nothing.
    MixedManagement {
        foreign: Vec<String>,
    },
    /// Go on to remediation, rollout and scaling.
    Proceed {
        secrets: SecretPlan,
    },
}

impl Lifecycle {
    /// The rule name, for logs, conditions and `inspect`.
    pub fn rule(&self) -> String {
        match self {
            Lifecycle::Paused { .. } => "lifecycle.paused".into(),
            Lifecycle::Delete { step, .. } => format!("deletion.{}", step.name()),
            Lifecycle::AddFinalizer => "lifecycle.add-finalizer".into(),
            Lifecycle::WaitForCluster { .. } => "lifecycle.wait-for-cluster".into(),
            Lifecycle::Secrets { plan } if plan.blocked.is_some() => "certificates.unusable".into(),
            Lifecycle::Secrets { .. } => "certificates.write".into(),
            Lifecycle::MixedManagement { .. } => "lifecycle.mixed-management".into(),
            Lifecycle::Proceed { .. } => "lifecycle.proceed".into(),
        }
    }

    /// One line on what it decided and why.
    pub fn message(&self) -> String {
        match self {
            Lifecycle::Paused { by } => format!("paused by {by}: nothing is reconciled"),
            Lifecycle::Delete { step, trigger } => format!("{trigger}: {}", step.message()),
            Lifecycle::AddFinalizer => "adding our finalizer".into(),
            Lifecycle::WaitForCluster { reason } => reason.clone(),
            Lifecycle::Secrets { plan } => match &plan.blocked {
                Some(reason) => format!("cluster Secret unusable, acting on nothing: {reason}"),
                None => plan
                    .writes
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
            },
            Lifecycle::MixedManagement { foreign } => format!(
                "refusing to act: control-plane Machine(s) of this Cluster are not owned by this KThreesControlPlane: {}",
                foreign.join(", ")
            ),
            Lifecycle::Proceed { .. } => "lifecycle settled".into(),
        }
    }
}

/// Decide this reconcile's lifecycle step.
pub fn decide_lifecycle_step(view: &LifecycleView) -> Lifecycle {
    let (cluster_deleting, cluster_paused, infrastructure) = match &view.cluster {
        ClusterState::Missing => (false, false, false),
        ClusterState::Present {
            deleting,
            paused,
            infrastructure_provisioned,
        } => (*deleting, *paused, *infrastructure_provisioned),
    };
    if cluster_paused || view.kcp_paused {
        let by = if cluster_paused {
            "the Cluster (spec.paused or the cluster.x-k8s.io/paused annotation)"
        } else {
            "the cluster.x-k8s.io/paused annotation on the KThreesControlPlane"
        };
        return Lifecycle::Paused { by: by.into() };
    }
    if view.kcp_deleting || cluster_deleting {
        let trigger = if view.kcp_deleting {
            "the KThreesControlPlane is being deleted"
        } else {
            "the Cluster is being deleted"
        };
        let step = decide_deletion(&DeletionView {
            workers: view.workers.clone(),
            machines: view
                .machines
                .iter()
                .map(|m| (m.name.clone(), m.deleting, m.has_our_hook))
                .collect(),
            has_finalizer: view.has_finalizer,
        });
        // Only the KThreesControlPlane's own deletion lets it go; for a
        // deleting Cluster, CAPI deletes the control plane object next.
        let step = match step {
            DeletionStep::RemoveFinalizer if !view.kcp_deleting => DeletionStep::Done,
            step => step,
        };
        return Lifecycle::Delete {
            step,
            trigger: trigger.into(),
        };
    }
    if !view.has_finalizer {
        return Lifecycle::AddFinalizer;
    }
    if view.cluster == ClusterState::Missing {
        return Lifecycle::WaitForCluster {
            reason: format!("Cluster {} not found", view.secrets.cluster),
        };
    }
    if !infrastructure {
        return Lifecycle::WaitForCluster {
            reason: format!(
                "waiting for Cluster {} status.initialization.infrastructureProvisioned",
                view.secrets.cluster
            ),
        };
    }
    let secrets = plan_secrets(&view.secrets);
    if secrets.blocked.is_some() || !secrets.writes.is_empty() {
        return Lifecycle::Secrets { plan: secrets };
    }
    if !view.foreign_machines.is_empty() {
        let mut foreign = view.foreign_machines.clone();
        foreign.sort();
        return Lifecycle::MixedManagement { foreign };
    }
    Lifecycle::Proceed { secrets }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::secrets::{KubeconfigState, SecretState, SecretWrite};

    fn settled() -> LifecycleView {
        let valid = SecretState::Valid { owned: true };
        LifecycleView {
            kcp_deleting: false,
            kcp_paused: false,
            has_finalizer: true,
            cluster: ClusterState::Present {
                deleting: false,
                paused: false,
                infrastructure_provisioned: true,
            },
            secrets: SecretsView {
                cluster: "c".into(),
                initialized: false,
                server_ca: valid.clone(),
                client_ca: valid.clone(),
                etcd_ca: valid.clone(),
                token: valid,
                kubeconfig: KubeconfigState::Present {
                    owned: false,
                    client_not_after: None,
                    server: None,
                    problem: None,
                },
                endpoint: Some("https://127.0.0.1:6443".into()),
                now: chrono::Utc::now(),
                kubeconfig_policy: crate::pki::KubeconfigPolicy::default(),
                ca_not_after: Default::default(),
            },
            machines: vec![OwnedMachine {
                name: "cp-1".into(),
                deleting: false,
                has_our_hook: false,
            }],
            foreign_machines: vec![],
            workers: vec![],
        }
    }

    fn with(change: impl FnOnce(&mut LifecycleView)) -> LifecycleView {
        let mut v = settled();
        change(&mut v);
        v
    }

    fn cluster(deleting: bool, paused: bool, infra: bool) -> ClusterState {
        ClusterState::Present {
            deleting,
            paused,
            infrastructure_provisioned: infra,
        }
    }

    #[test]
    fn table() {
        let cases: Vec<(&str, LifecycleView, &str)> = vec![
            ("everything settled: go on", settled(), "lifecycle.proceed"),
            (
                "paused Cluster: nothing but the Paused condition",
                with(|v| v.cluster = cluster(false, true, true)),
                "lifecycle.paused",
            ),
            (
                "paused annotation on the control plane",
                with(|v| v.kcp_paused = true),
                "lifecycle.paused",
            ),
            (
                "paused wins over deletion (clusterctl move deletes paused objects in the source)",
                with(|v| {
                    v.cluster = cluster(true, true, true);
                    v.kcp_deleting = true;
                }),
                "lifecycle.paused",
            ),
            (
                "control plane deleted: tear down, first the machines",
                with(|v| v.kcp_deleting = true),
                "deletion.delete-machines",
            ),
            (
                "Cluster deleted, control plane not yet: tear down as well",
                with(|v| v.cluster = cluster(true, false, true)),
                "deletion.delete-machines",
            ),
            (
                "deletion waits for workers",
                with(|v| {
                    v.kcp_deleting = true;
                    v.workers = vec!["w-1".into()];
                }),
                "deletion.wait-for-workers",
            ),
            (
                "deleted before it was ever set up (no Cluster, no machines): drop the finalizer",
                with(|v| {
                    v.kcp_deleting = true;
                    v.cluster = ClusterState::Missing;
                    v.machines.clear();
                }),
                "deletion.remove-finalizer",
            ),
            (
                "Cluster deleted and every machine gone: the control plane waits for its own deletion",
                with(|v| {
                    v.cluster = cluster(true, false, true);
                    v.machines.clear();
                }),
                "deletion.done",
            ),
            (
                "no finalizer yet: add it before anything is created",
                with(|v| v.has_finalizer = false),
                "lifecycle.add-finalizer",
            ),
            (
                "Cluster missing",
                with(|v| v.cluster = ClusterState::Missing),
                "lifecycle.wait-for-cluster",
            ),
            (
                "infrastructure not provisioned: no certificates, no machines",
                with(|v| v.cluster = cluster(false, false, false)),
                "lifecycle.wait-for-cluster",
            ),
            (
                "a CA is missing: generate it first",
                with(|v| v.secrets.etcd_ca = SecretState::Missing),
                "certificates.write",
            ),
            (
                "a user CA is unusable: refuse",
                with(|v| {
                    v.secrets.server_ca = SecretState::Invalid {
                        reason: "Secret ns/c-ca: key tls.crt is not a CA".into(),
                    }
                }),
                "certificates.unusable",
            ),
            (
                "a control-plane machine of the Cluster is not ours: refuse",
                with(|v| v.foreign_machines = vec!["other-cp".into()]),
                "lifecycle.mixed-management",
            ),
        ];
        for (situation, view, rule) in cases {
            let decision = decide_lifecycle_step(&view);
            assert_eq!(decision.rule(), rule, "{situation}: {decision:?}");
        }
    }

    #[test]
    fn mixed_management_names_the_machines() {
        let decision = decide_lifecycle_step(&with(|v| {
            v.foreign_machines = vec!["z-cp".into(), "a-cp".into()]
        }));
        assert_eq!(
            decision,
            Lifecycle::MixedManagement {
                foreign: vec!["a-cp".into(), "z-cp".into()]
            }
        );
        assert!(decision.message().contains("a-cp, z-cp"));
    }

    #[test]
    fn secrets_are_written_before_anything_else_is_decided() {
        let decision = decide_lifecycle_step(&with(|v| {
            v.secrets.token = SecretState::Missing;
            v.foreign_machines = vec!["other".into()];
        }));
        match decision {
            Lifecycle::Secrets { plan } => {
                assert_eq!(plan.writes, vec![SecretWrite::GenerateToken])
            }
            other => panic!("expected Secrets, got {other:?}"),
        }
    }
}
