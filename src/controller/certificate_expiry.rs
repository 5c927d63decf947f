//! Certificate expiry, told to CAPI: the expiry our handshakes saw goes onto
//! each Machine's KThreesConfig as `machine.cluster.x-k8s.io/certificates-expiry`,
//! as KubeadmControlPlane writes it on its KubeadmConfig, so that CAPI's
//! Machine controller copies it into `Machine.status.certificatesExpiryDate`.
//! Which configs get which value is decided in the record
//! ([`crate::decision::Decision::certificate_annotations`]); a value someone
//! else set is never overwritten. Also the expiry metric.

use std::collections::HashSet;

use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tracing::debug;

use crate::api::names::CERTIFICATES_EXPIRY_ANNOTATION;
use crate::api::{KThreesConfig, KThreesControlPlane};
use crate::decision::Decision;
use crate::decision::world::World;

use super::context::Context;
use super::error::{Error, Result};

/// Write the annotations `decision` asks for, each once per value.
pub async fn annotate_configs(ctx: &Context, world: &World, decision: &Decision) -> Result<()> {
    let namespace = world.kcp.namespace().unwrap_or_default();
    let configs: Api<KThreesConfig> = Api::namespaced(ctx.client.clone(), &namespace);
    let config_of = |machine: &str| {
        world
            .machine(machine)
            .and_then(|m| m.spec.bootstrap.config_ref.as_ref())
            .map(|r| format!("{namespace}/{}", r.name))
    };
    // Keep only what is still to be written: a value CAPI copied, or a
    // Machine gone, is forgotten, so the set stays bounded. Only this control
    // plane's entries are pruned: another's pass never makes this one write
    // again.
    let pending: HashSet<(String, String)> = decision
        .certificate_annotations
        .iter()
        .filter_map(|(m, v)| Some((config_of(m)?, v.clone())))
        .collect();
    let control_plane = format!("{namespace}/{}", world.kcp.name_any());
    ctx.certificate_annotations
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .keep_only(&control_plane, &pending);
    for (machine, value) in &decision.certificate_annotations {
        let Some(config) = world
            .machine(machine)
            .and_then(|m| m.spec.bootstrap.config_ref.as_ref())
            .filter(|r| {
                r.kind == KThreesConfig::kind(&()) && r.api_group == KThreesConfig::group(&())
            })
        else {
            continue;
        };
        let key = (format!("{namespace}/{}", config.name), value.clone());
        if ctx
            .certificate_annotations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .written(&control_plane, &key)
        {
            continue;
        }
        let patch = json!({"metadata": {"annotations": {CERTIFICATES_EXPIRY_ANNOTATION: value}}});
        match configs
            .patch(&config.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {
                debug!(config = %config.name, "KThreesConfig not found: certificate expiry not written");
            }
            Err(source) => {
                return Err(Error::Act {
                    step: format!(
                        "certificate-expiry: annotate KThreesConfig {namespace}/{}",
                        config.name
                    ),
                    source,
                });
            }
        }
        debug!(machine = %machine, config = %config.name, expiry = %value, "certificate expiry written on the bootstrap config");
        ctx.certificate_annotations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .record(&control_plane, key);
    }
    Ok(())
}

/// The expiry gauges of `kcp`'s Machines, from the record.
pub fn record_expiries(
    ctx: &Context,
    kcp: &KThreesControlPlane,
    cluster: &str,
    decision: &Decision,
) {
    let namespace = kcp.namespace().unwrap_or_default();
    ctx.metrics.certificate_expiries(
        &format!("{namespace}/{cluster}"),
        decision
            .certificates
            .iter()
            .map(|(machine, e)| {
                (
                    machine.as_str(),
                    e.source.certificate_label(),
                    e.at.timestamp(),
                )
            })
            .chain(
                decision
                    .cluster_cas
                    .iter()
                    .map(|(purpose, at)| ("", purpose.certificate_label(), at.timestamp())),
            ),
    );
}
