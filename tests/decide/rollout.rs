//! The rollout's next step, as table tests named after the situation: three
//! control-plane Machines (members 1..3, healthy voters) at `replicas: 3`
//! unless a case changes that.

use chrono::{DateTime, Duration, TimeZone, Utc};
use k3s_control_plane::quorum::MemberView;
use k3s_control_plane::remediation::{
    ControlPlaneView, EtcdState, MachineView, Membership, RemediationStrategy,
};
use k3s_control_plane::rollout::{RolloutStep, decide_rollout};

fn start() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap()
}

fn machine(n: u64, outdated: bool) -> MachineView {
    let mut m = MachineView::new(&format!("cp-{n}"), start() + Duration::hours(n as i64));
    m.etcd_member = Some(n);
    m.components_healthy = Some(true);
    m.outdated = outdated;
    m
}

fn member(id: u64) -> MemberView {
    MemberView::healthy_voter(id, format!("node-cp-{id}-{id:08x}"))
}

/// cp-1 and cp-2 outdated, cp-3 up to date; all healthy.
fn three() -> ControlPlaneView {
    let machines = vec![machine(1, true), machine(2, true), machine(3, false)];
    ControlPlaneView {
        name: "cp".into(),
        initialized: true,
        desired_replicas: 3,
        strategy: RemediationStrategy::default(),
        remediation_in_progress: None,
        etcd: EtcdState::Observed(Membership {
            members: (1..=3).map(member).collect(),
            leader: Some(1),
        }),
        failure_domains: vec![],
        pending_topology_version: None,
        machines,
    }
}

fn members(view: &mut ControlPlaneView) -> &mut Vec<MemberView> {
    match &mut view.etcd {
        EtcdState::Observed(m) => &mut m.members,
        other => panic!("no membership: {other:?}"),
    }
}

/// A Node that shows embedded etcd without a member; `confirmed`: past grace.
fn missing(confirmed: bool) -> k3s_control_plane::remediation::model::MemberMissing {
    k3s_control_plane::remediation::model::MemberMissing {
        node: "node-cp-3".into(),
        marks: "label node-role.kubernetes.io/etcd=true".into(),
        since: start(),
        confirmed,
    }
}

/// A surge Machine cp-4 (up to date) beside the three.
fn surged(view: &mut ControlPlaneView) -> &mut MachineView {
    view.machines.push(machine(4, false));
    view.machines.last_mut().unwrap()
}

type Case = (
    &'static str,
    u32,
    fn(&mut ControlPlaneView),
    Option<&'static str>,
);

fn cases() -> Vec<Case> {
    vec![
        (
            "nothing_outdated_is_no_rollout",
            1,
            |v| v.machines.iter_mut().for_each(|m| m.outdated = false),
            None,
        ),
        (
            "fewer_machines_than_replicas_is_scale_up_not_rollout",
            1,
            |v| {
                v.machines.pop();
            },
            None,
        ),
        (
            "settled_with_max_surge_1_creates_first",
            1,
            |_| {},
            Some("rollout.surge"),
        ),
        (
            "surge_machine_without_node_waits",
            1,
            |v| {
                let m = surged(v);
                m.node_ref = None;
                m.etcd_member = None;
            },
            Some("rollout.machine-provisioning"),
        ),
        (
            "surge_machine_with_node_but_no_member_waits",
            1,
            |v| {
                surged(v).etcd_member = None;
            },
            Some("rollout.replacement-not-voter"),
        ),
        (
            "surge_machine_still_a_learner_waits",
            1,
            |v| {
                surged(v);
                let mut learner = member(4);
                learner.learner = true;
                members(v).push(learner);
            },
            Some("rollout.etcd-learner"),
        ),
        (
            "surge_machine_member_added_not_started_waits",
            1,
            |v| {
                surged(v);
                let mut starting = member(4);
                starting.name = String::new();
                members(v).push(starting);
            },
            Some("rollout.etcd-member-unhealthy"),
        ),
        (
            "surge_machine_node_not_ready_waits",
            1,
            |v| {
                surged(v).components_healthy = Some(false);
                members(v).push(member(4));
            },
            Some("rollout.node-not-ready"),
        ),
        (
            "surge_machine_a_healthy_voter_lets_an_outdated_one_go",
            1,
            |v| {
                surged(v);
                members(v).push(member(4));
            },
            Some("rollout.remove-outdated"),
        ),
        (
            "a_machine_deleting_waits",
            1,
            |v| {
                surged(v);
                members(v).push(member(4));
                v.machines[0].deleting = Some(start());
            },
            Some("rollout.machine-deleting"),
        ),
        (
            "an_unhealthy_member_blocks_the_surge",
            1,
            |v| members(v)[1].probe_error = Some("context deadline exceeded".into()),
            Some("rollout.etcd-member-unhealthy"),
        ),
        (
            "an_alarm_blocks_the_surge",
            1,
            |v| members(v)[2].alarms = vec!["NOSPACE".into()],
            Some("rollout.etcd-member-unhealthy"),
        ),
        (
            // k3s keeps the etcd marks on a server whose member it removed or
            // evicted: the cluster runs a voter short of its servers.
            "a_server_whose_member_is_missing_blocks_the_surge",
            1,
            |v| {
                v.machines[2].etcd_member = None;
                v.machines[2].etcd_member_missing = Some(missing(true));
                members(v).pop();
            },
            Some("rollout.etcd-member-missing"),
        ),
        (
            "a_missing_member_within_its_grace_period_does_not_block",
            1,
            |v| {
                v.machines[2].etcd_member = None;
                v.machines[2].etcd_member_missing = Some(missing(false));
                members(v).pop();
            },
            Some("rollout.surge"),
        ),
        (
            "unreadable_membership_blocks_the_surge",
            1,
            |v| {
                v.etcd = EtcdState::Unreachable {
                    reason: "dial tcp: connection refused".into(),
                }
            },
            Some("rollout.etcd-unreachable"),
        ),
        (
            "external_datastore_surges_without_etcd_checks",
            1,
            |v| v.etcd = EtcdState::NotManaged,
            Some("rollout.surge"),
        ),
        (
            "external_datastore_removes_once_the_surge_has_a_node",
            1,
            |v| {
                v.etcd = EtcdState::NotManaged;
                surged(v).etcd_member = None;
            },
            Some("rollout.remove-outdated"),
        ),
        (
            "max_surge_0_with_three_healthy_voters_removes_first",
            0,
            |_| {},
            Some("rollout.remove-first"),
        ),
        (
            "max_surge_0_with_one_replica_refuses",
            0,
            |v| {
                v.machines.truncate(1);
                v.desired_replicas = 1;
                members(v).truncate(1);
            },
            Some("rollout.too-few-voters-to-remove-first"),
        ),
        (
            "max_surge_0_with_a_sick_voter_waits_for_it",
            0,
            |v| members(v)[2].probe_error = Some("timeout".into()),
            Some("rollout.etcd-member-unhealthy"),
        ),
        (
            "max_surge_0_waits_for_the_last_replacement_to_be_a_voter",
            0,
            |v| {
                v.machines[2].etcd_member = None;
            },
            Some("rollout.replacement-not-voter"),
        ),
    ]
}

#[test]
fn rollout_steps() {
    for (name, max_surge, mutate, want) in cases() {
        let mut view = three();
        mutate(&mut view);
        let got = decide_rollout(&view, max_surge);
        assert_eq!(
            got.as_ref().map(|d| d.rule.as_str()),
            want,
            "{name}: {got:?}"
        );
        if let Some(d) = got {
            // Every decision says where the rollout stands, with the numbers.
            assert!(
                d.message.contains("machines outdated (maxSurge"),
                "{name}: {}",
                d.message
            );
            let step_matches = match d.rule.as_str() {
                "rollout.surge" => d.step == RolloutStep::Surge,
                "rollout.remove-outdated" | "rollout.remove-first" => {
                    d.step == RolloutStep::RemoveOutdated
                }
                _ => matches!(d.step, RolloutStep::Wait { .. }),
            };
            assert!(step_matches, "{name}: {:?} for {}", d.step, d.rule);
        }
    }
}

#[test]
fn waits_name_the_machine_or_member_they_wait_for() {
    let mut view = three();
    surged(&mut view);
    let mut learner = member(4);
    learner.learner = true;
    members(&mut view).push(learner);
    let d = decide_rollout(&view, 1).unwrap();
    assert!(d.message.contains("node-cp-4-00000004"), "{}", d.message);
    assert_eq!(d.step, RolloutStep::Wait { progress: true });
    assert!(
        d.message.contains("2 of 4 machines outdated"),
        "{}",
        d.message
    );

    let mut view = three();
    view.machines.truncate(1);
    view.desired_replicas = 1;
    members(&mut view).truncate(1);
    let d = decide_rollout(&view, 0).unwrap();
    assert_eq!(d.step, RolloutStep::Wait { progress: false });
    assert!(
        d.message
            .contains("needs at least 3 healthy voters (1 healthy)"),
        "{}",
        d.message
    );
}
