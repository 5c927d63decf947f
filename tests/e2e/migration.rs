//! End to end: taking over a control plane from cluster-api-k3s (real etcd,
//! test API servers, CAPI's Machine deletion simulated, the real controller).
//!
//! The world is built as upstream leaves it when its controller is scaled to
//! 0: Machines without our spec-hash annotation (upstream records
//! `kthrees-server-configuration` instead), the `control-plane-name` label
//! empty (upstream writes it so), upstream's finalizer on the KCP (the same
//! name as ours), and its pre-terminate hook
//! `pre-terminate.delete.hook.machine.cluster.x-k8s.io: k3s` on Machines.

use crate::support;

use std::time::Duration;

use k3s_control_plane::api::names::{
    CONTROL_PLANE_NAME_LABEL, KCP_FINALIZER, PRE_TERMINATE_HOOK_ANNOTATION,
    REMEDIATION_FOR_ANNOTATION, REMEDIATION_IN_PROGRESS_ANNOTATION, SPEC_HASH_ANNOTATION,
    UPSTREAM_PRE_TERMINATE_HOOK_ANNOTATION, UPSTREAM_PRE_TERMINATE_HOOK_VALUE,
};
use k3s_control_plane::etcd::EtcdCluster;
use k3s_control_plane::harness::capi_sim::MACHINE_FINALIZER;
use k3s_control_plane::harness::sandbox::Sandbox;
use kube::ResourceExt;
use kube::api::DeleteParams;
use serde_json::json;
use support::*;

/// What cluster-api-k3s writes on a Machine it creates: the server
/// configuration it compares for rollouts (never our spec hash).
const UPSTREAM_SERVER_CONFIG_ANNOTATION: &str =
    "controlplane.cluster.x-k8s.io/kthrees-server-configuration";

/// Rewrite the sandbox's Machines as cluster-api-k3s made them; with `hooks`,
/// each also carries upstream's pre-terminate hook.
async fn as_upstream_left_it(sandbox: &Sandbox, hooks: &[&str]) {
    for name in &sandbox.machines {
        let mut annotations = json!({
            SPEC_HASH_ANNOTATION: null,
            PRE_TERMINATE_HOOK_ANNOTATION: null,
            UPSTREAM_SERVER_CONFIG_ANNOTATION: r#"{"disableComponents":["traefik"]}"#,
        });
        if hooks.contains(&name.as_str()) {
            annotations[UPSTREAM_PRE_TERMINATE_HOOK_ANNOTATION] =
                json!(UPSTREAM_PRE_TERMINATE_HOOK_VALUE);
        }
        sandbox
            .machines_api()
            .patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&json!({"metadata": {
                    "labels": {CONTROL_PLANE_NAME_LABEL: ""},
                    "annotations": annotations,
                }})),
            )
            .await
            .unwrap();
    }
    let kcp = kcp(sandbox).await;
    assert!(kcp.finalizers().iter().any(|f| f == KCP_FINALIZER));
}

async fn member_ids(sandbox: &Sandbox, admin: &EtcdCluster) -> Vec<u64> {
    let mut ids: Vec<u64> = snapshot(sandbox, admin)
        .await
        .members
        .iter()
        .map(|m| m.id)
        .collect();
    ids.sort();
    ids
}

/// Delete `machine` as upstream did (CAPI's finalizer holds it, then CAPI waits
/// on the hooks), before our controller runs.
async fn delete_as_upstream_did(sandbox: &Sandbox, machine: &str) {
    sandbox
        .wait_for("CAPI's finalizer on the Machine", LIMIT, || async {
            let m = sandbox
                .machines_api()
                .get(machine)
                .await
                .map_err(|e| e.to_string())?;
            if m.finalizers().iter().any(|f| f == MACHINE_FINALIZER) {
                Ok(())
            } else {
                Err("no finalizer yet".into())
            }
        })
        .await
        .unwrap();
    sandbox
        .machines_api()
        .delete(machine, &DeleteParams::default())
        .await
        .unwrap();
    sandbox
        .wait_for("CAPI to wait on the upstream hook", LIMIT, || async {
            let m = sandbox
                .machines_api()
                .get(machine)
                .await
                .map_err(|e| e.to_string())?;
            match m.condition("Deleting") {
                Some(c) if c.reason == "WaitingForPreTerminateHook" => Ok(()),
                other => Err(format!(
                    "Deleting is {:?}",
                    other.map(|c| c.reason.to_string())
                )),
            }
        })
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taking_over_a_settled_upstream_control_plane_deletes_creates_and_removes_nothing() {
    init_logs();
    let sandbox = Sandbox::start(3).await.unwrap();
    let admin = sandbox.etcd.connect();
    let all: Vec<&str> = sandbox.machines.iter().map(String::as_str).collect();
    as_upstream_left_it(&sandbox, &all).await;
    let names_before = machine_names(&sandbox).await;
    let ids_before = member_ids(&sandbox, &admin).await;
    let leader_before = snapshot(&sandbox, &admin).await.leader;

    let started = std::time::Instant::now();
    let controller = sandbox.start_controller();
    let ctx = controller.ctx.clone();
    wait_reconciles(&sandbox, &ctx, 6).await;

    assert_eq!(
        machine_names(&sandbox).await,
        names_before,
        "no Machine created or deleted"
    );
    for m in machines(&sandbox).await {
        assert!(!m.is_deleting(), "{} is deleting", m.name_any());
        // Not rolled for spec: no spec hash is no known spec, not another spec.
        assert!(!m.annotations().contains_key(SPEC_HASH_ANNOTATION));
        // A live Machine's leftover upstream hook stays: it is harmless until
        // the Machine is deleted, and then ours to release.
        assert_eq!(
            m.annotations()
                .get(UPSTREAM_PRE_TERMINATE_HOOK_ANNOTATION)
                .map(String::as_str),
            Some(UPSTREAM_PRE_TERMINATE_HOOK_VALUE)
        );
        // Our hook goes on every live Machine taken over (empty: no removal
        // chosen), so that a deletion anyone starts waits for etcd.
        assert_eq!(
            m.annotations()
                .get(PRE_TERMINATE_HOOK_ANNOTATION)
                .map(String::as_str),
            Some(""),
            "{}: our hook added on takeover",
            m.name_any()
        );
    }
    assert_eq!(
        member_ids(&sandbox, &admin).await,
        ids_before,
        "same etcd members"
    );
    assert_eq!(
        snapshot(&sandbox, &admin).await.leader,
        leader_before,
        "leadership untouched"
    );
    for reason in [
        "EtcdMemberRemoved",
        "EtcdLeadershipMoved",
        "MachineCreated",
        "MachineDeleting",
    ] {
        assert_eq!(
            event_count(&sandbox, reason).await,
            0,
            "{reason}: {:?}",
            event_notes(&sandbox, reason).await
        );
    }
    assert!(
        kcp(&sandbox)
            .await
            .finalizers()
            .iter()
            .any(|f| f == KCP_FINALIZER)
    );
    eprintln!(
        "settled takeover: {} reconciles in {:?}",
        reconciles(&ctx),
        started.elapsed()
    );
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_machine_upstream_left_deleting_is_finished_by_our_steps_and_replaced() {
    init_logs();
    let sandbox = Sandbox::start(3).await.unwrap();
    let admin = sandbox.etcd.connect();
    let before = snapshot(&sandbox, &admin).await;
    let leader = before.leader.expect("a leader");
    let index = sandbox.etcd.index_of(leader).unwrap();
    let target = sandbox.machines[index].clone();
    let target_member = sandbox.etcd.member(index).name.clone();
    let stays: Vec<u64> = {
        let mut ids: Vec<u64> = before
            .members
            .iter()
            .map(|m| m.id)
            .filter(|id| *id != leader)
            .collect();
        ids.sort();
        ids
    };
    as_upstream_left_it(&sandbox, &[target.as_str()]).await;
    // Upstream was scaled to 0 right after deleting the Machine: its hook holds it.
    delete_as_upstream_did(&sandbox, &target).await;

    let observer = Observer::start(&sandbox, vec![target_member.clone()]);
    let started = std::time::Instant::now();
    let controller = sandbox.start_controller();
    let ctx = controller.ctx.clone();

    sandbox
        .wait_for(
            "the Machine to go and a replacement to come",
            LIMIT,
            || async {
                let all = machine_names(&sandbox).await;
                if all.contains(&target) {
                    return Err(format!("{target} still exists"));
                }
                all.into_iter()
                    .find(|n| !sandbox.machines.contains(n))
                    .ok_or_else(|| "no replacement yet".to_string())
            },
        )
        .await
        .unwrap();
    let took = started.elapsed();
    wait_reconciles(&sandbox, &ctx, 2).await;
    let record = observer.record().await;
    let quorum = record.assert_safe("the upstream leader's deletion");
    let samples = record.samples;

    let after = snapshot(&sandbox, &admin).await;
    assert!(after.member_by_name(&target_member).is_none());
    let mut ids: Vec<u64> = after.members.iter().map(|m| m.id).collect();
    ids.sort();
    assert_eq!(
        ids, stays,
        "only the target's member went; the others are the same members"
    );
    assert!(after.leader.is_some_and(|l| l != leader));

    // Leadership moved off before the member went; the member went once.
    let moved = event_notes(&sandbox, "EtcdLeadershipMoved").await;
    assert!(!moved.is_empty(), "leadership was not moved first");
    assert_eq!(event_count(&sandbox, "EtcdMemberRemoved").await, 1);
    let first_at = |events: Vec<k8s_openapi::api::events::v1::Event>| {
        events
            .iter()
            .filter_map(|e| e.event_time.as_ref().map(|t| t.0))
            .min()
            .expect("an event time")
    };
    assert!(
        first_at(events(&sandbox, "EtcdLeadershipMoved").await)
            <= first_at(events(&sandbox, "EtcdMemberRemoved").await),
        "leadership moved after the member was removed"
    );
    let taken = event_notes(&sandbox, "UpstreamHookTakenOver").await;
    assert_eq!(taken.len(), 1, "{taken:?}");
    assert!(taken[0].contains(&format!("{leader:016x}")), "{}", taken[0]);
    let released = event_notes(&sandbox, "UpstreamHookReleased").await;
    assert_eq!(released.len(), 1, "{released:?}");
    assert!(
        released[0].contains(&format!("{leader:016x}")),
        "{}",
        released[0]
    );
    assert!(
        released[0].contains("upstream-hook.takeover"),
        "{}",
        released[0]
    );

    // Never released before the member was gone; quorum as the shared
    // sampler judges it (above), its leadership moved before it went.
    let mut gone = false;
    for s in &samples {
        if !s.missing.is_empty() {
            gone = true;
        }
        if !gone {
            assert!(
                s.deleting.contains(&target),
                "{target} went before its member: {s:?}"
            );
        }
    }
    eprintln!(
        "upstream deletion finished and replaced in {took:?} ({} samples; {quorum})",
        samples.len()
    );
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_remediation_in_flight_is_continued_with_its_retry_count() {
    init_logs();
    let sandbox = Sandbox::start(3).await.unwrap();
    let admin = sandbox.etcd.connect();
    let before = snapshot(&sandbox, &admin).await;
    let leader = before.leader.expect("a leader");
    // A follower: the record, not leadership, is what this test is about.
    let index = (0..3)
        .find(|i| sandbox.etcd.member(*i).id != leader)
        .unwrap();
    let target = sandbox.machines[index].clone();
    let target_member = sandbox.etcd.member(index).name.clone();
    as_upstream_left_it(&sandbox, &[target.as_str()]).await;
    sandbox.mark_unhealthy(&target).await.unwrap();
    // Upstream's record, as its Go code marshals it (seconds, UTC), after the
    // Machines were created (else it would be stale), retry 1 of a sequence.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let stamp = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let record = format!(r#"{{"machine":"{target}","timestamp":"{stamp}","retryCount":1}}"#);
    annotate_kcp(
        &sandbox,
        json!({REMEDIATION_IN_PROGRESS_ANNOTATION: record}),
    )
    .await;
    delete_as_upstream_did(&sandbox, &target).await;

    let started = std::time::Instant::now();
    let controller = sandbox.start_controller();
    let replacement = sandbox
        .wait_for("the replacement with remediation-for", LIMIT, || async {
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
    let took = started.elapsed();
    let carried: serde_json::Value =
        serde_json::from_str(&replacement.annotations()[REMEDIATION_FOR_ANNOTATION]).unwrap();
    let upstream: serde_json::Value = serde_json::from_str(&record).unwrap();
    assert_eq!(
        carried, upstream,
        "the upstream record is carried on as it was"
    );
    sandbox
        .wait_for("remediation-in-progress cleared", LIMIT, || async {
            match kcp(&sandbox)
                .await
                .annotations()
                .get(REMEDIATION_IN_PROGRESS_ANNOTATION)
            {
                Some(v) => Err(format!("still {v}")),
                None => Ok(()),
            }
        })
        .await
        .unwrap();
    assert!(
        snapshot(&sandbox, &admin)
            .await
            .member_by_name(&target_member)
            .is_none()
    );
    assert_eq!(event_count(&sandbox, "EtcdMemberRemoved").await, 1);
    assert_eq!(event_count(&sandbox, "UpstreamHookReleased").await, 1);
    let last = sandbox
        .wait_for("status.lastRemediation", LIMIT, || async {
            kcp(&sandbox)
                .await
                .status
                .and_then(|s| s.last_remediation)
                .ok_or_else(|| "not yet".to_string())
        })
        .await
        .unwrap();
    assert_eq!(
        (last.machine.as_str(), last.retry_count),
        (target.as_str(), 1)
    );
    eprintln!("upstream remediation continued and replaced in {took:?}");
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tearing_down_an_upstream_control_plane_releases_upstreams_hooks_too() {
    init_logs();
    let sandbox = Sandbox::start(3).await.unwrap();
    let admin = sandbox.etcd.connect();
    let all: Vec<&str> = sandbox.machines.iter().map(String::as_str).collect();
    as_upstream_left_it(&sandbox, &all).await;
    let controller = sandbox.start_controller();
    wait_reconciles(&sandbox, &controller.ctx, 2).await;
    // The whole cluster goes: CAPI deletes the control plane; no member is
    // removed (its servers go with it), every hook is released, ours and
    // upstream's, or CAPI would keep each Machine forever.
    let clusters: kube::Api<k3s_control_plane::api::Cluster> = kube::Api::namespaced(
        sandbox.client(),
        k3s_control_plane::harness::sandbox::NAMESPACE,
    );
    clusters
        .delete(
            k3s_control_plane::harness::sandbox::CLUSTER,
            &DeleteParams::default(),
        )
        .await
        .unwrap();
    sandbox
        .kcp_api()
        .delete(
            k3s_control_plane::harness::sandbox::KCP,
            &DeleteParams::default(),
        )
        .await
        .unwrap();
    sandbox
        .wait_for("every Machine gone", LIMIT, || async {
            let left = machines(&sandbox).await;
            if left.is_empty() {
                Ok(())
            } else {
                Err(left
                    .iter()
                    .map(|m| format!("{} {:?}", m.name_any(), m.annotations()))
                    .collect::<Vec<_>>()
                    .join("; "))
            }
        })
        .await
        .unwrap();
    assert_eq!(
        snapshot(&sandbox, &admin).await.members.len(),
        3,
        "a member was removed during teardown"
    );
    assert_eq!(event_count(&sandbox, "EtcdMemberRemoved").await, 0);
    controller.stop().await;
}

/// A Machine cluster-api-k3s made from another `serverConfig` (its record says
/// so) is outdated and rolled like one we made from another spec; the ones
/// made from the current `serverConfig`, recorded with upstream's defaults
/// written out, are not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_upstream_made_from_another_server_config_is_rolled_out() {
    init_logs();
    let sandbox = Sandbox::start(3).await.unwrap();
    let all: Vec<&str> = sandbox.machines.iter().map(String::as_str).collect();
    as_upstream_left_it(&sandbox, &[]).await;
    let (stale, current) = (&sandbox.machines[0], &sandbox.machines[1]);
    annotate_machine(
        &sandbox,
        stale,
        json!({UPSTREAM_SERVER_CONFIG_ANNOTATION: r#"{"disableComponents":["servicelb"]}"#}),
    )
    .await;
    annotate_machine(
        &sandbox,
        current,
        json!({UPSTREAM_SERVER_CONFIG_ANNOTATION:
            r#"{"disableComponents":["traefik"],"disableCloudController":true,"cloudProviderName":"external"}"#}),
    )
    .await;

    let controller = sandbox.start_controller();
    sandbox
        .wait_for("the stale Machine to be replaced", LIMIT, || async {
            let names = machine_names(&sandbox).await;
            if names.iter().any(|n| !all.contains(&n.as_str())) {
                Ok(())
            } else {
                Err(format!("Machines {names:?}"))
            }
        })
        .await
        .unwrap();
    let status = kcp(&sandbox).await.status.unwrap_or_default();
    let up_to_date = status
        .conditions
        .iter()
        .find(|c| c.type_ == "MachinesUpToDate")
        .expect("MachinesUpToDate condition");
    assert_eq!(up_to_date.status, "False", "{up_to_date:?}");
    assert!(
        up_to_date.message.contains(stale.as_str())
            && up_to_date.message.contains("kthrees-server-configuration")
            && !up_to_date.message.contains(current.as_str()),
        "{}",
        up_to_date.message
    );
    controller.stop().await;
}
