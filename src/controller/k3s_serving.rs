//! The k3s serving certificate of each server (its supervisor port, 6443
//! unless `serverConfig.httpsListenPort` says otherwise), probed by one
//! verified TLS handshake per Machine at most once a day, in the background:
//! a reconcile never waits for it, it reads what the last probe found.
//!
//! Probed only where the node address is reachable: not when etcd is reached
//! through port-forward (the nodes are not routable from here), and only on a
//! Ready Node (k3s serves the port before kubelet reports Ready). A probe
//! that fails keeps the previous value and is tried again a day later: the
//! certificate lives a year and the etcd serving certificate is seen anyway.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tracing::{debug, warn};

use crate::decision::k3s_serving::Due;
use crate::workload::serving_probe::ProbeError;

/// A probe that has not completed its handshake by then gave nothing.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// What the probes of one Machine found.
#[derive(Clone, Debug, Default)]
struct Record {
    attempted: Option<DateTime<Utc>>,
    not_after: Option<DateTime<Utc>>,
}

/// Every Machine's probe record: by cluster (`namespace/cluster`), then by
/// Machine name. A reconcile reads its own cluster's, never a scan of the
/// fleet's (that was O(N) per reconcile: about 0.5 k instructions per
/// control plane, a quarter of an idle reconcile at N = 1000).
#[derive(Clone, Default)]
pub struct K3sServingProbes(Arc<Mutex<HashMap<String, BTreeMap<String, Record>>>>);

impl K3sServingProbes {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, BTreeMap<String, Record>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `pick` of each Machine's record of `cluster` that has it.
    fn of_cluster(
        &self,
        cluster: &str,
        pick: impl Fn(&Record) -> Option<DateTime<Utc>>,
    ) -> BTreeMap<String, DateTime<Utc>> {
        self.lock()
            .get(cluster)
            .into_iter()
            .flatten()
            .filter_map(|(machine, record)| Some((machine.clone(), pick(record)?)))
            .collect()
    }

    /// When each Machine of `cluster` (`namespace/cluster`) was last attempted.
    pub fn attempted(&self, cluster: &str) -> BTreeMap<String, DateTime<Utc>> {
        self.of_cluster(cluster, |r| r.attempted)
    }

    /// What the probes of `cluster`'s Machines found, by Machine name.
    pub fn found(&self, cluster: &str) -> BTreeMap<String, DateTime<Utc>> {
        self.of_cluster(cluster, |r| r.not_after)
    }

    /// Forget the Machines of `cluster` not in `present` (and the cluster
    /// once it has none), so the map stays bounded by the Machines that exist.
    pub fn retain(&self, cluster: &str, present: &[&str]) {
        let mut records = self.lock();
        if let Some(machines) = records.get_mut(cluster) {
            machines.retain(|machine, _| present.contains(&machine.as_str()));
            if machines.is_empty() {
                records.remove(cluster);
            }
        }
    }

    /// Start the probes of `due` (recorded as attempted at `now` first, so a
    /// reconcile meanwhile does not start them again); each records what it
    /// found when it ends.
    pub fn start(
        &self,
        cluster: &str,
        due: Vec<Due>,
        config: Arc<rustls::ClientConfig>,
        now: DateTime<Utc>,
    ) {
        for target in due {
            self.lock()
                .entry(cluster.to_string())
                .or_default()
                .entry(target.machine.clone())
                .or_default()
                .attempted = Some(now);
            let probes = self.clone();
            let cluster = cluster.to_string();
            let config = config.clone();
            tokio::spawn(async move {
                match crate::workload::serving_probe::probe(config, target.address, PROBE_TIMEOUT)
                    .await
                {
                    Ok(not_after) => {
                        debug!(machine = %target.machine, address = %target.address, %not_after, "k3s serving certificate probed");
                        if let Some(record) = probes
                            .lock()
                            .get_mut(&cluster)
                            .and_then(|machines| machines.get_mut(&target.machine))
                        {
                            record.not_after = Some(not_after);
                        }
                    }
                    // A certificate that fails verification (e.g. without
                    // the node's address among its SANs) needs a person; a
                    // server that did not answer is ordinary (booting, gone).
                    Err(err @ ProbeError::Verify { .. }) => {
                        warn!(machine = %target.machine, error = %err, "k3s serving certificate refused; its expiry is not known from it, next attempt in a day");
                    }
                    Err(err) => {
                        debug!(machine = %target.machine, error = %err, "k3s serving certificate not probed; next attempt in a day");
                    }
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> DateTime<Utc> {
        "2026-12-04T00:00:00Z".parse().unwrap()
    }

    #[test]
    fn records_are_kept_per_cluster_and_forgotten_with_their_machine() {
        let probes = K3sServingProbes::default();
        let record = |not_after| Record {
            attempted: Some(now()),
            not_after,
        };
        probes
            .lock()
            .insert("ns/a".into(), [("m1".into(), record(Some(now())))].into());
        probes
            .lock()
            .insert("ns/b".into(), [("m1".into(), record(None))].into());
        // A cluster whose name extends another's is not mistaken for it.
        probes
            .lock()
            .insert("ns/a-2".into(), [("m9".into(), record(Some(now())))].into());
        assert_eq!(probes.found("ns/a").keys().collect::<Vec<_>>(), ["m1"]);
        assert!(probes.found("ns/b").is_empty());
        assert_eq!(probes.attempted("ns/b").len(), 1);
        probes.retain("ns/a", &[]);
        assert!(probes.attempted("ns/a").is_empty());
        assert!(
            !probes.lock().contains_key("ns/a"),
            "an emptied cluster goes"
        );
        assert_eq!(probes.attempted("ns/b").len(), 1, "another cluster's stay");
        assert_eq!(probes.attempted("ns/a-2").len(), 1);
    }
}
