//! End to end, on a real 3-member etcd: rollouts replace every outdated
//! Machine once, one at a time, without ever dropping below two healthy
//! voters or removing the member that leads; they survive a controller crash
//! after every step; `rolloutAfter` rolls once; a label change rolls nothing.

use crate::support;

use std::time::Duration;

use k3s_control_plane::api::{KThreesControlPlane, Machine};
use k3s_control_plane::harness::rollout::{Drive, DriveRecord, drive_until};
use k3s_control_plane::harness::sandbox::{Sandbox, VERSION};
use kube::ResourceExt;
use serde_json::json;
use support::*;

const NEW_VERSION: &str = "v1.31.4+k3s1";

/// One rollout at a time: each test runs 3 to 5 etcd members, a controller and
/// two API servers, and on 2 cores several at once starve etcd's heartbeats,
/// which is a test artefact, not a controller fault.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn condition<'a>(kcp: &'a KThreesControlPlane, type_: &str) -> Option<(&'a str, &'a str)> {
    kcp.conditions()
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.as_str(), c.message.as_str()))
}

/// Three Machines at `version`, each with a Node, none deleting, and the
/// control plane reporting all three up to date and no rollout.
fn rolled_out(version: &'static str) -> impl Fn(&[Machine], &KThreesControlPlane) -> bool {
    move |machines, kcp| {
        machines.len() == 3
            && machines.iter().all(|m| {
                !m.is_deleting()
                    && m.node_name().is_some()
                    && m.spec.version.as_deref() == Some(version)
            })
            && kcp.status.as_ref().and_then(|s| s.up_to_date_replicas) == Some(3)
            && condition(kcp, "RollingOut").is_some_and(|(s, _)| s == "False")
            && condition(kcp, "MachinesUpToDate").is_some_and(|(s, _)| s == "True")
    }
}

fn report(what: &str, record: &DriveRecord) {
    let joins: Vec<String> = record
        .provisioned
        .iter()
        .map(|p| {
            format!(
                "{:?} ({} MemberAdd refusals, {} promote attempts)",
                p.took, p.member_add_refusals, p.promote_attempts
            )
        })
        .collect();
    eprintln!(
        "rollout: {what}: {} steps in {:?}; controller {:?} (of which member removals {:?}), joins {:?}, pacing {:?}; joins: {}",
        record.steps.len(),
        record.wall,
        record.controller,
        record.member_removal_time(),
        record.waiting_on_etcd,
        record
            .wall
            .saturating_sub(record.controller + record.waiting_on_etcd),
        joins.join(", ")
    );
}

/// What every rollout of three Machines must show.
async fn assert_replaced_each_once_safely(
    sandbox: &Sandbox,
    originals: &[String],
    original_members: &[u64],
    record: &DriveRecord,
    max_live: usize,
) {
    let now = machine_names(sandbox).await;
    for old in originals {
        assert!(!now.contains(old), "{old} was not replaced: {now:?}");
    }
    // Each Machine replaced once: three new ones, no more.
    assert_eq!(
        record.machines_seen.len(),
        originals.len() + 3,
        "machines seen: {:?}",
        record.machines_seen
    );
    assert!(record.max_deleting() <= 1, "two Machines deleting at once");
    assert!(
        record.max_live() <= max_live,
        "{} live Machines at once (limit {max_live})",
        record.max_live()
    );
    let (healthy, voters) = record.min_healthy_voters().unwrap();
    assert!(
        healthy >= 2,
        "only {healthy} of {voters} voters healthy after a step"
    );
    assert!(
        record.leader_removals().is_empty(),
        "the leader was removed: {:?}",
        record.leader_removals()
    );
    let mut removed: Vec<u64> = record
        .steps
        .iter()
        .flat_map(|s| s.removed_members.clone())
        .collect();
    removed.sort();
    let mut want = original_members.to_vec();
    want.sort();
    assert_eq!(removed, want, "exactly the original members go, once each");
    // No step repeated or skipped: one of each per replaced Machine.
    for reason in [
        "RollingOutMachine",
        "PreTerminateHookAdded",
        "EtcdMemberRemoved",
        "PreTerminateHookReleased",
        "MachineCreated",
    ] {
        assert_eq!(
            event_count(sandbox, reason).await,
            3,
            "{reason}: {:?}",
            event_notes(sandbox, reason).await
        );
    }
    let kcp = kcp(sandbox).await;
    assert_eq!(
        condition(&kcp, "MachinesUpToDate").map(|c| c.0),
        Some("True")
    );
    for m in machines(sandbox).await {
        let up_to_date = m
            .conditions()
            .iter()
            .find(|c| c.type_ == "UpToDate")
            .map(|c| c.status.clone());
        assert_eq!(up_to_date.as_deref(), Some("True"), "{}", m.name_any());
    }
}

async fn original_members(sandbox: &Sandbox) -> Vec<u64> {
    sandbox
        .etcd
        .connect()
        .snapshot()
        .await
        .unwrap()
        .members
        .iter()
        .map(|m| m.id)
        .collect()
}

async fn upgrade(max_surge: i32, crash_after_every_step: bool) {
    let _serial = ONE_AT_A_TIME.lock().await;
    init_logs();
    let mut sandbox = Sandbox::start(3).await.unwrap();
    let originals = sandbox.machines.clone();
    let members = original_members(&sandbox).await;
    patch_kcp_spec(
        &sandbox,
        json!({"version": NEW_VERSION, "rollout": {"strategy": {"rollingUpdate": {"maxSurge": max_surge}}}}),
    )
    .await;
    let record = drive_until(
        &mut sandbox,
        &Drive {
            crash_after_every_step,
            limit: LIMIT * 3,
        },
        rolled_out(NEW_VERSION),
    )
    .await
    .unwrap();
    report(
        &format!(
            "{VERSION} -> {NEW_VERSION}, maxSurge {max_surge}{}",
            if crash_after_every_step {
                ", crash after every step"
            } else {
                ""
            }
        ),
        &record,
    );
    assert_replaced_each_once_safely(
        &sandbox,
        &originals,
        &members,
        &record,
        3 + max_surge as usize,
    )
    .await;
    let notes = event_notes(&sandbox, "RollingOutMachine").await;
    assert!(
        notes
            .iter()
            .all(|n| n.contains(&format!("version {VERSION} -> {NEW_VERSION}"))),
        "{notes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_with_max_surge_1_survives_a_crash_after_every_step() {
    upgrade(1, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_with_max_surge_0_survives_a_crash_after_every_step() {
    upgrade(0, true).await;
}

/// The real controller loop, watched from outside as fast as the observer can
/// sample (the support module's shared quorum sampler): never two Machines deleting,
/// at every sample at least a quorum of that sample's voters healthy (3 of 4
/// while a surge Machine's member votes, 2 of 3 otherwise), a window without
/// a leader closed within two election timeouts, no member removed while it
/// led.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_with_the_controller_running_keeps_quorum_at_every_sample() {
    use k3s_control_plane::harness::infra_sim::reconcile_infrastructure;
    let _serial = ONE_AT_A_TIME.lock().await;
    init_logs();
    let mut sandbox = Sandbox::start(3).await.unwrap();
    let originals = sandbox.machines.clone();
    let tracked = sandbox.etcd.member_names();
    let controller = sandbox.start_controller();
    let observer = Observer::start(&sandbox, tracked);
    let started = std::time::Instant::now();
    patch_kcp_spec(&sandbox, json!({"version": NEW_VERSION})).await;
    let done = rolled_out(NEW_VERSION);
    let deadline = tokio::time::Instant::now() + LIMIT * 3;
    loop {
        reconcile_infrastructure(&mut sandbox, LIMIT).await.unwrap();
        observer.assert_quorum_so_far("rollout");
        if done(&machines(&sandbox).await, &kcp(&sandbox).await) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not rolled out in time"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = started.elapsed();
    let record = observer.record().await;
    controller.stop().await;
    let summary = record.assert_safe("rollout");
    assert!(summary.samples > 20, "only {summary}");
    // The surge Machine's member voted beside the three old ones at some point.
    assert!(
        record.samples.iter().any(|s| s.healthy_voters.1 == 4),
        "never 4 voters: {summary}"
    );
    let now = machine_names(&sandbox).await;
    assert!(originals.iter().all(|o| !now.contains(o)), "{now:?}");
    assert_eq!(event_count(&sandbox, "MachineCreated").await, 3);
    eprintln!(
        "rollout: {VERSION} -> {NEW_VERSION}, maxSurge 1, controller running: {took:?}, quorum sampler: {summary}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollout_after_in_the_past_rolls_once() {
    let _serial = ONE_AT_A_TIME.lock().await;
    init_logs();
    let mut sandbox = Sandbox::start(3).await.unwrap();
    let originals = sandbox.machines.clone();
    let members = original_members(&sandbox).await;
    // Strictly after every Machine's creation (timestamps have seconds).
    let newest = machines(&sandbox)
        .await
        .iter()
        .filter_map(|m| m.creation_timestamp())
        .map(|t| t.0.as_second())
        .max()
        .unwrap();
    let at = chrono::DateTime::from_timestamp(newest + 1, 0).unwrap();
    sandbox
        .wait_for("the clock to pass rolloutAfter", LIMIT, || async {
            (chrono::Utc::now() > at)
                .then_some(())
                .ok_or_else(|| "not yet".to_string())
        })
        .await
        .unwrap();
    patch_kcp_spec(
        &sandbox,
        json!({"rollout": {"after": at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)}}),
    )
    .await;
    let drive = Drive {
        crash_after_every_step: false,
        limit: LIMIT * 3,
    };
    let record = drive_until(&mut sandbox, &drive, rolled_out(VERSION))
        .await
        .unwrap();
    report("rolloutAfter", &record);
    assert_replaced_each_once_safely(&sandbox, &originals, &members, &record, 4).await;
    // Once: the replacements are newer than rolloutAfter, so nothing more rolls.
    let settled = machine_names(&sandbox).await;
    let mut left = 5;
    drive_until(&mut sandbox, &drive, |_, _| {
        left -= 1;
        left == 0
    })
    .await
    .unwrap();
    assert_eq!(machine_names(&sandbox).await, settled, "rolled again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_label_change_rolls_nothing() {
    let _serial = ONE_AT_A_TIME.lock().await;
    init_logs();
    let mut sandbox = Sandbox::start(3).await.unwrap();
    let before = machine_names(&sandbox).await;
    patch_kcp_spec(
        &sandbox,
        json!({"machineTemplate": {"metadata": {"labels": {"tier": "gold"}}}}),
    )
    .await;
    let drive = Drive {
        crash_after_every_step: false,
        limit: LIMIT,
    };
    let record = drive_until(&mut sandbox, &drive, |_, kcp| {
        kcp.status.as_ref().and_then(|s| s.up_to_date_replicas) == Some(3)
            && kcp.status.as_ref().and_then(|s| s.observed_generation) == kcp.metadata.generation
    })
    .await
    .unwrap();
    assert_eq!(machine_names(&sandbox).await, before);
    assert!(record.steps.iter().all(|s| s.removed_members.is_empty()));
    assert_eq!(event_count(&sandbox, "MachineCreated").await, 0);
    let kcp = kcp(&sandbox).await;
    assert_eq!(condition(&kcp, "RollingOut").map(|c| c.0), Some("False"));
    // It reached the Machines in place (tests/e2e/sync.rs covers the rest).
    for m in machines(&sandbox).await {
        assert_eq!(
            m.labels().get("tier").map(String::as_str),
            Some("gold"),
            "{}",
            m.name_any()
        );
    }
}

/// The test API server, like a cluster whose CRD lacks our transition rule,
/// lets a downgrade through: the controller refuses it itself, says so in
/// `SpecValid` naming both versions and the Machine, and touches nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downgrade_the_crd_let_through_is_refused_by_the_controller() {
    let _serial = ONE_AT_A_TIME.lock().await;
    init_logs();
    let mut sandbox = Sandbox::start(3).await.unwrap();
    let before = machine_names(&sandbox).await;
    patch_kcp_spec(&sandbox, json!({"version": "v1.29.9+k3s1"})).await;
    let drive = Drive {
        crash_after_every_step: false,
        limit: LIMIT,
    };
    let record = drive_until(&mut sandbox, &drive, |_, kcp| {
        condition(kcp, "SpecValid").is_some_and(|(s, _)| s == "False")
    })
    .await
    .unwrap();
    let kcp = kcp(&sandbox).await;
    let (_, message) = condition(&kcp, "SpecValid").unwrap();
    assert!(
        message.contains(&format!(
            "spec.version: cannot downgrade from {VERSION} to v1.29.9+k3s1"
        )),
        "{message}"
    );
    assert!(message.contains("(Machine "), "{message}");
    assert_eq!(machine_names(&sandbox).await, before);
    assert!(record.steps.iter().all(|s| s.removed_members.is_empty()));
    assert_eq!(event_count(&sandbox, "MachineCreated").await, 0);
}
