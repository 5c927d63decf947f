//! The KThreesControlPlane rules, in Rust. The CRD carries the same rules as CEL
//! (see [`super::kcp`]), but the controller must not trust that the installed CRD
//! is ours or current, so it runs [`validate_kcp`] on every reconcile and refuses
//! to act on an object that breaks a rule.
//!
//! Two rules are transition rules: they compare `spec.version` with the old
//! object's (CEL `oldSelf`), so the API server runs them on UPDATE only, and so
//! does [`validate_kcp_update`]; [`validate_kcp`] has no old object and skips
//! them. [`check_version_change`] is the same check on two bare versions.

use std::fmt;
use std::sync::LazyLock;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use regex::Regex;

use super::kcp::{DATASTORE_ENDPOINT_MESSAGE, K3S_VERSION_PATTERN, KThreesControlPlane};

static K3S_VERSION: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(K3S_VERSION_PATTERN).expect("version pattern compiles"));

/// Every rule; the CRD has one CEL rule per variant (tests check both agree).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rule {
    /// `spec.version` is a k3s version like `v1.30.2+k3s2`.
    VersionFormat,
    /// `spec.replicas` >= 1.
    ReplicasAtLeastOne,
    /// `spec.replicas` odd unless `spec.externalDatastore` is declared.
    ReplicasOddWithEmbeddedEtcd,
    /// `serverConfig.datastoreEndpoint` only with `spec.externalDatastore`:
    /// the bootstrap provider does not pass it on.
    DatastoreEndpointNeedsExternalDatastore,
    /// `spec.machineTemplate.spec.infrastructureRef` present with kind and name.
    InfrastructureRefRequired,
    /// `spec.remediation.maxRetry` >= 0.
    MaxRetryNotNegative,
    /// `spec.rollout.before.certificatesExpiryDays` >= 7.
    CertificatesExpiryDaysAtLeastSeven,
    /// `spec.remediation.retryPeriodSeconds` >= 0.
    RetryPeriodNotNegative,
    /// `spec.remediation.minHealthyPeriodSeconds` >= 0.
    MinHealthyPeriodNotNegative,
    /// `spec.rollout.strategy.rollingUpdate.maxSurge` is 0 or 1 (or `"0"`/`"1"`).
    MaxSurgeZeroOrOne,
    /// `spec.rollout.strategy.type`, if set, is `RollingUpdate`.
    RolloutTypeRollingUpdate,
    /// `spec.machineTemplate.spec.deletion.nodeDrainTimeoutSeconds` >= 0.
    NodeDrainTimeoutNotNegative,
    /// `spec.machineTemplate.spec.deletion.nodeVolumeDetachTimeoutSeconds` >= 0.
    NodeVolumeDetachTimeoutNotNegative,
    /// `spec.machineTemplate.spec.deletion.nodeDeletionTimeoutSeconds` >= 0.
    NodeDeletionTimeoutNotNegative,
    /// Each readiness gate's `polarity`, if set, is `Positive` or `Negative`.
    ReadinessGatePolarity,
    /// `spec.machineNaming.template`, if set, contains `{{ .random }}`.
    MachineNamingHasRandom,
    /// `spec.etcdBackup.target` names exactly one of `s3` and `filesystem`.
    EtcdBackupOneTarget,
    /// `spec.etcdBackup.target.s3` has an endpoint and a bucket.
    EtcdBackupS3EndpointAndBucket,
    /// `spec.etcdBackup.target.filesystem.path` is absolute.
    EtcdBackupFilesystemPathAbsolute,
    /// `spec.etcdBackup.schedule` has the shape of a 5-field cron expression.
    EtcdBackupScheduleShape,
    /// `spec.etcdBackup.retention.count` >= 1.
    EtcdBackupRetentionCountAtLeastOne,
    /// `spec.etcdBackup.retention.maxAgeSeconds` >= 60.
    EtcdBackupRetentionMaxAgeAtLeastAMinute,
    /// `spec.etcdBackup.snapshotTimeoutSeconds` >= 1.
    EtcdBackupSnapshotTimeoutAtLeastOne,
    /// UPDATE only: `spec.version` does not go below the old one (see [`K3sVersion`]).
    VersionNoDowngrade,
    /// UPDATE only: `spec.version` moves at most one minor version up and keeps
    /// the major version.
    VersionNoMinorSkip,
}

impl Rule {
    pub const ALL: [Rule; 25] = [
        Rule::VersionFormat,
        Rule::ReplicasAtLeastOne,
        Rule::ReplicasOddWithEmbeddedEtcd,
        Rule::DatastoreEndpointNeedsExternalDatastore,
        Rule::InfrastructureRefRequired,
        Rule::MaxRetryNotNegative,
        Rule::CertificatesExpiryDaysAtLeastSeven,
        Rule::RetryPeriodNotNegative,
        Rule::MinHealthyPeriodNotNegative,
        Rule::MaxSurgeZeroOrOne,
        Rule::RolloutTypeRollingUpdate,
        Rule::NodeDrainTimeoutNotNegative,
        Rule::NodeVolumeDetachTimeoutNotNegative,
        Rule::NodeDeletionTimeoutNotNegative,
        Rule::ReadinessGatePolarity,
        Rule::MachineNamingHasRandom,
        Rule::EtcdBackupOneTarget,
        Rule::EtcdBackupS3EndpointAndBucket,
        Rule::EtcdBackupFilesystemPathAbsolute,
        Rule::EtcdBackupScheduleShape,
        Rule::EtcdBackupRetentionCountAtLeastOne,
        Rule::EtcdBackupRetentionMaxAgeAtLeastAMinute,
        Rule::EtcdBackupSnapshotTimeoutAtLeastOne,
        Rule::VersionNoDowngrade,
        Rule::VersionNoMinorSkip,
    ];

    /// JSON path of the field the rule is about.
    pub fn field(self) -> &'static str {
        match self {
            Rule::VersionFormat | Rule::VersionNoDowngrade | Rule::VersionNoMinorSkip => {
                "spec.version"
            }
            Rule::ReplicasAtLeastOne | Rule::ReplicasOddWithEmbeddedEtcd => "spec.replicas",
            Rule::DatastoreEndpointNeedsExternalDatastore => {
                "spec.kthreesConfigSpec.serverConfig.datastoreEndpoint"
            }
            Rule::InfrastructureRefRequired => "spec.machineTemplate.spec.infrastructureRef",
            Rule::MaxRetryNotNegative => "spec.remediation.maxRetry",
            Rule::CertificatesExpiryDaysAtLeastSeven => {
                "spec.rollout.before.certificatesExpiryDays"
            }
            Rule::RetryPeriodNotNegative => "spec.remediation.retryPeriodSeconds",
            Rule::MinHealthyPeriodNotNegative => "spec.remediation.minHealthyPeriodSeconds",
            Rule::MaxSurgeZeroOrOne => "spec.rollout.strategy.rollingUpdate.maxSurge",
            Rule::RolloutTypeRollingUpdate => "spec.rollout.strategy.type",
            Rule::NodeDrainTimeoutNotNegative => {
                "spec.machineTemplate.spec.deletion.nodeDrainTimeoutSeconds"
            }
            Rule::NodeVolumeDetachTimeoutNotNegative => {
                "spec.machineTemplate.spec.deletion.nodeVolumeDetachTimeoutSeconds"
            }
            Rule::NodeDeletionTimeoutNotNegative => {
                "spec.machineTemplate.spec.deletion.nodeDeletionTimeoutSeconds"
            }
            Rule::ReadinessGatePolarity => "spec.machineTemplate.spec.readinessGates[].polarity",
            Rule::MachineNamingHasRandom => "spec.machineNaming.template",
            Rule::EtcdBackupOneTarget => "spec.etcdBackup.target",
            Rule::EtcdBackupS3EndpointAndBucket => "spec.etcdBackup.target.s3",
            Rule::EtcdBackupFilesystemPathAbsolute => "spec.etcdBackup.target.filesystem.path",
            Rule::EtcdBackupScheduleShape => "spec.etcdBackup.schedule",
            Rule::EtcdBackupRetentionCountAtLeastOne => "spec.etcdBackup.retention.count",
            Rule::EtcdBackupRetentionMaxAgeAtLeastAMinute => {
                "spec.etcdBackup.retention.maxAgeSeconds"
            }
            Rule::EtcdBackupSnapshotTimeoutAtLeastOne => "spec.etcdBackup.snapshotTimeoutSeconds",
        }
    }

    /// Whether the rule compares with the old object (UPDATE only).
    pub fn is_transition(self) -> bool {
        matches!(self, Rule::VersionNoDowngrade | Rule::VersionNoMinorSkip)
    }
}

/// One broken rule on one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidationError {
    /// `namespace/name` of the object.
    pub object: String,
    pub rule: Rule,
    /// What is wrong, with the offending value.
    pub message: String,
}

impl ValidationError {
    pub fn field(&self) -> &'static str {
        self.rule.field()
    }
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.object, self.field(), self.message)
    }
}

/// All broken rules of one object (never empty).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ValidationErrors(pub Vec<ValidationError>);

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for e in &self.0 {
            if !first {
                f.write_str("; ")?;
            }
            first = false;
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl ValidationErrors {
    /// Whether `rule` is among the errors.
    pub fn has(&self, rule: Rule) -> bool {
        self.0.iter().any(|e| e.rule == rule)
    }
    pub fn rules(&self) -> Vec<Rule> {
        self.0.iter().map(|e| e.rule).collect()
    }
}

static CRON_SHAPE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(super::etcd_backup::CRON_SHAPE_PATTERN).expect("cron shape pattern compiles")
});

fn validate_etcd_backup(
    backup: &super::etcd_backup::EtcdBackup,
    fail: &mut impl FnMut(Rule, String),
) {
    let target = &backup.target;
    if target.s3.is_some() == target.filesystem.is_some() {
        fail(
            Rule::EtcdBackupOneTarget,
            "must name exactly one of s3 and filesystem".into(),
        );
    }
    if let Some(s3) = &target.s3 {
        let missing: Vec<&str> = [("endpoint", &s3.endpoint), ("bucket", &s3.bucket)]
            .into_iter()
            .filter(|(_, v)| v.is_empty())
            .map(|(k, _)| k)
            .collect();
        if !missing.is_empty() {
            fail(
                Rule::EtcdBackupS3EndpointAndBucket,
                format!(
                    "endpoint and bucket are required (missing {})",
                    missing.join(" and ")
                ),
            );
        }
    }
    if let Some(fs) = target
        .filesystem
        .as_ref()
        .filter(|f| !f.path.starts_with('/'))
    {
        fail(
            Rule::EtcdBackupFilesystemPathAbsolute,
            format!("must be an absolute path (got {:?})", fs.path),
        );
    }
    if let Some(schedule) = backup
        .schedule
        .as_deref()
        .filter(|s| !CRON_SHAPE.is_match(s))
    {
        fail(
            Rule::EtcdBackupScheduleShape,
            format!("must be a 5-field cron expression like \"0 */12 * * *\" (got {schedule:?})"),
        );
    }
    if let Some(n) = backup.retention.count.filter(|n| *n < 1) {
        fail(
            Rule::EtcdBackupRetentionCountAtLeastOne,
            format!("must be at least 1 (got {n})"),
        );
    }
    if let Some(n) = backup.retention.max_age_seconds.filter(|n| *n < 60) {
        fail(
            Rule::EtcdBackupRetentionMaxAgeAtLeastAMinute,
            format!("must be at least 60 (got {n})"),
        );
    }
    if let Some(n) = backup.snapshot_timeout_seconds.filter(|n| *n < 1) {
        fail(
            Rule::EtcdBackupSnapshotTimeoutAtLeastOne,
            format!("must be at least 1 (got {n})"),
        );
    }
}

/// Check every rule but the transition rules; `Err` lists all that are broken.
pub fn validate_kcp(kcp: &KThreesControlPlane) -> Result<(), ValidationErrors> {
    let object = object_name(kcp);
    let mut errors = Vec::new();
    let mut fail = |rule: Rule, message: String| {
        errors.push(ValidationError {
            object: object.clone(),
            rule,
            message,
        })
    };
    let spec = &kcp.spec;

    if !K3S_VERSION.is_match(&spec.version) {
        fail(
            Rule::VersionFormat,
            format!("must look like v1.30.2+k3s2 (got {:?})", spec.version),
        );
    }

    let replicas = kcp.desired_replicas();
    if replicas < 1 {
        fail(
            Rule::ReplicasAtLeastOne,
            format!("must be at least 1 (got {replicas})"),
        );
    } else if replicas % 2 == 0 && kcp.etcd_is_embedded() {
        fail(
            Rule::ReplicasOddWithEmbeddedEtcd,
            format!(
                "must be odd while etcd is embedded (got {replicas}): {replicas} members tolerate \
                 no more failures than {}",
                replicas - 1
            ),
        );
    }

    if spec
        .kthrees_config_spec
        .server_config
        .datastore_endpoint
        .as_deref()
        .is_some_and(|e| !e.is_empty())
        && kcp.etcd_is_embedded()
    {
        let field = Rule::DatastoreEndpointNeedsExternalDatastore.field();
        fail(
            Rule::DatastoreEndpointNeedsExternalDatastore,
            DATASTORE_ENDPOINT_MESSAGE
                .strip_prefix(&format!("{field}: "))
                .unwrap_or(DATASTORE_ENDPOINT_MESSAGE)
                .to_string(),
        );
    }

    let infra = &spec.machine_template.spec.infrastructure_ref;
    let missing: Vec<&str> = [("kind", &infra.kind), ("name", &infra.name)]
        .into_iter()
        .filter(|(_, v)| v.is_empty())
        .map(|(k, _)| k)
        .collect();
    if !missing.is_empty() {
        fail(
            Rule::InfrastructureRefRequired,
            format!(
                "is required, with apiGroup, kind and name (missing {})",
                missing.join(" and ")
            ),
        );
    }

    if let Some(days) = kcp.certificates_expiry_days().filter(|d| *d < 7) {
        fail(
            Rule::CertificatesExpiryDaysAtLeastSeven,
            format!("must be at least 7 (got {days})"),
        );
    }

    let remediation = &spec.remediation;
    let deletion = &spec.machine_template.spec.deletion;
    for (rule, value) in [
        (Rule::MaxRetryNotNegative, remediation.max_retry),
        (
            Rule::RetryPeriodNotNegative,
            remediation.retry_period_seconds,
        ),
        (
            Rule::MinHealthyPeriodNotNegative,
            remediation.min_healthy_period_seconds,
        ),
        (
            Rule::NodeDrainTimeoutNotNegative,
            deletion.node_drain_timeout_seconds,
        ),
        (
            Rule::NodeVolumeDetachTimeoutNotNegative,
            deletion.node_volume_detach_timeout_seconds,
        ),
        (
            Rule::NodeDeletionTimeoutNotNegative,
            deletion.node_deletion_timeout_seconds,
        ),
    ] {
        if let Some(n) = value.filter(|n| *n < 0) {
            fail(rule, format!("must not be negative (got {n})"));
        }
    }

    for gate in &spec.machine_template.spec.readiness_gates {
        if let Some(p) = gate
            .polarity
            .as_deref()
            .filter(|p| !["Positive", "Negative"].contains(p))
        {
            fail(
                Rule::ReadinessGatePolarity,
                format!(
                    "must be Positive or Negative (got {p:?} for {:?})",
                    gate.condition_type
                ),
            );
        }
    }

    if let Some(template) = spec
        .machine_naming
        .template
        .as_deref()
        .filter(|t| !t.contains(super::machine_naming::RANDOM))
    {
        fail(
            Rule::MachineNamingHasRandom,
            format!(
                "must contain {} (got {template:?})",
                super::machine_naming::RANDOM
            ),
        );
    }

    if let Some(backup) = &spec.etcd_backup {
        validate_etcd_backup(backup, &mut fail);
    }

    let strategy = &spec.rollout.strategy;
    if let Some(kind) = strategy.type_.as_deref().filter(|t| *t != "RollingUpdate") {
        fail(
            Rule::RolloutTypeRollingUpdate,
            format!("must be RollingUpdate (got {kind:?})"),
        );
    }
    // max_surge() is what the controller acts on: None is exactly "not 0 or 1".
    if let (None, Some(surge)) = (
        kcp.max_surge(),
        strategy
            .rolling_update
            .as_ref()
            .and_then(|r| r.max_surge.as_ref()),
    ) {
        let got = match surge {
            IntOrString::Int(n) => n.to_string(),
            IntOrString::String(s) => format!("{s:?}"),
        };
        fail(
            Rule::MaxSurgeZeroOrOne,
            format!("must be 0 or 1 (got {got})"),
        );
    }

    if errors.is_empty() {
        Ok(())
    } else {
        Err(ValidationErrors(errors))
    }
}

/// [`validate_kcp`] on `new` plus the transition rules from `old` to `new`:
/// what the API server checks on UPDATE.
pub fn validate_kcp_update(
    old: &KThreesControlPlane,
    new: &KThreesControlPlane,
) -> Result<(), ValidationErrors> {
    let mut errors = match validate_kcp(new) {
        Ok(()) => Vec::new(),
        Err(ValidationErrors(errors)) => errors,
    };
    // An unparseable version is VersionFormat's alone: the check passes it.
    if let Err(e) = check_version_change(&old.spec.version, &new.spec.version) {
        errors.push(ValidationError {
            object: object_name(new),
            rule: e.rule,
            message: e.message,
        });
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ValidationErrors(errors))
    }
}

/// A k3s version, as the transition rules order it.
///
/// Precedence is the field order: major, minor, patch, k3s revision (`+k3sN`),
/// then a release above a pre-release of the same numbers (`v1.31.0+k3s1` >
/// `v1.31.0-rc2+k3s1`). Pre-release tags are not ordered among themselves:
/// `-rc1` and `-rc2` of the same numbers compare equal, so moving between them
/// either way is no downgrade. The CRD's CEL rules take the version apart the
/// same way (see `kcp::version_cel_parts`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct K3sVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
    /// `N` of `+k3sN`.
    pub k3s: u32,
    /// No pre-release tag.
    pub release: bool,
}

impl K3sVersion {
    /// `None` unless `version` matches [`K3S_VERSION_PATTERN`] (whose numbers
    /// have at most 9 digits, so they always fit).
    pub fn parse(version: &str) -> Option<K3sVersion> {
        if !K3S_VERSION.is_match(version) {
            return None;
        }
        let (core, k3s) = version.split_once("+k3s")?;
        let (numbers, release) = match core.split_once('-') {
            Some((numbers, _tag)) => (numbers, false),
            None => (core, true),
        };
        let mut numbers = numbers.strip_prefix('v')?.split('.').map(str::parse);
        Some(K3sVersion {
            major: numbers.next()?.ok()?,
            minor: numbers.next()?.ok()?,
            patch: numbers.next()?.ok()?,
            k3s: k3s.parse().ok()?,
            release,
        })
    }
}

/// A `spec.version` change the transition rules forbid. Displays as
/// `spec.version: <message>`, the CRD's CEL message, naming both versions.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", rule.field())]
pub struct VersionChangeError {
    /// [`Rule::VersionNoDowngrade`] or [`Rule::VersionNoMinorSkip`].
    pub rule: Rule,
    /// Without the field, as in [`ValidationError::message`].
    pub message: String,
}

/// Whether the k3s version may go from `from` to `to`: no downgrade (see
/// [`K3sVersion`] for the order), no minor version skipped and no major version
/// change. A downgrade is reported as that even when it also changes the major
/// version. Passes when either version does not parse: that is
/// [`Rule::VersionFormat`]'s to report, once. No allocation unless it fails.
pub fn check_version_change(from: &str, to: &str) -> Result<(), VersionChangeError> {
    let (Some(old), Some(new)) = (K3sVersion::parse(from), K3sVersion::parse(to)) else {
        return Ok(());
    };
    let (rule, message) = if new < old {
        (
            Rule::VersionNoDowngrade,
            format!("cannot downgrade from {from} to {to}"),
        )
    } else if new.major != old.major {
        (
            Rule::VersionNoMinorSkip,
            format!("cannot change the major version: {from} to {to}"),
        )
    } else if new.minor > old.minor + 1 {
        (
            Rule::VersionNoMinorSkip,
            format!(
                "cannot skip a minor version: {from} to {to} (one minor version at a time: \
                 from v{}.{} to the next)",
                old.major, old.minor
            ),
        )
    } else {
        return Ok(());
    };
    Err(VersionChangeError { rule, message })
}

fn object_name(kcp: &KThreesControlPlane) -> String {
    format!("{}/{}", kcp.namespace().unwrap_or_default(), kcp.name_any())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_into_the_parts_the_cel_rules_read() {
        let v = |major, minor, patch, k3s, release| K3sVersion {
            major,
            minor,
            patch,
            k3s,
            release,
        };
        assert_eq!(
            K3sVersion::parse("v1.30.2+k3s2"),
            Some(v(1, 30, 2, 2, true))
        );
        assert_eq!(
            K3sVersion::parse("v1.31.0-rc.1-x+k3s10"),
            Some(v(1, 31, 0, 10, false))
        );
        assert_eq!(
            K3sVersion::parse("v999999999.0.0+k3s999999999"),
            Some(v(999_999_999, 0, 0, 999_999_999, true))
        );
        for bad in [
            "",
            "v1.30.2",
            "1.30.2+k3s2",
            "v1.30+k3s1",
            "v1.30.2+k3s",
            "v1.30.2-+k3s1",
        ] {
            assert_eq!(K3sVersion::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_release_ranks_above_its_pre_releases_which_tie() {
        let p = |s| K3sVersion::parse(s).unwrap();
        assert!(p("v1.31.0-rc9+k3s1") < p("v1.31.0+k3s1"));
        assert!(p("v1.31.0+k3s1") < p("v1.31.0-rc1+k3s2"));
        assert_eq!(p("v1.31.0-rc1+k3s1"), p("v1.31.0-rc2+k3s1"));
    }

    #[test]
    fn unparseable_versions_are_left_to_the_format_rule() {
        assert_eq!(check_version_change("v1.31.0+k3s1", "latest"), Ok(()));
        assert_eq!(check_version_change("latest", "v1.20.0+k3s1"), Ok(()));
    }
}
