//! Act on a lifecycle decision ([`crate::lifecycle::decide_lifecycle_step`]): the finalizer,
//! the cluster Secrets, and teardown. Every write is idempotent and guarded:
//! metadata writes carry the resourceVersion read (a 409 means observe again),
//! deletions carry the uid read.

use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use serde_json::json;
use tracing::info;

use crate::api::names::{KCP_FINALIZER, KUBECONFIG_SECRET_SUFFIX, TOKEN_SECRET_SUFFIX};
use crate::api::{KThreesControlPlane, Machine};
use crate::lifecycle::{DeletionStep, Lifecycle, SecretWrite};

use super::cluster_secrets::SecretWriter;
use super::context::Context;
use super::error::{Error, Result};
use super::kcp_metadata::patch_kcp_metadata;
use super::publish::{publish, publish_about};
use crate::decision::view::hooks_to_release;
use crate::decision::world::World;

fn act_err(step: &str) -> impl Fn(kube::Error) -> Error + '_ {
    move |source| Error::Act {
        step: step.to_string(),
        source,
    }
}

/// Carry out `lifecycle` (nothing for the decisions that only wait or refuse).
pub async fn apply(ctx: &Context, world: &World, lifecycle: &Lifecycle) -> Result<()> {
    let kcp = &world.kcp;
    let namespace = kcp.namespace().unwrap_or_default();
    let kcps: Api<KThreesControlPlane> = Api::namespaced(ctx.client.clone(), &namespace);
    let machines: Api<Machine> = Api::namespaced(ctx.client.clone(), &namespace);
    match lifecycle {
        Lifecycle::Paused { .. }
        | Lifecycle::WaitForCluster { .. }
        | Lifecycle::MixedManagement { .. }
        | Lifecycle::Proceed { .. } => Ok(()),
        Lifecycle::AddFinalizer => {
            let mut finalizers = kcp.finalizers().to_vec();
            finalizers.push(KCP_FINALIZER.to_string());
            patch_kcp_metadata(ctx, kcp, json!({ "finalizers": finalizers }), true)
                .await
                .map_err(act_err("add finalizer"))?;
            Ok(())
        }
        Lifecycle::Secrets { plan } => {
            if plan.blocked.is_some() {
                return Ok(());
            }
            let cluster = world.cluster_name.as_deref().unwrap_or_default();
            let secrets = Api::namespaced(ctx.client.clone(), &namespace);
            let writer = SecretWriter {
                api: &secrets,
                kcp,
                namespace: &namespace,
                cluster,
                endpoint: world.secrets.endpoint.as_deref(),
                policy: &ctx.settings.kubeconfig,
            };
            for write in &plan.writes {
                writer.write(write).await?;
                info!(%write, "cluster Secret written");
                publish_about(
                    ctx,
                    kcp,
                    EventType::Normal,
                    "ClusterSecretWritten",
                    &format!("{write} for Cluster {namespace}/{cluster}"),
                    Some(k8s_openapi::api::core::v1::ObjectReference {
                        api_version: Some("v1".into()),
                        kind: Some("Secret".into()),
                        name: Some(write_secret_name(write, cluster)),
                        namespace: Some(namespace.clone()),
                        ..Default::default()
                    }),
                )
                .await;
            }
            Ok(())
        }
        Lifecycle::Delete { step, trigger } => {
            apply_deletion(ctx, world, &kcps, &machines, step, trigger).await
        }
    }
}

async fn apply_deletion(
    ctx: &Context,
    world: &World,
    kcps: &Api<KThreesControlPlane>,
    machines: &Api<Machine>,
    step: &DeletionStep,
    trigger: &str,
) -> Result<()> {
    let kcp = &world.kcp;
    match step {
        DeletionStep::WaitForWorkers { .. }
        | DeletionStep::WaitForMachines { .. }
        | DeletionStep::Done => return Ok(()),
        DeletionStep::DeleteMachines { machines: names } => {
            for name in names {
                let uid = world.machine(name).and_then(|m| m.uid());
                let params = DeleteParams {
                    preconditions: uid.map(|uid| Preconditions {
                        uid: Some(uid),
                        resource_version: None,
                    }),
                    ..DeleteParams::default()
                };
                match machines.delete(name, &params).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(act_err("delete control-plane Machine")(e)),
                }
            }
        }
        DeletionStep::ReleaseHooks { machines: names } => {
            for name in names {
                let Some(machine) = world.machine(name) else {
                    continue;
                };
                // Ours, and cluster-api-k3s's on a Machine it left.
                let hooks = hooks_to_release(machine.metadata.annotations.as_ref());
                let patch = json!({"metadata": {
                    "resourceVersion": machine.resource_version(),
                    "annotations": hooks,
                }});
                match machines
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(act_err("release pre-terminate hook")(e)),
                }
            }
        }
        DeletionStep::RemoveFinalizer => {
            let finalizers: Vec<String> = kcp
                .finalizers()
                .iter()
                .filter(|f| *f != KCP_FINALIZER)
                .cloned()
                .collect();
            let patch = json!({"metadata": {
                "resourceVersion": kcp.resource_version(),
                "finalizers": finalizers,
            }});
            match kcps
                .patch(
                    &kcp.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(act_err("remove finalizer")(e)),
            }
        }
    }
    let note = format!("{trigger}: {}", step.message());
    info!(step = step.name(), "{note}");
    publish(
        ctx,
        kcp,
        EventType::Normal,
        crate::decision::step_events::deletion_step_reason(step),
        &note,
    )
    .await;
    Ok(())
}

/// The Secret a write creates or updates.
fn write_secret_name(write: &SecretWrite, cluster: &str) -> String {
    match write {
        SecretWrite::GenerateCa { purpose } => purpose.secret_name(cluster),
        SecretWrite::GenerateToken => format!("{cluster}{TOKEN_SECRET_SUFFIX}"),
        SecretWrite::CreateKubeconfig | SecretWrite::RotateKubeconfig { .. } => {
            format!("{cluster}{KUBECONFIG_SECRET_SUFFIX}")
        }
    }
}
