//! `k3s-control-plane etcd defrag | compact | alarm disarm` end to end: the
//! built binary against real etcd clusters from the harness, filled until a
//! real `NOSPACE`.

use std::process::Output;

use k3s_control_plane::harness::EtcdTestCluster;
use k3s_control_plane::harness::defrag_sampler::one_at_a_time;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_k3s-control-plane");
const KIB: u64 = 1024;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `k3s-control-plane etcd <args>` with `c`'s client certificate.
async fn etcd(c: &EtcdTestCluster, args: &[&str]) -> Output {
    let mut all: Vec<String> = vec!["etcd".into()];
    all.extend(args.iter().map(|a| a.to_string()));
    all.extend([
        "--endpoints".into(),
        c.endpoints().join(","),
        "--cacert".into(),
        c.ca_cert_path().display().to_string(),
        "--cert".into(),
        c.client_cert_path().display().to_string(),
        "--key".into(),
        c.client_key_path().display().to_string(),
    ]);
    tokio::process::Command::new(BIN)
        .args(&all)
        .kill_on_drop(true)
        .output()
        .await
        .expect("run the binary")
}

/// The member called `name` in `status --output json`.
fn member_json<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == name)
        .unwrap_or_else(|| panic!("{name} in {status}"))
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "JSON on stdout ({e}): {}{}",
            text(&out.stdout),
            text(&out.stderr)
        )
    })
}

/// A 3-member cluster whose member `full` has a backend quota of `quota`
/// bytes, with `keep` written first, then filled until etcd refuses writes.
async fn full_cluster(full: usize, quota: u64) -> EtcdTestCluster {
    k3s_control_plane::install_crypto_provider();
    let c = EtcdTestCluster::builder()
        .members(3)
        .quota_backend_bytes(full, quota)
        .start()
        .await
        .expect("start etcd");
    c.put(0, "keep", b"written before NOSPACE".to_vec())
        .await
        .unwrap();
    let writes = c
        .fill_until_nospace(0, 4, 64 * KIB as usize, 1000)
        .await
        .expect("etcd refuses writes once the small quota is passed");
    eprintln!("NOSPACE after {writes} writes of 64 KiB");
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nospace_is_recovered_with_compact_defrag_and_disarm_and_the_data_stays() {
    let quota = 1024 * KIB;
    let c = full_cluster(2, quota).await;
    let quota_flag = ["--quota-backend-bytes", "1Mi"];

    // status says so: the alarm, the sizes against the quota.
    let out = etcd(
        &c,
        &["status", "--output", "json", quota_flag[0], quota_flag[1]],
    )
    .await;
    let status = json(&out);
    let full = member_json(&status, &c.member(2).name);
    assert_eq!(full["alarms"], serde_json::json!(["NOSPACE"]), "{status}");
    assert_eq!(full["quota"], quota, "{status}");
    assert!(
        full["dbSize"].as_u64().unwrap() >= quota * 9 / 10,
        "{status}"
    );
    let out = etcd(&c, &["status", quota_flag[0], quota_flag[1]]).await;
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains(&format!("NOSPACE raised against {}", c.member(2).name)),
        "{stdout}"
    );

    // Disarming now would only trip the alarm again: refused, with the numbers.
    let out = etcd(&c, &["alarm", "disarm", quota_flag[0], quota_flag[1]]).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("refusing to disarm NOSPACE: ")
            && stderr.contains(
                "has no room below its quota (it must be at most 922 KiB, 90% of its quota)"
            )
            && stderr.contains("of 1.0 MiB (limit 922 KiB)"),
        "{stderr}"
    );

    // The history fills it: compact, then defragment every member.
    let out = etcd(&c, &["compact"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with("compacted the history to revision"),
        "{}",
        text(&out.stdout)
    );
    let out = etcd(&c, &["compact"]).await;
    assert!(
        text(&out.stdout).contains("already"),
        "{}",
        text(&out.stdout)
    );

    let out = etcd(&c, &["defrag", "--output", "json"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let done = json(&out);
    let defragmented = done["defragmented"].as_array().unwrap();
    assert_eq!(defragmented.len(), 3, "{done}");
    for d in defragmented {
        assert!(
            d["after"]["dbSize"].as_u64().unwrap() < quota * 9 / 10,
            "{d}"
        );
    }

    let out = etcd(&c, &["alarm", "disarm", quota_flag[0], quota_flag[1]]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.starts_with(&format!(
            "disarmed NOSPACE on {}: every member has room below its quota",
            c.member(2).name
        )),
        "{stdout}"
    );

    // Nothing left to disarm: said, with the numbers.
    let out = etcd(&c, &["alarm", "disarm", quota_flag[0], quota_flag[1]]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with("no NOSPACE alarm was raised; every member has room"),
        "{}",
        text(&out.stdout)
    );

    // Every member healthy, no alarm, writes accepted, the data kept.
    let out = etcd(
        &c,
        &["status", "--output", "json", quota_flag[0], quota_flag[1]],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let status = json(&out);
    for m in status["members"].as_array().unwrap() {
        assert_eq!(m["healthy"], true, "{m}");
        assert_eq!(m["alarms"], serde_json::json!([]), "{m}");
    }
    c.put(1, "after", b"accepted".to_vec()).await.unwrap();
    assert_eq!(
        c.get(2, "keep").await.unwrap().as_deref(),
        Some(&b"written before NOSPACE"[..])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defrag_is_refused_while_another_member_is_down_naming_it() {
    k3s_control_plane::install_crypto_provider();
    let mut c = EtcdTestCluster::start(3).await.unwrap();
    let snap = c.connect().snapshot().await.unwrap();
    let leader = c.index_of(snap.leader.unwrap()).unwrap();
    let down = (leader + 1) % 3;
    let follower = (leader + 2) % 3;
    c.stop(down).await.unwrap();
    let before = c.connect().snapshot().await.unwrap();
    let size = |s: &k3s_control_plane::etcd::MembershipSnapshot, i: usize| {
        s.member_by_name(&c.member(i).name)
            .and_then(|m| m.status.as_ref())
            .map(|s| s.db_size)
    };

    let out = etcd(&c, &["defrag", "--member", &c.member(follower).name]).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stdout));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "refusing to defragment {}: {} is unhealthy (",
            c.member(follower).name,
            c.member(down).name
        )),
        "{stderr}"
    );
    // Nothing was defragmented: the healthy follower's file is as it was.
    let after = c.connect().snapshot().await.unwrap();
    assert_eq!(size(&before, follower), size(&after, follower));
    assert!(text(&out.stdout).is_empty(), "{}", text(&out.stdout));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defrag_goes_one_member_at_a_time_followers_first_and_the_leader_last() {
    k3s_control_plane::install_crypto_provider();
    let c = EtcdTestCluster::start(3).await.unwrap();
    c.fill_fragmented(48).await.unwrap();
    let leader_id = c.connect().snapshot().await.unwrap().leader.unwrap();
    let leader = c.index_of(leader_id).unwrap();
    let mut before = Vec::new();
    for i in 0..3 {
        before.push(c.status(i).await.unwrap().db_size);
    }

    let sampler = c.sample_local_reads();
    let out = etcd(&c, &["defrag", "--output", "json"]).await;
    let samples = sampler.finish().await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report = json(&out);

    // The order the CLI reports: both followers, then the old leader after its leadership moved.
    let order: Vec<usize> = report["defragmented"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (0..3)
                .find(|&i| d["member"] == c.member(i).name)
                .expect("a member of the cluster")
        })
        .collect();
    assert_eq!(order.len(), 3, "{report}");
    assert_eq!(order[2], leader, "the leader goes last: {report}");
    assert_eq!(
        report["leaderMoves"][0]["from"],
        c.member(leader).name,
        "{report}"
    );
    let windows = one_at_a_time(&samples, &before, &order, &c.member_names())
        .unwrap_or_else(|e| panic!("{e}"));
    let start = samples.iter().map(|s| s.read.0).min().unwrap();
    for w in windows {
        eprintln!(
            "{}{}: samples typically {:?}, held {:?} from {:?}, file {} bytes, shrank at {:?}",
            c.member(w.member).name,
            if w.member == leader { " (leader)" } else { "" },
            w.typical,
            w.held_for(),
            w.held.0 - start,
            before[w.member],
            w.shrank.map(|t| t - start),
        );
    }
}
