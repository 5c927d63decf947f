//! Conversion between the served versions of our kinds, for the conversion
//! webhook. Pure, on JSON objects (a `ConversionReview` carries them as JSON).
//!
//! `KThreesControlPlane`: `v1beta1` <-> `v1beta2` <-> `v1beta3` (stored);
//! `KThreesControlPlaneTemplate`: `v1beta2` <-> `v1beta3` (stored). An object
//! moves one version at a time ([`v1beta1_v1beta2`], [`v1beta2_v1beta3`]).
//! What one version's form said that the other cannot hold travels in the
//! annotation [`CONVERSION_DATA_ANNOTATION`] (CAPI's key), keyed by the
//! version it belongs to ([`data`]), so an object read in any version and
//! written back loses nothing; an edit made in the version written wins over
//! what the annotation remembers.
//!
//! Going down from `v1beta3`, the infrastructure template's API version is
//! not in the object (`apiGroup` only): the form it was written in is taken
//! from the annotation, else from [`ApiVersions`], which the webhook fills
//! from the CRD's contract labels, as CAPI's own conversion does.

pub mod data;
mod durations;
pub mod v1beta1_v1beta2;
pub mod v1beta2_v1beta3;

use std::collections::BTreeMap;

use serde_json::{Map, Value};

pub use data::CONVERSION_DATA_ANNOTATION;

pub const V1BETA1: &str = "controlplane.cluster.x-k8s.io/v1beta1";
pub const V1BETA2: &str = "controlplane.cluster.x-k8s.io/v1beta2";
pub const V1BETA3: &str = "controlplane.cluster.x-k8s.io/v1beta3";

const CONTROL_PLANE: &str = "KThreesControlPlane";
const TEMPLATE: &str = "KThreesControlPlaneTemplate";

/// Why an object cannot be converted: names the object and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{object}: {field}: {reason}")]
pub struct ConversionError {
    pub object: String,
    pub field: String,
    pub reason: String,
}

/// The API version of a kind, by group and kind (the newest its CRD lists
/// for the CAPI contract we implement).
pub trait ApiVersions {
    fn api_version(&self, group: &str, kind: &str) -> Option<String>;
}

/// Known API versions by (group, kind).
pub type KnownApiVersions = BTreeMap<(String, String), String>;

impl ApiVersions for KnownApiVersions {
    fn api_version(&self, group: &str, kind: &str) -> Option<String> {
        self.get(&(group.to_string(), kind.to_string())).cloned()
    }
}

/// Where the versions of our kinds sit, oldest first.
fn rank(kind: &str, api_version: &str) -> Option<usize> {
    match (kind, api_version) {
        (CONTROL_PLANE, V1BETA1) => Some(1),
        (_, V1BETA2) => Some(2),
        (_, V1BETA3) => Some(3),
        _ => None,
    }
}

/// Convert `object` to `desired`; an object already in that version is
/// returned as it is.
pub fn convert(
    object: &Value,
    desired: &str,
    versions: &dyn ApiVersions,
) -> Result<Value, ConversionError> {
    let kind = object["kind"].as_str().unwrap_or(CONTROL_PLANE);
    let from = object["apiVersion"].as_str().unwrap_or_default();
    if from == desired {
        return Ok(object.clone());
    }
    let supported = || {
        if kind == TEMPLATE {
            format!("{V1BETA2} and {V1BETA3}")
        } else {
            format!("{V1BETA1}, {V1BETA2} and {V1BETA3}")
        }
    };
    let (Some(mut at), Some(to)) = (rank(kind, from), rank(kind, desired)) else {
        return Err(error(
            object,
            "apiVersion",
            format!(
                "cannot convert {kind} from {from:?} to {desired:?} (only {})",
                supported()
            ),
        ));
    };
    if kind != CONTROL_PLANE && kind != TEMPLATE {
        return Err(error(
            object,
            "kind",
            format!("{kind:?} is not one of ours"),
        ));
    }
    let mut current = object.clone();
    while at != to {
        current = match (at, at < to) {
            (1, true) => v1beta1_v1beta2::up(&current)?,
            (2, false) => v1beta1_v1beta2::down(&current)?,
            (2, true) => v1beta2_v1beta3::up(&current, versions)?,
            (3, false) => v1beta2_v1beta3::down(&current, versions)?,
            _ => unreachable!("ranks are 1..=3"),
        };
        at = if at < to { at + 1 } else { at - 1 };
    }
    Ok(current)
}

/// The (group, kind) of every infrastructure reference whose API version
/// converting `objects` to `desired` may look up, for the webhook to resolve
/// before it converts (down from v1beta3 to write the reference; up to v1beta3
/// to tell whether the written one needs remembering).
pub fn versions_needed(objects: &[Value], desired: &str) -> Vec<(String, String)> {
    let mut needed: Vec<(String, String)> = objects
        .iter()
        .filter(|o| o["apiVersion"] != desired)
        .filter(|o| o["apiVersion"] == V1BETA3 || desired == V1BETA3)
        .filter_map(v1beta2_v1beta3::infrastructure_group_kind)
        .collect();
    needed.sort();
    needed.dedup();
    needed
}

pub(crate) fn object_name(object: &Value) -> String {
    let meta = &object["metadata"];
    format!(
        "{} {}/{}",
        object["kind"].as_str().unwrap_or(CONTROL_PLANE),
        meta["namespace"].as_str().unwrap_or_default(),
        meta["name"].as_str().unwrap_or_default()
    )
}

pub(crate) fn error(object: &Value, field: &str, reason: impl Into<String>) -> ConversionError {
    ConversionError {
        object: object_name(object),
        field: field.into(),
        reason: reason.into(),
    }
}

pub(crate) fn as_object<'a>(
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

/// Set `value` at `path`, making the parents.
pub(crate) fn put(map: &mut Map<String, Value>, path: &[&str], value: Value) {
    let (last, parents) = path.split_last().expect("a path has a field");
    let mut here = map;
    for key in parents {
        let entry = here
            .entry(key.to_string())
            .or_insert_with(|| Value::Object(Map::new()));
        if !entry.is_object() {
            *entry = Value::Object(Map::new());
        }
        here = entry.as_object_mut().expect("made an object above");
    }
    here.insert(last.to_string(), value);
}

/// Remove and return the value at `path`; parents left empty are removed.
pub(crate) fn take(map: &mut Map<String, Value>, path: &[&str]) -> Option<Value> {
    let (first, rest) = path.split_first()?;
    if rest.is_empty() {
        return map.remove(*first);
    }
    let child = map.get_mut(*first)?.as_object_mut()?;
    let value = take(child, rest);
    if child.is_empty() {
        map.remove(*first);
    }
    value
}

/// The value at `path`, if every parent is an object.
pub(crate) fn get<'a>(map: &'a Map<String, Value>, path: &[&str]) -> Option<&'a Value> {
    let (first, rest) = path.split_first()?;
    let value = map.get(*first)?;
    if rest.is_empty() {
        Some(value)
    } else {
        get(value.as_object()?, rest)
    }
}

/// Dotted path of a field under `prefix` (`spec`, `spec.template.spec`).
pub(crate) fn dotted(prefix: &str, path: &[&str]) -> String {
    std::iter::once(prefix)
        .chain(path.iter().copied())
        .collect::<Vec<_>>()
        .join(".")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Server-side apply converts the fields one manager owns as partial
    /// objects: no metadata, no spec, or a spec with one field. Every
    /// direction converts them, gives metadata back, and adds no spec.
    #[test]
    fn partial_objects_of_server_side_apply_convert_in_every_direction() {
        let versions = KnownApiVersions::new();
        let all = [V1BETA1, V1BETA2, V1BETA3];
        for kind in ["KThreesControlPlane", "KThreesControlPlaneTemplate"] {
            for from in all {
                if kind == "KThreesControlPlaneTemplate" && from == V1BETA1 {
                    continue;
                }
                let bare = json!({"apiVersion": from, "kind": kind});
                for to in all {
                    if kind == "KThreesControlPlaneTemplate" && to == V1BETA1 {
                        continue;
                    }
                    let out = convert(&bare, to, &versions)
                        .unwrap_or_else(|e| panic!("{kind} {from} -> {to}: {e}"));
                    assert_eq!(out["apiVersion"], to);
                    if from != to {
                        assert!(out["metadata"].is_object(), "{kind} {from} -> {to}: {out}");
                    }
                    assert!(out.get("spec").is_none(), "{kind} {from} -> {to}: {out}");
                }
            }
        }
        let replicas_only =
            json!({"apiVersion": V1BETA2, "kind": "KThreesControlPlane", "spec": {"replicas": 3}});
        let stored = convert(&replicas_only, V1BETA3, &versions).unwrap();
        assert_eq!(stored["spec"], json!({"replicas": 3}));
        assert_eq!(
            convert(&stored, V1BETA1, &versions).unwrap()["spec"],
            json!({"replicas": 3})
        );
    }
}
