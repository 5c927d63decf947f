//! The CAPI v1beta2 control-plane contract conditions of a KThreesControlPlane
//! (`Available`, `Initialized`, `CertificatesAvailable`, `MachinesReady`,
//! `MachinesUpToDate`, `ScalingUp`, `ScalingDown`, `Deleting`, `Paused`), and
//! their v1beta1 mirror under `status.deprecated.v1beta1.conditions` for older
//! readers. Pure: each is computed from the observed world and the decisions.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::api::conditions::V1Beta1Condition;
use crate::lifecycle::{Lifecycle, plan_secrets};

use super::plan::{Action, Plan};
use super::world::{EtcdObservation, World};

pub const AVAILABLE: &str = "Available";
pub const INITIALIZED: &str = "Initialized";
pub const CERTIFICATES_AVAILABLE: &str = "CertificatesAvailable";
pub const MACHINES_READY: &str = "MachinesReady";
pub const MACHINES_UP_TO_DATE: &str = "MachinesUpToDate";
pub const SCALING_UP: &str = "ScalingUp";
pub const SCALING_DOWN: &str = "ScalingDown";
pub const DELETING: &str = "Deleting";
pub const PAUSED: &str = "Paused";
pub const ROLLING_OUT: &str = "RollingOut";

/// A condition's value before it is stamped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Value {
    pub type_: &'static str,
    pub status: Option<bool>,
    pub reason: &'static str,
    pub message: String,
}

fn value(
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

fn status_text(status: Option<bool>) -> &'static str {
    match status {
        Some(true) => "True",
        Some(false) => "False",
        None => "Unknown",
    }
}

/// Counts shared by the replica fields and the conditions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Replicas {
    pub desired: i32,
    /// Not deleting.
    pub live: i32,
    pub ready: i32,
    pub available: i32,
    pub up_to_date: i32,
    pub not_ready: Vec<String>,
    /// Each outdated Machine not deleting, with its reasons.
    pub outdated: Vec<String>,
    /// Outdated Machines not deleting yet: what the rollout still replaces.
    pub rolling_out: i32,
}

/// Count the Machines of `world`, `outdated` saying which need a rollout.
pub fn replicas(world: &World, outdated: &crate::rollout::OutdatedMachines) -> Replicas {
    let mut r = Replicas {
        desired: world.kcp.desired_replicas(),
        ..Replicas::default()
    };
    for m in &world.machines {
        let name = m.metadata.name.clone().unwrap_or_default();
        let reasons = outdated.get(&name).cloned().unwrap_or_default();
        if reasons.is_empty() {
            r.up_to_date += 1;
        } else if !m.is_deleting() {
            // A deleting Machine is on its way out: nothing left to roll.
            r.rolling_out += 1;
            r.outdated
                .push(format!("{name} ({})", crate::rollout::describe(&reasons)));
        }
        if m.is_deleting() {
            continue;
        }
        r.live += 1;
        let ready = m
            .node_name()
            .and_then(|n| world.node(n))
            .and_then(|n| n.ready)
            == Some(true);
        if ready {
            r.ready += 1;
            r.available += 1;
        } else {
            r.not_ready.push(name);
        }
    }
    r
}

/// Whether the embedded etcd (when managed) has quorum, and the numbers.
fn etcd_quorum(world: &World) -> (Option<bool>, String) {
    match &world.etcd {
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

/// The contract conditions. `plan` is present when the lifecycle let the
/// reconcile get as far as deciding on remediation and scaling.
pub fn contract_conditions(
    world: &World,
    lifecycle: &Lifecycle,
    plan: Option<&Plan>,
    r: &Replicas,
) -> Vec<Value> {
    let initialized = world.control_plane_initialized();
    let mut out = Vec::new();

    out.push(match lifecycle {
        Lifecycle::Paused { by } => value(PAUSED, Some(true), "Paused", format!("paused by {by}")),
        _ => value(PAUSED, Some(false), "NotPaused", ""),
    });
    out.push(match lifecycle {
        Lifecycle::Delete { step, trigger } => value(
            DELETING,
            Some(true),
            match step {
                crate::lifecycle::DeletionStep::WaitForWorkers { .. } => {
                    "WaitingForWorkersDeletion"
                }
                crate::lifecycle::DeletionStep::ReleaseHooks { .. }
                | crate::lifecycle::DeletionStep::DeleteMachines { .. }
                | crate::lifecycle::DeletionStep::WaitForMachines { .. } => {
                    "WaitingForMachineDeletion"
                }
                _ => "DeletionCompleted",
            },
            format!("{trigger}: {}", step.message()),
        ),
        _ => value(DELETING, Some(false), "NotDeleting", ""),
    });

    let secrets = plan_secrets(&world.secrets);
    out.push(if secrets.certificates_available {
        value(CERTIFICATES_AVAILABLE, Some(true), "Available", "")
    } else if let Some(blocked) = &secrets.blocked {
        value(
            CERTIFICATES_AVAILABLE,
            Some(false),
            "CertificatesUnusable",
            blocked.clone(),
        )
    } else if let Lifecycle::WaitForCluster { reason } = lifecycle {
        value(
            CERTIFICATES_AVAILABLE,
            None,
            "WaitingForCluster",
            reason.clone(),
        )
    } else {
        let missing: Vec<String> = secrets.writes.iter().map(ToString::to_string).collect();
        value(
            CERTIFICATES_AVAILABLE,
            Some(false),
            "NotAvailable",
            format!("pending: {}", missing.join(", ")),
        )
    });

    let workload_reason = match &world.workload {
        super::world::WorkloadState::Unavailable { reason } => reason.clone(),
        super::world::WorkloadState::Nodes(nodes) => {
            format!("{} control-plane Node(s) listed", nodes.len())
        }
    };
    out.push(if initialized {
        value(
            INITIALIZED,
            Some(true),
            "Initialized",
            "the first server's API answered",
        )
    } else if world.machines.is_empty() {
        value(INITIALIZED, Some(false), "NotInitialized", "no Machine yet")
    } else {
        value(
            INITIALIZED,
            Some(false),
            "NotInitialized",
            format!("waiting for the first server's API: {workload_reason}"),
        )
    });

    let (quorum, quorum_message) = etcd_quorum(world);
    out.push(if !initialized {
        value(
            AVAILABLE,
            Some(false),
            "NotAvailable",
            "the control plane is not initialized",
        )
    } else if r.ready == 0 {
        value(
            AVAILABLE,
            Some(false),
            "NotAvailable",
            format!("no ready control-plane Machine ({workload_reason})"),
        )
    } else {
        match quorum {
            Some(true) => value(
                AVAILABLE,
                Some(true),
                "Available",
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
                "NotAvailable",
                format!("etcd quorum lost: {quorum_message}"),
            ),
            None => value(AVAILABLE, None, "AvailableUnknown", quorum_message),
        }
    });

    out.push(if world.machines.is_empty() {
        value(
            MACHINES_READY,
            None,
            "NoReplicas",
            "no control-plane Machine",
        )
    } else if r.not_ready.is_empty() {
        value(
            MACHINES_READY,
            Some(true),
            "Ready",
            format!("{} of {} ready", r.ready, r.live),
        )
    } else {
        value(
            MACHINES_READY,
            Some(false),
            "NotReady",
            format!(
                "{} of {} ready; not ready: {}",
                r.ready,
                r.live,
                r.not_ready.join(", ")
            ),
        )
    });
    out.push(if r.outdated.is_empty() {
        value(MACHINES_UP_TO_DATE, Some(true), "UpToDate", "")
    } else {
        value(
            MACHINES_UP_TO_DATE,
            Some(false),
            "NotUpToDate",
            format!("outdated: {}", r.outdated.join(", ")),
        )
    });

    let waiting = plan
        .filter(|p| matches!(p.action, Action::Wait))
        .map(|p| format!("; {} ({})", p.message, p.rule))
        .unwrap_or_default();
    out.push(if r.rolling_out > 0 {
        let next = plan
            .map(|p| format!("; next: {} ({})", p.message, p.rule))
            .unwrap_or_default();
        value(
            ROLLING_OUT,
            Some(true),
            "RollingOut",
            format!(
                "rolling out {} not up-to-date replicas (maxSurge {}): {}{next}",
                r.rolling_out,
                world
                    .kcp
                    .max_surge()
                    .map_or_else(|| "invalid".to_string(), |n| n.to_string()),
                r.outdated.join(", ")
            ),
        )
    } else {
        value(ROLLING_OUT, Some(false), "NotRollingOut", "")
    });
    let deleting_now = matches!(lifecycle, Lifecycle::Delete { .. });
    out.push(if r.live < r.desired && !deleting_now {
        value(
            SCALING_UP,
            Some(true),
            "ScalingUp",
            format!(
                "scaling up from {} to {} replicas{waiting}",
                r.live, r.desired
            ),
        )
    } else {
        value(SCALING_UP, Some(false), "NotScalingUp", "")
    });
    out.push(if r.live > r.desired && !deleting_now {
        value(
            SCALING_DOWN,
            Some(true),
            "ScalingDown",
            format!(
                "scaling down from {} to {} replicas{waiting}",
                r.live, r.desired
            ),
        )
    } else {
        value(SCALING_DOWN, Some(false), "NotScalingDown", "")
    });
    out
}

/// The v1beta1 names of the conditions older readers (CAPI v1.10,
/// cluster-api-k3s tooling) look for, mirrored from the v1beta2 ones.
pub fn v1beta1_mirror(conditions: &[Condition]) -> Vec<V1Beta1Condition> {
    const MIRROR: &[(&str, &str)] = &[
        (AVAILABLE, "Ready"),
        (AVAILABLE, "Available"),
        (CERTIFICATES_AVAILABLE, "CertificatesAvailable"),
        (MACHINES_READY, "MachinesReady"),
        (MACHINES_UP_TO_DATE, "MachinesSpecUpToDate"),
        ("EtcdClusterHealthy", "EtcdClusterHealthy"),
    ];
    let mut out: Vec<V1Beta1Condition> = MIRROR
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
        .collect();
    // Resized: v1beta1's "the replica count is where it should be".
    let scaling = conditions
        .iter()
        .find(|c| (c.type_ == SCALING_UP || c.type_ == SCALING_DOWN) && c.status == "True");
    out.push(V1Beta1Condition {
        type_: "Resized".into(),
        status: if scaling.is_some() { "False" } else { "True" }.into(),
        severity: scaling.map(|_| "Warning".to_string()),
        last_transition_time: scaling
            .map(|c| c.last_transition_time.clone())
            .or_else(|| Some(Time(k8s_openapi::jiff::Timestamp::now()))),
        reason: scaling.map(|c| c.reason.clone()),
        message: scaling.map(|c| c.message.clone()),
    });
    out
}
