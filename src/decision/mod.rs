//! Decide once: from the observed [`world::World`] to one [`record::Decision`]
//! (the mapping, the view, the desired state, the lifecycle step, the plan
//! with its rule and message, and the status and conditions they imply).
//! Pure: the controller observes the world and acts on the record; status,
//! Events, `inspect` and the demo read the same record.

pub mod chain;
pub mod conditions;
pub mod etcd_backup;
pub mod etcd_restore;
pub mod etcd_space;
pub mod events;
#[cfg(any(test, feature = "sandbox"))]
pub mod fixtures;
pub mod k3s_serving;
pub mod leadership_move;
pub mod machine_sync;
pub mod pace;
pub mod placement;
pub mod plan;
pub mod record;
pub mod replicas;
pub mod restore_finish;
pub mod shard;
pub mod snapshot_policy;
pub mod status;
pub mod step_events;
pub mod view;
pub mod world;

pub use record::{Decision, DecisionEvent, decide, decide_lifecycle};
