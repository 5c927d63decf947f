//! Conversion between the served versions of a resource, as kube-apiserver does
//! for a CRD: every object is stored once, in the storage version; a request in
//! another version has its object converted to the storage version on the way in
//! and from it on the way out. With strategy `None` only `apiVersion` changes;
//! with `Webhook` the converter registered for the resource's API group stands in
//! for the conversion webhook, and its answer is checked as the real server
//! checks a `ConversionReview` response
//! (apiextensions-apiserver, `pkg/apiserver/conversion/webhook_converter.go`).

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::error::ApiError;
use super::resource::{ConversionStrategy, ResourceDef};

/// Converts `object` (a whole object, its `apiVersion` set) to `desired`
/// (`group/version`), as a conversion webhook converts one object of a
/// `ConversionReview`. `Err` carries the message a webhook would put in its
/// `Failure` result.
pub type Converter = Arc<dyn Fn(&Value, &str) -> Result<Value, String> + Send + Sync>;

/// The converters registered on one server, one per API group: one converter
/// serves every Webhook-strategy resource of its group, as one webhook Service
/// usually serves all CRDs of a group (it sees `kind` in each object).
#[derive(Clone, Default)]
pub struct Converters {
    by_group: HashMap<String, Converter>,
}

impl std::fmt::Debug for Converters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut groups: Vec<&String> = self.by_group.keys().collect();
        groups.sort();
        f.debug_struct("Converters")
            .field("groups", &groups)
            .finish()
    }
}

impl Converters {
    /// Convert objects of `group` with `converter` from now on (a later one replaces it).
    pub fn register(&mut self, group: &str, converter: Converter) {
        self.by_group.insert(group.to_string(), converter);
    }

    /// Whether objects stored for `def` look different in `version` beyond
    /// their `apiVersion`.
    pub fn changes_shape(&self, def: &ResourceDef, version: &str) -> bool {
        def.conversion == ConversionStrategy::Webhook && version != def.storage_version
    }

    /// `object`, in any version of `def`, as the storage version.
    pub fn to_storage(&self, def: &ResourceDef, object: Value) -> Result<Value, ApiError> {
        self.convert(def, object, &def.storage_version)
    }

    /// `object`, in any version of `def`, as `version` of `def`. An object
    /// already in that version is not sent to the converter (nor is one that is
    /// not a JSON object), as the real server sends only what needs converting.
    pub fn convert(
        &self,
        def: &ResourceDef,
        mut object: Value,
        version: &str,
    ) -> Result<Value, ApiError> {
        let desired = def.api_version(version);
        if !object.is_object() {
            return Ok(object);
        }
        let current = object
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if def.conversion == ConversionStrategy::None || current == desired {
            object["apiVersion"] = json!(desired);
            return Ok(object);
        }
        // The real messages name the object's own group/version and Kind
        // (`schema.GroupVersionKind`'s String form).
        let gvk = format!("{current}, Kind={}", def.kind);
        let converter = self.by_group.get(&def.group).ok_or_else(|| {
            ApiError::Internal(format!(
                "conversion webhook for {gvk} failed: no converter for the API group {:?} is registered with the test API server (TestApiServerBuilder::converter), as if the webhook could not be reached",
                def.group
            ))
        })?;
        let converted =
            converter(&object, &desired).map_err(|message| failed(&gvk, "failed", &message))?;
        checked(&object, converted, &desired, &gvk)
    }
}

fn failed(gvk: &str, what: &str, detail: &str) -> ApiError {
    ApiError::Internal(format!("conversion webhook for {gvk} {what}: {detail}"))
}

/// The converter's answer as the real server accepts it: the desired version
/// and the same Kind, name, namespace and uid, or an error; then every other
/// metadata field restored from the original (silently, as upstream's
/// `restoreObjectMeta`), keeping only the converter's labels and annotations.
fn checked(
    original: &Value,
    mut converted: Value,
    desired: &str,
    gvk: &str,
) -> Result<Value, ApiError> {
    let invalid = |detail: String| failed(gvk, "returned invalid object at index 0", &detail);
    let field = |obj: &Value, name: &str| {
        obj.get(name)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    if !converted.is_object() {
        return Err(invalid(format!("not a JSON object: {converted}")));
    }
    let received = field(&converted, "apiVersion");
    if received != desired {
        return Err(invalid(format!(
            "invalid groupVersion (expected {desired}, received {received})"
        )));
    }
    let (expected, received) = (field(original, "kind"), field(&converted, "kind"));
    if expected != received {
        return Err(invalid(format!(
            "invalid kind (expected {expected}, received {received})"
        )));
    }
    let meta_field = |obj: &Value, name: &str| {
        obj.pointer(&format!("/metadata/{name}"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    for (name, label) in [("name", "name"), ("namespace", "namespace"), ("uid", "UID")] {
        let (was, now) = (meta_field(original, name), meta_field(&converted, name));
        if was != now {
            return Err(failed(
                gvk,
                "returned invalid object",
                &format!("must have the same {label}: {was} != {now}"),
            ));
        }
    }
    let metadata = restored_metadata(original, &converted)
        .map_err(|detail| failed(gvk, "returned invalid metadata", &detail))?;
    converted["metadata"] = Value::Object(metadata);
    Ok(converted)
}

/// The original's metadata with the converter's labels and annotations. An
/// empty map is dropped, as the real server's round trip through `ObjectMeta`
/// (`omitempty`) drops it.
fn restored_metadata(original: &Value, converted: &Value) -> Result<Map<String, Value>, String> {
    let answered = match converted.get("metadata") {
        None => return Err("missing metadata in converted object".into()),
        Some(Value::Object(m)) => m,
        Some(other) => {
            return Err(format!(
                "invalid metadata of type {} in converted object",
                json_type(other)
            ));
        }
    };
    let mut metadata = original
        .get("metadata")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    for name in ["labels", "annotations"] {
        match answered.get(name) {
            None | Some(Value::Null) => {
                metadata.remove(name);
            }
            Some(Value::Object(map)) => {
                if let Some((key, value)) = map.iter().find(|(_, v)| !v.is_string()) {
                    return Err(format!(
                        "metadata.{name}[{key}] must be a string, but is {} in converted object",
                        json_type(value)
                    ));
                }
                if map.is_empty() {
                    metadata.remove(name);
                } else {
                    metadata.insert(name.into(), Value::Object(map.clone()));
                }
            }
            Some(other) => {
                return Err(format!(
                    "invalid metadata.{name} of type {} in converted object",
                    json_type(other)
                ));
            }
        }
    }
    Ok(metadata)
}

/// The Go type a JSON value decodes to, as the real messages print it (`%T`).
fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "<nil>",
        Value::Bool(_) => "bool",
        Value::Number(_) => "float64",
        Value::String(_) => "string",
        Value::Array(_) => "[]interface {}",
        Value::Object(_) => "map[string]interface {}",
    }
}

#[cfg(test)]
mod tests;
