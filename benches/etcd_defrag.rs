//! Defragmenting one member: ours (`EtcdCluster::defragment`: a fresh
//! handle, the guard's snapshot, the Defragment call, the health
//! confirmation after) against `etcdctl defrag` on the same member, on a
//! real 3-member loopback cluster (harness) whose members hold N MiB of live
//! data and as much compacted history (files about 2N MiB, half free).
//! Before every measurement the data is written twice again and compacted,
//! so both tools always find the same work; the tools alternate who goes
//! first. Medians of `ROUNDS`.
//!
//! Run: `cargo bench --bench etcd_defrag` (needs etcd and etcdctl on PATH).

use std::time::{Duration, Instant};

use k3s_control_plane::harness::EtcdTestCluster;

const SIZES_MIB: [usize; 3] = [16, 64, 128];
const ROUNDS: usize = 3;

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn etcdctl_defrag(c: &EtcdTestCluster, endpoint: &str) -> Duration {
    let started = Instant::now();
    let out = c
        .etcdctl(endpoint)
        .expect("etcdctl")
        .arg("--command-timeout=5m")
        .arg("defrag")
        .output()
        .expect("run etcdctl");
    let took = started.elapsed();
    assert!(
        out.status.success(),
        "etcdctl defrag: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    took
}

#[tokio::main]
async fn main() {
    k3s_control_plane::install_crypto_provider();
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return;
    }
    println!(
        "{:<10} {:>10} {:>14} {:>14} {:>14} {:>8}",
        "live MiB", "file MiB", "ours total", "ours call", "etcdctl", "ratio"
    );
    for mib in SIZES_MIB {
        let c = EtcdTestCluster::start(3).await.expect("start cluster");
        let leader = c.connect().snapshot().await.unwrap().leader.unwrap();
        let member = (0..3).find(|&i| c.member(i).id != leader).unwrap();
        let id = c.member(member).id;
        let endpoint = c.member(member).client_url();
        let (mut ours, mut call, mut theirs, mut files) = (vec![], vec![], vec![], vec![]);
        for round in 0..ROUNDS * 2 {
            c.fill_fragmented(mib).await.expect("fragment");
            files.push(c.status(member).await.unwrap().db_size);
            // Alternate which tool goes first in each pair of rounds.
            if (round % 2 == 0) == (round / 2 % 2 == 0) {
                let etcd = c.connect();
                let started = Instant::now();
                let done = etcd.defragment(id).await.expect("defragment");
                ours.push(started.elapsed());
                call.push(Duration::from_millis(done.elapsed_ms as u64));
            } else {
                theirs.push(etcdctl_defrag(&c, &endpoint));
            }
        }
        let (o, k, t) = (median(ours), median(call), median(theirs));
        let file = files.iter().sum::<i64>() as f64 / files.len() as f64 / (1024.0 * 1024.0);
        println!(
            "{mib:<10} {file:>10.0} {:>11.1} ms {:>11.1} ms {:>11.1} ms {:>7.2}x",
            ms(o),
            ms(k),
            ms(t),
            t.as_secs_f64() / o.as_secs_f64()
        );
    }
}
