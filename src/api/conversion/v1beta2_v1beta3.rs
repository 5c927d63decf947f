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
//! (`machineTemplate.spec.readinessGates`, `machineNaming`) its `v1beta3`
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
    ],
};

/// In a ClusterClass the machine infrastructure comes from the class; a
/// v1beta2 template may still name one, which v1beta3 has no field for.
const TEMPLATE_SHAPE: Shape = Shape {
    spec: &["spec", "template", "spec"],
    fields: &[SHARED_FIELDS],
    v1beta2_only: &[&["machineTemplate", "infrastructureRef"]],
    v1beta3_only: &[&["machineNaming"]],
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

/// v1beta2 -> v1beta3.
pub fn up(object: &Value) -> Result<Value, ConversionError> {
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
                put(&mut v3, v3_path, reference);
                put(&mut kept, v2_path, value);
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
