//! The restore rule: rebuild a control plane whose etcd lost quorum from a
//! snapshot a person names (annotation [`ETCD_RESTORE_ANNOTATION`], or
//! `k3s-control-plane restore`). Pure; the controller carries the steps out
//! (`controller::etcd_restore`), one per reconcile.
//!
//! Nothing happens before a person asks, and a request is accepted only
//! when etcd has lost quorum (from the real membership: a member without a
//! Machine counts) or the person forced it, and the target is one a new
//! server can read (S3). The controller then verifies the snapshot in the
//! target and records the acceptance on the KThreesControlPlane
//! ([`ETCD_RESTORE_ACCEPTED_ANNOTATION`]); from then on the attempt goes to
//! its end, whatever the request says:
//! 1. every old Machine loses our pre-terminate hook (etcd cannot consent:
//!    a person asked), is marked to skip drain and volume detach (its
//!    workload API is gone with quorum) and is deleted;
//! 2. once they are all gone, ONE Machine is created whose KThreesConfig
//!    restores the snapshot with k3s's cluster-reset (`backup::restore_boot`);
//! 3. once etcd answers with that Machine's member alone, a healthy voter
//!    holding the snapshot's data (the Node object of the server the
//!    snapshot was taken on: a fresh first start has none), the attempt is
//!    finished: the annotations go, `status.etcdBackup.lastRestore` says
//!    what was done, and scale-up joins the other servers one at a time.

use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde::{Deserialize, Serialize};

use crate::api::Machine;
use crate::api::etcd_backup::{EtcdBackup, EtcdBackupStatus, RestoreRecord};
use crate::api::names::{
    ETCD_RESTORE_ACCEPTED_ANNOTATION, ETCD_RESTORE_ANNOTATION, ETCD_RESTORE_FORCE_ANNOTATION,
    ETCD_RESTORE_OF_ANNOTATION, EXCLUDE_NODE_DRAINING_ANNOTATION,
    EXCLUDE_WAIT_FOR_VOLUME_DETACH_ANNOTATION, PRE_TERMINATE_HOOK_ANNOTATION,
};
use crate::backup::SnapshotName;
use crate::etcd::MembershipSnapshot;

use super::world::{EtcdObservation, World};

use crate::api::condition_names::ETCD_RESTORING;
use crate::api::condition_names::etcd_restoring::{
    REASON_RESTORE_REFUSED, REASON_RESTORED, REASON_RESTORING_SNAPSHOT, REASON_RETIRING_MACHINES,
    REASON_SNAPSHOT_UNUSABLE, REASON_VERIFYING_SNAPSHOT,
};

/// Where k3s's API server keeps a Node in its etcd (Kubernetes' default
/// `/registry` prefix, resource `minions`): the restored data holds the
/// Node of the server the snapshot was taken on; a fresh server's has not.
pub const NODE_KEY_PREFIX: &str = "/registry/minions/";

/// One accepted restore: the value of [`ETCD_RESTORE_ACCEPTED_ANNOTATION`]
/// on the KThreesControlPlane and of [`ETCD_RESTORE_OF_ANNOTATION`] on its
/// restore Machine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attempt {
    pub snapshot: String,
    /// RFC 3339, seconds.
    pub accepted_at: String,
    #[serde(default)]
    pub forced: bool,
    /// The control plane's Machines when it was accepted: the only ones the
    /// attempt retires. A Machine not among them (nor restoring this attempt)
    /// means the annotation is not the acceptance of what is there now (a
    /// copied or re-applied annotation): nothing is deleted on it.
    #[serde(default)]
    pub machines: Vec<String>,
}

impl Attempt {
    pub fn annotation_value(&self) -> String {
        serde_json::to_string(self).expect("an attempt serializes")
    }

    fn parse(value: &str) -> Result<Self, String> {
        serde_json::from_str(value).map_err(|e| format!("not a restore attempt: {e}"))
    }

    /// The node the snapshot was taken on (its name says, k3s's format).
    pub fn source_node(&self) -> Option<String> {
        snapshot_node(&self.snapshot).ok()
    }

    /// The etcd key that holds the source node's Node object.
    pub fn marker_key(&self) -> Option<String> {
        self.source_node().map(|n| format!("{NODE_KEY_PREFIX}{n}"))
    }
}

/// A person's request, as read from the annotations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub snapshot: String,
    pub force: bool,
}

/// One step of a restore.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RestoreStep {
    /// Verify `snapshot` in the target, then record the acceptance with the
    /// Machines there now.
    Accept {
        snapshot: String,
        forced: bool,
        machines: Vec<String>,
    },
    /// Release our hook on these old Machines, mark them to skip drain and
    /// volume detach, and delete them.
    RetireMachines { machines: Vec<String> },
    /// Create the Machine that restores the snapshot.
    CreateMachine { attempt: Attempt },
    /// The restore is done: clear the annotations, record it.
    Finish {
        attempt: Attempt,
        machine: String,
        member: u64,
    },
}

impl RestoreStep {
    pub fn name(&self) -> &'static str {
        match self {
            RestoreStep::Accept { .. } => "accept",
            RestoreStep::RetireMachines { .. } => "retire-machines",
            RestoreStep::CreateMachine { .. } => "create-machine",
            RestoreStep::Finish { .. } => "finish",
        }
    }
}

/// Why a restore under way waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestoreWait {
    /// Old Machines are being deleted (other controllers' hooks may hold them).
    MachinesGoing,
    /// The restore Machine is being deleted before it restored.
    RestoreMachineGoing,
    /// The restore Machine has not restored the snapshot yet.
    RestoredMember,
}

/// Why a request cannot be carried out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestoreRefusal {
    InvalidRequest,
    NoTarget,
    NoS3Target,
    NotEmbedded,
    QuorumHolds,
    EtcdUnknown,
    StaleAcceptance,
}

impl RestoreWait {
    pub fn as_str(self) -> &'static str {
        match self {
            RestoreWait::MachinesGoing => "machines-going",
            RestoreWait::RestoreMachineGoing => "restore-machine-going",
            RestoreWait::RestoredMember => "restored-member",
        }
    }
}

impl RestoreRefusal {
    pub fn as_str(self) -> &'static str {
        match self {
            RestoreRefusal::InvalidRequest => "invalid-request",
            RestoreRefusal::NoTarget => "no-target",
            RestoreRefusal::NoS3Target => "no-s3-target",
            RestoreRefusal::NotEmbedded => "not-embedded",
            RestoreRefusal::QuorumHolds => "quorum-holds",
            RestoreRefusal::EtcdUnknown => "etcd-unknown",
            RestoreRefusal::StaleAcceptance => "stale-acceptance",
        }
    }
}

/// What the restore rule says of this reconcile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RestoreDecision {
    Step {
        step: RestoreStep,
        message: String,
    },
    /// Under way, waiting for the world.
    Wait {
        why: RestoreWait,
        message: String,
    },
    /// The request cannot be carried out: nothing else acts until a person
    /// changes it.
    Refused {
        why: RestoreRefusal,
        message: String,
    },
}

impl RestoreDecision {
    /// `restore.<step>`, `restore.wait.<why>` or `restore.refused.<why>`.
    pub fn rule(&self) -> String {
        match self {
            RestoreDecision::Step { step, .. } => format!("restore.{}", step.name()),
            RestoreDecision::Wait { why, .. } => format!("restore.wait.{}", why.as_str()),
            RestoreDecision::Refused { why, .. } => format!("restore.refused.{}", why.as_str()),
        }
    }

    pub fn message(&self) -> &str {
        match self {
            RestoreDecision::Step { message, .. }
            | RestoreDecision::Wait { message, .. }
            | RestoreDecision::Refused { message, .. } => message,
        }
    }
}

fn refused(why: RestoreRefusal, message: String) -> Option<RestoreDecision> {
    Some(RestoreDecision::Refused { why, message })
}

fn wait(why: RestoreWait, message: String) -> Option<RestoreDecision> {
    Some(RestoreDecision::Wait { why, message })
}

/// The node in a snapshot's name (`<prefix>-<node>-<unix seconds>`), or why
/// the name cannot be restored by the controller.
pub fn snapshot_node(snapshot: &str) -> Result<String, String> {
    // It goes into a shell command and an object key: only what k3s's names
    // are made of, and never a flag.
    let shell_safe = !snapshot.is_empty()
        && !snapshot.starts_with(['-', '.'])
        && snapshot
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_');
    if !shell_safe {
        return Err(format!(
            "{snapshot:?} is not a snapshot name: letters, digits, '-', '.' and '_' only, not starting with '-' or '.'"
        ));
    }
    match SnapshotName::parse(snapshot) {
        Some(name) if !name.node.is_empty() && !name.compressed => Ok(name.node),
        Some(name) if name.compressed => Err(format!(
            "{snapshot:?} is a compressed snapshot: the controller restores uncompressed ones (docs/dr.md restores the others by hand)"
        )),
        _ => Err(format!(
            "{snapshot:?} does not name the node it was taken on as k3s names snapshots (<prefix>-<node>-<unix seconds>, with this controller's prefixes or k3s's etcd-snapshot and on-demand): the node tells the restored data from a fresh server's"
        )),
    }
}

fn kcp_label(world: &World) -> String {
    format!(
        "KThreesControlPlane {}/{}",
        world.kcp.metadata.namespace.as_deref().unwrap_or_default(),
        world.kcp.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The request on the KThreesControlPlane, if any.
pub fn request(world: &World) -> Option<Result<Request, String>> {
    let annotations = world.kcp.metadata.annotations.as_ref();
    let snapshot = annotations?
        .get(ETCD_RESTORE_ANNOTATION)?
        .trim()
        .to_string();
    let force = match annotations.and_then(|a| a.get(ETCD_RESTORE_FORCE_ANNOTATION)) {
        None => false,
        Some(v) if v == "true" => true,
        Some(v) if v == "false" => false,
        Some(v) => {
            return Some(Err(format!(
                "annotation {ETCD_RESTORE_FORCE_ANNOTATION}={v:?} on {}: expected \"true\" or \"false\"",
                kcp_label(world)
            )));
        }
    };
    Some(
        snapshot_node(&snapshot)
            .map(|_| Request { snapshot, force })
            .map_err(|why| {
                format!(
                    "annotation {ETCD_RESTORE_ANNOTATION} on {}: {why}",
                    kcp_label(world)
                )
            }),
    )
}

/// The accepted attempt recorded on the KThreesControlPlane, if any.
pub fn accepted(world: &World) -> Option<Result<Attempt, String>> {
    let value = world
        .kcp
        .metadata
        .annotations
        .as_ref()?
        .get(ETCD_RESTORE_ACCEPTED_ANNOTATION)?;
    Some(Attempt::parse(value).map_err(|why| {
        format!(
            "annotation {ETCD_RESTORE_ACCEPTED_ANNOTATION} on {}: {why}",
            kcp_label(world)
        )
    }))
}

/// The attempt `machine` restores, if it is a restore Machine.
fn restores(machine: &Machine) -> Option<Attempt> {
    let value = machine
        .metadata
        .annotations
        .as_ref()?
        .get(ETCD_RESTORE_OF_ANNOTATION)?;
    Attempt::parse(value).ok()
}

fn name(machine: &Machine) -> String {
    machine.metadata.name.clone().unwrap_or_default()
}

fn has_annotation(machine: &Machine, key: &str) -> bool {
    machine
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(key))
}

/// Pre-terminate hooks on `machine` that are not ours to release.
fn other_hooks(machine: &Machine) -> Vec<String> {
    machine
        .metadata
        .annotations
        .as_ref()
        .map(super::view::other_pre_terminate_hooks)
        .unwrap_or_default()
}

/// Whether `machine` still carries a hook of ours (or cluster-api-k3s's,
/// ours to release after a takeover).
fn holds_our_hook(machine: &Machine) -> bool {
    machine.metadata.annotations.as_ref().is_some_and(|a| {
        a.contains_key(PRE_TERMINATE_HOOK_ANNOTATION) || super::view::has_upstream_hook(a)
    })
}

/// What the restore rule says, `None` when no restore was asked for (the
/// reconcile goes on as usual).
pub fn decide_restore(world: &World) -> Option<RestoreDecision> {
    match accepted(world) {
        Some(Ok(attempt)) => under_way(world, &attempt),
        Some(Err(why)) => refused(
            RestoreRefusal::InvalidRequest,
            format!("{why}; remove it to start over (nothing was changed by it)"),
        ),
        None => match request(world)? {
            Err(why) => refused(RestoreRefusal::InvalidRequest, why),
            Ok(request) => acceptance(world, &request),
        },
    }
}

/// Whether the request can be accepted, on what was observed.
fn acceptance(world: &World, request: &Request) -> Option<RestoreDecision> {
    let Some(backup) = world.kcp.spec.etcd_backup.as_ref() else {
        return refused(
            RestoreRefusal::NoTarget,
            format!(
                "annotation {ETCD_RESTORE_ANNOTATION}={}: spec.etcdBackup.target is not set: there is no snapshot to restore from",
                request.snapshot
            ),
        );
    };
    if backup.target.s3.is_none() {
        return refused(
            RestoreRefusal::NoS3Target,
            format!(
                "annotation {ETCD_RESTORE_ANNOTATION}={}: spec.etcdBackup.target.filesystem is this controller's volume, which a new server cannot read: restore it by hand (docs/dr.md), or use an s3 target",
                request.snapshot
            ),
        );
    }
    let why = match &world.etcd {
        EtcdObservation::NotManaged => {
            return refused(
                RestoreRefusal::NotEmbedded,
                format!(
                    "annotation {ETCD_RESTORE_ANNOTATION}={}: spec.externalDatastore is set and no server runs embedded etcd: there is no etcd to restore",
                    request.snapshot
                ),
            );
        }
        EtcdObservation::Observed(snapshot) => {
            let standing = snapshot.assess_cluster();
            let numbers = format!(
                "voters {}, healthy {}, quorum {}",
                standing.voters, standing.healthy, standing.size
            );
            match (standing.has_quorum(), request.force) {
                (false, _) => format!("etcd has lost quorum ({numbers})"),
                (true, true) => format!("forced: etcd still has quorum ({numbers})"),
                (true, false) => {
                    return refused(
                        RestoreRefusal::QuorumHolds,
                        format!(
                            "annotation {ETCD_RESTORE_ANNOTATION}={}: etcd has quorum ({numbers}): a restore would throw away every write since the snapshot; set {ETCD_RESTORE_FORCE_ANNOTATION}=true to restore anyway, or remove the request",
                            request.snapshot
                        ),
                    );
                }
            }
        }
        EtcdObservation::Unreachable { reason } | EtcdObservation::NoCredentials { reason } => {
            if !request.force {
                return refused(
                    RestoreRefusal::EtcdUnknown,
                    format!(
                        "annotation {ETCD_RESTORE_ANNOTATION}={}: etcd could not be read ({reason}), so its loss of quorum cannot be confirmed; set {ETCD_RESTORE_FORCE_ANNOTATION}=true to restore anyway",
                        request.snapshot
                    ),
                );
            }
            format!("forced: etcd could not be read ({reason})")
        }
    };
    Some(RestoreDecision::Step {
        step: RestoreStep::Accept {
            snapshot: request.snapshot.clone(),
            forced: request.force,
            machines: world.machines.iter().map(name).collect(),
        },
        message: format!(
            "restoring from snapshot {} as a person asked: {why}; verifying it in the target before anything is deleted",
            request.snapshot
        ),
    })
}

/// The next step of an accepted attempt.
fn under_way(world: &World, attempt: &Attempt) -> Option<RestoreDecision> {
    let (ours, old): (Vec<&Machine>, Vec<&Machine>) = world
        .machines
        .iter()
        .partition(|m| restores(m).as_ref() == Some(attempt));
    let stray: Vec<String> = old
        .iter()
        .map(|m| name(m))
        .filter(|n| !attempt.machines.contains(n))
        .collect();
    if !stray.is_empty() {
        return refused(
            RestoreRefusal::StaleAcceptance,
            format!(
                "annotation {ETCD_RESTORE_ACCEPTED_ANNOTATION} on {} was written when the Machines were [{}], but {} {} not among them nor restoring this attempt: it is not the acceptance of what is there now (copied or re-applied?); nothing is deleted on it; remove it and {ETCD_RESTORE_ANNOTATION} to start over",
                kcp_label(world),
                attempt.machines.join(", "),
                stray.join(", "),
                if stray.len() == 1 { "is" } else { "are" }
            ),
        );
    }
    // A second restore Machine (a create retried on a stale read) goes too:
    // the oldest one restores.
    let mut live: Vec<&Machine> = ours.iter().copied().filter(|m| !m.is_deleting()).collect();
    live.sort_by_key(|m| (m.metadata.creation_timestamp.clone().map(|t| t.0), name(m)));
    let extra: Vec<&Machine> = live.iter().skip(1).copied().collect();
    let to_retire: Vec<String> = old
        .iter()
        .chain(extra.iter())
        .filter(|m| {
            !m.is_deleting()
                || holds_our_hook(m)
                || !has_annotation(m, EXCLUDE_NODE_DRAINING_ANNOTATION)
                || !has_annotation(m, EXCLUDE_WAIT_FOR_VOLUME_DETACH_ANNOTATION)
        })
        .map(|m| name(m))
        .collect();
    if !to_retire.is_empty() {
        return Some(RestoreDecision::Step {
            message: format!(
                "restore of snapshot {}: deleting the old Machine(s) {} (our hook released: etcd cannot consent, a person asked; drain and volume detach skipped: their workload API went with quorum)",
                attempt.snapshot,
                to_retire.join(", ")
            ),
            step: RestoreStep::RetireMachines {
                machines: to_retire,
            },
        });
    }
    if !old.is_empty() {
        let going: Vec<String> = old
            .iter()
            .map(|m| {
                let hooks = other_hooks(m);
                if hooks.is_empty() {
                    name(m)
                } else {
                    format!("{} (held by {})", name(m), hooks.join(", "))
                }
            })
            .collect();
        return wait(
            RestoreWait::MachinesGoing,
            format!(
                "restore of snapshot {}: waiting for the old Machine(s) {} to be gone before the restoring server starts (none of them may serve its old etcd beside it)",
                attempt.snapshot,
                going.join(", ")
            ),
        );
    }
    let Some(machine) = live.first() else {
        if let Some(going) = ours.first() {
            return wait(
                RestoreWait::RestoreMachineGoing,
                format!(
                    "restore of snapshot {}: restore Machine {} is being deleted before it restored; another is created once it is gone",
                    attempt.snapshot,
                    name(going)
                ),
            );
        }
        return Some(RestoreDecision::Step {
            message: format!(
                "restore of snapshot {}: the old Machines are gone; creating the Machine that restores it (k3s cluster-reset)",
                attempt.snapshot
            ),
            step: RestoreStep::CreateMachine {
                attempt: attempt.clone(),
            },
        });
    };
    let machine_name = name(machine);
    match restored_member(world, machine, attempt) {
        Ok(member) => Some(RestoreDecision::Step {
            message: format!(
                "restore of snapshot {}: member {} on Machine {machine_name} answers alone, a healthy voter holding the snapshot's data",
                attempt.snapshot,
                member.label()
            ),
            step: RestoreStep::Finish {
                attempt: attempt.clone(),
                machine: machine_name,
                member: member.id,
            },
        }),
        Err(why) => {
            let age = machine
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| {
                    format!(
                        " (created {}s ago)",
                        (world.now - crate::api::time::to_chrono(t))
                            .num_seconds()
                            .max(0)
                    )
                })
                .unwrap_or_default();
            wait(
                RestoreWait::RestoredMember,
                format!(
                    "restore of snapshot {}: waiting for Machine {machine_name}{age} to restore it: {why}",
                    attempt.snapshot
                ),
            )
        }
    }
}

/// The restore Machine's member, when etcd shows the restore done.
fn restored_member<'a>(
    world: &'a World,
    machine: &Machine,
    attempt: &Attempt,
) -> Result<&'a crate::etcd::MemberSnapshot, String> {
    let node = machine
        .node_name()
        .ok_or_else(|| "it has no Node yet".to_string())?;
    let snapshot: &MembershipSnapshot = match &world.etcd {
        EtcdObservation::Observed(s) => s,
        EtcdObservation::Unreachable { reason } | EtcdObservation::NoCredentials { reason } => {
            return Err(format!("etcd: {reason}"));
        }
        EtcdObservation::NotManaged => return Err("etcd is not managed".into()),
    };
    let [member] = snapshot.members.as_slice() else {
        let names: Vec<String> = snapshot.members.iter().map(|m| m.label()).collect();
        return Err(format!(
            "etcd lists {} members ({}), not the restored one alone",
            names.len(),
            names.join(", ")
        ));
    };
    if crate::membership::node_of_member_name(&member.name) != Some(node) {
        return Err(format!(
            "the member answering is {}, not one of Node {node}",
            member.label()
        ));
    }
    if let Some(why) = member.unhealthy_reason() {
        return Err(format!("member {} is not healthy: {why}", member.label()));
    }
    let key = attempt.marker_key().unwrap_or_default();
    match &world.restored_data {
        Some(probe) if probe.key == key => match &probe.found {
            Ok(true) => Ok(member),
            Ok(false) => Err(format!(
                "member {} holds no {key}: a fresh start, not yet the snapshot's data",
                member.label()
            )),
            Err(why) => Err(format!("reading {key}: {why}")),
        },
        _ => Err(format!("{key} not read yet")),
    }
}

/// Whether an accepted restore is under way (etcd is then read from the
/// Nodes as they are at each pass: the cluster is being replaced).
pub fn is_under_way(world: &World) -> bool {
    matches!(accepted(world), Some(Ok(_)))
}

/// Whether the observation should read the restored data's marker key:
/// an accepted attempt whose restore Machine exists. `Some(key)` to read.
pub fn marker_to_read(world: &World) -> Option<String> {
    let attempt = accepted(world)?.ok()?;
    world
        .machines
        .iter()
        .any(|m| !m.is_deleting() && restores(m).as_ref() == Some(&attempt))
        .then(|| attempt.marker_key())
        .flatten()
}

/// What acting on a restore step came to, for status.
#[derive(Clone, Debug, PartialEq)]
pub enum RestoreOutcome {
    /// The restore is done: `status.etcdBackup.lastRestore`.
    Finished(RestoreRecord),
    /// The snapshot could not be verified in the target (nothing was
    /// deleted): why, naming the annotation and the target.
    Unusable(String),
}

/// What `status.etcdBackup.lastRestore` becomes once `step` finished.
pub fn record(step: &RestoreStep, now: DateTime<Utc>) -> Option<RestoreRecord> {
    let RestoreStep::Finish {
        attempt,
        machine,
        member,
    } = step
    else {
        return None;
    };
    Some(RestoreRecord {
        snapshot: attempt.snapshot.clone(),
        accepted_at: attempt.accepted_at.clone(),
        completed_at: now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        machine: machine.clone(),
        member: format!("{member:016x}"),
        forced: attempt.forced,
    })
}

/// The `EtcdRestoring` condition: (status, reason, message), or `None` when
/// no restore was ever asked for or done. `unusable`: the snapshot named
/// could not be verified in the target (the acceptance failed).
pub fn condition(
    decision: Option<&RestoreDecision>,
    status: Option<&EtcdBackupStatus>,
    unusable: Option<&str>,
) -> Option<(bool, &'static str, String)> {
    if let Some(message) = unusable {
        return Some((false, REASON_SNAPSHOT_UNUSABLE, message.to_string()));
    }
    let Some(decision) = decision else {
        let last = status.and_then(|s| s.last_restore.as_ref())?;
        return Some((
            false,
            REASON_RESTORED,
            format!(
                "restored from snapshot {} at {} onto Machine {} (member {}){}",
                last.snapshot,
                last.completed_at,
                last.machine,
                last.member,
                if last.forced { ", forced" } else { "" }
            ),
        ));
    };
    let message = decision.message().to_string();
    Some(match decision {
        RestoreDecision::Refused { .. } => (false, REASON_RESTORE_REFUSED, message),
        RestoreDecision::Step {
            step: RestoreStep::Accept { .. },
            ..
        } => (true, REASON_VERIFYING_SNAPSHOT, message),
        RestoreDecision::Step {
            step: RestoreStep::RetireMachines { .. },
            ..
        }
        | RestoreDecision::Wait {
            why: RestoreWait::MachinesGoing,
            ..
        } => (true, REASON_RETIRING_MACHINES, message),
        RestoreDecision::Step { .. } | RestoreDecision::Wait { .. } => {
            (true, REASON_RESTORING_SNAPSHOT, message)
        }
    })
}

/// The condition of [`condition`], stamped.
pub fn to_condition(value: (bool, &'static str, String), generation: Option<i64>) -> Condition {
    Condition {
        type_: ETCD_RESTORING.into(),
        ..super::etcd_backup::to_condition(value, generation)
    }
}

/// Whether `backup` can take a restore at all (for the CLI's early check).
pub fn restorable_target(backup: Option<&EtcdBackup>) -> Result<(), String> {
    match backup {
        None => Err("spec.etcdBackup.target is not set: there is no snapshot to restore from".into()),
        Some(b) if b.target.s3.is_none() => Err(
            "spec.etcdBackup.target.filesystem is this controller's volume, which a new server cannot read: restore it by hand (docs/dr.md)".into(),
        ),
        Some(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;
    use crate::decision::fixtures::{self, WorldBuilder};
    use crate::decision::world::RestoredData;
    use crate::etcd::MemberSnapshot;

    const SNAP: &str = "capi-scheduled-cp-a-1765000000";

    fn s3_backup() -> serde_json::Value {
        json!({"target": {"s3": {"endpoint": "minio:9000", "bucket": "b",
                                   "credentialsSecret": {"name": "keys"}}}})
    }

    const NOON: &str = "2026-12-06T12:00:00Z";
    const REFUSED: &str = "connection refused";

    /// The control plane at noon with `annotations` and `backup` as
    /// `spec.etcdBackup`, etcd not answering.
    fn world(annotations: &[(&str, &str)], backup: serde_json::Value) -> WorldBuilder {
        WorldBuilder::new()
            .at(NOON)
            .with_annotations(annotations)
            .with_backup(backup)
            .etcd_unreachable("dial tcp 10.0.0.1:2379: connection refused")
    }

    /// A restore of SNAP asked for.
    fn asked() -> WorldBuilder {
        world(&[(ETCD_RESTORE_ANNOTATION, SNAP)], s3_backup())
    }

    /// A healthy member `id` named `name` (a Node's, not a numbered server's).
    fn member(id: u64, name: &str) -> MemberSnapshot {
        MemberSnapshot {
            id,
            name: name.into(),
            ..fixtures::member(0)
        }
    }

    fn machine(
        name: &str,
        annotations: &[(&str, &str)],
        deleting: bool,
        node: Option<&str>,
    ) -> Machine {
        let annotations: BTreeMap<&str, &str> = annotations.iter().copied().collect();
        let mut m: Machine = serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": name, "namespace": "ns", "annotations": annotations,
                         "creationTimestamp": "2026-12-06T11:59:00Z"},
            "spec": {"clusterName": "c",
                     "bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "KThreesConfig", "name": name}},
                     "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": name}},
        }))
        .unwrap();
        if deleting {
            m.metadata.deletion_timestamp = m.metadata.creation_timestamp.clone();
        }
        if let Some(node) = node {
            m.status = serde_json::from_value(json!({"nodeRef": {"name": node}})).unwrap();
        }
        m
    }

    /// Accepted while m1, m2, m3 and r0 were there.
    fn attempt() -> Attempt {
        Attempt {
            snapshot: SNAP.into(),
            accepted_at: "2026-12-06T11:58:00Z".into(),
            forced: false,
            machines: ["m1", "m2", "m3", "r0"].map(String::from).to_vec(),
        }
    }

    /// The attempt accepted; no Machine observed.
    fn accepted() -> WorldBuilder {
        world(
            &[(
                ETCD_RESTORE_ACCEPTED_ANNOTATION,
                &attempt().annotation_value(),
            )],
            s3_backup(),
        )
    }

    const HOOK: (&str, &str) = (PRE_TERMINATE_HOOK_ANNOTATION, "k3s-control-plane");
    const DRAIN: (&str, &str) = (EXCLUDE_NODE_DRAINING_ANNOTATION, "true");
    const VOLUMES: (&str, &str) = (EXCLUDE_WAIT_FOR_VOLUME_DETACH_ANNOTATION, "true");

    fn restore_machine(name: &str, deleting: bool, node: Option<&str>) -> Machine {
        let value = attempt().annotation_value();
        machine(
            name,
            &[(ETCD_RESTORE_OF_ANNOTATION, &value)],
            deleting,
            node,
        )
    }

    fn marker(found: Result<bool, String>) -> Option<RestoredData> {
        Some(RestoredData {
            key: format!("{NODE_KEY_PREFIX}cp-a"),
            found,
        })
    }

    /// The rule and the message's telling part, for every situation.
    #[test]
    fn restore_rule_table() {
        // (situation, world, expected rule and a telling part of its message)
        type Case<'a> = (&'a str, World, Option<(&'a str, &'a str)>);
        let cases: Vec<Case> = vec![
            ("nothing_asked", world(&[], s3_backup()).build(), None),
            (
                "quorum_holds_refused_with_the_numbers",
                asked().with_etcd_members(3).build(),
                Some((
                    "restore.refused.quorum-holds",
                    "voters 3, healthy 3, quorum 2",
                )),
            ),
            (
                "quorum_holds_forced",
                asked()
                    .with_annotations(&[(ETCD_RESTORE_FORCE_ANNOTATION, "true")])
                    .with_etcd_members(3)
                    .build(),
                Some((
                    "restore.accept",
                    "forced: etcd still has quorum (voters 3, healthy 3, quorum 2)",
                )),
            ),
            (
                "quorum_lost_accepted",
                asked()
                    .with_etcd_members(3)
                    .with_unhealthy_member("m1", REFUSED)
                    .with_unhealthy_member("m2", REFUSED)
                    .build(),
                Some((
                    "restore.accept",
                    "etcd has lost quorum (voters 3, healthy 1, quorum 2)",
                )),
            ),
            (
                "a_member_without_a_machine_counts",
                // Two healthy of three listed members: quorum holds, though
                // no Machine is left for two of them.
                asked()
                    .with_etcd_members(3)
                    .with_unhealthy_member("m2", REFUSED)
                    .with_machines(vec![machine("m1", &[HOOK], false, Some("cp-1"))])
                    .build(),
                Some((
                    "restore.refused.quorum-holds",
                    "voters 3, healthy 2, quorum 2",
                )),
            ),
            (
                "etcd_unreadable_refused",
                asked().build(),
                Some(("restore.refused.etcd-unknown", "connection refused")),
            ),
            (
                "etcd_unreadable_forced",
                asked()
                    .with_annotations(&[(ETCD_RESTORE_FORCE_ANNOTATION, "true")])
                    .build(),
                Some(("restore.accept", "forced: etcd could not be read")),
            ),
            (
                "no_target",
                world(&[(ETCD_RESTORE_ANNOTATION, SNAP)], json!(null)).build(),
                Some((
                    "restore.refused.no-target",
                    "spec.etcdBackup.target is not set",
                )),
            ),
            (
                "filesystem_target",
                world(
                    &[(ETCD_RESTORE_ANNOTATION, SNAP)],
                    json!({"target": {"filesystem": {"path": "/b"}}}),
                )
                .build(),
                Some((
                    "restore.refused.no-s3-target",
                    "spec.etcdBackup.target.filesystem",
                )),
            ),
            (
                "external_datastore",
                asked()
                    .with_annotations(&[(ETCD_RESTORE_FORCE_ANNOTATION, "true")])
                    .etcd_not_managed()
                    .build(),
                Some(("restore.refused.not-embedded", "spec.externalDatastore")),
            ),
            (
                "a_name_that_would_be_a_flag",
                world(
                    &[(ETCD_RESTORE_ANNOTATION, "--etcd-s3-bucket=x-1")],
                    s3_backup(),
                )
                .build(),
                Some(("restore.refused.invalid-request", "not starting with '-'")),
            ),
            (
                "a_name_with_shell",
                world(
                    &[(ETCD_RESTORE_ANNOTATION, "snap-$(reboot)-1")],
                    s3_backup(),
                )
                .build(),
                Some(("restore.refused.invalid-request", "letters, digits")),
            ),
            (
                "a_name_without_its_node",
                world(&[(ETCD_RESTORE_ANNOTATION, "mine.db")], s3_backup()).build(),
                Some(("restore.refused.invalid-request", "does not name the node")),
            ),
            (
                "a_compressed_snapshot",
                world(
                    &[(ETCD_RESTORE_ANNOTATION, "etcd-snapshot-cp-a-1765000000.zip")],
                    s3_backup(),
                )
                .build(),
                Some(("restore.refused.invalid-request", "compressed")),
            ),
            (
                "force_not_a_bool",
                asked()
                    .with_annotations(&[(ETCD_RESTORE_FORCE_ANNOTATION, "yes")])
                    .build(),
                Some((
                    "restore.refused.invalid-request",
                    ETCD_RESTORE_FORCE_ANNOTATION,
                )),
            ),
            (
                "accepted_annotation_garbled",
                world(
                    &[(ETCD_RESTORE_ACCEPTED_ANNOTATION, "{not json")],
                    s3_backup(),
                )
                .build(),
                Some((
                    "restore.refused.invalid-request",
                    ETCD_RESTORE_ACCEPTED_ANNOTATION,
                )),
            ),
            (
                "accepted_old_machines_live_or_hooked_are_retired",
                accepted()
                    .with_machines(vec![
                        machine("m1", &[HOOK], false, Some("cp-1")),
                        machine("m2", &[HOOK, DRAIN, VOLUMES], true, Some("cp-2")),
                        machine("m3", &[DRAIN, VOLUMES], true, Some("cp-3")),
                    ])
                    .build(),
                Some(("restore.retire-machines", "m1, m2 ")),
            ),
            (
                "accepted_old_machines_going_held_by_another_hook",
                accepted()
                    .with_machines(vec![machine(
                        "m3",
                        &[
                            DRAIN,
                            VOLUMES,
                            (
                                "pre-terminate.delete.hook.machine.cluster.x-k8s.io/backup",
                                "",
                            ),
                        ],
                        true,
                        Some("cp-3"),
                    )])
                    .build(),
                Some((
                    "restore.wait.machines-going",
                    "m3 (held by pre-terminate.delete.hook.machine.cluster.x-k8s.io/backup)",
                )),
            ),
            (
                "an_earlier_attempts_restore_machine_is_old",
                accepted()
                    .with_machines(vec![machine(
                        "r0",
                        &[(
                            ETCD_RESTORE_OF_ANNOTATION,
                            &Attempt {
                                accepted_at: "2026-01-01T00:00:00Z".into(),
                                ..attempt()
                            }
                            .annotation_value(),
                        )],
                        false,
                        Some("r0"),
                    )])
                    .build(),
                Some(("restore.retire-machines", "r0")),
            ),
            (
                "accepted_old_machines_gone_creates_the_restore_machine",
                accepted().build(),
                Some(("restore.create-machine", SNAP)),
            ),
            (
                "restore_machine_deleted_before_it_restored",
                accepted()
                    .with_machines(vec![restore_machine("r1", true, None)])
                    .build(),
                Some(("restore.wait.restore-machine-going", "r1")),
            ),
            (
                "restore_machine_booting",
                accepted()
                    .with_machines(vec![restore_machine("r1", false, None)])
                    .build(),
                Some((
                    "restore.wait.restored-member",
                    "r1 (created 60s ago) to restore it: it has no Node yet",
                )),
            ),
            (
                "a_reapplied_acceptance_deletes_nothing",
                // Machines made after the acceptance was written (a copy of
                // the annotation applied again later): not this attempt's.
                accepted()
                    .with_etcd_members(3)
                    .with_machines(vec![
                        machine("m1", &[HOOK], false, Some("cp-1")),
                        machine("n7", &[HOOK], false, Some("cp-7")),
                    ])
                    .build(),
                Some((
                    "restore.refused.stale-acceptance",
                    "but n7 is not among them nor restoring this attempt",
                )),
            ),
            (
                "a_second_restore_machine_goes",
                accepted()
                    .with_machines(vec![restore_machine("r1", false, None), {
                        let mut m = restore_machine("r2", false, None);
                        m.metadata.creation_timestamp =
                            serde_json::from_value(json!("2026-12-06T11:59:30Z")).unwrap();
                        m
                    }])
                    .build(),
                Some(("restore.retire-machines", "r2 ")),
            ),
            (
                "restored_member_alone_with_the_snapshots_data",
                accepted()
                    .with_member(member(1, "r1-0a0b0c0d"))
                    .with_machines(vec![restore_machine("r1", false, Some("r1"))])
                    .edit(|w| w.restored_data = marker(Ok(true)))
                    .build(),
                Some(("restore.finish", "r1-0a0b0c0d on Machine r1 answers alone")),
            ),
            (
                "a_fresh_first_start_is_not_the_restore",
                accepted()
                    .with_member(member(1, "r1-0a0b0c0d"))
                    .with_machines(vec![restore_machine("r1", false, Some("r1"))])
                    .edit(|w| w.restored_data = marker(Ok(false)))
                    .build(),
                Some((
                    "restore.wait.restored-member",
                    "holds no /registry/minions/cp-a",
                )),
            ),
            (
                "the_marker_not_read",
                accepted()
                    .with_member(member(1, "r1-0a0b0c0d"))
                    .with_machines(vec![restore_machine("r1", false, Some("r1"))])
                    .build(),
                Some(("restore.wait.restored-member", "not read yet")),
            ),
            (
                "old_members_still_listed",
                accepted()
                    .with_etcd_members(3)
                    .with_unhealthy_member("m1", REFUSED)
                    .with_unhealthy_member("m2", REFUSED)
                    .with_machines(vec![restore_machine("r1", false, Some("r1"))])
                    .edit(|w| w.restored_data = marker(Ok(true)))
                    .build(),
                Some(("restore.wait.restored-member", "lists 3 members")),
            ),
            (
                "another_nodes_member",
                accepted()
                    .with_member(member(1, "cp-1-00000001"))
                    .with_machines(vec![restore_machine("r1", false, Some("r1"))])
                    .edit(|w| w.restored_data = marker(Ok(true)))
                    .build(),
                Some(("restore.wait.restored-member", "not one of Node r1")),
            ),
        ];
        for (name, w, expected) in cases {
            let got = decide_restore(&w);
            match (expected, &got) {
                (None, None) => {}
                (Some((rule, part)), Some(d)) => {
                    assert_eq!(d.rule(), rule, "{name}: {}", d.message());
                    assert!(
                        d.message().contains(part),
                        "{name}: {:?} lacks {part:?}",
                        d.message()
                    );
                }
                (expected, got) => panic!("{name}: expected {expected:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn each_step_carries_what_the_controller_needs() {
        let w = asked()
            .with_etcd_members(3)
            .with_unhealthy_member("m1", REFUSED)
            .with_unhealthy_member("m2", REFUSED)
            .with_machines(vec![
                machine("m1", &[HOOK], false, Some("cp-1")),
                machine("m2", &[HOOK], true, Some("cp-2")),
            ])
            .build();
        let Some(RestoreDecision::Step { step, .. }) = decide_restore(&w) else {
            panic!("an acceptance")
        };
        // The acceptance records every Machine there, deleting ones too:
        // the only ones the attempt may retire.
        assert_eq!(
            step,
            RestoreStep::Accept {
                snapshot: SNAP.into(),
                forced: false,
                machines: vec!["m1".into(), "m2".into()],
            }
        );
        let w = accepted()
            .with_member(member(0xab, "r1-0a0b0c0d"))
            .with_machines(vec![restore_machine("r1", false, Some("r1"))])
            .edit(|w| w.restored_data = marker(Ok(true)))
            .build();
        let Some(RestoreDecision::Step { step, .. }) = decide_restore(&w) else {
            panic!("a step")
        };
        assert_eq!(
            step,
            RestoreStep::Finish {
                attempt: attempt(),
                machine: "r1".into(),
                member: 0xab
            }
        );
        let record = record(&step, w.now).unwrap();
        assert_eq!(record.member, "00000000000000ab");
        assert_eq!(record.completed_at, "2026-12-06T12:00:00Z");
        assert_eq!(record.accepted_at, attempt().accepted_at);
        // Only while a restore Machine is waited for is the marker read.
        assert_eq!(
            marker_to_read(&w).as_deref(),
            Some("/registry/minions/cp-a")
        );
        assert_eq!(marker_to_read(&accepted().build()), None);
        assert_eq!(marker_to_read(&asked().build()), None);
    }

    #[test]
    fn snapshot_names_tell_their_node() {
        for (name, node) in [
            ("capi-before-removal-cp-0-1765000000", Ok("cp-0")),
            ("etcd-snapshot-server-1-1765000000", Ok("server-1")),
            ("on-demand-my.node-1765000000", Ok("my.node")),
            ("nightly-cp-0-1765000000", Err("does not name the node")),
            ("cp-0", Err("does not name the node")),
            ("", Err("not a snapshot name")),
            (".hidden-cp-0-1", Err("not starting with")),
            ("a/b-cp-0-1", Err("letters, digits")),
        ] {
            match (snapshot_node(name), node) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{name}"),
                (Err(got), Err(part)) => assert!(got.contains(part), "{name}: {got}"),
                (got, want) => panic!("{name}: {got:?} vs {want:?}"),
            }
        }
    }

    #[test]
    fn the_condition_follows_the_restore() {
        let last = EtcdBackupStatus {
            last_restore: Some(RestoreRecord {
                snapshot: SNAP.into(),
                accepted_at: "a".into(),
                completed_at: "2026-12-06T12:00:00Z".into(),
                machine: "r1".into(),
                member: "00000000000000ab".into(),
                forced: true,
            }),
            ..EtcdBackupStatus::default()
        };
        let step = |step: RestoreStep| RestoreDecision::Step {
            step,
            message: "m".into(),
        };
        // (situation, the rule's verdict, status, an unusable snapshot's
        // message, expected (status, reason))
        type Case<'a> = (
            &'a str,
            Option<RestoreDecision>,
            Option<&'a EtcdBackupStatus>,
            Option<&'a str>,
            Option<(bool, &'a str)>,
        );
        let cases: Vec<Case> = vec![
            ("never_asked", None, None, None, None),
            (
                "done_before",
                None,
                Some(&last),
                None,
                Some((false, REASON_RESTORED)),
            ),
            (
                "refused",
                Some(RestoreDecision::Refused {
                    why: RestoreRefusal::QuorumHolds,
                    message: "m".into(),
                }),
                Some(&last),
                None,
                Some((false, REASON_RESTORE_REFUSED)),
            ),
            (
                "verifying",
                Some(step(RestoreStep::Accept {
                    snapshot: SNAP.into(),
                    forced: false,
                    machines: vec![],
                })),
                None,
                None,
                Some((true, REASON_VERIFYING_SNAPSHOT)),
            ),
            (
                "unusable",
                Some(step(RestoreStep::Accept {
                    snapshot: SNAP.into(),
                    forced: false,
                    machines: vec![],
                })),
                None,
                Some("not found"),
                Some((false, REASON_SNAPSHOT_UNUSABLE)),
            ),
            (
                "retiring",
                Some(step(RestoreStep::RetireMachines { machines: vec![] })),
                None,
                None,
                Some((true, REASON_RETIRING_MACHINES)),
            ),
            (
                "old_ones_going",
                Some(RestoreDecision::Wait {
                    why: RestoreWait::MachinesGoing,
                    message: "m".into(),
                }),
                None,
                None,
                Some((true, REASON_RETIRING_MACHINES)),
            ),
            (
                "creating",
                Some(step(RestoreStep::CreateMachine { attempt: attempt() })),
                None,
                None,
                Some((true, REASON_RESTORING_SNAPSHOT)),
            ),
            (
                "waiting_for_the_member",
                Some(RestoreDecision::Wait {
                    why: RestoreWait::RestoredMember,
                    message: "m".into(),
                }),
                None,
                None,
                Some((true, REASON_RESTORING_SNAPSHOT)),
            ),
        ];
        for (name, decision, status, unusable, expected) in cases {
            let got = condition(decision.as_ref(), status, unusable);
            assert_eq!(
                got.as_ref().map(|(ok, reason, _)| (*ok, *reason)),
                expected,
                "{name}: {got:?}"
            );
        }
        let done = condition(None, Some(&last), None).unwrap().2;
        assert_eq!(
            done,
            format!(
                "restored from snapshot {SNAP} at 2026-12-06T12:00:00Z onto Machine r1 (member 00000000000000ab), forced"
            )
        );
    }
}
