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
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tracing::{debug, warn};

use crate::workload::serving_probe::ProbeError;

use crate::api::{KThreesControlPlane, Machine};
use crate::workload::ControlPlaneNode;

/// How often each Machine's certificate is probed at most.
pub const PROBE_INTERVAL: chrono::TimeDelta = chrono::TimeDelta::days(1);
/// A probe that has not completed its handshake by then gave nothing.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// k3s's default `https-listen-port`.
pub const DEFAULT_PORT: u16 = 6443;

/// What the probes of one Machine found.
#[derive(Clone, Debug, Default)]
struct Record {
    attempted: Option<DateTime<Utc>>,
    not_after: Option<DateTime<Utc>>,
}

/// Every Machine's probe record, by `namespace/cluster/machine`.
#[derive(Clone, Default)]
pub struct K3sServingProbes(Arc<Mutex<HashMap<String, Record>>>);

/// A Machine whose certificate is due to be probed, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Due {
    pub machine: String,
    pub address: SocketAddr,
}

/// The port k3s serves on for `kcp`: `serverConfig.httpsListenPort`, else
/// 6443; `Err` names the field when it is not a port.
pub fn port(kcp: &KThreesControlPlane) -> Result<u16, String> {
    let text = &kcp.spec.kthrees_config_spec.server_config.https_listen_port;
    if text.is_empty() {
        return Ok(DEFAULT_PORT);
    }
    text.parse::<u16>().map_err(|_| {
        format!(
            "KThreesControlPlane {}/{}: spec.kthreesConfigSpec.serverConfig.httpsListenPort {text:?} is not a port (1 to 65535)",
            kcp.metadata.namespace.as_deref().unwrap_or_default(),
            kcp.metadata.name.as_deref().unwrap_or_default()
        )
    })
}

/// Which of `machines` are due at `now`, given when each was last attempted
/// (`attempted`, by Machine name). Pure.
pub fn due(
    machines: &[Machine],
    nodes: &[ControlPlaneNode],
    port: u16,
    attempted: &BTreeMap<String, DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Vec<Due> {
    machines
        .iter()
        .filter(|m| !m.is_deleting())
        .filter_map(|m| {
            let name = m.metadata.name.clone()?;
            if attempted
                .get(&name)
                .is_some_and(|at| now - *at < PROBE_INTERVAL)
            {
                return None;
            }
            let node = nodes
                .iter()
                .find(|n| Some(n.name.as_str()) == m.node_name())?;
            if node.ready != Some(true) || node.deleting {
                return None;
            }
            let ip = *node.internal_ips.first()?;
            Some(Due {
                machine: name,
                address: SocketAddr::new(ip, port),
            })
        })
        .collect()
}

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

    fn kcp_with_port(port: &str) -> KThreesControlPlane {
        serde_json::from_value(json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta2",
            "kind": "KThreesControlPlane",
            "metadata": {"name": "cp", "namespace": "ns"},
            "spec": {
                "version": "v1.30.2+k3s1",
                "machineTemplate": {"spec": {"infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachineTemplate", "name": "t"}}},
                "kthreesConfigSpec": {"serverConfig": {"httpsListenPort": port}},
            },
        }))
        .unwrap()
    }

    #[test]
    fn the_port_is_httpslistenport_else_6443_and_a_bad_one_names_the_object_and_field() {
        assert_eq!(port(&kcp_with_port("")), Ok(6443));
        assert_eq!(port(&kcp_with_port("7443")), Ok(7443));
        let err = port(&kcp_with_port("https")).unwrap_err();
        assert!(
            err.contains("KThreesControlPlane ns/cp")
                && err.contains("spec.kthreesConfigSpec.serverConfig.httpsListenPort")
                && err.contains("\"https\""),
            "{err}"
        );
    }
    use serde_json::json;

    fn machine(name: &str, node: Option<&str>, deleting: bool) -> Machine {
        let mut value = json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"clusterName": "c"},
        });
        if let Some(node) = node {
            value["status"] = json!({"nodeRef": {"name": node}});
        }
        if deleting {
            value["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        serde_json::from_value(value).unwrap()
    }

    fn node(name: &str, ip: &str, ready: Option<bool>) -> ControlPlaneNode {
        ControlPlaneNode {
            name: name.into(),
            etcd_member_name: None,
            etcd_node_address: None,
            etcd_role: true,
            internal_ips: vec![ip.parse().unwrap()],
            addresses: vec![],
            ready,
            etcd_voter: None,
            created: None,
            deleting: false,
        }
    }

    fn now() -> DateTime<Utc> {
        "2026-12-04T00:00:00Z".parse().unwrap()
    }

    #[test]
    fn a_ready_server_never_probed_is_due_on_its_internal_ip_and_port() {
        let due = due(
            &[machine("m1", Some("n1"), false)],
            &[node("n1", "10.0.0.1", Some(true))],
            6443,
            &BTreeMap::new(),
            now(),
        );
        assert_eq!(
            due,
            vec![Due {
                machine: "m1".into(),
                address: "10.0.0.1:6443".parse().unwrap()
            }]
        );
    }

    #[test]
    fn a_server_probed_less_than_a_day_ago_is_not_probed_again() {
        let attempted = BTreeMap::from([("m1".to_string(), now() - chrono::TimeDelta::hours(23))]);
        let machines = [machine("m1", Some("n1"), false)];
        let nodes = [node("n1", "10.0.0.1", Some(true))];
        assert!(due(&machines, &nodes, 6443, &attempted, now()).is_empty());
        let a_day_ago = BTreeMap::from([("m1".to_string(), now() - chrono::TimeDelta::hours(24))]);
        assert_eq!(due(&machines, &nodes, 6443, &a_day_ago, now()).len(), 1);
    }

    #[test]
    fn not_ready_deleting_or_nodeless_servers_are_not_probed() {
        let machines = [
            machine("no-node", None, false),
            machine("not-ready", Some("n2"), false),
            machine("deleting", Some("n3"), true),
            machine("unknown-node", Some("n9"), false),
        ];
        let nodes = [
            node("n2", "10.0.0.2", Some(false)),
            node("n3", "10.0.0.3", Some(true)),
        ];
        assert!(due(&machines, &nodes, 6443, &BTreeMap::new(), now()).is_empty());
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
