//! Whether a leadership move started off a member about to be removed has
//! come through, and how long it may take before it counts as failed. The
//! MoveLeader call runs beside the reconcile (`controller::etcd_leader_move`);
//! a later pass confirms it on its own snapshot. Pure.

use chrono::{DateTime, Utc};

use super::world::{EtcdObservation, LeadershipMove};

/// The move of the leadership of `machine`'s member `from` to `to`, started
/// `now`; past `now + allowed` a target still leading means the move failed
/// and it is asked for again.
pub fn started(
    machine: &str,
    from: u64,
    to: u64,
    now: DateTime<Utc>,
    allowed: std::time::Duration,
) -> LeadershipMove {
    // An absurd `--etcd-election-timeout` waits for ever rather than
    // overflowing the clock (chrono's `+` panics there).
    let deadline = chrono::Duration::from_std(allowed)
        .ok()
        .and_then(|allowed| now.checked_add_signed(allowed))
        .unwrap_or(DateTime::<Utc>::MAX_UTC);
    LeadershipMove {
        machine: machine.to_string(),
        from,
        to,
        started: now,
        deadline,
    }
}

/// The member leading once `moving` is confirmed on `etcd`: its member no
/// longer leads, and the cluster has settled on its new leader (every voter
/// it needs follows it: none reports "no leader" or fails a linearizable
/// read, as right after a handover). `None` while the move is still under
/// way, or etcd was not read.
pub fn confirmed_leader(moving: &LeadershipMove, etcd: &EtcdObservation) -> Option<u64> {
    let EtcdObservation::Observed(snapshot) = etcd else {
        return None;
    };
    let leader = snapshot.leader.filter(|l| *l != 0)?;
    let settled = snapshot.assess_cluster().has_quorum();
    (leader != moving.from && settled).then_some(leader)
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use crate::decision::fixtures;
    use crate::etcd::MembershipSnapshot;
    use crate::etcd::snapshot::{MemberSnapshot, MemberStatus};

    use super::*;

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 1, 0, 0, 0).unwrap()
    }

    /// Member `id` (the fixtures' server `id - 1`), answering with `leader`
    /// as its leader, or not answering.
    fn member(id: u64, leader: Option<u64>) -> MemberSnapshot {
        let member = fixtures::member(id - 1);
        match leader {
            Some(leader) => MemberSnapshot {
                status: member.status.map(|s| MemberStatus { leader, ..s }),
                ..member
            },
            None => fixtures::unhealthy(member, "unreachable"),
        }
    }

    /// Three members 1..3, each seeing `seen` as leader, or answering not
    /// at all where `seen` is `None`; the snapshot reports `leader`.
    fn observed(leader: Option<u64>, seen: [Option<u64>; 3]) -> EtcdObservation {
        EtcdObservation::Observed(MembershipSnapshot {
            cluster_id: 1,
            leader,
            members: (1..=3)
                .map(|id| member(id, seen[id as usize - 1]))
                .collect(),
            listed_by: "https://127.0.0.1:2379".into(),
            alarms_error: None,
            foreign_clusters: vec![],
        })
    }

    #[test]
    fn a_move_is_confirmed_once_another_member_leads_a_settled_cluster() {
        let moving = started("m1", 1, 2, now(), std::time::Duration::from_secs(10));
        let cases = [
            (
                "the_target_leads_a_cluster_that_follows_it",
                observed(Some(2), [Some(2), Some(2), Some(2)]),
                Some(2),
            ),
            (
                "another_member_than_the_target_took_over",
                observed(Some(3), [Some(3), Some(3), Some(3)]),
                Some(3),
            ),
            (
                "the_member_still_leads",
                observed(Some(1), [Some(1), Some(1), Some(1)]),
                None,
            ),
            (
                "no_leader_reported",
                observed(None, [Some(0), Some(0), Some(0)]),
                None,
            ),
            (
                "a_leader_of_zero_is_none",
                observed(Some(0), [Some(2), Some(2), Some(2)]),
                None,
            ),
            (
                "a_new_leader_without_quorum_following_it",
                observed(Some(2), [None, Some(2), None]),
                None,
            ),
            (
                "etcd_not_read",
                EtcdObservation::Unreachable {
                    reason: "timeout".into(),
                },
                None,
            ),
        ];
        for (name, etcd, leader) in cases {
            assert_eq!(confirmed_leader(&moving, &etcd), leader, "{name}");
        }
    }

    #[test]
    fn a_move_may_take_what_it_is_allowed_before_it_counts_as_failed() {
        let moving = started("m1", 1, 2, now(), std::time::Duration::from_secs(12));
        assert_eq!(
            (moving.machine.as_str(), moving.from, moving.to),
            ("m1", 1, 2)
        );
        assert_eq!(moving.started, now());
        assert_eq!(moving.deadline, now() + chrono::Duration::seconds(12));
    }

    #[test]
    fn an_absurd_timeout_waits_for_ever_instead_of_overflowing() {
        let now = Utc.with_ymd_and_hms(2026, 12, 6, 0, 0, 0).unwrap();
        for allowed in [
            std::time::Duration::MAX,
            std::time::Duration::from_secs(u64::MAX / 2),
            std::time::Duration::from_secs(400 * 365 * 86_400 * 1_000),
        ] {
            let moving = started("m1", 1, 2, now, allowed);
            assert_eq!(moving.deadline, DateTime::<Utc>::MAX_UTC, "{allowed:?}");
        }
        let moving = started("m1", 1, 2, now, std::time::Duration::from_secs(10));
        assert_eq!(moving.deadline, now + chrono::Duration::seconds(10));
    }
}
