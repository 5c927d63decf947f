//! Observe: read the world of one KThreesControlPlane (its Cluster, owned
//! Machines, the workload cluster's Nodes, the real etcd membership) into a
//! [`World`]. Reads only; etcd connections come from the pool.

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::Secret;
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use crate::api::names::{CLUSTER_NAME_LABEL, CONTROL_PLANE_LABEL};
use crate::api::{Cluster, KThreesControlPlane, Machine};
use crate::etcd::EtcdCluster;
use crate::workload::nodes::list_control_plane_nodes;
use crate::workload::secrets::etcd_access_from_secret;
use crate::workload::{ClusterKey, ClusterSecrets, ControlPlaneNode, EtcdAccess};

use super::context::Context;
use super::error::{Error, Result};
use super::etcd_pool::{EtcdCaPem, PoolKey};
use super::world::{EtcdObservation, WorkloadState, World};

/// The Cluster that owns `kcp`: its owner reference of kind Cluster, else the
/// `cluster.x-k8s.io/cluster-name` label.
pub fn cluster_name(kcp: &KThreesControlPlane) -> Option<String> {
    kcp.owner_references()
        .iter()
        .find(|o| o.kind == "Cluster" && o.api_version.starts_with("cluster.x-k8s.io/"))
        .map(|o| o.name.clone())
        .or_else(|| kcp.labels().get(CLUSTER_NAME_LABEL).cloned())
}

/// The control-plane Machines `kcp` owns (controller owner reference by uid).
pub async fn owned_machines(
    client: &kube::Client,
    kcp: &KThreesControlPlane,
    cluster: &str,
) -> Result<Vec<Machine>> {
    let namespace = kcp.namespace().unwrap_or_default();
    let api: Api<Machine> = Api::namespaced(client.clone(), &namespace);
    let selector = format!("{CLUSTER_NAME_LABEL}={cluster},{CONTROL_PLANE_LABEL}");
    let list = api
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|source| Error::Observe {
            context: format!("list Machines in {namespace} ({selector})"),
            source,
        })?;
    let uid = kcp.uid();
    let mut machines: Vec<Machine> = list
        .items
        .into_iter()
        .filter(|m| {
            m.owner_references()
                .iter()
                .any(|o| o.controller == Some(true) && Some(&o.uid) == uid.as_ref())
        })
        .collect();
    machines.sort_by_key(|m| m.name_any());
    Ok(machines)
}

/// The client URLs to start talking to etcd from: each control-plane Node's
/// member endpoint, as k3s serves it (`https://<InternalIP>:2379`).
pub fn etcd_seeds(nodes: &[ControlPlaneNode]) -> Vec<String> {
    nodes
        .iter()
        .filter_map(ControlPlaneNode::etcd_client_url)
        .collect()
}

/// Read everything a decision needs; the etcd handle is returned for acting.
pub async fn observe(
    ctx: &Context,
    kcp: KThreesControlPlane,
) -> Result<(World, Option<Arc<EtcdCluster>>)> {
    let namespace = kcp.namespace().unwrap_or_default();
    let now = chrono::Utc::now();
    let Some(cluster_name) = cluster_name(&kcp) else {
        let reason = "no Cluster owns this control plane yet".to_string();
        let world = World {
            kcp,
            cluster_name: None,
            cluster: None,
            machines: vec![],
            workload: WorkloadState::Unavailable {
                reason: reason.clone(),
            },
            etcd: EtcdObservation::Unreachable { reason },
            now,
        };
        return Ok((world, None));
    };
    let clusters: Api<Cluster> = Api::namespaced(ctx.client.clone(), &namespace);
    let cluster = clusters
        .get_opt(&cluster_name)
        .await
        .map_err(|source| Error::Observe {
            context: format!("get Cluster {namespace}/{cluster_name}"),
            source,
        })?;
    let machines = owned_machines(&ctx.client, &kcp, &cluster_name).await?;

    let key = ClusterKey::new(&namespace, &cluster_name);
    let secrets_api: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
    let secrets = ClusterSecrets::read(&secrets_api, &key).await?;
    let workload = match ctx.workloads.get(&key, &secrets).await {
        Ok(access) => match list_control_plane_nodes(&access.client, &key.to_string()).await {
            Ok(nodes) => WorkloadState::Nodes(nodes),
            Err(err) => WorkloadState::Unavailable {
                reason: err.to_string(),
            },
        },
        Err(err) => WorkloadState::Unavailable {
            reason: err.to_string(),
        },
    };

    // A bad etcd Secret is an error naming it, never "not managed".
    let (etcd, handle) = match etcd_access_from_secret(secrets.etcd.as_ref())? {
        EtcdAccess::NotManaged => (EtcdObservation::NotManaged, None),
        EtcdAccess::Managed(ca) => {
            let nodes = match &workload {
                WorkloadState::Nodes(nodes) => nodes.as_slice(),
                WorkloadState::Unavailable { .. } => &[],
            };
            let seeds = etcd_seeds(nodes);
            let secret = secrets.etcd.as_ref().expect("managed etcd has a Secret");
            let secret_name = format!("{namespace}/{}", secret.name_any());
            let version = format!(
                "{}/{}",
                secret.uid().unwrap_or_default(),
                secret.resource_version().unwrap_or_default()
            );
            let pem = EtcdCaPem {
                cert_field: &format!("{secret_name}[tls.crt]"),
                cert: ca.cert_pem().as_bytes(),
                key_field: &format!("{secret_name}[tls.key]"),
                key: ca.key_pem().as_bytes(),
                secret_version: &version,
            };
            let pool_key = PoolKey {
                namespace: namespace.clone(),
                cluster: cluster_name.clone(),
            };
            match ctx.etcd.get(&pool_key, &pem, &seeds) {
                Err(err) => {
                    let reason = match &workload {
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
                Ok(handle) => {
                    let started = Instant::now();
                    let snapshot = handle.snapshot().await;
                    ctx.metrics.etcd_operation("snapshot", started.elapsed());
                    match snapshot {
                        Ok(s) => (EtcdObservation::Observed(s), Some(handle)),
                        Err(err) => (
                            EtcdObservation::Unreachable {
                                reason: err.to_string(),
                            },
                            Some(handle),
                        ),
                    }
                }
            }
        }
    };
    Ok((
        World {
            kcp,
            cluster_name: Some(cluster_name),
            cluster,
            machines,
            workload,
            etcd,
            now,
        },
        handle,
    ))
}
