//! What an etcd snapshot the plan chose is called, and which of ours are kept
//! after it (`spec.etcdBackup.retention`). Pure; the controller streams the
//! snapshot under this name and prunes by this retention
//! (`controller::etcd_snapshot`).

use chrono::{DateTime, Utc};

use crate::api::etcd_backup::{EtcdBackup, SnapshotPurpose};
use crate::backup::name::NameError;
use crate::backup::{Retention, SnapshotName, SnapshotReason};

/// The name of a snapshot taken now for `purpose` from the member named
/// `member_name`: ours (never k3s's prefixes), after the member's Node
/// (its k3s member name without the suffix, else the name as it is).
pub fn snapshot_name(
    purpose: SnapshotPurpose,
    member_name: &str,
    now: DateTime<Utc>,
) -> Result<SnapshotName, NameError> {
    let node = crate::membership::node_of_member_name(member_name).unwrap_or(member_name);
    SnapshotName::ours(reason(purpose), node, now.into())
}

fn reason(purpose: SnapshotPurpose) -> SnapshotReason {
    match purpose {
        SnapshotPurpose::BeforeRemoval => SnapshotReason::BeforeRemoval,
        SnapshotPurpose::Scheduled => SnapshotReason::Scheduled,
    }
}

/// Which of our snapshots are kept: the newest `retention.count` (default 5,
/// at least 1), none older than `retention.maxAgeSeconds` when set.
pub fn retention(backup: &EtcdBackup) -> Retention {
    Retention {
        count: Some(backup.retention_count()),
        max_age: backup
            .retention
            .max_age_seconds
            .map(|s| std::time::Duration::from_secs(s.max(0) as u64)),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use chrono::TimeZone;
    use serde_json::json;

    use super::*;

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 1, 0, 0, 0).unwrap()
    }

    #[test]
    fn a_snapshot_is_named_after_its_purpose_its_node_and_the_time() {
        let at = now().timestamp();
        let cases = [
            (
                "before_a_removal_from_a_k3s_member",
                SnapshotPurpose::BeforeRemoval,
                "cp-1-8f3a2b1c",
                format!("capi-before-removal-cp-1-{at}"),
            ),
            (
                "scheduled_from_a_k3s_member",
                SnapshotPurpose::Scheduled,
                "cp-2-0a1b2c3d",
                format!("capi-scheduled-cp-2-{at}"),
            ),
            (
                "a_member_name_that_is_not_k3s_is_taken_as_it_is",
                SnapshotPurpose::Scheduled,
                "etcd-a",
                format!("capi-scheduled-etcd-a-{at}"),
            ),
        ];
        for (name, purpose, member, expected) in cases {
            assert_eq!(
                snapshot_name(purpose, member, now()).unwrap().to_string(),
                expected,
                "{name}"
            );
        }
        assert!(
            snapshot_name(SnapshotPurpose::Scheduled, "Not_A_Node", now()).is_err(),
            "a name Kubernetes does not allow for a Node is refused"
        );
    }

    #[test]
    fn retention_keeps_the_newest_count_and_drops_by_age_when_asked() {
        let backup = |retention: serde_json::Value| -> EtcdBackup {
            serde_json::from_value(json!({
                "target": {"filesystem": {"path": "/backups"}},
                "retention": retention,
            }))
            .unwrap()
        };
        let cases = [
            ("unset_keeps_five", json!({}), Some(5), None),
            ("a_count", json!({"count": 3}), Some(3), None),
            (
                "a_count_of_zero_keeps_one",
                json!({"count": 0}),
                Some(1),
                None,
            ),
            (
                "a_maximum_age",
                json!({"count": 2, "maxAgeSeconds": 3600}),
                Some(2),
                Some(Duration::from_secs(3600)),
            ),
            (
                "a_negative_age_is_zero",
                json!({"maxAgeSeconds": -5}),
                Some(5),
                Some(Duration::ZERO),
            ),
        ];
        for (name, spec, count, max_age) in cases {
            assert_eq!(
                retention(&backup(spec)),
                Retention { count, max_age },
                "{name}"
            );
        }
    }
}
