//! Scale-down selection and preflight, as table tests named after the situation.
//!
//! The selection cases are upstream KCP's `TestSelectMachineForScaleDown` (same
//! machines: failure domains "one"/"two", creation times relative to a start
//! date), with "outdated" as a per-machine flag: upstream's two cases whose
//! outdated set holds machines outside the control plane are expressed with
//! those machines inside it.

use chrono::{DateTime, Duration, TimeZone, Utc};
use k3s_control_plane::quorum::MemberView;
use k3s_control_plane::remediation::decide::Rule;
use k3s_control_plane::remediation::scale_down::{EligibleSet, ScaleDownRule};
use k3s_control_plane::remediation::{
    ControlPlaneView, EtcdState, MachineView, Membership, RemediationStrategy, ScaleDownDecision,
    decide_scale_down, select_machine_for_scale_down,
};

fn start() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2000, 1, 1, 1, 0, 0).unwrap()
}

/// Upstream's machine-N: failure domain and age (hours relative to start).
fn m(n: u64, fd: &str, hours: i64) -> MachineView {
    let mut m = MachineView::new(&format!("machine-{n}"), start() + Duration::hours(hours));
    m.failure_domain = Some(fd.into());
    m.etcd_member = Some(n);
    m.components_healthy = Some(true);
    m
}

fn annotated(mut m: MachineView) -> MachineView {
    m.delete_requested = true;
    m
}

fn outdated(mut m: MachineView) -> MachineView {
    m.outdated = true;
    m
}

fn view(machines: Vec<MachineView>) -> ControlPlaneView {
    let members = machines
        .iter()
        .filter_map(|m| m.etcd_member)
        .map(|id| MemberView {
            id,
            name: format!("node-{id}-{id:08x}"),
            learner: false,
            probe_error: None,
            alarms: vec![],
        })
        .collect();
    let leader = machines.first().and_then(|m| m.etcd_member);
    ControlPlaneView {
        name: "cp".into(),
        initialized: true,
        desired_replicas: machines.len().saturating_sub(1) as u32,
        strategy: RemediationStrategy::default(),
        remediation_in_progress: None,
        etcd: EtcdState::Observed(Membership { members, leader }),
        failure_domains: vec!["one".into(), "two".into()],
        pending_topology_version: None,
        machines,
    }
}

fn m1() -> MachineView {
    m(1, "one", 1)
}
fn m2() -> MachineView {
    m(2, "one", -3)
}
fn m3() -> MachineView {
    m(3, "one", -4)
}
fn m4() -> MachineView {
    m(4, "two", -1)
}
fn m5() -> MachineView {
    m(5, "two", -2)
}
fn m6() -> MachineView {
    m(6, "two", -7)
}
fn m7() -> MachineView {
    annotated(m(7, "two", -5))
}
fn m8() -> MachineView {
    annotated(m(8, "two", -6))
}

#[test]
fn select_machine_for_scale_down_table() {
    struct Case {
        name: &'static str,
        machines: Vec<MachineView>,
        failure_domains: Option<Vec<&'static str>>,
        want: &'static str,
        set: EligibleSet,
    }
    let cases = vec![
        Case {
            name: "machines needing upgrade: the oldest in the failure domain with the most machines needing upgrade",
            machines: vec![m1(), m2(), m3(), m4(), outdated(m5())],
            failure_domains: None,
            want: "machine-5",
            set: EligibleSet::Outdated,
        },
        Case {
            name: "no outdated machines: the oldest machine in the largest failure domain",
            machines: vec![m1(), m2(), m3(), m4()],
            failure_domains: None,
            want: "machine-3",
            set: EligibleSet::All,
        },
        Case {
            name: "a single outdated machine with the delete annotation is the one",
            machines: vec![outdated(m6()), outdated(m7()), m8()],
            failure_domains: None,
            want: "machine-7",
            set: EligibleSet::OutdatedWithDeleteAnnotation,
        },
        Case {
            name: "several outdated machines with the delete annotation: the oldest marked one",
            machines: vec![m6(), outdated(m7()), outdated(m8())],
            failure_domains: None,
            want: "machine-8",
            set: EligibleSet::OutdatedWithDeleteAnnotation,
        },
        Case {
            name: "annotated machines that are not outdated: the oldest marked one",
            machines: vec![m6(), m7(), m8()],
            failure_domains: None,
            want: "machine-8",
            set: EligibleSet::WithDeleteAnnotation,
        },
        Case {
            name: "an outdated annotated machine wins over an older outdated one",
            machines: vec![m1(), m2(), outdated(m3()), m4(), m5(), outdated(m7())],
            failure_domains: None,
            want: "machine-7",
            set: EligibleSet::OutdatedWithDeleteAnnotation,
        },
        Case {
            name: "an up-to-date annotated machine wins over outdated machines without annotation",
            machines: vec![outdated(m1()), outdated(m2()), outdated(m3()), m4(), m8()],
            failure_domains: None,
            want: "machine-8",
            set: EligibleSet::WithDeleteAnnotation,
        },
        Case {
            name: "outdated machines with unhealthy components go before other outdated machines",
            machines: vec![outdated(m2()), outdated(m3()), {
                let mut m = outdated(m1());
                m.components_healthy = Some(false);
                m
            }],
            failure_domains: None,
            want: "machine-1",
            set: EligibleSet::OutdatedWithUnhealthyComponents,
        },
        Case {
            name: "unknown component health is not unhealthy (transient), so all outdated are eligible",
            machines: vec![outdated(m2()), outdated(m3()), {
                let mut m = outdated(m1());
                m.components_healthy = None;
                m
            }],
            failure_domains: None,
            want: "machine-3",
            set: EligibleSet::Outdated,
        },
        Case {
            name: "a machine outside the Cluster's failure domains goes first",
            machines: vec![m2(), m3(), m(9, "gone", 5)],
            failure_domains: None,
            want: "machine-9",
            set: EligibleSet::All,
        },
        Case {
            name: "without failure domains: the oldest machine",
            machines: vec![m4(), m5(), m6()],
            failure_domains: Some(vec![]),
            want: "machine-6",
            set: EligibleSet::All,
        },
        Case {
            name: "equal eligible counts: the domain with more machines overall",
            machines: vec![outdated(m1()), m2(), outdated(m4())],
            failure_domains: None,
            want: "machine-1",
            set: EligibleSet::Outdated,
        },
        Case {
            name: "full tie between domains: the first domain by name (upstream: random)",
            machines: vec![m(1, "two", 0), m(2, "one", 0)],
            failure_domains: None,
            want: "machine-2",
            set: EligibleSet::All,
        },
    ];
    for case in cases {
        let mut v = view(case.machines);
        if let Some(fds) = case.failure_domains {
            v.failure_domains = fds.into_iter().map(String::from).collect();
        }
        let pick = select_machine_for_scale_down(&v).expect(case.name);
        assert_eq!(pick.machine, case.want, "{}: {pick}", case.name);
        assert_eq!(pick.set, case.set, "{}: {pick}", case.name);
    }
}

#[test]
fn the_pick_explains_itself() {
    let v = view(vec![m1(), m2(), m3(), m4()]);
    let pick = select_machine_for_scale_down(&v).unwrap();
    assert_eq!(
        pick.to_string(),
        "machine-3 from all machines (4 eligible); failure domain one has the most machines (3 eligible, 3 in total); oldest eligible machine there"
    );
}

#[test]
fn scale_down_preflight_table() {
    struct Case {
        name: &'static str,
        view: ControlPlaneView,
        want: Result<&'static str, ScaleDownRule>,
        text: &'static str,
    }
    let base = || view(vec![m2(), m3(), m4(), m5()]); // picks machine-3 (fd one, oldest)
    let with = |f: &dyn Fn(&mut ControlPlaneView)| {
        let mut v = base();
        f(&mut v);
        v
    };
    let cases = vec![
        Case {
            name: "healthy control plane: go, with the quorum numbers",
            view: base(),
            want: Ok("machine-3"),
            text: "removing node-3-00000003 leaves 3 of 3 voters healthy, quorum needs 2",
        },
        Case {
            name: "as many machines as desired: nothing to do",
            view: with(&|v| v.desired_replicas = 4),
            want: Err(ScaleDownRule::NotNeeded),
            text: "4 machines for 4 desired replicas",
        },
        Case {
            name: "a machine is deleting: wait",
            view: with(&|v| v.machines[2].deleting = Some(start())),
            want: Err(ScaleDownRule::MachineDeleting),
            text: "deleting: machine-4",
        },
        Case {
            name: "another machine has unhealthy components: wait",
            view: with(&|v| v.machines[2].components_healthy = Some(false)),
            want: Err(ScaleDownRule::OtherMachineUnhealthy),
            text: "machine-4 has unhealthy control-plane components",
        },
        Case {
            name: "another machine's component health is unknown: wait",
            view: with(&|v| v.machines[0].components_healthy = None),
            want: Err(ScaleDownRule::OtherMachineUnhealthy),
            text: "machine-2 control-plane component health is unknown",
        },
        Case {
            name: "another machine has no node yet: wait",
            view: with(&|v| v.machines[3].node_ref = None),
            want: Err(ScaleDownRule::OtherMachineUnhealthy),
            text: "machine-5 has no node yet",
        },
        Case {
            name: "another machine's etcd member is unhealthy: wait",
            view: with(&|v| {
                if let EtcdState::Observed(m) = &mut v.etcd {
                    m.members[2].probe_error = Some("connection refused".into());
                }
            }),
            want: Err(ScaleDownRule::OtherMachineUnhealthy),
            text: "machine-4 etcd member node-4-00000004 is unhealthy (connection refused)",
        },
        Case {
            name: "the target itself being unhealthy does not block",
            view: with(&|v| v.machines[1].components_healthy = Some(false)),
            want: Ok("machine-3"),
            text: "",
        },
        Case {
            name: "a learner joining blocks on quorum",
            view: with(&|v| {
                if let EtcdState::Observed(m) = &mut v.etcd {
                    m.members.push(MemberView {
                        id: 99,
                        name: "joining-0000abcd".into(),
                        learner: true,
                        probe_error: None,
                        alarms: vec![],
                    });
                }
            }),
            want: Err(ScaleDownRule::Etcd(Rule::EtcdQuorumAtRisk)),
            text: "learner joining-0000abcd has not been promoted yet",
        },
        Case {
            name: "an unhealthy member without Machine counts in quorum",
            view: with(&|v| {
                v.machines.truncate(2); // machine-2 and the target machine-3
                v.desired_replicas = 1;
                if let EtcdState::Observed(m) = &mut v.etcd {
                    m.members.retain(|x| x.id == 2 || x.id == 3);
                    m.members.push(MemberView {
                        id: 42,
                        name: "orphan-0000002a".into(),
                        learner: false,
                        probe_error: Some("i/o timeout".into()),
                        alarms: vec![],
                    });
                }
            }),
            want: Err(ScaleDownRule::Etcd(Rule::EtcdQuorumAtRisk)),
            text: "would leave 1 of 2 voters healthy, quorum needs 2",
        },
        Case {
            name: "unreadable membership: wait, never guess",
            view: with(&|v| {
                v.etcd = EtcdState::Unreachable {
                    reason: "tls: unknown certificate authority".into(),
                }
            }),
            want: Err(ScaleDownRule::Etcd(Rule::EtcdMembershipUnknown)),
            text: "unknown certificate authority",
        },
        Case {
            name: "etcd not managed: no etcd step",
            view: with(&|v| v.etcd = EtcdState::NotManaged),
            want: Ok("machine-3"),
            text: "",
        },
    ];
    for case in cases {
        let got = decide_scale_down(&case.view);
        match (&got, case.want) {
            (
                ScaleDownDecision::Go {
                    scale_down,
                    message,
                },
                Ok(machine),
            ) => {
                assert_eq!(scale_down.machine, machine, "{}", case.name);
                assert!(message.contains(case.text), "{}: {message}", case.name);
            }
            (ScaleDownDecision::Wait { rule, message }, Err(want)) => {
                assert_eq!(*rule, want, "{}: {message}", case.name);
                assert!(message.contains(case.text), "{}: {message}", case.name);
            }
            _ => panic!("{}: got {got:?}", case.name),
        }
    }
}

#[test]
fn scale_down_of_the_leader_plans_a_transfer_to_the_newest_healthy_machine() {
    let mut v = view(vec![m2(), m3(), m4(), m5()]);
    if let EtcdState::Observed(m) = &mut v.etcd {
        m.leader = Some(3);
    }
    let ScaleDownDecision::Go { scale_down, .. } = decide_scale_down(&v) else {
        panic!("expected go")
    };
    assert_eq!(
        (scale_down.member, scale_down.transferee),
        (Some(3), Some(4))
    );
}

#[test]
fn scale_down_of_a_node_without_etcd_costs_nothing() {
    let mut v = view(vec![m2(), m3(), m4(), m5()]);
    v.machines[1].etcd_member = None;
    if let EtcdState::Observed(m) = &mut v.etcd {
        m.members.retain(|x| x.id != 3);
    }
    let ScaleDownDecision::Go {
        scale_down,
        message,
    } = decide_scale_down(&v)
    else {
        panic!("expected go")
    };
    assert_eq!((scale_down.member, scale_down.transferee), (None, None));
    assert!(
        message.contains("machine-3 has no etcd member"),
        "{message}"
    );
}
