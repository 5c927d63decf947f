//! Which unhealthy machine to remediate first: the most broken one.
//!
//! CAPI KCP's `pickMachineToBeRemediated` order (v1.10+): a machine with the
//! `cluster.x-k8s.io/remediate-machine` annotation; then one without a nodeRef
//! (provisioning failed, nothing else can be known); then one whose etcd member
//! is unhealthy (managed etcd only); then one whose control-plane components are
//! not known healthy; ties go to the oldest, then the name. Remediating the most
//! broken machine first gives the replacement the best chance to join.

use std::cmp::Ordering;
use std::fmt;

use super::model::{ControlPlaneView, MachineView};

/// Why the picked machine came first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PickReason {
    OnlyCandidate,
    RemediateAnnotation,
    NoNodeRef,
    EtcdMemberUnhealthy,
    ComponentsUnhealthy,
    Oldest,
}

impl fmt::Display for PickReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PickReason::OnlyCandidate => "the only machine to remediate",
            PickReason::RemediateAnnotation => {
                "it has the cluster.x-k8s.io/remediate-machine annotation"
            }
            PickReason::NoNodeRef => "it has no node (provisioning failed)",
            PickReason::EtcdMemberUnhealthy => "its etcd member is unhealthy",
            PickReason::ComponentsUnhealthy => "its control-plane components are not healthy",
            PickReason::Oldest => "it is the oldest",
        })
    }
}

/// The criteria in priority order; `true` means "more broken".
fn criteria(view: &ControlPlaneView, m: &MachineView) -> [(bool, PickReason); 4] {
    [
        (m.remediate_requested, PickReason::RemediateAnnotation),
        (m.node_ref.is_none(), PickReason::NoNodeRef),
        (
            view.etcd_managed() && view.etcd_member_unhealthy(m),
            PickReason::EtcdMemberUnhealthy,
        ),
        (
            m.components_healthy != Some(true),
            PickReason::ComponentsUnhealthy,
        ),
    ]
}

/// Compare two candidates: `Less` means `a` is remediated before `b`; also
/// returns the criterion that decided.
fn compare(view: &ControlPlaneView, a: &MachineView, b: &MachineView) -> (Ordering, PickReason) {
    for ((a_broken, reason), (b_broken, _)) in criteria(view, a).into_iter().zip(criteria(view, b))
    {
        match (a_broken, b_broken) {
            (true, false) => return (Ordering::Less, reason),
            (false, true) => return (Ordering::Greater, reason),
            _ => {}
        }
    }
    (a.age_key().cmp(&b.age_key()), PickReason::Oldest)
}

/// Pick the machine to remediate among `candidates` (all of them ours to
/// remediate); `None` when there are none.
pub fn pick_machine_to_remediate<'a>(
    view: &ControlPlaneView,
    candidates: &[&'a MachineView],
) -> Option<(&'a MachineView, PickReason)> {
    let first = *candidates.iter().min_by(|a, b| compare(view, a, b).0)?;
    if candidates.len() == 1 {
        return Some((first, PickReason::OnlyCandidate));
    }
    // The decisive criterion is the strongest one that set it apart from the runner-up.
    let reason = candidates
        .iter()
        .filter(|m| m.name != first.name)
        .map(|other| compare(view, first, other).1)
        .min_by_key(|r| *r as u8)
        .unwrap_or(PickReason::Oldest);
    Some((first, reason))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quorum::MemberView;
    use crate::remediation::model::{EtcdState, Membership, RemediationStrategy};
    use chrono::{DateTime, TimeZone, Utc};

    fn t(min: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2024, 5, 1, 10, min, 0).unwrap()
    }

    fn view(machines: Vec<MachineView>, unhealthy_members: &[u64]) -> ControlPlaneView {
        let members = machines
            .iter()
            .filter_map(|m| m.etcd_member)
            .map(|id| MemberView {
                id,
                name: format!("member-{id}"),
                learner: false,
                probe_error: unhealthy_members
                    .contains(&id)
                    .then(|| "connection refused".to_string()),
                alarms: vec![],
            })
            .collect();
        ControlPlaneView {
            name: "cp".into(),
            initialized: true,
            desired_replicas: 3,
            strategy: RemediationStrategy::default(),
            remediation_in_progress: None,
            etcd: EtcdState::Observed(Membership {
                members,
                leader: None,
            }),
            failure_domains: vec![],
            pending_topology_version: None,
            machines,
        }
    }

    fn machine(name: &str, created: u32, member: u64) -> MachineView {
        let mut m = MachineView::new(name, t(created));
        m.etcd_member = Some(member);
        m.components_healthy = Some(true);
        m
    }

    fn pick(view: &ControlPlaneView) -> (String, PickReason) {
        let candidates: Vec<&MachineView> = view.machines.iter().collect();
        let (m, reason) = pick_machine_to_remediate(view, &candidates).unwrap();
        (m.name.clone(), reason)
    }

    /// Upstream TestGetMachineToBeRemediated, case by case.
    #[test]
    fn returns_the_machine_with_remediate_machine_annotation_first() {
        let mut m1 = machine("m1", 0, 1);
        m1.remediate_requested = true;
        let mut m2 = machine("m2", 1, 2);
        m2.node_ref = None;
        m2.components_healthy = Some(false);
        let v = view(vec![m2, m1], &[2]);
        assert_eq!(pick(&v), ("m1".into(), PickReason::RemediateAnnotation));
    }

    #[test]
    fn returns_provisioning_machines_first() {
        let mut m1 = machine("m1", 0, 1);
        m1.components_healthy = Some(false);
        let mut m2 = machine("m2", 1, 2);
        m2.node_ref = None;
        let v = view(vec![m1, m2], &[1]);
        assert_eq!(pick(&v), ("m2".into(), PickReason::NoNodeRef));
    }

    #[test]
    fn returns_the_machine_with_etcd_errors_first_if_none_is_provisioning() {
        let mut m1 = machine("m1", 0, 1);
        m1.components_healthy = Some(false);
        let m2 = machine("m2", 1, 2);
        let v = view(vec![m1, m2], &[2]);
        assert_eq!(pick(&v), ("m2".into(), PickReason::EtcdMemberUnhealthy));
    }

    #[test]
    fn returns_the_machine_with_api_server_errors_first_if_no_etcd_issue() {
        let m1 = machine("m1", 0, 1);
        let mut m2 = machine("m2", 1, 2);
        m2.components_healthy = Some(false);
        let v = view(vec![m1, m2], &[]);
        assert_eq!(pick(&v), ("m2".into(), PickReason::ComponentsUnhealthy));
    }

    #[test]
    fn returns_the_oldest_machine_if_nothing_else_sets_them_apart() {
        let m1 = machine("m1", 0, 1);
        let m2 = machine("m2", 1, 2);
        let v = view(vec![m2, m1], &[]);
        assert_eq!(pick(&v), ("m1".into(), PickReason::Oldest));
    }

    #[test]
    fn equal_age_goes_to_the_name() {
        let b = machine("b", 0, 1);
        let a = machine("a", 0, 2);
        let v = view(vec![b, a], &[]);
        assert_eq!(pick(&v), ("a".into(), PickReason::Oldest));
    }

    #[test]
    fn a_machine_without_etcd_member_has_no_etcd_issue() {
        // m1 runs k3s with --disable-etcd: no member, nothing wrong with etcd there.
        let mut m1 = machine("m1", 0, 1);
        m1.etcd_member = None;
        let m2 = machine("m2", 1, 2);
        let v = view(vec![m1, m2], &[2]);
        assert_eq!(pick(&v), ("m2".into(), PickReason::EtcdMemberUnhealthy));
    }

    #[test]
    fn a_machine_whose_node_shows_etcd_without_a_member_has_an_etcd_issue() {
        // m2's member was removed or evicted; k3s kept the etcd marks on its Node.
        let m1 = machine("m1", 0, 1);
        let mut m2 = machine("m2", 1, 2);
        m2.etcd_member = None;
        m2.etcd_member_missing = Some(crate::remediation::model::MemberMissing {
            node: "node-m2".into(),
            marks: "EtcdIsVoter=False (NotAMember)".into(),
            since: t(0),
            confirmed: true,
        });
        let v = view(vec![m1, m2], &[]);
        assert_eq!(pick(&v), ("m2".into(), PickReason::EtcdMemberUnhealthy));
    }

    #[test]
    fn etcd_health_is_ignored_when_etcd_is_not_managed() {
        let m1 = machine("m1", 0, 1);
        let m2 = machine("m2", 1, 2);
        let mut v = view(vec![m1, m2], &[2]);
        v.etcd = EtcdState::NotManaged;
        assert_eq!(pick(&v), ("m1".into(), PickReason::Oldest));
    }

    #[test]
    fn unknown_component_health_counts_as_a_problem() {
        let m1 = machine("m1", 0, 1);
        let mut m2 = machine("m2", 1, 2);
        m2.components_healthy = None;
        let v = view(vec![m1, m2], &[]);
        assert_eq!(pick(&v), ("m2".into(), PickReason::ComponentsUnhealthy));
    }
}
