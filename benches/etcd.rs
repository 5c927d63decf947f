//! etcd engine against `etcdctl` on a real 3-member loopback cluster (harness).
//!
//! - snapshot: our `EtcdCluster::snapshot` (member list + status of every member
//!   on its own endpoint + alarms) vs `etcdctl member list` followed by
//!   `etcdctl endpoint status --cluster`.
//! - move leader + remove: ours (fresh handle, cold connections, as etcdctl)
//!   vs `etcdctl move-leader` to the leader then `etcdctl member remove` to the
//!   transferee. Each iteration uses a new cluster; only the operation is timed.
//!
//! Run: `cargo bench --bench etcd` (needs etcd and etcdctl on PATH).

use std::time::{Duration, Instant};

use k3s_control_plane::etcd::EtcdCluster;
use k3s_control_plane::harness::EtcdTestCluster;

const SNAPSHOT_ITERATIONS: usize = 30;
const REMOVE_ITERATIONS: usize = 5;
/// etcd refuses reconfiguration until its peers have been connected for 5 s
/// (its HealthInterval); a fresh cluster waits that out before being measured.
const SETTLE: Duration = Duration::from_millis(5500);

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn etcdctl(c: &EtcdTestCluster, endpoints: &str, args: &[&str]) {
    let out = c
        .etcdctl(endpoints)
        .expect("etcdctl")
        .args(args)
        .output()
        .expect("run etcdctl");
    assert!(
        out.status.success(),
        "etcdctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn settled_cluster() -> (EtcdTestCluster, u64, u64) {
    let c = EtcdTestCluster::start(3).await.expect("start cluster");
    let snap = c.connect().snapshot().await.expect("snapshot");
    let leader = snap.leader.expect("leader");
    let transferee = snap.choose_transferee(leader).expect("transferee").id;
    tokio::time::sleep(SETTLE).await;
    (c, leader, transferee)
}

fn row(name: &str, ours: Duration, theirs: Duration) {
    println!(
        "{name:<28} {:>10.2} ms {:>12.2} ms {:>8.2}x",
        ours.as_secs_f64() * 1e3,
        theirs.as_secs_f64() * 1e3,
        theirs.as_secs_f64() / ours.as_secs_f64()
    );
}

#[tokio::main]
async fn main() {
    k3s_control_plane::install_crypto_provider();
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return; // `cargo test --benches` / tooling probes: nothing to list.
    }

    let binary = k3s_control_plane::harness::etcd::EtcdBinary::find().expect("etcd");
    println!(
        "etcd {} ({}), etcdctl {}",
        binary.version_string(),
        binary.path.display(),
        binary.etcdctl().display()
    );
    // Snapshot: warm handle (as the controller keeps one) vs etcdctl per call.
    let c = EtcdTestCluster::start(3).await.expect("start cluster");
    let etcd = c.connect();
    etcd.snapshot().await.expect("warm up");
    let mut ours = Vec::new();
    for _ in 0..SNAPSHOT_ITERATIONS {
        let t = Instant::now();
        let snap = etcd.snapshot().await.expect("snapshot");
        ours.push(t.elapsed());
        assert_eq!(snap.members.len(), 3);
    }
    let mut cold = Vec::new();
    for _ in 0..SNAPSHOT_ITERATIONS / 3 {
        let fresh = c.connect();
        let t = Instant::now();
        fresh.snapshot().await.expect("snapshot");
        cold.push(t.elapsed());
    }
    let endpoints = c.endpoints().join(",");
    let mut theirs = Vec::new();
    for _ in 0..SNAPSHOT_ITERATIONS {
        let t = Instant::now();
        etcdctl(&c, &endpoints, &["member", "list"]);
        etcdctl(&c, &endpoints, &["endpoint", "status", "--cluster"]);
        theirs.push(t.elapsed());
    }
    drop(etcd);
    drop(c);
    let snapshot = (median(ours), median(cold), median(theirs));

    // Move leadership off the leader, then remove it.
    let mut ours = Vec::new();
    let mut ours_safe = Vec::new();
    let mut theirs = Vec::new();
    for _ in 0..REMOVE_ITERATIONS {
        let (c, leader, transferee) = settled_cluster().await;
        let etcd = EtcdCluster::new(&c.endpoints(), c.client_tls()).unwrap();
        let t = Instant::now();
        etcd.move_leader_off(leader, Some(transferee))
            .await
            .expect("move");
        etcd.remove_member(leader).await.expect("remove");
        ours.push(t.elapsed());
        drop(c);

        let (c, leader, _) = settled_cluster().await;
        let etcd = EtcdCluster::new(&c.endpoints(), c.client_tls()).unwrap();
        let t = Instant::now();
        etcd.safe_remove(leader).await.expect("safe remove");
        ours_safe.push(t.elapsed());
        drop(c);

        let (c, leader, transferee) = settled_cluster().await;
        let leader_url = c.member(c.index_of(leader).unwrap()).client_url();
        let transferee_url = c.member(c.index_of(transferee).unwrap()).client_url();
        let t = Instant::now();
        etcdctl(
            &c,
            &leader_url,
            &["move-leader", &format!("{transferee:x}")],
        );
        etcdctl(
            &c,
            &transferee_url,
            &["member", "remove", &format!("{leader:x}")],
        );
        theirs.push(t.elapsed());
        drop(c);
    }

    println!();
    println!(
        "{:<28} {:>13} {:>15} {:>9}",
        "median (3 members, loopback)", "ours", "etcdctl", "ratio"
    );
    row("snapshot (warm handle)", snapshot.0, snapshot.2);
    row("snapshot (fresh handle)", snapshot.1, snapshot.2);
    row("move leader + remove", median(ours), median(theirs.clone()));
    row("safe_remove (leader)", median(ours_safe), median(theirs));
    println!(
        "({SNAPSHOT_ITERATIONS} snapshot samples, {REMOVE_ITERATIONS} removal samples; ratio = etcdctl / ours; \
         ours confirms the new leader and the removal, etcdctl does not)"
    );
}
