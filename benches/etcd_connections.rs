//! Memory per pooled etcd connection (issue 12).
//!
//! One real 3-member TLS etcd on loopback (`EtcdTestCluster`). K pooled handles
//! are built the way the controller's pool builds them (`EtcdPool::get`, one per
//! workload cluster, each with its own client certificate minted from the etcd
//! CA), then one `snapshot()` is taken on each, at the controller's default
//! concurrency (10), so that every handle holds its 3 open TLS connections.
//!
//! Each K runs in a child process of its own (a fresh heap), which reports:
//! - VmRSS / VmHWM (`/proc/self/status`) before the K handles (after the etcd
//!   cluster, the harness's own handle and one warm-up handle), after building
//!   the K handles (certificates minted, no connection yet), after the first
//!   snapshot on each, and after a second (warm) round; the etcd share per
//!   handle and per connection is the growth over "before";
//! - the time to build the K handles and to take the first snapshot on each,
//!   and the process's CPU (utime + stime) for both;
//! - one warm round (a snapshot on each handle again, concurrency 10) and
//!   the median of 50 warm snapshots on one handle, one after another;
//! - the ESTABLISHED TCP connections to port 2379 and the pool's
//!   `connections_opened` after each phase: the warm round must open none.
//!
//! Run: `cargo bench --bench etcd_connections -- [K...]` (default 300 1000;
//! needs etcd on PATH).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k3s_control_plane::controller::etcd_pool::{EtcdCaPem, EtcdPool, PoolKey};
use k3s_control_plane::etcd::EtcdCluster;
use k3s_control_plane::harness::EtcdTestCluster;

use common::{clock_ticks_per_second, cpu_ticks, established_to_port, memory_kib};

/// The controller's default reconcile concurrency.
const CONCURRENCY: usize = 10;
const WARM_SAMPLES: usize = 50;
const ETCD_CLIENT_PORT: u16 = 2379;
const MEMBERS: usize = 3;

fn key(name: &str) -> PoolKey {
    PoolKey {
        namespace: "bench".into(),
        cluster: name.into(),
    }
}

/// Raise the soft limit of open files to what `k` handles need (3 sockets each).
fn raise_nofile(k: usize) {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let need = (MEMBERS * (k + 2) + 256) as u64;
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    if soft < need {
        let target = need.min(hard);
        setrlimit(Resource::RLIMIT_NOFILE, target, hard).expect("setrlimit");
        assert!(
            target >= need,
            "open files limited to {hard}, {k} handles need {need}"
        );
    }
}

struct Phase {
    rss: u64,
    hwm: u64,
    established: usize,
    opened: u64,
}

fn phase(pool: &EtcdPool) -> Phase {
    let pid = std::process::id();
    let (rss, hwm) = memory_kib(pid);
    Phase {
        rss,
        hwm,
        established: established_to_port(pid, ETCD_CLIENT_PORT).len(),
        opened: pool.connections_opened(),
    }
}

fn cpu_seconds() -> f64 {
    cpu_ticks(std::process::id()) as f64 / clock_ticks_per_second() as f64
}

async fn snapshot_all(handles: &[Arc<EtcdCluster>]) {
    let mut results = futures::stream::iter(handles.iter().cloned())
        .map(|h| async move { h.snapshot().await })
        .buffer_unordered(CONCURRENCY);
    while let Some(result) = results.next().await {
        let snap = result.expect("snapshot");
        assert_eq!(snap.members.len(), MEMBERS, "members in the snapshot");
        assert!(
            snap.members.iter().all(|m| m.probe_error.is_none()),
            "every member healthy: {:?}",
            snap.members
        );
    }
}

/// One K in this (child) process; prints a human block and a `RESULT` line.
async fn child(k: usize) {
    raise_nofile(k);
    let cluster = EtcdTestCluster::start(MEMBERS).await.expect("start etcd");
    let seeds = cluster.endpoints();
    let ca = EtcdCaPem {
        cert_field: "bench/etcd[tls.crt]",
        cert: cluster.ca_pem().as_bytes(),
        key_field: "bench/etcd[tls.key]",
        key: cluster.ca_key_pem().as_bytes(),
        secret_version: "1",
    };
    let pool = EtcdPool::default();

    // Warm-up: one handle through every code path once (lazy statics, the
    // runtime's blocking pool), kept, so that "before" holds it.
    let warm = pool
        .get(&key("warm-up"), &ca, &seeds)
        .expect("warm-up handle");
    warm.snapshot().await.expect("warm-up snapshot");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = phase(&pool);

    let cpu0 = cpu_seconds();
    let t = Instant::now();
    let handles: Vec<Arc<EtcdCluster>> = (0..k)
        .map(|i| {
            pool.get(&key(&format!("c{i}")), &ca, &seeds)
                .expect("handle")
        })
        .collect();
    let build = t.elapsed();
    let built = phase(&pool);

    let t = Instant::now();
    snapshot_all(&handles).await;
    let first = t.elapsed();
    let cpu_first = cpu_seconds() - cpu0;
    let after_first = phase(&pool);

    let t = Instant::now();
    snapshot_all(&handles).await;
    let warm_round = t.elapsed();
    let mut samples = Vec::with_capacity(WARM_SAMPLES);
    for _ in 0..WARM_SAMPLES {
        let t = Instant::now();
        handles[0].snapshot().await.expect("warm snapshot");
        samples.push(t.elapsed());
    }
    samples.sort();
    let warm_median = samples[samples.len() / 2];
    let warm_p90 = samples[samples.len() * 9 / 10];
    let after_warm = phase(&pool);

    let connections = (MEMBERS * k) as f64;
    let per = |p: &Phase, n: f64| p.rss.saturating_sub(before.rss) as f64 / n;
    println!(
        "K = {k} handles, {connections} connections (pid {})",
        std::process::id()
    );
    for (name, p) in [
        ("before", &before),
        ("handles built", &built),
        ("first snapshot", &after_first),
        ("warm round", &after_warm),
    ] {
        println!(
            "  {name:<15} VmRSS {:>8.1} MiB  VmHWM {:>8.1} MiB  established to :2379 {:>5}  opened {:>5}",
            p.rss as f64 / 1024.0,
            p.hwm as f64 / 1024.0,
            p.established,
            p.opened
        );
    }
    println!(
        "  per handle before connecting: {:.1} KiB; per connection after first snapshot: {:.1} KiB, after warm round: {:.1} KiB ({:.1} KiB per handle)",
        per(&built, k as f64),
        per(&after_first, connections),
        per(&after_warm, connections),
        per(&after_warm, k as f64),
    );
    println!(
        "  build {:.2} s + first snapshot {:.2} s = {:.2} s (CPU {:.2} s); warm round {:.2} s; one warm snapshot: median {:.2} ms, p90 {:.2} ms",
        build.as_secs_f64(),
        first.as_secs_f64(),
        (build + first).as_secs_f64(),
        cpu_first,
        warm_round.as_secs_f64(),
        warm_median.as_secs_f64() * 1e3,
        warm_p90.as_secs_f64() * 1e3,
    );
    let new_in_warm = after_warm.opened - after_first.opened;
    println!(
        "  connections opened in the warm round: {new_in_warm} (pool counter), established {} -> {}",
        after_first.established, after_warm.established
    );
    println!(
        "RESULT {k} {:.1} {:.1} {:.1} {:.2} {:.2} {:.2} {:.2} {:.2} {} {:.1} {:.1}",
        per(&built, k as f64),
        per(&after_first, connections),
        per(&after_warm, connections),
        build.as_secs_f64(),
        first.as_secs_f64(),
        cpu_first,
        warm_round.as_secs_f64(),
        warm_median.as_secs_f64() * 1e3,
        new_in_warm,
        after_warm.rss as f64 / 1024.0,
        after_warm.hwm as f64 / 1024.0,
    );
    assert_eq!(
        after_first.opened,
        before.opened + (MEMBERS * k) as u64,
        "one connection per member and handle"
    );
    assert_eq!(new_in_warm, 0, "the warm round opened connections");
    assert_eq!(
        after_warm.established, after_first.established,
        "established connections changed in the warm round"
    );
    drop(handles);
    drop(warm);
}

fn main() {
    k3s_control_plane::install_crypto_provider();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list" || a == "--test") {
        return; // `cargo test --benches` / tooling probes: nothing to list.
    }
    if let Some(i) = args.iter().position(|a| a == "--child") {
        let k: usize = args
            .get(i + 1)
            .and_then(|k| k.parse().ok())
            .expect("--child K");
        tokio::runtime::Runtime::new()
            .expect("runtime")
            .block_on(child(k));
        return;
    }
    let mut ks: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
    if ks.is_empty() {
        ks = vec![300, 1000];
    }
    let exe = std::env::current_exe().expect("current exe");
    let mut rows = Vec::new();
    for k in ks {
        let out = std::process::Command::new(&exe)
            .args(["--child", &k.to_string()])
            .stderr(std::process::Stdio::inherit())
            .output()
            .expect("run child");
        let text = String::from_utf8_lossy(&out.stdout);
        for line in text.lines().filter(|l| !l.starts_with("RESULT ")) {
            println!("{line}");
        }
        assert!(out.status.success(), "K = {k}: child failed");
        if let Some(line) = text.lines().find(|l| l.starts_with("RESULT ")) {
            rows.push(line.trim_start_matches("RESULT ").to_string());
        }
    }
    println!();
    println!(
        "| K | KiB per handle, unconnected | KiB per connection, first snapshot | KiB per connection, warm | build + first snapshot (CPU) | warm round | warm snapshot (median) | new connections, warm round | VmRSS / VmHWM |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for row in rows {
        let f: Vec<&str> = row.split_whitespace().collect();
        println!(
            "| {} | {} | {} | {} | {} + {} s ({} s) | {} s | {} ms | {} | {} / {} MiB |",
            f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], f[10], f[11]
        );
    }
}
