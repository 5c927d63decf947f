//! Status: what the KThreesControlPlane reports after a reconcile, computed
//! from the world and the decision ([`kcp_status`]); each condition's rule is
//! in [`super::conditions`]. Pure; the controller writes it
//! (`controller::status`).

use crate::api::condition_names::ETCD_SPACE_HEALTHY;
use crate::api::conditions;
use crate::api::kcp::{
    ControlPlaneInitializationStatus, EtcdQuorumStatus, KThreesControlPlaneStatus,
};
use crate::api::names::{CLUSTER_NAME_LABEL, CONTROL_PLANE_LABEL};
use crate::etcd::MembershipSnapshot;

use super::conditions::contract::contract_conditions;
use super::conditions::etcd::{EtcdClusterNotes, etcd_cluster_healthy, etcd_space_healthy};
use super::conditions::lifecycle::paused;
use super::conditions::remediation::remediating;
use super::conditions::spec_valid::spec_valid;
use super::conditions::v1beta1::v1beta1_mirror;
use super::plan::{Plan, Refusal};
use super::replicas::Replicas;
use super::world::World;
use crate::lifecycle::Lifecycle;

/// The KThreesControlPlane's status after this reconcile. `plan` is `None`
/// when the lifecycle stopped the reconcile before remediation and scaling
/// (deletion, secrets, mixed management, waiting for the Cluster), and `Err`
/// when the reconcile refused to decide (then conditions say why).
pub fn kcp_status(
    world: &World,
    lifecycle: &Lifecycle,
    plan: Option<std::result::Result<&Plan, &Refusal>>,
    counts: &Replicas,
    space: Option<&super::etcd_space::EtcdSpace>,
) -> KThreesControlPlaneStatus {
    let kcp = &world.kcp;
    let generation = kcp.metadata.generation;
    let mut status = kcp.status.clone().unwrap_or_default();
    // Only what was read this reconcile: a margin kept from an earlier read
    // would look healthy while nobody knows.
    status.etcd = etcd_status(world);
    if let Lifecycle::Paused { .. } = lifecycle {
        // Paused: nothing is reconciled, only the Paused condition is written.
        conditions::set(
            &mut status.conditions,
            paused(lifecycle).to_condition(generation),
        );
        return status;
    }
    let machines = &world.machines;
    status.replicas = machines.len() as i32;
    status.ready_replicas = counts.ready;
    status.available_replicas = Some(counts.available);
    status.up_to_date_replicas = Some(counts.up_to_date);
    status.updated_replicas = counts.up_to_date;
    status.unavailable_replicas = (status.replicas - counts.available).max(0);
    // The lowest version running: Machines that have a Node.
    status.version = machines
        .iter()
        .filter(|m| m.node_name().is_some())
        .filter_map(|m| m.spec.version.clone())
        .min_by(|a, b| compare_versions(a, b));
    if let Some(cluster) = &world.cluster_name {
        status.selector = format!("{CLUSTER_NAME_LABEL}={cluster},{CONTROL_PLANE_LABEL}");
    }
    // Initialized once a first server joined and its API answered; it never goes back.
    let initialized = world.control_plane_initialized();
    status.initialized = initialized;
    status.initialization = Some(ControlPlaneInitializationStatus {
        control_plane_initialized: Some(initialized),
    });
    status.ready = initialized && counts.ready > 0;
    status.observed_generation = generation;

    let conds = &mut status.conditions;
    conditions::set(conds, spec_valid(plan).to_condition(generation));
    let ok_plan = plan.and_then(|p| p.ok());
    conditions::set(
        conds,
        etcd_cluster_healthy(&world.etcd, &EtcdClusterNotes::of(world, ok_plan))
            .to_condition(generation),
    );
    match etcd_space_healthy(
        world.etcd_space.care,
        space.and_then(|s| s.decision.as_ref()),
    ) {
        Some(value) => {
            conditions::set(conds, value.to_condition(generation));
        }
        None => {
            conditions::remove(conds, ETCD_SPACE_HEALTHY);
        }
    }
    if let Some(value) = remediating(lifecycle, plan) {
        conditions::set(conds, value.to_condition(generation));
    }
    for value in contract_conditions(world, lifecycle, ok_plan, counts) {
        conditions::set(conds, value.to_condition(generation));
    }
    let mirror = v1beta1_mirror(conds);
    let deprecated = status
        .deprecated
        .get_or_insert_with(Default::default)
        .v1beta1
        .get_or_insert_with(Default::default);
    for c in mirror {
        conditions::set_v1beta1(&mut deprecated.conditions, c);
    }
    deprecated.ready_replicas = Some(counts.ready);
    deprecated.updated_replicas = Some(counts.up_to_date);
    deprecated.unavailable_replicas = Some((status.replicas - counts.ready).max(0));
    status
}

/// `status.etcd` of this observation: the membership's quorum arithmetic,
/// or `None` when etcd was not read (or not ours).
pub fn etcd_status(world: &World) -> Option<EtcdQuorumStatus> {
    world.snapshot().map(etcd_quorum_status)
}

/// The quorum numbers of `snapshot` as it stands, from the same rule every
/// decision uses ([`MembershipSnapshot::assess_cluster`]).
pub fn etcd_quorum_status(snapshot: &MembershipSnapshot) -> EtcdQuorumStatus {
    let a = snapshot.assess_cluster();
    let n = |v: usize| i32::try_from(v).unwrap_or(i32::MAX);
    EtcdQuorumStatus {
        members: n(snapshot.members.len()),
        voters: n(a.voters),
        healthy_voters: n(a.healthy),
        quorum: n(a.size),
        quorum_margin: n(a.healthy) - n(a.size),
        voter_health: format!("{}/{}", a.healthy, a.voters),
    }
}

/// Compare k3s versions numerically (`v1.30.10+k3s1` > `v1.30.2+k3s2`).
pub fn compare_versions(a: &str, b: &str) -> std::cmp::Ordering {
    let key = |v: &str| -> Vec<u64> {
        v.trim_start_matches('v')
            .split(|c: char| !c.is_ascii_digit())
            .filter(|p| !p.is_empty())
            .map(|p| p.parse().unwrap_or(0))
            .collect()
    };
    key(a).cmp(&key(b))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::api::condition_names::ETCD_CLUSTER_HEALTHY;
    use crate::decision::fixtures::WorldBuilder;
    use crate::decision::world::EtcdObservation;
    use crate::lifecycle::plan_secrets;

    /// What an earlier reconcile wrote: 3 of 3 healthy.
    fn written_before() -> WorldBuilder {
        WorldBuilder::new().with_status(json!({"etcd": {
            "members": 3, "voters": 3, "healthyVoters": 3, "quorum": 2,
            "quorumMargin": 1, "voterHealth": "3/3"}}))
    }

    fn status_of(world: &World) -> KThreesControlPlaneStatus {
        let lifecycle = Lifecycle::Proceed {
            secrets: plan_secrets(&world.secrets),
        };
        let counts = crate::decision::replicas::replicas(
            world,
            &crate::rollout::outdated_machines(
                &crate::rollout::desired(&world.kcp),
                &world.machines,
                &Default::default(),
                world.now,
            ),
        );
        kcp_status(world, &lifecycle, None, &counts, None)
    }

    #[test]
    fn etcd_status_is_the_quorum_of_the_membership_read_now() {
        let w = written_before()
            .with_healthy_servers(3)
            .with_unhealthy_member("m2", "connection refused")
            .build();
        let etcd = status_of(&w).etcd.expect("etcd was read");
        assert_eq!(
            etcd,
            EtcdQuorumStatus {
                members: 3,
                voters: 3,
                healthy_voters: 2,
                quorum: 2,
                quorum_margin: 0,
                voter_health: "2/3".into(),
            }
        );
        // Quorum lost: the margin goes negative (fault tolerance stays 0).
        let w = written_before()
            .with_healthy_servers(3)
            .with_unhealthy_member("m1", "timeout")
            .with_unhealthy_member("m2", "connection refused")
            .build();
        assert_eq!(status_of(&w).etcd.unwrap().quorum_margin, -1);
        // A learner is a member, not a voter.
        let w = written_before()
            .with_healthy_servers(2)
            .with_learner("m1")
            .build();
        let etcd = status_of(&w).etcd.unwrap();
        assert_eq!((etcd.members, etcd.voters, etcd.quorum_margin), (2, 1, 0));
    }

    #[test]
    fn etcd_status_is_absent_not_stale_when_etcd_is_not_read() {
        for etcd in [
            EtcdObservation::Unreachable {
                reason: "connection refused".into(),
            },
            EtcdObservation::NoCredentials {
                reason: "Secret ns/c-etcd not found".into(),
            },
            EtcdObservation::NotManaged,
        ] {
            let w = written_before().with_etcd(etcd.clone()).build();
            let status = status_of(&w);
            assert_eq!(status.etcd, None, "{etcd:?}");
            // The condition says why.
            let c = status
                .conditions
                .iter()
                .find(|c| c.type_ == ETCD_CLUSTER_HEALTHY)
                .unwrap();
            assert_eq!(c.status, "Unknown", "{etcd:?}");
        }
        // Paused: nothing is read, so nothing is claimed.
        let w = written_before().build();
        let paused = kcp_status(
            &w,
            &Lifecycle::Paused {
                by: "the Cluster".into(),
            },
            None,
            &crate::decision::replicas::replicas(
                &w,
                &crate::rollout::outdated_machines(
                    &crate::rollout::desired(&w.kcp),
                    &w.machines,
                    &Default::default(),
                    w.now,
                ),
            ),
            None,
        );
        assert_eq!(paused.etcd, None);
    }
}
