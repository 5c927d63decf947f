//! What every reconcile shares: clients, caches, metrics, the event recorder,
//! and per-object error backoff.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use kube::Client;
use kube::runtime::events::Reporter;

use super::caches::{SecretCache, WatchCaches};
use super::etcd_pool::EtcdPool;
use super::metrics::Metrics;
use super::replica_election::guard::LeaderGuard;
use crate::pki::KubeconfigPolicy;
use crate::workload::WorkloadCache;

/// Tunables; the defaults suit production, tests shorten them.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Requeue while a step waits on the world (drain, hooks, quorum).
    pub wait_requeue: Duration,
    /// Requeue of a steady control plane, to refresh etcd health.
    pub idle_requeue: Duration,
    /// First and largest delay after a failed reconcile.
    pub error_backoff_min: Duration,
    pub error_backoff_max: Duration,
    /// Lifetime and renewal of the admin kubeconfigs we generate.
    pub kubeconfig: KubeconfigPolicy,
    /// How long a ghost or orphan etcd member must have been seen before it is
    /// removed (a join in progress gets this long to finish).
    pub orphan_grace: Duration,
    /// How long a server's Node may show embedded etcd (k3s's label,
    /// annotations, `EtcdIsVoter=False`) without an etcd member before the
    /// Machine's `EtcdMemberHealthy` turns False (`EtcdMemberMissing`).
    pub member_missing_grace: Duration,
    /// How etcd members are reached (`run --etcd-transport`).
    pub etcd_transport: super::etcd_pool::TransportMode,
    /// `run --watch-filter`: only control planes labelled
    /// `cluster.x-k8s.io/watch-filter=<value>` are reconciled (Clusters with
    /// the label are served from the watch cache, others read); every acting
    /// pass checks the label again first (`decision::shard`).
    pub watch_filter: Option<String>,
    /// `run --namespace`: only this namespace is watched.
    pub namespace: Option<String>,
    /// `run --concurrency`: control planes reconciled at once.
    pub concurrency: u16,
    /// `run --secret-refresh`: how long the cluster Secrets read by one
    /// reconcile serve the next ones (zero: every reconcile reads them). A
    /// reconcile about to act reads them again whatever this says.
    pub secret_refresh: Duration,
    /// `run --max-chained-steps`: removal steps one reconcile takes back to
    /// back after its first, each on a fresh read (zero: one step per
    /// reconcile).
    pub max_chained_steps: u32,
    /// `run --etcd-space-care` (off by default), its thresholds and
    /// `--etcd-quota-backend-bytes`.
    pub etcd_space: crate::space_rule::SpaceSettings,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            wait_requeue: Duration::from_secs(10),
            idle_requeue: Duration::from_secs(60),
            error_backoff_min: Duration::from_secs(1),
            error_backoff_max: Duration::from_secs(300),
            kubeconfig: KubeconfigPolicy::default(),
            orphan_grace: Duration::from_secs(300),
            member_missing_grace: Duration::from_secs(120),
            etcd_transport: super::etcd_pool::TransportMode::Auto,
            watch_filter: None,
            namespace: None,
            concurrency: 10,
            max_chained_steps: 8,
            secret_refresh: Duration::from_secs(30 * 60),
            etcd_space: crate::space_rule::SpaceSettings::default(),
        }
    }
}

pub struct Context {
    /// The management cluster.
    pub client: Client,
    pub metrics: Metrics,
    pub recorder: super::recorder::EventRecorder,
    pub workloads: WorkloadCache,
    pub etcd: EtcdPool,
    pub settings: Settings,
    /// Consecutive failures per object (namespace/name); reset on success.
    failures: Mutex<HashMap<String, usize>>,
    /// Infrastructure templates already given their Cluster owner reference
    /// (`<namespace>/<kind>/<name>@<cluster uid>`), so it is checked once per
    /// process, not read on every reconcile.
    pub template_owners: Mutex<std::collections::HashSet<String>>,
    /// API versions of kinds referenced by group only (contract labels).
    pub contract_versions: super::contract_versions::ContractVersions,
    /// When each etcd member (by cluster, then member id) was first seen.
    pub members_seen:
        Mutex<HashMap<String, std::collections::BTreeMap<u64, chrono::DateTime<chrono::Utc>>>>,
    /// Our last write to each control plane, so a reconcile reads it again
    /// only when the watch cache has not caught up with that write.
    pub kcp_writes: KcpWrites,
    /// The reflector stores reconciles read from while [`super::run`] feeds
    /// them (a reconcile called directly reads the API).
    caches: std::sync::RwLock<Option<WatchCaches>>,
    /// The cluster Secrets as last read, for `settings.secret_refresh`.
    pub secrets: SecretCache,
    /// Whether this process may act now (leader election); always leading
    /// when election is disabled. A reconcile that starts without it returns
    /// without writing.
    pub leader: LeaderGuard,
    /// Certificate expiry annotations written, per control plane
    /// (`namespace/name`): the (KThreesConfig, value) pairs, so that one is
    /// written once while CAPI has not copied it yet. Each control plane's
    /// pass prunes only its own entries.
    pub certificate_annotations: Mutex<super::written_annotations::WrittenAnnotations>,
    /// The etcd members this process defragmented, by cluster.
    pub defragmented: Mutex<super::defragmented::Defragmented>,
    /// Leadership moves started and not yet confirmed, by cluster.
    pub leadership_moves: super::etcd_leader_move::in_flight::LeadershipMoves,
    /// The k3s serving certificate probes, by Machine.
    pub k3s_serving: super::k3s_serving::K3sServingProbes,
}

impl Context {
    pub fn new(client: Client, metrics: Metrics, etcd: EtcdPool, settings: Settings) -> Arc<Self> {
        Self::new_with_leader(client, metrics, etcd, settings, LeaderGuard::always())
    }

    /// Like [`Context::new`], for a replica that acts only while `leader` leads.
    pub fn new_with_leader(
        client: Client,
        metrics: Metrics,
        etcd: EtcdPool,
        settings: Settings,
        leader: LeaderGuard,
    ) -> Arc<Self> {
        let reporter = Reporter {
            controller: "k3s-control-plane".into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        let secrets = SecretCache::new(settings.secret_refresh);
        let contract_versions = super::contract_versions::ContractVersions::new(client.clone());
        Arc::new(Context {
            recorder: super::recorder::EventRecorder::new(client.clone(), reporter),
            workloads: WorkloadCache::default(),
            client,
            metrics,
            etcd,
            settings,
            failures: Mutex::new(HashMap::new()),
            template_owners: Mutex::new(Default::default()),
            contract_versions,
            members_seen: Mutex::new(HashMap::new()),
            kcp_writes: KcpWrites::default(),
            caches: std::sync::RwLock::new(None),
            secrets,
            leader,
            certificate_annotations: Mutex::new(Default::default()),
            defragmented: Mutex::new(Default::default()),
            leadership_moves: Default::default(),
            k3s_serving: Default::default(),
        })
    }

    /// The delay before retrying `object` after one more failure: exponential
    /// with jitter, per object, so one broken control plane does not slow others.
    pub fn next_error_backoff(&self, object: &str) -> Duration {
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let count = failures.entry(object.to_string()).or_insert(0);
        *count += 1;
        ExponentialBuilder::default()
            .with_min_delay(self.settings.error_backoff_min)
            .with_max_delay(self.settings.error_backoff_max)
            .with_jitter()
            .without_max_times()
            .build()
            .nth(*count - 1)
            .unwrap_or(self.settings.error_backoff_max)
    }

    /// Record the members of `cluster` seen now; returns when each was first seen
    /// (members no longer listed are forgotten).
    pub fn members_first_seen(
        &self,
        cluster: &str,
        members: impl Iterator<Item = u64>,
        now: chrono::DateTime<chrono::Utc>,
    ) -> std::collections::BTreeMap<u64, chrono::DateTime<chrono::Utc>> {
        let mut seen = self.members_seen.lock().unwrap_or_else(|p| p.into_inner());
        let known = seen.entry(cluster.to_string()).or_default();
        let current: std::collections::BTreeMap<u64, chrono::DateTime<chrono::Utc>> = members
            .map(|id| (id, known.get(&id).copied().unwrap_or(now)))
            .collect();
        *known = current.clone();
        current
    }

    /// The watch caches, while a controller loop feeds them.
    pub fn caches(&self) -> Option<WatchCaches> {
        self.caches
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Read from `caches` from now on (`None`: from the API again).
    pub fn install_caches(&self, caches: Option<WatchCaches>) {
        *self.caches.write().unwrap_or_else(|p| p.into_inner()) = caches;
    }

    /// Forget everything held for the workload cluster `namespace/cluster`
    /// (its control plane is gone, or moved to another shard): pooled etcd
    /// connections, the workload client, cached Secrets, the cover of its
    /// Machines in a shard's cache, first-seen member
    /// times, leadership moves, serving-certificate probes and its metric
    /// series. A deleted
    /// cluster costs nothing afterwards.
    pub fn forget_cluster(&self, namespace: &str, cluster: &str) {
        self.etcd.drop_cluster(&super::etcd_pool::PoolKey {
            namespace: namespace.to_string(),
            cluster: cluster.to_string(),
        });
        self.workloads
            .invalidate(&crate::workload::ClusterKey::new(namespace, cluster));
        self.secrets.invalidate(namespace, cluster);
        if let Some(caches) = self.caches() {
            caches.machine_coverage.forget(namespace, cluster);
        }
        let key = format!("{namespace}/{cluster}");
        self.members_seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key);
        self.leadership_moves.forget_cluster(&key);
        self.defragmented
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .forget(&key);
        // The k3s serving-certificate probe records of its Machines.
        self.k3s_serving.retain(&key, &[]);
        self.metrics.forget_cluster(&key);
    }

    /// Forget what is held for the control plane `namespace/name` itself.
    pub fn forget_control_plane(&self, namespace: &str, name: &str) {
        self.kcp_writes.forget(&format!("{namespace}/{name}"));
        self.certificate_annotations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .forget(&format!("{namespace}/{name}"));
    }

    /// A successful reconcile resets `object`'s backoff.
    pub fn reset_error_backoff(&self, object: &str) {
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(object);
    }
}

/// The resourceVersion of our last write to each KThreesControlPlane
/// (`namespace/name`). The watch cache may lag behind our own writes (an
/// annotation that records a step, the status): a reconcile decides on the
/// cached object only when it already shows our last write, and reads the
/// object otherwise. A write in flight, or one whose outcome is unknown, forces
/// a read. Without a write in this process the cache is as current as a read.
#[derive(Debug, Default)]
pub struct KcpWrites(Mutex<HashMap<String, Option<String>>>);

impl KcpWrites {
    fn key(kcp: &crate::api::KThreesControlPlane) -> String {
        use kube::ResourceExt;
        format!("{}/{}", kcp.namespace().unwrap_or_default(), kcp.name_any())
    }

    /// Before writing `kcp`: until the write's result is known, read it.
    pub fn started(&self, kcp: &crate::api::KThreesControlPlane) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(Self::key(kcp), None);
    }

    /// After a write succeeded: the object as the server returned it. Also
    /// after a read that found the cache current (the same version).
    pub fn finished(&self, written: &crate::api::KThreesControlPlane) {
        use kube::ResourceExt;
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(Self::key(written), written.resource_version());
    }

    /// Whether `cached` already shows our last write (or we wrote nothing).
    pub fn cache_is_current(&self, cached: &crate::api::KThreesControlPlane) -> bool {
        use kube::ResourceExt;
        match self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&Self::key(cached))
        {
            None => true,
            Some(None) => false,
            Some(Some(version)) => cached.resource_version().as_ref() == Some(version),
        }
    }

    pub fn forget(&self, key: &str) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
    }
}

#[cfg(test)]
mod kcp_writes_tests {
    use super::KcpWrites;
    use crate::api::KThreesControlPlane;

    fn kcp(version: &str) -> KThreesControlPlane {
        let mut kcp: KThreesControlPlane = serde_json::from_value(serde_json::json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta2",
            "kind": "KThreesControlPlane",
            "metadata": {"name": "cp", "namespace": "ns"},
            "spec": {"version": "v1.31.4+k3s1", "machineTemplate": {"spec": {"infrastructureRef": {
                "apiGroup": "infrastructure.cluster.x-k8s.io",
                "kind": "DockerMachineTemplate", "name": "t"}}}}
        }))
        .unwrap();
        kcp.metadata.resource_version = Some(version.into());
        kcp
    }

    #[test]
    fn without_a_write_of_ours_the_cache_is_current() {
        assert!(KcpWrites::default().cache_is_current(&kcp("5")));
    }

    #[test]
    fn the_cache_is_current_only_once_it_shows_our_last_write() {
        let writes = KcpWrites::default();
        writes.started(&kcp("5"));
        assert!(!writes.cache_is_current(&kcp("5")), "a write in flight");
        writes.finished(&kcp("6"));
        assert!(
            !writes.cache_is_current(&kcp("5")),
            "the cache lags behind it"
        );
        assert!(writes.cache_is_current(&kcp("6")));
        assert!(
            !writes.cache_is_current(&kcp("7")),
            "a later write: read it"
        );
        // The read found the cache current: trust it until our next write.
        writes.finished(&kcp("7"));
        assert!(writes.cache_is_current(&kcp("7")));
        writes.started(&kcp("6"));
        assert!(!writes.cache_is_current(&kcp("6")), "outcome unknown");
        writes.forget("ns/cp");
        assert!(writes.cache_is_current(&kcp("6")));
    }
}
