//! `k3s-control-plane demo`: the provider's main job, on a machine with no
//! cluster. A real 3-member TLS etcd cluster plays the workload cluster's
//! embedded etcd, the real controller runs, the etcd leader's Machine is marked
//! unhealthy as a MachineHealthCheck would, and every Event and Machine change
//! is printed as it happens, then a summary with the times.
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

use crate::api::KThreesControlPlane;
use crate::controller::etcd_pool::EtcdPool;
use crate::controller::metrics::Metrics;
use crate::controller::{self, Context, Settings};
use crate::harness::etcd::etcd_binary;
use crate::harness::infra_sim::{self, Provisioned};
use crate::harness::sandbox::{KCP, NAMESPACE, Sandbox, SandboxError};

use crate::cli::inspect::{self, Report, init_quiet_logging, read_only_context, render_members};
use crate::cli::run::management_client;

mod timeline;

use timeline::{Clock, MACHINE_CREATED, MACHINE_DELETED, say, secs, start_timeline};

/// How long the remediation may take from the mark to a healthy cluster.
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
        "etcd binary not found (looked at $ETCD_BIN, then etcd on PATH): run hack/setup.sh to install etcd 3.4 (Debian etcd-server)"
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
    init_quiet_logging();
    let result = match &args.kubeconfig {
        Some(path) => against_cluster(path).await,
        // Dropping the demo on Ctrl-C drops the sandbox: its etcd members are
        // killed and its files removed.
        None => tokio::select! {
            result = sandbox_demo() => result,
            _ = tokio::signal::ctrl_c() => Err(DemoError::Interrupted),
        },
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

fn print_intro() {
    say("k3s-control-plane demo: remediating the etcd leader's control-plane Machine");
    say("");
    say("What is real:");
    say("  - etcd: 3 real etcd 3.4 processes, mutual TLS (k3s-like PKI, k3s-style member");
    say("    names), each on its own 127.77.x.y loopback address, ports 2379/2380;");
    say("  - the controller: the real code (observe -> plan -> act -> status), the same");
    say("    binary as `k3s-control-plane run`, talking to etcd over verified TLS.");
    say("What is simulated:");
    say("  - the management and workload Kubernetes API servers: in-process test API");
    say("    servers speaking the Kubernetes REST/watch protocol;");
    say("  - Cluster API's Machine controller (finalizer, pre-terminate hook wait) and the");
    say("    machines' infrastructure (a replacement \"boots\": its new etcd member is real,");
    say("    it joins as a learner and is promoted, as k3s does).");
    say("");
}

/// Until the controller has written the control plane's status once: the
/// timeline then starts from a settled world.
async fn wait_settled(sandbox: &Sandbox) -> Result<(), DemoError> {
    sandbox
        .wait_for("the controller's first reconcile", LIMIT, || async {
            let kcp = sandbox
                .kcp_api()
                .get(KCP)
                .await
                .map_err(|e| e.to_string())?;
            let generation = kcp.metadata.generation;
            match kcp.status.as_ref().and_then(|s| s.observed_generation) {
                Some(g) if Some(g) == generation => Ok(()),
                other => Err(format!("observedGeneration {other:?}")),
            }
        })
        .await?;
    Ok(())
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

/// When each step was first observed, relative to the mark.
#[derive(Default)]
struct Milestones {
    member_removed: Option<Duration>,
    leader_after: Option<String>,
    machine_deleted: Option<Duration>,
    decommissioned: bool,
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

async fn sandbox_demo() -> Result<(), DemoError> {
    const MEMBERS: usize = 3;
    let run_started = Instant::now();
    print_intro();
    etcd_binary().map_err(|_| DemoError::EtcdMissing)?;

    say("Starting the etcd cluster, the API servers and the controller...");
    let started = Instant::now();
    let mut sandbox = Sandbox::start(MEMBERS).await?;
    let etcd_ready = started.elapsed();
    for (i, m) in sandbox.etcd.members().iter().enumerate() {
        say(format!(
            "  etcd member {} at {} (Machine {}, Node {})",
            m.name,
            m.client_url(),
            sandbox.machines[i],
            m.node_name
        ));
    }
    say(format!(
        "  etcd data and certificates: {} (removed at the end)",
        sandbox.etcd.dir().display()
    ));
    say(format!(
        "  management API (simulated): {}   workload API (simulated): {}",
        sandbox.management.url(),
        sandbox.workload.url()
    ));
    say(format!(
        "  KThreesControlPlane {NAMESPACE}/{KCP}, {MEMBERS} Machines; ready in {}",
        secs(etcd_ready)
    ));

    let controller = sandbox.start_controller();
    wait_settled(&sandbox).await?;
    let observer = read_only_context(sandbox.client());
    let before = report(&observer).await?;
    say("");
    say("Before (what `k3s-control-plane inspect default/demo-control-plane` shows):");
    print_state(&before);

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
    let originals = sandbox.machines.clone();

    // etcd (strict reconfiguration check) refuses MemberRemove as "unhealthy
    // cluster" until the receiving member has been connected to every peer for
    // 5 s. A production cluster is long past that; a cluster started a second
    // ago is not, and the controller would retry until it is. Start from a
    // realistic cluster instead.
    let settled_at = started + etcd_ready + ETCD_PEER_HEALTH_INTERVAL;
    if Instant::now() < settled_at {
        say("");
        say(format!(
            "Waiting {} more: etcd accepts member removals only once its members have been connected for 5 s.",
            secs(settled_at - Instant::now())
        ));
        tokio::time::sleep_until(settled_at).await;
    }

    let clock = Clock::default();
    let timeline = start_timeline(sandbox.client(), Some(NAMESPACE), clock.clone()).await?;
    say("");
    say(format!(
        "Marking Machine {target} (it runs the etcd LEADER {target_member}) unhealthy, as a MachineHealthCheck does:"
    ));
    say("HealthCheckSucceeded=False, OwnerRemediated=False. Times are from this moment.");
    say("");
    clock.start();
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
        if done.machine_deleted.is_some() && !done.decommissioned {
            infra_sim::decommission(&mut sandbox, &target).await?;
            done.decommissioned = true;
            say(format!(
                "{} infrastructure (simulated): {target}'s server is gone; its Node {} is deleted",
                clock.stamp(),
                sandbox.etcd.member(index).node_name
            ));
        }
        if done.decommissioned
            && done.provisioned.is_none()
            && let Some((_, new)) = done.replacement.clone()
        {
            say(format!(
                "{} infrastructure (simulated): {new} boots; k3s joins etcd as a learner (a real new etcd process)",
                clock.stamp()
            ));
            let provisioned = infra_sim::provision(&mut sandbox, &new, LIMIT).await?;
            say(format!(
                "{} infrastructure (simulated): etcd member {} promoted to voter ({} MemberPromote attempt(s)); Node {} registered at {}",
                clock.stamp(),
                provisioned.member,
                provisioned.promote_attempts,
                provisioned.node,
                provisioned.ip
            ));
            done.provisioned = Some((clock.elapsed(), provisioned));
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
    controller.stop().await;
    // Let the last lines of the watches print, then stop them.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let moved = timeline.first("EtcdLeadershipMoved", |_| true);
    let removed = timeline.first("EtcdMemberRemoved", |note| note.contains(&target_member));
    let deleted = timeline.first(MACHINE_DELETED, |name| name == target);
    let (_, replacement) = done.replacement.clone().unwrap_or_default();
    let created = timeline.first(MACHINE_CREATED, |name| name == replacement);
    drop(timeline);

    say("");
    say("Summary (times from the mark):");
    let at = |d: Option<Duration>| d.map_or_else(|| "?".to_string(), |d| format!("at {}", secs(d)));
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
        "Done in {} in all (environment ready in {}); etcd processes stopped, {} removed.",
        secs(run_started.elapsed()),
        secs(etcd_ready),
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
    let timeline = start_timeline(client.clone(), None, clock).await?;
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
