//! `k3s-control-plane inspect` end to end: the built binary against a sandbox
//! (real 3-member TLS etcd, test API servers), as a user runs it.

use std::collections::BTreeMap;
use std::process::Output;
use std::time::Duration;

use k3s_control_plane::harness::capi_sim::MACHINE_FINALIZER;
use k3s_control_plane::harness::sandbox::{KCP, NAMESPACE, Sandbox};
use k8s_openapi::api::events::v1::Event;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_k3s-control-plane");
const LIMIT: Duration = Duration::from_secs(30);

fn target() -> String {
    format!("{NAMESPACE}/{KCP}")
}

/// Run the binary without blocking the runtime that serves the sandbox's API.
async fn inspect(args: &[&str]) -> Output {
    tokio::process::Command::new(BIN)
        .arg("inspect")
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .await
        .expect("run the binary")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

async fn json(kubeconfig: &str) -> Value {
    let out = inspect(&[&target(), "--kubeconfig", kubeconfig, "--output", "json"]).await;
    assert!(out.status.success(), "inspect failed: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).expect("one JSON document")
}

/// resourceVersion of the KCP and of every Machine, and the number of Events.
async fn server_state(sandbox: &Sandbox) -> (BTreeMap<String, String>, usize) {
    let mut versions = BTreeMap::new();
    let kcp = sandbox.kcp_api().get(KCP).await.unwrap();
    versions.insert(format!("kcp/{KCP}"), kcp.resource_version().unwrap());
    for m in sandbox
        .machines_api()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
    {
        versions.insert(
            format!("machine/{}", m.name_any()),
            m.resource_version().unwrap(),
        );
    }
    let events: Api<Event> = Api::all(sandbox.client());
    let count = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .len();
    (versions, count)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_membership_quorum_and_next_action_and_changes_nothing() {
    let sandbox = Sandbox::start(3).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("management.yaml");
    std::fs::write(
        &kubeconfig,
        k3s_control_plane::yaml::to_string(&sandbox.management.kubeconfig()).unwrap(),
    )
    .unwrap();
    let kubeconfig = kubeconfig.to_str().unwrap().to_string();

    let snap = sandbox.etcd.connect().snapshot().await.unwrap();
    let leader_id = snap.leader.expect("a leader");
    let leader_index = sandbox.etcd.index_of(leader_id).unwrap();
    let leader_member = sandbox.etcd.member(leader_index).name.clone();
    let leader_machine = sandbox.machines[leader_index].clone();

    // The simulated CAPI Machine controller adds its finalizer to new Machines
    // on its own schedule: let it finish before taking the reference state.
    sandbox
        .wait_for("CAPI's finalizer on every Machine", LIMIT, || async {
            let machines = sandbox
                .machines_api()
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?
                .items;
            match machines
                .iter()
                .find(|m| !m.finalizers().iter().any(|f| f == MACHINE_FINALIZER))
            {
                Some(m) => Err(format!("{} has no finalizer yet", m.name_any())),
                None => Ok(()),
            }
        })
        .await
        .unwrap();
    let before = server_state(&sandbox).await;

    // Text: the table, the leader, the quorum arithmetic, the next action.
    let out = inspect(&[&target(), "--kubeconfig", &kubeconfig]).await;
    assert!(out.status.success(), "inspect failed: {}", stderr(&out));
    let text = stdout(&out);
    println!("{text}");
    for name in sandbox.etcd.member_names() {
        assert!(text.contains(&name), "member {name} missing:\n{text}");
    }
    let leader_row = text
        .lines()
        .find(|l| l.starts_with(&leader_member))
        .unwrap_or_else(|| panic!("no row for {leader_member}:\n{text}"));
    assert!(
        leader_row.contains("leader"),
        "leader not marked: {leader_row}"
    );
    assert!(leader_row.contains(&leader_machine), "{leader_row}");
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("cp-") && l.contains(" leader "))
            .count(),
        1,
        "exactly one leader row:\n{text}"
    );
    assert!(
        text.contains("quorum: 3 of 3 voters healthy, quorum needs 2, fault tolerance 1"),
        "{text}"
    );
    assert!(text.contains("members without a machine: 0"), "{text}");
    assert!(text.contains("machines without a member: 0"), "{text}");
    assert!(text.contains("ambiguities: none"), "{text}");
    assert!(text.contains("next: idle (rule steady)"), "{text}");

    // JSON: the same content, stable camelCase keys.
    let doc = json(&kubeconfig).await;
    assert_eq!(doc["controlPlane"], target());
    assert_eq!(doc["etcd"]["state"], "observed");
    assert_eq!(doc["etcd"]["leader"], leader_member.as_str());
    let members = doc["members"].as_array().unwrap();
    assert_eq!(members.len(), 3);
    let leaders: Vec<&Value> = members.iter().filter(|m| m["leader"] == true).collect();
    assert_eq!(leaders.len(), 1);
    assert_eq!(leaders[0]["name"], leader_member.as_str());
    assert_eq!(leaders[0]["machine"], leader_machine.as_str());
    for m in members {
        assert_eq!(m["healthy"], true, "{m}");
        assert_eq!(m["learner"], false, "{m}");
        assert_eq!(m["matchedBy"], "nodeAnnotation", "{m}");
        assert!(m["node"].is_string(), "{m}");
    }
    assert_eq!(doc["membersWithoutMachineCount"], 0);
    assert_eq!(doc["machinesWithoutMember"].as_array().unwrap().len(), 0);
    assert_eq!(doc["quorum"]["voters"], 3);
    assert_eq!(doc["quorum"]["healthy"], 3);
    assert_eq!(doc["quorum"]["size"], 2);
    assert_eq!(doc["quorum"]["faultTolerance"], 1);
    assert_eq!(doc["next"]["refused"], false);
    assert_eq!(doc["next"]["action"], "idle");
    assert_eq!(doc["next"]["rule"], "steady");

    assert_eq!(
        server_state(&sandbox).await,
        before,
        "inspect changed the server"
    );

    // After a MachineHealthCheck marks the leader's Machine: the remediation
    // rule decides, naming the machine; still nothing is changed.
    sandbox.mark_unhealthy(&leader_machine).await.unwrap();
    let marked = server_state(&sandbox).await;
    let doc = json(&kubeconfig).await;
    assert_eq!(
        doc["next"]["rule"], "remediation.remediate",
        "{}",
        doc["next"]
    );
    assert_eq!(
        doc["next"]["action"], "record-remediation",
        "{}",
        doc["next"]
    );
    let message = doc["next"]["message"].as_str().unwrap();
    assert!(message.contains(&leader_machine), "{message}");
    let row = doc["machines"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == leader_machine.as_str())
        .unwrap();
    assert_eq!(row["healthCheckSucceeded"], false);
    assert_eq!(row["ownerRemediated"], false);
    let out = inspect(&[&target(), "--kubeconfig", &kubeconfig]).await;
    let text = stdout(&out);
    println!("{text}");
    println!("{}", serde_json::to_string_pretty(&doc).unwrap());
    assert!(
        text.contains("next: record-remediation (rule remediation.remediate)"),
        "{text}"
    );
    assert_eq!(
        server_state(&sandbox).await,
        marked,
        "inspect changed the server"
    );

    // A control plane that does not exist is named.
    let out = inspect(&["default/nope", "--kubeconfig", &kubeconfig]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("KThreesControlPlane default/nope not found"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
}

#[tokio::test]
async fn malformed_target_is_refused_naming_the_argument() {
    // Checked before any cluster is contacted: no kubeconfig needed.
    for bad in ["demo-control-plane", "default/", "a/b/c"] {
        let out = inspect(&[bad, "--kubeconfig", "/nonexistent"]).await;
        assert_eq!(out.status.code(), Some(1), "{bad}");
        let err = stderr(&out);
        assert!(err.contains("NAMESPACE/NAME"), "{bad}: {err}");
        assert!(err.contains(bad), "{bad}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    }
}

/// A second control plane in the sandbox's namespace whose etcd cannot be
/// reached: its own Cluster `lost`, every cluster Secret (the kubeconfig leads
/// to its own workload API server, the etcd CA is its own), one etcd server
/// Node at an address where nothing listens, and no Machine yet.
async fn add_lost_control_plane(sandbox: &Sandbox) -> k3s_control_plane::apiserver::TestApiServer {
    use k3s_control_plane::api::names::{
        CLUSTER_NAME_LABEL, K3S_ETCD_NODE_ADDRESS_ANNOTATION, K3S_ETCD_NODE_NAME_ANNOTATION,
        KCP_FINALIZER, NODE_ROLE_CONTROL_PLANE_LABEL, NODE_ROLE_ETCD_LABEL,
    };
    use k3s_control_plane::api::{Cluster, KThreesControlPlane};
    use k3s_control_plane::harness::sandbox::{
        cluster_object, kcp_object, mark_infrastructure_provisioned, mark_initialized,
    };
    use k8s_openapi::api::core::v1::{Node, Secret};
    use kube::api::{Patch, PatchParams, PostParams};
    use serde_json::json;

    let workload = k3s_control_plane::apiserver::TestApiServer::builder()
        .with_core_resources()
        .start()
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(workload.client());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": "lost-0",
            "labels": {NODE_ROLE_CONTROL_PLANE_LABEL: "true", NODE_ROLE_ETCD_LABEL: "true"},
            "annotations": {K3S_ETCD_NODE_NAME_ANNOTATION: "lost-0-0a0b0c0d",
                            K3S_ETCD_NODE_ADDRESS_ANNOTATION: "127.0.0.251"}},
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let status = json!({"status": {
        "addresses": [{"type": "InternalIP", "address": "127.0.0.251"}],
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]
    }});
    nodes
        .patch_status("lost-0", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();

    let client = sandbox.client();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let etcd_ca =
        k3s_control_plane::pki::generate_ca("lost-etcd-ca", Duration::from_secs(86400)).unwrap();
    let ca = k3s_control_plane::pki::generate_ca("lost-ca", Duration::from_secs(86400)).unwrap();
    let cca = k3s_control_plane::pki::generate_ca("lost-cca", Duration::from_secs(86400)).unwrap();
    let kubeconfig = k3s_control_plane::yaml::to_string(&workload.kubeconfig()).unwrap();
    let token = k3s_control_plane::pki::generate_token();
    for (name, data) in [
        ("lost-kubeconfig", json!({"value": kubeconfig})),
        (
            "lost-etcd",
            json!({"tls.crt": etcd_ca.cert_pem, "tls.key": etcd_ca.key_pem}),
        ),
        (
            "lost-ca",
            json!({"tls.crt": ca.cert_pem, "tls.key": ca.key_pem}),
        ),
        (
            "lost-cca",
            json!({"tls.crt": cca.cert_pem, "tls.key": cca.key_pem}),
        ),
        ("lost-token", json!({"value": token})),
    ] {
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {CLUSTER_NAME_LABEL: "lost"}},
            "type": "cluster.x-k8s.io/secret",
            "stringData": data,
        }))
        .unwrap();
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
    }
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), NAMESPACE);
    let cluster = clusters
        .create(
            &PostParams::default(),
            &cluster_object("lost", "lost-control-plane"),
        )
        .await
        .unwrap();
    mark_infrastructure_provisioned(&clusters, "lost")
        .await
        .unwrap();
    let kcps: Api<KThreesControlPlane> = Api::namespaced(client, NAMESPACE);
    let mut kcp = kcp_object("lost-control-plane", &cluster, 1);
    kcp.metadata.finalizers = Some(vec![KCP_FINALIZER.to_string()]);
    kcps.create(&PostParams::default(), &kcp).await.unwrap();
    mark_initialized(&kcps, "lost-control-plane").await.unwrap();
    workload
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_namespace_lists_every_control_plane_one_line_each() {
    let sandbox = Sandbox::start(3).await.unwrap();
    let _lost_workload = add_lost_control_plane(&sandbox).await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("management.yaml");
    std::fs::write(
        &kubeconfig,
        k3s_control_plane::yaml::to_string(&sandbox.management.kubeconfig()).unwrap(),
    )
    .unwrap();
    let kubeconfig = kubeconfig.to_str().unwrap().to_string();
    let before = server_state(&sandbox).await;

    let out = inspect(&["-n", NAMESPACE, "--kubeconfig", &kubeconfig]).await;
    assert!(out.status.success(), "inspect failed: {}", stderr(&out));
    let text = stdout(&out);
    println!("{text}");
    let lines: Vec<&str> = text.lines().collect();
    let cols = |l: &str| l.split_whitespace().map(String::from).collect::<Vec<_>>();
    assert_eq!(
        cols(lines[0]),
        [
            "NAME", "CLUSTER", "REPLICAS", "VERSION", "ETCD", "QUORUM", "MARGIN", "UPTODATE",
            "NEXT"
        ],
        "{text}"
    );
    // Sorted by name: the healthy one, then the one whose etcd is down.
    let demo = cols(lines[1]);
    assert_eq!(
        demo[..8],
        [KCP, "demo", "3/3", "v1.30.2+k3s2", "3/3", "2", "1", "3/3"],
        "{text}"
    );
    assert_eq!(demo[8..].join(" "), "idle (rule steady)", "{text}");
    let lost = cols(lines[2]);
    assert_eq!(
        lost[..8],
        [
            "lost-control-plane",
            "lost",
            "0/1",
            "v1.30.2+k3s2",
            "unreachable",
            "-",
            "-",
            "0/1"
        ],
        "{text}"
    );
    // NEXT is what the detailed view decides for it.
    let detail = inspect(&[
        "lost-control-plane",
        "-n",
        NAMESPACE,
        "--kubeconfig",
        &kubeconfig,
        "--output",
        "json",
    ])
    .await;
    assert!(detail.status.success(), "{}", stderr(&detail));
    let doc: Value = serde_json::from_slice(&detail.stdout).unwrap();
    assert_eq!(doc["etcd"]["state"], "unreachable");
    assert!(doc["quorum"].is_null());
    assert_eq!(
        lost[8..].join(" "),
        format!(
            "{} (rule {})",
            doc["next"]["action"].as_str().unwrap(),
            doc["next"]["rule"].as_str().unwrap()
        ),
        "{text}"
    );
    // Why, below the table.
    let why = lines
        .iter()
        .find(|l| l.starts_with("lost-control-plane: etcd unreachable: "))
        .unwrap_or_else(|| panic!("no reason line:\n{text}"));
    assert!(why.contains("127.0.0.251"), "{why}");

    // JSON: one object per control plane.
    let out = inspect(&[
        "-n",
        NAMESPACE,
        "--kubeconfig",
        &kubeconfig,
        "--output",
        "json",
    ])
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let rows: Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["name"], KCP);
    assert_eq!(rows[0]["quorumMargin"], 1);
    assert_eq!(rows[0]["etcd"], "3/3");
    assert_eq!(rows[1]["etcd"], "unreachable");
    assert!(rows[1]["quorumMargin"].is_null());
    assert!(rows[1]["reason"].is_string());

    // An empty namespace is a header alone; nothing was changed.
    let out = inspect(&["-n", "empty", "--kubeconfig", &kubeconfig]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).lines().count(), 1, "{}", stdout(&out));
    assert_eq!(
        server_state(&sandbox).await,
        before,
        "inspect changed the server"
    );
}

/// `status.etcd.quorumMargin` of `name`, or why not yet.
async fn etcd_status(sandbox: &Sandbox, name: &str) -> Option<Value> {
    let kcp = sandbox.kcp_api().get(name).await.ok()?;
    let status = serde_json::to_value(kcp.status?).ok()?;
    status.get("etcd").cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_writes_status_etcd_and_its_gauges_as_inspect_sees_them() {
    use k3s_control_plane::controller::metrics::ClusterLabels;
    use k3s_control_plane::harness::sandbox::docker_machine_template;
    use kube::api::{DynamicObject, Patch, PatchParams, PostParams};

    let mut sandbox = Sandbox::start(3).await.unwrap();
    let _lost_workload = add_lost_control_plane(&sandbox).await;
    // The lost control plane can create its Machine (it never boots).
    let templates: Api<DynamicObject> =
        Api::namespaced_with(sandbox.client(), NAMESPACE, &docker_machine_template());
    let mut template =
        DynamicObject::new("lost-control-plane-template", &docker_machine_template())
            .within(NAMESPACE);
    template.data = serde_json::json!({"spec": {"template": {"spec": {}}}});
    templates
        .create(&PostParams::default(), &template)
        .await
        .unwrap();
    // A margin left from an earlier read must not survive a reconcile that
    // cannot read etcd.
    let stale = serde_json::json!({"status": {"etcd": {"members": 3, "voters": 3,
        "healthyVoters": 3, "quorum": 2, "quorumMargin": 1, "voterHealth": "3/3"}}});
    sandbox
        .kcp_api()
        .patch_status(
            "lost-control-plane",
            &PatchParams::default(),
            &Patch::Merge(&stale),
        )
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("management.yaml");
    std::fs::write(
        &kubeconfig,
        k3s_control_plane::yaml::to_string(&sandbox.management.kubeconfig()).unwrap(),
    )
    .unwrap();
    let kubeconfig = kubeconfig.to_str().unwrap().to_string();

    let controller = sandbox.start_controller();
    let gauge = |cluster: &str| {
        controller
            .ctx
            .metrics
            .etcd_quorum_margin
            .get(&ClusterLabels {
                cluster: format!("{NAMESPACE}/{cluster}"),
            })
            .map(|g| g.get())
    };
    let healthy = serde_json::json!({"members": 3, "voters": 3, "healthyVoters": 3,
        "quorum": 2, "quorumMargin": 1, "voterHealth": "3/3"});
    sandbox
        .wait_for("status.etcd 3/3 on demo, none on lost", LIMIT, || async {
            let demo = etcd_status(&sandbox, KCP).await;
            let lost = etcd_status(&sandbox, "lost-control-plane").await;
            if demo.as_ref() == Some(&healthy) && lost.is_none() {
                Ok(())
            } else {
                Err(format!("demo {demo:?}, lost {lost:?}"))
            }
        })
        .await
        .unwrap();
    let lost = sandbox.kcp_api().get("lost-control-plane").await.unwrap();
    let condition = lost
        .conditions()
        .iter()
        .find(|c| c.type_ == "EtcdClusterHealthy")
        .unwrap();
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str()),
        ("Unknown", "EtcdUnreachable")
    );
    assert_eq!(gauge("demo"), Some(1));
    assert_eq!(gauge("lost"), None);

    // One member down: the margin is 0 in status, the gauge and inspect.
    // (not the leader: no election to wait for.)
    let leader = sandbox.etcd.connect().snapshot().await.unwrap().leader;
    let down = (0..3)
        .find(|&i| Some(i) != leader.and_then(|id| sandbox.etcd.index_of(id)))
        .unwrap();
    sandbox.etcd.stop(down).await.unwrap();
    sandbox
        .wait_for("status.etcd margin 0 on demo", LIMIT, || async {
            let demo = etcd_status(&sandbox, KCP).await;
            match &demo {
                Some(e) if e["quorumMargin"] == 0 && e["voterHealth"] == "2/3" => Ok(()),
                _ => Err(format!("demo {demo:?}")),
            }
        })
        .await
        .unwrap();
    assert_eq!(gauge("demo"), Some(0));
    let out = inspect(&["-n", NAMESPACE, "--kubeconfig", &kubeconfig]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    println!("{text}");
    let demo: Vec<&str> = text
        .lines()
        .find(|l| l.starts_with(KCP))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(demo[4..7], ["2/3", "2", "0"], "{text}");
    controller.stop().await;
}
