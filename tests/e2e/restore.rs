//! End to end, on real etcd and a real S3 server (moto): a control plane of
//! three servers loses two for good; nothing happens until a person names a
//! snapshot; then the controller verifies it, deletes the old Machines,
//! creates one that restores it (the simulated k3s runs the cluster-reset
//! restore from S3 with real etcd tooling), and scale-up joins two more:
//! three healthy voters holding the keys written before the snapshot.
//! Bad requests (quorum still there, an unknown or corrupt snapshot, a
//! missing bucket) are refused with the field named and nothing deleted.

use crate::support;

use std::time::{Duration, SystemTime};

use k3s_control_plane::api::condition_names::ETCD_RESTORING;
use k3s_control_plane::api::condition_names::etcd_restoring::{
    REASON_RESTORE_REFUSED, REASON_RESTORED, REASON_SNAPSHOT_UNUSABLE,
};
use k3s_control_plane::api::names::{
    ETCD_RESTORE_ACCEPTED_ANNOTATION, ETCD_RESTORE_ANNOTATION, ETCD_RESTORE_FORCE_ANNOTATION,
    ETCD_RESTORE_OF_ANNOTATION, PRE_TERMINATE_HOOK_ANNOTATION,
};
use k3s_control_plane::api::{KThreesConfig, Machine};
use k3s_control_plane::backup::restore_boot::SERVER_TO_CLUSTER_INIT;
use k3s_control_plane::backup::{SnapshotName, SnapshotReason, Target};
use k3s_control_plane::harness::infra_sim::reconcile_infrastructure;
use k3s_control_plane::harness::s3::MotoServer;
use k3s_control_plane::harness::sandbox::{CLUSTER, KCP, NAMESPACE, Sandbox};
use k8s_openapi::api::core::v1::Secret;
use kube::api::PostParams;
use kube::{Api, ResourceExt};
use serde_json::json;
use support::*;

const BIN: &str = env!("CARGO_BIN_EXE_k3s-control-plane");
const CREDENTIALS: &str = "etcd-backup-s3";

/// `k3s-control-plane restore` against the sandbox's management cluster:
/// (exit code, stdout, stderr). Run without blocking the runtime that
/// serves the sandbox's API.
async fn restore_cli(sandbox: &Sandbox, args: &[&str]) -> (i32, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("management.yaml");
    std::fs::write(
        &kubeconfig,
        k3s_control_plane::yaml::to_string(&sandbox.management.kubeconfig()).unwrap(),
    )
    .unwrap();
    let out = tokio::process::Command::new(BIN)
        .arg("restore")
        .arg(format!("{NAMESPACE}/{KCP}"))
        .args(args)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .env_remove("RUST_LOG")
        .output()
        .await
        .expect("run the binary");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
const BUCKET: &str = "snapshots";
const KEYS: usize = 20;

async fn with_s3_target(sandbox: &Sandbox, s3: &MotoServer, bucket: &str) {
    let secrets: Api<Secret> = Api::namespaced(sandbox.client(), NAMESPACE);
    let object: Secret = serde_json::from_value(json!({
        "metadata": {"name": CREDENTIALS, "namespace": NAMESPACE},
        "stringData": {"AWS_ACCESS_KEY_ID": s3.access_key_id(),
                       "AWS_SECRET_ACCESS_KEY": s3.secret_access_key()},
    }))
    .unwrap();
    let _ = secrets.create(&PostParams::default(), &object).await;
    patch_kcp_spec(
        sandbox,
        json!({"etcdBackup": {"target": {"s3": {
            "endpoint": s3.endpoint(), "bucket": bucket, "folder": "demo",
            "insecure": true, "credentialsSecret": {"name": CREDENTIALS},
        }}}}),
    )
    .await;
}

fn folder() -> String {
    format!("demo/{NAMESPACE}/{CLUSTER}")
}

/// Write the test keys, take an on-demand snapshot from member 0 with our
/// engine (as `etcd snapshot save` does), then write one key after it.
async fn keys_and_snapshot(sandbox: &Sandbox, s3: &MotoServer) -> String {
    for i in 0..KEYS {
        sandbox
            .etcd
            .put(
                0,
                &format!("/registry/test/key-{i}"),
                format!("value-{i}").into_bytes(),
            )
            .await
            .unwrap();
    }
    let admin = sandbox.etcd.connect();
    let membership = admin.snapshot().await.unwrap();
    let from = sandbox.etcd.member(0).id;
    let node = sandbox.etcd.member(0).node_name.clone();
    let name = SnapshotName::ours(SnapshotReason::OnDemand, &node, SystemTime::now()).unwrap();
    let target = Target::open(&s3.target(BUCKET, &folder())).unwrap();
    let saved = k3s_control_plane::backup::save(
        &admin,
        &membership,
        from,
        &target,
        &name,
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    sandbox
        .etcd
        .put(0, "/registry/test/after-the-snapshot", b"lost".to_vec())
        .await
        .unwrap();
    saved.name
}

/// `EtcdRestoring` as (status, reason, message), once there.
async fn restoring(sandbox: &Sandbox) -> Option<(String, String, String)> {
    kcp(sandbox)
        .await
        .status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == ETCD_RESTORING)
        .map(|c| (c.status, c.reason, c.message))
}

async fn wait_restoring_reason(sandbox: &Sandbox, reason: &str, part: &str) -> String {
    let (_, _, message) = sandbox
        .wait_for(
            &format!("EtcdRestoring {reason} ({part})"),
            LIMIT,
            || async {
                match restoring(sandbox).await {
                    Some(c) if c.1 == reason && c.2.contains(part) => Ok(c),
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await
        .unwrap();
    message
}

async fn quorum_lost_seen(sandbox: &Sandbox) {
    sandbox
        .wait_for("status.etcd to show quorum lost", LIMIT, || async {
            let status = kcp(sandbox).await.status.and_then(|s| s.etcd);
            match status {
                Some(e) if e.quorum_margin < 0 => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await
        .unwrap();
}

/// No step of a restore has run: the same Machines, none deleting, no
/// acceptance, no restore Event.
async fn nothing_restored(sandbox: &Sandbox, before: &[String], what: &str) {
    let all = machines(sandbox).await;
    let names: Vec<String> = all.iter().map(|m| m.name_any()).collect();
    assert_eq!(names, before, "{what}: Machines changed");
    assert!(
        all.iter().all(|m| !m.is_deleting()),
        "{what}: a Machine is deleting"
    );
    assert!(
        !kcp(sandbox)
            .await
            .annotations()
            .contains_key(ETCD_RESTORE_ACCEPTED_ANNOTATION),
        "{what}: accepted"
    );
    for reason in [
        "EtcdRestoreAccepted",
        "EtcdRestoreRetiredMachine",
        "EtcdRestoreMachineCreated",
    ] {
        assert_eq!(event_count(sandbox, reason).await, 0, "{what}: {reason}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_servers_two_lost_are_restored_from_a_snapshot_after_a_person_asks() {
    init_logs();
    let s3 = MotoServer::start(&[BUCKET]).unwrap_or_else(|e| panic!("{e} (run hack/setup.sh)"));
    let mut sandbox = Sandbox::start(3).await.unwrap();
    with_s3_target(&sandbox, &s3, BUCKET).await;
    let snapshot = keys_and_snapshot(&sandbox, &s3).await;
    let old_machines = machine_names(&sandbox).await;
    let old_members = sandbox.etcd.member_names();

    let controller = sandbox.start_controller();
    // Two servers lost for good.
    sandbox.etcd.stop(1).await.unwrap();
    sandbox.etcd.stop(2).await.unwrap();
    quorum_lost_seen(&sandbox).await;
    wait_reconciles(&sandbox, &controller.ctx, 4).await;
    nothing_restored(&sandbox, &old_machines, "before the person asked").await;

    // A person names the snapshot, through the CLI: it checks what the
    // controller will (quorum, the snapshot whole in the target), then asks.
    let asked = tokio::time::Instant::now();
    let (code, stdout, stderr) = restore_cli(&sandbox, &["--snapshot", &snapshot]).await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout.contains("etcd has lost quorum (voters 3, healthy "),
        "{stdout}"
    );
    assert!(stdout.contains("SHA-256 verified"), "{stdout}");
    assert_eq!(
        kcp(&sandbox)
            .await
            .annotations()
            .get(ETCD_RESTORE_ANNOTATION),
        Some(&snapshot)
    );
    let deadline = asked + LIMIT * 3;
    let mut restore_machine = None;
    let mut most_machines = 0;
    // A Secret of the keys Secret's name that is not the control plane's is
    // never written over: the restore Machine waits until it is gone.
    let secrets: Api<Secret> = Api::namespaced(sandbox.client(), NAMESPACE);
    let keys_name = format!("{CLUSTER}-etcd-restore-s3");
    let foreign: Secret = serde_json::from_value(json!({
        "metadata": {"name": keys_name, "namespace": NAMESPACE},
        "stringData": {"s3.env": "someone else's"},
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    let mut foreign_present = true;
    // The Secrets the restored data decrypts with stay as they were.
    let token_before: Secret = secrets.get(&format!("{CLUSTER}-token")).await.unwrap();
    loop {
        reconcile_infrastructure(&mut sandbox, LIMIT).await.unwrap();
        let all = machines(&sandbox).await;
        if foreign_present
            && event_notes(&sandbox, "StepFailed").await.iter().any(|n| {
                n.contains(&format!(
                    "Secret {NAMESPACE}/{keys_name} exists and is not this control plane's"
                ))
            })
        {
            assert!(
                all.iter()
                    .all(|m| !m.annotations().contains_key(ETCD_RESTORE_OF_ANNOTATION)),
                "a restore Machine was made without its keys"
            );
            let kept: Secret = secrets.get(&keys_name).await.unwrap();
            assert_eq!(
                kept.data.unwrap()["s3.env"].0,
                b"someone else's".to_vec(),
                "the foreign Secret was written over"
            );
            secrets
                .delete(&keys_name, &Default::default())
                .await
                .unwrap();
            foreign_present = false;
        }
        // One new server at a time: the restore Machine, then each join.
        let provisioning = all
            .iter()
            .filter(|m| !m.is_deleting() && m.node_name().is_none())
            .count();
        assert!(
            provisioning <= 1,
            "{provisioning} Machines provisioning at once"
        );
        // Never an old Machine beside the restoring one.
        if let Some(r) = all
            .iter()
            .find(|m| m.annotations().contains_key(ETCD_RESTORE_OF_ANNOTATION))
        {
            restore_machine.get_or_insert_with(|| r.name_any());
            assert!(
                all.iter().all(|m| !old_machines.contains(&m.name_any())),
                "the restore Machine exists beside old ones: {:?}",
                all.iter().map(|m| m.name_any()).collect::<Vec<_>>()
            );
        }
        most_machines = most_machines.max(all.len());
        let restored = kcp(&sandbox)
            .await
            .status
            .and_then(|s| s.etcd_backup)
            .and_then(|b| b.last_restore);
        let ready = all.len() == 3
            && all
                .iter()
                .all(|m| !m.is_deleting() && m.node_name().is_some());
        if restored.is_some() && ready {
            let snap = sandbox.etcd.connect().snapshot().await;
            if let Ok(snap) = snap
                && snap.members.len() == 3
                && snap.members.iter().all(|m| !m.learner && m.is_healthy())
            {
                break;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not restored in time: {:?}",
            restoring(&sandbox).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !foreign_present,
        "the foreign keys Secret was never refused"
    );
    let token_after: Secret = secrets.get(&format!("{CLUSTER}-token")).await.unwrap();
    assert_eq!(
        (token_after.uid(), token_after.resource_version()),
        (token_before.uid(), token_before.resource_version()),
        "the token Secret changed"
    );
    let took = asked.elapsed();
    eprintln!("restored and grown back to 3 in {:.1}s", took.as_secs_f64());
    assert!(most_machines <= 3, "{most_machines} Machines at once");

    // The restore Machine ran k3s's reset from S3 and restored the snapshot.
    let restore_machine = restore_machine.expect("a restore Machine was created");
    let record = sandbox
        .restore_of(&restore_machine)
        .cloned()
        .expect("the restore ran");
    assert!(record.outcome.is_ok(), "{record:?}");
    let config: KThreesConfig = Api::namespaced(sandbox.client(), NAMESPACE)
        .get(&restore_machine)
        .await
        .unwrap();
    assert_eq!(config.spec.pre_k3s_commands[0], SERVER_TO_CLUSTER_INIT);
    assert!(
        config.spec.post_k3s_commands[1].contains(&format!(
            "--cluster-reset-restore-path={snapshot} --etcd-s3"
        )),
        "{:?}",
        config.spec.post_k3s_commands
    );
    // The derived keys Secret holds no more than k3s needs.
    let keys: Secret = Api::namespaced(sandbox.client(), NAMESPACE)
        .get(&format!("{CLUSTER}-etcd-restore-s3"))
        .await
        .unwrap();
    assert_eq!(keys.data.unwrap().keys().collect::<Vec<_>>(), ["s3.env"]);

    // Three healthy voters, none of the old ones, with the snapshot's keys
    // and not what was written after it.
    let snap = sandbox.etcd.connect().snapshot().await.unwrap();
    assert!(
        snap.members.iter().all(|m| !old_members.contains(&m.name)),
        "{:?}",
        member_names(&snap)
    );
    let live = sandbox.etcd.index_of(snap.leader.unwrap()).unwrap();
    for i in 0..KEYS {
        assert_eq!(
            sandbox
                .etcd
                .get(live, &format!("/registry/test/key-{i}"))
                .await
                .unwrap(),
            Some(format!("value-{i}").into_bytes()),
            "key-{i}"
        );
    }
    assert_eq!(
        sandbox
            .etcd
            .get(live, "/registry/test/after-the-snapshot")
            .await
            .unwrap(),
        None
    );

    // Every Machine is managed as usual again (our hook on each), the
    // request is gone, status and the condition say what was done.
    let all = machines(&sandbox).await;
    assert!(all.iter().all(|m| !old_machines.contains(&m.name_any())));
    for m in &all {
        sandbox
            .wait_for(&format!("our hook on {}", m.name_any()), LIMIT, || async {
                let m: Machine = sandbox
                    .machines_api()
                    .get(&m.name_any())
                    .await
                    .map_err(|e| e.to_string())?;
                m.annotations()
                    .contains_key(PRE_TERMINATE_HOOK_ANNOTATION)
                    .then_some(())
                    .ok_or_default()
            })
            .await
            .unwrap();
    }
    let kcp = kcp(&sandbox).await;
    for key in [ETCD_RESTORE_ANNOTATION, ETCD_RESTORE_ACCEPTED_ANNOTATION] {
        assert!(!kcp.annotations().contains_key(key), "{key} left");
    }
    let last = kcp
        .status
        .unwrap()
        .etcd_backup
        .unwrap()
        .last_restore
        .unwrap();
    assert_eq!(
        (last.snapshot.as_str(), last.machine.as_str(), last.forced),
        (snapshot.as_str(), restore_machine.as_str(), false)
    );
    let message = wait_restoring_reason(&sandbox, REASON_RESTORED, &snapshot).await;
    assert!(message.contains(&restore_machine), "{message}");
    assert_eq!(event_count(&sandbox, "EtcdRestoreAccepted").await, 1);
    assert_eq!(event_count(&sandbox, "EtcdRestoreRetiredMachine").await, 3);
    assert_eq!(event_count(&sandbox, "EtcdRestoreMachineCreated").await, 1);
    assert_eq!(event_count(&sandbox, "EtcdRestored").await, 1);
    let restores = &controller.ctx.metrics.etcd_restores;
    for (step, count) in [
        ("accepted", 1),
        ("retired-machine", 3),
        ("machine-created", 1),
        ("restored", 1),
    ] {
        let counted = restores
            .get_or_create(&k3s_control_plane::controller::metrics::EtcdRestoreLabels {
                step: step.into(),
            })
            .get();
        assert_eq!(
            counted, count,
            "k3scp_etcd_restore_steps_total{{step={step}}}"
        );
    }
    controller.stop().await;
}

trait OkOrDefault {
    fn ok_or_default(self) -> Result<(), String>;
}

impl OkOrDefault for Option<()> {
    fn ok_or_default(self) -> Result<(), String> {
        self.ok_or_else(|| "not yet".to_string())
    }
}

/// Every request that cannot be carried out is refused, with the field or
/// annotation named, and nothing is deleted: quorum still there (until
/// forced), an unknown snapshot, a corrupt one, a missing bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_restore_requests_are_refused_and_nothing_is_deleted() {
    init_logs();
    let s3 = MotoServer::start(&[BUCKET]).unwrap_or_else(|e| panic!("{e} (run hack/setup.sh)"));
    let mut sandbox = Sandbox::start(3).await.unwrap();
    with_s3_target(&sandbox, &s3, BUCKET).await;
    let snapshot = keys_and_snapshot(&sandbox, &s3).await;
    let before = machine_names(&sandbox).await;
    let controller = sandbox.start_controller();

    // Quorum holds: the CLI refuses (exit 2) and sets nothing.
    let (code, _, stderr) = restore_cli(&sandbox, &["--snapshot", &snapshot]).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("etcd has quorum (voters 3, healthy 3, quorum 2)"),
        "{stderr}"
    );
    assert!(
        !kcp(&sandbox)
            .await
            .annotations()
            .contains_key(ETCD_RESTORE_ANNOTATION)
    );
    // Set by hand instead, the controller refuses it with the numbers.
    annotate_kcp(&sandbox, json!({ETCD_RESTORE_ANNOTATION: snapshot})).await;
    let message = wait_restoring_reason(&sandbox, REASON_RESTORE_REFUSED, "etcd has quorum").await;
    assert!(
        message.contains("voters 3, healthy 3, quorum 2"),
        "{message}"
    );
    assert!(message.contains(ETCD_RESTORE_FORCE_ANNOTATION), "{message}");
    assert!(!event_notes(&sandbox, "EtcdRestoreRefused").await.is_empty());
    wait_reconciles(&sandbox, &controller.ctx, 3).await;
    nothing_restored(&sandbox, &before, "quorum holds").await;
    // The person takes the request back before quorum goes: nothing of it
    // is left to act on later.
    annotate_kcp(&sandbox, json!({ETCD_RESTORE_ANNOTATION: null})).await;
    sandbox
        .wait_for("the refusal to clear", LIMIT, || async {
            match restoring(&sandbox).await {
                None => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await
        .unwrap();

    // Quorum lost, but the snapshot named is not in the target.
    sandbox.etcd.stop(1).await.unwrap();
    sandbox.etcd.stop(2).await.unwrap();
    quorum_lost_seen(&sandbox).await;
    let unknown = "capi-on-demand-nowhere-1765000000";
    let (code, _, stderr) = restore_cli(&sandbox, &["--snapshot", unknown]).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "--snapshot {unknown}: snapshot {unknown} not found"
        )),
        "{stderr}"
    );
    annotate_kcp(&sandbox, json!({ETCD_RESTORE_ANNOTATION: unknown})).await;
    let message = wait_restoring_reason(&sandbox, REASON_SNAPSHOT_UNUSABLE, unknown).await;
    assert!(message.contains(ETCD_RESTORE_ANNOTATION), "{message}");
    assert!(message.contains("not found"), "{message}");
    assert!(
        message.contains(&format!("s3://{BUCKET}/{}", folder())),
        "{message}"
    );

    // A corrupt copy under a name of its own: etcd's checksum refuses it.
    let target = Target::open(&s3.target(BUCKET, &folder())).unwrap();
    let mut bytes = Vec::new();
    {
        use futures::StreamExt;
        let mut stream = target.read(&snapshot).await.unwrap();
        while let Some(chunk) = stream.next().await {
            bytes.extend_from_slice(&chunk.unwrap());
        }
    }
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    let corrupt = format!(
        "capi-on-demand-{}-1765000001",
        sandbox.etcd.member(0).node_name
    );
    let mut upload = target.put(&corrupt).await.unwrap();
    upload.write(&bytes).await.unwrap();
    upload.finish().await.unwrap();
    annotate_kcp(&sandbox, json!({ETCD_RESTORE_ANNOTATION: corrupt})).await;
    let message = wait_restoring_reason(&sandbox, REASON_SNAPSHOT_UNUSABLE, &corrupt).await;
    assert!(
        message.to_lowercase().contains("sha-256") || message.contains("hash"),
        "{message}"
    );

    // The right snapshot, but the credentials are wrong: refused by the
    // target, the Secret named, the secret never shown.
    let secrets: Api<Secret> = Api::namespaced(sandbox.client(), NAMESPACE);
    let wrong = json!({"stringData": {"AWS_SECRET_ACCESS_KEY": "not-the-secret"}});
    secrets
        .patch(
            CREDENTIALS,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&wrong),
        )
        .await
        .unwrap();
    annotate_kcp(&sandbox, json!({ETCD_RESTORE_ANNOTATION: snapshot})).await;
    let message = wait_restoring_reason(
        &sandbox,
        REASON_SNAPSHOT_UNUSABLE,
        "spec.etcdBackup.target.s3.credentialsSecret",
    )
    .await;
    assert!(!message.contains("not-the-secret"), "{message}");

    // The right snapshot and keys, but a bucket the endpoint does not have
    // (set before the keys are put right: never a moment when all is right).
    patch_kcp_spec(
        &sandbox,
        json!({"etcdBackup": {"target": {"s3": {"bucket": "missing"}}}}),
    )
    .await;
    let right = json!({"stringData": {"AWS_SECRET_ACCESS_KEY": s3.secret_access_key()}});
    secrets
        .patch(
            CREDENTIALS,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&right),
        )
        .await
        .unwrap();
    let message = wait_restoring_reason(
        &sandbox,
        REASON_SNAPSHOT_UNUSABLE,
        "spec.etcdBackup.target.s3.bucket",
    )
    .await;
    assert!(message.contains("missing"), "{message}");
    assert!(!message.contains(s3.secret_access_key()), "{message}");
    wait_reconciles(&sandbox, &controller.ctx, 3).await;
    nothing_restored(&sandbox, &before, "bad requests").await;
    let _ = reconcile_infrastructure(&mut sandbox, LIMIT).await.unwrap();
    controller.stop().await;
}
