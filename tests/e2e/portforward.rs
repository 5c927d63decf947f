//! End to end through port-forward: the Nodes' InternalIPs are not reachable
//! (the real etcd members advertise them, and their certificates carry them, but
//! nothing listens there), so the controller can reach etcd only through the
//! workload API server's `pods/portforward` to the `etcd-proxy` pod on each
//! member's node, with TLS verified against the node address. Also: `auto`
//! falls back and says so, a missing proxy pod is named and nothing is removed,
//! and the figures of port-forward against direct on one cluster.

use crate::support;

use std::time::Instant;

use k3s_control_plane::api::names::{ETCD_PROXY_NAMESPACE, ETCD_TRANSPORT_ANNOTATION};
use k3s_control_plane::etcd::{EtcdCluster, Timeouts, Transport};
use k3s_control_plane::harness::EtcdTestCluster;
use k3s_control_plane::harness::sandbox::Sandbox;
use k3s_control_plane::workload::portforward::PortForwardRelay;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use support::*;

async fn unreachable_sandbox() -> Sandbox {
    let sandbox = Sandbox::start_with(
        EtcdTestCluster::builder()
            .members(3)
            .unreachable_client_addresses(),
        3,
    )
    .await
    .unwrap();
    for m in sandbox.etcd.members() {
        let addr = std::net::SocketAddr::from((m.ip, 2379));
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "{addr} must not answer: the test is about unreachable node addresses"
        );
    }
    sandbox
}

async fn proxy_pod(sandbox: &Sandbox, node: &str) -> String {
    sandbox.etcd_proxy_pod(node).await.unwrap()
}

async fn tunnels(sandbox: &Sandbox) -> u64 {
    let mut opened = 0;
    for m in sandbox.etcd.members() {
        let pod = proxy_pod(sandbox, &m.node_name).await;
        opened += sandbox
            .workload
            .port_forwards_opened(ETCD_PROXY_NAMESPACE, &pod);
    }
    opened
}

/// Every message of the KThreesControlPlane's conditions, joined.
async fn kcp_condition_text(sandbox: &Sandbox) -> String {
    let kcp = kcp(sandbox).await;
    serde_json::to_string(&kcp.status.map(|s| s.conditions)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_unreachable_node_addresses_auto_falls_back_and_remediation_runs_through_port_forward()
{
    init_logs();
    let sandbox = unreachable_sandbox().await;
    let admin = sandbox.etcd.connect();
    let before = admin.snapshot().await.unwrap();
    let leader_id = before.leader.expect("a leader");
    let leader_index = sandbox.etcd.index_of(leader_id).unwrap();
    let target = sandbox.machines[leader_index].clone();
    let target_member = sandbox.etcd.member(leader_index).name.clone();
    assert_eq!(tunnels(&sandbox).await, 0);

    // Default settings: --etcd-transport auto.
    let controller = sandbox.start_controller();
    let said = sandbox
        .wait_for("the condition to say auto fell back", LIMIT, || async {
            let text = kcp_condition_text(&sandbox).await;
            if text.contains("reached by port-forward (auto: direct could not connect") {
                Ok(text)
            } else {
                Err(text)
            }
        })
        .await
        .unwrap();
    // Direct failed for want of a connection, named by the node address.
    let m0 = sandbox.etcd.member(0).ip.to_string();
    assert!(said.contains("unreachable"), "{said}");
    assert!(
        sandbox
            .etcd
            .members()
            .iter()
            .any(|m| said.contains(&m.ip.to_string()))
            || said.contains(&m0),
        "{said}"
    );
    let opened_before = tunnels(&sandbox).await;
    assert!(opened_before > 0, "the proxies were used");

    sandbox.mark_unhealthy(&target).await.unwrap();
    let after = sandbox
        .wait_for("the target's member to be removed", LIMIT, || async {
            let snap = admin.snapshot().await.map_err(|e| e.to_string())?;
            if snap.member_by_name(&target_member).is_some() {
                return Err(format!("{target_member} still a member"));
            }
            Ok(snap)
        })
        .await
        .unwrap();
    assert_eq!(after.members.len(), 2);
    assert_ne!(after.leader, Some(leader_id), "leadership moved first");
    sandbox
        .wait_for("the Machine to be replaced", LIMIT, || async {
            let all = machines(&sandbox).await;
            if all.iter().any(|m| m.name_any() == target) {
                return Err(format!("{target} still exists"));
            }
            all.into_iter()
                .find(|m| !sandbox.machines.contains(&m.name_any()))
                .ok_or_else(|| "no replacement yet".to_string())
        })
        .await
        .unwrap();
    // Every tunnel went through the proxy pods; the pool reused connections
    // (not one tunnel per request).
    let pool_tunnels = controller.ctx.etcd.tunnels_opened();
    assert!(pool_tunnels > 0);
    assert_eq!(
        pool_tunnels,
        tunnels(&sandbox).await,
        "every tunnel is the pool's"
    );
    assert!(
        pool_tunnels < reconciles(&controller.ctx) * 3,
        "{pool_tunnels} tunnels for {} reconciles: connections are pooled",
        reconciles(&controller.ctx)
    );
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_proxy_pod_is_named_with_its_node_and_selector_and_nothing_is_removed() {
    init_logs();
    let sandbox = unreachable_sandbox().await;
    let admin = sandbox.etcd.connect();
    let before = admin.snapshot().await.unwrap();
    // Forced by the annotation (no auto detour).
    annotate_kcp(
        &sandbox,
        serde_json::json!({ETCD_TRANSPORT_ANNOTATION: "port-forward"}),
    )
    .await;
    let target = sandbox.machines[0].clone();
    let missing_node = sandbox.etcd.member(1).node_name.clone();
    let pods: Api<Pod> = Api::namespaced(sandbox.workload.client(), ETCD_PROXY_NAMESPACE);
    pods.delete(
        &proxy_pod(&sandbox, &missing_node).await,
        &DeleteParams::default(),
    )
    .await
    .unwrap();

    let controller = sandbox.start_controller();
    sandbox.mark_unhealthy(&target).await.unwrap();
    let needle = format!("no Running etcd proxy pod on node {missing_node}");
    let said = sandbox
        .wait_for("the missing proxy to be named", LIMIT, || async {
            let text = kcp_condition_text(&sandbox).await;
            if text.contains(&needle) {
                Ok(text)
            } else {
                Err(text)
            }
        })
        .await
        .unwrap();
    assert!(said.contains("app=etcd-proxy"), "{said}");
    assert!(
        said.contains(&format!("spec.nodeName={missing_node}")),
        "{said}"
    );
    assert!(
        said.contains("reached by port-forward") || said.contains("port-forward"),
        "{said}"
    );
    // Let the controller reconcile a few more times: still nothing removed.
    wait_reconciles(&sandbox, &controller.ctx, 3).await;
    let now = snapshot(&sandbox, &admin).await;
    assert_eq!(
        member_names(&now),
        member_names(&before),
        "no member removed"
    );
    assert!(
        machine_names(&sandbox).await.contains(&target),
        "no Machine deleted"
    );
    controller.stop().await;
}

/// A proxy pod that is Pending (its image or the pod network not ready yet,
/// as upstream's DaemonSet pods are at first): named with its phase, and
/// nothing is removed on what cannot be read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_proxy_pod_is_named_with_its_phase_and_nothing_is_removed() {
    use kube::api::{Patch, PatchParams};
    init_logs();
    let sandbox = unreachable_sandbox().await;
    let admin = sandbox.etcd.connect();
    let before = admin.snapshot().await.unwrap();
    annotate_kcp(
        &sandbox,
        serde_json::json!({ETCD_TRANSPORT_ANNOTATION: "port-forward"}),
    )
    .await;
    let target = sandbox.machines[0].clone();
    let pending_node = sandbox.etcd.member(1).node_name.clone();
    let pods: Api<Pod> = Api::namespaced(sandbox.workload.client(), ETCD_PROXY_NAMESPACE);
    pods.patch_status(
        &proxy_pod(&sandbox, &pending_node).await,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"status": {"phase": "Pending"}})),
    )
    .await
    .unwrap();

    let controller = sandbox.start_controller();
    sandbox.mark_unhealthy(&target).await.unwrap();
    let needle = format!(
        "{ETCD_PROXY_NAMESPACE}/{} on node {pending_node} is Pending, not Running",
        proxy_pod(&sandbox, &pending_node).await
    );
    sandbox
        .wait_for("the Pending proxy to be named", LIMIT, || async {
            let text = kcp_condition_text(&sandbox).await;
            if text.contains(&needle) {
                Ok(text)
            } else {
                Err(text)
            }
        })
        .await
        .unwrap();
    wait_reconciles(&sandbox, &controller.ctx, 3).await;
    assert_eq!(
        member_names(&snapshot(&sandbox, &admin).await),
        member_names(&before),
        "no member removed"
    );
    assert!(
        machine_names(&sandbox).await.contains(&target),
        "no Machine deleted"
    );
    controller.stop().await;
}

/// Figures: a membership snapshot and a leader removal (move leader + remove
/// member) over direct and over port-forward, on the same cluster, one run each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn figures_port_forward_against_direct_on_one_cluster() {
    init_logs();
    let sandbox = Sandbox::start(4).await.unwrap();
    let tls = || sandbox.etcd.minted_tls();
    let seeds = sandbox.etcd.endpoints();
    let direct =
        EtcdCluster::with_options(&seeds, tls(), Transport::Direct, Timeouts::default()).unwrap();
    let relay = std::sync::Arc::new(PortForwardRelay::new(sandbox.workload.client()).unwrap());
    let forwarded = EtcdCluster::with_options(
        &seeds,
        tls(),
        Transport::Relayed(relay.clone()),
        Timeouts::default(),
    )
    .unwrap();
    let mut figures = Vec::new();
    for (name, etcd) in [("direct", &direct), ("port-forward", &forwarded)] {
        // First snapshot opens the connections (and, for port-forward, the tunnels).
        let started = Instant::now();
        let cold = etcd.snapshot().await.unwrap();
        let cold_took = started.elapsed();
        let started = Instant::now();
        let snap = etcd.snapshot().await.unwrap();
        let warm_took = started.elapsed();
        assert_eq!(snap.members.len(), cold.members.len());
        let leader = snap.leader.expect("a leader");
        let started = Instant::now();
        let removed = sandbox
            .wait_for("a safe removal of the leader", LIMIT, || async {
                etcd.safe_remove(leader).await.map_err(|e| e.to_string())
            })
            .await
            .unwrap();
        let removal_took = started.elapsed();
        assert!(
            removed.leader_move.is_some(),
            "{name}: the leader was moved first"
        );
        figures.push(format!(
            "{name}: snapshot cold {cold_took:?} warm {warm_took:?} ({} members); leader removal {removal_took:?}",
            snap.members.len()
        ));
        // The next one starts once the removed member is gone from the list.
        sandbox
            .wait_for("the removal to be listed", LIMIT, || async {
                let s = etcd.snapshot().await.map_err(|e| e.to_string())?;
                if s.member(leader).is_none() && s.leader.is_some() {
                    Ok(())
                } else {
                    Err("still listed or no leader".into())
                }
            })
            .await
            .unwrap();
    }
    assert!(
        relay.tunnels_opened() > 0,
        "port-forward figures went through tunnels"
    );
    for line in figures {
        eprintln!("{line}");
    }
}
