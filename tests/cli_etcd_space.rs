//! `k3s-control-plane etcd defrag | compact | alarm disarm` end to end: the
//! built binary against real etcd clusters from the harness, filled until a
//! real `NOSPACE`.

use std::process::Output;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k3s_control_plane::harness::EtcdTestCluster;
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
    eprintln!("{stderr}");
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

    let out = etcd(&c, &["status", quota_flag[0], quota_flag[1]]).await;
    eprintln!("{}", text(&out.stdout));
    let out = etcd(&c, &["defrag", "--output", "json"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let done = json(&out);
    eprintln!("{done}");
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
    eprintln!("{stdout}");
    assert!(
        stdout.starts_with(&format!(
            "disarmed NOSPACE on {}: every member has room below its quota",
            c.member(2).name
        )),
        "{stdout}"
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

/// One look at one member: how long a read served from its own backend took
/// (it waits while the member is defragmented), then its file size.
#[derive(Clone, Copy, Debug)]
struct Sample {
    member: usize,
    read: (Instant, Instant),
    db_size: Option<i64>,
}

/// Sample member `member` back to back until `stop`.
fn sampler(
    c: Arc<EtcdTestCluster>,
    member: usize,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<Sample>> {
    tokio::spawn(async move {
        let mut samples = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let started = Instant::now();
            let _ = c.read_local(member, "probe", Duration::from_secs(30)).await;
            let ended = Instant::now();
            let db_size = c.status(member).await.ok().map(|s| s.db_size);
            samples.push(Sample {
                member,
                read: (started, ended),
                db_size,
            });
        }
        samples
    })
}

/// Fill every member with `mib` MiB of live data and as much history, then
/// compact it: each member's file is then about half free pages.
async fn fragmented_cluster(mib: usize) -> EtcdTestCluster {
    k3s_control_plane::install_crypto_provider();
    let c = EtcdTestCluster::start(3).await.unwrap();
    for round in 0..2 {
        for i in 0..mib {
            c.put(0, &format!("data-{i}"), vec![b'a' + round; 1024 * 1024])
                .await
                .unwrap();
        }
    }
    let out = etcd(&c, &["compact"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    // The pages the compaction freed count as free once the backend commits again.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        c.put(0, "tick", b"x".to_vec()).await.unwrap();
        let mut fragmented = true;
        for i in 0..3 {
            let s = c.status(i).await.unwrap();
            fragmented &= s.db_size_in_use * 10 < s.db_size * 7;
        }
        if fragmented {
            return c;
        }
        assert!(
            Instant::now() < deadline,
            "the compacted pages never counted as free"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defrag_goes_one_member_at_a_time_followers_first_and_the_leader_last() {
    let c = Arc::new(fragmented_cluster(48).await);
    let leader_id = c.connect().snapshot().await.unwrap().leader.unwrap();
    let leader = c.index_of(leader_id).unwrap();
    let before: Vec<i64> = {
        let mut sizes = Vec::new();
        for i in 0..3 {
            sizes.push(c.status(i).await.unwrap().db_size);
        }
        sizes
    };

    let stop = Arc::new(AtomicBool::new(false));
    let samplers: Vec<_> = (0..3)
        .map(|i| sampler(c.clone(), i, stop.clone()))
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let out = etcd(&c, &["defrag", "--output", "json"]).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report = json(&out);
    let mut samples = Vec::new();
    for s in samplers {
        samples.extend(s.await.unwrap());
    }

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

    // What the members showed: when each one's file shrank, and the longest
    // wait of a read served from its own backend (its defragmentation).
    let shrank: Vec<Instant> = (0..3)
        .map(|i| {
            samples
                .iter()
                .filter(|s| s.member == i)
                .find(|s| s.db_size.is_some_and(|size| size * 4 < before[i] * 3))
                .unwrap_or_else(|| panic!("{} never shrank", c.member(i).name))
                .read
                .1
        })
        .collect();
    let blocked: Vec<(Instant, Instant)> = (0..3)
        .map(|i| {
            samples
                .iter()
                .filter(|s| s.member == i)
                .max_by_key(|s| s.read.1 - s.read.0)
                .unwrap()
                .read
        })
        .collect();
    let start = samples.iter().map(|s| s.read.0).min().unwrap();
    for i in 0..3 {
        let typical = {
            let mut d: Vec<Duration> = samples
                .iter()
                .filter(|s| s.member == i)
                .map(|s| s.read.1 - s.read.0)
                .collect();
            d.sort();
            d[d.len() / 2]
        };
        eprintln!(
            "{}{}: {} samples, read typically {typical:?}, longest {:?} from {:?} to {:?}, file {} -> shrank at {:?}",
            c.member(i).name,
            if i == leader { " (leader)" } else { "" },
            samples.iter().filter(|s| s.member == i).count(),
            blocked[i].1 - blocked[i].0,
            blocked[i].0 - start,
            blocked[i].1 - start,
            before[i],
            shrank[i] - start,
        );
        // The signal is real: the defragmentation held reads far longer than usual.
        assert!(
            blocked[i].1 - blocked[i].0 > typical * 5,
            "{}: no read waited noticeably",
            c.member(i).name
        );
    }
    // Shrunk in the order the CLI reports.
    for w in order.windows(2) {
        assert!(
            shrank[w[0]] < shrank[w[1]],
            "shrank out of order: {order:?}"
        );
    }
    // One at a time: each member's defragmentation ended before the next one's began.
    for w in order.windows(2) {
        assert!(
            blocked[w[0]].1 <= blocked[w[1]].0,
            "{} was still blocked when {} was: {:?} vs {:?}",
            c.member(w[0]).name,
            c.member(w[1]).name,
            blocked[w[0]],
            blocked[w[1]]
        );
    }
}
