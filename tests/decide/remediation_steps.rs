//! The resumable removal: walk every intermediate state of a removal in a
//! simulated world and check that each state maps to exactly one next step, that
//! a restart after any step (in-memory state thrown away, rebuilt from what is
//! observable) resumes with the next step, and that re-running a finished step
//! changes nothing.

use chrono::{DateTime, Duration, TimeZone, Utc};
use k3s_control_plane::quorum::MemberView;
use k3s_control_plane::remediation::steps::{
    BORN_HOOK_VALUE, HookValue, hook_value, parse_hook_value, resume,
};
use k3s_control_plane::remediation::{
    ControlPlaneView, EtcdState, MachineView, Membership, Outcome, RemediationData,
    RemediationStrategy, Removal, RemovalKind, Step, WaitReason, decide_remediation, next_step,
};

fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2024, 5, 1, 12, 0, 0).unwrap()
}

fn machine(i: u64) -> MachineView {
    let mut m = MachineView::new(
        &format!("m{i}"),
        now() - Duration::hours(3) + Duration::minutes(i as i64),
    );
    m.etcd_member = Some(i);
    m.components_healthy = Some(true);
    m
}

fn member(id: u64) -> MemberView {
    MemberView::healthy_voter(id, format!("node-m{id}-{id:08x}"))
}

/// Three machines, m1 MHC-unhealthy and leading etcd.
fn three_machines() -> ControlPlaneView {
    let mut m1 = machine(1);
    m1.health_check_succeeded = Some(false);
    m1.owner_remediated = Some(false);
    ControlPlaneView {
        name: "cp".into(),
        initialized: true,
        desired_replicas: 3,
        strategy: RemediationStrategy::default(),
        remediation_in_progress: None,
        etcd: EtcdState::Observed(Membership {
            members: vec![member(1), member(2), member(3)],
            leader: Some(1),
        }),
        failure_domains: vec![],
        pending_topology_version: None,
        machines: vec![m1, machine(2), machine(3)],
    }
}

fn membership(view: &mut ControlPlaneView) -> &mut Membership {
    match &mut view.etcd {
        EtcdState::Observed(m) => m,
        _ => panic!("etcd not observed"),
    }
}

fn target<'a>(view: &'a mut ControlPlaneView, name: &str) -> Option<&'a mut MachineView> {
    view.machines.iter_mut().find(|m| m.name == name)
}

/// Execute `step` in the simulated world, including what CAPI and etcd do on
/// their own while we wait. Steps are "ensure" operations: executing one whose
/// effect is already there changes nothing.
fn apply(view: &mut ControlPlaneView, removal: &Removal, step: &Step) {
    let name = removal.machine.clone();
    match step {
        Step::RecordRemediation { value } => view.remediation_in_progress = Some(value.clone()),
        Step::AddHook { member, .. } => {
            let m = target(view, &name).unwrap();
            m.has_our_hook = true;
            m.removal_chosen = true;
            m.hook_member = *member;
        }
        Step::RecordHookMember { member, .. } => {
            target(view, &name).unwrap().hook_member = Some(*member);
        }
        Step::MoveLeadership { from, to } => {
            let ms = membership(view);
            // MoveLeader sent to a member that no longer leads fails ("not leader"): no change.
            if ms.leader == Some(*from) {
                ms.leader = Some(*to);
            }
        }
        Step::DeleteMachine { .. } => {
            let m = target(view, &name).unwrap();
            m.deleting.get_or_insert(now());
        }
        Step::RemoveMember { member, via, .. } => {
            let ms = membership(view);
            assert_ne!(member, via, "MemberRemove must go to a member that stays");
            assert!(ms.member(*via).is_some());
            // Removing an absent member is "member not found": treated as done.
            ms.members.retain(|m| m.id != *member);
        }
        Step::ReleaseHook { .. } => {
            if let Some(m) = target(view, &name) {
                m.has_our_hook = false;
            }
        }
        Step::CreateReplacement { remediation_for } => {
            if !view
                .machines
                .iter()
                .any(|m| m.remediation_for.as_ref() == Some(remediation_for))
            {
                let mut m = MachineView::new("m1-replacement", now() + Duration::minutes(5));
                m.remediation_for = Some(remediation_for.clone());
                view.machines.push(m);
            }
        }
        Step::ClearRemediationInProgress => view.remediation_in_progress = None,
        // What the rest of the world does while we wait.
        Step::Wait { reason, .. } => match reason {
            WaitReason::Drain => target(view, &name).unwrap().waiting_for_pre_terminate_hook = true,
            WaitReason::MachineGoing => view.machines.retain(|m| m.name != name),
            other => panic!("unexpected wait {other:?} in a clean run"),
        },
        Step::Done => {}
    }
}

/// The controller after a restart: it knows only what it observes.
fn rebuild(view: &ControlPlaneView) -> Option<Removal> {
    resume(view)
}

/// Walk a removal to Done; returns the step names and the states before each step.
fn walk(
    mut view: ControlPlaneView,
    removal: Removal,
) -> (Vec<&'static str>, Vec<(ControlPlaneView, Step)>) {
    let mut names = Vec::new();
    let mut trace = Vec::new();
    for _ in 0..30 {
        let step = next_step(&view, &removal);
        names.push(step.name());
        trace.push((view.clone(), step.clone()));
        if step == Step::Done {
            return (names, trace);
        }
        apply(&mut view, &removal, &step);
    }
    panic!("no progress: {names:?}");
}

fn remediation_of_m1(view: &ControlPlaneView) -> Removal {
    let d = decide_remediation(view, now());
    let Outcome::Remediate(r) = d.outcome else {
        panic!("{}", d.message)
    };
    assert_eq!(r.machine, "m1");
    Removal {
        machine: r.machine,
        kind: RemovalKind::Remediation { record: r.retry },
    }
}

/// Check the crash property on a trace: after executing step k, a rebuilt
/// controller computes step k+1; re-running step k changes nothing.
fn assert_resumable(trace: &[(ControlPlaneView, Step)], removal: &Removal) {
    for k in 0..trace.len() - 1 {
        let (before, step) = &trace[k];
        let (after, next) = &trace[k + 1];
        let mut replay = before.clone();
        apply(&mut replay, removal, step);
        assert_eq!(&replay, after, "the trace is the world's own history");
        let resumed = match rebuild(after) {
            Some(restarted) => next_step(after, &restarted),
            None => Step::Done,
        };
        assert_eq!(
            &resumed,
            next,
            "crash after step {k} ({}) must resume with {}",
            step.name(),
            next.name()
        );
        if !matches!(step, Step::Wait { .. }) {
            let mut again = after.clone();
            apply(&mut again, removal, step);
            assert_eq!(&again, after, "re-running {} must be a no-op", step.name());
            assert_ne!(next, step, "{} must not be repeated", step.name());
        }
    }
}

#[test]
fn mhc_remediation_of_the_leader_runs_every_step_once() {
    let view = three_machines();
    let removal = remediation_of_m1(&view);
    let (names, trace) = walk(view, removal.clone());
    assert_eq!(
        names,
        [
            "record-remediation",
            "add-hook",
            "move-leadership",
            "delete-machine",
            "wait",
            "remove-member",
            "release-hook",
            "wait",
            "create-replacement",
            "clear-remediation-in-progress",
            "done"
        ]
    );
    assert_eq!(
        trace[1].1,
        Step::AddHook {
            machine: "m1".into(),
            member: Some(1)
        }
    );
    assert_eq!(trace[2].1, Step::MoveLeadership { from: 1, to: 3 });
    let Step::RemoveMember {
        member,
        via,
        assessment,
    } = &trace[5].1
    else {
        panic!()
    };
    assert_eq!(
        (*member, *via),
        (1, 3),
        "sent to the new leader, which stays"
    );
    assert_eq!(
        (assessment.voters, assessment.healthy, assessment.size),
        (2, 2, 2)
    );
    let Step::CreateReplacement { remediation_for } = &trace[8].1 else {
        panic!()
    };
    assert_eq!(remediation_for.machine, "m1");
    assert_resumable(&trace, &removal);
}

#[test]
fn scale_down_runs_the_same_steps_without_record_and_replacement() {
    let mut view = three_machines();
    view.machines[0].health_check_succeeded = None;
    view.machines[0].owner_remediated = None;
    membership(&mut view).leader = Some(2);
    let removal = Removal {
        machine: "m1".into(),
        kind: RemovalKind::ScaleDown,
    };
    let (names, trace) = walk(view, removal.clone());
    assert_eq!(
        names,
        [
            "add-hook",
            "delete-machine",
            "wait",
            "remove-member",
            "release-hook",
            "done"
        ]
    );
    assert_resumable(&trace, &removal);
}

#[test]
fn a_node_without_etcd_gets_no_etcd_step() {
    let mut view = three_machines();
    view.machines[0].etcd_member = None;
    membership(&mut view).members.retain(|m| m.id != 1);
    membership(&mut view).leader = Some(2);
    let removal = remediation_of_m1(&view);
    let (names, trace) = walk(view, removal.clone());
    assert_eq!(
        names,
        [
            "record-remediation",
            "add-hook",
            "delete-machine",
            "wait",
            "release-hook",
            "wait",
            "create-replacement",
            "clear-remediation-in-progress",
            "done"
        ]
    );
    assert_eq!(
        trace[1].1,
        Step::AddHook {
            machine: "m1".into(),
            member: None
        }
    );
    assert_resumable(&trace, &removal);
}

#[test]
fn not_initialized_control_plane_gets_no_etcd_step() {
    let mut view = three_machines();
    view.initialized = false;
    view.machines.truncate(1);
    membership(&mut view).members.truncate(1);
    let removal = remediation_of_m1(&view);
    let (names, _) = walk(view, removal);
    assert!(
        !names.contains(&"remove-member") && !names.contains(&"move-leadership"),
        "{names:?}"
    );
}

/// A state at step 5 (CAPI drained, waiting on hooks), for the wait cases.
fn drained() -> (ControlPlaneView, Removal) {
    let mut view = three_machines();
    let removal = remediation_of_m1(&view);
    let RemovalKind::Remediation { record } = &removal.kind else {
        unreachable!()
    };
    view.remediation_in_progress = Some(record.clone());
    let m1 = &mut view.machines[0];
    m1.has_our_hook = true;
    m1.hook_member = Some(1);
    m1.deleting = Some(now());
    m1.waiting_for_pre_terminate_hook = true;
    membership(&mut view).leader = Some(3);
    (view, removal)
}

#[track_caller]
fn assert_wait(step: Step, reason: WaitReason, text: &str) {
    match step {
        Step::Wait { reason: r, message } => {
            assert_eq!(r, reason, "{message}");
            assert!(
                message.contains(text),
                "{message:?} does not contain {text:?}"
            );
        }
        other => panic!("expected wait {reason:?}, got {other:?}"),
    }
}

#[test]
fn member_is_removed_only_after_drain() {
    let (mut view, removal) = drained();
    view.machines[0].waiting_for_pre_terminate_hook = false;
    assert_wait(
        next_step(&view, &removal),
        WaitReason::Drain,
        "CAPI is draining m1",
    );
}

#[test]
fn other_pre_terminate_hooks_run_first() {
    let (mut view, removal) = drained();
    view.machines[0].other_pre_terminate_hooks =
        vec!["pre-terminate.delete.hook.machine.cluster.x-k8s.io/backup".into()];
    assert_wait(next_step(&view, &removal), WaitReason::OtherHooks, "backup");
}

#[test]
fn the_oldest_deleting_machine_goes_first() {
    let (mut view, removal) = drained();
    view.machines[2].deleting = Some(now() - Duration::minutes(1));
    assert_wait(
        next_step(&view, &removal),
        WaitReason::OlderDeletion,
        "m3 was marked for deletion before m1",
    );
    // Same timestamp: the name decides, deterministically.
    view.machines[2].deleting = Some(now());
    assert!(matches!(
        next_step(&view, &removal),
        Step::RemoveMember { .. }
    ));
}

#[test]
fn leadership_that_came_back_is_moved_again() {
    let (mut view, removal) = drained();
    membership(&mut view).leader = Some(1);
    assert_eq!(
        next_step(&view, &removal),
        Step::MoveLeadership { from: 1, to: 3 }
    );
}

#[test]
fn leadership_back_without_transferee_waits() {
    let (mut view, removal) = drained();
    membership(&mut view).leader = Some(1);
    for m in &mut view.machines[1..] {
        m.health_check_succeeded = Some(false);
    }
    assert_wait(
        next_step(&view, &removal),
        WaitReason::NoTransferee,
        "no healthy etcd member to take leadership",
    );
}

/// Right after a leadership handover every member may fail a linearizable
/// read for a moment ("leader changed"): that is etcd settling, a Normal wait
/// looked at again shortly, not a Warning that quorum is at risk.
#[test]
fn a_member_settling_after_a_handover_is_a_short_wait_not_quorum_at_risk() {
    let (mut view, removal) = drained();
    membership(&mut view).members[1].probe_error =
        Some("linearizable read failed: gRPC Unavailable: etcdserver: leader changed".into());
    let step = next_step(&view, &removal);
    assert_wait(
        step,
        WaitReason::EtcdSettling,
        "would leave 1 of 2 voters healthy, quorum needs 2",
    );
    assert!(WaitReason::EtcdSettling.is_progress());
    // The same numbers with the member down: quorum at risk.
    membership(&mut view).members[1].probe_error = Some("connection refused".into());
    assert_wait(
        next_step(&view, &removal),
        WaitReason::QuorumAtRisk,
        "would leave 1 of 2 voters healthy, quorum needs 2",
    );
}

#[test]
fn quorum_is_checked_again_before_member_removal() {
    let (mut view, removal) = drained();
    membership(&mut view).members[1].probe_error = Some("connection refused".into());
    assert_wait(
        next_step(&view, &removal),
        WaitReason::QuorumAtRisk,
        "removing node-m1-00000001 would leave 1 of 2 voters healthy, quorum needs 2",
    );
    // The member recovers: removal proceeds.
    membership(&mut view).members[1].probe_error = None;
    assert!(matches!(
        next_step(&view, &removal),
        Step::RemoveMember {
            member: 1,
            via: 3,
            ..
        }
    ));
}

/// The decision was taken some reconciles ago; a member that failed since
/// (after record, hook and leadership move) stops the deletion itself, not
/// only the later member removal.
#[test]
fn quorum_is_checked_again_before_the_machine_is_deleted() {
    let mut view = three_machines();
    let removal = remediation_of_m1(&view);
    let RemovalKind::Remediation { record } = &removal.kind else {
        unreachable!()
    };
    view.remediation_in_progress = Some(record.clone());
    view.machines[0].has_our_hook = true;
    view.machines[0].removal_chosen = true;
    view.machines[0].hook_member = Some(1);
    membership(&mut view).leader = Some(3);
    assert!(matches!(
        next_step(&view, &removal),
        Step::DeleteMachine { .. }
    ));

    membership(&mut view).members[1].probe_error = Some("connection refused".into());
    assert_wait(
        next_step(&view, &removal),
        WaitReason::QuorumAtRisk,
        "not deleting m1 now: removing node-m1-00000001 would leave 1 of 2 voters healthy, quorum needs 2",
    );

    // A target without a member: the cluster as it stands must have quorum.
    view.machines[0].hook_member = None;
    view.machines[0].etcd_member = None;
    membership(&mut view).members.retain(|m| m.id != 1);
    assert_wait(
        next_step(&view, &removal),
        WaitReason::QuorumAtRisk,
        "1 of 2 voters healthy, quorum needs 2",
    );
    membership(&mut view).members[0].probe_error = None;
    assert!(matches!(
        next_step(&view, &removal),
        Step::DeleteMachine { .. }
    ));
}

#[test]
fn unreadable_membership_waits_instead_of_guessing() {
    let (mut view, removal) = drained();
    view.etcd = EtcdState::Unreachable {
        reason: "context deadline exceeded".into(),
    };
    assert_wait(
        next_step(&view, &removal),
        WaitReason::EtcdUnreachable,
        "context deadline exceeded",
    );
}

#[test]
fn the_recorded_member_is_removed_even_after_the_mapping_is_lost() {
    // The Node (and with it the member <-> machine mapping) is gone after drain;
    // the member recorded in our hook is still removed before the hook is released.
    let (mut view, removal) = drained();
    view.machines[0].etcd_member = None;
    view.machines[0].node_ref = None;
    assert!(matches!(
        next_step(&view, &removal),
        Step::RemoveMember { member: 1, .. }
    ));
}

#[test]
fn another_remediation_recorded_blocks() {
    let (mut view, removal) = drained();
    view.remediation_in_progress = Some(RemediationData {
        machine: "m9".into(),
        timestamp: Some(now()),
        retry_count: 0,
    });
    assert_wait(
        next_step(&view, &removal),
        WaitReason::AnotherRemediation,
        "m9",
    );
}

#[test]
fn hook_value_round_trips_and_rejects_garbage() {
    let chosen = |member| HookValue {
        removal_chosen: true,
        member,
    };
    assert_eq!(hook_value(Some(0x1a2b)), "member=1a2b");
    assert_eq!(parse_hook_value("member=1a2b"), Ok(chosen(Some(0x1a2b))));
    assert_eq!(hook_value(None), "member=none");
    assert_eq!(parse_hook_value("member=none"), Ok(chosen(None)));
    assert_eq!(
        parse_hook_value(BORN_HOOK_VALUE),
        Ok(HookValue {
            removal_chosen: false,
            member: None
        })
    );
    assert!(parse_hook_value("member=zz").is_err());
    let err = parse_hook_value("yes").unwrap_err();
    assert!(
        err.contains("pre-terminate.delete.hook.machine.cluster.x-k8s.io/k3s-control-plane"),
        "{err}"
    );
}

/// Every Machine carries our hook from its creation (and live Machines
/// without it get it before anything else); no Machine is MHC-unhealthy.
fn hooked_three() -> ControlPlaneView {
    let mut view = three_machines();
    view.machines[0].health_check_succeeded = None;
    view.machines[0].owner_remediated = None;
    for m in &mut view.machines {
        m.has_our_hook = true;
    }
    view
}

/// Walk every deletion in flight to its end as the controller does: each
/// pass rebuilds the removal from the world; returns (machine, step) pairs.
fn walk_deletions(mut view: ControlPlaneView) -> (Vec<(String, &'static str)>, ControlPlaneView) {
    let mut seen = Vec::new();
    for _ in 0..40 {
        let Some(removal) = resume(&view) else {
            return (seen, view);
        };
        let step = next_step(&view, &removal);
        seen.push((removal.machine.clone(), step.name()));
        apply(&mut view, &removal, &step);
        if matches!(step, Step::ReleaseHook { .. }) {
            // CAPI finishes the deletion once no hook holds it.
            view.machines.retain(|m| m.name != removal.machine);
        }
    }
    panic!("no end: {seen:?}");
}

#[test]
fn a_live_machine_carrying_our_hook_from_birth_is_not_a_removal_in_flight() {
    // Before, a hook on a live Machine meant "a removal of ours started":
    // with the hook on every Machine, that would delete a healthy one.
    assert_eq!(resume(&hooked_three()), None);
}

/// `kubectl delete machine` of the etcd leader's Machine: CAPI drains, waits
/// on our hook; leadership moves, the member is removed through a member
/// that stays, and only then is the hook released.
#[test]
fn a_person_deleting_the_etcd_leaders_machine_waits_for_leadership_and_member_removal() {
    let mut view = hooked_three();
    view.machines[0].deleting = Some(now());
    let removal = resume(&view).expect("a deletion someone else started is in flight");
    assert_eq!(removal.machine, "m1");
    let (names, trace) = walk(view, removal.clone());
    assert_eq!(
        names,
        [
            "wait",
            "move-leadership",
            "record-hook-member",
            "remove-member",
            "release-hook",
            "done"
        ]
    );
    assert_eq!(trace[1].1, Step::MoveLeadership { from: 1, to: 3 });
    assert!(matches!(
        trace[3].1,
        Step::RemoveMember {
            member: 1,
            via: 3,
            ..
        }
    ));
    assert_resumable(&trace, &removal);
}

#[test]
fn two_machines_deleted_at_once_are_taken_one_at_a_time_oldest_first() {
    let mut view = hooked_three();
    membership(&mut view).leader = Some(2);
    view.machines[1].deleting = Some(now() - Duration::seconds(1));
    view.machines[0].deleting = Some(now());
    let (seen, after) = walk_deletions(view);
    let order: Vec<String> = seen.iter().map(|(m, s)| format!("{m}:{s}")).collect();
    assert_eq!(
        order,
        [
            "m2:wait",
            "m2:move-leadership",
            "m2:record-hook-member",
            "m2:remove-member",
            "m2:release-hook",
            "m1:wait",
            "m1:record-hook-member",
            "m1:remove-member",
            "m1:release-hook",
        ],
        "m2 was deleted first: its member is gone and its hook released before m1's member is touched"
    );
    let left: Vec<u64> = membership(&mut after.clone())
        .members
        .iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(left, [3]);
}

#[test]
fn a_deletion_that_would_lose_quorum_holds_the_hook_and_says_why_with_the_numbers() {
    let mut view = hooked_three();
    membership(&mut view).leader = Some(3);
    membership(&mut view).members[1].probe_error = Some("connection refused".into());
    view.machines[0].deleting = Some(now());
    view.machines[0].waiting_for_pre_terminate_hook = true;
    view.machines[0].hook_member = Some(1);
    let removal = resume(&view).unwrap();
    for _ in 0..3 {
        assert_wait(
            next_step(&view, &removal),
            WaitReason::QuorumAtRisk,
            "not removing the member of m1 now: removing node-m1-00000001 would leave 1 of 2 voters healthy, quorum needs 2",
        );
    }
}

/// A Machine with no nodeRef (a providerID mismatch, what MHC's
/// nodeStartupTimeout catches) and no address that matches: its live member
/// cannot be attached to it. It no longer "costs nothing": the deletion holds
/// the hook, and a remediation is refused, naming the unclaimed member.
#[test]
fn a_target_whose_member_cannot_be_mapped_is_never_released_on_a_guess() {
    let mut view = hooked_three();
    membership(&mut view).leader = Some(3);
    let m1 = &mut view.machines[0];
    m1.node_ref = None;
    m1.etcd_member = None;
    m1.deleting = Some(now());
    m1.waiting_for_pre_terminate_hook = true;
    let removal = resume(&view).unwrap();
    assert_wait(
        next_step(&view, &removal),
        WaitReason::TargetMemberUnknown,
        "m1 maps to no etcd member while a member is claimed by no Machine (node-m1-00000001)",
    );
    // The worst case: counted as that voter.
    assert_wait(
        next_step(&view, &removal),
        WaitReason::TargetMemberUnknown,
        "removing m1 would leave 2 of 2 voters healthy, quorum needs 2",
    );
    assert_wait(
        next_step(&view, &removal),
        WaitReason::TargetMemberUnknown,
        "etcd.k3s.cattle.io/node-name",
    );
    // Once the member maps (a person annotated the Node), it goes the usual way.
    view.machines[0].etcd_member = Some(1);
    assert_eq!(
        next_step(&view, &removal),
        Step::RecordHookMember {
            machine: "m1".into(),
            member: 1
        }
    );
    // Provably none: every member is another Machine's.
    view.machines[0].etcd_member = None;
    membership(&mut view).members.retain(|m| m.id != 1);
    assert_eq!(
        next_step(&view, &removal),
        Step::ReleaseHook {
            machine: "m1".into()
        }
    );
}

#[test]
fn a_remediation_of_a_target_whose_member_cannot_be_mapped_is_refused_with_the_worst_case() {
    let mut view = three_machines();
    view.machines[0].node_ref = None;
    view.machines[0].etcd_member = None;
    membership(&mut view).leader = Some(3);
    let d = decide_remediation(&view, now());
    assert!(
        !matches!(d.outcome, Outcome::Remediate(_)),
        "remediated on a guess: {}",
        d.message
    );
    assert_eq!(
        d.rule.as_str(),
        "etcd.target-member-unknown",
        "{}",
        d.message
    );
    assert!(
        d.message
            .contains("removing m1 would leave 2 of 2 voters healthy, quorum needs 2"),
        "{}",
        d.message
    );
    assert!(d.message.contains("node-m1-00000001"), "{}", d.message);
    // Every member is another Machine's: it costs nothing.
    membership(&mut view).members.retain(|m| m.id != 1);
    let d = decide_remediation(&view, now());
    assert!(matches!(d.outcome, Outcome::Remediate(_)), "{}", d.message);
}
