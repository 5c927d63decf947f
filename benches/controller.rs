//! The controller end to end (harness):
//!
//! - remediation latency: on a fresh sandbox (real 3-member TLS etcd on
//!   loopback, management and workload test API servers, CAPI's deletion
//!   simulated) the controller is started and has reconciled once; then the
//!   etcd leader's Machine is marked as a MachineHealthCheck does, and we time
//!   mark -> member removed (etcd polled), mark -> Machine gone and mark ->
//!   replacement created (both from a Machine watch). Marked once right after
//!   the first reconcile (what a user sees on a just-started cluster, etcd's
//!   5 s start-up guard on reconfiguration included) and once when the
//!   cluster is more than 6 s old (the controller's own time); and a
//!   follower's Machine, > 6 s old (no leadership move).
//! - memory: the `k3s-control-plane run` binary in its own process against a
//!   management test API server: VmRSS idle (no objects), then, in a second
//!   process, with 100 KThreesControlPlanes (+ Clusters, 300 Machines, one
//!   workload test API server with 3 Nodes per cluster, no `<cluster>-etcd`
//!   Secret so etcd is not managed) once every one has a status, and VmHWM.
//!
//! Run: `cargo bench --bench controller` (needs etcd on PATH).

mod common;

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use etcd_client::{Certificate, ConnectOptions, Identity, TlsOptions};
use futures::{StreamExt, TryStreamExt};
use k3s_control_plane::api::condition_names::ETCD_CLUSTER_HEALTHY;
use k3s_control_plane::api::names::{
    CLUSTER_NAME_LABEL, CONTROL_PLANE_LABEL, CONTROL_PLANE_NAME_LABEL,
    NODE_ROLE_CONTROL_PLANE_LABEL,
};
use k3s_control_plane::api::{KThreesControlPlane, Machine};
use k3s_control_plane::apiserver::TestApiServer;
use k3s_control_plane::harness::sandbox::{
    KCP, Sandbox, VERSION, cluster_object, kcp_object, management_server, mark_initialized,
};
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tokio::time::Instant;

use common::{ControllerProcess, mib};

const ITERATIONS: usize = 5;
/// etcd refuses member removal until its peers have been connected for 5 s.
const GUARD_AGE: Duration = Duration::from_secs(6);
const LIMIT: Duration = Duration::from_secs(60);
/// Pause between member-list reads while waiting for the removal.
const ETCD_POLL: Duration = Duration::from_millis(5);
const FLEET: usize = 100;
const NAMESPACE: &str = "default";

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn min_median_max(mut samples: Vec<Duration>) -> (Duration, Duration, Duration) {
    samples.sort();
    (
        samples[0],
        samples[samples.len() / 2],
        samples[samples.len() - 1],
    )
}

// ---------------------------------------------------------------- remediation

/// Which member's Machine the MHC marks.
#[derive(Clone, Copy, PartialEq)]
enum Target {
    /// The leader: leadership is moved off before the removal.
    Leader,
    /// A follower: no leadership move.
    Follower,
}

/// One remediation, times from the mark.
struct Timeline {
    member_removed: Duration,
    machine_gone: Duration,
    replacement: Duration,
    /// How long after the sandbox was up the mark came.
    age_at_mark: Duration,
}

/// Raft timing of the bench's etcd: `K3SCP_BENCH_RAFT=500,5000` runs at k3s's
/// own (heartbeat 500 ms, election 5000 ms); unset: the harness's 100/1500 ms.
fn raft_timing() -> Option<(u32, u32)> {
    let text = std::env::var("K3SCP_BENCH_RAFT").ok()?;
    let (heartbeat, election) = text.split_once(',')?;
    Some((
        heartbeat.trim().parse().ok()?,
        election.trim().parse().ok()?,
    ))
}

/// `K3SCP_BENCH_ONLY_REMEDIATION=1`: skip the fleet (memory) part.
fn only_remediation() -> bool {
    std::env::var_os("K3SCP_BENCH_ONLY_REMEDIATION").is_some()
}

/// `backup`: with `spec.etcdBackup` on a directory target, so the removal
/// waits for its snapshot first.
async fn remediate_once(target_kind: Target, aged: bool, backup: bool) -> Timeline {
    let mut etcd = k3s_control_plane::harness::EtcdTestCluster::builder().members(3);
    if let Some((heartbeat, election)) = raft_timing() {
        etcd = etcd.raft_timing(heartbeat, election);
    }
    let sandbox = Sandbox::start_with(etcd, 3).await.expect("sandbox");
    let up = Instant::now();
    let admin = sandbox.etcd.connect();
    let snapshot = admin.snapshot().await.expect("snapshot");
    let leader = snapshot.leader.expect("a leader");
    let target_member = match target_kind {
        Target::Leader => leader,
        Target::Follower => {
            snapshot
                .members
                .iter()
                .find(|m| m.id != leader)
                .expect("a follower")
                .id
        }
    };
    let index = sandbox.etcd.index_of(target_member).expect("member index");
    let target = sandbox.machines[index].clone();
    let member_name = sandbox.etcd.member(index).name.clone();

    let snapshots = tempfile::tempdir().expect("snapshot directory");
    if backup {
        sandbox
            .kcp_api()
            .patch(
                KCP,
                &PatchParams::default(),
                &Patch::Merge(&serde_json::json!({"spec": {"etcdBackup": {
                    "target": {"filesystem": {"path": snapshots.path()}}}}})),
            )
            .await
            .expect("spec.etcdBackup");
    }
    let controller = sandbox.start_controller();
    sandbox
        .wait_for("a first reconcile (etcd healthy)", LIMIT, || async {
            let kcp = sandbox
                .kcp_api()
                .get(KCP)
                .await
                .map_err(|e| e.to_string())?;
            let healthy = kcp.status.as_ref().and_then(|s| {
                k3s_control_plane::api::conditions::get(&s.conditions, ETCD_CLUSTER_HEALTHY)
            });
            match healthy {
                Some(c) if c.status == "True" => Ok(()),
                other => Err(format!("{ETCD_CLUSTER_HEALTHY}: {other:?}")),
            }
        })
        .await
        .expect("steady");
    if aged {
        tokio::time::sleep_until(up + GUARD_AGE).await;
    }

    // Observers, ready before the mark.
    let originals: HashSet<String> = sandbox.machines.iter().cloned().collect();
    let (watch_ready, watching) = tokio::sync::oneshot::channel();
    let machines = sandbox.machines_api();
    let watched = target.clone();
    let machine_times = tokio::spawn(async move {
        let mut events = watcher::watcher(machines, watcher::Config::default()).boxed();
        let mut ready = Some(watch_ready);
        let (mut gone, mut created) = (None, None);
        while let Some(event) = events.next().await {
            let now = Instant::now();
            match event {
                Ok(Event::InitDone) => {
                    if let Some(ready) = ready.take() {
                        let _ = ready.send(());
                    }
                }
                Ok(Event::Delete(m)) if m.name_any() == watched => {
                    gone.get_or_insert(now);
                }
                Ok(Event::Apply(m)) if !originals.contains(&m.name_any()) => {
                    created.get_or_insert(now);
                }
                _ => {}
            }
            if let (Some(gone), Some(created)) = (gone, created) {
                return (gone, created);
            }
        }
        panic!("the Machine watch ended");
    });
    watching.await.expect("Machine watch started");
    // Membership is read from a member that stays, with the member list
    // only: the removed member stops answering, and a full snapshot (which
    // asks every listed member) can stall on it just as it goes.
    let stays = sandbox
        .etcd
        .member((0..3).find(|&i| i != index).expect("another member"));
    let read = |path: &Path| std::fs::read(path).expect("harness PKI file");
    let tls = TlsOptions::new()
        .ca_certificate(Certificate::from_pem(read(sandbox.etcd.ca_cert_path())))
        .identity(Identity::from_pem(
            read(sandbox.etcd.client_cert_path()),
            read(sandbox.etcd.client_key_path()),
        ))
        .domain_name(stays.ip.to_string());
    let mut poller = etcd_client::Client::connect(
        [stays.client_url()],
        Some(ConnectOptions::new().with_tls(tls)),
    )
    .await
    .expect("etcd client");
    poller.member_list().await.expect("warm the poller");

    let marked = Instant::now();
    sandbox.mark_unhealthy(&target).await.expect("mark");
    let member_removed = async {
        loop {
            // The read that first misses the member was served just after it
            // started: time its start.
            let asked = Instant::now();
            if let Ok(list) = poller.member_list().await
                && list.members().iter().all(|m| m.name() != member_name)
            {
                return asked;
            }
            tokio::time::sleep(ETCD_POLL).await;
        }
    };
    let (removed, machine_times) =
        tokio::time::timeout(LIMIT, futures::future::join(member_removed, machine_times))
            .await
            .unwrap_or_else(|_| panic!("remediation of {target} not done within {LIMIT:?}"));
    let (gone, created) = machine_times.expect("Machine watch task");
    controller.stop().await;
    Timeline {
        member_removed: removed - marked,
        machine_gone: gone - marked,
        replacement: created - marked,
        age_at_mark: marked - up,
    }
}

struct Scenario {
    name: &'static str,
    runs: Vec<Timeline>,
}

/// etcd's own floor for the leader's removal at the same raft timing: on a
/// cluster past etcd's 5 s reconfiguration guard, the raw operations through
/// our engine (move leadership off the leader, remove its member, confirmed),
/// with no controller, API server or drain around them.
async fn etcd_floor() -> Vec<Duration> {
    let mut runs = Vec::new();
    for _ in 0..ITERATIONS {
        let mut builder = k3s_control_plane::harness::EtcdTestCluster::builder().members(3);
        if let Some((heartbeat, election)) = raft_timing() {
            builder = builder.raft_timing(heartbeat, election);
        }
        let cluster = builder.start().await.expect("etcd cluster");
        tokio::time::sleep(GUARD_AGE).await;
        let etcd = cluster.connect();
        let leader = etcd
            .snapshot()
            .await
            .expect("snapshot")
            .leader
            .expect("a leader");
        let started = Instant::now();
        etcd.move_leader_off(leader, None)
            .await
            .expect("move leader");
        etcd.remove_member(leader).await.expect("remove member");
        runs.push(started.elapsed());
    }
    runs
}

async fn scenario(name: &'static str, target: Target, aged: bool, backup: bool) -> Scenario {
    let mut runs = Vec::new();
    for _ in 0..ITERATIONS {
        runs.push(remediate_once(target, aged, backup).await);
    }
    Scenario { name, runs }
}

/// The snapshot's own time: `backup::save` from a follower of a fresh
/// 3-member cluster (as small as the sandbox's) into a directory, with no
/// controller around it.
async fn snapshot_floor() -> Vec<Duration> {
    use k3s_control_plane::backup::{self, SnapshotName, SnapshotReason, Target, TargetConfig};
    let mut runs = Vec::new();
    for _ in 0..ITERATIONS {
        let mut builder = k3s_control_plane::harness::EtcdTestCluster::builder().members(3);
        if let Some((heartbeat, election)) = raft_timing() {
            builder = builder.raft_timing(heartbeat, election);
        }
        let cluster = builder.start().await.expect("etcd cluster");
        let etcd = cluster.connect();
        let dir = tempfile::tempdir().expect("snapshot directory");
        let target = Target::open(&TargetConfig::Filesystem {
            path: dir.path().to_path_buf(),
        })
        .expect("directory target");
        let started = Instant::now();
        let snap = etcd.snapshot().await.expect("snapshot");
        let from = k3s_control_plane::etcd::save::snapshot_source(&snap)
            .expect("a source")
            .id;
        let name = SnapshotName::ours(
            SnapshotReason::BeforeRemoval,
            "cp-1",
            std::time::SystemTime::now(),
        )
        .expect("name");
        backup::save(&etcd, &snap, from, &target, &name, LIMIT)
            .await
            .expect("save");
        runs.push(started.elapsed());
    }
    runs
}

// ---------------------------------------------------------------- memory

/// One workload cluster of the fleet: its own test API server with 3 ready
/// control-plane Nodes, and in the management server a Cluster, a kubeconfig
/// Secret, an initialized KThreesControlPlane and 3 provisioned Machines.
async fn add_cluster(management: &kube::Client, i: usize) -> TestApiServer {
    let cluster = format!("c{i:03}");
    let kcp_name = format!("{cluster}-control-plane");
    let workload = TestApiServer::builder()
        .with_core_resources()
        .start()
        .await
        .expect("workload API server");
    let nodes: Api<Node> = Api::all(workload.client());
    let node_names: Vec<String> = (0..3).map(|j| format!("{cluster}-cp-{j}")).collect();
    for (j, node) in node_names.iter().enumerate() {
        let ip = format!("10.{}.{}.{}", i / 250, i % 250, j + 10);
        let status = json!({
            "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": node}],
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]
        });
        let object: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node, "labels": {NODE_ROLE_CONTROL_PLANE_LABEL: "true"}},
        }))
        .expect("Node");
        nodes
            .create(&PostParams::default(), &object)
            .await
            .expect("create Node");
        nodes
            .patch_status(
                node,
                &PatchParams::default(),
                &Patch::Merge(&json!({ "status": status })),
            )
            .await
            .expect("Node status");
    }

    let secrets: Api<Secret> = Api::namespaced(management.clone(), NAMESPACE);
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": format!("{cluster}-kubeconfig"), "labels": {CLUSTER_NAME_LABEL: cluster}},
        "type": "cluster.x-k8s.io/secret",
        "stringData": {"value": k3s_control_plane::yaml::to_string(&workload.kubeconfig()).expect("kubeconfig")}
    }))
    .expect("Secret");
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("create Secret");

    let clusters: Api<k3s_control_plane::api::Cluster> =
        Api::namespaced(management.clone(), NAMESPACE);
    let object = cluster_object(&cluster, &kcp_name);
    let created_cluster = clusters
        .create(&PostParams::default(), &object)
        .await
        .expect("create Cluster");

    let kcps: Api<KThreesControlPlane> = Api::namespaced(management.clone(), NAMESPACE);
    let object = kcp_object(&kcp_name, &created_cluster, 3);
    let kcp = kcps
        .create(&PostParams::default(), &object)
        .await
        .expect("create KThreesControlPlane");
    mark_initialized(&kcps, &kcp_name)
        .await
        .expect("initialize KThreesControlPlane");

    let owner = kcp.controller_owner_ref(&()).expect("KCP uid");
    let machines: Api<Machine> = Api::namespaced(management.clone(), NAMESPACE);
    for (j, node) in node_names.iter().enumerate() {
        let ip = format!("10.{}.{}.{}", i / 250, i % 250, j + 10);
        let object: Machine = serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {
                "name": node, "namespace": NAMESPACE,
                "labels": {CLUSTER_NAME_LABEL: cluster, CONTROL_PLANE_LABEL: "", CONTROL_PLANE_NAME_LABEL: kcp_name},
                "ownerReferences": [owner],
            },
            "spec": {
                "clusterName": cluster,
                "bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "KThreesConfig", "name": node}},
                "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": node},
                "version": VERSION
            }
        }))
        .expect("Machine");
        machines
            .create(&PostParams::default(), &object)
            .await
            .expect("create Machine");
        let status = json!({"status": {
            "nodeRef": {"name": node},
            "addresses": [{"type": "InternalIP", "address": ip}],
            "phase": "Running"
        }});
        machines
            .patch_status(node, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .expect("provision Machine");
    }
    workload
}

/// Reconciled: the controller wrote a status that read the 3 Machines and
/// their Nodes, and saw that etcd is not managed.
fn reconciled(kcp: &KThreesControlPlane) -> bool {
    kcp.status.as_ref().is_some_and(|s| {
        s.ready_replicas == 3
            && k3s_control_plane::api::conditions::get(&s.conditions, ETCD_CLUSTER_HEALTHY)
                .is_some_and(|c| c.reason == "EtcdNotManaged")
    })
}

struct FleetFigures {
    idle: (u64, u64),
    reconciled: (u64, u64),
    settled: (u64, u64),
    all_reconciled_after: Duration,
    reconciles: u64,
    populate: Duration,
}

async fn fleet() -> FleetFigures {
    // Idle: nothing to watch but empty lists.
    let empty = management_server().await.expect("management server");
    let idle_process = ControllerProcess::spawn(&empty, LIMIT).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle = idle_process.memory();
    idle_process.stop().await;
    drop(empty);

    // Loaded: the fleet exists before the controller starts.
    let management = management_server().await.expect("management server");
    let client = management.client();
    let started = Instant::now();
    let workloads: Vec<TestApiServer> = futures::stream::iter(0..FLEET)
        .map(|i| add_cluster(&client, i))
        .buffer_unordered(8)
        .collect()
        .await;
    let populate = started.elapsed();

    let kcps: Api<KThreesControlPlane> = Api::namespaced(client.clone(), NAMESPACE);
    let (watch_ready, watching) = tokio::sync::oneshot::channel();
    let done = tokio::spawn(async move {
        let mut events = watcher::watcher(kcps, watcher::Config::default()).boxed();
        let mut ready = Some(watch_ready);
        let mut seen = HashSet::new();
        while let Some(event) = events.try_next().await.expect("KCP watch") {
            match event {
                Event::InitDone => {
                    if let Some(ready) = ready.take() {
                        let _ = ready.send(());
                    }
                }
                Event::Apply(kcp) | Event::InitApply(kcp) if reconciled(&kcp) => {
                    seen.insert(kcp.name_any());
                }
                _ => {}
            }
            if seen.len() == FLEET {
                return Instant::now();
            }
        }
        panic!("the KThreesControlPlane watch ended");
    });
    watching.await.expect("KCP watch started");

    let spawned = Instant::now();
    let process = ControllerProcess::spawn(&management, LIMIT).await;
    let all_done = match tokio::time::timeout(Duration::from_secs(120), done).await {
        Ok(done) => done.expect("KCP watch task"),
        Err(_) => panic!(
            "not all {FLEET} KThreesControlPlanes reconciled:\n{}",
            process.log_tail()
        ),
    };
    let reconciled_memory = process.memory();
    let reconciles = process.reconciles().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let settled = process.memory();
    process.stop().await;
    drop(workloads);
    FleetFigures {
        idle,
        reconciled: reconciled_memory,
        settled,
        all_reconciled_after: all_done - spawned,
        reconciles,
        populate,
    }
}

// ---------------------------------------------------------------- report

fn timeline_rows(s: &Scenario) {
    let row = |what: &str, pick: fn(&Timeline) -> Duration| {
        let (min, median, max) = min_median_max(s.runs.iter().map(pick).collect());
        println!(
            "  {what:<34} {:>9.0} {:>9.0} {:>9.0}",
            ms(min),
            ms(median),
            ms(max)
        );
    };
    let (_, age, _) = min_median_max(s.runs.iter().map(|t| t.age_at_mark).collect());
    println!(
        "{} (marked {:.1} s after the sandbox was up, median)",
        s.name,
        age.as_secs_f64()
    );
    row("mark -> etcd member removed", |t| t.member_removed);
    row("mark -> Machine gone", |t| t.machine_gone);
    row("mark -> replacement Machine created", |t| t.replacement);
}

fn median_of(s: &Scenario, pick: fn(&Timeline) -> Duration) -> Duration {
    min_median_max(s.runs.iter().map(pick).collect()).1
}

fn main() {
    k3s_control_plane::install_crypto_provider();
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return; // `cargo test --benches` / tooling probes: nothing to list.
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // Watches of the sandbox's simulators that outlive its servers at teardown log
                // connection errors there: noise, not results.
                .unwrap_or_else(|_| "error,kube_client::client::builder=off".into()),
        )
        .with_writer(std::io::stderr)
        .try_init();
    if let Ok(binary) = k3s_control_plane::harness::etcd::EtcdBinary::find() {
        println!(
            "etcd {} ({})",
            binary.version_string(),
            binary.path.display()
        );
    }
    assert!(
        Path::new(env!("CARGO_BIN_EXE_k3s-control-plane")).exists(),
        "the k3s-control-plane binary is built with the bench"
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async {
        let started = Instant::now();
        let fresh = scenario("leader marked, cluster just started", Target::Leader, false, false).await;
        let aged = scenario("leader marked, cluster > 6 s old", Target::Leader, true, false).await;
        let follower = scenario("follower marked, cluster > 6 s old", Target::Follower, true, false).await;
        let with_snapshot = scenario(
            "follower marked, > 6 s old, snapshot first (spec.etcdBackup, directory)",
            Target::Follower,
            true,
            true,
        )
        .await;

        println!();
        println!(
            "remediation, 3-member loopback etcd (raft heartbeat/election {}), {ITERATIONS} runs each   {:>9} {:>9} {:>9}",
            raft_timing().map_or("500/5000 ms (k3s)".to_string(), |(h, e)| format!("{h}/{e} ms")),
            "min ms", "median ms", "max ms"
        );
        for s in [&fresh, &aged, &follower, &with_snapshot] {
            timeline_rows(s);
        }
        let added = ms(median_of(&with_snapshot, |t| t.member_removed))
            - ms(median_of(&follower, |t| t.member_removed));
        let (min, median, max) = min_median_max(snapshot_floor().await);
        println!(
            "snapshot before removal: member removed {added:.0} ms later (median with - without); \
             the snapshot's own time (backup::save, raw) min/median/max {:.0}/{:.0}/{:.0} ms",
            ms(min),
            ms(median),
            ms(max)
        );
        let guard = |pick: fn(&Timeline) -> Duration| {
            ms(median_of(&fresh, pick)) - ms(median_of(&aged, pick))
        };
        println!(
            "etcd start-up guard share (median just started - median > 6 s old): \
             member removed {:.0} ms, Machine gone {:.0} ms",
            guard(|t| t.member_removed),
            guard(|t| t.machine_gone)
        );
        let floor = etcd_floor().await;
        let (min, median, max) = min_median_max(floor);
        println!(
            "  etcd's own floor: move leader + remove member (raw, warm handle) {:>9.0} {:>9.0} {:>9.0}",
            ms(min),
            ms(median),
            ms(max)
        );
        if only_remediation() {
            return;
        }
        let fleet = fleet().await;
        println!();
        println!(
            "controller process (`k3s-control-plane run`, {} build), {FLEET} KThreesControlPlanes, \
             300 Machines, etcd not managed",
            if cfg!(debug_assertions) { "debug" } else { "release" }
        );
        let line = |what: &str, (rss, hwm): (u64, u64)| {
            println!(
                "  {what:<40} VmRSS {:>6.1} MiB   VmHWM {:>6.1} MiB",
                mib(rss),
                mib(hwm)
            );
        };
        line("idle (no objects, own process)", fleet.idle);
        line("all reconciled", fleet.reconciled);
        line("3 s later", fleet.settled);
        println!(
            "  all {FLEET} reconciled {:.2} s after spawn ({:.0} KCP/s incl. start-up and initial lists; \
             {} reconciles); fleet populated in {:.1} s",
            fleet.all_reconciled_after.as_secs_f64(),
            FLEET as f64 / fleet.all_reconciled_after.as_secs_f64(),
            fleet.reconciles,
            fleet.populate.as_secs_f64()
        );
        println!("(whole bench {:.0} s)", started.elapsed().as_secs_f64());
    });
}
