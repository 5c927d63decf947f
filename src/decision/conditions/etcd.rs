//! `EtcdClusterHealthy` and `EtcdSpaceHealthy` on the KThreesControlPlane,
//! `EtcdMemberHealthy` on each Machine: the embedded etcd as read now.

use crate::api::condition_names::{
    ETCD_CLUSTER_HEALTHY, ETCD_MEMBER_HEALTHY, ETCD_SPACE_HEALTHY, etcd_cluster_healthy,
    etcd_member_healthy, etcd_space_healthy,
};
use crate::etcd::MemberSnapshot;
use crate::remediation::model::MemberMissing;
use crate::remediation::orphans::OrphanDecision;
use crate::space_rule::SpaceDecision;

use super::super::plan::Plan;
use super::super::world::{EtcdObservation, World};
use super::{Value, value};

/// What `EtcdClusterHealthy` adds to the quorum arithmetic.
#[derive(Clone, Debug, Default)]
pub struct EtcdClusterNotes<'a> {
    /// Members no Machine claims (they count in the quorum).
    pub members_without_machine: Vec<String>,
    /// The ghost/orphan member rule's verdict, when there is a plan.
    pub orphans: Option<&'a OrphanDecision>,
    /// A Node carrying k3s's etcd marks although `spec.externalDatastore`
    /// is set.
    pub embedded_despite_external: Option<&'a str>,
    /// How etcd was reached (`direct`, `port-forward ...`).
    pub transport: Option<&'a str>,
}

impl<'a> EtcdClusterNotes<'a> {
    pub fn of(world: &'a World, plan: Option<&'a Plan>) -> Self {
        EtcdClusterNotes {
            members_without_machine: plan
                .and_then(|p| p.mapping.as_ref())
                .map(|m| {
                    m.members_without_machine
                        .iter()
                        .map(|r| r.label())
                        .collect()
                })
                .unwrap_or_default(),
            orphans: plan.map(|p| &p.orphans),
            embedded_despite_external: (!world.kcp.etcd_is_embedded())
                .then(|| world.embedded_etcd_node())
                .flatten()
                .map(|n| n.name.as_str()),
            transport: world.etcd_transport.as_deref(),
        }
    }
}

/// `EtcdClusterHealthy`: True when every member is healthy, the quorum is
/// safe and the alarms could be read; Unknown while etcd is not ours or
/// not read, saying why.
pub fn etcd_cluster_healthy(etcd: &EtcdObservation, notes: &EtcdClusterNotes) -> Value {
    let snapshot = match etcd {
        EtcdObservation::NotManaged => {
            return value(
                ETCD_CLUSTER_HEALTHY,
                None,
                etcd_cluster_healthy::REASON_ETCD_NOT_MANAGED,
                "spec.externalDatastore is set and no workload Node shows embedded etcd: no etcd of ours",
            );
        }
        EtcdObservation::NoCredentials { reason } => {
            return value(
                ETCD_CLUSTER_HEALTHY,
                None,
                etcd_cluster_healthy::REASON_ETCD_CREDENTIALS_UNAVAILABLE,
                reason.clone(),
            );
        }
        EtcdObservation::Unreachable { reason } => {
            return value(
                ETCD_CLUSTER_HEALTHY,
                None,
                etcd_cluster_healthy::REASON_ETCD_UNREACHABLE,
                reason.clone(),
            );
        }
        EtcdObservation::Observed(snapshot) => snapshot,
    };
    let assessment = snapshot.assess_cluster();
    let mut message = assessment.to_string();
    if !notes.members_without_machine.is_empty() {
        message.push_str(&format!(
            "; members without a Machine (counted): {}",
            notes.members_without_machine.join(", ")
        ));
    }
    if let Some(OrphanDecision::Wait { member, reason }) = notes.orphans {
        message.push_str(&format!("; {member} is not removed yet: {reason}"));
    }
    if let Some(err) = &snapshot.alarms_error {
        message.push_str(&format!("; alarms could not be read: {err}"));
    }
    if let Some(node) = notes.embedded_despite_external {
        message.push_str(&format!(
            "; spec.externalDatastore is set, but Node {node} carries k3s's etcd marks: \
             etcd is managed"
        ));
    }
    // Direct is the plain case (inspect and the metric say it);
    // a tunnel is worth telling where the health is read.
    if let Some(transport) = notes.transport.filter(|t| t.starts_with("port-forward")) {
        message.push_str(&format!("; reached by {transport}"));
    }
    let healthy =
        assessment.unhealthy.is_empty() && assessment.is_safe() && snapshot.alarms_error.is_none();
    let reason = if healthy {
        etcd_cluster_healthy::REASON_HEALTHY
    } else {
        etcd_cluster_healthy::REASON_UNHEALTHY
    };
    value(ETCD_CLUSTER_HEALTHY, Some(healthy), reason, message)
}

/// `EtcdSpaceHealthy`, with `run --etcd-space-care` only (`care`; absent
/// without): False while NOSPACE is raised, with what the space rule does or
/// why it cannot; True otherwise, its reason saying whether a routine
/// defragmentation runs or waits; Unknown while etcd is not read
/// (`decision` is `None`).
pub fn etcd_space_healthy(care: bool, decision: Option<&SpaceDecision>) -> Option<Value> {
    if !care {
        return None;
    }
    let Some(decision) = decision else {
        return Some(value(
            ETCD_SPACE_HEALTHY,
            None,
            etcd_space_healthy::REASON_ETCD_NOT_READ,
            "etcd was not read this time (see EtcdClusterHealthy)",
        ));
    };
    let recovery = decision.is_recovery();
    let reason = match decision {
        SpaceDecision::Fine { .. } => etcd_space_healthy::REASON_HEALTHY,
        SpaceDecision::Act { .. } if recovery => {
            etcd_space_healthy::REASON_RECOVERING_FROM_NO_SPACE
        }
        SpaceDecision::Act { .. } => etcd_space_healthy::REASON_DEFRAGMENTING,
        SpaceDecision::Blocked { .. } if recovery => etcd_space_healthy::REASON_NO_SPACE,
        SpaceDecision::Blocked { why, .. } if why.is_wait() => {
            etcd_space_healthy::REASON_DEFRAGMENTATION_WAITING
        }
        SpaceDecision::Blocked { .. } => etcd_space_healthy::REASON_DEFRAGMENTATION_BLOCKED,
    };
    let message = match decision {
        SpaceDecision::Fine { message } => message.clone(),
        other => other.to_string(),
    };
    Some(value(ETCD_SPACE_HEALTHY, Some(!recovery), reason, message))
}

/// `EtcdMemberHealthy` of one Machine: its member's health (`member`, from
/// the mapping); without one, whether its Node shows embedded etcd
/// (`missing`) and for how long.
pub fn etcd_member_healthy(
    member: Option<&MemberSnapshot>,
    missing: Option<&MemberMissing>,
) -> Value {
    let since = |m: &MemberMissing| m.since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    match (member, missing) {
        (Some(m), _) => match m.unhealthy_reason() {
            None => value(
                ETCD_MEMBER_HEALTHY,
                Some(true),
                etcd_member_healthy::REASON_HEALTHY,
                format!("member {} is healthy", m.label()),
            ),
            Some(why) => value(
                ETCD_MEMBER_HEALTHY,
                Some(false),
                etcd_member_healthy::REASON_UNHEALTHY,
                format!("member {}: {why}", m.label()),
            ),
        },
        (None, Some(missing)) if missing.confirmed => value(
            ETCD_MEMBER_HEALTHY,
            Some(false),
            etcd_member_healthy::REASON_ETCD_MEMBER_MISSING,
            format!(
                "Node {} shows embedded etcd ({}) but no etcd member maps to it since {}: \
                 its member was removed or evicted",
                missing.node,
                missing.marks,
                since(missing)
            ),
        ),
        (None, Some(missing)) => value(
            ETCD_MEMBER_HEALTHY,
            None,
            etcd_member_healthy::REASON_WAITING_FOR_ETCD_MEMBER,
            format!(
                "Node {} shows embedded etcd ({}) but no etcd member maps to it since {}; \
                 a restarting server rejoins as a learner within the grace period",
                missing.node,
                missing.marks,
                since(missing)
            ),
        ),
        (None, None) => value(
            ETCD_MEMBER_HEALTHY,
            None,
            etcd_member_healthy::REASON_NO_ETCD_MEMBER,
            "no etcd member maps to this Machine and its Node shows no embedded etcd \
             (a server without etcd, or no Node yet)",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_facts::{member, observed, snapshot};
    use super::*;
    use crate::space_rule::{Blocked, SpaceStep};

    #[test]
    fn etcd_cluster_healthy_condition() {
        let healthy = || observed(vec![member(1, None), member(2, None), member(3, None)]);
        let one_down = observed(vec![
            member(1, None),
            member(2, None),
            member(3, Some("connection refused")),
        ]);
        let mut alarms_unread = snapshot(vec![member(1, None)]);
        alarms_unread.alarms_error = Some("context deadline exceeded".into());
        let orphan_waits = OrphanDecision::Wait {
            member: "ghost-1".into(),
            reason: "first seen 1m ago".into(),
        };
        let plain = EtcdClusterNotes::default();
        let cases = [
            (
                "an external datastore",
                EtcdObservation::NotManaged,
                plain.clone(),
                None,
                etcd_cluster_healthy::REASON_ETCD_NOT_MANAGED,
                "no etcd of ours",
            ),
            (
                "no client certificate",
                EtcdObservation::NoCredentials {
                    reason: "Secret ns/c-etcd not found".into(),
                },
                plain.clone(),
                None,
                etcd_cluster_healthy::REASON_ETCD_CREDENTIALS_UNAVAILABLE,
                "Secret ns/c-etcd not found",
            ),
            (
                "no member answered",
                EtcdObservation::Unreachable {
                    reason: "connection refused".into(),
                },
                plain.clone(),
                None,
                etcd_cluster_healthy::REASON_ETCD_UNREACHABLE,
                "connection refused",
            ),
            (
                "every member healthy, reached through a tunnel",
                healthy(),
                EtcdClusterNotes {
                    transport: Some("port-forward pod/etcd-relay"),
                    ..plain.clone()
                },
                Some(true),
                etcd_cluster_healthy::REASON_HEALTHY,
                "; reached by port-forward pod/etcd-relay",
            ),
            (
                "reached directly, which goes unsaid",
                healthy(),
                EtcdClusterNotes {
                    transport: Some("direct"),
                    ..plain.clone()
                },
                Some(true),
                etcd_cluster_healthy::REASON_HEALTHY,
                "",
            ),
            (
                "a member is down",
                one_down,
                plain.clone(),
                Some(false),
                etcd_cluster_healthy::REASON_UNHEALTHY,
                "",
            ),
            (
                "alarms could not be read",
                EtcdObservation::Observed(alarms_unread),
                plain.clone(),
                Some(false),
                etcd_cluster_healthy::REASON_UNHEALTHY,
                "; alarms could not be read: context deadline exceeded",
            ),
            (
                "healthy, with notes on members and marks",
                healthy(),
                EtcdClusterNotes {
                    members_without_machine: vec!["ghost-1".into()],
                    orphans: Some(&orphan_waits),
                    embedded_despite_external: Some("node-1"),
                    transport: None,
                },
                Some(true),
                etcd_cluster_healthy::REASON_HEALTHY,
                "; members without a Machine (counted): ghost-1; ghost-1 is not removed yet: \
                 first seen 1m ago; spec.externalDatastore is set, but Node node-1 carries \
                 k3s's etcd marks: etcd is managed",
            ),
        ];
        for (name, etcd, notes, status, reason, message) in cases {
            let got = etcd_cluster_healthy(&etcd, &notes);
            assert_eq!(got.type_, ETCD_CLUSTER_HEALTHY, "{name}");
            assert_eq!((got.status, got.reason), (status, reason), "{name}");
            assert!(got.message.contains(message), "{name}: {}", got.message);
            if notes.transport == Some("direct") {
                assert!(
                    !got.message.contains("reached by"),
                    "{name}: {}",
                    got.message
                );
            }
        }
    }

    #[test]
    fn etcd_space_healthy_condition() {
        let fine = SpaceDecision::Fine {
            message: "every member has room".into(),
        };
        let act = |recovery| SpaceDecision::Act {
            step: SpaceStep::Compact { revision: 42 },
            recovery,
            message: "compacting".into(),
        };
        let blocked = |why, recovery| SpaceDecision::Blocked {
            why,
            recovery,
            message: "not now".into(),
        };
        let cases = [
            (
                "routine, nothing to do",
                Some(fine),
                Some(true),
                etcd_space_healthy::REASON_HEALTHY,
                "every member has room",
            ),
            (
                "a routine defragmentation runs",
                Some(act(false)),
                Some(true),
                etcd_space_healthy::REASON_DEFRAGMENTING,
                "compacting (etcd-space.compact)",
            ),
            (
                "recovering from NOSPACE",
                Some(act(true)),
                Some(false),
                etcd_space_healthy::REASON_RECOVERING_FROM_NO_SPACE,
                "compacting (etcd-space.compact)",
            ),
            (
                "NOSPACE and nothing may be done",
                Some(blocked(Blocked::NotEnoughRoom, true)),
                Some(false),
                etcd_space_healthy::REASON_NO_SPACE,
                "not now (etcd-space.blocked.not-enough-room)",
            ),
            (
                "a routine defragmentation waits for a membership change",
                Some(blocked(Blocked::MembershipChange, false)),
                Some(true),
                etcd_space_healthy::REASON_DEFRAGMENTATION_WAITING,
                "not now (etcd-space.wait.membership-change)",
            ),
            (
                "a routine defragmentation is blocked",
                Some(blocked(Blocked::UnhealthyMember, false)),
                Some(true),
                etcd_space_healthy::REASON_DEFRAGMENTATION_BLOCKED,
                "not now (etcd-space.blocked.unhealthy-member)",
            ),
            (
                "etcd was not read",
                None,
                None,
                etcd_space_healthy::REASON_ETCD_NOT_READ,
                "etcd was not read this time",
            ),
        ];
        for (name, decision, status, reason, message) in cases {
            let got = etcd_space_healthy(true, decision.as_ref()).expect(name);
            assert_eq!(got.type_, ETCD_SPACE_HEALTHY, "{name}");
            assert_eq!((got.status, got.reason), (status, reason), "{name}");
            assert!(got.message.contains(message), "{name}: {}", got.message);
        }
        // Without `run --etcd-space-care` the condition is not ours to write.
        assert_eq!(etcd_space_healthy(false, None), None);
        assert_eq!(
            etcd_space_healthy(false, Some(&act(true))),
            None,
            "not even during NOSPACE"
        );
    }

    #[test]
    fn etcd_member_healthy_condition() {
        let since = chrono::DateTime::parse_from_rfc3339("2024-05-01T10:00:00Z")
            .unwrap()
            .with_timezone(&chrono::Utc);
        let missing = |confirmed| MemberMissing {
            node: "node-2".into(),
            marks: "EtcdIsVoter=False".into(),
            since,
            confirmed,
        };
        let healthy = member(1, None);
        let down = member(2, Some("connection refused"));
        let cases = [
            (
                "its member is healthy",
                Some(&healthy),
                None,
                Some(true),
                etcd_member_healthy::REASON_HEALTHY,
                "member cp-0-00000001 is healthy",
            ),
            (
                "its member does not answer",
                Some(&down),
                None,
                Some(false),
                etcd_member_healthy::REASON_UNHEALTHY,
                "member cp-1-00000002: ",
            ),
            (
                "its member is gone past the grace period",
                None,
                Some(missing(true)),
                Some(false),
                etcd_member_healthy::REASON_ETCD_MEMBER_MISSING,
                "Node node-2 shows embedded etcd (EtcdIsVoter=False) but no etcd member maps to it since 2024-05-01T10:00:00Z: its member was removed",
            ),
            (
                "its member is gone within the grace period",
                None,
                Some(missing(false)),
                None,
                etcd_member_healthy::REASON_WAITING_FOR_ETCD_MEMBER,
                "since 2024-05-01T10:00:00Z; a restarting server rejoins",
            ),
            (
                "no member and no sign of etcd",
                None,
                None,
                None,
                etcd_member_healthy::REASON_NO_ETCD_MEMBER,
                "its Node shows no embedded etcd",
            ),
        ];
        for (name, member, missing, status, reason, message) in cases {
            let got = etcd_member_healthy(member, missing.as_ref());
            assert_eq!(got.type_, ETCD_MEMBER_HEALTHY, "{name}");
            assert_eq!((got.status, got.reason), (status, reason), "{name}");
            assert!(got.message.contains(message), "{name}: {}", got.message);
        }
    }
}
