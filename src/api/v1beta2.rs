//! `controlplane.cluster.x-k8s.io/v1beta2` `KThreesControlPlane` and
//! `KThreesControlPlaneTemplate` as cluster-api-k3s serves them: the spec
//! shape of the CAPI v1beta1 contract (`machineTemplate.infrastructureRef` as
//! an ObjectReference, Go duration strings, `rolloutAfter`). Served, not
//! stored: these types exist for the schema (with the same CEL rules as the
//! stored version, with this version's field paths) and for tests; the
//! webhook converts ([`super::conversion`]). The status is the stored one's.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::bootstrap::KThreesConfigSpec;
use super::kcp::{
    DATASTORE_ENDPOINT_MESSAGE, K3S_VERSION_PATTERN, KThreesControlPlaneStatus, VERSION_MAX_LENGTH,
    cel_string, default_replicas, version_no_downgrade_rule, version_no_minor_skip_rule,
};
use super::refs::{GoDuration, TemplateMeta};

/// cluster-api-k3s's v1beta2 spec (v1beta1-contract shape), served and
/// converted to the stored [`super::kcp`] version by our webhook.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "controlplane.cluster.x-k8s.io",
    version = "v1beta2",
    kind = "KThreesControlPlane",
    plural = "kthreescontrolplanes",
    shortname = "ktcp",
    category = "cluster-api",
    namespaced,
    status = "KThreesControlPlaneStatus",
    derive = "PartialEq",
    scale = r#"{"specReplicasPath":".spec.replicas","statusReplicasPath":".status.replicas","labelSelectorPath":".status.selector"}"#,
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']","description":"Cluster this control plane belongs to"}"#,
    printcolumn = r#"{"name":"Initialized","type":"boolean","jsonPath":".status.initialized","description":"Whether the first k3s server has initialized the cluster"}"#,
    printcolumn = r#"{"name":"Desired","type":"integer","jsonPath":".spec.replicas","description":"Desired number of control-plane machines"}"#,
    printcolumn = r#"{"name":"Replicas","type":"integer","jsonPath":".status.replicas","description":"Non-terminated control-plane machines"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.readyReplicas","description":"Ready control-plane machines"}"#,
    printcolumn = r#"{"name":"Updated","type":"integer","jsonPath":".status.updatedReplicas","description":"Machines with the desired spec"}"#,
    printcolumn = r#"{"name":"Unavailable","type":"integer","jsonPath":".status.unavailableReplicas","description":"Machines still needed for full capacity"}"#,
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".spec.version","description":"Desired k3s version"}"#,
    printcolumn = r#"{"name":"Etcd","type":"string","jsonPath":".status.etcd.voterHealth","description":"Healthy etcd voters / voters, from the real membership this reconcile (empty when etcd could not be read: see the EtcdClusterHealthy condition)"}"#,
    printcolumn = r#"{"name":"Etcd Margin","type":"integer","jsonPath":".status.etcd.quorumMargin","description":"Healthy etcd voters that can still be lost before quorum is lost (0: the next loss breaks quorum; negative: quorum lost; empty: etcd unknown)"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = Rule::new(
    "!has(self.replicas) || self.replicas < 1 || self.replicas % 2 == 1 || (has(self.externalDatastore) && self.externalDatastore)"
).message("spec.replicas: must be odd while etcd is embedded (an even count adds no fault tolerance); set spec.externalDatastore only if the servers really use an external datastore"))]
#[x_kube(validation = Rule::new(
    "!has(self.kthreesConfigSpec) || !has(self.kthreesConfigSpec.serverConfig) || !has(self.kthreesConfigSpec.serverConfig.datastoreEndpoint) || self.kthreesConfigSpec.serverConfig.datastoreEndpoint == '' || (has(self.externalDatastore) && self.externalDatastore)"
).message(DATASTORE_ENDPOINT_MESSAGE))]
#[x_kube(validation = Rule::new(
    "has(self.machineTemplate) && has(self.machineTemplate.infrastructureRef) && has(self.machineTemplate.infrastructureRef.kind) && self.machineTemplate.infrastructureRef.kind != '' && has(self.machineTemplate.infrastructureRef.name) && self.machineTemplate.infrastructureRef.name != ''"
).message("spec.machineTemplate.infrastructureRef: required, with kind and name"))]
#[serde(rename_all = "camelCase")]
pub struct KThreesControlPlaneSpec {
    /// Desired control-plane machines (default 1). Odd while etcd is embedded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(default = "default_replicas")]
    #[x_kube(validation = Rule::new("self >= 1").message("spec.replicas: must be at least 1"))]
    pub replicas: Option<i32>,
    /// Desired k3s version, e.g. `v1.30.2+k3s2`. On UPDATE it may not go down
    /// nor skip a minor version.
    #[schemars(length(max = VERSION_MAX_LENGTH))]
    #[x_kube(validation = Rule::new(format!("self.matches({})", cel_string(K3S_VERSION_PATTERN))).message("spec.version: must look like v1.30.2+k3s2"))]
    #[x_kube(validation = version_no_downgrade_rule())]
    #[x_kube(validation = version_no_minor_skip_rule())]
    pub version: String,
    /// k3s configuration for every control-plane machine. Defaulted to `{}`
    /// so that the server configuration's defaults apply to every object.
    #[serde(default, skip_serializing_if = "KThreesConfigSpec::is_empty")]
    #[schemars(extend("default" = {}))]
    pub kthrees_config_spec: KThreesConfigSpec,
    /// Roll out all machines after this time even without spec changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_after: Option<Time>,
    /// Roll out machines before something about them expires (CAPI's
    /// KubeadmControlPlane field of the same name and meaning).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_before: Option<RolloutBefore>,
    /// How control-plane machines are shaped.
    #[serde(default)]
    pub machine_template: KThreesControlPlaneMachineTemplate,
    /// How unhealthy control-plane machines are remediated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remediation_strategy: Option<RemediationStrategy>,
    /// The servers use an external datastore (k3s `--datastore-endpoint`),
    /// configured outside this spec, e.g. as a `config.yaml.d` drop-in in
    /// `kthreesConfigSpec.files`: cluster-api-k3s's bootstrap provider has no
    /// datastore field and writes `cluster-init: true` for the first server.
    /// Allows even replica counts and lets the controller skip etcd, unless
    /// the workload cluster's Nodes show embedded etcd after all (k3s's etcd
    /// label or annotations): then etcd is managed as usual. Our addition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_datastore: Option<bool>,
    /// How outdated machines are replaced (additive to cluster-api-k3s's
    /// schema; absent means a rolling update with maxSurge 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_strategy: Option<RolloutStrategy>,
}

/// Shape of control-plane machines.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KThreesControlPlaneMachineTemplate {
    /// Labels and annotations for the Machines.
    #[serde(default, skip_serializing_if = "TemplateMeta::is_empty")]
    pub metadata: TemplateMeta,
    /// Infrastructure template (required; cluster-api-k3s v1beta2 uses a full
    /// core/v1 ObjectReference here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_ref: Option<ObjectReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_drain_timeout: Option<GoDuration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_volume_detach_timeout: Option<GoDuration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_deletion_timeout: Option<GoDuration>,
}

/// How outdated control-plane machines are replaced, as CAPI's KCP spells it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStrategy {
    /// Only `RollingUpdate` exists.
    // A CEL rule, not a schema enum: CEL evaluated client-side (kube-cel)
    // ignores `enum`, and the verdicts must match the API server's.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == 'RollingUpdate'").message("spec.rolloutStrategy.type: must be RollingUpdate"))]
    pub type_: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolling_update: Option<RollingUpdate>,
}

/// `rolloutStrategy.rollingUpdate`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RollingUpdate {
    /// Machines created above `replicas` during a rollout: 0 (remove an
    /// outdated machine first, needs 3 healthy voters) or 1 (the default:
    /// create the replacement first). The strings "0" and "1" are taken as
    /// the numbers; percentages are refused.
    // The strings as `KThreesControlPlane::max_surge` reads them (CEL: `string`
    // of an int is its digits; kube-cel has no `type()`). A percentage
    // of a handful of control-plane machines would round to 0 or 1 anyway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("string(self) in ['0', '1']").message("spec.rolloutStrategy.rollingUpdate.maxSurge: must be 0 or 1"))]
    pub max_surge: Option<k8s_openapi::apimachinery::pkg::util::intstr::IntOrString>,
}

/// `spec.rolloutBefore`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutBefore {
    /// Replace a Machine whose certificates expire within this many days
    /// (at least 7). A Machine whose expiry is unknown is never rolled for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 7").message("spec.rolloutBefore.certificatesExpiryDays: must be at least 7"))]
    pub certificates_expiry_days: Option<i32>,
}

/// How control-plane machine remediation happens.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RemediationStrategy {
    /// Retries of one remediation sequence; unset = forever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0").message("spec.remediationStrategy.maxRetry: must not be negative"))]
    pub max_retry: Option<i32>,
    /// Wait before remediating a replacement machine again; unset = immediately.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(r"self.matches('^[-+]?(([0-9]+(\\.[0-9]*)?|\\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+$|^[-+]?0$') && duration(self) >= duration('0s')").message("spec.remediationStrategy.retryPeriod: must be a non-negative duration like 0s, 30m or 1h30m"))]
    pub retry_period: Option<GoDuration>,
    /// After this long a failure starts a new sequence; unset = 1h.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(r"self.matches('^[-+]?(([0-9]+(\\.[0-9]*)?|\\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+$|^[-+]?0$') && duration(self) >= duration('0s')").message("spec.remediationStrategy.minHealthyPeriod: must be a non-negative duration like 0s, 30m or 1h30m"))]
    pub min_healthy_period: Option<GoDuration>,
}

/// cluster-api-k3s's v1beta2 `KThreesControlPlaneTemplate` spec.
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

/// The `template` of a v1beta2 `KThreesControlPlaneTemplate`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct KThreesControlPlaneTemplateResource {
    #[serde(default, skip_serializing_if = "TemplateMeta::is_empty")]
    pub metadata: TemplateMeta,
    pub spec: KThreesControlPlaneTemplateResourceSpec,
}

/// What a v1beta2 template fixes; replicas and version come from the Cluster
/// topology. `rolloutBefore` and `externalDatastore` are ours (cluster-api-k3s
/// lacks them), so a template can carry everything a control plane may.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KThreesControlPlaneTemplateResourceSpec {
    #[serde(default, skip_serializing_if = "KThreesConfigSpec::is_empty")]
    pub kthrees_config_spec: KThreesConfigSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_after: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_before: Option<RolloutBefore>,
    /// In a ClusterClass the infrastructure template comes from the class, so
    /// `infrastructureRef` is not required here.
    #[serde(default)]
    pub machine_template: KThreesControlPlaneMachineTemplate,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remediation_strategy: Option<RemediationStrategy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_strategy: Option<RolloutStrategy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_datastore: Option<bool>,
}
