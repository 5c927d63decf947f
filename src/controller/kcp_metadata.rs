//! Writes to the KThreesControlPlane's own metadata (annotations, the
//! finalizer): one merge patch, conditional on the version the decision was
//! made on when asked, and recorded in the context's write tracker so that
//! the next reconcile reads past a watch cache that has not seen it yet.

use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::api::KThreesControlPlane;

use super::context::Context;

/// Merge-patch `metadata` (a JSON object: `annotations`, `finalizers`) into
/// `kcp`; with `conditional`, only if it is still at the version observed
/// (a conflict then means another writer changed it: decide again).
pub async fn patch_kcp_metadata(
    ctx: &Context,
    kcp: &KThreesControlPlane,
    mut metadata: serde_json::Value,
    conditional: bool,
) -> Result<KThreesControlPlane, kube::Error> {
    if conditional && let Some(fields) = metadata.as_object_mut() {
        fields.insert("resourceVersion".into(), json!(kcp.resource_version()));
    }
    let kcps: Api<KThreesControlPlane> =
        Api::namespaced(ctx.client.clone(), &kcp.namespace().unwrap_or_default());
    ctx.kcp_writes.started(kcp);
    let written = kcps
        .patch(
            &kcp.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&json!({ "metadata": metadata })),
        )
        .await?;
    ctx.kcp_writes.finished(&written);
    Ok(written)
}
