//! DELETE, finalizers and deletionTimestamp, owner-reference garbage collection.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{
    DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::{Resource, ResourceExt};
use serde_json::json;

use futures::{StreamExt, TryStreamExt};

use crate::support::*;

fn held(name: &str) -> kube::api::DynamicObject {
    let mut obj = kcp(name);
    obj.finalizers_mut().push(HOLD.into());
    obj
}

fn owned_by(owner: &kube::api::DynamicObject, name: &str) -> k8s_openapi::api::core::v1::ConfigMap {
    let mut cm = config_map(name, &[]);
    cm.metadata.owner_references = Some(vec![OwnerReference {
        api_version: kcp_resource().api_version,
        kind: kcp_resource().kind,
        name: owner.name_any(),
        uid: owner.uid().unwrap(),
        ..Default::default()
    }]);
    cm
}

#[tokio::test]
async fn delete_without_finalizers_removes_the_object() {
    run("delete-plain", |env| async move {
        env.kcps()
            .create(&PostParams::default(), &kcp("kcp-1"))
            .await
            .unwrap();
        env.kcps()
            .delete("kcp-1", &DeleteParams::default())
            .await
            .unwrap();
        eventually("kcp-1 to be gone", || async {
            env.kcps()
                .get_opt("kcp-1")
                .await
                .unwrap()
                .is_none()
                .then_some(())
        })
        .await;
        let status = status_of(env.kcps().delete("kcp-1", &DeleteParams::default()).await);
        assert_eq!(status.code, 404);
    })
    .await;
}

#[tokio::test]
async fn delete_with_finalizers_sets_deletion_timestamp_and_keeps_the_object() {
    run("delete-finalizers", |env| async move {
        env.kcps()
            .create(&PostParams::default(), &held("kcp-1"))
            .await
            .unwrap();
        let answer = env
            .kcps()
            .delete("kcp-1", &DeleteParams::default())
            .await
            .unwrap();
        let marked = answer
            .left()
            .expect("a held object is returned, not a Status");
        assert!(marked.meta().deletion_timestamp.is_some());
        let stored = env.kcps().get("kcp-1").await.unwrap();
        assert!(stored.meta().deletion_timestamp.is_some());
        assert_eq!(stored.meta().deletion_grace_period_seconds, Some(0));
        assert_eq!(stored.finalizers(), &[HOLD.to_string()]);
    })
    .await;
}

#[tokio::test]
async fn removing_the_last_finalizer_of_a_deleted_object_deletes_it() {
    run("last-finalizer", |env| async move {
        env.kcps()
            .create(&PostParams::default(), &held("kcp-1"))
            .await
            .unwrap();
        env.kcps()
            .delete("kcp-1", &DeleteParams::default())
            .await
            .unwrap();
        let marked = env.kcps().get("kcp-1").await.unwrap();
        let mut events = env
            .kcps()
            .watch(
                &WatchParams::default().timeout(30),
                &marked.resource_version().unwrap(),
            )
            .await
            .unwrap()
            .boxed();
        env.kcps()
            .patch(
                "kcp-1",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await
            .unwrap();
        let deleted = tokio::time::timeout(DEADLINE, async {
            while let Some(ev) = events.try_next().await.unwrap() {
                if let WatchEvent::Deleted(obj) = ev {
                    return obj;
                }
            }
            panic!("watch ended before the DELETED event");
        })
        .await
        .expect("a DELETED event within the deadline");
        assert_eq!(deleted.name_any(), "kcp-1");
        assert!(env.kcps().get_opt("kcp-1").await.unwrap().is_none());
    })
    .await;
}

#[tokio::test]
async fn adding_a_finalizer_to_a_deleted_object_is_invalid_422() {
    run("finalizer-after-delete", |env| async move {
        env.kcps()
            .create(&PostParams::default(), &held("kcp-1"))
            .await
            .unwrap();
        env.kcps()
            .delete("kcp-1", &DeleteParams::default())
            .await
            .unwrap();
        let patch =
            json!({"metadata": {"finalizers": [HOLD, "conformance.k3s-control-plane.io/late"]}});
        let status = status_of(
            env.kcps()
                .patch("kcp-1", &PatchParams::default(), &Patch::Merge(patch))
                .await,
        );
        assert_eq!(status.code, 422);
        assert_eq!(status.reason, "Invalid");
    })
    .await;
}

#[tokio::test]
async fn deleting_an_owner_garbage_collects_its_dependents() {
    run("owner-gc", |env| async move {
        let owner = env
            .kcps()
            .create(&PostParams::default(), &kcp("kcp-1"))
            .await
            .unwrap();
        env.config_maps()
            .create(&PostParams::default(), &owned_by(&owner, "dependent"))
            .await
            .unwrap();
        let mut guarded = owned_by(&owner, "guarded");
        guarded.metadata.finalizers = Some(vec![HOLD.into()]);
        env.config_maps()
            .create(&PostParams::default(), &guarded)
            .await
            .unwrap();
        env.kcps()
            .delete("kcp-1", &DeleteParams::background())
            .await
            .unwrap();
        eventually("the dependent to be collected", || async {
            env.config_maps()
                .get_opt("dependent")
                .await
                .unwrap()
                .is_none()
                .then_some(())
        })
        .await;
        eventually(
            "the guarded dependent to be marked for deletion",
            || async {
                env.config_maps()
                    .get("guarded")
                    .await
                    .unwrap()
                    .metadata
                    .deletion_timestamp
                    .map(|_| ())
            },
        )
        .await;
    })
    .await;
}

#[tokio::test]
async fn orphan_propagation_keeps_dependents_without_the_owner_reference() {
    run("orphan", |env| async move {
        let owner = env
            .kcps()
            .create(&PostParams::default(), &kcp("kcp-1"))
            .await
            .unwrap();
        env.config_maps()
            .create(&PostParams::default(), &owned_by(&owner, "dependent"))
            .await
            .unwrap();
        env.kcps()
            .delete("kcp-1", &DeleteParams::orphan())
            .await
            .unwrap();
        eventually(
            "the owner to be gone and the dependent orphaned",
            || async {
                let owner_gone = env.kcps().get_opt("kcp-1").await.unwrap().is_none();
                let dependent = env.config_maps().get("dependent").await.unwrap();
                (owner_gone && dependent.owner_references().is_empty()).then_some(())
            },
        )
        .await;
    })
    .await;
}

#[tokio::test]
async fn delete_collection_removes_objects_matching_the_selector() {
    run("delete-collection", |env| async move {
        for (name, group) in [("a", "x"), ("b", "x"), ("c", "y")] {
            env.config_maps()
                .create(
                    &PostParams::default(),
                    &config_map(name, &[("group", group)]),
                )
                .await
                .unwrap();
        }
        env.config_maps()
            .delete_collection(
                &DeleteParams::default(),
                &ListParams::default().labels("group=x"),
            )
            .await
            .unwrap();
        let left = eventually("matching config maps to be gone", || async {
            let names: Vec<String> = env
                .config_maps()
                .list(&ListParams::default().labels("group"))
                .await
                .unwrap()
                .items
                .iter()
                .map(|c| c.name_any())
                .collect();
            (names.len() == 1).then_some(names)
        })
        .await;
        assert_eq!(left, vec!["c".to_string()]);
    })
    .await;
}

#[tokio::test]
async fn delete_with_a_stale_resource_version_precondition_is_conflict_409() {
    run("delete-precondition", |env| async move {
        let created = env
            .kcps()
            .create(&PostParams::default(), &kcp("kcp-1"))
            .await
            .unwrap();
        env.kcps()
            .patch(
                "kcp-1",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": 5}})),
            )
            .await
            .unwrap();
        let dp = DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                resource_version: created.resource_version(),
                uid: None,
            }),
            ..DeleteParams::default()
        };
        let status = status_of(env.kcps().delete("kcp-1", &dp).await);
        assert_eq!(status.code, 409);
        assert!(env.kcps().get_opt("kcp-1").await.unwrap().is_some());
    })
    .await;
}

#[tokio::test]
async fn foreground_deletion_keeps_the_owner_until_blocking_dependents_are_gone() {
    run("foreground", |env| async move {
        let owner = env
            .kcps()
            .create(&PostParams::default(), &kcp("kcp-1"))
            .await
            .unwrap();
        let mut blocking = owned_by(&owner, "blocking");
        blocking.metadata.owner_references.as_mut().unwrap()[0].block_owner_deletion = Some(true);
        blocking.metadata.finalizers = Some(vec![HOLD.into()]);
        env.config_maps()
            .create(&PostParams::default(), &blocking)
            .await
            .unwrap();
        env.kcps()
            .delete("kcp-1", &DeleteParams::foreground())
            .await
            .unwrap();
        eventually(
            "the blocking dependent to be marked for deletion",
            || async {
                env.config_maps()
                    .get("blocking")
                    .await
                    .unwrap()
                    .metadata
                    .deletion_timestamp
                    .map(|_| ())
            },
        )
        .await;
        let waiting = env.kcps().get("kcp-1").await.unwrap();
        assert!(waiting.meta().deletion_timestamp.is_some());
        assert!(
            waiting
                .finalizers()
                .iter()
                .any(|f| f == "foregroundDeletion")
        );
        env.config_maps()
            .patch(
                "blocking",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await
            .unwrap();
        eventually(
            "the owner to go once its blocking dependent is gone",
            || async {
                env.kcps()
                    .get_opt("kcp-1")
                    .await
                    .unwrap()
                    .is_none()
                    .then_some(())
            },
        )
        .await;
    })
    .await;
}

#[tokio::test]
async fn deleting_a_namespace_empties_it_and_refuses_new_content_while_terminating() {
    run("namespace-termination", |env| async move {
        let doomed = env.namespace("conf-doomed").await;
        let cms: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
            kube::Api::namespaced(env.client.clone(), &doomed);
        cms.create(&PostParams::default(), &config_map("plain", &[]))
            .await
            .unwrap();
        let mut held_cm = config_map("held", &[]);
        held_cm.metadata.finalizers = Some(vec![HOLD.into()]);
        cms.create(&PostParams::default(), &held_cm).await.unwrap();
        let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> =
            kube::Api::all(env.client.clone());
        namespaces
            .delete(&doomed, &DeleteParams::default())
            .await
            .unwrap();
        eventually(
            "the namespace to terminate and its plain content to go",
            || async {
                let ns = namespaces.get(&doomed).await.unwrap();
                let terminating = ns.status.and_then(|s| s.phase).as_deref() == Some("Terminating");
                let plain_gone = cms.get_opt("plain").await.unwrap().is_none();
                (terminating && plain_gone).then_some(())
            },
        )
        .await;
        let status = status_of(
            cms.create(&PostParams::default(), &config_map("late", &[]))
                .await,
        );
        assert_eq!(status.code, 403);
        assert_eq!(status.reason, "Forbidden");
        cms.patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
        eventually("the namespace to go once empty", || async {
            namespaces
                .get_opt(&doomed)
                .await
                .unwrap()
                .is_none()
                .then_some(())
        })
        .await;
    })
    .await;
}
