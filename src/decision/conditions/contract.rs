//! The CAPI v1beta2 control-plane contract conditions of a
//! KThreesControlPlane, together and in the order they are written.

use crate::lifecycle::{Lifecycle, plan_secrets};

use super::super::plan::Plan;
use super::super::replicas::Replicas;
use super::super::world::World;
use super::availability::{available, certificates_available, initialized};
use super::lifecycle::{deleting, paused};
use super::machines::{machines_ready, machines_up_to_date};
use super::scaling::{rolling_out, scaling_down, scaling_up};
use super::{PlanNote, Value};

/// The contract conditions. `plan` is present when the lifecycle let the
/// reconcile get as far as deciding on remediation and scaling.
pub fn contract_conditions(
    world: &World,
    lifecycle: &Lifecycle,
    plan: Option<&Plan>,
    r: &Replicas,
) -> Vec<Value> {
    let is_initialized = world.control_plane_initialized();
    let any_machine = !world.machines.is_empty();
    let note = plan.map(PlanNote::of);
    let deleting_now = matches!(lifecycle, Lifecycle::Delete { .. });
    vec![
        paused(lifecycle),
        deleting(lifecycle),
        certificates_available(&plan_secrets(&world.secrets), lifecycle),
        initialized(is_initialized, any_machine, &world.workload),
        available(is_initialized, r, &world.workload, &world.etcd),
        machines_ready(any_machine, r),
        machines_up_to_date(r),
        rolling_out(r, world.kcp.max_surge(), note),
        scaling_up(r, deleting_now, note),
        scaling_down(r, deleting_now, note),
    ]
}
