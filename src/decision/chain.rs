//! Whether a pass chained after a removal's step may act on what it decided.
//! A reconcile whose step of a removal landed decides again at once, on a
//! fresh read (`controller::reconcile`); such a pass only takes the next step
//! of that same removal, or waits, or idles. Any other action is left to the
//! next reconcile, so a chain never starts a second removal. Pure.

use super::plan::Action;

/// Whether a pass chained after a step of the removal of `removing` may
/// carry out its decision: one that `acts` may only if its plan's `action`
/// (`None` for a lifecycle decision, which has no plan) is a step of that
/// removal.
pub fn chained_pass_may_act(removing: &str, acts: bool, action: Option<&Action>) -> bool {
    !acts || matches!(action, Some(Action::Step { removal, .. }) if removal.machine == removing)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remediation::steps::{Removal, RemovalKind, Step};

    fn step_of(machine: &str) -> Action {
        Action::Step {
            removal: Removal {
                machine: machine.into(),
                kind: RemovalKind::ScaleDown,
            },
            step: Step::DeleteMachine {
                machine: machine.into(),
            },
        }
    }

    #[test]
    fn a_chained_pass_acts_only_on_the_next_step_of_its_removal() {
        let cases = [
            (
                "the_next_step_of_the_same_removal",
                true,
                Some(step_of("m1")),
                true,
            ),
            (
                "a_step_of_another_removal",
                true,
                Some(step_of("m2")),
                false,
            ),
            (
                "another_action_such_as_a_new_machine",
                true,
                Some(Action::CreateMachine),
                false,
            ),
            ("a_lifecycle_step_such_as_a_secret_write", true, None, false),
            ("a_wait", false, Some(Action::Wait), true),
            ("nothing_to_do", false, Some(Action::Idle), true),
            ("a_lifecycle_wait_or_a_refusal", false, None, true),
        ];
        for (name, acts, action, may) in cases {
            assert_eq!(
                chained_pass_may_act("m1", acts, action.as_ref()),
                may,
                "{name}"
            );
        }
    }
}
