//! Store rules fed directly with JSON objects (no HTTP).

use serde_json::json;

use super::*;
use crate::apiserver::resource::Scope;

fn widgets() -> ResourceDef {
    ResourceDef::new(
        kube::core::ApiResource {
            group: "example.com".into(),
            version: "v1".into(),
            api_version: "example.com/v1".into(),
            kind: "Widget".into(),
            plural: "widgets".into(),
        },
        Scope::Namespaced,
    )
    .with_status()
}

fn store(limit: usize) -> (Store, ResourceDef) {
    let def = widgets();
    let mut registry = Registry::default();
    registry.add(def.clone());
    (Store::new(registry, Converters::default(), limit), def)
}

fn widget(name: &str) -> Value {
    json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": name}, "spec": {"size": 1}})
}

fn rv(obj: &Value) -> u64 {
    meta_str(obj, "resourceVersion").unwrap().parse().unwrap()
}

#[test]
fn generation_counts_spec_changes_only() {
    let (s, def) = store(100);
    let created = s.create(&def, "v1", Some("ns"), widget("w")).unwrap();
    assert_eq!(created["metadata"]["generation"], 1);
    let mut labelled = created.clone();
    labelled["metadata"]["labels"] = json!({"a": "b"});
    let labelled = s
        .replace(&def, "v1", Some("ns"), "w", labelled, Target::Main)
        .unwrap();
    assert_eq!(labelled["metadata"]["generation"], 1);
    let mut status = labelled.clone();
    status["status"] = json!({"ready": true});
    let status = s
        .replace(&def, "v1", Some("ns"), "w", status, Target::Status)
        .unwrap();
    assert_eq!(status["metadata"]["generation"], 1);
    let mut spec = status.clone();
    spec["spec"]["size"] = json!(2);
    let spec = s
        .replace(&def, "v1", Some("ns"), "w", spec, Target::Main)
        .unwrap();
    assert_eq!(spec["metadata"]["generation"], 2);
    assert_eq!(spec["status"]["ready"], true);
}

#[test]
fn unchanged_write_keeps_revision() {
    let (s, def) = store(100);
    let created = s.create(&def, "v1", Some("ns"), widget("w")).unwrap();
    let again = s
        .replace(&def, "v1", Some("ns"), "w", created.clone(), Target::Main)
        .unwrap();
    assert_eq!(rv(&again), rv(&created));
}

#[test]
fn stale_resource_version_conflicts() {
    let (s, def) = store(100);
    let created = s.create(&def, "v1", Some("ns"), widget("w")).unwrap();
    let mut changed = created.clone();
    changed["spec"]["size"] = json!(5);
    s.replace(&def, "v1", Some("ns"), "w", changed.clone(), Target::Main)
        .unwrap();
    changed["spec"]["size"] = json!(6);
    let err = s
        .replace(&def, "v1", Some("ns"), "w", changed, Target::Main)
        .unwrap_err();
    assert_eq!(err.code(), 409);
}

#[test]
fn owner_deletion_collects_dependents_and_keeps_finalized_ones() {
    let (s, def) = store(100);
    let owner = s.create(&def, "v1", Some("ns"), widget("owner")).unwrap();
    let uid = owner["metadata"]["uid"].as_str().unwrap();
    let refs =
        json!([{"apiVersion": "example.com/v1", "kind": "Widget", "name": "owner", "uid": uid}]);
    let mut plain = widget("plain");
    plain["metadata"]["ownerReferences"] = refs.clone();
    let mut guarded = widget("guarded");
    guarded["metadata"]["ownerReferences"] = refs;
    guarded["metadata"]["finalizers"] = json!(["example.com/keep"]);
    s.create(&def, "v1", Some("ns"), plain).unwrap();
    s.create(&def, "v1", Some("ns"), guarded).unwrap();
    s.delete(&def, "v1", Some("ns"), "owner", &DeleteOptions::default())
        .unwrap();
    assert_eq!(
        s.get(&def, "v1", Some("ns"), "plain").unwrap_err().code(),
        404
    );
    let kept = s.get(&def, "v1", Some("ns"), "guarded").unwrap();
    assert!(meta_str(&kept, "deletionTimestamp").is_some());
}

#[test]
fn history_bound_turns_old_revisions_into_gone() {
    let (s, def) = store(2);
    let first = s.create(&def, "v1", Some("ns"), widget("a")).unwrap();
    s.create(&def, "v1", Some("ns"), widget("b")).unwrap();
    assert!(s.events_since(rv(&first) - 1).is_ok());
    s.create(&def, "v1", Some("ns"), widget("c")).unwrap();
    assert_eq!(s.events_since(rv(&first) - 1).unwrap_err().code(), 410);
    let (events, newest) = s.events_since(rv(&first)).unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(newest, s.current_rv());
}

#[test]
fn foreground_owner_without_blocking_dependents_goes_at_once_and_takes_dependents() {
    let (s, def) = store(100);
    let owner = s.create(&def, "v1", Some("ns"), widget("owner")).unwrap();
    let uid = owner["metadata"]["uid"].as_str().unwrap();
    let mut dependent = widget("dependent");
    dependent["metadata"]["ownerReferences"] =
        json!([{"apiVersion": "example.com/v1", "kind": "Widget", "name": "owner", "uid": uid}]);
    s.create(&def, "v1", Some("ns"), dependent).unwrap();
    let opts = DeleteOptions {
        propagation: Propagation::Foreground,
        ..Default::default()
    };
    s.delete(&def, "v1", Some("ns"), "owner", &opts).unwrap();
    assert_eq!(
        s.get(&def, "v1", Some("ns"), "owner").unwrap_err().code(),
        404
    );
    assert_eq!(
        s.get(&def, "v1", Some("ns"), "dependent")
            .unwrap_err()
            .code(),
        404
    );
}

#[test]
fn orphaned_dependent_keeps_its_other_owners() {
    let (s, def) = store(100);
    let a = s.create(&def, "v1", Some("ns"), widget("a")).unwrap();
    let b = s.create(&def, "v1", Some("ns"), widget("b")).unwrap();
    let refs: Vec<Value> = [&a, &b]
        .iter()
        .map(|o| json!({"apiVersion": "example.com/v1", "kind": "Widget", "name": o["metadata"]["name"], "uid": o["metadata"]["uid"]}))
        .collect();
    let mut dependent = widget("dependent");
    dependent["metadata"]["ownerReferences"] = json!(refs);
    s.create(&def, "v1", Some("ns"), dependent).unwrap();
    s.delete(&def, "v1", Some("ns"), "a", &DeleteOptions::default())
        .unwrap();
    let kept = s.get(&def, "v1", Some("ns"), "dependent").unwrap();
    assert_eq!(
        meta::owner_uids(&kept),
        vec![b["metadata"]["uid"].as_str().unwrap().to_string()]
    );
}

#[test]
fn put_without_resource_version_is_unconditional_only_where_allowed() {
    let (s, def) = store(100);
    s.create(&def, "v1", Some("ns"), widget("w")).unwrap();
    let mut blind = widget("w");
    blind["spec"]["size"] = json!(5);
    for missing in [json!(null), json!("")] {
        let mut body = blind.clone();
        body["metadata"]["resourceVersion"] = missing;
        let err = s
            .replace(&def, "v1", Some("ns"), "w", body, Target::Main)
            .unwrap_err();
        assert_eq!((err.code(), err.reason()), (422, "Invalid"));
        assert_eq!(
            err.to_string(),
            "widgets.example.com \"w\" is invalid: metadata.resourceVersion: Invalid value: 0x0: must be specified for an update"
        );
    }
    let def = def.with_unconditional_update(true);
    let mut body = blind.clone();
    body["metadata"]["resourceVersion"] = json!("");
    let written = s
        .replace(&def, "v1", Some("ns"), "w", body, Target::Main)
        .unwrap();
    assert_eq!(written["spec"]["size"], 5);
    blind["spec"]["size"] = json!(6);
    let written = s
        .replace(&def, "v1", Some("ns"), "w", blind, Target::Main)
        .unwrap();
    assert_eq!(written["spec"]["size"], 6);
}
