//! The observed membership: every member, what its own endpoint said (or why
//! it said nothing), alarms, the leader, and the quorum views built from it.

use serde::Serialize;

use crate::quorum::{self, Assessment, MemberView};
use crate::space_rule::{ClusterSpace, ConfiguredQuota, MemberSpace, QuotaSource, Sizes};

/// What a member's own endpoint answered to `Status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberStatus {
    /// The leader this member believes in (0 = none).
    #[serde(serialize_with = "hex_id")]
    pub leader: u64,
    pub raft_term: u64,
    pub raft_index: u64,
    pub raft_applied_index: u64,
    /// The backend file, free pages included: what the quota is checked against.
    pub db_size: i64,
    /// What is in use of it (`dbSizeInUse`, etcd >= 3.4): what a
    /// defragmentation would leave.
    pub db_size_in_use: i64,
    /// The member's quota (`dbSizeQuota`), reported from etcd 3.6 on; 0 before.
    pub db_size_quota: i64,
    /// The store's revision (the response header's).
    pub revision: i64,
    pub version: String,
    /// Errors the member reported about itself (e.g. "NOSPACE").
    pub errors: Vec<String>,
    pub is_learner: bool,
}

/// One member as listed, plus the probe of its own endpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberSnapshot {
    #[serde(serialize_with = "hex_id")]
    pub id: u64,
    /// Empty while the member has not started.
    pub name: String,
    #[serde(rename = "peerURLs")]
    pub peer_urls: Vec<String>,
    #[serde(rename = "clientURLs")]
    pub client_urls: Vec<String>,
    pub learner: bool,
    /// The status its own endpoint answered, when it answered.
    pub status: Option<MemberStatus>,
    /// Why the probe failed (unreachable, timeout, TLS...), when it failed.
    pub probe_error: Option<String>,
    /// Active alarms raised against this member (`NOSPACE`, `CORRUPT`).
    pub alarms: Vec<String>,
}

impl MemberSnapshot {
    /// A member as named in messages: its name, or its id while unnamed.
    pub fn label(&self) -> String {
        crate::quorum::member_label(self.id, &self.name)
    }

    /// Why this member is not healthy, as the quorum rule sees it.
    pub fn unhealthy_reason(&self) -> Option<String> {
        self.view().unhealthy_reason()
    }

    pub fn is_healthy(&self) -> bool {
        self.unhealthy_reason().is_none()
    }

    /// The quorum rule's view of this member.
    pub fn view(&self) -> MemberView {
        let probe_error = match (&self.probe_error, &self.status) {
            (Some(err), _) => Some(err.clone()),
            (None, Some(status)) if !status.errors.is_empty() => {
                Some(format!("reports errors: {}", status.errors.join(", ")))
            }
            (None, Some(_)) => None,
            (None, None) => Some("not probed".to_string()),
        };
        MemberView {
            id: self.id,
            name: self.name.clone(),
            learner: self.learner,
            probe_error,
            alarms: self.alarms.clone(),
        }
    }
}

/// Everything observed about the cluster at one moment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MembershipSnapshot {
    #[serde(serialize_with = "hex_id")]
    pub cluster_id: u64,
    /// The leader, as reported by the members that answered (highest term wins).
    #[serde(serialize_with = "opt_hex_id")]
    pub leader: Option<u64>,
    pub members: Vec<MemberSnapshot>,
    /// The endpoint that answered the member list.
    pub listed_by: String,
    /// Why alarms could not be read (they go through raft, so this happens
    /// when quorum is lost); the alarm lists are then unknown, not empty.
    pub alarms_error: Option<String>,
    /// Endpoints on the seeds that answered for another etcd cluster (e.g. a
    /// removed first server that restarted as a new one-member cluster, k3s
    /// T3): never used, reported.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub foreign_clusters: Vec<ForeignCluster>,
}

/// Another etcd cluster found on one of the seeds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ForeignCluster {
    /// The endpoint that answered for it.
    pub endpoint: String,
    #[serde(serialize_with = "hex_id")]
    pub cluster_id: u64,
    /// Its members' names, voters and learners.
    pub members: Vec<String>,
}

impl std::fmt::Display for ForeignCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} answers for etcd cluster {:016x} (members: {})",
            self.endpoint,
            self.cluster_id,
            self.members.join(", ")
        )
    }
}

impl MembershipSnapshot {
    /// The member to take a snapshot from: a started, healthy voter other
    /// than `excluding` (the member about to be removed) that does not lead
    /// (a snapshot reads the whole backend, which the leader can spare
    /// least), the most up to date first, then by name; the leader when it
    /// is the only one. NOSPACE does not stop a snapshot (a read).
    pub fn snapshot_source(&self, excluding: Option<u64>) -> Option<&MemberSnapshot> {
        let snap = self;
        let view = snap.ignoring_nospace();
        let eligible = |m: &&MemberSnapshot| {
            Some(m.id) != excluding
                && view
                    .member(m.id)
                    .is_some_and(|v| v.snapshot_refusal().is_none())
        };
        let index = |m: &MemberSnapshot| m.status.as_ref().map_or(0, |s| s.raft_index);
        let best = |leader: bool| {
            snap.members
                .iter()
                .filter(eligible)
                .filter(|m| (Some(m.id) == snap.leader) == leader)
                .max_by(|a, b| index(a).cmp(&index(b)).then_with(|| b.name.cmp(&a.name)))
        };
        best(false).or_else(|| best(true))
    }
}

impl MemberSnapshot {
    /// Why this member cannot be the source of a snapshot.
    pub fn snapshot_refusal(&self) -> Option<String> {
        let member = self;
        if member.name.is_empty() || member.client_urls.is_empty() {
            return Some("it has not started (no name or client URL yet)".into());
        }
        if member.learner {
            return Some("it is a learner, which may lag behind the voters".into());
        }
        member
            .unhealthy_reason()
            .map(|why| format!("it is not healthy ({why})"))
    }
}

impl MembershipSnapshot {
    pub fn member(&self, id: u64) -> Option<&MemberSnapshot> {
        self.members.iter().find(|m| m.id == id)
    }

    pub fn member_by_name(&self, name: &str) -> Option<&MemberSnapshot> {
        self.members
            .iter()
            .find(|m| !m.name.is_empty() && m.name == name)
    }

    /// Find a member by exact name, or by id written as 16 hex digits.
    pub fn find(&self, name_or_id: &str) -> Option<&MemberSnapshot> {
        self.member_by_name(name_or_id)
            .or_else(|| parse_member_id(name_or_id).and_then(|id| self.member(id)))
    }

    pub fn leader_member(&self) -> Option<&MemberSnapshot> {
        self.leader.and_then(|id| self.member(id))
    }

    /// The quorum rule's input.
    pub fn member_views(&self) -> Vec<MemberView> {
        self.members.iter().map(MemberSnapshot::view).collect()
    }

    /// The cluster as it stands.
    pub fn assess_cluster(&self) -> Assessment {
        quorum::assess_cluster(&self.member_views())
    }

    /// Whether removing member `id` keeps quorum.
    pub fn assess_removal(&self, id: u64) -> Assessment {
        quorum::assess_removal(&self.member_views(), id)
    }

    /// A healthy voter other than `target` to hand leadership to: the most
    /// up-to-date raft index first, then the name for a stable choice.
    pub fn choose_transferee(&self, target: u64) -> Option<&MemberSnapshot> {
        self.members
            .iter()
            .filter(|m| m.id != target && !m.learner && m.is_healthy() && !m.name.is_empty())
            .max_by(|a, b| {
                let index = |m: &MemberSnapshot| m.status.as_ref().map_or(0, |s| s.raft_index);
                index(a).cmp(&index(b)).then_with(|| b.name.cmp(&a.name))
            })
    }
}

/// The alarm that fills the backend.
pub const NOSPACE: &str = "NOSPACE";

/// Whether an error a member reports in its `Status` is a `NOSPACE` alarm:
/// etcd lists every active alarm of the cluster in every member's `Status`
/// errors (`memberID:<id> alarm:NOSPACE `), so one full member makes every
/// member report it.
pub fn is_nospace_error(error: &str) -> bool {
    error.contains("alarm:NOSPACE")
}

impl MembershipSnapshot {
    /// Whether a `NOSPACE` alarm is active: listed against a member, or
    /// reported in a member's `Status` errors.
    pub fn nospace(&self) -> bool {
        self.members.iter().any(|m| {
            m.alarms.iter().any(|a| a == NOSPACE)
                || m.status
                    .as_ref()
                    .is_some_and(|s| s.errors.iter().any(|e| is_nospace_error(e)))
        })
    }

    /// The snapshot with `NOSPACE` left out of every member's reported errors
    /// and alarms. Under `NOSPACE` every member reports the alarm, so every
    /// voter counts unhealthy and quorum lost; that stays the verdict for
    /// removals, but repairing the space needs the health apart from it: a
    /// `NOSPACE` cluster still commits compactions, alarm changes and
    /// leadership moves.
    pub fn ignoring_nospace(&self) -> MembershipSnapshot {
        let mut snap = self.clone();
        for m in &mut snap.members {
            m.alarms.retain(|a| a != NOSPACE);
            if let Some(status) = m.status.as_mut() {
                status.errors.retain(|e| !is_nospace_error(e));
            }
        }
        snap
    }

    /// The cluster as the space rule sees it: each member's sizes from its
    /// own `Status`, its quota (its own if it reports one, else `configured`),
    /// its health apart from `NOSPACE`, and any learner or unstarted member as
    /// a membership change in flight. The history is not read here.
    pub fn space(&self, configured: &ConfiguredQuota) -> ClusterSpace {
        let healthy_view = self.ignoring_nospace();
        let configured_quota = configured.resolve();
        let members = self
            .members
            .iter()
            .zip(&healthy_view.members)
            .map(|(m, h)| {
                let reported = m.status.as_ref().map_or(0, |s| s.db_size_quota).max(0) as u64;
                let (quota, quota_source) = if reported > 0 {
                    (Some(reported), QuotaSource::Reported)
                } else {
                    match &configured_quota {
                        Ok((q, source)) => (Some(*q), *source),
                        Err(_) => (None, QuotaSource::Annotation),
                    }
                };
                MemberSpace {
                    id: m.id,
                    label: m.label(),
                    leader: self.leader == Some(m.id),
                    learner: m.learner,
                    sizes: m.status.as_ref().map(|s| Sizes {
                        db_size: s.db_size.max(0) as u64,
                        in_use: s.db_size_in_use.max(0) as u64,
                    }),
                    quota,
                    quota_source,
                    problem: h.unhealthy_reason(),
                    nospace: m.alarms.iter().any(|a| a == NOSPACE),
                    measured: false,
                }
            })
            .collect::<Vec<_>>();
        let quota_error = match &configured_quota {
            Err(why) if members.iter().any(|m| m.quota.is_none()) => Some(why.clone()),
            _ => None,
        };
        let busy = self.members.iter().find_map(|m| {
            if m.name.is_empty() {
                Some(format!(
                    "member {:016x} has been added but has not started",
                    m.id
                ))
            } else if m.learner {
                Some(format!("learner {} has not been promoted yet", m.name))
            } else {
                None
            }
        });
        ClusterSpace {
            nospace: self.nospace(),
            members,
            alarms_unknown: self.alarms_error.clone(),
            quota_error,
            history: None,
            busy,
        }
    }
}

/// Parse a member id written as exactly 16 hex digits.
pub fn parse_member_id(text: &str) -> Option<u64> {
    if text.len() == 16 && text.chars().all(|c| c.is_ascii_hexdigit()) {
        u64::from_str_radix(text, 16).ok()
    } else {
        None
    }
}

fn hex_id<S: serde::Serializer>(id: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{id:016x}"))
}

fn opt_hex_id<S: serde::Serializer>(id: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
    match id {
        Some(id) => hex_id(id, s),
        None => s.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: u64, name: &str, index: u64) -> MemberSnapshot {
        MemberSnapshot {
            id,
            name: name.into(),
            peer_urls: vec![],
            client_urls: vec![],
            learner: false,
            status: Some(MemberStatus {
                leader: 1,
                raft_term: 2,
                raft_index: index,
                raft_applied_index: index,
                db_size: 0,
                db_size_in_use: 0,
                db_size_quota: 0,
                revision: 0,
                version: "3.4.23".into(),
                errors: vec![],
                is_learner: false,
            }),
            probe_error: None,
            alarms: vec![],
        }
    }

    fn snapshot(members: Vec<MemberSnapshot>) -> MembershipSnapshot {
        MembershipSnapshot {
            cluster_id: 7,
            leader: Some(1),
            members,
            listed_by: "x".into(),
            alarms_error: None,
            foreign_clusters: Vec::new(),
        }
    }

    #[test]
    fn transferee_is_the_most_up_to_date_healthy_voter() {
        let mut down = member(4, "cp-3-00000004", 99);
        down.probe_error = Some("connection refused".into());
        down.status = None;
        let mut learner = member(5, "cp-4-00000005", 100);
        learner.learner = true;
        let snap = snapshot(vec![
            member(1, "cp-0-00000001", 50),
            member(2, "cp-1-00000002", 40),
            member(3, "cp-2-00000003", 45),
            down,
            learner,
        ]);
        assert_eq!(snap.choose_transferee(1).unwrap().id, 3);
        assert_eq!(snap.choose_transferee(3).unwrap().id, 1);
    }

    #[test]
    fn reported_errors_and_alarms_make_a_member_unhealthy() {
        let mut m = member(1, "a", 1);
        m.status.as_mut().unwrap().errors = vec!["NOSPACE".into()];
        assert!(!m.is_healthy());
        let mut m = member(1, "a", 1);
        m.alarms = vec!["CORRUPT".into()];
        assert_eq!(m.unhealthy_reason().unwrap(), "alarm CORRUPT");
    }

    /// etcd 3.4 under NOSPACE: every member reports the alarm in its
    /// `Status` errors, the full one also has it listed against it.
    fn nospace_snapshot() -> MembershipSnapshot {
        let mut members = vec![
            member(1, "cp-0-00000001", 50),
            member(2, "cp-1-00000002", 50),
            member(3, "cp-2-00000003", 50),
        ];
        for m in &mut members {
            let status = m.status.as_mut().unwrap();
            status.errors = vec!["memberID:3 alarm:NOSPACE ".into()];
            status.db_size = 4_000_000;
            status.db_size_in_use = 1_000_000;
        }
        members[2].alarms = vec![NOSPACE.into()];
        snapshot(members)
    }

    #[test]
    fn nospace_makes_every_voter_unhealthy_but_not_for_the_space_rule() {
        let snap = nospace_snapshot();
        assert!(snap.nospace());
        // Removals keep the conservative verdict.
        assert!(!snap.assess_cluster().has_quorum());
        // Repairing the space sees the health apart from NOSPACE.
        let repaired = snap.ignoring_nospace();
        assert!(repaired.assess_cluster().has_quorum());
        assert!(repaired.members.iter().all(|m| m.is_healthy()));
        let space = snap.space(&ConfiguredQuota::Default(4 << 20));
        assert!(space.nospace);
        assert_eq!(
            space.members.iter().map(|m| m.nospace).collect::<Vec<_>>(),
            [false, false, true]
        );
        assert!(space.members.iter().all(|m| m.problem.is_none()));
        assert!(space.members[0].leader);
        assert_eq!(
            space.members[2].sizes,
            Some(Sizes {
                db_size: 4_000_000,
                in_use: 1_000_000
            })
        );
        assert_eq!(space.members[2].quota, Some(4 << 20));
        assert_eq!(space.members[2].quota_source, QuotaSource::Default);
        assert_eq!(space.busy, None);
    }

    #[test]
    fn other_alarms_and_errors_still_count_for_the_space_rule() {
        let mut snap = nospace_snapshot();
        snap.members[1].alarms = vec!["CORRUPT".into()];
        snap.members[0]
            .status
            .as_mut()
            .unwrap()
            .errors
            .push("etcdserver: no leader".into());
        let space = snap.space(&ConfiguredQuota::Default(4 << 20));
        assert_eq!(space.members[1].problem.as_deref(), Some("alarm CORRUPT"));
        assert_eq!(
            space.members[0].problem.as_deref(),
            Some("reports errors: etcdserver: no leader")
        );
    }

    #[test]
    fn a_reported_quota_wins_and_a_bad_annotation_is_said() {
        let mut snap = nospace_snapshot();
        snap.members[0].status.as_mut().unwrap().db_size_quota = 8 << 30;
        let space = snap.space(&ConfiguredQuota::Invalid("annotation x: \"big\"".into()));
        assert_eq!(space.members[0].quota, Some(8 << 30));
        assert_eq!(space.members[0].quota_source, QuotaSource::Reported);
        assert_eq!(space.members[1].quota, None);
        assert_eq!(space.quota_error.as_deref(), Some("annotation x: \"big\""));
        let space = snap.space(&ConfiguredQuota::Annotation(1 << 30));
        assert_eq!(space.members[1].quota_source, QuotaSource::Annotation);
        assert_eq!(space.quota_error, None);
    }

    #[test]
    fn a_learner_is_a_membership_change_in_flight() {
        let mut learner = member(4, "cp-3-00000004", 50);
        learner.learner = true;
        let snap = snapshot(vec![member(1, "cp-0-00000001", 50), learner]);
        let space = snap.space(&ConfiguredQuota::Default(1 << 30));
        assert_eq!(
            space.busy.as_deref(),
            Some("learner cp-3-00000004 has not been promoted yet")
        );
        assert!(!space.nospace);
    }

    #[test]
    fn find_by_name_or_16_hex_id() {
        let snap = snapshot(vec![member(0xabc, "cp-0-0a1b2c3d", 1)]);
        assert_eq!(snap.find("cp-0-0a1b2c3d").unwrap().id, 0xabc);
        assert_eq!(snap.find("0000000000000abc").unwrap().id, 0xabc);
        assert!(snap.find("abc").is_none(), "ids are 16 hex digits");
        assert!(snap.find("cp-0").is_none(), "names match exactly");
    }
}
