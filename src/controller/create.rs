//! Creating a control-plane Machine (scale-up or a remediation's replacement),
//! as CAPI's KubeadmControlPlane does: the infrastructure object cloned from
//! `machineTemplate.spec.infrastructureRef`, a `KThreesConfig` from
//! `kthreesConfigSpec`, then the `Machine` that references both, with the CAPI
//! labels, the owner reference, version, failure domain and `remediation-for`.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use crate::api::machine::{Bootstrap, MachineSpec};
use crate::api::names::{
    CLUSTER_NAME_LABEL, CONTROL_PLANE_LABEL, CONTROL_PLANE_NAME_LABEL,
    PRE_TERMINATE_HOOK_ANNOTATION, REMEDIATION_FOR_ANNOTATION, SPEC_HASH_ANNOTATION,
};
use crate::api::refs::ContractVersionedObjectReference;
use crate::api::{KThreesConfig, Machine};
use crate::remediation::model::RemediationData;

use super::context::Context;
use super::error::{Error, Result};
use crate::decision::world::World;

const STEP: &str = "create-machine";

/// Labels every control-plane Machine (and its objects) carries.
pub fn control_plane_labels(cluster: &str, kcp: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (CLUSTER_NAME_LABEL.to_string(), cluster.to_string()),
        (CONTROL_PLANE_LABEL.to_string(), String::new()),
        (CONTROL_PLANE_NAME_LABEL.to_string(), kcp.to_string()),
    ])
}

/// A fresh Machine name from `spec.machineNaming.template` (default
/// `<kcp>-<5 chars>`); unique enough, and a collision is an AlreadyExists
/// error that the next reconcile retries with another name.
pub fn machine_name(
    template: Option<&str>,
    cluster: &str,
    kcp: &str,
) -> Result<String, crate::api::machine_naming::NamingError> {
    crate::api::machine_naming::render(template, cluster, kcp, &random_suffix())
}

fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
        ^ (std::process::id() as u64).rotate_left(32);
    (0..crate::api::machine_naming::RANDOM_LEN)
        .map(|_| {
            // xorshift: spreads the clock's low bits over the suffix.
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            ALPHABET[(seed % ALPHABET.len() as u64) as usize] as char
        })
        .collect()
}

fn precondition(reason: impl Into<String>) -> Error {
    Error::Precondition {
        step: STEP.into(),
        reason: reason.into(),
    }
}

/// Give the infrastructure template a (non-controller) owner reference to the
/// Cluster, as cluster-api-k3s and KCP do, so it goes with the Cluster and
/// `clusterctl move` carries it along. Checked once per process per template.
pub async fn ensure_template_owner(ctx: &Context, world: &World) -> Result<()> {
    let Some(cluster) = world.cluster.as_ref() else {
        return Ok(());
    };
    let Some(infra_ref) = world.kcp.infrastructure_ref() else {
        return Ok(());
    };
    let (kind, name) = (infra_ref.kind.as_str(), infra_ref.name.as_str());
    if !kind.ends_with("Template") {
        return Ok(());
    }
    let namespace = world.kcp.namespace().unwrap_or_default();
    let cluster_uid = cluster.uid().unwrap_or_default();
    let memo = format!("{namespace}/{kind}/{name}@{cluster_uid}");
    if ctx
        .template_owners
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains(&memo)
    {
        return Ok(());
    }
    // Creating a Machine names a template whose version cannot be told.
    let Ok(api_version) = ctx
        .contract_versions
        .api_version(&infra_ref.api_group, kind)
        .await
    else {
        return Ok(());
    };
    let Some((group, version)) = api_version.split_once('/') else {
        return Ok(());
    };
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &namespace, &resource);
    let step = format!("{STEP}: own infrastructure template {kind} {namespace}/{name}");
    let Some(template) = api.get_opt(name).await.map_err(|source| Error::Act {
        step: step.clone(),
        source,
    })?
    else {
        // Creating a Machine names the missing template; nothing to own yet.
        return Ok(());
    };
    let mut owners = template.owner_references().to_vec();
    if !owners.iter().any(|o| o.uid == cluster_uid) {
        owners.push(OwnerReference {
            api_version: "cluster.x-k8s.io/v1beta2".into(),
            kind: "Cluster".into(),
            name: cluster.name_any(),
            uid: cluster_uid.clone(),
            controller: None,
            block_owner_deletion: None,
        });
        let patch = json!({"metadata": {
            "resourceVersion": template.resource_version(),
            "ownerReferences": owners,
        }});
        api.patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .map_err(|source| Error::Act { step, source })?;
    }
    ctx.template_owners
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(memo);
    Ok(())
}

/// The Machine that restores a snapshot (`controller::etcd_restore`): its
/// KThreesConfig spec, and the attempt it belongs to
/// (`controlplane.cluster.x-k8s.io/etcd-restore-of` on it and its config).
pub struct RestoreBirth {
    pub config: crate::api::KThreesConfigSpec,
    pub attempt: String,
}

/// Creates the infrastructure clone, the KThreesConfig and the Machine; returns
/// the Machine's name. On a failure after the first object, what was created
/// is deleted again so nothing is left behind.
pub async fn create_machine(
    ctx: &Context,
    world: &World,
    remediation_for: Option<&RemediationData>,
) -> Result<String> {
    create_machine_born(ctx, world, remediation_for, None).await
}

/// [`create_machine`], for a restore Machine when `restore` is given: its
/// config restores the snapshot, and it is born without our hook (a restore
/// Machine deleted before it restored is simply made again; the hook comes
/// once the restore is done and the control plane is managed as usual).
pub async fn create_machine_born(
    ctx: &Context,
    world: &World,
    remediation_for: Option<&RemediationData>,
    restore: Option<&RestoreBirth>,
) -> Result<String> {
    let kcp = &world.kcp;
    let namespace = kcp.namespace().unwrap_or_default();
    let kcp_name = kcp.name_any();
    let object = format!("KThreesControlPlane {namespace}/{kcp_name}");
    let cluster = world
        .cluster_name
        .clone()
        .ok_or_else(|| precondition(format!("{object}: no Cluster owns it (ownerReferences)")))?;
    let owner = kcp
        .controller_owner_ref(&())
        .ok_or_else(|| precondition(format!("{object}: metadata.uid is not set yet")))?;
    let name = machine_name(
        kcp.spec.machine_naming.template.as_deref(),
        &cluster,
        &kcp_name,
    )
    .map_err(|e| precondition(format!("{object}: spec.machineNaming.template: {e}")))?;
    // Born in sync (decision::machine_sync): template metadata on all three objects.
    let born = crate::decision::machine_sync::born_metadata(
        kcp,
        control_plane_labels(&cluster, &kcp_name),
    );
    let labels = born.labels.clone();

    let infra_ref = kcp.infrastructure_ref().ok_or_else(|| {
        precondition(format!(
            "{object}: spec.machineTemplate.spec.infrastructureRef is required, with kind and name"
        ))
    })?;
    let template_kind = infra_ref.kind.clone();
    // Checked before any request: the clone's kind and API come from these.
    let Some(infra_kind) = template_kind
        .strip_suffix("Template")
        .filter(|k| !k.is_empty())
        .map(str::to_string)
    else {
        return Err(precondition(format!(
            "{object}: spec.machineTemplate.spec.infrastructureRef.kind: {template_kind:?} does not name a template (<Kind>Template)"
        )));
    };
    let api_version = ctx
        .contract_versions
        .api_version(&infra_ref.api_group, &template_kind)
        .await
        .map_err(|e| {
            precondition(format!(
                "{object}: spec.machineTemplate.spec.infrastructureRef: {e}"
            ))
        })?;
    let (group, version) = api_version
        .split_once('/')
        .expect("contract versions are <group>/<version>");
    let template_api =
        ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, &template_kind));
    let template_ns = namespace.clone();
    let templates: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), &template_ns, &template_api);
    let template_name = infra_ref.name.clone();
    let template = templates
        .get(&template_name)
        .await
        .map_err(|source| Error::Act {
            step: format!(
                "{STEP}: read infrastructure template {template_kind} {template_ns}/{template_name}"
            ),
            source,
        })?;
    let infra_api = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, &infra_kind));
    let infra: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), &namespace, &infra_api);
    let mut infra_labels = labels.clone();
    if let Some(extra) = template
        .data
        .pointer("/spec/template/metadata/labels")
        .and_then(|v| v.as_object())
    {
        for (k, v) in extra {
            if let Some(v) = v.as_str() {
                infra_labels.insert(k.clone(), v.to_string());
            }
        }
    }
    let mut infra_obj = DynamicObject::new(&name, &infra_api).within(&namespace);
    infra_obj.metadata.labels = Some(infra_labels);
    infra_obj.metadata.annotations = Some(BTreeMap::from([
        (
            "cluster.x-k8s.io/cloned-from-name".to_string(),
            template_name.clone(),
        ),
        (
            "cluster.x-k8s.io/cloned-from-groupkind".to_string(),
            format!("{template_kind}.{group}"),
        ),
    ]));
    infra_obj
        .metadata
        .annotations
        .get_or_insert_default()
        .extend(born.annotations.clone());
    infra_obj.metadata.owner_references = Some(vec![OwnerReference {
        controller: None,
        block_owner_deletion: None,
        ..owner.clone()
    }]);
    infra_obj.data = json!({"spec": template.data.pointer("/spec/template/spec").cloned().unwrap_or_else(|| json!({}))});
    infra
        .create(&PostParams::default(), &infra_obj)
        .await
        .map_err(|source| Error::Act {
            step: format!("{STEP}: create {infra_kind} {namespace}/{name}"),
            source,
        })?;

    let configs: Api<KThreesConfig> = Api::namespaced(ctx.client.clone(), &namespace);
    let config_spec = match restore {
        Some(restore) => restore.config.clone(),
        None => kcp.spec.kthrees_config_spec.clone(),
    };
    let mut config_annotations = born.annotations.clone();
    if let Some(restore) = restore {
        config_annotations.insert(
            crate::api::names::ETCD_RESTORE_OF_ANNOTATION.to_string(),
            restore.attempt.clone(),
        );
    }
    let mut config = KThreesConfig::new(&name, config_spec);
    config.metadata = ObjectMeta {
        name: Some(name.clone()),
        namespace: Some(namespace.clone()),
        labels: Some(labels.clone()),
        annotations: Some(config_annotations),
        owner_references: Some(vec![owner.clone()]),
        ..ObjectMeta::default()
    };
    if let Err(source) = configs.create(&PostParams::default(), &config).await {
        let _ = infra.delete(&name, &Default::default()).await;
        return Err(Error::Act {
            step: format!("{STEP}: create KThreesConfig {namespace}/{name}"),
            source,
        });
    }

    let mut annotations = born.annotations;
    annotations.extend(born.record);
    if let Some(rf) = remediation_for {
        annotations.insert(REMEDIATION_FOR_ANNOTATION.to_string(), rf.to_annotation());
    }
    match restore {
        Some(restore) => {
            annotations.insert(
                crate::api::names::ETCD_RESTORE_OF_ANNOTATION.to_string(),
                restore.attempt.clone(),
            );
        }
        // Our pre-terminate hook from birth: whoever deletes this Machine, CAPI
        // then waits for the removal steps (etcd leadership, member) to release it.
        None => {
            annotations.insert(
                PRE_TERMINATE_HOOK_ANNOTATION.to_string(),
                crate::remediation::steps::BORN_HOOK_VALUE.to_string(),
            );
        }
    }
    // What it is made from, so a later spec change is seen as a rollout.
    annotations.insert(
        SPEC_HASH_ANNOTATION.to_string(),
        crate::rollout::spec_hash(kcp),
    );
    let mut machine_labels = kcp.spec.machine_template.metadata.labels.clone();
    machine_labels.extend(labels.clone());
    let machine = Machine {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(namespace.clone()),
            labels: Some(machine_labels),
            annotations: Some(annotations),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec: MachineSpec {
            cluster_name: cluster,
            bootstrap: Bootstrap {
                config_ref: Some(ContractVersionedObjectReference {
                    api_group: KThreesConfig::group(&()).to_string(),
                    kind: KThreesConfig::kind(&()).to_string(),
                    name: name.clone(),
                }),
                ..Bootstrap::default()
            },
            infrastructure_ref: ContractVersionedObjectReference {
                api_group: group.to_string(),
                kind: infra_kind,
                name: name.clone(),
            },
            version: Some(kcp.spec.version.clone()),
            failure_domain: crate::decision::placement::failure_domain(
                world.cluster.as_ref(),
                &world.machines,
            ),
            deletion: crate::decision::machine_sync::deletion_timeouts(kcp),
            extra: readiness_gates(kcp),
        },
        status: None,
    };
    let machines: Api<Machine> = Api::namespaced(ctx.client.clone(), &namespace);
    if let Err(source) = machines.create(&PostParams::default(), &machine).await {
        let _ = configs.delete(&name, &Default::default()).await;
        let _ = infra.delete(&name, &Default::default()).await;
        return Err(Error::Act {
            step: format!("{STEP}: create Machine {namespace}/{name}"),
            source,
        });
    }
    Ok(name)
}

/// `spec.readinessGates` of a new Machine: the template's, as written.
fn readiness_gates(kcp: &crate::api::KThreesControlPlane) -> BTreeMap<String, serde_json::Value> {
    let gates = &kcp.spec.machine_template.spec.readiness_gates;
    if gates.is_empty() {
        return BTreeMap::new();
    }
    BTreeMap::from([(
        "readinessGates".to_string(),
        serde_json::to_value(gates).expect("readiness gates serialize"),
    )])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_names_are_prefixed_and_short() {
        let a = machine_name(None, "c", "kcp").unwrap();
        assert!(a.starts_with("kcp-") && a.len() == "kcp-".len() + 5, "{a}");
        assert!(
            a["kcp-".len()..]
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        );
    }
}
