//! The CAPI `cluster.x-k8s.io/v1beta2` `Machine` fields we read and write.
//! Every level we model keeps unknown fields in `extra`, so an update we send
//! never drops what other controllers wrote.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::conditions::{self, ConditionView, V1Beta1Condition};
use super::refs::ContractVersionedObjectReference;

/// Machine spec (subset).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cluster.x-k8s.io",
    version = "v1beta2",
    kind = "Machine",
    plural = "machines",
    shortname = "ma",
    category = "cluster-api",
    namespaced,
    status = "MachineStatus",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct MachineSpec {
    /// Cluster this Machine belongs to.
    #[serde(default)]
    pub cluster_name: String,
    #[serde(default)]
    pub bootstrap: Bootstrap,
    #[serde(default)]
    pub infrastructure_ref: ContractVersionedObjectReference,
    /// Kubernetes (k3s) version, e.g. `v1.30.2+k3s2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_domain: Option<String>,
    /// Drain, volume-detach and Node-deletion timeouts (v1beta2, in seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion: Option<MachineDeletionSpec>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// `spec.deletion` of a v1beta2 Machine.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineDeletionSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_drain_timeout_seconds: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_volume_detach_timeout_seconds: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_deletion_timeout_seconds: Option<i32>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

impl MachineDeletionSpec {
    pub fn is_empty(&self) -> bool {
        self.node_drain_timeout_seconds.is_none()
            && self.node_volume_detach_timeout_seconds.is_none()
            && self.node_deletion_timeout_seconds.is_none()
            && self.extra.is_empty()
    }
}

/// `spec.bootstrap`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Bootstrap {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_ref: Option<ContractVersionedObjectReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_secret_name: Option<String>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// Machine status (subset).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineStatus {
    /// metav1 conditions (v1beta2).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The Node of this Machine, once it joined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_ref: Option<MachineNodeReference>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<MachineAddress>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deprecated: Option<MachineDeprecatedStatus>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// `status.nodeRef` (v1beta2: only the name).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct MachineNodeReference {
    pub name: String,
}

/// One address of a Machine.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct MachineAddress {
    /// `Hostname`, `ExternalIP`, `InternalIP`, `ExternalDNS` or `InternalDNS`.
    #[serde(rename = "type")]
    pub type_: String,
    pub address: String,
}

/// `status.deprecated`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct MachineDeprecatedStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub v1beta1: Option<MachineV1Beta1DeprecatedStatus>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// `status.deprecated.v1beta1`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineV1Beta1DeprecatedStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<V1Beta1Condition>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

impl Machine {
    /// metav1 conditions (empty without status).
    pub fn conditions(&self) -> &[Condition] {
        self.status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default()
    }

    /// Deprecated v1beta1 conditions (empty without status).
    pub fn v1beta1_conditions(&self) -> &[V1Beta1Condition] {
        self.status
            .as_ref()
            .and_then(|s| s.deprecated.as_ref())
            .and_then(|d| d.v1beta1.as_ref())
            .map(|v| v.conditions.as_slice())
            .unwrap_or_default()
    }

    /// Condition `type_` from either list (v1beta2 first).
    pub fn condition(&self, type_: &str) -> Option<ConditionView<'_>> {
        conditions::find(self.conditions(), self.v1beta1_conditions(), type_)
    }

    /// Mutable metav1 conditions, creating the status if needed.
    pub fn conditions_mut(&mut self) -> &mut Vec<Condition> {
        &mut self.status.get_or_insert_with(Default::default).conditions
    }

    /// Mutable v1beta1 conditions, creating the path if needed.
    pub fn v1beta1_conditions_mut(&mut self) -> &mut Vec<V1Beta1Condition> {
        &mut self
            .status
            .get_or_insert_with(Default::default)
            .deprecated
            .get_or_insert_with(Default::default)
            .v1beta1
            .get_or_insert_with(Default::default)
            .conditions
    }

    /// Name of the Node, once the Machine has one.
    pub fn node_name(&self) -> Option<&str> {
        self.status
            .as_ref()
            .and_then(|s| s.node_ref.as_ref())
            .map(|n| n.name.as_str())
            .filter(|n| !n.is_empty())
    }

    /// Addresses reported by the infrastructure provider.
    pub fn addresses(&self) -> &[MachineAddress] {
        self.status
            .as_ref()
            .map(|s| s.addresses.as_slice())
            .unwrap_or_default()
    }

    /// Whether deletion has started (`metadata.deletionTimestamp` set).
    pub fn is_deleting(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }
}
