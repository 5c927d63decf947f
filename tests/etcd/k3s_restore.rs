//! The simulated k3s restoring an etcd snapshot (docs/k3s.md "Snapshot
//! restore"), on real etcd: snapshots are taken with the real `etcdctl
//! snapshot save`, restored with etcd's own tool, and every assertion reads
//! what the real members answer.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Secret};
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

use k3s_control_plane::api::names::K3S_ETCD_NODE_NAME_ANNOTATION;
use k3s_control_plane::api::{KThreesConfig, Machine};
use k3s_control_plane::harness::infra_sim;
use k3s_control_plane::harness::restore::{
    self, RESTORE_S3_ENV_PATH, RestoreAction, S3Settings, SERVER_TO_CLUSTER_INIT,
};
use k3s_control_plane::harness::sandbox::{KCP, NAMESPACE, Sandbox, management_server};

const LIMIT: Duration = Duration::from_secs(180);

/// `etcdctl snapshot save` against member `index`: the real tool, not ours.
fn save_snapshot(sandbox: &Sandbox, index: usize, to: &Path) {
    let out = sandbox
        .etcd
        .etcdctl(&sandbox.etcd.member(index).client_url())
        .unwrap()
        .arg("snapshot")
        .arg("save")
        .arg(to)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "etcdctl snapshot save: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A KThreesConfig named `name` with these commands, for the Machine of the
/// same name.
async fn create_config(sandbox: &Sandbox, name: &str, pre: &[&str], post: &[String]) {
    let config: KThreesConfig = serde_json::from_value(json!({
        "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2", "kind": "KThreesConfig",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"preK3sCommands": pre, "postK3sCommands": post},
    }))
    .unwrap();
    Api::<KThreesConfig>::namespaced(sandbox.client(), NAMESPACE)
        .create(&PostParams::default(), &config)
        .await
        .unwrap();
}

/// A control-plane Machine `name` (its KThreesConfig is `name`), not booted.
async fn add_machine(sandbox: &Sandbox, name: &str) {
    let kcp = sandbox.kcp_api().get(KCP).await.unwrap();
    sandbox.add_machine(&kcp, name, None).await.unwrap();
}

/// The contract's file restore commands.
fn file_restore(snapshot: &Path) -> Vec<String> {
    vec![
        "systemctl stop k3s".into(),
        format!(
            "k3s server --cluster-reset --cluster-reset-restore-path={}",
            snapshot.display()
        ),
        "systemctl start k3s".into(),
    ]
}

fn is_k3s_member_name(name: &str, node: &str) -> bool {
    name.strip_prefix(&format!("{node}-"))
        .is_some_and(|suffix| {
            suffix.len() == 8
                && suffix
                    .chars()
                    .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
        })
}

fn etcd_old_dirs(dir: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("etcd-old-"))
        })
        .collect();
    dirs.sort();
    dirs
}

/// The steps without their details, for order assertions.
fn kinds(actions: &[RestoreAction]) -> Vec<&'static str> {
    actions
        .iter()
        .map(|a| match a {
            RestoreAction::ConfigRendered { server: Some(_) } => "config-join",
            RestoreAction::ConfigRendered { server: None } => "config-init",
            RestoreAction::ServerReplacedByClusterInit => "server->cluster-init",
            RestoreAction::FirstStart { .. } => "first-start",
            RestoreAction::FirstStartJoins { .. } => "first-start-joins",
            RestoreAction::Stopped => "stop",
            RestoreAction::SnapshotFetched { .. } => "fetch",
            RestoreAction::DataMovedAside { .. } => "move-aside",
            RestoreAction::SnapshotRestored { .. } => "restore",
            RestoreAction::ResetRun { .. } => "reset-run",
            RestoreAction::Refused { .. } => "refused",
            RestoreAction::RestoreFailed { .. } => "failed",
            RestoreAction::Started { .. } => "start",
            RestoreAction::NotRun { .. } => "not-run",
            RestoreAction::NodeRegistered { .. } => "node",
        })
        .collect()
}

/// Quorum lost (two of three members down), a new Machine restores the
/// snapshot: a one-member cluster with the snapshot's keys (and not what
/// was written after it), under a new member name, with a new cluster id;
/// two more Machines join it as learners and are promoted: three healthy
/// voters with the keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_that_lost_quorum_is_rebuilt_from_a_snapshot_and_grows_back() {
    let mut sandbox = Sandbox::start(3).await.unwrap();
    for i in 0..20 {
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
    let old_names = sandbox.etcd.member_names();
    let old_cluster_id = sandbox.etcd.own_member_list(0).await.unwrap().cluster_id;
    let dir = tempfile::tempdir().unwrap();
    let snapshot = dir.path().join("snapshot.db");
    save_snapshot(&sandbox, 0, &snapshot);
    sandbox
        .etcd
        .put(0, "/registry/test/after-snapshot", b"x".to_vec())
        .await
        .unwrap();

    sandbox.etcd.stop(1).await.unwrap();
    sandbox.etcd.stop(2).await.unwrap();
    let without_quorum = sandbox.etcd.get(0, "/registry/test/key-0").await;
    assert!(
        without_quorum.is_err(),
        "a linearizable read needs quorum: {without_quorum:?}"
    );

    // The sandbox's control plane is initialized, so the bootstrap
    // provider renders a join configuration: the pre command makes the
    // install start a first server (docs/k3s.md SR9).
    create_config(
        &sandbox,
        "restore-0",
        &[SERVER_TO_CLUSTER_INIT],
        &file_restore(&snapshot),
    )
    .await;
    add_machine(&sandbox, "restore-0").await;
    let restored = infra_sim::provision(&mut sandbox, "restore-0", LIMIT)
        .await
        .unwrap();

    let record = sandbox.restores.last().unwrap().clone();
    assert_eq!(record.outcome, Ok(restored.member.clone()));
    assert_eq!(
        kinds(&record.actions),
        vec![
            "config-join",
            "server->cluster-init",
            "first-start",
            "stop",
            "fetch",
            "move-aside",
            "restore",
            "reset-run",
            "start",
            "node",
        ]
    );
    let first_name = record
        .actions
        .iter()
        .find_map(|a| match a {
            RestoreAction::FirstStart { member } => Some(member.clone()),
            _ => None,
        })
        .unwrap();
    // etcd's restore wrote the snapshot under the first start's name; the
    // reset run gave the member a new one.
    assert!(
        record.actions.contains(&RestoreAction::SnapshotRestored {
            tool: if k3s_control_plane::harness::etcd::EtcdBinary::find()
                .unwrap()
                .version
                >= (3, 5, 0)
            {
                "etcdutl".into()
            } else {
                "etcdctl".into()
            },
            member: first_name.clone(),
        })
    );

    let index = record.member_index.unwrap();
    let own = sandbox.etcd.own_member_list(index).await.unwrap();
    assert_eq!(own.members.len(), 1, "{own:?}");
    assert_eq!(own.members[0].name, restored.member);
    assert!(
        is_k3s_member_name(&restored.member, &restored.node),
        "{}",
        restored.member
    );
    assert_ne!(restored.member, first_name);
    assert!(!old_names.contains(&restored.member));
    assert_ne!(own.cluster_id, old_cluster_id);
    for i in 0..20 {
        let got = sandbox
            .etcd
            .get(index, &format!("/registry/test/key-{i}"))
            .await
            .unwrap();
        assert_eq!(got, Some(format!("value-{i}").into_bytes()), "key-{i}");
    }
    assert_eq!(
        sandbox
            .etcd
            .get(index, "/registry/test/after-snapshot")
            .await
            .unwrap(),
        None
    );
    // k3s's traces on the node: the first start's data moved aside, the
    // reset flag gone after the normal start.
    let member_dir = sandbox.etcd.member_dir(index).to_path_buf();
    assert_eq!(etcd_old_dirs(&member_dir).len(), 1);
    assert!(!member_dir.join("reset-flag").exists());

    // The Node carries the new member name; the Machine has its nodeRef.
    let node: Node = Api::all(sandbox.workload.client())
        .get(&restored.node)
        .await
        .unwrap();
    assert_eq!(
        node.metadata.annotations.unwrap()[K3S_ETCD_NODE_NAME_ANNOTATION],
        restored.member
    );
    let machine: Machine = sandbox.machines_api().get("restore-0").await.unwrap();
    assert_eq!(machine.node_name(), Some(restored.node.as_str()));

    // Two more servers join the restored cluster the normal way.
    for name in ["join-1", "join-2"] {
        add_machine(&sandbox, name).await;
        let joined = infra_sim::provision(&mut sandbox, name, LIMIT)
            .await
            .unwrap();
        assert!(joined.promote_attempts >= 1, "{joined:?}");
    }
    let own = sandbox.etcd.own_member_list(index).await.unwrap();
    assert_eq!(own.members.len(), 3, "{own:?}");
    assert!(own.members.iter().all(|m| !m.learner), "{own:?}");
    assert!(own.members.iter().all(|m| !old_names.contains(&m.name)));
    let snap = sandbox.etcd.connect().snapshot().await.unwrap();
    assert_eq!(snap.members.len(), 3);
    for m in &snap.members {
        assert!(m.is_healthy(), "{}: {:?}", m.name, m.unhealthy_reason());
    }
    for i in [4, 5] {
        assert_eq!(
            sandbox.etcd.get(i, "/registry/test/key-7").await.unwrap(),
            Some(b"value-7".to_vec())
        );
    }
}

/// A flipped byte in the snapshot: etcd's tool refuses it on its hash, the
/// error says so, and nothing is started. Before that, without the pre
/// command, the join configuration makes k3s refuse the reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_snapshot_or_a_join_configuration_starts_nothing() {
    let mut sandbox = Sandbox::start(1).await.unwrap();
    sandbox.etcd.put(0, "/k", b"v".to_vec()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let snapshot = dir.path().join("snapshot.db");
    save_snapshot(&sandbox, 0, &snapshot);
    let old_endpoints = sandbox.etcd.endpoints();

    // Join configuration left as rendered: the install's k3s joins, the
    // reset is refused, no etcd of its own ever ran.
    create_config(&sandbox, "restore-join", &[], &file_restore(&snapshot)).await;
    add_machine(&sandbox, "restore-join").await;
    let err = infra_sim::provision(&mut sandbox, "restore-join", LIMIT)
        .await
        .unwrap_err();
    assert!(
        err.0.contains("the node never ran etcd of its own"),
        "{}",
        err.0
    );
    let record = sandbox.restores.last().unwrap();
    assert_eq!(
        kinds(&record.actions),
        vec![
            "config-join",
            "first-start-joins",
            "stop",
            "refused",
            "first-start-joins"
        ]
    );
    assert!(record.actions.iter().any(|a| matches!(a,
        RestoreAction::Refused { message, .. }
            if message == "cannot perform cluster-reset while server URL is set - remove server from configuration before resetting")));
    assert!(err.0.contains("KThreesConfig restore-join"), "{}", err.0);

    let mut bytes = std::fs::read(&snapshot).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    let corrupt = dir.path().join("corrupt.db");
    std::fs::write(&corrupt, &bytes).unwrap();
    create_config(
        &sandbox,
        "restore-corrupt",
        &[SERVER_TO_CLUSTER_INIT],
        &file_restore(&corrupt),
    )
    .await;
    add_machine(&sandbox, "restore-corrupt").await;
    let err = infra_sim::provision(&mut sandbox, "restore-corrupt", LIMIT)
        .await
        .unwrap_err();
    assert!(err.0.contains("expected sha256"), "{}", err.0);
    assert!(err.0.contains("KThreesConfig restore-corrupt"), "{}", err.0);
    let record = sandbox.restores.last().unwrap().clone();
    assert_eq!(
        kinds(&record.actions),
        vec![
            "config-join",
            "server->cluster-init",
            "first-start",
            "stop",
            "fetch",
            "move-aside",
            "failed",
            "not-run",
        ]
    );
    // Nothing started: the node's etcd is down, the sandbox's cluster is
    // the one it was, no Node and no nodeRef.
    let index = record.member_index.unwrap();
    assert_eq!(sandbox.etcd.member(index).pid(), None);
    assert!(sandbox.etcd.members().iter().all(|m| !m.retired));
    assert_eq!(sandbox.etcd.endpoints()[0], old_endpoints[0]);
    assert!(!sandbox.machines.contains(&"restore-corrupt".to_string()));
    let nodes: Api<Node> = Api::all(sandbox.workload.client());
    let node = &sandbox.etcd.member(index).node_name;
    assert!(nodes.get_opt(node).await.unwrap().is_none());
    let machine: Machine = sandbox.machines_api().get("restore-corrupt").await.unwrap();
    assert_eq!(machine.node_name(), None);
    assert_eq!(
        sandbox.etcd.get(0, "/k").await.unwrap(),
        Some(b"v".to_vec())
    );
}

/// The reset flag (docs/k3s.md SR5): after a restore's reset run, a start
/// that still carries `--cluster-reset` is refused with k3s's message while
/// the flag exists; one with a restore path restores again (k3s does not
/// look at the flag then), under yet another name; the normal start then
/// clears the flag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reset_flag_refuses_a_second_plain_reset_but_not_a_second_restore() {
    let mut sandbox = Sandbox::start(1).await.unwrap();
    sandbox.etcd.put(0, "/k", b"v".to_vec()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let snapshot = dir.path().join("snapshot.db");
    save_snapshot(&sandbox, 0, &snapshot);
    sandbox.etcd.stop(0).await.unwrap();

    let restore = format!(
        "k3s server --cluster-reset --cluster-reset-restore-path={}",
        snapshot.display()
    );
    let post = vec![
        "systemctl stop k3s".to_string(),
        restore.clone(),
        "k3s server --cluster-reset".into(),
        restore,
        "systemctl start k3s".into(),
    ];
    create_config(&sandbox, "restore-twice", &[SERVER_TO_CLUSTER_INIT], &post).await;
    add_machine(&sandbox, "restore-twice").await;
    let restored = infra_sim::provision(&mut sandbox, "restore-twice", LIMIT)
        .await
        .unwrap();
    let record = sandbox.restores.last().unwrap().clone();
    assert_eq!(
        kinds(&record.actions),
        vec![
            "config-join",
            "server->cluster-init",
            "first-start",
            "stop",
            "fetch",
            "move-aside",
            "restore",
            "reset-run",
            "refused",
            "fetch",
            "move-aside",
            "restore",
            "reset-run",
            "start",
            "node",
        ]
    );
    let index = record.member_index.unwrap();
    let flag = sandbox.etcd.member_dir(index).join("reset-flag");
    let refusal = record
        .actions
        .iter()
        .find_map(|a| match a {
            RestoreAction::Refused { message, .. } => Some(message.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        refusal,
        format!(
            "Managed etcd cluster membership was previously reset, please remove the cluster-reset flag and start k3s normally. If you need to perform another cluster reset, you must first manually delete the file at {}",
            flag.display()
        )
    );
    let names: Vec<String> = record
        .actions
        .iter()
        .filter_map(|a| match a {
            RestoreAction::ResetRun { member } => Some(member.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(names.len(), 2);
    assert_ne!(names[0], names[1]);
    assert_eq!(names[1], restored.member);
    // The second restore wrote the snapshot under the first reset's name.
    let restored_under: Vec<&str> = record
        .actions
        .iter()
        .filter_map(|a| match a {
            RestoreAction::SnapshotRestored { member, .. } => Some(member.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(restored_under.len(), 2);
    assert_eq!(restored_under[1], names[0]);
    assert_eq!(etcd_old_dirs(sandbox.etcd.member_dir(index)).len(), 2);
    assert!(!flag.exists());
    let own = sandbox.etcd.own_member_list(index).await.unwrap();
    assert_eq!(own.members.len(), 1);
    assert_eq!(own.members[0].name, restored.member);
    assert_eq!(
        sandbox.etcd.get(index, "/k").await.unwrap(),
        Some(b"v".to_vec())
    );
}

/// S3 restores are read from the KThreesConfig as the bootstrap provider
/// writes its files: the keys come from the Secret behind
/// `/etc/rancher/k3s/restore-s3.env`, the object from `<folder>/<name>`.
/// (The download itself needs an S3 server: the integrator's test.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_s3_restore_is_read_with_its_keys_from_the_secret() {
    let server = management_server().await.unwrap();
    let client = server.client();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "restore-keys", "namespace": NAMESPACE},
        "stringData": {"env": "AWS_ACCESS_KEY_ID=AKIDEXAMPLE\nAWS_SECRET_ACCESS_KEY=\"wJalr/K7MDENG\"\n"},
    }))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), NAMESPACE)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let command = "set -a; . /etc/rancher/k3s/restore-s3.env; set +a; k3s server --cluster-reset \
        --cluster-reset-restore-path=etcd-snapshot-cp-0-1733500000 --etcd-s3 \
        --etcd-s3-endpoint=127.0.0.1:9000 --etcd-s3-bucket=backups --etcd-s3-folder=demo/etcd \
        --etcd-s3-insecure";
    let config: KThreesConfig = serde_json::from_value(json!({
        "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2", "kind": "KThreesConfig",
        "metadata": {"name": "restore-s3", "namespace": NAMESPACE},
        "spec": {
            "files": [{"path": RESTORE_S3_ENV_PATH, "permissions": "0600",
                       "contentFrom": {"secret": {"name": "restore-keys", "key": "env"}}}],
            "postK3sCommands": ["systemctl stop k3s", command, "systemctl start k3s"],
        },
    }))
    .unwrap();
    Api::<KThreesConfig>::namespaced(client.clone(), NAMESPACE)
        .create(&PostParams::default(), &config)
        .await
        .unwrap();
    let files = restore::resolve_files(&client, &config).await.unwrap();
    let plan = restore::parse_restore("restore-s3", &config.spec, &files)
        .unwrap()
        .unwrap();
    let s3 = plan.request.s3.clone().unwrap();
    assert_eq!(
        s3,
        S3Settings {
            endpoint: "127.0.0.1:9000".into(),
            bucket: "backups".into(),
            folder: "demo/etcd".into(),
            region: "us-east-1".into(),
            insecure: true,
            skip_ssl_verify: false,
            endpoint_ca_pem: None,
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: "wJalr/K7MDENG".into(),
        }
    );
    assert_eq!(
        s3.object_key(&plan.request.restore_path),
        "demo/etcd/etcd-snapshot-cp-0-1733500000"
    );
    assert_eq!(s3.endpoint_url(), "http://127.0.0.1:9000");

    // A key the Secret lacks is named as the bootstrap provider names it.
    let mut missing = config.clone();
    missing.spec.files[0]
        .content_from
        .as_mut()
        .unwrap()
        .secret
        .key = "nope".into();
    let err = restore::resolve_files(&client, &missing).await.unwrap_err();
    assert!(
        err.0.contains(
            "spec.files[0].contentFrom.secret: secret references non-existent secret key: \"nope\""
        ),
        "{}",
        err.0
    );
}

/// The parser, table-tested: no etcd, no API server.
mod parsing {
    use k3s_control_plane::api::bootstrap::KThreesConfigSpec;
    use k3s_control_plane::harness::restore::*;

    fn spec(pre: &[&str], post: &[&str]) -> KThreesConfigSpec {
        KThreesConfigSpec {
            pre_k3s_commands: pre.iter().map(|s| s.to_string()).collect(),
            post_k3s_commands: post.iter().map(|s| s.to_string()).collect(),
            ..KThreesConfigSpec::default()
        }
    }

    fn env_file(content: &str) -> NodeFile {
        NodeFile {
            path: RESTORE_S3_ENV_PATH.into(),
            permissions: "0600".into(),
            content: content.into(),
        }
    }

    fn ca_file() -> NodeFile {
        NodeFile {
            path: RESTORE_S3_CA_PATH.into(),
            permissions: String::new(),
            content: "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n".into(),
        }
    }

    const KEYS: &str = "AWS_ACCESS_KEY_ID=AKID\nAWS_SECRET_ACCESS_KEY='se cret'\n";

    fn s3(endpoint: &str, bucket: &str, folder: &str) -> S3Settings {
        S3Settings {
            endpoint: endpoint.into(),
            bucket: bucket.into(),
            folder: folder.into(),
            region: "us-east-1".into(),
            insecure: false,
            skip_ssl_verify: false,
            endpoint_ca_pem: None,
            access_key_id: "AKID".into(),
            secret_access_key: "se cret".into(),
        }
    }

    /// The contract's commands, and variations k3s's CLI reads the same
    /// way or refuses; each case: commands, files, what comes out.
    #[test]
    fn restore_commands_table() {
        type Want = Result<Option<RestoreRequest>, &'static str>;
        let file = |p: &str| RestoreRequest {
            restore_path: p.into(),
            s3: None,
        };
        let with_s3 = |name: &str, s: S3Settings| RestoreRequest {
            restore_path: name.into(),
            s3: Some(s),
        };
        let s3_prefix =
            "set -a; . /etc/rancher/k3s/restore-s3.env; set +a; k3s server --cluster-reset";
        let cases: Vec<(&str, Vec<String>, Vec<NodeFile>, Want)> = vec![
            (
                "file restore, --flag=value",
                vec!["systemctl stop k3s".into(), "k3s server --cluster-reset --cluster-reset-restore-path=/var/backups/snap.db".into(), "systemctl start k3s".into()],
                vec![],
                Ok(Some(file("/var/backups/snap.db"))),
            ),
            (
                "file restore, --flag value and a single dash",
                vec!["k3s server -cluster-reset --cluster-reset-restore-path /var/backups/snap.db".into()],
                vec![],
                Ok(Some(file("/var/backups/snap.db"))),
            ),
            (
                "bool flag written =true, path quoted",
                vec!["k3s server --cluster-reset=true --cluster-reset-restore-path='/var/b ackups/snap.db'".into()],
                vec![],
                Ok(Some(file("/var/b ackups/snap.db"))),
            ),
            (
                "K3S_CLUSTER_RESET exported stands for --cluster-reset",
                vec!["export K3S_CLUSTER_RESET=true; k3s server --cluster-reset-restore-path=/s.db".into()],
                vec![],
                Ok(Some(file("/s.db"))),
            ),
            (
                "a pipe elsewhere is left alone",
                vec!["echo ok | tee /tmp/x".into(), "k3s server --cluster-reset --cluster-reset-restore-path=/s.db".into()],
                vec![],
                Ok(Some(file("/s.db"))),
            ),
            (
                "no reset at all: an ordinary join",
                vec!["echo hello".into()],
                vec![],
                Ok(None),
            ),
            (
                "restore path without --cluster-reset",
                vec!["k3s server --cluster-reset-restore-path=/s.db".into()],
                vec![],
                Err("invalid flag use; --cluster-reset required with --cluster-reset-restore-path"),
            ),
            (
                "--cluster-reset=false is no reset",
                vec!["k3s server --cluster-reset=false --cluster-reset-restore-path=/s.db".into()],
                vec![],
                Err("invalid flag use; --cluster-reset required with --cluster-reset-restore-path"),
            ),
            (
                "a bool flag does not take the next word",
                vec!["k3s server --cluster-reset false --cluster-reset-restore-path=/s.db".into()],
                vec![],
                Err("this command does not take any arguments"),
            ),
            (
                "a bad bool value",
                vec!["k3s server --cluster-reset=yes --cluster-reset-restore-path=/s.db".into()],
                vec![],
                Err("invalid boolean value \"yes\" for -cluster-reset: parse error"),
            ),
            (
                "an undefined flag",
                vec!["k3s server --cluster-reset --cluster-restore-path=/s.db".into()],
                vec![],
                Err("flag provided but not defined: -cluster-restore-path"),
            ),
            (
                "a value flag at the end",
                vec!["k3s server --cluster-reset --cluster-reset-restore-path".into()],
                vec![],
                Err("flag needs an argument: -cluster-reset-restore-path"),
            ),
            (
                "a reset that restores nothing",
                vec!["k3s server --cluster-reset".into()],
                vec![],
                Err("without --cluster-reset-restore-path"),
            ),
            (
                "S3 as the contract writes it, keys from the sourced env file",
                vec![format!("{s3_prefix} --cluster-reset-restore-path=snap-1 --etcd-s3 --etcd-s3-endpoint=minio.example:9000 --etcd-s3-bucket=backups --etcd-s3-folder=prod/etcd")],
                vec![env_file(KEYS)],
                Ok(Some(with_s3("snap-1", s3("minio.example:9000", "backups", "prod/etcd")))),
            ),
            (
                "S3 with region, insecure and the CA file",
                vec![format!("{s3_prefix} --cluster-reset-restore-path snap-1 --etcd-s3 --etcd-s3-endpoint 10.0.0.5:9000 --etcd-s3-bucket backups --etcd-s3-region eu-west-1 --etcd-s3-insecure --etcd-s3-endpoint-ca=/etc/rancher/k3s/restore-s3-ca.crt")],
                vec![env_file(KEYS), ca_file()],
                Ok(Some(with_s3("snap-1", S3Settings {
                    region: "eu-west-1".into(),
                    insecure: true,
                    endpoint_ca_pem: Some(ca_file().content),
                    ..s3("10.0.0.5:9000", "backups", "")
                }))),
            ),
            (
                "keys sourced without `set -a` are not exported: k3s sees none",
                vec![". /etc/rancher/k3s/restore-s3.env; k3s server --cluster-reset --cluster-reset-restore-path=snap-1 --etcd-s3 --etcd-s3-bucket=backups".into()],
                vec![env_file(KEYS)],
                Ok(Some(with_s3("snap-1", S3Settings {
                    access_key_id: String::new(),
                    secret_access_key: String::new(),
                    ..s3("s3.amazonaws.com", "backups", "")
                }))),
            ),
            (
                "a key on the command line wins over the variable",
                vec![format!("{s3_prefix} --cluster-reset-restore-path=snap-1 --etcd-s3 --etcd-s3-bucket=b --etcd-s3-access-key=CLI")],
                vec![env_file(KEYS)],
                Ok(Some(with_s3("snap-1", S3Settings {
                    access_key_id: "CLI".into(),
                    ..s3("s3.amazonaws.com", "b", "")
                }))),
            ),
            (
                "without --etcd-s3 the name is taken for a local path",
                vec![format!("{s3_prefix} --cluster-reset-restore-path=snap-1 --etcd-s3-bucket=b")],
                vec![env_file(KEYS)],
                Ok(Some(file("snap-1"))),
            ),
            (
                "--etcd-s3 without a bucket",
                vec![format!("{s3_prefix} --cluster-reset-restore-path=snap-1 --etcd-s3 --etcd-s3-endpoint=m:9000")],
                vec![env_file(KEYS)],
                Err("s3 bucket name was not set"),
            ),
            (
                "--etcd-s3 with only the config secret",
                vec!["k3s server --cluster-reset --cluster-reset-restore-path=snap-1 --etcd-s3 --etcd-s3-config-secret=s3cfg".into()],
                vec![],
                Err("cannot use S3 config secret when restoring snapshot"),
            ),
            (
                "--etcd-s3 with nothing else",
                vec!["k3s server --cluster-reset --cluster-reset-restore-path=snap-1 --etcd-s3".into()],
                vec![],
                Err("s3 configuration was not set"),
            ),
            (
                "the CA file is not among the files",
                vec![format!("{s3_prefix} --cluster-reset-restore-path=snap-1 --etcd-s3 --etcd-s3-bucket=b --etcd-s3-endpoint-ca=/etc/rancher/k3s/restore-s3-ca.crt")],
                vec![env_file(KEYS)],
                Err("etcd-s3-endpoint-ca /etc/rancher/k3s/restore-s3-ca.crt: no such file"),
            ),
            (
                "the env file is missing",
                vec![format!("{s3_prefix} --cluster-reset-restore-path=snap-1 --etcd-s3 --etcd-s3-bucket=b")],
                vec![],
                Err("`. /etc/rancher/k3s/restore-s3.env`: no such file"),
            ),
            (
                "a malformed env file line",
                vec![format!("{s3_prefix} --cluster-reset-restore-path=snap-1 --etcd-s3 --etcd-s3-bucket=b")],
                vec![env_file("AWS_ACCESS_KEY_ID AKID\n")],
                Err("/etc/rancher/k3s/restore-s3.env line 1: \"AWS_ACCESS_KEY_ID AKID\" is not NAME=value"),
            ),
        ];
        for (name, post, files, want) in cases {
            let refs: Vec<&str> = post.iter().map(String::as_str).collect();
            let got = parse_restore("restore-0", &spec(&[], &refs), &files);
            match (got, want) {
                (Ok(plan), Ok(want)) => {
                    assert_eq!(plan.map(|p| p.request), want, "{name}");
                }
                (Err(err), Err(want)) => {
                    let text = err.to_string();
                    assert!(text.contains(want), "{name}: {text}");
                    assert!(
                        text.contains("KThreesConfig restore-0 spec.postK3sCommands[0]")
                            || text.contains("KThreesConfig restore-0 spec.postK3sCommands"),
                        "{name}: names the field: {text}"
                    );
                }
                (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn the_steps_keep_their_order_and_and_chains() {
        let plan = parse_restore(
            "r",
            &spec(
                &[SERVER_TO_CLUSTER_INIT],
                &[
                    "systemctl stop k3s",
                    "k3s server --cluster-reset --cluster-reset-restore-path=/s.db && systemctl start k3s",
                ],
            ),
            &[],
        )
        .unwrap()
        .unwrap();
        let steps: Vec<(String, bool)> = plan
            .steps
            .iter()
            .map(|p| (p.step.describe(), p.after_success_of_previous))
            .collect();
        assert_eq!(
            steps,
            vec![
                (SERVER_TO_CLUSTER_INIT.to_string(), false),
                ("the k3s install script".into(), false),
                ("systemctl stop k3s".into(), false),
                (
                    "k3s server --cluster-reset --cluster-reset-restore-path=/s.db".into(),
                    false
                ),
                ("systemctl start k3s".into(), true),
            ]
        );
    }

    /// `path.Join(folder, name)` as Go computes it.
    #[test]
    fn object_keys_are_joined_as_go_joins_paths() {
        let cases = [
            ("", "snap", "snap"),
            ("prod", "snap", "prod/snap"),
            ("prod/", "snap", "prod/snap"),
            ("/prod", "snap", "/prod/snap"),
            ("a//b/./c", "snap", "a/b/c/snap"),
            ("a/../b", "snap", "b/snap"),
            ("..", "snap", "../snap"),
        ];
        for (folder, name, want) in cases {
            assert_eq!(object_key(folder, name), want, "{folder:?} + {name:?}");
        }
        let s = s3("m:9000", "b", "prod");
        assert_eq!(s.object_key("snap"), "prod/snap");
        assert_eq!(s.endpoint_url(), "https://m:9000");
        assert_eq!(
            S3Settings {
                insecure: true,
                ..s
            }
            .endpoint_url(),
            "http://m:9000"
        );
    }

    #[test]
    fn the_keys_never_show_in_debug_output() {
        let text = format!("{:?}", s3("m", "b", ""));
        assert!(
            !text.contains("AKID") && !text.contains("se cret"),
            "{text}"
        );
    }
}
