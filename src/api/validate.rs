//! The KThreesControlPlane rules, in Rust. The CRD carries the same rules as CEL
//! (see [`super::kcp`]), but the controller must not trust that the installed CRD
//! is ours or current, so it runs [`validate_kcp`] on every reconcile and refuses
//! to act on an object that breaks a rule.

use std::fmt;
use std::sync::LazyLock;

use kube::ResourceExt;
use regex::Regex;

use super::kcp::{K3S_VERSION_PATTERN, KThreesControlPlane};
use super::refs::GoDuration;

static K3S_VERSION: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(K3S_VERSION_PATTERN).expect("version pattern compiles"));

/// Every rule; the CRD has one CEL rule per variant (tests check both agree).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rule {
    /// `spec.version` is a k3s version like `v1.30.2+k3s2`.
    VersionFormat,
    /// `spec.replicas` >= 1.
    ReplicasAtLeastOne,
    /// `spec.replicas` odd unless an external datastore is configured.
    ReplicasOddWithEmbeddedEtcd,
    /// `spec.machineTemplate.infrastructureRef` present with kind and name.
    InfrastructureRefRequired,
    /// `spec.remediationStrategy.maxRetry` >= 0.
    MaxRetryNotNegative,
    /// `spec.remediationStrategy.retryPeriod` is a non-negative Go duration.
    RetryPeriodDuration,
    /// `spec.remediationStrategy.minHealthyPeriod` is a non-negative Go duration.
    MinHealthyPeriodDuration,
}

impl Rule {
    pub const ALL: [Rule; 7] = [
        Rule::VersionFormat,
        Rule::ReplicasAtLeastOne,
        Rule::ReplicasOddWithEmbeddedEtcd,
        Rule::InfrastructureRefRequired,
        Rule::MaxRetryNotNegative,
        Rule::RetryPeriodDuration,
        Rule::MinHealthyPeriodDuration,
    ];

    /// JSON path of the field the rule is about.
    pub fn field(self) -> &'static str {
        match self {
            Rule::VersionFormat => "spec.version",
            Rule::ReplicasAtLeastOne | Rule::ReplicasOddWithEmbeddedEtcd => "spec.replicas",
            Rule::InfrastructureRefRequired => "spec.machineTemplate.infrastructureRef",
            Rule::MaxRetryNotNegative => "spec.remediationStrategy.maxRetry",
            Rule::RetryPeriodDuration => "spec.remediationStrategy.retryPeriod",
            Rule::MinHealthyPeriodDuration => "spec.remediationStrategy.minHealthyPeriod",
        }
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

/// Check every rule; `Err` lists all that are broken.
pub fn validate_kcp(kcp: &KThreesControlPlane) -> Result<(), ValidationErrors> {
    let object = format!("{}/{}", kcp.namespace().unwrap_or_default(), kcp.name_any());
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

    match &spec.machine_template.infrastructure_ref {
        None => fail(Rule::InfrastructureRefRequired, "is required".into()),
        Some(r) => {
            let missing: Vec<&str> = [("kind", &r.kind), ("name", &r.name)]
                .into_iter()
                .filter(|(_, v)| v.as_deref().is_none_or(str::is_empty))
                .map(|(k, _)| k)
                .collect();
            if !missing.is_empty() {
                fail(
                    Rule::InfrastructureRefRequired,
                    format!("needs {}", missing.join(" and ")),
                );
            }
        }
    }

    if let Some(strategy) = &spec.remediation_strategy {
        if let Some(max) = strategy.max_retry.filter(|m| *m < 0) {
            fail(
                Rule::MaxRetryNotNegative,
                format!("must not be negative (got {max})"),
            );
        }
        for (rule, value) in [
            (Rule::RetryPeriodDuration, &strategy.retry_period),
            (Rule::MinHealthyPeriodDuration, &strategy.min_healthy_period),
        ] {
            if let Some(message) = value.as_ref().and_then(duration_problem) {
                fail(rule, message);
            }
        }
    }

    if errors.is_empty() {
        Ok(())
    } else {
        Err(ValidationErrors(errors))
    }
}

fn duration_problem(d: &GoDuration) -> Option<String> {
    match d.parse() {
        Err(e) => Some(format!("must be a duration like 0s, 30m or 1h30m: {e}")),
        Ok(p) if p.is_negative() => Some(format!("must not be negative (got {:?})", d.0)),
        Ok(_) => None,
    }
}
