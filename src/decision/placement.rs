//! Where a new control-plane Machine goes: the failure domain with the fewest
//! live Machines, as CAPI's KubeadmControlPlane spreads them. Pure; the
//! controller puts it on the Machine it creates (`controller::create`).

use crate::api::{Cluster, Machine};

/// The failure domain of the Cluster's control-plane ones with the fewest
/// `machines` not being deleted (ties: the first by name), or none when the
/// Cluster offers none.
pub fn failure_domain(cluster: Option<&Cluster>, machines: &[Machine]) -> Option<String> {
    let domains = cluster?.control_plane_failure_domains();
    domains
        .iter()
        .min_by_key(|fd| {
            let count = machines
                .iter()
                .filter(|m| !m.is_deleting() && m.spec.failure_domain.as_deref() == Some(**fd))
                .count();
            (count, fd.to_string())
        })
        .map(|fd| fd.to_string())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A Cluster offering `domains` (name, for control planes).
    fn cluster(domains: &[(&str, bool)]) -> Cluster {
        let domains: Vec<_> = domains
            .iter()
            .map(|(name, cp)| json!({"name": name, "controlPlane": cp}))
            .collect();
        serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": "c", "namespace": "ns"},
            "spec": {},
            "status": {"failureDomains": domains},
        }))
        .unwrap()
    }

    fn machine(name: &str, domain: &str, deleting: bool) -> Machine {
        let mut value = json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"clusterName": "c", "failureDomain": domain},
        });
        if deleting {
            value["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_new_machine_goes_to_the_least_used_control_plane_failure_domain() {
        let abc = [("a", true), ("b", true), ("c", true)];
        let cases = [
            ("no_cluster", None, vec![], None),
            (
                "a_cluster_without_failure_domains",
                Some(cluster(&[])),
                vec![],
                None,
            ),
            (
                "only_worker_failure_domains",
                Some(cluster(&[("w1", false)])),
                vec![],
                None,
            ),
            (
                "no_machines_yet_takes_the_first_by_name",
                Some(cluster(&[("b", true), ("a", true)])),
                vec![],
                Some("a"),
            ),
            (
                "the_emptiest_domain",
                Some(cluster(&abc)),
                vec![
                    machine("m1", "a", false),
                    machine("m2", "b", false),
                    machine("m3", "a", false),
                ],
                Some("c"),
            ),
            (
                "a_tie_goes_to_the_first_by_name",
                Some(cluster(&abc)),
                vec![machine("m1", "a", false)],
                Some("b"),
            ),
            (
                "deleting_machines_do_not_count",
                Some(cluster(&[("a", true), ("b", true)])),
                vec![machine("m1", "a", true), machine("m2", "b", false)],
                Some("a"),
            ),
            (
                "a_worker_domain_is_never_chosen",
                Some(cluster(&[("a", true), ("w", false)])),
                vec![machine("m1", "a", false)],
                Some("a"),
            ),
        ];
        for (name, cluster, machines, domain) in cases {
            assert_eq!(
                failure_domain(cluster.as_ref(), &machines).as_deref(),
                domain,
                "{name}"
            );
        }
    }
}
