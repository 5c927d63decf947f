//! End to end against the simulated k3s (src/harness/k3s_agent.rs), which
//! does what k3s's source does to Nodes and members: its member controller's
//! Node finalizer and member removal on Node deletion, and the leader's
//! learner tick. Raft timing is k3s's (500/5000 ms), the harness default.

use crate::support;

use std::time::Duration;

use k3s_control_plane::api::names::K3S_ETCD_NODE_FINALIZER;
use k3s_control_plane::harness::k3s_agent::{K3sAction, K3sAgent, K3sAgentSettings};
use k3s_control_plane::harness::sandbox::Sandbox;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use support::*;

async fn wait_finalizers(sandbox: &Sandbox) {
    let nodes: Api<Node> = Api::all(sandbox.workload.client());
    sandbox
        .wait_for("k3s's finalizer on every Node", LIMIT, || async {
            let list = nodes
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?;
            match list
                .items
                .iter()
                .find(|n| !n.finalizers().iter().any(|f| f == K3S_ETCD_NODE_FINALIZER))
            {
                Some(n) => Err(format!("{} has none", n.name_any())),
                None => Ok(()),
            }
        })
        .await
        .unwrap();
}

/// The simulated k3s on every server, its finalizer on every Node, with a
/// 1 s learner tick: the tests that use it are not about the tick (its
/// 15 s default is k3s's; the learner tests set their own).
async fn start_k3s_with_a_short_tick(sandbox: &Sandbox) -> K3sAgent {
    let k3s = sandbox.start_k3s_agent(K3sAgentSettings {
        tick: Duration::from_secs(1),
        ..K3sAgentSettings::default()
    });
    wait_finalizers(sandbox).await;
    k3s
}

/// The index of a member that does not lead etcd.
async fn a_follower(sandbox: &Sandbox) -> usize {
    let leader = sandbox
        .etcd
        .connect()
        .snapshot()
        .await
        .unwrap()
        .leader
        .unwrap();
    (0..3)
        .find(|i| sandbox.etcd.member(*i).id != leader)
        .unwrap()
}

/// A Machine's `EtcdMemberHealthy` condition: (status, reason, message).
fn etcd_member_condition(
    machine: &k3s_control_plane::api::Machine,
) -> Option<(String, String, String)> {
    use k3s_control_plane::api::condition_names::ETCD_MEMBER_HEALTHY;
    machine.status.as_ref().and_then(|s| {
        s.conditions
            .iter()
            .find(|c| c.type_ == ETCD_MEMBER_HEALTHY)
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    })
}

/// A Node deleted while the controller removes its Machine: k3s removes the
/// member itself (no quorum check of its own); the controller observes that
/// instead of fighting it, and the removal ends with the Machine gone and a
/// replacement, without a failed step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_deleted_in_the_middle_of_a_removal_is_observed_not_fought() {
    init_logs();
    let sandbox = Sandbox::start(3).await.unwrap();
    let k3s = start_k3s_with_a_short_tick(&sandbox).await;
    let index = a_follower(&sandbox).await;
    let admin = sandbox.etcd.connect();
    let target = sandbox.machines[index].clone();
    let node = sandbox.etcd.member(index).node_name.clone();
    let member = sandbox.etcd.member(index).name.clone();

    let controller = sandbox.start_controller();
    sandbox.mark_unhealthy(&target).await.unwrap();
    // The removal has begun (our hook is on the Machine): the Node goes.
    sandbox
        .wait_for("our pre-terminate hook on the target", LIMIT, || async {
            let m = sandbox
                .machines_api()
                .get(&target)
                .await
                .map_err(|e| e.to_string())?;
            m.annotations()
                .keys()
                .any(|k| k.starts_with("pre-terminate.delete.hook.machine.cluster.x-k8s.io/"))
                .then_some(())
                .ok_or_else(|| "no hook yet".to_string())
        })
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(sandbox.workload.client());
    nodes.delete(&node, &DeleteParams::default()).await.unwrap();

    // k3s removed the member, once.
    sandbox
        .wait_for("k3s to remove the member", LIMIT, || async {
            let snap = admin.snapshot().await.map_err(|e| e.to_string())?;
            snap.member_by_name(&member)
                .map_or(Ok(()), |_| Err(format!("{member} still a member")))
        })
        .await
        .unwrap();
    // The controller finishes the removal: Machine gone, replacement made.
    sandbox
        .wait_for("the Machine replaced", LIMIT, || async {
            let names = machine_names(&sandbox).await;
            if names.contains(&target) {
                return Err(format!("{target} still there: {names:?}"));
            }
            names
                .iter()
                .find(|n| !sandbox.machines.contains(n))
                .cloned()
                .ok_or_else(|| format!("no replacement: {names:?}"))
        })
        .await
        .unwrap();
    // k3s reacts within 200 ms, but once the Node is gone CAPI's drain has
    // nothing to wait for, so the controller may remove the member first;
    // then k3s finds none to remove and lets the Node go. Either way the
    // member was removed once, by one of them, and nobody failed.
    let removed: Vec<_> = k3s
        .actions()
        .into_iter()
        .filter(|a| matches!(a, K3sAction::RemovedMember { .. }))
        .collect();
    assert!(
        removed.is_empty()
            || removed
                == vec![K3sAction::RemovedMember {
                    node: node.clone(),
                    member: member.clone(),
                }],
        "k3s removed nothing else: {removed:?}"
    );
    sandbox
        .wait_for(
            "the Node gone (k3s released its finalizer)",
            LIMIT,
            || async {
                match nodes.get_opt(&node).await.map_err(|e| e.to_string())? {
                    Some(_) => Err("still there".to_string()),
                    None => Ok(()),
                }
            },
        )
        .await
        .unwrap();
    assert_eq!(admin.snapshot().await.unwrap().members.len(), 2);
    let failed = event_notes(&sandbox, "StepFailed").await;
    assert!(failed.is_empty(), "no step failed fighting k3s: {failed:?}");
    controller.stop().await;
    k3s.stop().await;
}

/// A learner (a server still joining, its Node already registered, as k3s
/// registers it before promotion) blocks every removal; once the leader's
/// tick promotes it, the remediation proceeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_blocks_a_removal_until_k3s_promotes_it() {
    init_logs();
    let mut sandbox = Sandbox::start(3).await.unwrap();
    let index = sandbox.etcd.add_learner().await.unwrap();
    let (node, ip, learner) = {
        let m = sandbox.etcd.member(index);
        (m.node_name.clone(), m.ip.to_string(), m.name.clone())
    };
    sandbox.add_node(&node, &ip, Some(&learner)).await.unwrap();
    let target = sandbox.machines[0].clone();
    let target_member = sandbox.etcd.member(0).name.clone();
    let controller = sandbox.start_controller();
    sandbox.mark_unhealthy(&target).await.unwrap();

    // Before k3s promotes: the remediation waits, saying why.
    let admin = sandbox.etcd.connect();
    let waiting = sandbox
        .wait_for("the remediation to wait for the learner", LIMIT, || async {
            let kcp = kcp(&sandbox).await;
            let message = kcp
                .status
                .as_ref()
                .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Remediating"))
                .map(|c| c.message.clone())
                .unwrap_or_default();
            message
                .contains("learner")
                .then_some(message.clone())
                .ok_or(message)
        })
        .await
        .unwrap();
    assert!(waiting.contains(&learner), "{waiting}");
    let snap = admin.snapshot().await.unwrap();
    assert!(
        snap.member_by_name(&target_member).is_some(),
        "nothing removed while a learner exists"
    );

    // k3s's tick: promoted, then the remediation goes on.
    let k3s = sandbox.start_k3s_agent(K3sAgentSettings {
        // Short, so the test does not wait k3s's 15 s.
        tick: Duration::from_secs(2),
        ..K3sAgentSettings::default()
    });
    sandbox
        .wait_for(
            "the target's member removed after the promotion",
            LIMIT,
            || async {
                let snap = admin.snapshot().await.map_err(|e| e.to_string())?;
                snap.member_by_name(&target_member)
                    .map_or(Ok(()), |_| Err(format!("{target_member} still a member")))
            },
        )
        .await
        .unwrap();
    assert!(
        k3s.actions().iter().any(
            |a| matches!(a, K3sAction::PromotedLearner { member } if member.contains(&learner))
        ),
        "k3s promoted {learner}: {:?}",
        k3s.actions()
    );
    let snap = admin.snapshot().await.unwrap();
    assert!(
        snap.members.iter().all(|m| !m.learner),
        "promoted: {snap:?}"
    );
    controller.stop().await;
    k3s.stop().await;
}

/// Quorum lost, and a Node deleted: k3s cannot list the members, so its
/// finalizer stays and the Node hangs in Terminating (as k3s's handler keeps
/// failing); the controller removes nothing meanwhile. Once quorum is back,
/// k3s removes the member and the Node goes: it did not hold it forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_stuck_terminating_after_quorum_loss_is_released_when_quorum_returns() {
    init_logs();
    let mut sandbox = Sandbox::start(3).await.unwrap();
    let k3s = start_k3s_with_a_short_tick(&sandbox).await;
    let node = sandbox.etcd.member(0).node_name.clone();
    let member = sandbox.etcd.member(0).name.clone();
    let controller = sandbox.start_controller();
    // Two of three members down: no quorum, the member list fails.
    sandbox.etcd.stop(1).await.unwrap();
    sandbox.etcd.stop(2).await.unwrap();
    let nodes: Api<Node> = Api::all(sandbox.workload.client());
    nodes.delete(&node, &DeleteParams::default()).await.unwrap();
    sandbox
        .wait_for("k3s to keep its finalizer", LIMIT, || async {
            k3s.actions()
                .iter()
                .any(|a| matches!(a, K3sAction::KeptFinalizer { node: n, .. } if *n == node))
                .then_some(())
                .ok_or_else(|| format!("{:?}", k3s.actions()))
        })
        .await
        .unwrap();
    let stuck = nodes.get(&node).await.expect("the Node is still there");
    assert!(stuck.metadata.deletion_timestamp.is_some(), "Terminating");
    assert!(
        stuck
            .finalizers()
            .iter()
            .any(|f| f == K3S_ETCD_NODE_FINALIZER)
    );
    wait_reconciles(&sandbox, &controller.ctx, 3).await;
    assert_eq!(
        machine_names(&sandbox).await.len(),
        3,
        "nothing removed without quorum"
    );

    // Quorum back: k3s removes the member and lets the Node go.
    sandbox.etcd.restart(1).await.unwrap();
    sandbox.etcd.restart(2).await.unwrap();
    sandbox
        .wait_for(
            "the Node gone once k3s removed its member",
            LIMIT,
            || async {
                match nodes.get_opt(&node).await.map_err(|e| e.to_string())? {
                    Some(_) => Err("still Terminating".to_string()),
                    None => Ok(()),
                }
            },
        )
        .await
        .unwrap();
    assert!(
        k3s.actions().contains(&K3sAction::RemovedMember {
            node: node.clone(),
            member: member.clone()
        }),
        "{:?}",
        k3s.actions()
    );
    controller.stop().await;
    k3s.stop().await;
}

/// k3s restarts on a server between the removal of its member and the release
/// of our hook (docs/k3s.md T1, T2): its tombstone makes it back up its data
/// and join again as a learner under a new name, mapped to the same deleting
/// Machine. The controller removes that learner too before releasing the
/// hook (it would otherwise be promoted and die with the VM), asks for the
/// old member no more, deletes nothing twice, and no step fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_rejoins_after_its_removal_is_removed_again_before_the_hook_goes() {
    use k3s_control_plane::api::names::PRE_TERMINATE_HOOK_ANNOTATION;
    use kube::api::{Patch, PatchParams};
    init_logs();
    let mut sandbox = Sandbox::start(3).await.unwrap();
    let index = a_follower(&sandbox).await;
    let admin = sandbox.etcd.connect();
    let target = sandbox.machines[index].clone();
    let (old_name, old_id) = {
        let m = sandbox.etcd.member(index);
        (m.name.clone(), m.id)
    };
    // Where a removal of ours stood: the Machine deleting with our hook
    // recording its member, and that member removed.
    sandbox
        .machines_api()
        .patch(
            &target,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"annotations": {
                PRE_TERMINATE_HOOK_ANNOTATION:
                    k3s_control_plane::remediation::steps::hook_value(Some(old_id)),
            }}})),
        )
        .await
        .unwrap();
    sandbox
        .machines_api()
        .delete(&target, &DeleteParams::default())
        .await
        .unwrap();
    admin.remove_member(old_id).await.unwrap();
    sandbox
        .etcd
        .wait_exited(index, LIMIT)
        .await
        .expect("a removed member stops (k3s writes its tombstone)");

    // k3s restarts there: a new member under a new name, a learner.
    let new_name = sandbox.restart_k3s_server(index).await.unwrap();
    assert_ne!(new_name, old_name);
    let node = sandbox.etcd.member(index).node_name.clone();
    assert!(
        new_name.starts_with(&format!("{node}-")),
        "k3s names it <node>-<8 hex>: {new_name}"
    );
    let snap = admin.snapshot().await.unwrap();
    let rejoined = snap.member_by_name(&new_name).expect("rejoined").clone();
    assert!(rejoined.learner, "it joins as a learner: {snap:?}");

    let controller = sandbox.start_controller();
    sandbox
        .wait_for("the Machine gone", LIMIT, || async {
            let names = machine_names(&sandbox).await;
            (!names.contains(&target))
                .then_some(())
                .ok_or_else(|| format!("{target} still there: {names:?}"))
        })
        .await
        .unwrap();
    let snap = admin.snapshot().await.unwrap();
    assert!(
        snap.member_by_name(&new_name).is_none(),
        "the rejoined member went before the hook: {snap:?}"
    );
    assert_eq!(snap.members.len(), 2, "{snap:?}");
    let removed = event_notes(&sandbox, "EtcdMemberRemoved").await;
    assert_eq!(
        removed.len(),
        1,
        "one removal, of the new member: {removed:?}"
    );
    assert!(
        removed[0].contains(&new_name) && !removed[0].contains(&old_name),
        "{removed:?}"
    );
    let failed = event_notes(&sandbox, "StepFailed").await;
    assert!(failed.is_empty(), "no step failed: {failed:?}");
    assert_eq!(
        event_count(&sandbox, "MachineDeleting").await,
        0,
        "deleted once, before"
    );
    controller.stop().await;
}

/// A learner that stopped catching up (its server hangs) blocks every
/// removal; k3s's leader evicts it once its applied index has not grown for
/// the stall period (docs/k3s.md L3), and the pending remediation then goes
/// ahead with no action of ours; the evicted server's Node reads
/// `EtcdIsVoter=False` (`NotAMember`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_learner_blocks_removals_until_k3s_evicts_it() {
    use k3s_control_plane::api::names::{K3S_ETCD_IS_VOTER_CONDITION, K3S_NOT_A_MEMBER_REASON};
    init_logs();
    let mut sandbox = Sandbox::start(3).await.unwrap();
    let index = sandbox.etcd.add_learner().await.unwrap();
    let (node, ip, learner) = {
        let m = sandbox.etcd.member(index);
        (m.node_name.clone(), m.ip.to_string(), m.name.clone())
    };
    sandbox.add_node(&node, &ip, Some(&learner)).await.unwrap();
    // The learner's server hangs, and the cluster moves on without it: it is
    // far behind the leader, so etcd refuses to promote it.
    sandbox.etcd.pause(index).unwrap();
    for k in 0..100 {
        sandbox
            .etcd
            .put(0, &format!("/registry/filler/{k}"), vec![0; 16])
            .await
            .unwrap();
    }
    let target = sandbox.machines[0].clone();
    let target_member = sandbox.etcd.member(0).name.clone();
    let controller = sandbox.start_controller();
    sandbox.mark_unhealthy(&target).await.unwrap();
    let admin = sandbox.etcd.connect();
    sandbox
        .wait_for("the remediation to wait for the learner", LIMIT, || async {
            let message = kcp(&sandbox)
                .await
                .status
                .as_ref()
                .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Remediating"))
                .map(|c| c.message.clone())
                .unwrap_or_default();
            message.contains(&learner).then_some(()).ok_or(message)
        })
        .await
        .unwrap();

    let k3s = sandbox.start_k3s_agent(K3sAgentSettings {
        // Shortened from k3s's 15 s and 5 min so the test runs in seconds;
        // what matters is who acts, not how long k3s waits.
        tick: Duration::from_secs(1),
        stall_after: Duration::from_secs(4),
        ..K3sAgentSettings::default()
    });
    sandbox
        .wait_for(
            "the target's member removed after the eviction",
            LIMIT,
            || async {
                let snap = admin.snapshot().await.map_err(|e| e.to_string())?;
                snap.member_by_name(&target_member)
                    .map_or(Ok(()), |_| Err(format!("{target_member} still a member")))
            },
        )
        .await
        .unwrap();
    let actions = k3s.actions();
    assert!(
        actions.iter().any(
            |a| matches!(a, K3sAction::EvictedStalledLearner { member } if member.contains(&learner))
        ),
        "k3s evicted {learner}: {actions:?}"
    );
    assert!(
        !actions
            .iter()
            .any(|a| matches!(a, K3sAction::PromotedLearner { .. })),
        "a learner behind is never promoted: {actions:?}"
    );
    let nodes: Api<Node> = Api::all(sandbox.workload.client());
    sandbox
        .wait_for(
            "EtcdIsVoter=False NotAMember on the evicted server's Node",
            LIMIT,
            || async {
                let n = nodes.get(&node).await.map_err(|e| e.to_string())?;
                let c = n
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .into_iter()
                    .find(|c| c.type_ == K3S_ETCD_IS_VOTER_CONDITION);
                match c {
                    Some(c)
                        if c.status == "False"
                            && c.reason.as_deref() == Some(K3S_NOT_A_MEMBER_REASON) =>
                    {
                        Ok(())
                    }
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await
        .unwrap();
    sandbox.etcd.resume(index).unwrap();
    controller.stop().await;
    k3s.stop().await;
}

/// cluster-api-k3s scaled a Machine down and k3s removed its member through
/// the `etcd.k3s.cattle.io/remove` annotation (docs/k3s.md M3: the member
/// goes, `removed-node-name` is written and the member's annotations are
/// dropped), then upstream stopped with the Machine deleting under its hook.
/// The controller takes it over and releases both hooks with no etcd step
/// and no `upstream-member-unknown` refusal: every remaining member is
/// claimed by another Machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_k3s_removed_through_the_annotation_lets_the_upstream_hook_go() {
    use k3s_control_plane::api::names::{
        K3S_ETCD_NODE_NAME_ANNOTATION, UPSTREAM_PRE_TERMINATE_HOOK_ANNOTATION,
        UPSTREAM_PRE_TERMINATE_HOOK_VALUE,
    };
    use k3s_control_plane::harness::k3s_agent::{REMOVE_ANNOTATION, REMOVED_NODE_NAME_ANNOTATION};
    use kube::api::{Patch, PatchParams};
    init_logs();
    let sandbox = Sandbox::start(3).await.unwrap();
    let k3s = start_k3s_with_a_short_tick(&sandbox).await;
    let index = a_follower(&sandbox).await;
    let admin = sandbox.etcd.connect();
    let target = sandbox.machines[index].clone();
    let node = sandbox.etcd.member(index).node_name.clone();
    let member = sandbox.etcd.member(index).name.clone();
    let nodes: Api<Node> = Api::all(sandbox.workload.client());
    // What cluster-api-k3s does for a scale-down: its hook, the Machine
    // deleted, the Node annotated for k3s.
    sandbox
        .machines_api()
        .patch(
            &target,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"annotations": {
                UPSTREAM_PRE_TERMINATE_HOOK_ANNOTATION: UPSTREAM_PRE_TERMINATE_HOOK_VALUE,
            }}})),
        )
        .await
        .unwrap();
    sandbox
        .machines_api()
        .delete(&target, &DeleteParams::default())
        .await
        .unwrap();
    nodes
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(
                serde_json::json!({"metadata": {"annotations": {REMOVE_ANNOTATION: "true"}}}),
            ),
        )
        .await
        .unwrap();
    sandbox
        .wait_for("k3s to remove the member and say so", LIMIT, || async {
            let n = nodes.get(&node).await.map_err(|e| e.to_string())?;
            let a = n.annotations();
            match (
                a.get(REMOVED_NODE_NAME_ANNOTATION),
                a.get(K3S_ETCD_NODE_NAME_ANNOTATION),
            ) {
                (Some(removed), None) if *removed == member => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await
        .unwrap();
    assert!(
        admin
            .snapshot()
            .await
            .unwrap()
            .member_by_name(&member)
            .is_none()
    );

    let controller = sandbox.start_controller();
    sandbox
        .wait_for("the Machine gone", LIMIT, || async {
            let names = machine_names(&sandbox).await;
            (!names.contains(&target))
                .then_some(())
                .ok_or_else(|| format!("{target} still there: {names:?}"))
        })
        .await
        .unwrap();
    assert_eq!(event_count(&sandbox, "UpstreamHookReleased").await, 1);
    for reason in [
        "EtcdMemberRemoved",
        "EtcdLeadershipMoved",
        "StepFailed",
        "RemovalBlocked",
    ] {
        assert_eq!(event_count(&sandbox, reason).await, 0, "{reason}");
    }
    assert_eq!(admin.snapshot().await.unwrap().members.len(), 2);
    let removed: Vec<_> = k3s
        .actions()
        .into_iter()
        .filter(|a| matches!(a, K3sAction::RemovedMember { .. }))
        .collect();
    assert_eq!(
        removed,
        vec![K3sAction::RemovedMember { node, member }],
        "k3s removed that member once, and nothing else"
    );
    controller.stop().await;
    k3s.stop().await;
}

/// An etcd-only server (k3s `--disable-apiserver`) gets the etcd label and
/// none of the control-plane ones (docs/k3s.md D3). Its member is still
/// found through its Node (seed, claim), its Machine's member is reported
/// healthy, and it counts for quorum when another Machine is remediated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_only_server_is_seen_claimed_and_counted() {
    use k3s_control_plane::api::names::NODE_ROLE_CONTROL_PLANE_LABEL;
    use kube::api::{Patch, PatchParams};
    init_logs();
    let sandbox = Sandbox::start(3).await.unwrap();
    let admin = sandbox.etcd.connect();
    let leader = admin.snapshot().await.unwrap().leader.unwrap();
    let followers: Vec<usize> = (0..3)
        .filter(|i| sandbox.etcd.member(*i).id != leader)
        .collect();
    let (etcd_only, target) = (followers[0], followers[1]);
    let etcd_only_machine = sandbox.machines[etcd_only].clone();
    let etcd_only_node = sandbox.etcd.member(etcd_only).node_name.clone();
    let nodes: Api<Node> = Api::all(sandbox.workload.client());
    nodes
        .patch(
            &etcd_only_node,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {
                NODE_ROLE_CONTROL_PLANE_LABEL: null,
            }}})),
        )
        .await
        .unwrap();
    let controller = sandbox.start_controller();
    sandbox
        .wait_for(
            "EtcdMemberHealthy=True on the etcd-only server's Machine",
            LIMIT,
            || async {
                let m = sandbox
                    .machines_api()
                    .get(&etcd_only_machine)
                    .await
                    .map_err(|e| e.to_string())?;
                match m.condition("EtcdMemberHealthy") {
                    Some(c) if c.status == "True" => Ok(()),
                    other => Err(format!(
                        "{:?}",
                        other.map(|c| (c.status.to_string(), c.message.to_string()))
                    )),
                }
            },
        )
        .await
        .unwrap();
    // Another Machine remediated: the etcd-only member counts for quorum and
    // stays; the target's member goes.
    let target_machine = sandbox.machines[target].clone();
    let target_member = sandbox.etcd.member(target).name.clone();
    let etcd_only_member = sandbox.etcd.member(etcd_only).name.clone();
    sandbox.mark_unhealthy(&target_machine).await.unwrap();
    sandbox
        .wait_for("the target's member removed", LIMIT, || async {
            let snap = admin.snapshot().await.map_err(|e| e.to_string())?;
            snap.member_by_name(&target_member)
                .map_or(Ok(()), |_| Err(format!("{target_member} still a member")))
        })
        .await
        .unwrap();
    let snap = admin.snapshot().await.unwrap();
    assert!(snap.member_by_name(&etcd_only_member).is_some(), "{snap:?}");
    let removed = event_notes(&sandbox, "EtcdMemberRemoved").await;
    assert!(
        removed.len() == 1 && removed[0].contains("2 of 2 voters healthy"),
        "the removal counted the etcd-only member: {removed:?}"
    );
    controller.stop().await;
}

/// The first server (no `server:` to rejoin) restarts after its member was
/// removed and, as the January 2026 k3s releases did, starts a one-member
/// cluster of its own on the same address (docs/k3s.md T3). As on k3s (the
/// harness bootstraps as k3s does, E5), the rogue has the real cluster's id
/// and the removed member's id: only the member lists tell them apart. A
/// controller that meets it first (fresh, its Node first among the seeds)
/// must keep to the real cluster: the hook goes because the member is gone
/// from the real membership, the replacement joins the real cluster, and
/// nothing is removed anywhere (the rogue dies with its VM). With a rule
/// that compares cluster ids only, the controller lists from the rogue, the
/// removed member looks present, and the Machine never goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_server_restarted_as_a_cluster_of_its_own_is_not_taken_for_the_cluster() {
    use k3s_control_plane::api::names::PRE_TERMINATE_HOOK_ANNOTATION;
    use kube::api::{Patch, PatchParams};
    init_logs();
    let mut sandbox = Sandbox::start(3).await.unwrap();
    let admin = sandbox.etcd.connect();
    let first = 0;
    let target = sandbox.machines[first].clone();
    let (old_name, old_id) = {
        let m = sandbox.etcd.member(first);
        (m.name.clone(), m.id)
    };
    let others: Vec<String> = (1..3)
        .map(|i| sandbox.etcd.member(i).name.clone())
        .collect();
    // Where a removal of ours stood: the Machine deleting with our hook
    // recording its member, and that member removed.
    sandbox
        .machines_api()
        .patch(
            &target,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"annotations": {
                PRE_TERMINATE_HOOK_ANNOTATION:
                    k3s_control_plane::remediation::steps::hook_value(Some(old_id)),
            }}})),
        )
        .await
        .unwrap();
    sandbox
        .machines_api()
        .delete(&target, &DeleteParams::default())
        .await
        .unwrap();
    admin.remove_member(old_id).await.unwrap();
    sandbox.etcd.wait_exited(first, LIMIT).await.unwrap();
    let real_id = admin.snapshot().await.unwrap().cluster_id;

    let rogue_name = sandbox.restart_first_server_alone(first).await.unwrap();
    let rogue = k3s_control_plane::etcd::EtcdCluster::with_options(
        &[sandbox.etcd.member(first).client_url()],
        sandbox.etcd.client_tls(),
        sandbox.etcd.transport(),
        k3s_control_plane::etcd::Timeouts::default(),
    )
    .unwrap()
    .snapshot()
    .await
    .unwrap();
    assert_eq!(
        rogue.cluster_id, real_id,
        "bootstrapped alone with etcd's default token: the rogue has the real cluster's id"
    );
    assert_eq!(
        rogue.members.iter().map(|m| m.id).collect::<Vec<_>>(),
        vec![old_id],
        "same peer URL and token: the rogue's only member has the removed member's id"
    );

    // A fresh handle (the rogue's Node first among the seeds) finds the
    // real cluster and reports the rogue.
    let fresh = sandbox.etcd.connect().snapshot().await.unwrap();
    assert_eq!(fresh.cluster_id, real_id, "{fresh:?}");
    assert!(
        fresh
            .foreign_clusters
            .iter()
            .any(|f| f.members == vec![rogue_name.clone()]),
        "the rogue is reported, not used: {fresh:?}"
    );

    let controller = sandbox.start_controller();
    // The simulated infrastructure boots the replacement the controller
    // creates; it joins through the real cluster's members.
    let deadline = tokio::time::Instant::now() + LIMIT * 2;
    loop {
        k3s_control_plane::harness::infra_sim::reconcile_infrastructure(&mut sandbox, LIMIT)
            .await
            .unwrap();
        let names = machine_names(&sandbox).await;
        let snap = sandbox.etcd.connect().snapshot().await.unwrap();
        let voters = snap.members.iter().filter(|m| !m.learner).count();
        if !names.contains(&target)
            && voters == 3
            && snap.members.iter().all(|m| m.unhealthy_reason().is_none())
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not replaced in time: Machines {names:?}, members {:?}",
            member_names(&snap)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let snap = sandbox.etcd.connect().snapshot().await.unwrap();
    assert_eq!(snap.cluster_id, real_id, "the real cluster, as before");
    for name in &others {
        assert!(
            snap.member_by_name(name).is_some(),
            "{name} was never removed: {snap:?}"
        );
    }
    assert!(event_notes(&sandbox, "EtcdMemberRemoved").await.is_empty());
    let failed = event_notes(&sandbox, "StepFailed").await;
    assert!(failed.is_empty(), "no step failed: {failed:?}");
    assert_ne!(rogue_name, old_name);
    controller.stop().await;
}

/// After `k3s server --cluster-reset` on one server and its next normal
/// start (docs/k3s.md CR1, CR2), one member is left under a new name; the
/// other servers' Nodes keep their etcd marks while their etcd stays down.
/// The reset server's Machine maps by its new `node-name` annotation; the
/// others turn `EtcdMemberHealthy=False` (`EtcdMemberMissing`) after the
/// grace, and once a MachineHealthCheck marks them they are replaced one at
/// a time, the remaining member never touched. (Grace 3 s instead of 120 s:
/// the wait itself is table-tested in decision::view.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_cluster_reset_the_other_servers_are_missing_members_and_replaced_one_at_a_time() {
    use k3s_control_plane::harness::infra_sim::reconcile_infrastructure;
    use k3s_control_plane::harness::sandbox::fast_settings;
    init_logs();
    let mut sandbox = Sandbox::start(3).await.unwrap();
    let kept = 1;
    let kept_machine = sandbox.machines[kept].clone();
    let kept_id = sandbox.etcd.member(kept).id;
    let new_name = sandbox.cluster_reset(kept).await.unwrap();
    let lost: Vec<String> = [0, 2].map(|i| sandbox.machines[i].clone()).to_vec();
    let snap = sandbox.etcd.connect().snapshot().await.unwrap();
    assert_eq!(member_names(&snap), vec![new_name.clone()], "{snap:?}");
    assert_eq!(snap.members[0].id, kept_id, "a reset keeps the member id");

    let controller = sandbox.start_controller_with(k3s_control_plane::controller::Settings {
        member_missing_grace: Duration::from_secs(3),
        ..fast_settings()
    });
    sandbox
        .wait_for(
            "the lost servers' members missing, the kept one healthy",
            LIMIT,
            || async {
                let all = machines(&sandbox).await;
                let mut seen = Vec::new();
                for m in &all {
                    let name = m.name_any();
                    let condition = etcd_member_condition(m);
                    let ok = match condition.as_ref() {
                        Some((status, reason, message)) if lost.contains(&name) => {
                            status == "False"
                                && reason == "EtcdMemberMissing"
                                && message.contains("since")
                        }
                        Some((status, _, message)) if name == kept_machine => {
                            status == "True" && message.contains(&new_name)
                        }
                        _ => false,
                    };
                    if !ok {
                        seen.push(format!("{name}: {condition:?}"));
                    }
                }
                seen.is_empty().then_some(()).ok_or_else(|| seen.join("; "))
            },
        )
        .await
        .unwrap();

    // A MachineHealthCheck on EtcdMemberHealthy=False marks both.
    for machine in &lost {
        sandbox.mark_unhealthy(machine).await.unwrap();
    }
    let deadline = tokio::time::Instant::now() + LIMIT * 3;
    loop {
        reconcile_infrastructure(&mut sandbox, LIMIT).await.unwrap();
        let all = machines(&sandbox).await;
        assert!(
            all.iter().filter(|m| m.is_deleting()).count() <= 1,
            "one Machine at a time: {:?}",
            all.iter().map(|m| m.name_any()).collect::<Vec<_>>()
        );
        let snap = sandbox.etcd.connect().snapshot().await.unwrap();
        assert!(
            snap.member(kept_id).is_some(),
            "the remaining member is never removed: {snap:?}"
        );
        let voters = snap.members.iter().filter(|m| !m.learner).count();
        let names: Vec<String> = all.iter().map(|m| m.name_any()).collect();
        if voters == 3
            && all.len() == 3
            && !names.iter().any(|n| lost.contains(n))
            && all
                .iter()
                .all(|m| m.node_name().is_some() && !m.is_deleting())
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not replaced in time: Machines {names:?}, members {:?}",
            member_names(&snap)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        event_notes(&sandbox, "EtcdMemberRemoved").await.is_empty(),
        "no member to remove: the lost servers had none"
    );
    let failed = event_notes(&sandbox, "StepFailed").await;
    assert!(failed.is_empty(), "no step failed: {failed:?}");
    controller.stop().await;
}

/// Deleting the Node of a live etcd server by hand (docs/k3s.md M2): k3s
/// removes its member with no quorum check of its own and lets the Node go.
/// The controller does not fight it: it removes and deletes nothing and does
/// not call the member healthy. When k3s restarts there, etcd rejoins as a
/// learner under a new name (tombstone), the kubelet registers the Node with
/// k3s's member annotations, and once the leader's tick (1 s here; the tick
/// is tested with the learner tests) promotes it, the Machine's member is
/// healthy again under its new name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_deleted_by_hand_loses_its_member_and_the_server_rejoins_as_k3s_restarts() {
    init_logs();
    let mut sandbox = Sandbox::start(3).await.unwrap();
    let k3s = start_k3s_with_a_short_tick(&sandbox).await;
    let index = a_follower(&sandbox).await;
    let target = sandbox.machines[index].clone();
    let node = sandbox.etcd.member(index).node_name.clone();
    let member = sandbox.etcd.member(index).name.clone();
    let ip = sandbox.etcd.member(index).ip.to_string();
    let controller = sandbox.start_controller();
    let member_condition = async |sandbox: &Sandbox| {
        let m = sandbox
            .machines_api()
            .get(&target)
            .await
            .map_err(|e| e.to_string())?;
        etcd_member_condition(&m).ok_or_else(|| "no condition".to_string())
    };
    sandbox
        .wait_for("the target's member healthy", LIMIT, || async {
            let (status, _, message) = member_condition(&sandbox).await?;
            (status == "True").then_some(()).ok_or(message)
        })
        .await
        .unwrap();

    let nodes: Api<Node> = Api::all(sandbox.workload.client());
    nodes.delete(&node, &DeleteParams::default()).await.unwrap();
    sandbox
        .wait_for(
            "k3s to remove the member and let the Node go",
            LIMIT,
            || async {
                let gone = nodes
                    .get_opt(&node)
                    .await
                    .map_err(|e| e.to_string())?
                    .is_none();
                let removed = k3s.actions().contains(&K3sAction::RemovedMember {
                    node: node.clone(),
                    member: member.clone(),
                });
                (gone && removed)
                    .then_some(())
                    .ok_or_else(|| format!("gone {gone}, {:?}", k3s.actions()))
            },
        )
        .await
        .unwrap();
    sandbox.etcd.wait_exited(index, LIMIT).await.unwrap();
    // The server's Node gone and its member removed: nothing for the
    // controller to do but say so; it removes and deletes nothing.
    wait_reconciles(&sandbox, &controller.ctx, 3).await;
    let (status, _, message) = member_condition(&sandbox).await.unwrap();
    assert_ne!(status, "True", "no member, no Node: {message}");
    assert_eq!(machine_names(&sandbox).await.len(), 3, "nothing deleted");
    assert!(
        machines(&sandbox).await.iter().all(|m| !m.is_deleting()),
        "no Machine deleting"
    );

    // k3s restarts on that server (its etcd stopped when the member was
    // removed): the tombstone makes etcd rejoin first as a learner under a
    // new name (T1, T2), then the kubelet registers the Node and k3s writes
    // its member annotations (N1).
    let rejoined = sandbox.etcd.rejoin_after_tombstone(index).await.unwrap();
    sandbox.add_node(&node, &ip, Some(&rejoined)).await.unwrap();
    let healthy = sandbox
        .wait_for(
            "the rejoined member healthy on the target",
            LIMIT,
            || async {
                let (status, _, message) = member_condition(&sandbox).await?;
                (status == "True" && message.contains(&rejoined))
                    .then_some(message.clone())
                    .ok_or(message)
            },
        )
        .await
        .unwrap();
    assert!(healthy.contains(&rejoined), "{healthy}");
    assert!(event_notes(&sandbox, "EtcdMemberRemoved").await.is_empty());
    let failed = event_notes(&sandbox, "StepFailed").await;
    assert!(failed.is_empty(), "no step failed: {failed:?}");
    assert_eq!(machine_names(&sandbox).await.len(), 3, "nothing deleted");
    controller.stop().await;
    k3s.stop().await;
}
