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
