//! End to end, on real etcd and a real S3 server (moto): with
//! `spec.etcdBackup`, no member is removed before its verified snapshot is
//! in the target; a failing target blocks the removal with a condition that
//! names the field, until it works again or a person waives it once;
//! scheduled snapshots and retention on a directory target.

use crate::support;

use std::time::{Duration, SystemTime};

use k3s_control_plane::api::condition_names::ETCD_BACKUP_READY;
use k3s_control_plane::api::condition_names::etcd_backup_ready::{
    REASON_READY, REASON_SNAPSHOT_FAILED,
};
use k3s_control_plane::api::etcd_backup::SnapshotPurpose;
use k3s_control_plane::api::names::ETCD_SNAPSHOT_WAIVED_ANNOTATION;
use k3s_control_plane::backup::{SnapshotName, SnapshotReason, Target, TargetConfig};
use k3s_control_plane::harness::s3::MotoServer;
use k3s_control_plane::harness::sandbox::{CLUSTER, NAMESPACE, Sandbox};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;
use support::*;

const CREDENTIALS: &str = "etcd-backup-s3";

fn moto(buckets: &[&str]) -> MotoServer {
    MotoServer::start(buckets).unwrap_or_else(|e| panic!("{e} (run hack/setup.sh)"))
}

async fn create_credentials(sandbox: &Sandbox, id: &str, secret: &str) {
    let secrets: Api<Secret> = Api::namespaced(sandbox.client(), NAMESPACE);
    let object: Secret = serde_json::from_value(json!({
        "metadata": {"name": CREDENTIALS, "namespace": NAMESPACE},
        "stringData": {"AWS_ACCESS_KEY_ID": id, "AWS_SECRET_ACCESS_KEY": secret},
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &object)
        .await
        .unwrap();
}

/// `EtcdBackupReady` as (status, reason, message), once it is there.
async fn backup_condition(sandbox: &Sandbox) -> Option<(String, String, String)> {
    let kcp = kcp(sandbox).await;
    kcp.status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == ETCD_BACKUP_READY)
        .map(|c| (c.status, c.reason, c.message))
}

/// `EtcdBackupReady`'s message once it says a snapshot failed.
async fn wait_snapshot_failed(sandbox: &Sandbox) -> String {
    let (_, _, message) = sandbox
        .wait_for("EtcdBackupReady False", LIMIT, || async {
            match backup_condition(sandbox).await {
                Some(c) if c.1 == REASON_SNAPSHOT_FAILED => Ok(c),
                other => Err(format!("{other:?}")),
            }
        })
        .await
        .unwrap();
    message
}

async fn stored(config: &TargetConfig) -> Vec<String> {
    let target = Target::open(config).unwrap();
    let mut names: Vec<String> = target
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    names.sort();
    names
}

/// Write `key` through member `index`; the store's revision right after
/// (nothing else writes to this etcd, so it is the write's own).
async fn put_key(sandbox: &Sandbox, index: usize, key: &str) -> i64 {
    sandbox.etcd.put(index, key, b"v".to_vec()).await.unwrap();
    let snap = sandbox.etcd.connect().snapshot().await.unwrap();
    snap.members
        .iter()
        .filter_map(|m| m.status.as_ref().map(|s| s.revision))
        .max()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remediation_waits_for_its_snapshot_while_the_bucket_is_missing_then_stores_it_first() {
    init_logs();
    let s3 = moto(&[]);
    let sandbox = Sandbox::start(3).await.unwrap();
    create_credentials(&sandbox, s3.access_key_id(), s3.secret_access_key()).await;
    patch_kcp_spec(
        &sandbox,
        json!({"etcdBackup": {"target": {"s3": {
            "endpoint": s3.endpoint(), "bucket": "snapshots", "folder": "demo",
            "insecure": true, "credentialsSecret": {"name": CREDENTIALS},
        }}}}),
    )
    .await;
    let admin = sandbox.etcd.connect();
    let before = admin.snapshot().await.unwrap();
    let leader = before.leader.unwrap();
    let index = (0..3)
        .find(|i| sandbox.etcd.member(*i).id != leader)
        .unwrap();
    let target = sandbox.machines[index].clone();
    let member = sandbox.etcd.member(index).name.clone();
    let member_id = sandbox.etcd.member(index).id;
    let leader_index = sandbox.etcd.index_of(leader).unwrap();
    let written_before = put_key(&sandbox, leader_index, "/registry/before-the-snapshot").await;

    let controller = sandbox.start_controller();
    sandbox.mark_unhealthy(&target).await.unwrap();

    // The bucket does not exist: the removal waits, and says why.
    let message = wait_snapshot_failed(&sandbox).await;
    assert!(
        message.contains("spec.etcdBackup.target.s3.bucket") && message.contains("snapshots"),
        "{message}"
    );
    assert!(!message.contains(s3.secret_access_key()), "{message}");
    let warnings = event_notes(&sandbox, "EtcdSnapshotFailed").await;
    assert!(!warnings.is_empty());
    // Several more passes later the member is still there, and no Machine went.
    wait_reconciles(&sandbox, &controller.ctx, 3).await;
    let snap = admin.snapshot().await.unwrap();
    assert!(
        snap.member_by_name(&member).is_some(),
        "removed without a snapshot"
    );

    // The target works again: the snapshot is stored, then the member goes.
    s3.create_bucket("snapshots").unwrap();
    wait_member_gone(&sandbox, &admin, &member).await;
    let written_after = put_key(&sandbox, leader_index, "/registry/after-the-removal").await;
    let kcp = kcp(&sandbox).await;
    let record = kcp
        .status
        .as_ref()
        .and_then(|s| s.etcd_backup.as_ref())
        .and_then(|b| b.last(SnapshotPurpose::BeforeRemoval))
        .cloned()
        .expect("a before-removal snapshot recorded");
    assert_eq!(
        record.before_removal_of.as_deref(),
        Some(format!("{member_id:016x}").as_str())
    );
    assert!(
        record.revision >= written_before && record.revision < written_after,
        "snapshot revision {} not between {written_before} and {written_after}",
        record.revision
    );
    let names = stored(&s3.target("snapshots", &format!("demo/{NAMESPACE}/{CLUSTER}"))).await;
    assert!(
        names.contains(&record.name),
        "{names:?} lacks {}",
        record.name
    );
    let parsed = SnapshotName::parse(&record.name).unwrap();
    assert_eq!(parsed.reason(), Some(SnapshotReason::BeforeRemoval));
    assert_eq!(
        record.location,
        format!("s3://snapshots/demo/{NAMESPACE}/{CLUSTER}/{}", record.name)
    );
    let target_store =
        Target::open(&s3.target("snapshots", &format!("demo/{NAMESPACE}/{CLUSTER}"))).unwrap();
    let verified = k3s_control_plane::backup::verify_stored(&target_store, &record.name)
        .await
        .unwrap();
    assert_eq!(verified.size as i64, record.size_bytes);
    assert!(event_count(&sandbox, "EtcdSnapshotSaved").await >= 1);
    sandbox
        .wait_for("EtcdBackupReady True", LIMIT, || async {
            match backup_condition(&sandbox).await {
                Some(c) if c.0 == "True" && c.1 == REASON_READY => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await
        .unwrap();
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_waives_the_snapshot_for_one_removal_and_the_waiver_is_spent() {
    init_logs();
    let s3 = moto(&[]);
    let sandbox = Sandbox::start(3).await.unwrap();
    create_credentials(&sandbox, s3.access_key_id(), "not-the-secret").await;
    patch_kcp_spec(
        &sandbox,
        json!({"etcdBackup": {"target": {"s3": {
            "endpoint": s3.endpoint(), "bucket": "snapshots", "insecure": true,
            "credentialsSecret": {"name": CREDENTIALS},
        }}}}),
    )
    .await;
    let admin = sandbox.etcd.connect();
    let leader = admin.snapshot().await.unwrap().leader.unwrap();
    let index = (0..3)
        .find(|i| sandbox.etcd.member(*i).id != leader)
        .unwrap();
    let target = sandbox.machines[index].clone();
    let member = sandbox.etcd.member(index).name.clone();
    let controller = sandbox.start_controller();
    sandbox.mark_unhealthy(&target).await.unwrap();
    // The wrong secret: refused by the target, named, never shown.
    let message = wait_snapshot_failed(&sandbox).await;
    assert!(
        message.contains("spec.etcdBackup.target.s3.credentialsSecret"),
        "{message}"
    );
    assert!(!message.contains("not-the-secret"), "{message}");
    let snap = admin.snapshot().await.unwrap();
    assert!(
        snap.member_by_name(&member).is_some(),
        "removed without a snapshot"
    );
    annotate_kcp(&sandbox, json!({ ETCD_SNAPSHOT_WAIVED_ANNOTATION: target })).await;
    wait_member_gone(&sandbox, &admin, &member).await;
    sandbox
        .wait_for("the waiver to be spent", LIMIT, || async {
            let kcp = kcp(&sandbox).await;
            match kcp
                .metadata
                .annotations
                .unwrap_or_default()
                .get(ETCD_SNAPSHOT_WAIVED_ANNOTATION)
            {
                Some(v) => Err(format!("still there: {v}")),
                None => Ok(()),
            }
        })
        .await
        .unwrap();
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_snapshot_is_taken_when_due_and_retention_prunes_only_ours() {
    init_logs();
    let root = tempfile::tempdir().unwrap();
    let sandbox = Sandbox::start(1).await.unwrap();
    // Each cluster's snapshots are under <path>/<namespace>/<cluster>.
    let dir = root.path().join(NAMESPACE).join(CLUSTER);
    std::fs::create_dir_all(&dir).unwrap();
    let node = sandbox.etcd.member(0).node_name.clone();
    // Two older snapshots of ours and one of k3s's own.
    let day = Duration::from_secs(86_400);
    let now = SystemTime::now();
    let old: Vec<String> = [3u32, 2]
        .iter()
        .map(|d| {
            SnapshotName::ours(SnapshotReason::Scheduled, &node, now - day * *d)
                .unwrap()
                .to_string()
        })
        .collect();
    for name in &old {
        std::fs::write(dir.join(name), b"old").unwrap();
    }
    let k3s_own = format!("etcd-snapshot-{node}-1700000000");
    std::fs::write(dir.join(&k3s_own), b"k3s").unwrap();
    patch_kcp_spec(
        &sandbox,
        json!({"etcdBackup": {
            "target": {"filesystem": {"path": root.path()}},
            // Yearly: its last occurrence has no snapshot yet, so it is due now.
            "schedule": "0 0 1 1 *",
            "retention": {"count": 2},
        }}),
    )
    .await;
    let controller = sandbox.start_controller();
    let record = sandbox
        .wait_for("a scheduled snapshot", LIMIT, || async {
            let kcp = kcp(&sandbox).await;
            kcp.status
                .and_then(|s| s.etcd_backup)
                .and_then(|b| b.last(SnapshotPurpose::Scheduled).cloned())
                .ok_or_else(|| "none yet".to_string())
        })
        .await
        .unwrap();
    let config = TargetConfig::Filesystem { path: dir.clone() };
    let names = sandbox
        .wait_for("the oldest of ours pruned", LIMIT, || async {
            let names = stored(&config).await;
            if names.contains(&old[0]) {
                return Err(format!("{names:?}"));
            }
            Ok(names)
        })
        .await
        .unwrap();
    let mut want = vec![old[1].clone(), record.name.clone(), k3s_own.clone()];
    want.sort();
    assert_eq!(names, want);
    // Not due again: later passes take none.
    wait_reconciles(&sandbox, &controller.ctx, 3).await;
    assert_eq!(stored(&config).await, want);
    assert_eq!(event_count(&sandbox, "EtcdSnapshotSaved").await, 1);
    assert!(warning_events(&sandbox).await.is_empty());
    controller.stop().await;
}
