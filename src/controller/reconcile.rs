//! One reconcile of a KThreesControlPlane, as a named pipeline:
//! observe -> validate + decide (pure, [`crate::decision::plan`]) -> act (one step) -> status.
//!
//! When that one step was a step of a removal (a remediation or scale-down)
//! and it landed, the pipeline runs again at once on a fresh read, up to
//! `Settings::max_chained_steps` times: each step is still decided on its own
//! observation, but a removal does not wait in the work queue between steps.
//!
//! What a chained pass reads again: the KThreesControlPlane, Cluster and
//! Machines always (from the API server). The workload cluster's Nodes and the
//! etcd membership only when the step before touched etcd, or when the pass is
//! about to: a step that changes etcd or its membership (a leadership move, a
//! member removal, a replacement that will join) is always decided on an etcd
//! snapshot of its own pass.

use std::sync::Arc;
use std::time::Instant;

use kube::runtime::controller::Action as Requeue;
use kube::{Api, ResourceExt};
use tracing::{Instrument, info, instrument, warn};

use crate::api::{KThreesControlPlane, Machine};

use super::act::act;
use super::apply_lifecycle::apply as apply_lifecycle;
use super::caches::Source;
use super::certificate_expiry;
use super::context::Context;
use super::create::ensure_template_owner;
use super::error::{Error, Result};
use super::observe::{ManagementRead, WorkloadObservation, observe_management, observe_workload};
use super::publish::publish;

use super::status::{write_kcp_status, write_kcp_status_after, write_machine_conditions};
use super::sync_machines::{planned_syncs, sync_machines};
use crate::decision::chain::chained_pass_may_act;
use crate::decision::pace::{self, Next, Paces};
use crate::decision::plan::Action;
use crate::decision::step_events;
use crate::decision::world::{EtcdObservation, World};
use crate::decision::{Decision, decide, decide_lifecycle};
use crate::lifecycle::{DeletionStep, Lifecycle};

#[instrument(skip_all, fields(kcp = %format!("{}/{}", kcp.namespace().unwrap_or_default(), kcp.name_any()), cluster, rule))]
pub async fn reconcile(kcp: Arc<KThreesControlPlane>, ctx: Arc<Context>) -> Result<Requeue> {
    let started = Instant::now();
    ctx.metrics.reconciles.inc();
    // At rest nothing publishes, so expired Events are forgotten here.
    ctx.recorder.prune();
    let key = format!("{}/{}", kcp.namespace().unwrap_or_default(), kcp.name_any());
    let result = reconcile_inner(&kcp, &ctx).await;
    ctx.metrics
        .reconcile_seconds
        .observe(started.elapsed().as_secs_f64());
    if result.is_ok() {
        ctx.reset_error_backoff(&key);
    }
    result
}

async fn reconcile_inner(cached: &KThreesControlPlane, ctx: &Context) -> Result<Requeue> {
    // The watch cache may lag behind our own last writes (an annotation, the
    // status with lastRemediation): decide on, and build status from, the
    // current object, or a stale status would be written back.
    // Read only when the cache has not yet shown our last write.
    let namespace = cached.namespace().unwrap_or_default();
    let kcps: Api<KThreesControlPlane> = Api::namespaced(ctx.client.clone(), &namespace);
    let read = if ctx.kcp_writes.cache_is_current(cached) {
        Some(cached.clone())
    } else {
        let fresh = get_kcp(&kcps, cached).await?;
        if let Some(fresh) = &fresh
            && fresh.resource_version() == cached.resource_version()
        {
            ctx.kcp_writes.finished(fresh);
        }
        fresh
    };
    let Some(mut current) = read else {
        // Gone: its connections, caches and series go with it.
        ctx.forget_control_plane(&namespace, &cached.name_any());
        if let Some(cluster) = super::observe::cluster_name(cached) {
            ctx.forget_cluster(&namespace, &cluster);
        }
        return Ok(Requeue::await_change());
    };
    if let Some(reason) =
        crate::decision::shard::ownership(current.labels(), ctx.settings.watch_filter.as_deref())
            .reason()
    {
        // Read fresh and relabelled since the watch delivered it: the watch's
        // DELETED follows; let go now.
        info!(rule = crate::decision::shard::NOT_OURS_RULE, "{reason}");
        release(ctx, &current);
        return Ok(Requeue::await_change());
    }
    let mut observed = observe_management(ctx, current.clone(), Source::Caches).await?;
    if let Some(cluster) = &observed.0.cluster_name {
        tracing::Span::current().record("cluster", cluster.as_str());
    }
    let mut chained = 0;
    // The removal whose step landed last in this reconcile, if any.
    let mut continuing: Option<String> = None;
    // The workload side the last pass decided on, when its step left it as is.
    let mut previous: Option<WorkloadObservation> = None;
    loop {
        // Boxed: the pass is a large future, and a reconcile awaited on a
        // small stack (a test's thread) must not hold it inline.
        let pass = decide_and_act(
            ctx,
            &kcps,
            &current,
            observed,
            continuing.as_deref(),
            previous.take(),
        );
        // A chained pass logs under its own span, with its own rule.
        let span = if chained == 0 {
            tracing::Span::current()
        } else {
            tracing::info_span!("chained", step = chained, rule = tracing::field::Empty)
        };
        match Box::pin(pass.instrument(span)).await? {
            Pass::Done(requeue) => return Ok(requeue),
            // What the pass decided on was behind: decide again on what was
            // read, and on a fresh workload observation.
            Pass::Stale(fresh) => observed = *fresh,
            // The bound keeps one removal from holding a worker indefinitely.
            Pass::Stepped { requeue, .. } if chained >= ctx.settings.max_chained_steps => {
                return Ok(requeue);
            }
            Pass::Stepped {
                machine, workload, ..
            } => {
                continuing = Some(machine);
                previous = workload.map(|w| *w);
                // The step's effect is observable now: look again at once,
                // from the API server (the caches have not seen our own write
                // yet), and decide the next step on that.
                chained += 1;
                ctx.metrics.chained_steps.inc();
                let Some(fresh) = get_kcp(&kcps, &current).await? else {
                    // Deleted meanwhile: the next reconcile finds it gone.
                    return Ok(Requeue::requeue(pace::SOON));
                };
                current = fresh;
                observed =
                    Box::pin(observe_management(ctx, current.clone(), Source::Chained)).await?;
            }
        }
    }
}

/// Let go of a control plane that left this process's watch (deleted, or
/// relabelled to another shard): its pooled etcd connections, workload
/// client, cached Secrets, written-annotation records and metric series.
/// What the next owner needs is persisted on the objects (the hook values,
/// the KThreesControlPlane's annotations), never here.
pub fn release(ctx: &Context, kcp: &KThreesControlPlane) {
    let namespace = kcp.namespace().unwrap_or_default();
    ctx.forget_control_plane(&namespace, &kcp.name_any());
    if let Some(cluster) = super::observe::cluster_name(kcp) {
        ctx.forget_cluster(&namespace, &cluster);
    }
    ctx.reset_error_backoff(&format!("{namespace}/{}", kcp.name_any()));
    ctx.metrics.released_control_planes.inc();
}

/// Still ours, asked on a read taken now, right before acting: a reconcile
/// may have started on the object as it was before a relabel to another
/// shard. `Some(reason)` when it is no longer ours (the refusal is counted,
/// logged with its rule, and what was held for it released). Without a
/// `--watch-filter` nothing is read: every control plane is ours.
async fn left_this_shard(
    ctx: &Context,
    kcps: &Api<KThreesControlPlane>,
    kcp: &KThreesControlPlane,
    rule: &str,
) -> Result<Option<String>> {
    let Some(filter) = ctx.settings.watch_filter.as_deref() else {
        return Ok(None);
    };
    let labels = match get_kcp(kcps, kcp).await? {
        Some(now) => now.labels().clone(),
        // Gone: nobody acts on it; the watch's DELETED releases it.
        None => Default::default(),
    };
    let Some(reason) = crate::decision::shard::ownership(&labels, Some(filter)).reason() else {
        return Ok(None);
    };
    ctx.metrics.shard_refusals.inc();
    warn!(
        rule = crate::decision::shard::NOT_OURS_RULE,
        decided = rule,
        "refusing to act: {reason}"
    );
    release(ctx, kcp);
    Ok(Some(reason))
}

/// `kcp` as the API server has it now (`None`: gone).
async fn get_kcp(
    kcps: &Api<KThreesControlPlane>,
    kcp: &KThreesControlPlane,
) -> Result<Option<KThreesControlPlane>> {
    kcps.get_opt(&kcp.name_any())
        .await
        .map_err(|source| Error::Observe {
            context: format!(
                "get KThreesControlPlane {}/{}",
                kcp.namespace().unwrap_or_default(),
                kcp.name_any()
            ),
            source,
        })
}

/// How one pass of decide-and-act ended.
enum Pass {
    Done(Requeue),
    /// A step of the removal of `machine` was carried out; `requeue` is what
    /// to do if no further pass follows in this reconcile. `workload` is what
    /// the pass observed of the workload cluster and etcd, when the step did
    /// not touch them.
    Stepped {
        requeue: Requeue,
        machine: String,
        workload: Option<Box<WorkloadObservation>>,
    },
    /// About to act on what it decided on, the pass found it behind: the
    /// cached management objects (a fresh read differs), or the previous
    /// pass's etcd snapshot under a step that needs one of its own.
    Stale(Box<(World, ManagementRead)>),
}

/// Fresh before acting: when `read` came (partly) from caches, read the
/// management objects again; `Some` with the fresh observation when any
/// version differs, `None` when the cached one is as current (or was fresh).
async fn fresh_if_changed(
    ctx: &Context,
    kcp: &KThreesControlPlane,
    read: &ManagementRead,
    rule: &str,
) -> Result<Option<(World, ManagementRead)>> {
    if !read.from_caches {
        return Ok(None);
    }
    let fresh = observe_management(ctx, kcp.clone(), Source::Api).await?;
    if fresh.1.fingerprint == read.fingerprint {
        return Ok(None);
    }
    info!(
        rule,
        "the cached Cluster, Machines or Secrets were behind the API server: deciding again on a fresh read before acting"
    );
    ctx.metrics.stale_cache_decisions.inc();
    Ok(Some(fresh))
}

/// One pass: decide on `world` and act. `continuing` names the Machine whose
/// removal a step of this reconcile carried on: such a pass only takes the
/// next step of that removal (or waits, or idles); any other action is left
/// to the next reconcile, so a chain never starts a second removal.
/// `previous` is the workload side the pass before decided on, if its step
/// left it as it was: decided on again, unless the step now due needs an etcd
/// snapshot of its own.
async fn decide_and_act(
    ctx: &Context,
    kcps: &Api<KThreesControlPlane>,
    kcp: &KThreesControlPlane,
    (mut world, read): (World, ManagementRead),
    continuing: Option<&str>,
    previous: Option<WorkloadObservation>,
) -> Result<Pass> {
    let chain_ends = || Ok(Pass::Done(Requeue::requeue(pace::SOON)));
    let chain_stops = |decision: &Decision| {
        continuing.is_some_and(|machine| {
            !chained_pass_may_act(
                machine,
                decision.acts(),
                decision.planned().map(|p| &p.action),
            )
        })
    };
    let lifecycle = decide_lifecycle(&world);
    if !matches!(lifecycle, Lifecycle::Proceed { .. }) {
        // The workload is not looked at: the record is the lifecycle's.
        let decision = decide(&world, lifecycle);
        if chain_stops(&decision) {
            return chain_ends();
        }
        if decision.acts()
            && let Some(fresh) = fresh_if_changed(ctx, kcp, &read, &decision.rule()).await?
        {
            return Ok(Pass::Stale(Box::new(fresh)));
        }
        if decision.acts()
            && left_this_shard(ctx, kcps, kcp, &decision.rule())
                .await?
                .is_some()
        {
            return Ok(Pass::Done(Requeue::await_change()));
        }
        return settle_lifecycle(ctx, kcps, &world, &decision)
            .await
            .map(Pass::Done);
    }
    if world.cluster_name.is_some() {
        ensure_template_owner(ctx, &world).await?;
    }
    let reused = previous.is_some();
    let etcd = match previous {
        Some(previous) => {
            ctx.metrics.reused_workload_observations.inc();
            previous.restore(&mut world)
        }
        None => match observe_workload(ctx, &mut world, &read.secrets).await {
            Ok(etcd) => etcd,
            Err(err) => {
                // Nothing current is known of its etcd.
                world.etcd = EtcdObservation::Unreachable {
                    reason: err.to_string(),
                };
                record_etcd_quorum(ctx, &world);
                record_etcd_space(ctx, &world, None);
                return Err(err);
            }
        },
    };
    record_etcd_quorum(ctx, &world);
    world.leadership_move = super::etcd_leader_move::observe(ctx, &world).await;
    let decision = decide(&world, lifecycle);
    record_etcd_space(ctx, &world, decision.etcd_space.as_ref());
    if chain_stops(&decision) {
        return chain_ends();
    }
    if reused
        && let Some(plan) = decision.planned()
        && plan.action.needs_its_own_etcd_snapshot()
    {
        // Decided on the pass before's snapshot: take one of its own first.
        WorkloadObservation::forget(&mut world);
        return Ok(Pass::Stale(Box::new((world, read))));
    }
    if decision.acts()
        && let Some(fresh) = fresh_if_changed(ctx, kcp, &read, &decision.rule()).await?
    {
        return Ok(Pass::Stale(Box::new(fresh)));
    }
    if decision.acts()
        && left_this_shard(ctx, kcps, kcp, &decision.rule())
            .await?
            .is_some()
    {
        return Ok(Pass::Done(Requeue::await_change()));
    }
    act_on_plan(ctx, kcps, kcp, world, etcd, decision).await
}

/// Publish `decision`'s Event when the status it implies is new.
async fn announce(
    ctx: &Context,
    kcp: &KThreesControlPlane,
    decision: &Decision,
    status_changed: bool,
) {
    if !status_changed {
        return;
    }
    if let Some(event) = decision.event() {
        publish(ctx, kcp, event.type_, event.reason, &event.note).await;
        if let Some(outcome) = event.remediation_outcome {
            ctx.metrics.remediation(outcome);
        }
    }
}

/// Write conditions, then carry out the plan's one action, then status.
async fn act_on_plan(
    ctx: &Context,
    kcps: &Api<KThreesControlPlane>,
    kcp: &KThreesControlPlane,
    mut world: World,
    etcd: Option<std::sync::Arc<crate::etcd::EtcdCluster>>,
    mut decision: Decision,
) -> Result<Pass> {
    let namespace = kcp.namespace().unwrap_or_default();
    let machines: Api<Machine> = Api::namespaced(ctx.client.clone(), &namespace);
    tracing::Span::current().record("rule", decision.rule().as_str());

    if let Some(refusal) = decision.refusal() {
        // Refuse, say why on the object, and act on nothing.
        let changed = kcp.status.as_ref() != Some(&decision.status);
        write_kcp_status(kcps, &ctx.kcp_writes, kcp, &decision.status).await?;
        announce(ctx, kcp, &decision, changed).await;
        if changed {
            warn!(rule = refusal.rule(), %refusal, "refusing to act");
        }
        return Ok(Pass::Done(requeue(pace::after_refusal(
            refusal,
            paces(ctx),
        ))));
    }

    // Conditions first: they must say why, also when acting fails.
    for (name, changes) in std::mem::take(&mut decision.machine_conditions) {
        let Some(machine) = world.machine(&name) else {
            continue;
        };
        // Later writes of this reconcile are conditional on the new version.
        if let Some(updated) = write_machine_conditions(&machines, machine, changes).await? {
            world.replace_machine(updated);
        }
    }
    // In place, no rollout: template metadata and node*Timeouts (CAPI's
    // syncMachines). Asked first whether the control plane is still ours: a
    // late pass of the shard it left would label its Machines back.
    let planned = planned_syncs(&world);
    if !planned.is_empty()
        && left_this_shard(ctx, kcps, kcp, "sync-machines")
            .await?
            .is_some()
    {
        return Ok(Pass::Done(Requeue::await_change()));
    }
    let written = sync_machines(ctx, &world, planned).await?;
    for updated in written {
        world.replace_machine(updated);
    }
    // What our handshakes saw of certificate expiry, told to CAPI.
    certificate_expiry::annotate_configs(ctx, &world, &decision).await?;
    if let Some(cluster) = &world.cluster_name {
        certificate_expiry::record_expiries(ctx, kcp, cluster, &decision);
    }
    let Some(plan) = decision.planned() else {
        unreachable!("a proceeding decision has a plan or a refusal")
    };
    let handle = etcd.clone();
    if decision.acts() {
        // Asked again right before the step: the conditions and in-place
        // writes above took requests of their own, and a relabel to another
        // shard may have come meanwhile. The window left is this one read.
        if left_this_shard(ctx, kcps, kcp, &decision.rule())
            .await?
            .is_some()
        {
            return Ok(Pass::Done(Requeue::await_change()));
        }
        ctx.metrics.actions.inc();
    }
    let outcome = match act(ctx, &world, plan, etcd).await {
        Ok(outcome) => outcome,
        // A write conflict is an ordinary race: observed again, quietly.
        Err(err) if err.is_conflict() => return Err(err),
        Err(err) => {
            let event =
                step_events::step_failed_event(Some(&plan.action), &plan.rule, &err.to_string());
            if let Some(outcome) = event.remediation_outcome {
                ctx.metrics.remediation(outcome);
            }
            publish(ctx, kcp, event.type_, event.reason, &event.note).await;
            return Err(err);
        }
    };
    let snapshot_failed = match &outcome.snapshot {
        Some(crate::decision::etcd_backup::SnapshotOutcome::Failed(f)) => Some(f.message.clone()),
        _ => None,
    };
    let unusable = match &outcome.restore {
        Some(crate::decision::etcd_restore::RestoreOutcome::Unusable(message)) => {
            Some(message.clone())
        }
        _ => None,
    };
    let status = decision.status_after(
        &world,
        outcome.last_remediation,
        outcome.snapshot,
        outcome.restore,
    );
    let status_changed = kcp.status.as_ref() != Some(&status);
    write_kcp_status_after(kcps, &ctx.kcp_writes, kcp, decision.acts(), &status).await?;
    announce(ctx, kcp, &decision, status_changed).await;
    if let Some(message) = snapshot_failed {
        // Recorded and announced: retried at this object's error backoff.
        return Err(Error::Snapshot(message));
    }
    if let Some(message) = unusable {
        // Recorded and announced; nothing was deleted. Retried at this
        // object's error backoff (the person may fix the target or the name).
        return Err(Error::Restore(message));
    }

    let next = requeue(pace::after_plan(&plan.action, &plan.rule, paces(ctx)));
    match &plan.action {
        Action::Wait => {
            // An expected wait: INFO once per change of the status, DEBUG after.
            if status_changed {
                info!(rule = %plan.rule, "{}", plan.message);
            } else {
                tracing::debug!(rule = %plan.rule, "{}", plan.message);
            }
            Ok(Pass::Done(next))
        }
        Action::Step { removal, .. } => {
            let machine = removal.machine.clone();
            let workload = (!plan.action.changes_etcd())
                .then(|| Box::new(WorkloadObservation::of(world, handle)));
            Ok(Pass::Stepped {
                requeue: next,
                machine,
                workload,
            })
        }
        Action::Idle
        | Action::CreateMachine
        | Action::AddHooks { .. }
        | Action::RemoveOrphan { .. }
        | Action::EtcdSpace { .. }
        | Action::EtcdSnapshot { .. }
        | Action::EtcdRestore { .. } => Ok(Pass::Done(next)),
    }
}

/// Act on a lifecycle decision that stops this reconcile before remediation
/// and scaling, say so in status, and choose when to look again.
async fn settle_lifecycle(
    ctx: &Context,
    kcps: &Api<KThreesControlPlane>,
    world: &World,
    decision: &Decision,
) -> Result<Requeue> {
    let kcp = &world.kcp;
    let lifecycle = &decision.lifecycle;
    // etcd is not read on this path: no quorum series either.
    record_etcd_quorum(ctx, world);
    record_etcd_space(ctx, world, None);
    let rule = decision.rule();
    tracing::Span::current().record("rule", rule.as_str());
    if decision.acts() {
        ctx.metrics.actions.inc();
    }
    let applied = apply_lifecycle(ctx, world, lifecycle).await;
    if let (Lifecycle::Secrets { .. }, Some(cluster)) = (lifecycle, &world.cluster_name) {
        // What we wrote (or failed to) is read again next time.
        ctx.secrets
            .invalidate(&kcp.namespace().unwrap_or_default(), cluster);
    }
    if let Err(err) = applied {
        if err.is_conflict() {
            // An ordinary race (e.g. with CAPI's owner-reference patch).
            return Err(err);
        }
        let event = step_events::step_failed_event(None, &rule, &err.to_string());
        publish(ctx, kcp, event.type_, event.reason, &event.note).await;
        return Err(err);
    }
    let next = requeue(pace::after_lifecycle(lifecycle, paces(ctx)));
    let gone = matches!(
        lifecycle,
        Lifecycle::Delete {
            step: DeletionStep::RemoveFinalizer,
            ..
        }
    );
    if gone {
        ctx.forget_control_plane(&kcp.namespace().unwrap_or_default(), &kcp.name_any());
        if let Some(cluster) = &world.cluster_name {
            ctx.forget_cluster(&kcp.namespace().unwrap_or_default(), cluster);
        }
        return Ok(next);
    }
    let changed = kcp.status.as_ref() != Some(&decision.status);
    write_kcp_status_after(
        kcps,
        &ctx.kcp_writes,
        kcp,
        decision.acts(),
        &decision.status,
    )
    .await?;
    if changed {
        info!(rule = %rule, "{}", decision.message());
    }
    Ok(next)
}

/// The paces `run` was configured with.
fn paces(ctx: &Context) -> Paces {
    Paces {
        wait: ctx.settings.wait_requeue,
        idle: ctx.settings.idle_requeue,
    }
}

/// kube-runtime's requeue for when [`pace`] says to look again.
fn requeue(next: Next) -> Requeue {
    match next {
        Next::OnChange => Requeue::await_change(),
        Next::After(delay) => Requeue::requeue(delay),
    }
}

/// The quorum gauges of this world's cluster: the numbers `status.etcd`
/// gets, or no series when etcd was not read this reconcile.
fn record_etcd_quorum(ctx: &Context, world: &World) {
    if let Some(cluster) = &world.cluster_name {
        let namespace = world.kcp.namespace().unwrap_or_default();
        ctx.metrics.etcd_quorum(
            &format!("{namespace}/{cluster}"),
            crate::decision::status::etcd_status(world).as_ref(),
        );
    }
}

/// The space gauges of this world's cluster, from the decision record (no
/// series when etcd was not read).
fn record_etcd_space(
    ctx: &Context,
    world: &World,
    space: Option<&crate::decision::etcd_space::EtcdSpace>,
) {
    if let Some(cluster) = &world.cluster_name {
        let namespace = world.kcp.namespace().unwrap_or_default();
        ctx.metrics
            .etcd_space(&format!("{namespace}/{cluster}"), space.map(|s| &s.cluster));
    }
}

/// On error: log, count by stage, and retry with this object's own backoff.
pub fn error_policy(kcp: Arc<KThreesControlPlane>, error: &Error, ctx: Arc<Context>) -> Requeue {
    let key = format!("{}/{}", kcp.namespace().unwrap_or_default(), kcp.name_any());
    let delay = ctx.next_error_backoff(&key);
    if error.is_conflict() {
        // An ordinary race with another writer: observe again, quietly.
        tracing::debug!(kcp = %key, %error, retry_in = ?delay, "write conflict, observing again");
        ctx.metrics.error("conflict");
        return Requeue::requeue(delay);
    }
    ctx.metrics.error(error.stage());
    warn!(kcp = %key, stage = error.stage(), %error, retry_in = ?delay, "reconcile failed");
    Requeue::requeue(delay)
}
