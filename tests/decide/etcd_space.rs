//! etcd's space in the decision record, as table tests named after the
//! situation: three control-plane Machines with their Nodes and members
//! (cp-0 leads), every member healthy with a 100 MiB quota unless a case
//! changes that. What the plan does, the rule, `EtcdSpaceHealthy` and the
//! Event of a wait.

use k3s_control_plane::api::names::ETCD_QUOTA_ANNOTATION;
use k3s_control_plane::decision::fixtures::{WorldBuilder, member_name};
use k3s_control_plane::decision::plan::Action;
use k3s_control_plane::decision::world::{EtcdObservation, World};
use k3s_control_plane::decision::{Decision, decide, decide_lifecycle};
use k3s_control_plane::etcd::MembershipSnapshot;
use k3s_control_plane::space_rule::{
    Defragmentation, History, SpaceSettings, SpaceStep, Thresholds,
};
use kube::runtime::events::EventType;

const MIB: i64 = 1024 * 1024;

/// Space care on, every member 10 MiB of which 9 in use: nothing to do.
fn world() -> World {
    let mut w = WorldBuilder::new()
        .three_healthy_servers()
        .with_annotations(&[(ETCD_QUOTA_ANNOTATION, "100Mi")])
        .with_etcd_space(SpaceSettings {
            care: true,
            thresholds: Thresholds::default(),
            default_quota: 2 << 30,
        })
        .build();
    for i in 0..3 {
        sized(&mut w, i, 10, 9);
    }
    w
}

fn snapshot(w: &mut World) -> &mut MembershipSnapshot {
    match &mut w.etcd {
        EtcdObservation::Observed(s) => s,
        other => panic!("{other:?}"),
    }
}

/// Member `i` at `db` MiB, `in_use` MiB of it in use.
fn sized(w: &mut World, i: usize, db: i64, in_use: i64) {
    let status = snapshot(w).members[i].status.as_mut().unwrap();
    status.db_size = db * MIB;
    status.db_size_in_use = in_use * MIB;
}

/// Member `i` as our last defragmentation of it left it, nothing written
/// since (its revision is the one it reported then).
fn defragmented_now(w: &mut World, i: usize) {
    let member = &snapshot(w).members[i];
    let (id, revision) = (member.id, member.status.as_ref().unwrap().revision);
    let history_compacted = matches!(&w.etcd_history, Some(Ok(h)) if h.compacted);
    w.etcd_defragmented.insert(
        id,
        Defragmentation {
            revision,
            history_compacted,
        },
    );
}

/// NOSPACE raised against member `i`: listed against it, reported by all.
fn nospace(w: &mut World, i: usize) {
    let snap = snapshot(w);
    let id = snap.members[i].id;
    snap.members[i].alarms = vec!["NOSPACE".into()];
    for m in &mut snap.members {
        m.status.as_mut().unwrap().errors = vec![format!("memberID:{id} alarm:NOSPACE ")];
    }
}

/// Machine `m<i>` deleting (CAPI holds it with its finalizer).
fn deleting(w: &mut World, i: usize) {
    let m = &mut w.machines[i].metadata;
    m.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    m.finalizers = Some(vec!["machine.cluster.x-k8s.io".into()]);
}

fn decided(w: &World) -> Decision {
    decide(w, decide_lifecycle(w))
}

/// What a case expects: the plan's action (or a wait), its rule, and
/// `EtcdSpaceHealthy` (status, reason); `None` when absent.
struct Expect {
    action: Option<SpaceStep>,
    rule: &'static str,
    condition: Option<(&'static str, &'static str)>,
}

fn check(name: &str, w: &World, expect: &Expect) -> Decision {
    let d = decided(w);
    let plan = d
        .planned()
        .unwrap_or_else(|| panic!("{name}: no plan: {}", d.message()));
    match (&plan.action, &expect.action) {
        (Action::EtcdSpace { step }, Some(want)) => assert_eq!(step, want, "{name}"),
        (other, Some(want)) => panic!(
            "{name}: expected {want:?}, got {other:?} ({})",
            plan.message
        ),
        (Action::EtcdSpace { step }, None) => panic!("{name}: unexpected {step:?}"),
        (_, None) => {}
    }
    assert_eq!(plan.rule, expect.rule, "{name}: {}", plan.message);
    let condition = d
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == "EtcdSpaceHealthy")
        .map(|c| (c.status.as_str(), c.reason.as_str()));
    assert_eq!(condition, expect.condition, "{name}: {}", plan.message);
    d
}

#[test]
fn table() {
    let defrag = |i: u64| SpaceStep::Defragment {
        member: i + 1,
        label: member_name(i),
    };
    type Case = (&'static str, fn(&mut World), Expect);
    let cases: Vec<Case> = vec![
        (
            "every member has room and none is fragmented: steady",
            |_| {},
            Expect {
                action: None,
                rule: "steady",
                condition: Some(("True", "Healthy")),
            },
        ),
        (
            "space care off: a full, NOSPACE cluster is left alone and no condition is written",
            |w| {
                w.etcd_space.care = false;
                sized(w, 1, 100, 20);
                nospace(w, 1);
            },
            Expect {
                action: None,
                rule: "steady",
                condition: None,
            },
        ),
        (
            "a big fragmented follower is defragmented when nothing else is to be done",
            |w| sized(w, 2, 80, 10),
            Expect {
                action: Some(defrag(2)),
                rule: "etcd-space.defragment",
                condition: Some(("True", "Defragmenting")),
            },
        ),
        (
            "only the leader is due: its leadership moves first",
            |w| sized(w, 0, 80, 10),
            Expect {
                action: Some(SpaceStep::MoveLeader {
                    from: 1,
                    label: member_name(0),
                }),
                rule: "etcd-space.move-leader",
                condition: Some(("True", "Defragmenting")),
            },
        ),
        (
            "a routine defragmentation waits for a scale-up",
            |w| {
                sized(w, 2, 80, 10);
                w.kcp.spec.replicas = Some(5);
            },
            Expect {
                action: None,
                rule: "scale-up",
                condition: Some(("True", "Defragmenting")),
            },
        ),
        (
            "NOSPACE on a follower with free pages: it is defragmented first",
            |w| {
                sized(w, 1, 100, 20);
                nospace(w, 1);
            },
            Expect {
                action: Some(defrag(1)),
                rule: "etcd-space.defragment",
                condition: Some(("False", "RecoveringFromNoSpace")),
            },
        ),
        (
            "NOSPACE goes before a scale-up: the cluster refuses writes",
            |w| {
                sized(w, 1, 100, 20);
                nospace(w, 1);
                w.kcp.spec.replicas = Some(5);
            },
            Expect {
                action: Some(defrag(1)),
                rule: "etcd-space.defragment",
                condition: Some(("False", "RecoveringFromNoSpace")),
            },
        ),
        (
            "NOSPACE with history filling the quota: compact to the current revision",
            |w| {
                sized(w, 1, 100, 95);
                nospace(w, 1);
                w.etcd_history = Some(Ok(History {
                    revision: 500,
                    compacted: false,
                }));
            },
            Expect {
                action: Some(SpaceStep::Compact { revision: 500 }),
                rule: "etcd-space.compact",
                condition: Some(("False", "RecoveringFromNoSpace")),
            },
        ),
        (
            "NOSPACE with every member back under its limit: disarm",
            |w| {
                sized(w, 1, 30, 29);
                nospace(w, 1);
            },
            Expect {
                action: Some(SpaceStep::DisarmNospace),
                rule: "etcd-space.disarm-nospace",
                condition: Some(("False", "RecoveringFromNoSpace")),
            },
        ),
        (
            "NOSPACE whose live data fills the quota even compacted: refused with the numbers",
            |w| {
                sized(w, 1, 96, 96);
                nospace(w, 1);
                w.etcd_history = Some(Ok(History {
                    revision: 500,
                    compacted: true,
                }));
                defragmented_now(w, 1);
            },
            Expect {
                action: None,
                rule: "etcd-space.blocked.not-enough-room",
                condition: Some(("False", "NoSpace")),
            },
        ),
        (
            "NOSPACE, compacted, in use reported as the whole file but not measured: defragment, which measures",
            |w| {
                sized(w, 1, 96, 96);
                nospace(w, 1);
                w.etcd_history = Some(Ok(History {
                    revision: 500,
                    compacted: true,
                }));
            },
            Expect {
                action: Some(defrag(1)),
                rule: "etcd-space.defragment",
                condition: Some(("False", "RecoveringFromNoSpace")),
            },
        ),
        (
            "NOSPACE, compacted, defragmented by us before a write: not measured now, defragment again",
            |w| {
                sized(w, 1, 96, 96);
                defragmented_now(w, 1);
                w.etcd_defragmented
                    .values_mut()
                    .for_each(|d| d.revision -= 1);
                nospace(w, 1);
                w.etcd_history = Some(Ok(History {
                    revision: 500,
                    compacted: true,
                }));
            },
            Expect {
                action: Some(defrag(1)),
                rule: "etcd-space.defragment",
                condition: Some(("False", "RecoveringFromNoSpace")),
            },
        ),
        (
            "NOSPACE, defragmented by us, then the history compacted (by a person): not measured now, defragment again",
            |w| {
                sized(w, 1, 96, 96);
                nospace(w, 1);
                defragmented_now(w, 1);
                w.etcd_history = Some(Ok(History {
                    revision: 500,
                    compacted: true,
                }));
            },
            Expect {
                action: Some(defrag(1)),
                rule: "etcd-space.defragment",
                condition: Some(("False", "RecoveringFromNoSpace")),
            },
        ),
        (
            "NOSPACE with another member down: refused, naming it",
            |w| {
                sized(w, 1, 100, 20);
                nospace(w, 1);
                let m = &mut snapshot(w).members[2];
                m.status = None;
                m.probe_error = Some("connection refused".into());
            },
            Expect {
                action: None,
                rule: "etcd-space.blocked.unhealthy-member",
                condition: Some(("False", "NoSpace")),
            },
        ),
        (
            "a routine defragmentation waits while a Machine is being deleted (its removal goes first)",
            |w| {
                sized(w, 2, 80, 10);
                deleting(w, 1);
            },
            Expect {
                action: None,
                rule: "removal.wait.drain",
                condition: Some(("True", "DefragmentationWaiting")),
            },
        ),
        (
            "NOSPACE waits for a Machine whose hook is released to be gone",
            |w| {
                sized(w, 2, 100, 20);
                nospace(w, 2);
                deleting(w, 1);
                // Our part is over: CAPI is finishing the deletion.
                w.machines[1].metadata.annotations = None;
            },
            Expect {
                action: None,
                rule: "etcd-space.wait.membership-change",
                condition: Some(("False", "NoSpace")),
            },
        ),
        (
            "a removal in flight goes before NOSPACE recovery",
            |w| {
                sized(w, 2, 100, 20);
                nospace(w, 2);
                deleting(w, 0);
                w.machines[0].metadata.annotations = Some(
                    [(
                        k3s_control_plane::api::names::PRE_TERMINATE_HOOK_ANNOTATION.to_string(),
                        k3s_control_plane::remediation::steps::hook_value(Some(1)),
                    )]
                    .into(),
                );
            },
            Expect {
                action: None,
                rule: "removal.wait.drain",
                condition: Some(("False", "NoSpace")),
            },
        ),
        (
            "a quota annotation that is not one: refused naming the annotation",
            |w| {
                w.kcp.metadata.annotations.as_mut().unwrap().insert(
                    "controlplane.cluster.x-k8s.io/etcd-quota-backend-bytes".into(),
                    "lots".into(),
                );
            },
            Expect {
                action: None,
                rule: "etcd-space.blocked.quota-unknown",
                condition: Some(("True", "DefragmentationBlocked")),
            },
        ),
    ];
    for (name, setup, expect) in cases {
        let mut w = world();
        setup(&mut w);
        check(name, &w, &expect);
    }
}

#[test]
fn a_refusal_is_a_warning_with_the_numbers_and_a_wait_for_a_membership_change_is_normal() {
    let mut w = world();
    sized(&mut w, 1, 96, 96);
    nospace(&mut w, 1);
    w.etcd_history = Some(Ok(History {
        revision: 500,
        compacted: true,
    }));
    defragmented_now(&mut w, 1);
    let d = decided(&w);
    let event = d.event().expect("a blocked space rule is announced");
    assert_eq!(
        (event.type_, event.reason),
        (EventType::Warning, "EtcdSpaceBlocked")
    );
    assert!(
        event.note.contains("cp-1-00000002 still has no room: it must be at most 90.0 MiB (90% of its quota), but its live data alone is 96.0 MiB")
            && event.note.ends_with("(etcd-space.blocked.not-enough-room)"),
        "{}",
        event.note
    );
    assert!(!d.acts());

    let mut w = world();
    sized(&mut w, 2, 80, 10);
    w.machines[1].status = None;
    let d = decided(&w);
    let event = d.event().expect("a wait is announced");
    assert_eq!(
        (event.type_, event.reason),
        (EventType::Normal, "EtcdSpaceWaiting")
    );
    assert!(
        event.note.contains("Machine m1 has no Node yet"),
        "{}",
        event.note
    );
}

#[test]
fn a_step_acts_and_the_record_carries_every_members_sizes() {
    let mut w = world();
    sized(&mut w, 1, 100, 20);
    nospace(&mut w, 1);
    let d = decided(&w);
    assert!(d.acts());
    let space = d.etcd_space.as_ref().expect("etcd was observed");
    let full = space.cluster.member(2).unwrap();
    assert!(full.nospace);
    assert_eq!(full.quota, Some(100 * 1024 * 1024));
    assert_eq!(full.sizes.unwrap().db_size, 100 * 1024 * 1024);
    assert!(space.cluster.members.iter().all(|m| m.problem.is_none()));
    // Off, the sizes are still there, with no verdict.
    w.etcd_space.care = false;
    let d = decided(&w);
    assert!(d.etcd_space.as_ref().unwrap().decision.is_none());
    assert!(!d.acts());
}

#[test]
fn the_history_is_read_only_when_a_compaction_may_be_due() {
    use k3s_control_plane::decision::etcd_space::needs_history;
    let mut w = world();
    assert!(!needs_history(&w));
    sized(&mut w, 1, 100, 20);
    nospace(&mut w, 1);
    assert!(!needs_history(&w), "defragmenting is enough");
    sized(&mut w, 1, 100, 95);
    assert!(needs_history(&w));
    w.etcd_space.care = false;
    assert!(!needs_history(&w));
}
