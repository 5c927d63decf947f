//! End to end: the controller resumes after a crash between two steps, leaves
//! externally remediated machines alone, and ignores a stale in-progress record.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use k3s_control_plane::api::Machine;
use k3s_control_plane::api::names::{
    PRE_TERMINATE_HOOK_ANNOTATION, REMEDIATION_FOR_ANNOTATION, REMEDIATION_IN_PROGRESS_ANNOTATION,
};
use k3s_control_plane::controller::reconcile::reconcile;
use k3s_control_plane::etcd::EtcdCluster;
use k3s_control_plane::harness::sandbox::{Sandbox, controller_context, one_step_settings};
use kube::ResourceExt;
use serde_json::json;
use support::*;

fn remediation_for(machine: &Machine) -> Option<serde_json::Value> {
    machine
        .annotations()
        .get(REMEDIATION_FOR_ANNOTATION)
        .map(|v| serde_json::from_str(v).unwrap())
}

/// Wait until `target` is gone, a Machine carries `remediation-for` naming it,
/// and the control plane's in-progress record is cleared; returns the replacement.
async fn wait_remediation_done(sandbox: &Sandbox, target: &str) -> Machine {
    let replacement = sandbox
        .wait_for(&format!("{target} to be replaced"), LIMIT, || async {
            let all = machines(sandbox).await;
            if all.iter().any(|m| m.name_any() == target) {
                let seen: Vec<_> = all
                    .iter()
                    .map(|m| (m.name_any(), remediation_for(m)))
                    .collect();
                return Err(format!("{target} still exists; machines: {seen:?}"));
            }
            all.into_iter()
                .find(|m| remediation_for(m).is_some_and(|r| r["machine"] == target))
                .ok_or_else(|| format!("no replacement of {target} yet"))
        })
        .await
        .unwrap();
    sandbox
        .wait_for("remediation-in-progress to be cleared", LIMIT, || async {
            match kcp(sandbox)
                .await
                .annotations()
                .get(REMEDIATION_IN_PROGRESS_ANNOTATION)
            {
                Some(v) => Err(format!("still annotated: {v}")),
                None => Ok(()),
            }
        })
        .await
        .unwrap();
    replacement
}

async fn members_now(sandbox: &Sandbox, admin: &EtcdCluster) -> Vec<String> {
    member_names(&snapshot(sandbox, admin).await)
}

/// A crash right after the member removal: reconciles are driven one at a time
/// with a first Context until the target's member is gone (membership checked
/// after every call), then that Context is dropped, as a crashed process's
/// state is. The real controller loop, with a new Context, resumes from what
/// it observes: the Machine is deleted once, the replacement created once, no
/// other member removed, and exactly one `EtcdMemberRemoved` Event exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_crashing_after_member_removal_resumes_without_repeating_a_step() {
    init_logs();
    let sandbox = Sandbox::start(3).await.unwrap();
    let admin = sandbox.etcd.connect();
    let original = members_now(&sandbox, &admin).await;
    let leader = sandbox
        .etcd
        .index_of(snapshot(&sandbox, &admin).await.leader.unwrap())
        .unwrap();
    // The leader's machine: leadership has to move before the member goes.
    let target = sandbox.machines[leader].clone();
    let target_member = sandbox.etcd.member(leader).name.clone();
    let mut expected = original.clone();
    expected.retain(|n| *n != target_member);
    sandbox.mark_unhealthy(&target).await.unwrap();

    // One step per reconcile, so that the process can "crash" right after
    // the removal, before the step that follows it.
    let first = controller_context(sandbox.client(), one_step_settings());
    let deadline = tokio::time::Instant::now() + LIMIT;
    let mut calls = 0;
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "member not removed after {calls} reconciles"
        );
        let _ = reconcile(Arc::new(kcp(&sandbox).await), first.clone()).await;
        calls += 1;
        // The removal's Event is published by the very reconcile that removed
        // the member: the exact stop point, whatever a lagging member lists.
        if event_count(&sandbox, "EtcdMemberRemoved").await > 0 {
            break;
        }
        assert_eq!(
            members_now(&sandbox, &admin).await,
            original,
            "no member may go before the removal step"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(first);
    sandbox
        .wait_for("the membership without the target", LIMIT, || async {
            let members = members_now(&sandbox, &admin).await;
            if members == expected {
                Ok(())
            } else {
                Err(format!("{members:?}"))
            }
        })
        .await
        .unwrap();

    // Precisely between "member removed" and "hook released".
    let stopped_at = sandbox.machines_api().get(&target).await.unwrap();
    assert!(stopped_at.is_deleting());
    assert!(
        stopped_at
            .annotations()
            .contains_key(PRE_TERMINATE_HOOK_ANNOTATION)
    );
    assert!(
        kcp(&sandbox)
            .await
            .annotations()
            .contains_key(REMEDIATION_IN_PROGRESS_ANNOTATION)
    );

    let controller = sandbox.start_controller();
    let replacement = wait_remediation_done(&sandbox, &target).await;
    // Settled: further reconciles change nothing.
    wait_reconciles(&sandbox, &controller.ctx, 3).await;
    assert_eq!(remediation_for(&replacement).unwrap()["retryCount"], 0);
    let names = machine_names(&sandbox).await;
    let new: Vec<_> = names
        .iter()
        .filter(|n| !sandbox.machines.contains(n))
        .collect();
    assert_eq!(
        new,
        vec![&replacement.name_any()],
        "one replacement: {names:?}"
    );
    assert_eq!(names.len(), 3);
    assert_eq!(members_now(&sandbox, &admin).await, expected);
    assert_eq!(event_count(&sandbox, "EtcdMemberRemoved").await, 1);
    assert_eq!(event_count(&sandbox, "MachineDeleting").await, 1);
    assert_eq!(event_count(&sandbox, "ReplacementCreated").await, 1);
    controller.stop().await;
}

/// A MachineHealthCheck with external remediation marks a machine
/// (`HealthCheckSucceeded=False`, `ExternallyRemediated`, no `OwnerRemediated`):
/// not ours. Once the controller has reconciled it (status observed, the
/// Machine's etcd condition written) and then again, nothing has changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn externally_remediated_machine_is_left_alone() {
    init_logs();
    let sandbox = Sandbox::start(3).await.unwrap();
    let admin = sandbox.etcd.connect();
    let original = members_now(&sandbox, &admin).await;
    let target = sandbox.machines[1].clone();
    mark_externally_remediated(&sandbox, &target).await;
    let controller = sandbox.start_controller();

    sandbox
        .wait_for(
            "the controller to have looked at the marked machine",
            LIMIT,
            || async {
                let k = kcp(&sandbox).await;
                let status = k.status.clone().unwrap_or_default();
                let remediating = status.conditions.iter().find(|c| c.type_ == "Remediating");
                let m = sandbox
                    .machines_api()
                    .get(&target)
                    .await
                    .map_err(|e| e.to_string())?;
                match (
                    status.observed_generation,
                    remediating,
                    m.condition("EtcdMemberHealthy"),
                ) {
                    (Some(g), Some(r), Some(_)) if Some(g) == k.metadata.generation => {
                        Ok(r.reason.clone())
                    }
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await
        .unwrap();
    wait_reconciles(&sandbox, &controller.ctx, 2).await;

    let k = kcp(&sandbox).await;
    let remediating = k
        .status
        .clone()
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Remediating")
        .unwrap();
    assert_eq!(remediating.reason, "NotRemediating", "{remediating:?}");
    assert!(
        !k.annotations()
            .contains_key(REMEDIATION_IN_PROGRESS_ANNOTATION)
    );
    let m = sandbox.machines_api().get(&target).await.unwrap();
    assert!(!m.is_deleting());
    assert!(owner_remediated(&m).is_none(), "{:?}", owner_remediated(&m));
    // Our hook stays as it was born (empty): no removal of ours started; when
    // the external remediation deletes the Machine, it holds it for etcd.
    assert_eq!(
        m.annotations()
            .get(PRE_TERMINATE_HOOK_ANNOTATION)
            .map(String::as_str),
        Some("")
    );
    assert_eq!(machine_names(&sandbox).await.len(), 3);
    assert_eq!(members_now(&sandbox, &admin).await, original);
    assert_eq!(event_count(&sandbox, "RemediationStarted").await, 0);
    controller.stop().await;
}

/// A `remediation-in-progress` record older than every Machine (left by a
/// remediation whose replacement exists, or by another controller) is stale:
/// it is cleared without acting on it (no replacement for the machine it
/// names), and a new remediation proceeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_remediation_in_progress_record_is_cleared_and_a_new_remediation_proceeds() {
    init_logs();
    let sandbox = Sandbox::start(3).await.unwrap();
    let admin = sandbox.etcd.connect();
    let original = members_now(&sandbox, &admin).await;
    let stale = json!({"machine": "demo-control-plane-gone1", "timestamp": "2020-01-01T00:00:00Z", "retryCount": 0});
    annotate_kcp(
        &sandbox,
        json!({REMEDIATION_IN_PROGRESS_ANNOTATION: stale.to_string()}),
    )
    .await;
    let target = sandbox.machines[2].clone();
    let target_member = sandbox.etcd.member(2).name.clone();
    sandbox.mark_unhealthy(&target).await.unwrap();
    let controller = sandbox.start_controller();

    let replacement = wait_remediation_done(&sandbox, &target).await;
    let record = remediation_for(&replacement).unwrap();
    assert_eq!(record["machine"], target.as_str());
    assert_eq!(record["retryCount"], 0);
    wait_reconciles(&sandbox, &controller.ctx, 2).await;
    // Nothing was created for the stale record's machine.
    let all = machines(&sandbox).await;
    assert!(
        !all.iter()
            .any(|m| remediation_for(m).is_some_and(|r| r["machine"] == "demo-control-plane-gone1")),
        "a replacement was created for the stale record"
    );
    assert_eq!(
        all.len(),
        3,
        "{:?}",
        all.iter().map(|m| m.name_any()).collect::<Vec<_>>()
    );
    let mut expected = original.clone();
    expected.retain(|n| *n != target_member);
    assert_eq!(members_now(&sandbox, &admin).await, expected);
    controller.stop().await;
}
