//! The hash of what a control-plane Machine is made from, recorded on it at
//! creation ([`SPEC_HASH_ANNOTATION`](crate::api::names::SPEC_HASH_ANNOTATION))
//! so a later spec change is seen as "made from something else" across restarts.
//!
//! Covered: `kthreesConfigSpec` (what the bootstrap provider renders into the
//! server's cloud-init) and the infrastructure template's group, kind, name
//! and namespace (the control plane's own). Not covered, because they change in place
//! (see [`crate::controller::sync_machines`]) or are compared on their own:
//! `machineTemplate.metadata`, the node drain/volume detach/deletion timeouts,
//! `version` and `rollout.after`. The infrastructure template's API *version*
//! is left out too: serving the same template under a newer API version is
//! not a new template.

use ring::digest::{SHA256, digest};
use serde_json::Value;

use crate::api::KThreesControlPlane;
use crate::api::bootstrap::{DEFAULT_CLOUD_PROVIDER_NAME, DEFAULT_DISABLE_CLOUD_CONTROLLER};

/// Hex characters of the hash kept (64 bits: collisions between two specs of
/// one control plane are not a practical concern).
const HASH_LEN: usize = 16;

/// The spec hash of `kcp`'s current Machine spec.
pub fn spec_hash(kcp: &KThreesControlPlane) -> String {
    let namespace = kcp.metadata.namespace.clone().unwrap_or_default();
    let infra = &kcp.spec.machine_template.spec.infrastructure_ref;
    let mut config = serde_json::to_value(&kcp.spec.kthrees_config_spec)
        .expect("a KThreesConfigSpec always serializes");
    if let Some(server) = config.get_mut("serverConfig") {
        *server = server_config_fingerprint(server);
    }
    // The same input as when the reference carried a namespace (always the
    // control plane's own): Machines made before v1beta3 keep their hash.
    let input = serde_json::json!({
        "kthreesConfigSpec": config,
        "infrastructure": {
            "group": infra.api_group,
            "kind": infra.kind,
            "name": infra.name,
            "namespace": namespace,
        },
    });
    hash_value(&input)
}

/// `serverConfig` as compared across Machines: normalized (see [`normalize`]),
/// with cluster-api-k3s's defaults taken as absent. The API server fills them
/// in (our CRD defaults, upstream's webhook), so a spec stored before they
/// existed and one stored after describe the same servers and must compare
/// equal; an explicit `cloudProviderName: ""` (no cloud provider) stays
/// distinct from absent.
pub fn server_config_fingerprint(server_config: &Value) -> Value {
    let mut value = server_config.clone();
    if let Value::Object(map) = &mut value {
        if map.get("disableCloudController") == Some(&Value::Bool(DEFAULT_DISABLE_CLOUD_CONTROLLER))
        {
            map.remove("disableCloudController");
        }
        match map.get("cloudProviderName").and_then(Value::as_str) {
            Some(DEFAULT_CLOUD_PROVIDER_NAME) => {
                map.remove("cloudProviderName");
            }
            // normalize() drops empty strings: keep "no cloud provider" visible.
            Some("") => {
                map.insert("cloudProviderName".into(), Value::Bool(false));
            }
            _ => {}
        }
    }
    normalize(&value).unwrap_or(Value::Object(Default::default()))
}

/// SHA-256 of the normalized JSON, hex, shortened.
fn hash_value(value: &Value) -> String {
    // serde_json's maps are sorted by key (no `preserve_order`), so the text
    // is canonical once empty values are gone.
    let text = normalize(value).map(|v| v.to_string()).unwrap_or_default();
    let sum = digest(&SHA256, text.as_bytes());
    sum.as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>()[..HASH_LEN]
        .to_string()
}

/// Drop nulls, empty strings, lists and objects, recursively: `files: []`
/// and no `files` render the same server, so they must not differ here.
fn normalize(value: &Value) -> Option<Value> {
    match value {
        Value::Null => None,
        Value::String(s) if s.is_empty() => None,
        Value::Array(items) => {
            let items: Vec<Value> = items.iter().filter_map(normalize).collect();
            (!items.is_empty()).then_some(Value::Array(items))
        }
        Value::Object(map) => {
            let map: serde_json::Map<String, Value> = map
                .iter()
                .filter_map(|(k, v)| normalize(v).map(|v| (k.clone(), v)))
                .collect();
            (!map.is_empty()).then_some(Value::Object(map))
        }
        other => Some(other.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn kcp(spec: Value) -> KThreesControlPlane {
        let mut base = json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta3", "kind": "KThreesControlPlane",
            "metadata": {"name": "cp", "namespace": "ns"},
            "spec": {"replicas": 3, "version": "v1.30.2+k3s2",
                     "machineTemplate": {"spec": {"infrastructureRef": {
                         "apiGroup": "infrastructure.cluster.x-k8s.io",
                         "kind": "DockerMachineTemplate", "name": "t"}}},
                     "kthreesConfigSpec": {"serverConfig": {"disableComponents": ["traefik"]}}}
        });
        merge(&mut base["spec"], spec);
        serde_json::from_value(base).unwrap()
    }

    fn merge(into: &mut Value, patch: Value) {
        match (into, patch) {
            (Value::Object(a), Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(Value::Null), v);
                }
            }
            (slot, v) => *slot = v,
        }
    }

    fn base() -> String {
        spec_hash(&kcp(json!({})))
    }

    /// Machines carry the hash they were made with: the storage version of
    /// the spec may change (v1beta2 to v1beta3), the hash of the same servers
    /// must not, or every Machine would be rolled out after an upgrade. The
    /// input is still group, kind, name and namespace of the template.
    #[test]
    fn the_hash_of_the_same_servers_is_pinned() {
        assert_eq!(base(), "ec0df4de64adae46");
    }

    #[test]
    fn the_hash_is_stable_and_short() {
        assert_eq!(base(), base());
        assert_eq!(base().len(), HASH_LEN);
        assert!(base().chars().all(|c| c.is_ascii_hexdigit()));
    }

    #[test]
    fn changes_that_need_new_servers_change_the_hash() {
        for (what, change) in [
            (
                "server config",
                json!({"kthreesConfigSpec": {"serverConfig": {"disableComponents": ["traefik", "servicelb"]}}}),
            ),
            (
                "agent config",
                json!({"kthreesConfigSpec": {"agentConfig": {"nodeLabels": ["tier=cp"]}}}),
            ),
            (
                "the cloud controller kept",
                json!({"kthreesConfigSpec": {"serverConfig": {"disableCloudController": false}}}),
            ),
            (
                "no cloud provider",
                json!({"kthreesConfigSpec": {"serverConfig": {"cloudProviderName": ""}}}),
            ),
            (
                "another cloud provider",
                json!({"kthreesConfigSpec": {"serverConfig": {"cloudProviderName": "aws"}}}),
            ),
            (
                "template name",
                json!({"machineTemplate": {"spec": {"infrastructureRef": {"name": "t2"}}}}),
            ),
            (
                "template kind",
                json!({"machineTemplate": {"spec": {"infrastructureRef": {"kind": "AWSMachineTemplate"}}}}),
            ),
            (
                "template group",
                json!({"machineTemplate": {"spec": {"infrastructureRef": {"apiGroup": "infrastructure.example.com"}}}}),
            ),
        ] {
            assert_ne!(
                spec_hash(&kcp(change)),
                base(),
                "{what} must change the hash"
            );
        }
    }

    #[test]
    fn in_place_and_separately_compared_fields_leave_the_hash_alone() {
        for (what, change) in [
            ("version", json!({"version": "v1.31.0+k3s1"})),
            ("replicas", json!({"replicas": 5})),
            (
                "rollout.after",
                json!({"rollout": {"after": "2026-01-01T00:00:00Z"}}),
            ),
            (
                "template metadata",
                json!({"machineTemplate": {"metadata": {"labels": {"a": "b"}}}}),
            ),
            (
                "drain timeout",
                json!({"machineTemplate": {"spec": {"deletion": {"nodeDrainTimeoutSeconds": 600}}}}),
            ),
            (
                "empty lists and strings",
                json!({"kthreesConfigSpec": {"files": [], "preK3sCommands": [], "version": ""}}),
            ),
            (
                "maxSurge",
                json!({"rollout": {"strategy": {"rollingUpdate": {"maxSurge": 0}}}}),
            ),
            (
                "cluster-api-k3s's defaults written out (the API server defaults them)",
                json!({"kthreesConfigSpec": {"serverConfig": {"disableCloudController": true, "cloudProviderName": "external"}}}),
            ),
        ] {
            assert_eq!(
                spec_hash(&kcp(change)),
                base(),
                "{what} must not change the hash"
            );
        }
    }

    /// What cluster-api-k3s records on its Machines (Go's `json.Marshal` of
    /// the server config: defaults written out, empty fields omitted) compares
    /// equal to our spec of the same servers.
    #[test]
    fn upstream_record_of_the_same_servers_has_the_same_fingerprint() {
        let ours = kcp(json!({}));
        let recorded: Value = serde_json::from_str(
            r#"{"disableComponents":["traefik"],"disableCloudController":true,"cloudProviderName":"external"}"#,
        )
        .unwrap();
        let current = serde_json::to_value(&ours.spec.kthrees_config_spec.server_config).unwrap();
        assert_eq!(
            server_config_fingerprint(&recorded),
            server_config_fingerprint(&current)
        );
        let other: Value =
            serde_json::from_str(r#"{"disableComponents":["traefik"],"cloudProviderName":""}"#)
                .unwrap();
        assert_ne!(
            server_config_fingerprint(&other),
            server_config_fingerprint(&current)
        );
    }
}
