//! `RemediationData`: the JSON kept in the `remediation-in-progress` and
//! `remediation-for` annotations and in `status.lastRemediation`, e.g.
//! `{"machine":"m1","timestamp":"2024-05-01T10:00:00Z","retryCount":0}`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One remediation of a sequence: which Machine, when, and how many retries so far.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RemediationData {
    /// Name of the Machine that was remediated.
    pub machine: String,
    /// When it happened (RFC 3339, UTC, seconds).
    pub timestamp: Time,
    /// Retries in this sequence (0 for the first remediation).
    pub retry_count: i32,
}

/// An annotation value that is not RemediationData JSON.
#[derive(Debug, thiserror::Error)]
#[error("annotation {annotation} on {object}: not remediation data JSON ({source})")]
pub struct RemediationDataError {
    pub object: String,
    pub annotation: String,
    #[source]
    pub source: serde_json::Error,
}

impl RemediationData {
    /// Parse the annotation value found on `object` (`namespace/name`).
    pub fn from_annotation(
        object: &str,
        annotation: &str,
        value: &str,
    ) -> Result<Self, RemediationDataError> {
        serde_json::from_str(value).map_err(|source| RemediationDataError {
            object: object.to_owned(),
            annotation: annotation.to_owned(),
            source,
        })
    }

    /// The annotation value.
    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).expect("RemediationData always serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::names::REMEDIATION_FOR_ANNOTATION;

    #[test]
    fn annotation_round_trips_in_upstream_format() {
        let text = r#"{"machine":"m1","timestamp":"2024-05-01T10:00:00Z","retryCount":0}"#;
        let data =
            RemediationData::from_annotation("ns/m2", REMEDIATION_FOR_ANNOTATION, text).unwrap();
        assert_eq!(data.machine, "m1");
        assert_eq!(data.retry_count, 0);
        assert_eq!(data.to_annotation(), text);
    }

    #[test]
    fn bad_annotation_names_object_and_annotation() {
        let err = RemediationData::from_annotation(
            "ns/m2",
            REMEDIATION_FOR_ANNOTATION,
            "{\"machine\":1}",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("ns/m2"), "{err}");
        assert!(err.contains(REMEDIATION_FOR_ANNOTATION), "{err}");
    }
}
