//! Quorum arithmetic on the *real* etcd membership.
//!
//! Pure: callers feed what they observed (each member's probe result and alarms)
//! and get back an assessment that explains itself with the numbers. The rule is
//! Cluster API v1.13's `targetEtcdClusterHealthy`, improved where upstream had to
//! guess:
//! - voters = members that are not learners, minus the target (if it has a member);
//! - a voter is healthy when its own endpoint answered `Status` without errors and
//!   it has no alarm (NOSPACE, CORRUPT);
//! - a learner or an unnamed (not yet started) member other than the target makes
//!   any removal unsafe: the cluster is mid-join and its size is about to change;
//! - removal is safe iff healthy voters >= voters / 2 + 1.
//!
//! A target without a member (a k3s `--disable-etcd` server, or a machine whose
//! member never joined) costs nothing: nothing is subtracted. Members without a
//! Machine are counted like any other, from their own probe, never assumed.

use std::fmt;

use serde::Serialize;

/// What was observed of one member, as the quorum rule needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberView {
    pub id: u64,
    /// Empty while the member has not started (etcd reports no name yet).
    pub name: String,
    pub learner: bool,
    /// `None` when the member's own endpoint answered `Status` without errors;
    /// otherwise why it is not healthy (unreachable, timeout, errors it reported).
    pub probe_error: Option<String>,
    /// Active alarms raised against this member (e.g. `NOSPACE`, `CORRUPT`).
    pub alarms: Vec<String>,
}

/// Whether a member's reason for not counting as healthy is etcd settling
/// after a change of leader or of voters, which passes by itself within a few
/// heartbeats: a linearizable read that straddled a leadership change
/// ("etcdserver: leader changed"), or a member promoted from learner a moment
/// ago that has not applied its promotion yet ("etcdserver: rpc not
/// supported for learner"), or, while the snapshot shows a leader that the
/// others follow, a member that has not heard of it yet ("etcdserver: no
/// leader"). A lost quorum shows as no leader anywhere, or timeouts, which
/// are never taken for settling.
pub fn is_settling_reason(reason: &str, leader_observed: bool) -> bool {
    reason.contains("etcdserver: leader changed")
        || reason.contains("etcdserver: rpc not supported for learner")
        || (leader_observed && reason.contains("etcdserver: no leader"))
}

/// A member as named in explanations: its name, or its id while unnamed
/// (a member that has not started yet has no name).
pub fn member_label(id: u64, name: &str) -> String {
    if name.is_empty() {
        format!("unnamed member {id:016x}")
    } else {
        name.to_string()
    }
}

impl MemberView {
    /// A started voter that answered its probe with no alarm.
    pub fn healthy_voter(id: u64, name: impl Into<String>) -> Self {
        MemberView {
            id,
            name: name.into(),
            learner: false,
            probe_error: None,
            alarms: vec![],
        }
    }

    pub fn label(&self) -> String {
        member_label(self.id, &self.name)
    }

    /// Why this member does not count as a healthy voter, if it does not.
    pub fn unhealthy_reason(&self) -> Option<String> {
        match (&self.probe_error, self.alarms.is_empty()) {
            (Some(err), true) => Some(err.clone()),
            (Some(err), false) => Some(format!("{err}; alarms {}", self.alarms.join(","))),
            (None, false) => Some(format!("alarm {}", self.alarms.join(","))),
            (None, true) => None,
        }
    }
}

/// Why a removal (or the cluster as it stands) is not safe.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Blocker {
    /// A learner is joining; the voter set is about to change.
    LearnerPresent { member: String },
    /// A member has been added but has not started (no name yet).
    StartingMember { id: String },
    /// Too few healthy voters would remain.
    QuorumLost {
        healthy: usize,
        voters: usize,
        quorum: usize,
    },
    /// The target maps to no member while these members are claimed by no
    /// Machine: any of them may be its own, so it counts as one of them.
    TargetUnmapped {
        machine: String,
        unclaimed: Vec<String>,
    },
}

impl fmt::Display for Blocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Blocker::LearnerPresent { member } => {
                write!(f, "learner {member} has not been promoted yet")
            }
            Blocker::StartingMember { id } => {
                write!(f, "member {id} has been added but has not started")
            }
            Blocker::QuorumLost {
                healthy,
                voters,
                quorum,
            } => write!(
                f,
                "only {healthy} of {voters} voters would be healthy, quorum needs {quorum}"
            ),
            Blocker::TargetUnmapped { machine, unclaimed } => write!(
                f,
                "{machine} maps to no etcd member while {} claimed by no Machine ({}): it may be its own, so it is counted as one of them",
                if unclaimed.len() == 1 {
                    "a member is"
                } else {
                    "members are"
                },
                unclaimed.join(", ")
            ),
        }
    }
}

/// A voter that does not count as healthy, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct UnhealthyVoter {
    pub member: String,
    pub reason: String,
}

/// The result of the quorum rule, with every number that decided it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Assessment {
    /// The member whose removal is assessed, as named in explanations; `None`
    /// when assessing the cluster as it stands.
    pub target: Option<String>,
    /// Whether the target has an etcd member at all (false costs nothing).
    pub target_is_member: bool,
    /// Voting members that remain (after removing the target).
    pub voters: usize,
    /// Of those, how many are healthy.
    pub healthy: usize,
    /// Quorum size of the remaining voters: voters / 2 + 1.
    pub size: usize,
    /// How many more healthy voters may fail before quorum is lost (0 when
    /// quorum is already lost).
    pub fault_tolerance: usize,
    pub unhealthy: Vec<UnhealthyVoter>,
    pub blockers: Vec<Blocker>,
}

impl Assessment {
    pub fn is_safe(&self) -> bool {
        self.blockers.is_empty()
    }

    /// Unsafe only because voters are settling after a change of leader or
    /// of voters ([`is_settling_reason`]): no learner, no starting member, no
    /// unmapped target, and every unhealthy voter settling. Such a wait ends
    /// by itself within a few heartbeats: it is progress, not a problem.
    pub fn only_settling(&self, leader_observed: bool) -> bool {
        !self.is_safe()
            && !self.unhealthy.is_empty()
            && self
                .unhealthy
                .iter()
                .all(|u| is_settling_reason(&u.reason, leader_observed))
            && self
                .blockers
                .iter()
                .all(|b| matches!(b, Blocker::QuorumLost { .. }))
    }

    /// Whether enough voters are healthy for quorum: for the cluster as it
    /// stands, whether etcd can commit anything at all; for a removal,
    /// whether it would still be able to.
    pub fn has_quorum(&self) -> bool {
        !self
            .blockers
            .iter()
            .any(|b| matches!(b, Blocker::QuorumLost { .. }))
    }
}

/// Quorum size for `voters` voting members.
pub fn quorum_size(voters: usize) -> usize {
    voters / 2 + 1
}

/// Assess the cluster as it stands (no removal).
pub fn assess_cluster(members: &[MemberView]) -> Assessment {
    assess(members, None)
}

/// The cluster as it stands, when it has lost quorum (fewer healthy voters than
/// a quorum): then no removal is safe whatever its own arithmetic says, since
/// etcd cannot commit the change and what we cannot read (alarms) is unknown.
pub fn quorum_lost(members: &[MemberView]) -> Option<Assessment> {
    let standing = assess_cluster(members);
    (!standing.has_quorum()).then_some(standing)
}

/// Assess removing the member with id `target` (or nothing, if `None` or if no
/// member has that id).
pub fn assess_removal(members: &[MemberView], target: u64) -> Assessment {
    assess(members, Some(target))
}

/// Assess removing `machine`, whose member could not be told apart from the
/// `unclaimed` members (ids no Machine claims): it counts as a voter, the
/// worst case among them (the one whose removal leaves the least fault
/// tolerance), and the removal is never safe while it is unknown.
pub fn assess_unmapped_removal(
    members: &[MemberView],
    machine: &str,
    unclaimed: &[u64],
) -> Assessment {
    let mut worst = unclaimed
        .iter()
        .map(|id| assess(members, Some(*id)))
        .min_by_key(|a| (a.healthy as i64 - a.size as i64, a.voters))
        .unwrap_or_else(|| assess(members, None));
    worst.target = Some(machine.to_string());
    worst.target_is_member = true;
    worst.blockers.push(Blocker::TargetUnmapped {
        machine: machine.to_string(),
        unclaimed: unclaimed
            .iter()
            .map(|id| {
                members
                    .iter()
                    .find(|m| m.id == *id)
                    .map_or_else(|| format!("{id:016x}"), MemberView::label)
            })
            .collect(),
    });
    worst
}

fn assess(members: &[MemberView], target: Option<u64>) -> Assessment {
    let target_member = target.and_then(|id| members.iter().find(|m| m.id == id));
    let remaining = members
        .iter()
        .filter(|m| Some(m.id) != target_member.map(|t| t.id));

    let mut voters = 0;
    let mut unhealthy = Vec::new();
    let mut blockers = Vec::new();
    for member in remaining {
        if member.name.is_empty() {
            blockers.push(Blocker::StartingMember {
                id: format!("{:016x}", member.id),
            });
        }
        if member.learner {
            blockers.push(Blocker::LearnerPresent {
                member: member.label(),
            });
            continue;
        }
        voters += 1;
        if let Some(reason) = member.unhealthy_reason() {
            unhealthy.push(UnhealthyVoter {
                member: member.label(),
                reason,
            });
        }
    }
    let healthy = voters - unhealthy.len();
    let size = quorum_size(voters);
    if healthy < size {
        blockers.push(Blocker::QuorumLost {
            healthy,
            voters,
            quorum: size,
        });
    }
    Assessment {
        target: target.map(|id| target_member.map_or_else(|| format!("{id:016x}"), |m| m.label())),
        target_is_member: target_member.is_some(),
        voters,
        healthy,
        size,
        fault_tolerance: healthy.saturating_sub(size),
        unhealthy,
        blockers,
    }
}

impl fmt::Display for Assessment {
    /// One line with the numbers, e.g. "removing m2 would leave 1 of 2 voters
    /// healthy, quorum needs 2; unhealthy: m3 (connection refused)".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verb = if self.is_safe() {
            "leaves"
        } else {
            "would leave"
        };
        match (&self.target, self.target_is_member) {
            (Some(t), true) => write!(
                f,
                "removing {t} {verb} {} of {} voters healthy, quorum needs {}",
                self.healthy, self.voters, self.size
            )?,
            (Some(t), false) => write!(
                f,
                "{t} has no etcd member (removing it costs nothing); {} of {} voters healthy, quorum needs {}",
                self.healthy, self.voters, self.size
            )?,
            (None, _) => write!(
                f,
                "{} of {} voters healthy, quorum needs {}",
                self.healthy, self.voters, self.size
            )?,
        }
        if self.is_safe() {
            write!(f, ", fault tolerance {}", self.fault_tolerance)?;
        }
        if !self.unhealthy.is_empty() {
            let list: Vec<String> = self
                .unhealthy
                .iter()
                .map(|u| format!("{} ({})", u.member, u.reason))
                .collect();
            write!(f, "; unhealthy: {}", list.join(", "))?;
        }
        for blocker in &self.blockers {
            if !matches!(blocker, Blocker::QuorumLost { .. }) {
                write!(f, "; {blocker}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(i: u64) -> MemberView {
        MemberView {
            id: i,
            name: format!("m{i}-0000000{i}"),
            learner: false,
            probe_error: None,
            alarms: vec![],
        }
    }

    /// `n` members m1..mn; the ids in `down` fail their probe.
    fn cluster(n: u64, down: &[u64]) -> Vec<MemberView> {
        (1..=n)
            .map(|i| {
                let mut m = member(i);
                if down.contains(&i) {
                    m.probe_error = Some("connection refused".into());
                }
                m
            })
            .collect()
    }

    /// Upstream KCP's TestCanSafelyRemoveEtcdMember, on real membership: the
    /// target is always m1; "missing" drops m1's member.
    /// Settling after a leadership handover or a promotion passes by itself;
    /// a lost quorum, a member down or a learner joining does not.
    #[test]
    fn only_settling_is_told_apart_from_a_real_risk() {
        let with = |errors: &[(u64, &str)]| {
            let mut members = cluster(3, &[]);
            for (id, err) in errors {
                members[*id as usize - 1].probe_error = Some(err.to_string());
            }
            members
        };
        let changed = "linearizable read on https://10.0.0.2:2379 failed: gRPC Unavailable: etcdserver: leader changed";
        let promoted =
            "linearizable read failed: gRPC Unavailable: etcdserver: rpc not supported for learner";
        let cases: [(&str, Vec<MemberView>, bool); 6] = [
            ("a read straddled the handover", with(&[(2, changed)]), true),
            (
                "every member mid-handover",
                with(&[(1, changed), (2, changed), (3, changed)]),
                true,
            ),
            (
                "a member promoted a moment ago",
                with(&[(2, promoted)]),
                true,
            ),
            ("a member down", with(&[(2, "connection refused")]), false),
            (
                "one settling, one down",
                with(&[(2, changed), (3, "deadline exceeded")]),
                false,
            ),
            (
                "a member that has not heard of the new leader yet",
                with(&[(2, "etcdserver: no leader")]),
                true,
            ),
        ];
        for (name, members, settling) in cases {
            let a = assess_removal(&members, 1);
            assert!(!a.is_safe(), "{name}: {a}");
            assert_eq!(a.only_settling(true), settling, "{name}: {a}");
        }
        // No leader anywhere: that is a lost quorum, not settling.
        let a = assess_removal(&with(&[(2, "etcdserver: no leader")]), 1);
        assert!(!a.only_settling(false), "{a}");
        // A learner joining is never settling, whatever the probes say.
        let mut members = with(&[(2, changed)]);
        members.push(MemberView {
            learner: true,
            ..member(4)
        });
        assert!(!assess_removal(&members, 1).only_settling(true));
        // Safe is not settling.
        assert!(!assess_removal(&cluster(3, &[]), 1).only_settling(true));
    }

    #[test]
    fn can_safely_remove_etcd_member_table() {
        struct Case {
            name: &'static str,
            members: u64,
            target_missing: bool,
            down: &'static [u64],
            safe: bool,
        }
        let cases = [
            Case {
                name: "can't safely remediate 1 machine CP",
                members: 1,
                target_missing: false,
                down: &[],
                safe: false,
            },
            Case {
                name: "can safely remediate 2 machine CP without additional etcd member failures",
                members: 2,
                target_missing: false,
                down: &[],
                safe: true,
            },
            Case {
                name: "can safely remediate 2 machines CP when the etcd member being remediated is missing",
                members: 2,
                target_missing: true,
                down: &[],
                safe: true,
            },
            Case {
                name: "can't safely remediate 2 machines CP with one additional etcd member failure",
                members: 2,
                target_missing: false,
                down: &[2],
                safe: false,
            },
            Case {
                name: "can safely remediate 3 machines CP without additional etcd member failures",
                members: 3,
                target_missing: false,
                down: &[],
                safe: true,
            },
            Case {
                name: "can safely remediate 3 machines CP when the etcd member being remediated is missing",
                members: 3,
                target_missing: true,
                down: &[],
                safe: true,
            },
            Case {
                name: "can't safely remediate 3 machines CP with one additional etcd member failure",
                members: 3,
                target_missing: false,
                down: &[2],
                safe: false,
            },
            Case {
                name: "can safely remediate 3 machines CP when the target itself is down",
                members: 3,
                target_missing: false,
                down: &[1],
                safe: true,
            },
            Case {
                name: "can safely remediate 5 machines CP less than 2 additional etcd member failures",
                members: 5,
                target_missing: false,
                down: &[2],
                safe: true,
            },
            Case {
                name: "can't safely remediate 5 machines CP with 2 additional etcd member failures",
                members: 5,
                target_missing: false,
                down: &[2, 3],
                safe: false,
            },
            Case {
                name: "can safely remediate 7 machines CP with less than 3 additional etcd member failures",
                members: 7,
                target_missing: false,
                down: &[2, 3],
                safe: true,
            },
            Case {
                name: "can't safely remediate 7 machines CP with 3 additional etcd member failures",
                members: 7,
                target_missing: false,
                down: &[2, 3, 4],
                safe: false,
            },
            Case {
                name: "can't safely remediate 3 machines CP with the target missing and one member down",
                members: 3,
                target_missing: true,
                down: &[2],
                safe: false,
            },
            Case {
                name: "can safely remediate 4 machines CP with the target missing and one member down",
                members: 4,
                target_missing: true,
                down: &[2],
                safe: true,
            },
        ];
        for case in cases {
            let mut members = cluster(case.members, case.down);
            if case.target_missing {
                members.retain(|m| m.id != 1);
            }
            let got = assess_removal(&members, 1);
            assert_eq!(got.is_safe(), case.safe, "{}: {got}", case.name);
            assert_eq!(got.target_is_member, !case.target_missing, "{}", case.name);
        }
    }

    #[test]
    fn numbers_and_message_of_a_refusal() {
        let got = assess_removal(&cluster(3, &[3]), 2);
        assert_eq!((got.voters, got.healthy, got.size), (2, 1, 2));
        assert_eq!(got.fault_tolerance, 0);
        assert_eq!(
            got.blockers,
            vec![Blocker::QuorumLost {
                healthy: 1,
                voters: 2,
                quorum: 2
            }]
        );
        assert_eq!(
            got.to_string(),
            "removing m2-00000002 would leave 1 of 2 voters healthy, quorum needs 2; unhealthy: m3-00000003 (connection refused)"
        );
    }

    #[test]
    fn cluster_as_it_stands_reports_fault_tolerance() {
        let got = assess_cluster(&cluster(3, &[]));
        assert_eq!(
            (got.voters, got.healthy, got.size, got.fault_tolerance),
            (3, 3, 2, 1)
        );
        assert_eq!(
            got.to_string(),
            "3 of 3 voters healthy, quorum needs 2, fault tolerance 1"
        );
        let got = assess_cluster(&cluster(5, &[4]));
        assert_eq!(
            (got.voters, got.healthy, got.size, got.fault_tolerance),
            (5, 4, 3, 1)
        );
    }

    /// v1.13's TestTargetEtcdClusterHealthy cases.
    #[test]
    fn a_learner_blocks_removal() {
        let mut members = cluster(4, &[]);
        members[3].learner = true;
        let got = assess_removal(&members, 1);
        assert!(!got.is_safe());
        assert_eq!(got.voters, 2, "learners do not vote");
        assert!(got.blockers.contains(&Blocker::LearnerPresent {
            member: "m4-00000004".into()
        }));
        assert!(
            got.to_string()
                .contains("learner m4-00000004 has not been promoted yet"),
            "{got}"
        );
    }

    #[test]
    fn removing_the_learner_itself_is_not_blocked_by_it() {
        let mut members = cluster(4, &[]);
        members[3].learner = true;
        assert!(assess_removal(&members, 4).is_safe());
    }

    #[test]
    fn a_starting_member_blocks_removal() {
        let mut members = cluster(4, &[]);
        members[3].name.clear();
        let got = assess_removal(&members, 1);
        assert!(!got.is_safe());
        assert!(got.blockers.contains(&Blocker::StartingMember {
            id: "0000000000000004".into()
        }));
    }

    #[test]
    fn a_member_without_machine_with_an_alarm_counts_as_unhealthy() {
        // The mapping is irrelevant here: members are counted from their own probe.
        let mut members = cluster(3, &[]);
        members[2].alarms = vec!["NOSPACE".into()];
        let got = assess_removal(&members, 1);
        assert!(!got.is_safe());
        assert_eq!(
            got.unhealthy,
            vec![UnhealthyVoter {
                member: "m3-00000003".into(),
                reason: "alarm NOSPACE".into()
            }]
        );
    }

    #[test]
    fn quorum_lost_in_the_cluster_as_it_stands() {
        let got = assess_cluster(&cluster(3, &[2, 3]));
        assert!(!got.has_quorum());
        assert_eq!((got.voters, got.healthy, got.size), (3, 1, 2));
        assert!(
            got.to_string()
                .starts_with("1 of 3 voters healthy, quorum needs 2; unhealthy: m2-00000002"),
            "{got}"
        );
        assert!(assess_cluster(&cluster(3, &[3])).has_quorum());
        // A learner blocks removals but does not cost quorum.
        let mut members = cluster(3, &[]);
        members[2].learner = true;
        let got = assess_cluster(&members);
        assert!(!got.is_safe() && got.has_quorum(), "{got}");
    }

    #[test]
    fn a_target_without_member_costs_nothing() {
        let got = assess_removal(&cluster(3, &[]), 42);
        assert!(got.is_safe());
        assert!(!got.target_is_member);
        assert_eq!((got.voters, got.healthy, got.size), (3, 3, 2));
    }
}
