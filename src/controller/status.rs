//! Writing status: the KThreesControlPlane's status subresource and the
//! conditions we own on its Machines, each a patch guarded by resourceVersion.
//! What is written is computed by [`crate::decision::status`].

use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::api::conditions;
use crate::api::kcp::KThreesControlPlaneStatus;
use crate::api::{KThreesControlPlane, Machine};
use crate::decision::conditions::machine::MachineConditions;

use super::context::KcpWrites;
use super::error::{Error, Result};

/// Write the KCP status; conflicts surface as errors and the reconcile retries.
pub async fn write_kcp_status(
    api: &Api<KThreesControlPlane>,
    writes: &KcpWrites,
    kcp: &KThreesControlPlane,
    status: &KThreesControlPlaneStatus,
) -> Result<()> {
    if kcp.status.as_ref() == Some(status) {
        return Ok(());
    }
    // Conditional on the version the status was computed from: a concurrent
    // writer (another replica, a user) makes this a 409 and we observe again.
    let mut new = serde_json::to_value(status).unwrap_or_default();
    if let Some(old) = &kcp.status {
        // A merge patch keeps what it does not name: what the new status
        // dropped (status.etcd when etcd was not read, lastFailure after a
        // success) is named with null.
        null_what_was_dropped(&serde_json::to_value(old).unwrap_or_default(), &mut new);
    }
    let patch = json!({"metadata": {"resourceVersion": kcp.resource_version()}, "status": new});
    writes.started(kcp);
    let written = api
        .patch_status(
            &kcp.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(|source| Error::Status {
            context: format!("KThreesControlPlane {}", kcp.name_any()),
            source,
        })?;
    writes.finished(&written);
    Ok(())
}

/// Add `null` to `new` for every object key `old` has and `new` lacks, at
/// any depth (arrays are replaced whole by a merge patch). Pure.
fn null_what_was_dropped(old: &serde_json::Value, new: &mut serde_json::Value) {
    let (Some(old), Some(new)) = (old.as_object(), new.as_object_mut()) else {
        return;
    };
    for (key, old_value) in old {
        match new.get_mut(key) {
            None => {
                new.insert(key.clone(), serde_json::Value::Null);
            }
            Some(new_value) => null_what_was_dropped(old_value, new_value),
        }
    }
}

/// Write `status` computed from `observed`. When this reconcile `acted` (an
/// annotation, the finalizer, a Secret), the object may have changed since it
/// was read, so its latest version is read first; otherwise nothing is read
/// or written when the status is unchanged.
pub async fn write_kcp_status_after(
    api: &Api<KThreesControlPlane>,
    writes: &KcpWrites,
    observed: &KThreesControlPlane,
    acted: bool,
    status: &KThreesControlPlaneStatus,
) -> Result<()> {
    if !acted {
        return write_kcp_status(api, writes, observed, status).await;
    }
    let fresh = api
        .get_status(&observed.name_any())
        .await
        .map_err(|source| Error::Status {
            context: format!("KThreesControlPlane {}", observed.name_any()),
            source,
        })?;
    write_kcp_status(api, writes, &fresh, status).await
}

/// Apply `changes` to the Machine's conditions and write them if they changed,
/// guarded by the Machine's resourceVersion; returns the Machine as written.
pub async fn write_machine_conditions(
    api: &Api<Machine>,
    machine: &Machine,
    changes: MachineConditions,
) -> Result<Option<Machine>> {
    let mut updated = machine.clone();
    let mut changed = false;
    for c in changes.set {
        changed |= conditions::set(updated.conditions_mut(), c);
    }
    for c in changes.set_v1beta1 {
        changed |= conditions::set_v1beta1(updated.v1beta1_conditions_mut(), c);
    }
    for type_ in changes.remove {
        changed |= conditions::remove(updated.conditions_mut(), type_);
        changed |= conditions::remove_v1beta1(updated.v1beta1_conditions_mut(), type_);
    }
    if !changed {
        return Ok(None);
    }
    let status = updated.status.clone().unwrap_or_default();
    let patch = json!({
        "metadata": {"resourceVersion": machine.resource_version()},
        "status": {
            "conditions": status.conditions,
            "deprecated": status.deprecated,
        }
    });
    let written = api
        .patch_status(
            &machine.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(|source| Error::Status {
            context: format!("Machine {}", machine.name_any()),
            source,
        })?;
    Ok(Some(written))
}

#[cfg(test)]
mod tests {
    use super::null_what_was_dropped;
    use serde_json::json;

    #[test]
    fn a_merge_patch_names_what_the_new_status_dropped() {
        let old = json!({
            "etcd": {"members": 3},
            "etcdBackup": {"lastSnapshots": [{"name": "a"}], "lastFailure": {"message": "down"}},
            "replicas": 3,
        });
        let mut new = json!({
            "etcdBackup": {"lastSnapshots": [{"name": "b"}]},
            "replicas": 3,
        });
        null_what_was_dropped(&old, &mut new);
        assert_eq!(
            new,
            json!({
                "etcd": null,
                "etcdBackup": {"lastSnapshots": [{"name": "b"}], "lastFailure": null},
                "replicas": 3,
            })
        );
    }
}
