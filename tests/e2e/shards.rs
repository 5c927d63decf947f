//! End to end, two watch-filter shards on one sandbox (real 3-member etcd,
//! test API servers, CAPI's Machine deletion simulated): a remediation started
//! by shard a is handed to shard b by relabelling the control plane and its
//! Cluster mid-way. Exactly one etcd member is removed over the whole run,
//! shard a takes no step once it has seen the relabel (and a reconcile of
//! shard a still holding the old object acts on nothing), shard b finishes,
//! 3 healthy voters at the end and quorum never lost (the quorum sampler).

use crate::support;

use std::sync::Arc;

use k3s_control_plane::api::names::{PRE_TERMINATE_HOOK_ANNOTATION, WATCH_FILTER_LABEL};
use k3s_control_plane::api::{Cluster, KThreesControlPlane};
use k3s_control_plane::controller::Settings;
use k3s_control_plane::controller::reconcile::reconcile;
use k3s_control_plane::harness::sandbox::{
    CLUSTER, KCP, NAMESPACE, Sandbox, controller_context, fast_settings, one_step_settings,
    spawn_controller,
};
use k3s_control_plane::remediation::steps::parse_hook_value;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use support::*;

async fn label_for(sandbox: &Sandbox, shard: &str) {
    let patch = json!({"metadata": {"labels": {WATCH_FILTER_LABEL: shard}}});
    // The Cluster first, then the control plane (what decides), as a person
    // or a script would relabel them one after the other.
    Api::<Cluster>::namespaced(sandbox.client(), NAMESPACE)
        .patch(CLUSTER, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    sandbox
        .kcp_api()
        .patch(KCP, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remediation_relabelled_to_another_shard_mid_way_is_finished_there_with_one_member_removed()
 {
    init_logs();
    let mut sandbox = Sandbox::start(3).await.unwrap();
    let admin = sandbox.etcd.connect();
    let original: Vec<String> = sandbox.etcd.member_names();
    let before = admin.snapshot().await.unwrap();
    // The leader's Machine: its removal has a leadership move between the
    // mark and the deletion, so there is a step to be caught in the middle of.
    let leader_index = sandbox
        .etcd
        .index_of(before.leader.expect("a leader"))
        .unwrap();
    let target = sandbox.machines[leader_index].clone();
    let target_member = sandbox.etcd.member(leader_index).name.clone();
    let original_machines = sandbox.machines.clone();
    label_for(&sandbox, "shard-a").await;

    let observer = Observer::start(&sandbox, original.clone());
    // Shard a takes one step per reconcile, so the test can relabel between two.
    let a = spawn_controller(controller_context(
        sandbox.client(),
        Settings {
            watch_filter: Some("shard-a".into()),
            ..one_step_settings()
        },
    ));
    let b = spawn_controller(controller_context(
        sandbox.client(),
        Settings {
            watch_filter: Some("shard-b".into()),
            ..fast_settings()
        },
    ));
    sandbox.mark_unhealthy(&target).await.unwrap();

    // Shard a has chosen the target (its member recorded in our hook's value)
    // and the Machine is not gone yet: relabel now.
    let machines = sandbox.machines_api();
    let at_relabel = sandbox
        .wait_for(
            "shard a to record the target's member in its hook",
            LIMIT,
            || async {
                let m = machines
                    .get_opt(&target)
                    .await
                    .map_err(|e| e.to_string())?
                    .ok_or("the Machine is already gone: no step was caught mid-way")?;
                let value = m
                    .annotations()
                    .get(PRE_TERMINATE_HOOK_ANNOTATION)
                    .cloned()
                    .unwrap_or_default();
                match parse_hook_value(&value) {
                    Ok(h) if h.removal_chosen && h.member.is_some() => Ok(m),
                    other => Err(format!("hook value {value:?}: {other:?}")),
                }
            },
        )
        .await
        .unwrap();
    let stale: KThreesControlPlane = sandbox.kcp_api().get(KCP).await.unwrap();
    assert_eq!(
        b.ctx.metrics.reconciles.get(),
        0,
        "shard b reconciled a control plane labelled for shard a"
    );
    assert!(
        a.ctx.metrics.actions.get() >= 2,
        "shard a started the removal"
    );
    label_for(&sandbox, "shard-b").await;
    eprintln!(
        "relabelled with the target {} deleting: {}, shard a's actions so far: {}",
        target,
        at_relabel.metadata.deletion_timestamp.is_some(),
        a.ctx.metrics.actions.get()
    );

    // Shard a sees it leave its watch and lets go.
    sandbox
        .wait_for("shard a to release the control plane", LIMIT, || async {
            if a.ctx.metrics.released_control_planes.get() >= 1 {
                Ok(())
            } else {
                Err("not yet".to_string())
            }
        })
        .await
        .unwrap();
    let a_actions = a.ctx.metrics.actions.get();
    let a_reconciles = a.ctx.metrics.reconciles.get();
    // A reconcile of shard a that still holds the object as it was before the
    // relabel (one under way at that moment) acts on nothing.
    // It refuses before acting, or, when what it decided acts on nothing,
    // its status write is refused by the server (conditional on the version
    // the relabel moved past): both leave the world as it was.
    match reconcile(Arc::new(stale), a.ctx.clone()).await {
        Ok(_) => {}
        Err(err) if err.is_conflict() => {}
        Err(err) => panic!("shard a's late reconcile: {err}"),
    }
    assert_eq!(
        a.ctx.metrics.actions.get(),
        a_actions,
        "shard a acted on the old object after the relabel"
    );

    // Shard b finishes: the member goes, the Machine goes, a replacement
    // joins as a voter, remediation-in-progress is cleared.
    drive(&mut sandbox, "hand-over", replaced(&target, 3)).await;
    wait_in_progress_cleared(&sandbox).await;
    let replacement = machines_now(&sandbox).await;
    assert!(
        replacement.iter().any(|m| !original_machines.contains(m)),
        "a replacement Machine: {replacement:?}"
    );

    // Exactly one member removed over the whole run: the target's.
    let after = snapshot(&sandbox, &admin).await;
    let gone: Vec<&String> = original
        .iter()
        .filter(|n| after.member_by_name(n).is_none())
        .collect();
    assert_eq!(
        gone,
        vec![&target_member],
        "members now: {:?}",
        member_names(&after)
    );
    assert_eq!(after.members.len(), 3);
    let record = observer.record().await;
    let most_missing = record
        .samples
        .iter()
        .map(|s| s.missing.len())
        .max()
        .unwrap();
    assert_eq!(
        most_missing, 1,
        "never more than one original member missing"
    );
    let summary = record.assert_safe("hand-over");
    eprintln!("hand-over: quorum sampler: {summary}");

    // Shard a took no step after it saw the relabel; shard b did the rest.
    assert_eq!(
        a.ctx.metrics.actions.get(),
        a_actions,
        "shard a acted after it released the control plane"
    );
    assert!(
        a.ctx.metrics.reconciles.get() <= a_reconciles + 1,
        "shard a went on reconciling: {} -> {} (one is the direct call above)",
        a_reconciles,
        a.ctx.metrics.reconciles.get()
    );
    assert!(
        b.ctx.metrics.actions.get() >= 1,
        "shard b took the remaining steps"
    );
    a.stop().await;
    b.stop().await;
}

async fn machines_now(sandbox: &Sandbox) -> Vec<String> {
    machine_names(sandbox).await
}

/// The reconcile under way at the moment of the relabel, made deterministic:
/// shard a takes the first step of a remediation (remediation-in-progress
/// recorded), the control plane is relabelled to shard b, and a reconcile of
/// shard a on the object as it held it (still labelled for shard a, and as
/// current as its own last write, so it is decided on without a read) is about
/// to take the next step, marking the target Machine's hook: a write to a
/// Machine, not conditional on the control plane's version. It refuses
/// (`shard.not-ours`) and writes nothing; shard b then finishes from what is
/// persisted, with one member removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_under_way_at_the_relabel_takes_no_step_and_the_new_shard_finishes() {
    init_logs();
    let mut sandbox = Sandbox::start(3).await.unwrap();
    let admin = sandbox.etcd.connect();
    let original: Vec<String> = sandbox.etcd.member_names();
    let target = sandbox.machines[0].clone();
    let target_member = sandbox.etcd.member(0).name.clone();
    label_for(&sandbox, "shard-a").await;
    let observer = Observer::start(&sandbox, original.clone());
    let a = controller_context(
        sandbox.client(),
        Settings {
            watch_filter: Some("shard-a".into()),
            ..one_step_settings()
        },
    );
    sandbox.mark_unhealthy(&target).await.unwrap();
    let hook = |m: &k3s_control_plane::api::Machine| {
        m.annotations()
            .get(PRE_TERMINATE_HOOK_ANNOTATION)
            .cloned()
            .unwrap_or_default()
    };
    // Shard a's reconciles, one step each, until the removal is recorded.
    let mut first_step = false;
    for _ in 0..10 {
        let now = sandbox.kcp_api().get(KCP).await.unwrap();
        if now
            .annotations()
            .contains_key(k3s_control_plane::api::names::REMEDIATION_IN_PROGRESS_ANNOTATION)
        {
            first_step = true;
            break;
        }
        reconcile(Arc::new(now), a.clone()).await.unwrap();
    }
    assert!(first_step, "shard a never recorded remediation-in-progress");
    let machines = sandbox.machines_api();
    let hook_before = hook(&machines.get(&target).await.unwrap());
    assert!(
        !parse_hook_value(&hook_before).unwrap().removal_chosen,
        "the target is not marked yet: {hook_before:?}"
    );
    let held = sandbox.kcp_api().get(KCP).await.unwrap();
    let actions = a.metrics.actions.get();
    label_for(&sandbox, "shard-b").await;

    reconcile(Arc::new(held), a.clone()).await.unwrap();
    assert_eq!(
        a.metrics.shard_refusals.get(),
        1,
        "refused by shard.not-ours"
    );
    assert_eq!(a.metrics.actions.get(), actions, "shard a took a step");
    assert_eq!(
        hook(&machines.get(&target).await.unwrap()),
        hook_before,
        "shard a marked the target after the relabel"
    );

    // Shard b resumes from the persisted record and finishes.
    let b = spawn_controller(controller_context(
        sandbox.client(),
        Settings {
            watch_filter: Some("shard-b".into()),
            ..fast_settings()
        },
    ));
    drive(
        &mut sandbox,
        "hand-over after the refusal",
        replaced(&target, 3),
    )
    .await;
    wait_in_progress_cleared(&sandbox).await;
    let after = snapshot(&sandbox, &admin).await;
    let gone: Vec<&String> = original
        .iter()
        .filter(|n| after.member_by_name(n).is_none())
        .collect();
    assert_eq!(
        gone,
        vec![&target_member],
        "members now: {:?}",
        member_names(&after)
    );
    let record = observer.record().await;
    let most_missing = record
        .samples
        .iter()
        .map(|s| s.missing.len())
        .max()
        .unwrap();
    assert_eq!(
        most_missing, 1,
        "never more than one original member missing"
    );
    record.assert_safe("hand-over after the refusal");
    assert_eq!(a.metrics.actions.get(), actions, "shard a acted later");
    assert!(
        b.ctx.metrics.actions.get() >= 2,
        "shard b marked, moved, removed"
    );
    b.stop().await;
}
