//! What k3s itself does to a workload cluster's Nodes and etcd members, for
//! the sandbox (docs/k3s.md has each fact with its source path):
//!
//! - the member controller's finalizer `wrangler.cattle.io/managed-etcd-controller`
//!   on every Node, and on a Node's deletion the removal of the member whose
//!   name and peer address match its `etcd.k3s.cattle.io/node-name` and
//!   `node-address` annotations, with no quorum check of its own (etcd's
//!   own reconfiguration check still applies); while the member list or the
//!   removal fails the finalizer stays and the Node hangs in Terminating; no
//!   matching member: the finalizer goes (k3s reports success);
//! - the `etcd.k3s.cattle.io/remove` annotation: the same removal, then
//!   `etcd.k3s.cattle.io/removed-node-name` written and the `node-name` and
//!   `node-address` annotations deleted;
//! - on the etcd leader's tick (15 s in k3s): learners promoted, a learner
//!   whose applied index has not grown for the stall period (5 min) removed,
//!   and the `EtcdIsVoter` condition written on every etcd Node (reasons
//!   `MemberNotLearner`, `MemberIsLearner`, `NotAMember`).
//!
//! Only the decisions are simulated; the members and their removal are real.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::api::names::{
    K3S_ETCD_IS_VOTER_CONDITION, K3S_ETCD_NODE_ADDRESS_ANNOTATION, K3S_ETCD_NODE_FINALIZER,
    K3S_ETCD_NODE_NAME_ANNOTATION, K3S_NOT_A_MEMBER_REASON, NODE_ROLE_ETCD_LABEL,
};
use crate::etcd::{EtcdCluster, MembershipSnapshot, Transport};

/// k3s's annotation asking it to remove a Node's etcd member.
pub const REMOVE_ANNOTATION: &str = "etcd.k3s.cattle.io/remove";
/// What k3s writes once it removed the member.
pub const REMOVED_NODE_NAME_ANNOTATION: &str = "etcd.k3s.cattle.io/removed-node-name";

/// How fast the simulated k3s acts.
#[derive(Clone, Copy, Debug)]
pub struct K3sAgentSettings {
    /// The leader's learner tick: promotion, stall eviction, `EtcdIsVoter`.
    pub tick: Duration,
    /// A learner whose applied index has not grown for this long is removed.
    pub stall_after: Duration,
    /// How soon a Node deletion or a remove annotation is acted on (k3s's
    /// handlers are event-driven; this is the simulation's polling period).
    pub react_within: Duration,
}

impl Default for K3sAgentSettings {
    /// k3s's own timing.
    fn default() -> Self {
        K3sAgentSettings {
            tick: Duration::from_secs(15),
            stall_after: Duration::from_secs(300),
            react_within: Duration::from_millis(200),
        }
    }
}

/// One thing k3s did, for tests to assert on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum K3sAction {
    /// A member removed because its Node was deleted or annotated.
    RemovedMember {
        node: String,
        member: String,
    },
    /// A Node's finalizer kept because the member list or removal failed.
    KeptFinalizer {
        node: String,
        why: String,
    },
    PromotedLearner {
        member: String,
    },
    EvictedStalledLearner {
        member: String,
    },
}

/// The running simulated k3s of one sandbox.
pub struct K3sAgent {
    stop: CancellationToken,
    task: JoinHandle<()>,
    actions: Arc<Mutex<Vec<K3sAction>>>,
}

impl K3sAgent {
    /// Start acting on the workload cluster of `nodes` and the etcd of `etcd`.
    pub fn start(
        nodes: Api<Node>,
        etcd: EtcdCluster,
        transport: Transport,
        settings: K3sAgentSettings,
    ) -> Self {
        let stop = CancellationToken::new();
        let actions = Arc::new(Mutex::new(Vec::new()));
        let agent = Agent {
            nodes,
            etcd,
            transport,
            settings,
            actions: actions.clone(),
            learners: HashMap::new(),
        };
        let task = tokio::spawn(agent.run(stop.clone()));
        K3sAgent {
            stop,
            task,
            actions,
        }
    }

    /// What it did so far, in order.
    pub fn actions(&self) -> Vec<K3sAction> {
        self.actions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

struct Agent {
    nodes: Api<Node>,
    etcd: EtcdCluster,
    transport: Transport,
    settings: K3sAgentSettings,
    actions: Arc<Mutex<Vec<K3sAction>>>,
    /// Learner id -> (applied index, since when it has not grown).
    learners: HashMap<u64, (u64, Instant)>,
}

fn annotation<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

fn host_of(url: &str) -> Option<&str> {
    let rest = url.split_once("://")?.1;
    let host = rest.rsplit_once(':').map_or(rest, |(h, _)| h);
    Some(host.trim_start_matches('[').trim_end_matches(']'))
}

/// The member k3s's RemovePeer removes for `node`: name and peer address both match.
fn member_of(node: &Node, snapshot: &MembershipSnapshot) -> Option<(u64, String)> {
    let name = annotation(node, K3S_ETCD_NODE_NAME_ANNOTATION)?;
    let address = annotation(node, K3S_ETCD_NODE_ADDRESS_ANNOTATION)?;
    snapshot
        .members
        .iter()
        .find(|m| m.name == name && m.peer_urls.iter().any(|u| host_of(u) == Some(address)))
        .map(|m| (m.id, m.name.clone()))
}

impl Agent {
    fn did(&self, action: K3sAction) {
        tracing::debug!(?action, "simulated k3s");
        self.actions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(action);
    }

    async fn run(mut self, stop: CancellationToken) {
        let mut next_tick = Instant::now() + self.settings.tick;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(self.settings.react_within) => {}
            }
            self.react().await;
            if Instant::now() >= next_tick {
                next_tick = Instant::now() + self.settings.tick;
                self.leader_tick().await;
            }
        }
    }

    /// The member controller: finalizers, Node deletions, remove annotations.
    async fn react(&self) {
        let Ok(list) = self.nodes.list(&ListParams::default()).await else {
            return;
        };
        let mut snapshot: Option<Result<MembershipSnapshot, String>> = None;
        for node in &list.items {
            let name = node.name_any();
            let finalizers = node.finalizers().to_vec();
            let ours = finalizers.iter().any(|f| f == K3S_ETCD_NODE_FINALIZER);
            let deleting = node.metadata.deletion_timestamp.is_some();
            let asked = annotation(node, REMOVE_ANNOTATION) == Some("true")
                && annotation(node, REMOVED_NODE_NAME_ANNOTATION).is_none();
            if !deleting && !ours {
                let mut with = finalizers.clone();
                with.push(K3S_ETCD_NODE_FINALIZER.to_string());
                self.patch_finalizers(&name, &node.resource_version(), with)
                    .await;
                continue;
            }
            let removing = deleting && ours;
            if !removing && !asked {
                continue;
            }
            if snapshot.is_none() {
                snapshot = Some(self.etcd.snapshot().await.map_err(|e| e.to_string()));
            }
            let removed = match snapshot.as_ref().expect("read above") {
                Err(why) => Err(format!("member list failed: {why}")),
                Ok(snap) => match member_of(node, snap) {
                    None => Ok(None),
                    Some((id, member)) => match self.etcd.remove_member(id).await {
                        Ok(_) => Ok(Some(member)),
                        Err(e) => Err(format!("removing member {member}: {e}")),
                    },
                },
            };
            match removed {
                Err(why) => {
                    self.did(K3sAction::KeptFinalizer {
                        node: name.clone(),
                        why,
                    });
                }
                Ok(member) => {
                    if let Some(member) = &member {
                        self.did(K3sAction::RemovedMember {
                            node: name.clone(),
                            member: member.clone(),
                        });
                        snapshot = None;
                    }
                    if deleting {
                        let without = finalizers
                            .iter()
                            .filter(|f| *f != K3S_ETCD_NODE_FINALIZER)
                            .cloned()
                            .collect();
                        self.patch_finalizers(&name, &node.resource_version(), without)
                            .await;
                    } else {
                        let value = annotation(node, K3S_ETCD_NODE_NAME_ANNOTATION)
                            .unwrap_or_default()
                            .to_string();
                        let _ = self
                            .nodes
                            .patch(
                                &name,
                                &PatchParams::default(),
                                // k3s drops the member's annotations with it; the
                                // Node's own k3s writes them again while it runs.
                                &Patch::Merge(json!({"metadata": {"annotations": {
                                    REMOVED_NODE_NAME_ANNOTATION: value,
                                    K3S_ETCD_NODE_NAME_ANNOTATION: null,
                                    K3S_ETCD_NODE_ADDRESS_ANNOTATION: null,
                                }}})),
                            )
                            .await;
                    }
                }
            }
        }
    }

    async fn patch_finalizers(
        &self,
        node: &str,
        version: &Option<String>,
        finalizers: Vec<String>,
    ) {
        let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": version}});
        // A conflict is retried on the next pass, as wrangler requeues.
        let _ = self
            .nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await;
    }

    /// The etcd leader's tick: promote learners, evict stalled ones, write
    /// `EtcdIsVoter` on every etcd Node.
    async fn leader_tick(&mut self) {
        let Ok(snap) = self.etcd.snapshot().await else {
            return;
        };
        let now = Instant::now();
        for member in snap.members.iter().filter(|m| m.learner) {
            let applied = member.status.as_ref().map_or(0, |s| s.raft_applied_index);
            let entry = self.learners.entry(member.id).or_insert((applied, now));
            if applied > entry.0 {
                *entry = (applied, now);
            }
            if now.duration_since(entry.1) >= self.settings.stall_after {
                if self.etcd.remove_member(member.id).await.is_ok() {
                    self.did(K3sAction::EvictedStalledLearner {
                        member: member.label(),
                    });
                }
                continue;
            }
            if self.promote(&snap, member.id).await {
                self.did(K3sAction::PromotedLearner {
                    member: member.label(),
                });
            }
        }
        self.learners
            .retain(|id, _| snap.members.iter().any(|m| m.id == *id && m.learner));
        let Ok(snap) = self.etcd.snapshot().await else {
            return;
        };
        let Ok(nodes) = self
            .nodes
            .list(&ListParams::default().labels(&format!("{NODE_ROLE_ETCD_LABEL}=true")))
            .await
        else {
            return;
        };
        for node in nodes
            .items
            .iter()
            .filter(|n| n.metadata.deletion_timestamp.is_none())
        {
            let member = annotation(node, K3S_ETCD_NODE_NAME_ANNOTATION)
                .and_then(|name| snap.members.iter().find(|m| m.name == name));
            let (status, reason) = match member {
                Some(m) if m.learner => ("False", "MemberIsLearner"),
                Some(_) => ("True", "MemberNotLearner"),
                None => ("False", K3S_NOT_A_MEMBER_REASON),
            };
            self.write_voter_condition(node, status, reason).await;
        }
    }

    /// `MemberPromote` through the leader; false while etcd refuses (not in sync).
    async fn promote(&self, snap: &MembershipSnapshot, id: u64) -> bool {
        let Some(leader) = snap.leader_member() else {
            return false;
        };
        let Some(url) = leader.client_urls.first() else {
            return false;
        };
        let Ok(endpoint) = self.transport.resolve(url) else {
            return false;
        };
        self.etcd
            .clients
            .call(
                &endpoint,
                "member promote",
                Duration::from_secs(3),
                |mut c| async move { c.member_promote(id).await },
            )
            .await
            .is_ok()
    }

    async fn write_voter_condition(&self, node: &Node, status: &str, reason: &str) {
        let mut conditions: Vec<serde_json::Value> = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .map(|c| {
                c.iter()
                    .map(|c| serde_json::to_value(c).unwrap_or_default())
                    .collect()
            })
            .unwrap_or_default();
        let current = conditions
            .iter()
            .find(|c| c["type"] == K3S_ETCD_IS_VOTER_CONDITION);
        if current.is_some_and(|c| c["status"] == status && c["reason"] == reason) {
            return;
        }
        conditions.retain(|c| c["type"] != K3S_ETCD_IS_VOTER_CONDITION);
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        conditions.push(json!({
            "type": K3S_ETCD_IS_VOTER_CONDITION, "status": status, "reason": reason,
            "message": "",
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        }));
        let _ = self
            .nodes
            .patch_status(
                &node.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"conditions": conditions}})),
            )
            .await;
    }
}
