//! `controlplane.cluster.x-k8s.io/v1beta3` `KThreesControlPlaneTemplate`, used by
//! ClusterClass to stamp out `KThreesControlPlane` objects: the stored version,
//! in the CAPI v1beta2 contract's template shape (KCP v1beta2's names).
//! cluster-api-k3s's `v1beta2` is served beside it ([`super::v1beta2`]).

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::bootstrap::KThreesConfigSpec;
use super::kcp::{
    KThreesControlPlaneRemediation, KThreesControlPlaneRollout, MachineNaming,
    MachineTemplateDeletion,
};
use super::refs::TemplateMeta;

/// Spec of a `KThreesControlPlaneTemplate`.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "controlplane.cluster.x-k8s.io",
    version = "v1beta3",
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
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
pub struct KThreesControlPlaneTemplateResource {
    /// Labels and annotations of the KThreesControlPlane made from it.
    #[serde(default, skip_serializing_if = "TemplateMeta::is_empty")]
    pub metadata: TemplateMeta,
    #[serde(default)]
    pub spec: KThreesControlPlaneTemplateResourceSpec,
}

/// What a template fixes: everything a KThreesControlPlane spec may say,
/// except what the Cluster topology gives (replicas, version, the machine
/// infrastructure template, readiness gates).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct KThreesControlPlaneTemplateResourceSpec {
    #[serde(default, skip_serializing_if = "TemplateMachineTemplate::is_empty")]
    pub machine_template: TemplateMachineTemplate,
    #[serde(default, skip_serializing_if = "KThreesConfigSpec::is_empty")]
    pub kthrees_config_spec: KThreesConfigSpec,
    #[serde(default, skip_serializing_if = "KThreesControlPlaneRollout::is_empty")]
    pub rollout: KThreesControlPlaneRollout,
    #[serde(
        default,
        skip_serializing_if = "KThreesControlPlaneRemediation::is_empty"
    )]
    pub remediation: KThreesControlPlaneRemediation,
    #[serde(default, skip_serializing_if = "MachineNaming::is_empty")]
    pub machine_naming: MachineNaming,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_datastore: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_backup: Option<super::etcd_backup::EtcdBackup>,
}

/// `spec.template.spec.machineTemplate`: in a ClusterClass the infrastructure
/// template comes from the class, so only metadata and deletion are here.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateMachineTemplate {
    #[serde(default, skip_serializing_if = "TemplateMeta::is_empty")]
    pub metadata: TemplateMeta,
    #[serde(default, skip_serializing_if = "TemplateMachineTemplateSpec::is_empty")]
    pub spec: TemplateMachineTemplateSpec,
}

impl TemplateMachineTemplate {
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// `spec.template.spec.machineTemplate.spec`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateMachineTemplateSpec {
    #[serde(default, skip_serializing_if = "MachineTemplateDeletion::is_empty")]
    pub deletion: MachineTemplateDeletion,
}

impl TemplateMachineTemplateSpec {
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}
