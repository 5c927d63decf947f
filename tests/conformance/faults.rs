//! Injected faults of the test API server (`fail_next_write(s)`), through a
//! real `kube::Client`: the write fails with the real `Status`, nothing changes
//! (no revision, no watch event), the next write succeeds. A real cluster cannot
//! inject faults on demand: these tests are skipped when `KUBECONFIG` is set.

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::support::*;

fn kcps_resource() -> String {
    format!("kthreescontrolplanes.{KCP_GROUP}")
}

const MODIFIED: &str =
    "the object has been modified; please apply your changes to the latest version and try again";

fn replicas(n: i64) -> Patch<serde_json::Value> {
    Patch::Merge(json!({"spec": {"replicas": n}}))
}

#[tokio::test]
async fn an_injected_conflict_fails_one_write_changes_nothing_and_the_next_succeeds() {
    run("fault-conflict", |env| async move {
        let Some(server) = env.server.as_ref() else {
            eprintln!("skipped against a real cluster: faults cannot be injected");
            return;
        };
        let created = env
            .kcps()
            .create(&PostParams::default(), &kcp("kcp-1"))
            .await
            .unwrap();
        let mut events = env
            .kcps()
            .watch(
                &WatchParams::default().timeout(60),
                &created.resource_version().unwrap(),
            )
            .await
            .unwrap()
            .boxed();
        server.fail_next_write(&kcps_resource(), 409);
        let revision = server.resource_version();
        let status = status_of(
            env.kcps()
                .patch("kcp-1", &PatchParams::default(), &replicas(5))
                .await,
        );
        assert_eq!((status.code, status.reason.as_str()), (409, "Conflict"));
        assert_eq!(
            status.message,
            format!("Operation cannot be fulfilled on kthreescontrolplanes.{KCP_GROUP} \"kcp-1\": {MODIFIED}")
        );
        let details = status.details.expect("Conflict carries details");
        assert_eq!(
            (details.name.as_str(), details.group.as_str(), details.kind.as_str()),
            ("kcp-1", KCP_GROUP, "kthreescontrolplanes")
        );
        assert_eq!(server.resource_version(), revision, "no new revision");
        let stored = env.kcps().get("kcp-1").await.unwrap();
        assert_eq!(field(&stored, "/spec/replicas"), 3);
        assert_eq!(stored.resource_version(), created.resource_version());

        let written = env
            .kcps()
            .patch("kcp-1", &PatchParams::default(), &replicas(7))
            .await
            .unwrap();
        assert_eq!(field(&written, "/spec/replicas"), 7);
        // The watch's first event is the successful write: the failed one sent none.
        let first = tokio::time::timeout(DEADLINE, async {
            loop {
                match events.try_next().await.unwrap().expect("watch open") {
                    WatchEvent::Bookmark(_) => continue,
                    ev => return ev,
                }
            }
        })
        .await
        .unwrap();
        match first {
            WatchEvent::Modified(o) => assert_eq!(field(&o, "/spec/replicas"), 7),
            other => panic!("expected MODIFIED with replicas 7, got {other:?}"),
        }
    })
    .await;
}

#[tokio::test]
async fn injected_conflicts_hit_update_status_and_scale_writes_in_turn() {
    run("fault-subresources", |env| async move {
        let Some(server) = env.server.as_ref() else {
            eprintln!("skipped against a real cluster: faults cannot be injected");
            return;
        };
        let created = env
            .kcps()
            .create(&PostParams::default(), &kcp("kcp-1"))
            .await
            .unwrap();
        server.fail_next_writes(&kcps_resource(), 409, 3);
        let mut replaced = created.clone();
        replaced.data["spec"]["replicas"] = json!(5);
        let update = status_of(
            env.kcps()
                .replace("kcp-1", &PostParams::default(), &replaced)
                .await,
        );
        let status = status_of(
            env.kcps()
                .patch_status(
                    "kcp-1",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"replicas": 1}})),
                )
                .await,
        );
        let scale = status_of(
            env.kcps()
                .patch_scale("kcp-1", &PatchParams::default(), &replicas(9))
                .await,
        );
        for s in [update, status, scale] {
            assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"));
        }
        assert_eq!(server.pending_write_faults(&kcps_resource()), 0);
        let stored = env.kcps().get("kcp-1").await.unwrap();
        assert_eq!(stored.resource_version(), created.resource_version());
        assert!(field(&stored, "/status/replicas").is_null());
        // The same replace, unchanged, now goes through.
        let written = env
            .kcps()
            .replace("kcp-1", &PostParams::default(), &replaced)
            .await
            .unwrap();
        assert_eq!(field(&written, "/spec/replicas"), 5);
        assert_eq!(written.meta().generation, Some(2));
    })
    .await;
}

#[tokio::test]
async fn an_injected_create_conflict_is_already_exists_and_creates_nothing() {
    run("fault-create", |env| async move {
        let Some(server) = env.server.as_ref() else {
            eprintln!("skipped against a real cluster: faults cannot be injected");
            return;
        };
        let mut secret = Secret::default();
        secret.metadata.name = Some("creds".into());
        server.fail_next_write("secrets", 409);
        let status = status_of(env.secrets().create(&PostParams::default(), &secret).await);
        assert_eq!(
            (status.code, status.reason.as_str()),
            (409, "AlreadyExists")
        );
        assert_eq!(status.message, "secrets \"creds\" already exists");
        assert!(env.secrets().get_opt("creds").await.unwrap().is_none());
        env.secrets()
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
    })
    .await;
}

#[tokio::test]
async fn an_injected_internal_error_on_delete_keeps_the_object() {
    run("fault-internal", |env| async move {
        let Some(server) = env.server.as_ref() else {
            eprintln!("skipped against a real cluster: faults cannot be injected");
            return;
        };
        env.kcps()
            .create(&PostParams::default(), &kcp("kcp-1"))
            .await
            .unwrap();
        server.fail_next_write("KThreesControlPlane", 500);
        let status = status_of(env.kcps().delete("kcp-1", &DeleteParams::default()).await);
        assert_eq!(
            (status.code, status.reason.as_str()),
            (500, "InternalError")
        );
        assert!(env.kcps().get_opt("kcp-1").await.unwrap().is_some());
        env.kcps()
            .delete("kcp-1", &DeleteParams::default())
            .await
            .unwrap();
        assert!(env.kcps().get_opt("kcp-1").await.unwrap().is_none());
    })
    .await;
}
