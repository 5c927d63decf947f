//! End to end on the real membership: a control-plane machine without an etcd
//! member costs nothing, a member without a Machine still counts, and a
//! scale-down removes members one at a time, leadership first.

use crate::support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k3s_control_plane::api::names::{
    DELETE_MACHINE_ANNOTATION, PRE_TERMINATE_HOOK_ANNOTATION, REMEDIATION_FOR_ANNOTATION,
    REMEDIATION_IN_PROGRESS_ANNOTATION,
};
use k3s_control_plane::controller::Settings;
use k3s_control_plane::controller::reconcile::reconcile;
use k3s_control_plane::harness::sandbox::{
    Sandbox, controller_context, fast_settings, one_step_settings,
};
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use support::*;

/// A 4th control-plane machine whose node runs no etcd member (k3s
/// `--disable-etcd`; a scale-up to 5 in progress) is marked: it is remediated
/// without any etcd step: no leadership move, the membership is unchanged; the
/// Machine is deleted and replaced once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machine_without_etcd_member_is_remediated_without_etcd_steps() {
    init_logs();
    let sandbox = Sandbox::start(3).await.unwrap();
    let admin = sandbox.etcd.connect();
    let before = snapshot(&sandbox, &admin).await;
    let target = "cp-noetcd";
    add_memberless_machine(&sandbox, target, 0).await;
    patch_kcp_spec(&sandbox, json!({"replicas": 5})).await;
    sandbox.mark_unhealthy(target).await.unwrap();
    let observer = Observer::start(&sandbox, sandbox.etcd.member_names());
    let controller = sandbox.start_controller();

    let replacement = sandbox
        .wait_for("the memberless machine to be replaced", LIMIT, || async {
            let all = machines(&sandbox).await;
            if all.iter().any(|m| m.name_any() == target) {
                return Err(format!("{target} still exists"));
            }
            all.into_iter()
                .find(|m| m.annotations().contains_key(REMEDIATION_FOR_ANNOTATION))
                .ok_or_else(|| "no replacement yet".to_string())
        })
        .await
        .unwrap();
    let record: serde_json::Value =
        serde_json::from_str(&replacement.annotations()[REMEDIATION_FOR_ANNOTATION]).unwrap();
    assert_eq!(record["machine"], target);
    sandbox
        .wait_for("remediation-in-progress cleared", LIMIT, || async {
            let k = kcp(&sandbox).await;
            match k.annotations().get(REMEDIATION_IN_PROGRESS_ANNOTATION) {
                Some(v) => Err(v.clone()),
                None => Ok(()),
            }
        })
        .await
        .unwrap();
    wait_reconciles(&sandbox, &controller.ctx, 2).await;
    let samples = observer.finish().await;

    // No etcd step: same members, same leader, all along.
    let after = snapshot(&sandbox, &admin).await;
    assert_eq!(member_names(&after), member_names(&before));
    assert!(samples.iter().all(|s| s.missing.is_empty()));
    let leaders: BTreeSet<Option<u64>> = samples.iter().map(|s| s.leader).collect();
    assert_eq!(leaders, BTreeSet::from([before.leader]), "leadership moved");
    assert_eq!(event_count(&sandbox, "EtcdLeadershipMoved").await, 0);
    assert_eq!(event_count(&sandbox, "EtcdMemberRemoved").await, 0);
    // Deleted once, replaced once; scale-up waits for the replacement's node.
    assert_eq!(event_count(&sandbox, "MachineDeleting").await, 1);
    assert_eq!(event_count(&sandbox, "ReplacementCreated").await, 1);
    let names = machine_names(&sandbox).await;
    assert_eq!(names.len(), 4, "{names:?}");
    controller.stop().await;
}

/// An etcd member whose Machine the control plane does not own (its owner
/// reference removed) still counts. With that member stopped, the control
/// plane owning 3 machines (two with members, one server without etcd),
/// removing the marked machine's member would leave 1 of 2 voters healthy:
/// refused, with the unowned member named as unhealthy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_without_machine_counts_for_quorum() {
    init_logs();
    let mut sandbox = Sandbox::start(3).await.unwrap();
    let admin = sandbox.etcd.connect();
    let before = snapshot(&sandbox, &admin).await;
    let leader = sandbox.etcd.index_of(before.leader.unwrap()).unwrap();
    let unowned = (leader + 1) % 3;
    let target = sandbox.machines[(leader + 2) % 3].clone();
    let unowned_member = sandbox.etcd.member(unowned).name.clone();
    sandbox
        .machines_api()
        .patch(
            &sandbox.machines[unowned],
            &PatchParams::default(),
            // Not a Machine of this Cluster any more (an unowned control-plane
            // Machine of the Cluster would be mixed management, refused).
            &Patch::Merge(&json!({"metadata": {"ownerReferences": null, "labels": {"cluster.x-k8s.io/cluster-name": null}}})),
        )
        .await
        .unwrap();
    // The control plane still has its 3 replicas: one is a server without etcd.
    add_memberless_machine(&sandbox, "cp-noetcd", 0).await;
    sandbox.etcd.stop(unowned).await.unwrap();
    sandbox.mark_unhealthy(&target).await.unwrap();
    let controller = sandbox.start_controller();

    let message = wait_owner_remediated(
        &sandbox,
        &target,
        "CannotBeRemediated",
        &[
            "quorum",
            "1 of 2 voters healthy, quorum needs 2",
            &unowned_member,
        ],
    )
    .await;
    wait_reconciles(&sandbox, &controller.ctx, 3).await;
    let after = snapshot(&sandbox, &admin).await;
    assert_eq!(member_names(&after), member_names(&before), "{message}");
    let all = machines(&sandbox).await;
    assert!(!all.iter().any(|m| m.is_deleting()));
    assert_eq!(all.len(), 4);
    assert_eq!(event_count(&sandbox, "EtcdMemberRemoved").await, 0);
    assert_eq!(event_count(&sandbox, "MachineDeleting").await, 0);
    controller.stop().await;
}

/// Scale-down from 3 to 1, driven one reconcile at a time so that the world can
/// be checked around every single step: members go one at a time; a member is
/// never removed while it leads (the first target is made the leader's machine
/// with `delete-machine`, so leadership must move first); in the end 1 member
/// and 1 Machine remain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_down_from_three_to_one_removes_members_one_at_a_time_leadership_first() {
    scale_down_from_three_to_one(one_step_settings()).await;
}

/// The same with steps chained (the default): a reconcile carries one removal
/// as far as it can go, but never starts the next one, so still at most one
/// member goes per reconcile, and the outcome is the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_down_with_chained_steps_still_removes_one_member_per_reconcile() {
    scale_down_from_three_to_one(fast_settings()).await;
}

/// A chained pass after a step that touched only management objects decides
/// on the Nodes and etcd snapshot of the pass before, and on the Secrets this
/// reconcile already read; a leadership move is still decided on a snapshot
/// of its own. One reconcile, at most one chained step: the hook (pass 1,
/// everything read), then the leadership move (pass 2: decided on pass 1's
/// snapshot, so the workload cluster and etcd are read again before it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chained_pass_reuses_the_last_snapshot_but_moves_leadership_on_its_own() {
    init_logs();
    let sandbox = Sandbox::start(3).await.unwrap();
    let admin = sandbox.etcd.connect();
    let before = snapshot(&sandbox, &admin).await;
    let leader = sandbox.etcd.index_of(before.leader.unwrap()).unwrap();
    let target = sandbox.machines[leader].clone();
    annotate_machine(&sandbox, &target, json!({DELETE_MACHINE_ANNOTATION: ""})).await;
    patch_kcp_spec(&sandbox, json!({"replicas": 1})).await;
    let ctx = controller_context(
        sandbox.client(),
        Settings {
            max_chained_steps: 1,
            ..fast_settings()
        },
    );
    let node_lists = || {
        sandbox
            .workload
            .request_counts()
            .get(&("list".to_string(), "nodes".to_string()))
            .copied()
            .unwrap_or(0)
    };
    let secret_gets = || {
        sandbox
            .management
            .request_counts()
            .get(&("get".to_string(), "secrets".to_string()))
            .copied()
            .unwrap_or(0)
    };
    let (lists, gets) = (node_lists(), secret_gets());

    reconcile(Arc::new(kcp(&sandbox).await), ctx.clone())
        .await
        .unwrap();

    let hooked = machines(&sandbox)
        .await
        .into_iter()
        .find(|m| m.name_any() == target)
        .unwrap();
    assert!(
        hooked
            .annotations()
            .contains_key(PRE_TERMINATE_HOOK_ANNOTATION),
        "pass 1 adds the hook"
    );
    assert!(!hooked.is_deleting(), "the chain stops after one more step");
    let after = snapshot(&sandbox, &admin).await;
    assert_ne!(
        after.leader, before.leader,
        "pass 2 moves leadership off {target}"
    );
    assert_eq!(
        ctx.metrics.reused_workload_observations.get(),
        1,
        "pass 2 first decides on pass 1's observation"
    );
    assert_eq!(
        node_lists() - lists,
        2,
        "the workload cluster is read by pass 1 and again before the move"
    );
    assert_eq!(
        secret_gets() - gets,
        5,
        "the five cluster Secrets are read once per reconcile"
    );
}

async fn scale_down_from_three_to_one(settings: Settings) {
    init_logs();
    let one_step = settings.max_chained_steps == 0;
    let sandbox = Sandbox::start(3).await.unwrap();
    let admin = sandbox.etcd.connect();
    let before = snapshot(&sandbox, &admin).await;
    let leader = sandbox.etcd.index_of(before.leader.unwrap()).unwrap();
    let first = sandbox.machines[leader].clone();
    let leader_member = sandbox.etcd.member(leader).name.clone();
    annotate_machine(&sandbox, &first, json!({DELETE_MACHINE_ANNOTATION: ""})).await;
    patch_kcp_spec(&sandbox, json!({"replicas": 1})).await;

    let ctx = controller_context(sandbox.client(), settings);
    let deadline = tokio::time::Instant::now() + LIMIT;
    let mut removed: Vec<String> = vec![];
    let mut calls = 0;
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "scale-down not done after {calls} reconciles; removed {removed:?}"
        );
        let members_before = snapshot(&sandbox, &admin).await;
        let machines_before = machines(&sandbox).await;
        let current = Arc::new(kcp(&sandbox).await);
        // A failed step (e.g. a conflict) is retried by the next call, as the loop does.
        let _ = reconcile(current, ctx.clone()).await;
        calls += 1;
        let members_after = snapshot(&sandbox, &admin).await;
        let gone: Vec<_> = members_before
            .members
            .iter()
            .filter(|m| members_after.member(m.id).is_none())
            .collect();
        assert!(gone.len() <= 1, "two members removed in one reconcile");
        if let Some(member) = gone.first() {
            // One step per reconcile, the world sampled before it is the one
            // the removal was decided on: the member did not lead, and its
            // Machine was the only one deleting, waiting on our hook. Chained,
            // leadership moves and the Machine is deleted in the same
            // reconcile; the count of Machines deleting is checked below.
            if one_step {
                assert_ne!(
                    members_before.leader,
                    Some(member.id),
                    "{} was removed while it led",
                    member.name
                );
                let deleting: Vec<_> = machines_before.iter().filter(|m| m.is_deleting()).collect();
                assert_eq!(deleting.len(), 1, "one removal at a time");
                assert!(
                    deleting[0]
                        .annotations()
                        .contains_key(PRE_TERMINATE_HOOK_ANNOTATION)
                );
            }
            removed.push(member.name.clone());
        }
        let deleting = machines(&sandbox)
            .await
            .iter()
            .filter(|m| m.is_deleting())
            .count();
        assert!(deleting <= 1, "{deleting} Machines deleting at once");
        let all = machines(&sandbox).await;
        if members_after.members.len() == 1 && all.len() == 1 && deleting == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    assert_eq!(removed.len(), 2, "{removed:?}");
    assert_eq!(
        removed[0], leader_member,
        "the delete-machine annotation picks first"
    );
    let moved = event_notes(&sandbox, "EtcdLeadershipMoved").await;
    assert!(
        moved
            .iter()
            .any(|n| n.contains(&format!("from {leader_member}"))),
        "{moved:?}"
    );
    let after = snapshot(&sandbox, &admin).await;
    assert_eq!(after.members.len(), 1);
    let survivor = machines(&sandbox).await.remove(0).name_any();
    let survivor_index = sandbox
        .machines
        .iter()
        .position(|m| *m == survivor)
        .unwrap();
    assert_eq!(
        after.members[0].name,
        sandbox.etcd.member(survivor_index).name,
        "the last Machine runs the last member"
    );
    assert_eq!(event_count(&sandbox, "EtcdMemberRemoved").await, 2);
    assert_eq!(event_count(&sandbox, "ReplacementCreated").await, 0);
}
