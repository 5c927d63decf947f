//! The Machine counts a reconcile reports: the replica fields of the status
//! and the numbers the contract conditions quote. Pure.

use super::world::World;

/// Counts shared by the replica fields and the conditions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Replicas {
    pub desired: i32,
    /// Not deleting.
    pub live: i32,
    pub ready: i32,
    pub available: i32,
    pub up_to_date: i32,
    pub not_ready: Vec<String>,
    /// Each outdated Machine not deleting, with its reasons.
    pub outdated: Vec<String>,
    /// Outdated Machines not deleting yet: what the rollout still replaces.
    pub rolling_out: i32,
}

/// Count the Machines of `world`, `outdated` saying which need a rollout.
pub fn replicas(world: &World, outdated: &crate::rollout::OutdatedMachines) -> Replicas {
    let mut r = Replicas {
        desired: world.kcp.desired_replicas(),
        ..Replicas::default()
    };
    for m in &world.machines {
        let name = m.metadata.name.clone().unwrap_or_default();
        let reasons = outdated.get(&name).cloned().unwrap_or_default();
        if reasons.is_empty() {
            r.up_to_date += 1;
        } else if !m.is_deleting() {
            // A deleting Machine is on its way out: nothing left to roll.
            r.rolling_out += 1;
            r.outdated
                .push(format!("{name} ({})", crate::rollout::describe(&reasons)));
        }
        if m.is_deleting() {
            continue;
        }
        r.live += 1;
        let ready = m
            .node_name()
            .and_then(|n| world.node(n))
            .and_then(|n| n.ready)
            == Some(true);
        if ready {
            r.ready += 1;
            r.available += 1;
        } else {
            r.not_ready.push(name);
        }
    }
    r
}
