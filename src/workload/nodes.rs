//! Control-plane Nodes of a workload cluster, their k3s etcd annotations and
//! addresses, and the client URL each node's etcd member serves (how that URL
//! is dialled is the etcd engine's transport seam, `etcd::Transport`).

use std::net::IpAddr;

use chrono::{DateTime, Utc};

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::ListParams;

use super::error::Error;
use super::reads::WorkloadReads;
use crate::api::names::{
    K3S_ETCD_IS_VOTER_CONDITION, K3S_ETCD_NODE_ADDRESS_ANNOTATION, K3S_ETCD_NODE_NAME_ANNOTATION,
    NODE_ROLE_CONTROL_PLANE_LABEL, NODE_ROLE_ETCD_LABEL, NODE_ROLE_MASTER_LABEL,
};

use crate::etcd::transport::DEFAULT_CLIENT_PORT as ETCD_CLIENT_PORT;

/// Label selector of k3s's etcd Nodes.
const ETCD_ROLE_SELECTOR: &str = "node-role.kubernetes.io/etcd=true";

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
    /// k3s's `EtcdIsVoter` condition, as its etcd leader last wrote it.
    pub etcd_voter: Option<EtcdVoterCondition>,
    /// `metadata.creationTimestamp`.
    pub created: Option<DateTime<Utc>>,
    /// `metadata.deletionTimestamp` is set: the Node is Terminating (held by
    /// finalizers, e.g. k3s's while it removes the Node's etcd member).
    pub deleting: bool,
}

/// k3s's `EtcdIsVoter` Node condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdVoterCondition {
    /// `True`: a voting member; `False`: a learner, unhealthy, or not a member.
    pub voter: bool,
    /// `MemberNotLearner`, `MemberIsLearner`, `Unhealthy`, `NotAMember`.
    pub reason: String,
    pub message: String,
    /// When the status, reason or message last changed.
    pub since: Option<DateTime<Utc>>,
}

/// A k3s server: labelled control-plane or master, or etcd alone (an
/// etcd-only server, `--disable-apiserver`, gets only the etcd label).
fn is_server(node: &Node) -> bool {
    let labels = node.labels();
    labels.contains_key(NODE_ROLE_CONTROL_PLANE_LABEL)
        || labels.contains_key(NODE_ROLE_MASTER_LABEL)
        || labels
            .get(NODE_ROLE_ETCD_LABEL)
            .is_some_and(|v| v == "true")
}

fn to_chrono(time: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> DateTime<Utc> {
    let ts = time.0;
    DateTime::from_timestamp(ts.as_second(), ts.subsec_nanosecond().max(0) as u32)
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

impl ControlPlaneNode {
    /// Read a Node; `None` if it is not a k3s server's Node.
    pub fn from_node(node: &Node) -> Option<Self> {
        if !is_server(node) {
            return None;
        }
        let conditions = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default();
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
            ready: conditions
                .iter()
                .find(|c| c.type_ == "Ready")
                .map(|c| c.status == "True"),
            etcd_voter: conditions
                .iter()
                .find(|c| c.type_ == K3S_ETCD_IS_VOTER_CONDITION && c.status != "Unknown")
                .map(|c| EtcdVoterCondition {
                    voter: c.status == "True",
                    reason: c.reason.clone().unwrap_or_default(),
                    message: c.message.clone().unwrap_or_default(),
                    since: c.last_transition_time.as_ref().map(to_chrono),
                }),
            created: node.metadata.creation_timestamp.as_ref().map(to_chrono),
            deleting: node.metadata.deletion_timestamp.is_some(),
        })
    }

    /// k3s marked this Node as running embedded etcd: its etcd role label or
    /// its etcd member annotations. Only `--disable-etcd` servers (and
    /// external-datastore servers) have none of them. The `EtcdIsVoter`
    /// condition alone is no mark: k3s drops the label and annotations of a
    /// server switched to `--disable-etcd`, but its removal of the condition
    /// does not reach the status (k3s-io/k3s pkg/etcd/metadata_controller.go,
    /// handleSelf), so it may stay behind, stale.
    pub fn shows_embedded_etcd(&self) -> bool {
        self.etcd_role || self.etcd_member_name.is_some() || self.etcd_node_address.is_some()
    }

    /// What marked it as an etcd node, for messages.
    pub fn etcd_marks(&self) -> String {
        let mut marks = Vec::new();
        if self.etcd_role {
            marks.push(format!("label {NODE_ROLE_ETCD_LABEL}=true"));
        }
        if let Some(name) = &self.etcd_member_name {
            marks.push(format!("annotation {K3S_ETCD_NODE_NAME_ANNOTATION}={name}"));
        }
        if let Some(voter) = self.etcd_voter.as_ref().filter(|v| !v.voter) {
            marks.push(format!(
                "{K3S_ETCD_IS_VOTER_CONDITION}=False ({})",
                voter.reason
            ));
        }
        marks.join(", ")
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

impl ControlPlaneNode {
    /// The client URL k3s serves this node's etcd member on,
    /// `https://<ip>:2379` (IPv6 in brackets), or `None` if the node has no
    /// usable IP (never a guess). The certificate is verified against that IP.
    pub fn etcd_client_url(&self) -> Option<String> {
        let host = match self.etcd_ip()? {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => format!("[{v6}]"),
        };
        Some(format!("https://{host}:{ETCD_CLIENT_PORT}"))
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

/// List the workload cluster's server Nodes, sorted by name: those labelled
/// `node-role.kubernetes.io/control-plane` (k3s labels every server with an
/// API server so since v1.20, next to the legacy `master`), and, only when one
/// of the Nodes in `expected` (the control-plane Machines' nodeRefs) is not
/// among them, those labelled `master` or `etcd=true` too (an etcd-only server
/// carries only the etcd label). A steady cluster of API servers costs one
/// LIST.
#[tracing::instrument(skip(reads, expected))]
pub async fn list_control_plane_nodes(
    reads: &WorkloadReads,
    cluster: &str,
    expected: &[&str],
) -> Result<Vec<ControlPlaneNode>, Error> {
    let list = |label: &'static str| async move {
        reads
            .list_all::<Node>(&ListParams::default().labels(label))
            .await
            .map(|l| l.items)
            .map_err(|source| Error::ListNodes {
                cluster: cluster.to_owned(),
                source,
            })
    };
    let mut nodes: Vec<Node> = list(NODE_ROLE_CONTROL_PLANE_LABEL).await?;
    let missing = expected
        .iter()
        .any(|name| !nodes.iter().any(|n| n.name_any() == *name));
    if missing {
        for label in [NODE_ROLE_MASTER_LABEL, ETCD_ROLE_SELECTOR] {
            for node in list(label).await? {
                if !nodes.iter().any(|n| n.name_any() == node.name_any()) {
                    nodes.push(node);
                }
            }
        }
    }
    Ok(control_plane_nodes(&nodes))
}
