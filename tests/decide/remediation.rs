//! MHC remediation decisions, case by case: every case of CAPI KCP's
//! remediation_test.go (v1.10 / v1.11 `TestReconcileUnhealthyMachines` and
//! `TestReconcileUnhealthyMachinesSequences`, v1.13 `TestCanSafelyRemediateMachine`,
//! `TestTargetEtcdClusterHealthy` removal cases and `TestTargetK8sControlPlaneHealthy`
//! removal cases) expressed with a REAL etcd membership, plus the cases upstream
//! cannot express (control-plane nodes without etcd, members without Machine).
//!
//! Upstream case -> our test (U = TestReconcileUnhealthyMachines, S = ...Sequences,
//! C = TestCanSafelyRemediateMachine, E = TestTargetEtcdClusterHealthy,
//! K = TestTargetK8sControlPlaneHealthy, G = TestGetMachineToBeRemediated):
//!  U1  It cleans up stuck remediation on previously unhealthy machines -> stale_owner_remediated_is_cleaned_up
//!  U2  Remediation does not happen if there are no unhealthy machines -> no_unhealthy_machine_means_nothing_to_do
//!  U3  return early if another remediation is in progress -> another_remediation_in_progress_blocks
//!  U4  RemediationInProgressAnnotation is cleaned up when stale and there are no machines to be remediated -> stale_in_progress_is_cleared_without_unhealthy_machines
//!  U5  remediation in progress is ignored when stale -> stale_in_progress_does_not_block
//!  U6  return early if the machine to be remediated is already being deleted -> target_already_deleting_is_skipped
//!  U7  return early if there is a pending topology upgrade -> pending_topology_upgrade_defers
//!  U8  Remediation does not happen if MaxRetry is reached -> max_retry_reached_refuses
//!  U9  Retry history is ignored if min healthy period is expired, default min healthy period -> retry_history_ignored_after_default_min_healthy_period
//!  U10 Retry history is ignored if min healthy period is expired -> retry_history_ignored_after_custom_min_healthy_period
//!  U11 Remediation does not happen if RetryPeriodSeconds is not yet passed -> retry_period_not_expired_defers
//!  U12 Remediation does not happen if desired replicas <= 1 -> single_initialized_machine_cannot_be_remediated
//!  U13 ... there is another machine being deleted -> other_machine_deleting_defers
//!  U14 ... there is an healthy machine being provisioned -> healthy_machine_provisioning_defers
//!  U15 ... healthy machine being provisioned - 4 CP (during 3 CP rolling upgrade) -> healthy_machine_provisioning_during_rollout_defers
//!  (ours) ... but the target's member is a dead voter and no member is joining: etcd refuses the
//!          provisioning Machine's MemberAdd until it is removed (CAPI issue #10125) -> a_dead_voter_blocks_the_provisioning_machines_join_so_it_is_remediated
//!  U16 ... at least one additional unhealthy etcd member on a 3 machine CP -> three_machines_one_more_unhealthy_member_refuses
//!  U17 ... at least two additional unhealthy etcd member on a 5 machine CP -> five_machines_two_more_unhealthy_members_refuses
//!  U18 Remediation deletes unhealthy machine - 1 CP not initialized -> first_machine_not_initialized_is_remediated
//!  U19 Subsequent remediation of the same machine increase retry count - 1 CP not initialized -> replacements_of_the_first_machine_count_retries
//!  U20 Remediation deletes unhealthy machine - 2 CP (during 1 CP rolling upgrade) -> two_machines_remediates_the_unhealthy_one
//!  U21 Remediation deletes unhealthy machine - 3 CP -> three_machines_remediates_the_unhealthy_one
//!  U22 Remediation deletes unhealthy machine failed to provision - 3 CP -> three_machines_remediates_one_that_failed_to_provision
//!  U23 Remediation deletes unhealthy machine - 4 CP (during 3 CP rolling upgrade) -> four_machines_remediates_the_unhealthy_one
//!  U24 Remediation deletes unhealthy machine failed to provision - 4 CP -> four_machines_remediates_one_that_failed_to_provision
//!  U25 Remediation fails gracefully if no healthy Control Planes are available to become etcd leader -> leader_target_without_healthy_transferee_refuses
//!  U26 Subsequent remediation of the same machine increase retry count - 3 CP -> replacement_in_three_machines_counts_retries
//!  S1  Remediates the first CP machine having problems to come up -> sequence_first_machine_fails_to_come_up
//!  S2  Remediates the second CP machine having problems to come up -> sequence_second_machine_fails_to_come_up
//!  S3  Remediates only one CP machine in case of multiple failures -> sequence_only_one_remediation_at_a_time
//!  C1  Can safely remediate when both target etcd cluster and k8s control plane will be healthy -> two_machines_remediates_the_unhealthy_one (+ safety_table "C1")
//!  C2  ... not possible to get a member for the machine being remediated -> safety_table "C2"
//!  C3  ... external etcd and k8s control plane will be healthy -> safety_table "C3"
//!  C4  Can't ... target k8s control plane will be in unhealthy state -> safety_table "C4"
//!  C5  Can't ... target etcd cluster will be in unhealthy state -> safety_table "C5"
//!  E1..E15, E17..E21 (removal cases, by name in safety_table) -> safety_table; the add-member cases are scale-up: not here
//!  R1..R11 v1.10 TestCanSafelyRemoveEtcdMember (1 CP; 2 CP without failure / target missing / one failure;
//!          3 CP without failure / target missing / one failure; 5 CP <2 / 2 failures; 7 CP <3 / 3 failures)
//!          -> safety_table E1, E2, E3, E4, E5, E6, E7, E10, E12, E13, E15
//!  v1.10's 44 cases = G1-G5, U1-U3, U5-U26, S1-S3, R1-R11; U4, C*, E8/E9/E11/E14, E17-E21, K* are v1.13's.
//!  K1, K2 (removal cases) -> safety_table
//!  G1..G5 -> src/remediation/pick.rs tests (returns_the_machine_with_remediate_machine_annotation_first, ...)

use chrono::{DateTime, Duration, TimeZone, Utc};
use k3s_control_plane::api::condition_names::owner_remediated::{
    REASON_CANNOT_BE_REMEDIATED, REASON_INTERNAL_ERROR, REASON_MACHINE_DELETING,
    REASON_REMEDIATION_DEFERRED,
};
use k3s_control_plane::quorum::MemberView;
use k3s_control_plane::remediation::{
    ControlPlaneView, EtcdState, MachineView, Membership, Outcome, RemediationData,
    RemediationDecision, RemediationStrategy, Rule, decide_remediation,
};

fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2024, 5, 1, 12, 0, 0).unwrap()
}

/// Machines are created a minute apart, m1 first.
fn created(i: u64) -> DateTime<Utc> {
    now() - Duration::hours(3) + Duration::minutes(i as i64)
}

/// A healthy machine `m<i>` with member `i` (healthy components, MHC not failed).
fn healthy(i: u64) -> MachineView {
    let mut m = MachineView::new(&format!("m{i}"), created(i));
    m.etcd_member = Some(i);
    m.components_healthy = Some(true);
    m
}

/// An MHC-unhealthy machine ours to remediate (no component conditions, as
/// upstream's `createMachine(..., withMachineHealthCheckFailed())`).
fn unhealthy(i: u64) -> MachineView {
    let mut m = MachineView::new(&format!("m{i}"), created(i));
    m.etcd_member = Some(i);
    m.health_check_succeeded = Some(false);
    m.owner_remediated = Some(false);
    m
}

fn member(id: u64) -> MemberView {
    MemberView::healthy_voter(id, format!("node-m{id}-{id:08x}"))
}

struct Cp {
    view: ControlPlaneView,
}

impl Cp {
    /// An initialized control plane whose membership is the machines' members
    /// (all healthy), led by `m1`'s member.
    fn new(machines: Vec<MachineView>) -> Self {
        let members = machines
            .iter()
            .filter_map(|m| m.etcd_member)
            .map(member)
            .collect();
        Cp {
            view: ControlPlaneView {
                name: "cp".into(),
                initialized: true,
                desired_replicas: machines.len() as u32,
                strategy: RemediationStrategy::default(),
                remediation_in_progress: None,
                etcd: EtcdState::Observed(Membership {
                    members,
                    leader: Some(1),
                }),
                failure_domains: vec![],
                pending_topology_version: None,
                machines,
            },
        }
    }
    fn not_initialized(mut self) -> Self {
        self.view.initialized = false;
        self
    }
    fn replicas(mut self, n: u32) -> Self {
        self.view.desired_replicas = n;
        self
    }
    fn strategy(mut self, s: RemediationStrategy) -> Self {
        self.view.strategy = s;
        self
    }
    fn membership(&mut self) -> &mut Membership {
        match &mut self.view.etcd {
            EtcdState::Observed(m) => m,
            _ => panic!("etcd not observed"),
        }
    }
    /// The members with these ids fail their probe.
    fn members_down(mut self, ids: &[u64]) -> Self {
        for m in &mut self.membership().members {
            if ids.contains(&m.id) {
                m.probe_error = Some("context deadline exceeded".into());
            }
        }
        self
    }
    /// Drop these members from the membership (the machines keep their mapping).
    fn members_missing(mut self, ids: &[u64]) -> Self {
        self.membership().members.retain(|m| !ids.contains(&m.id));
        self
    }
    fn add_member(mut self, m: MemberView) -> Self {
        self.membership().members.push(m);
        self
    }
    fn leader(mut self, id: Option<u64>) -> Self {
        self.membership().leader = id;
        self
    }
    fn in_progress(mut self, data: RemediationData) -> Self {
        self.view.remediation_in_progress = Some(data);
        self
    }
    fn decide(&self) -> RemediationDecision {
        decide_remediation(&self.view, now())
    }
}

fn data(machine: &str, at: DateTime<Utc>, retry_count: u32) -> RemediationData {
    RemediationData {
        machine: machine.into(),
        timestamp: Some(at),
        retry_count,
    }
}

#[track_caller]
fn assert_remediates<'a>(
    d: &'a RemediationDecision,
    machine: &str,
    retry_count: u32,
) -> &'a k3s_control_plane::remediation::Remediate {
    assert_eq!(d.rule, Rule::Remediate, "{}", d.message);
    let Outcome::Remediate(r) = &d.outcome else {
        panic!("expected remediation, got {:?}", d.outcome)
    };
    assert_eq!(r.machine, machine, "{}", d.message);
    assert_eq!(r.retry.machine, machine);
    assert_eq!(r.retry.retry_count, retry_count, "{}", d.message);
    assert_eq!(r.retry.timestamp, Some(now()));
    let (m, cond) = d.owner_remediated().unwrap();
    assert_eq!(
        (m, cond.reason, cond.message.as_str()),
        (machine, REASON_MACHINE_DELETING, "Machine is deleting")
    );
    r
}

#[track_caller]
fn assert_waits(d: &RemediationDecision, machine: &str, rule: Rule, reason: &str, text: &str) {
    assert_eq!(d.rule, rule, "{}", d.message);
    assert!(
        matches!(&d.outcome, Outcome::Wait { machine: m, .. } if m == machine),
        "{:?}",
        d.outcome
    );
    let (m, cond) = d.owner_remediated().unwrap();
    assert_eq!((m, cond.reason), (machine, reason));
    assert!(
        cond.message.contains(text),
        "{:?} does not contain {text:?}",
        cond.message
    );
    let kcp = d.kcp_remediating();
    assert!(kcp.status);
    assert_eq!(kcp.reason, "Remediating");
}

// ---- generic preflight ----------------------------------------------------

#[test]
fn stale_owner_remediated_is_cleaned_up() {
    let mut m1 = healthy(1);
    m1.health_check_succeeded = Some(true);
    m1.owner_remediated = Some(false);
    let mut deleting = healthy(2);
    deleting.health_check_succeeded = Some(true);
    deleting.owner_remediated = Some(false);
    deleting.deleting = Some(now());
    let d = Cp::new(vec![m1, deleting, healthy(3)]).decide();
    assert_eq!(
        d.cleanup_owner_remediated,
        vec!["m1".to_string()],
        "deleting machines are left alone"
    );
    assert_eq!(d.rule, Rule::NoMachineToRemediate);
    assert_eq!(d.outcome, Outcome::Idle);
}

#[test]
fn no_unhealthy_machine_means_nothing_to_do() {
    let d = Cp::new(vec![]).decide();
    assert_eq!(
        (d.rule, &d.outcome),
        (Rule::NoMachineToRemediate, &Outcome::Idle)
    );
    assert_eq!(d.owner_remediated(), None);
    let kcp = d.kcp_remediating();
    assert_eq!((kcp.status, kcp.reason), (false, "NotRemediating"));
}

#[test]
fn externally_remediated_machines_are_not_ours() {
    let mut m1 = unhealthy(1);
    m1.externally_remediated = true;
    let d = Cp::new(vec![m1, healthy(2), healthy(3)]).decide();
    assert_eq!(d.rule, Rule::NoMachineToRemediate);
}

#[test]
fn unhealthy_machine_without_owner_remediated_is_not_ours() {
    let mut m1 = unhealthy(1);
    m1.owner_remediated = None;
    let d = Cp::new(vec![m1, healthy(2), healthy(3)]).decide();
    assert_eq!(d.rule, Rule::NoMachineToRemediate);
}

#[test]
fn another_remediation_in_progress_blocks() {
    let d = Cp::new(vec![unhealthy(1)])
        .not_initialized()
        .in_progress(data("foo", now(), 0))
        .decide();
    assert_eq!(d.rule, Rule::AnotherRemediationInProgress);
    assert!(!d.clear_stale_in_progress);
    assert!(matches!(d.outcome, Outcome::Skip { .. }));
    assert_eq!(d.owner_remediated(), None, "the condition is left alone");
    assert!(d.message.contains("foo"), "{}", d.message);
}

#[test]
fn stale_in_progress_is_cleared_without_unhealthy_machines() {
    let d = Cp::new(vec![healthy(1)])
        .in_progress(data("foo", now() - Duration::days(1), 0))
        .decide();
    assert!(d.clear_stale_in_progress);
    assert_eq!(d.rule, Rule::NoMachineToRemediate);
}

#[test]
fn stale_in_progress_does_not_block() {
    let d = Cp::new(vec![unhealthy(1)])
        .not_initialized()
        .in_progress(data("foo", now() - Duration::days(1), 0))
        .decide();
    assert!(d.clear_stale_in_progress);
    assert_remediates(&d, "m1", 0);
}

#[test]
fn target_already_deleting_is_skipped() {
    let mut m1 = unhealthy(1);
    m1.deleting = Some(now());
    let d = Cp::new(vec![m1]).decide();
    assert_eq!(d.rule, Rule::TargetAlreadyDeleting);
    assert!(matches!(d.outcome, Outcome::Skip { .. }));
    assert_eq!(d.owner_remediated(), None);
}

#[test]
fn pending_topology_upgrade_defers() {
    let mut cp = Cp::new(vec![unhealthy(1), healthy(2), healthy(3)]);
    cp.view.pending_topology_version = Some("v1.31.1+k3s1".into());
    let d = cp.decide();
    assert_waits(
        &d,
        "m1",
        Rule::TopologyUpgradePending,
        REASON_REMEDIATION_DEFERRED,
        "waiting for a version upgrade to v1.31.1+k3s1 to be propagated from Cluster.spec.topology",
    );
}

// ---- retry limits -----------------------------------------------------------

fn remediated_before(mut m: MachineView, ago: Duration, retry_count: u32) -> MachineView {
    m.remediation_for = Some(data("m0", now() - ago, retry_count));
    m
}

#[test]
fn max_retry_reached_refuses() {
    let m1 = remediated_before(unhealthy(1), Duration::minutes(30), 3);
    let d = Cp::new(vec![m1, healthy(2), healthy(3)])
        .strategy(RemediationStrategy {
            max_retry: Some(3),
            ..Default::default()
        })
        .not_initialized()
        .decide();
    assert_waits(
        &d,
        "m1",
        Rule::MaxRetryReached,
        REASON_CANNOT_BE_REMEDIATED,
        "already failed 3 times (MaxRetry)",
    );
}

#[test]
fn retry_history_ignored_after_default_min_healthy_period() {
    let m1 = remediated_before(unhealthy(1), Duration::hours(2), 3);
    let d = Cp::new(vec![m1, healthy(2), healthy(3)])
        .strategy(RemediationStrategy {
            max_retry: Some(3),
            ..Default::default()
        })
        .not_initialized()
        .decide();
    assert_remediates(&d, "m1", 0);
}

#[test]
fn retry_history_ignored_after_custom_min_healthy_period() {
    let four_hours = std::time::Duration::from_secs(4 * 3600);
    let m1 = remediated_before(unhealthy(1), Duration::hours(8), 3);
    let d = Cp::new(vec![m1, healthy(2), healthy(3)])
        .strategy(RemediationStrategy {
            max_retry: Some(3),
            min_healthy_period: four_hours,
            ..Default::default()
        })
        .not_initialized()
        .decide();
    assert_remediates(&d, "m1", 0);
}

#[test]
fn retry_period_not_expired_defers() {
    let m1 = remediated_before(unhealthy(1), Duration::minutes(30), 2);
    let d = Cp::new(vec![m1, healthy(2), healthy(3)])
        .strategy(RemediationStrategy {
            max_retry: Some(3),
            retry_period: std::time::Duration::from_secs(3600),
            ..Default::default()
        })
        .not_initialized()
        .decide();
    assert_waits(
        &d,
        "m1",
        Rule::RetryPeriodNotExpired,
        REASON_REMEDIATION_DEFERRED,
        "already failed in the latest 1h0m0s (RetryPeriod)",
    );
}

// ---- preflight for an initialized control plane -------------------------------

#[test]
fn single_initialized_machine_cannot_be_remediated() {
    let d = Cp::new(vec![unhealthy(1)]).replicas(1).decide();
    assert_waits(
        &d,
        "m1",
        Rule::TooFewMachines,
        REASON_CANNOT_BE_REMEDIATED,
        "less or equal to 1 (1 machine)",
    );
}

#[test]
fn other_machine_deleting_defers() {
    let mut m3 = healthy(3);
    m3.deleting = Some(now());
    let d = Cp::new(vec![unhealthy(1), healthy(2), m3]).decide();
    assert_waits(
        &d,
        "m1",
        Rule::MachineDeleting,
        REASON_REMEDIATION_DEFERRED,
        "deletion to complete before triggering remediation (deleting: m3)",
    );
}

#[test]
fn healthy_machine_provisioning_defers() {
    let mut m3 = healthy(3);
    m3.node_ref = None;
    m3.etcd_member = None;
    let d = Cp::new(vec![unhealthy(1), healthy(2), m3]).decide();
    assert_waits(
        &d,
        "m1",
        Rule::MachineProvisioning,
        REASON_REMEDIATION_DEFERRED,
        "provisioning to complete before triggering remediation (no node yet: m3)",
    );
}

/// Cluster API issue #10125: 5 servers, 2 dead members; the first dead one
/// was replaced, but etcd refuses the replacement's MemberAdd while the other
/// dead member is a voter it cannot reach. Waiting for the replacement to get
/// a node would wait forever: the dead member's Machine is remediated (4
/// voters, 3 healthy: removing it leaves 3 of 3).
#[test]
fn a_dead_voter_blocks_the_provisioning_machines_join_so_it_is_remediated() {
    let mut m6 = healthy(6);
    m6.node_ref = None;
    m6.etcd_member = None;
    let d = Cp::new(vec![
        healthy(1),
        healthy(2),
        healthy(3),
        unhealthy(4),
        m6.clone(),
    ])
    .members_down(&[4])
    .decide();
    let r = assert_remediates(&d, "m4", 0);
    assert_eq!(r.member, Some(4));
    // While a member is joining (a learner, or added and not started), the
    // provisioning Machine is waited for, as before.
    for joining in [
        MemberView {
            learner: true,
            ..member(6)
        },
        MemberView {
            name: String::new(),
            ..member(6)
        },
    ] {
        let d = Cp::new(vec![
            healthy(1),
            healthy(2),
            healthy(3),
            unhealthy(4),
            m6.clone(),
        ])
        .members_down(&[4])
        .add_member(joining)
        .decide();
        assert_waits(
            &d,
            "m4",
            Rule::MachineProvisioning,
            REASON_REMEDIATION_DEFERRED,
            "no node yet: m6",
        );
    }
    // A target whose member answers (MHC-unhealthy for another reason) does
    // not block a join: the provisioning Machine is waited for.
    let d = Cp::new(vec![healthy(1), healthy(2), healthy(3), unhealthy(4), m6]).decide();
    assert_waits(
        &d,
        "m4",
        Rule::MachineProvisioning,
        REASON_REMEDIATION_DEFERRED,
        "no node yet: m6",
    );
}

#[test]
fn healthy_machine_provisioning_during_rollout_defers() {
    let mut m4 = healthy(4);
    m4.node_ref = None;
    m4.etcd_member = None;
    let d = Cp::new(vec![unhealthy(1), healthy(2), healthy(3), m4])
        .replicas(3)
        .decide();
    assert_waits(
        &d,
        "m1",
        Rule::MachineProvisioning,
        REASON_REMEDIATION_DEFERRED,
        "no node yet: m4",
    );
}

#[test]
fn three_machines_one_more_unhealthy_member_refuses() {
    let d = Cp::new(vec![unhealthy(1), healthy(2), healthy(3)])
        .members_down(&[2])
        .decide();
    assert_waits(
        &d,
        "m1",
        Rule::EtcdQuorumAtRisk,
        REASON_CANNOT_BE_REMEDIATED,
        "removing node-m1-00000001 would leave 1 of 2 voters healthy, quorum needs 2",
    );
}

#[test]
fn five_machines_two_more_unhealthy_members_refuses() {
    let machines = vec![unhealthy(1), healthy(2), healthy(3), healthy(4), healthy(5)];
    let d = Cp::new(machines).members_down(&[2, 3]).decide();
    assert_waits(
        &d,
        "m1",
        Rule::EtcdQuorumAtRisk,
        REASON_CANNOT_BE_REMEDIATED,
        "2 of 4 voters healthy, quorum needs 3",
    );
}

// ---- remediation ----------------------------------------------------------------

#[test]
fn first_machine_not_initialized_is_remediated() {
    let d = Cp::new(vec![unhealthy(1)])
        .replicas(1)
        .not_initialized()
        .decide();
    let r = assert_remediates(&d, "m1", 0);
    assert_eq!(
        (r.member, r.transferee, &r.assessment),
        (None, None, &None),
        "no etcd step before initialization"
    );
}

#[test]
fn replacements_of_the_first_machine_count_retries() {
    // The replacement of m1 fails too, then its replacement: retries 1 and 2.
    let mut record = data("m1", now() - Duration::minutes(20), 0);
    for (i, expected_retry) in [(2u64, 1u32), (3, 2)] {
        let mut mi = unhealthy(i);
        mi.created = record.timestamp.unwrap() + Duration::minutes(1);
        mi.remediation_for = Some(record.clone());
        let d = Cp::new(vec![mi]).replicas(1).not_initialized().decide();
        let r = assert_remediates(&d, &format!("m{i}"), expected_retry);
        record = RemediationData {
            timestamp: Some(now() - Duration::minutes(10)),
            ..r.retry.clone()
        };
    }
}

#[test]
fn two_machines_remediates_the_unhealthy_one() {
    let d = Cp::new(vec![unhealthy(1), healthy(2)]).decide();
    let r = assert_remediates(&d, "m1", 0);
    assert_eq!((r.member, r.transferee), (Some(1), Some(2)));
    let a = r.assessment.as_ref().unwrap();
    assert_eq!((a.voters, a.healthy, a.size), (1, 1, 1));
    assert!(
        d.message
            .contains("removing node-m1-00000001 leaves 1 of 1 voters healthy, quorum needs 1"),
        "{}",
        d.message
    );
    assert!(
        d.message.contains("leadership goes to node-m2-00000002"),
        "{}",
        d.message
    );
}

#[test]
fn three_machines_remediates_the_unhealthy_one() {
    let d = Cp::new(vec![unhealthy(1), healthy(2), healthy(3)]).decide();
    let r = assert_remediates(&d, "m1", 0);
    assert_eq!(
        r.transferee,
        Some(3),
        "the newest healthy machine's member, as upstream"
    );
    let a = r.assessment.as_ref().unwrap();
    assert_eq!((a.voters, a.healthy, a.size), (2, 2, 2));
}

#[test]
fn three_machines_remediates_one_that_failed_to_provision() {
    let mut m1 = unhealthy(1);
    m1.node_ref = None;
    m1.etcd_member = None;
    let d = Cp::new(vec![m1, healthy(2), healthy(3)])
        .leader(Some(2))
        .decide();
    let r = assert_remediates(&d, "m1", 0);
    assert_eq!(
        (r.member, r.transferee),
        (None, None),
        "no member: no etcd step"
    );
    assert!(!r.assessment.as_ref().unwrap().target_is_member);
}

#[test]
fn four_machines_remediates_the_unhealthy_one() {
    let d = Cp::new(vec![unhealthy(1), healthy(2), healthy(3), healthy(4)]).decide();
    let r = assert_remediates(&d, "m1", 0);
    assert_eq!(r.transferee, Some(4));
    let a = r.assessment.as_ref().unwrap();
    assert_eq!((a.voters, a.healthy, a.size), (3, 3, 2));
}

#[test]
fn four_machines_remediates_one_that_failed_to_provision() {
    let mut m1 = unhealthy(1);
    m1.node_ref = None;
    m1.etcd_member = None;
    let d = Cp::new(vec![m1, healthy(2), healthy(3), healthy(4)])
        .leader(Some(3))
        .decide();
    let r = assert_remediates(&d, "m1", 0);
    assert_eq!(r.member, None);
}

#[test]
fn leader_target_without_healthy_transferee_refuses() {
    // Every other machine is MHC-unhealthy too: their members are healthy voters,
    // but they are about to be remediated themselves, so none takes leadership.
    let mut others: Vec<MachineView> = (2..=4).map(unhealthy).collect();
    for m in &mut others {
        m.components_healthy = Some(true);
    }
    let mut machines = vec![unhealthy(1)];
    machines.extend(others);
    let d = Cp::new(machines).decide();
    assert_waits(
        &d,
        "m1",
        Rule::NoLeadershipTransferee,
        REASON_CANNOT_BE_REMEDIATED,
        "it is the etcd leader and there is no healthy etcd member to take leadership",
    );
}

#[test]
fn replacement_in_three_machines_counts_retries() {
    let mut m5 = unhealthy(5);
    m5.remediation_for = Some(data("m1", now() - Duration::minutes(10), 0));
    let d = Cp::new(vec![m5, healthy(2), healthy(3)])
        .leader(Some(2))
        .decide();
    let r = assert_remediates(&d, "m5", 1);
    assert_eq!(r.transferee, Some(3));
}

// ---- sequences ----------------------------------------------------------------------

#[test]
fn sequence_first_machine_fails_to_come_up() {
    // Not initialized: m1 is remediated, then its replacement m2 (retry 1).
    let d = Cp::new(vec![unhealthy(1)])
        .replicas(3)
        .not_initialized()
        .decide();
    let first = assert_remediates(&d, "m1", 0).retry.clone();
    let mut m2 = unhealthy(2);
    m2.created = now() + Duration::minutes(1);
    m2.remediation_for = Some(first);
    let later = now() + Duration::minutes(5);
    let d = decide_remediation(&Cp::new(vec![m2]).replicas(3).not_initialized().view, later);
    let Outcome::Remediate(r) = &d.outcome else {
        panic!("{:?}", d.outcome)
    };
    assert_eq!((r.machine.as_str(), r.retry.retry_count), ("m2", 1));
}

#[test]
fn sequence_second_machine_fails_to_come_up() {
    let d = Cp::new(vec![healthy(1), unhealthy(2)]).replicas(3).decide();
    let first = assert_remediates(&d, "m2", 0);
    assert_eq!(first.transferee, Some(1));
    let mut m3 = unhealthy(3);
    m3.created = now() + Duration::minutes(1);
    m3.remediation_for = Some(first.retry.clone());
    let d = decide_remediation(
        &Cp::new(vec![healthy(1), m3]).replicas(3).view,
        now() + Duration::minutes(5),
    );
    let Outcome::Remediate(r) = &d.outcome else {
        panic!("{:?}", d.outcome)
    };
    assert_eq!((r.machine.as_str(), r.retry.retry_count), ("m3", 1));
}

#[test]
fn sequence_only_one_remediation_at_a_time() {
    let mut m2 = unhealthy(2);
    let mut m3 = unhealthy(3);
    m2.components_healthy = Some(true);
    m3.components_healthy = Some(true);
    let cp = Cp::new(vec![healthy(1), m2, m3.clone()]).leader(Some(2));
    let d = cp.decide();
    let r = assert_remediates(&d, "m2", 0);
    assert_eq!(
        r.transferee,
        Some(1),
        "m3 is MHC-unhealthy: not a leadership candidate"
    );
    // Next reconcile: m2 is gone, the KCP records its remediation: m3 waits.
    let d = Cp::new(vec![healthy(1), m3])
        .in_progress(r.retry.clone())
        .decide();
    assert_eq!(d.rule, Rule::AnotherRemediationInProgress);
}

// ---- safety: upstream TestCanSafelyRemediateMachine / TestTargetEtcdClusterHealthy /
// TestTargetK8sControlPlaneHealthy, removal cases, each through decide_remediation() -------------

#[test]
fn safety_table() {
    struct Case {
        name: &'static str,
        cp: Cp,
        /// `None`: remediation goes ahead; otherwise the refusing rule.
        refused: Option<Rule>,
    }
    let n = |count: u64| -> Vec<MachineView> {
        let mut v = vec![unhealthy(1)];
        v.extend((2..=count).map(healthy));
        v
    };
    let no_member_target = {
        let mut v = n(2);
        v[0].etcd_member = None;
        v
    };
    let cases = vec![
        Case {
            name: "C1 both target etcd cluster and k8s control plane healthy",
            cp: Cp::new(n(2)),
            refused: None,
        },
        Case {
            name: "C2 no member found for the machine being remediated",
            cp: Cp::new(no_member_target),
            refused: None,
        },
        Case {
            name: "C3 external (unmanaged) etcd and healthy k8s control plane",
            cp: {
                let mut cp = Cp::new(n(2));
                cp.view.etcd = EtcdState::NotManaged;
                cp
            },
            refused: None,
        },
        Case {
            name: "C4/K2 target k8s control plane unhealthy (no other healthy components)",
            cp: {
                let mut cp = Cp::new(n(2));
                cp.view.machines[1].components_healthy = Some(false);
                cp
            },
            refused: Some(Rule::NoHealthyControlPlaneLeft),
        },
        Case {
            name: "C5 target etcd cluster unhealthy",
            cp: Cp::new(n(2)).members_down(&[2]),
            refused: Some(Rule::EtcdQuorumAtRisk),
        },
        Case {
            name: "K1 at least one k8s control plane stays healthy",
            cp: Cp::new(n(3)).leader(Some(2)),
            refused: None,
        },
        Case {
            name: "E1 one Machine",
            cp: Cp::new(n(1)),
            refused: Some(Rule::TooFewMachines),
        },
        Case {
            name: "E2 two Machines, no additional failure",
            cp: Cp::new(n(2)),
            refused: None,
        },
        Case {
            name: "E3 two Machines, target member missing",
            cp: Cp::new(n(2)).members_missing(&[1]).leader(Some(2)),
            refused: None,
        },
        Case {
            name: "E4 two Machines, one additional failure",
            cp: Cp::new(n(2)).members_down(&[2]),
            refused: Some(Rule::EtcdQuorumAtRisk),
        },
        Case {
            name: "E5 three Machines, no additional failure",
            cp: Cp::new(n(3)),
            refused: None,
        },
        Case {
            name: "E6 three Machines, target member missing",
            cp: Cp::new(n(3)).members_missing(&[1]).leader(Some(2)),
            refused: None,
        },
        Case {
            name: "E7 three Machines, one additional failure",
            cp: Cp::new(n(3)).members_down(&[2]),
            refused: Some(Rule::EtcdQuorumAtRisk),
        },
        Case {
            name: "E8 three Machines, another (unhealthy) member missing",
            cp: Cp::new(n(3)).members_missing(&[2]),
            refused: None,
        },
        Case {
            name: "E9 three Machines, target and another member missing",
            cp: Cp::new(n(3)).members_missing(&[1, 2]).leader(Some(3)),
            refused: None,
        },
        Case {
            name: "E10 five Machines, one additional failure",
            cp: Cp::new(n(5)).members_down(&[2]),
            refused: None,
        },
        Case {
            name: "E11 five Machines, members missing but quorum",
            cp: Cp::new(n(5)).members_missing(&[2]).members_down(&[3]),
            refused: None,
        },
        Case {
            name: "E12 five Machines, two additional failures",
            cp: Cp::new(n(5)).members_down(&[2, 3]),
            refused: Some(Rule::EtcdQuorumAtRisk),
        },
        Case {
            name: "E13 seven Machines, two additional failures",
            cp: Cp::new(n(7)).members_down(&[2, 3]),
            refused: None,
        },
        Case {
            name: "E14 seven Machines, members missing but quorum",
            cp: Cp::new(n(7)).members_missing(&[2]).members_down(&[3, 4]),
            refused: None,
        },
        Case {
            name: "E15 seven Machines, three additional failures",
            cp: Cp::new(n(7)).members_down(&[2, 3, 4]),
            refused: Some(Rule::EtcdQuorumAtRisk),
        },
        Case {
            name: "E17 a learner blocks removal",
            cp: {
                let mut cp = Cp::new(n(2));
                cp.membership().members[1].learner = true;
                cp
            },
            refused: Some(Rule::EtcdQuorumAtRisk),
        },
        Case {
            name: "E18 a starting (unnamed) member blocks removal",
            cp: Cp::new(n(2)).add_member(MemberView {
                name: String::new(),
                ..member(9)
            }),
            refused: Some(Rule::EtcdQuorumAtRisk),
        },
        Case {
            name: "E19 a member without Machine with an alarm counts as unhealthy",
            cp: Cp::new(n(2)).add_member(MemberView {
                alarms: vec!["NOSPACE".into()],
                ..member(9)
            }),
            refused: Some(Rule::EtcdQuorumAtRisk),
        },
        Case {
            name: "E20 an orphan learner does not block its own removal",
            cp: {
                // The target machine maps to a learner that never got promoted.
                let mut cp = Cp::new(n(2)).leader(Some(2));
                cp.membership().members[0].learner = true;
                cp
            },
            refused: None,
        },
        Case {
            name: "E21 an in-flight learner blocks removal of a voter",
            cp: Cp::new(n(3)).add_member(MemberView {
                learner: true,
                ..member(4)
            }),
            refused: Some(Rule::EtcdQuorumAtRisk),
        },
    ];
    for case in cases {
        let d = case.cp.decide();
        match case.refused {
            None => assert_eq!(d.rule, Rule::Remediate, "{}: {}", case.name, d.message),
            Some(rule) => {
                assert_eq!(d.rule, rule, "{}: {}", case.name, d.message);
                assert!(matches!(d.outcome, Outcome::Wait { .. }), "{}", case.name);
            }
        }
    }
}

// ---- what upstream cannot express ------------------------------------------------------

#[test]
fn control_plane_node_without_etcd_is_remediated_without_etcd_step() {
    // m1 runs k3s with --disable-etcd: it has no member; m2, m3 carry etcd.
    let mut m1 = unhealthy(1);
    m1.etcd_member = None;
    let d = Cp::new(vec![m1, healthy(2), healthy(3)])
        .leader(Some(2))
        .decide();
    let r = assert_remediates(&d, "m1", 0);
    assert_eq!((r.member, r.transferee), (None, None));
    let a = r.assessment.as_ref().unwrap();
    assert_eq!((a.voters, a.healthy, a.target_is_member), (2, 2, false));
}

#[test]
fn control_plane_node_without_etcd_does_not_count_in_quorum() {
    // m3 has no member (--disable-etcd); two members only: removing m1's leaves m2 alone,
    // 1 of 1 healthy, quorum 1. Upstream would count m3 as a member "without health".
    let mut m3 = healthy(3);
    m3.etcd_member = None;
    let d = Cp::new(vec![unhealthy(1), healthy(2), m3]).decide();
    let r = assert_remediates(&d, "m1", 0);
    let a = r.assessment.as_ref().unwrap();
    assert_eq!((a.voters, a.healthy, a.size), (1, 1, 1));
    assert_eq!(r.transferee, Some(2));
}

#[test]
fn member_without_machine_counts_when_unhealthy() {
    let d = Cp::new(vec![unhealthy(1), healthy(2)])
        .add_member(MemberView {
            probe_error: Some("connection refused".into()),
            ..member(9)
        })
        .decide();
    assert_waits(
        &d,
        "m1",
        Rule::EtcdQuorumAtRisk,
        REASON_CANNOT_BE_REMEDIATED,
        "1 of 2 voters healthy, quorum needs 2",
    );
}

#[test]
fn member_without_machine_counts_when_healthy() {
    // Two machines plus a healthy member with no Machine: removing m1 leaves 2 of 2.
    let d = Cp::new(vec![unhealthy(1), healthy(2)])
        .add_member(member(9))
        .decide();
    let r = assert_remediates(&d, "m1", 0);
    let a = r.assessment.as_ref().unwrap();
    assert_eq!((a.voters, a.healthy, a.size), (2, 2, 2));
    assert_eq!(
        r.transferee,
        Some(2),
        "a machine's member is preferred over an orphan"
    );
}

#[test]
fn member_without_machine_takes_leadership_when_no_healthy_machine_can() {
    let mut m2 = unhealthy(2);
    m2.components_healthy = Some(true);
    let d = Cp::new(vec![unhealthy(1), m2, healthy(3)])
        .members_down(&[3])
        .add_member(member(9))
        .decide();
    // Voters after removing m1: m2, m3 (down), orphan 9 -> 2 of 3 healthy, quorum 2.
    let r = assert_remediates(&d, "m1", 0);
    assert_eq!(r.transferee, Some(9));
}

#[test]
fn target_that_does_not_lead_needs_no_transferee() {
    let mut others: Vec<MachineView> = (2..=3).map(unhealthy).collect();
    for m in &mut others {
        m.components_healthy = Some(true);
    }
    let mut machines = vec![unhealthy(1)];
    machines.extend(others);
    let d = Cp::new(machines).leader(Some(2)).decide();
    let r = assert_remediates(&d, "m1", 0);
    assert_eq!((r.member, r.transferee), (Some(1), None));
}

#[test]
fn unknown_leader_without_transferee_refuses() {
    let mut m2 = unhealthy(2);
    m2.components_healthy = Some(true);
    let d = Cp::new(vec![unhealthy(1), m2]).leader(None).decide();
    assert_waits(
        &d,
        "m1",
        Rule::NoLeadershipTransferee,
        REASON_CANNOT_BE_REMEDIATED,
        "no etcd leader was observed",
    );
}

#[test]
fn unreadable_membership_refuses_with_internal_error() {
    let mut cp = Cp::new(vec![unhealthy(1), healthy(2), healthy(3)]);
    cp.view.etcd = EtcdState::Unreachable {
        reason: "dial tcp 10.0.0.2:2379: connection refused".into(),
    };
    let d = cp.decide();
    assert_waits(
        &d,
        "m1",
        Rule::EtcdMembershipUnknown,
        REASON_INTERNAL_ERROR,
        "connection refused",
    );
}

#[test]
fn no_member_target_with_broken_cluster_refuses() {
    // A target without member costs nothing, but the cluster as it stands must be safe.
    let mut m1 = unhealthy(1);
    m1.etcd_member = None;
    let d = Cp::new(vec![m1, healthy(2), healthy(3)])
        .members_down(&[2, 3])
        .decide();
    assert_waits(
        &d,
        "m1",
        Rule::EtcdQuorumAtRisk,
        REASON_CANNOT_BE_REMEDIATED,
        // Lost quorum is said first, with the numbers.
        "etcd has lost quorum: 0 of 2 voters healthy, quorum needs 2",
    );
}

#[test]
fn the_most_broken_machine_is_remediated_first() {
    let mut m2 = unhealthy(2);
    m2.node_ref = None;
    m2.etcd_member = None;
    let mut m1 = unhealthy(1);
    m1.components_healthy = Some(true);
    let d = Cp::new(vec![m1, m2, healthy(3)]).decide();
    let r = assert_remediates(&d, "m2", 0);
    assert_eq!(r.member, None);
    assert!(d.message.contains("it has no node"), "{}", d.message);
}
