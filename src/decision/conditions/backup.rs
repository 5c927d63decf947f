//! `EtcdBackupReady` and `EtcdRestoring` set on the status, or removed
//! when their rule has nothing to say. The rules themselves are the backup
//! and restore rules' (`decision::etcd_backup::condition`,
//! `decision::etcd_restore::condition`, with their table tests).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::api::condition_names::{ETCD_BACKUP_READY, ETCD_RESTORING};
use crate::api::conditions;
use crate::api::kcp::KThreesControlPlaneStatus;

use super::super::etcd_restore::RestoreDecision;
use super::super::world::World;
use super::v1beta1::v1beta1_renamed;

/// `EtcdBackupReady` from `spec.etcdBackup` and `status.etcdBackup` (gone
/// with the target).
pub fn set_backup_condition(world: &World, status: &mut KThreesControlPlaneStatus) {
    use super::super::etcd_backup::{condition, to_condition};
    match condition(
        world.kcp.spec.etcd_backup.as_ref(),
        status.etcd_backup.as_ref(),
        world.now,
    ) {
        Some(value) => set_condition(status, to_condition(value, world.kcp.metadata.generation)),
        None => {
            conditions::remove(&mut status.conditions, ETCD_BACKUP_READY);
        }
    }
}

/// `EtcdRestoring` from the restore rule's `decision` and the last restore
/// recorded; `unusable`: the snapshot could not be verified.
pub fn set_restore_condition(
    world: &World,
    status: &mut KThreesControlPlaneStatus,
    decision: Option<&RestoreDecision>,
    unusable: Option<&str>,
) {
    use super::super::etcd_restore::{condition, to_condition};
    match condition(decision, status.etcd_backup.as_ref(), unusable) {
        Some(value) => set_condition(status, to_condition(value, world.kcp.metadata.generation)),
        None => {
            conditions::remove(&mut status.conditions, ETCD_RESTORING);
        }
    }
}

/// Set `condition` on `status` and on its v1beta1 mirror (its renamed
/// form only: `Resized` is `kcp_status`'s, from every condition).
pub fn set_condition(status: &mut KThreesControlPlaneStatus, condition: Condition) {
    for mirrored in v1beta1_renamed(std::slice::from_ref(&condition)) {
        let deprecated = status
            .deprecated
            .get_or_insert_with(Default::default)
            .v1beta1
            .get_or_insert_with(Default::default);
        conditions::set_v1beta1(&mut deprecated.conditions, mirrored);
    }
    conditions::set(&mut status.conditions, condition);
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use crate::api::condition_names::{CERTIFICATES_EXPIRING, SCALING_UP};
    use crate::decision::conditions::v1beta1::v1beta1_mirror;

    fn condition(type_: &str, status: &str, reason: &str) -> Condition {
        conditions::new_condition(
            type_,
            status,
            reason,
            "",
            Some(1),
            Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        )
    }

    fn resized(status: &KThreesControlPlaneStatus) -> Option<String> {
        let mirror = &status.deprecated.as_ref()?.v1beta1.as_ref()?.conditions;
        conditions::get_v1beta1(mirror, "Resized").map(|c| c.status.clone())
    }

    /// While scaling, the whole set's mirror says `Resized=False`; a condition
    /// set afterwards on its own (CertificatesExpiring, EtcdBackupReady,
    /// EtcdRestoring on every pass) must leave that verdict alone.
    #[test]
    fn setting_one_condition_leaves_the_resized_verdict_of_the_whole_set() {
        let mut status = KThreesControlPlaneStatus::default();
        let scaling_up = condition(SCALING_UP, "True", "ScalingUp");
        for mirrored in v1beta1_mirror(std::slice::from_ref(&scaling_up)) {
            let deprecated = status
                .deprecated
                .get_or_insert_with(Default::default)
                .v1beta1
                .get_or_insert_with(Default::default);
            conditions::set_v1beta1(&mut deprecated.conditions, mirrored);
        }
        assert_eq!(resized(&status).as_deref(), Some("False"));

        set_condition(
            &mut status,
            condition(CERTIFICATES_EXPIRING, "False", "NotExpiring"),
        );

        assert_eq!(resized(&status).as_deref(), Some("False"));
        assert!(conditions::is_false(
            &status.conditions,
            CERTIFICATES_EXPIRING
        ));
    }
}
