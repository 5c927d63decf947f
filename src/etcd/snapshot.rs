//! The observed membership: every member, what its own endpoint said (or why
//! it said nothing), alarms, the leader, and the quorum views built from it.

use serde::Serialize;

use crate::quorum::{self, Assessment, MemberView};

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
    pub db_size: i64,
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

    #[test]
    fn find_by_name_or_16_hex_id() {
        let snap = snapshot(vec![member(0xabc, "cp-0-0a1b2c3d", 1)]);
        assert_eq!(snap.find("cp-0-0a1b2c3d").unwrap().id, 0xabc);
        assert_eq!(snap.find("0000000000000abc").unwrap().id, 0xabc);
        assert!(snap.find("abc").is_none(), "ids are 16 hex digits");
        assert!(snap.find("cp-0").is_none(), "names match exactly");
    }
}
