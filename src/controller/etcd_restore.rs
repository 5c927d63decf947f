//! Act on [`Action::EtcdRestore`]: one step of a restore a person asked
//! for ([`crate::decision::etcd_restore`] decides which). Each step leaves a
//! trace the next observation reads (the accepted annotation, deleted
//! Machines, the restore Machine and its annotation), so a restart between
//! any two resumes without repeating or skipping one.
//!
//! [`Action::EtcdRestore`]: crate::decision::plan::Action::EtcdRestore

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tracing::info;

use crate::api::names::{
    CLUSTER_NAME_LABEL, CLUSTER_SECRET_TYPE, ETCD_RESTORE_ACCEPTED_ANNOTATION,
    ETCD_RESTORE_ANNOTATION, EXCLUDE_NODE_DRAINING_ANNOTATION,
    EXCLUDE_WAIT_FOR_VOLUME_DETACH_ANNOTATION,
};
use crate::api::{KThreesControlPlane, Machine};
use crate::backup::restore_boot::{
    S3_ENV_SECRET_KEY, restore_config, s3_env_file, s3_env_secret_name,
};
use crate::backup::{self, BackupError, S3Config, TargetConfig};
use crate::decision::etcd_restore::{Attempt, RestoreOutcome, RestoreStep, record};
use crate::decision::plan::Plan;
use crate::decision::restore_finish::annotations_cleared;
use crate::decision::world::World;

use super::context::Context;
use super::create::{RestoreBirth, create_machine_born};
use super::error::{Error, Result};
use super::kcp_metadata::patch_kcp_metadata;
use super::publish::{machine_ref, publish, publish_about};

/// Carry out `step`. `Some` when it changes status (the restore finished,
/// or the snapshot could not be verified and nothing was done).
pub async fn act(
    ctx: &Context,
    world: &World,
    plan: &Plan,
    step: &RestoreStep,
) -> Result<Option<RestoreOutcome>> {
    match step {
        RestoreStep::Accept {
            snapshot,
            forced,
            machines,
        } => accept(ctx, world, plan, snapshot, *forced, machines).await,
        RestoreStep::RetireMachines { machines } => {
            retire(ctx, world, plan, machines).await?;
            Ok(None)
        }
        RestoreStep::CreateMachine { attempt } => {
            create(ctx, world, plan, attempt).await?;
            Ok(None)
        }
        RestoreStep::Finish { .. } => finish(ctx, world, plan, step).await.map(Some),
    }
}

fn act_err(step: String) -> impl FnOnce(kube::Error) -> Error {
    move |source| Error::Act { step, source }
}

fn precondition(reason: String) -> Error {
    Error::Precondition {
        step: "etcd-restore".into(),
        reason,
    }
}

/// The S3 target of `spec.etcdBackup`, with its Secrets read.
async fn s3_target(ctx: &Context, world: &World) -> std::result::Result<S3Config, String> {
    let backup = world
        .kcp
        .spec
        .etcd_backup
        .as_ref()
        .ok_or("spec.etcdBackup.target is not set")?;
    let cluster = world.cluster_name.as_deref().unwrap_or_default();
    match super::etcd_snapshot::target_config(ctx, &world.kcp, cluster, backup).await? {
        TargetConfig::S3(s3) => Ok(s3),
        TargetConfig::Filesystem { .. } => {
            Err("spec.etcdBackup.target.filesystem: a new server cannot read it".into())
        }
    }
}

/// `snapshot` read back from the S3 target of `spec.etcdBackup`, streamed,
/// and checked against etcd's trailing SHA-256; with where it is. The error
/// names the field or the snapshot, never a secret. (The controller's
/// acceptance and `k3s-control-plane restore` both check with this.)
pub async fn verify_snapshot(
    ctx: &Context,
    world: &World,
    snapshot: &str,
) -> std::result::Result<(backup::Verified, String), String> {
    let s3 = s3_target(ctx, world).await?;
    let target = backup::Target::open(&TargetConfig::S3(s3)).map_err(|e| e.to_string())?;
    match backup::verify_stored(&target, snapshot).await {
        Ok(verified) => Ok((verified, target.location(snapshot))),
        Err(BackupError::NotFound { target, .. }) => {
            Err(format!("snapshot {snapshot} not found in {target}"))
        }
        Err(err) => Err(err.to_string()),
    }
}

/// Verify the snapshot in the target (streamed, etcd's trailing SHA-256),
/// then record the acceptance. Nothing is deleted before this passed.
async fn accept(
    ctx: &Context,
    world: &World,
    plan: &Plan,
    snapshot: &str,
    forced: bool,
    machines: &[String],
) -> Result<Option<RestoreOutcome>> {
    let kcp = &world.kcp;
    let (verified, location) = match verify_snapshot(ctx, world, snapshot).await {
        Ok(found) => found,
        Err(why) => {
            let message = format!(
                "annotation {ETCD_RESTORE_ANNOTATION}={snapshot}: {why}; nothing was deleted"
            );
            ctx.metrics.etcd_restore_step("refused");
            publish(ctx, kcp, EventType::Warning, "EtcdRestoreRefused", &message).await;
            return Ok(Some(RestoreOutcome::Unusable(message)));
        }
    };
    let attempt = Attempt {
        snapshot: snapshot.to_string(),
        accepted_at: world.now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        forced,
        machines: machines.to_vec(),
    };
    // Conditional on the object decided on: a request changed meanwhile is
    // decided again.
    let annotations = json!({ETCD_RESTORE_ACCEPTED_ANNOTATION: attempt.annotation_value()});
    patch_kcp_metadata(ctx, kcp, json!({ "annotations": annotations }), true)
        .await
        .map_err(act_err("etcd-restore: record the acceptance".into()))?;
    let note = format!(
        "accepted the restore from etcd snapshot {snapshot} ({location}, {} bytes, SHA-256 {} verified): {} ({})",
        verified.size, verified.sha256, plan.message, plan.rule
    );
    info!(rule = %plan.rule, "{note}");
    ctx.metrics.etcd_restore_step("accepted");
    publish(ctx, kcp, EventType::Normal, "EtcdRestoreAccepted", &note).await;
    Ok(None)
}

/// Release our hold on the old Machines and delete them, skipping drain
/// and volume detach (their workload API went with quorum).
async fn retire(ctx: &Context, world: &World, plan: &Plan, names: &[String]) -> Result<()> {
    let kcp = &world.kcp;
    let namespace = kcp.namespace().unwrap_or_default();
    let machines: Api<Machine> = Api::namespaced(ctx.client.clone(), &namespace);
    for name in names {
        let Some(machine) = world.machine(name) else {
            continue;
        };
        let mut annotations =
            crate::decision::view::hooks_to_release(machine.metadata.annotations.as_ref());
        annotations.insert(EXCLUDE_NODE_DRAINING_ANNOTATION.into(), json!("true"));
        annotations.insert(
            EXCLUDE_WAIT_FOR_VOLUME_DETACH_ANNOTATION.into(),
            json!("true"),
        );
        let patch = json!({"metadata": {
            "resourceVersion": machine.resource_version(),
            "annotations": annotations,
        }});
        let patched = match machines
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(patched) => patched,
            Err(kube::Error::Api(s)) if s.code == 404 => continue,
            Err(e) => {
                return Err(act_err(format!(
                    "etcd-restore: release Machine {namespace}/{name}"
                ))(e));
            }
        };
        if !patched.is_deleting() {
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: patched.uid(),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match machines.delete(name, &params).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    return Err(act_err(format!(
                        "etcd-restore: delete Machine {namespace}/{name}"
                    ))(e));
                }
            }
        }
        let note = format!(
            "deleted Machine {name} for the restore: {} ({})",
            plan.message, plan.rule
        );
        info!(rule = %plan.rule, machine = %name, "{note}");
        ctx.metrics.etcd_restore_step("retired-machine");
        publish_about(
            ctx,
            kcp,
            EventType::Normal,
            "EtcdRestoreRetiredMachine",
            &note,
            Some(machine_ref(&namespace, name)),
        )
        .await;
    }
    Ok(())
}

/// The derived Secret with the keys file, created or brought up to date.
async fn write_env_secret(
    ctx: &Context,
    kcp: &KThreesControlPlane,
    cluster: &str,
    s3: &S3Config,
) -> Result<String> {
    let namespace = kcp.namespace().unwrap_or_default();
    let name = s3_env_secret_name(cluster);
    let owner = kcp.controller_owner_ref(&()).ok_or_else(|| {
        precondition(format!(
            "KThreesControlPlane {namespace}/{}: metadata.uid is not set yet",
            kcp.name_any()
        ))
    })?;
    let data = BTreeMap::from([(
        S3_ENV_SECRET_KEY.to_string(),
        ByteString(s3_env_file(s3).into_bytes()),
    )]);
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
    let step = format!("etcd-restore: write Secret {namespace}/{name}");
    match secrets
        .get_opt(&name)
        .await
        .map_err(act_err(step.clone()))?
    {
        Some(mut existing) => {
            // Never another's Secret: only the one this control plane made.
            if !existing
                .owner_references()
                .iter()
                .any(|o| o.uid == owner.uid)
            {
                return Err(precondition(format!(
                    "Secret {namespace}/{name} exists and is not this control plane's (no owner reference to KThreesControlPlane {namespace}/{}): the restore's S3 keys are not written over it; rename or delete it",
                    kcp.name_any()
                )));
            }
            if existing.data.as_ref() != Some(&data) {
                existing.data = Some(data);
                existing.string_data = None;
                secrets
                    .replace(&name, &PostParams::default(), &existing)
                    .await
                    .map_err(act_err(step))?;
            }
        }
        None => {
            let secret = Secret {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    namespace: Some(namespace.clone()),
                    labels: Some(BTreeMap::from([(
                        CLUSTER_NAME_LABEL.to_string(),
                        cluster.to_string(),
                    )])),
                    owner_references: Some(vec![owner]),
                    ..ObjectMeta::default()
                },
                type_: Some(CLUSTER_SECRET_TYPE.to_string()),
                data: Some(data),
                ..Secret::default()
            };
            secrets
                .create(&PostParams::default(), &secret)
                .await
                .map_err(act_err(step))?;
        }
    }
    Ok(name)
}

/// Create the Machine that restores the snapshot, and forget what this
/// process learnt of the old etcd cluster (the restored one is new to it).
async fn create(ctx: &Context, world: &World, plan: &Plan, attempt: &Attempt) -> Result<()> {
    let kcp = &world.kcp;
    let namespace = kcp.namespace().unwrap_or_default();
    let cluster = world
        .cluster_name
        .clone()
        .ok_or_else(|| precondition("no Cluster owns the control plane".into()))?;
    let s3 = s3_target(ctx, world).await.map_err(precondition)?;
    let env_secret = write_env_secret(ctx, kcp, &cluster, &s3).await?;
    let endpoint_ca = kcp
        .spec
        .etcd_backup
        .as_ref()
        .and_then(|b| b.target.s3.as_ref())
        .and_then(|s3| s3.endpoint_ca_secret.as_ref());
    let birth = RestoreBirth {
        config: restore_config(
            &kcp.spec.kthrees_config_spec,
            &attempt.snapshot,
            &s3,
            &env_secret,
            endpoint_ca,
        ),
        attempt: attempt.annotation_value(),
    };
    let name = create_machine_born(ctx, world, None, Some(&birth)).await?;
    ctx.forget_cluster(&namespace, &cluster);
    let note = format!(
        "created Machine {name} to restore etcd snapshot {}: {} ({})",
        attempt.snapshot, plan.message, plan.rule
    );
    info!(rule = %plan.rule, machine = %name, "{note}");
    ctx.metrics.etcd_restore_step("machine-created");
    publish_about(
        ctx,
        kcp,
        EventType::Normal,
        "EtcdRestoreMachineCreated",
        &note,
        Some(machine_ref(&namespace, &name)),
    )
    .await;
    Ok(())
}

/// The restore is done: the request and acceptance go, status says what
/// was done, and the control plane is managed as usual again (scale-up
/// joins the other servers to the restored one).
async fn finish(
    ctx: &Context,
    world: &World,
    plan: &Plan,
    step: &RestoreStep,
) -> Result<RestoreOutcome> {
    let RestoreStep::Finish { attempt, .. } = step else {
        unreachable!("finish is called with the Finish step");
    };
    let kcp = &world.kcp;
    let clear: serde_json::Map<String, serde_json::Value> =
        annotations_cleared(kcp.annotations(), attempt)
            .into_iter()
            .map(|key| (key.to_string(), serde_json::Value::Null))
            .collect();
    patch_kcp_metadata(ctx, kcp, json!({ "annotations": clear }), true)
        .await
        .map_err(act_err("etcd-restore: clear the request".into()))?;
    let record = record(step, world.now).expect("a Finish step makes a record");
    let note = format!(
        "restored etcd from snapshot {} onto Machine {} (member {}); scale-up joins the other servers: {} ({})",
        record.snapshot, record.machine, record.member, plan.message, plan.rule
    );
    info!(rule = %plan.rule, "{note}");
    ctx.metrics.etcd_restore_step("restored");
    publish(ctx, kcp, EventType::Normal, "EtcdRestored", &note).await;
    Ok(RestoreOutcome::Finished(record))
}
