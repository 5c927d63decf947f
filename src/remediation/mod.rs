//! Remediation and scale-down of control-plane machines: the pure decision model.
//!
//! The controller observes the world into a [`model::ControlPlaneView`], then:
//! - MHC remediation: if the KCP carries a non-stale `remediation-in-progress`,
//!   it resumes that removal with [`steps::next_step`]; otherwise [`decide::decide_remediation`]
//!   picks a machine and a rule, and a `Remediate` outcome starts a removal;
//! - scale-down: [`scale_down::decide_scale_down`] picks the machine and runs the
//!   same preflight and quorum checks, then the same steps (without recording or
//!   replacement);
//! - it executes the ONE returned step and observes again.
//!
//! Nothing here does I/O or reads a clock: time is passed in.

pub mod decide;
pub mod model;
pub mod orphans;
pub mod pick;
pub mod retry;
pub mod scale_down;
pub mod steps;

pub use decide::{Outcome, Remediate, RemediationDecision, Rule, decide_remediation};
pub use model::{
    ControlPlaneView, EtcdState, MachineView, Membership, RemediationData, RemediationStrategy,
};
pub use scale_down::{ScaleDownDecision, decide_scale_down, select_machine_for_scale_down};
pub use steps::{Removal, RemovalKind, Step, WaitReason, next_step};
