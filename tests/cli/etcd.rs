//! `k3s-control-plane etcd ...` end to end: the built binary against a real
//! etcd cluster from the harness.

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use k3s_control_plane::harness::EtcdTestCluster;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_k3s-control-plane");

async fn run(args: &[&str]) -> Output {
    tokio::process::Command::new(BIN)
        .args(args)
        .kill_on_drop(true)
        .output()
        .await
        .expect("run the binary")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Connection flags for `c` with its client certificate.
fn conn(c: &EtcdTestCluster) -> Vec<String> {
    vec![
        "--endpoints".into(),
        c.endpoints().join(","),
        "--cacert".into(),
        c.ca_cert_path().display().to_string(),
        "--cert".into(),
        c.client_cert_path().display().to_string(),
        "--key".into(),
        c.client_key_path().display().to_string(),
    ]
}

async fn etcd(args: &[&str], extra: &[String]) -> Output {
    let mut all: Vec<String> = vec!["etcd".into()];
    all.extend(args.iter().map(|a| a.to_string()));
    all.extend(extra.iter().cloned());
    let refs: Vec<&str> = all.iter().map(String::as_str).collect();
    run(&refs).await
}

async fn cluster(n: usize) -> EtcdTestCluster {
    k3s_control_plane::install_crypto_provider();
    EtcdTestCluster::start(n).await.expect("start etcd cluster")
}

#[tokio::test]
async fn status_json_has_the_documented_shape_and_text_has_the_quorum_line() {
    let c = cluster(3).await;
    let out = etcd(&["status", "--output", "json"], &conn(&c)).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json: Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    let cluster_id = json["clusterId"].as_str().unwrap();
    assert!(u64::from_str_radix(cluster_id, 16).unwrap() != 0);
    let members = json["members"].as_array().unwrap();
    assert_eq!(members.len(), 3);
    let leader = json["leader"].as_str().unwrap();
    for m in members {
        let id = m["id"].as_str().unwrap();
        assert_eq!(id.len(), 16, "{id}");
        assert!(u64::from_str_radix(id, 16).is_ok());
        assert!(
            c.member_names()
                .contains(&m["name"].as_str().unwrap().to_string())
        );
        assert_eq!(m["peerURLs"].as_array().unwrap().len(), 1);
        assert_eq!(m["clientURLs"].as_array().unwrap().len(), 1);
        assert_eq!(m["learner"], Value::Bool(false));
        assert_eq!(m["healthy"], Value::Bool(true));
        assert_eq!(m["error"], Value::Null);
        assert_eq!(m["alarms"], serde_json::json!([]));
        assert_eq!(m["leader"], Value::Bool(m["name"] == leader), "{m}");
    }
    assert_eq!(
        json["quorum"]["voters"]
            .as_u64()
            .zip(json["quorum"]["healthy"].as_u64()),
        Some((3, 3))
    );
    assert_eq!(json["quorum"]["size"], 2);
    assert_eq!(json["quorum"]["faultTolerance"], 1);

    let out = etcd(&["status"], &conn(&c)).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains(&format!("leader {leader}")), "{stdout}");
    assert!(
        stdout.contains("quorum: 3 of 3 voters healthy, quorum needs 2, fault tolerance 1"),
        "{stdout}"
    );
    for name in c.member_names() {
        assert!(stdout.contains(&name), "{stdout}");
    }
}

#[tokio::test]
async fn remove_member_refuses_an_unsafe_removal_with_exit_2_then_removes_the_leader() {
    let mut c = cluster(3).await;
    let snap = c.connect().snapshot().await.unwrap();
    let leader = c.index_of(snap.leader.unwrap()).unwrap();
    let stopped = (leader + 1) % 3;
    let healthy = (leader + 2) % 3;
    c.stop(stopped).await.unwrap();

    // Unsafe: removing a healthy member with another one down.
    let name = c.member(healthy).name.clone();
    let out = etcd(&["remove-member", &name], &conn(&c)).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "removing {name} would leave 1 of 2 voters healthy, quorum needs 2"
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&c.member(stopped).name),
        "names the unhealthy member: {stderr}"
    );
    assert_eq!(c.connect().snapshot().await.unwrap().members.len(), 3);

    // Safe: remove the stopped member by id, minting our client certificate.
    let id = format!("{:016x}", c.member(stopped).id);
    let minted = [
        "--endpoints".to_string(),
        c.endpoints().join(","),
        "--cacert".into(),
        c.ca_cert_path().display().to_string(),
        "--ca-key".into(),
        c.ca_key_path().display().to_string(),
    ];
    let out = etcd(&["remove-member", &id, "--output", "json"], &minted).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["removal"]["result"], "removed", "{json}");

    // Then the leader itself: leadership moves first.
    let leader_name = c.member(leader).name.clone();
    let out = etcd(&["remove-member", &leader_name], &conn(&c)).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains(&format!("moved leadership from {leader_name} to")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("removed member {leader_name}")),
        "{stdout}"
    );
    let snap = c.connect().snapshot().await.unwrap();
    assert_eq!(snap.members.len(), 1);
    assert_eq!(snap.members[0].name, c.member(healthy).name);
}

#[tokio::test]
async fn move_leader_moves_to_the_requested_member() {
    let c = cluster(3).await;
    let snap = c.connect().snapshot().await.unwrap();
    let leader = c.index_of(snap.leader.unwrap()).unwrap();
    let to = (leader + 1) % 3;
    let out = etcd(
        &[
            "move-leader",
            "--from",
            &c.member(leader).name,
            "--to",
            &c.member(to).name,
        ],
        &conn(&c),
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        c.connect().snapshot().await.unwrap().leader,
        Some(c.member(to).id)
    );
}

/// Bad input: exit 1, one line on stderr naming the flag; nothing contacted.
#[tokio::test]
async fn bad_input_exits_1_with_one_line_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let pki = k3s_control_plane::harness::TestPki::new();
    let write = |name: &str, body: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, body).unwrap();
        p.display().to_string()
    };
    let ca = write("ca.crt", &pki.server_ca.pair.cert_pem);
    let cert = write("client.crt", &pki.client.cert_pem);
    let key = write("client.key", &pki.client.key_pem);
    let wrong_key = write("wrong.key", &pki.peer_ca.pair.key_pem);
    let missing = dir.path().join("missing.crt").display().to_string();
    let url = "https://127.77.255.1:2379";

    struct Case<'a> {
        name: &'a str,
        args: Vec<&'a str>,
        expected: String,
    }
    let cases = [
        Case {
            name: "key that does not match the certificate",
            args: vec![
                "--endpoints",
                url,
                "--cacert",
                &ca,
                "--cert",
                &cert,
                "--key",
                &wrong_key,
            ],
            expected: format!(
                "error: --key {wrong_key}: key does not match the certificate in --cert {cert}"
            ),
        },
        Case {
            name: "unreadable CA file",
            args: vec![
                "--endpoints",
                url,
                "--cacert",
                &missing,
                "--cert",
                &cert,
                "--key",
                &key,
            ],
            expected: format!("error: --cacert {missing}: cannot read"),
        },
        Case {
            name: "malformed URL",
            args: vec![
                "--endpoints",
                "127.0.0.1:2379",
                "--cacert",
                &ca,
                "--cert",
                &cert,
                "--key",
                &key,
            ],
            expected: "error: --endpoints \"127.0.0.1:2379\"".into(),
        },
        Case {
            name: "plaintext URL",
            args: vec![
                "--endpoints",
                "http://10.0.0.1:2379",
                "--cacert",
                &ca,
                "--cert",
                &cert,
                "--key",
                &key,
            ],
            expected: "error: --endpoints \"http://10.0.0.1:2379\": scheme \"http\" is not allowed"
                .into(),
        },
        Case {
            name: "certificate file holding a key",
            args: vec![
                "--endpoints",
                url,
                "--cacert",
                &ca,
                "--cert",
                &key,
                "--key",
                &key,
            ],
            expected: format!("error: --cert {key}: no PEM certificate found"),
        },
        Case {
            name: "CA key that is not the CA's",
            args: vec!["--endpoints", url, "--cacert", &ca, "--ca-key", &wrong_key],
            expected: format!(
                "error: --ca-key {wrong_key}: key does not match the certificate in --cacert {ca}"
            ),
        },
        Case {
            name: "no client credentials",
            args: vec!["--endpoints", url, "--cacert", &ca],
            expected: "error: --cert and --key, or --ca-key, is required".into(),
        },
    ];
    for case in cases {
        let mut args = vec!["etcd", "status"];
        args.extend(case.args.iter().copied());
        let out = run(&args).await;
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{}: {stderr}", case.name);
        assert_eq!(
            stderr.lines().count(),
            1,
            "{}: one line: {stderr}",
            case.name
        );
        assert!(
            stderr.starts_with(&case.expected),
            "{}: {stderr}",
            case.name
        );
        assert!(!stderr.contains("PRIVATE KEY"), "{}: {stderr}", case.name);
    }
}

#[tokio::test]
async fn unknown_member_exits_1_and_lists_the_members() {
    let c = cluster(1).await;
    let out = etcd(&["remove-member", "cp-9-00000000"], &conn(&c)).await;
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("\"cp-9-00000000\": no such etcd member"),
        "{stderr}"
    );
    assert!(stderr.contains(&c.member(0).name), "{stderr}");
    assert!(Path::new(BIN).exists());
}

/// `etcd ...` bounded by a deadline: the command must answer within `limit`.
async fn etcd_within(limit: Duration, args: &[&str], extra: &[String]) -> (Output, Duration) {
    let started = Instant::now();
    let out = tokio::time::timeout(limit, etcd(args, extra))
        .await
        .unwrap_or_else(|_| panic!("etcd {args:?} did not finish within {limit:?}"));
    (out, started.elapsed())
}

#[tokio::test]
async fn lost_quorum_is_reported_as_such_with_exit_2_within_seconds() {
    let mut c = cluster(3).await;
    let snap = c.connect().snapshot().await.unwrap();
    let leader = c.index_of(snap.leader.unwrap()).unwrap();
    let survivor = (leader + 1) % 3;
    let down = (leader + 2) % 3;
    c.stop(down).await.unwrap();
    c.stop(leader).await.unwrap();
    let limit = Duration::from_secs(10);
    let lost = "quorum lost: 0 of 3 voters healthy, quorum needs 2";

    let (out, took) = etcd_within(limit, &["status"], &conn(&c)).await;
    eprintln!("status without quorum took {took:?}");
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(2), "{stdout}{stderr}");
    assert!(
        stdout.contains(&format!("\n{lost}; unhealthy: ")),
        "{stdout}"
    );
    assert!(
        stdout.contains("cannot serve a linearizable read"),
        "{stdout}"
    );
    assert!(stdout.contains("leader none"), "{stdout}");
    assert!(stderr.starts_with(&format!("error: {lost}")), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");

    let (out, _) = etcd_within(limit, &["status", "--output", "json"], &conn(&c)).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let json: Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(json["quorum"]["lost"], true, "{json}");
    assert_eq!(json["quorum"]["healthy"], 0);
    assert_eq!(json["quorum"]["voters"], 3);
    assert_eq!(json["leader"], Value::Null);
    let members = json["members"].as_array().unwrap();
    let alive = members
        .iter()
        .find(|m| m["name"] == c.member(survivor).name.as_str())
        .unwrap();
    assert_eq!(alive["healthy"], false, "{alive}");
    assert!(alive["raftTerm"].is_u64(), "it answered Status: {alive}");

    // Removing the survivor or a dead member alike: quorum lost, not "cannot
    // read etcd alarms".
    for target in [c.member(down).name.clone(), c.member(survivor).name.clone()] {
        let (out, took) = etcd_within(limit, &["remove-member", &target], &conn(&c)).await;
        eprintln!("remove-member without quorum took {took:?}");
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.starts_with(&format!("error: {lost}; unhealthy: ")),
            "{stderr}"
        );
        assert!(!stderr.contains("alarms"), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
    }
    let (out, _) = etcd_within(
        limit,
        &["remove-member", &c.member(down).name, "--output", "json"],
        &conn(&c),
    )
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let json: Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(json["refused"], true, "{json}");
    assert_eq!(json["quorumLost"], true, "{json}");
    assert_eq!(json["assessment"]["healthy"], 0, "{json}");

    let (out, _) = etcd_within(
        limit,
        &["move-leader", "--from", &c.member(survivor).name],
        &conn(&c),
    )
    .await;
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.starts_with(&format!("error: {lost}")), "{stderr}");
}
