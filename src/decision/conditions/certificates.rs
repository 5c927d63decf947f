//! `CertificatesExpiring`: whether any Machine's certificates, or a cluster
//! CA, expire soon.

use std::collections::BTreeMap;

use crate::api::condition_names::{CERTIFICATES_EXPIRING, certificates_expiring};
use crate::lifecycle::CaPurpose;
use crate::rollout::certificates::Expiry;

use super::{Value, value};

/// The warning window when `rollout.before.certificatesExpiryDays` is unset.
pub const CERTIFICATES_WARNING_DAYS: i32 = 30;

/// A cluster CA is reported this long before it expires: no rollout renews
/// a CA; a person rotates it (`k3s certificate rotate-ca`), which takes
/// planning.
pub const CA_WARNING_DAYS: i64 = 365;

/// The cluster CAs that expire within [`CA_WARNING_DAYS`], as
/// "Secret at time (in N days)".
pub fn expiring_cas(
    cluster: Option<&str>,
    cas: &BTreeMap<CaPurpose, chrono::DateTime<chrono::Utc>>,
    now: chrono::DateTime<chrono::Utc>,
) -> Vec<String> {
    let limit = now + chrono::Duration::days(CA_WARNING_DAYS);
    cas.iter()
        .filter(|(_, at)| **at <= limit)
        .map(|(purpose, at)| {
            format!(
                "cluster CA {} at {} (in {} days)",
                purpose.secret_name(cluster.unwrap_or_default()),
                at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                (*at - now).num_days()
            )
        })
        .collect()
}

/// `CertificatesExpiring`: True when a Machine's certificates (by Machine
/// name) expire within `rollout_before_days` (else
/// [`CERTIFICATES_WARNING_DAYS`]), or, `CAExpiringSoon`, when only cluster
/// CAs (`cas`, from [`expiring_cas`]) do; False otherwise.
pub fn certificates_expiring(
    certificates: &BTreeMap<String, Expiry>,
    rollout_before_days: Option<i32>,
    cas: &[String],
    now: chrono::DateTime<chrono::Utc>,
) -> Value {
    let days = rollout_before_days.unwrap_or(CERTIFICATES_WARNING_DAYS);
    let limit = now + chrono::Duration::days(i64::from(days));
    let expiring: Vec<String> = certificates
        .iter()
        .filter(|(_, e)| e.at <= limit)
        .map(|(machine, e)| {
            format!(
                "{machine} at {}",
                e.at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            )
        })
        .collect();
    let ca_note = (!cas.is_empty()).then(|| {
        format!(
            "{} within {CA_WARNING_DAYS} days: no rollout renews a CA; rotate it before then (k3s certificate rotate-ca, then the new CA into the Secret)",
            cas.join(", ")
        )
    });
    if expiring.is_empty() {
        return match ca_note {
            Some(note) => value(
                CERTIFICATES_EXPIRING,
                Some(true),
                certificates_expiring::REASON_CA_EXPIRING_SOON,
                note,
            ),
            None => value(
                CERTIFICATES_EXPIRING,
                Some(false),
                certificates_expiring::REASON_NOT_EXPIRING,
                format!(
                    "no known certificate expires within {days} days ({} of them known)",
                    certificates.len()
                ),
            ),
        };
    }
    let then = if rollout_before_days.is_some() {
        "they are rolled out (rollout.before.certificatesExpiryDays)"
    } else {
        "set spec.rollout.before.certificatesExpiryDays to roll them out in time"
    };
    value(
        CERTIFICATES_EXPIRING,
        Some(true),
        certificates_expiring::REASON_EXPIRING_SOON,
        format!(
            "certificates expire within {days} days: {}; {then}{}",
            expiring.join(", "),
            ca_note.map(|n| format!("; {n}")).unwrap_or_default()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::certificates::ExpirySource;

    #[test]
    fn certificates_expiring_condition() {
        let now = chrono::DateTime::parse_from_rfc3339("2024-05-01T00:00:00Z")
            .unwrap()
            .with_timezone(&chrono::Utc);
        let in_days = |machine: &str, days: i64| {
            (
                machine.to_string(),
                Expiry {
                    at: now + chrono::Duration::days(days),
                    source: ExpirySource::MachineStatus,
                },
            )
        };
        let ca = vec!["cluster CA c-etcd at 2024-11-17T00:00:00Z (in 200 days)".to_string()];
        let cases = [
            (
                "nothing expires soon",
                vec![in_days("cp-1", 300), in_days("cp-2", 90)],
                None,
                vec![],
                Some(false),
                certificates_expiring::REASON_NOT_EXPIRING,
                "no known certificate expires within 30 days (2 of them known)",
            ),
            (
                "nothing known",
                vec![],
                None,
                vec![],
                Some(false),
                certificates_expiring::REASON_NOT_EXPIRING,
                "(0 of them known)",
            ),
            (
                "a Machine within the default window",
                vec![in_days("cp-1", 10), in_days("cp-2", 90)],
                None,
                vec![],
                Some(true),
                certificates_expiring::REASON_EXPIRING_SOON,
                "certificates expire within 30 days: cp-1 at 2024-05-11T00:00:00Z; set spec.rollout.before.certificatesExpiryDays",
            ),
            (
                "a Machine within the rollout's window, rolled out",
                vec![in_days("cp-2", 90)],
                Some(120),
                vec![],
                Some(true),
                certificates_expiring::REASON_EXPIRING_SOON,
                "within 120 days: cp-2 at 2024-07-30T00:00:00Z; they are rolled out",
            ),
            (
                "only a cluster CA",
                vec![in_days("cp-1", 300)],
                None,
                ca.clone(),
                Some(true),
                certificates_expiring::REASON_CA_EXPIRING_SOON,
                "cluster CA c-etcd at 2024-11-17T00:00:00Z (in 200 days) within 365 days: no rollout renews a CA",
            ),
            (
                "a Machine and a cluster CA",
                vec![in_days("cp-1", 10)],
                None,
                ca.clone(),
                Some(true),
                certificates_expiring::REASON_EXPIRING_SOON,
                "roll them out in time; cluster CA c-etcd",
            ),
        ];
        for (name, certificates, days, cas, status, reason, message) in cases {
            let certificates: BTreeMap<_, _> = certificates.into_iter().collect();
            let got = certificates_expiring(&certificates, days, &cas, now);
            assert_eq!(got.type_, CERTIFICATES_EXPIRING, "{name}");
            assert_eq!((got.status, got.reason), (status, reason), "{name}");
            assert!(got.message.contains(message), "{name}: {}", got.message);
        }
    }

    #[test]
    fn expiring_cas_lists_those_within_a_year() {
        let now = chrono::DateTime::parse_from_rfc3339("2024-05-01T00:00:00Z")
            .unwrap()
            .with_timezone(&chrono::Utc);
        let cas = BTreeMap::from([
            (CaPurpose::Etcd, now + chrono::Duration::days(200)),
            (CaPurpose::Server, now + chrono::Duration::days(3650)),
        ]);
        assert_eq!(
            expiring_cas(Some("c"), &cas, now),
            vec!["cluster CA c-etcd at 2024-11-17T00:00:00Z (in 200 days)".to_string()]
        );
    }
}
