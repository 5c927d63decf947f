//! Rollouts: which control-plane Machines are outdated and why
//! ([`outdated`], with the spec each was made from recorded as a
//! [`spec_hash`]), whether the control plane is settled enough to add or
//! remove one ([`preflight`]), and the next step ([`decide`]). Pure: the
//! controller maps API objects in and carries the step out with the same
//! create and safe-removal steps as scaling and remediation.

pub mod certificates;
pub mod decide;
pub mod outdated;
pub mod preflight;
pub mod spec_hash;
pub mod version;

use chrono::{DateTime, Utc};

use crate::api::names::{SERVER_CONFIGURATION_ANNOTATION, SPEC_HASH_ANNOTATION};
use crate::api::{KThreesControlPlane, Machine};

pub use decide::{RolloutDecision, RolloutStep, decide_rollout};
pub use outdated::{Desired, MadeFrom, OutdatedReason, describe, outdated_reasons};
pub use spec_hash::{server_config_fingerprint, spec_hash};

/// What `kcp` asks of every Machine now.
pub fn desired(kcp: &KThreesControlPlane) -> Desired {
    Desired {
        version: kcp.spec.version.clone(),
        spec_hash: spec_hash(kcp),
        server_config: server_config_fingerprint(
            &serde_json::to_value(&kcp.spec.kthrees_config_spec.server_config)
                .expect("a KThreesServerConfig always serializes"),
        ),
        rollout_after: kcp.rollout_after().map(crate::api::time::to_chrono),
        certificates_expiry_days: kcp.certificates_expiry_days(),
    }
}

/// What `machine` was made from; `now` stands in for a missing creation time,
/// `observed_expiry` is what our handshake with its etcd member saw.
pub fn made_from(
    machine: &Machine,
    observed_expiry: Option<certificates::Expiry>,
    now: DateTime<Utc>,
) -> MadeFrom {
    let annotation = |key: &str| {
        machine
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
    };
    MadeFrom {
        version: machine.spec.version.clone(),
        spec_hash: annotation(SPEC_HASH_ANNOTATION).cloned(),
        upstream_server_config: annotation(SERVER_CONFIGURATION_ANNOTATION)
            .and_then(|text| serde_json::from_str::<serde_json::Value>(text).ok())
            .filter(serde_json::Value::is_object)
            .map(|v| server_config_fingerprint(&v)),
        created: machine
            .metadata
            .creation_timestamp
            .as_ref()
            .map(crate::api::time::to_chrono)
            .unwrap_or(now),
        certificates_expiry: certificates::expiry(machine, observed_expiry).map(|e| e.at),
    }
}

/// Why each of `machines` needs a rollout under `desired` at `now`, by
/// Machine name (an empty list: up to date). Computed once per decision.
pub type OutdatedMachines = std::collections::BTreeMap<String, Vec<OutdatedReason>>;

/// [`reasons_for`] of every Machine, by name.
/// `observed_expiry` holds what our handshakes saw of each Machine's etcd
/// serving certificate, by Machine name.
pub fn outdated_machines(
    desired: &Desired,
    machines: &[Machine],
    observed_expiry: &std::collections::BTreeMap<String, certificates::Expiry>,
    now: DateTime<Utc>,
) -> OutdatedMachines {
    machines
        .iter()
        .map(|m| {
            let name = m.metadata.name.clone().unwrap_or_default();
            let observed = observed_expiry.get(&name).copied();
            let reasons = outdated_reasons(desired, &made_from(m, observed, now), now);
            (name, reasons)
        })
        .collect()
}

/// Why `machine` needs a rollout under `desired` at `now` (empty: up to
/// date). The one place the controller, status and `inspect` ask.
pub fn reasons_for(
    desired: &Desired,
    machine: &Machine,
    now: DateTime<Utc>,
) -> Vec<OutdatedReason> {
    outdated_reasons(desired, &made_from(machine, None, now), now)
}
