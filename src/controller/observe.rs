//! Observe: read the world of one KThreesControlPlane (its Cluster, owned
//! Machines, the workload cluster's Nodes, the real etcd membership) into a
//! [`World`]. Reads only; etcd connections come from the pool.

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::Secret;
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use crate::api::names::{CLUSTER_NAME_LABEL, CONTROL_PLANE_LABEL};
use crate::api::names::{ETCD_CLUSTER_MEMBERS_ANNOTATION, ETCD_TRANSPORT_ANNOTATION};
use crate::api::{Cluster, KThreesControlPlane, Machine};
use crate::etcd::{EtcdCluster, EtcdError, MembershipSnapshot};
use crate::lifecycle::CaPurpose;
use crate::pki;
use crate::workload::nodes::list_control_plane_nodes;
use crate::workload::secrets::ca_pem_texts;
use crate::workload::{ClusterKey, ClusterSecrets, ControlPlaneNode};

use super::caches::{Coverage, ManagementFingerprint, Source};
use super::cluster_secrets::{ClusterSecretObjects, secrets_view};
use super::context::Context;
use super::error::{Error, Result};
use super::etcd_pool::{EtcdCaPem, PoolKey, TransportMode};
use crate::decision::k3s_serving;
use crate::decision::world::{EtcdObservation, WorkloadState, World};

/// The Cluster that owns `kcp`: its owner reference of kind Cluster, else the
/// `cluster.x-k8s.io/cluster-name` label.
pub fn cluster_name(kcp: &KThreesControlPlane) -> Option<String> {
    kcp.owner_references()
        .iter()
        .find(|o| o.kind == "Cluster" && o.api_version.starts_with("cluster.x-k8s.io/"))
        .map(|o| o.name.clone())
        .or_else(|| kcp.labels().get(CLUSTER_NAME_LABEL).cloned())
}

/// The Cluster's Machines, split by who manages them.
#[derive(Clone, Debug, Default)]
pub struct ClusterMachines {
    /// Control-plane Machines `kcp` controls (owner reference by uid), by name.
    pub owned: Vec<Machine>,
    /// Control-plane Machines of the Cluster controlled by anything else.
    pub foreign: Vec<String>,
    /// Machines of the Cluster without the control-plane label.
    pub workers: Vec<String>,
}

/// List the Cluster's Machines once and split them.
pub async fn cluster_machines(
    client: &kube::Client,
    kcp: &KThreesControlPlane,
    cluster: &str,
) -> Result<ClusterMachines> {
    Ok(ClusterMachines::split(
        kcp,
        list_cluster_machines(client, kcp, cluster).await?,
    ))
}

/// Every Machine of the Cluster (label `cluster.x-k8s.io/cluster-name`).
async fn list_cluster_machines(
    client: &kube::Client,
    kcp: &KThreesControlPlane,
    cluster: &str,
) -> Result<Vec<Machine>> {
    let namespace = kcp.namespace().unwrap_or_default();
    let api: Api<Machine> = Api::namespaced(client.clone(), &namespace);
    let selector = format!("{CLUSTER_NAME_LABEL}={cluster}");
    let list = api
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|source| Error::Observe {
            context: format!("list Machines in {namespace} ({selector})"),
            source,
        })?;
    Ok(list.items)
}

impl ClusterMachines {
    /// Split the Cluster's Machines by who manages them.
    pub fn split(kcp: &KThreesControlPlane, machines: Vec<Machine>) -> Self {
        let uid = kcp.uid();
        let mut split = ClusterMachines::default();
        for machine in machines {
            if !machine.labels().contains_key(CONTROL_PLANE_LABEL) {
                split.workers.push(machine.name_any());
            } else if machine
                .owner_references()
                .iter()
                .any(|o| o.controller == Some(true) && Some(&o.uid) == uid.as_ref())
            {
                split.owned.push(machine);
            } else {
                split.foreign.push(machine.name_any());
            }
        }
        split.owned.sort_by_key(|m| m.name_any());
        split.foreign.sort();
        split.workers.sort();
        split
    }
}

/// The control-plane Machines `kcp` owns (controller owner reference by uid).
pub async fn owned_machines(
    client: &kube::Client,
    kcp: &KThreesControlPlane,
    cluster: &str,
) -> Result<Vec<Machine>> {
    Ok(cluster_machines(client, kcp, cluster).await?.owned)
}

/// The client URLs to start talking to etcd from: each control-plane Node's
/// member endpoint, as k3s serves it (`https://<InternalIP>:2379`).
pub fn etcd_seeds(nodes: &[ControlPlaneNode]) -> Vec<String> {
    nodes
        .iter()
        .filter_map(ControlPlaneNode::etcd_client_url)
        .collect()
}

/// One way of reaching a cluster's etcd, tried.
enum Attempt {
    /// No handle could be built.
    Handle(EtcdError),
    Snapshot(
        Arc<EtcdCluster>,
        std::result::Result<MembershipSnapshot, EtcdError>,
    ),
}

struct Reach<'a> {
    ctx: &'a Context,
    key: &'a PoolKey,
    pem: &'a EtcdCaPem<'a>,
    seeds: &'a [String],
    /// The workload API (its kube client is made here on first need) and
    /// the kubeconfig Secret's version.
    port_forward: Option<(&'a crate::workload::WorkloadReads, &'a str)>,
    /// Member ids a person pinned as the cluster's (annotation).
    pinned: Option<&'a std::collections::BTreeSet<u64>>,
}

impl Reach<'_> {
    async fn attempt(&self, port_forward: bool) -> Attempt {
        let via = if port_forward {
            match self.port_forward {
                Some((workload, version)) => Some((workload.client(), version)),
                None => {
                    return Attempt::Handle(EtcdError::InvalidEndpoint {
                        url: String::new(),
                        reason: "port-forward needs the workload API server, which is unavailable"
                            .into(),
                    });
                }
            }
        } else {
            None
        };
        match self.ctx.etcd.get_with(self.key, self.pem, self.seeds, via) {
            Err(err) => Attempt::Handle(err),
            Ok(handle) => {
                handle.pin_members(self.pinned.cloned());
                let started = Instant::now();
                let snapshot = handle.snapshot().await;
                self.ctx
                    .metrics
                    .etcd_operation("snapshot", started.elapsed());
                Attempt::Snapshot(handle, snapshot)
            }
        }
    }
}

/// Direct failed for want of a connection (not a TLS or etcd refusal, which a
/// tunnel would not fix and must not hide).
fn cannot_connect(err: &EtcdError) -> bool {
    match err {
        EtcdError::AllEndpointsFailed(errors) => {
            !errors.is_empty() && errors.iter().all(EtcdError::is_unreachable)
        }
        other => other.is_unreachable(),
    }
}

/// `direct` or `port-forward`, for the metric label.
fn transport_label(description: &str) -> &'static str {
    if description.starts_with("port-forward") {
        "port-forward"
    } else {
        "direct"
    }
}

/// Read everything a decision needs; the etcd handle is returned for acting.
pub async fn observe(
    ctx: &Context,
    kcp: KThreesControlPlane,
) -> Result<(World, Option<Arc<EtcdCluster>>)> {
    let (mut world, read) = observe_management(ctx, kcp, Source::Api).await?;
    let etcd = observe_workload(ctx, &mut world, &read.secrets).await?;
    Ok((world, etcd))
}

const NOT_READ: &str = "not read: the lifecycle did not get this far";

/// How the management objects of one observation were read.
pub struct ManagementRead {
    /// As the Secret cache holds them (shared, not copied).
    pub secrets: Arc<ClusterSecretObjects>,
    /// Which version of each object the observation holds.
    pub fingerprint: ManagementFingerprint,
    /// Some of them came from a cache: read them again before acting.
    pub from_caches: bool,
}

/// Read the management cluster's side only (Cluster, Machines, Secrets): what
/// the lifecycle decides on. The workload cluster and etcd are left "not read".
/// With [`Source::Caches`] the watch caches and the Secret cache serve what
/// they hold; see [`super::caches`] for why that is safe.
pub async fn observe_management(
    ctx: &Context,
    kcp: KThreesControlPlane,
    source: Source,
) -> Result<(World, ManagementRead)> {
    let namespace = kcp.namespace().unwrap_or_default();
    let now = chrono::Utc::now();
    let unread = || {
        (
            WorkloadState::Unavailable {
                reason: NOT_READ.into(),
            },
            EtcdObservation::Unreachable {
                reason: NOT_READ.into(),
            },
        )
    };
    let Some(cluster_name) = cluster_name(&kcp) else {
        let reason = "no Cluster owns this control plane yet".to_string();
        let secrets = crate::lifecycle::SecretsView::unobserved("", now);
        let world = World {
            kcp,
            cluster_name: None,
            cluster: None,
            machines: vec![],
            foreign_machines: vec![],
            workers: vec![],
            secrets,
            workload: WorkloadState::Unavailable {
                reason: reason.clone(),
            },
            etcd: EtcdObservation::Unreachable { reason },
            members_first_seen: Default::default(),
            leadership_move: None,
            serving_certs: Default::default(),
            k3s_serving_certs: Default::default(),
            etcd_transport: None,
            orphan_grace: ctx.settings.orphan_grace,
            member_missing_grace: ctx.settings.member_missing_grace,
            etcd_space: ctx.settings.etcd_space,
            etcd_history: None,
            restored_data: None,
            etcd_defragmented: Default::default(),
            now,
        };
        let read = ManagementRead {
            secrets: Arc::default(),
            fingerprint: ManagementFingerprint::default(),
            from_caches: false,
        };
        return Ok((world, read));
    };
    let caches = match source {
        Source::Caches => ctx.caches().filter(|c| c.ready()),
        Source::Api | Source::Chained => None,
    };
    let mut from_caches = false;
    // An object absent from a cache is read: absence is never taken on trust.
    let cluster = match caches
        .as_ref()
        .and_then(|c| c.cluster(&namespace, &cluster_name))
    {
        Some(cluster) => {
            from_caches = true;
            Some(cluster)
        }
        None => {
            let clusters: Api<Cluster> = Api::namespaced(ctx.client.clone(), &namespace);
            clusters
                .get_opt(&cluster_name)
                .await
                .map_err(|source| Error::Observe {
                    context: format!("get Cluster {namespace}/{cluster_name}"),
                    source,
                })?
        }
    };
    let cached_machines = caches
        .as_ref()
        .and_then(|c| c.machines(&namespace, &cluster_name));
    let all_machines = match (cached_machines, &caches) {
        (Some(machines), _) => {
            from_caches = true;
            machines
        }
        (None, Some(caches)) => {
            // A shard's store does not (yet) stand for this cluster's LIST.
            let listed = list_cluster_machines(&ctx.client, &kcp, &cluster_name).await?;
            ctx.metrics.uncovered_machine_lists.inc();
            let coverage = caches.confirm_machines(&namespace, &cluster_name, &listed);
            if coverage != Coverage::Whole {
                tracing::debug!(
                    cluster = %cluster_name,
                    ?coverage,
                    "Machines listed from the API: this shard's Machine cache does not hold them all"
                );
            }
            listed
        }
        (None, None) => list_cluster_machines(&ctx.client, &kcp, &cluster_name).await?,
    };
    let cached_secrets = match source {
        Source::Caches | Source::Chained => ctx.secrets.get(&namespace, &cluster_name),
        Source::Api => None,
    };
    let objects = match cached_secrets {
        Some(objects) => {
            // A chained pass's Secrets were confirmed by this reconcile.
            from_caches |= source == Source::Caches;
            objects
        }
        None => {
            let secrets_api: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
            let read = ClusterSecretObjects::read(&secrets_api, &namespace, &cluster_name).await?;
            ctx.secrets.put(&namespace, &cluster_name, read)
        }
    };
    let fingerprint = ManagementFingerprint::of(cluster.as_ref(), &all_machines, &objects);
    let machines = ClusterMachines::split(&kcp, all_machines);
    let endpoint = cluster
        .as_ref()
        .and_then(Cluster::control_plane_endpoint)
        .map(|e| pki::endpoint_url(&e.host, e.port as u16));
    let secrets = secrets_view(
        &kcp,
        &cluster_name,
        &objects,
        endpoint,
        &ctx.settings.kubeconfig,
        now,
    );
    let (workload, etcd) = unread();
    Ok((
        World {
            kcp,
            cluster_name: Some(cluster_name),
            cluster,
            machines: machines.owned,
            foreign_machines: machines.foreign,
            workers: machines.workers,
            secrets,
            workload,
            etcd,
            members_first_seen: Default::default(),
            leadership_move: None,
            serving_certs: Default::default(),
            k3s_serving_certs: Default::default(),
            etcd_transport: None,
            orphan_grace: ctx.settings.orphan_grace,
            member_missing_grace: ctx.settings.member_missing_grace,
            etcd_space: ctx.settings.etcd_space,
            etcd_history: None,
            restored_data: None,
            etcd_defragmented: Default::default(),
            now,
        },
        ManagementRead {
            secrets: objects,
            fingerprint,
            from_caches,
        },
    ))
}

/// The workload side of one observation: the control-plane Nodes, the etcd
/// membership, how etcd was reached, and the pooled etcd handle. A pass
/// chained after a step that touched only management objects decides on the
/// previous pass's, instead of reading the workload cluster and etcd again.
pub struct WorkloadObservation {
    workload: WorkloadState,
    etcd: EtcdObservation,
    etcd_transport: Option<String>,
    etcd_history: Option<Result<crate::space_rule::History, String>>,
    restored_data: Option<crate::decision::world::RestoredData>,
    etcd_defragmented: std::collections::BTreeMap<u64, crate::space_rule::Defragmentation>,
    members_first_seen: std::collections::BTreeMap<u64, chrono::DateTime<chrono::Utc>>,
    serving_certs: std::collections::BTreeMap<u64, chrono::DateTime<chrono::Utc>>,
    k3s_serving_certs: std::collections::BTreeMap<String, chrono::DateTime<chrono::Utc>>,
    handle: Option<Arc<EtcdCluster>>,
}

impl WorkloadObservation {
    /// The workload side of `world`, as observed with `handle`.
    pub fn of(world: World, handle: Option<Arc<EtcdCluster>>) -> Self {
        WorkloadObservation {
            workload: world.workload,
            etcd: world.etcd,
            etcd_transport: world.etcd_transport,
            etcd_history: world.etcd_history,
            restored_data: world.restored_data,
            etcd_defragmented: world.etcd_defragmented,
            members_first_seen: world.members_first_seen,
            serving_certs: world.serving_certs,
            k3s_serving_certs: world.k3s_serving_certs,
            handle,
        }
    }

    /// Put it into `world` (a fresh management observation); the handle back.
    pub fn restore(self, world: &mut World) -> Option<Arc<EtcdCluster>> {
        world.workload = self.workload;
        world.etcd = self.etcd;
        world.etcd_transport = self.etcd_transport;
        world.etcd_history = self.etcd_history;
        world.restored_data = self.restored_data;
        world.etcd_defragmented = self.etcd_defragmented;
        world.members_first_seen = self.members_first_seen;
        world.serving_certs = self.serving_certs;
        world.k3s_serving_certs = self.k3s_serving_certs;
        self.handle
    }

    /// Take the workload side out of `world`, leaving it "not read".
    pub fn forget(world: &mut World) {
        world.workload = WorkloadState::Unavailable {
            reason: NOT_READ.into(),
        };
        world.etcd = EtcdObservation::Unreachable {
            reason: NOT_READ.into(),
        };
        world.etcd_transport = None;
        world.etcd_history = None;
        world.restored_data = None;
        world.etcd_defragmented = Default::default();
        world.members_first_seen = Default::default();
        world.serving_certs = Default::default();
        world.k3s_serving_certs = Default::default();
    }
}

/// Read the workload cluster (its control-plane Nodes, through the
/// kubeconfig Secret) and the real etcd membership into `world`. When either
/// could not be read, the cached Secrets are dropped: credentials that stopped
/// working are read again at the next reconcile, not after the refresh period.
pub async fn observe_workload(
    ctx: &Context,
    world: &mut World,
    objects: &ClusterSecretObjects,
) -> Result<Option<Arc<EtcdCluster>>> {
    let result = read_workload(ctx, world, objects).await;
    observe_k3s_serving(ctx, world, objects);
    let working = result.is_ok()
        && matches!(world.workload, WorkloadState::Nodes(_))
        && matches!(
            world.etcd,
            EtcdObservation::Observed(_) | EtcdObservation::NotManaged
        );
    if !working && let Some(cluster) = &world.cluster_name {
        ctx.secrets
            .invalidate(&world.kcp.namespace().unwrap_or_default(), cluster);
    }
    result
}

/// Start the k3s serving certificate probes that are due for `world`'s Machines and put what the
/// probes found so far into `world.k3s_serving_certs`.
fn observe_k3s_serving(ctx: &Context, world: &mut World, objects: &ClusterSecretObjects) {
    let Some(cluster_name) = world.cluster_name.as_deref() else {
        return;
    };
    let cluster = format!(
        "{}/{cluster_name}",
        world.kcp.namespace().unwrap_or_default()
    );
    let present: Vec<&str> = world
        .machines
        .iter()
        .filter_map(|m| m.metadata.name.as_deref())
        .collect();
    ctx.k3s_serving.retain(&cluster, &present);
    world.k3s_serving_certs = ctx.k3s_serving.found(&cluster);
    if !k3s_serving::nodes_reachable(world.etcd_transport.as_deref()) {
        return;
    }
    let WorkloadState::Nodes(nodes) = &world.workload else {
        return;
    };
    let port = match k3s_serving::port(&world.kcp) {
        Ok(port) => port,
        Err(why) => {
            tracing::debug!(%cluster, "k3s serving certificates not probed: {why}");
            return;
        }
    };
    let due = k3s_serving::due(
        &world.machines,
        nodes,
        port,
        &ctx.k3s_serving.attempted(&cluster),
        world.now,
    );
    if due.is_empty() || objects.ca_validity(CaPurpose::Server) != Some(Ok(())) {
        return;
    }
    let field = format!(
        "Secret {}/{}[tls.crt]",
        world.kcp.namespace().unwrap_or_default(),
        CaPurpose::Server.secret_name(cluster_name)
    );
    let Some(pem) = objects
        .server_ca
        .as_ref()
        .and_then(|s| s.data.as_ref()?.get("tls.crt"))
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
    else {
        return;
    };
    match crate::workload::serving_probe::client_config(&pem, &field) {
        Ok(config) => ctx.k3s_serving.start(&cluster, due, config, world.now),
        Err(err) => tracing::debug!(%cluster, error = %err, "k3s serving certificates not probed"),
    }
}

async fn read_workload(
    ctx: &Context,
    world: &mut World,
    objects: &ClusterSecretObjects,
) -> Result<Option<Arc<EtcdCluster>>> {
    let Some(cluster_name) = world.cluster_name.clone() else {
        return Ok(None);
    };
    let namespace = world.kcp.namespace().unwrap_or_default();
    let key = ClusterKey::new(&namespace, &cluster_name);
    let secrets = ClusterSecrets {
        kubeconfig: objects.kubeconfig.clone(),
        etcd: objects.etcd_ca.clone(),
    };
    let mut workload_client = None;
    world.workload = match ctx.workloads.get(&key, &secrets).await {
        Ok(access) => {
            workload_client = Some(access.clone());
            let expected: Vec<&str> = world
                .machines
                .iter()
                .filter_map(Machine::node_name)
                .collect();
            match list_control_plane_nodes(&access.reads, &key.to_string(), &expected).await {
                Ok(nodes) => WorkloadState::Nodes(nodes),
                Err(err) => WorkloadState::Unavailable {
                    reason: err.to_string(),
                },
            }
        }
        Err(err) => WorkloadState::Unavailable {
            reason: err.to_string(),
        },
    };
    let workload = &world.workload;
    // A declared external datastore is believed only while the Nodes agree:
    // the bootstrap provider may well have started embedded etcd after all.
    if !world.kcp.etcd_is_embedded() {
        match workload {
            WorkloadState::Nodes(_) if world.embedded_etcd_node().is_none() => {
                world.etcd = EtcdObservation::NotManaged;
                return Ok(None);
            }
            WorkloadState::Nodes(_) => {}
            WorkloadState::Unavailable { reason } => {
                world.etcd = EtcdObservation::Unreachable {
                    reason: format!(
                        "spec.externalDatastore is set, but the workload cluster's Nodes could not \
                         be read to confirm that no server runs embedded etcd ({reason}); nothing \
                         is removed until they can"
                    ),
                };
                return Ok(None);
            }
        }
    }
    let etcd_secret = format!("{namespace}/{}", CaPurpose::Etcd.secret_name(&cluster_name));
    // Embedded etcd without usable credentials is unknown, never "not managed".
    let unknown = |why: String| EtcdObservation::NoCredentials {
        reason: format!(
            "{why}: the etcd membership is unknown, so no member is removed and no Machine deleted"
        ),
    };
    let Some(secret) = secrets.etcd.as_ref() else {
        world.etcd = unknown(format!("Secret {etcd_secret} not found"));
        return Ok(None);
    };
    // Checked once per read of the Secrets (see `ClusterSecretObjects`).
    let texts = match objects.ca_validity(CaPurpose::Etcd) {
        Some(Ok(())) => ca_pem_texts(secret).map_err(|e| e.to_string()),
        Some(Err(reason)) => Err(reason.to_string()),
        None => Err(format!("Secret {etcd_secret} not found")),
    };
    let (cert_pem, key_pem) = match texts {
        Ok(texts) => texts,
        Err(why) => {
            world.etcd = unknown(why);
            return Ok(None);
        }
    };
    let nodes = match workload {
        WorkloadState::Nodes(nodes) => nodes.as_slice(),
        WorkloadState::Unavailable { .. } => &[],
    };
    let seeds = etcd_seeds(nodes);
    let version = format!(
        "{}/{}",
        secret.uid().unwrap_or_default(),
        secret.resource_version().unwrap_or_default()
    );
    let pem = EtcdCaPem {
        cert_field: &format!("{etcd_secret}[tls.crt]"),
        cert: cert_pem.as_bytes(),
        key_field: &format!("{etcd_secret}[tls.key]"),
        key: key_pem.as_bytes(),
        secret_version: &version,
    };
    let pool_key = PoolKey {
        namespace: namespace.clone(),
        cluster: cluster_name.clone(),
    };
    let mode = match world.kcp.annotations().get(ETCD_TRANSPORT_ANNOTATION) {
        None => ctx.settings.etcd_transport,
        Some(value) => match TransportMode::parse(value) {
            Some(mode) => mode,
            None => {
                world.etcd = EtcdObservation::Unreachable {
                    reason: format!(
                        "annotation {ETCD_TRANSPORT_ANNOTATION}={value:?} on KThreesControlPlane {namespace}/{}: expected direct, port-forward or auto; etcd is not contacted",
                        world.kcp.name_any()
                    ),
                };
                return Ok(None);
            }
        },
    };
    let pinned = match world.kcp.annotations().get(ETCD_CLUSTER_MEMBERS_ANNOTATION) {
        None => None,
        Some(value) => match crate::etcd::cluster::parse_pinned_members(value) {
            Ok(ids) => Some(ids),
            Err(why) => {
                world.etcd = EtcdObservation::Unreachable {
                    reason: format!(
                        "annotation {ETCD_CLUSTER_MEMBERS_ANNOTATION} on KThreesControlPlane {namespace}/{}: {why}; etcd is not contacted",
                        world.kcp.name_any()
                    ),
                };
                return Ok(None);
            }
        },
    };
    let kubeconfig_version = objects
        .kubeconfig
        .as_ref()
        .map(|s| {
            format!(
                "{}/{}",
                s.uid().unwrap_or_default(),
                s.resource_version().unwrap_or_default()
            )
        })
        .unwrap_or_default();
    let port_forward = workload_client
        .as_ref()
        .map(|access| (&access.reads, kubeconfig_version.as_str()));
    let reach = Reach {
        ctx,
        key: &pool_key,
        pem: &pem,
        seeds: &seeds,
        port_forward,
        pinned: pinned.as_ref(),
    };
    if crate::decision::etcd_restore::is_under_way(world) {
        // The cluster is being replaced: every pass starts from the Nodes as
        // they are now (the restoring server's among them), never from what
        // an earlier handle learnt of the old members, which are gone.
        ctx.etcd.drop_cluster(&pool_key);
    }
    let fallback = ctx.etcd.fallback(&pool_key);
    let (attempt, transport) = match (mode, fallback) {
        (TransportMode::Direct, _) => (reach.attempt(false).await, "direct".to_string()),
        (TransportMode::PortForward, _) => (reach.attempt(true).await, "port-forward".to_string()),
        (TransportMode::Auto, Some(why)) => (
            reach.attempt(true).await,
            format!("port-forward (auto: {why})"),
        ),
        (TransportMode::Auto, None) => {
            let direct = reach.attempt(false).await;
            match &direct {
                Attempt::Snapshot(_, Err(err)) if cannot_connect(err) && port_forward.is_some() => {
                    let why = format!("direct could not connect: {err}");
                    let forwarded = reach.attempt(true).await;
                    if matches!(forwarded, Attempt::Snapshot(_, Ok(_))) {
                        ctx.etcd.remember_fallback(&pool_key, why.clone());
                        tracing::info!(cluster = %key, reason = %why, "etcd: auto transport falls back to port-forward");
                    }
                    (forwarded, format!("port-forward (auto: {why})"))
                }
                _ => (direct, "direct (auto)".to_string()),
            }
        }
    };
    world.etcd_transport = Some(transport.clone());
    ctx.metrics
        .etcd_transport(&key.to_string(), transport_label(&transport));
    let (etcd, handle) = match attempt {
        Attempt::Handle(err) => {
            let reason = match workload {
                WorkloadState::Unavailable { reason } if seeds.is_empty() => {
                    format!("no etcd endpoint: workload cluster unavailable: {reason}")
                }
                _ if seeds.is_empty() => {
                    "no control-plane Node with an InternalIP to reach etcd at".to_string()
                }
                _ => err.to_string(),
            };
            (EtcdObservation::Unreachable { reason }, None)
        }
        Attempt::Snapshot(handle, snapshot) => match snapshot {
            Ok(s) => (EtcdObservation::Observed(s), Some(handle)),
            Err(err) => (
                EtcdObservation::Unreachable {
                    reason: format!("{err} (etcd transport: {transport})"),
                },
                Some(handle),
            ),
        },
    };
    if let EtcdObservation::Observed(snapshot) = &etcd {
        world.members_first_seen = ctx.members_first_seen(
            &format!("{namespace}/{cluster_name}"),
            snapshot.members.iter().map(|m| m.id),
            world.now,
        );
        let listed: Vec<u64> = snapshot.members.iter().map(|m| m.id).collect();
        world.etcd_defragmented = ctx
            .defragmented
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .of(&format!("{namespace}/{cluster_name}"), &listed);
        // Seen in the handshakes the snapshot made: no connection of its own.
        if let Some(handle) = &handle {
            world.serving_certs = snapshot
                .members
                .iter()
                .filter_map(|m| {
                    let not_after = handle.serving_cert_not_after(m)?;
                    Some((m.id, chrono::DateTime::<chrono::Utc>::from(not_after)))
                })
                .collect();
        }
    }
    world.etcd = etcd;
    // Whether the history is compacted: read only when the space rule needs it.
    world.etcd_history = None;
    if crate::decision::etcd_space::needs_history(world)
        && let (Some(handle), EtcdObservation::Observed(snapshot)) = (&handle, &world.etcd)
    {
        world.etcd_history = Some(handle.history(snapshot).await.map_err(|e| e.to_string()));
    }
    // Whether a restored member holds the snapshot's data: only while a
    // restore Machine is waited for.
    world.restored_data = None;
    if let (Some(key), Some(handle), EtcdObservation::Observed(snapshot)) = (
        crate::decision::etcd_restore::marker_to_read(world),
        &handle,
        &world.etcd,
    ) {
        let found = handle
            .key_exists(snapshot, &key)
            .await
            .map_err(|e| e.to_string());
        world.restored_data = Some(crate::decision::world::RestoredData { key, found });
    }
    Ok(handle)
}
