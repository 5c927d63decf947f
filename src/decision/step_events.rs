//! Which Event each step gets once it landed: a removal's step (its reason,
//! its note, the remediation outcome it counts as), the extra Events a rollout
//! or cluster-api-k3s's hook add to it, an etcd space step's reason and the
//! member it is about, a teardown step's reason; and the Warning of a step
//! that failed. Pure: the controller publishes what these say
//! (docs/operations.md lists every reason).

use kube::ResourceExt;
use kube::runtime::events::EventType;

use crate::api::Machine;
use crate::api::names::{
    UPSTREAM_PRE_TERMINATE_HOOK_ANNOTATION, UPSTREAM_PRE_TERMINATE_HOOK_VALUE,
};
use crate::lifecycle::DeletionStep;
use crate::remediation::ControlPlaneView;
use crate::remediation::steps::{Removal, RemovalKind, Step, UPSTREAM_TAKEOVER_RULE};
use crate::space_rule::SpaceStep;

use super::plan::Action;
use super::record::DecisionEvent;

fn normal(reason: &'static str, note: String) -> DecisionEvent {
    DecisionEvent {
        type_: EventType::Normal,
        reason,
        note,
        remediation_outcome: None,
    }
}

/// The Event of a removal's `step`, taken under `rule` on `view`; `created`
/// names the Machine a replacement step created. Related to the Machine being
/// removed, so that each removal's Events form their own series.
pub fn removal_step_event(
    view: &ControlPlaneView,
    rule: &str,
    removal: &Removal,
    step: &Step,
    created: Option<&str>,
) -> DecisionEvent {
    DecisionEvent {
        remediation_outcome: remediation_outcome(removal, step),
        ..normal(
            removal_step_reason(step),
            removal_step_note(view, rule, removal, step, created),
        )
    }
}

/// The Event of a `RemoveMember` step whose member was no longer listed when
/// the removal was checked again on a fresh snapshot: the plan read an older
/// member list (a member that had not yet applied the removal), so nothing was
/// removed now, and `EtcdMemberRemoved`, once per removal, is not repeated.
pub fn member_already_gone_event(
    view: &ControlPlaneView,
    rule: &str,
    removal: &Removal,
    step: &Step,
) -> DecisionEvent {
    let member = match step {
        Step::RemoveMember { member, .. } => member_label(view, *member),
        other => other.to_string(),
    };
    DecisionEvent {
        reason: "EtcdMemberAlreadyRemoved",
        note: format!(
            "etcd member {member} of {} was no longer listed when its removal was checked again on a fresh snapshot: nothing removed ({rule})",
            removal.machine
        ),
        ..removal_step_event(view, rule, removal, step, None)
    }
}

/// A member by its name where the view knows it, else by its id.
fn member_label(view: &ControlPlaneView, id: u64) -> String {
    view.membership()
        .and_then(|m| m.member(id))
        .map(|m| m.label())
        .unwrap_or_else(|| format!("{id:016x}"))
}

/// The Event reason of each step of a removal.
pub fn removal_step_reason(step: &Step) -> &'static str {
    match step {
        Step::RecordRemediation { .. } => "RemediationStarted",
        Step::AddHook { .. } => "PreTerminateHookAdded",
        Step::RecordHookMember { .. } => "EtcdMemberRecorded",
        Step::MoveLeadership { .. } => "EtcdLeadershipMoveStarted",
        Step::DeleteMachine { .. } => "MachineDeleting",
        Step::RemoveMember { .. } => "EtcdMemberRemoved",
        Step::ReleaseHook { .. } => "PreTerminateHookReleased",
        Step::CreateReplacement { .. } => "ReplacementCreated",
        Step::ClearRemediationInProgress => "RemediationCompleted",
        Step::Wait { .. } => "Waiting",
        Step::Done => "Done",
    }
}

/// What the step did, with the members by name where the view knows them.
fn removal_step_note(
    view: &ControlPlaneView,
    rule: &str,
    removal: &Removal,
    step: &Step,
    created: Option<&str>,
) -> String {
    let member_name = |id: u64| member_label(view, id);
    match step {
        Step::MoveLeadership { from, to } => format!(
            "moving etcd leadership from {} to {} (removing {}); confirmed on a later pass",
            member_name(*from),
            member_name(*to),
            removal.machine
        ),
        Step::RemoveMember {
            member, assessment, ..
        } => {
            format!(
                "removed etcd member {} of {}: {assessment}",
                member_name(*member),
                removal.machine
            )
        }
        Step::CreateReplacement { remediation_for } => format!(
            "created Machine {} to replace {} (retry {})",
            created.unwrap_or("?"),
            remediation_for.machine,
            remediation_for.retry_count
        ),
        _ => format!("{}: {step} ({rule})", removal.machine),
    }
}

/// A remediation's outcomes only (`k3scp_remediations_total{outcome}`):
/// scale-down and rollout removals take the same steps but are no remediation.
fn remediation_outcome(removal: &Removal, step: &Step) -> Option<&'static str> {
    if !matches!(removal.kind, RemovalKind::Remediation { .. }) {
        return None;
    }
    Some(match step {
        Step::RecordRemediation { .. } => "started",
        Step::CreateReplacement { .. } => "completed",
        _ => "step",
    })
}

/// One Event per Machine a rollout replaces, saying why it is replaced
/// (`RollingOutMachine`), for a step of a rollout's removal.
pub fn rollout_event(
    view: &ControlPlaneView,
    rule: &str,
    removal: &Removal,
) -> Option<DecisionEvent> {
    if !rule.starts_with("rollout.remove") {
        return None;
    }
    let machine = view.machine(&removal.machine)?;
    Some(normal(
        "RollingOutMachine",
        format!(
            "replacing outdated Machine {}: {} ({rule})",
            removal.machine,
            crate::rollout::describe(&machine.outdated_reasons),
        ),
    ))
}

/// The Event saying that `step` took over or released cluster-api-k3s's
/// hook on the Machine being removed (`observed` as read), if it did.
pub fn upstream_hook_event(
    observed: Option<&Machine>,
    view: &ControlPlaneView,
    removal: &Removal,
    step: &Step,
) -> Option<DecisionEvent> {
    let observed = observed?;
    if !super::view::has_upstream_hook(observed.annotations()) {
        return None;
    }
    let machine = &removal.machine;
    let hook =
        format!("{UPSTREAM_PRE_TERMINATE_HOOK_ANNOTATION}={UPSTREAM_PRE_TERMINATE_HOOK_VALUE}");
    match step {
        Step::AddHook { member, .. } if observed.is_deleting() => Some(normal(
            "UpstreamHookTakenOver",
            format!(
                "taking over Machine {machine}, left deleting by cluster-api-k3s with its hook {hook}: {} per the etcd membership; our hook now guards it until that member is gone ({UPSTREAM_TAKEOVER_RULE})",
                match member {
                    Some(id) => format!("etcd member {id:016x}"),
                    None => "no etcd member".to_string(),
                }
            ),
        )),
        Step::ReleaseHook { .. } => {
            let id = view.machine(machine).and_then(|m| m.hook_member);
            Some(normal(
                "UpstreamHookReleased",
                format!(
                    "released cluster-api-k3s's hook {hook} on Machine {machine} together with ours: {} is not in the etcd membership ({UPSTREAM_TAKEOVER_RULE})",
                    match id {
                        Some(id) => format!("its etcd member {id:016x}"),
                        None => "its etcd member".to_string(),
                    }
                ),
            ))
        }
        _ => None,
    }
}

/// The Warning of an action that failed under `rule` with `error`: `action`
/// is the plan's (`None` for a lifecycle step); a remediation's step that
/// failed counts as the remediation outcome `failed`.
pub fn step_failed_event(action: Option<&Action>, rule: &str, error: &str) -> DecisionEvent {
    let remediation = matches!(
        action,
        Some(Action::Step {
            removal: Removal {
                kind: RemovalKind::Remediation { .. },
                ..
            },
            ..
        })
    );
    DecisionEvent {
        type_: EventType::Warning,
        reason: "StepFailed",
        note: format!("{error} ({rule})"),
        remediation_outcome: remediation.then_some("failed"),
    }
}

/// The Event reason of each etcd space step.
pub fn space_step_reason(step: &SpaceStep) -> &'static str {
    match step {
        SpaceStep::Defragment { .. } => "EtcdDefragmented",
        SpaceStep::MoveLeader { .. } => "EtcdLeadershipMoved",
        SpaceStep::Compact { .. } => "EtcdCompacted",
        SpaceStep::DisarmNospace => "EtcdAlarmDisarmed",
    }
}

/// The member a space step is about, when it is one member's: its Event is
/// then related to that member's Machine, so that each member's step is a
/// series of its own (the recorder folds Events of one reason and related
/// object into one series).
pub fn space_step_member(step: &SpaceStep) -> Option<u64> {
    match step {
        SpaceStep::Defragment { member, .. } => Some(*member),
        SpaceStep::MoveLeader { from, .. } => Some(*from),
        SpaceStep::Compact { .. } | SpaceStep::DisarmNospace => None,
    }
}

/// The Event reason of a teardown step that acted.
pub fn deletion_step_reason(step: &DeletionStep) -> &'static str {
    match step {
        DeletionStep::DeleteMachines { .. } => "DeletingControlPlaneMachines",
        DeletionStep::ReleaseHooks { .. } => "PreTerminateHookReleased",
        DeletionStep::RemoveFinalizer => "ControlPlaneDeleted",
        DeletionStep::WaitForWorkers { .. }
        | DeletionStep::WaitForMachines { .. }
        | DeletionStep::Done => "Deleting",
    }
}

#[cfg(test)]
mod tests {
    use chrono::{TimeZone, Utc};
    use serde_json::json;

    use crate::quorum::MemberView;
    use crate::remediation::steps::WaitReason;
    use crate::remediation::{
        EtcdState, MachineView, Membership, RemediationData, RemediationStrategy,
    };
    use crate::rollout::OutdatedReason;

    use super::*;

    fn member(id: u64) -> MemberView {
        MemberView::healthy_voter(id, format!("node-m{id}-{id:08x}"))
    }

    /// Three Machines m1..m3 with members 1..3; m2 is outdated (version)
    /// and its hook records member 2.
    fn view() -> ControlPlaneView {
        let created = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
        let machines = (1..=3)
            .map(|i| {
                let mut m = MachineView::new(&format!("m{i}"), created);
                m.etcd_member = Some(i);
                if i == 2 {
                    m.hook_member = Some(2);
                    m.outdated_reasons = vec![OutdatedReason::Version {
                        has: Some("v1.30.2+k3s2".into()),
                        wants: "v1.31.0+k3s1".into(),
                    }];
                }
                m
            })
            .collect();
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

    fn record(machine: &str) -> RemediationData {
        RemediationData {
            machine: machine.into(),
            timestamp: None,
            retry_count: 1,
        }
    }

    fn remediation(machine: &str) -> Removal {
        Removal {
            machine: machine.into(),
            kind: RemovalKind::Remediation {
                record: record(machine),
            },
        }
    }

    fn scale_down(machine: &str) -> Removal {
        Removal {
            machine: machine.into(),
            kind: RemovalKind::ScaleDown,
        }
    }

    fn machine(annotations: serde_json::Value, deleting: bool) -> Machine {
        let mut value = json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": "m2", "namespace": "ns", "annotations": annotations},
            "spec": {"clusterName": "c"},
        });
        if deleting {
            value["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn each_removal_step_has_its_reason() {
        let cases = [
            (
                "remediation_recorded",
                Step::RecordRemediation {
                    value: record("m2"),
                },
                "RemediationStarted",
            ),
            (
                "hook_added",
                Step::AddHook {
                    machine: "m2".into(),
                    member: Some(2),
                },
                "PreTerminateHookAdded",
            ),
            (
                "hook_member_recorded",
                Step::RecordHookMember {
                    machine: "m2".into(),
                    member: 2,
                },
                "EtcdMemberRecorded",
            ),
            (
                "leadership_move_started",
                Step::MoveLeadership { from: 2, to: 1 },
                "EtcdLeadershipMoveStarted",
            ),
            (
                "machine_deleted",
                Step::DeleteMachine {
                    machine: "m2".into(),
                },
                "MachineDeleting",
            ),
            (
                "member_removed",
                Step::RemoveMember {
                    member: 2,
                    via: 1,
                    assessment: crate::quorum::assess_removal(&[member(1), member(2)], 2),
                },
                "EtcdMemberRemoved",
            ),
            (
                "hook_released",
                Step::ReleaseHook {
                    machine: "m2".into(),
                },
                "PreTerminateHookReleased",
            ),
            (
                "replacement_created",
                Step::CreateReplacement {
                    remediation_for: record("m2"),
                },
                "ReplacementCreated",
            ),
            (
                "remediation_cleared",
                Step::ClearRemediationInProgress,
                "RemediationCompleted",
            ),
            (
                "a_wait",
                Step::Wait {
                    reason: WaitReason::Drain,
                    message: "draining".into(),
                },
                "Waiting",
            ),
            ("done", Step::Done, "Done"),
        ];
        for (name, step, reason) in cases {
            assert_eq!(removal_step_reason(&step), reason, "{name}");
        }
    }

    #[test]
    fn a_removal_steps_note_names_members_and_what_it_did() {
        let cases = [
            (
                "a_leadership_move_names_both_members",
                Step::MoveLeadership { from: 2, to: 1 },
                None,
                "moving etcd leadership from node-m2-00000002 to node-m1-00000001 (removing m2); confirmed on a later pass",
            ),
            (
                "a_member_unknown_to_the_view_is_named_by_its_id",
                Step::MoveLeadership { from: 9, to: 1 },
                None,
                "moving etcd leadership from 0000000000000009 to node-m1-00000001 (removing m2); confirmed on a later pass",
            ),
            (
                "a_replacement_names_the_machine_created_and_the_retry",
                Step::CreateReplacement {
                    remediation_for: record("m2"),
                },
                Some("m4"),
                "created Machine m4 to replace m2 (retry 1)",
            ),
            (
                "any_other_step_says_what_it_did_under_its_rule",
                Step::DeleteMachine {
                    machine: "m2".into(),
                },
                None,
                "m2: delete Machine m2 (remediation.remove)",
            ),
        ];
        for (name, step, created, note) in cases {
            let event = removal_step_event(
                &view(),
                "remediation.remove",
                &remediation("m2"),
                &step,
                created,
            );
            assert_eq!(event.note, note, "{name}");
            assert_eq!(event.type_, EventType::Normal, "{name}");
        }
        let assessment = crate::quorum::assess_removal(&[member(1), member(2), member(3)], 2);
        let removed = Step::RemoveMember {
            member: 2,
            via: 1,
            assessment: assessment.clone(),
        };
        assert_eq!(
            removal_step_event(&view(), "r", &scale_down("m2"), &removed, None).note,
            format!("removed etcd member node-m2-00000002 of m2: {assessment}")
        );
    }

    /// The member was gone by the time the removal was checked again: its
    /// own reason (never a second `EtcdMemberRemoved`), the member and the
    /// Machine named, and the step still counted as the remediation's.
    #[test]
    fn a_member_found_already_gone_is_no_second_removal() {
        let assessment = crate::quorum::assess_removal(&[member(1), member(2), member(3)], 2);
        let removed = Step::RemoveMember {
            member: 2,
            via: 1,
            assessment,
        };
        let event =
            member_already_gone_event(&view(), "remediation.remove", &remediation("m2"), &removed);
        assert_eq!(event.reason, "EtcdMemberAlreadyRemoved");
        assert_ne!(event.reason, removal_step_reason(&removed));
        assert_eq!(
            event.note,
            "etcd member node-m2-00000002 of m2 was no longer listed when its removal was checked again on a fresh snapshot: nothing removed (remediation.remove)"
        );
        assert_eq!(event.type_, EventType::Normal);
        assert_eq!(
            event.remediation_outcome,
            removal_step_event(
                &view(),
                "remediation.remove",
                &remediation("m2"),
                &removed,
                None
            )
            .remediation_outcome
        );
    }

    #[test]
    fn only_a_remediation_counts_its_steps_as_remediation_outcomes() {
        let delete = Step::DeleteMachine {
            machine: "m2".into(),
        };
        let cases = [
            (
                "a_remediation_starts",
                remediation("m2"),
                Step::RecordRemediation {
                    value: record("m2"),
                },
                Some("started"),
            ),
            (
                "a_remediation_completes_with_its_replacement",
                remediation("m2"),
                Step::CreateReplacement {
                    remediation_for: record("m2"),
                },
                Some("completed"),
            ),
            (
                "a_remediation_takes_a_step",
                remediation("m2"),
                delete.clone(),
                Some("step"),
            ),
            (
                "a_scale_down_is_no_remediation",
                scale_down("m2"),
                delete,
                None,
            ),
        ];
        for (name, removal, step, outcome) in cases {
            assert_eq!(
                removal_step_event(&view(), "r", &removal, &step, Some("m4")).remediation_outcome,
                outcome,
                "{name}"
            );
        }
    }

    #[test]
    fn a_rollouts_removal_says_why_the_machine_is_replaced() {
        let cases = [
            (
                "a_rollout_removal_of_an_outdated_machine",
                "rollout.remove-outdated",
                "m2",
                Some(
                    "replacing outdated Machine m2: version v1.30.2+k3s2 -> v1.31.0+k3s1 (rollout.remove-outdated)",
                ),
            ),
            (
                "a_scale_down_is_no_rollout",
                "scale-down.remove",
                "m2",
                None,
            ),
            (
                "a_machine_the_view_does_not_hold",
                "rollout.remove-outdated",
                "m9",
                None,
            ),
        ];
        for (name, rule, machine, note) in cases {
            let event = rollout_event(&view(), rule, &scale_down(machine));
            assert_eq!(event.as_ref().map(|e| e.note.as_str()), note, "{name}");
            if let Some(event) = event {
                assert_eq!(event.reason, "RollingOutMachine", "{name}");
            }
        }
    }

    #[test]
    fn taking_over_or_releasing_cluster_api_k3s_hook_is_announced() {
        let upstream =
            json!({UPSTREAM_PRE_TERMINATE_HOOK_ANNOTATION: UPSTREAM_PRE_TERMINATE_HOOK_VALUE});
        let add_hook = Step::AddHook {
            machine: "m2".into(),
            member: Some(2),
        };
        let release = Step::ReleaseHook {
            machine: "m2".into(),
        };
        let cases = [
            (
                "our_hook_added_to_a_machine_it_left_deleting",
                Some(machine(upstream.clone(), true)),
                add_hook.clone(),
                Some("UpstreamHookTakenOver"),
            ),
            (
                "our_hook_added_to_a_machine_not_deleting",
                Some(machine(upstream.clone(), false)),
                add_hook.clone(),
                None,
            ),
            (
                "its_hook_released_with_ours",
                Some(machine(upstream.clone(), true)),
                release.clone(),
                Some("UpstreamHookReleased"),
            ),
            (
                "its_key_under_another_value_is_not_its_hook",
                Some(machine(
                    json!({UPSTREAM_PRE_TERMINATE_HOOK_ANNOTATION: "someone-else"}),
                    true,
                )),
                release.clone(),
                None,
            ),
            ("a_machine_not_observed", None, release, None),
            (
                "a_step_that_does_not_touch_hooks",
                Some(machine(upstream, true)),
                Step::DeleteMachine {
                    machine: "m2".into(),
                },
                None,
            ),
        ];
        for (name, observed, step, reason) in cases {
            let event = upstream_hook_event(observed.as_ref(), &view(), &scale_down("m2"), &step);
            assert_eq!(event.as_ref().map(|e| e.reason), reason, "{name}");
            if let Some(event) = event {
                assert!(event.note.contains("Machine m2"), "{name}: {}", event.note);
                assert!(
                    event.note.contains("0000000000000002"),
                    "{name}: {}",
                    event.note
                );
            }
        }
    }

    #[test]
    fn a_failed_step_is_a_warning_and_counts_only_for_a_remediation() {
        let step = |removal: Removal| Action::Step {
            step: Step::DeleteMachine {
                machine: removal.machine.clone(),
            },
            removal,
        };
        let cases = [
            (
                "a_remediation_step",
                Some(step(remediation("m2"))),
                Some("failed"),
            ),
            ("a_scale_down_step", Some(step(scale_down("m2"))), None),
            ("a_new_machine", Some(Action::CreateMachine), None),
            ("a_lifecycle_step", None, None),
        ];
        for (name, action, outcome) in cases {
            let event = step_failed_event(action.as_ref(), "some.rule", "denied");
            assert_eq!(event.type_, EventType::Warning, "{name}");
            assert_eq!(event.reason, "StepFailed", "{name}");
            assert_eq!(event.note, "denied (some.rule)", "{name}");
            assert_eq!(event.remediation_outcome, outcome, "{name}");
        }
    }

    #[test]
    fn each_space_step_has_its_reason_and_member() {
        let cases = [
            (
                "a_defragmentation",
                SpaceStep::Defragment {
                    member: 2,
                    label: "m2".into(),
                },
                "EtcdDefragmented",
                Some(2),
            ),
            (
                "a_leadership_move_for_space",
                SpaceStep::MoveLeader {
                    from: 1,
                    label: "m1".into(),
                },
                "EtcdLeadershipMoved",
                Some(1),
            ),
            (
                "a_compaction",
                SpaceStep::Compact { revision: 7 },
                "EtcdCompacted",
                None,
            ),
            (
                "nospace_disarmed",
                SpaceStep::DisarmNospace,
                "EtcdAlarmDisarmed",
                None,
            ),
        ];
        for (name, step, reason, member) in cases {
            assert_eq!(space_step_reason(&step), reason, "{name}");
            assert_eq!(space_step_member(&step), member, "{name}");
        }
    }

    #[test]
    fn each_teardown_step_has_its_reason() {
        let cases = [
            (
                "machines_deleted",
                DeletionStep::DeleteMachines {
                    machines: vec!["m1".into()],
                },
                "DeletingControlPlaneMachines",
            ),
            (
                "hooks_released",
                DeletionStep::ReleaseHooks {
                    machines: vec!["m1".into()],
                },
                "PreTerminateHookReleased",
            ),
            (
                "finalizer_removed",
                DeletionStep::RemoveFinalizer,
                "ControlPlaneDeleted",
            ),
            (
                "waiting_for_workers",
                DeletionStep::WaitForWorkers {
                    workers: vec!["w1".into()],
                },
                "Deleting",
            ),
            (
                "waiting_for_machines",
                DeletionStep::WaitForMachines {
                    machines: vec!["m1".into()],
                },
                "Deleting",
            ),
            ("done", DeletionStep::Done, "Deleting"),
        ];
        for (name, step, reason) in cases {
            assert_eq!(deletion_step_reason(&step), reason, "{name}");
        }
    }
}
