//! The status and scale subresources of KThreesControlPlane.

use kube::Resource;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn main_resource_write_ignores_status() {
    run("main-ignores-status", |env| async move {
        let created = env
            .kcps()
            .create(&PostParams::default(), &kcp("kcp-1"))
            .await
            .unwrap();
        let mut with_status = created.clone();
        with_status.data["status"] = json!({"replicas": 7});
        with_status.data["spec"]["replicas"] = json!(5);
        let written = env
            .kcps()
            .replace("kcp-1", &PostParams::default(), &with_status)
            .await
            .unwrap();
        assert_eq!(field(&written, "/spec/replicas"), 5);
        assert!(
            field(&written, "/status/replicas").is_null(),
            "status must not change through the main resource"
        );
        let patched = env
            .kcps()
            .patch(
                "kcp-1",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"replicas": 9}})),
            )
            .await
            .unwrap();
        assert!(field(&patched, "/status/replicas").is_null());
    })
    .await;
}

#[tokio::test]
async fn status_subresource_write_changes_only_status_without_generation_bump() {
    run("status-only", |env| async move {
        let created = env
            .kcps()
            .create(&PostParams::default(), &kcp("kcp-1"))
            .await
            .unwrap();
        let mut body = created.clone();
        body.data["status"] = json!({"replicas": 2, "selector": "app=cp"});
        body.data["spec"]["replicas"] = json!(5);
        let written = env
            .kcps()
            .replace_status("kcp-1", &PostParams::default(), &body)
            .await
            .unwrap();
        assert_eq!(field(&written, "/status/replicas"), 2);
        assert_eq!(
            field(&written, "/spec/replicas"),
            3,
            "spec must not change through /status"
        );
        assert_eq!(written.meta().generation, Some(1));
        assert!(rv_of(&written) > rv_of(&created));
        let patched = env
            .kcps()
            .patch_status(
                "kcp-1",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"replicas": 3}})),
            )
            .await
            .unwrap();
        assert_eq!(field(&patched, "/status/replicas"), 3);
        assert_eq!(field(&patched, "/status/selector"), "app=cp");
        assert_eq!(patched.meta().generation, Some(1));
    })
    .await;
}

#[tokio::test]
async fn status_write_with_stale_resource_version_is_conflict_409() {
    run("status-stale", |env| async move {
        let created = env
            .kcps()
            .create(&PostParams::default(), &kcp("kcp-1"))
            .await
            .unwrap();
        let mut first = created.clone();
        first.data["status"] = json!({"replicas": 1});
        env.kcps()
            .replace_status("kcp-1", &PostParams::default(), &first)
            .await
            .unwrap();
        let mut stale = created.clone();
        stale.data["status"] = json!({"replicas": 2});
        let status = status_of(
            env.kcps()
                .replace_status("kcp-1", &PostParams::default(), &stale)
                .await,
        );
        assert_eq!(status.code, 409);
    })
    .await;
}

#[tokio::test]
async fn scale_subresource_reads_and_writes_replicas() {
    run("scale", |env| async move {
        env.kcps()
            .create(&PostParams::default(), &kcp("kcp-1"))
            .await
            .unwrap();
        env.kcps()
            .patch_status(
                "kcp-1",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"replicas": 3, "selector": "app=cp"}})),
            )
            .await
            .unwrap();
        let scale = env.kcps().get_scale("kcp-1").await.unwrap();
        assert_eq!(scale.spec.as_ref().and_then(|s| s.replicas), Some(3));
        assert_eq!(scale.status.as_ref().map(|s| s.replicas), Some(3));
        assert_eq!(
            scale
                .status
                .as_ref()
                .and_then(|s| s.selector.clone())
                .as_deref(),
            Some("app=cp")
        );
        let scaled = env
            .kcps()
            .patch_scale(
                "kcp-1",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": 5}})),
            )
            .await
            .unwrap();
        assert_eq!(scaled.spec.and_then(|s| s.replicas), Some(5));
        let obj = env.kcps().get("kcp-1").await.unwrap();
        assert_eq!(field(&obj, "/spec/replicas"), 5);
        assert_eq!(obj.meta().generation, Some(2));
    })
    .await;
}
