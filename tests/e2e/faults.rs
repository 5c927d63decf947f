//! Hostile faults on real etcd members, one test per row of the fault matrix
//! (docs/faults.md). Each asserts that nothing is lost: no Machine deleted and
//! no member removed on a guess, at most one Machine deleting, and exactly one
//! replacement where a remediation completes.

use crate::support;

use k3s_control_plane::api::KThreesControlPlane;
use k3s_control_plane::controller::reconcile::reconcile;
use k3s_control_plane::harness::sandbox::{
    CLUSTER, KCP, NAMESPACE, Sandbox, controller_context, one_step_settings,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use std::sync::Arc;
use support::{LIMIT, Observer, Record, event_count, init_logs, machines, snapshot};

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
    let restored = std::time::Instant::now();
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
    eprintln!(
        "fault matrix: CA rotated: healthy again {:?} after the real CA was restored",
        restored.elapsed()
    );
    assert_eq!(
        ctx.etcd.len(),
        1,
        "one handle per workload cluster, the old ones dropped"
    );
    // Back on the real CA the marked Machine's remediation may go ahead (its
    // steps chain within a reconcile); no other member may have gone.
    let admin = sandbox.etcd.connect();
    let now = snapshot(&sandbox, &admin).await;
    for (i, member) in (0..3).map(|i| (i, sandbox.etcd.member(i))) {
        assert!(
            i == 1 || now.member_by_name(&member.name).is_some(),
            "{} was removed, but only {target}'s member may go",
            member.name
        );
    }
}

/// A member added by a join that never completed (a ghost) counts as an
/// unhealthy voter and blocks every removal; after the grace period the
/// controller removes it (quorum allowing), and the remediation it blocked then
/// completes with exactly one replacement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ghost_member_after_a_failed_join_is_counted_unhealthy_then_cleaned_up() {
    use k3s_control_plane::harness::infra_sim::add_ghost_member;
    use support::spare_ip;

    init_logs();
    let mut sandbox = Sandbox::start(3).await.unwrap();
    let ghost = add_ghost_member(&sandbox, &spare_ip(&sandbox, 0))
        .await
        .unwrap();
    let target = sandbox.machines[2].clone();
    sandbox.mark_unhealthy(&target).await.unwrap();
    let controller = sandbox.start_controller();

    let ghost_label = format!("{ghost:016x}");
    let started = std::time::Instant::now();
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

    drive_until_replaced(&mut sandbox, &target, "ghost", async |sandbox| {
        sandbox
            .etcd
            .connect()
            .snapshot()
            .await
            .is_ok_and(|s| s.members.len() == 3 && s.member(ghost).is_none())
    })
    .await;
    eprintln!(
        "fault matrix: ghost member: removed and the blocked remediation done in {:?}",
        started.elapsed()
    );
    assert_eq!(event_count(&sandbox, "EtcdOrphanMemberRemoved").await, 1);
    assert_eq!(event_count(&sandbox, "EtcdMemberRemoved").await, 1);
    assert_eq!(event_count(&sandbox, "ReplacementCreated").await, 1);
    controller.stop().await;
}

/// Run the simulated infrastructure until `target` is replaced (3 Machines,
/// each with a Node, none deleting, `target` gone) and `also` holds, checking
/// at every pass that at most one Machine is deleting.
async fn drive_until_replaced(
    sandbox: &mut Sandbox,
    target: &str,
    what: &str,
    also: impl AsyncFn(&Sandbox) -> bool,
) {
    use k3s_control_plane::harness::infra_sim::reconcile_infrastructure;
    let deadline = tokio::time::Instant::now() + LIMIT * 2;
    loop {
        reconcile_infrastructure(sandbox, LIMIT).await.unwrap();
        let all = machines(sandbox).await;
        assert!(
            all.iter().filter(|m| m.is_deleting()).count() <= 1,
            "{what}: two Machines deleting"
        );
        let replaced = all.len() == 3
            && all
                .iter()
                .all(|m| m.node_name().is_some() && !m.is_deleting())
            && !all
                .iter()
                .any(|m| m.metadata.name.as_deref() == Some(target));
        if replaced && also(sandbox).await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: {target} not replaced in time"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Drive the control plane one reconcile at a time, each by a FRESH controller
/// (new Context: no pool, no memory; a crash and restart after every step,
/// so each takes one step: no chaining), with the simulated infrastructure
/// between steps, until `done`. Checks at every step that at most one Machine
/// is deleting; the shared [`Observer`] samples etcd throughout, and its record
/// must hold (the support module's rule: every sample counts, a window without a
/// leader closes within two election timeouts, no member removed while it
/// led). Returns the steps and the record.
async fn step_with_a_new_controller_each_time(
    sandbox: &mut Sandbox,
    what: &str,
    before_each: &mut dyn FnMut(&mut Sandbox, &k3s_control_plane::decision::plan::Plan),
    done: &dyn Fn(&[k3s_control_plane::api::Machine]) -> bool,
) -> (usize, Record) {
    use k3s_control_plane::controller::observe::observe;
    use k3s_control_plane::decision::plan::plan;
    use k3s_control_plane::harness::infra_sim::reconcile_infrastructure;
    let observer = Observer::start(sandbox, sandbox.etcd.member_names());
    let deadline = tokio::time::Instant::now() + LIMIT * 2;
    let mut steps = 0;
    loop {
        let ctx = controller_context(sandbox.client(), one_step_settings());
        let current = (*kcp(sandbox).await).clone();
        if let Ok((world, _)) = observe(&ctx, current).await
            && let Ok(planned) = plan(&world)
        {
            before_each(sandbox, &planned);
        }
        let _ = reconcile(kcp(sandbox).await, ctx).await;
        steps += 1;
        reconcile_infrastructure(sandbox, LIMIT).await.unwrap();
        let all = machines(sandbox).await;
        assert!(
            all.iter().filter(|m| m.is_deleting()).count() <= 1,
            "{what}: two Machines deleting"
        );
        observer.assert_quorum_so_far(what);
        if done(&all) {
            let record = observer.record().await;
            let summary = record.assert_safe(what);
            eprintln!("{what}: quorum sampler: {summary}");
            return (steps, record);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not done after {steps} steps"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remediation_survives_a_controller_crash_after_every_step() {
    init_logs();
    let mut sandbox = Sandbox::start(3).await.unwrap();
    let admin = sandbox.etcd.connect();
    let leader = snapshot(&sandbox, &admin).await.leader.unwrap();
    let leader_index = sandbox.etcd.index_of(leader).unwrap();
    let target = sandbox.machines[leader_index].clone();
    let target_member = sandbox.etcd.member(leader_index).name.clone();
    sandbox.mark_unhealthy(&target).await.unwrap();
    let started = std::time::Instant::now();
    let (steps, record) =
        step_with_a_new_controller_each_time(&mut sandbox, "remediation", &mut |_, _| {}, &|all| {
            all.len() == 3
                && all
                    .iter()
                    .all(|m| m.node_name().is_some() && !m.is_deleting())
                && !all
                    .iter()
                    .any(|m| m.metadata.name.as_deref() == Some(target.as_str()))
        })
        .await;
    // Wait for the record to be cleared too (the last step).
    sandbox
        .wait_for("remediation-in-progress cleared", LIMIT, || async {
            let _ = reconcile(kcp(&sandbox).await, sandbox.context()).await;
            let k = kcp(&sandbox).await;
            if k.annotations()
                .contains_key("controlplane.cluster.x-k8s.io/remediation-in-progress")
            {
                Err("still recorded".to_string())
            } else {
                Ok(())
            }
        })
        .await
        .unwrap();
    // The target led: exactly one leadership move, off it, before its
    // removal, as etcd itself saw it (the sampler's record: the leaders while
    // the target's member was listed; the step driver already checked that no
    // member that stays still followed it once removed).
    let leaders = record.leaders_while_listed(&target_member);
    assert!(
        leaders.len() == 2 && leaders[0] == target_member,
        "leaders while {target_member} was listed: {leaders:?} (one move off it expected)"
    );
    // A leadership move runs beside the reconcile and is remembered in the
    // controller's memory only, which every restart here loses: a controller
    // that starts while the move is under way asks for it again (the resume),
    // one that starts after it finished sees another leader and goes on
    // without confirming it. So: started once or resumed, never confirmed (the
    // confirmation needs the record), and the move itself is checked above
    // from etcd's view.
    let started_moves = event_count(&sandbox, "EtcdLeadershipMoveStarted").await;
    let confirmed_moves = event_count(&sandbox, "EtcdLeadershipMoved").await;
    assert!(
        (1..=3).contains(&started_moves) && confirmed_moves == 0,
        "leadership moves started {started_moves}, confirmed {confirmed_moves}"
    );
    for (reason, times) in [
        ("RemediationStarted", 1),
        ("PreTerminateHookAdded", 1),
        ("MachineDeleting", 1),
        ("EtcdMemberRemoved", 1),
        ("PreTerminateHookReleased", 1),
        ("ReplacementCreated", 1),
        ("RemediationCompleted", 1),
    ] {
        assert_eq!(
            event_count(&sandbox, reason).await,
            times,
            "{reason} after {steps} restarts"
        );
    }
    eprintln!(
        "fault matrix: remediation, restart after every step: {steps} restarts, done in {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scale_down_survives_a_controller_crash_after_every_step() {
    init_logs();
    let mut sandbox = Sandbox::start(3).await.unwrap();
    sandbox
        .kcp_api()
        .patch(
            KCP,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 1}})),
        )
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let (steps, _) =
        step_with_a_new_controller_each_time(&mut sandbox, "scale-down", &mut |_, _| {}, &|all| {
            all.len() == 1 && all.iter().all(|m| !m.is_deleting())
        })
        .await;
    let admin = sandbox.etcd.connect();
    assert_eq!(snapshot(&sandbox, &admin).await.members.len(), 1);
    for (reason, times) in [
        ("MachineDeleting", 2),
        ("EtcdMemberRemoved", 2),
        ("PreTerminateHookReleased", 2),
        ("ReplacementCreated", 0),
    ] {
        assert_eq!(
            event_count(&sandbox, reason).await,
            times,
            "{reason} after {steps} restarts"
        );
    }
    eprintln!(
        "fault matrix: scale-down 3 -> 1, restart after every step: {steps} restarts, done in {:?}",
        started.elapsed()
    );
}

/// 2 of 3 members dead: a remediation is refused within seconds, saying that
/// quorum is lost, with the numbers; nothing is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_of_three_members_dead_is_refused_within_seconds_saying_quorum_is_lost() {
    use support::wait_owner_remediated;
    init_logs();
    let mut sandbox = Sandbox::start(3).await.unwrap();
    sandbox.etcd.kill(0).unwrap();
    sandbox.etcd.kill(1).unwrap();
    let target = sandbox.machines[0].clone();
    let controller = sandbox.start_controller();
    let started = tokio::time::Instant::now();
    sandbox.mark_unhealthy(&target).await.unwrap();
    let message = wait_owner_remediated(
        &sandbox,
        &target,
        "CannotBeRemediated",
        &["lost quorum", "0 of 3 voters healthy, quorum needs 2"],
    )
    .await;
    let took = started.elapsed();
    assert!(
        took < std::time::Duration::from_secs(15),
        "refused only after {took:?}: {message}"
    );
    let etcd = condition(&*kcp(&sandbox).await, "EtcdClusterHealthy");
    assert_eq!(etcd.status, "False");
    assert!(
        etcd.message.contains("0 of 3 voters healthy"),
        "{}",
        etcd.message
    );
    assert!(machines(&sandbox).await.iter().all(|m| !m.is_deleting()));
    assert_eq!(event_count(&sandbox, "EtcdMemberRemoved").await, 0);
    controller.stop().await;
    eprintln!("fault matrix: 2 of 3 members dead: refused in {took:?}");
}

/// The leader is killed, or paused (SIGSTOP), exactly when the controller is
/// about to move leadership off it: the move fails, a new leader is elected, and
/// the removal completes on the next steps, nothing repeated, one replacement.
async fn leader_fault_during_the_leadership_move(pause: bool) {
    use k3s_control_plane::decision::plan::Action;
    use k3s_control_plane::remediation::steps::Step;
    init_logs();
    let mut sandbox = Sandbox::start(3).await.unwrap();
    let admin = sandbox.etcd.connect();
    let leader = snapshot(&sandbox, &admin).await.leader.unwrap();
    let leader_index = sandbox.etcd.index_of(leader).unwrap();
    let target = sandbox.machines[leader_index].clone();
    sandbox.mark_unhealthy(&target).await.unwrap();
    let mut struck = false;
    let started = std::time::Instant::now();
    step_with_a_new_controller_each_time(
        &mut sandbox,
        if pause {
            "leader paused"
        } else {
            "leader killed"
        },
        &mut |sandbox, planned| {
            if !struck
                && matches!(
                    planned.action,
                    Action::Step {
                        step: Step::MoveLeadership { .. },
                        ..
                    }
                )
            {
                struck = true;
                if pause {
                    sandbox.etcd.pause(leader_index).unwrap();
                } else {
                    sandbox.etcd.kill(leader_index).unwrap();
                }
            }
        },
        &|all| {
            all.len() == 3
                && all
                    .iter()
                    .all(|m| m.node_name().is_some() && !m.is_deleting())
                && !all
                    .iter()
                    .any(|m| m.metadata.name.as_deref() == Some(target.as_str()))
        },
    )
    .await;
    assert!(struck, "the leadership move was never reached");
    if pause {
        let _ = sandbox.etcd.resume(leader_index);
    }
    assert_eq!(event_count(&sandbox, "EtcdMemberRemoved").await, 1);
    assert_eq!(event_count(&sandbox, "MachineDeleting").await, 1);
    assert_eq!(event_count(&sandbox, "ReplacementCreated").await, 1);
    let admin = sandbox.etcd.connect();
    let snap = snapshot(&sandbox, &admin).await;
    assert!(
        snap.member(leader).is_none(),
        "the old leader's member is still listed"
    );
    eprintln!(
        "fault matrix: leader {} during the leadership move: replaced in {:?}",
        if pause { "paused" } else { "killed" },
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_in_the_middle_of_a_leadership_move() {
    leader_fault_during_the_leadership_move(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_paused_in_the_middle_of_a_leadership_move() {
    leader_fault_during_the_leadership_move(true).await;
}

/// In the middle of a remediation, the management API answers the next writes
/// of Machines and of the control plane with 409 Conflict, and expires every
/// watch (410 Gone, the watchers re-list): the controller observes again and
/// finishes, every step once, exactly one replacement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicts_and_expired_watches_in_the_middle_of_a_remediation_lose_nothing() {
    init_logs();
    let mut sandbox = Sandbox::start(3).await.unwrap();
    let target = sandbox.machines[1].clone();
    let controller = sandbox.start_controller();
    sandbox.mark_unhealthy(&target).await.unwrap();
    sandbox
        .wait_for("the remediation started", LIMIT, || async {
            if event_count(&sandbox, "RemediationStarted").await > 0 {
                Ok(())
            } else {
                Err(String::new())
            }
        })
        .await
        .unwrap();
    let machines_resource = "machines.cluster.x-k8s.io";
    let kcps_resource = "kthreescontrolplanes.controlplane.cluster.x-k8s.io";
    sandbox
        .management
        .fail_next_writes(machines_resource, 409, 3);
    sandbox.management.fail_next_writes(kcps_resource, 409, 2);
    sandbox.management.expire_watches();
    let started = std::time::Instant::now();

    drive_until_replaced(&mut sandbox, &target, "409s and 410s", async |sandbox| {
        !kcp(sandbox)
            .await
            .annotations()
            .contains_key("controlplane.cluster.x-k8s.io/remediation-in-progress")
    })
    .await;
    eprintln!(
        "fault matrix: 409s and 410s mid-remediation: finished {:?} after injection",
        started.elapsed()
    );
    assert_eq!(
        sandbox.management.pending_write_faults(machines_resource),
        0,
        "the injected faults were not all hit"
    );
    assert_eq!(sandbox.management.pending_write_faults(kcps_resource), 0);
    for reason in [
        "RemediationStarted",
        "MachineDeleting",
        "EtcdMemberRemoved",
        "ReplacementCreated",
        "RemediationCompleted",
    ] {
        assert_eq!(event_count(&sandbox, reason).await, 1, "{reason}");
    }
    controller.stop().await;
}

/// A member cut off from its peers (its raft traffic held, its client port
/// answering, so `Status` still looks fine) while another Machine is marked:
/// the cut-off member counts as unhealthy, so removing the marked one would
/// leave too few healthy voters: refused, nothing deleted. Healed, the
/// remediation completes with one replacement.
async fn partitioned_member_blocks_a_removal_until_healed(partition_leader: bool) {
    use k3s_control_plane::harness::EtcdTestCluster;
    use support::wait_owner_remediated;
    init_logs();
    let mut sandbox = Sandbox::start_with(EtcdTestCluster::builder().members(3).partitionable(), 3)
        .await
        .unwrap();
    let admin = sandbox.etcd.connect();
    let leader = snapshot(&sandbox, &admin).await.leader.unwrap();
    let leader_index = sandbox.etcd.index_of(leader).unwrap();
    let followers: Vec<usize> = (0..3).filter(|i| *i != leader_index).collect();
    let (cut, target_index) = if partition_leader {
        (leader_index, followers[0])
    } else {
        (followers[0], followers[1])
    };
    let cut_member = sandbox.etcd.member(cut).name.clone();
    let target = sandbox.machines[target_index].clone();
    let controller = sandbox.start_controller();
    sandbox.etcd.isolate(cut).unwrap();
    let started = std::time::Instant::now();
    sandbox.mark_unhealthy(&target).await.unwrap();
    let message = wait_owner_remediated(
        &sandbox,
        &target,
        "CannotBeRemediated",
        &["quorum", &cut_member],
    )
    .await;
    let refused_after = started.elapsed();
    assert!(
        machines(&sandbox).await.iter().all(|m| !m.is_deleting()),
        "{message}"
    );
    assert_eq!(event_count(&sandbox, "EtcdMemberRemoved").await, 0);

    sandbox.etcd.heal(cut).unwrap();
    let healed = std::time::Instant::now();
    drive_until_replaced(&mut sandbox, &target, "after the heal", async |_| true).await;
    assert_eq!(event_count(&sandbox, "EtcdMemberRemoved").await, 1);
    assert_eq!(event_count(&sandbox, "ReplacementCreated").await, 1);
    eprintln!(
        "fault matrix: {} partitioned: refused after {refused_after:?}; remediated {:?} after the heal",
        if partition_leader {
            "leader"
        } else {
            "follower"
        },
        healed.elapsed()
    );
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_follower_blocks_a_removal_until_healed() {
    partitioned_member_blocks_a_removal_until_healed(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_leader_blocks_a_removal_until_healed() {
    partitioned_member_blocks_a_removal_until_healed(true).await;
}

/// A real NOSPACE alarm: one member with a small backend quota, filled with
/// writes until etcd refuses them. That member counts as unhealthy, so the
/// removal of another Machine is refused with a condition naming the alarm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nospace_on_one_member_blocks_a_removal_naming_the_alarm() {
    use k3s_control_plane::harness::EtcdTestCluster;
    use support::wait_owner_remediated;
    init_logs();
    let full = 2;
    let sandbox = Sandbox::start_with(
        EtcdTestCluster::builder()
            .members(3)
            .quota_backend_bytes(full, 512 * 1024),
        3,
    )
    .await
    .unwrap();
    // Fill it for real, with etcdctl, until etcd refuses writes.
    let value = "x".repeat(64 * 1024);
    let mut refused = None;
    for i in 0..200 {
        let out = sandbox
            .etcd
            .etcdctl(&sandbox.etcd.member(0).client_url())
            .expect("etcdctl (hack/setup.sh installs it beside etcd)")
            .args(["put", &format!("fill-{i}"), &value])
            .output()
            .expect("etcdctl runs (hack/setup.sh installs it)");
        if !out.status.success() {
            refused = Some(String::from_utf8_lossy(&out.stderr).into_owned());
            break;
        }
    }
    let refused = refused.expect("etcd never refused a write");
    assert!(refused.contains("database space exceeded"), "{refused}");

    let target = sandbox.machines[0].clone();
    let full_member = sandbox.etcd.member(full).name.clone();
    let controller = sandbox.start_controller();
    sandbox.mark_unhealthy(&target).await.unwrap();
    let message = wait_owner_remediated(
        &sandbox,
        &target,
        "CannotBeRemediated",
        &["NOSPACE", &full_member],
    )
    .await;
    assert!(message.contains("quorum"), "{message}");
    assert!(machines(&sandbox).await.iter().all(|m| !m.is_deleting()));
    assert_eq!(event_count(&sandbox, "EtcdMemberRemoved").await, 0);
    let etcd = condition(&*kcp(&sandbox).await, "EtcdClusterHealthy");
    assert!(
        etcd.status == "False" && etcd.message.contains("NOSPACE"),
        "{}",
        etcd.message
    );
    eprintln!("fault matrix: NOSPACE: {message}");
    controller.stop().await;
}

/// The shared quorum sampler's rule on made-up records (no etcd): every sample
/// counts, healthy voters against the quorum of that sample's voters, a window
/// without a leader is bounded, and a removed member still followed by those
/// that stay was removed while it led.
#[test]
fn the_quorum_sampler_counts_every_sample() {
    use std::time::Duration;
    use support::Sample;
    let ms = Duration::from_millis;
    // (at ms, leader, healthy, voters)
    let sample = |at: u64, leader: Option<u64>, healthy: usize, voters: usize| Sample {
        at: ms(at),
        deleting: vec![],
        missing: vec![],
        leader,
        healthy_voters: (healthy, voters),
        quorum: voters / 2 + 1,
        probe_timed_out: false,
        settling: false,
        listed: (1..=voters as u64).map(|i| (i, format!("m{i}"))).collect(),
        follows: vec![],
        detail: String::new(),
    };
    let record = |samples: Vec<Sample>| Record {
        samples,
        unseen: vec![],
        limit: ms(12_000),
    };
    let ok = |r: &Record| r.check_quorum().map(|_| ());
    // 2 of 3 has quorum; 2 of 4 does not.
    assert!(ok(&record(vec![sample(0, Some(1), 2, 3)])).is_ok());
    let two_of_four = ok(&record(vec![
        sample(0, Some(1), 3, 4),
        sample(50, Some(1), 2, 4),
    ]));
    assert!(
        two_of_four
            .as_ref()
            .is_err_and(|e| e.contains("2 of 4 voters healthy, quorum 3")),
        "{two_of_four:?}"
    );
    // A short leaderless window (a handover) closes in time.
    assert!(
        ok(&record(vec![
            sample(0, Some(1), 3, 3),
            sample(50, None, 0, 3),
            sample(900, Some(2), 3, 3),
        ]))
        .is_ok()
    );
    // A leaderless window that outlasts the limit fails, and so does one still
    // open when the sampler stops.
    let long = ok(&record(vec![
        sample(0, Some(1), 3, 3),
        sample(50, None, 1, 3),
        sample(11_000, None, 1, 3),
        sample(12_100, Some(2), 2, 3),
    ]));
    assert!(
        long.as_ref().is_err_and(|e| e.contains("no quorum for")),
        "{long:?}"
    );
    let open = ok(&record(vec![
        sample(0, Some(1), 3, 3),
        sample(50, None, 1, 3),
    ]));
    assert!(
        open.as_ref()
            .is_err_and(|e| e.contains("stopped without quorum")),
        "{open:?}"
    );
    // Below quorum only because reads straddled a leadership handover
    // ("etcdserver: leader changed"): a window that closes in time passes,
    // one that outlasts the limit fails like any other.
    let settling = |at: u64, healthy: usize| Sample {
        settling: true,
        ..sample(at, Some(1), healthy, 4)
    };
    assert!(
        ok(&record(vec![
            sample(0, Some(1), 4, 4),
            settling(50, 1),
            sample(400, Some(2), 4, 4),
        ]))
        .is_ok()
    );
    let stuck = ok(&record(vec![
        sample(0, Some(1), 4, 4),
        settling(50, 1),
        settling(6_000, 1),
        settling(12_100, 1),
        sample(12_200, Some(2), 4, 4),
    ]));
    assert!(
        stuck.as_ref().is_err_and(|e| e.contains("no quorum for")),
        "{stuck:?}"
    );
    // Leaderless samples alone are not a pass.
    assert!(ok(&record(vec![sample(0, None, 0, 3)])).is_err());
    // A sampler that did not look for longer than the limit fails.
    let gap = ok(&record(vec![
        sample(0, Some(1), 3, 3),
        sample(13_000, Some(1), 3, 3),
    ]));
    assert!(
        gap.as_ref().is_err_and(|e| e.contains("did not look")),
        "{gap:?}"
    );
    // A probe timeout makes a sample below quorum inconclusive, within the bound.
    let mut slow = sample(50, Some(1), 1, 3);
    slow.probe_timed_out = true;
    assert!(
        ok(&record(vec![
            sample(0, Some(1), 3, 3),
            slow,
            sample(100, Some(1), 3, 3)
        ]))
        .is_ok()
    );

    // Removed while leading: m3 led; once it left the list m1 still followed it.
    let mut before = sample(0, Some(3), 3, 3);
    before.follows = vec![(1, 3), (2, 3), (3, 3)];
    let mut after = sample(50, None, 0, 2);
    after.follows = vec![(1, 3), (2, 3)];
    let removed = record(vec![before.clone(), after]).removed_while_leading();
    assert!(
        removed.len() == 1 && removed[0].starts_with("m3 was removed while it led"),
        "{removed:?}"
    );
    // Moved first (m1 leads when m3 leaves): nothing to report, even if the
    // last sample listing m3 still saw it lead.
    let mut moved = sample(50, Some(1), 2, 2);
    moved.follows = vec![(1, 1), (2, 1)];
    assert!(
        record(vec![before, moved])
            .removed_while_leading()
            .is_empty()
    );
}
