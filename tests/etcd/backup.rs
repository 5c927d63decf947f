//! The backup engine against real etcd clusters (harness) and a real S3
//! server (moto, from hack/setup.sh): snapshots saved to a directory and to
//! a bucket are verified and restored by etcd's own tools with the data in
//! them; refusals; retention next to k3s's own snapshots; bad input.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use k3s_control_plane::backup::{
    self, BackupError, Retention, S3Config, SnapshotName, SnapshotReason, Target, TargetConfig,
    VerifyError,
};
use k3s_control_plane::etcd::{EtcdError, SaveSnapshotError, snapshot_source};
use k3s_control_plane::harness::EtcdTestCluster;
use k3s_control_plane::harness::etcd::EtcdBinary;
use k3s_control_plane::harness::s3::MotoServer;

const LIMIT: Duration = Duration::from_secs(120);

fn init() {
    k3s_control_plane::install_crypto_provider();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

fn moto(buckets: &[&str]) -> MotoServer {
    MotoServer::start(buckets).unwrap_or_else(|e| panic!("{e}"))
}

fn name_for(reason: SnapshotReason, node: &str, secs: u64) -> SnapshotName {
    SnapshotName::ours(
        reason,
        node,
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs),
    )
    .unwrap()
}

/// The names in the target.
async fn names(target: &Target) -> Vec<String> {
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

/// Every file under `dir`, staging files included.
fn files_under(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let path = entry.path();
        if path.is_dir() {
            found.extend(files_under(&path));
        } else {
            found.push(path.display().to_string());
        }
    }
    found.sort();
    found
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// An etcd started on a data directory restored from `snapshot` with etcd's
/// own tool (etcdutl from 3.5 on, etcdctl before), on plain HTTP loopback.
struct Restored {
    child: Child,
    client: String,
    etcdctl: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Restored {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn restore(snapshot: &Path) -> Restored {
    let binary = EtcdBinary::find().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (client_port, peer_port) = (free_port(), free_port());
    let peer = format!("http://127.0.0.1:{peer_port}");
    let client = format!("http://127.0.0.1:{client_port}");
    let etcdutl = binary.path.with_file_name("etcdutl");
    let mut tool = if binary.version >= (3, 5, 0) && etcdutl.is_file() {
        Command::new(&etcdutl)
    } else {
        let mut c = Command::new(binary.etcdctl());
        c.env("ETCDCTL_API", "3");
        c
    };
    let out = tool
        .args(["snapshot", "restore"])
        .arg(snapshot)
        .arg(format!("--data-dir={}", data.display()))
        .arg("--name=restored")
        .arg(format!("--initial-cluster=restored={peer}"))
        .arg(format!("--initial-advertise-peer-urls={peer}"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "etcd's restore refused the snapshot: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let child = Command::new(&binary.path)
        .arg("--name=restored")
        .arg(format!("--data-dir={}", data.display()))
        .arg(format!("--listen-client-urls={client}"))
        .arg(format!("--advertise-client-urls={client}"))
        .arg(format!("--listen-peer-urls={peer}"))
        .arg(format!("--initial-advertise-peer-urls={peer}"))
        .arg("--listen-metrics-urls=")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Restored {
        child,
        client,
        etcdctl: binary.etcdctl(),
        _dir: dir,
    }
}

impl Restored {
    /// The value of `key`, polling until the restored member serves reads.
    fn get(&self, key: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = Command::new(&self.etcdctl)
                .env("ETCDCTL_API", "3")
                .arg(format!("--endpoints={}", self.client))
                .args(["--command-timeout=2s", "get", "--print-value-only", key])
                .output()
                .unwrap();
            if out.status.success() {
                return String::from_utf8_lossy(&out.stdout).trim().to_string();
            }
            assert!(
                Instant::now() < deadline,
                "restored etcd never answered: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// A non-leader member's index and id.
async fn follower(c: &EtcdTestCluster) -> (usize, u64) {
    let snap = c.connect().snapshot().await.unwrap();
    let chosen = snapshot_source(&snap).expect("a healthy voter");
    assert_ne!(
        Some(chosen.id),
        snap.leader,
        "the default source does not lead"
    );
    (c.index_of(chosen.id).unwrap(), chosen.id)
}

#[tokio::test]
async fn a_snapshot_saved_to_a_directory_is_verified_and_restored_by_etcds_own_tool() {
    init();
    let c = EtcdTestCluster::start(3).await.unwrap();
    c.put(0, "before-backup", b"kept".to_vec()).await.unwrap();
    let etcd = c.connect();
    let snap = etcd.snapshot().await.unwrap();
    let (index, id) = follower(&c).await;
    let node = &c.member(index).node_name;
    let dir = tempfile::tempdir().unwrap();
    let target = Target::open(&TargetConfig::Filesystem {
        path: dir.path().to_path_buf(),
    })
    .unwrap();
    let name = SnapshotName::ours(SnapshotReason::BeforeRemoval, node, SystemTime::now()).unwrap();

    let saved = backup::save(&etcd, &snap, id, &target, &name, LIMIT)
        .await
        .unwrap();

    assert_eq!(saved.name, name.to_string());
    assert!(
        saved
            .name
            .starts_with(&format!("capi-before-removal-{node}-"))
    );
    assert_eq!(saved.member, c.member(index).name);
    assert!(saved.revision > 1, "revision {}", saved.revision);
    let file = dir.path().join(&saved.name);
    assert_eq!(saved.location, format!("file://{}", file.display()));
    assert_eq!(std::fs::metadata(&file).unwrap().len(), saved.size);
    assert_eq!(
        files_under(dir.path()),
        vec![file.display().to_string()],
        "no staging file left"
    );
    let verified = backup::verify_stored(&target, &saved.name).await.unwrap();
    assert_eq!(
        (verified.size, verified.sha256.clone()),
        (saved.size, saved.sha256.clone())
    );

    let restored = restore(&file);
    assert_eq!(restored.get("before-backup"), "kept");
}

#[tokio::test]
async fn a_snapshot_saved_to_s3_lands_at_folder_slash_name_and_restores() {
    init();
    let s3 = moto(&["backups"]);
    let c = EtcdTestCluster::start(3).await.unwrap();
    c.put(1, "in-s3", b"yes".to_vec()).await.unwrap();
    let etcd = c.connect();
    let snap = etcd.snapshot().await.unwrap();
    let (index, id) = follower(&c).await;
    let target = Target::open(&s3.target("backups", "clusters/prod")).unwrap();
    let name = SnapshotName::ours(
        SnapshotReason::Scheduled,
        &c.member(index).node_name,
        SystemTime::now(),
    )
    .unwrap();

    let saved = backup::save(&etcd, &snap, id, &target, &name, LIMIT)
        .await
        .unwrap();

    assert_eq!(saved.location, format!("s3://backups/clusters/prod/{name}"));
    assert_eq!(names(&target).await, vec![name.to_string()]);
    let head = target.head(&saved.name).await.unwrap();
    assert_eq!(head.size, saved.size);
    let verified = backup::verify_stored(&target, &saved.name).await.unwrap();
    assert_eq!(verified.sha256, saved.sha256);

    // Download it as k3s would for --cluster-reset-restore-path, and restore.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(&saved.name);
    let mut out = std::fs::File::create(&file).unwrap();
    let mut bytes = target.read(&saved.name).await.unwrap();
    use futures::StreamExt;
    use std::io::Write;
    while let Some(chunk) = bytes.next().await {
        out.write_all(&chunk.unwrap()).unwrap();
    }
    drop(out);
    let restored = restore(&file);
    assert_eq!(restored.get("in-s3"), "yes");
}

#[tokio::test]
async fn a_snapshot_is_refused_from_a_member_that_is_not_a_healthy_voter() {
    init();
    let c = EtcdTestCluster::builder()
        .members(3)
        .learners(1)
        .start()
        .await
        .unwrap();
    let etcd = c.connect();
    let dir = tempfile::tempdir().unwrap();
    let target = Target::open(&TargetConfig::Filesystem {
        path: dir.path().to_path_buf(),
    })
    .unwrap();

    // A learner.
    let snap = etcd.snapshot().await.unwrap();
    let learner = snap.members.iter().find(|m| m.learner).expect("a learner");
    let name = name_for(SnapshotReason::OnDemand, "learner", 1_700_000_000);
    let err = backup::save(&etcd, &snap, learner.id, &target, &name, LIMIT)
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, BackupError::Etcd(EtcdError::OperationRefused { .. })),
        "{text}"
    );
    assert!(
        text.contains(&learner.name) && text.contains("learner"),
        "{text}"
    );

    // A paused voter (it answers nothing: unhealthy).
    let (index, id) = follower(&c).await;
    c.pause(index).unwrap();
    let snap = etcd.snapshot().await.unwrap();
    let err = backup::save(&etcd, &snap, id, &target, &name, LIMIT)
        .await
        .unwrap_err();
    c.resume(index).unwrap();
    let text = err.to_string();
    assert!(
        text.contains(&c.member(index).name) && text.contains("not healthy"),
        "{text}"
    );
    assert!(files_under(dir.path()).is_empty(), "nothing stored");
}

#[tokio::test]
async fn a_failing_sink_stops_the_stream_and_says_so() {
    init();
    let c = EtcdTestCluster::start(1).await.unwrap();
    let etcd = c.connect();
    let snap = etcd.snapshot().await.unwrap();

    struct Failing(u64);
    impl k3s_control_plane::etcd::SnapshotSink for Failing {
        type Error = String;
        async fn write(&mut self, chunk: &[u8]) -> Result<(), String> {
            self.0 += chunk.len() as u64;
            if self.0 > 4096 {
                Err("disk full".into())
            } else {
                Ok(())
            }
        }
    }
    let id = snap.members[0].id;
    let err = etcd
        .save_snapshot(&snap, id, LIMIT, &mut Failing(0))
        .await
        .unwrap_err();
    assert!(
        matches!(err, SaveSnapshotError::Sink(ref e) if e == "disk full"),
        "{err}"
    );

    // And into memory, whole.
    let mut bytes = Vec::new();
    let streamed = etcd
        .save_snapshot(&snap, id, LIMIT, &mut bytes)
        .await
        .unwrap();
    assert_eq!(streamed.size, bytes.len() as u64);
    assert_eq!(
        bytes.len() % 512,
        32,
        "a database of whole pages and its SHA-256"
    );
}

/// The member is stopped (SIGSTOP) once the upload has begun, so the save
/// runs out of time in the middle of the stream, whatever the machine's speed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_save_that_runs_out_of_time_mid_stream_leaves_nothing_behind() {
    init();
    let s3 = moto(&["backups"]);
    let c = EtcdTestCluster::start(1).await.unwrap();
    for i in 0..16 {
        c.put(0, &format!("big-{i}"), vec![b'x'; 1024 * 1024])
            .await
            .unwrap();
    }
    let etcd = c.connect();
    let snap = etcd.snapshot().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let in_dir = Target::open(&TargetConfig::Filesystem {
        path: dir.path().to_path_buf(),
    })
    .unwrap();
    let in_s3 = Target::open(&s3.target("backups", "etcd")).unwrap();
    let name = name_for(SnapshotReason::Scheduled, "cp-0", 1_700_000_000);
    let uploading = |s3_target: bool| {
        if s3_target {
            !s3.multipart_uploads("backups").unwrap().is_empty()
        } else {
            !files_under(dir.path()).is_empty() // the staging file
        }
    };
    for (target, is_s3) in [(&in_dir, false), (&in_s3, true)] {
        let stop_once_uploading = async {
            let deadline = Instant::now() + Duration::from_secs(20);
            while !uploading(is_s3) {
                assert!(Instant::now() < deadline, "the upload never began");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            c.pause(0).unwrap();
        };
        let (result, ()) = tokio::join!(
            backup::save(
                &etcd,
                &snap,
                snap.members[0].id,
                target,
                &name,
                Duration::from_secs(4)
            ),
            stop_once_uploading
        );
        c.resume(0).unwrap();
        // Timed out in the stream, or before it if the member stopped while
        // it was being reached: either way after the upload began.
        let err = result.unwrap_err();
        assert!(
            matches!(
                err,
                BackupError::Etcd(EtcdError::Timeout { .. } | EtcdError::Unreachable { .. })
                    | BackupError::TimedOut { .. }
            ),
            "{}: {err}",
            target.describe()
        );
        assert!(names(target).await.is_empty(), "{}", target.describe());
    }
    assert!(
        files_under(dir.path()).is_empty(),
        "left behind: {:?}",
        files_under(dir.path())
    );
    assert_eq!(
        s3.multipart_uploads("backups").unwrap(),
        Vec::<String>::new(),
        "the multipart upload was aborted"
    );
}

#[tokio::test]
async fn retention_prunes_only_ours_beyond_the_count_and_keeps_k3ss_own() {
    init();
    let s3 = moto(&["backups"]);
    let target = Target::open(&s3.target("backups", "etcd")).unwrap();
    let ours: Vec<String> = (0..4)
        .map(|i| name_for(SnapshotReason::Scheduled, "cp-0", 1_700_000_000 + i * 3600).to_string())
        .collect();
    let k3s = "etcd-snapshot-cp-0-1600000000".to_string();
    for name in ours.iter().chain([&k3s]) {
        let mut upload = target.put(name).await.unwrap();
        upload.write(b"not a real snapshot").await.unwrap();
        upload.finish().await.unwrap();
    }
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + 10 * 3600);
    let pruned = backup::prune(
        &target,
        &Retention {
            count: Some(2),
            max_age: None,
        },
        now,
    )
    .await
    .unwrap();

    let deleted: Vec<&str> = pruned.deleted.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(deleted, vec![ours[0].as_str(), ours[1].as_str()]);
    assert_eq!(pruned.kept, 2);
    let mut expected = vec![k3s.clone(), ours[2].clone(), ours[3].clone()];
    expected.sort();
    assert_eq!(names(&target).await, expected);

    // By age, the newest of ours stays however old.
    let pruned = backup::prune(
        &target,
        &Retention {
            count: None,
            max_age: Some(Duration::from_secs(60)),
        },
        now,
    )
    .await
    .unwrap();
    assert_eq!(pruned.deleted.len(), 1);
    let mut expected = vec![k3s, ours[3].clone()];
    expected.sort();
    assert_eq!(names(&target).await, expected);
}

#[tokio::test]
async fn a_missing_bucket_and_refused_credentials_name_their_field_and_no_secret() {
    init();
    let s3 = moto(&["backups"]);

    let wrong_bucket = Target::open(&s3.target("no-such-bucket", "")).unwrap();
    let err = wrong_bucket.check().await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "spec.etcdBackup.target.s3.bucket: bucket \"no-such-bucket\" does not exist at endpoint {}",
            s3.url()
        )
    );

    let TargetConfig::S3(good) = s3.target("backups", "") else {
        unreachable!()
    };
    let wrong_secret = S3Config {
        secret_access_key: "wrong-secret-value".into(),
        ..good.clone()
    };
    let unknown_key = S3Config {
        access_key_id: "AKIAUNKNOWNKEY000000".into(),
        ..good.clone()
    };
    for config in [wrong_secret, unknown_key] {
        let target = Target::open(&TargetConfig::S3(config.clone())).unwrap();
        let err = target.check().await.unwrap_err();
        let text = err.to_string();
        eprintln!("refused credentials: {text}");
        assert!(matches!(err, BackupError::Credentials { .. }), "{text}");
        assert!(
            text.starts_with("spec.etcdBackup.target.s3.credentialsSecret"),
            "{text}"
        );
        for secret in [
            &config.secret_access_key,
            &good.secret_access_key,
            &config.access_key_id,
        ] {
            assert!(!text.contains(secret.as_str()), "{text} shows a credential");
        }
    }

    let unreachable = S3Config {
        endpoint: format!("127.0.0.1:{}", free_port()),
        ..good
    };
    let err = Target::open(&TargetConfig::S3(unreachable))
        .unwrap()
        .check()
        .await
        .unwrap_err();
    eprintln!("unreachable: {err}");
    assert!(
        err.to_string()
            .starts_with("spec.etcdBackup.target.s3.endpoint: the endpoint"),
        "{err}"
    );
}

#[tokio::test]
async fn a_corrupt_or_truncated_stored_snapshot_is_named_and_refused() {
    init();
    let c = EtcdTestCluster::start(1).await.unwrap();
    c.put(0, "k", b"v".to_vec()).await.unwrap();
    let etcd = c.connect();
    let snap = etcd.snapshot().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let target = Target::open(&TargetConfig::Filesystem {
        path: dir.path().to_path_buf(),
    })
    .unwrap();
    let name = name_for(SnapshotReason::OnDemand, "cp-0", 1_700_000_000);
    let saved = backup::save(&etcd, &snap, snap.members[0].id, &target, &name, LIMIT)
        .await
        .unwrap();
    let good = std::fs::read(dir.path().join(&saved.name)).unwrap();

    let mut flipped = good.clone();
    flipped[good.len() / 2] ^= 0x40;
    std::fs::write(dir.path().join("flipped"), &flipped).unwrap();
    let err = backup::verify_stored(&target, "flipped").await.unwrap_err();
    assert!(
        matches!(
            err,
            BackupError::Invalid {
                source: VerifyError::ChecksumMismatch { .. },
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().starts_with(&format!(
            "file://{}/flipped: checksum mismatch",
            dir.path().display()
        )),
        "{err}"
    );

    std::fs::write(dir.path().join("truncated"), &good[..good.len() - 1000]).unwrap();
    let err = backup::verify_stored(&target, "truncated")
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            BackupError::Invalid {
                source: VerifyError::Truncated { .. },
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("/truncated: truncated"), "{err}");

    let err = backup::verify_stored(&target, "absent").await.unwrap_err();
    assert!(matches!(err, BackupError::NotFound { .. }), "{err}");

    // The same name twice is refused, and the first stays as it was.
    let err = backup::save(&etcd, &snap, snap.members[0].id, &target, &name, LIMIT)
        .await
        .unwrap_err();
    assert!(matches!(err, BackupError::AlreadyExists { .. }), "{err}");
    assert_eq!(std::fs::read(dir.path().join(&saved.name)).unwrap(), good);
}

const BIN: &str = env!("CARGO_BIN_EXE_k3s-control-plane");

/// `k3s-control-plane etcd <args>` with the cluster's TLS files.
async fn cli(c: &EtcdTestCluster, env: &[(&str, &str)], args: &[&str]) -> std::process::Output {
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.arg("etcd")
        .args(args)
        .arg(format!("--endpoints={}", c.endpoints().join(",")))
        .arg(format!("--cacert={}", c.ca_cert_path().display()))
        .arg(format!("--cert={}", c.client_cert_path().display()))
        .arg(format!("--key={}", c.client_key_path().display()))
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env_remove("AWS_SESSION_TOKEN");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().await.unwrap()
}

fn text(out: &std::process::Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test]
async fn the_cli_saves_lists_verifies_and_prunes_through_the_same_engine() {
    init();
    let s3 = moto(&["backups"]);
    let c = EtcdTestCluster::start(3).await.unwrap();
    let endpoint = s3.endpoint();
    let target = [
        "--s3-endpoint",
        endpoint.as_str(),
        "--s3-bucket",
        "backups",
        "--s3-folder",
        "cli",
        "--s3-insecure",
    ];
    let creds = [
        ("AWS_ACCESS_KEY_ID", s3.access_key_id()),
        ("AWS_SECRET_ACCESS_KEY", s3.secret_access_key()),
    ];
    // Two saves a second apart (names are per second), the second keeping one.
    let mut saved = Vec::new();
    for retention in [None, Some("1")] {
        let mut args = vec!["snapshot", "save", "--output", "json"];
        args.extend(target);
        if let Some(n) = retention {
            args.extend(["--retention", n]);
        }
        let before = SystemTime::now();
        let out = cli(&c, &creds, &args).await;
        assert!(out.status.success(), "{}", text(&out));
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let name = json["saved"]["name"].as_str().unwrap().to_string();
        assert!(name.starts_with("capi-on-demand-cp-"), "{name}");
        saved.push((name, json["pruned"].clone()));
        // The next name must be another second's.
        let next = before + Duration::from_secs(1);
        while SystemTime::now() < next {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert_eq!(
        saved[1].1,
        serde_json::json!([saved[0].0]),
        "the older one pruned"
    );

    let mut args = vec!["snapshot", "list", "--output", "json"];
    args.extend(target);
    let out = cli(&c, &creds, &args).await;
    assert!(out.status.success(), "{}", text(&out));
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed[0]["name"], saved[1].0.as_str());
    assert_eq!(listed[0]["reason"], "on-demand");

    let mut args = vec!["snapshot", "verify", saved[1].0.as_str()];
    args.extend(target);
    let out = cli(&c, &creds, &args).await;
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("sha256"),
        "{}",
        text(&out)
    );

    // No credentials: refused before etcd or the bucket is reached, naming
    // the variable.
    let mut args = vec!["snapshot", "list"];
    args.extend(target);
    let out = cli(&c, &[], &args).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "error: AWS_ACCESS_KEY_ID: is empty"
    );

    // A paused member named as the source: refused, exit 2, nothing stored.
    let dir = tempfile::tempdir().unwrap();
    let dir_arg = dir.path().display().to_string();
    let (index, _) = follower(&c).await;
    c.pause(index).unwrap();
    let out = cli(
        &c,
        &[],
        &[
            "snapshot",
            "save",
            "--dir",
            &dir_arg,
            "--member",
            &c.member(index).name,
        ],
    )
    .await;
    c.resume(index).unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not healthy"),
        "{}",
        text(&out)
    );
    assert!(files_under(dir.path()).is_empty());
}

#[tokio::test]
async fn an_https_endpoint_is_trusted_only_through_the_given_ca() {
    init();
    let ca = k3s_control_plane::harness::TestCa::new("s3-ca");
    let s3 = MotoServer::start_tls(&["backups"], &ca).unwrap_or_else(|e| panic!("{e}"));
    let config = s3.target("backups", "tls");
    let TargetConfig::S3(with_ca) = &config else {
        unreachable!()
    };
    assert!(!with_ca.insecure);

    let target = Target::open(&config).unwrap();
    target.check().await.unwrap();
    let mut upload = target.put("capi-scheduled-cp-0-1").await.unwrap();
    upload.write(b"bytes over verified TLS").await.unwrap();
    upload.finish().await.unwrap();
    assert_eq!(
        names(&target).await,
        vec!["capi-scheduled-cp-0-1".to_string()]
    );

    let without_ca = S3Config {
        endpoint_ca_pem: None,
        ..with_ca.clone()
    };
    let err = Target::open(&TargetConfig::S3(without_ca))
        .unwrap()
        .check()
        .await
        .unwrap_err();
    eprintln!("untrusted: {err}");
    assert!(matches!(err, BackupError::Tls { .. }), "{err}");
    assert!(
        err.to_string()
            .starts_with("spec.etcdBackup.target.s3.endpointCASecret:"),
        "{err}"
    );

    let other_ca = S3Config {
        endpoint_ca_pem: Some(
            k3s_control_plane::harness::TestCa::new("other")
                .pair
                .cert_pem,
        ),
        ..with_ca.clone()
    };
    let err = Target::open(&TargetConfig::S3(other_ca))
        .unwrap()
        .check()
        .await
        .unwrap_err();
    assert!(matches!(err, BackupError::Tls { .. }), "{err}");
}

/// The controller runs these in spawned tasks: they must be `Send`
/// (compiled, never run).
#[allow(dead_code)]
fn the_engine_futures_are_send(
    etcd: &k3s_control_plane::etcd::EtcdCluster,
    snap: &k3s_control_plane::etcd::MembershipSnapshot,
    target: &Target,
    name: &SnapshotName,
) {
    fn send<T: Send>(_: T) {}
    send(backup::save(etcd, snap, 1, target, name, LIMIT));
    send(backup::prune(
        target,
        &Retention::default(),
        SystemTime::now(),
    ));
    send(backup::verify_stored(target, "x"));
    send(target.check());
    send(target.list());
}
