//! The conversion-data annotation: per version (`v1beta2`, `v1beta3`), what
//! that version's form of the object said that the version it is read in
//! cannot hold. A hop down adds the entry of the version it leaves; a hop up
//! takes the entry of the version it reaches.

use serde_json::{Map, Value};

use super::{ConversionError, error};

/// Where an object keeps what another version can say (CAPI's key).
pub const CONVERSION_DATA_ANNOTATION: &str = "cluster.x-k8s.io/conversion-data";

/// The annotation's entries by version. An annotation written before entries
/// were keyed by version (`{"spec": ..., "conditions": ...}` on a v1beta1
/// object) is the v1beta2 entry.
pub fn read(object: &Value) -> Result<Map<String, Value>, ConversionError> {
    let Some(text) = object["metadata"]["annotations"][CONVERSION_DATA_ANNOTATION].as_str() else {
        return Ok(Map::new());
    };
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(map)) if map.contains_key("spec") || map.contains_key("conditions") => Ok(
            Map::from_iter([("v1beta2".to_string(), Value::Object(map))]),
        ),
        Ok(Value::Object(map)) => Ok(map),
        _ => Err(error(
            object,
            &format!("metadata.annotations[{CONVERSION_DATA_ANNOTATION}]"),
            "not a JSON object (written by a conversion of this controller; remove it to drop what only another version can say)",
        )),
    }
}

/// Take the entry of `version` (an object; anything else is dropped).
pub fn take_entry(data: &mut Map<String, Value>, version: &str) -> Map<String, Value> {
    match data.remove(version) {
        Some(Value::Object(entry)) => entry,
        _ => Map::new(),
    }
}

/// Store `data` in `object`'s annotation, or remove the annotation (and an
/// annotations map left empty) when there is nothing to keep.
pub fn write(object: &mut Value, data: Map<String, Value>) -> Result<(), ConversionError> {
    let original = object.clone();
    // The API server's server-side apply converts partial objects (the
    // fields one manager owns) that may have no metadata at all; it wants
    // metadata back.
    if object.get("metadata").is_none_or(Value::is_null) {
        object["metadata"] = Value::Object(Map::new());
    }
    let metadata = object
        .get_mut("metadata")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| error(&original, "metadata", "must be an object"))?;
    let annotations = metadata
        .entry("annotations")
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
        .ok_or_else(|| error(&original, "metadata.annotations", "must be an object"))?;
    let data: Map<String, Value> = data
        .into_iter()
        .filter(|(_, v)| !v.as_object().is_some_and(Map::is_empty))
        .collect();
    if data.is_empty() {
        annotations.remove(CONVERSION_DATA_ANNOTATION);
    } else {
        annotations.insert(
            CONVERSION_DATA_ANNOTATION.into(),
            Value::String(Value::Object(data).to_string()),
        );
    }
    if annotations.is_empty() {
        metadata.remove("annotations");
    }
    Ok(())
}
