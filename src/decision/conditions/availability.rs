//! `Initialized`, `Available` and `CertificatesAvailable`: whether the
//! control plane was set up and answers.

use crate::api::condition_names::{
    AVAILABLE, CERTIFICATES_AVAILABLE, INITIALIZED, available, certificates_available, initialized,
};
use crate::lifecycle::{Lifecycle, SecretPlan};

use super::super::replicas::Replicas;
use super::super::world::{EtcdObservation, WorkloadState};
use super::{Value, value};

/// What the workload cluster's API said, for the messages.
fn workload_reason(workload: &WorkloadState) -> String {
    match workload {
        WorkloadState::Unavailable { reason } => reason.clone(),
        WorkloadState::Nodes(nodes) => format!("{} control-plane Node(s) listed", nodes.len()),
    }
}

/// Whether the embedded etcd (when managed) has quorum, and the numbers.
fn etcd_quorum(etcd: &EtcdObservation) -> (Option<bool>, String) {
    match etcd {
        EtcdObservation::NotManaged => (Some(true), "external datastore".into()),
        EtcdObservation::Observed(s) => {
            let a = s.assess_cluster();
            (
                Some(a.healthy >= a.size),
                format!(
                    "etcd: {} of {} voters healthy, quorum {}",
                    a.healthy, a.voters, a.size
                ),
            )
        }
        EtcdObservation::Unreachable { reason } | EtcdObservation::NoCredentials { reason } => {
            (None, format!("etcd: {reason}"))
        }
    }
}

/// `Initialized`: True once a first server joined and its API answered
/// (`initialized`); `any_machine`: a control-plane Machine exists at all.
pub fn initialized(initialized: bool, any_machine: bool, workload: &WorkloadState) -> Value {
    if initialized {
        value(
            INITIALIZED,
            Some(true),
            initialized::REASON_INITIALIZED,
            "the first server's API answered",
        )
    } else if !any_machine {
        value(
            INITIALIZED,
            Some(false),
            initialized::REASON_NOT_INITIALIZED,
            "no Machine yet",
        )
    } else {
        value(
            INITIALIZED,
            Some(false),
            initialized::REASON_NOT_INITIALIZED,
            format!(
                "waiting for the first server's API: {}",
                workload_reason(workload)
            ),
        )
    }
}

/// `Available`: initialized, a ready Machine, and etcd (when ours) has
/// quorum; Unknown while etcd was not read.
pub fn available(
    initialized: bool,
    r: &Replicas,
    workload: &WorkloadState,
    etcd: &EtcdObservation,
) -> Value {
    if !initialized {
        return value(
            AVAILABLE,
            Some(false),
            available::REASON_NOT_AVAILABLE,
            "the control plane is not initialized",
        );
    }
    if r.ready == 0 {
        return value(
            AVAILABLE,
            Some(false),
            available::REASON_NOT_AVAILABLE,
            format!(
                "no ready control-plane Machine ({})",
                workload_reason(workload)
            ),
        );
    }
    let (quorum, quorum_message) = etcd_quorum(etcd);
    match quorum {
        Some(true) => value(
            AVAILABLE,
            Some(true),
            available::REASON_AVAILABLE,
            format!(
                "{} of {} Machines ready{}; {quorum_message}",
                r.ready,
                r.live,
                if r.live == r.desired {
                    String::new()
                } else {
                    format!(", {} desired", r.desired)
                }
            ),
        ),
        Some(false) => value(
            AVAILABLE,
            Some(false),
            available::REASON_NOT_AVAILABLE,
            format!("etcd quorum lost: {quorum_message}"),
        ),
        None => value(
            AVAILABLE,
            None,
            available::REASON_AVAILABLE_UNKNOWN,
            quorum_message,
        ),
    }
}

/// `CertificatesAvailable`: every cluster CA exists and is usable; False
/// with the Secret that is not, or with what is still to be written;
/// Unknown while waiting for the Cluster.
pub fn certificates_available(secrets: &SecretPlan, lifecycle: &Lifecycle) -> Value {
    if secrets.certificates_available {
        value(
            CERTIFICATES_AVAILABLE,
            Some(true),
            certificates_available::REASON_AVAILABLE,
            "",
        )
    } else if let Some(blocked) = &secrets.blocked {
        value(
            CERTIFICATES_AVAILABLE,
            Some(false),
            certificates_available::REASON_CERTIFICATES_UNUSABLE,
            blocked.clone(),
        )
    } else if let Lifecycle::WaitForCluster { reason } = lifecycle {
        value(
            CERTIFICATES_AVAILABLE,
            None,
            certificates_available::REASON_WAITING_FOR_CLUSTER,
            reason.clone(),
        )
    } else {
        let missing: Vec<String> = secrets.writes.iter().map(ToString::to_string).collect();
        value(
            CERTIFICATES_AVAILABLE,
            Some(false),
            certificates_available::REASON_NOT_AVAILABLE,
            format!("pending: {}", missing.join(", ")),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_facts::{member, observed};
    use super::*;
    use crate::lifecycle::{CaPurpose, SecretWrite};

    fn nodes() -> WorkloadState {
        WorkloadState::Nodes(vec![])
    }

    #[test]
    fn initialized_condition() {
        let cases = [
            (
                "the first server's API answered",
                true,
                true,
                nodes(),
                Some(true),
                initialized::REASON_INITIALIZED,
                "the first server's API answered",
            ),
            (
                "no Machine yet",
                false,
                false,
                nodes(),
                Some(false),
                initialized::REASON_NOT_INITIALIZED,
                "no Machine yet",
            ),
            (
                "a Machine, the API does not answer yet",
                false,
                true,
                WorkloadState::Unavailable {
                    reason: "no kubeconfig Secret yet".into(),
                },
                Some(false),
                initialized::REASON_NOT_INITIALIZED,
                "waiting for the first server's API: no kubeconfig Secret yet",
            ),
            (
                "a Machine, the API answers without Nodes",
                false,
                true,
                nodes(),
                Some(false),
                initialized::REASON_NOT_INITIALIZED,
                "0 control-plane Node(s) listed",
            ),
        ];
        for (name, is_initialized, any_machine, workload, status, reason, message) in cases {
            let got = initialized(is_initialized, any_machine, &workload);
            assert_eq!(got.type_, INITIALIZED, "{name}");
            assert_eq!((got.status, got.reason), (status, reason), "{name}");
            assert!(got.message.contains(message), "{name}: {}", got.message);
        }
    }

    #[test]
    fn available_condition() {
        let counts = |ready, live, desired| Replicas {
            ready,
            live,
            desired,
            ..Replicas::default()
        };
        let unreachable = EtcdObservation::Unreachable {
            reason: "connection refused".into(),
        };
        let cases = [
            (
                "not initialized",
                false,
                counts(0, 1, 3),
                EtcdObservation::NotManaged,
                Some(false),
                available::REASON_NOT_AVAILABLE,
                "the control plane is not initialized",
            ),
            (
                "no ready Machine",
                true,
                counts(0, 3, 3),
                EtcdObservation::NotManaged,
                Some(false),
                available::REASON_NOT_AVAILABLE,
                "no ready control-plane Machine (0 control-plane Node(s) listed)",
            ),
            (
                "external datastore, all ready",
                true,
                counts(3, 3, 3),
                EtcdObservation::NotManaged,
                Some(true),
                available::REASON_AVAILABLE,
                "3 of 3 Machines ready; external datastore",
            ),
            (
                "etcd has quorum, fewer than desired",
                true,
                counts(2, 2, 3),
                observed(vec![
                    member(1, None),
                    member(2, None),
                    member(3, Some("timeout")),
                ]),
                Some(true),
                available::REASON_AVAILABLE,
                "2 of 2 Machines ready, 3 desired; etcd: 2 of 3 voters healthy, quorum 2",
            ),
            (
                "etcd lost quorum",
                true,
                counts(1, 3, 3),
                observed(vec![
                    member(1, None),
                    member(2, Some("timeout")),
                    member(3, Some("timeout")),
                ]),
                Some(false),
                available::REASON_NOT_AVAILABLE,
                "etcd quorum lost: etcd: 1 of 3 voters healthy, quorum 2",
            ),
            (
                "etcd was not read",
                true,
                counts(3, 3, 3),
                unreachable,
                None,
                available::REASON_AVAILABLE_UNKNOWN,
                "etcd: connection refused",
            ),
        ];
        for (name, is_initialized, r, etcd, status, reason, message) in cases {
            let got = available(is_initialized, &r, &nodes(), &etcd);
            assert_eq!(got.type_, AVAILABLE, "{name}");
            assert_eq!((got.status, got.reason), (status, reason), "{name}");
            assert_eq!(got.message, message, "{name}");
        }
    }

    #[test]
    fn certificates_available_condition() {
        let secrets =
            |available: bool, blocked: Option<&str>, writes: Vec<SecretWrite>| SecretPlan {
                writes,
                blocked: blocked.map(Into::into),
                certificates_available: available,
                kubeconfig_pending: None,
            };
        let proceed = |s: &SecretPlan| Lifecycle::Proceed { secrets: s.clone() };
        let cases = [
            (
                "every CA is usable",
                secrets(true, None, vec![]),
                None,
                Some(true),
                certificates_available::REASON_AVAILABLE,
                "",
            ),
            (
                "a Secret cannot be used",
                secrets(false, Some("Secret ns/c-ca: no tls.key"), vec![]),
                None,
                Some(false),
                certificates_available::REASON_CERTIFICATES_UNUSABLE,
                "Secret ns/c-ca: no tls.key",
            ),
            (
                "waiting for the Cluster",
                secrets(
                    false,
                    None,
                    vec![SecretWrite::GenerateCa {
                        purpose: CaPurpose::Server,
                    }],
                ),
                Some(Lifecycle::WaitForCluster {
                    reason: "Cluster ns/c not found".into(),
                }),
                None,
                certificates_available::REASON_WAITING_FOR_CLUSTER,
                "Cluster ns/c not found",
            ),
            (
                "CAs still to be generated",
                secrets(
                    false,
                    None,
                    vec![
                        SecretWrite::GenerateCa {
                            purpose: CaPurpose::Server,
                        },
                        SecretWrite::GenerateToken,
                    ],
                ),
                None,
                Some(false),
                certificates_available::REASON_NOT_AVAILABLE,
                "pending: generate the Server CA, generate the join token",
            ),
        ];
        for (name, plan, lifecycle, status, reason, message) in cases {
            let lifecycle = lifecycle.unwrap_or_else(|| proceed(&plan));
            let got = certificates_available(&plan, &lifecycle);
            assert_eq!(got.type_, CERTIFICATES_AVAILABLE, "{name}");
            assert_eq!((got.status, got.reason), (status, reason), "{name}");
            assert_eq!(got.message, message, "{name}");
        }
    }
}
