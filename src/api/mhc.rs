//! The CAPI `cluster.x-k8s.io/v1beta2` `MachineHealthCheck` fields we read;
//! unknown fields are preserved.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// MachineHealthCheck spec (subset).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cluster.x-k8s.io",
    version = "v1beta2",
    kind = "MachineHealthCheck",
    plural = "machinehealthchecks",
    shortname = "mhc",
    category = "cluster-api",
    namespaced,
    status = "MachineHealthCheckStatus",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct MachineHealthCheckSpec {
    #[serde(default)]
    pub cluster_name: String,
    /// Which Machines are checked.
    #[serde(default)]
    pub selector: LabelSelector,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checks: Option<MachineHealthCheckChecks>,
    /// When and how remediation is triggered (kept as is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remediation: Option<MachineHealthCheckRemediation>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// `spec.checks`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineHealthCheckChecks {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_startup_timeout_seconds: Option<i32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unhealthy_node_conditions: Vec<UnhealthyNodeCondition>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// A Node condition that makes a Machine unhealthy after a timeout.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UnhealthyNodeCondition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<i32>,
}

/// `spec.remediation`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineHealthCheckRemediation {
    /// External remediation template; when set, the owner does NOT remediate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_ref: Option<RemediationTemplateReference>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// `spec.remediation.templateRef`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RemediationTemplateReference {
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub api_version: String,
}

/// MachineHealthCheck status (subset).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineHealthCheckStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_machines: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_healthy: Option<i32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}
