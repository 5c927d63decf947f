//! Reach etcd members through the workload API server: a port-forward to the
//! `etcd-proxy` pod (kube-system, `app=etcd-proxy`; a DaemonSet the bootstrap
//! provider writes as a server manifest, on the pod network, socat relaying
//! over IPv4 to `$(HOSTIP):2379`) on the member's node, as upstream
//! cluster-api-k3s does. Such a pod is Pending until the node is labelled and
//! its network and image are ready: only a Running one is used.
//!
//! Each member address gets a local listener on 127.0.0.1; every connection
//! accepted there opens its own port-forward (kube's `Api::<Pod>::portforward`),
//! so a broken tunnel is rebuilt by the next connection, and the etcd client's
//! pooling of connections applies unchanged. The TLS session runs end to end
//! inside the tunnel and is verified against the member's node address (the
//! transport keeps `server_name`), never against the local address.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use crate::api::names::{ETCD_PROXY_NAMESPACE, ETCD_PROXY_SELECTOR};
use crate::etcd::EtcdError;
use crate::etcd::transport::Relay;

use super::nodes::ControlPlaneNode;

/// Why a tunnel could not be opened (kept per member address, so the etcd
/// error tells it instead of "connection closed").
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TunnelError {
    #[error(
        "no Node of the workload cluster has InternalIP (or etcd.k3s.cattle.io/node-address) {host}, so no etcd proxy can be chosen for it"
    )]
    NoNode { host: String },
    #[error(
        "no Running etcd proxy pod on node {node}: no pod in {ETCD_PROXY_NAMESPACE} matches labels {ETCD_PROXY_SELECTOR} and spec.nodeName={node} (does the node run etcd, and is the etcd-proxy DaemonSet deployed?)"
    )]
    NoProxyPod { node: String },
    #[error(
        "the etcd proxy pod {ETCD_PROXY_NAMESPACE}/{pod} on node {node} is {phase}, not Running (its image pull, the pod network, or the node's etcd label may not be ready yet)"
    )]
    ProxyPodNotRunning {
        node: String,
        pod: String,
        phase: String,
    },
    #[error("workload API server: {0}")]
    Api(String),
}

impl TunnelError {
    fn retryable(&self) -> bool {
        matches!(self, TunnelError::Api(_))
    }
}

struct Bound {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

struct Shared {
    client: Client,
    /// Last failure per member host; cleared by a tunnel that opens.
    failures: Mutex<HashMap<String, TunnelError>>,
    opened: AtomicU64,
    /// Pod each member host was last tunnelled to (for `inspect`).
    pods: Mutex<HashMap<String, String>>,
}

/// The port-forward relay of one workload cluster.
pub struct PortForwardRelay {
    shared: Arc<Shared>,
    runtime: tokio::runtime::Handle,
    listeners: Mutex<HashMap<(String, u16), Bound>>,
}

impl std::fmt::Debug for PortForwardRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortForwardRelay")
            .field("tunnels_opened", &self.tunnels_opened())
            .finish_non_exhaustive()
    }
}

impl Drop for PortForwardRelay {
    fn drop(&mut self) {
        for bound in self
            .listeners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
        {
            bound.task.abort();
        }
    }
}

impl PortForwardRelay {
    /// A relay through the workload API server `client`; must be created
    /// inside a Tokio runtime (its listeners run there).
    pub fn new(client: Client) -> Result<Self, EtcdError> {
        let runtime =
            tokio::runtime::Handle::try_current().map_err(|e| EtcdError::InvalidEndpoint {
                url: String::new(),
                reason: format!("port-forward needs a Tokio runtime: {e}"),
            })?;
        Ok(Self {
            shared: Arc::new(Shared {
                client,
                failures: Mutex::default(),
                opened: AtomicU64::new(0),
                pods: Mutex::default(),
            }),
            runtime,
            listeners: Mutex::default(),
        })
    }

    /// Port-forwards opened so far.
    pub fn tunnels_opened(&self) -> u64 {
        self.shared.opened.load(Ordering::Relaxed)
    }
}

impl Relay for PortForwardRelay {
    fn local_addr(&self, host: &str, port: u16) -> Result<SocketAddr, EtcdError> {
        let key = (host.to_string(), port);
        let mut listeners = self.listeners.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(bound) = listeners.get(&key)
            && !bound.task.is_finished()
        {
            return Ok(bound.addr);
        }
        let local = |e: std::io::Error| EtcdError::Unreachable {
            endpoint: format!("https://{host}:{port}"),
            reason: format!("cannot listen on 127.0.0.1 for the port-forward: {e}"),
        };
        let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(local)?;
        listener.set_nonblocking(true).map_err(local)?;
        let addr = listener.local_addr().map_err(local)?;
        let shared = self.shared.clone();
        let member = key.clone();
        let task = self.runtime.spawn(async move {
            let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                return;
            };
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(forward(shared.clone(), member.clone(), conn));
            }
        });
        listeners.insert(key, Bound { addr, task });
        Ok(addr)
    }

    fn kind(&self) -> &'static str {
        "port-forward"
    }

    fn failure(&self, host: &str) -> Option<String> {
        self.shared
            .failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(host)
            .map(ToString::to_string)
    }

    fn route(&self, host: &str) -> Option<String> {
        self.shared
            .pods
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(host)
            .map(|pod| format!("{ETCD_PROXY_NAMESPACE}/{pod}"))
    }
}

/// One accepted connection: open a port-forward to the member's proxy pod and
/// copy both ways until either side closes.
async fn forward(shared: Arc<Shared>, member: (String, u16), mut conn: tokio::net::TcpStream) {
    let (host, port) = (member.0.as_str(), member.1);
    // Bounded: API hiccups are retried a few times, a missing pod is not.
    let opened = (|| open(&shared.client, host, port))
        .retry(
            ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(100))
                .with_max_delay(Duration::from_millis(500))
                .with_max_times(3),
        )
        .when(TunnelError::retryable)
        .await;
    let (pod, mut forwarder) = match opened {
        Ok(opened) => opened,
        Err(err) => {
            // Per attempt, so DEBUG: the etcd condition says it once per change.
            tracing::debug!(member = %format!("{host}:{port}"), error = %err, "etcd port-forward failed");
            shared
                .failures
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(member.0, err);
            return;
        }
    };
    shared.opened.fetch_add(1, Ordering::Relaxed);
    shared
        .failures
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(host);
    shared
        .pods
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(host.to_string(), pod);
    let Some(mut stream) = forwarder.take_stream(port) else {
        return;
    };
    let _ = tokio::io::copy_bidirectional(&mut conn, &mut stream).await;
    drop(stream);
    forwarder.abort();
}

async fn open(
    client: &Client,
    host: &str,
    port: u16,
) -> Result<(String, kube::api::Portforwarder), TunnelError> {
    let api_err = |e: kube::Error| TunnelError::Api(e.to_string());
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes
        .list(&ListParams::default())
        .await
        .map_err(api_err)?
        .items
        .iter()
        .filter_map(ControlPlaneNode::from_node)
        .find(|n| {
            n.etcd_ip().is_some_and(|ip| ip.to_string() == host)
                || n.etcd_node_address.as_deref() == Some(host)
        })
        .map(|n| n.name)
        .ok_or_else(|| TunnelError::NoNode {
            host: host.to_string(),
        })?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ETCD_PROXY_NAMESPACE);
    let mut candidates = pods
        .list(
            &ListParams::default()
                .labels(ETCD_PROXY_SELECTOR)
                .fields(&format!("spec.nodeName={node}")),
        )
        .await
        .map_err(api_err)?
        .items;
    candidates.retain(|p| p.metadata.deletion_timestamp.is_none());
    candidates.sort_by_key(|p| p.name_any());
    let phase = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_else(|| "Pending".into())
    };
    let pod = match candidates.iter().find(|p| phase(p) == "Running") {
        Some(p) => p.name_any(),
        None => {
            return Err(match candidates.first() {
                Some(p) => TunnelError::ProxyPodNotRunning {
                    node,
                    pod: p.name_any(),
                    phase: phase(p),
                },
                None => TunnelError::NoProxyPod { node },
            });
        }
    };
    let forwarder = pods.portforward(&pod, &[port]).await.map_err(api_err)?;
    Ok((pod, forwarder))
}
