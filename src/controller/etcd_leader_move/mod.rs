//! Moving etcd's leadership off a member about to be removed (not the
//! controller replicas' election: that is [`super::replica_election`]).
//!
//! A leadership move that does not hold a reconcile worker: the MoveLeader
//! call runs beside the reconcile, which records the move and requeues; a
//! later pass sees the new leader in its own snapshot, says so, and the
//! removal goes on. The record is in memory: after a restart the target
//! still leads (the step machine asks for the move again) or no longer does
//! (it goes on), so nothing is lost with it.

use std::sync::Arc;

use kube::runtime::events::EventType;
use tracing::info;

use crate::decision::leadership_move;
use crate::decision::world::{EtcdObservation, LeadershipMove, World};
use crate::etcd::EtcdCluster;

use super::context::Context;
use super::publish::{machine_ref, publish_about};

pub mod in_flight;

fn cluster_key(world: &World) -> String {
    format!(
        "{}/{}",
        world.kcp.metadata.namespace.as_deref().unwrap_or_default(),
        world.cluster_name.as_deref().unwrap_or_default()
    )
}

/// The move under way on `world`'s cluster, as its snapshot shows it: one
/// that came through ([`leadership_move::confirmed_leader`]) is confirmed
/// here (an Event about the Machine with the time it took, the metric) and
/// forgotten. Until then the removal waits, as a move in flight.
pub async fn observe(ctx: &Context, world: &World) -> Option<LeadershipMove> {
    let key = cluster_key(world);
    let (moving, started) = ctx.leadership_moves.get(&key)?;
    let (Some(leader), EtcdObservation::Observed(snapshot)) = (
        leadership_move::confirmed_leader(&moving, &world.etcd),
        &world.etcd,
    ) else {
        return Some(moving);
    };
    ctx.leadership_moves.forget(&key, &moving);
    let took = started.elapsed();
    ctx.metrics.etcd_operation("move_leader", took);
    let label = |id: u64| {
        snapshot
            .member(id)
            .map_or_else(|| format!("{id:016x}"), |m| m.label())
    };
    let note = format!(
        "moved etcd leadership from {} to {} (removing {}), confirmed after {} ms",
        label(moving.from),
        label(leader),
        moving.machine,
        took.as_millis()
    );
    info!(machine = %moving.machine, "{note}");
    let related = Some(machine_ref(
        world.kcp.metadata.namespace.as_deref().unwrap_or_default(),
        &moving.machine,
    ));
    publish_about(
        ctx,
        &world.kcp,
        EventType::Normal,
        "EtcdLeadershipMoved",
        &note,
        related,
    )
    .await;
    None
}

/// Start moving leadership off `from` (the member of `machine`) to `to`:
/// recorded, then asked for beside the reconcile. A failed call forgets the
/// record, so the next pass asks again.
pub fn start(
    ctx: &Context,
    world: &World,
    etcd: Arc<EtcdCluster>,
    machine: &str,
    from: u64,
    to: u64,
) {
    let timeouts = etcd.timeouts();
    let allowed = timeouts.move_leader() + timeouts.confirmation();
    let moving = leadership_move::started(machine, from, to, world.now, allowed);
    let key = cluster_key(world);
    ctx.leadership_moves.insert(&key, moving.clone());
    let moves = ctx.leadership_moves.clone();
    tokio::spawn(async move {
        if let Err(err) = etcd.move_leader_off(from, Some(to)).await {
            info!(%err, machine = %moving.machine, "etcd leadership move failed; it is asked for again on the next pass");
            moves.forget(&key, &moving);
        }
    });
}
