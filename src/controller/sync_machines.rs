//! In-place propagation, as CAPI KCP's `syncMachines`: what each Machine
//! needs is decided in [`crate::decision::machine_sync`] ([`plan_sync`]);
//! applying patches the infrastructure object and the KThreesConfig first and
//! the Machine last, with the new record and guarded by its resourceVersion,
//! so a crash midway is redone by the next reconcile.

use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};
use serde_json::Value;
use tracing::{debug, info};

use crate::api::{KThreesConfig, Machine};
use crate::decision::machine_sync::{MachineSync, plan_sync};

use super::context::Context;
use super::error::{Error, Result};
use super::publish::{machine_ref, publish_about};
use crate::decision::world::World;

const STEP: &str = "sync-machines";

/// What each Machine of `world` needs ([`plan_sync`]), decided once: the
/// caller asks whether it may write before [`sync_machines`] writes it.
pub fn planned_syncs(world: &World) -> Vec<(&Machine, MachineSync)> {
    world
        .machines
        .iter()
        .filter_map(|m| plan_sync(&world.kcp, m).map(|sync| (m, sync)))
        .collect()
}

/// Apply `planned` (from [`planned_syncs`]): bring those Machines in line with
/// the template (see the module doc); returns the Machines as written, to
/// replace the observed ones (later writes of this reconcile are conditional
/// on their versions).
pub async fn sync_machines(
    ctx: &Context,
    world: &World,
    planned: Vec<(&Machine, MachineSync)>,
) -> Result<Vec<Machine>> {
    let kcp = &world.kcp;
    let namespace = kcp.namespace().unwrap_or_default();
    let machines: Api<Machine> = Api::namespaced(ctx.client.clone(), &namespace);
    let configs: Api<KThreesConfig> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut written = vec![];
    for (machine, sync) in planned {
        let name = machine.name_any();
        if sync.touches_metadata() {
            let patch = sync.metadata_patch();
            if let Some(infra) = infrastructure_api(ctx, machine, &namespace).await {
                let what = format!(
                    "{} {namespace}/{}",
                    machine.spec.infrastructure_ref.kind, machine.spec.infrastructure_ref.name
                );
                patch_metadata(&infra, &machine.spec.infrastructure_ref.name, &what, &patch)
                    .await?;
            }
            match machine.spec.bootstrap.config_ref.as_ref() {
                Some(r)
                    if r.kind == KThreesConfig::kind(&())
                        && r.api_group == KThreesConfig::group(&()) =>
                {
                    let what = format!("KThreesConfig {namespace}/{}", r.name);
                    patch_metadata(&configs, &r.name, &what, &patch).await?;
                }
                other => debug!(machine = %name, config_ref = ?other, "no KThreesConfig to sync"),
            }
        }
        // Last, with the record: a crash before this point is redone.
        let patch = sync.machine_patch(machine.resource_version().as_deref());
        let updated = match machines
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(m) => m,
            Err(kube::Error::Api(s)) if s.code == 404 => {
                debug!(machine = %name, "Machine gone before its sync");
                continue;
            }
            Err(source) => {
                return Err(Error::Act {
                    step: format!(
                        "{STEP}: patch Machine {namespace}/{name} metadata.labels, metadata.annotations, spec.deletion"
                    ),
                    source,
                });
            }
        };
        let note = format!("synced Machine {name} in place: {}", sync.describe());
        info!(machine = %name, "{note}");
        publish_about(
            ctx,
            kcp,
            EventType::Normal,
            "MachineMetadataSynced",
            &note,
            Some(machine_ref(&namespace, &name)),
        )
        .await;
        written.push(updated);
    }
    Ok(written)
}

/// The API of the Machine's infrastructure object: its group and kind from the
/// Machine, the version from its CRD's contract labels (as CAPI reads it).
/// `None` when the version cannot be told (logged; the next pass retries).
async fn infrastructure_api(
    ctx: &Context,
    machine: &Machine,
    namespace: &str,
) -> Option<Api<DynamicObject>> {
    let r = &machine.spec.infrastructure_ref;
    if r.kind.is_empty() {
        return None;
    }
    match ctx
        .contract_versions
        .api_version(&r.api_group, &r.kind)
        .await
    {
        Ok(api_version) => {
            let (group, version) = api_version.split_once('/')?;
            let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, &r.kind));
            Some(Api::namespaced_with(
                ctx.client.clone(),
                namespace,
                &resource,
            ))
        }
        Err(e) => {
            debug!(
                machine = %machine.name_any(),
                error = %e,
                "infrastructure object not synced: its version is unknown"
            );
            None
        }
    }
}

/// Merge-patch labels and annotations of `name`; a missing object is skipped
/// (the Machine may be going, or its provider has not created it yet).
async fn patch_metadata<K>(api: &Api<K>, name: &str, what: &str, patch: &Value) -> Result<()>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => {
            debug!(object = %what, "not found: metadata not synced");
            Ok(())
        }
        Err(source) => Err(Error::Act {
            step: format!("{STEP}: patch {what} metadata.labels, metadata.annotations"),
            source,
        }),
    }
}
