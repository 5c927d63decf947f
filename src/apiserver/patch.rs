//! PATCH bodies: JSON merge patch, JSON patch, strategic merge (approximated) and server-side apply (approximated).

use serde_json::Value;

use super::error::ApiError;

/// The patch flavours the server accepts, from the request's `Content-Type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchKind {
    /// RFC 7386.
    Merge,
    /// RFC 6902.
    Json,
    /// Applied as a merge patch: lists are replaced, not merged by key; `$patch` directives are not understood.
    StrategicMerge,
    /// Server-side apply, approximated as a merge patch of the applied object (no field ownership).
    Apply,
}

const ACCEPTED: &str = "application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml";

impl PatchKind {
    pub fn from_content_type(content_type: Option<&str>) -> Result<Self, ApiError> {
        let essence = content_type
            .unwrap_or("")
            .split(';')
            .next()
            .unwrap_or("")
            .trim();
        match essence {
            "application/merge-patch+json" => Ok(Self::Merge),
            "application/json-patch+json" => Ok(Self::Json),
            "application/strategic-merge-patch+json" => Ok(Self::StrategicMerge),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => Ok(Self::Apply),
            _ => Err(ApiError::UnsupportedMediaType(ACCEPTED.to_string())),
        }
    }

    /// Parse the request body for this kind (apply bodies are YAML, a superset of JSON).
    pub fn parse_body(self, body: &[u8]) -> Result<Value, ApiError> {
        let parsed = match self {
            Self::Apply => crate::yaml::from_slice::<Value>(body).map_err(|e| e.to_string()),
            _ => serde_json::from_slice::<Value>(body).map_err(|e| e.to_string()),
        };
        parsed.map_err(|e| ApiError::BadRequest(format!("error decoding patch: {e}")))
    }

    /// Apply `patch` to `target`, returning the patched document.
    pub fn apply(self, target: &Value, patch: &Value) -> Result<Value, ApiError> {
        let mut doc = target.clone();
        match self {
            Self::Merge | Self::StrategicMerge | Self::Apply => {
                if !patch.is_object() {
                    return Err(ApiError::BadRequest(
                        "patch body must be a JSON object".into(),
                    ));
                }
                json_patch::merge(&mut doc, patch);
            }
            Self::Json => {
                let ops: json_patch::Patch =
                    serde_json::from_value(patch.clone()).map_err(|e| {
                        ApiError::BadRequest(format!(
                            "the server rejected our request due to an error in our request: {e}"
                        ))
                    })?;
                json_patch::patch(&mut doc, &ops).map_err(|e| ApiError::Invalid {
                    subject: Box::default(),
                    field: "patch".into(),
                    detail: e.to_string(),
                })?;
            }
        }
        Ok(doc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn content_types_map_to_patch_kinds() {
        assert_eq!(
            PatchKind::from_content_type(Some("application/merge-patch+json")).unwrap(),
            PatchKind::Merge
        );
        assert_eq!(
            PatchKind::from_content_type(Some("application/apply-patch+yaml")).unwrap(),
            PatchKind::Apply
        );
        assert_eq!(
            PatchKind::from_content_type(Some("text/plain"))
                .unwrap_err()
                .code(),
            415
        );
    }

    #[test]
    fn merge_patch_null_deletes_and_objects_merge() {
        let doc = json!({"spec": {"a": 1, "b": 2}, "list": [1, 2]});
        let out = PatchKind::Merge
            .apply(&doc, &json!({"spec": {"a": null, "c": 3}, "list": [3]}))
            .unwrap();
        assert_eq!(out, json!({"spec": {"b": 2, "c": 3}, "list": [3]}));
    }

    #[test]
    fn json_patch_applies_ops_and_reports_failed_test_op() {
        let doc = json!({"spec": {"replicas": 3}});
        let out = PatchKind::Json
            .apply(
                &doc,
                &json!([{"op": "replace", "path": "/spec/replicas", "value": 5}]),
            )
            .unwrap();
        assert_eq!(out["spec"]["replicas"], 5);
        let err = PatchKind::Json
            .apply(
                &doc,
                &json!([{"op": "test", "path": "/spec/replicas", "value": 4}]),
            )
            .unwrap_err();
        assert_eq!(err.code(), 422);
    }
}
