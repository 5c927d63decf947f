//! Bootstrap API we create for control-plane Machines:
//! `bootstrap.cluster.x-k8s.io/v1beta2` `KThreesConfig` and `KThreesConfigTemplate`,
//! schema-compatible with cluster-api-k3s. Modelled fields are typed; anything else
//! is kept in `extra` and preserved (`x-kubernetes-preserve-unknown-fields`).

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::conditions::V1Beta1Condition;

/// How Machines are bootstrapped with k3s (`KThreesConfigSpec` in Go); also the
/// spec of the `KThreesConfig` object (one per control-plane Machine).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "bootstrap.cluster.x-k8s.io",
    version = "v1beta2",
    kind = "KThreesConfig",
    plural = "kthreesconfigs",
    namespaced,
    status = "KThreesConfigStatus",
    category = "cluster-api",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct KThreesConfigSpec {
    /// Extra files written before k3s starts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<File>,
    /// Commands run before k3s is installed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pre_k3s_commands: Vec<String>,
    /// Commands run after k3s is installed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub post_k3s_commands: Vec<String>,
    /// k3s agent settings.
    #[serde(default, skip_serializing_if = "KThreesAgentConfig::is_empty")]
    pub agent_config: KThreesAgentConfig,
    /// k3s server settings. Defaulted to `{}` by the API server so that its
    /// own defaults (upstream's `disableCloudController`, `cloudProviderName`)
    /// are filled in when the object has none.
    #[serde(default, skip_serializing_if = "KThreesServerConfig::is_empty")]
    #[schemars(extend("default" = {}))]
    pub server_config: KThreesServerConfig,
    /// k3s version (defaults to the control plane's).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,
    /// Fields we do not model, kept as they are.
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

impl KThreesConfigSpec {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// k3s server flags (`KThreesServerConfig` in Go). JSON names follow
/// cluster-api-k3s exactly, including its `kubeAPIServerArg` (singular).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KThreesServerConfig {
    #[serde(
        rename = "kubeAPIServerArg",
        default,
        skip_serializing_if = "Vec::is_empty"
    )]
    pub kube_api_server_args: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kube_controller_manager_args: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kube_scheduler_args: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tls_san: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub bind_address: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub https_listen_port: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub advertise_address: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub advertise_port: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cluster_cidr: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub service_cidr: String,
    #[serde(
        rename = "clusterDNS",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub cluster_dns: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cluster_domain: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disable_components: Vec<String>,
    /// k3s `--disable-cloud-controller`. Defaulted to `true` as
    /// cluster-api-k3s's defaulting webhook does (an external cloud provider
    /// runs the cloud controller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(default = "default_disable_cloud_controller")]
    pub disable_cloud_controller: Option<bool>,
    /// The kubelet's `--cloud-provider`. Defaulted to `external` as
    /// cluster-api-k3s's defaulting webhook does; `""` sets none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(default = "default_cloud_provider_name")]
    pub cloud_provider_name: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub system_default_registry: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub etcd_proxy_image: String,
    /// External datastore (k3s `--datastore-endpoint`). Not a field of
    /// cluster-api-k3s's KThreesConfig: its API server drops it, so it never
    /// reaches a server. Refused unless `spec.externalDatastore` says the
    /// servers are configured for one another way; kept so YAML that sets it
    /// is read, and refused with a message, rather than silently pruned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub datastore_endpoint: Option<String>,
    /// Fields we do not model, kept as they are.
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// cluster-api-k3s's default of `serverConfig.disableCloudController`.
pub const DEFAULT_DISABLE_CLOUD_CONTROLLER: bool = true;
/// cluster-api-k3s's default of `serverConfig.cloudProviderName`.
pub const DEFAULT_CLOUD_PROVIDER_NAME: &str = "external";

fn default_disable_cloud_controller() -> Option<bool> {
    Some(DEFAULT_DISABLE_CLOUD_CONTROLLER)
}

fn default_cloud_provider_name() -> Option<String> {
    Some(DEFAULT_CLOUD_PROVIDER_NAME.to_string())
}

impl KThreesServerConfig {
    /// Fill in cluster-api-k3s's defaults where the fields are absent, as its
    /// webhook and our CRD's defaults do on the API server.
    pub fn apply_upstream_defaults(&mut self) {
        self.disable_cloud_controller
            .get_or_insert(DEFAULT_DISABLE_CLOUD_CONTROLLER);
        self.cloud_provider_name
            .get_or_insert_with(|| DEFAULT_CLOUD_PROVIDER_NAME.to_string());
    }

    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// k3s agent flags (`KThreesAgentConfig` in Go).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KThreesAgentConfig {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_labels: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_taints: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub private_registry: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kubelet_args: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kube_proxy_args: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node_name: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub air_gapped: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub air_gapped_install_script_path: String,
    /// Fields we do not model, kept as they are.
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

impl KThreesAgentConfig {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// A file written on the node before k3s starts.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct File {
    pub path: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub owner: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub permissions: String,
    /// `base64`, `gzip` or `gzip+base64`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub encoding: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_from: Option<FileSource>,
}

/// Where a file's content comes from.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct FileSource {
    pub secret: SecretFileSource,
}

/// A key of a Secret in the config's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct SecretFileSource {
    pub name: String,
    pub key: String,
}

/// Observed state of a `KThreesConfig` (written by the bootstrap provider).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KThreesConfigStatus {
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ready: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_secret_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// v1beta1-style conditions, as cluster-api-k3s writes them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<V1Beta1Condition>,
    /// Fields we do not model, kept as they are.
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// `KThreesConfigTemplate`: a template of `KThreesConfig` specs.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "bootstrap.cluster.x-k8s.io",
    version = "v1beta2",
    kind = "KThreesConfigTemplate",
    plural = "kthreesconfigtemplates",
    namespaced,
    category = "cluster-api",
    derive = "PartialEq"
)]
pub struct KThreesConfigTemplateSpec {
    pub template: KThreesConfigTemplateResource,
}

/// The `template` of a `KThreesConfigTemplate`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct KThreesConfigTemplateResource {
    #[serde(default, skip_serializing_if = "super::refs::TemplateMeta::is_empty")]
    pub metadata: super::refs::TemplateMeta,
    /// `null` is accepted (cluster-api-k3s samples write `spec: null`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<KThreesConfigSpec>,
}
