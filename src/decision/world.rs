//! The observed world of one KThreesControlPlane: everything a reconcile (or
//! `inspect`) reads, gathered once, before anything is decided.

use chrono::{DateTime, Utc};

use crate::api::{Cluster, KThreesControlPlane, Machine};
use crate::etcd::MembershipSnapshot;
use crate::lifecycle::SecretsView;
use crate::workload::ControlPlaneNode;

/// What could be read of the workload cluster's API.
#[derive(Clone, Debug)]
pub enum WorkloadState {
    /// No kubeconfig Secret yet, or the API did not answer: why.
    Unavailable { reason: String },
    /// Control-plane Nodes as listed.
    Nodes(Vec<ControlPlaneNode>),
}

/// What could be read of the workload cluster's etcd.
#[derive(Clone, Debug)]
pub enum EtcdObservation {
    /// `spec.externalDatastore`, and no workload Node shows embedded etcd:
    /// no etcd of ours.
    NotManaged,
    /// Embedded etcd, but the `<cluster>-etcd` Secret is missing or unusable:
    /// the membership is unknown, so nothing may be removed.
    NoCredentials {
        reason: String,
    },
    /// Managed, but not read this time (not initialized yet, or unreachable).
    Unreachable {
        reason: String,
    },
    Observed(MembershipSnapshot),
}

/// One reconcile's observation.
#[derive(Clone, Debug)]
pub struct World {
    pub kcp: KThreesControlPlane,
    /// The owning Cluster's name (owner reference, else the cluster-name label).
    pub cluster_name: Option<String>,
    pub cluster: Option<Cluster>,
    /// Control-plane Machines owned by this KThreesControlPlane.
    pub machines: Vec<Machine>,
    /// Control-plane Machines of the Cluster that this control plane does not own.
    pub foreign_machines: Vec<String>,
    /// The Cluster's other (worker) Machines.
    pub workers: Vec<String>,
    /// The cluster Secrets as observed (states only, never their content).
    pub secrets: SecretsView,
    pub workload: WorkloadState,
    pub etcd: EtcdObservation,
    /// How etcd was reached this time (`direct`, `port-forward`, and why for
    /// `auto`); `None` when not contacted.
    pub etcd_transport: Option<String>,
    /// When this controller first saw each etcd member (by id).
    pub members_first_seen: std::collections::BTreeMap<u64, DateTime<Utc>>,
    /// The leadership move this process started on this cluster and has not
    /// yet seen finish; in memory only ([`LeadershipMove`]).
    pub leadership_move: Option<LeadershipMove>,
    /// When each member's etcd serving certificate expires (by id), as our
    /// handshakes with it verified it; absent before one.
    pub serving_certs: std::collections::BTreeMap<u64, DateTime<Utc>>,
    /// When each Machine's k3s serving certificate (its supervisor port)
    /// expires (by Machine name), as the last daily probe verified it.
    pub k3s_serving_certs: std::collections::BTreeMap<String, DateTime<Utc>>,
    /// How long a ghost or orphan member must be seen before it is removed.
    pub orphan_grace: std::time::Duration,
    /// How long a server's Node may show embedded etcd without a member
    /// before that counts as an unhealthy member (a restart rejoining).
    pub member_missing_grace: std::time::Duration,
    /// `run --etcd-space-care` and its thresholds, the default quota.
    pub etcd_space: crate::space_rule::SpaceSettings,
    /// Whether the history is compacted to the current revision, read only
    /// when the space rule needs it ([`super::etcd_space::needs_history`]).
    pub etcd_history: Option<Result<crate::space_rule::History, String>>,
    /// Whether a restored member holds the snapshot's data, read only while
    /// a restore Machine is waited for ([`super::etcd_restore::marker_to_read`]).
    pub restored_data: Option<RestoredData>,
    /// The members this process defragmented, with the revision each
    /// reported right after ([`crate::space_rule::MemberSpace::measured`]).
    pub etcd_defragmented: std::collections::BTreeMap<u64, crate::space_rule::Defragmentation>,
    pub now: DateTime<Utc>,
}

impl World {
    pub fn nodes(&self) -> &[ControlPlaneNode] {
        match &self.workload {
            WorkloadState::Nodes(nodes) => nodes,
            WorkloadState::Unavailable { .. } => &[],
        }
    }

    pub fn node(&self, name: &str) -> Option<&ControlPlaneNode> {
        self.nodes().iter().find(|n| n.name == name)
    }

    /// A Node that shows embedded etcd (k3s's etcd label or annotations).
    /// With `spec.externalDatastore` set, one is enough for etcd to be managed.
    pub fn embedded_etcd_node(&self) -> Option<&ControlPlaneNode> {
        self.nodes().iter().find(|n| n.shows_embedded_etcd())
    }

    pub fn snapshot(&self) -> Option<&MembershipSnapshot> {
        match &self.etcd {
            EtcdObservation::Observed(s) => Some(s),
            _ => None,
        }
    }

    /// Initialized: recorded in status before, or the workload API answers
    /// with a control-plane Node of one of our Machines (the first server is up).
    pub fn control_plane_initialized(&self) -> bool {
        self.kcp.is_initialized()
            || self.machines.iter().any(|m| {
                m.node_name()
                    .is_some_and(|n| self.nodes().iter().any(|node| node.name == n))
            })
    }

    pub fn machine(&self, name: &str) -> Option<&Machine> {
        self.machines
            .iter()
            .find(|m| m.metadata.name.as_deref() == Some(name))
    }

    /// Replace the observed Machine of the same name with `updated` (as
    /// written), so later writes of the reconcile are conditional on it.
    pub fn replace_machine(&mut self, updated: Machine) {
        if let Some(slot) = self
            .machines
            .iter_mut()
            .find(|m| m.metadata.name == updated.metadata.name)
        {
            *slot = updated;
        }
    }
}

/// One read of the restore's marker key (the snapshot's source Node).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoredData {
    pub key: String,
    pub found: Result<bool, String>,
}

/// A leadership move started and not yet confirmed. The MoveLeader call runs
/// beside the reconcile, which requeues and confirms the new leader on a
/// later pass instead of holding a worker for it. Kept in memory only: a
/// restart forgets it, the target is then still the leader (or not), and the
/// step machine issues the move again (or goes on): that is the resume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeadershipMove {
    /// The Machine whose member gives up leadership.
    pub machine: String,
    pub from: u64,
    pub to: u64,
    pub started: DateTime<Utc>,
    /// After this, a target still leading means the move failed: issue it again.
    pub deadline: DateTime<Utc>,
}
