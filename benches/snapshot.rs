//! Saving an etcd snapshot: ours (`backup::save` into a directory target:
//! the member's stream over verified mutual TLS, the SHA-256 checked on the
//! way, written in parts, the stored size checked after) against `etcdctl
//! snapshot save` from the same member, on a real 1-member loopback etcd
//! (harness, quota raised) holding 128 MiB of live data; the tools alternate
//! who goes first, medians of `ROUNDS`. Then 512 MiB, and how much this
//! process's resident memory grows while ours streams it: the peak
//! (VmHWM, reset through /proc/self/clear_refs just before) minus VmRSS
//! before.
//!
//! Run: `cargo bench --bench snapshot` (after hack/setup.sh).

use std::time::{Duration, Instant, SystemTime};

use k3s_control_plane::backup::{self, SnapshotName, SnapshotReason, Target, TargetConfig};
use k3s_control_plane::harness::EtcdTestCluster;

const ROUNDS: usize = 3;
const MIB: usize = 1024 * 1024;

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// VmRSS and VmHWM of this process, in KiB.
fn memory_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{name} in /proc/self/status"))
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Start a 1-member etcd with room for `mib` MiB and fill it with that much
/// live data (1 MiB values).
async fn filled(mib: usize) -> EtcdTestCluster {
    let quota = (mib as u64 * 2 + 512) * MIB as u64;
    let c = EtcdTestCluster::builder()
        .members(1)
        .quota_backend_bytes(0, quota)
        .start()
        .await
        .expect("start etcd");
    for i in 0..mib {
        let value: Vec<u8> = (0..MIB).map(|j| (i * 31 + j * 7) as u8).collect();
        c.put(0, &format!("data-{i}"), value).await.expect("put");
    }
    c
}

async fn ours(c: &EtcdTestCluster, dir: &std::path::Path, round: usize) -> (Duration, u64) {
    let etcd = c.connect();
    let target = Target::open(&TargetConfig::Filesystem {
        path: dir.to_path_buf(),
    })
    .expect("target");
    let name = SnapshotName::ours(
        SnapshotReason::OnDemand,
        &c.member(0).node_name,
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + round as u64),
    )
    .unwrap();
    let started = Instant::now();
    let snap = etcd.snapshot().await.expect("membership");
    let saved = backup::save(
        &etcd,
        &snap,
        c.member(0).id,
        &target,
        &name,
        Duration::from_secs(600),
    )
    .await
    .expect("save");
    let took = started.elapsed();
    std::fs::remove_file(dir.join(&saved.name)).unwrap();
    (took, saved.size)
}

fn etcdctl(c: &EtcdTestCluster, dir: &std::path::Path) -> Duration {
    let file = dir.join("etcdctl.db");
    let started = Instant::now();
    let out = c
        .etcdctl(&c.member(0).client_url())
        .expect("etcdctl")
        .arg("--command-timeout=10m")
        .args(["snapshot", "save"])
        .arg(&file)
        .output()
        .expect("run etcdctl");
    let took = started.elapsed();
    assert!(
        out.status.success(),
        "etcdctl snapshot save: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_file(&file).unwrap();
    took
}

#[tokio::main]
async fn main() {
    k3s_control_plane::install_crypto_provider();
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();

    let c = filled(128).await;
    let (mut mine, mut theirs, mut size) = (vec![], vec![], 0);
    for round in 0..ROUNDS * 2 {
        if (round % 2 == 0) == (round / 2 % 2 == 0) {
            let (took, bytes) = ours(&c, dir.path(), round).await;
            mine.push(took);
            size = bytes;
        } else {
            theirs.push(etcdctl(&c, dir.path()));
        }
    }
    drop(c);
    let (o, t) = (median(mine), median(theirs));
    println!(
        "128 MiB live ({:.0} MiB file): ours {:.0} ms ({:.0} MiB/s), etcdctl snapshot save {:.0} ms, ratio {:.2}x",
        size as f64 / MIB as f64,
        ms(o),
        size as f64 / MIB as f64 / o.as_secs_f64(),
        ms(t),
        o.as_secs_f64() / t.as_secs_f64()
    );

    let c = filled(512).await;
    // Warm the connection and the code paths, so that the measurement is the
    // stream, not first-use allocations.
    let etcd = c.connect();
    etcd.snapshot().await.unwrap();
    let (rss_before, _) = memory_kib();
    // Writing 5 resets VmHWM to the current RSS (Linux >= 4.0).
    std::fs::write("/proc/self/clear_refs", "5").expect("reset VmHWM");
    let (took, bytes) = ours(&c, dir.path(), 99).await;
    let (rss_after, peak) = memory_kib();
    let theirs = etcdctl(&c, dir.path());
    println!(
        "512 MiB live ({:.0} MiB file): ours {:.0} ms, etcdctl {:.0} ms; RSS before {:.1} MiB, peak while streaming {:.1} MiB (growth {:.1} MiB), after {:.1} MiB",
        bytes as f64 / MIB as f64,
        ms(took),
        ms(theirs),
        rss_before as f64 / 1024.0,
        peak as f64 / 1024.0,
        peak.saturating_sub(rss_before) as f64 / 1024.0,
        rss_after as f64 / 1024.0
    );
}
