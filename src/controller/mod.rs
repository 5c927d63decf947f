//! kube-runtime wiring of the KThreesControlPlane controller: the reconcile
//! pipeline (observe -> validate -> decide -> act -> status), its context,
//! metrics and probe endpoints.

pub mod act;
pub mod apply_lifecycle;
pub mod caches;
pub mod certificate_expiry;
pub mod cluster_secrets;
pub mod context;
pub mod contract_versions;
pub mod create;
pub mod defragmented;
pub mod error;
pub mod etcd_leader_move;
pub mod etcd_pool;
pub mod etcd_restore;
pub mod etcd_snapshot;
pub mod http;
pub mod k3s_serving;
pub mod kcp_metadata;
pub mod machine_store;
pub mod metrics;
pub mod observe;
pub mod publish;
pub mod reconcile;
pub mod recorder;
pub mod replica_election;
pub mod status;
pub mod sync_machines;
pub mod written_annotations;

use std::sync::Arc;

use futures::{FutureExt, StreamExt, TryStreamExt};
use kube::runtime::controller::Action as Requeue;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, WatchStreamExt, reflector, watcher};
use kube::{Api, Client, ResourceExt};

use crate::api::{Cluster, KThreesControlPlane, Machine};
pub use context::{Context, Settings};
pub use error::Error;

/// Run the controller until `shutdown` resolves (in-flight reconciles finish
/// first). Each reconcile consults `ctx.leader` (see [`guarded_reconcile`]).
///
/// A `shutdown` that comes before the control planes' cache has synced ends
/// the controller at once: no reconcile can have started yet. (kube-runtime's
/// graceful shutdown alone would wait forever there: it stops polling the
/// watch streams, which are also what fills the cache, while its runner waits
/// for that cache to be ready before it can end.)
pub async fn run(
    ctx: Arc<Context>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let client: Client = ctx.client.clone();
    // Stopped or dropped (the lease ran out): no etcd series go stale here.
    let _forget = ctx.metrics.forget_etcd_quorums_on_drop();
    let (kcps, machines, clusters): (Api<KThreesControlPlane>, Api<Machine>, Api<Cluster>) =
        match &ctx.settings.namespace {
            Some(ns) => (
                Api::namespaced(client.clone(), ns),
                Api::namespaced(client.clone(), ns),
                Api::namespaced(client.clone(), ns),
            ),
            None => (
                Api::all(client.clone()),
                Api::all(client.clone()),
                Api::all(client.clone()),
            ),
        };
    // With a watch filter all three watches select the shard's label: its
    // Machines carry it (born with it, kept by the in-place sync), and a
    // cluster's Machines are read from the store only while it is known to
    // hold them whole (`caches::MachineCoverage`). Each watch feeds a
    // reflector store the reconcile reads from (see `caches`) and triggers
    // reconciles; objects are trimmed.
    let filtered = watch_config(ctx.settings.watch_filter.as_deref());
    let coverage = Arc::new(caches::MachineCoverage::new(
        ctx.settings.watch_filter.clone(),
        ctx.settings.secret_refresh,
    ));
    let (kcp_store, kcp_writer) = reflector::store();
    let releasing = ctx.clone();
    let kcp_stream = watcher(kcps, filtered.clone())
        .default_backoff()
        .modify(caches::trim)
        .reflect(kcp_writer)
        .inspect_ok(move |event| {
            // DELETED: gone, or (with a watch filter) relabelled out of this
            // shard, as the API server reports an object that stops matching
            // the selector. Nothing more is reconciled for it here.
            if let watcher::Event::Delete(kcp) = event {
                tracing::info!(
                    kcp = %format!("{}/{}", kcp.namespace().unwrap_or_default(), kcp.name_any()),
                    "left this process's watch (deleted, or relabelled to another shard): released"
                );
                reconcile::release(&releasing, kcp);
            }
        })
        .applied_objects();
    let (machine_store, mut machine_writer) = machine_store::MachineStore::new();
    let uncovering = coverage.clone();
    let machine_stream = watcher(machines, filtered.clone())
        .default_backoff()
        .modify(caches::trim)
        .inspect_ok(move |event| {
            // A cluster that lost a Machine (deleted, its label changed) is
            // no longer known to be held whole: listed again before it is
            // served from the store. A reconcile running between the two
            // lines may see the store without the Machine while still
            // covered: like any cache lag, an action decided on that is
            // checked against a fresh LIST first.
            match machine_writer.apply(event) {
                machine_store::Change::Left(namespace, cluster) => {
                    uncovering.forget(&namespace, &cluster)
                }
                machine_store::Change::Relisting => uncovering.forget_all(),
                machine_store::Change::Kept => {}
            }
        })
        .touched_objects();
    let (cluster_store, cluster_writer) = reflector::store();
    let cluster_stream = watcher(clusters, filtered)
        .default_backoff()
        .modify(caches::trim)
        .reflect(cluster_writer)
        .touched_objects();
    ctx.install_caches(Some(caches::WatchCaches {
        machines: machine_store,
        clusters: cluster_store,
        machine_coverage: coverage,
    }));
    // Stopped or dropped: nothing feeds the stores any more, so later reads
    // (a reconcile called directly, the next run) go to the API.
    let _uninstall = CachesInstalled(ctx.clone());
    let synced = kcp_store.clone();
    let graceful = tokio_util::sync::CancellationToken::new();
    let controller = Controller::for_stream(kcp_stream, kcp_store)
        .with_config(
            kube::runtime::controller::Config::default().concurrency(ctx.settings.concurrency),
        )
        .owns_stream(machine_stream)
        .watches_stream(cluster_stream, |cluster: Cluster| {
            // A Cluster change (e.g. its control plane became initialized)
            // reconciles the control plane it references.
            cluster
                .spec
                .control_plane_ref
                .as_ref()
                .filter(|r| r.kind == "KThreesControlPlane")
                .map(|r| ObjectRef::new(&r.name).within(&cluster.namespace().unwrap_or_default()))
        })
        .graceful_shutdown_on(graceful.clone().cancelled_owned())
        .run(guarded_reconcile, reconcile::error_policy, ctx)
        .for_each(|result| async move {
            if let Err(err) = result {
                tracing::debug!(%err, "controller event");
            }
        });
    tokio::pin!(controller);
    tokio::select! {
        () = &mut controller => return,
        () = shutdown => {}
    }
    // kube-runtime starts reconciles only once the store is ready, and a store
    // that is not ready now never will be: the graceful shutdown below ends
    // the streams that would fill it.
    if synced.wait_until_ready().now_or_never().is_none() {
        tracing::debug!("stopped before the caches synced: no reconcile had started");
        return;
    }
    graceful.cancel();
    controller.await;
}

/// Removes the watch caches from the context when the loop that feeds them ends.
struct CachesInstalled(Arc<Context>);

impl Drop for CachesInstalled {
    fn drop(&mut self) {
        self.0.install_caches(None);
    }
}

/// The watcher configuration for `--watch-filter` (none: everything).
pub fn watch_config(watch_filter: Option<&str>) -> watcher::Config {
    match watch_filter {
        Some(value) => watcher::Config::default().labels(&format!(
            "{}={value}",
            crate::api::names::WATCH_FILTER_LABEL
        )),
        None => watcher::Config::default(),
    }
}

/// A reconcile that acts only under a valid lease: one that starts without it
/// returns at once without reading or writing anything, and one that is running
/// when the lease runs out is dropped at its next await point, so no step
/// starts after the renew deadline. Without leader election the guard always
/// leads and this is [`reconcile::reconcile`].
pub async fn guarded_reconcile(
    kcp: Arc<KThreesControlPlane>,
    ctx: Arc<Context>,
) -> Result<Requeue, Error> {
    let leader = ctx.leader.clone();
    if !leader.is_leading() {
        tracing::debug!(kcp = %kcp.name_any(), "not leading: reconcile skipped");
        return Ok(Requeue::await_change());
    }
    let name = kcp.name_any();
    tokio::select! {
        biased;
        _ = leader.lost() => {
            tracing::warn!(kcp = %name, "lease lost during the reconcile: cancelled before its next step");
            Ok(Requeue::await_change())
        }
        result = reconcile::reconcile(kcp, ctx) => result,
    }
}
