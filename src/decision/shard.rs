//! Watch-filter sharding: is this control plane ours? Pure.
//!
//! A process started with `run --watch-filter V` reconciles exactly the
//! KThreesControlPlanes labelled `cluster.x-k8s.io/watch-filter=V`. The
//! control plane's own label is the source of truth (it is what the primary
//! watch selects on, as CAPI's `ResourceHasFilterLabel` predicate reads the
//! reconciled object's label); the Cluster's label only decides whether the
//! Cluster is served from this process's watch cache (a Cluster without it is
//! read from the API server instead). A process without a filter owns every
//! control plane, labelled or not: it must not run beside shards.
//!
//! The watch drops a control plane from a shard's cache once it is
//! relabelled, but a reconcile may already be under way on the object as it
//! was. So every pass about to act (a write that can touch etcd or delete a
//! Machine) asks this again on a read of the control plane taken then, and
//! refuses with [`NOT_OURS_RULE`] when the answer changed.

use std::collections::BTreeMap;

use crate::api::names::WATCH_FILTER_LABEL;

/// The rule named when a pass refuses to act on a control plane that left
/// this shard (logs, the refusal metric).
pub const NOT_OURS_RULE: &str = "shard.not-ours";

/// Whether this process may act on a control plane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// No filter: every control plane is ours.
    Unsharded,
    /// The label carries this shard's value.
    Ours,
    /// Another shard's (or nobody's, when `found` is `None`).
    NotOurs {
        wanted: String,
        found: Option<String>,
    },
}

impl Ownership {
    pub fn may_act(&self) -> bool {
        !matches!(self, Ownership::NotOurs { .. })
    }

    /// Why a pass refuses: the rule and the values, for logs.
    pub fn reason(&self) -> Option<String> {
        match self {
            Ownership::NotOurs { wanted, found } => Some(format!(
                "{NOT_OURS_RULE}: label {WATCH_FILTER_LABEL} is {} but this shard reconciles {wanted:?}; \
                 left to the shard that has it",
                found
                    .as_deref()
                    .map_or("absent".to_string(), |v| format!("{v:?}"))
            )),
            _ => None,
        }
    }
}

/// Decide from the control plane's labels and the process's `--watch-filter`.
pub fn ownership(labels: &BTreeMap<String, String>, watch_filter: Option<&str>) -> Ownership {
    let Some(wanted) = watch_filter else {
        return Ownership::Unsharded;
    };
    let found = labels.get(WATCH_FILTER_LABEL);
    if found.map(String::as_str) == Some(wanted) {
        Ownership::Ours
    } else {
        Ownership::NotOurs {
            wanted: wanted.to_string(),
            found: found.cloned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn who_may_act_on_a_control_plane() {
        let not_ours = |wanted: &str, found: Option<&str>| Ownership::NotOurs {
            wanted: wanted.into(),
            found: found.map(str::to_string),
        };
        type Case<'a> = (
            &'a str,
            BTreeMap<String, String>,
            Option<&'a str>,
            Ownership,
        );
        let cases: &[Case] = &[
            (
                "no filter, no label: unsharded",
                labels(&[]),
                None,
                Ownership::Unsharded,
            ),
            (
                "no filter, labelled for a shard: still unsharded (never run one beside shards)",
                labels(&[(WATCH_FILTER_LABEL, "shard-1")]),
                None,
                Ownership::Unsharded,
            ),
            (
                "the shard's own value",
                labels(&[(WATCH_FILTER_LABEL, "shard-1")]),
                Some("shard-1"),
                Ownership::Ours,
            ),
            (
                "relabelled to another shard",
                labels(&[(WATCH_FILTER_LABEL, "shard-2")]),
                Some("shard-1"),
                not_ours("shard-1", Some("shard-2")),
            ),
            (
                "label removed: nobody's",
                labels(&[("other", "shard-1")]),
                Some("shard-1"),
                not_ours("shard-1", None),
            ),
            (
                "an empty value is not the shard's",
                labels(&[(WATCH_FILTER_LABEL, "")]),
                Some("shard-1"),
                not_ours("shard-1", Some("")),
            ),
            (
                "values compare exactly (no prefix match)",
                labels(&[(WATCH_FILTER_LABEL, "shard-10")]),
                Some("shard-1"),
                not_ours("shard-1", Some("shard-10")),
            ),
        ];
        for (situation, labels, filter, want) in cases {
            let got = ownership(labels, *filter);
            assert_eq!(&got, want, "{situation}");
            assert_eq!(got.may_act(), !matches!(want, Ownership::NotOurs { .. }));
            assert_eq!(got.reason().is_some(), !got.may_act(), "{situation}");
        }
    }

    #[test]
    fn the_refusal_names_the_rule_and_both_values() {
        let reason = ownership(&labels(&[(WATCH_FILTER_LABEL, "shard-b")]), Some("shard-a"))
            .reason()
            .unwrap();
        assert!(reason.starts_with(NOT_OURS_RULE), "{reason}");
        assert!(
            reason.contains("\"shard-b\"") && reason.contains("\"shard-a\""),
            "{reason}"
        );
        let reason = ownership(&labels(&[]), Some("shard-a")).reason().unwrap();
        assert!(reason.contains("absent"), "{reason}");
    }
}
