//! `SpecValid`: whether `spec` passed the validator the CRD's CEL rules
//! repeat.

use crate::api::condition_names::{SPEC_VALID, spec_valid};

use super::super::plan::{Plan, Refusal};
use super::{Value, value};

/// `SpecValid`: False with the validation errors when the plan refused an
/// invalid spec; True otherwise (no plan, another refusal, or a plan).
pub fn spec_valid(plan: Option<Result<&Plan, &Refusal>>) -> Value {
    match plan {
        Some(Err(Refusal::Invalid(errors))) => value(
            SPEC_VALID,
            Some(false),
            spec_valid::REASON_INVALID_SPEC,
            errors.to_string(),
        ),
        _ => value(SPEC_VALID, Some(true), spec_valid::REASON_VALID, ""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::validate::Rule;
    use crate::api::{ValidationError, ValidationErrors};

    #[test]
    fn spec_valid_condition() {
        let invalid = Refusal::Invalid(ValidationErrors(vec![ValidationError {
            object: "ns/cp".into(),
            rule: Rule::ReplicasOddWithEmbeddedEtcd,
            message: "2 is even".into(),
        }]));
        let cases = [
            (
                "an invalid spec is refused",
                Some(Err(&invalid)),
                Some(false),
                spec_valid::REASON_INVALID_SPEC,
                "ns/cp: spec.replicas",
            ),
            (
                "another refusal says nothing of the spec",
                Some(Err(&Refusal::NoCluster)),
                Some(true),
                spec_valid::REASON_VALID,
                "",
            ),
            (
                "the lifecycle stopped before a plan",
                None,
                Some(true),
                spec_valid::REASON_VALID,
                "",
            ),
        ];
        for (name, plan, status, reason, message) in cases {
            let got = spec_valid(plan);
            assert_eq!(got.type_, SPEC_VALID, "{name}");
            assert_eq!((got.status, got.reason), (status, reason), "{name}");
            assert!(got.message.contains(message), "{name}: {}", got.message);
        }
    }
}
