//! `KThreesControlPlane` `v1beta1` <-> `v1beta2`, as cluster-api-k3s converts
//! them (`controlplane/api/v1beta1/conversion.go`):
//!
//! | v1beta1 | v1beta2 |
//! |---|---|
//! | `spec.infrastructureTemplate` | `spec.machineTemplate.infrastructureRef` |
//! | `spec.upgradeAfter` | `spec.rolloutAfter` |
//! | `spec.nodeDrainTimeout` | `spec.machineTemplate.nodeDrainTimeout` |
//!
//! Every other v1beta1 spec field has the same name and meaning in v1beta2.
//! What v1beta1 cannot hold (`rolloutStrategy`, `rolloutBefore`,
//! `externalDatastore`, `machineTemplate.nodeVolumeDetachTimeout`, ...) and the
//! v1beta2 conditions are the annotation's `v1beta2` entry. `kthreesConfigSpec`
//! passes through unchanged (its schema keeps unknown fields in both versions).

use serde_json::{Map, Value, json};

use super::{ConversionError, V1BETA1, V1BETA2, as_object, data, error, put, take};

/// The v1beta1 spec fields and where each lives in v1beta2.
const MOVED: [(&str, &[&str]); 3] = [
    (
        "infrastructureTemplate",
        &["machineTemplate", "infrastructureRef"],
    ),
    ("upgradeAfter", &["rolloutAfter"]),
    ("nodeDrainTimeout", &["machineTemplate", "nodeDrainTimeout"]),
];

/// v1beta1 spec fields with the same name and meaning in v1beta2.
const SAME: [&str; 4] = [
    "replicas",
    "version",
    "kthreesConfigSpec",
    "remediationStrategy",
];

/// v1beta2 -> v1beta1.
pub fn down(object: &Value) -> Result<Value, ConversionError> {
    let mut out = object.clone();
    out["apiVersion"] = json!(V1BETA1);
    let spec = as_object(object, &object["spec"], "spec")?
        .cloned()
        .unwrap_or_default();
    let mut rest = spec.clone();
    let mut v1 = Map::new();
    for key in SAME {
        if let Some(value) = rest.remove(key) {
            v1.insert(key.into(), value);
        }
    }
    for (v1_key, v2_path) in MOVED {
        if let Some(value) = take(&mut rest, v2_path) {
            v1.insert(v1_key.into(), value);
        }
    }
    // The machine template's metadata exists in both.
    if let Some(metadata) = take(&mut rest, &["machineTemplate", "metadata"]) {
        put(&mut v1, &["machineTemplate", "metadata"], metadata);
    }
    if rest
        .get("machineTemplate")
        .and_then(Value::as_object)
        .is_some_and(Map::is_empty)
    {
        rest.remove("machineTemplate");
    }
    if !v1.is_empty() || object.get("spec").is_some() {
        out["spec"] = Value::Object(v1);
    }
    // What v1beta1 cannot say, and the v1beta2 conditions, ride along
    // beside what the object already carries for other versions.
    let mut entries = data::read(object)?;
    let mut entry = Map::new();
    if !rest.is_empty() {
        entry.insert("spec".into(), Value::Object(rest));
    }
    if let Some(status) = as_object(object, &object["status"], "status")? {
        if let Some(conditions) = status.get("conditions") {
            entry.insert("conditions".into(), conditions.clone());
        }
        out["status"] = Value::Object(status_to_v1beta1(status));
    }
    entries.insert("v1beta2".into(), Value::Object(entry));
    data::write(&mut out, entries)?;
    Ok(out)
}

/// v1beta1 -> v1beta2.
pub fn up(object: &Value) -> Result<Value, ConversionError> {
    let mut out = object.clone();
    out["apiVersion"] = json!(V1BETA2);
    let spec = as_object(object, &object["spec"], "spec")?
        .cloned()
        .unwrap_or_default();
    // What an earlier read as v1beta1 kept of the v1beta2 object.
    let mut entries = data::read(object)?;
    let data = data::take_entry(&mut entries, "v1beta2");
    let mut v2 = match data.get("spec") {
        Some(Value::Object(rest)) => rest.clone(),
        _ => Map::new(),
    };
    for (key, value) in &spec {
        if SAME.contains(&key.as_str()) {
            v2.insert(key.clone(), value.clone());
        } else if let Some((_, path)) = MOVED.iter().find(|(k, _)| k == key) {
            put(&mut v2, path, value.clone());
        } else if key == "machineTemplate" {
            if let Some(metadata) = value.get("metadata") {
                put(&mut v2, &["machineTemplate", "metadata"], metadata.clone());
            }
        } else {
            return Err(error(
                object,
                &format!("spec.{key}"),
                "not a field of v1beta1 KThreesControlPlane",
            ));
        }
    }
    if !v2.is_empty() || object.get("spec").is_some() {
        out["spec"] = Value::Object(v2);
    }
    if let Some(status) = as_object(object, &object["status"], "status")? {
        out["status"] = Value::Object(status_to_v1beta2(status, data.get("conditions")));
    }
    data::write(&mut out, entries)?;
    Ok(out)
}

/// v1beta1's status: its conditions are CAPI v1beta1 conditions, which v1beta2
/// keeps under `deprecated.v1beta1`; the rest is the same.
fn status_to_v1beta1(status: &Map<String, Value>) -> Map<String, Value> {
    let mut out = status.clone();
    out.remove("conditions");
    if let Some(deprecated) = out.remove("deprecated")
        && let Some(v1) = deprecated.get("v1beta1")
        && let Some(conditions) = v1.get("conditions")
    {
        out.insert("conditions".into(), conditions.clone());
    }
    out
}

fn status_to_v1beta2(
    status: &Map<String, Value>,
    conditions: Option<&Value>,
) -> Map<String, Value> {
    let mut out = status.clone();
    if let Some(v1) = out.remove("conditions") {
        put(&mut out, &["deprecated", "v1beta1", "conditions"], v1);
    }
    if let Some(conditions) = conditions {
        out.insert("conditions".into(), conditions.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v1beta2() -> Value {
        json!({
            "apiVersion": V1BETA2, "kind": "KThreesControlPlane",
            "metadata": {"name": "cp", "namespace": "ns", "labels": {"a": "b"}},
            "spec": {
                "replicas": 3,
                "version": "v1.30.2+k3s2",
                "kthreesConfigSpec": {"serverConfig": {"disableCloudController": true, "cloudProviderName": "external"}},
                "rolloutAfter": "2026-06-01T00:00:00Z",
                "rolloutBefore": {"certificatesExpiryDays": 21},
                "rolloutStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0}},
                "externalDatastore": false,
                "machineTemplate": {
                    "metadata": {"labels": {"tier": "cp"}},
                    "infrastructureRef": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "DockerMachineTemplate", "name": "t"},
                    "nodeDrainTimeout": "5m",
                    "nodeVolumeDetachTimeout": "1m",
                    "nodeDeletionTimeout": "10s",
                },
                "remediationStrategy": {"maxRetry": 2, "retryPeriod": "1m", "minHealthyPeriod": "1h"},
            },
            "status": {
                "replicas": 3, "initialized": true, "ready": true,
                "conditions": [{"type": "Available", "status": "True", "reason": "Available", "message": "", "lastTransitionTime": "2026-06-01T00:00:00Z"}],
                "deprecated": {"v1beta1": {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-06-01T00:00:00Z"}]}},
            },
        })
    }

    #[test]
    fn every_field_survives_a_round_trip_through_v1beta1() {
        let stored = v1beta2();
        let served = down(&stored).unwrap();
        assert_eq!(up(&served).unwrap(), stored);
    }

    #[test]
    fn the_moved_fields_are_where_cluster_api_k3s_puts_them() {
        let served = down(&v1beta2()).unwrap();
        let spec = &served["spec"];
        let cases = [
            (
                "infrastructureTemplate",
                json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "DockerMachineTemplate", "name": "t"}),
            ),
            ("upgradeAfter", json!("2026-06-01T00:00:00Z")),
            ("nodeDrainTimeout", json!("5m")),
            ("replicas", json!(3)),
            ("version", json!("v1.30.2+k3s2")),
            (
                "remediationStrategy",
                json!({"maxRetry": 2, "retryPeriod": "1m", "minHealthyPeriod": "1h"}),
            ),
        ];
        for (field, want) in cases {
            assert_eq!(spec[field], want, "spec.{field}");
        }
        assert_eq!(
            spec["machineTemplate"],
            json!({"metadata": {"labels": {"tier": "cp"}}})
        );
        for v2_only in [
            "rolloutAfter",
            "rolloutBefore",
            "rolloutStrategy",
            "externalDatastore",
        ] {
            assert!(
                spec.get(v2_only).is_none(),
                "{v2_only} is not a v1beta1 field"
            );
        }
        let data: Value = serde_json::from_str(
            served["metadata"]["annotations"][data::CONVERSION_DATA_ANNOTATION]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            data["v1beta2"]["spec"]["rolloutBefore"],
            json!({"certificatesExpiryDays": 21})
        );
        assert_eq!(
            data["v1beta2"]["spec"]["machineTemplate"]["nodeVolumeDetachTimeout"],
            json!("1m")
        );
        // v1beta1 shows CAPI v1beta1 conditions.
        assert_eq!(served["status"]["conditions"][0]["type"], "Ready");
        assert!(served["status"].get("deprecated").is_none());
    }

    #[test]
    fn an_upstream_v1beta1_object_without_conversion_data_converts() {
        let upstream = json!({
            "apiVersion": V1BETA1, "kind": "KThreesControlPlane",
            "metadata": {"name": "cp", "namespace": "ns"},
            "spec": {
                "replicas": 1, "version": "v1.29.4+k3s1",
                "infrastructureTemplate": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "DockerMachineTemplate", "name": "t"},
                "upgradeAfter": "2026-01-01T00:00:00Z",
                "nodeDrainTimeout": "2m",
                "kthreesConfigSpec": {"agentConfig": {"nodeName": "x"}},
            },
        });
        let stored = up(&upstream).unwrap();
        assert_eq!(stored["apiVersion"], V1BETA2);
        assert_eq!(
            stored["spec"]["machineTemplate"]["infrastructureRef"]["name"],
            "t"
        );
        assert_eq!(stored["spec"]["machineTemplate"]["nodeDrainTimeout"], "2m");
        assert_eq!(stored["spec"]["rolloutAfter"], "2026-01-01T00:00:00Z");
        assert_eq!(
            stored["spec"]["kthreesConfigSpec"]["agentConfig"]["nodeName"],
            "x"
        );
        assert!(stored["metadata"].get("annotations").is_none());
        // And back, unchanged.
        assert_eq!(down(&stored).unwrap(), upstream);
        // It deserializes as our type.
        let kcp: crate::api::v1beta2::KThreesControlPlane = serde_json::from_value(stored).unwrap();
        assert_eq!(kcp.spec.version, "v1.29.4+k3s1");
    }

    #[test]
    fn an_edit_made_in_v1beta1_wins_over_the_stored_data() {
        let mut served = down(&v1beta2()).unwrap();
        served["spec"]["nodeDrainTimeout"] = json!("9m");
        served["spec"]["replicas"] = json!(5);
        let stored = up(&served).unwrap();
        assert_eq!(stored["spec"]["machineTemplate"]["nodeDrainTimeout"], "9m");
        assert_eq!(stored["spec"]["replicas"], 5);
        assert_eq!(
            stored["spec"]["rolloutBefore"]["certificatesExpiryDays"],
            21
        );
    }

    #[test]
    fn bad_input_names_the_object_and_the_field() {
        let cases = [
            (
                json!({"apiVersion": V1BETA1, "metadata": {"name": "cp", "namespace": "ns"}, "spec": {"version": "v1", "rolloutStrategy": {}}}),
                V1BETA2,
                "spec.rolloutStrategy",
            ),
            (
                json!({"apiVersion": V1BETA1, "metadata": {"name": "cp", "namespace": "ns", "annotations": {data::CONVERSION_DATA_ANNOTATION: "[1]"}}, "spec": {}}),
                V1BETA2,
                "conversion-data",
            ),
            (
                json!({"apiVersion": V1BETA1, "metadata": {"name": "cp", "namespace": "ns"}, "spec": "x"}),
                V1BETA2,
                "spec: must be an object",
            ),
            (
                json!({"apiVersion": "v9", "metadata": {"name": "cp", "namespace": "ns"}}),
                V1BETA2,
                "apiVersion",
            ),
        ];
        for (object, desired, want) in cases {
            let err =
                super::super::convert(&object, desired, &super::super::KnownApiVersions::new())
                    .unwrap_err()
                    .to_string();
            assert!(err.starts_with("KThreesControlPlane ns/cp: "), "{err}");
            assert!(err.contains(want), "{want}: {err}");
        }
    }
}
