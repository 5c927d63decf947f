//! The plain, observed world the remediation rules decide on.
//!
//! The controller maps API objects (KThreesControlPlane, Machines, the etcd
//! membership snapshot and its member <-> Machine mapping) into these types; the
//! rules never see an API object, a client or a clock.

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::quorum::MemberView;

// The contract's names live in one place, `api::names`; re-exported here
// because the rules speak of them.
pub use crate::api::kcp::DEFAULT_MIN_HEALTHY_PERIOD;
pub use crate::api::names::{
    CAPI_PRE_TERMINATE_HOOK_PREFIX, DELETE_MACHINE_ANNOTATION, PRE_TERMINATE_HOOK_ANNOTATION,
    PRE_TERMINATE_HOOK_PREFIX, REMEDIATE_MACHINE_ANNOTATION, REMEDIATION_FOR_ANNOTATION,
    REMEDIATION_IN_PROGRESS_ANNOTATION, UPSTREAM_PRE_TERMINATE_HOOK_ANNOTATION,
    UPSTREAM_PRE_TERMINATE_HOOK_VALUE,
};

/// A remediation as recorded in the `remediation-in-progress` / `remediation-for`
/// annotations, e.g. `{"machine":"m1","timestamp":"2024-05-01T10:00:00Z","retryCount":0}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RemediationData {
    /// The machine being (or last) remediated.
    pub machine: String,
    /// When the remediation happened; `None` when the annotation carries a null
    /// timestamp (CAPI writes that for a zero time) or none at all (Go's
    /// decoder, which cluster-api-k3s uses, accepts a missing field), which
    /// counts as long ago.
    #[serde(
        default,
        serialize_with = "serialize_timestamp",
        deserialize_with = "deserialize_timestamp"
    )]
    pub timestamp: Option<DateTime<Utc>>,
    /// How many times in a row a replacement of this machine failed again.
    #[serde(default)]
    pub retry_count: u32,
}

fn serialize_timestamp<S: Serializer>(
    value: &Option<DateTime<Utc>>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    // Kubernetes metav1.Time: RFC 3339, seconds precision, UTC "Z".
    match value {
        Some(t) => serializer.serialize_str(&t.to_rfc3339_opts(SecondsFormat::Secs, true)),
        None => serializer.serialize_none(),
    }
}

fn deserialize_timestamp<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<DateTime<Utc>>, D::Error> {
    let raw: Option<String> = Option::deserialize(deserializer)?;
    match raw.as_deref() {
        None | Some("") => Ok(None),
        Some(s) => DateTime::parse_from_rfc3339(s)
            .map(|t| Some(t.with_timezone(&Utc)))
            .map_err(serde::de::Error::custom),
    }
}

/// Bad observed input, named by object and field.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ModelError {
    #[error(
        "{object}: annotation {annotation} is not valid remediation data ({reason}): {value:?}"
    )]
    InvalidRemediationData {
        object: String,
        annotation: &'static str,
        value: String,
        reason: String,
    },
}

impl RemediationData {
    /// Parse an annotation value; `object` and `annotation` name it in the error.
    pub fn parse(value: &str, object: &str, annotation: &'static str) -> Result<Self, ModelError> {
        serde_json::from_str(value).map_err(|err| ModelError::InvalidRemediationData {
            object: object.to_string(),
            annotation,
            value: value.to_string(),
            reason: err.to_string(),
        })
    }

    /// The annotation value.
    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).expect("RemediationData always serializes")
    }
}

/// `spec.remediation`, defaults applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemediationStrategy {
    /// `None`: retry forever.
    pub max_retry: Option<u32>,
    /// Zero: retry immediately.
    pub retry_period: Duration,
    /// After this long healthy, a machine's failure starts a new retry sequence.
    pub min_healthy_period: Duration,
}

impl Default for RemediationStrategy {
    fn default() -> Self {
        Self {
            max_retry: None,
            retry_period: Duration::ZERO,
            min_healthy_period: DEFAULT_MIN_HEALTHY_PERIOD,
        }
    }
}

/// The real etcd membership as observed (members probed one by one).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Membership {
    pub members: Vec<MemberView>,
    /// The leader's member id, if a leader was observed.
    pub leader: Option<u64>,
}

impl Membership {
    pub fn member(&self, id: u64) -> Option<&MemberView> {
        self.members.iter().find(|m| m.id == id)
    }

    /// A voter that answered its probe without alarms: fit to take leadership.
    pub fn is_healthy_voter(&self, id: u64) -> bool {
        self.member(id)
            .is_some_and(|m| !m.learner && !m.name.is_empty() && m.unhealthy_reason().is_none())
    }
}

/// What we know of the workload cluster's etcd.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EtcdState {
    /// No `<cluster>-etcd` Secret: etcd is not ours to touch.
    NotManaged,
    /// Managed, but the membership could not be read; nothing may be removed.
    Unreachable { reason: String },
    /// Managed and observed.
    Observed(Membership),
}

/// A Machine whose Node shows embedded etcd (k3s's etcd label, annotations or
/// `EtcdIsVoter=False`) while no etcd member maps to it: its member was
/// removed or evicted, and k3s keeps the marks (only `--disable-etcd` has none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberMissing {
    pub node: String,
    /// What marked the Node as an etcd node.
    pub marks: String,
    /// Since when: `EtcdIsVoter=False NotAMember`'s transition, else the
    /// Node's creation.
    pub since: DateTime<Utc>,
    /// The grace period has passed: it counts as an unhealthy etcd member
    /// (picked first for remediation, fails preflight).
    pub confirmed: bool,
}

/// One control-plane Machine as observed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineView {
    pub name: String,
    pub created: DateTime<Utc>,
    /// `metadata.deletionTimestamp`.
    pub deleting: Option<DateTime<Utc>>,
    /// `status.nodeRef.name`.
    pub node_ref: Option<String>,
    pub failure_domain: Option<String>,
    /// Condition `HealthCheckSucceeded` (None: not set).
    pub health_check_succeeded: Option<bool>,
    /// Condition `OwnerRemediated` (None: not set).
    pub owner_remediated: Option<bool>,
    /// The MHC uses external remediation for this machine (condition
    /// `ExternallyRemediated` present): never ours.
    pub externally_remediated: bool,
    /// Annotation `cluster.x-k8s.io/remediate-machine` present.
    pub remediate_requested: bool,
    /// Annotation `remediation-for`, parsed.
    pub remediation_for: Option<RemediationData>,
    /// Annotation `cluster.x-k8s.io/delete-machine` present.
    pub delete_requested: bool,
    /// The machine needs rollout (spec differs from the KCP's).
    pub outdated: bool,
    /// Why it is outdated (empty when up to date, or when a test sets only
    /// `outdated`).
    pub outdated_reasons: Vec<crate::rollout::OutdatedReason>,
    /// Its etcd member, from the mapping; `None`: no member (`--disable-etcd`,
    /// or its member never joined).
    pub etcd_member: Option<u64>,
    /// No member, although its Node shows embedded etcd.
    pub etcd_member_missing: Option<MemberMissing>,
    /// API server / controller manager / scheduler conditions; `None`: unknown.
    pub components_healthy: Option<bool>,
    /// Our pre-terminate hook annotation is on the Machine.
    pub has_our_hook: bool,
    /// The etcd member recorded in our hook's value when it was added (see
    /// [`super::steps::hook_value`]), so the member to remove survives the
    /// Node and its mapping going away.
    pub hook_member: Option<u64>,
    /// Our hook's value says a removal of ours chose this Machine (a hook
    /// born empty only holds deletions others start).
    pub removal_chosen: bool,
    /// cluster-api-k3s's hook (`pre-terminate.delete.hook.machine.cluster.x-k8s.io: k3s`)
    /// is on the Machine: left by the upstream controller this one replaced,
    /// ours to release once the member is gone (never another owner's hook).
    pub has_upstream_hook: bool,
    /// Other pre-terminate hooks (other owners) still on the Machine.
    pub other_pre_terminate_hooks: Vec<String>,
    /// CAPI reports it drained the node and waits on pre-terminate hooks
    /// (v1beta2 `Deleting=True` reason `WaitingForPreTerminateHook`; v1beta1
    /// `PreTerminateDeleteHookSucceeded=False`).
    pub waiting_for_pre_terminate_hook: bool,
    /// A leadership move off this Machine's member that this process started
    /// and has not seen finish.
    pub leadership_move: Option<MoveInFlight>,
}

/// A leadership move under way, as the removal steps read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoveInFlight {
    pub from: u64,
    pub to: u64,
    /// Still within its deadline (at least two election timeouts).
    pub in_time: bool,
}

impl MachineView {
    /// A new, healthy-by-default machine (for tests and simple mappings).
    pub fn new(name: &str, created: DateTime<Utc>) -> Self {
        Self {
            name: name.to_string(),
            created,
            deleting: None,
            node_ref: Some(format!("node-{name}")),
            failure_domain: None,
            health_check_succeeded: None,
            owner_remediated: None,
            externally_remediated: false,
            remediate_requested: false,
            remediation_for: None,
            delete_requested: false,
            outdated: false,
            outdated_reasons: Vec::new(),
            etcd_member: None,
            etcd_member_missing: None,
            components_healthy: None,
            has_our_hook: false,
            hook_member: None,
            removal_chosen: false,
            has_upstream_hook: false,
            other_pre_terminate_hooks: Vec::new(),
            waiting_for_pre_terminate_hook: false,
            leadership_move: None,
        }
    }

    pub fn is_deleting(&self) -> bool {
        self.deleting.is_some()
    }

    /// Marked unhealthy by a MachineHealthCheck (whoever remediates it).
    pub fn is_mhc_unhealthy(&self) -> bool {
        self.health_check_succeeded == Some(false)
    }

    /// Ours to remediate: `HealthCheckSucceeded=False` and `OwnerRemediated=False`.
    pub fn needs_owner_remediation(&self) -> bool {
        !self.externally_remediated
            && self.health_check_succeeded == Some(false)
            && self.owner_remediated == Some(false)
    }

    /// A left-over `OwnerRemediated=False` on a machine that recovered.
    pub fn has_stale_owner_remediated(&self) -> bool {
        !self.is_deleting()
            && self.health_check_succeeded == Some(true)
            && self.owner_remediated == Some(false)
    }

    /// Sort key "oldest first, then name".
    pub fn age_key(&self) -> (DateTime<Utc>, &str) {
        (self.created, &self.name)
    }
}

/// One KThreesControlPlane and everything the rules need about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControlPlaneView {
    pub name: String,
    /// `status.initialized` / `status.initialization.controlPlaneInitialized`.
    pub initialized: bool,
    pub desired_replicas: u32,
    pub strategy: RemediationStrategy,
    /// Annotation `remediation-in-progress`, parsed.
    pub remediation_in_progress: Option<RemediationData>,
    pub etcd: EtcdState,
    /// Failure domains the Cluster offers to control-plane machines.
    pub failure_domains: Vec<String>,
    /// `Cluster.spec.topology.version` when it differs from the KCP's
    /// `spec.version` (ClusterClass clusters): an upgrade is still to be propagated.
    pub pending_topology_version: Option<String>,
    pub machines: Vec<MachineView>,
}

impl ControlPlaneView {
    pub fn machine(&self, name: &str) -> Option<&MachineView> {
        self.machines.iter().find(|m| m.name == name)
    }

    /// Names of the machines being deleted (`deletionTimestamp` set).
    pub fn deleting_machine_names(&self) -> Vec<&str> {
        self.machines
            .iter()
            .filter(|m| m.is_deleting())
            .map(|m| m.name.as_str())
            .collect()
    }

    pub fn membership(&self) -> Option<&Membership> {
        match &self.etcd {
            EtcdState::Observed(m) => Some(m),
            _ => None,
        }
    }

    pub fn etcd_managed(&self) -> bool {
        !matches!(self.etcd, EtcdState::NotManaged)
    }

    /// The machine's member as observed in the membership (a mapped id that is
    /// no longer a member counts as no member).
    pub fn member_of(&self, machine: &MachineView) -> Option<&MemberView> {
        let id = machine.etcd_member?;
        self.membership()?.member(id)
    }

    /// The target's member: the one recorded in our hook while it is in the
    /// membership, else the one the membership maps to it now. After our
    /// removal a k3s restart on the target brings a new member under a new
    /// name (its tombstone, docs/k3s.md T2) that maps to the same Machine: it
    /// is removed too before the hook goes, or it would be promoted and die
    /// with the VM.
    pub fn current_member(&self, target: &MachineView) -> Option<u64> {
        let membership = self.membership()?;
        let present = |id: &u64| membership.member(*id).is_some();
        target
            .hook_member
            .filter(present)
            .or(target.etcd_member.filter(present))
    }

    /// What the membership read in this pass says of `target`'s member. It
    /// has none only provably: the member our hook recorded is gone, or every
    /// member is claimed by another Machine. Otherwise any member no Machine
    /// claims (an unnamed, starting one included) may be its own.
    pub fn target_member(&self, target: &MachineView) -> TargetMember {
        let Some(membership) = self.membership() else {
            return TargetMember::Unknown { unclaimed: vec![] };
        };
        if let Some(id) = self.current_member(target) {
            return TargetMember::Member(id);
        }
        if target.hook_member.is_some() {
            return TargetMember::None;
        }
        let unclaimed: Vec<u64> = membership
            .members
            .iter()
            .filter(|member| {
                member.name.is_empty()
                    || !self.machines.iter().any(|m| {
                        m.etcd_member == Some(member.id) || m.hook_member == Some(member.id)
                    })
            })
            .map(|member| member.id)
            .collect();
        if unclaimed.is_empty() {
            TargetMember::None
        } else {
            TargetMember::Unknown { unclaimed }
        }
    }

    /// The machine's etcd member is unhealthy (probe error or alarm), or is
    /// missing past its grace period while the Node shows embedded etcd. A
    /// machine whose Node shows no etcd (`--disable-etcd`) has no etcd problem.
    pub fn etcd_member_unhealthy(&self, machine: &MachineView) -> bool {
        self.member_of(machine)
            .is_some_and(|m| m.unhealthy_reason().is_some())
            || (self.membership().is_some()
                && machine
                    .etcd_member_missing
                    .as_ref()
                    .is_some_and(|m| m.confirmed))
    }
}

/// A removal target's etcd member, as the real membership shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetMember {
    /// This member is the target's.
    Member(u64),
    /// Provably none: removing the target costs nothing.
    None,
    /// Not mapped, but these members (ids) are claimed by no Machine: any of
    /// them may be the target's (empty: the membership was not read).
    Unknown { unclaimed: Vec<u64> },
}

impl TargetMember {
    /// What would let the mapping pair `machine` with its member, for messages.
    pub fn how_to_map(machine: &MachineView) -> String {
        format!(
            "give {}'s Node ({}) the annotation {} with its member's name, or set the Machine's status.addresses to the member's peer address; or, if the member is not its own, remove that member with `k3s-control-plane etcd remove-member`",
            machine.name,
            machine.node_ref.as_deref().unwrap_or("no nodeRef yet"),
            crate::api::names::K3S_ETCD_NODE_NAME_ANNOTATION
        )
    }
}

/// Go's `time.Duration` notation ("1h0m0s", "5m0s", "30s"), as CAPI prints it.
pub fn format_duration(d: Duration) -> String {
    let total = d.as_secs();
    let millis = d.subsec_millis();
    let (h, m, s) = (total / 3600, (total / 60) % 60, total % 60);
    let secs = if millis == 0 {
        format!("{s}s")
    } else {
        let fraction = format!("{millis:03}");
        format!("{s}.{}s", fraction.trim_end_matches('0'))
    };
    if h > 0 {
        format!("{h}h{m}m{secs}")
    } else if m > 0 {
        format!("{m}m{secs}")
    } else {
        secs
    }
}

/// The status form of a remediation record (`status.lastRemediation`).
impl From<&RemediationData> for crate::api::RemediationData {
    fn from(record: &RemediationData) -> Self {
        let timestamp = record
            .timestamp
            .and_then(|t| k8s_openapi::jiff::Timestamp::from_second(t.timestamp()).ok())
            .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        crate::api::RemediationData {
            machine: record.machine.clone(),
            timestamp: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(timestamp),
            retry_count: record.retry_count.min(i32::MAX as u32) as i32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn status_form_serializes_like_the_annotations() {
        let text = r#"{"machine":"m1","timestamp":"2024-05-01T10:00:00Z","retryCount":2}"#;
        let record = RemediationData::parse(text, "ns/m2", "test").unwrap();
        let status = crate::api::RemediationData::from(&record);
        assert_eq!(serde_json::to_string(&status).unwrap(), text);
    }

    #[test]
    fn remediation_data_round_trips_the_capi_json() {
        let value = r#"{"machine":"m1","timestamp":"2024-05-01T10:00:00Z","retryCount":0}"#;
        let data = RemediationData::parse(value, "kcp/cp", REMEDIATION_FOR_ANNOTATION).unwrap();
        assert_eq!(
            data,
            RemediationData {
                machine: "m1".into(),
                timestamp: Some(Utc.with_ymd_and_hms(2024, 5, 1, 10, 0, 0).unwrap()),
                retry_count: 0,
            }
        );
        assert_eq!(data.to_annotation(), value);
    }

    #[test]
    fn a_null_timestamp_is_accepted_as_unknown() {
        let data = RemediationData::parse(
            r#"{"machine":"m1","timestamp":null,"retryCount":2}"#,
            "machine/m2",
            REMEDIATION_FOR_ANNOTATION,
        )
        .unwrap();
        assert_eq!(data.timestamp, None);
        assert_eq!(data.retry_count, 2);
    }

    #[test]
    fn bad_remediation_data_names_object_and_annotation() {
        let err = RemediationData::parse("{nope", "kcp/cp", REMEDIATION_IN_PROGRESS_ANNOTATION)
            .unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("kcp/cp: annotation controlplane.cluster.x-k8s.io/remediation-in-progress is not valid remediation data"), "{msg}");
    }

    /// cluster-api-k3s marshals its `RemediationData` with Go's encoding/json:
    /// `metav1.Time` at seconds precision in UTC, `retryCount` always written.
    #[test]
    fn an_upstream_remediation_in_progress_value_is_continued_with_its_retry_count() {
        let upstream = r#"{"machine":"prod-control-plane-4hv9q","timestamp":"2026-11-30T08:15:42Z","retryCount":2}"#;
        let data = RemediationData::parse(
            upstream,
            "KThreesControlPlane team-a/prod-control-plane",
            REMEDIATION_IN_PROGRESS_ANNOTATION,
        )
        .unwrap();
        assert_eq!(data.machine, "prod-control-plane-4hv9q");
        assert_eq!(
            data.timestamp,
            Some(Utc.with_ymd_and_hms(2026, 11, 30, 8, 15, 42).unwrap())
        );
        assert_eq!(data.retry_count, 2);
        // Written back byte for byte as upstream wrote it: the replacement's
        // `remediation-for` and a rollback to upstream read the same value.
        assert_eq!(data.to_annotation(), upstream);
    }

    #[test]
    fn upstream_format_variants_go_accepts_are_accepted() {
        let parse =
            |v: &str| RemediationData::parse(v, "kcp/cp", REMEDIATION_IN_PROGRESS_ANNOTATION);
        // Fractional seconds and an offset (Go's RFC 3339 parser takes both).
        let data =
            parse(r#"{"machine":"m1","timestamp":"2026-11-30T09:15:42.123+01:00","retryCount":0}"#)
                .unwrap();
        assert_eq!(
            data.timestamp.map(|t| t.timestamp()),
            Some(
                Utc.with_ymd_and_hms(2026, 11, 30, 8, 15, 42)
                    .unwrap()
                    .timestamp()
            )
        );
        // Missing timestamp and retryCount: Go leaves them zero.
        let data = parse(r#"{"machine":"m1"}"#).unwrap();
        assert_eq!((data.timestamp, data.retry_count), (None, 0));
        // Unknown fields are ignored, as Go does.
        assert!(parse(r#"{"machine":"m1","timestamp":null,"retryCount":1,"extra":true}"#).is_ok());
    }

    #[test]
    fn a_malformed_upstream_record_is_refused_naming_the_object_and_annotation() {
        for bad in [
            r#"{"machine":"m1","timestamp":"30/11/2026 08:15","retryCount":0}"#,
            r#"{"machine":"m1","timestamp":"2026-11-30T08:15:42Z","retryCount":"2"}"#,
            r#"{"timestamp":"2026-11-30T08:15:42Z","retryCount":0}"#,
            "machine=m1",
        ] {
            let err = RemediationData::parse(
                bad,
                "KThreesControlPlane team-a/prod-control-plane",
                REMEDIATION_IN_PROGRESS_ANNOTATION,
            )
            .unwrap_err()
            .to_string();
            assert!(
                err.starts_with("KThreesControlPlane team-a/prod-control-plane: annotation controlplane.cluster.x-k8s.io/remediation-in-progress is not valid remediation data"),
                "{err}"
            );
            assert!(err.contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[test]
    fn durations_print_like_go() {
        assert_eq!(format_duration(Duration::from_secs(3600)), "1h0m0s");
        assert_eq!(format_duration(Duration::from_secs(300)), "5m0s");
        assert_eq!(format_duration(Duration::from_secs(30)), "30s");
        assert_eq!(format_duration(Duration::ZERO), "0s");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1.5s");
    }
}
