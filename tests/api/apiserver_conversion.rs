//! The test API server converts custom resources between served versions as a
//! real kube-apiserver does with a CRD whose `spec.conversion.strategy` is
//! `Webhook`, through a real `kube::Client`: a toy `Widget` whose `v1` says
//! `spec.a` where the stored `v2` says `spec.b`, converted by a toy converter.
//! Last, our own CRDs in the harness's management server, converted by our
//! conversion.

use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k3s_control_plane::apiserver::{ResourceDef, TestApiServer};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams, WatchEvent, WatchParams,
};
use serde_json::{Value, json};

const NS: &str = "default";
const DEADLINE: Duration = Duration::from_secs(10);

/// A CRD of `kind` in `group` serving `v1` and `v2` (stored), with status and
/// scale subresources, converted by `strategy`.
fn crd(group: &str, kind: &str, strategy: &str) -> CustomResourceDefinition {
    let plural = format!("{}s", kind.to_lowercase());
    let version = |name: &str, storage: bool| {
        json!({"name": name, "served": true, "storage": storage,
               "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
               "subresources": {"status": {}, "scale": {
                   "specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}}})
    };
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}")},
        "spec": {"group": group, "scope": "Namespaced",
          "names": {"kind": kind, "plural": plural},
          "conversion": {"strategy": strategy},
          "versions": [version("v1", false), version("v2", true)]}
    }))
    .unwrap()
}

/// The toy conversion: `v1` `spec.a` <-> `v2` `spec.b`; the value `"explode"`
/// cannot be converted.
fn a_to_b(object: &Value, desired: &str) -> Result<Value, String> {
    let mut out = object.clone();
    let spec = out["spec"].as_object_mut().ok_or("spec: missing")?;
    let (from, to) = match desired {
        "example.com/v2" => ("a", "b"),
        "example.com/v1" => ("b", "a"),
        other => return Err(format!("cannot convert to {other}")),
    };
    if let Some(value) = spec.remove(from) {
        if value == "explode" {
            return Err(format!("spec.{from}: cannot convert \"explode\""));
        }
        spec.insert(to.into(), value);
    }
    out["apiVersion"] = json!(desired);
    Ok(out)
}

/// Widgets (example.com, Webhook, converted by [`a_to_b`]), Gadgets
/// (example.org, Webhook, no converter) and Things (example.net, strategy None).
async fn server() -> TestApiServer {
    TestApiServer::builder()
        .with_core_resources()
        .resource(ResourceDef::from_crd(&crd(
            "example.com",
            "Widget",
            "Webhook",
        )))
        .resource(ResourceDef::from_crd(&crd(
            "example.org",
            "Gadget",
            "Webhook",
        )))
        .resource(ResourceDef::from_crd(&crd("example.net", "Thing", "None")))
        .converter("example.com", Arc::new(a_to_b))
        .bookmark_interval(Duration::from_millis(100))
        .start()
        .await
        .unwrap()
}

fn api(server: &TestApiServer, group: &str, kind: &str, version: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(group, version, kind);
    Api::namespaced_with(server.client(), NS, &ApiResource::from_gvk(&gvk))
}

fn widgets(server: &TestApiServer, version: &str) -> Api<DynamicObject> {
    api(server, "example.com", "Widget", version)
}

fn object(api_version: &str, kind: &str, name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": api_version, "kind": kind,
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }))
    .unwrap()
}

fn widget(version: &str, name: &str, spec: Value) -> DynamicObject {
    object(&format!("example.com/{version}"), "Widget", name, spec)
}

fn json_of(obj: &DynamicObject) -> Value {
    serde_json::to_value(obj).unwrap()
}

/// The metadata a conversion must never change.
fn identity(obj: &DynamicObject) -> Value {
    let m = &json_of(obj)["metadata"];
    json!([
        m["uid"],
        m["resourceVersion"],
        m["generation"],
        m["creationTimestamp"],
        m["name"]
    ])
}

type Events = std::pin::Pin<
    Box<dyn futures::Stream<Item = Result<WatchEvent<DynamicObject>, kube::Error>> + Send>,
>;

/// The next event of a watch that is not a bookmark.
async fn next(events: &mut Events) -> WatchEvent<DynamicObject> {
    loop {
        let event = tokio::time::timeout(DEADLINE, events.try_next())
            .await
            .expect("an event in time")
            .unwrap()
            .expect("the watch goes on");
        if !matches!(event, WatchEvent::Bookmark(_)) {
            return event;
        }
    }
}

fn status_of<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> Box<kube::core::Status> {
    match result {
        Err(kube::Error::Api(status)) => status,
        other => panic!("expected an API error status, got {other:?}"),
    }
}

#[tokio::test]
async fn created_in_v1_is_stored_once_in_v2_and_read_in_either() {
    let server = server().await;
    let (v1, v2) = (widgets(&server, "v1"), widgets(&server, "v2"));
    let created = v1
        .create(&PostParams::default(), &widget("v1", "w", json!({"a": 1})))
        .await
        .unwrap();
    assert_eq!(json_of(&created)["apiVersion"], "example.com/v1");
    assert_eq!(json_of(&created)["spec"], json!({"a": 1}));

    let as_v2 = v2.get("w").await.unwrap();
    assert_eq!(json_of(&as_v2)["apiVersion"], "example.com/v2");
    assert_eq!(
        json_of(&as_v2)["spec"],
        json!({"b": 1}),
        "converted to the storage shape"
    );
    let as_v1 = v1.get("w").await.unwrap();
    assert_eq!(json_of(&as_v1)["spec"], json!({"a": 1}));
    assert_eq!(identity(&as_v1), identity(&created));
    assert_eq!(
        identity(&as_v2),
        identity(&created),
        "reading in v2 changes no metadata"
    );

    // Stored once: one object in each version's list, in that version's shape.
    let listed_v2 = v2.list(&ListParams::default()).await.unwrap();
    assert_eq!(listed_v2.items.len(), 1);
    assert_eq!(json_of(&listed_v2.items[0])["spec"], json!({"b": 1}));
    let listed_v1 = v1.list(&ListParams::default()).await.unwrap();
    assert_eq!(listed_v1.items.len(), 1);
    assert_eq!(json_of(&listed_v1.items[0])["spec"], json!({"a": 1}));
    assert_eq!(identity(&listed_v1.items[0]), identity(&created));
}

#[tokio::test]
async fn watches_in_either_version_see_that_versions_shape() {
    let server = server().await;
    let (v1, v2) = (widgets(&server, "v1"), widgets(&server, "v2"));
    v1.create(&PostParams::default(), &widget("v1", "w", json!({"a": 1})))
        .await
        .unwrap();
    let params = WatchParams::default().timeout(5);
    let mut in_v1: Events = Box::pin(v1.watch(&params, "0").await.unwrap());
    let mut in_v2: Events = Box::pin(v2.watch(&params, "0").await.unwrap());
    let (WatchEvent::Added(a1), WatchEvent::Added(a2)) =
        (next(&mut in_v1).await, next(&mut in_v2).await)
    else {
        panic!("each watch starts with the object");
    };
    assert_eq!(json_of(&a1)["spec"], json!({"a": 1}));
    assert_eq!(json_of(&a2)["spec"], json!({"b": 1}));

    v2.patch(
        "w",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"b": 2}})),
    )
    .await
    .unwrap();
    let (WatchEvent::Modified(m1), WatchEvent::Modified(m2)) =
        (next(&mut in_v1).await, next(&mut in_v2).await)
    else {
        panic!("each watch sees the change");
    };
    assert_eq!(json_of(&m1)["apiVersion"], "example.com/v1");
    assert_eq!(json_of(&m1)["spec"], json!({"a": 2}));
    assert_eq!(json_of(&m2)["spec"], json!({"b": 2}));
    assert_eq!(identity(&m1), identity(&m2));

    v1.delete("w", &DeleteParams::default()).await.unwrap();
    let WatchEvent::Deleted(d1) = next(&mut in_v1).await else {
        panic!("the v1 watch sees the deletion");
    };
    assert_eq!(json_of(&d1)["spec"], json!({"a": 2}));
}

#[tokio::test]
async fn streaming_lists_send_initial_objects_and_bookmarks_in_the_watchs_version() {
    let server = server().await;
    widgets(&server, "v2")
        .create(&PostParams::default(), &widget("v2", "w", json!({"b": 7})))
        .await
        .unwrap();
    let request = http::Request::get(
        "/apis/example.com/v1/namespaces/default/widgets?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=2",
    )
    .body(Vec::new())
    .unwrap();
    let events: Vec<WatchEvent<DynamicObject>> = server
        .client()
        .request_events::<DynamicObject>(request)
        .await
        .unwrap()
        .take(2)
        .try_collect()
        .await
        .unwrap();
    let WatchEvent::Added(initial) = &events[0] else {
        panic!("the initial object first: {events:?}");
    };
    assert_eq!(json_of(initial)["apiVersion"], "example.com/v1");
    assert_eq!(json_of(initial)["spec"], json!({"a": 7}));
    let WatchEvent::Bookmark(end) = &events[1] else {
        panic!("then the initial-events-end bookmark: {events:?}");
    };
    assert_eq!(end.types.api_version, "example.com/v1");
}

#[tokio::test]
async fn patches_in_v1_apply_to_the_v1_shape_and_land_converted() {
    let server = server().await;
    let (v1, v2) = (widgets(&server, "v1"), widgets(&server, "v2"));
    let created = v2
        .create(
            &PostParams::default(),
            &widget("v2", "w", json!({"b": 1, "replicas": 1})),
        )
        .await
        .unwrap();

    let merged = v1
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"a": 5}})),
        )
        .await
        .unwrap();
    assert_eq!(json_of(&merged)["spec"], json!({"a": 5, "replicas": 1}));
    let stored = json_of(&v2.get("w").await.unwrap());
    assert_eq!(stored["spec"], json!({"b": 5, "replicas": 1}));
    assert_eq!(stored["metadata"]["generation"], 2);
    assert_eq!(
        stored["metadata"]["uid"],
        json_of(&created)["metadata"]["uid"]
    );

    // A JSON patch addresses the v1 shape: /spec/a exists only there.
    let patch: json_patch::Patch =
        serde_json::from_value(json!([{"op": "replace", "path": "/spec/a", "value": 6}])).unwrap();
    v1.patch("w", &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
        .unwrap();
    assert_eq!(json_of(&v2.get("w").await.unwrap())["spec"]["b"], 6);

    // Server-side apply in v1: of the present object, then creating one.
    let apply = PatchParams::apply("conversion-test");
    v1.patch(
        "w",
        &apply,
        &Patch::Apply(widget("v1", "w", json!({"a": 7}))),
    )
    .await
    .unwrap();
    assert_eq!(json_of(&v2.get("w").await.unwrap())["spec"]["b"], 7);
    let applied = v1
        .patch(
            "fresh",
            &apply,
            &Patch::Apply(widget("v1", "fresh", json!({"a": 8}))),
        )
        .await
        .unwrap();
    assert_eq!(json_of(&applied)["spec"], json!({"a": 8}));
    assert_eq!(
        json_of(&v2.get("fresh").await.unwrap())["spec"],
        json!({"b": 8})
    );
}

#[tokio::test]
async fn updates_in_v1_count_generation_by_the_stored_spec() {
    let server = server().await;
    let (v1, v2) = (widgets(&server, "v1"), widgets(&server, "v2"));
    v2.create(&PostParams::default(), &widget("v2", "w", json!({"b": 1})))
        .await
        .unwrap();
    let read = v1.get("w").await.unwrap();

    // Written back as read: the stored object is unchanged, nothing happens.
    let same = v1
        .replace("w", &PostParams::default(), &read)
        .await
        .unwrap();
    assert_eq!(identity(&same), identity(&read));

    let mut labelled = read.clone();
    labelled.metadata.labels = Some([("tier".to_string(), "one".to_string())].into());
    let labelled = v1
        .replace("w", &PostParams::default(), &labelled)
        .await
        .unwrap();
    assert_eq!(json_of(&labelled)["metadata"]["generation"], 1);
    assert_ne!(
        labelled.metadata.resource_version,
        read.metadata.resource_version
    );

    let mut changed = labelled.clone();
    changed.data["spec"]["a"] = json!(2);
    let changed = v1
        .replace("w", &PostParams::default(), &changed)
        .await
        .unwrap();
    assert_eq!(json_of(&changed)["metadata"]["generation"], 2);
    assert_eq!(json_of(&changed)["spec"], json!({"a": 2}));
    assert_eq!(
        json_of(&v2.get("w").await.unwrap())["spec"],
        json!({"b": 2})
    );
}

#[tokio::test]
async fn status_and_scale_in_v1_go_through_conversion() {
    let server = server().await;
    let (v1, v2) = (widgets(&server, "v1"), widgets(&server, "v2"));
    v2.create(
        &PostParams::default(),
        &widget("v2", "w", json!({"b": 1, "replicas": 1})),
    )
    .await
    .unwrap();
    let status = v1
        .patch_status(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"replicas": 1}})),
        )
        .await
        .unwrap();
    assert_eq!(
        json_of(&status)["spec"],
        json!({"a": 1, "replicas": 1}),
        "answered in v1"
    );
    assert_eq!(json_of(&status)["metadata"]["generation"], 1);
    assert_eq!(
        json_of(&v2.get("w").await.unwrap())["status"]["replicas"],
        1
    );

    let scale = v1.get_scale("w").await.unwrap();
    assert_eq!(scale.spec.and_then(|s| s.replicas), Some(1));
    v1.patch_scale(
        "w",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 3}})),
    )
    .await
    .unwrap();
    let stored = json_of(&v2.get("w").await.unwrap());
    assert_eq!(
        stored["spec"],
        json!({"b": 1, "replicas": 3}),
        "the rest of the spec kept"
    );
    assert_eq!(stored["metadata"]["generation"], 2);
}

#[tokio::test]
async fn a_converter_error_reaches_the_client_with_its_message() {
    let server = server().await;
    let (v1, v2) = (widgets(&server, "v1"), widgets(&server, "v2"));
    let refused = status_of(
        v1.create(
            &PostParams::default(),
            &widget("v1", "w", json!({"a": "explode"})),
        )
        .await,
    );
    assert_eq!(refused.code, 500);
    assert_eq!(refused.reason, "", "the real server's 500 has no reason");
    assert_eq!(
        refused.message,
        "conversion webhook for example.com/v1, Kind=Widget failed: spec.a: cannot convert \"explode\""
    );
    assert!(v2.get_opt("w").await.unwrap().is_none(), "nothing stored");

    // Stored fine, but not readable in v1: reads, lists and watches in v1 fail.
    v2.create(
        &PostParams::default(),
        &widget("v2", "w", json!({"b": "explode"})),
    )
    .await
    .unwrap();
    let message = "conversion webhook for example.com/v2, Kind=Widget failed: spec.b: cannot convert \"explode\"";
    assert_eq!(status_of(v1.get("w").await).message, message);
    assert_eq!(
        status_of(v1.list(&ListParams::default()).await).message,
        message
    );
    let mut events = Box::pin(
        v1.watch(&WatchParams::default().timeout(2), "0")
            .await
            .unwrap(),
    );
    match events.try_next().await.unwrap() {
        Some(WatchEvent::Error(e)) => assert_eq!((e.code, e.message.as_str()), (500, message)),
        other => panic!("expected an ERROR event, got {other:?}"),
    }
    assert_eq!(
        status_of(v1.delete("w", &DeleteParams::default()).await).code,
        500
    );
    assert!(
        v2.get_opt("w").await.unwrap().is_some(),
        "a delete that cannot read the object deletes nothing"
    );
}

#[tokio::test]
async fn a_webhook_crd_without_converter_fails_outside_its_storage_version() {
    let server = server().await;
    let (v1, v2) = (
        api(&server, "example.org", "Gadget", "v1"),
        api(&server, "example.org", "Gadget", "v2"),
    );
    let gadget = |version: &str| {
        object(
            &format!("example.org/{version}"),
            "Gadget",
            "g",
            json!({"a": 1}),
        )
    };
    let created = v2
        .create(&PostParams::default(), &gadget("v2"))
        .await
        .unwrap();
    assert_eq!(
        v2.get("g").await.unwrap().metadata.uid,
        created.metadata.uid,
        "the storage version needs no converter"
    );

    let read = status_of(v1.get("g").await);
    assert_eq!(read.code, 500);
    assert!(
        read.message
            .starts_with("conversion webhook for example.org/v2, Kind=Gadget failed: "),
        "{}",
        read.message
    );
    assert_eq!(status_of(v1.list(&ListParams::default()).await).code, 500);
    let write = status_of(
        v1.create(
            &PostParams::default(),
            &object("example.org/v1", "Gadget", "h", json!({})),
        )
        .await,
    );
    assert!(
        write
            .message
            .starts_with("conversion webhook for example.org/v1, Kind=Gadget failed: "),
        "{}",
        write.message
    );
}

#[tokio::test]
async fn strategy_none_changes_only_the_api_version() {
    let server = server().await;
    let (v1, v2) = (
        api(&server, "example.net", "Thing", "v1"),
        api(&server, "example.net", "Thing", "v2"),
    );
    v1.create(
        &PostParams::default(),
        &object("example.net/v1", "Thing", "t", json!({"a": 1})),
    )
    .await
    .unwrap();
    let read = json_of(&v2.get("t").await.unwrap());
    assert_eq!(read["apiVersion"], "example.net/v2");
    assert_eq!(read["spec"], json!({"a": 1}));
}

/// Our CRDs in the harness's management server come with our conversion: an
/// upstream (cluster-api-k3s) v1beta1 KThreesControlPlane is stored as v1beta3
/// and read in every version; one written in v1beta3, referencing its
/// infrastructure template by group only, reads as v1beta1 with the template's
/// API version (from the sandbox's infrastructure CRDs); what only v1beta2 says
/// survives a v1beta1 write.
#[tokio::test]
async fn the_management_server_converts_our_kinds_with_our_conversion() {
    let server = k3s_control_plane::harness::sandbox::management_server()
        .await
        .unwrap();
    let kcps = |version: &str| {
        api(
            &server,
            "controlplane.cluster.x-k8s.io",
            "KThreesControlPlane",
            version,
        )
    };
    let (v1, v2, v3) = (kcps("v1beta1"), kcps("v1beta2"), kcps("v1beta3"));
    // As cluster-api-k3s users write it (tests/fixtures/upstream-kcp-v1beta1.yaml).
    let upstream = json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "KThreesControlPlane",
        "metadata": {"name": "legacy-control-plane", "namespace": NS},
        "spec": {
            "replicas": 3, "version": "v1.29.4+k3s1",
            "infrastructureTemplate": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
                "kind": "DockerMachineTemplate", "name": "legacy-control-plane"},
            "upgradeAfter": "2026-01-01T00:00:00Z", "nodeDrainTimeout": "2m",
            "kthreesConfigSpec": {"serverConfig": {"disableComponents": ["servicelb", "traefik"]}}
        }
    });
    let name = "legacy-control-plane";
    v1.create(
        &PostParams::default(),
        &serde_json::from_value(upstream.clone()).unwrap(),
    )
    .await
    .expect("created as v1beta1");
    let stored = json_of(&v3.get(name).await.unwrap());
    let reference = &stored["spec"]["machineTemplate"]["spec"]["infrastructureRef"];
    assert_eq!(
        (&reference["kind"], &reference["name"]),
        (&json!("DockerMachineTemplate"), &json!(name)),
        "{stored}"
    );
    let as_v2 = json_of(&v2.get(name).await.unwrap());
    assert_eq!(
        as_v2["spec"]["machineTemplate"]["infrastructureRef"],
        upstream["spec"]["infrastructureTemplate"]
    );
    assert_eq!(
        as_v2["spec"]["rolloutAfter"],
        upstream["spec"]["upgradeAfter"]
    );
    assert_eq!(as_v2["metadata"]["uid"], stored["metadata"]["uid"]);

    v2.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"rolloutBefore": {"certificatesExpiryDays": 21}}})),
    )
    .await
    .unwrap();
    let served = json_of(&v1.get(name).await.unwrap());
    assert!(served["spec"].get("rolloutBefore").is_none(), "{served}");
    v1.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 5}})),
    )
    .await
    .unwrap();
    let as_v2 = json_of(&v2.get(name).await.unwrap());
    assert_eq!(as_v2["spec"]["replicas"], 5);
    assert_eq!(
        as_v2["spec"]["rolloutBefore"]["certificatesExpiryDays"], 21,
        "{as_v2}"
    );

    // Written in the stored version, the template named by group only.
    let current = json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta3", "kind": "KThreesControlPlane",
        "metadata": {"name": "current", "namespace": NS},
        "spec": {"replicas": 1, "version": "v1.30.2+k3s2",
            "machineTemplate": {"spec": {"infrastructureRef": {
                "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachineTemplate",
                "name": "current"}}}}
    });
    v3.create(
        &PostParams::default(),
        &serde_json::from_value(current).unwrap(),
    )
    .await
    .expect("created as v1beta3");
    let as_v1 = json_of(&v1.get("current").await.expect("read as v1beta1"));
    assert_eq!(
        as_v1["spec"]["infrastructureTemplate"]["apiVersion"],
        "infrastructure.cluster.x-k8s.io/v1beta1",
        "{as_v1}"
    );
}
