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
        serde_yaml::to_string(&sandbox.management.kubeconfig()).unwrap(),
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
