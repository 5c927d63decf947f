//! `controlplane.cluster.x-k8s.io/v1beta1` KThreesControlPlane, as
//! cluster-api-k3s serves it, and its conversion to and from our stored
//! `v1beta2`. Pure, on JSON objects (the webhook's `ConversionReview` carries
//! them as JSON).
//!
//! The fields that moved (cluster-api-k3s's own conversion,
//! `controlplane/api/v1beta1/conversion.go`):
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
//! v1beta2 conditions travel in the annotation [`CONVERSION_DATA_ANNOTATION`],
//! as CAPI providers keep them, so an object read as v1beta1 and written back
//! loses nothing. `kthreesConfigSpec` passes through unchanged (its schema keeps
//! unknown fields in both versions).

use serde_json::{Map, Value, json};

/// Where a v1beta1 object keeps what only v1beta2 can say (CAPI's key).
pub const CONVERSION_DATA_ANNOTATION: &str = "cluster.x-k8s.io/conversion-data";

pub const V1BETA1: &str = "controlplane.cluster.x-k8s.io/v1beta1";
pub const V1BETA2: &str = "controlplane.cluster.x-k8s.io/v1beta2";

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

/// Why an object cannot be converted: names the object and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{object}: {field}: {reason}")]
pub struct ConversionError {
    pub object: String,
    pub field: String,
    pub reason: String,
}

fn object_name(object: &Value) -> String {
    let meta = &object["metadata"];
    format!(
        "KThreesControlPlane {}/{}",
        meta["namespace"].as_str().unwrap_or_default(),
        meta["name"].as_str().unwrap_or_default()
    )
}

fn error(object: &Value, field: &str, reason: impl Into<String>) -> ConversionError {
    ConversionError {
        object: object_name(object),
        field: field.into(),
        reason: reason.into(),
    }
}

fn as_object<'a>(
    object: &'a Value,
    value: &'a Value,
    field: &str,
) -> Result<Option<&'a Map<String, Value>>, ConversionError> {
    match value {
        Value::Null => Ok(None),
        Value::Object(map) => Ok(Some(map)),
        other => Err(error(
            object,
            field,
            format!("must be an object, got {other}"),
        )),
    }
}

fn put(map: &mut Map<String, Value>, path: &[&str], value: Value) {
    let (last, parents) = path.split_last().expect("a path has a field");
    let mut here = map;
    for key in parents {
        here = here
            .entry(key.to_string())
            .or_insert_with(|| Value::Object(Map::new()))
            .as_object_mut()
            .expect("a parent on a conversion path is an object");
    }
    here.insert(last.to_string(), value);
}

fn take(map: &mut Map<String, Value>, path: &[&str]) -> Option<Value> {
    let (last, parents) = path.split_last()?;
    let mut here = map;
    for key in parents {
        here = here.get_mut(*key)?.as_object_mut()?;
    }
    here.remove(*last)
}

/// Convert `object` to `desired` (`.../v1beta1` or `.../v1beta2`); an object
/// already in that version is returned as it is.
pub fn convert(object: &Value, desired: &str) -> Result<Value, ConversionError> {
    let from = object["apiVersion"].as_str().unwrap_or_default();
    match (from, desired) {
        (f, d) if f == d => Ok(object.clone()),
        (V1BETA1, V1BETA2) => to_v1beta2(object),
        (V1BETA2, V1BETA1) => to_v1beta1(object),
        (f, d) => Err(error(
            object,
            "apiVersion",
            format!("cannot convert from {f:?} to {d:?} (only {V1BETA1} and {V1BETA2})"),
        )),
    }
}

/// v1beta2 (stored) -> v1beta1 (served).
pub fn to_v1beta1(object: &Value) -> Result<Value, ConversionError> {
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
    out["spec"] = Value::Object(v1);
    // What v1beta1 cannot say, and the v1beta2 conditions, ride along.
    let mut data = Map::new();
    if !rest.is_empty() {
        data.insert("spec".into(), Value::Object(rest));
    }
    if let Some(status) = as_object(object, &object["status"], "status")? {
        if let Some(conditions) = status.get("conditions") {
            data.insert("conditions".into(), conditions.clone());
        }
        out["status"] = Value::Object(status_to_v1beta1(status));
    }
    let annotations = out["metadata"]
        .as_object_mut()
        .ok_or_else(|| error(object, "metadata", "must be an object"))?
        .entry("annotations")
        .or_insert_with(|| Value::Object(Map::new()));
    let annotations = annotations
        .as_object_mut()
        .ok_or_else(|| error(object, "metadata.annotations", "must be an object"))?;
    if data.is_empty() {
        annotations.remove(CONVERSION_DATA_ANNOTATION);
    } else {
        annotations.insert(
            CONVERSION_DATA_ANNOTATION.into(),
            Value::String(Value::Object(data).to_string()),
        );
    }
    if annotations.is_empty() {
        out["metadata"]
            .as_object_mut()
            .expect("checked above")
            .remove("annotations");
    }
    Ok(out)
}

/// v1beta1 (served) -> v1beta2 (stored).
pub fn to_v1beta2(object: &Value) -> Result<Value, ConversionError> {
    let mut out = object.clone();
    out["apiVersion"] = json!(V1BETA2);
    let spec = as_object(object, &object["spec"], "spec")?
        .cloned()
        .unwrap_or_default();
    // What an earlier read as v1beta1 stored of the v1beta2 object.
    let data: Map<String, Value> = match object["metadata"]["annotations"]
        [CONVERSION_DATA_ANNOTATION]
        .as_str()
    {
        None => Map::new(),
        Some(text) => match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(map)) => map,
            _ => {
                return Err(error(
                    object,
                    &format!("metadata.annotations[{CONVERSION_DATA_ANNOTATION}]"),
                    "not a JSON object (written by a conversion of this controller; remove it to drop the v1beta2-only fields)",
                ));
            }
        },
    };
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
    out["spec"] = Value::Object(v2);
    if let Some(status) = as_object(object, &object["status"], "status")? {
        out["status"] = Value::Object(status_to_v1beta2(status, data.get("conditions")));
    }
    if let Some(annotations) = out
        .get_mut("metadata")
        .and_then(|m| m.get_mut("annotations"))
        .and_then(Value::as_object_mut)
    {
        annotations.remove(CONVERSION_DATA_ANNOTATION);
        if annotations.is_empty() {
            out["metadata"]
                .as_object_mut()
                .expect("has annotations")
                .remove("annotations");
        }
    }
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

/// The OpenAPI schema of v1beta1, as cluster-api-k3s documents its fields.
/// Validation of the spec's content is the controller's (it validates the
/// stored v1beta2 object every reconcile, and says so in `SpecValid`).
pub fn schema() -> Value {
    let duration = json!({"type": "string", "maxLength": 64});
    let string = json!({"type": "string", "maxLength": 253});
    json!({
        "type": "object",
        "description": "KThreesControlPlane (cluster-api-k3s v1beta1), converted to and stored as v1beta2.",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": {
                "type": "object",
                "required": ["version"],
                "properties": {
                    "replicas": {"type": "integer", "format": "int32"},
                    "version": {"type": "string", "maxLength": 64},
                    "infrastructureTemplate": {
                        "type": "object",
                        "description": "v1beta2: spec.machineTemplate.infrastructureRef",
                        "properties": {
                            "apiVersion": string, "kind": string, "name": string,
                            "namespace": string, "uid": string,
                            "resourceVersion": string, "fieldPath": string,
                        },
                    },
                    "kthreesConfigSpec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "upgradeAfter": {"type": "string", "format": "date-time", "description": "v1beta2: spec.rolloutAfter"},
                    "nodeDrainTimeout": {"type": "string", "maxLength": 64, "description": "v1beta2: spec.machineTemplate.nodeDrainTimeout"},
                    "machineTemplate": {
                        "type": "object",
                        "properties": {
                            "metadata": {
                                "type": "object",
                                "properties": {
                                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                                    "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
                                },
                            },
                        },
                    },
                    "remediationStrategy": {
                        "type": "object",
                        "properties": {
                            "maxRetry": {"type": "integer", "format": "int32"},
                            "retryPeriod": duration,
                            "minHealthyPeriod": duration,
                        },
                    },
                },
            },
            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
        },
    })
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
        let served = to_v1beta1(&stored).unwrap();
        assert_eq!(to_v1beta2(&served).unwrap(), stored);
    }

    #[test]
    fn the_moved_fields_are_where_cluster_api_k3s_puts_them() {
        let served = to_v1beta1(&v1beta2()).unwrap();
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
            served["metadata"]["annotations"][CONVERSION_DATA_ANNOTATION]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            data["spec"]["rolloutBefore"],
            json!({"certificatesExpiryDays": 21})
        );
        assert_eq!(
            data["spec"]["machineTemplate"]["nodeVolumeDetachTimeout"],
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
        let stored = to_v1beta2(&upstream).unwrap();
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
        assert_eq!(to_v1beta1(&stored).unwrap(), upstream);
        // It deserializes as our type.
        let kcp: crate::api::KThreesControlPlane = serde_json::from_value(stored).unwrap();
        assert_eq!(kcp.spec.version, "v1.29.4+k3s1");
    }

    #[test]
    fn an_edit_made_in_v1beta1_wins_over_the_stored_data() {
        let mut served = to_v1beta1(&v1beta2()).unwrap();
        served["spec"]["nodeDrainTimeout"] = json!("9m");
        served["spec"]["replicas"] = json!(5);
        let stored = to_v1beta2(&served).unwrap();
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
                json!({"apiVersion": V1BETA1, "metadata": {"name": "cp", "namespace": "ns", "annotations": {CONVERSION_DATA_ANNOTATION: "[1]"}}, "spec": {}}),
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
            let err = convert(&object, desired).unwrap_err().to_string();
            assert!(err.starts_with("KThreesControlPlane ns/cp: "), "{err}");
            assert!(err.contains(want), "{want}: {err}");
        }
    }
}
