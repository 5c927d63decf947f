//! The reconcile's reads (issue 12): an idle reconcile reads its Cluster and
//! Machines from the watch caches and its Secrets from the Secret cache, so the
//! management API sees no request from it and the workload API one Node LIST;
//! and a decision to act taken on a cache that lags is taken again on a fresh
//! read before anything is written (fresh before acting).
//!
//! In-process only: the request counts come from the test API servers.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k3s_control_plane::api::{Cluster, KThreesControlPlane, Machine};
use k3s_control_plane::apiserver::TestApiServer;
use k3s_control_plane::controller::caches::WatchCaches;
use k3s_control_plane::controller::machine_store::{MachineStore, MachineStoreWriter};
use k3s_control_plane::controller::reconcile::reconcile;
use k3s_control_plane::harness::sandbox::{CLUSTER, KCP, NAMESPACE, Sandbox, fast_settings};
use kube::Api;
use kube::api::ListParams;
use kube::runtime::reflector;
use kube::runtime::watcher::Event;

const LIMIT: Duration = Duration::from_secs(60);

type Counts = BTreeMap<(String, String), u64>;

fn diff(after: &Counts, before: &Counts) -> Counts {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect()
}

fn counts(server: &TestApiServer) -> Counts {
    server.request_counts()
}

async fn wait_reconciles(ctx: &k3s_control_plane::controller::Context, more: u64) {
    let target = ctx.metrics.reconciles.get() + more;
    let deadline = tokio::time::Instant::now() + LIMIT;
    while ctx.metrics.reconciles.get() < target {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {target} reconciles",
            ctx.metrics.reconciles.get()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// After 2 more reconciles (the last writes settle), the requests the
/// management and workload APIs got over the next `reconciles`, and how
/// many reconciles that window held.
async fn idle_requests(
    ctx: &k3s_control_plane::controller::Context,
    sandbox: &Sandbox,
    reconciles: u64,
) -> (Counts, Counts, u64) {
    wait_reconciles(ctx, 2).await;
    let (management, workload) = (counts(&sandbox.management), counts(&sandbox.workload));
    let from = ctx.metrics.reconciles.get();
    wait_reconciles(ctx, reconciles).await;
    (
        diff(&counts(&sandbox.management), &management),
        diff(&counts(&sandbox.workload), &workload),
        ctx.metrics.reconciles.get() - from,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_reconciles_read_nothing_from_the_management_api_and_list_nodes_once() {
    let sandbox = Sandbox::start(3).await.unwrap();
    let settings = k3s_control_plane::controller::Settings {
        idle_requeue: Duration::from_millis(300),
        ..fast_settings()
    };
    assert!(
        settings.secret_refresh >= Duration::from_secs(60),
        "the production refresh period applies"
    );
    let controller = sandbox.start_controller_with(settings);
    let ctx = controller.ctx.clone();
    sandbox
        .wait_for("a settled control plane", LIMIT, || async {
            let kcp = sandbox
                .kcp_api()
                .get(KCP)
                .await
                .map_err(|e| e.to_string())?;
            let healthy = kcp
                .conditions()
                .iter()
                .any(|c| c.type_ == "EtcdClusterHealthy" && c.status == "True");
            if healthy {
                Ok(())
            } else {
                Err("EtcdClusterHealthy is not True yet".into())
            }
        })
        .await
        .unwrap();
    // The first reconciles read and wrote; from here nothing changes.
    let (management, workload, reconciles) = idle_requests(&ctx, &sandbox, 6).await;
    controller.stop().await;

    // Leader election is off in the sandbox's controller: no Lease requests.
    assert!(
        management.is_empty(),
        "{reconciles} idle reconciles sent the management API {management:?}"
    );
    let node_lists = workload
        .get(&("list".to_string(), "nodes".to_string()))
        .copied()
        .unwrap_or(0);
    assert_eq!(
        workload.len(),
        1,
        "the workload API gets Node LISTs only: {workload:?}"
    );
    // The counter moves when a reconcile starts, its LIST comes later: at
    // either end of the window one reconcile may be counted without its LIST
    // or the other way round.
    assert!(
        node_lists.abs_diff(reconciles) <= 1,
        "{node_lists} Node LISTs in {reconciles} idle reconciles"
    );
    assert_eq!(ctx.metrics.stale_cache_decisions.get(), 0);
}

/// A store that holds `objects`, as a reflector would after its initial list;
/// it stays current (ready) while the returned writer lives.
fn stale_store<K>(objects: Vec<K>) -> (reflector::Store<K>, reflector::store::Writer<K>)
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    let (store, mut writer) = reflector::store();
    writer.apply_watcher_event(&Event::Init);
    for object in objects {
        writer.apply_watcher_event(&Event::InitApply(object));
    }
    writer.apply_watcher_event(&Event::InitDone);
    (store, writer)
}

/// [`stale_store`] for the Machine store.
fn stale_machine_store(machines: Vec<Machine>) -> (MachineStore, MachineStoreWriter) {
    let (store, mut writer) = MachineStore::new();
    writer.apply(&Event::Init);
    for machine in machines {
        writer.apply(&Event::InitApply(machine));
    }
    writer.apply(&Event::InitDone);
    (store, writer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_to_act_on_a_lagging_cache_is_taken_again_on_a_fresh_read() {
    let sandbox = Sandbox::start(3).await.unwrap();
    let ctx = sandbox.context();
    let machines = sandbox.machines_api();
    let all = machines.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(all.len(), 3);
    let cluster: Cluster = Api::namespaced(sandbox.client(), NAMESPACE)
        .get(CLUSTER)
        .await
        .unwrap();

    // A cache that has not seen the third Machine yet: on it alone, the
    // control plane is one short and a Machine would be created.
    let (machine_store, _machine_writer) = stale_machine_store(all[..2].to_vec());
    let (cluster_store, _cluster_writer) = stale_store(vec![cluster]);
    ctx.install_caches(Some(WatchCaches::unsharded(machine_store, cluster_store)));
    let kcp: KThreesControlPlane = sandbox.kcp_api().get(KCP).await.unwrap();
    reconcile(Arc::new(kcp), ctx.clone()).await.unwrap();

    let after = machines.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(after.len(), 3, "a Machine was created on a lagging cache");
    assert_eq!(
        ctx.metrics.stale_cache_decisions.get(),
        1,
        "the decision to create was taken again on the fresh read"
    );

    // With a current cache the same reconcile acts on nothing and needs no
    // fresh read: the Secrets were cached by the read above.
    let (machine_store, _machine_writer) = stale_machine_store(after);
    let cluster: Cluster = Api::namespaced(sandbox.client(), NAMESPACE)
        .get(CLUSTER)
        .await
        .unwrap();
    let (cluster_store, _cluster_writer) = stale_store(vec![cluster]);
    ctx.install_caches(Some(WatchCaches::unsharded(machine_store, cluster_store)));
    let before = counts(&sandbox.management);
    let kcp: KThreesControlPlane = sandbox.kcp_api().get(KCP).await.unwrap();
    let before_get = counts(&sandbox.management);
    reconcile(Arc::new(kcp), ctx.clone()).await.unwrap();
    let sent = diff(&counts(&sandbox.management), &before_get);
    assert!(
        diff(&before_get, &before).len() == 1,
        "only the test's own GET"
    );
    assert!(
        sent.keys().all(|(verb, _)| verb != "get" && verb != "list"),
        "a reconcile on current caches read {sent:?}"
    );
    assert_eq!(ctx.metrics.stale_cache_decisions.get(), 1);
    assert_eq!(
        machines
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        3
    );
}

/// A shard's Machine watch selects its label. Machines made before the
/// control plane was put in the shard are listed from the API (never taken as
/// absent) until the controller has labelled them; from then an idle
/// reconcile reads nothing from the management API. A Machine whose label
/// someone removes leaves the store: its cluster is listed again (no Machine
/// is created for it) and the label is put back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_reads_machines_from_its_cache_only_once_all_carry_its_label() {
    use k3s_control_plane::api::KThreesConfig;
    use k3s_control_plane::api::names::WATCH_FILTER_LABEL;
    use kube::ResourceExt;
    use kube::api::{Patch, PatchParams};
    use serde_json::json;

    let sandbox = Sandbox::start(3).await.unwrap();
    let shard =
        |value: serde_json::Value| json!({"metadata": {"labels": {WATCH_FILTER_LABEL: value}}});
    Api::<Cluster>::namespaced(sandbox.client(), NAMESPACE)
        .patch(
            CLUSTER,
            &PatchParams::default(),
            &Patch::Merge(&shard(json!("shard-a"))),
        )
        .await
        .unwrap();
    sandbox
        .kcp_api()
        .patch(
            KCP,
            &PatchParams::default(),
            &Patch::Merge(&shard(json!("shard-a"))),
        )
        .await
        .unwrap();
    let machines = sandbox.machines_api();
    let before = machines.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(before.len(), 3);
    assert!(
        before
            .iter()
            .all(|m| !m.labels().contains_key(WATCH_FILTER_LABEL)),
        "the sandbox's Machines start without the shard label"
    );
    let controller = sandbox.start_controller_with(k3s_control_plane::controller::Settings {
        watch_filter: Some("shard-a".into()),
        idle_requeue: Duration::from_millis(300),
        ..fast_settings()
    });
    let ctx = controller.ctx.clone();
    let covered = || {
        ctx.caches()
            .is_some_and(|c| c.machine_coverage.covers(NAMESPACE, CLUSTER))
    };
    let configs: Api<KThreesConfig> = Api::namespaced(sandbox.client(), NAMESPACE);
    let labelled = |label: Option<&String>| label.map(String::as_str) == Some("shard-a");
    sandbox
        .wait_for(
            "every Machine and KThreesConfig labelled for shard-a, and covered",
            LIMIT,
            || async {
                let listed = machines
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?;
                for m in &listed.items {
                    if !labelled(m.labels().get(WATCH_FILTER_LABEL)) {
                        return Err(format!("Machine {} not labelled", m.name_any()));
                    }
                    if let Some(c) = configs
                        .get_opt(&m.name_any())
                        .await
                        .map_err(|e| e.to_string())?
                        && !labelled(c.labels().get(WATCH_FILTER_LABEL))
                    {
                        return Err(format!("KThreesConfig {} not labelled", c.name_any()));
                    }
                }
                if listed.items.len() != 3 {
                    return Err(format!("{} Machines", listed.items.len()));
                }
                if covered() {
                    Ok(())
                } else {
                    Err("not covered yet".into())
                }
            },
        )
        .await
        .unwrap();
    // Settled: idle reconciles read nothing from the management API.
    let (idle, _, reconciles) = idle_requests(&ctx, &sandbox, 4).await;
    assert!(
        idle.is_empty(),
        "{reconciles} idle reconciles of a covered cluster sent the management API {idle:?}"
    );

    // Someone takes the label off a Machine: it leaves the shard's store.
    let lost = before[0].name_any();
    let management = counts(&sandbox.management);
    machines
        .patch(
            &lost,
            &PatchParams::default(),
            &Patch::Merge(&shard(serde_json::Value::Null)),
        )
        .await
        .unwrap();
    sandbox
        .wait_for(
            "the label put back and the cluster covered again",
            LIMIT,
            || async {
                let m = machines.get(&lost).await.map_err(|e| e.to_string())?;
                let count = machines
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?
                    .items
                    .len();
                if count != 3 {
                    return Err(format!(
                        "{count} Machines: one was created for the unlabelled one"
                    ));
                }
                if labelled(m.labels().get(WATCH_FILTER_LABEL)) && covered() {
                    Ok(())
                } else {
                    Err("not labelled or not covered yet".into())
                }
            },
        )
        .await
        .unwrap();
    let after = diff(&counts(&sandbox.management), &management);
    let lists = after
        .get(&("list".to_string(), "machines".to_string()))
        .copied()
        .unwrap_or(0);
    let stale = ctx.metrics.stale_cache_decisions.get();
    controller.stop().await;
    // A store missing a Machine would have shown a control plane short of
    // one: a decision to create it, caught only by the fresh read.
    assert_eq!(
        stale, 0,
        "a decision was taken on a cache that did not hold every Machine"
    );
    assert!(
        lists >= 1,
        "the cluster was not listed again after a Machine left the store: {after:?}"
    );
    assert_eq!(
        machines
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        3,
        "no Machine was created"
    );
}
