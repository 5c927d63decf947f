//! Leader election between real `k3s-control-plane run` processes against one
//! management API (the in-process test API server): exactly one replica holds
//! the Lease and reconciles; a killed leader is replaced within the lease
//! duration; a paused leader that comes back after losing its Lease writes
//! nothing; `--leader-elect=false` reconciles without a Lease.
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
            serde_yaml::to_string(&server.kubeconfig()).unwrap(),
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
                "warn,k3s_control_plane::controller::leader=info,k3s_control_plane::controller=info",
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
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta2", "kind": "KThreesControlPlane",
        "metadata": {"name": "cp", "namespace": "default"},
        "spec": {"replicas": 1, "version": "v1.30.2+k3s2",
                 "machineTemplate": {"infrastructureRef": {"kind": "DockerMachineTemplate", "name": "t"}}}
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
