//! Act on [`Action::EtcdSnapshot`]: stream a verified snapshot from the
//! member the plan chose into the target of `spec.etcdBackup`, prune by
//! retention, and say so (a Normal Event for each snapshot, a Warning only
//! when one fails). The outcome goes to `status.etcdBackup`, where the
//! backup rule reads it: a before-removal snapshot lets that member's
//! removal go ahead.
//!
//! [`Action::EtcdSnapshot`]: crate::decision::plan::Action::EtcdSnapshot

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::Secret;
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use serde_json::json;
use tracing::{info, warn};

use crate::api::KThreesControlPlane;
use crate::api::etcd_backup::{
    ACCESS_KEY_ID_KEY, EtcdBackup, SECRET_ACCESS_KEY_KEY, SESSION_TOKEN_KEY, SnapshotFailure,
    SnapshotPurpose, SnapshotRecord,
};
use crate::api::names::ETCD_SNAPSHOT_WAIVED_ANNOTATION;
use crate::backup::{self, S3Config, TargetConfig};
use crate::decision::etcd_backup::{SnapshotOutcome, purpose_text};
use crate::decision::plan::Plan;
use crate::decision::snapshot_policy;
use crate::decision::world::World;
use crate::etcd::EtcdCluster;

use super::context::Context;
use super::error::{Error, Result};
use super::publish::publish;

/// Take the snapshot the plan chose. A failure of the target or of etcd is
/// an outcome (recorded, announced), not an error of the reconcile.
pub async fn take(
    ctx: &Context,
    world: &World,
    plan: &Plan,
    purpose: SnapshotPurpose,
    from: u64,
    before_removal_of: Option<u64>,
    etcd: Arc<EtcdCluster>,
) -> Result<SnapshotOutcome> {
    let precondition = |reason: &str| Error::Precondition {
        step: "etcd-snapshot".into(),
        reason: reason.into(),
    };
    let backup = world
        .kcp
        .spec
        .etcd_backup
        .as_ref()
        .ok_or_else(|| precondition("spec.etcdBackup is not set"))?;
    let membership = world
        .snapshot()
        .ok_or_else(|| precondition("etcd was not read this time"))?;
    let source = membership
        .member(from)
        .ok_or_else(|| precondition(&format!("member {from:016x} is not in the membership")))?;
    let name = snapshot_policy::snapshot_name(purpose, &source.name, world.now)
        .map_err(|e| precondition(&e.to_string()))?;
    let kcp = &world.kcp;
    let started = Instant::now();
    let result = async {
        let cluster = world.cluster_name.as_deref().unwrap_or_default();
        let config = target_config(ctx, kcp, cluster, backup).await?;
        let target = backup::Target::open(&config).map_err(|e| e.to_string())?;
        let saved = backup::save(
            &etcd,
            membership,
            from,
            &target,
            &name,
            backup.snapshot_timeout(),
        )
        .await
        .map_err(|e| e.to_string())?;
        let pruned = backup::prune(
            &target,
            &snapshot_policy::retention(backup),
            world.now.into(),
        )
        .await;
        Ok::<_, String>((saved, pruned, target.describe()))
    }
    .await;
    let took = started.elapsed();
    ctx.metrics.etcd_operation("snapshot", took);
    match result {
        Ok((saved, pruned, target)) => {
            ctx.metrics.etcd_snapshot(purpose_text(purpose), "taken");
            let note = format!(
                "saved etcd snapshot {} to {target}: revision {}, {} bytes, from {} in {:.1}s ({})",
                saved.name,
                saved.revision,
                saved.size,
                saved.member,
                took.as_secs_f64(),
                plan.rule
            );
            info!(rule = %plan.rule, "{note}");
            publish(ctx, kcp, EventType::Normal, "EtcdSnapshotSaved", &note).await;
            match pruned {
                Ok(pruned) if !pruned.deleted.is_empty() => {
                    let names: Vec<String> =
                        pruned.deleted.iter().map(ToString::to_string).collect();
                    info!(pruned = ?names, kept = pruned.kept, "pruned etcd snapshots by spec.etcdBackup.retention");
                }
                Ok(_) => {}
                Err(err) => {
                    warn!(%err, "pruning etcd snapshots failed; retried after the next snapshot")
                }
            }
            Ok(SnapshotOutcome::Taken(SnapshotRecord {
                purpose,
                name: saved.name,
                taken_at: world.now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                revision: saved.revision,
                size_bytes: saved.size as i64,
                location: saved.location,
                source_member: saved.member,
                before_removal_of: before_removal_of.map(|m| format!("{m:016x}")),
            }))
        }
        Err(message) => {
            ctx.metrics.etcd_snapshot(purpose_text(purpose), "failed");
            let note = format!(
                "etcd snapshot {name} failed: {message}{} ({})",
                match before_removal_of {
                    Some(m) => format!(
                        "; the removal of member {m:016x} waits for it (annotation {ETCD_SNAPSHOT_WAIVED_ANNOTATION} waives it once)"
                    ),
                    None => String::new(),
                },
                plan.rule
            );
            publish(ctx, kcp, EventType::Warning, "EtcdSnapshotFailed", &note).await;
            Ok(SnapshotOutcome::Failed(SnapshotFailure {
                purpose,
                time: world.now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                message,
            }))
        }
    }
}

/// The target of `spec.etcdBackup` for `cluster`, with its Secrets read;
/// errors name the field and the Secret, never a value. Snapshots go under
/// `<folder or path>/<namespace>/<cluster>/`.
pub async fn target_config(
    ctx: &Context,
    kcp: &KThreesControlPlane,
    cluster: &str,
    backup: &EtcdBackup,
) -> std::result::Result<TargetConfig, String> {
    // Each cluster under its own folder: retention counts every snapshot of
    // ours in a folder, so two clusters sharing one would prune each other's.
    let namespace = kcp.namespace().unwrap_or_default();
    let own = format!("{namespace}/{cluster}");
    if let Some(fs) = &backup.target.filesystem {
        let path = std::path::Path::new(&fs.path).join(&own);
        std::fs::create_dir_all(&path).map_err(|e| {
            format!(
                "spec.etcdBackup.target.filesystem.path: cannot create {}: {e}",
                path.display()
            )
        })?;
        return Ok(TargetConfig::Filesystem { path });
    }
    let Some(s3) = &backup.target.s3 else {
        return Err("spec.etcdBackup.target: names neither s3 nor filesystem".into());
    };
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
    let read = |field: &'static str, name: String| {
        let secrets = secrets.clone();
        let namespace = namespace.clone();
        async move {
            secrets
                .get_opt(&name)
                .await
                .map_err(|e| format!("{field}: reading Secret {namespace}/{name}: {e}"))?
                .ok_or_else(|| format!("{field}: Secret {namespace}/{name} not found"))
        }
    };
    let key =
        |secret: &Secret, field: &str, key: &str| -> std::result::Result<Option<String>, String> {
            match secret.data.as_ref().and_then(|d| d.get(key)) {
                None => Ok(None),
                Some(bytes) => String::from_utf8(bytes.0.clone())
                    .map(|s| Some(s.trim().to_string()))
                    .map_err(|_| {
                        format!(
                            "{field}: key {key} of Secret {} is not UTF-8",
                            secret.name_any()
                        )
                    }),
            }
        };
    let (mut access_key_id, mut secret_access_key, mut session_token) = (None, None, None);
    if let Some(credentials) = &s3.credentials_secret {
        let field = "spec.etcdBackup.target.s3.credentialsSecret";
        let secret = read(field, credentials.name.clone()).await?;
        access_key_id = key(&secret, field, ACCESS_KEY_ID_KEY)?;
        secret_access_key = key(&secret, field, SECRET_ACCESS_KEY_KEY)?;
        session_token = key(&secret, field, SESSION_TOKEN_KEY)?;
        if access_key_id.is_none() || secret_access_key.is_none() {
            return Err(format!(
                "{field}: Secret {namespace}/{} needs keys {ACCESS_KEY_ID_KEY} and {SECRET_ACCESS_KEY_KEY}",
                credentials.name
            ));
        }
    }
    let endpoint_ca_pem = match &s3.endpoint_ca_secret {
        None => None,
        Some(ca) => {
            let field = "spec.etcdBackup.target.s3.endpointCASecret";
            let secret = read(field, ca.name.clone()).await?;
            Some(key(&secret, field, &ca.key)?.ok_or_else(|| {
                format!(
                    "{field}: Secret {namespace}/{} has no key {}",
                    ca.name, ca.key
                )
            })?)
        }
    };
    Ok(TargetConfig::S3(S3Config {
        endpoint: s3.endpoint.clone(),
        bucket: s3.bucket.clone(),
        folder: match s3.folder.as_deref().map(|f| f.trim_matches('/')) {
            Some(folder) if !folder.is_empty() => format!("{folder}/{own}"),
            _ => own,
        },
        region: s3.region.clone().unwrap_or_default(),
        insecure: s3.insecure.unwrap_or(false),
        // Never: TLS is verified, against endpointCASecret when given.
        skip_tls_verify: false,
        endpoint_ca_pem,
        access_key_id: access_key_id.unwrap_or_default(),
        secret_access_key: secret_access_key.unwrap_or_default(),
        session_token,
    }))
}

/// After `member`'s removal: a waiver naming it (or its Machine) is spent.
/// Best effort: a waiver left behind names a member or Machine that is gone
/// (etcd never reuses ids; Machine names carry a random part).
pub async fn consume_waiver(ctx: &Context, world: &World, member: u64, machine: Option<&str>) {
    let Some(waiver) = crate::decision::etcd_backup::waiver(&world.kcp) else {
        return;
    };
    if !crate::decision::etcd_backup::waives(waiver, &format!("{member:016x}"), machine) {
        return;
    }
    let annotations = json!({ETCD_SNAPSHOT_WAIVED_ANNOTATION: null});
    if let Err(err) = super::kcp_metadata::patch_kcp_metadata(
        ctx,
        &world.kcp,
        json!({ "annotations": annotations }),
        false,
    )
    .await
    {
        warn!(%err, "removing the spent annotation {ETCD_SNAPSHOT_WAIVED_ANNOTATION}");
    }
}
