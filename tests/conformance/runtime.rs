//! kube-runtime on top of the server, unchanged: watcher, reflector, Controller, event Recorder.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::{Controller, reflector, watcher};
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::support::*;

type WatcherEvents = BoxStream<'static, watcher::Result<watcher::Event<DynamicObject>>>;

/// Read watcher events until `done` says so, failing after the deadline.
async fn watch_until(
    events: &mut WatcherEvents,
    mut done: impl FnMut(&watcher::Result<watcher::Event<DynamicObject>>) -> bool,
) {
    tokio::time::timeout(DEADLINE, async {
        loop {
            let ev = events.next().await.expect("the watcher stream never ends");
            if done(&ev) {
                return;
            }
        }
    })
    .await
    .expect("the expected watcher event within the deadline");
}

fn is_apply(
    ev: &watcher::Result<watcher::Event<DynamicObject>>,
    name: &str,
    replicas: i64,
) -> bool {
    matches!(ev, Ok(watcher::Event::Apply(o)) if o.name_any() == name && field(o, "/spec/replicas") == replicas)
}

#[tokio::test]
async fn kube_runtime_watcher_sees_added_modified_and_deleted() {
    run("runtime-watcher", |env| async move {
        let mut events: WatcherEvents = watcher(env.kcps(), watcher::Config::default()).boxed();
        watch_until(&mut events, |ev| matches!(ev, Ok(watcher::Event::InitDone))).await;
        env.kcps()
            .create(&PostParams::default(), &kcp("kcp-1"))
            .await
            .unwrap();
        watch_until(&mut events, |ev| is_apply(ev, "kcp-1", 3)).await;
        env.kcps()
            .patch(
                "kcp-1",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": 5}})),
            )
            .await
            .unwrap();
        watch_until(&mut events, |ev| is_apply(ev, "kcp-1", 5)).await;
        env.kcps()
            .delete("kcp-1", &DeleteParams::default())
            .await
            .unwrap();
        watch_until(
            &mut events,
            |ev| matches!(ev, Ok(watcher::Event::Delete(o)) if o.name_any() == "kcp-1"),
        )
        .await;
    })
    .await;
}

#[tokio::test]
async fn kube_runtime_watcher_recovers_from_gone_by_relisting() {
    run("runtime-watcher-gone", |env| async move {
        let Some(server) = env.server.as_ref() else {
            eprintln!(
                "skipped against a real cluster: its watch history cannot be expired on demand"
            );
            return;
        };
        let mut events: WatcherEvents = watcher(env.kcps(), watcher::Config::default()).boxed();
        watch_until(&mut events, |ev| matches!(ev, Ok(watcher::Event::InitDone))).await;
        env.kcps()
            .create(&PostParams::default(), &kcp("kcp-1"))
            .await
            .unwrap();
        watch_until(&mut events, |ev| is_apply(ev, "kcp-1", 3)).await;
        server.expire_watches();
        env.kcps()
            .create(&PostParams::default(), &kcp("kcp-2"))
            .await
            .unwrap();
        watch_until(
            &mut events,
            |ev| matches!(ev, Err(watcher::Error::WatchError(status)) if status.code == 410),
        )
        .await;
        let mut relisted = Vec::new();
        watch_until(&mut events, |ev| match ev {
            Ok(watcher::Event::InitApply(o)) => {
                relisted.push(o.name_any());
                false
            }
            Ok(watcher::Event::InitDone) => true,
            _ => false,
        })
        .await;
        relisted.sort();
        assert_eq!(relisted, vec!["kcp-1".to_string(), "kcp-2".to_string()]);
        // After the re-list the watcher watches again: later changes arrive.
        env.kcps()
            .patch(
                "kcp-2",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": 5}})),
            )
            .await
            .unwrap();
        watch_until(&mut events, |ev| is_apply(ev, "kcp-2", 5)).await;
    })
    .await;
}

#[tokio::test]
async fn kube_runtime_watcher_with_streaming_lists_gets_initial_state() {
    run("runtime-streaming-list", |env| async move {
        env.kcps()
            .create(&PostParams::default(), &kcp("kcp-1"))
            .await
            .unwrap();
        let mut events: WatcherEvents =
            watcher(env.kcps(), watcher::Config::default().streaming_lists()).boxed();
        let mut initial = Vec::new();
        watch_until(&mut events, |ev| match ev {
            Ok(watcher::Event::InitApply(o)) => {
                initial.push(o.name_any());
                false
            }
            Ok(watcher::Event::InitDone) => true,
            _ => false,
        })
        .await;
        assert_eq!(initial, vec!["kcp-1".to_string()]);
        env.kcps()
            .create(&PostParams::default(), &kcp("kcp-2"))
            .await
            .unwrap();
        watch_until(&mut events, |ev| is_apply(ev, "kcp-2", 3)).await;
    })
    .await;
}

#[tokio::test]
async fn kube_runtime_reflector_store_mirrors_objects() {
    run("runtime-reflector", |env| async move {
        let writer = reflector::store::Writer::<DynamicObject>::new(kcp_resource());
        let reader = writer.as_reader();
        let stream = reflector(writer, watcher(env.kcps(), watcher::Config::default()));
        let task = tokio::spawn(stream.for_each(|_| async {}));
        env.kcps()
            .create(&PostParams::default(), &kcp("kcp-1"))
            .await
            .unwrap();
        env.kcps()
            .create(&PostParams::default(), &kcp("kcp-2"))
            .await
            .unwrap();
        eventually("both objects in the store", || async {
            (reader.state().len() == 2).then_some(())
        })
        .await;
        env.kcps()
            .delete("kcp-1", &DeleteParams::default())
            .await
            .unwrap();
        eventually("kcp-1 to leave the store", || async {
            let names: Vec<String> = reader.state().iter().map(|o| o.name_any()).collect();
            (names == ["kcp-2"]).then_some(())
        })
        .await;
        task.abort();
    })
    .await;
}

#[derive(Debug, thiserror::Error)]
#[error("never")]
struct Never;

#[tokio::test]
async fn kube_runtime_controller_reconciles_each_object_and_each_change() {
    run("runtime-controller", |env| async move {
        let seen: Arc<Mutex<BTreeMap<String, i64>>> = Arc::default();
        let controller = Controller::new_with(
            env.kcps(),
            watcher::Config::default(),
            kcp_resource(),
        )
        .run(
            |obj: Arc<DynamicObject>, seen: Arc<Arc<Mutex<BTreeMap<String, i64>>>>| async move {
                let generation = obj.meta().generation.unwrap_or(0);
                seen.lock().unwrap().insert(obj.name_any(), generation);
                Ok::<_, Never>(Action::await_change())
            },
            |_, _: &Never, _| Action::requeue(Duration::from_secs(1)),
            Arc::new(seen.clone()),
        )
        .for_each(|_| async {});
        let task = tokio::spawn(controller);
        env.kcps()
            .create(&PostParams::default(), &kcp("kcp-1"))
            .await
            .unwrap();
        env.kcps()
            .create(&PostParams::default(), &kcp("kcp-2"))
            .await
            .unwrap();
        eventually("both objects reconciled", || async {
            (seen.lock().unwrap().len() == 2).then_some(())
        })
        .await;
        env.kcps()
            .patch(
                "kcp-1",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": 5}})),
            )
            .await
            .unwrap();
        eventually("the change reconciled", || async {
            (seen.lock().unwrap().get("kcp-1") == Some(&2)).then_some(())
        })
        .await;
        task.abort();
    })
    .await;
}

#[tokio::test]
async fn kube_runtime_event_recorder_publishes_and_aggregates_events() {
    run("runtime-recorder", |env| async move {
        let obj = env
            .kcps()
            .create(&PostParams::default(), &kcp("kcp-1"))
            .await
            .unwrap();
        let recorder = Recorder::new(
            env.client.clone(),
            Reporter {
                controller: "conformance".into(),
                instance: Some("test".into()),
            },
        );
        let event = Event {
            type_: EventType::Normal,
            reason: "ConformanceCheck".into(),
            note: Some("recorded by the conformance suite".into()),
            action: "Check".into(),
            secondary: None,
        };
        let reference = obj.object_ref(&kcp_resource());
        recorder.publish(&event, &reference).await.unwrap();
        recorder.publish(&event, &reference).await.unwrap();
        let events: Api<K8sEvent> = Api::namespaced(env.client.clone(), &env.ns);
        let found = eventually("the event to be listed", || async {
            events
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("ConformanceCheck"))
        })
        .await;
        assert_eq!(
            found.regarding.as_ref().and_then(|r| r.name.as_deref()),
            Some("kcp-1")
        );
        assert_eq!(found.series.map(|s| s.count), Some(2));
        let _ = events
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await;
    })
    .await;
}

#[tokio::test]
async fn metadata_only_requests_and_metadata_watcher_get_partial_object_metadata() {
    run("runtime-metadata", |env| async move {
        // kube 5: an Api over PartialObjectMeta makes metadata-only requests.
        let metas: Api<kube::core::PartialObjectMeta<DynamicObject>> =
            Api::namespaced_with(env.client.clone(), &env.ns, &kcp_resource());
        let mut events = watcher(metas, watcher::Config::default()).boxed();
        env.kcps()
            .create(&PostParams::default(), &kcp("kcp-1"))
            .await
            .unwrap();
        let meta = env.kcps().get_metadata("kcp-1").await.unwrap();
        assert_eq!(
            meta.types.as_ref().map(|t| t.kind.as_str()),
            Some("PartialObjectMetadata")
        );
        assert_eq!(meta.metadata.name.as_deref(), Some("kcp-1"));
        let list = env
            .kcps()
            .list_metadata(&ListParams::default())
            .await
            .unwrap();
        assert_eq!(list.items.len(), 1);
        assert_eq!(
            list.items[0].types.as_ref().map(|t| t.kind.as_str()),
            Some("PartialObjectMetadata")
        );
        tokio::time::timeout(DEADLINE, async {
            loop {
                match events.next().await.expect("the watcher stream never ends") {
                    Ok(watcher::Event::Apply(m) | watcher::Event::InitApply(m))
                        if m.name_any() == "kcp-1" =>
                    {
                        assert_eq!(
                            m.types.as_ref().map(|t| t.kind.as_str()),
                            Some("PartialObjectMetadata")
                        );
                        return;
                    }
                    _ => continue,
                }
            }
        })
        .await
        .expect("the metadata watcher sees kcp-1");
    })
    .await;
}
