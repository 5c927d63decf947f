//! Act: carry out the ONE action the plan chose. Each step is idempotent and
//! leaves a trace in the world (an annotation, a deletion, a membership change)
//! that the next observation reads, so a restart between any two steps resumes
//! without repeating or skipping one.

use std::sync::Arc;
use std::time::Instant;

use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use serde_json::json;
use tracing::info;

use crate::api::Machine;
use crate::api::names::{PRE_TERMINATE_HOOK_ANNOTATION, REMEDIATION_IN_PROGRESS_ANNOTATION};
use crate::etcd::{EtcdCluster, LeaderMove};
use crate::remediation::steps::{BORN_HOOK_VALUE, Step, UPSTREAM_TAKEOVER_RULE, hook_value};
use crate::space_rule::SpaceStep;

use super::context::Context;
use super::create::create_machine;
use super::error::{Error, Result};
use super::kcp_metadata::patch_kcp_metadata;
use super::publish::{machine_ref, publish, publish_about};
use crate::decision::plan::{Action, Plan};
use crate::decision::step_events;
use crate::decision::world::World;

/// What acting did, for status and events.
#[derive(Debug, Default)]
pub struct Outcome {
    /// The replacement (or scale-up) Machine created, if any.
    pub created: Option<String>,
    /// `status.lastRemediation` to record, if a replacement was created.
    pub last_remediation: Option<crate::api::RemediationData>,
    /// The etcd snapshot taken (or attempted) for `spec.etcdBackup`.
    pub snapshot: Option<crate::decision::etcd_backup::SnapshotOutcome>,
    /// What a restore step came to, when it changes status.
    pub restore: Option<crate::decision::etcd_restore::RestoreOutcome>,
}

/// Carry out `plan.action`. `etcd` is the workload cluster's etcd, when managed.
pub async fn act(
    ctx: &Context,
    world: &World,
    plan: &Plan,
    etcd: Option<Arc<EtcdCluster>>,
) -> Result<Outcome> {
    let kcp = &world.kcp;
    let namespace = kcp.namespace().unwrap_or_default();
    let machines: Api<Machine> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut outcome = Outcome::default();
    // A RemoveMember that found its member already gone (the plan's member
    // list was older than the fresh snapshot the removal checks again).
    let mut already_gone = false;
    let (removal, step) = match &plan.action {
        Action::Idle | Action::Wait => return Ok(outcome),
        Action::CreateMachine => {
            let name = create_machine(ctx, world, None).await?;
            publish_about(
                ctx,
                kcp,
                EventType::Normal,
                "MachineCreated",
                &format!("created Machine {name}: {}", plan.message),
                Some(machine_ref(&namespace, &name)),
            )
            .await;
            outcome.created = Some(name);
            return Ok(outcome);
        }
        Action::RemoveOrphan {
            member,
            label,
            kind,
            assessment,
        } => {
            let step = "remove-orphan-member".to_string();
            let etcd = require_etcd(&etcd, world, &step)?;
            let started = Instant::now();
            // Checked again on the membership as it is now; leadership moved
            // off it first if it leads.
            let removed = etcd
                .safe_remove(*member)
                .await
                .map_err(|source| Error::Etcd { step, source })?;
            ctx.metrics
                .etcd_operation("remove_member", started.elapsed());
            super::etcd_snapshot::consume_waiver(ctx, world, *member, None).await;
            let moved = match &removed.leader_move {
                Some(LeaderMove::Moved { to, .. }) => {
                    format!(" (it led etcd: leadership moved to {to})")
                }
                _ => String::new(),
            };
            let note = format!(
                "removed {kind} etcd member {label}{moved}: {assessment}; checked again when removed: {}",
                removed.assessment
            );
            info!(?removed, "{note}");
            publish(
                ctx,
                kcp,
                EventType::Normal,
                "EtcdOrphanMemberRemoved",
                &note,
            )
            .await;
            return Ok(outcome);
        }
        Action::EtcdSpace { step } => {
            act_on_space(ctx, world, plan, step, etcd).await?;
            return Ok(outcome);
        }
        Action::EtcdSnapshot {
            purpose,
            from,
            before_removal_of,
        } => {
            let etcd = require_etcd(&etcd, world, "etcd-snapshot")?;
            outcome.snapshot = Some(
                super::etcd_snapshot::take(
                    ctx,
                    world,
                    plan,
                    *purpose,
                    *from,
                    *before_removal_of,
                    etcd,
                )
                .await?,
            );
            return Ok(outcome);
        }
        Action::EtcdRestore { step } => {
            outcome.restore = super::etcd_restore::act(ctx, world, plan, step).await?;
            return Ok(outcome);
        }
        Action::AddHooks { machines: names } => {
            for name in names {
                let patch = json!({"metadata": {
                    "resourceVersion": observed_version(world, name),
                    "annotations": {PRE_TERMINATE_HOOK_ANNOTATION: BORN_HOOK_VALUE},
                }});
                machines
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(|source| Error::Act {
                        step: "add-hooks".into(),
                        source,
                    })?;
            }
            let note = format!("{} ({})", plan.message, plan.rule);
            publish(ctx, kcp, EventType::Normal, "PreTerminateHookAdded", &note).await;
            info!(rule = %plan.rule, "{note}");
            return Ok(outcome);
        }
        Action::Step { removal, step } => (removal, step),
    };
    let step_name = step.name().to_string();
    let act_err = |source| Error::Act {
        step: step_name.clone(),
        source,
    };
    match step {
        // Writes that act as locks or carry state between steps are
        // conditional on the version observed: a 409 means observe again.
        Step::RecordRemediation { value } => {
            let annotations = json!({REMEDIATION_IN_PROGRESS_ANNOTATION: value.to_annotation()});
            patch_kcp_metadata(ctx, kcp, json!({ "annotations": annotations }), true)
                .await
                .map_err(act_err)?;
        }
        Step::AddHook { machine, member } => {
            let patch = json!({"metadata": {
                "resourceVersion": observed_version(world, machine),
                "annotations": {PRE_TERMINATE_HOOK_ANNOTATION: hook_value(*member)},
            }});
            machines
                .patch(machine, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(act_err)?;
        }
        Step::RecordHookMember { machine, member } => {
            let patch = json!({"metadata": {
                "resourceVersion": observed_version(world, machine),
                "annotations": {PRE_TERMINATE_HOOK_ANNOTATION: hook_value(Some(*member))},
            }});
            machines
                .patch(machine, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(act_err)?;
        }
        Step::MoveLeadership { from, to } => {
            // Beside the reconcile: a later pass confirms it (etcd_leader_move).
            let etcd = require_etcd(&etcd, world, &step_name)?;
            super::etcd_leader_move::start(ctx, world, etcd, &removal.machine, *from, *to);
        }
        Step::DeleteMachine { machine } => {
            let uid = world.machine(machine).and_then(|m| m.uid());
            let params = DeleteParams {
                preconditions: uid.map(|uid| Preconditions {
                    uid: Some(uid),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match machines.delete(machine, &params).await {
                Ok(_) => {}
                // Already gone: the step's effect is there.
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(act_err(e)),
            }
        }
        Step::RemoveMember {
            member,
            via,
            assessment,
        } => {
            let etcd = require_etcd(&etcd, world, &step_name)?;
            let started = Instant::now();
            // The plan's quorum check is some milliseconds old: checked again
            // on a snapshot taken now, sent to the member the plan chose.
            let removed = etcd
                .safe_remove_via(*member, *via)
                .await
                .map_err(|source| Error::Etcd {
                    step: step_name.clone(),
                    source,
                })?;
            already_gone = matches!(
                removed.removal,
                crate::etcd::ops::Removal::AlreadyGone { .. }
            );
            ctx.metrics
                .etcd_operation("remove_member", started.elapsed());
            info!(?removed, planned = %assessment, "etcd member removed");
            super::etcd_snapshot::consume_waiver(ctx, world, *member, Some(&removal.machine)).await;
        }
        Step::ReleaseHook { machine } => {
            // cluster-api-k3s's hook goes with ours, in the same write: the
            // steps reach this only once the member is gone.
            let annotations = crate::decision::view::hooks_to_release(
                world
                    .machine(machine)
                    .and_then(|m| m.metadata.annotations.as_ref()),
            );
            let patch = json!({"metadata": {
                "resourceVersion": observed_version(world, machine),
                "annotations": annotations,
            }});
            match machines
                .patch(machine, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(act_err(e)),
            }
        }
        Step::CreateReplacement { remediation_for } => {
            let name = create_machine(ctx, world, Some(remediation_for)).await?;
            outcome.created = Some(name);
            outcome.last_remediation = Some(crate::api::RemediationData::from(remediation_for));
        }
        Step::ClearRemediationInProgress => {
            let annotations = json!({REMEDIATION_IN_PROGRESS_ANNOTATION: null});
            patch_kcp_metadata(ctx, kcp, json!({ "annotations": annotations }), true)
                .await
                .map_err(act_err)?;
        }
        Step::Wait { .. } | Step::Done => return Ok(outcome),
    }
    let related = || Some(machine_ref(&namespace, &removal.machine));
    if let Some(event) = step_events::rollout_event(&plan.view, &plan.rule, removal) {
        publish_about(ctx, kcp, event.type_, event.reason, &event.note, related()).await;
    }
    if let Some(event) =
        step_events::upstream_hook_event(world.machine(&removal.machine), &plan.view, removal, step)
    {
        publish_about(ctx, kcp, event.type_, event.reason, &event.note, related()).await;
        info!(step = %step_name, machine = %removal.machine, rule = UPSTREAM_TAKEOVER_RULE, "{}", event.note);
    }
    let event = if already_gone {
        step_events::member_already_gone_event(&plan.view, &plan.rule, removal, step)
    } else {
        step_events::removal_step_event(
            &plan.view,
            &plan.rule,
            removal,
            step,
            outcome.created.as_deref(),
        )
    };
    // Related to the Machine being removed, so that every removal's Events form
    // their own series (the recorder folds Events of one reason and related object).
    publish_about(ctx, kcp, event.type_, event.reason, &event.note, related()).await;
    if let Some(outcome) = event.remediation_outcome {
        ctx.metrics.remediation(outcome);
    }
    let note = event.note;
    info!(step = %step_name, machine = %removal.machine, "{note}");
    Ok(outcome)
}

/// Take one step on etcd's space and publish it as an Event with the numbers.
async fn act_on_space(
    ctx: &Context,
    world: &World,
    plan: &Plan,
    step: &SpaceStep,
    etcd: Option<Arc<EtcdCluster>>,
) -> Result<()> {
    let name = format!("etcd-{}", step.name());
    let etcd = require_etcd(&etcd, world, &name)?;
    let failed = |source| Error::Etcd {
        step: name.clone(),
        source,
    };
    let rule = &plan.rule;
    let started = Instant::now();
    // What a defragmentation measured holds until the next compaction.
    let cluster = format!(
        "{}/{}",
        world.kcp.namespace().unwrap_or_default(),
        world.cluster_name.as_deref().unwrap_or_default()
    );
    let defragmented = || ctx.defragmented.lock().unwrap_or_else(|p| p.into_inner());
    let note = match step {
        SpaceStep::Defragment { member, .. } => {
            let done = etcd.defragment(*member).await.map_err(failed)?;
            let history_compacted = matches!(&world.etcd_history, Some(Ok(h)) if h.compacted);
            defragmented().record(
                &cluster,
                *member,
                crate::space_rule::Defragmentation {
                    revision: done.revision,
                    history_compacted,
                },
            );
            ctx.metrics.etcd_operation("defragment", started.elapsed());
            format!("defragmented etcd member {} ({rule})", done.describe())
        }
        SpaceStep::MoveLeader { from, label } => {
            let moved = etcd.move_leader_for_space(*from).await.map_err(failed)?;
            ctx.metrics.etcd_operation("move_leader", started.elapsed());
            let to = match &moved {
                LeaderMove::Moved { to, .. } => to.clone(),
                LeaderMove::NotLeader { leader, .. } => {
                    leader.clone().unwrap_or_else(|| "none".into())
                }
            };
            format!(
                "moved etcd leadership from {label} to {to}, so that {label} can be defragmented: {} ({rule})",
                plan.message
            )
        }
        SpaceStep::Compact { .. } => {
            let done = etcd.compact().await.map_err(failed)?;
            defragmented().forget(&cluster);
            ctx.metrics.etcd_operation("compact", started.elapsed());
            let what = if done.already {
                format!(
                    "the etcd history was compacted to revision {} already",
                    done.revision
                )
            } else {
                format!(
                    "compacted the etcd history to revision {} (through {}, {} ms)",
                    done.revision, done.via, done.elapsed_ms
                )
            };
            format!("{what}: {} ({rule})", plan.message)
        }
        SpaceStep::DisarmNospace => {
            let quota = crate::decision::etcd_space::configured_quota(world);
            let done = etcd
                .disarm_nospace(&quota, &world.etcd_space.thresholds)
                .await
                .map_err(failed)?;
            ctx.metrics
                .etcd_operation("disarm_nospace", started.elapsed());
            format!(
                "disarmed NOSPACE on {}: {} ({rule})",
                if done.members.is_empty() {
                    "no member (none had it any more)".to_string()
                } else {
                    done.members.join(", ")
                },
                done.room
            )
        }
    };
    ctx.metrics.etcd_space_step(step.name());
    info!(step = %name, "{note}");
    // About a member's Machine, when it has one.
    let related = step_events::space_step_member(step)
        .and_then(|id| {
            plan.mapping
                .as_ref()
                .and_then(|m| m.pairs.iter().find(|p| p.member.id == id))
        })
        .map(|p| machine_ref(&world.kcp.namespace().unwrap_or_default(), &p.machine));
    let reason = step_events::space_step_reason(step);
    publish_about(ctx, &world.kcp, EventType::Normal, reason, &note, related).await;
    Ok(())
}

/// The resourceVersion of `machine` as observed (null when it was not: the
/// patch is then unconditional, as for a Machine that vanished).
fn observed_version(world: &World, machine: &str) -> serde_json::Value {
    world
        .machine(machine)
        .and_then(|m| m.resource_version())
        .map_or(serde_json::Value::Null, serde_json::Value::String)
}

pub(super) fn require_etcd(
    etcd: &Option<Arc<EtcdCluster>>,
    world: &World,
    step: &str,
) -> Result<Arc<EtcdCluster>> {
    etcd.clone().ok_or_else(|| Error::Precondition {
        step: step.to_string(),
        reason: format!(
            "no etcd connection for Cluster {}/{} (Secret {}-etcd, keys tls.crt/tls.key, and a control-plane Node with an InternalIP are needed)",
            world.kcp.namespace().unwrap_or_default(),
            world.cluster_name.as_deref().unwrap_or("?"),
            world.cluster_name.as_deref().unwrap_or("<cluster>"),
        ),
    })
}
