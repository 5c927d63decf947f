//! A bring-up of 3 from nothing (issue 21), at the harness's raft timing
//! (k3s's 500 ms heartbeat, 5000 ms election timeout): a Cluster and a
//! KThreesControlPlane with `replicas: 3`, no Machine and no Secret
//! (`harness::bringup::BringUp`, as `tests/e2e/lifecycle.rs` starts). The
//! controller generates the CAs, the join token and the kubeconfig and
//! creates the Machines; the simulated infrastructure boots each server from
//! those Secrets: the first starts a new 1-member TLS etcd and the workload
//! API server, each later one joins etcd as a learner (`MemberAddAsLearner`,
//! refused by etcd until its leader has been connected to every voter for
//! 5 s) and is promoted once in sync (`harness::infra_sim`).
//!
//! Each run times, from the KThreesControlPlane's creation:
//! - **first Machine**: the controller created the init Machine;
//! - **first server up**: the simulated infrastructure booted it (its etcd
//!   member and the workload API answer, its Node and nodeRef are there);
//! - **initialized**: `status.initialized` on the control plane;
//! - **3 voters**: 3 healthy etcd voters and 3 Machines with a nodeRef;
//! - **ready**: `status.readyReplicas` 3 and `Available` True;
//! - **both**: the later of the two, the run's wall time (`readyReplicas`
//!   counts Machines whose Node is ready, and a joining server's Node is
//!   there while its member is still a learner, so ready may come first).
//!
//! In `run` and `sandbox` the 3-voter mark is taken by the infrastructure's
//! loop after each pass (every 50 ms), the others from watch events.
//!
//! Three ways of running the controller:
//! - **run**: the real `k3s-control-plane run` binary in its own process with
//!   its production defaults (a wait is looked at again after 10 s, a wait
//!   for a learner's promotion after 1 s), started
//!   and ready before the control plane is created; its own time is the sum of
//!   its reconciles from `/metrics` (`k3scp_reconcile_duration_seconds_sum`);
//! - **sandbox**: the same controller loop in this process with the
//!   sandbox's short requeues (`fast_settings`: 500 ms); its own time is
//!   the sum of its reconciles from its `Metrics`;
//! - **driven**: one reconcile at a time with the infrastructure between
//!   reconciles (`harness::rollout::drive_until`, as `benches/rollout.rs`),
//!   so the wall time splits exactly into the controller (inside
//!   `reconcile`), the infrastructure (booting the servers, etcd's joins and
//!   promotions) and pacing (the driver's 20 ms and its own reads); no
//!   requeue is waited for.
//!
//! Beside them, **etcd's own floor** for the same thing with no controller
//! and no API: start one member (`EtcdTestCluster::builder().members(1)`),
//! then twice `add_learner` (MemberAddAsLearner, retried while refused, and
//! start the member) and `MemberPromote` (retried every 50 ms until etcd
//! accepts it), then wait until the new voter follows the leader.
//!
//! Run: `cargo bench --bench bringup -- [--runs N] [floor] [driven] [run]
//! [sandbox]` (needs etcd on PATH; default: 3 runs of each).

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k3s_control_plane::api::{KThreesControlPlane, Machine};
use k3s_control_plane::controller::Context;
use k3s_control_plane::controller::etcd_pool::EtcdPool;
use k3s_control_plane::controller::metrics::Metrics;
use k3s_control_plane::controller::reconcile::reconcile;
use k3s_control_plane::etcd::Timeouts;
use k3s_control_plane::harness::EtcdTestCluster;
use k3s_control_plane::harness::bringup::BringUp;
use k3s_control_plane::harness::infra_sim::reconcile_infrastructure;
use k3s_control_plane::harness::rollout::{Drive, drive_until};
use k3s_control_plane::harness::sandbox::{
    KCP, Sandbox, controller_context, fast_settings, management_server, one_step_settings,
    spawn_controller,
};
use kube::ResourceExt;
use kube::runtime::watcher::{self, Event};
use prometheus_client::registry::Registry;
use tokio::time::Instant;

use common::ControllerProcess;

const REPLICAS: usize = 3;
const LIMIT: Duration = Duration::from_secs(300);
/// How often the simulated infrastructure looks at the Machines.
const INFRA_POLL: Duration = Duration::from_millis(50);

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn available(kcp: &KThreesControlPlane) -> bool {
    kcp.conditions()
        .iter()
        .any(|c| c.type_ == "Available" && c.status == "True")
}

fn ready(kcp: &KThreesControlPlane) -> bool {
    kcp.status
        .as_ref()
        .is_some_and(|s| s.ready_replicas == REPLICAS as i32)
        && available(kcp)
}

fn with_node_ref(machines: &[Machine]) -> usize {
    machines
        .iter()
        .filter(|m| !m.is_deleting() && m.node_name().is_some())
        .count()
}

/// When each milestone was first seen.
#[derive(Clone, Debug, Default)]
struct Marks {
    kcp_created: Option<Instant>,
    first_machine: Option<Instant>,
    first_server_up: Option<Instant>,
    initialized: Option<Instant>,
    three_voters: Option<Instant>,
    ready: Option<Instant>,
}

/// One bring-up.
#[derive(Clone, Debug, Default)]
struct Run {
    marks: Marks,
    /// Inside the controller's reconciles (None: not measured).
    controller: Option<Duration>,
    reconciles: Option<u64>,
    /// Inside the simulated infrastructure: booting the first server, then
    /// each join (MemberAddAsLearner with its refusals, the learner's start,
    /// Node and nodeRef, MemberPromote until accepted, the voter in sync).
    infrastructure: Duration,
    member_add_refusals: u32,
    promote_attempts: u32,
    /// Each join's time inside the infrastructure.
    joins: Vec<Duration>,
    /// `run` only: lines of the controller's log saying it waits for a
    /// learner to be promoted before the next Machine.
    learner_waits: Option<usize>,
}

impl Run {
    fn at(&self, mark: Option<Instant>) -> Option<Duration> {
        Some(mark? - self.marks.kcp_created?)
    }

    /// Until the later of **3 voters** and **ready**: `readyReplicas` counts
    /// Machines whose Node is ready, and a joining server's Node is there
    /// while its member is still a learner.
    fn wall(&self) -> Duration {
        let ready = self.at(self.marks.ready).expect("ready");
        self.at(self.marks.three_voters)
            .map_or(ready, |voters| voters.max(ready))
    }
}

fn set(mark: &mut Option<Instant>, now: Instant) {
    if mark.is_none() {
        *mark = Some(now);
    }
}

// ------------------------------------------------ the controller running

enum Running {
    Process(Box<ControllerProcess>),
    /// With the registry its metrics are in.
    InProcess(
        k3s_control_plane::harness::sandbox::ControllerHandle,
        Registry,
    ),
}

/// As `harness::sandbox::controller_context` with `fast_settings`, keeping
/// the metrics registry so that the reconciles' time can be read.
fn sandbox_context(client: kube::Client) -> (Arc<Context>, Registry) {
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let timeouts = Timeouts {
        confirm: Duration::from_secs(30),
        ..Timeouts::default()
    };
    let ctx = Context::new(
        client,
        metrics,
        EtcdPool::with_timeouts(timeouts),
        fast_settings(),
    );
    (ctx, registry)
}

/// `<name>_sum` of a histogram in `registry`, from its text encoding.
fn histogram_sum(registry: &Registry, name: &str) -> f64 {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).expect("encode metrics");
    let prefix = format!("{name}_sum ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

fn metric(metrics: &std::collections::BTreeMap<String, f64>, name: &str) -> f64 {
    metrics.get(name).copied().unwrap_or(0.0)
}

/// Watch the control plane and the Machines, noting the milestones they show.
async fn watch_marks(
    client: kube::Client,
    marks: Arc<Mutex<Marks>>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let kcps: kube::Api<KThreesControlPlane> = kube::Api::namespaced(
        client.clone(),
        k3s_control_plane::harness::sandbox::NAMESPACE,
    );
    let machines: kube::Api<Machine> =
        kube::Api::namespaced(client, k3s_control_plane::harness::sandbox::NAMESPACE);
    let (kcp_ready, kcp_watching) = tokio::sync::oneshot::channel();
    let record = marks.clone();
    let kcp_task = tokio::spawn(async move {
        let mut events = watcher::watcher(kcps, watcher::Config::default()).boxed();
        let mut started = Some(kcp_ready);
        while let Some(event) = events.next().await {
            let now = Instant::now();
            match event {
                Ok(Event::InitDone) => {
                    if let Some(s) = started.take() {
                        let _ = s.send(());
                    }
                }
                Ok(Event::Apply(kcp) | Event::InitApply(kcp)) if kcp.name_any() == KCP => {
                    let mut m = record.lock().expect("lock");
                    set(&mut m.kcp_created, now);
                    if kcp.status.as_ref().is_some_and(|s| s.initialized) {
                        set(&mut m.initialized, now);
                    }
                    if ready(&kcp) {
                        set(&mut m.ready, now);
                    }
                }
                _ => {}
            }
        }
    });
    let (machines_ready, machines_watching) = tokio::sync::oneshot::channel();
    let record = marks;
    let machine_task = tokio::spawn(async move {
        let mut events = watcher::watcher(machines, watcher::Config::default()).boxed();
        let mut started = Some(machines_ready);
        while let Some(event) = events.next().await {
            let now = Instant::now();
            match event {
                Ok(Event::InitDone) => {
                    if let Some(s) = started.take() {
                        let _ = s.send(());
                    }
                }
                Ok(Event::Apply(_) | Event::InitApply(_)) => {
                    set(&mut record.lock().expect("lock").first_machine, now);
                }
                _ => {}
            }
        }
    });
    kcp_watching.await.expect("KCP watch started");
    machines_watching.await.expect("Machine watch started");
    vec![kcp_task, machine_task]
}

/// A bring-up with the controller running on its own: the real binary
/// (`process`) or the controller loop in this process with the sandbox's
/// short requeues.
async fn running(process: bool) -> Run {
    let management = management_server().await.expect("management server");
    let client = management.client();
    let controller = if process {
        Running::Process(Box::new(
            ControllerProcess::spawn_with(&management.kubeconfig(), &[], Duration::from_secs(60))
                .await,
        ))
    } else {
        let (ctx, registry) = sandbox_context(client.clone());
        Running::InProcess(spawn_controller(ctx), registry)
    };
    let marks: Arc<Mutex<Marks>> = Arc::default();
    let watches = watch_marks(client.clone(), marks.clone()).await;
    let before = match &controller {
        Running::Process(p) => Some(p.metrics().await),
        Running::InProcess(..) => None,
    };
    let world = BringUp::start_on(management, REPLICAS as i32)
        .await
        .expect("bring-up world");
    let deadline = Instant::now() + LIMIT;
    let mut run = Run::default();

    // The infrastructure provider reacts to the first Machine.
    let first = loop {
        let list = world
            .machines_api()
            .list(&Default::default())
            .await
            .expect("list Machines");
        if let Some(m) = list.items.first() {
            break m.name_any();
        }
        assert!(Instant::now() < deadline, "no first Machine");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let t = Instant::now();
    let mut sandbox = world
        .boot_first(&first)
        .await
        .expect("boot the first server");
    run.infrastructure += t.elapsed();
    set(
        &mut marks.lock().expect("lock").first_server_up,
        Instant::now(),
    );
    let etcd = sandbox.etcd.connect();
    loop {
        let t = Instant::now();
        let pass = reconcile_infrastructure(&mut sandbox, LIMIT)
            .await
            .expect("infrastructure pass");
        if !pass.provisioned.is_empty() {
            run.infrastructure += t.elapsed();
            for p in &pass.provisioned {
                run.member_add_refusals += p.member_add_refusals;
                run.promote_attempts += p.promote_attempts;
                run.joins.push(p.took);
            }
        }
        let now = Instant::now();
        let machines = sandbox
            .machines_api()
            .list(&Default::default())
            .await
            .expect("list Machines")
            .items;
        if with_node_ref(&machines) == REPLICAS
            && let Ok(snap) = etcd.snapshot().await
        {
            let a = snap.assess_cluster();
            if a.healthy == REPLICAS && a.voters == REPLICAS {
                set(&mut marks.lock().expect("lock").three_voters, now);
            }
        }
        {
            let m = marks.lock().expect("lock");
            if m.ready.is_some() && m.three_voters.is_some() {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "not ready within {LIMIT:?}: {:?}",
            marks.lock().expect("lock")
        );
        tokio::time::sleep(INFRA_POLL).await;
    }
    match controller {
        Running::Process(p) => {
            let after = p.metrics().await;
            let before = before.expect("metrics before");
            let d = |name: &str| metric(&after, name) - metric(&before, name);
            run.controller = Some(Duration::from_secs_f64(d(
                "k3scp_reconcile_duration_seconds_sum",
            )));
            run.reconciles = Some(d("k3scp_reconciles_total") as u64);
            run.learner_waits = Some(p.log_lines_with("to be promoted"));
            p.stop().await;
        }
        Running::InProcess(handle, registry) => {
            run.reconciles = Some(handle.ctx.metrics.reconciles.get());
            run.controller = Some(Duration::from_secs_f64(histogram_sum(
                &registry,
                "k3scp_reconcile_duration_seconds",
            )));
            handle.stop().await;
        }
    }
    for w in watches {
        w.abort();
    }
    run.marks = marks.lock().expect("lock").clone();
    drop(sandbox);
    run
}

// ------------------------------------------------ one reconcile at a time

async fn driven() -> (Run, Duration, usize) {
    let world = BringUp::start(REPLICAS as i32)
        .await
        .expect("bring-up world");
    // `start` creates the control plane last.
    let mut run = Run::default();
    run.marks.kcp_created = Some(Instant::now());
    let ctx = controller_context(world.client(), one_step_settings());
    let kcps = world.kcp_api();
    let mut controller = Duration::ZERO;
    let mut steps = 0;
    let first = loop {
        let kcp = kcps.get(KCP).await.expect("get KCP");
        let t = Instant::now();
        let _ = reconcile(Arc::new(kcp), ctx.clone()).await;
        controller += t.elapsed();
        steps += 1;
        let list = world
            .machines_api()
            .list(&Default::default())
            .await
            .expect("list Machines");
        if let Some(m) = list.items.first() {
            run.marks.first_machine = Some(Instant::now());
            break m.name_any();
        }
        assert!(steps < 200, "no first Machine after {steps} reconciles");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let t = Instant::now();
    let mut sandbox: Sandbox = world
        .boot_first(&first)
        .await
        .expect("boot the first server");
    run.infrastructure += t.elapsed();
    run.marks.first_server_up = Some(Instant::now());
    let mut stamps = Vec::new();
    let mut marks = run.marks.clone();
    let record = drive_until(
        &mut sandbox,
        &Drive {
            crash_after_every_step: false,
            limit: LIMIT,
        },
        |machines, kcp| {
            let now = Instant::now();
            stamps.push(now);
            if kcp.status.as_ref().is_some_and(|s| s.initialized) {
                set(&mut marks.initialized, now);
            }
            if ready(kcp) {
                set(&mut marks.ready, now);
            }
            with_node_ref(machines) == REPLICAS && ready(kcp)
        },
    )
    .await
    .expect("bring-up driven");
    // 3 voters: the first step after which etcd had 3 healthy voters (the
    // join that promotes the third finishes inside that step).
    marks.three_voters = record
        .steps
        .iter()
        .zip(&stamps)
        .find(|(s, _)| s.healthy_voters == Some((REPLICAS, REPLICAS)))
        .map(|(_, t)| *t);
    run.marks = marks;
    run.controller = Some(controller + record.controller);
    run.reconciles = Some(steps as u64 + record.steps.len() as u64);
    run.infrastructure += record.waiting_on_etcd;
    for p in &record.provisioned {
        run.member_add_refusals += p.member_add_refusals;
        run.promote_attempts += p.promote_attempts;
        run.joins.push(p.took);
    }
    let pacing = run
        .wall()
        .saturating_sub(run.controller.unwrap_or_default() + run.infrastructure);
    let steps = steps + record.steps.len();
    drop(sandbox);
    (run, pacing, steps)
}

// ------------------------------------------------ etcd's own floor

#[derive(Debug, Default)]
struct Floor {
    /// Start of the 1-member cluster (PKI, process, leader elected).
    first: Duration,
    /// Per join: MemberAddAsLearner (refusals) + the learner started and
    /// answering, MemberPromote until accepted (attempts), the voter following.
    adds: Vec<(Duration, u32)>,
    promotes: Vec<(Duration, u32)>,
    in_sync: Vec<Duration>,
    total: Duration,
    refusal_messages: Vec<String>,
}

async fn floor() -> Floor {
    let mut f = Floor::default();
    let started = Instant::now();
    let mut etcd = EtcdTestCluster::builder()
        .members(1)
        .start()
        .await
        .expect("1-member etcd");
    f.first = started.elapsed();
    let tls = etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(etcd.ca_pem().as_bytes()))
        .identity(etcd_client::Identity::from_pem(
            std::fs::read(etcd.client_cert_path()).expect("client cert"),
            std::fs::read(etcd.client_key_path()).expect("client key"),
        ));
    let mut client = etcd_client::Client::connect(
        etcd.endpoints(),
        Some(etcd_client::ConnectOptions::new().with_tls(tls)),
    )
    .await
    .expect("etcd client");
    for _ in 1..REPLICAS {
        let t = Instant::now();
        let index = etcd.add_learner().await.expect("add a learner");
        let (id, name, refusals) = {
            let m = etcd.member(index);
            (m.id, m.name.clone(), m.member_add_refusals)
        };
        f.adds.push((t.elapsed(), refusals));
        let t = Instant::now();
        let mut attempts = 0;
        loop {
            attempts += 1;
            match client.member_promote(id).await {
                Ok(_) => break,
                Err(e) => {
                    let message = e.to_string();
                    if !f.refusal_messages.contains(&message) {
                        f.refusal_messages.push(message);
                    }
                    assert!(t.elapsed() < LIMIT, "promote not accepted: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        f.promotes.push((t.elapsed(), attempts));
        let t = Instant::now();
        let running: Vec<usize> = (0..etcd.members().len()).collect();
        etcd.poll(
            "voter following the leader",
            LIMIT,
            |snap| match (snap.member_by_name(&name), snap.leader) {
                (Some(m), Some(leader))
                    if !m.learner
                        && m.is_healthy()
                        && m.status.as_ref().map(|s| s.leader) == Some(leader) =>
                {
                    Ok(())
                }
                other => Err(format!("{:?}", other.0.map(|m| m.learner))),
            },
            &running,
        )
        .await
        .expect("voter in sync");
        f.in_sync.push(t.elapsed());
    }
    f.total = started.elapsed();
    drop(client);
    drop(etcd);
    f
}

// ------------------------------------------------ report

fn cell(d: Option<Duration>) -> String {
    d.map_or("-".to_string(), |d| format!("{:.0}", ms(d)))
}

fn print_runs(what: &str, runs: &[Run]) {
    println!();
    println!("{what}");
    println!(
        "| run | first Machine ms | first server up ms | initialized ms | 3 voters ms | ready ms | both ms | controller (reconciles) ms | infrastructure ms | joins ms | other ms | MemberAdd refusals | promote attempts |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (i, r) in runs.iter().enumerate() {
        let other = r
            .controller
            .map(|c| r.wall().saturating_sub(c + r.infrastructure));
        println!(
            "| {} | {} | {} | {} | {} | {} | {:.0} | {}{} | {:.0} | {} | {} | {} | {} |",
            i + 1,
            cell(r.at(r.marks.first_machine)),
            cell(r.at(r.marks.first_server_up)),
            cell(r.at(r.marks.initialized)),
            cell(r.at(r.marks.three_voters)),
            cell(r.at(r.marks.ready)),
            ms(r.wall()),
            cell(r.controller),
            r.reconciles.map_or(String::new(), |n| format!(" ({n})")),
            ms(r.infrastructure),
            r.joins
                .iter()
                .map(|j| format!("{:.0}", ms(*j)))
                .collect::<Vec<_>>()
                .join(" + "),
            cell(other),
            r.member_add_refusals,
            r.promote_attempts,
        );
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list" || a == "--test") {
        return; // `cargo test --benches` / tooling probes: nothing to list.
    }
    k3s_control_plane::install_crypto_provider();
    let mut runs = 3;
    let mut modes = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--bench" => {}
            "--runs" => {
                runs = it
                    .next()
                    .and_then(|n| n.parse().ok())
                    .expect("--runs takes a number")
            }
            m @ ("floor" | "driven" | "run" | "sandbox") => modes.push(m.to_string()),
            other => panic!("unknown argument {other:?}"),
        }
    }
    if modes.is_empty() {
        modes = ["floor", "driven", "run", "sandbox"]
            .map(String::from)
            .to_vec();
    }
    println!(
        "bring-up of {REPLICAS} from nothing, etcd at the harness's raft timing (500/5000 ms), {} build; load average at start {}",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        loadavg()
    );
    for mode in &modes {
        match mode.as_str() {
            "floor" => {
                println!();
                println!(
                    "etcd's own floor, no controller: 1 member, then {} x (MemberAddAsLearner + start, MemberPromote every 50 ms until accepted, voter following)",
                    REPLICAS - 1
                );
                println!(
                    "| run | first member ms | add + start ms (refusals) | promote ms (attempts) | in sync ms | total ms | load |"
                );
                println!("|---|---|---|---|---|---|---|");
                let mut messages = Vec::new();
                for i in 0..runs {
                    let f = floor().await;
                    println!(
                        "| {} | {:.0} | {} | {} | {} | {:.0} | {} |",
                        i + 1,
                        ms(f.first),
                        f.adds
                            .iter()
                            .map(|(d, n)| format!("{:.0} ({n})", ms(*d)))
                            .collect::<Vec<_>>()
                            .join(" + "),
                        f.promotes
                            .iter()
                            .map(|(d, n)| format!("{:.0} ({n})", ms(*d)))
                            .collect::<Vec<_>>()
                            .join(" + "),
                        f.in_sync
                            .iter()
                            .map(|d| format!("{:.0}", ms(*d)))
                            .collect::<Vec<_>>()
                            .join(" + "),
                        ms(f.total),
                        loadavg()
                    );
                    for m in f.refusal_messages {
                        if !messages.contains(&m) {
                            messages.push(m);
                        }
                    }
                }
                for m in messages {
                    println!("promote refused with: {m}");
                }
            }
            "driven" => {
                let mut all = Vec::new();
                let mut extra = Vec::new();
                for _ in 0..runs {
                    let (run, pacing, steps) = driven().await;
                    extra.push((pacing, steps, loadavg()));
                    all.push(run);
                }
                print_runs(
                    "driven: one reconcile at a time (one_step_settings), infrastructure between reconciles; other = pacing (20 ms per step and the driver's reads)",
                    &all,
                );
                for (i, (pacing, steps, load)) in extra.iter().enumerate() {
                    println!(
                        "run {}: {steps} reconciles, pacing {:.0} ms, load {load}",
                        i + 1,
                        ms(*pacing)
                    );
                }
            }
            "run" | "sandbox" => {
                let process = mode == "run";
                let mut all = Vec::new();
                let mut loads = Vec::new();
                for _ in 0..runs {
                    all.push(running(process).await);
                    loads.push(loadavg());
                }
                print_runs(
                    if process {
                        "run: the k3s-control-plane binary, production defaults (wait requeue 10 s, 1 s for a learner); other = waiting for the controller to look again, and the infrastructure's 50 ms polls"
                    } else {
                        "sandbox: the controller loop in this process, fast_settings (wait requeue 500 ms); other = waiting for the controller to look again, and the infrastructure's 50 ms polls"
                    },
                    &all,
                );
                for (i, (load, r)) in loads.iter().zip(&all).enumerate() {
                    println!(
                        "run {}: load {load}{}",
                        i + 1,
                        r.learner_waits.map_or(String::new(), |n| format!(
                            "; controller log lines waiting for a learner to be promoted: {n}"
                        ))
                    );
                }
            }
            _ => unreachable!(),
        }
    }
}
