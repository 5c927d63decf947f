//! `v1beta2` (cluster-api-k3s's shape: the CAPI v1beta1 contract) <->
//! `v1beta3` (stored: the CAPI v1beta2 contract, KCP v1beta2's names), for
//! `KThreesControlPlane` (under `spec`) and `KThreesControlPlaneTemplate`
//! (under `spec.template.spec`).
//!
//! | v1beta2 | v1beta3 |
//! |---|---|
//! | `machineTemplate.infrastructureRef` (ObjectReference) | `machineTemplate.spec.infrastructureRef` (`apiGroup`, `kind`, `name`) |
//! | `machineTemplate.nodeDrainTimeout` (Go duration) | `machineTemplate.spec.deletion.nodeDrainTimeoutSeconds` |
//! | `machineTemplate.nodeVolumeDetachTimeout` | `machineTemplate.spec.deletion.nodeVolumeDetachTimeoutSeconds` |
//! | `machineTemplate.nodeDeletionTimeout` | `machineTemplate.spec.deletion.nodeDeletionTimeoutSeconds` |
//! | `rolloutAfter`, `rolloutBefore`, `rolloutStrategy` | `rollout.after`, `rollout.before`, `rollout.strategy` |
//! | `remediationStrategy.maxRetry` | `remediation.maxRetry` |
//! | `remediationStrategy.retryPeriod`, `.minHealthyPeriod` | `remediation.retryPeriodSeconds`, `.minHealthyPeriodSeconds` |
//!
//! `replicas`, `version`, `kthreesConfigSpec`, `externalDatastore` and
//! `machineTemplate.metadata` keep their place. Durations become whole
//! seconds (as CAPI converts them: truncated); a reference keeps only its
//! group. What the v1beta2 form said beyond that (the reference's
//! `apiVersion`, `namespace`, ...; a duration not in Go's canonical form) is
//! the annotation's `v1beta2` entry; what only v1beta3 can say
//! (`machineTemplate.spec.readinessGates`, `machineNaming`, `etcdBackup`) its `v1beta3`
//! entry.

use serde_json::{Map, Value, json};

use super::durations::{canonical_duration, duration_seconds};
use super::{
    ApiVersions, ConversionError, TEMPLATE, V1BETA2, V1BETA3, as_object, data, dotted, error, get,
    put, take,
};

/// How a field's value changes between the versions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    Same,
    /// Go duration text <-> whole seconds.
    Duration,
    /// ObjectReference <-> ContractVersionedObjectReference.
    Reference,
}

type Field = (&'static [&'static str], &'static [&'static str], Form);

/// Fields of both versions' control-plane spec: (v1beta2 path, v1beta3 path).
const SHARED_FIELDS: &[Field] = &[
    (&["kthreesConfigSpec"], &["kthreesConfigSpec"], Form::Same),
    (&["externalDatastore"], &["externalDatastore"], Form::Same),
    (
        &["machineTemplate", "metadata"],
        &["machineTemplate", "metadata"],
        Form::Same,
    ),
    (
        &["machineTemplate", "nodeDrainTimeout"],
        &[
            "machineTemplate",
            "spec",
            "deletion",
            "nodeDrainTimeoutSeconds",
        ],
        Form::Duration,
    ),
    (
        &["machineTemplate", "nodeVolumeDetachTimeout"],
        &[
            "machineTemplate",
            "spec",
            "deletion",
            "nodeVolumeDetachTimeoutSeconds",
        ],
        Form::Duration,
    ),
    (
        &["machineTemplate", "nodeDeletionTimeout"],
        &[
            "machineTemplate",
            "spec",
            "deletion",
            "nodeDeletionTimeoutSeconds",
        ],
        Form::Duration,
    ),
    (&["rolloutAfter"], &["rollout", "after"], Form::Same),
    (&["rolloutBefore"], &["rollout", "before"], Form::Same),
    (&["rolloutStrategy"], &["rollout", "strategy"], Form::Same),
    (
        &["remediationStrategy", "maxRetry"],
        &["remediation", "maxRetry"],
        Form::Same,
    ),
    (
        &["remediationStrategy", "retryPeriod"],
        &["remediation", "retryPeriodSeconds"],
        Form::Duration,
    ),
    (
        &["remediationStrategy", "minHealthyPeriod"],
        &["remediation", "minHealthyPeriodSeconds"],
        Form::Duration,
    ),
];

/// Fields only a KThreesControlPlane has.
const CONTROL_PLANE_FIELDS: &[Field] = &[
    (&["replicas"], &["replicas"], Form::Same),
    (&["version"], &["version"], Form::Same),
    (
        &["machineTemplate", "infrastructureRef"],
        &["machineTemplate", "spec", "infrastructureRef"],
        Form::Reference,
    ),
];

/// Where each kind keeps its spec, what each version alone can say.
struct Shape {
    spec: &'static [&'static str],
    fields: &'static [&'static [Field]],
    v1beta2_only: &'static [&'static [&'static str]],
    v1beta3_only: &'static [&'static [&'static str]],
}

const CONTROL_PLANE: Shape = Shape {
    spec: &["spec"],
    fields: &[SHARED_FIELDS, CONTROL_PLANE_FIELDS],
    v1beta2_only: &[],
    v1beta3_only: &[
        &["machineTemplate", "spec", "readinessGates"],
        &["machineNaming"],
        &["etcdBackup"],
    ],
};

/// In a ClusterClass the machine infrastructure comes from the class; a
/// v1beta2 template may still name one, which v1beta3 has no field for.
const TEMPLATE_SHAPE: Shape = Shape {
    spec: &["spec", "template", "spec"],
    fields: &[SHARED_FIELDS],
    v1beta2_only: &[&["machineTemplate", "infrastructureRef"]],
    v1beta3_only: &[&["machineNaming"], &["etcdBackup"]],
};

fn shape(object: &Value) -> &'static Shape {
    if object["kind"] == TEMPLATE {
        &TEMPLATE_SHAPE
    } else {
        &CONTROL_PLANE
    }
}

fn fields(shape: &Shape) -> impl Iterator<Item = &'static Field> {
    shape.fields.iter().flat_map(|f| f.iter())
}

/// The spec map of `object` at `shape.spec` (empty when absent).
fn spec_of(object: &Value, shape: &Shape) -> Result<Map<String, Value>, ConversionError> {
    let mut here = object;
    let mut path = Vec::new();
    for key in shape.spec {
        path.push(*key);
        here = &here[*key];
        as_object(object, here, &path.join("."))?;
    }
    Ok(here.as_object().cloned().unwrap_or_default())
}

fn set_spec(out: &mut Value, shape: &Shape, spec: Map<String, Value>) {
    // A partial object without a spec (server-side apply converts the fields
    // one manager owns) stays without one: an empty spec would be a field.
    if spec.is_empty() && out.pointer(&format!("/{}", shape.spec.join("/"))).is_none() {
        return;
    }
    let mut here = out;
    for key in shape.spec {
        if here.get(*key).is_none_or(Value::is_null) {
            here[*key] = json!({});
        }
        here = &mut here[*key];
    }
    *here = Value::Object(spec);
}

fn first_leftover(rest: &Map<String, Value>) -> String {
    fn walk(map: &Map<String, Value>, path: &mut Vec<String>) -> Option<String> {
        let (key, value) = map.iter().next()?;
        path.push(key.clone());
        match value {
            Value::Object(inner) if !inner.is_empty() => walk(inner, path),
            _ => Some(path.join(".")),
        }
    }
    walk(rest, &mut Vec::new()).unwrap_or_default()
}

/// v1beta2 -> v1beta3. A reference is remembered as written unless it is
/// exactly what converting back would give (the contract's API version).
pub fn up(object: &Value, versions: &dyn ApiVersions) -> Result<Value, ConversionError> {
    let shape = shape(object);
    let prefix = shape.spec.join(".");
    let mut rest = spec_of(object, shape)?;
    let mut entries = data::read(object)?;
    let remembered = data::take_entry(&mut entries, "v1beta3");
    let remembered = remembered
        .get("spec")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let mut v3 = Map::new();
    let mut kept = Map::new();
    for (v2_path, v3_path, form) in fields(shape) {
        let Some(value) = take(&mut rest, v2_path) else {
            continue;
        };
        let field = dotted(&prefix, v2_path);
        match form {
            Form::Same => put(&mut v3, v3_path, value),
            Form::Duration => {
                let seconds = duration_seconds(object, &field, &value)?;
                if value.as_str() != Some(canonical_duration(seconds).as_str()) {
                    put(&mut kept, v2_path, value);
                }
                put(&mut v3, v3_path, json!(seconds));
            }
            Form::Reference => {
                let reference = reference_up(object, &field, &value)?;
                if !is_contract_form(&value, &reference, versions) {
                    put(&mut kept, v2_path, value);
                }
                put(&mut v3, v3_path, reference);
            }
        }
    }
    for path in shape.v1beta2_only {
        if let Some(value) = take(&mut rest, path) {
            put(&mut kept, path, value);
        }
    }
    if !rest.is_empty() {
        return Err(error(
            object,
            &dotted(&prefix, &[first_leftover(&rest).as_str()]),
            "not a field of v1beta2",
        ));
    }
    for path in shape.v1beta3_only {
        if let Some(value) = get(&remembered, path) {
            put(&mut v3, path, value.clone());
        }
    }
    let mut out = object.clone();
    out["apiVersion"] = json!(V1BETA3);
    set_spec(&mut out, shape, v3);
    if !kept.is_empty() {
        entries.insert("v1beta2".into(), json!({ "spec": kept }));
    }
    data::write(&mut out, entries)?;
    Ok(out)
}

/// v1beta3 -> v1beta2.
pub fn down(object: &Value, versions: &dyn ApiVersions) -> Result<Value, ConversionError> {
    let shape = shape(object);
    let prefix = shape.spec.join(".");
    let mut rest = spec_of(object, shape)?;
    let mut entries = data::read(object)?;
    let kept = data::take_entry(&mut entries, "v1beta2");
    let kept = kept
        .get("spec")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let mut v2 = Map::new();
    for (v2_path, v3_path, form) in fields(shape) {
        let Some(value) = take(&mut rest, v3_path) else {
            continue;
        };
        let field = dotted(&prefix, v3_path);
        let converted = match form {
            Form::Same => value,
            Form::Duration => {
                let seconds = value.as_i64().ok_or_else(|| {
                    error(
                        object,
                        &field,
                        format!("must be whole seconds, got {value}"),
                    )
                })?;
                // The text it was written as, unless an edit changed it since.
                match get(&kept, v2_path) {
                    Some(text) if duration_seconds(object, &field, text).ok() == Some(seconds) => {
                        text.clone()
                    }
                    _ => json!(canonical_duration(seconds)),
                }
            }
            Form::Reference => {
                reference_down(object, &field, &value, get(&kept, v2_path), versions)?
            }
        };
        put(&mut v2, v2_path, converted);
    }
    for path in shape.v1beta2_only {
        if let Some(value) = get(&kept, path) {
            put(&mut v2, path, value.clone());
        }
    }
    let mut only_v3 = Map::new();
    for path in shape.v1beta3_only {
        if let Some(value) = take(&mut rest, path) {
            put(&mut only_v3, path, value);
        }
    }
    if !rest.is_empty() {
        return Err(error(
            object,
            &dotted(&prefix, &[first_leftover(&rest).as_str()]),
            "not a field of v1beta3",
        ));
    }
    let mut out = object.clone();
    out["apiVersion"] = json!(V1BETA2);
    set_spec(&mut out, shape, v2);
    if !only_v3.is_empty() {
        entries.insert("v1beta3".into(), json!({ "spec": only_v3 }));
    }
    data::write(&mut out, entries)?;
    Ok(out)
}

/// ObjectReference -> `{apiGroup, kind, name}`.
fn reference_up(object: &Value, field: &str, value: &Value) -> Result<Value, ConversionError> {
    let reference = value
        .as_object()
        .ok_or_else(|| error(object, field, format!("must be an object, got {value}")))?;
    let text = |key: &str| {
        reference
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or_default()
    };
    let api_version = text("apiVersion");
    let group = match api_version.rsplit_once('/') {
        Some((group, _)) => group,
        None => "",
    };
    let mut out = Map::new();
    for (key, value) in [
        ("apiGroup", group),
        ("kind", text("kind")),
        ("name", text("name")),
    ] {
        if !value.is_empty() {
            out.insert(key.into(), json!(value));
        }
    }
    Ok(Value::Object(out))
}

/// Whether `written` (v1beta2) is exactly what [`reference_down`] makes of
/// `reference` without a memory of it: apiVersion, kind and name only, at
/// the API version the contract labels give.
fn is_contract_form(written: &Value, reference: &Value, versions: &dyn ApiVersions) -> bool {
    let keys_ok = written.as_object().is_some_and(|m| {
        m.keys()
            .all(|k| ["apiVersion", "kind", "name"].contains(&k.as_str()))
    });
    let group = reference["apiGroup"].as_str().unwrap_or_default();
    let kind = reference["kind"].as_str().unwrap_or_default();
    keys_ok
        && !kind.is_empty()
        && versions.api_version(group, kind).as_deref() == written["apiVersion"].as_str()
}

/// `{apiGroup, kind, name}` -> ObjectReference: as it was written in v1beta2
/// when it still names the same template, else with the API version the
/// CRD's contract labels give (as CAPI converts).
fn reference_down(
    object: &Value,
    field: &str,
    value: &Value,
    written: Option<&Value>,
    versions: &dyn ApiVersions,
) -> Result<Value, ConversionError> {
    let reference = value
        .as_object()
        .ok_or_else(|| error(object, field, format!("must be an object, got {value}")))?;
    let text = |key: &str| {
        reference
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or_default()
    };
    let (group, kind, name) = (text("apiGroup"), text("kind"), text("name"));
    if let Some(written) = written
        && reference_up(object, field, written)? == *value
    {
        return Ok(written.clone());
    }
    let mut out = Map::new();
    if !kind.is_empty() {
        let api_version = versions.api_version(group, kind).ok_or_else(|| {
            error(
                object,
                field,
                format!(
                    "cannot tell the API version of {kind} in group {group:?}: its CustomResourceDefinition was not found or lists no version under a cluster.x-k8s.io contract label"
                ),
            )
        })?;
        out.insert("apiVersion".into(), json!(api_version));
        out.insert("kind".into(), json!(kind));
    }
    if !name.is_empty() {
        out.insert("name".into(), json!(name));
    }
    Ok(Value::Object(out))
}

/// The (group, kind) of a v1beta3 control plane's infrastructure reference.
pub fn infrastructure_group_kind(object: &Value) -> Option<(String, String)> {
    let reference = &object["spec"]["machineTemplate"]["spec"]["infrastructureRef"];
    let kind = reference["kind"].as_str().filter(|k| !k.is_empty())?;
    Some((
        reference["apiGroup"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        kind.to_string(),
    ))
}

#[cfg(test)]
mod tests {
    use super::super::{KnownApiVersions, convert};
    use super::*;
    use crate::api::conversion::data::CONVERSION_DATA_ANNOTATION;

    fn versions() -> KnownApiVersions {
        KnownApiVersions::from([(
            (
                "infrastructure.cluster.x-k8s.io".to_string(),
                "DockerMachineTemplate".to_string(),
            ),
            "infrastructure.cluster.x-k8s.io/v1beta2".to_string(),
        )])
    }

    fn v1beta2() -> Value {
        json!({
            "apiVersion": V1BETA2, "kind": "KThreesControlPlane",
            "metadata": {"name": "cp", "namespace": "ns"},
            "spec": {
                "replicas": 3, "version": "v1.30.2+k3s2",
                "kthreesConfigSpec": {"serverConfig": {"tlsSan": ["a"]}},
                "externalDatastore": false,
                "machineTemplate": {
                    "metadata": {"labels": {"tier": "cp"}},
                    "infrastructureRef": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "DockerMachineTemplate", "name": "t", "namespace": "ns"},
                    "nodeDrainTimeout": "5m",
                    "nodeVolumeDetachTimeout": "1m30s",
                    "nodeDeletionTimeout": "1.5s",
                },
                "rolloutAfter": "2026-06-01T00:00:00Z",
                "rolloutBefore": {"certificatesExpiryDays": 21},
                "rolloutStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0}},
                "remediationStrategy": {"maxRetry": 2, "retryPeriod": "1m", "minHealthyPeriod": "1h"},
            },
            "status": {"replicas": 3, "initialized": true},
        })
    }

    fn v1beta3() -> Value {
        json!({
            "apiVersion": V1BETA3, "kind": "KThreesControlPlane",
            "metadata": {"name": "cp", "namespace": "ns"},
            "spec": {
                "replicas": 3, "version": "v1.30.2+k3s2",
                "kthreesConfigSpec": {"serverConfig": {"tlsSan": ["a"]}},
                "machineTemplate": {
                    "metadata": {"labels": {"tier": "cp"}},
                    "spec": {
                        "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachineTemplate", "name": "t"},
                        "readinessGates": [{"conditionType": "NetworkReady"}],
                        "deletion": {"nodeDrainTimeoutSeconds": 300, "nodeDeletionTimeoutSeconds": 90},
                    },
                },
                "rollout": {"after": "2026-06-01T00:00:00Z", "strategy": {"rollingUpdate": {"maxSurge": 1}}},
                "remediation": {"maxRetry": 2, "retryPeriodSeconds": 60},
                "machineNaming": {"template": "{{ .kthreesControlPlane.name }}-{{ .random }}"},
                "etcdBackup": {"target": {"s3": {"endpoint": "s3.example.com", "bucket": "b", "credentialsSecret": {"name": "s3"}}}, "schedule": "0 */12 * * *"},
            },
        })
    }

    #[test]
    fn every_field_moves_where_the_v1beta2_contract_puts_it() {
        let stored = up(&v1beta2(), &versions()).unwrap();
        let spec = &stored["spec"];
        let cases = [
            ("/replicas", json!(3)),
            ("/version", json!("v1.30.2+k3s2")),
            ("/externalDatastore", json!(false)),
            ("/kthreesConfigSpec/serverConfig/tlsSan", json!(["a"])),
            ("/machineTemplate/metadata/labels/tier", json!("cp")),
            (
                "/machineTemplate/spec/infrastructureRef",
                json!({"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachineTemplate", "name": "t"}),
            ),
            (
                "/machineTemplate/spec/deletion/nodeDrainTimeoutSeconds",
                json!(300),
            ),
            (
                "/machineTemplate/spec/deletion/nodeVolumeDetachTimeoutSeconds",
                json!(90),
            ),
            (
                "/machineTemplate/spec/deletion/nodeDeletionTimeoutSeconds",
                json!(1),
            ),
            ("/rollout/after", json!("2026-06-01T00:00:00Z")),
            ("/rollout/before/certificatesExpiryDays", json!(21)),
            ("/rollout/strategy/rollingUpdate/maxSurge", json!(0)),
            ("/remediation/maxRetry", json!(2)),
            ("/remediation/retryPeriodSeconds", json!(60)),
            ("/remediation/minHealthyPeriodSeconds", json!(3600)),
        ];
        for (path, want) in cases {
            assert_eq!(spec.pointer(path), Some(&want), "{path}");
        }
        // It is a stored object the controller reads.
        let kcp: crate::api::KThreesControlPlane = serde_json::from_value(stored).unwrap();
        assert_eq!(
            kcp.min_healthy_period(),
            Some(std::time::Duration::from_secs(3600))
        );
        assert_eq!(kcp.max_surge(), Some(0));
    }

    #[test]
    fn a_round_trip_through_either_version_loses_nothing() {
        let from_v2 = v1beta2();
        let stored = up(&from_v2, &versions()).unwrap();
        assert_eq!(
            down(&stored, &KnownApiVersions::new()).unwrap(),
            from_v2,
            "v1beta2 -> v1beta3 -> v1beta2"
        );
        let from_v3 = v1beta3();
        let served = down(&from_v3, &versions()).unwrap();
        assert_eq!(
            up(&served, &versions()).unwrap(),
            from_v3,
            "v1beta3 -> v1beta2 -> v1beta3"
        );
        // And through v1beta1, two hops each way.
        for object in [from_v2, from_v3] {
            let oldest = convert(&object, crate::api::conversion::V1BETA1, &versions()).unwrap();
            let version = object["apiVersion"].as_str().unwrap();
            assert_eq!(
                convert(&oldest, version, &versions()).unwrap(),
                object,
                "{version} via v1beta1"
            );
        }
    }

    #[test]
    fn what_v1beta2_cannot_say_waits_in_the_annotation_by_version() {
        let served = down(&v1beta3(), &versions()).unwrap();
        let spec = &served["spec"];
        // The reference gets the version the contract labels give.
        assert_eq!(
            spec["machineTemplate"]["infrastructureRef"],
            json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "DockerMachineTemplate", "name": "t"})
        );
        assert_eq!(spec["machineTemplate"]["nodeDrainTimeout"], "5m0s");
        assert_eq!(spec["machineTemplate"]["nodeDeletionTimeout"], "1m30s");
        assert_eq!(spec["remediationStrategy"]["retryPeriod"], "1m0s");
        assert!(spec.get("machineNaming").is_none());
        assert!(spec.get("etcdBackup").is_none());
        let data: Value = serde_json::from_str(
            served["metadata"]["annotations"][CONVERSION_DATA_ANNOTATION]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            data["v1beta3"]["spec"]["machineTemplate"]["spec"]["readinessGates"],
            json!([{"conditionType": "NetworkReady"}])
        );
        assert_eq!(
            data["v1beta3"]["spec"]["machineNaming"]["template"],
            "{{ .kthreesControlPlane.name }}-{{ .random }}"
        );
        assert_eq!(
            data["v1beta3"]["spec"]["etcdBackup"]["target"]["s3"]["bucket"],
            "b"
        );
    }

    #[test]
    fn an_edit_in_the_older_version_wins_over_what_the_annotation_remembers() {
        let mut served = down(
            &up(&v1beta2(), &versions()).unwrap(),
            &KnownApiVersions::new(),
        )
        .unwrap();
        served["spec"]["machineTemplate"]["nodeDeletionTimeout"] = json!("2m");
        served["spec"]["machineTemplate"]["infrastructureRef"]["name"] = json!("t2");
        let stored = up(&served, &versions()).unwrap();
        let spec = &stored["spec"]["machineTemplate"]["spec"];
        assert_eq!(spec["deletion"]["nodeDeletionTimeoutSeconds"], 120);
        assert_eq!(spec["infrastructureRef"]["name"], "t2");
        // Read back: the edited values, the reference as last written.
        let again = down(&stored, &KnownApiVersions::new()).unwrap();
        assert_eq!(
            again["spec"]["machineTemplate"]["nodeDeletionTimeout"],
            "2m"
        );
        assert_eq!(
            again["spec"]["machineTemplate"]["infrastructureRef"]["apiVersion"],
            "infrastructure.cluster.x-k8s.io/v1beta1"
        );
        // An edit in v1beta3 of a remembered value wins too.
        let mut stored = up(&v1beta2(), &versions()).unwrap();
        stored["spec"]["machineTemplate"]["spec"]["deletion"]["nodeDeletionTimeoutSeconds"] =
            json!(7);
        let served = down(&stored, &KnownApiVersions::new()).unwrap();
        assert_eq!(
            served["spec"]["machineTemplate"]["nodeDeletionTimeout"],
            "7s"
        );
    }

    #[test]
    fn templates_convert_under_spec_template_spec() {
        let template = json!({
            "apiVersion": V1BETA2, "kind": "KThreesControlPlaneTemplate",
            "metadata": {"name": "t", "namespace": "ns"},
            "spec": {"template": {"metadata": {"labels": {"a": "b"}}, "spec": {
                "kthreesConfigSpec": {"serverConfig": {"tlsSan": ["0.0.0.0"]}},
                "machineTemplate": {"nodeDrainTimeout": "30s", "infrastructureRef": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "DockerMachineTemplate", "name": "x"}},
                "rolloutBefore": {"certificatesExpiryDays": 30},
                "externalDatastore": true,
            }}},
        });
        let stored = up(&template, &versions()).unwrap();
        let spec = &stored["spec"]["template"]["spec"];
        assert_eq!(
            spec["machineTemplate"]["spec"]["deletion"]["nodeDrainTimeoutSeconds"],
            30
        );
        assert_eq!(spec["rollout"]["before"]["certificatesExpiryDays"], 30);
        assert_eq!(spec["externalDatastore"], true);
        // A template has no infrastructure reference in v1beta3 (the
        // ClusterClass gives it): kept for v1beta2 readers only.
        assert!(
            spec["machineTemplate"]["spec"]
                .get("infrastructureRef")
                .is_none()
        );
        assert_eq!(stored["spec"]["template"]["metadata"]["labels"]["a"], "b");
        assert_eq!(down(&stored, &KnownApiVersions::new()).unwrap(), template);
        let _: crate::api::KThreesControlPlaneTemplate = serde_json::from_value(stored).unwrap();
    }

    #[test]
    fn bad_input_names_the_object_and_the_field() {
        let mut unknown_version = v1beta3();
        unknown_version["spec"]["machineTemplate"]["spec"]["infrastructureRef"]["kind"] =
            json!("AWSMachineTemplate");
        let mut negative = v1beta2();
        negative["spec"]["machineTemplate"]["nodeDrainTimeout"] = json!("-5m");
        let mut stray = v1beta2();
        stray["spec"]["machineTemplate"]["spec"] = json!({"x": 1});
        let mut not_seconds = v1beta3();
        not_seconds["spec"]["remediation"]["retryPeriodSeconds"] = json!("60");
        let cases = [
            (
                unknown_version,
                V1BETA2,
                "spec.machineTemplate.spec.infrastructureRef: cannot tell the API version of AWSMachineTemplate",
            ),
            (
                negative,
                V1BETA3,
                "spec.machineTemplate.nodeDrainTimeout: \"-5m\" is not a non-negative duration",
            ),
            (
                stray,
                V1BETA3,
                "spec.machineTemplate.spec.x: not a field of v1beta2",
            ),
            (
                not_seconds,
                V1BETA2,
                "spec.remediation.retryPeriodSeconds: must be whole seconds",
            ),
        ];
        for (object, desired, want) in cases {
            let err = convert(&object, desired, &versions())
                .unwrap_err()
                .to_string();
            assert!(err.starts_with("KThreesControlPlane ns/cp: "), "{err}");
            assert!(err.contains(want), "{want}: {err}");
        }
    }
}
