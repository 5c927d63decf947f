//! Which API version of a referenced kind to use, from the CAPI contract
//! labels on its CRD (`cluster.x-k8s.io/<contract>: <v1>_<v2>...`): the newest
//! version listed under the newest contract we implement, as CAPI's
//! `internal/contract/version.go` picks it. Pure; the lookup of the CRD is
//! `controller::contract_versions`.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use super::names::{CONTRACT_LABEL_V1BETA1, CONTRACT_LABEL_V1BETA2};

/// The contracts we implement, newest first.
const CONTRACTS: [&str; 2] = [CONTRACT_LABEL_V1BETA2, CONTRACT_LABEL_V1BETA1];

/// The version to use, from a CRD's labels; `None` when no contract label
/// lists one.
pub fn version_for_contract(labels: &BTreeMap<String, String>) -> Option<String> {
    CONTRACTS.iter().find_map(|label| {
        labels
            .get(*label)
            .into_iter()
            .flat_map(|value| value.split('_'))
            .filter(|v| !v.is_empty())
            .max_by(|a, b| kube_version_order(a, b))
            .map(str::to_string)
    })
}

/// Kubernetes' order of API versions: GA above beta above alpha, then by
/// major and minor number; a name of another form ranks below them all,
/// alphabetically.
pub fn kube_version_order(a: &str, b: &str) -> Ordering {
    match (parse(a), parse(b)) {
        (Some(x), Some(y)) => x.cmp(&y),
        (Some(_), None) => Ordering::Greater,
        (None, Some(_)) => Ordering::Less,
        (None, None) => b.cmp(a),
    }
}

/// (major, stability: 2 GA / 1 beta / 0 alpha, minor).
fn parse(version: &str) -> Option<(u32, u8, u32)> {
    let rest = version.strip_prefix('v')?;
    let digits = rest.chars().take_while(char::is_ascii_digit).count();
    let major: u32 = rest[..digits].parse().ok()?;
    let rest = &rest[digits..];
    if rest.is_empty() {
        return Some((major, 2, 0));
    }
    let (stability, minor) = if let Some(m) = rest.strip_prefix("beta") {
        (1, m)
    } else if let Some(m) = rest.strip_prefix("alpha") {
        (0, m)
    } else {
        return None;
    };
    Some((major, stability, minor.parse().ok()?))
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
    fn the_newest_version_under_the_newest_contract_is_used() {
        let cases = [
            (
                "only the v1beta1 contract",
                vec![("cluster.x-k8s.io/v1beta1", "v1alpha4_v1beta1")],
                Some("v1beta1"),
            ),
            (
                "both contracts: v1beta2's versions win",
                vec![
                    ("cluster.x-k8s.io/v1beta1", "v1beta1"),
                    ("cluster.x-k8s.io/v1beta2", "v1beta2"),
                ],
                Some("v1beta2"),
            ),
            (
                "kube order, not text order",
                vec![("cluster.x-k8s.io/v1beta2", "v1beta10_v1beta2_v1")],
                Some("v1"),
            ),
            (
                "alpha below beta",
                vec![("cluster.x-k8s.io/v1beta1", "v1beta1_v1alpha9")],
                Some("v1beta1"),
            ),
            ("no contract label", vec![("app", "x")], None),
            (
                "an empty contract label falls back",
                vec![
                    ("cluster.x-k8s.io/v1beta2", ""),
                    ("cluster.x-k8s.io/v1beta1", "v1beta1"),
                ],
                Some("v1beta1"),
            ),
        ];
        for (situation, pairs, want) in cases {
            assert_eq!(
                version_for_contract(&labels(&pairs)).as_deref(),
                want,
                "{situation}"
            );
        }
    }
}
