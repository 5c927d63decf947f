//! When a Machine's certificates expire, and which value counts. Pure.
//!
//! As CAPI does for `Machine.status.certificatesExpiryDate`: a value set by
//! hand on the Machine (annotation `machine.cluster.x-k8s.io/certificates-expiry`)
//! wins; then the status CAPI's Machine controller copied from the bootstrap
//! config's annotation (which we write, unless someone else did); then what our
//! own handshakes with the Machine's etcd member saw. A missing value is
//! unknown, never "expired".

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::api::Machine;
use crate::api::names::CERTIFICATES_EXPIRY_ANNOTATION;

/// Where an expiry came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ExpirySource {
    /// The Machine's own annotation, set by hand.
    MachineAnnotation,
    /// `Machine.status.certificatesExpiryDate` (CAPI copies it from the
    /// bootstrap config's annotation).
    MachineStatus,
    /// The etcd serving certificate our handshake with its member verified.
    EtcdServingCertificate,
    /// The k3s serving certificate on the server's supervisor port, as our
    /// daily probe verified it.
    K3sServingCertificate,
}

impl ExpirySource {
    /// The `certificate` label of the expiry metric.
    pub fn certificate_label(self) -> &'static str {
        match self {
            ExpirySource::MachineAnnotation | ExpirySource::MachineStatus => "machine",
            ExpirySource::EtcdServingCertificate => "etcd-serving",
            ExpirySource::K3sServingCertificate => "k3s-serving",
        }
    }
}

/// One Machine's certificates expiry and where it came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Expiry {
    pub at: DateTime<Utc>,
    pub source: ExpirySource,
}

fn parse(text: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// The value `Machine.status.certificatesExpiryDate` has, if any.
pub fn status_expiry(machine: &Machine) -> Option<DateTime<Utc>> {
    machine
        .status
        .as_ref()?
        .extra
        .get("certificatesExpiryDate")?
        .as_str()
        .and_then(parse)
}

/// The hand-set annotation on the Machine, if any.
pub fn annotated_expiry(machine: &Machine) -> Option<DateTime<Utc>> {
    machine
        .metadata
        .annotations
        .as_ref()?
        .get(CERTIFICATES_EXPIRY_ANNOTATION)
        .and_then(|t| parse(t))
}

/// The expiry that counts for `machine`, `observed` being the earliest our
/// handshakes saw (etcd member, k3s serving port).
pub fn expiry(machine: &Machine, observed: Option<Expiry>) -> Option<Expiry> {
    let found = |at, source| Some(Expiry { at, source });
    if let Some(at) = annotated_expiry(machine) {
        return found(at, ExpirySource::MachineAnnotation);
    }
    if let Some(at) = status_expiry(machine) {
        return found(at, ExpirySource::MachineStatus);
    }
    observed
}

/// The earlier of what our handshakes saw of one Machine: its etcd member's
/// serving certificate and its k3s serving certificate.
pub fn earliest_observed(
    etcd_serving: Option<DateTime<Utc>>,
    k3s_serving: Option<DateTime<Utc>>,
) -> Option<Expiry> {
    let etcd = etcd_serving.map(|at| Expiry {
        at,
        source: ExpirySource::EtcdServingCertificate,
    });
    let k3s = k3s_serving.map(|at| Expiry {
        at,
        source: ExpirySource::K3sServingCertificate,
    });
    match (etcd, k3s) {
        (Some(e), Some(k)) => Some(if k.at < e.at { k } else { e }),
        (e, k) => e.or(k),
    }
}

/// Whether the bootstrap config of `machine` should get our observed value as
/// its expiry annotation: only while neither the Machine nor (through the
/// status CAPI copies from it) the config carries one already, as
/// KubeadmControlPlane does. A value someone set is never overwritten.
pub fn annotation_to_write(machine: &Machine, observed: Option<DateTime<Utc>>) -> Option<String> {
    if annotated_expiry(machine).is_some() || status_expiry(machine).is_some() {
        return None;
    }
    observed.map(|at| at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
}

/// Every Machine's expiry by name (`observed` by Machine name).
pub fn expiries(
    machines: &[Machine],
    observed: &BTreeMap<String, Expiry>,
) -> BTreeMap<String, Expiry> {
    machines
        .iter()
        .filter_map(|m| {
            let name = m.metadata.name.clone().unwrap_or_default();
            let found = expiry(m, observed.get(&name).copied())?;
            Some((name, found))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn machine(annotation: Option<&str>, status: Option<&str>) -> Machine {
        let mut value = json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": "m", "namespace": "ns"},
            "spec": {"clusterName": "c"},
        });
        if let Some(a) = annotation {
            value["metadata"]["annotations"] = json!({CERTIFICATES_EXPIRY_ANNOTATION: a});
        }
        if let Some(s) = status {
            value["status"] = json!({"certificatesExpiryDate": s});
        }
        serde_json::from_value(value).unwrap()
    }

    fn at(text: &str) -> DateTime<Utc> {
        parse(text).unwrap()
    }

    #[test]
    fn which_expiry_counts() {
        let observed = earliest_observed(Some(at("2027-03-01T00:00:00Z")), None);
        let cases = [
            (
                "a_hand_set_machine_annotation_wins",
                machine(Some("2026-12-24T00:00:00Z"), Some("2027-01-01T00:00:00Z")),
                Some(("2026-12-24T00:00:00Z", ExpirySource::MachineAnnotation)),
                None,
            ),
            (
                "the_status_capi_copied_from_the_config_comes_next",
                machine(None, Some("2027-01-01T00:00:00Z")),
                Some(("2027-01-01T00:00:00Z", ExpirySource::MachineStatus)),
                None,
            ),
            (
                "what_our_handshake_saw_when_nothing_is_set",
                machine(None, None),
                Some(("2027-03-01T00:00:00Z", ExpirySource::EtcdServingCertificate)),
                Some("2027-03-01T00:00:00Z"),
            ),
            (
                "an_unparsable_annotation_is_not_a_value",
                machine(Some("next year"), None),
                Some(("2027-03-01T00:00:00Z", ExpirySource::EtcdServingCertificate)),
                Some("2027-03-01T00:00:00Z"),
            ),
        ];
        for (name, m, want, write) in cases {
            let got = expiry(&m, observed).map(|e| (e.at, e.source));
            assert_eq!(got, want.map(|(t, s)| (at(t), s)), "{name}");
            assert_eq!(
                annotation_to_write(&m, observed.map(|e| e.at)).as_deref(),
                write,
                "{name}: annotation to write"
            );
        }
        assert_eq!(
            expiry(&machine(None, None), None),
            None,
            "unknown stays unknown"
        );
        assert_eq!(annotation_to_write(&machine(None, None), None), None);
    }

    #[test]
    fn the_earlier_of_the_etcd_and_k3s_serving_certificates_counts() {
        let etcd = at("2027-03-01T00:00:00Z");
        let k3s = at("2027-02-01T00:00:00Z");
        let cases = [
            (
                "k3s_serving_expires_first",
                Some(etcd),
                Some(k3s),
                Some((k3s, ExpirySource::K3sServingCertificate)),
            ),
            (
                "etcd_serving_expires_first",
                Some(k3s),
                Some(etcd),
                Some((k3s, ExpirySource::EtcdServingCertificate)),
            ),
            (
                "only_the_k3s_probe_answered",
                None,
                Some(k3s),
                Some((k3s, ExpirySource::K3sServingCertificate)),
            ),
            (
                "only_the_etcd_handshake",
                Some(etcd),
                None,
                Some((etcd, ExpirySource::EtcdServingCertificate)),
            ),
            ("neither", None, None, None),
        ];
        for (name, etcd, k3s, want) in cases {
            let got = earliest_observed(etcd, k3s).map(|e| (e.at, e.source));
            assert_eq!(got, want, "{name}");
        }
        let hand_set = machine(Some("2026-12-24T00:00:00Z"), None);
        assert_eq!(
            expiry(&hand_set, earliest_observed(None, Some(k3s))).map(|e| e.source),
            Some(ExpirySource::MachineAnnotation),
            "a value set by hand still wins over a probe"
        );
    }
}
