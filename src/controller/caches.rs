//! What a reconcile may read without asking the API server, and the rule that
//! keeps that safe.
//!
//! - **Watch caches**: the stores of the Machines (indexed by cluster,
//!   [`MachineStore`]) and Clusters (a reflector store) the controller watches
//!   anyway (the same streams trigger reconciles), trimmed of `managedFields`
//!   as CAPI's cache transform does. In a shard
//!   (`--watch-filter`) both watches select the shard's label, so a cluster's
//!   Machines are served from the cache only once they are known to carry it
//!   ([`MachineCoverage`]).
//! - **Secret cache**: the five cluster Secrets, kept for `--secret-refresh`,
//!   once per cluster and shared with the reconciles it serves, without
//!   `managedFields` or a `kubectl apply` copy of their data.
//!   Secrets are not watched: that would need list/watch on every Secret in
//!   scope, more than the `get` we are granted.
//!
//! The rule, **fresh before acting**: a reconcile may decide on cached objects,
//! and an idle one (nothing to do) reads nothing from the management API. One
//! that is about to write on their strength (a Secret, a Machine created or
//! deleted, a hook, an etcd member removed) reads them again first, and starts
//! over on what it read if anything differs (see
//! [`ManagementFingerprint`]). A lagging cache can therefore delay a decision
//! but never cause an action: no second Machine for one not yet seen, no member
//! removed on a CA Secret that is gone.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::api::names::WATCH_FILTER_LABEL;
use crate::api::{Cluster, Machine};

pub use super::machine_store::MachineStore;

use super::cluster_secrets::ClusterSecretObjects;

/// Where a reconcile's management objects come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Watch caches and the Secret cache where they can serve; the API otherwise.
    Caches,
    /// The API server, always (and the Secret cache is refreshed).
    Api,
    /// A pass chained after a removal step of the same reconcile: the
    /// Cluster and Machines from the API server (the watch caches have not
    /// seen that step yet), the Secrets from the Secret cache. Before its
    /// first step the reconcile read them from the API server or confirmed
    /// the cached ones against it, and no removal step writes a Secret; a
    /// missing entry is read.
    Chained,
}

/// Drop what no decision reads and every watched object would carry: the
/// server's field-ownership records (often the largest part of an object).
pub fn trim<K: kube::Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
}

/// The reflector stores the reconcile reads from (installed by
/// [`super::run`]; without them every read goes to the API).
#[derive(Clone)]
pub struct WatchCaches {
    pub machines: MachineStore,
    pub clusters: Store<Cluster>,
    /// Which clusters' Machines the (label-selected) Machine store holds whole.
    pub machine_coverage: Arc<MachineCoverage>,
}

impl WatchCaches {
    /// Stores fed by unfiltered watches: every Machine is in them.
    pub fn unsharded(machines: MachineStore, clusters: Store<Cluster>) -> Self {
        WatchCaches {
            machines,
            clusters,
            machine_coverage: Arc::new(MachineCoverage::new(None, Duration::MAX)),
        }
    }

    /// Both stores have had their initial list and are still fed by their
    /// watches (a store whose writer is gone is no longer current).
    pub fn ready(&self) -> bool {
        self.machines.is_ready()
            && matches!(
                self.clusters.wait_until_ready().now_or_never(),
                Some(Ok(()))
            )
    }

    pub fn cluster(&self, namespace: &str, name: &str) -> Option<Cluster> {
        self.clusters
            .get(&ObjectRef::new(name).within(namespace))
            .map(|c| (*c).clone())
    }

    /// The Machines of `cluster` (label `cluster.x-k8s.io/cluster-name`), as
    /// the label-selected LIST would return them, if the store holds them all
    /// ([`MachineCoverage`]); `None`: list them from the API and
    /// [`confirm_machines`](Self::confirm_machines) what was listed.
    pub fn machines(&self, namespace: &str, cluster: &str) -> Option<Vec<Machine>> {
        if !self.machine_coverage.covers(namespace, cluster) {
            return None;
        }
        Some(
            self.cached_machines(namespace, cluster)
                .into_iter()
                .map(|m| (*m).clone())
                .collect(),
        )
    }

    fn cached_machines(&self, namespace: &str, cluster: &str) -> Vec<Arc<Machine>> {
        self.machines.of_cluster(namespace, cluster)
    }

    /// After a LIST from the API of `cluster`'s Machines: from now on serve
    /// them from the store if [`coverage`] says it holds them whole.
    pub fn confirm_machines(&self, namespace: &str, cluster: &str, listed: &[Machine]) -> Coverage {
        let Some(filter) = self.machine_coverage.filter.as_deref() else {
            return Coverage::Whole;
        };
        let cached = self.cached_machines(namespace, cluster);
        let cached_uids: BTreeSet<&str> = cached
            .iter()
            .filter_map(|m| m.metadata.uid.as_deref())
            .collect();
        let verdict = coverage(filter, listed, &cached_uids);
        if verdict == Coverage::Whole {
            self.machine_coverage.confirm(namespace, cluster);
        }
        verdict
    }
}

/// Whether a shard's label-selected Machine store holds a cluster's Machines
/// whole, so an idle reconcile may read them from it instead of listing them.
///
/// Our own Machines are born with the control plane's shard label and keep it
/// (`decision::machine_sync`), but a Machine made before the cluster came to
/// this shard, or by someone else (workers, another owner), may lack it, and a
/// Machine missing from a cache must never look absent. So a cluster is
/// covered only after a LIST from the API found every Machine of it labelled
/// for this shard and already in the store, and for `ttl` after that (the
/// `--secret-refresh` period: a worker made later without the label shows
/// within it). A Machine that leaves the store (deleted, or relabelled) and a
/// watch that starts over end the cover at once; so does a release of the
/// cluster. Without a filter the store holds every Machine: always covered.
///
/// A stale view can still only delay an action, never cause one: a decision
/// to act is checked against a fresh LIST first (the module's rule).
pub struct MachineCoverage {
    filter: Option<String>,
    ttl: Duration,
    confirmed: Mutex<HashMap<String, Instant>>,
}

impl MachineCoverage {
    pub fn new(filter: Option<String>, ttl: Duration) -> Self {
        MachineCoverage {
            filter,
            ttl,
            confirmed: Mutex::default(),
        }
    }

    fn key(namespace: &str, cluster: &str) -> String {
        format!("{namespace}/{cluster}")
    }

    pub fn covers(&self, namespace: &str, cluster: &str) -> bool {
        if self.filter.is_none() {
            return true;
        }
        self.confirmed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&Self::key(namespace, cluster))
            .is_some_and(|at| at.elapsed() < self.ttl)
    }

    fn confirm(&self, namespace: &str, cluster: &str) {
        if self.ttl.is_zero() {
            return;
        }
        self.confirmed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(Self::key(namespace, cluster), Instant::now());
    }

    /// A Machine of `cluster` left the store, or the cluster left this shard.
    pub fn forget(&self, namespace: &str, cluster: &str) {
        self.confirmed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&Self::key(namespace, cluster));
    }

    /// The watch starts over: what it drops at the end of its new list is
    /// not reported one by one.
    pub fn forget_all(&self) {
        self.confirmed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// The clusters covered now (metrics, tests).
    pub fn len(&self) -> usize {
        self.confirmed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a LIST of a cluster's Machines says of a shard's store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Coverage {
    /// Every listed Machine carries the shard's label and is in the store.
    Whole,
    /// These Machines lack the shard's label: the store will never hold them.
    Unlabelled(Vec<String>),
    /// All are labelled, but the store has not seen these yet (or still holds
    /// one the API no longer has).
    StoreBehind(Vec<String>),
}

/// The rule of [`MachineCoverage`], pure: compare a LIST from the API with
/// the uids the store holds for the same cluster.
pub fn coverage(filter: &str, listed: &[Machine], cached_uids: &BTreeSet<&str>) -> Coverage {
    let unlabelled: Vec<String> = listed
        .iter()
        .filter(|m| m.labels().get(WATCH_FILTER_LABEL).map(String::as_str) != Some(filter))
        .map(|m| m.name_any())
        .collect();
    if !unlabelled.is_empty() {
        return Coverage::Unlabelled(unlabelled);
    }
    let listed_uids: BTreeSet<&str> = listed
        .iter()
        .filter_map(|m| m.metadata.uid.as_deref())
        .collect();
    let mut behind: Vec<String> = listed
        .iter()
        .filter(|m| {
            m.metadata
                .uid
                .as_deref()
                .is_none_or(|uid| !cached_uids.contains(uid))
        })
        .map(|m| m.name_any())
        .collect();
    behind.extend(
        cached_uids
            .iter()
            .filter(|uid| !listed_uids.contains(*uid))
            .map(|uid| format!("uid {uid} (gone)")),
    );
    if behind.is_empty() {
        Coverage::Whole
    } else {
        Coverage::StoreBehind(behind)
    }
}

/// The cluster Secrets as last read, per `namespace/cluster`, for `ttl`.
#[derive(Default)]
pub struct SecretCache {
    ttl: Duration,
    /// Shared with the reconciles it serves: a map entry is a pointer, not
    /// five `Secret`s inline (the table keeps spare slots), and a served
    /// read copies nothing.
    entries: Mutex<HashMap<String, (Instant, Arc<ClusterSecretObjects>)>>,
}

impl SecretCache {
    /// A cache that serves a read for `ttl` (zero: never, every reconcile reads).
    pub fn new(ttl: Duration) -> Self {
        SecretCache {
            ttl,
            entries: Mutex::default(),
        }
    }

    fn key(namespace: &str, cluster: &str) -> String {
        format!("{namespace}/{cluster}")
    }

    /// The Secrets read less than the refresh period ago, if any.
    pub fn get(&self, namespace: &str, cluster: &str) -> Option<Arc<ClusterSecretObjects>> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries
            .get(&Self::key(namespace, cluster))
            .filter(|(read, _)| read.elapsed() < self.ttl)
            .map(|(_, objects)| objects.clone())
    }

    /// Remember what was just read; the objects to use from now on. When every
    /// Secret is at the version already cached, that is the cached entry (its
    /// content was already checked), refreshed.
    pub fn put(
        &self,
        namespace: &str,
        cluster: &str,
        objects: ClusterSecretObjects,
    ) -> Arc<ClusterSecretObjects> {
        if self.ttl.is_zero() {
            return Arc::new(objects);
        }
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let key = Self::key(namespace, cluster);
        let kept = match entries.remove(&key) {
            Some((_, cached)) if cached.same_versions(&objects) => cached,
            _ => Arc::new(objects),
        };
        entries.insert(key, (Instant::now(), kept.clone()));
        kept
    }

    /// Forget the cluster's Secrets (we wrote one, or the cluster is gone).
    pub fn invalidate(&self, namespace: &str, cluster: &str) {
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&Self::key(namespace, cluster));
    }

    pub fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Which version of each management object a decision saw: equal
/// fingerprints mean a fresh read would decide the same.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ManagementFingerprint {
    pub cluster: Option<Version>,
    /// Every Machine of the Cluster (owned, foreign and workers) by name.
    pub machines: Vec<(String, Version)>,
    /// The five Secrets in [`ClusterSecretObjects`] order.
    pub secrets: [Option<Version>; 5],
}

/// uid and resourceVersion of one object.
pub type Version = (Option<String>, Option<String>);

pub fn version_of<K: kube::Resource>(object: &K) -> Version {
    let meta = object.meta();
    (meta.uid.clone(), meta.resource_version.clone())
}

impl ManagementFingerprint {
    pub fn of(
        cluster: Option<&Cluster>,
        machines: &[Machine],
        secrets: &ClusterSecretObjects,
    ) -> Self {
        let mut named: Vec<(String, Version)> = machines
            .iter()
            .map(|m| (m.name_any(), version_of(m)))
            .collect();
        named.sort();
        let s =
            |secret: &Option<k8s_openapi::api::core::v1::Secret>| secret.as_ref().map(version_of);
        ManagementFingerprint {
            cluster: cluster.map(version_of),
            machines: named,
            secrets: [
                s(&secrets.server_ca),
                s(&secrets.client_ca),
                s(&secrets.etcd_ca),
                s(&secrets.token),
                s(&secrets.kubeconfig),
            ],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::names::CLUSTER_NAME_LABEL;
    use k8s_openapi::api::core::v1::Secret;

    fn secret(name: &str, version: &str) -> Secret {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                         "resourceVersion": version},
        }))
        .unwrap()
    }

    fn objects(etcd_version: &str) -> ClusterSecretObjects {
        ClusterSecretObjects {
            etcd_ca: Some(secret("c1-etcd", etcd_version)),
            ..Default::default()
        }
    }

    /// A read that finds every Secret at the cached version keeps the cached
    /// objects, and with them what was worked out of their content; a new
    /// version replaces them.
    #[test]
    fn a_read_of_the_same_versions_keeps_the_cached_objects() {
        let cache = SecretCache::new(Duration::from_secs(60));
        let first = cache.put("ns", "c1", objects("1"));
        let again = cache.put("ns", "c1", objects("1"));
        assert!(std::sync::Arc::ptr_eq(&first, &again));
        let served = cache.get("ns", "c1").unwrap();
        assert!(std::sync::Arc::ptr_eq(&first, &served));
        let changed = cache.put("ns", "c1", objects("2"));
        assert!(!std::sync::Arc::ptr_eq(&first, &changed));
        assert_eq!(
            changed
                .etcd_ca
                .as_ref()
                .unwrap()
                .metadata
                .resource_version
                .as_deref(),
            Some("2")
        );
        // Objects without versions are never taken for the cached ones.
        let unversioned = || ClusterSecretObjects {
            etcd_ca: Some(Secret::default()),
            ..Default::default()
        };
        let kept = cache.put("ns", "c2", unversioned());
        let again = cache.put("ns", "c2", unversioned());
        assert!(!std::sync::Arc::ptr_eq(&kept, &again));
    }

    #[test]
    fn a_zero_refresh_never_serves_from_the_cache() {
        let cache = SecretCache::new(Duration::ZERO);
        cache.put("ns", "c1", objects("1"));
        assert!(cache.get("ns", "c1").is_none());
        assert!(cache.is_empty());
    }

    #[test]
    fn the_secrets_are_served_until_the_refresh_period_or_an_invalidation() {
        let cache = SecretCache::new(Duration::from_millis(200));
        assert!(cache.get("ns", "c1").is_none(), "nothing read yet");
        cache.put("ns", "c1", objects("1"));
        let served = cache.get("ns", "c1").expect("fresh entry");
        assert_eq!(
            served
                .etcd_ca
                .as_ref()
                .and_then(|s| s.metadata.resource_version.clone()),
            Some("1".into())
        );
        assert!(cache.get("ns", "c2").is_none(), "per cluster");
        cache.invalidate("ns", "c1");
        assert!(cache.get("ns", "c1").is_none(), "invalidated");
        cache.put("ns", "c1", objects("2"));
        std::thread::sleep(Duration::from_millis(250));
        assert!(cache.get("ns", "c1").is_none(), "past the refresh period");
    }

    fn labelled(name: &str, uid: &str, shard: Option<&str>) -> Machine {
        let mut labels = serde_json::json!({CLUSTER_NAME_LABEL: "c1"});
        if let Some(shard) = shard {
            labels[WATCH_FILTER_LABEL] = shard.into();
        }
        serde_json::from_value(serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": name, "namespace": "ns", "uid": uid, "labels": labels},
            "spec": {"clusterName": "c1", "bootstrap": {}, "infrastructureRef": {
                "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": name}}
        }))
        .unwrap()
    }

    /// When a shard's store may stand for the API's LIST of a cluster's Machines.
    #[test]
    fn a_cluster_is_covered_only_when_every_machine_is_labelled_and_in_the_store() {
        let m1 = || labelled("m1", "u1", Some("s0"));
        let m2 = || labelled("m2", "u2", Some("s0"));
        let cases: Vec<(&str, Vec<Machine>, Vec<&str>, Coverage)> = vec![
            (
                "every Machine labelled and in the store",
                vec![m1(), m2()],
                vec!["u1", "u2"],
                Coverage::Whole,
            ),
            ("no Machine at all", vec![], vec![], Coverage::Whole),
            (
                "a Machine made before the cluster came to this shard",
                vec![m1(), labelled("m2", "u2", None)],
                vec!["u1"],
                Coverage::Unlabelled(vec!["m2".into()]),
            ),
            (
                "a Machine still labelled for another shard",
                vec![m1(), labelled("m2", "u2", Some("s1"))],
                vec!["u1"],
                Coverage::Unlabelled(vec!["m2".into()]),
            ),
            (
                "a labelled Machine the watch has not delivered yet",
                vec![m1(), m2()],
                vec!["u1"],
                Coverage::StoreBehind(vec!["m2".into()]),
            ),
            (
                "the store still holds a Machine the API no longer has",
                vec![m1()],
                vec!["u1", "u2"],
                Coverage::StoreBehind(vec!["uid u2 (gone)".into()]),
            ),
        ];
        for (situation, listed, cached, want) in cases {
            let cached: BTreeSet<&str> = cached.into_iter().collect();
            assert_eq!(coverage("s0", &listed, &cached), want, "{situation}");
        }
    }

    #[test]
    fn a_cover_lasts_its_period_and_ends_when_forgotten() {
        let unsharded = MachineCoverage::new(None, Duration::ZERO);
        assert!(unsharded.covers("ns", "c1"), "without a filter: always");
        let shard = MachineCoverage::new(Some("s0".into()), Duration::from_millis(200));
        assert!(!shard.covers("ns", "c1"), "nothing confirmed yet");
        shard.confirm("ns", "c1");
        assert!(shard.covers("ns", "c1"));
        assert!(!shard.covers("ns", "c2"), "per cluster");
        shard.forget("ns", "c1");
        assert!(!shard.covers("ns", "c1"), "forgotten");
        shard.confirm("ns", "c1");
        shard.confirm("ns", "c2");
        shard.forget_all();
        assert!(
            shard.is_empty(),
            "a watch that starts over ends every cover"
        );
        shard.confirm("ns", "c1");
        std::thread::sleep(Duration::from_millis(250));
        assert!(!shard.covers("ns", "c1"), "past the period");
        let never = MachineCoverage::new(Some("s0".into()), Duration::ZERO);
        never.confirm("ns", "c1");
        assert!(!never.covers("ns", "c1"), "a zero period: always list");
    }

    #[test]
    fn fingerprints_differ_when_any_object_version_differs() {
        let machine = |name: &str, version: &str| -> Machine {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                "metadata": {"name": name, "namespace": "ns", "resourceVersion": version},
                "spec": {"clusterName": "c1", "bootstrap": {}, "infrastructureRef": {
                    "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": name}}
            }))
            .unwrap()
        };
        let base = ManagementFingerprint::of(
            None,
            &[machine("m1", "5"), machine("m2", "6")],
            &objects("1"),
        );
        let same_other_order = ManagementFingerprint::of(
            None,
            &[machine("m2", "6"), machine("m1", "5")],
            &objects("1"),
        );
        assert_eq!(base, same_other_order);
        let cases = [
            (
                "a Machine changed",
                ManagementFingerprint::of(
                    None,
                    &[machine("m1", "7"), machine("m2", "6")],
                    &objects("1"),
                ),
            ),
            (
                "a Machine the cache has not seen yet",
                ManagementFingerprint::of(
                    None,
                    &[machine("m1", "5"), machine("m2", "6"), machine("m3", "8")],
                    &objects("1"),
                ),
            ),
            (
                "the etcd CA Secret changed",
                ManagementFingerprint::of(
                    None,
                    &[machine("m1", "5"), machine("m2", "6")],
                    &objects("2"),
                ),
            ),
            (
                "the etcd CA Secret is gone",
                ManagementFingerprint::of(
                    None,
                    &[machine("m1", "5"), machine("m2", "6")],
                    &ClusterSecretObjects::default(),
                ),
            ),
        ];
        for (what, other) in cases {
            assert_ne!(base, other, "{what}");
        }
    }
}
