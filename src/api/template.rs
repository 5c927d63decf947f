//! `controlplane.cluster.x-k8s.io/v1beta2` `KThreesControlPlaneTemplate`, used by
//! ClusterClass to stamp out `KThreesControlPlane` objects.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::bootstrap::KThreesConfigSpec;
use super::kcp::{KThreesControlPlaneMachineTemplate, RemediationStrategy, RolloutStrategy};
use super::refs::TemplateMeta;

/// Spec of a `KThreesControlPlaneTemplate`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "controlplane.cluster.x-k8s.io",
    version = "v1beta2",
    kind = "KThreesControlPlaneTemplate",
    plural = "kthreescontrolplanetemplates",
    category = "cluster-api",
    namespaced,
    derive = "PartialEq"
)]
pub struct KThreesControlPlaneTemplateSpec {
    pub template: KThreesControlPlaneTemplateResource,
}

/// The `template` of a `KThreesControlPlaneTemplate`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct KThreesControlPlaneTemplateResource {
    #[serde(default, skip_serializing_if = "TemplateMeta::is_empty")]
    pub metadata: TemplateMeta,
    pub spec: KThreesControlPlaneTemplateResourceSpec,
}

/// What a template fixes; replicas and version come from the Cluster topology.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KThreesControlPlaneTemplateResourceSpec {
    #[serde(default, skip_serializing_if = "KThreesConfigSpec::is_empty")]
    pub kthrees_config_spec: KThreesConfigSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_after: Option<Time>,
    /// In a ClusterClass the infrastructure template comes from the class, so
    /// `infrastructureRef` is not required here.
    #[serde(default)]
    pub machine_template: KThreesControlPlaneMachineTemplate,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remediation_strategy: Option<RemediationStrategy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_strategy: Option<RolloutStrategy>,
}
