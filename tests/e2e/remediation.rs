//! End to end: real etcd, test API servers as management and workload
//! clusters, CAPI's Machine deletion simulated, and the real controller loop.
//! MHC remediation: the leader's machine, two machines at once, a removal that
//! would lose quorum, and the retry limits over a real sequence.

use crate::support;

use std::time::Duration;

use k3s_control_plane::api::names::{
    REMEDIATION_FOR_ANNOTATION, REMEDIATION_IN_PROGRESS_ANNOTATION,
};
use k3s_control_plane::harness::sandbox::Sandbox;
use kube::ResourceExt;
use support::*;

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
    // Steps after the first were decided in the reconcile of the step before
    // them (on a fresh read), not after a trip through the queue.
    assert!(
        controller.ctx.metrics.chained_steps.get() >= 1,
        "no removal step was chained"
    );
    controller.stop().await;
}

/// The Machine that replaced `target` (carries `remediation-for` naming it),
/// once `target` is gone.
async fn wait_replaced(sandbox: &Sandbox, target: &str) -> k3s_control_plane::api::Machine {
    sandbox
        .wait_for(&format!("{target} to be replaced"), LIMIT, || async {
            let all = machines(sandbox).await;
            if all.iter().any(|m| m.name_any() == target) {
                return Err(format!("{target} still exists"));
            }
            all.into_iter()
                .find(|m| remediation_for(m).is_some_and(|r| r["machine"] == target))
                .ok_or_else(|| format!("no replacement of {target} yet"))
        })
        .await
        .unwrap()
}

fn remediation_for(machine: &k3s_control_plane::api::Machine) -> Option<serde_json::Value> {
    machine
        .annotations()
        .get(REMEDIATION_FOR_ANNOTATION)
        .map(|v| serde_json::from_str(v).unwrap())
}

/// Promote a learner through a voter, retrying while etcd says it has not
/// caught up yet ("can only promote a learner member which is in sync").
async fn promote_learner(sandbox: &Sandbox, learner: u64, via: usize) {
    k3s_control_plane::install_crypto_provider();
    let tls = etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(sandbox.etcd.ca_pem()))
        .identity(etcd_client::Identity::from_pem(
            sandbox.etcd.pki.client.cert_pem.clone(),
            sandbox.etcd.pki.client.key_pem.clone(),
        ));
    let url = sandbox.etcd.member(via).client_url();
    sandbox
        .wait_for("the learner to be promoted", LIMIT, || {
            let (tls, url) = (tls.clone(), url.clone());
            async move {
                let options = etcd_client::ConnectOptions::new()
                    .with_tls(tls)
                    .with_timeout(Duration::from_secs(3));
                let mut client = etcd_client::Client::connect([url], Some(options))
                    .await
                    .map_err(|e| e.to_string())?;
                client
                    .member_promote(learner)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }
        })
        .await
        .unwrap();
}

/// Two machines marked at once, 3 members: exactly one is remediated at a time.
///
/// The rules pick one (the oldest, then by name: `cp-0`) and take it all the
/// way: member removed, Machine deleted, replacement created. The other is
/// then deferred (`RemediationDeferred`) while the replacement has no node:
/// the sandbox gives a Machine a node only when the test provisions it. We
/// provision it as k3s joins a server: a node whose etcd member joins as a
/// learner. The second is then refused for quorum (`CannotBeRemediated`: a
/// learner is not promoted yet, the voter set is about to change). Once the
/// learner is promoted, the second is remediated too. A concurrent observer
/// checks that no two Machines are ever deleting at once and that the second
/// member is never gone before the first replacement is provisioned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_machines_marked_at_once_are_remediated_one_at_a_time() {
    init_logs();
    let mut sandbox = Sandbox::start(3).await.unwrap();
    let admin = sandbox.etcd.connect();
    let original: Vec<String> = sandbox.etcd.member_names();
    let (first, second, survivor) = (
        sandbox.machines[0].clone(),
        sandbox.machines[1].clone(),
        2usize,
    );
    let first_member = sandbox.etcd.member(0).name.clone();
    let second_member = sandbox.etcd.member(1).name.clone();

    let observer = Observer::start(&sandbox, original.clone());
    sandbox.mark_unhealthy(&first).await.unwrap();
    sandbox.mark_unhealthy(&second).await.unwrap();
    let controller = sandbox.start_controller();

    // Phase 1: the first goes all the way; the second waits for the replacement's node.
    wait_member_gone(&sandbox, &admin, &first_member).await;
    let replacement = wait_replaced(&sandbox, &first).await.name_any();
    wait_in_progress_cleared(&sandbox).await;
    let deferred = wait_owner_remediated(
        &sandbox,
        &second,
        "RemediationDeferred",
        &["provisioning", &replacement],
    )
    .await;
    wait_reconciles(&sandbox, &controller.ctx, 2).await;
    let phase1 = observer.finish().await;
    assert!(!phase1.is_empty());
    let max_deleting = phase1.iter().map(|s| s.deleting.len()).max().unwrap();
    let max_missing = phase1.iter().map(|s| s.missing.len()).max().unwrap();
    assert_eq!(max_deleting, 1, "exactly one Machine deleting at a time");
    assert_eq!(
        max_missing, 1,
        "one member removed before the replacement has a node"
    );
    let snap = snapshot(&sandbox, &admin).await;
    assert!(snap.member_by_name(&second_member).is_some(), "{deferred}");
    assert_eq!(machine_names(&sandbox).await.len(), 3);

    // Phase 2: the replacement's node joins with a learner member: refused for quorum.
    let observer = Observer::start(&sandbox, original.clone());
    sandbox.etcd.wait_exited(0, LIMIT).await.unwrap();
    let learner = sandbox.etcd.add_learner().await.unwrap();
    let (node, ip, learner_name, learner_id) = {
        let m = sandbox.etcd.member(learner);
        (m.node_name.clone(), m.ip.to_string(), m.name.clone(), m.id)
    };
    sandbox
        .add_node(&node, &ip, Some(&learner_name))
        .await
        .unwrap();
    sandbox.provision(&replacement, &node, &ip).await.unwrap();
    let refused = wait_owner_remediated(
        &sandbox,
        &second,
        "CannotBeRemediated",
        &["quorum", &learner_name, "has not been promoted yet"],
    )
    .await;
    wait_reconciles(&sandbox, &controller.ctx, 2).await;
    let snap = snapshot(&sandbox, &admin).await;
    assert!(snap.member_by_name(&second_member).is_some(), "{refused}");
    assert!(!machines(&sandbox).await.iter().any(|m| m.is_deleting()));

    // Phase 3: promoted, the learner is a voter; the second is remediated.
    promote_learner(&sandbox, learner_id, survivor).await;
    wait_member_gone(&sandbox, &admin, &second_member).await;
    let second_replacement = wait_replaced(&sandbox, &second).await;
    wait_in_progress_cleared(&sandbox).await;
    let phase23 = observer.finish().await;
    let max_deleting = phase23.iter().map(|s| s.deleting.len()).max().unwrap();
    assert_eq!(max_deleting, 1, "exactly one Machine deleting at a time");
    assert_eq!(
        remediation_for(&second_replacement).unwrap()["retryCount"],
        0
    );

    let snap = snapshot(&sandbox, &admin).await;
    let mut expected = vec![sandbox.etcd.member(survivor).name.clone(), learner_name];
    expected.sort();
    assert_eq!(member_names(&snap), expected);
    assert_eq!(event_count(&sandbox, "EtcdMemberRemoved").await, 2);
    assert_eq!(event_count(&sandbox, "ReplacementCreated").await, 2);
    controller.stop().await;
}

/// Another member is stopped: removing the marked machine's member would leave
/// 1 of 2 voters healthy where quorum needs 2, so remediation is refused, and
/// the Machine's `OwnerRemediated` condition and a Kubernetes Event say so with
/// the numbers. Nothing is removed or deleted while the controller keeps
/// looking. Once the stopped member is back, remediation runs to completion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removal_that_would_lose_quorum_is_refused_until_the_stopped_member_returns() {
    init_logs();
    let mut sandbox = Sandbox::start(3).await.unwrap();
    let admin = sandbox.etcd.connect();
    let before = snapshot(&sandbox, &admin).await;
    let leader = sandbox.etcd.index_of(before.leader.unwrap()).unwrap();
    // Stop a follower (no election needed); the leader's machine is the target.
    let stopped = (leader + 1) % 3;
    let target = sandbox.machines[leader].clone();
    let target_member = sandbox.etcd.member(leader).name.clone();
    let stopped_member = sandbox.etcd.member(stopped).name.clone();
    sandbox.etcd.stop(stopped).await.unwrap();

    let controller = sandbox.start_controller();
    sandbox.mark_unhealthy(&target).await.unwrap();
    let numbers = "1 of 2 voters healthy, quorum needs 2";
    let message = wait_owner_remediated(
        &sandbox,
        &target,
        "CannotBeRemediated",
        &["quorum", numbers, &stopped_member],
    )
    .await;
    let note = sandbox
        .wait_for(
            "a RemediationBlocked Event with the numbers",
            LIMIT,
            || async {
                event_notes(&sandbox, "RemediationBlocked")
                    .await
                    .into_iter()
                    .find(|n| n.contains(numbers) && n.contains(&target))
                    .ok_or_else(|| "no such Event yet".to_string())
            },
        )
        .await
        .unwrap();
    assert!(note.contains(&stopped_member), "{note}");

    // The controller keeps looking and keeps refusing.
    wait_reconciles(&sandbox, &controller.ctx, 3).await;
    let now = snapshot(&sandbox, &admin).await;
    assert_eq!(member_names(&now), member_names(&before), "{message}");
    assert!(!machines(&sandbox).await.iter().any(|m| m.is_deleting()));
    assert_eq!(machine_names(&sandbox).await.len(), 3);
    assert!(
        !kcp(&sandbox)
            .await
            .annotations()
            .contains_key(REMEDIATION_IN_PROGRESS_ANNOTATION)
    );
    assert_eq!(event_count(&sandbox, "EtcdMemberRemoved").await, 0);
    assert_eq!(event_count(&sandbox, "MachineDeleting").await, 0);

    // The member returns: remediation proceeds to completion.
    sandbox.etcd.restart(stopped).await.unwrap();
    wait_member_gone(&sandbox, &admin, &target_member).await;
    wait_replaced(&sandbox, &target).await;
    wait_in_progress_cleared(&sandbox).await;
    let after = snapshot(&sandbox, &admin).await;
    let mut expected = member_names(&before);
    expected.retain(|n| n != &target_member);
    assert_eq!(member_names(&after), expected);
    controller.stop().await;
}

/// `remediation {maxRetry: 1, retryPeriodSeconds: 3600}` over a real sequence:
/// a machine is remediated (retry 0); its replacement fails too and is
/// deferred for the retry period (upstream's message); with the period
/// shortened to 0s it is remediated (retry 1); the next replacement failing is
/// refused for MaxRetry. The replacements get a node without an etcd member
/// (a target without a member costs nothing), so no learner is needed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_retry_and_retry_period_are_honoured_over_a_real_sequence() {
    init_logs();
    let sandbox = Sandbox::start(3).await.unwrap();
    let admin = sandbox.etcd.connect();
    let before = snapshot(&sandbox, &admin).await;
    patch_kcp_spec(
        &sandbox,
        serde_json::json!({"remediation": {"maxRetry": 1, "retryPeriodSeconds": 3600, "minHealthyPeriodSeconds": 3600}}),
    )
    .await;
    let first = sandbox.machines[2].clone();
    let first_member = sandbox.etcd.member(2).name.clone();
    let controller = sandbox.start_controller();

    // Retry 0: a new sequence.
    sandbox.mark_unhealthy(&first).await.unwrap();
    let r1 = wait_replaced(&sandbox, &first).await;
    assert_eq!(remediation_for(&r1).unwrap()["retryCount"], 0);
    wait_in_progress_cleared(&sandbox).await;
    let r1 = r1.name_any();

    // The replacement fails within the retry period: deferred.
    provision_memberless(&sandbox, &r1, 0).await;
    sandbox.mark_unhealthy(&r1).await.unwrap();
    wait_owner_remediated(
        &sandbox,
        &r1,
        "RemediationDeferred",
        &["already failed in the latest 1h0m0s (RetryPeriod)"],
    )
    .await;
    wait_reconciles(&sandbox, &controller.ctx, 2).await;
    assert!(!machines(&sandbox).await.iter().any(|m| m.is_deleting()));
    assert_eq!(machine_names(&sandbox).await.len(), 3);

    // Retry period over: retry 1.
    patch_kcp_spec(
        &sandbox,
        serde_json::json!({"remediation": {"retryPeriodSeconds": 0}}),
    )
    .await;
    let r2 = wait_replaced(&sandbox, &r1).await;
    let record = remediation_for(&r2).unwrap();
    assert_eq!(record["retryCount"], 1, "{record}");
    wait_in_progress_cleared(&sandbox).await;
    let r2 = r2.name_any();
    let last = kcp(&sandbox)
        .await
        .status
        .unwrap()
        .last_remediation
        .unwrap();
    assert_eq!((last.machine.as_str(), last.retry_count), (r1.as_str(), 1));

    // MaxRetry reached: refused.
    provision_memberless(&sandbox, &r2, 1).await;
    sandbox.mark_unhealthy(&r2).await.unwrap();
    wait_owner_remediated(
        &sandbox,
        &r2,
        "CannotBeRemediated",
        &["already failed 1 times (MaxRetry)"],
    )
    .await;
    wait_reconciles(&sandbox, &controller.ctx, 2).await;
    let all = machines(&sandbox).await;
    assert!(all.iter().any(|m| m.name_any() == r2 && !m.is_deleting()));
    assert_eq!(all.len(), 3);
    // Only the first remediation touched etcd (the replacements had no member).
    let after = snapshot(&sandbox, &admin).await;
    let mut expected = member_names(&before);
    expected.retain(|n| n != &first_member);
    assert_eq!(member_names(&after), expected);
    assert_eq!(event_count(&sandbox, "EtcdMemberRemoved").await, 1);
    controller.stop().await;
}

/// `spec.externalDatastore` declared while the servers run embedded etcd (as
/// every server cluster-api-k3s's bootstrap provider starts does): the Nodes
/// carry k3s's etcd marks, so etcd is managed all the same, and a removal that
/// would lose quorum is refused with the numbers exactly as without the
/// declaration. The condition names the Node that showed embedded etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_external_datastore_is_not_believed_while_nodes_show_embedded_etcd() {
    init_logs();
    let mut sandbox = Sandbox::start(3).await.unwrap();
    patch_kcp_spec(&sandbox, serde_json::json!({"externalDatastore": true})).await;
    let admin = sandbox.etcd.connect();
    let before = snapshot(&sandbox, &admin).await;
    let leader = sandbox.etcd.index_of(before.leader.unwrap()).unwrap();
    let stopped = (leader + 1) % 3;
    let target = sandbox.machines[leader].clone();
    sandbox.etcd.stop(stopped).await.unwrap();

    let controller = sandbox.start_controller();
    sandbox.mark_unhealthy(&target).await.unwrap();
    wait_owner_remediated(
        &sandbox,
        &target,
        "CannotBeRemediated",
        &["quorum", "1 of 2 voters healthy, quorum needs 2"],
    )
    .await;
    let status = kcp(&sandbox).await.status.unwrap_or_default();
    let etcd = status
        .conditions
        .iter()
        .find(|c| c.type_ == "EtcdClusterHealthy")
        .expect("EtcdClusterHealthy");
    assert!(
        etcd.message
            .contains("spec.externalDatastore is set, but Node")
            && etcd.message.contains("etcd is managed"),
        "{etcd:?}"
    );
    assert!(status.etcd.is_some(), "the membership was read");
    wait_reconciles(&sandbox, &controller.ctx, 2).await;
    assert_eq!(
        member_names(&snapshot(&sandbox, &admin).await),
        member_names(&before)
    );
    assert!(!machines(&sandbox).await.iter().any(|m| m.is_deleting()));
    controller.stop().await;
}
