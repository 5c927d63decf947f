//! Ghost and orphan etcd members, removed when nothing can claim them and
//! quorum allows, as cluster-api-k3s's `reconcileEtcdMembers` does, with its
//! gaps closed:
//! - a **ghost** is a member added but never started (a k3s join that failed):
//!   etcd lists it without a name; as a voter it counts against quorum, and any
//!   unnamed member blocks every removal;
//! - an **orphan** is a named member that no Machine and no workload Node
//!   claims (its server was deleted without its member being removed).
//!
//! Neither is touched while a Machine is provisioning (its member may be the
//! one joining) or deleting (its member is being removed by the steps), before
//! the member has been seen for a grace period, or when removing it would
//! break quorum. One member per reconcile. Pure.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::quorum::{Assessment, MemberView, assess_removal, member_label};

use super::model::ControlPlaneView;

/// What the orphan rule reads besides the control-plane view.
#[derive(Clone, Debug, Default)]
pub struct OrphanInput {
    /// Members no Machine maps to (ids).
    pub members_without_machine: Vec<u64>,
    /// Member names some workload Node claims (k3s annotation or name prefix).
    pub claimed_by_nodes: Vec<String>,
    /// Member name -> its Node, which is Terminating (claims nothing: k3s's
    /// finalizer removes the member, and holds the Node while it cannot).
    pub terminating_nodes: BTreeMap<String, String>,
    /// Why the workload Nodes were not read in this pass, if they were not:
    /// then no Node can be said to claim nothing, and nothing is removed.
    pub nodes_unread: Option<String>,
    /// When this controller first saw each member id.
    pub first_seen: BTreeMap<u64, DateTime<Utc>>,
    pub grace: Duration,
}

/// The orphan rule's verdict.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "decision", rename_all = "kebab-case")]
pub enum OrphanDecision {
    /// No ghost or orphan member.
    None,
    /// There is one, but it may not be removed now; why.
    Wait { member: String, reason: String },
    /// Remove this member.
    Remove {
        member: u64,
        label: String,
        kind: &'static str,
        assessment: Assessment,
    },
}

fn kind(member: &MemberView) -> &'static str {
    if member.name.is_empty() {
        "ghost (added, never started)"
    } else {
        "orphan (no Machine, no Node)"
    }
}

/// Decide on ghost and orphan members.
pub fn decide_orphans(
    view: &ControlPlaneView,
    input: &OrphanInput,
    now: DateTime<Utc>,
) -> OrphanDecision {
    let Some(membership) = view.membership() else {
        return OrphanDecision::None;
    };
    let mut candidates: Vec<&MemberView> = membership
        .members
        .iter()
        .filter(|m| input.members_without_machine.contains(&m.id))
        .filter(|m| m.name.is_empty() || !input.claimed_by_nodes.contains(&m.name))
        .collect();
    if candidates.is_empty() {
        return OrphanDecision::None;
    }
    // Ghosts first (they block every removal), then unhealthy ones, then by id.
    candidates.sort_by_key(|m| (!m.name.is_empty(), m.unhealthy_reason().is_none(), m.id));
    let target = candidates[0];
    let label = member_label(target.id, &target.name);
    let terminating = input.terminating_nodes.get(&target.name).map(|node| {
        format!(
            "; its Node {node} is Terminating, held by k3s's finalizer {} until the member \
             is gone",
            crate::api::names::K3S_ETCD_NODE_FINALIZER
        )
    });
    let wait = |reason: String| OrphanDecision::Wait {
        member: format!("{label}, {}", kind(target)),
        reason: format!("{reason}{}", terminating.as_deref().unwrap_or_default()),
    };
    if !view.initialized {
        return wait("the control plane is not initialized".into());
    }
    if let Some(reason) = &input.nodes_unread {
        return wait(format!(
            "the workload Nodes were not read in this pass ({reason}): a Node may claim it"
        ));
    }
    if let Some(m) = view
        .machines
        .iter()
        .find(|m| m.node_ref.is_none() && !m.is_deleting())
    {
        return wait(format!(
            "Machine {} is provisioning: its member may be the one joining",
            m.name
        ));
    }
    if let Some(m) = view.machines.iter().find(|m| m.is_deleting()) {
        return wait(format!("Machine {} is deleting", m.name));
    }
    let seen = input.first_seen.get(&target.id).copied().unwrap_or(now);
    let seen_for = (now - seen).to_std().unwrap_or_default();
    if seen_for < input.grace {
        return wait(format!(
            "seen for {}s of the {}s grace period",
            seen_for.as_secs(),
            input.grace.as_secs()
        ));
    }
    let assessment = assess_removal(&membership.members, target.id);
    if !assessment.is_safe() {
        return wait(format!("removal is not safe: {assessment}"));
    }
    OrphanDecision::Remove {
        member: target.id,
        label,
        kind: kind(target),
        assessment,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remediation::model::{EtcdState, MachineView, Membership, RemediationStrategy};

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-12-01T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    fn member(id: u64, name: &str, healthy: bool) -> MemberView {
        MemberView {
            id,
            name: name.into(),
            learner: false,
            probe_error: (!healthy).then(|| "connection refused".to_string()),
            alarms: vec![],
        }
    }

    fn machine(name: &str, node: bool) -> MachineView {
        let mut m = MachineView::new(name, now() - chrono::Duration::hours(1));
        m.node_ref = node.then(|| name.to_string());
        m
    }

    fn view(members: Vec<MemberView>, machines: Vec<MachineView>) -> ControlPlaneView {
        ControlPlaneView {
            name: "kcp".into(),
            initialized: true,
            desired_replicas: 3,
            strategy: RemediationStrategy::default(),
            remediation_in_progress: None,
            etcd: EtcdState::Observed(Membership {
                members,
                leader: Some(1),
            }),
            failure_domains: vec![],
            pending_topology_version: None,
            machines,
        }
    }

    fn three_with(extra: MemberView) -> ControlPlaneView {
        view(
            vec![
                member(1, "cp-0-aaaaaaaa", true),
                member(2, "cp-1-bbbbbbbb", true),
                member(3, "cp-2-cccccccc", true),
                extra,
            ],
            vec![
                machine("cp-0", true),
                machine("cp-1", true),
                machine("cp-2", true),
            ],
        )
    }

    fn input(without: Vec<u64>, seen_ago: i64) -> OrphanInput {
        OrphanInput {
            members_without_machine: without.clone(),
            claimed_by_nodes: vec![],
            terminating_nodes: BTreeMap::new(),
            nodes_unread: None,
            first_seen: without
                .iter()
                .map(|id| (*id, now() - chrono::Duration::seconds(seen_ago)))
                .collect(),
            grace: Duration::from_secs(60),
        }
    }

    /// The workload API is down (an expired certificate, an upgrade that
    /// crash-loops): an unread Node list is no proof that no Node claims the
    /// member. A healthy etcd-only server's member must survive it.
    #[test]
    fn an_orphan_is_not_removed_when_the_nodes_were_not_read_in_this_pass() {
        let mut unread = input(vec![9], 3600);
        unread.nodes_unread = Some("connection refused".into());
        let view = three_with(member(9, "etcd-only-0-dddddddd", true));
        match decide_orphans(&view, &unread, now()) {
            OrphanDecision::Wait { member, reason } => {
                assert!(member.starts_with("etcd-only-0-dddddddd"), "{member}");
                assert!(
                    reason
                        .contains("workload Nodes were not read in this pass (connection refused)"),
                    "{reason}"
                );
            }
            other => panic!("expected a wait, got {other:?}"),
        }
        // Read in this pass and claimed by no Node: it goes.
        assert!(matches!(
            decide_orphans(&view, &input(vec![9], 3600), now()),
            OrphanDecision::Remove { member: 9, .. }
        ));
    }

    #[test]
    fn a_ghost_seen_past_the_grace_period_is_removed() {
        let d = decide_orphans(
            &three_with(member(9, "", false)),
            &input(vec![9], 120),
            now(),
        );
        match d {
            OrphanDecision::Remove {
                member,
                kind,
                assessment,
                ..
            } => {
                assert_eq!(member, 9);
                assert!(kind.starts_with("ghost"));
                assert_eq!((assessment.voters, assessment.healthy), (3, 3));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn table_of_reasons_to_wait() {
        let ghost = || member(9, "", false);
        let mut provisioning = three_with(ghost());
        provisioning.machines.push(machine("cp-3", false));
        let mut deleting = three_with(ghost());
        deleting.machines[0].deleting = Some(now());
        let mut not_initialized = three_with(ghost());
        not_initialized.initialized = false;
        // Removing the orphan would leave 1 of 2 healthy voters.
        let unsafe_view = view(
            vec![
                member(1, "cp-0-aaaaaaaa", true),
                member(2, "cp-1-bbbbbbbb", false),
                member(3, "old-x-dddddddd", true),
            ],
            vec![machine("cp-0", true), machine("cp-1", true)],
        );
        let cases: Vec<(&str, ControlPlaneView, OrphanInput, &str)> = vec![
            (
                "within the grace period",
                three_with(ghost()),
                input(vec![9], 10),
                "grace period",
            ),
            (
                "a Machine is provisioning (its member may be joining)",
                provisioning,
                input(vec![9], 120),
                "provisioning",
            ),
            (
                "a Machine is deleting",
                deleting,
                input(vec![9], 120),
                "deleting",
            ),
            (
                "not initialized",
                not_initialized,
                input(vec![9], 120),
                "not initialized",
            ),
            (
                "removal would lose quorum",
                unsafe_view,
                input(vec![3], 120),
                "not safe",
            ),
        ];
        for (situation, view, input, needle) in cases {
            match decide_orphans(&view, &input, now()) {
                OrphanDecision::Wait { reason, .. } => {
                    assert!(reason.contains(needle), "{situation}: {reason}")
                }
                other => panic!("{situation}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_member_a_node_claims_is_not_an_orphan() {
        let extra = member(9, "manual-3-dddddddd", true);
        let mut claimed = input(vec![9], 120);
        claimed.claimed_by_nodes = vec!["manual-3-dddddddd".into()];
        assert_eq!(
            decide_orphans(&three_with(extra.clone()), &claimed, now()),
            OrphanDecision::None
        );
        let unclaimed = input(vec![9], 120);
        assert!(matches!(
            decide_orphans(&three_with(extra), &unclaimed, now()),
            OrphanDecision::Remove { kind, .. } if kind.starts_with("orphan")
        ));
    }

    /// A member whose Node is Terminating (k3s's finalizer could not remove
    /// it, e.g. while quorum was lost) is claimed by nothing: it is removed
    /// once quorum allows, and a wait says why the Node still stands.
    #[test]
    fn a_member_of_a_terminating_node_is_an_orphan_and_the_wait_names_the_node() {
        let extra = member(9, "gone-3-dddddddd", true);
        let mut terminating = input(vec![9], 120);
        terminating
            .terminating_nodes
            .insert("gone-3-dddddddd".into(), "gone-3".into());
        assert!(matches!(
            decide_orphans(&three_with(extra.clone()), &terminating, now()),
            OrphanDecision::Remove { member: 9, .. }
        ));
        let mut early = terminating.clone();
        early
            .first_seen
            .insert(9, now() - chrono::Duration::seconds(10));
        match decide_orphans(&three_with(extra), &early, now()) {
            OrphanDecision::Wait { reason, .. } => assert!(
                reason.contains("grace period")
                    && reason.contains("Node gone-3 is Terminating")
                    && reason.contains("wrangler.cattle.io/managed-etcd-controller"),
                "{reason}"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn nothing_without_a_membership_or_candidates() {
        let mut v = three_with(member(9, "", false));
        assert_eq!(
            decide_orphans(&v, &input(vec![], 120), now()),
            OrphanDecision::None
        );
        v.etcd = EtcdState::NotManaged;
        assert_eq!(
            decide_orphans(&v, &input(vec![9], 120), now()),
            OrphanDecision::None
        );
    }
}
