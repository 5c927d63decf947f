//! Which control-plane Machines need a rollout, and why. Pure.
//!
//! A Machine is outdated when (as CAPI's KCP `UpToDate`):
//! - its `spec.version` differs from the control plane's `spec.version`;
//! - `spec.rollout.after` has passed and the Machine was created before it;
//! - the spec it was made from (its recorded spec hash) differs from the
//!   current one;
//! - it has no spec hash (made by cluster-api-k3s before a migration) but
//!   carries cluster-api-k3s's record of the `serverConfig` it was made from
//!   (`kthrees-server-configuration`), and that differs from the current one.
//!
//! A Machine with neither record is not rolled for its spec: we cannot know
//! what it was made from, and replacing every server on adoption would be a
//! surprise.

use std::fmt;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;

/// What the current spec asks of every Machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    pub version: String,
    pub spec_hash: String,
    /// `serverConfig` as [`super::spec_hash::server_config_fingerprint`] compares it.
    pub server_config: serde_json::Value,
    pub rollout_after: Option<DateTime<Utc>>,
    /// `spec.rollout.before.certificatesExpiryDays`.
    pub certificates_expiry_days: Option<i32>,
}

/// What a Machine was made from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MadeFrom {
    pub version: Option<String>,
    /// The spec hash annotation; `None` when absent.
    pub spec_hash: Option<String>,
    /// cluster-api-k3s's `serverConfig` record, as a fingerprint; `None` when
    /// absent or not JSON (then nothing is known of it).
    pub upstream_server_config: Option<serde_json::Value>,
    pub created: DateTime<Utc>,
    /// When its certificates expire, if known (see [`super::certificates`]).
    pub certificates_expiry: Option<DateTime<Utc>>,
}

/// One reason a Machine needs a rollout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum OutdatedReason {
    Version {
        has: Option<String>,
        wants: String,
    },
    RolloutAfter {
        at: DateTime<Utc>,
    },
    Spec {
        has: String,
        wants: String,
    },
    /// A migrated Machine's recorded `serverConfig` differs from the current one.
    ServerConfig,
    /// Its certificates expire within `spec.rollout.before.certificatesExpiryDays`.
    CertificatesExpiring {
        at: DateTime<Utc>,
        days: i32,
    },
}

impl OutdatedReason {
    /// A short, stable name for conditions and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            OutdatedReason::Version { .. } => "version",
            OutdatedReason::RolloutAfter { .. } => "rollout.after",
            OutdatedReason::Spec { .. } => "spec",
            OutdatedReason::ServerConfig => "serverConfig",
            OutdatedReason::CertificatesExpiring { .. } => "certificatesExpiring",
        }
    }
}

impl fmt::Display for OutdatedReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OutdatedReason::Version { has, wants } => write!(
                f,
                "version {} -> {wants}",
                has.as_deref().unwrap_or("(none)")
            ),
            OutdatedReason::RolloutAfter { at } => write!(
                f,
                "rollout.after {} passed and the Machine is older",
                at.to_rfc3339_opts(SecondsFormat::Secs, true)
            ),
            OutdatedReason::Spec { has, wants } => write!(
                f,
                "kthreesConfigSpec or infrastructure template changed (spec hash {has} -> {wants})"
            ),
            OutdatedReason::ServerConfig => write!(
                f,
                "kthreesConfigSpec.serverConfig differs from the one cluster-api-k3s recorded \
                 on the Machine (annotation controlplane.cluster.x-k8s.io/kthrees-server-configuration)"
            ),
            OutdatedReason::CertificatesExpiring { at, days } => write!(
                f,
                "certificates expire at {}, within rollout.before.certificatesExpiryDays ({days} days)",
                at.to_rfc3339_opts(SecondsFormat::Secs, true)
            ),
        }
    }
}

/// Every reason `machine` needs a rollout at `now`; empty: up to date.
pub fn outdated_reasons(
    desired: &Desired,
    machine: &MadeFrom,
    now: DateTime<Utc>,
) -> Vec<OutdatedReason> {
    let mut reasons = Vec::new();
    if machine.version.as_deref() != Some(desired.version.as_str()) {
        reasons.push(OutdatedReason::Version {
            has: machine.version.clone(),
            wants: desired.version.clone(),
        });
    }
    if let Some(at) = desired.rollout_after
        && at <= now
        && machine.created < at
    {
        reasons.push(OutdatedReason::RolloutAfter { at });
    }
    match (&machine.spec_hash, &machine.upstream_server_config) {
        (Some(has), _) if *has != desired.spec_hash => reasons.push(OutdatedReason::Spec {
            has: has.clone(),
            wants: desired.spec_hash.clone(),
        }),
        (None, Some(has)) if *has != desired.server_config => {
            reasons.push(OutdatedReason::ServerConfig)
        }
        _ => {}
    }
    // An unknown expiry never rolls anything.
    if let (Some(days), Some(at)) = (
        desired.certificates_expiry_days,
        machine.certificates_expiry,
    ) && at <= now + chrono::Duration::days(i64::from(days))
    {
        reasons.push(OutdatedReason::CertificatesExpiring { at, days });
    }
    reasons
}

/// Reasons as one line: "version v1.30.2+k3s2 -> v1.31.0+k3s1; ...".
pub fn describe(reasons: &[OutdatedReason]) -> String {
    reasons
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn t(h: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 6, 1, h, 0, 0).unwrap()
    }

    fn desired() -> Desired {
        Desired {
            version: "v1.31.0+k3s1".into(),
            spec_hash: "aaaa".into(),
            server_config: serde_json::json!({"disableComponents": ["traefik"]}),
            rollout_after: None,
            certificates_expiry_days: None,
        }
    }

    fn made(version: &str, hash: Option<&str>, created: u32) -> MadeFrom {
        MadeFrom {
            version: Some(version.into()),
            spec_hash: hash.map(str::to_string),
            upstream_server_config: None,
            created: t(created),
            certificates_expiry: None,
        }
    }

    /// A Machine cluster-api-k3s made: no spec hash, its serverConfig record.
    fn upstream(version: &str, server_config: serde_json::Value) -> MadeFrom {
        MadeFrom {
            upstream_server_config: Some(server_config),
            ..made(version, None, 1)
        }
    }

    fn kinds(reasons: &[OutdatedReason]) -> Vec<&'static str> {
        reasons.iter().map(OutdatedReason::kind).collect()
    }

    #[test]
    fn table() {
        let with_after = |at: u32| Desired {
            rollout_after: Some(t(at)),
            ..desired()
        };
        let cases: Vec<(&str, Desired, MadeFrom, u32, Vec<&str>)> = vec![
            (
                "same_version_same_spec",
                desired(),
                made("v1.31.0+k3s1", Some("aaaa"), 1),
                10,
                vec![],
            ),
            (
                "older_version",
                desired(),
                made("v1.30.2+k3s2", Some("aaaa"), 1),
                10,
                vec!["version"],
            ),
            (
                "no_version_on_the_machine",
                desired(),
                MadeFrom {
                    version: None,
                    ..made("", Some("aaaa"), 1)
                },
                10,
                vec!["version"],
            ),
            (
                "spec_changed",
                desired(),
                made("v1.31.0+k3s1", Some("bbbb"), 1),
                10,
                vec!["spec"],
            ),
            (
                "no_spec_record_is_not_rolled_for_its_spec",
                desired(),
                made("v1.31.0+k3s1", None, 1),
                10,
                vec![],
            ),
            (
                "migrated_machine_with_the_current_server_config",
                desired(),
                upstream(
                    "v1.31.0+k3s1",
                    serde_json::json!({"disableComponents": ["traefik"]}),
                ),
                10,
                vec![],
            ),
            (
                "migrated_machine_with_another_server_config",
                desired(),
                upstream(
                    "v1.31.0+k3s1",
                    serde_json::json!({"disableComponents": ["servicelb"]}),
                ),
                10,
                vec!["serverConfig"],
            ),
            (
                "our_spec_hash_wins_over_the_upstream_record",
                desired(),
                MadeFrom {
                    spec_hash: Some("aaaa".into()),
                    ..upstream(
                        "v1.31.0+k3s1",
                        serde_json::json!({"disableComponents": ["servicelb"]}),
                    )
                },
                10,
                vec![],
            ),
            (
                "rollout_after_passed_machine_older",
                with_after(5),
                made("v1.31.0+k3s1", Some("aaaa"), 1),
                10,
                vec!["rollout.after"],
            ),
            (
                "rollout_after_passed_machine_newer",
                with_after(5),
                made("v1.31.0+k3s1", Some("aaaa"), 6),
                10,
                vec![],
            ),
            (
                "rollout_after_in_the_future",
                with_after(12),
                made("v1.31.0+k3s1", Some("aaaa"), 1),
                10,
                vec![],
            ),
            (
                "certificates_expire_within_the_days_asked",
                Desired {
                    certificates_expiry_days: Some(7),
                    ..desired()
                },
                MadeFrom {
                    certificates_expiry: Some(t(10) + chrono::Duration::days(6)),
                    ..made("v1.31.0+k3s1", Some("aaaa"), 1)
                },
                10,
                vec!["certificatesExpiring"],
            ),
            (
                "certificates_expire_after_the_days_asked",
                Desired {
                    certificates_expiry_days: Some(7),
                    ..desired()
                },
                MadeFrom {
                    certificates_expiry: Some(t(10) + chrono::Duration::days(8)),
                    ..made("v1.31.0+k3s1", Some("aaaa"), 1)
                },
                10,
                vec![],
            ),
            (
                "an_unknown_expiry_never_rolls",
                Desired {
                    certificates_expiry_days: Some(365),
                    ..desired()
                },
                made("v1.31.0+k3s1", Some("aaaa"), 1),
                10,
                vec![],
            ),
            (
                "expiring_certificates_without_the_field_do_not_roll",
                desired(),
                MadeFrom {
                    certificates_expiry: Some(t(10) + chrono::Duration::days(1)),
                    ..made("v1.31.0+k3s1", Some("aaaa"), 1)
                },
                10,
                vec![],
            ),
            (
                "everything_at_once",
                with_after(5),
                made("v1.30.2+k3s2", Some("bbbb"), 1),
                10,
                vec!["version", "rollout.after", "spec"],
            ),
        ];
        for (name, desired, machine, now, want) in cases {
            let got = outdated_reasons(&desired, &machine, t(now));
            assert_eq!(kinds(&got), want, "{name}: {}", describe(&got));
        }
    }

    #[test]
    fn reasons_read_as_a_sentence() {
        let got = outdated_reasons(
            &Desired {
                rollout_after: Some(t(5)),
                ..desired()
            },
            &made("v1.30.2+k3s2", Some("bbbb"), 1),
            t(10),
        );
        assert_eq!(
            describe(&got),
            "version v1.30.2+k3s2 -> v1.31.0+k3s1; rollout.after 2026-06-01T05:00:00Z passed and \
             the Machine is older; kthreesConfigSpec or infrastructure template changed (spec hash bbbb -> aaaa)"
        );
    }
}
