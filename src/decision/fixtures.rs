//! One builder of observed [`World`]s for the tests (the lib's and
//! `tests/decide`), with the situations they need named, chained:
//! `WorldBuilder::new().three_healthy_servers().with_unhealthy_member("m1", "timeout").build()`.
//! Behind the `sandbox` feature: the shipped controller has no test worlds.
//!
//! Servers are numbered: server `i` is Machine `m<i>`, its Node `cp-<i>`
//! at `10.0.0.<i+1>`, and its etcd member `i+1` named `cp-<i>-<8 hex of i+1>`
//! (as k3s names members); member 1 (server 0's) leads. A situation names a
//! server by its Machine.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};

use super::world::{EtcdObservation, WorkloadState, World};
use crate::api::names::{KCP_FINALIZER, PRE_TERMINATE_HOOK_ANNOTATION};
use crate::api::{Cluster, KThreesControlPlane, Machine};
use crate::etcd::{MemberSnapshot, MemberStatus, MembershipSnapshot};
use crate::lifecycle::{KubeconfigState, SecretState, SecretsView};
use crate::workload::ControlPlaneNode;

/// The version of the KThreesControlPlane and of every Machine built here.
pub const VERSION: &str = "v1.30.2+k3s2";

/// Why etcd was not read, in a world that does not say otherwise.
pub const ETCD_NOT_READ: &str = "not read";

pub fn machine_name(i: u64) -> String {
    format!("m{i}")
}

pub fn node_name(i: u64) -> String {
    format!("cp-{i}")
}

/// Server `i`'s etcd member name, `<node>-<8 hex>` as k3s names it.
pub fn member_name(i: u64) -> String {
    format!("cp-{i}-{:08x}", i + 1)
}

pub fn internal_ip(i: u64) -> String {
    format!("10.0.0.{}", i + 1)
}

/// Server `i` of a Machine name `m<i>`.
fn server_of(machine: &str) -> u64 {
    machine
        .strip_prefix('m')
        .and_then(|i| i.parse().ok())
        .unwrap_or_else(|| panic!("{machine} is not a server's Machine (m<i>)"))
}

/// A Machine as we create it, still provisioning: our pre-terminate hook,
/// the control plane's version, no Node yet.
pub fn machine(name: &str) -> Machine {
    serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": name, "namespace": "ns", "creationTimestamp": "2026-01-01T00:00:00Z",
                     "annotations": {PRE_TERMINATE_HOOK_ANNOTATION: ""}},
        "spec": {
            "clusterName": "c",
            "bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "KThreesConfig", "name": name}},
            "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": name},
            "version": VERSION
        }
    }))
    .unwrap()
}

/// Server `i`'s Machine, its Node joined (nodeRef and InternalIP).
pub fn server_machine(i: u64) -> Machine {
    let mut m = machine(&machine_name(i));
    m.status = serde_json::from_value(json!({
        "nodeRef": {"name": node_name(i)},
        "addresses": [{"type": "InternalIP", "address": internal_ip(i)}]
    }))
    .unwrap();
    m
}

/// Server `i`'s Node: Ready, showing embedded etcd (k3s's member name and
/// address annotations, the etcd role label).
pub fn node(i: u64) -> ControlPlaneNode {
    let ip = internal_ip(i);
    ControlPlaneNode {
        name: node_name(i),
        etcd_member_name: Some(member_name(i)),
        etcd_node_address: Some(ip.clone()),
        etcd_role: true,
        internal_ips: vec![ip.parse().unwrap()],
        addresses: vec![("InternalIP".into(), ip)],
        ready: Some(true),
        etcd_voter: None,
        created: None,
        deleting: false,
    }
}

/// Server `i`'s Node as a `--disable-etcd` server's: no sign of embedded etcd.
pub fn node_without_etcd(i: u64) -> ControlPlaneNode {
    ControlPlaneNode {
        etcd_member_name: None,
        etcd_node_address: None,
        etcd_role: false,
        ..node(i)
    }
}

/// Server `i`'s etcd member: a healthy voter following member 1.
pub fn member(i: u64) -> MemberSnapshot {
    let ip = internal_ip(i);
    MemberSnapshot {
        id: i + 1,
        name: member_name(i),
        peer_urls: vec![format!("https://{ip}:2380")],
        client_urls: vec![format!("https://{ip}:2379")],
        learner: false,
        status: Some(MemberStatus {
            leader: 1,
            raft_term: 2,
            raft_index: 10,
            raft_applied_index: 10,
            db_size: 20_480,
            db_size_in_use: 20_480,
            db_size_quota: 0,
            revision: 500,
            version: "3.5.21".into(),
            errors: vec![],
            is_learner: false,
        }),
        probe_error: None,
        alarms: vec![],
    }
}

/// `member` failing its probe with `why` (its status unread).
pub fn unhealthy(member: MemberSnapshot, why: &str) -> MemberSnapshot {
    MemberSnapshot {
        status: None,
        probe_error: Some(why.into()),
        ..member
    }
}

/// The membership as listed through server 0's member, which leads.
pub fn membership(members: Vec<MemberSnapshot>) -> MembershipSnapshot {
    MembershipSnapshot {
        cluster_id: 7,
        leader: Some(1),
        members,
        listed_by: format!("https://{}:2379", internal_ip(0)),
        alarms_error: None,
        foreign_clusters: Vec::new(),
    }
}

/// Every cluster Secret there and usable (a control plane brought up before).
pub fn settled_secrets(cluster: &str, now: DateTime<Utc>) -> SecretsView {
    let valid = SecretState::Valid { owned: true };
    SecretsView {
        server_ca: valid.clone(),
        client_ca: valid.clone(),
        etcd_ca: valid.clone(),
        token: valid,
        kubeconfig: KubeconfigState::Present {
            owned: false,
            client_not_after: None,
            server: None,
            problem: None,
        },
        ..SecretsView::unobserved(cluster, now)
    }
}

/// A Cluster whose infrastructure is provisioned.
pub fn provisioned_cluster(name: &str) -> Cluster {
    serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {},
        "status": {"initialization": {"infrastructureProvisioned": true}}
    }))
    .unwrap()
}

/// `now` as a Kubernetes timestamp.
pub fn time(now: DateTime<Utc>) -> Time {
    serde_json::from_value(json!(now.to_rfc3339())).unwrap()
}

/// Builds one [`World`]; start from [`WorldBuilder::new`].
#[derive(Clone, Debug)]
pub struct WorldBuilder {
    world: World,
}

impl Default for WorldBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl WorldBuilder {
    /// A new KThreesControlPlane `ns/cp` of the Cluster named `c` (its
    /// Cluster object not read), 3 replicas of [`VERSION`], before anything
    /// was observed: no Machines, no Secrets, no Nodes, etcd not read.
    pub fn new() -> Self {
        let now = Utc::now();
        let kcp: KThreesControlPlane = serde_json::from_value(json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta3", "kind": "KThreesControlPlane",
            "metadata": {"name": "cp", "namespace": "ns", "generation": 1},
            "spec": {
                "replicas": 3, "version": VERSION,
                "machineTemplate": {"spec": {"infrastructureRef": {
                    "apiGroup": "infrastructure.cluster.x-k8s.io",
                    "kind": "DockerMachineTemplate", "name": "t"
                }}}
            }
        }))
        .unwrap();
        WorldBuilder {
            world: World {
                kcp,
                cluster_name: Some("c".into()),
                cluster: None,
                machines: vec![],
                foreign_machines: vec![],
                workers: vec![],
                secrets: SecretsView::unobserved("c", now),
                workload: WorkloadState::Nodes(vec![]),
                etcd: EtcdObservation::Unreachable {
                    reason: ETCD_NOT_READ.into(),
                },
                etcd_transport: None,
                members_first_seen: Default::default(),
                leadership_move: None,
                serving_certs: Default::default(),
                k3s_serving_certs: Default::default(),
                orphan_grace: std::time::Duration::from_secs(300),
                member_missing_grace: std::time::Duration::from_secs(120),
                etcd_space: Default::default(),
                etcd_history: None,
                restored_data: None,
                etcd_defragmented: Default::default(),
                now,
            },
        }
    }

    pub fn build(self) -> World {
        self.world
    }

    /// A control plane brought up before: its Cluster provisioned, every
    /// cluster Secret settled, `status.initialized`, our finalizer on it.
    pub fn running(mut self) -> Self {
        let cluster = self.cluster_name();
        self.world.cluster = Some(provisioned_cluster(&cluster));
        self.world.secrets = settled_secrets(&cluster, self.world.now);
        let kcp = &mut self.world.kcp;
        kcp.metadata.uid = Some("u1".into());
        kcp.metadata.finalizers = Some(vec![KCP_FINALIZER.into()]);
        kcp.status.get_or_insert_with(Default::default).initialized = true;
        self
    }

    /// [`Self::running`] on three healthy servers, `m0`'s member leading.
    pub fn three_healthy_servers(self) -> Self {
        self.running().with_healthy_servers(3)
    }

    /// Servers `0..n` (Machine, Node, member), each healthy.
    pub fn with_healthy_servers(self, n: u64) -> Self {
        (0..n).fold(self, Self::with_server)
    }

    /// Server `i`: its Machine joined, its Node, its member a healthy voter.
    pub fn with_server(self, i: u64) -> Self {
        self.with_machine(server_machine(i))
            .with_node(node(i))
            .with_member(member(i))
    }

    /// The members of servers `0..n` alone: etcd lists them, with no
    /// Machine or Node of theirs observed.
    pub fn with_etcd_members(self, n: u64) -> Self {
        (0..n).map(member).fold(self, Self::with_member)
    }

    pub fn with_machine(mut self, machine: Machine) -> Self {
        self.world.machines.push(machine);
        self
    }

    pub fn with_machines(self, machines: impl IntoIterator<Item = Machine>) -> Self {
        machines.into_iter().fold(self, Self::with_machine)
    }

    /// A Node listed by the workload API (which then answers).
    pub fn with_node(mut self, node: ControlPlaneNode) -> Self {
        match &mut self.world.workload {
            WorkloadState::Nodes(nodes) => nodes.push(node),
            unread => *unread = WorkloadState::Nodes(vec![node]),
        }
        self
    }

    /// A member etcd lists (etcd then answers).
    pub fn with_member(mut self, member: MemberSnapshot) -> Self {
        self.membership_mut().members.push(member);
        self
    }

    /// Server `machine`'s member fails its probe with `why`.
    pub fn with_unhealthy_member(self, machine: &str, why: &str) -> Self {
        self.edit_member(machine, |m| *m = unhealthy(m.clone(), why))
    }

    /// Server `machine`'s member is a learner (joining, not voting yet).
    pub fn with_learner(self, machine: &str) -> Self {
        self.edit_member(machine, |m| {
            m.learner = true;
            if let Some(status) = &mut m.status {
                status.is_learner = true;
            }
        })
    }

    /// Server `machine` runs without embedded etcd (`--disable-etcd`): its
    /// Node shows none and etcd lists no member of it.
    pub fn without_etcd_member(mut self, machine: &str) -> Self {
        let i = server_of(machine);
        let id = member(i).id;
        self.membership_mut().members.retain(|m| m.id != id);
        self.edit_node(&node_name(i), |n| *n = node_without_etcd(i))
    }

    /// etcd is managed but was not read: `why`.
    pub fn etcd_unreachable(self, why: &str) -> Self {
        self.with_etcd(EtcdObservation::Unreachable { reason: why.into() })
    }

    /// Embedded etcd, but its client Secret is missing or unusable: `why`.
    pub fn no_credentials(self, why: &str) -> Self {
        self.with_etcd(EtcdObservation::NoCredentials { reason: why.into() })
    }

    /// `spec.externalDatastore`: no etcd of ours.
    pub fn etcd_not_managed(self) -> Self {
        self.with_etcd(EtcdObservation::NotManaged)
    }

    pub fn with_etcd(mut self, etcd: EtcdObservation) -> Self {
        self.world.etcd = etcd;
        self
    }

    /// The workload API did not answer: `why`.
    pub fn nodes_unreadable(mut self, why: &str) -> Self {
        self.world.workload = WorkloadState::Unavailable { reason: why.into() };
        self
    }

    /// The KThreesControlPlane's `spec`, in full.
    pub fn with_spec(mut self, spec: Value) -> Self {
        self.world.kcp.spec = serde_json::from_value(spec).unwrap();
        self
    }

    /// The KThreesControlPlane's `status`, in full (what an earlier reconcile wrote).
    pub fn with_status(mut self, status: Value) -> Self {
        self.world.kcp.status = serde_json::from_value(status).unwrap();
        self
    }

    pub fn with_replicas(mut self, replicas: i32) -> Self {
        self.world.kcp.spec.replicas = Some(replicas);
        self
    }

    /// `spec.version` (the Machines built here stay at [`VERSION`]).
    pub fn with_version(mut self, version: &str) -> Self {
        self.world.kcp.spec.version = version.into();
        self
    }

    /// `spec.etcdBackup` (`null`: none).
    pub fn with_backup(mut self, backup: Value) -> Self {
        self.world.kcp.spec.etcd_backup = serde_json::from_value(backup).unwrap();
        self
    }

    /// Annotations on the KThreesControlPlane, beside those it has.
    pub fn with_annotations(mut self, annotations: &[(&str, &str)]) -> Self {
        let all = self
            .world
            .kcp
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new);
        for (key, value) in annotations {
            all.insert(key.to_string(), value.to_string());
        }
        self
    }

    /// The KThreesControlPlane's name.
    pub fn named(mut self, name: &str) -> Self {
        self.world.kcp.metadata.name = Some(name.into());
        self
    }

    /// No Cluster owns the control plane yet.
    pub fn without_cluster(mut self) -> Self {
        self.world.cluster_name = None;
        self.world.cluster = None;
        self
    }

    /// `run --etcd-space-care` and its thresholds.
    pub fn with_etcd_space(mut self, settings: crate::space_rule::SpaceSettings) -> Self {
        self.world.etcd_space = settings;
        self
    }

    /// The observation's clock (and the Secrets', as read then).
    pub fn at(mut self, now: &str) -> Self {
        let now: DateTime<Utc> = now.parse().unwrap();
        self.world.now = now;
        self.world.secrets.now = now;
        self
    }

    /// Machine `name` is being deleted (CAPI's finalizer holds it).
    pub fn deleting(self, name: &str) -> Self {
        let now = time(self.world.now);
        self.edit_machine(name, |m| {
            m.metadata.deletion_timestamp = Some(now);
            m.metadata
                .finalizers
                .get_or_insert_with(Vec::new)
                .push("machine.cluster.x-k8s.io".into());
        })
    }

    /// Machine `name` is being deleted, drained, and CAPI waits on its
    /// pre-terminate hooks (ours among them): the removal's etcd steps are due.
    pub fn waiting_on_pre_terminate_hooks(self, name: &str) -> Self {
        let since = self.world.now.to_rfc3339();
        self.deleting(name).edit_machine(name, |m| {
            m.status
                .get_or_insert_with(Default::default)
                .conditions
                .push(
                    serde_json::from_value(json!({
                        "type": "Deleting", "status": "True",
                        "reason": "WaitingForPreTerminateHook", "message": "",
                        "lastTransitionTime": since
                    }))
                    .unwrap(),
                );
        })
    }

    /// A removal of ours chose server `machine`: our hook records its member.
    pub fn chosen_for_removal(self, machine: &str) -> Self {
        let value = crate::remediation::steps::hook_value(Some(member(server_of(machine)).id));
        self.edit_machine(machine, |m| {
            m.metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(PRE_TERMINATE_HOOK_ANNOTATION.into(), value);
        })
    }

    /// Machine `name` lacks our pre-terminate hook (created by an earlier
    /// version, or taken over).
    pub fn without_our_hook(self, name: &str) -> Self {
        self.edit_machine(name, |m| {
            if let Some(a) = &mut m.metadata.annotations {
                a.remove(PRE_TERMINATE_HOOK_ANNOTATION);
            }
        })
    }

    /// Machine `name` marked unhealthy by a MachineHealthCheck, for us to
    /// remediate (`HealthCheckSucceeded=False`, `OwnerRemediated=False`).
    pub fn with_unhealthy_machine(self, name: &str) -> Self {
        let since = self.world.now - chrono::Duration::minutes(10);
        self.edit_machine(name, |m| {
            let condition = |type_: &str, reason: &str| {
                serde_json::from_value(json!({
                    "type": type_, "status": "False", "reason": reason, "message": "",
                    "lastTransitionTime": since.to_rfc3339()
                }))
                .unwrap()
            };
            let status = m.status.get_or_insert_with(Default::default);
            status.conditions.push(condition(
                crate::api::names::HEALTH_CHECK_SUCCEEDED_CONDITION,
                "UnhealthyNode",
            ));
            status.conditions.push(condition(
                crate::api::names::OWNER_REMEDIATED_CONDITION,
                "WaitingForRemediation",
            ));
        })
    }

    /// Change Machine `name` as `edit` says.
    pub fn edit_machine(mut self, name: &str, edit: impl FnOnce(&mut Machine)) -> Self {
        let machine = self
            .world
            .machines
            .iter_mut()
            .find(|m| m.metadata.name.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("no Machine {name}"));
        edit(machine);
        self
    }

    /// Change the listed Node `name` as `edit` says.
    pub fn edit_node(mut self, name: &str, edit: impl FnOnce(&mut ControlPlaneNode)) -> Self {
        let WorkloadState::Nodes(nodes) = &mut self.world.workload else {
            panic!("the Nodes were not read");
        };
        let node = nodes
            .iter_mut()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no Node {name}"));
        edit(node);
        self
    }

    /// Change server `machine`'s member as `edit` says.
    pub fn edit_member(mut self, machine: &str, edit: impl FnOnce(&mut MemberSnapshot)) -> Self {
        let id = member(server_of(machine)).id;
        let member = self
            .membership_mut()
            .members
            .iter_mut()
            .find(|m| m.id == id)
            .unwrap_or_else(|| panic!("no member of {machine}"));
        edit(member);
        self
    }

    /// Change the membership read as `edit` says.
    pub fn edit_membership(mut self, edit: impl FnOnce(&mut MembershipSnapshot)) -> Self {
        edit(self.membership_mut());
        self
    }

    /// Change anything else of the world as `edit` says.
    pub fn edit(mut self, edit: impl FnOnce(&mut World)) -> Self {
        edit(&mut self.world);
        self
    }

    fn cluster_name(&self) -> String {
        self.world
            .cluster_name
            .clone()
            .unwrap_or_else(|| "c".into())
    }

    /// The membership read, an empty one if etcd was not read.
    fn membership_mut(&mut self) -> &mut MembershipSnapshot {
        if !matches!(self.world.etcd, EtcdObservation::Observed(_)) {
            self.world.etcd = EtcdObservation::Observed(membership(vec![]));
        }
        match &mut self.world.etcd {
            EtcdObservation::Observed(snapshot) => snapshot,
            _ => unreachable!(),
        }
    }
}
