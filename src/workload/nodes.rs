//! Control-plane Nodes of a workload cluster, their k3s etcd annotations and
//! addresses, and the endpoint through which each node's etcd member is reached.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use super::error::Error;
use crate::api::names::{
    K3S_ETCD_NODE_ADDRESS_ANNOTATION, K3S_ETCD_NODE_NAME_ANNOTATION, NODE_ROLE_CONTROL_PLANE_LABEL,
    NODE_ROLE_ETCD_LABEL, NODE_ROLE_MASTER_LABEL,
};

/// etcd client port on every k3s server.
pub const ETCD_CLIENT_PORT: u16 = 2379;

/// What we know of one control-plane Node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControlPlaneNode {
    pub name: String,
    /// Exact etcd member name (`etcd.k3s.cattle.io/node-name`), if k3s wrote it.
    pub etcd_member_name: Option<String>,
    /// etcd member address (`etcd.k3s.cattle.io/node-address`), if k3s wrote it.
    pub etcd_node_address: Option<String>,
    /// Labelled `node-role.kubernetes.io/etcd=true`.
    pub etcd_role: bool,
    /// `InternalIP` addresses in the order the Node lists them.
    pub internal_ips: Vec<IpAddr>,
    /// Every address as `(type, address)`.
    pub addresses: Vec<(String, String)>,
    /// The Node's `Ready` condition (`None`: not reported); k3s runs the API
    /// server, controller manager and scheduler in the same process as kubelet.
    pub ready: Option<bool>,
}

/// How the management cluster reaches an etcd member. One seam, so a later
/// transport (port-forward through the workload API server to an `etcd-proxy`
/// pod) can be added without touching callers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum EtcdTransport {
    /// Connect to `https://<node InternalIP>:2379`; the node address is routable.
    #[default]
    Direct,
}

/// Where one node's etcd member listens, and the name its certificate must carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdEndpoint {
    pub node: String,
    /// `https://<ip>:2379` (IPv6 in brackets).
    pub url: String,
    /// The name TLS verifies the server certificate against (the node IP).
    pub server_name: String,
    pub transport: EtcdTransport,
}

fn is_control_plane(node: &Node) -> bool {
    let labels = node.labels();
    labels.contains_key(NODE_ROLE_CONTROL_PLANE_LABEL)
        || labels.contains_key(NODE_ROLE_MASTER_LABEL)
}

impl ControlPlaneNode {
    /// Read a Node; `None` if it is not a control-plane Node.
    pub fn from_node(node: &Node) -> Option<Self> {
        if !is_control_plane(node) {
            return None;
        }
        let annotation = |key: &str| {
            node.annotations()
                .get(key)
                .filter(|v| !v.is_empty())
                .cloned()
        };
        let addresses: Vec<(String, String)> = node
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .map(|list| {
                list.iter()
                    .map(|a| (a.type_.clone(), a.address.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let internal_ips = addresses
            .iter()
            .filter(|(t, _)| t == "InternalIP")
            .filter_map(|(_, a)| a.parse().ok())
            .collect();
        Some(Self {
            name: node.name_any(),
            etcd_member_name: annotation(K3S_ETCD_NODE_NAME_ANNOTATION),
            etcd_node_address: annotation(K3S_ETCD_NODE_ADDRESS_ANNOTATION),
            etcd_role: node
                .labels()
                .get(NODE_ROLE_ETCD_LABEL)
                .is_some_and(|v| v == "true"),
            internal_ips,
            addresses,
            ready: node
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
                .map(|c| c.status == "True"),
        })
    }

    /// The IP the node's etcd member listens on: the first InternalIP, else the
    /// address k3s annotated for etcd.
    pub fn etcd_ip(&self) -> Option<IpAddr> {
        self.internal_ips.first().copied().or_else(|| {
            self.etcd_node_address
                .as_deref()
                .and_then(|a| a.parse().ok())
        })
    }
}

impl EtcdTransport {
    /// The endpoint of `node`'s etcd member, or `None` if the node has no usable IP.
    pub fn endpoint_for(&self, node: &ControlPlaneNode) -> Option<EtcdEndpoint> {
        match self {
            EtcdTransport::Direct => {
                let ip = node.etcd_ip()?;
                let host = match ip {
                    IpAddr::V4(v4) => v4.to_string(),
                    IpAddr::V6(v6) => format!("[{v6}]"),
                };
                Some(EtcdEndpoint {
                    node: node.name.clone(),
                    url: format!("https://{host}:{ETCD_CLIENT_PORT}"),
                    server_name: ip.to_string(),
                    transport: self.clone(),
                })
            }
        }
    }
}

/// Control-plane Nodes among `nodes`, sorted by name.
pub fn control_plane_nodes(nodes: &[Node]) -> Vec<ControlPlaneNode> {
    let mut out: Vec<_> = nodes
        .iter()
        .filter_map(ControlPlaneNode::from_node)
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// List the workload cluster's control-plane Nodes (label `control-plane` or
/// the legacy `master`), deduplicated and sorted by name.
#[tracing::instrument(skip(client))]
pub async fn list_control_plane_nodes(
    client: &Client,
    cluster: &str,
) -> Result<Vec<ControlPlaneNode>, Error> {
    let api: Api<Node> = Api::all(client.clone());
    let mut nodes: Vec<Node> = Vec::new();
    for label in [NODE_ROLE_CONTROL_PLANE_LABEL, NODE_ROLE_MASTER_LABEL] {
        let list = api
            .list(&ListParams::default().labels(label))
            .await
            .map_err(|source| Error::ListNodes {
                cluster: cluster.to_owned(),
                source,
            })?;
        for node in list.items {
            if !nodes.iter().any(|n| n.name_any() == node.name_any()) {
                nodes.push(node);
            }
        }
    }
    Ok(control_plane_nodes(&nodes))
}
