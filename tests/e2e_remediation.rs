//! End to end: real etcd, test API servers as management and workload
//! clusters, CAPI's Machine deletion simulated, and the real controller loop.

use std::time::Duration;

use k3s_control_plane::api::Machine;
use k3s_control_plane::api::names::{
    REMEDIATION_FOR_ANNOTATION, REMEDIATION_IN_PROGRESS_ANNOTATION,
};
use k3s_control_plane::harness::sandbox::Sandbox;
use kube::ResourceExt;
use kube::api::ListParams;

const LIMIT: Duration = Duration::from_secs(60);

fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

async fn machines(sandbox: &Sandbox) -> Vec<Machine> {
    sandbox
        .machines_api()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leaders_machine_marked_by_mhc_is_replaced_after_its_member_is_removed() {
    init_logs();
    let sandbox = Sandbox::start(3).await.unwrap();
    let admin = sandbox.etcd.connect();
    let before = admin.snapshot().await.unwrap();
    let leader_id = before.leader.expect("a leader");
    let leader_index = sandbox.etcd.index_of(leader_id).unwrap();
    let target = sandbox.machines[leader_index].clone();
    let target_member = sandbox.etcd.member(leader_index).name.clone();

    let controller = sandbox.start_controller();
    sandbox.mark_unhealthy(&target).await.unwrap();

    // The member goes, and leadership went elsewhere before.
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
    assert_ne!(after.leader, Some(leader_id));

    // The Machine is gone and a replacement carries remediation-for.
    let replacement = sandbox
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
    let record = replacement
        .annotations()
        .get(REMEDIATION_FOR_ANNOTATION)
        .cloned()
        .expect("remediation-for");
    let record: serde_json::Value = serde_json::from_str(&record).unwrap();
    assert_eq!(record["machine"], target.as_str());
    assert_eq!(record["retryCount"], 0);

    // The KCP's in-progress record is cleared and lastRemediation says what happened.
    let kcp = sandbox
        .wait_for("remediation-in-progress to be cleared", LIMIT, || async {
            let kcp = sandbox
                .kcp_api()
                .get(k3s_control_plane::harness::sandbox::KCP)
                .await
                .map_err(|e| e.to_string())?;
            if kcp
                .annotations()
                .contains_key(REMEDIATION_IN_PROGRESS_ANNOTATION)
            {
                return Err("still annotated".into());
            }
            Ok(kcp)
        })
        .await
        .unwrap();
    let last = kcp
        .status
        .as_ref()
        .and_then(|s| s.last_remediation.clone())
        .expect("lastRemediation");
    assert_eq!(last.machine, target);
    controller.stop().await;
}
