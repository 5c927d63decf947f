//! etcd space in the decision record: each member's sizes against its quota,
//! and, with `run --etcd-space-care`, the space rule's verdict
//! ([`crate::space_rule::decide_space`]) on this world. Pure.

use serde::Serialize;

use crate::api::names::ETCD_QUOTA_ANNOTATION;
use crate::space_rule::{ClusterSpace, ConfiguredQuota, SpaceDecision, Thresholds, parse_quota};

use super::world::World;

/// What the record says of etcd's space.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdSpace {
    /// The quota of members that do not report theirs.
    pub quota: ConfiguredQuota,
    pub thresholds: Thresholds,
    /// Every member's sizes, quota and health apart from NOSPACE.
    pub cluster: ClusterSpace,
    /// The rule's verdict, with `run --etcd-space-care`; `None` without.
    pub decision: Option<SpaceDecision>,
}

/// The quota of `world`'s members that do not report theirs: the control
/// plane's annotation, else `run --etcd-quota-backend-bytes`.
pub fn configured_quota(world: &World) -> ConfiguredQuota {
    let annotations = world.kcp.metadata.annotations.as_ref();
    match annotations.and_then(|a| a.get(ETCD_QUOTA_ANNOTATION)) {
        None => ConfiguredQuota::Default(world.etcd_space.default_quota),
        Some(value) => match parse_quota(value) {
            Ok(bytes) => ConfiguredQuota::Annotation(bytes),
            Err(why) => ConfiguredQuota::Invalid(format!(
                "annotation {ETCD_QUOTA_ANNOTATION} on KThreesControlPlane {}/{}: {why}",
                world.kcp.metadata.namespace.as_deref().unwrap_or_default(),
                world.kcp.metadata.name.as_deref().unwrap_or_default()
            )),
        },
    }
}

/// A membership change the management side shows: a Machine being deleted,
/// a recorded remediation, a Machine whose Node has not joined yet.
fn management_change(world: &World) -> Option<String> {
    let name = |m: &crate::api::Machine| m.metadata.name.clone().unwrap_or_default();
    if let Some(m) = world.machines.iter().find(|m| m.is_deleting()) {
        return Some(format!("Machine {} is being deleted", name(m)));
    }
    if world
        .kcp
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(crate::api::names::REMEDIATION_IN_PROGRESS_ANNOTATION))
    {
        return Some("a remediation is in progress".into());
    }
    world
        .machines
        .iter()
        .find(|m| m.node_name().is_none())
        .map(|m| {
            format!(
                "Machine {} has no Node yet (its server is joining)",
                name(m)
            )
        })
}

/// `snapshot` as the space rule sees it, each member marked measured when
/// its revision is still the one it reported right after our last
/// defragmentation of it (nothing written since) and no compaction came
/// after it.
fn cluster_space(
    world: &World,
    snapshot: &crate::etcd::MembershipSnapshot,
    quota: &ConfiguredQuota,
) -> ClusterSpace {
    let mut cluster = snapshot.space(quota);
    let history = match &world.etcd_history {
        Some(Ok(h)) => Some(h),
        _ => None,
    };
    for (space, member) in cluster.members.iter_mut().zip(&snapshot.members) {
        space.measured = match (world.etcd_defragmented.get(&member.id), &member.status) {
            (Some(done), Some(status)) => done.still_measures(status.revision, history),
            _ => false,
        };
    }
    cluster
}

/// The space of `world`'s etcd, when it was observed.
pub fn etcd_space(world: &World) -> Option<EtcdSpace> {
    let snapshot = world.snapshot()?;
    let quota = configured_quota(world);
    let mut cluster = cluster_space(world, snapshot, &quota);
    cluster.history = world.etcd_history.clone();
    if cluster.busy.is_none() {
        cluster.busy = management_change(world);
    }
    let thresholds = world.etcd_space.thresholds;
    let decision = world
        .etcd_space
        .care
        .then(|| crate::space_rule::decide_space(&cluster, &thresholds));
    Some(EtcdSpace {
        quota,
        thresholds,
        cluster,
        decision,
    })
}

/// Whether the rule needs to know if the history is compacted: with space
/// care on, under NOSPACE, a member over its limit holds more in use than
/// its limit, or our defragmentation left it over (so only a compaction can
/// bring it under). Observation reads it then, and only then.
pub fn needs_history(world: &World) -> bool {
    if !world.etcd_space.care {
        return false;
    }
    let Some(snapshot) = world.snapshot() else {
        return false;
    };
    let cluster = cluster_space(world, snapshot, &configured_quota(world));
    let t = &world.etcd_space.thresholds;
    cluster.nospace
        && cluster.members.iter().any(|m| match (m.sizes, m.limit(t)) {
            (Some(s), Some(limit)) => s.db_size > limit && (s.in_use > limit || m.measured),
            _ => false,
        })
}
