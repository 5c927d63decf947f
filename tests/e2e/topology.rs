//! A control plane made from a ClusterClass, on real etcd: the simulated
//! topology controller (`harness::topology_sim`, which follows CAPI's
//! `exp/topology/desiredstate`) creates the KThreesControlPlane from the
//! template and the Cluster's topology; it comes up; a change of
//! `Cluster.spec.topology.version` rolls it out; while a topology version
//! waits to be carried to the control plane, an unhealthy Machine is not
//! remediated (KCP's rule), and once it is not pending it is; our controller
//! never writes the spec the topology owns (`metadata.generation` moves only
//! with the topology's writes).

use crate::support;

use std::time::Duration;

use k3s_control_plane::api::names::{CLUSTER_NAME_LABEL, REMEDIATION_FOR_ANNOTATION};
use k3s_control_plane::api::{Cluster, KThreesControlPlane, Machine};
use k3s_control_plane::harness::bringup::BringUp;
use k3s_control_plane::harness::sandbox::{CLUSTER, KCP, NAMESPACE, Sandbox, VERSION};
use k3s_control_plane::harness::topology_sim::TOPOLOGY_OWNED_LABEL;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use support::{LIMIT, all_ready, drive, init_logs, machines, owner_remediated};

const NEW_VERSION: &str = "v1.31.4+k3s1";
const NEXT_VERSION: &str = "v1.32.1+k3s1";

async fn kcp_when(
    sandbox: &Sandbox,
    what: &str,
    ok: impl Fn(&KThreesControlPlane) -> bool,
) -> KThreesControlPlane {
    sandbox
        .wait_for(what, LIMIT * 3, || async {
            let kcp = sandbox
                .kcp_api()
                .get(KCP)
                .await
                .map_err(|e| e.to_string())?;
            if ok(&kcp) {
                Ok(kcp)
            } else {
                Err(format!("{:?}", kcp.status))
            }
        })
        .await
        .unwrap()
}

async fn set_topology_version(sandbox: &Sandbox, version: &str) {
    let clusters: Api<Cluster> = Api::namespaced(sandbox.client(), NAMESPACE);
    clusters
        .patch(
            CLUSTER,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"topology": {"version": version}}})),
        )
        .await
        .unwrap();
}

fn rolled_out(version: &'static str) -> impl Fn(&[Machine], (usize, usize)) -> bool {
    move |all, ready| {
        all_ready(3)(all, ready)
            && all
                .iter()
                .all(|m| m.spec.version.as_deref() == Some(version))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_class_control_plane_comes_up_follows_the_topology_version_and_is_remediated() {
    init_logs();
    let (world, topology) = BringUp::start_from_topology(
        3,
        json!({
            "kthreesConfigSpec": {"serverConfig": {"disableComponents": ["traefik"]}},
            "remediation": {"minHealthyPeriodSeconds": 3600},
            "machineTemplate": {"spec": {"deletion": {"nodeDrainTimeoutSeconds": 30}}},
        }),
    )
    .await
    .unwrap();

    // The topology made the control plane, in the v1beta2 contract's shape.
    let made = {
        let kcps = world.kcp_api();
        let deadline = tokio::time::Instant::now() + LIMIT;
        loop {
            if let Some(kcp) = kcps.get_opt(KCP).await.unwrap() {
                break kcp;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the topology made no control plane"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    assert_eq!(made.spec.version, VERSION);
    assert_eq!(made.spec.replicas, Some(3));
    let infra = made
        .infrastructure_ref()
        .expect("the topology's infrastructure reference");
    assert_eq!(
        (infra.api_group.as_str(), infra.kind.as_str()),
        ("infrastructure.cluster.x-k8s.io", "DockerMachineTemplate")
    );
    assert_eq!(
        made.spec
            .machine_template
            .spec
            .deletion
            .node_drain_timeout_seconds,
        Some(30)
    );
    assert_eq!(
        made.labels().get(CLUSTER_NAME_LABEL).map(String::as_str),
        Some(CLUSTER)
    );
    assert!(made.labels().contains_key(TOPOLOGY_OWNED_LABEL));
    let generation = made.metadata.generation;

    // It comes up, one server at a time.
    let controller = world.start_controller();
    let first = world.wait_first_machine(LIMIT).await.unwrap();
    let mut sandbox = world.boot_first(&first).await.unwrap();
    drive(&mut sandbox, "bring-up from the topology", all_ready(3)).await;
    for machine in machines(&sandbox).await {
        assert_eq!(
            machine.labels().get("topology-label").map(String::as_str),
            Some("from-cluster"),
            "{}: the topology's control-plane metadata reaches the Machines",
            machine.name_any()
        );
    }
    let kcp = kcp_when(&sandbox, "status.version", |k| {
        k.status.as_ref().and_then(|s| s.version.as_deref()) == Some(VERSION)
    })
    .await;
    assert_eq!(
        kcp.metadata.generation, generation,
        "the spec changed while only our controller ran: it must not write the topology's fields"
    );

    // A topology version change: the topology carries it over once the
    // control plane is stable, and the Machines roll.
    set_topology_version(&sandbox, NEW_VERSION).await;
    drive(&mut sandbox, "topology upgrade", rolled_out(NEW_VERSION)).await;
    let kcp = kcp_when(&sandbox, "status.version at the new version", |k| {
        k.status.as_ref().and_then(|s| s.version.as_deref()) == Some(NEW_VERSION)
    })
    .await;
    assert_eq!(kcp.spec.version, NEW_VERSION);

    // The topology asks for the next version but does not carry it over yet
    // (paused, as when it waits on a hook): an unhealthy Machine waits.
    topology.pause();
    set_topology_version(&sandbox, NEXT_VERSION).await;
    let target = machines(&sandbox).await[0].name_any();
    sandbox.mark_unhealthy(&target).await.unwrap();
    let message = sandbox
        .wait_for("remediation to wait for the topology", LIMIT, || async {
            let m = sandbox
                .machines_api()
                .get(&target)
                .await
                .map_err(|e| e.to_string())?;
            match owner_remediated(&m) {
                Some((_, message)) if message.contains("propagated from Cluster.spec.topology") => {
                    Ok(message)
                }
                other => Err(format!("OwnerRemediated is {other:?}")),
            }
        })
        .await
        .unwrap();
    assert!(message.contains(NEXT_VERSION), "{message}");
    let deletions = machines(&sandbox)
        .await
        .iter()
        .filter(|m| m.is_deleting())
        .count();
    assert_eq!(
        deletions, 0,
        "nothing is removed while the topology upgrade is pending"
    );

    // Back to the version the control plane has: nothing is pending, the
    // Machine is remediated (its member removed first, a replacement made).
    set_topology_version(&sandbox, NEW_VERSION).await;
    topology.resume();
    drive(
        &mut sandbox,
        "remediation after the topology settled",
        |all, ready| all_ready(3)(all, ready) && !all.iter().any(|m| m.name_any() == target),
    )
    .await;
    let replacement = machines(&sandbox)
        .await
        .into_iter()
        .find(|m| {
            m.annotations()
                .get(REMEDIATION_FOR_ANNOTATION)
                .is_some_and(|r| r.contains(&target))
        })
        .expect("a replacement recording what it remediated");
    assert_eq!(replacement.spec.version.as_deref(), Some(NEW_VERSION));
    drop(topology);
    controller.stop().await;
}
