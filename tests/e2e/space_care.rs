//! etcd space care in the real controller loop (`run --etcd-space-care`),
//! against the sandbox's real etcd: one member started with a 1 MiB backend
//! quota, a key written, then filled until a real NOSPACE. With the flag
//! the controller compacts, defragments one member at a time (followers
//! first, the leader last after its leadership moved) and disarms the alarm;
//! without it, nothing of the kind happens. A fragmented cluster is
//! defragmented one member at a time, as sampling the members shows.

use crate::support;

use k3s_control_plane::harness::EtcdTestCluster;
use k3s_control_plane::harness::defrag_sampler::one_at_a_time;
use k3s_control_plane::harness::sandbox::{Sandbox, fast_settings};
use k3s_control_plane::space_rule::{SpaceSettings, Thresholds};
use serde_json::json;
use support::{
    LIMIT, annotate_kcp, event_notes, events, init_logs, kcp, snapshot, wait_reconciles,
};

const KEEP: &str = "keep";
const KEPT: &[u8] = b"written before NOSPACE";
const QUOTA: u64 = 1024 * 1024;

/// Member 2 with a 1 MiB quota (and the control plane told so), `keep`
/// written, then 64 KiB values overwritten until etcd refuses writes.
async fn full_sandbox() -> Sandbox {
    init_logs();
    let sandbox = Sandbox::start_with(
        EtcdTestCluster::builder()
            .members(3)
            .quota_backend_bytes(2, QUOTA),
        3,
    )
    .await
    .unwrap();
    annotate_kcp(
        &sandbox,
        json!({"controlplane.cluster.x-k8s.io/etcd-quota-backend-bytes": "1Mi"}),
    )
    .await;
    sandbox.etcd.put(0, KEEP, KEPT.to_vec()).await.unwrap();
    let writes = sandbox
        .etcd
        .fill_until_nospace(0, 4, 64 * 1024, 1000)
        .await
        .unwrap();
    eprintln!("NOSPACE after {writes} writes of 64 KiB");
    sandbox
}

fn condition(
    kcp: &k3s_control_plane::api::KThreesControlPlane,
    type_: &str,
) -> Option<(String, String, String)> {
    kcp.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nospace_is_recovered_by_the_controller_with_space_care_on() {
    let sandbox = full_sandbox().await;
    let admin = sandbox.etcd.connect();
    let before = snapshot(&sandbox, &admin).await;
    assert!(before.nospace());
    let leader = before.leader_member().unwrap().name.clone();
    let started = std::time::Instant::now();
    let mut settings = fast_settings();
    settings.etcd_space = SpaceSettings {
        care: true,
        ..SpaceSettings::default()
    };
    let controller = sandbox.start_controller_with(settings);

    // Recovered: the alarm gone, every member healthy, the condition True.
    sandbox
        .wait_for("NOSPACE recovered", LIMIT, || async {
            let snap = admin.snapshot().await.map_err(|e| e.to_string())?;
            if snap.nospace() {
                // What the controller decided, so that a timeout explains itself.
                let space = condition(&kcp(&sandbox).await, "EtcdSpaceHealthy");
                return Err(format!("NOSPACE still raised; EtcdSpaceHealthy {space:?}"));
            }
            if let Some(m) = snap.members.iter().find(|m| !m.is_healthy()) {
                return Err(format!("{} unhealthy: {:?}", m.name, m.unhealthy_reason()));
            }
            match condition(&kcp(&sandbox).await, "EtcdSpaceHealthy") {
                Some((status, reason, _)) if status == "True" && reason == "Healthy" => Ok(()),
                other => Err(format!("EtcdSpaceHealthy {other:?}")),
            }
        })
        .await
        .unwrap();
    eprintln!(
        "space care: NOSPACE recovered {:?} after the controller started",
        started.elapsed()
    );

    // Each step an Event with the numbers: the history compacted (it filled
    // the quota), every member defragmented once, the alarm disarmed once.
    let compacted = event_notes(&sandbox, "EtcdCompacted").await;
    assert_eq!(compacted.len(), 1, "{compacted:?}");
    assert!(
        compacted[0].contains("compacted the etcd history to revision"),
        "{compacted:?}"
    );
    // Which members are over their limit is what etcd reports: etcd 3.6
    // reports each member's own quota (`dbSizeQuota`: member 2's 1 MiB, the
    // others' 2 GiB default), so only member 2 is defragmented; before 3.6
    // no member reports one and the annotation's 1 MiB is every member's,
    // so all three are, the leader last after its leadership moved.
    let own_quotas = before
        .members
        .iter()
        .all(|m| m.status.as_ref().is_some_and(|s| s.db_size_quota > 0));
    let over_limit: Vec<String> = if own_quotas {
        vec![sandbox.etcd.member(2).name.clone()]
    } else {
        sandbox.etcd.member_names()
    };
    let mut defrags = events(&sandbox, "EtcdDefragmented").await;
    defrags.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
    let notes: Vec<String> = defrags.iter().filter_map(|e| e.note.clone()).collect();
    assert_eq!(
        notes.len(),
        over_limit.len(),
        "members report their own quota: {own_quotas}; {notes:?}"
    );
    for name in &over_limit {
        assert_eq!(
            notes
                .iter()
                .filter(|n| n.starts_with(&format!("defragmented etcd member {name}: ")))
                .count(),
            1,
            "{name}: {notes:?}"
        );
    }
    let moved = events(&sandbox, "EtcdLeadershipMoved").await;
    if over_limit.contains(&leader) {
        let last = defrags.last().unwrap();
        assert!(
            notes
                .last()
                .unwrap()
                .starts_with(&format!("defragmented etcd member {leader}: ")),
            "the leader last: {notes:?}"
        );
        assert_eq!(moved.len(), 1, "{moved:?}");
        assert!(
            moved[0].event_time.as_ref().map(|t| t.0) < last.event_time.as_ref().map(|t| t.0),
            "leadership moved before the leader was defragmented"
        );
    } else {
        assert_eq!(moved.len(), 0, "the leader was not defragmented: {moved:?}");
    }
    let disarmed = event_notes(&sandbox, "EtcdAlarmDisarmed").await;
    assert_eq!(disarmed.len(), 1, "{disarmed:?}");
    assert!(
        disarmed[0].starts_with(&format!(
            "disarmed NOSPACE on {}: every member has room below its quota",
            sandbox.etcd.member(2).name
        )),
        "{disarmed:?}"
    );
    assert_eq!(events(&sandbox, "StepFailed").await.len(), 0);

    // Writes are accepted again and the key written before is there.
    sandbox
        .etcd
        .put(1, "after", b"accepted".to_vec())
        .await
        .unwrap();
    assert_eq!(
        sandbox.etcd.get(2, KEEP).await.unwrap().as_deref(),
        Some(KEPT)
    );
    let metrics = &controller.ctx.metrics;
    assert_eq!(
        metrics
            .etcd_space_steps
            .get_or_create(&k3s_control_plane::controller::metrics::SpaceStepLabels {
                step: "defragment".into()
            })
            .get(),
        over_limit.len() as u64
    );
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nospace_is_left_alone_with_space_care_off() {
    let sandbox = full_sandbox().await;
    let admin = sandbox.etcd.connect();
    let controller = sandbox.start_controller();
    // The controller sees it: EtcdClusterHealthy names the alarm.
    sandbox
        .wait_for("the controller sees NOSPACE", LIMIT, || async {
            match condition(&kcp(&sandbox).await, "EtcdClusterHealthy") {
                Some((status, _, message)) if status == "False" && message.contains("NOSPACE") => {
                    Ok(())
                }
                other => Err(format!("EtcdClusterHealthy {other:?}")),
            }
        })
        .await
        .unwrap();
    // Several whole reconciles later, nothing was done: no file shrank.
    let before = snapshot(&sandbox, &admin).await;
    wait_reconciles(&sandbox, &controller.ctx, 4).await;
    let after = snapshot(&sandbox, &admin).await;
    assert!(after.nospace());
    for m in &before.members {
        let size = |s: &k3s_control_plane::etcd::MembershipSnapshot| {
            s.member(m.id)
                .and_then(|m| m.status.as_ref())
                .map(|s| s.db_size)
        };
        assert!(
            size(&after) >= size(&before),
            "{} was defragmented: {:?} -> {:?}",
            m.name,
            size(&before),
            size(&after)
        );
    }
    for reason in [
        "EtcdCompacted",
        "EtcdDefragmented",
        "EtcdLeadershipMoved",
        "EtcdAlarmDisarmed",
    ] {
        assert_eq!(events(&sandbox, reason).await.len(), 0, "{reason}");
    }
    assert_eq!(condition(&kcp(&sandbox).await, "EtcdSpaceHealthy"), None);
    assert!(
        sandbox
            .etcd
            .put(1, "after", b"refused".to_vec())
            .await
            .unwrap_err()
            .to_string()
            .contains("database space exceeded")
    );
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nospace_with_another_member_down_is_refused_naming_it_until_it_is_back() {
    let mut sandbox = full_sandbox().await;
    let admin = sandbox.etcd.connect();
    let snap = snapshot(&sandbox, &admin).await;
    // A member other than the full one, and not the leader (quorum stays).
    let down = (0..2)
        .find(|&i| {
            snap.leader
                != Some(
                    snap.member_by_name(&sandbox.etcd.member(i).name)
                        .unwrap()
                        .id,
                )
        })
        .unwrap();
    let down_name = sandbox.etcd.member(down).name.clone();
    sandbox.etcd.stop(down).await.unwrap();
    let mut settings = fast_settings();
    settings.etcd_space = SpaceSettings {
        care: true,
        ..SpaceSettings::default()
    };
    let controller = sandbox.start_controller_with(settings);

    let message = sandbox
        .wait_for(
            "EtcdSpaceHealthy=False NoSpace naming the member down",
            LIMIT,
            || async {
                match condition(&kcp(&sandbox).await, "EtcdSpaceHealthy") {
                    Some((status, reason, message))
                        if status == "False"
                            && reason == "NoSpace"
                            && message.contains(&down_name) =>
                    {
                        Ok(message)
                    }
                    other => Err(format!("EtcdSpaceHealthy {other:?}")),
                }
            },
        )
        .await
        .unwrap();
    assert!(
        message.contains(&format!("but {down_name} is unhealthy ("))
            && message.ends_with("(etcd-space.blocked.unhealthy-member)"),
        "{message}"
    );
    let blocked = event_notes(&sandbox, "EtcdSpaceBlocked").await;
    assert!(
        blocked.iter().any(|n| n.contains(&down_name)),
        "{blocked:?}"
    );
    wait_reconciles(&sandbox, &controller.ctx, 3).await;
    for reason in [
        "EtcdCompacted",
        "EtcdDefragmented",
        "EtcdLeadershipMoved",
        "EtcdAlarmDisarmed",
    ] {
        assert_eq!(events(&sandbox, reason).await.len(), 0, "{reason}");
    }
    assert!(snapshot(&sandbox, &admin).await.nospace());

    // Back: the recovery goes ahead by itself.
    sandbox.etcd.restart(down).await.unwrap();
    sandbox
        .wait_for(
            "NOSPACE recovered once the member is back",
            LIMIT,
            || async {
                match condition(&kcp(&sandbox).await, "EtcdSpaceHealthy") {
                    Some((status, _, _)) if status == "True" => Ok(()),
                    other => Err(format!("EtcdSpaceHealthy {other:?}")),
                }
            },
        )
        .await
        .unwrap();
    assert!(!snapshot(&sandbox, &admin).await.nospace());
    assert_eq!(
        sandbox.etcd.get(down, KEEP).await.unwrap().as_deref(),
        Some(KEPT)
    );
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fragmented_cluster_is_defragmented_by_the_controller_one_member_at_a_time() {
    init_logs();
    // Each member runs with a 200 MiB quota (as `--etcd-arg
    // quota-backend-bytes=...` gives it on k3s): etcd 3.6 reports it itself
    // (`dbSizeQuota`); before 3.6 the control plane's annotation tells it.
    // With the annotation alone a 3.6 member reports etcd's 2 GiB default
    // and is never near its limit (seen on 3.6.13: no defragmentation).
    const QUOTA_200_MIB: u64 = 200 * 1024 * 1024;
    let sandbox = Sandbox::start_with(
        EtcdTestCluster::builder()
            .members(3)
            .quota_backend_bytes(0, QUOTA_200_MIB)
            .quota_backend_bytes(1, QUOTA_200_MIB)
            .quota_backend_bytes(2, QUOTA_200_MIB),
        3,
    )
    .await
    .unwrap();
    sandbox.etcd.fill_fragmented(48).await.unwrap();
    // Files of about 125 MiB, half free, against a 200 MiB quota.
    annotate_kcp(
        &sandbox,
        json!({"controlplane.cluster.x-k8s.io/etcd-quota-backend-bytes": "200Mi"}),
    )
    .await;
    let admin = sandbox.etcd.connect();
    let leader = snapshot(&sandbox, &admin).await.leader.unwrap();
    let leader = sandbox.etcd.index_of(leader).unwrap();
    let mut before = Vec::new();
    for i in 0..3 {
        before.push(sandbox.etcd.status(i).await.unwrap().db_size);
    }
    let mut settings = fast_settings();
    settings.etcd_space = SpaceSettings {
        care: true,
        thresholds: Thresholds {
            fragmentation: 0.3,
            ..Thresholds::default()
        },
        ..SpaceSettings::default()
    };
    let sampler = sandbox.etcd.sample_local_reads();
    let controller = sandbox.start_controller_with(settings);
    sandbox
        .wait_for("every member defragmented", LIMIT, || async {
            let done = events(&sandbox, "EtcdDefragmented").await.len();
            match condition(&kcp(&sandbox).await, "EtcdSpaceHealthy") {
                Some((status, reason, _))
                    if done == 3 && status == "True" && reason == "Healthy" =>
                {
                    Ok(())
                }
                other => Err(format!("{done} defragmented, EtcdSpaceHealthy {other:?}")),
            }
        })
        .await
        .unwrap();
    let samples = sampler.finish().await;

    // The order the Events tell, and what the members showed.
    let mut defrags = events(&sandbox, "EtcdDefragmented").await;
    defrags.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
    let names = sandbox.etcd.member_names();
    let order: Vec<usize> = defrags
        .iter()
        .map(|e| {
            let note = e.note.clone().unwrap_or_default();
            names
                .iter()
                .position(|n| note.starts_with(&format!("defragmented etcd member {n}: ")))
                .unwrap_or_else(|| panic!("{note}"))
        })
        .collect();
    assert_eq!(order[2], leader, "the leader last: {order:?}");
    one_at_a_time(&samples, &before, &order, &names).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(events(&sandbox, "EtcdLeadershipMoved").await.len(), 1);
    for reason in ["EtcdCompacted", "EtcdAlarmDisarmed", "StepFailed"] {
        assert_eq!(events(&sandbox, reason).await.len(), 0, "{reason}");
    }
    for i in 0..3 {
        let after = sandbox.etcd.status(i).await.unwrap().db_size;
        assert!(
            after * 3 < before[i] * 2,
            "{}: {} -> {after}",
            names[i],
            before[i]
        );
    }
    controller.stop().await;
}
