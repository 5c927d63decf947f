//! Leader election between real `k3s-control-plane run` processes against one
//! management API (the in-process test API server): exactly one replica holds
//! the Lease and reconciles; a killed leader is replaced within the lease
//! duration; a paused leader that comes back after losing its Lease writes
//! nothing; `--leader-elect=false` reconciles without a Lease; SIGTERM or
//! SIGINT at any moment of start-up or leadership ends the process within
//! 1 s, the Lease released.
//!
//! Short timings: lease duration 3 s, renew deadline 2 s (renewal every 1 s).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k3s_control_plane::api::KThreesControlPlane;
use k3s_control_plane::apiserver::TestApiServer;
use k3s_control_plane::harness::sandbox::management_server;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const LEASE: &str = "k3s-control-plane";
const LEASE_DURATION: Duration = Duration::from_secs(3);

/// One `run` process; killed when dropped.
struct Replica {
    name: String,
    child: Child,
    probes: String,
    log: PathBuf,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Replica {
    fn start(server: &TestApiServer, dir: &tempfile::TempDir, name: &str, extra: &[&str]) -> Self {
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            k3s_control_plane::yaml::to_string(&server.kubeconfig()).unwrap(),
        )
        .unwrap();
        let probes = format!("127.0.0.1:{}", free_port());
        let log = dir.path().join(format!("{name}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_k3s-control-plane"))
            .args([
                "run",
                "--kubeconfig",
                kubeconfig.to_str().unwrap(),
                "--probe-address",
                &probes,
                "--leader-election-namespace",
                "default",
                "--leader-election-lease-duration",
                "3s",
                "--leader-election-renew-deadline",
                "2s",
            ])
            .args(extra)
            .env("POD_NAME", name)
            .env_remove("POD_NAMESPACE")
            .env(
                "RUST_LOG",
                "warn,k3s_control_plane::controller=info,k3s_control_plane::cli::run=info",
            )
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Replica {
            name: name.into(),
            child,
            probes,
            log,
        }
    }

    fn logs(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(40).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        format!("--- {} log (tail) ---\n{}", self.name, tail.join("\n"))
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    /// `k3scp_leader` and `k3scp_reconciles_total`, once /metrics answers.
    async fn gauges(&self) -> Option<(i64, u64)> {
        let (_, body) = get(&self.probes, "/metrics").await?;
        let value = |name: &str| {
            body.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse::<f64>().ok())
        };
        Some((
            value("k3scp_leader ")? as i64,
            value("k3scp_reconciles_total ")? as u64,
        ))
    }

    async fn readyz(&self) -> Option<(u16, String)> {
        get(&self.probes, "/readyz").await
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Status code and body of GET `path`, or None while nothing listens.
async fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: probes\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let code = response.get(9..12)?.parse().ok()?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((code, body))
}

/// Polls `check` every 50 ms until it returns Some, or panics after `within`
/// with `explain()`.
async fn until<T, F, Fut>(
    within: Duration,
    what: &str,
    mut check: F,
    explain: impl Fn() -> String,
) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{what} within {within:?}\n{}",
            explain()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn holder(leases: &Api<Lease>) -> Option<String> {
    leases
        .get_opt(LEASE)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
}

async fn create_kcp(server: &TestApiServer) -> Api<KThreesControlPlane> {
    let kcp: KThreesControlPlane = serde_json::from_value(serde_json::json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta3", "kind": "KThreesControlPlane",
        "metadata": {"name": "cp", "namespace": "default"},
        "spec": {"replicas": 1, "version": "v1.30.2+k3s2",
                 "machineTemplate": {"spec": {"infrastructureRef": {"kind": "DockerMachineTemplate", "name": "t"}}}}
    }))
    .unwrap();
    let kcps: Api<KThreesControlPlane> = Api::namespaced(server.client(), "default");
    kcps.create(&Default::default(), &kcp).await.unwrap();
    kcps
}

/// A change to the KThreesControlPlane: whoever leads reconciles it at once.
async fn touch(kcps: &Api<KThreesControlPlane>, n: usize) {
    kcps.patch(
        "cp",
        &PatchParams::default(),
        &Patch::Merge(
            serde_json::json!({"metadata": {"annotations": {"test/touch": n.to_string()}}}),
        ),
    )
    .await
    .unwrap();
}

/// The Events the controller published: name -> reporting instance.
async fn reporters(server: &TestApiServer) -> std::collections::BTreeMap<String, String> {
    let events: Api<Event> = Api::namespaced(server.client(), "default");
    events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reporting_controller.as_deref() == Some("k3s-control-plane"))
        .map(|e| {
            (
                e.metadata.name.unwrap_or_default(),
                e.reporting_instance.unwrap_or_default(),
            )
        })
        .collect()
}

/// Starts `name` and waits until it leads (gauge 1, Lease holder).
async fn start_leader(server: &TestApiServer, dir: &tempfile::TempDir, name: &str) -> Replica {
    let leases: Api<Lease> = Api::namespaced(server.client(), "default");
    let replica = Replica::start(server, dir, name, &[]);
    until(
        Duration::from_secs(20),
        &format!("{name} leads"),
        || async {
            let leads = replica.gauges().await.is_some_and(|(l, _)| l == 1);
            (leads && holder(&leases).await.as_deref() == Some(name)).then_some(())
        },
        || replica.logs(),
    )
    .await;
    replica
}

/// Starts `name` and waits until it is a Ready standby.
async fn start_standby(server: &TestApiServer, dir: &tempfile::TempDir, name: &str) -> Replica {
    let replica = Replica::start(server, dir, name, &[]);
    until(
        Duration::from_secs(20),
        &format!("{name} is a ready standby"),
        || async {
            let (code, body) = replica.readyz().await?;
            let standby = replica.gauges().await.is_some_and(|(l, _)| l == 0);
            (code == 200 && standby && body.contains("standby")).then_some(body)
        },
        || replica.logs(),
    )
    .await;
    replica
}

#[tokio::test]
async fn exactly_one_of_two_replicas_holds_the_lease_and_only_it_reconciles() {
    let server = management_server().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let leases: Api<Lease> = Api::namespaced(server.client(), "default");
    let a = start_leader(&server, &dir, "replica-a").await;
    let b = start_standby(&server, &dir, "replica-b").await;
    let explain = || format!("{}\n{}", a.logs(), b.logs());
    let (_, body) = b.readyz().await.unwrap();
    assert!(body.contains("held by replica-a"), "{body}");
    let (_, body) = a.readyz().await.unwrap();
    assert!(body.contains("leader: replica-a"), "{body}");

    let kcps = create_kcp(&server).await;
    until(
        Duration::from_secs(20),
        "replica-a reconciles",
        || async { a.gauges().await.filter(|(_, r)| *r >= 1) },
        explain,
    )
    .await;
    let transitions = leases
        .get(LEASE)
        .await
        .unwrap()
        .spec
        .unwrap()
        .lease_transitions;

    // Over three lease durations of changes to the object (each one would be
    // reconciled at once by a leader), the Lease stays with replica-a, which
    // keeps reconciling, and replica-b never reconciles.
    let window = Instant::now() + 3 * LEASE_DURATION;
    let mut n = 0;
    let before = a.gauges().await.unwrap().1;
    while Instant::now() < window {
        n += 1;
        touch(&kcps, n).await;
        let (a_leads, _) = a.gauges().await.unwrap();
        let (b_leads, b_reconciles) = b.gauges().await.unwrap();
        assert_eq!((a_leads, b_leads, b_reconciles), (1, 0, 0), "{}", explain());
        assert_eq!(holder(&leases).await.as_deref(), Some("replica-a"));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let after = a.gauges().await.unwrap().1;
    assert!(
        after > before,
        "the leader kept reconciling: {before} -> {after}"
    );
    let lease = leases.get(LEASE).await.unwrap().spec.unwrap();
    assert_eq!(lease.lease_transitions, transitions, "no handover happened");
    assert_eq!(lease.lease_duration_seconds, Some(3));
    // Every Event came from the leader.
    let reporters = reporters(&server).await;
    assert!(!reporters.is_empty());
    assert!(
        reporters.values().all(|r| r == "replica-a"),
        "{reporters:?}"
    );
}

#[tokio::test]
async fn a_killed_leader_is_replaced_within_the_lease_duration() {
    let server = management_server().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let leases: Api<Lease> = Api::namespaced(server.client(), "default");
    let kcps = create_kcp(&server).await;
    let mut a = start_leader(&server, &dir, "replica-a").await;
    let b = start_standby(&server, &dir, "replica-b").await;
    until(
        Duration::from_secs(20),
        "replica-a reconciles",
        || async { a.gauges().await.filter(|(_, r)| *r >= 1) },
        || a.logs(),
    )
    .await;
    assert_eq!(b.gauges().await.unwrap(), (0, 0));

    // kill -9: no release; the other replica waits for the Lease to expire.
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    let killed = Instant::now();
    until(
        LEASE_DURATION + Duration::from_secs(3),
        "replica-b takes over",
        || async { b.gauges().await.filter(|(l, _)| *l == 1) },
        || b.logs(),
    )
    .await;
    let takeover = killed.elapsed();
    eprintln!("takeover after kill -9: {takeover:?} (lease duration {LEASE_DURATION:?})");
    assert_eq!(holder(&leases).await.as_deref(), Some("replica-b"));
    // The new leader reconciles, and its Events say so.
    touch(&kcps, 1).await;
    until(
        Duration::from_secs(20),
        "replica-b reconciles",
        || async { b.gauges().await.filter(|(_, r)| *r >= 1) },
        || b.logs(),
    )
    .await;
    let (_, body) = b.readyz().await.unwrap();
    assert!(body.contains("leader: replica-b"), "{body}");
}

#[tokio::test]
async fn a_terminated_leader_releases_the_lease_for_a_quick_handover() {
    let server = management_server().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let leases: Api<Lease> = Api::namespaced(server.client(), "default");
    let mut a = start_leader(&server, &dir, "replica-a").await;
    let b = start_standby(&server, &dir, "replica-b").await;

    // SIGTERM (what Kubernetes sends): the controller stops, then the Lease is
    // released, and the process exits 0.
    kill(a.pid(), Signal::SIGTERM).unwrap();
    let terminated = Instant::now();
    let a_log = a.log.clone();
    let status = until(
        Duration::from_secs(10),
        "replica-a exits",
        || {
            let status = a.child.try_wait().unwrap();
            async move { status }
        },
        || std::fs::read_to_string(&a_log).unwrap_or_default(),
    )
    .await;
    assert!(status.success(), "{status:?}\n{}", a.logs());
    assert!(
        a.logs().contains("released the leader lease"),
        "{}",
        a.logs()
    );
    until(
        LEASE_DURATION + Duration::from_secs(3),
        "replica-b takes over",
        || async { b.gauges().await.filter(|(l, _)| *l == 1) },
        || b.logs(),
    )
    .await;
    let takeover = terminated.elapsed();
    eprintln!("takeover after SIGTERM: {takeover:?}");
    // Released, the Lease is taken at the standby's next look (every renew
    // interval, 1 s here), not when it would have expired.
    assert!(
        takeover < Duration::from_secs(2),
        "{takeover:?}\n{}",
        b.logs()
    );
    assert_eq!(holder(&leases).await.as_deref(), Some("replica-b"));
}

#[tokio::test]
async fn a_paused_leader_that_lost_its_lease_acts_no_more_when_it_resumes() {
    let server = management_server().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let leases: Api<Lease> = Api::namespaced(server.client(), "default");
    let kcps = create_kcp(&server).await;
    let a = start_leader(&server, &dir, "replica-a").await;
    let b = start_standby(&server, &dir, "replica-b").await;
    until(
        Duration::from_secs(20),
        "replica-a reconciles",
        || async { a.gauges().await.filter(|(_, r)| *r >= 1) },
        || a.logs(),
    )
    .await;

    // Freeze the leader (a long GC pause, a stopped VM): its renewals stop,
    // replica-b takes the Lease.
    kill(a.pid(), Signal::SIGSTOP).unwrap();
    until(
        LEASE_DURATION + Duration::from_secs(3),
        "replica-b takes over from the frozen leader",
        || async { b.gauges().await.filter(|(l, _)| *l == 1) },
        || b.logs(),
    )
    .await;
    // Changes pile up for whoever leads.
    touch(&kcps, 1).await;
    let events_before = reporters(&server).await;

    // The old leader wakes up with work in its queue: its guard ran out long
    // ago, so it starts nothing, writes nothing, and does not take the Lease back.
    kill(a.pid(), Signal::SIGCONT).unwrap();
    let (_, a_reconciles) = until(
        Duration::from_secs(5),
        "replica-a says it no longer leads",
        || async { a.gauges().await.filter(|(l, _)| *l == 0) },
        || a.logs(),
    )
    .await;
    let window = Instant::now() + 2 * LEASE_DURATION;
    let mut n = 1;
    while Instant::now() < window {
        n += 1;
        touch(&kcps, n).await;
        let (a_leads, a_now) = a.gauges().await.unwrap();
        assert_eq!((a_leads, a_now), (0, a_reconciles), "{}", a.logs());
        assert_eq!(holder(&leases).await.as_deref(), Some("replica-b"));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    until(
        Duration::from_secs(20),
        "replica-b reconciles",
        || async { b.gauges().await.filter(|(_, r)| *r >= 1) },
        || b.logs(),
    )
    .await;
    // Any Event published since the freeze is replica-b's.
    let reporters = reporters(&server).await;
    assert!(
        reporters
            .iter()
            .filter(|(name, _)| !events_before.contains_key(*name))
            .all(|(_, r)| r == "replica-b"),
        "{reporters:?}"
    );
}

#[tokio::test]
async fn without_leader_election_it_reconciles_without_a_lease() {
    let server = management_server().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let leases: Api<Lease> = Api::namespaced(server.client(), "default");
    let _kcps = create_kcp(&server).await;
    let a = Replica::start(&server, &dir, "replica-a", &["--leader-elect=false"]);
    until(
        Duration::from_secs(20),
        "replica-a reconciles",
        || async { a.gauges().await.filter(|(l, r)| *l == 1 && *r >= 1) },
        || a.logs(),
    )
    .await;
    let (code, body) = a.readyz().await.unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("leader election disabled"), "{body}");
    assert!(
        leases
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "no Lease without election"
    );
}

/// When a replica is told to stop, relative to its start.
#[derive(Clone, Copy, Debug)]
enum Moment {
    /// Right after the process is spawned (before its runtime may even run).
    Spawned,
    /// When it logs "leader election": the election is about to start.
    ElectionStarts,
    /// While it waits as a standby for a Lease another holder keeps.
    Standby,
    /// This long after it logs "leading: starting the controller" (the
    /// controller's caches sync, its first reconciles run, then steady state).
    Leading(Duration),
}

/// What one stop looked like.
struct Stop {
    moment: Moment,
    signal: Signal,
    /// From the signal to the process's end, if it ended within the budget.
    exited_after: Option<Duration>,
    status: Option<std::process::ExitStatus>,
    holder: Option<String>,
    log: String,
}

/// How long a replica may take to end once told to (issue 30).
const STOP_BUDGET: Duration = Duration::from_secs(1);

/// Polls `replica`'s log until a line contains `text`; the instant it was seen.
async fn log_line(replica: &Replica, text: &str) -> Instant {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if std::fs::read_to_string(&replica.log).is_ok_and(|l| l.contains(text)) {
            return Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "{text:?} logged within 20 s\n{}",
            replica.logs()
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Starts a replica on its own Lease, sends `signal` at `moment` and waits at
/// most [`STOP_BUDGET`] for it to end.
async fn stop_at(
    server: &TestApiServer,
    dir: &tempfile::TempDir,
    n: usize,
    moment: Moment,
    signal: Signal,
) -> Stop {
    let leases: Api<Lease> = Api::namespaced(server.client(), "default");
    let lease = format!("stop-{n}");
    if let Moment::Standby = moment {
        // Another holder keeps the Lease for an hour: the replica can only wait.
        let held: Lease = serde_json::from_value(serde_json::json!({
            "metadata": {"name": lease, "namespace": "default"},
            "spec": {"holderIdentity": "someone-else", "leaseDurationSeconds": 3600,
                     "acquireTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                         k8s_openapi::jiff::Timestamp::now()),
                     "renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                         k8s_openapi::jiff::Timestamp::now())}
        }))
        .unwrap();
        leases.create(&Default::default(), &held).await.unwrap();
    }
    let name = format!("stopped-{n}");
    let mut replica = Replica::start(
        server,
        dir,
        &name,
        &[&format!("--leader-election-lease-name={lease}")],
    );
    match moment {
        Moment::Spawned => {}
        Moment::ElectionStarts => {
            log_line(&replica, "leader election").await;
        }
        Moment::Standby => {
            log_line(&replica, "\"someone-else\"").await;
        }
        Moment::Leading(after) => {
            let seen = log_line(&replica, "leading: starting the controller").await;
            tokio::time::sleep_until((seen + after).into()).await;
        }
    }
    kill(replica.pid(), signal).unwrap();
    let sent = Instant::now();
    let mut exited_after = None;
    let mut status = None;
    while sent.elapsed() < STOP_BUDGET {
        if let Some(s) = replica.child.try_wait().unwrap() {
            exited_after = Some(sent.elapsed());
            status = Some(s);
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let log = replica.logs();
    // Still running: killed here, so the Lease read below is what it left.
    drop(replica);
    let holder = leases
        .get_opt(&lease)
        .await
        .unwrap()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity);
    Stop {
        moment,
        signal,
        exited_after,
        status,
        holder,
        log,
    }
}

/// SIGTERM or SIGINT, at every moment of a replica's start-up and leadership:
/// it exits within [`STOP_BUDGET`], with success, and leaves the Lease
/// released (another holder's Lease untouched). Run against two management
/// APIs: one serving our CRDs (the controller's caches sync in a few
/// milliseconds, its first reconciles run) and one without them (its caches
/// never sync, as while the CRDs are not installed yet or not readable).
#[tokio::test]
async fn a_replica_told_to_stop_at_any_moment_exits_within_a_second_and_releases_the_lease() {
    let server = management_server().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    // Work for the controller's first moments: caches to fill, reconciles to run.
    let kcps: Api<KThreesControlPlane> = Api::namespaced(server.client(), "default");
    for i in 0..20 {
        let kcp: KThreesControlPlane = serde_json::from_value(serde_json::json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta3", "kind": "KThreesControlPlane",
            "metadata": {"name": format!("cp-{i}"), "namespace": "default"},
            "spec": {"replicas": 1, "version": "v1.30.2+k3s2",
                     "machineTemplate": {"spec": {"infrastructureRef": {"kind": "DockerMachineTemplate", "name": "t"}}}}
        }))
        .unwrap();
        kcps.create(&Default::default(), &kcp).await.unwrap();
    }
    let without_crds = TestApiServer::builder()
        .with_core_resources()
        .start()
        .await
        .unwrap();
    let without_crds_dir = tempfile::tempdir().unwrap();

    let ms = Duration::from_millis;
    let (term, int) = (Signal::SIGTERM, Signal::SIGINT);
    let with_crds = [
        (Moment::Spawned, term),
        (Moment::ElectionStarts, term),
        (Moment::Standby, term),
        (Moment::Leading(ms(0)), term),
        (Moment::Leading(ms(10)), term),
        (Moment::Leading(ms(50)), term),
        (Moment::Leading(ms(150)), term),
        (Moment::Leading(ms(300)), term),
        (Moment::Leading(ms(1000)), term),
        (Moment::Leading(ms(3000)), term),
        (Moment::ElectionStarts, int),
        (Moment::Leading(ms(50)), int),
        (Moment::Leading(ms(1000)), int),
    ];
    let caches_never_sync = [
        (Moment::Leading(ms(0)), term),
        (Moment::Leading(ms(300)), term),
        (Moment::Leading(ms(1000)), term),
        (Moment::Leading(ms(3000)), term),
        (Moment::Leading(ms(300)), int),
    ];
    let mut stops = Vec::new();
    for (n, (moment, signal)) in with_crds.into_iter().enumerate() {
        let stop = stop_at(&server, &dir, n, moment, signal).await;
        stops.push(("CRDs served", stop));
    }
    for (n, (moment, signal)) in caches_never_sync.into_iter().enumerate() {
        let stop = stop_at(&without_crds, &without_crds_dir, n, moment, signal).await;
        stops.push(("no CRDs", stop));
    }
    let mut failures = Vec::new();
    for (api, stop) in &stops {
        let exited = match stop.exited_after {
            Some(d) => format!("exited after {d:?} ({:?})", stop.status.unwrap()),
            None => format!("still running after {STOP_BUDGET:?}"),
        };
        let line = format!(
            "{api}: {:?} at {:?}: {exited}; Lease holder {:?}",
            stop.signal, stop.moment, stop.holder
        );
        eprintln!("{line}");
        let status_ok = stop.status.is_some_and(|s| {
            use std::os::unix::process::ExitStatusExt;
            // Before its handlers are installed the signal's default action
            // ends the process; after, it ends by itself, with success.
            s.success() || (matches!(stop.moment, Moment::Spawned) && s.signal().is_some())
        });
        let holder_ok = match stop.moment {
            Moment::Standby => stop.holder.as_deref() == Some("someone-else"),
            _ => stop.holder.is_none(),
        };
        if !(status_ok && holder_ok) {
            failures.push(format!("{line}\n{}", stop.log));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
