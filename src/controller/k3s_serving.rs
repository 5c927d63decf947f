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

/// Every Machine's probe record, by `namespace/cluster/machine`.
#[derive(Clone, Default)]
pub struct K3sServingProbes(Arc<Mutex<HashMap<String, Record>>>);

impl K3sServingProbes {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Record>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// When each Machine of `cluster` (`namespace/cluster`) was last attempted.
    pub fn attempted(&self, cluster: &str) -> BTreeMap<String, DateTime<Utc>> {
        let prefix = format!("{cluster}/");
        self.lock()
            .iter()
            .filter_map(|(key, r)| Some((key.strip_prefix(&prefix)?.to_string(), r.attempted?)))
            .collect()
    }

    /// What the probes of `cluster`'s Machines found, by Machine name.
    pub fn found(&self, cluster: &str) -> BTreeMap<String, DateTime<Utc>> {
        let prefix = format!("{cluster}/");
        self.lock()
            .iter()
            .filter_map(|(key, r)| Some((key.strip_prefix(&prefix)?.to_string(), r.not_after?)))
            .collect()
    }

    /// Forget the Machines of `cluster` not in `present`, so the map stays
    /// bounded by the Machines that exist.
    pub fn retain(&self, cluster: &str, present: &[&str]) {
        let prefix = format!("{cluster}/");
        self.lock().retain(|key, _| {
            key.strip_prefix(&prefix)
                .is_none_or(|machine| present.contains(&machine))
        });
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
            let key = format!("{cluster}/{}", target.machine);
            self.lock().entry(key.clone()).or_default().attempted = Some(now);
            let probes = self.clone();
            let config = config.clone();
            tokio::spawn(async move {
                match crate::workload::serving_probe::probe(config, target.address, PROBE_TIMEOUT)
                    .await
                {
                    Ok(not_after) => {
                        debug!(machine = %target.machine, address = %target.address, %not_after, "k3s serving certificate probed");
                        if let Some(record) = probes.lock().get_mut(&key) {
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
        probes.lock().insert(
            "ns/a/m1".into(),
            Record {
                attempted: Some(now()),
                not_after: Some(now()),
            },
        );
        probes.lock().insert(
            "ns/b/m1".into(),
            Record {
                attempted: Some(now()),
                not_after: None,
            },
        );
        assert_eq!(probes.found("ns/a").len(), 1);
        assert!(probes.found("ns/b").is_empty());
        assert_eq!(probes.attempted("ns/b").len(), 1);
        probes.retain("ns/a", &[]);
        assert!(probes.attempted("ns/a").is_empty());
        assert_eq!(probes.attempted("ns/b").len(), 1, "another cluster's stay");
    }
}
