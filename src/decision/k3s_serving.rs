//! Which servers' k3s serving certificates are due to be probed, and on
//! which port: each Machine's at most once a day, on its Node's first
//! InternalIP, only on a Ready Node that is not going (k3s serves the port
//! before kubelet reports Ready), and only where the Nodes are routable from
//! here. Pure; the controller starts the probes (`controller::k3s_serving`)
//! and the record reads what they found.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use chrono::{DateTime, Utc};

use crate::api::{KThreesControlPlane, Machine};
use crate::workload::ControlPlaneNode;

/// How often each Machine's certificate is probed at most.
pub const PROBE_INTERVAL: chrono::TimeDelta = chrono::TimeDelta::days(1);
/// k3s's default `https-listen-port`.
pub const DEFAULT_PORT: u16 = 6443;

/// A Machine whose certificate is due to be probed, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Due {
    pub machine: String,
    pub address: SocketAddr,
}

/// Whether the Nodes' addresses can be probed from here: not when etcd is
/// reached through port-forward (`etcd_transport` as observed), for then the
/// Nodes are not routable from here.
pub fn nodes_reachable(etcd_transport: Option<&str>) -> bool {
    !etcd_transport.is_some_and(|t| t.starts_with("port-forward"))
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
/// (`attempted`, by Machine name).
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
    fn the_nodes_are_probed_unless_etcd_is_reached_through_port_forward() {
        let cases = [
            ("etcd_not_contacted", None, true),
            ("direct", Some("direct"), true),
            ("auto_went_direct", Some("direct (auto)"), true),
            ("port_forward", Some("port-forward"), false),
            (
                "auto_fell_back_to_port_forward",
                Some("port-forward (auto: direct could not connect: refused)"),
                false,
            ),
        ];
        for (name, transport, reachable) in cases {
            assert_eq!(nodes_reachable(transport), reachable, "{name}");
        }
    }
}
