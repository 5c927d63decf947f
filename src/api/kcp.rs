//! `controlplane.cluster.x-k8s.io/v1beta3` `KThreesControlPlane`: the stored
//! version, whose spec has the CAPI v1beta2 control-plane contract's shape,
//! with the CEL rules that [`super::validate`] enforces again on every
//! reconcile. The rules and the status are shared with the served
//! cluster-api-k3s-shaped [`super::v1beta2`].

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::bootstrap::KThreesConfigSpec;
use super::conditions::V1Beta1Condition;
use super::refs::{ContractVersionedObjectReference, TemplateMeta};

/// k3s release versions: `v1.30.2+k3s2`, pre-releases `v1.31.0-rc1+k3s1`.
///
/// ASCII digits only (`\d` is Unicode in Rust's regex but ASCII in the API
/// server's RE2), at most 9 per number (so every number fits CEL's `int` and a
/// `u32`), and a pre-release tag of at most 20 characters: the longest match
/// is [`VERSION_MAX_LENGTH`] characters, so the schema's `maxLength` never
/// rejects what the pattern accepts.
pub const K3S_VERSION_PATTERN: &str =
    r"^v[0-9]{1,9}\.[0-9]{1,9}\.[0-9]{1,9}(-[0-9A-Za-z.-]{1,20})?\+k3s[0-9]{1,9}$";

/// `maxLength` of `spec.version`. The API server's CEL cost estimate needs a
/// bound on the string to accept the `split`/`substring` of the transition rules.
pub const VERSION_MAX_LENGTH: usize = 64;

pub(crate) use super::cel::cel_string;

/// CEL for the precedence of the k3s version in the CEL string `v`, as
/// [`super::validate::K3sVersion`] orders it: major, minor, patch, k3s revision,
/// then 1 for a release and 0 for a pre-release. Only sound once `v` matched
/// [`K3S_VERSION_PATTERN`]. There is no `let` in the CEL of a 1.28 API server
/// (nor `cel.bind` in kube-cel), so the rules spell each part out.
///
/// Each part is cut out with `find` (its result is no longer than `v`, whose
/// `maxLength` the API server knows), never with `split`: the API server's
/// cost estimator cannot bound the elements of the list `split` returns, and
/// refuses the CRD when a rule then reads them. Leftmost matches pick the
/// parts: the major and minor numbers are followed by `.`, so the first number
/// followed by `-` or `+` is the patch; the version ends in `+k3s<digits>`.
fn version_cel_parts(v: &str) -> [String; 5] {
    [
        format!("int({v}.find('^v[0-9]+').substring(1))"),
        format!("int({v}.find('[.][0-9]+').substring(1))"),
        format!("int({v}.find('[0-9]+[-+]').replace('-', '').replace('+', ''))"),
        format!("int({v}.find('[0-9]+$'))"),
        format!("({v}.contains('-') ? 0 : 1)"),
    ]
}

/// CEL: the tuple `a` sorts before `b`.
fn cel_tuple_less(a: &[String], b: &[String]) -> String {
    match (a, b) {
        ([x], [y]) => format!("{x} < {y}"),
        ([x, a @ ..], [y, b @ ..]) => {
            format!("({x} != {y} ? {x} < {y} : {})", cel_tuple_less(a, b))
        }
        _ => unreachable!("tuples of one length"),
    }
}

/// CEL guard of the transition rules: both versions parse. Otherwise they pass,
/// and the format rule reports a bad new version (an old one is history).
fn cel_both_versions_parse() -> String {
    let pattern = cel_string(K3S_VERSION_PATTERN);
    format!("!self.matches({pattern}) || !oldSelf.matches({pattern})")
}

/// `spec.version` transition rule: no downgrade (`validate::Rule::VersionNoDowngrade`).
pub(crate) fn version_no_downgrade_rule() -> kube::core::Rule {
    let less = cel_tuple_less(&version_cel_parts("self"), &version_cel_parts("oldSelf"));
    kube::core::Rule::new(format!("{} || !{less}", cel_both_versions_parse())).message(
        kube::core::Message::Expression(
            "'spec.version: cannot downgrade from ' + oldSelf + ' to ' + self".into(),
        ),
    )
}

/// `spec.version` transition rule: at most one minor up, same major
/// (`validate::Rule::VersionNoMinorSkip`). A lower major is a downgrade and
/// left to the downgrade rule, so one change breaks one rule.
pub(crate) fn version_no_minor_skip_rule() -> kube::core::Rule {
    let [new_major, new_minor, ..] = version_cel_parts("self");
    let [old_major, old_minor, ..] = version_cel_parts("oldSelf");
    kube::core::Rule::new(format!(
        "{} || ({new_major} == {old_major} ? {new_minor} <= {old_minor} + 1 : {new_major} < {old_major})",
        cel_both_versions_parse()
    ))
    // The message reads only strings cut out of the two bounded versions:
    // `string()` of an int has no size bound for the cost estimator, and a
    // message built from it is refused like a rule.
    .message(kube::core::Message::Expression(format!(
        "{new_major} == {old_major} \
         ? 'spec.version: cannot skip a minor version: ' + oldSelf + ' to ' + self + ' (one minor version at a time: from ' + oldSelf.find('^v[0-9]+[.][0-9]+') + ' to the next)' \
         : 'spec.version: cannot change the major version: ' + oldSelf + ' to ' + self"
    )))
}

/// Why `serverConfig.datastoreEndpoint` alone is refused (CEL and validator).
pub const DATASTORE_ENDPOINT_MESSAGE: &str = "spec.kthreesConfigSpec.serverConfig.datastoreEndpoint: \
cluster-api-k3s's bootstrap provider does not pass this field on (its KThreesConfig has no such field \
and writes cluster-init: true for the first server), so the servers would run embedded etcd; \
configure the datastore in kthreesConfigSpec.files and set spec.externalDatastore: true";

/// Desired state of a k3s control plane.
///
/// The stored version. Its spec has the shape of the CAPI v1beta2
/// control-plane contract (CAPI's KubeadmControlPlane v1beta2 names:
/// `machineTemplate.spec`, `rollout`, `remediation`, `machineNaming`);
/// cluster-api-k3s's `v1beta2` and `v1beta1` are served beside it and
/// converted by our webhook ([`super::conversion`]).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "controlplane.cluster.x-k8s.io",
    version = "v1beta3",
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
    "has(self.machineTemplate) && has(self.machineTemplate.spec) && has(self.machineTemplate.spec.infrastructureRef) && has(self.machineTemplate.spec.infrastructureRef.kind) && self.machineTemplate.spec.infrastructureRef.kind != '' && has(self.machineTemplate.spec.infrastructureRef.name) && self.machineTemplate.spec.infrastructureRef.name != ''"
).message("spec.machineTemplate.spec.infrastructureRef: required, with apiGroup, kind and name"))]
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
    /// How control-plane machines are shaped.
    #[serde(default)]
    pub machine_template: KThreesControlPlaneMachineTemplate,
    /// k3s configuration for every control-plane machine. Defaulted to `{}`
    /// so that the server configuration's defaults apply to every object.
    #[serde(default, skip_serializing_if = "KThreesConfigSpec::is_empty")]
    #[schemars(extend("default" = {}))]
    pub kthrees_config_spec: KThreesConfigSpec,
    /// When and how machines are replaced.
    #[serde(default, skip_serializing_if = "KThreesControlPlaneRollout::is_empty")]
    pub rollout: KThreesControlPlaneRollout,
    /// How unhealthy control-plane machines are remediated.
    #[serde(
        default,
        skip_serializing_if = "KThreesControlPlaneRemediation::is_empty"
    )]
    pub remediation: KThreesControlPlaneRemediation,
    /// How control-plane Machines are named.
    #[serde(default, skip_serializing_if = "MachineNaming::is_empty")]
    pub machine_naming: MachineNaming,
    /// The servers use an external datastore (k3s `--datastore-endpoint`),
    /// configured outside this spec, e.g. as a `config.yaml.d` drop-in in
    /// `kthreesConfigSpec.files`: cluster-api-k3s's bootstrap provider has no
    /// datastore field and writes `cluster-init: true` for the first server.
    /// Allows even replica counts and lets the controller skip etcd, unless
    /// the workload cluster's Nodes show embedded etcd after all (k3s's etcd
    /// label or annotations): then etcd is managed as usual. Our addition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_datastore: Option<bool>,
    /// etcd snapshots before every member removal and on a schedule, into
    /// a target named here. Our addition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_backup: Option<super::etcd_backup::EtcdBackup>,
}

pub(crate) fn default_replicas() -> Option<i32> {
    Some(1)
}

/// Shape of control-plane machines (`spec.machineTemplate`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct KThreesControlPlaneMachineTemplate {
    /// Labels and annotations for the Machines (changed in place).
    #[serde(default, skip_serializing_if = "TemplateMeta::is_empty")]
    pub metadata: TemplateMeta,
    #[serde(default)]
    pub spec: KThreesControlPlaneMachineTemplateSpec,
}

/// `spec.machineTemplate.spec`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct KThreesControlPlaneMachineTemplateSpec {
    /// The infrastructure machine template (required): its API version is the
    /// newest its CRD lists for the CAPI contract (contract labels).
    #[serde(default)]
    pub infrastructure_ref: ContractVersionedObjectReference,
    /// Conditions the Machine's `Ready` also waits for (copied to Machines).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub readiness_gates: Vec<MachineReadinessGate>,
    /// Drain, volume-detach and Node-deletion timeouts (changed in place).
    #[serde(default, skip_serializing_if = "MachineTemplateDeletion::is_empty")]
    pub deletion: MachineTemplateDeletion,
}

/// `spec.machineTemplate.spec.readinessGates[]` (CAPI `MachineReadinessGate`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineReadinessGate {
    /// A condition type of the Machine.
    #[schemars(length(min = 1, max = 316))]
    pub condition_type: String,
    /// `Positive` (the default: True is good) or `Negative`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self in ['Positive', 'Negative']").message("spec.machineTemplate.spec.readinessGates[].polarity: must be Positive or Negative"))]
    pub polarity: Option<String>,
}

/// `spec.machineTemplate.spec.deletion`, in whole seconds.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineTemplateDeletion {
    /// Time spent draining a Node; unset or 0 = no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0").message("spec.machineTemplate.spec.deletion.nodeDrainTimeoutSeconds: must not be negative"))]
    pub node_drain_timeout_seconds: Option<i32>,
    /// Time spent waiting for volumes to detach; unset or 0 = no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0").message("spec.machineTemplate.spec.deletion.nodeVolumeDetachTimeoutSeconds: must not be negative"))]
    pub node_volume_detach_timeout_seconds: Option<i32>,
    /// Time spent deleting the Node; unset = CAPI's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0").message("spec.machineTemplate.spec.deletion.nodeDeletionTimeoutSeconds: must not be negative"))]
    pub node_deletion_timeout_seconds: Option<i32>,
}

impl MachineTemplateDeletion {
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// `spec.rollout`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct KThreesControlPlaneRollout {
    /// Roll out all machines after this time even without spec changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<Time>,
    /// Roll out machines before something about them expires.
    #[serde(default, skip_serializing_if = "RolloutBefore::is_empty")]
    pub before: RolloutBefore,
    /// How outdated machines are replaced (absent: a rolling update with
    /// maxSurge 1).
    #[serde(default, skip_serializing_if = "RolloutStrategy::is_empty")]
    pub strategy: RolloutStrategy,
}

impl KThreesControlPlaneRollout {
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// `spec.rollout.strategy`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStrategy {
    /// Only `RollingUpdate` exists.
    // A CEL rule, not a schema enum: CEL evaluated client-side (kube-cel)
    // ignores `enum`, and the verdicts must match the API server's.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == 'RollingUpdate'").message("spec.rollout.strategy.type: must be RollingUpdate"))]
    pub type_: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolling_update: Option<RollingUpdate>,
}

impl RolloutStrategy {
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// `spec.rollout.strategy.rollingUpdate`.
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
    #[x_kube(validation = Rule::new("string(self) in ['0', '1']").message("spec.rollout.strategy.rollingUpdate.maxSurge: must be 0 or 1"))]
    pub max_surge: Option<k8s_openapi::apimachinery::pkg::util::intstr::IntOrString>,
}

/// Default `rollout.strategy.rollingUpdate.maxSurge`.
pub const DEFAULT_MAX_SURGE: u32 = 1;

/// `spec.rollout.before`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutBefore {
    /// Replace a Machine whose certificates expire within this many days
    /// (at least 7). A Machine whose expiry is unknown is never rolled for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 7").message("spec.rollout.before.certificatesExpiryDays: must be at least 7"))]
    pub certificates_expiry_days: Option<i32>,
}

impl RolloutBefore {
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// `spec.remediation`: how control-plane machine remediation happens.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct KThreesControlPlaneRemediation {
    /// Retries of one remediation sequence; unset = forever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0").message("spec.remediation.maxRetry: must not be negative"))]
    pub max_retry: Option<i32>,
    /// Seconds to wait before remediating a replacement machine again;
    /// unset = immediately.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0").message("spec.remediation.retryPeriodSeconds: must not be negative"))]
    pub retry_period_seconds: Option<i32>,
    /// After this many seconds a failure starts a new sequence; unset = 3600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0").message("spec.remediation.minHealthyPeriodSeconds: must not be negative"))]
    pub min_healthy_period_seconds: Option<i32>,
}

impl KThreesControlPlaneRemediation {
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// `spec.machineNaming`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineNaming {
    /// Go-template-style name of new Machines, e.g.
    /// `{{ .kthreesControlPlane.name }}-cp-{{ .random }}`: `.cluster.name`,
    /// `.kthreesControlPlane.name` and `.random` (5 characters, required)
    /// may appear. Unset: `<name>-<random>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    #[x_kube(validation = Rule::new("self.contains('{{ .random }}')").message("spec.machineNaming.template: must contain {{ .random }}"))]
    pub template: Option<String>,
}

impl MachineNaming {
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// Default `minHealthyPeriod` (CAPI KCP and cluster-api-k3s).
pub const DEFAULT_MIN_HEALTHY_PERIOD: std::time::Duration = std::time::Duration::from_secs(3600);

/// Observed state of a k3s control plane.
///
/// Conditions follow the CAPI v1beta2 contract: `conditions` holds metav1
/// conditions (what CAPI >= v1.11 reads; CAPI v1.10 reads the same fields), and
/// the CAPI v1beta1-style list lives under `deprecated.v1beta1.conditions`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KThreesControlPlaneStatus {
    /// Label selector of our Machines, in query-parameter form (scale subresource).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub selector: String,
    #[serde(default)]
    pub replicas: i32,
    #[serde(default)]
    pub updated_replicas: i32,
    #[serde(default)]
    pub ready_replicas: i32,
    /// Machines whose Node is ready (v1beta2 contract).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_replicas: Option<i32>,
    /// Machines with the desired spec (v1beta2 contract).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub up_to_date_replicas: Option<i32>,
    #[serde(default)]
    pub unavailable_replicas: i32,
    /// Lowest k3s version among the machines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The first server has initialized the cluster (v1beta1 contract).
    #[serde(default)]
    pub initialized: bool,
    /// The API server answers (v1beta1 contract).
    #[serde(default)]
    pub ready: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// metav1 conditions (CAPI v1beta2 contract).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// CAPI v1beta2 contract initialization flags.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<ControlPlaneInitializationStatus>,
    /// The last remediation we performed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_remediation: Option<super::RemediationData>,
    /// The embedded etcd's quorum, from the real membership read in this
    /// reconcile. Absent (never zeros, never the last value) when etcd was
    /// not read this time: unreachable, no credentials, an external
    /// datastore, paused, or a lifecycle step (deletion, Secrets) that
    /// stopped the reconcile before the workload cluster; the
    /// `EtcdClusterHealthy` condition then says why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<EtcdQuorumStatus>,
    /// The snapshots this controller took (`spec.etcdBackup`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_backup: Option<super::etcd_backup::EtcdBackupStatus>,
    /// CAPI v1beta1-style fields kept for older readers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deprecated: Option<DeprecatedStatus>,
}

/// `status.etcd`: the quorum arithmetic of the embedded etcd as it stands.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdQuorumStatus {
    /// Every member, learners included.
    pub members: i32,
    /// Voting members (learners do not vote).
    pub voters: i32,
    /// Voters whose own endpoint answered without errors or alarms.
    pub healthy_voters: i32,
    /// Voters needed for quorum: voters / 2 + 1.
    pub quorum: i32,
    /// healthyVoters - quorum: how many more healthy voters can be lost
    /// before quorum is lost. 0: the next loss breaks quorum; negative:
    /// quorum is lost (etcd cannot commit).
    pub quorum_margin: i32,
    /// `healthyVoters/voters`, e.g. `3/3` (the printer column).
    pub voter_health: String,
}

/// `status.initialization` of the CAPI v1beta2 control-plane contract.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ControlPlaneInitializationStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_initialized: Option<bool>,
}

/// `status.deprecated`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct DeprecatedStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub v1beta1: Option<V1Beta1DeprecatedStatus>,
}

/// `status.deprecated.v1beta1`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct V1Beta1DeprecatedStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<V1Beta1Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable_replicas: Option<i32>,
}

impl KThreesControlPlane {
    /// `status.initialized` or the v1beta2 `status.initialization.controlPlaneInitialized`.
    pub fn is_initialized(&self) -> bool {
        self.status.as_ref().is_some_and(|s| {
            s.initialized
                || s.initialization
                    .as_ref()
                    .and_then(|i| i.control_plane_initialized)
                    .unwrap_or(false)
        })
    }

    /// `spec.replicas` with its default (1) applied.
    pub fn desired_replicas(&self) -> i32 {
        self.spec.replicas.unwrap_or(1)
    }

    /// Whether k3s runs embedded etcd for this control plane.
    /// Whether the spec says etcd is embedded: unless `spec.externalDatastore`
    /// declares otherwise. What the workload cluster shows decides in the end
    /// (see `controller::observe`): a declared external datastore whose Nodes
    /// carry k3s's etcd marks is managed all the same.
    pub fn etcd_is_embedded(&self) -> bool {
        self.spec.external_datastore != Some(true)
    }

    /// `remediation.minHealthyPeriodSeconds`, defaulted to 1h. `None` if negative.
    pub fn min_healthy_period(&self) -> Option<std::time::Duration> {
        match self.spec.remediation.min_healthy_period_seconds {
            None => Some(DEFAULT_MIN_HEALTHY_PERIOD),
            Some(s) => seconds(s),
        }
    }

    /// `remediation.retryPeriodSeconds`, defaulted to zero. `None` if negative.
    pub fn retry_period(&self) -> Option<std::time::Duration> {
        match self.spec.remediation.retry_period_seconds {
            None => Some(std::time::Duration::ZERO),
            Some(s) => seconds(s),
        }
    }

    /// `remediation.maxRetry`; `None` = retry forever.
    pub fn max_retry(&self) -> Option<i32> {
        self.spec.remediation.max_retry
    }

    /// `rollout.after`.
    pub fn rollout_after(&self) -> Option<&Time> {
        self.spec.rollout.after.as_ref()
    }

    /// `rollout.before.certificatesExpiryDays`.
    pub fn certificates_expiry_days(&self) -> Option<i32> {
        self.spec.rollout.before.certificates_expiry_days
    }

    /// The infrastructure machine template, when it names a kind and a name.
    pub fn infrastructure_ref(&self) -> Option<&ContractVersionedObjectReference> {
        let r = &self.spec.machine_template.spec.infrastructure_ref;
        (!r.kind.is_empty() && !r.name.is_empty()).then_some(r)
    }

    /// `rollout.strategy.rollingUpdate.maxSurge` as 0 or 1; `None` when it is
    /// set to anything else (the validator names it).
    pub fn max_surge(&self) -> Option<u32> {
        use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
        match self
            .spec
            .rollout
            .strategy
            .rolling_update
            .as_ref()
            .and_then(|r| r.max_surge.as_ref())
        {
            None => Some(DEFAULT_MAX_SURGE),
            Some(IntOrString::Int(n)) if (0..=1).contains(n) => Some(*n as u32),
            Some(IntOrString::String(s)) if s == "0" || s == "1" => s.parse().ok(),
            Some(_) => None,
        }
    }

    /// metav1 conditions of the status (empty without status).
    pub fn conditions(&self) -> &[Condition] {
        self.status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default()
    }
}

/// Whole seconds as a duration; `None` when negative.
fn seconds(s: i32) -> Option<std::time::Duration> {
    u64::try_from(s).ok().map(std::time::Duration::from_secs)
}
