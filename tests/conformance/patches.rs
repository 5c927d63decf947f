//! PATCH flavours: merge, JSON, strategic merge, server-side apply; resourceVersion preconditions.

use kube::api::{Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn merge_patch_sets_fields_and_null_removes_them() {
    run("merge-patch", |env| async move {
        let mut obj = kcp("kcp-1");
        obj.labels_mut().insert("drop".into(), "me".into());
        env.kcps()
            .create(&PostParams::default(), &obj)
            .await
            .unwrap();
        let patch =
            json!({"metadata": {"labels": {"drop": null, "keep": "yes"}}, "spec": {"replicas": 5}});
        let patched = env
            .kcps()
            .patch("kcp-1", &PatchParams::default(), &Patch::Merge(patch))
            .await
            .unwrap();
        assert_eq!(field(&patched, "/spec/replicas"), 5);
        assert_eq!(field(&patched, "/spec/version"), "v1.30.2+k3s2");
        assert_eq!(
            patched.labels().get("keep").map(String::as_str),
            Some("yes")
        );
        assert!(!patched.labels().contains_key("drop"));
        assert_eq!(patched.meta().generation, Some(2));
    })
    .await;
}

#[tokio::test]
async fn json_patch_applies_operations_and_a_failed_test_is_invalid_422() {
    run("json-patch", |env| async move {
        env.kcps()
            .create(&PostParams::default(), &kcp("kcp-1"))
            .await
            .unwrap();
        let ops: json_patch::Patch = serde_json::from_value(json!([
            {"op": "test", "path": "/spec/replicas", "value": 3},
            {"op": "replace", "path": "/spec/replicas", "value": 5}
        ]))
        .unwrap();
        let patched = env
            .kcps()
            .patch("kcp-1", &PatchParams::default(), &Patch::Json::<()>(ops))
            .await
            .unwrap();
        assert_eq!(field(&patched, "/spec/replicas"), 5);
        let failing: json_patch::Patch =
            serde_json::from_value(json!([{"op": "test", "path": "/spec/replicas", "value": 3}]))
                .unwrap();
        let status = status_of(
            env.kcps()
                .patch(
                    "kcp-1",
                    &PatchParams::default(),
                    &Patch::Json::<()>(failing),
                )
                .await,
        );
        assert_eq!(status.code, 422);
    })
    .await;
}

#[tokio::test]
async fn strategic_merge_patch_merges_config_map_data() {
    run("strategic-merge", |env| async move {
        env.config_maps()
            .create(&PostParams::default(), &config_map("cm", &[]))
            .await
            .unwrap();
        let patch = json!({"data": {"added": "1"}});
        let patched = env
            .config_maps()
            .patch("cm", &PatchParams::default(), &Patch::Strategic(patch))
            .await
            .unwrap();
        let data = patched.data.unwrap();
        assert_eq!(data.get("key").map(String::as_str), Some("value"));
        assert_eq!(data.get("added").map(String::as_str), Some("1"));
    })
    .await;
}

#[tokio::test]
async fn apply_creates_when_absent_and_updates_its_fields() {
    run("apply", |env| async move {
        let pp = PatchParams::apply("conformance").force();
        let mut desired = kcp("kcp-1");
        desired.labels_mut().insert("applied".into(), "yes".into());
        let created = env
            .kcps()
            .patch("kcp-1", &pp, &Patch::Apply(&desired))
            .await
            .unwrap();
        assert_eq!(field(&created, "/spec/replicas"), 3);
        assert!(created.uid().is_some());
        // Another manager's field must survive a later apply by ours.
        env.kcps()
            .patch(
                "kcp-1",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"other": "manager"}}})),
            )
            .await
            .unwrap();
        desired.data["spec"]["replicas"] = json!(5);
        let updated = env
            .kcps()
            .patch("kcp-1", &pp, &Patch::Apply(&desired))
            .await
            .unwrap();
        assert_eq!(field(&updated, "/spec/replicas"), 5);
        assert_eq!(
            updated.labels().get("other").map(String::as_str),
            Some("manager")
        );
        assert_eq!(
            updated.labels().get("applied").map(String::as_str),
            Some("yes")
        );
        assert_eq!(updated.uid(), created.uid());
    })
    .await;
}

#[tokio::test]
async fn patch_with_stale_resource_version_is_conflict_409() {
    run("patch-stale", |env| async move {
        let created = env.kcps().create(&PostParams::default(), &kcp("kcp-1")).await.unwrap();
        env.kcps()
            .patch("kcp-1", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 5}})))
            .await
            .unwrap();
        let stale = json!({"metadata": {"resourceVersion": created.resource_version()}, "spec": {"replicas": 1}});
        let status = status_of(env.kcps().patch("kcp-1", &PatchParams::default(), &Patch::Merge(stale)).await);
        assert_eq!(status.code, 409);
        assert_eq!(status.reason, "Conflict");
    })
    .await;
}
