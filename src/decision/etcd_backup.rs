//! The backup rule (`spec.etcdBackup`). Pure.
//!
//! - Before a member removal: no member is removed, whoever started the
//!   removal (remediation, scale-down, rollout, orphan, a person's delete),
//!   until a verified snapshot taken for that very member is recorded in
//!   `status.etcdBackup`, or a person waived it for that one removal
//!   (annotation [`ETCD_SNAPSHOT_WAIVED_ANNOTATION`] naming the Machine or
//!   the member's hex id). The record is keyed by the member's id, which
//!   etcd never reuses: a record dropped with the status only costs another
//!   snapshot, never a removal without one.
//! - On the schedule: when the cron's last occurrence has no scheduled
//!   snapshot after it, one is taken while nothing else is to be done.
//! - Without a target nothing changes.
//!
//! The snapshot is streamed from a healthy voter that is not being removed,
//! preferring one that does not lead (a snapshot reads the whole database).

use chrono::{DateTime, Duration, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::api::etcd_backup::{
    EtcdBackup, EtcdBackupStatus, SnapshotFailure, SnapshotPurpose, SnapshotRecord,
};
use crate::api::names::ETCD_SNAPSHOT_WAIVED_ANNOTATION;
use crate::etcd::{MemberSnapshot, MembershipSnapshot};

use crate::api::condition_names::ETCD_BACKUP_READY;
use crate::api::condition_names::etcd_backup_ready::{
    REASON_INVALID_SCHEDULE, REASON_READY, REASON_SCHEDULE_LATE, REASON_SNAPSHOT_FAILED,
};

/// Rules the plan reports.
pub const RULE_BEFORE_REMOVAL: &str = "backup.before-removal";
pub const RULE_SCHEDULED: &str = "backup.scheduled";
pub const RULE_NO_SOURCE: &str = "backup.wait.no-source";

/// A scheduled snapshot this long past its time makes the condition False.
pub const LATE_AFTER: Duration = Duration::minutes(10);

/// What the rule says about one member's removal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RemovalGate {
    /// No backup target: the removal goes ahead as without this rule.
    NoTarget,
    /// A snapshot for this member is recorded, or a person waived it.
    Passed { note: String },
    /// Take the snapshot first, streamed from `from`.
    Take { from: u64, message: String },
    /// No member can give a snapshot: wait.
    Wait { message: String },
}

/// The gate before removing `member` (`machine`: the Machine it belongs to).
pub fn before_removal(
    backup: Option<&EtcdBackup>,
    status: Option<&EtcdBackupStatus>,
    waiver: Option<&str>,
    snapshot: Option<&MembershipSnapshot>,
    member: u64,
    machine: Option<&str>,
) -> RemovalGate {
    if backup.is_none() {
        return RemovalGate::NoTarget;
    }
    let id = format!("{member:016x}");
    let label = snapshot
        .and_then(|s| s.member(member))
        .map(MemberSnapshot::label)
        .unwrap_or_else(|| id.clone());
    if let Some(record) = status
        .and_then(|s| s.last(SnapshotPurpose::BeforeRemoval))
        .filter(|r| r.before_removal_of.as_deref() == Some(id.as_str()))
    {
        return RemovalGate::Passed {
            note: format!(
                "snapshot {} (revision {}) taken before removing {label}",
                record.name, record.revision
            ),
        };
    }
    if let Some(waiver) = waiver.map(str::trim).filter(|w| waives(w, &id, machine)) {
        return RemovalGate::Passed {
            note: format!(
                "no snapshot before removing {label}: waived by annotation {ETCD_SNAPSHOT_WAIVED_ANNOTATION}={waiver}"
            ),
        };
    }
    match snapshot.and_then(|s| source_member(s, Some(member))) {
        Some(source) => RemovalGate::Take {
            from: source.id,
            message: format!(
                "taking an etcd snapshot from {} before removing {label}",
                source.label()
            ),
        },
        None => RemovalGate::Wait {
            message: format!(
                "no healthy voter other than {label} to take the snapshot from before removing it; \
                 a person may waive it for this removal with annotation \
                 {ETCD_SNAPSHOT_WAIVED_ANNOTATION}={}",
                machine.unwrap_or(&id)
            ),
        },
    }
}

/// Whether `waiver` (the annotation's value) names this removal.
pub fn waives(waiver: &str, member_hex: &str, machine: Option<&str>) -> bool {
    let waiver = waiver.trim_start_matches("0x");
    Some(waiver) == machine
        || waiver.eq_ignore_ascii_case(member_hex)
        || waiver.eq_ignore_ascii_case(member_hex.trim_start_matches('0'))
}

/// The member a snapshot is streamed from
/// ([`MembershipSnapshot::snapshot_source`], shared with the engine and the
/// CLI): a started, healthy voter other than `excluding`, a non-leader first.
pub fn source_member(
    snapshot: &MembershipSnapshot,
    excluding: Option<u64>,
) -> Option<&MemberSnapshot> {
    snapshot.snapshot_source(excluding)
}

/// Where the schedule stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Schedule {
    /// No target, or no schedule: only snapshots before removals.
    None,
    /// The cron expression does not parse.
    Invalid { message: String },
    /// The last occurrence has its snapshot (or there was none yet).
    NotDue { next: Option<DateTime<Utc>> },
    /// The occurrence at `due` has no snapshot yet.
    Due { due: DateTime<Utc> },
}

/// The schedule of `backup` at `now`, given what `status` recorded.
pub fn schedule(
    backup: Option<&EtcdBackup>,
    status: Option<&EtcdBackupStatus>,
    now: DateTime<Utc>,
) -> Schedule {
    let Some(expression) = backup.and_then(|b| b.schedule.as_deref()) else {
        return Schedule::None;
    };
    let cron = match expression.parse::<croner::Cron>() {
        Ok(cron) => cron,
        Err(err) => {
            return Schedule::Invalid {
                message: format!("spec.etcdBackup.schedule {expression:?}: {err}"),
            };
        }
    };
    let next = cron.find_next_occurrence(&now, false).ok();
    let Ok(previous) = cron.find_previous_occurrence(&now, true) else {
        return Schedule::NotDue { next };
    };
    let last = status
        .and_then(|s| s.last(SnapshotPurpose::Scheduled))
        .and_then(taken_at);
    match last {
        Some(last) if last >= previous => Schedule::NotDue { next },
        _ => Schedule::Due { due: previous },
    }
}

fn taken_at(record: &SnapshotRecord) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(&record.taken_at)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// The scheduled snapshot to take now, streamed from `from`, if one is due.
pub fn scheduled_snapshot(
    backup: Option<&EtcdBackup>,
    status: Option<&EtcdBackupStatus>,
    snapshot: Option<&MembershipSnapshot>,
    now: DateTime<Utc>,
) -> Option<(u64, String)> {
    let Schedule::Due { due } = schedule(backup, status, now) else {
        return None;
    };
    let source = source_member(snapshot?, None)?;
    Some((
        source.id,
        format!(
            "taking the scheduled etcd snapshot of {} from {}",
            due.to_rfc3339(),
            source.label()
        ),
    ))
}

/// What a snapshot attempt left for the status.
#[derive(Clone, Debug, PartialEq)]
pub enum SnapshotOutcome {
    Taken(SnapshotRecord),
    Failed(SnapshotFailure),
}

/// `status.etcdBackup` after `outcome`.
pub fn record_outcome(status: &mut Option<EtcdBackupStatus>, outcome: SnapshotOutcome) {
    let status = status.get_or_insert_with(Default::default);
    match outcome {
        SnapshotOutcome::Taken(record) => status.record(record),
        SnapshotOutcome::Failed(failure) => status.last_failure = Some(failure),
    }
}

/// `EtcdBackupReady` for `backup` and what `status` recorded (absent
/// without a target): False while the last attempt failed, while the
/// schedule is [`LATE_AFTER`] late or does not parse; True otherwise, its
/// message the newest snapshot and the next scheduled one.
pub fn condition(
    backup: Option<&EtcdBackup>,
    status: Option<&EtcdBackupStatus>,
    now: DateTime<Utc>,
) -> Option<(bool, &'static str, String)> {
    backup?;
    if let Some(failure) = status.and_then(|s| s.last_failure.as_ref()) {
        return Some((
            false,
            REASON_SNAPSHOT_FAILED,
            format!(
                "the {} snapshot of {} failed: {}",
                purpose_text(failure.purpose),
                failure.time,
                failure.message
            ),
        ));
    }
    let schedule = schedule(backup, status, now);
    match &schedule {
        Schedule::Invalid { message } => {
            return Some((false, REASON_INVALID_SCHEDULE, message.clone()));
        }
        Schedule::Due { due } if now - *due > LATE_AFTER => {
            return Some((
                false,
                REASON_SCHEDULE_LATE,
                format!(
                    "the scheduled snapshot of {} is {} minutes late",
                    due.to_rfc3339(),
                    (now - *due).num_minutes()
                ),
            ));
        }
        _ => {}
    }
    let newest = status
        .into_iter()
        .flat_map(|s| s.last_snapshots.iter())
        .max_by(|a, b| a.taken_at.cmp(&b.taken_at));
    let mut message = match newest {
        Some(r) => format!(
            "newest snapshot {} ({}, {}, revision {}, {} bytes)",
            r.name,
            purpose_text(r.purpose),
            r.taken_at,
            r.revision,
            r.size_bytes
        ),
        None => "no snapshot taken yet: one is taken before every member removal".to_string(),
    };
    if let Schedule::NotDue { next: Some(next) } | Schedule::Due { due: next } = schedule {
        message.push_str(&format!("; next scheduled {}", next.to_rfc3339()));
    }
    Some((true, REASON_READY, message))
}

pub fn purpose_text(purpose: SnapshotPurpose) -> &'static str {
    match purpose {
        SnapshotPurpose::BeforeRemoval => "before-removal",
        SnapshotPurpose::Scheduled => "scheduled",
    }
}

/// The condition of [`condition`], stamped.
pub fn to_condition(value: (bool, &'static str, String), generation: Option<i64>) -> Condition {
    let (ok, reason, message) = value;
    Condition {
        type_: ETCD_BACKUP_READY.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.into(),
        message,
        observed_generation: generation,
        // conditions::set keeps the old time while the status is unchanged.
        last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        ),
    }
}

/// The waiver annotation's value on the control plane, if set.
pub fn waiver(kcp: &crate::api::KThreesControlPlane) -> Option<&str> {
    kcp.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ETCD_SNAPSHOT_WAIVED_ANNOTATION))
        .map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::etcd_backup::{BackupTarget, FilesystemBackupTarget};
    use crate::etcd::MemberStatus;

    fn member(id: u64, healthy: bool, learner: bool) -> MemberSnapshot {
        MemberSnapshot {
            id,
            name: format!("cp-{id}-0000000{id}"),
            peer_urls: vec![],
            client_urls: vec![format!("https://10.0.0.{id}:2379")],
            learner,
            status: healthy.then(|| MemberStatus {
                leader: 1,
                raft_term: 2,
                raft_index: 10,
                raft_applied_index: 10,
                db_size: 1,
                db_size_in_use: 1,
                db_size_quota: 0,
                revision: 42,
                version: "3.5.1".into(),
                errors: vec![],
                is_learner: learner,
            }),
            probe_error: (!healthy).then(|| "unreachable".to_string()),
            alarms: vec![],
        }
    }

    /// Members 1 (leader), 2, 3, healthy unless listed in `down`.
    fn three(down: &[u64]) -> MembershipSnapshot {
        MembershipSnapshot {
            cluster_id: 7,
            leader: Some(1),
            members: (1..=3)
                .map(|id| member(id, !down.contains(&id), false))
                .collect(),
            listed_by: "https://10.0.0.1:2379".into(),
            alarms_error: None,
            foreign_clusters: vec![],
        }
    }

    fn backup(schedule: Option<&str>) -> EtcdBackup {
        EtcdBackup {
            target: BackupTarget {
                filesystem: Some(FilesystemBackupTarget {
                    path: "/snapshots".into(),
                }),
                ..Default::default()
            },
            schedule: schedule.map(Into::into),
            ..Default::default()
        }
    }

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .with_timezone(&Utc)
    }

    fn record(purpose: SnapshotPurpose, taken_at: &str, before: Option<u64>) -> SnapshotRecord {
        SnapshotRecord {
            purpose,
            name: "k3scp-x-cp-2-1".into(),
            taken_at: taken_at.into(),
            revision: 41,
            size_bytes: 4096,
            location: "/snapshots/ns/c/k3scp-x-cp-2-1".into(),
            source_member: "cp-2-00000002".into(),
            before_removal_of: before.map(|m| format!("{m:016x}")),
        }
    }

    fn with(records: Vec<SnapshotRecord>) -> EtcdBackupStatus {
        EtcdBackupStatus {
            last_snapshots: records,
            last_failure: None,
            last_restore: None,
        }
    }

    #[test]
    fn removal_gate_table() {
        let taken_for_3 = with(vec![record(
            SnapshotPurpose::BeforeRemoval,
            "2026-12-06T10:00:00Z",
            Some(3),
        )]);
        let taken_for_2 = with(vec![record(
            SnapshotPurpose::BeforeRemoval,
            "2026-12-06T10:00:00Z",
            Some(2),
        )]);
        let scheduled_only = with(vec![record(
            SnapshotPurpose::Scheduled,
            "2026-12-06T10:00:00Z",
            None,
        )]);
        let b = backup(None);
        type Case<'a> = (
            &'a str,
            Option<&'a EtcdBackup>,
            Option<&'a EtcdBackupStatus>,
            Option<&'a str>,
            MembershipSnapshot,
            u64,
            Option<&'a str>,
            &'a str,
        );
        let cases: Vec<Case> = vec![
            (
                "no_target_removes_as_before",
                None,
                None,
                None,
                three(&[]),
                3,
                Some("m3"),
                "no-target",
            ),
            (
                "no_snapshot_yet_takes_one_from_a_non_leader_other_than_the_target",
                Some(&b),
                None,
                None,
                three(&[]),
                3,
                Some("m3"),
                "take:2",
            ),
            (
                "the_target_is_the_only_non_leader_so_the_leader_gives_it",
                Some(&b),
                None,
                None,
                three(&[2]),
                3,
                Some("m3"),
                "take:1",
            ),
            (
                "a_snapshot_for_this_member_lets_it_go",
                Some(&b),
                Some(&taken_for_3),
                None,
                three(&[]),
                3,
                Some("m3"),
                "passed",
            ),
            (
                "a_snapshot_for_another_member_does_not",
                Some(&b),
                Some(&taken_for_2),
                None,
                three(&[]),
                3,
                Some("m3"),
                "take:2",
            ),
            (
                "a_scheduled_snapshot_does_not_count_for_a_removal",
                Some(&b),
                Some(&scheduled_only),
                None,
                three(&[]),
                3,
                Some("m3"),
                "take:2",
            ),
            (
                "a_waiver_naming_the_machine_lets_it_go",
                Some(&b),
                None,
                Some("m3"),
                three(&[]),
                3,
                Some("m3"),
                "passed",
            ),
            (
                "a_waiver_naming_the_member_id_lets_an_orphan_go",
                Some(&b),
                None,
                Some("0000000000000003"),
                three(&[]),
                3,
                None,
                "passed",
            ),
            (
                "a_waiver_naming_the_short_id_lets_an_orphan_go",
                Some(&b),
                None,
                Some("3"),
                three(&[]),
                3,
                None,
                "passed",
            ),
            (
                "a_waiver_naming_another_machine_does_not",
                Some(&b),
                None,
                Some("m2"),
                three(&[]),
                3,
                Some("m3"),
                "take:2",
            ),
            (
                "no_healthy_voter_but_the_target_waits",
                Some(&b),
                None,
                None,
                three(&[1, 2]),
                3,
                Some("m3"),
                "wait",
            ),
        ];
        for (name, backup, status, waiver, snap, member, machine, want) in cases {
            let got = match before_removal(backup, status, waiver, Some(&snap), member, machine) {
                RemovalGate::NoTarget => "no-target".to_string(),
                RemovalGate::Passed { .. } => "passed".to_string(),
                RemovalGate::Take { from, .. } => format!("take:{from}"),
                RemovalGate::Wait { message } => {
                    assert!(
                        message.contains(ETCD_SNAPSHOT_WAIVED_ANNOTATION),
                        "{name}: {message}"
                    );
                    "wait".to_string()
                }
            };
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn the_source_is_never_a_learner_nor_unstarted() {
        let mut snap = three(&[]);
        snap.members[1].learner = true;
        snap.members[2].name.clear();
        // Only the leader is left to give it.
        assert_eq!(source_member(&snap, None).map(|m| m.id), Some(1));
        assert_eq!(source_member(&snap, Some(1)).map(|m| m.id), None);
    }

    #[test]
    fn schedule_table() {
        let every_12h = backup(Some("0 */12 * * *"));
        let bad = backup(Some("0 */12 * * BLURSDAY"));
        let none = backup(None);
        let now = at("2026-12-06T13:05:00Z");
        let cases: Vec<(&str, Option<&EtcdBackup>, Option<EtcdBackupStatus>, &str)> = vec![
            ("no_schedule_takes_none", Some(&none), None, "none"),
            ("no_target_takes_none", None, None, "none"),
            (
                "never_taken_is_due_at_the_last_occurrence",
                Some(&every_12h),
                None,
                "due:2026-12-06T12:00:00+00:00",
            ),
            (
                "taken_after_the_last_occurrence_is_not_due",
                Some(&every_12h),
                Some(with(vec![record(
                    SnapshotPurpose::Scheduled,
                    "2026-12-06T12:00:03Z",
                    None,
                )])),
                "not-due:2026-12-07T00:00:00+00:00",
            ),
            (
                "taken_before_the_last_occurrence_is_due",
                Some(&every_12h),
                Some(with(vec![record(
                    SnapshotPurpose::Scheduled,
                    "2026-12-06T00:00:02Z",
                    None,
                )])),
                "due:2026-12-06T12:00:00+00:00",
            ),
            (
                "a_before_removal_snapshot_does_not_stand_for_the_schedule",
                Some(&every_12h),
                Some(with(vec![record(
                    SnapshotPurpose::BeforeRemoval,
                    "2026-12-06T12:30:00Z",
                    Some(3),
                )])),
                "due:2026-12-06T12:00:00+00:00",
            ),
            (
                "a_schedule_that_does_not_parse_is_invalid",
                Some(&bad),
                None,
                "invalid",
            ),
        ];
        for (name, backup, status, want) in cases {
            let got = match schedule(backup, status.as_ref(), now) {
                Schedule::None => "none".to_string(),
                Schedule::Invalid { message } => {
                    assert!(
                        message.contains("spec.etcdBackup.schedule"),
                        "{name}: {message}"
                    );
                    "invalid".to_string()
                }
                Schedule::NotDue { next } => format!(
                    "not-due:{}",
                    next.map(|n| n.to_rfc3339()).unwrap_or_default()
                ),
                Schedule::Due { due } => format!("due:{}", due.to_rfc3339()),
            };
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn condition_table() {
        let every_12h = backup(Some("0 */12 * * *"));
        let failed = EtcdBackupStatus {
            last_snapshots: vec![],
            last_failure: Some(SnapshotFailure {
                purpose: SnapshotPurpose::BeforeRemoval,
                time: "2026-12-06T12:01:00Z".into(),
                message: "spec.etcdBackup.target.s3.bucket: bucket \"nope\" does not exist".into(),
            }),
            last_restore: None,
        };
        let fresh = with(vec![record(
            SnapshotPurpose::Scheduled,
            "2026-12-06T12:00:03Z",
            None,
        )]);
        let none = backup(None);
        type Case<'a> = (
            &'a str,
            Option<&'a EtcdBackup>,
            Option<&'a EtcdBackupStatus>,
            &'a str,
            Option<(bool, &'a str)>,
        );
        let cases: Vec<Case> = vec![
            (
                "no_target_no_condition",
                None,
                None,
                "2026-12-06T12:05:00Z",
                None,
            ),
            (
                "a_failure_is_false_with_the_targets_error",
                Some(&every_12h),
                Some(&failed),
                "2026-12-06T12:05:00Z",
                Some((false, REASON_SNAPSHOT_FAILED)),
            ),
            (
                "due_within_ten_minutes_is_not_late",
                Some(&every_12h),
                None,
                "2026-12-06T12:09:00Z",
                Some((true, REASON_READY)),
            ),
            (
                "due_for_eleven_minutes_is_late",
                Some(&every_12h),
                None,
                "2026-12-06T12:11:00Z",
                Some((false, REASON_SCHEDULE_LATE)),
            ),
            (
                "taken_on_time_is_ready",
                Some(&every_12h),
                Some(&fresh),
                "2026-12-06T13:00:00Z",
                Some((true, REASON_READY)),
            ),
            (
                "only_before_removals_is_ready_without_a_snapshot",
                Some(&none),
                None,
                "2026-12-06T13:00:00Z",
                Some((true, REASON_READY)),
            ),
        ];
        for (name, backup, status, now, want) in cases {
            let got = condition(backup, status, at(now));
            assert_eq!(
                got.as_ref().map(|(ok, reason, _)| (*ok, *reason)),
                want,
                "{name}: {got:?}"
            );
            if let Some((false, REASON_SNAPSHOT_FAILED, message)) = &got {
                assert!(message.contains("bucket \"nope\""), "{name}: {message}");
            }
        }
    }

    #[test]
    fn a_success_clears_the_failure_and_keeps_one_record_per_purpose() {
        let mut status = Some(EtcdBackupStatus {
            last_snapshots: vec![record(
                SnapshotPurpose::BeforeRemoval,
                "2026-12-06T10:00:00Z",
                Some(2),
            )],
            last_failure: Some(SnapshotFailure {
                purpose: SnapshotPurpose::BeforeRemoval,
                time: "2026-12-06T11:00:00Z".into(),
                message: "down".into(),
            }),
            last_restore: None,
        });
        record_outcome(
            &mut status,
            SnapshotOutcome::Taken(record(
                SnapshotPurpose::BeforeRemoval,
                "2026-12-06T12:00:00Z",
                Some(3),
            )),
        );
        let status = status.unwrap();
        assert_eq!(status.last_failure, None);
        assert_eq!(status.last_snapshots.len(), 1);
        assert_eq!(
            status.last_snapshots[0].before_removal_of.as_deref(),
            Some("0000000000000003")
        );
    }
}
