//! Hostile faults on real etcd members, one test per row of the fault matrix
//! (docs/faults.md). Each asserts that nothing is lost: no Machine deleted and
//! no member removed on a guess, at most one Machine deleting, and exactly one
//! replacement where a remediation completes.

mod e2e_support;

use e2e_support::{LIMIT, event_count, init_logs, machines, snapshot};
use k3s_control_plane::api::KThreesControlPlane;
use k3s_control_plane::controller::reconcile::reconcile;
use k3s_control_plane::harness::sandbox::{CLUSTER, KCP, NAMESPACE, Sandbox};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use std::sync::Arc;

fn condition(kcp: &KThreesControlPlane, type_: &str) -> Condition {
    kcp.conditions()
        .iter()
        .find(|c| c.type_ == type_)
        .cloned()
        .unwrap_or_else(|| panic!("no {type_} in {:?}", kcp.conditions()))
}

async fn kcp(sandbox: &Sandbox) -> Arc<KThreesControlPlane> {
    Arc::new(sandbox.kcp_api().get(KCP).await.unwrap())
}

async fn set_etcd_ca(sandbox: &Sandbox, cert: &str, key: &str) {
    let secrets: Api<Secret> = Api::namespaced(sandbox.client(), NAMESPACE);
    secrets
        .patch(
            &format!("{CLUSTER}-etcd"),
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"tls.crt": cert, "tls.key": key}})),
        )
        .await
        .unwrap();
}

/// The `<cluster>-etcd` CA changes while the controller holds pooled
/// connections: they are rebuilt, certificates minted from the old CA are never
/// used again (with a CA the members do not trust, etcd becomes unreachable
/// instead of staying healthy on old connections), and nothing is removed
/// meanwhile. Back on the real CA, new connections again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_ca_rotated_mid_life_rebuilds_connections_and_never_reuses_old_ones() {
    init_logs();
    let sandbox = Sandbox::start(3).await.unwrap();
    let ctx = sandbox.context();
    reconcile(kcp(&sandbox).await, ctx.clone()).await.unwrap();
    assert_eq!(
        condition(&*kcp(&sandbox).await, "EtcdClusterHealthy").status,
        "True"
    );
    let built = ctx.etcd.handles_built();
    assert_eq!(built, 1);
    let (real_cert, real_key) = (
        sandbox.etcd.ca_pem().to_string(),
        sandbox.etcd.ca_key_pem().to_string(),
    );

    let other = k3s_control_plane::pki::generate_ca(
        "etcd-server-ca@rotated",
        k3s_control_plane::pki::CA_LIFETIME,
    )
    .unwrap();
    set_etcd_ca(&sandbox, &other.cert_pem, &other.key_pem).await;
    let target = sandbox.machines[1].clone();
    sandbox.mark_unhealthy(&target).await.unwrap();
    for _ in 0..3 {
        reconcile(kcp(&sandbox).await, ctx.clone()).await.unwrap();
    }
    assert_eq!(
        ctx.etcd.handles_built(),
        2,
        "the handle was not rebuilt when the CA changed"
    );
    let etcd = condition(&*kcp(&sandbox).await, "EtcdClusterHealthy");
    assert_eq!(
        etcd.status, "Unknown",
        "old connections were reused: {}",
        etcd.message
    );
    assert!(machines(&sandbox).await.iter().all(|m| !m.is_deleting()));
    assert_eq!(event_count(&sandbox, "EtcdMemberRemoved").await, 0);

    set_etcd_ca(&sandbox, &real_cert, &real_key).await;
    sandbox
        .wait_for("etcd healthy again on the real CA", LIMIT, || async {
            reconcile(kcp(&sandbox).await, ctx.clone())
                .await
                .map_err(|e| e.to_string())?;
            let c = condition(&*kcp(&sandbox).await, "EtcdClusterHealthy");
            if c.status == "True" {
                Ok(())
            } else {
                Err(c.message)
            }
        })
        .await
        .unwrap();
    assert_eq!(
        ctx.etcd.handles_built(),
        3,
        "the restored CA reused a handle"
    );
    assert_eq!(
        ctx.etcd.len(),
        1,
        "one handle per workload cluster, the old ones dropped"
    );
    let admin = sandbox.etcd.connect();
    assert_eq!(snapshot(&sandbox, &admin).await.members.len(), 3);
}

/// A member added by a join that never completed (a ghost) counts as an
/// unhealthy voter and blocks every removal; after the grace period the
/// controller removes it (quorum allowing), and the remediation it blocked then
/// completes with exactly one replacement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ghost_member_after_a_failed_join_is_counted_unhealthy_then_cleaned_up() {
    use e2e_support::spare_ip;
    use k3s_control_plane::harness::infra_sim::{add_ghost_member, reconcile_infrastructure};

    init_logs();
    let mut sandbox = Sandbox::start(3).await.unwrap();
    let ghost = add_ghost_member(&sandbox, &spare_ip(&sandbox, 0))
        .await
        .unwrap();
    let target = sandbox.machines[2].clone();
    sandbox.mark_unhealthy(&target).await.unwrap();
    let controller = sandbox.start_controller();

    let ghost_label = format!("{ghost:016x}");
    sandbox
        .wait_for(
            "the ghost counted unhealthy and awaiting its grace period",
            LIMIT,
            || async {
                let kcp = kcp(&sandbox).await;
                match kcp
                    .conditions()
                    .iter()
                    .find(|c| c.type_ == "EtcdClusterHealthy")
                {
                    Some(c)
                        if c.status == "False"
                            && c.message.contains(&ghost_label)
                            && c.message.contains("grace period") =>
                    {
                        Ok(())
                    }
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await
        .unwrap();
    assert!(
        machines(&sandbox).await.iter().all(|m| !m.is_deleting()),
        "remediated past a ghost"
    );

    let deadline = tokio::time::Instant::now() + LIMIT * 2;
    loop {
        reconcile_infrastructure(&mut sandbox, LIMIT).await.unwrap();
        let all = machines(&sandbox).await;
        assert!(all.iter().filter(|m| m.is_deleting()).count() <= 1);
        let admin = sandbox.etcd.connect();
        let snap = admin.snapshot().await;
        let done = !all
            .iter()
            .any(|m| m.metadata.name.as_deref() == Some(target.as_str()))
            && all.len() == 3
            && all.iter().all(|m| m.node_name().is_some())
            && snap
                .as_ref()
                .is_ok_and(|s| s.members.len() == 3 && s.member(ghost).is_none());
        if done {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not recovered in time"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(event_count(&sandbox, "EtcdOrphanMemberRemoved").await, 1);
    assert_eq!(event_count(&sandbox, "EtcdMemberRemoved").await, 1);
    assert_eq!(event_count(&sandbox, "ReplacementCreated").await, 1);
    controller.stop().await;
}
