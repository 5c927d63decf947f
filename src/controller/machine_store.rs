//! The Machine watch's store, indexed by cluster: a reconcile finds its
//! cluster's Machines without going over every cached Machine (kube's
//! reflector store can only be filtered whole, which at 1,000 control planes
//! is 3,000 Machines looked at per reconcile, and every Machine of a shard's
//! namespace scope).
//!
//! It follows a watcher's events as kube's reflector does: `Apply` and
//! `Delete` change it at once; a (re)list (`Init`, `InitApply`...,
//! `InitDone`) is gathered aside and replaces it whole at its end. It is
//! ready once the first list ended, and stops being ready when its writer is
//! dropped (nothing feeds it any more).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use kube::ResourceExt;
use kube::runtime::watcher::Event;

use crate::api::Machine;
use crate::api::names::CLUSTER_NAME_LABEL;

/// `(namespace, cluster)`: a cluster's Machines are those of its namespace
/// with its `cluster.x-k8s.io/cluster-name` label.
type ClusterKey = (String, String);
/// `(namespace, name)` of one Machine.
type MachineKey = (String, String);

#[derive(Default)]
struct Index {
    by_cluster: HashMap<ClusterKey, BTreeMap<String, Arc<Machine>>>,
    /// Under which cluster each Machine is filed (its label may change).
    filed: HashMap<MachineKey, ClusterKey>,
}

impl Index {
    /// File `machine`; the cluster it was filed under before, if that is
    /// another one (it left that cluster's LIST).
    fn insert(&mut self, machine: Machine) -> Option<ClusterKey> {
        let key = (machine.namespace().unwrap_or_default(), machine.name_any());
        let was = self.remove(&key);
        // A Machine without the label is in no cluster's LIST.
        let Some(cluster) = machine.labels().get(CLUSTER_NAME_LABEL).cloned() else {
            return was;
        };
        let cluster_key = (key.0.clone(), cluster);
        let left = was.filter(|w| *w != cluster_key);
        self.by_cluster
            .entry(cluster_key.clone())
            .or_default()
            .insert(key.1.clone(), Arc::new(machine));
        self.filed.insert(key, cluster_key);
        left
    }

    /// Unfile a Machine; the cluster it was filed under.
    fn remove(&mut self, key: &MachineKey) -> Option<ClusterKey> {
        let cluster_key = self.filed.remove(key)?;
        if let Some(machines) = self.by_cluster.get_mut(&cluster_key) {
            machines.remove(&key.1);
            if machines.is_empty() {
                self.by_cluster.remove(&cluster_key);
            }
        }
        Some(cluster_key)
    }
}

/// The read side (cheap to clone).
#[derive(Clone, Default)]
pub struct MachineStore {
    index: Arc<RwLock<Index>>,
    ready: Arc<AtomicBool>,
}

/// The write side: fed the watch's events. Dropping it ends the store's
/// readiness.
pub struct MachineStoreWriter {
    store: MachineStore,
    /// A list in progress: replaces the index at `InitDone`.
    relisting: Option<Index>,
}

impl MachineStore {
    pub fn new() -> (MachineStore, MachineStoreWriter) {
        let store = MachineStore::default();
        let writer = MachineStoreWriter {
            store: store.clone(),
            relisting: None,
        };
        (store, writer)
    }

    /// The first list has ended and the writer is still there.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// The Machines of `namespace/cluster`, by name.
    pub fn of_cluster(&self, namespace: &str, cluster: &str) -> Vec<Arc<Machine>> {
        let index = self.index.read().unwrap_or_else(|p| p.into_inner());
        index
            .by_cluster
            .get(&(namespace.to_string(), cluster.to_string()))
            .map(|machines| machines.values().cloned().collect())
            .unwrap_or_default()
    }

    /// How many Machines the store holds.
    pub fn len(&self) -> usize {
        self.index
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .filed
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What an event did to the clusters' LISTs as the store holds them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Nothing left any cluster.
    Kept,
    /// A Machine left this `(namespace, cluster)`: deleted, out of the watch
    /// (its label changed), or filed under another cluster.
    Left(String, String),
    /// A list starts over: the store will be replaced whole, and what it drops
    /// is not reported one by one.
    Relisting,
}

impl MachineStoreWriter {
    pub fn apply(&mut self, event: &Event<Machine>) -> Change {
        let left = match event {
            Event::Apply(machine) => self.write().insert(machine.clone()),
            Event::Delete(machine) => self
                .write()
                .remove(&(machine.namespace().unwrap_or_default(), machine.name_any())),
            Event::Init => {
                self.relisting = Some(Index::default());
                return Change::Relisting;
            }
            Event::InitApply(machine) => {
                self.relisting
                    .get_or_insert_with(Index::default)
                    .insert(machine.clone());
                None
            }
            Event::InitDone => {
                let listed = self.relisting.take().unwrap_or_default();
                *self.write() = listed;
                self.store.ready.store(true, Ordering::Release);
                None
            }
        };
        left.map_or(Change::Kept, |(namespace, cluster)| {
            Change::Left(namespace, cluster)
        })
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Index> {
        self.store.index.write().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for MachineStoreWriter {
    fn drop(&mut self) {
        self.store.ready.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(namespace: &str, name: &str, cluster: Option<&str>) -> Machine {
        let mut labels = serde_json::json!({});
        if let Some(cluster) = cluster {
            labels[CLUSTER_NAME_LABEL] = cluster.into();
        }
        serde_json::from_value(serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"clusterName": cluster.unwrap_or(""), "bootstrap": {}, "infrastructureRef": {
                "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": name}}
        }))
        .unwrap()
    }

    fn names(store: &MachineStore, namespace: &str, cluster: &str) -> Vec<String> {
        store
            .of_cluster(namespace, cluster)
            .iter()
            .map(|m| m.name_any())
            .collect()
    }

    #[test]
    fn a_clusters_machines_are_found_by_namespace_and_label() {
        let (store, mut writer) = MachineStore::new();
        assert!(!store.is_ready(), "not before the first list");
        writer.apply(&Event::Init);
        for m in [
            machine("ns", "a-1", Some("a")),
            machine("ns", "a-2", Some("a")),
            machine("ns", "b-1", Some("b")),
            machine("other", "a-9", Some("a")),
            machine("ns", "loose", None),
        ] {
            writer.apply(&Event::InitApply(m));
        }
        assert!(store.is_empty(), "a list in progress is not served");
        writer.apply(&Event::InitDone);
        assert!(store.is_ready());
        assert_eq!(names(&store, "ns", "a"), ["a-1", "a-2"]);
        assert_eq!(names(&store, "ns", "b"), ["b-1"]);
        assert_eq!(names(&store, "other", "a"), ["a-9"]);
        assert!(names(&store, "ns", "c").is_empty());
        assert_eq!(
            store.len(),
            4,
            "the Machine without a cluster label is in no LIST"
        );

        // Relabelled to another cluster: found there only, and cluster a is
        // told it lost one.
        assert_eq!(
            writer.apply(&Event::Apply(machine("ns", "a-2", Some("b")))),
            Change::Left("ns".into(), "a".into())
        );
        assert_eq!(
            writer.apply(&Event::Apply(machine("ns", "a-2", Some("b")))),
            Change::Kept,
            "an update in place leaves no cluster"
        );
        assert_eq!(names(&store, "ns", "a"), ["a-1"]);
        assert_eq!(names(&store, "ns", "b"), ["a-2", "b-1"]);
        // Its label removed: in no cluster.
        writer.apply(&Event::Apply(machine("ns", "a-2", None)));
        assert_eq!(names(&store, "ns", "b"), ["b-1"]);
        assert_eq!(
            writer.apply(&Event::Delete(machine("ns", "a-1", Some("a")))),
            Change::Left("ns".into(), "a".into())
        );
        assert!(names(&store, "ns", "a").is_empty());
        assert_eq!(store.len(), 2);

        // A relist replaces the store whole at its end: what it no longer
        // has is gone without a Delete.
        assert_eq!(writer.apply(&Event::Init), Change::Relisting);
        writer.apply(&Event::InitApply(machine("ns", "c-1", Some("c"))));
        assert_eq!(
            names(&store, "ns", "b"),
            ["b-1"],
            "served until the list ends"
        );
        writer.apply(&Event::InitDone);
        assert!(names(&store, "ns", "b").is_empty());
        assert_eq!(names(&store, "ns", "c"), ["c-1"]);

        drop(writer);
        assert!(!store.is_ready(), "nothing feeds it any more");
    }
}
