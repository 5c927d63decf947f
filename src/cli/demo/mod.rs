//! `k3s-control-plane demo`: the provider's main job, on a machine with no
//! cluster. It starts from a Cluster and a KThreesControlPlane with nothing
//! else: the real controller generates the cluster Secrets and creates the init
//! node's Machine, the simulated infrastructure boots it from those Secrets (a
//! real etcd cluster, a mutual-TLS workload API), the other servers join (real
//! etcd learners, promoted) until 3 healthy voters and `Available=True`. Then
//! the etcd leader's Machine is marked unhealthy as a MachineHealthCheck would
//! and remediated. Every Event, Secret created, control-plane condition change
//! and Machine change is printed as it happens, then a summary with the times.
//!
//! With `--kubeconfig` it runs the controller against a real management cluster
//! instead and prints what happens there until Ctrl-C (nothing is simulated and
//! nothing is marked).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use kube::api::ListParams;
use kube::{Api, ResourceExt};
use prometheus_client::registry::Registry;
use tokio::sync::oneshot;
use tokio::time::Instant;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::api::KThreesControlPlane;
use crate::api::condition_names::{AVAILABLE, INITIALIZED, SCALING_UP};
use crate::controller::etcd_pool::EtcdPool;
use crate::controller::metrics::Metrics;
use crate::controller::{self, Context, Settings};
use crate::harness::bringup::BringUp;
use crate::harness::etcd::EtcdBinary;
use crate::harness::infra_sim::{self, Provisioned};
use crate::harness::sandbox::{CLUSTER, ControllerHandle, KCP, NAMESPACE, Sandbox, SandboxError};

use crate::cli::inspect::{
    self, Report, init_logging_or, init_quiet_logging, read_only_context, render_members,
};
use crate::cli::run::management_client;

mod timeline;

use timeline::{
    Clock, MACHINE_CREATED, MACHINE_DELETED, SECRET_CREATED, Watches, condition_record, say, secs,
    start_timeline,
};

/// How long each wait may take: the bring-up to a healthy control plane, and
/// the remediation from the mark to a healthy cluster.
const LIMIT: Duration = Duration::from_secs(45);
const POLL: Duration = Duration::from_millis(100);
/// etcd's `HealthInterval` (5 s) plus a margin: how long members must have
/// been connected before etcd accepts a membership removal.
const ETCD_PEER_HEALTH_INTERVAL: Duration = Duration::from_millis(5500);

#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Run the controller against this management cluster instead of the
    /// simulated one, and print its Events and Machine changes until Ctrl-C.
    /// The CRDs, a Cluster, its KThreesControlPlane and Secrets must exist.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
enum DemoError {
    #[error(
        "etcd binary not found (looked at $ETCD_BIN, then .tools/etcd-v3.5.1/etcd, then etcd on PATH): run hack/setup.sh, which installs etcd 3.5.1 there"
    )]
    EtcdMissing,
    #[error("{0}")]
    Sandbox(#[from] SandboxError),
    #[error("{0}")]
    Failed(String),
    #[error("interrupted (Ctrl-C); everything started was stopped")]
    Interrupted,
}

pub async fn run(args: DemoArgs) -> ExitCode {
    crate::install_crypto_provider();
    let result = match &args.kubeconfig {
        Some(path) => {
            init_quiet_logging();
            against_cluster(path).await
        }
        // Dropping the demo on Ctrl-C drops the sandbox: its etcd members are
        // killed and its files removed.
        None => {
            // Until the first server boots, the control-plane endpoint closes
            // every connection (a load balancer without a backend) and
            // kube-client logs each failed connect as an ERROR; the timeline
            // already shows it as the Initialized condition's reason.
            init_logging_or("warn,kube_client::client::builder=off");
            tokio::select! {
                result = sandbox_demo() => result,
                _ = tokio::signal::ctrl_c() => Err(DemoError::Interrupted),
            }
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------------------
// The self-contained demo.

fn print_intro(etcd: &EtcdBinary) {
    say("k3s-control-plane demo: a k3s control plane brought up from nothing, then the etcd");
    say("leader's control-plane Machine remediated");
    say("");
    say("What is real:");
    say(format!(
        "  - etcd: each server's member is a real etcd {} process with k3s's etcd settings",
        etcd.version_string()
    ));
    say(format!(
        "    ({}), a k3s-style member name, its own",
        etcd.path.display()
    ));
    say("    127.77.x.y loopback address and ports 2379/2380; the first server starts a new");
    say("    cluster, each later one joins as a learner and is promoted, as k3s does;");
    say("  - TLS: mutual TLS, from the Secrets the controller generates: the etcd certificates");
    say("    are signed by its <cluster>-etcd CA; the workload API server serves a <cluster>-ca");
    say("    certificate and accepts only client certificates signed by <cluster>-cca;");
    say("  - the controller: the real code (observe -> plan -> act -> status), the same binary");
    say("    as `k3s-control-plane run`; it reaches the workload cluster only through the");
    say("    kubeconfig it generated, and etcd over verified TLS.");
    say("What is simulated:");
    say("  - the management API: an in-process test API server speaking the Kubernetes");
    say("    REST/watch protocol (our CRDs and CAPI's), with Cluster API's Machine controller");
    say("    (finalizer, pre-terminate hook wait, deletion);");
    say("  - the infrastructure: a Machine the controller creates boots a server, a deleted");
    say("    Machine's server goes away (src/harness/infra_sim.rs);");
    say("  - k3s: no k3s binary runs; a server's etcd is started or joined as k3s does, the");
    say("    workload API server is an in-process test API server, Nodes register as k3s's do.");
    say("");
}

async fn report(ctx: &Context) -> Result<Report, DemoError> {
    inspect::inspect(ctx, NAMESPACE, KCP)
        .await
        .map_err(|e| DemoError::Failed(format!("inspect: {e}")))
}

fn print_state(report: &Report) {
    print!("{}", render_members(report));
    if let Some(q) = &report.quorum {
        say(format!("quorum: {}", q.summary));
    }
    match &report.next.action {
        Some(action) => say(format!(
            "controller's next action: {action} (rule {}): {}",
            report.next.rule, report.next.message
        )),
        None => say(format!(
            "controller refuses (rule {}): {}",
            report.next.rule, report.next.message
        )),
    }
}

fn is_whole_again(report: &Report, members: usize) -> bool {
    report.next.action.as_deref() == Some("idle")
        && report.members.len() == members
        && report
            .members
            .iter()
            .all(|m| m.healthy && !m.learner && m.machine.is_some())
        && report
            .quorum
            .as_ref()
            .is_some_and(|q| q.assessment.voters == members && q.assessment.healthy == members)
}

fn condition(kcp: &KThreesControlPlane, type_: &str) -> Option<Condition> {
    kcp.conditions().iter().find(|c| c.type_ == type_).cloned()
}

/// `(healthy, voters)` of the real etcd membership, from the demo's own
/// connection (independent of the controller).
async fn etcd_voters(sandbox: &Sandbox) -> Option<(usize, usize)> {
    let snap = sandbox.etcd.connect().snapshot().await.ok()?;
    let a = snap.assess_cluster();
    Some((a.healthy, a.voters))
}

/// What the simulated infrastructure reports of a server that joined.
fn joined_line(p: &Provisioned) -> String {
    let refused = match p.member_add_refusals {
        0 => String::new(),
        n => format!(
            " (MemberAdd refused {n}x as transient: etcd adds a member only once its leader has been connected to every voter for 5 s)"
        ),
    };
    format!(
        "infrastructure (simulated): {} booted in {}: k3s joined etcd with {CLUSTER}-token, learner {} added{refused}, promoted to voter ({} MemberPromote attempt(s)); Node {} registered at {}",
        p.machine,
        secs(p.took),
        p.member,
        p.promote_attempts,
        p.node,
        p.ip
    )
}

/// The Secrets the controller must generate for a cluster started from
/// nothing, as cluster-api-k3s names them.
fn generated_secret_names() -> [String; 5] {
    ["-ca", "-cca", "-etcd", "-token", "-kubeconfig"].map(|s| format!("{CLUSTER}{s}"))
}

/// What the bring-up observed; times from the controller's start.
#[derive(Default)]
struct BringUpFigures {
    secrets: Vec<(String, Option<Duration>)>,
    first_machine: Option<(Duration, String)>,
    second_machine: Option<Duration>,
    first_booted: Option<Duration>,
    initialized: Option<Duration>,
    joined: Vec<(Duration, Provisioned)>,
    voters: Option<Duration>,
    available: Option<(Duration, String)>,
    total: Duration,
}

impl BringUpFigures {
    fn pending(&self, members: usize) -> String {
        if self.initialized.is_none() {
            "the control plane to be initialized (Initialized=True)".into()
        } else if self.joined.len() + 1 < members {
            format!("{} more server(s) to join", members - 1 - self.joined.len())
        } else if self.voters.is_none() {
            format!("{members} healthy etcd voters")
        } else if self.available.is_none() {
            format!("Available=True with {members} of {members} Machines ready")
        } else {
            "the controller to have nothing left to do".into()
        }
    }
}

/// The control plane, up.
struct BroughtUp {
    sandbox: Sandbox,
    controller: ControllerHandle,
    figures: BringUpFigures,
    /// When the last server joined (its member was promoted).
    last_join: Instant,
}

/// From a Cluster and a KThreesControlPlane with nothing else to `members`
/// healthy voters and `Available=True`, printing the timeline.
async fn bring_up(members: usize) -> Result<BroughtUp, DemoError> {
    say(format!(
        "Creating the management objects: a Cluster (control-plane endpoint reserved, infrastructure provisioned) and a KThreesControlPlane (replicas {members}); no Machine, no Secret..."
    ));
    let world = BringUp::start(members as i32).await?;
    let endpoint = world.endpoint;
    say(format!(
        "  management API (simulated): {}   control-plane endpoint: https://{endpoint} (nothing answers yet)",
        world.management.url()
    ));
    let clock = Clock::default();
    let timeline =
        start_timeline(world.client(), Some(NAMESPACE), clock.clone(), Watches::ALL).await?;
    say("");
    say(format!(
        "Bring-up: starting the controller on KThreesControlPlane {NAMESPACE}/{KCP}. Times are from this moment."
    ));
    say("");
    clock.start();
    let controller = world.start_controller();
    let mut figures = BringUpFigures::default();

    let first = world.wait_first_machine(LIMIT).await?;
    figures.first_machine = Some((clock.elapsed(), first.clone()));
    // The controller must now wait for the init node: exactly one Machine
    // while the control plane is not initialized.
    let kcps = world.kcp_api();
    let waiting = wait_until("the controller to wait for the first server", || async {
        let kcp = kcps.get(KCP).await.map_err(|e| e.to_string())?;
        match condition(&kcp, SCALING_UP) {
            Some(c) if c.status == "True" && c.message.contains("waiting for the first server") => {
                Ok(c.message)
            }
            other => Err(format!("{SCALING_UP}: {other:?}")),
        }
    })
    .await?;
    let count = world
        .machines_api()
        .list(&ListParams::default())
        .await
        .map_err(|e| DemoError::Failed(format!("list Machines: {e}")))?
        .items
        .len();
    if count != 1 {
        return Err(DemoError::Failed(format!(
            "{count} Machines exist before the control plane is initialized; expected the init node alone"
        )));
    }
    say(format!(
        "{} 1 Machine ({first}), the init node, alone: ScalingUp=True: {waiting}",
        clock.stamp()
    ));
    say(format!(
        "{} infrastructure (simulated): {first} boots the first server from the controller's Secrets: a new etcd cluster signed by {CLUSTER}-etcd; the workload API on https://{endpoint} serving a {CLUSTER}-ca certificate, accepting only {CLUSTER}-cca clients",
        clock.stamp()
    ));
    let mut sandbox = world.boot_first(&first).await?;
    {
        let m = sandbox.etcd.member(0);
        say(format!(
            "{} infrastructure (simulated): {first} booted: etcd member {} at {}; Node {} registered at {}",
            clock.stamp(),
            m.name,
            m.client_url(),
            m.node_name,
            m.ip
        ));
    }
    figures.first_booted = Some(clock.elapsed());
    say(format!(
        "  etcd data and certificates: {} (removed at the end)",
        sandbox.etcd.dir().display()
    ));
    let mut last_join = Instant::now();

    let observer = read_only_context(sandbox.client());
    let deadline = Instant::now() + LIMIT;
    let state = loop {
        if Instant::now() >= deadline {
            return Err(DemoError::Failed(format!(
                "bring-up timed out after {} waiting for {}",
                secs(LIMIT),
                figures.pending(members)
            )));
        }
        let pass = infra_sim::reconcile_infrastructure(&mut sandbox, LIMIT).await?;
        for p in pass.provisioned {
            say(format!("{} {}", clock.stamp(), joined_line(&p)));
            figures.joined.push((clock.elapsed(), p));
            last_join = Instant::now();
        }
        if figures.voters.is_none()
            && let Some((healthy, voters)) = etcd_voters(&sandbox).await
            && healthy == members
            && voters == members
        {
            figures.voters = Some(clock.elapsed());
        }
        let kcp = sandbox
            .kcp_api()
            .get(KCP)
            .await
            .map_err(|e| DemoError::Failed(format!("get KThreesControlPlane: {e}")))?;
        if figures.initialized.is_none()
            && condition(&kcp, INITIALIZED).is_some_and(|c| c.status == "True")
        {
            figures.initialized = Some(clock.elapsed());
        }
        let ready = format!("{members} of {members} Machines ready");
        if figures.available.is_none()
            && let Some(c) = condition(&kcp, AVAILABLE)
            && c.status == "True"
            && c.message.starts_with(&ready)
        {
            figures.available = Some((clock.elapsed(), c.message));
        }
        if figures.voters.is_some() && figures.available.is_some() {
            let now = report(&observer).await?;
            if is_whole_again(&now, members) {
                break now;
            }
        }
        tokio::time::sleep(POLL).await;
    };
    figures.total = clock.elapsed();
    // Let the last lines of the watches print, then stop them.
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The timeline's records are the moments the API showed each change;
    // the demo's own polls are the fallback.
    figures.secrets = generated_secret_names()
        .into_iter()
        .map(|name| {
            let at = timeline
                .first(SECRET_CREATED, |n| n == name)
                .map(|(t, _)| t);
            (name, at)
        })
        .collect();
    if let Some((t, _)) = timeline.first(MACHINE_CREATED, |name| name == first) {
        figures.first_machine = Some((t, first.clone()));
    }
    figures.second_machine = timeline
        .first(MACHINE_CREATED, |name| name != first)
        .map(|(t, _)| t);
    if let Some((t, _)) = timeline.first(&condition_record(INITIALIZED), |v| v.starts_with("True"))
    {
        figures.initialized = Some(t);
    }
    drop(timeline);
    drop(observer);
    say("");
    say(format!(
        "Control plane up in {} (what `k3s-control-plane inspect {NAMESPACE}/{KCP}` shows):",
        secs(figures.total)
    ));
    print_state(&state);
    Ok(BroughtUp {
        sandbox,
        controller,
        figures,
        last_join,
    })
}

/// Poll `check` every [`POLL`] until it yields a value, for at most [`LIMIT`].
async fn wait_until<T, F, Fut>(what: &str, mut check: F) -> Result<T, DemoError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + LIMIT;
    loop {
        match check().await {
            Ok(value) => return Ok(value),
            Err(last) if Instant::now() >= deadline => {
                return Err(DemoError::Failed(format!(
                    "timed out after {} waiting for {what}: {last}",
                    secs(LIMIT)
                )));
            }
            Err(_) => tokio::time::sleep(POLL).await,
        }
    }
}

/// When each remediation step was first observed, relative to the mark.
#[derive(Default)]
struct Milestones {
    member_removed: Option<Duration>,
    leader_after: Option<String>,
    machine_deleted: Option<Duration>,
    decommissioned: Option<Duration>,
    replacement: Option<(Duration, String)>,
    provisioned: Option<(Duration, Provisioned)>,
    healthy: Option<(Duration, Report)>,
}

impl Milestones {
    fn pending(&self) -> &'static str {
        if self.member_removed.is_none() {
            "the member to be removed"
        } else if self.machine_deleted.is_none() {
            "the Machine to be deleted"
        } else if self.replacement.is_none() {
            "a replacement Machine"
        } else if self.provisioned.is_none() {
            "the replacement to be provisioned"
        } else {
            "a healthy 3-member control plane with nothing left to do"
        }
    }
}

async fn sandbox_demo() -> Result<(), DemoError> {
    const MEMBERS: usize = 3;
    let run_started = Instant::now();
    let etcd = EtcdBinary::find().map_err(|_| DemoError::EtcdMissing)?;
    print_intro(&etcd);

    let BroughtUp {
        mut sandbox,
        controller,
        figures: up,
        last_join,
    } = bring_up(MEMBERS).await?;
    let bring_up_done = run_started.elapsed();

    let observer = read_only_context(sandbox.client());
    let admin = sandbox.etcd.connect();
    let snap = admin
        .snapshot()
        .await
        .map_err(|e| DemoError::Failed(format!("etcd: {e}")))?;
    let leader_id = snap
        .leader
        .ok_or_else(|| DemoError::Failed("etcd has no leader".into()))?;
    let index = sandbox
        .etcd
        .index_of(leader_id)
        .ok_or_else(|| DemoError::Failed("the etcd leader is not a sandbox member".into()))?;
    let target = sandbox.machines[index].clone();
    let target_member = sandbox.etcd.member(index).name.clone();
    let target_node = sandbox.etcd.member(index).node_name.clone();
    let originals = sandbox.machines.clone();

    // etcd (strict reconfiguration check) refuses MemberRemove as "unhealthy
    // cluster" until the receiving member has been connected to every peer for
    // 5 s. A production cluster is long past that; a cluster whose last member
    // joined a second ago is not, and the controller would retry until it is.
    // Start from a realistic cluster instead.
    let settled_at = last_join + ETCD_PEER_HEALTH_INTERVAL;
    if Instant::now() < settled_at {
        say("");
        say(format!(
            "Waiting {} more: etcd accepts member removals only once its members have been connected for 5 s (the last joined {} ago).",
            secs(settled_at - Instant::now()),
            secs(last_join.elapsed())
        ));
        tokio::time::sleep_until(settled_at).await;
    }

    let clock = Clock::default();
    let timeline = start_timeline(
        sandbox.client(),
        Some(NAMESPACE),
        clock.clone(),
        Watches::ALL,
    )
    .await?;
    say("");
    say(format!(
        "Remediation: marking Machine {target} (it runs the etcd LEADER {target_member}) unhealthy, as a MachineHealthCheck does:"
    ));
    say("HealthCheckSucceeded=False, OwnerRemediated=False. Times are from this moment.");
    say("");
    clock.start();
    let marked = Instant::now();
    sandbox.mark_unhealthy(&target).await?;

    let mut done = Milestones::default();
    let deadline = Instant::now() + LIMIT;
    while done.healthy.is_none() {
        if Instant::now() >= deadline {
            return Err(DemoError::Failed(format!(
                "timed out after {} waiting for {}",
                secs(LIMIT),
                done.pending()
            )));
        }
        if done.member_removed.is_none()
            && let Ok(snap) = admin.snapshot().await
            && snap.member_by_name(&target_member).is_none()
        {
            done.member_removed = Some(clock.elapsed());
            done.leader_after = snap.leader_member().map(|m| m.label());
        }
        let machines = sandbox
            .machines_api()
            .list(&ListParams::default())
            .await
            .map_err(|e| DemoError::Failed(format!("list Machines: {e}")))?
            .items;
        if done.machine_deleted.is_none() && !machines.iter().any(|m| m.name_any() == target) {
            done.machine_deleted = Some(clock.elapsed());
        }
        if done.replacement.is_none()
            && let Some(new) = machines.iter().find(|m| !originals.contains(&m.name_any()))
        {
            done.replacement = Some((clock.elapsed(), new.name_any()));
        }
        // The simulated infrastructure provider's pass, as during the
        // bring-up: it decommissions the deleted Machine's server and boots
        // the replacement.
        let pass = infra_sim::reconcile_infrastructure(&mut sandbox, LIMIT).await?;
        for gone in &pass.decommissioned {
            let node = originals
                .iter()
                .position(|m| m == gone)
                .map(|i| sandbox.etcd.member(i).node_name.clone())
                .unwrap_or_else(|| target_node.clone());
            say(format!(
                "{} infrastructure (simulated): {gone}'s server is gone (its etcd process stopped); its Node {node} is deleted",
                clock.stamp()
            ));
            done.decommissioned.get_or_insert(clock.elapsed());
        }
        for p in pass.provisioned {
            say(format!("{} {}", clock.stamp(), joined_line(&p)));
            if done.replacement.is_none() {
                done.replacement = Some((clock.elapsed(), p.machine.clone()));
            }
            done.provisioned = Some((clock.elapsed(), p));
        }
        if done.provisioned.is_some() {
            let now = report(&observer).await?;
            if is_whole_again(&now, MEMBERS) {
                done.healthy = Some((clock.elapsed(), now));
                break;
            }
        }
        tokio::time::sleep(POLL).await;
    }
    let remediation_done = marked.elapsed();
    controller.stop().await;
    // Let the last lines of the watches print, then stop them.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let moved = timeline.first("EtcdLeadershipMoved", |_| true);
    let removed = timeline.first("EtcdMemberRemoved", |note| note.contains(&target_member));
    let deleted = timeline.first(MACHINE_DELETED, |name| name == target);
    let (_, replacement) = done.replacement.clone().unwrap_or_default();
    let created = timeline.first(MACHINE_CREATED, |name| name == replacement);
    let available_false = timeline.first(&condition_record(AVAILABLE), |v| !v.starts_with("True"));
    drop(timeline);

    let at = |d: Option<Duration>| d.map_or_else(|| "?".to_string(), |d| format!("at {}", secs(d)));
    say("");
    say("Summary");
    say("Bring-up (times from the controller's start):");
    let secrets: Vec<String> = up
        .secrets
        .iter()
        .map(|(name, t)| format!("{name} {}", at(*t)))
        .collect();
    say(format!(
        "  Secrets generated:  {} (names only; content never printed)",
        secrets.join(", ")
    ));
    if let Some((t, first)) = &up.first_machine {
        say(format!(
            "  first Machine:      {first} at {}, the only one until the first server's API answered (next Machine {})",
            secs(*t),
            at(up.second_machine)
        ));
    }
    say(format!(
        "  first server up:    {} (simulated infrastructure)",
        at(up.first_booted)
    ));
    say(format!(
        "  initialized:        {} (Initialized=True: the first server's API answered)",
        at(up.initialized)
    ));
    for (t, p) in &up.joined {
        say(format!(
            "  server joined:      {} as etcd member {} on Node {} at {}",
            p.machine,
            p.member,
            p.node,
            secs(*t)
        ));
    }
    say(format!(
        "  {MEMBERS} healthy voters:   {} (the demo's own etcd poll)",
        at(up.voters)
    ));
    match &up.available {
        Some((t, message)) => say(format!(
            "  Available:          at {}: Available=True: {message}",
            secs(*t)
        )),
        None => say("  Available:          ?"),
    }
    say(format!(
        "  nothing left to do: at {} (next action idle)",
        secs(up.total)
    ));
    say("Remediation (times from the mark):");
    say(format!(
        "  marked unhealthy:   Machine {target}, running etcd leader {target_member}"
    ));
    match &moved {
        Some((t, note)) => say(format!("  leadership moved:   at {}: {note}", secs(*t))),
        None => say("  leadership moved:   no EtcdLeadershipMoved event was seen"),
    }
    // The controller's Event is the moment of removal; the demo's own etcd
    // poll confirms it independently (and reads the new leader).
    let removed_at = removed.map(|(t, _)| t).or(done.member_removed);
    say(format!(
        "  member removed:     {target_member} {} (etcd confirmed {}); new leader {}",
        at(removed_at),
        at(done.member_removed),
        done.leader_after.as_deref().unwrap_or("none")
    ));
    let deleted_at = deleted.map(|(t, _)| t).or(done.machine_deleted);
    say(format!("  Machine deleted:    {target} {}", at(deleted_at)));
    let created_at = created
        .map(|(t, _)| t)
        .or(done.replacement.as_ref().map(|(t, _)| *t));
    say(format!(
        "  Machine replaced:   {target} -> {replacement}, created {}",
        at(created_at)
    ));
    if let Some((t, p)) = &done.provisioned {
        say(format!(
            "  replacement joined: etcd member {} on Node {} at {} (simulated infrastructure)",
            p.member,
            p.node,
            secs(*t)
        ));
    }
    match &available_false {
        None => say("  Available:          stayed True throughout"),
        Some((t, v)) => say(format!("  Available:          at {}: {v}", secs(*t))),
    }
    let (healthy_at, after) = done.healthy.take().expect("the loop ends when healthy");
    say(format!(
        "  healthy again:      at {} (3 of 3 voters, nothing left to do)",
        secs(healthy_at)
    ));
    say("");
    say("Final membership:");
    print_state(&after);
    drop(observer);
    drop(admin);
    let dir = sandbox.etcd.dir().to_path_buf();
    drop(sandbox);
    say("");
    say(format!(
        "Done in {} in all (bring-up {}, remediation {} from the mark); etcd processes stopped, {} removed.",
        secs(run_started.elapsed()),
        secs(bring_up_done),
        secs(remediation_done),
        dir.display()
    ));
    Ok(())
}

// ---------------------------------------------------------------------------
// Against a real management cluster.

async fn against_cluster(path: &Path) -> Result<(), DemoError> {
    say(format!(
        "k3s-control-plane demo against the management cluster of {}",
        path.display()
    ));
    say("Nothing is simulated: the management cluster, CAPI, the machines and their etcd are");
    say("yours; this process runs the real controller against them (do not run it next to a");
    say("deployed copy of this provider). It marks nothing: let a MachineHealthCheck mark a");
    say("control-plane Machine and watch. Requires our CRDs and CAPI's, a Cluster with its");
    say("KThreesControlPlane, and the <cluster>-kubeconfig and <cluster>-etcd Secrets.");
    let client = management_client(Some(&path.to_path_buf()))
        .await
        .map_err(DemoError::Failed)?;
    let kcps: Api<KThreesControlPlane> = Api::all(client.clone());
    let list = kcps.list(&ListParams::default()).await.map_err(|e| {
        DemoError::Failed(format!(
            "--kubeconfig {}: cannot list KThreesControlPlanes (are the CRDs installed? `k3s-control-plane crds | kubectl apply -f -`): {e}",
            path.display()
        ))
    })?;
    say(format!("{} KThreesControlPlane(s):", list.items.len()));
    for kcp in &list.items {
        say(format!(
            "  {}/{}",
            kcp.namespace().unwrap_or_default(),
            kcp.name_any()
        ));
    }
    let clock = Clock::default();
    clock.start();
    let timeline =
        start_timeline(client.clone(), None, clock, Watches::EVENTS_AND_MACHINES).await?;
    let metrics = Metrics::register(&mut Registry::default());
    let ctx = Context::new(client, metrics, EtcdPool::default(), Settings::default());
    let (stop, stopped) = oneshot::channel::<()>();
    let controller = tokio::spawn(controller::run(ctx, async {
        let _ = stopped.await;
    }));
    say("Controller running; printing Events and Machine changes (Ctrl-C to stop).");
    let _ = tokio::signal::ctrl_c().await;
    let _ = stop.send(());
    let _ = controller.await;
    drop(timeline);
    say("Stopped.");
    Ok(())
}
