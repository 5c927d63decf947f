//! The conversion rules fed directly with JSON objects (no HTTP): a toy Widget
//! whose `v1` says `spec.a` where the stored `v2` says `spec.b`.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::json;

use super::*;

fn widgets(strategy: &str) -> ResourceDef {
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
          "names": {"kind": "Widget", "plural": "widgets"},
          "conversion": {"strategy": strategy},
          "versions": [
            {"name": "v1", "served": true, "storage": false},
            {"name": "v2", "served": true, "storage": true}]}
    }))
    .unwrap();
    ResourceDef::from_crd(&crd)
}

/// v1 `spec.a` <-> v2 `spec.b`.
fn a_to_b(object: &Value, desired: &str) -> Result<Value, String> {
    let mut out = object.clone();
    let spec = out["spec"].as_object_mut().ok_or("spec: missing")?;
    match desired {
        "example.com/v2" => {
            let a = spec.remove("a").ok_or("spec.a: missing")?;
            spec.insert("b".into(), a);
        }
        "example.com/v1" => {
            let b = spec.remove("b").ok_or("spec.b: missing")?;
            spec.insert("a".into(), b);
        }
        other => return Err(format!("cannot convert to {other}")),
    }
    out["apiVersion"] = json!(desired);
    Ok(out)
}

fn with(
    converter: impl Fn(&Value, &str) -> Result<Value, String> + Send + Sync + 'static,
) -> Converters {
    let mut converters = Converters::default();
    converters.register("example.com", Arc::new(converter));
    converters
}

fn widget_v1() -> Value {
    json!({"apiVersion": "example.com/v1", "kind": "Widget",
           "metadata": {"name": "w", "namespace": "ns", "uid": "u-1", "resourceVersion": "7",
                        "generation": 2, "finalizers": ["keep"], "labels": {"tier": "one"}},
           "spec": {"a": 1}})
}

fn message(err: ApiError) -> (u16, String) {
    (err.code(), err.to_string())
}

#[test]
fn webhook_strategy_changes_the_shape_both_ways() {
    let (def, converters) = (widgets("Webhook"), with(a_to_b));
    let stored = converters.to_storage(&def, widget_v1()).unwrap();
    assert_eq!(stored["apiVersion"], "example.com/v2");
    assert_eq!(stored["spec"], json!({"b": 1}));
    assert_eq!(stored["metadata"], widget_v1()["metadata"]);
    let read = converters.convert(&def, stored, "v1").unwrap();
    assert_eq!(read, widget_v1());
}

#[test]
fn none_strategy_only_rewrites_the_api_version() {
    let def = widgets("None");
    let stored = with(a_to_b).to_storage(&def, widget_v1()).unwrap();
    assert_eq!(stored["apiVersion"], "example.com/v2");
    assert_eq!(stored["spec"], json!({"a": 1}));
}

#[test]
fn an_object_already_in_the_desired_version_is_not_sent() {
    let def = widgets("Webhook");
    let unreachable = with(|_: &Value, _: &str| Err("must not be called".to_string()));
    let stored = unreachable.to_storage(&def, a_to_b(&widget_v1(), "example.com/v2").unwrap());
    assert_eq!(stored.unwrap()["spec"], json!({"b": 1}));
    // Nor with no converter at all.
    let v1 = Converters::default()
        .convert(&def, widget_v1(), "v1")
        .unwrap();
    assert_eq!(v1, widget_v1());
}

#[test]
fn no_converter_fails_as_an_unreachable_webhook() {
    let err = Converters::default()
        .to_storage(&widgets("Webhook"), widget_v1())
        .unwrap_err();
    let (code, text) = message(err);
    assert_eq!(code, 500);
    assert!(
        text.starts_with("conversion webhook for example.com/v1, Kind=Widget failed: "),
        "{text}"
    );
    assert!(text.contains("example.com"), "{text}");
}

#[test]
fn a_converter_error_is_reported_with_its_message() {
    let err = with(|_: &Value, _: &str| Err("spec.a: out of range".to_string()))
        .to_storage(&widgets("Webhook"), widget_v1())
        .unwrap_err();
    assert_eq!(
        message(err),
        (
            500,
            "conversion webhook for example.com/v1, Kind=Widget failed: spec.a: out of range"
                .to_string()
        )
    );
    assert_eq!(
        ApiError::Internal(String::new()).reason(),
        "",
        "the real server's 500 for a failed conversion has no reason"
    );
}

#[test]
fn an_answer_in_the_wrong_version_or_kind_is_refused() {
    let def = widgets("Webhook");
    let same_version = with(|o: &Value, _: &str| Ok(o.clone()));
    let (_, text) = message(same_version.to_storage(&def, widget_v1()).unwrap_err());
    assert_eq!(
        text,
        "conversion webhook for example.com/v1, Kind=Widget returned invalid object at index 0: invalid groupVersion (expected example.com/v2, received example.com/v1)"
    );
    let other_kind = with(|o: &Value, d: &str| {
        let mut out = a_to_b(o, d)?;
        out["kind"] = json!("Gadget");
        Ok(out)
    });
    let (_, text) = message(other_kind.to_storage(&def, widget_v1()).unwrap_err());
    assert!(
        text.ends_with("invalid kind (expected Widget, received Gadget)"),
        "{text}"
    );
}

#[test]
fn a_changed_name_namespace_or_uid_is_refused() {
    let def = widgets("Webhook");
    for (field, label) in [("name", "name"), ("namespace", "namespace"), ("uid", "UID")] {
        let renaming = with(move |o: &Value, d: &str| {
            let mut out = a_to_b(o, d)?;
            out["metadata"][field] = json!("other");
            Ok(out)
        });
        let (code, text) = message(renaming.to_storage(&def, widget_v1()).unwrap_err());
        assert_eq!(code, 500);
        assert!(
            text.starts_with(
                "conversion webhook for example.com/v1, Kind=Widget returned invalid object: "
            ),
            "{text}"
        );
        assert!(
            text.contains(&format!("must have the same {label}: ")),
            "{text}"
        );
    }
}

#[test]
fn other_metadata_is_restored_but_labels_and_annotations_are_the_converters() {
    let def = widgets("Webhook");
    let meddling = with(|o: &Value, d: &str| {
        let mut out = a_to_b(o, d)?;
        out["metadata"]["resourceVersion"] = json!("99");
        out["metadata"]["generation"] = json!(5);
        out["metadata"]["finalizers"] = json!([]);
        out["metadata"]["labels"] = json!({"tier": "two"});
        out["metadata"]["annotations"] = json!({"converted": "yes"});
        Ok(out)
    });
    let stored = meddling.to_storage(&def, widget_v1()).unwrap();
    let metadata = &stored["metadata"];
    assert_eq!(metadata["resourceVersion"], "7");
    assert_eq!(metadata["generation"], 2);
    assert_eq!(metadata["finalizers"], json!(["keep"]));
    assert_eq!(metadata["labels"], json!({"tier": "two"}));
    assert_eq!(metadata["annotations"], json!({"converted": "yes"}));
    let dropping = with(|o: &Value, d: &str| {
        let mut out = a_to_b(o, d)?;
        out["metadata"] = json!({"name": "w", "namespace": "ns", "uid": "u-1", "labels": {}});
        Ok(out)
    });
    let stored = dropping.to_storage(&def, widget_v1()).unwrap();
    assert_eq!(stored["metadata"].get("labels"), None, "{stored}");
    assert_eq!(stored["metadata"]["finalizers"], json!(["keep"]));
}

#[test]
fn labels_must_stay_strings() {
    let numeric = with(|o: &Value, d: &str| {
        let mut out = a_to_b(o, d)?;
        out["metadata"]["labels"] = json!({"tier": 2});
        Ok(out)
    });
    let (_, text) = message(
        numeric
            .to_storage(&widgets("Webhook"), widget_v1())
            .unwrap_err(),
    );
    assert_eq!(
        text,
        "conversion webhook for example.com/v1, Kind=Widget returned invalid metadata: metadata.labels[tier] must be a string, but is float64 in converted object"
    );
}
