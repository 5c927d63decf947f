//! `status.lastRemediation`: the same JSON as the `remediation-in-progress` and
//! `remediation-for` annotations, e.g.
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

impl RemediationData {
    /// The status form of the remediation model's record (the annotations'
    /// JSON is parsed and written by `remediation::model::RemediationData`).
    pub fn from_model(record: &crate::remediation::model::RemediationData) -> Self {
        let timestamp = record
            .timestamp
            .and_then(|t| k8s_openapi::jiff::Timestamp::from_second(t.timestamp()).ok())
            .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        RemediationData {
            machine: record.machine.clone(),
            timestamp: Time(timestamp),
            retry_count: record.retry_count.min(i32::MAX as u32) as i32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_form_serializes_like_the_annotations() {
        let text = r#"{"machine":"m1","timestamp":"2024-05-01T10:00:00Z","retryCount":2}"#;
        let record =
            crate::remediation::model::RemediationData::parse(text, "ns/m2", "test").unwrap();
        let status = RemediationData::from_model(&record);
        assert_eq!(serde_json::to_string(&status).unwrap(), text);
    }
}
