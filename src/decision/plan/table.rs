//! [`plan`] (and the `choose` it ends in) as one table: each case a
//! situation built with the [`WorldBuilder`], the rule that must fire and the
//! action it must choose (as `inspect` names it; `refused` when the plan
//! refuses to decide).

use serde_json::json;

use super::*;
use crate::api::names::{
    ETCD_QUOTA_ANNOTATION, ETCD_RESTORE_ANNOTATION, REMEDIATION_IN_PROGRESS_ANNOTATION,
};
use crate::decision::fixtures::{self, WorldBuilder};
use crate::etcd::MemberSnapshot;
use crate::workload::ControlPlaneNode;

const REFUSED: &str = "connection refused";

/// The rule and the action (or `refused`) the plan comes to on `world`.
fn decided(world: &World) -> (String, String) {
    match plan(world) {
        Ok(p) => (p.rule.clone(), p.summary().action),
        Err(refusal) => (refusal.rule().to_string(), "refused".to_string()),
    }
}

/// A fourth member no Machine or Node claims, first seen an hour ago.
fn with_orphan(b: WorldBuilder) -> WorldBuilder {
    let orphan = MemberSnapshot {
        id: 9,
        name: "gone-9-0a0b0c0d".into(),
        ..fixtures::member(8)
    };
    b.with_member(orphan).edit(|w| {
        w.members_first_seen
            .insert(9, w.now - chrono::Duration::hours(1));
    })
}

/// Space care on, the 100 MiB quota of the annotation; server `machine`'s
/// member at 80 MiB of which 10 in use (fragmented: due for defragmentation).
fn fragmented(b: WorldBuilder, machine: &str) -> WorldBuilder {
    b.with_annotations(&[(ETCD_QUOTA_ANNOTATION, "100Mi")])
        .with_etcd_space(crate::space_rule::SpaceSettings {
            care: true,
            ..Default::default()
        })
        .edit_member(machine, |m| {
            let status = m.status.as_mut().unwrap();
            status.db_size = 80 << 20;
            status.db_size_in_use = 10 << 20;
        })
}

/// NOSPACE raised against server `machine`'s member (space care on).
fn out_of_space(b: WorldBuilder, machine: &str) -> WorldBuilder {
    fragmented(b, machine).edit_member(machine, |m| m.alarms = vec!["NOSPACE".into()])
}

fn s3_backup() -> serde_json::Value {
    json!({"target": {"s3": {"endpoint": "minio:9000", "bucket": "b",
                              "credentialsSecret": {"name": "keys"}}}})
}

#[test]
fn plan_table() {
    let healthy = || WorldBuilder::new().three_healthy_servers();
    // (situation, world, expected (rule, action))
    let cases: Vec<(&str, WorldBuilder, (&str, &str))> = vec![
        // Refusals: nothing is decided.
        (
            "an_even_replica_count_is_refused",
            healthy().with_replicas(2),
            ("refused.invalid-spec", "refused"),
        ),
        (
            "a_version_below_the_machines_is_refused",
            healthy().with_version("v1.29.9+k3s1"),
            ("refused.invalid-spec", "refused"),
        ),
        (
            "without_an_owning_cluster_nothing_is_decided",
            healthy().without_cluster(),
            ("refused.no-cluster", "refused"),
        ),
        (
            "two_nodes_claiming_one_member_is_refused",
            healthy().edit_node("cp-1", |n| {
                *n = ControlPlaneNode {
                    etcd_member_name: Some(fixtures::member_name(0)),
                    ..fixtures::node(1)
                }
            }),
            ("refused.ambiguous-membership", "refused"),
        ),
        (
            "a_garbled_remediation_record_is_refused",
            healthy().with_annotations(&[(REMEDIATION_IN_PROGRESS_ANNOTATION, "{not json")]),
            ("refused.invalid-object", "refused"),
        ),
        // A restore a person asked for goes before everything else.
        (
            "a_restore_asked_while_quorum_holds_waits_refused",
            healthy()
                .with_backup(s3_backup())
                .with_annotations(&[(ETCD_RESTORE_ANNOTATION, "capi-scheduled-cp-0-1765000000")]),
            ("restore.refused.quorum-holds", "wait"),
        ),
        // Then, every live Machine carries our hook.
        (
            "a_live_machine_without_our_hook_gets_it_before_anything_else",
            healthy().with_replicas(5).without_our_hook("m1"),
            ("hooks.adopt", "add-hooks"),
        ),
        // A stale remediation record is cleared before anything resumes from it.
        (
            "a_remediation_record_older_than_every_machine_is_cleared",
            healthy().with_annotations(&[(
                REMEDIATION_IN_PROGRESS_ANNOTATION,
                r#"{"machine":"m9","timestamp":"2025-12-01T00:00:00Z","retryCount":0}"#,
            )]),
            (
                "remediation.stale-in-progress",
                "clear-remediation-in-progress",
            ),
        ),
        // A removal in flight goes first, to its end.
        (
            "a_deleting_machine_still_draining_is_waited_for",
            healthy().with_replicas(5).deleting("m2"),
            ("removal.wait.drain", "wait"),
        ),
        (
            "a_deletion_someone_else_started_records_the_member_first",
            healthy()
                .with_replicas(5)
                .waiting_on_pre_terminate_hooks("m2"),
            ("removal.record-hook-member", "record-hook-member"),
        ),
        (
            "a_removal_of_ours_held_by_our_hook_removes_the_member",
            healthy()
                .with_replicas(5)
                .chosen_for_removal("m2")
                .waiting_on_pre_terminate_hooks("m2"),
            ("removal.remove-member", "remove-member"),
        ),
        // A member nothing claims counts against quorum: it goes next.
        (
            "an_orphan_member_past_its_grace_is_removed",
            with_orphan(healthy()),
            ("etcd.orphan-member", "remove-orphan-member"),
        ),
        // MHC remediation.
        (
            "an_unhealthy_machine_is_remediated",
            healthy()
                .with_unhealthy_machine("m2")
                .with_unhealthy_member("m2", REFUSED),
            ("remediation.remediate", "record-remediation"),
        ),
        (
            "a_remediation_that_would_lose_quorum_waits",
            healthy()
                .with_unhealthy_machine("m2")
                .with_unhealthy_member("m1", REFUSED),
            ("remediation.etcd.quorum-at-risk", "wait"),
        ),
        // etcd out of space refuses writes: recovering goes before scaling.
        (
            "etcd_out_of_space_is_recovered_before_scaling_up",
            out_of_space(healthy().with_replicas(5), "m2"),
            ("etcd-space.disarm-nospace", "etcd-disarm-nospace"),
        ),
        // Rollout.
        (
            "an_outdated_control_plane_surges_one_machine_first",
            healthy().with_version("v1.31.4+k3s1"),
            ("rollout.surge", "create-machine"),
        ),
        (
            "after_the_surge_an_outdated_machine_is_removed_one_at_a_time",
            healthy()
                .with_version("v1.31.4+k3s1")
                .with_server(3)
                .edit_machine("m3", |m| m.spec.version = Some("v1.31.4+k3s1".into())),
            ("rollout.remove-outdated", "add-hook"),
        ),
        (
            "a_surged_machine_not_up_yet_holds_the_rollout",
            healthy()
                .with_version("v1.31.4+k3s1")
                .with_machine(fixtures::machine("m3"))
                .edit_machine("m3", |m| m.spec.version = Some("v1.31.4+k3s1".into())),
            ("rollout.machine-provisioning", "wait"),
        ),
        // Scaling towards spec.replicas.
        (
            "no_machine_yet_creates_the_first_server",
            WorldBuilder::new(),
            ("init", "create-machine"),
        ),
        (
            "a_first_server_not_up_yet_holds_the_others_back",
            WorldBuilder::new().with_machine(fixtures::machine("m0")),
            ("scale-up.waiting-for-initialization", "wait"),
        ),
        (
            "fewer_machines_than_replicas_scales_up",
            healthy().with_replicas(5),
            ("scale-up", "create-machine"),
        ),
        (
            "an_unhealthy_member_holds_a_scale_up_back",
            healthy()
                .with_replicas(5)
                .with_unhealthy_member("m2", REFUSED),
            ("scale-up.etcd-member-unhealthy", "wait"),
        ),
        (
            "etcd_unreachable_holds_a_scale_up_back",
            healthy().with_replicas(5).etcd_unreachable("timeout"),
            ("scale-up.etcd-unreachable", "wait"),
        ),
        (
            "etcd_credentials_missing_hold_a_scale_up_back",
            healthy()
                .with_replicas(5)
                .no_credentials("Secret ns/c-etcd not found"),
            ("scale-up.etcd-unreachable", "wait"),
        ),
        (
            "more_machines_than_replicas_scales_down",
            healthy().with_server(3),
            ("scale-down", "add-hook"),
        ),
        (
            "an_unhealthy_member_of_another_machine_holds_a_scale_down_back",
            healthy()
                .with_server(3)
                .with_unhealthy_member("m1", REFUSED)
                .with_unhealthy_member("m2", REFUSED),
            ("scale-down.other-machine-unhealthy", "wait"),
        ),
        (
            "quorum_would_be_lost_refuses_scale_down",
            // Four healthy servers and three dead members nothing claims
            // (still in their grace): 4 of 7 voters, quorum 4.
            (10..13).fold(healthy().with_server(3), |b, i| {
                b.with_member(fixtures::unhealthy(
                    MemberSnapshot {
                        id: i,
                        name: format!("gone-{i}-0a0b0c0d"),
                        ..fixtures::member(i - 1)
                    },
                    REFUSED,
                ))
            }),
            ("scale-down.etcd.quorum-at-risk", "wait"),
        ),
        (
            "a_member_removal_takes_its_snapshot_first",
            healthy()
                .with_replicas(5)
                .chosen_for_removal("m2")
                .waiting_on_pre_terminate_hooks("m2")
                .with_backup(s3_backup()),
            ("backup.before-removal", "etcd-snapshot"),
        ),
        // Nothing else to do.
        (
            "as_many_healthy_machines_as_replicas_is_steady",
            healthy(),
            ("steady", "idle"),
        ),
        (
            "an_idle_pass_takes_the_scheduled_snapshot_when_due",
            healthy()
                .with_backup(json!({"target": s3_backup()["target"], "schedule": "0 * * * *"})),
            ("backup.scheduled", "etcd-snapshot"),
        ),
        (
            "a_fragmented_member_is_defragmented_when_nothing_else_is_to_be_done",
            fragmented(healthy(), "m2"),
            ("etcd-space.defragment", "etcd-defragment"),
        ),
    ];
    let mut wrong = Vec::new();
    for (name, world, (rule, action)) in cases {
        let got = decided(&world.build());
        if got != (rule.to_string(), action.to_string()) {
            wrong.push(format!("{name}: expected ({rule}, {action}), got {got:?}"));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}
