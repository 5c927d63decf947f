//! The CAPI `cluster.x-k8s.io/v1beta2` `Cluster` fields we read (references,
//! initialization, conditions, failure domains); unknown fields are preserved.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::conditions::V1Beta1Condition;
use super::refs::ContractVersionedObjectReference;

/// Cluster spec (subset).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cluster.x-k8s.io",
    version = "v1beta2",
    kind = "Cluster",
    plural = "clusters",
    shortname = "cl",
    category = "cluster-api",
    namespaced,
    status = "ClusterStatus",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSpec {
    /// Our KThreesControlPlane.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_ref: Option<ContractVersionedObjectReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_ref: Option<ContractVersionedObjectReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// Where the workload API server is reached (set by the infrastructure provider).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<ApiEndpoint>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

impl Cluster {
    /// `spec.topology.version` of a Cluster made from a ClusterClass
    /// (`spec.topology.classRef.name` set); `None` otherwise.
    pub fn topology_version(&self) -> Option<&str> {
        let topology = self.spec.extra.get("topology")?;
        let class = topology
            .pointer("/classRef/name")
            .or_else(|| topology.get("class"))
            .and_then(Value::as_str)
            .filter(|c| !c.is_empty());
        class?;
        topology
            .get("version")
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty())
    }
}

/// `spec.controlPlaneEndpoint`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ApiEndpoint {
    #[serde(default)]
    pub host: String,
    #[serde(default)]
    pub port: i32,
}

impl ApiEndpoint {
    /// Set and usable: a host and a port in range (CAPI's `IsValid`).
    pub fn is_valid(&self) -> bool {
        !self.host.is_empty() && self.port > 0 && self.port <= 65535
    }
}

/// Cluster status (subset).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<ClusterInitializationStatus>,
    /// Failure domains synced from the infrastructure provider.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failure_domains: Vec<FailureDomain>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deprecated: Option<ClusterDeprecatedStatus>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// `status.initialization`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterInitializationStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_provisioned: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_initialized: Option<bool>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// One failure domain (v1beta2 is a list keyed by name).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailureDomain {
    pub name: String,
    /// Whether control-plane machines may be placed there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane: Option<bool>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, String>,
}

/// `status.deprecated`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ClusterDeprecatedStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub v1beta1: Option<ClusterV1Beta1DeprecatedStatus>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// `status.deprecated.v1beta1`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ClusterV1Beta1DeprecatedStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<V1Beta1Condition>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

impl Cluster {
    /// `spec.controlPlaneEndpoint`, when set and valid.
    pub fn control_plane_endpoint(&self) -> Option<&ApiEndpoint> {
        self.spec
            .control_plane_endpoint
            .as_ref()
            .filter(|e| e.is_valid())
    }

    /// `status.initialization.infrastructureProvisioned` (v1beta2), or the
    /// v1beta1 `status.infrastructureReady` an older CAPI writes.
    pub fn infrastructure_provisioned(&self) -> bool {
        let Some(status) = self.status.as_ref() else {
            return false;
        };
        status
            .initialization
            .as_ref()
            .and_then(|i| i.infrastructure_provisioned)
            .or_else(|| {
                status
                    .extra
                    .get("infrastructureReady")
                    .and_then(Value::as_bool)
            })
            .unwrap_or(false)
    }

    /// Whether the Cluster is being deleted.
    pub fn is_deleting(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }

    /// Whether CAPI reports the control plane initialized (v1beta2 contract).
    pub fn control_plane_initialized(&self) -> bool {
        self.status
            .as_ref()
            .and_then(|s| s.initialization.as_ref())
            .and_then(|i| i.control_plane_initialized)
            .unwrap_or(false)
    }

    /// Names of failure domains eligible for control-plane machines.
    pub fn control_plane_failure_domains(&self) -> Vec<&str> {
        self.status
            .iter()
            .flat_map(|s| s.failure_domains.iter())
            .filter(|fd| fd.control_plane.unwrap_or(false))
            .map(|fd| fd.name.as_str())
            .collect()
    }
}
