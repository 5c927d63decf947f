//! Write-time conversions the real server applies to particular built-in kinds.

use serde_json::{Value, json};

use super::store::ResKey;

/// Secrets: `stringData` is merged into `data` (base64) and dropped; `type` defaults to `Opaque`.
pub fn normalize(res: &ResKey, obj: &mut Value) {
    if res.group.is_empty() && res.plural == "secrets" {
        normalize_secret(obj);
    }
}

fn normalize_secret(obj: &mut Value) {
    let Some(root) = obj.as_object_mut() else {
        return;
    };
    if let Some(Value::Object(string_data)) = root.remove("stringData") {
        let data = root.entry("data").or_insert_with(|| json!({}));
        if !data.is_object() {
            *data = json!({});
        }
        for (key, value) in string_data {
            let text = value
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| value.to_string());
            let encoded = serde_json::to_value(k8s_openapi::ByteString(text.into_bytes()))
                .expect("a ByteString always serializes to a base64 string");
            data[key] = encoded;
        }
    }
    if root
        .get("type")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        root.insert("type".into(), json!("Opaque"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_string_data_becomes_base64_data_and_type_defaults() {
        let res = ResKey {
            group: String::new(),
            plural: "secrets".into(),
        };
        let mut secret = json!({"data": {"a": "eA=="}, "stringData": {"b": "hello"}});
        normalize(&res, &mut secret);
        assert_eq!(
            secret,
            json!({"data": {"a": "eA==", "b": "aGVsbG8="}, "type": "Opaque"})
        );
    }

    #[test]
    fn other_kinds_are_untouched() {
        let res = ResKey {
            group: String::new(),
            plural: "configmaps".into(),
        };
        let mut cm = json!({"stringData": {"b": "x"}});
        normalize(&res, &mut cm);
        assert_eq!(cm, json!({"stringData": {"b": "x"}}));
    }
}
