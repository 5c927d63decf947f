//! Raw watch protocol: event order, resume from a resourceVersion, initial state,
//! bookmarks, timeouts, selector transitions and 410 Gone.

use std::time::Duration;

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use kube::ResourceExt;
use kube::api::{
    DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use serde_json::json;

use crate::support::*;

type Events<K> = BoxStream<'static, Result<WatchEvent<K>, kube::Error>>;

/// Next event that is not a bookmark, within the deadline.
async fn next_change<K: Clone>(events: &mut Events<K>) -> WatchEvent<K> {
    tokio::time::timeout(DEADLINE, async {
        loop {
            match events.try_next().await.expect("watch stream error") {
                Some(WatchEvent::Bookmark(_)) => continue,
                Some(ev) => return ev,
                None => panic!("watch ended early"),
            }
        }
    })
    .await
    .expect("a watch event within the deadline")
}

fn describe<K: ResourceExt + Clone>(ev: &WatchEvent<K>) -> (String, String) {
    match ev {
        WatchEvent::Added(o) => ("ADDED".into(), o.name_any()),
        WatchEvent::Modified(o) => ("MODIFIED".into(), o.name_any()),
        WatchEvent::Deleted(o) => ("DELETED".into(), o.name_any()),
        WatchEvent::Bookmark(_) => ("BOOKMARK".into(), String::new()),
        WatchEvent::Error(e) => ("ERROR".into(), e.message.clone()),
    }
}

fn pair(kind: &str, name: &str) -> (String, String) {
    (kind.into(), name.into())
}

#[tokio::test]
async fn watch_streams_added_modified_deleted_in_order() {
    run("watch-order", |env| async move {
        let rv = env
            .kcps()
            .list(&ListParams::default())
            .await
            .unwrap()
            .metadata
            .resource_version
            .unwrap();
        let mut events: Events<_> = env
            .kcps()
            .watch(&WatchParams::default().timeout(60), &rv)
            .await
            .unwrap()
            .boxed();
        env.kcps()
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
        env.kcps()
            .delete("kcp-1", &DeleteParams::default())
            .await
            .unwrap();
        let mut seen = Vec::new();
        let mut last_rv = 0;
        for _ in 0..3 {
            let ev = next_change(&mut events).await;
            if let WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o) = &ev {
                assert!(
                    rv_of(o) > last_rv,
                    "resourceVersions increase along the stream"
                );
                last_rv = rv_of(o);
            }
            seen.push(describe(&ev));
        }
        assert_eq!(
            seen,
            vec![
                pair("ADDED", "kcp-1"),
                pair("MODIFIED", "kcp-1"),
                pair("DELETED", "kcp-1")
            ]
        );
    })
    .await;
}

#[tokio::test]
async fn watch_from_a_resource_version_replays_only_later_changes() {
    run("watch-resume", |env| async move {
        env.kcps()
            .create(&PostParams::default(), &kcp("before"))
            .await
            .unwrap();
        let mark = env
            .kcps()
            .get("before")
            .await
            .unwrap()
            .resource_version()
            .unwrap();
        env.kcps()
            .create(&PostParams::default(), &kcp("after"))
            .await
            .unwrap();
        let mut events: Events<_> = env
            .kcps()
            .watch(&WatchParams::default().timeout(60), &mark)
            .await
            .unwrap()
            .boxed();
        assert_eq!(
            describe(&next_change(&mut events).await),
            pair("ADDED", "after")
        );
    })
    .await;
}

#[tokio::test]
async fn watch_from_resource_version_zero_starts_with_current_objects() {
    run("watch-rv-zero", |env| async move {
        for name in ["kcp-a", "kcp-b"] {
            env.kcps()
                .create(&PostParams::default(), &kcp(name))
                .await
                .unwrap();
        }
        let mut events: Events<_> = env
            .kcps()
            .watch(&WatchParams::default().timeout(60), "0")
            .await
            .unwrap()
            .boxed();
        let mut first_two = vec![
            describe(&next_change(&mut events).await),
            describe(&next_change(&mut events).await),
        ];
        first_two.sort();
        assert_eq!(
            first_two,
            vec![pair("ADDED", "kcp-a"), pair("ADDED", "kcp-b")]
        );
    })
    .await;
}

#[tokio::test]
async fn watch_sends_bookmarks_when_allowed() {
    run("watch-bookmarks", |env| async move {
        let created = env
            .kcps()
            .create(&PostParams::default(), &kcp("kcp-1"))
            .await
            .unwrap();
        let rv = created.resource_version().unwrap();
        // A real server sends a bookmark shortly before the timeout; ours every second.
        let mut events: Events<_> = env
            .kcps()
            .watch(&WatchParams::default().timeout(8), &rv)
            .await
            .unwrap()
            .boxed();
        let bookmark = tokio::time::timeout(DEADLINE, async {
            loop {
                match events.try_next().await.unwrap() {
                    Some(WatchEvent::Bookmark(b)) => return b,
                    Some(_) => continue,
                    None => panic!("watch ended without a bookmark"),
                }
            }
        })
        .await
        .expect("a bookmark within the deadline");
        assert_eq!(bookmark.types.kind, "KThreesControlPlane");
        assert_eq!(bookmark.types.api_version, kcp_resource().api_version);
        let bookmark_rv: u64 = bookmark.metadata.resource_version.parse().unwrap();
        assert!(bookmark_rv >= rv_of(&created));
    })
    .await;
}

#[tokio::test]
async fn watch_timeout_seconds_ends_the_stream() {
    run("watch-timeout", |env| async move {
        let rv = env
            .kcps()
            .list(&ListParams::default())
            .await
            .unwrap()
            .metadata
            .resource_version
            .unwrap();
        let started = std::time::Instant::now();
        let mut events: Events<_> = env
            .kcps()
            .watch(&WatchParams::default().timeout(1), &rv)
            .await
            .unwrap()
            .boxed();
        tokio::time::timeout(DEADLINE, async {
            while events.try_next().await.unwrap().is_some() {}
        })
        .await
        .expect("the stream ends by itself");
        assert!(
            started.elapsed() >= Duration::from_millis(900),
            "ended after {:?}",
            started.elapsed()
        );
    })
    .await;
}

#[tokio::test]
async fn watch_label_selector_turns_an_object_that_stops_matching_into_deleted() {
    run("watch-selector", |env| async move {
        let rv = env
            .config_maps()
            .list(&ListParams::default())
            .await
            .unwrap()
            .metadata
            .resource_version
            .unwrap();
        let wp = WatchParams::default().labels("app=web").timeout(60);
        let mut events: Events<_> = env.config_maps().watch(&wp, &rv).await.unwrap().boxed();
        env.config_maps()
            .create(
                &PostParams::default(),
                &config_map("other", &[("app", "db")]),
            )
            .await
            .unwrap();
        env.config_maps()
            .create(&PostParams::default(), &config_map("cm", &[("app", "web")]))
            .await
            .unwrap();
        let relabel = |app: &str| Patch::Merge(json!({"metadata": {"labels": {"app": app}}}));
        env.config_maps()
            .patch("cm", &PatchParams::default(), &relabel("db"))
            .await
            .unwrap();
        env.config_maps()
            .patch("cm", &PatchParams::default(), &relabel("web"))
            .await
            .unwrap();
        let mut seen = Vec::new();
        for _ in 0..3 {
            seen.push(describe(&next_change(&mut events).await));
        }
        assert_eq!(
            seen,
            vec![
                pair("ADDED", "cm"),
                pair("DELETED", "cm"),
                pair("ADDED", "cm")
            ]
        );
    })
    .await;
}

#[tokio::test]
async fn watch_from_a_too_old_resource_version_is_gone_410() {
    run("watch-gone", |env| async move {
        let old = env
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
        // Locally we drop the history; a real cluster has compacted revision 1 long ago.
        let from = if env.compact() {
            old.resource_version().unwrap()
        } else {
            "1".to_string()
        };
        let code = match env
            .kcps()
            .watch(&WatchParams::default().timeout(30), &from)
            .await
        {
            Err(kube::Error::Api(status)) => status.code,
            Err(other) => panic!("unexpected error {other:?}"),
            Ok(stream) => {
                let mut events: Events<_> = stream.boxed();
                match next_change(&mut events).await {
                    WatchEvent::Error(status) => status.code,
                    other => panic!("expected an ERROR event, got {:?}", describe(&other)),
                }
            }
        };
        assert_eq!(code, 410);
    })
    .await;
}

/// `expire_watches` (local only) ends every open watch as a real server ends
/// one whose revision was compacted: one ERROR event carrying a 410 `Status`
/// (reason Expired, `too old resource version: N (M)`), then end of stream.
#[tokio::test]
async fn expired_open_watch_ends_with_one_410_error_event() {
    run("watch-expired", |env| async move {
        let Some(server) = env.server.as_ref() else {
            eprintln!("skipped against a real cluster: its watches cannot be expired on demand");
            return;
        };
        let created = env
            .kcps()
            .create(&PostParams::default(), &kcp("kcp-1"))
            .await
            .unwrap();
        let mut events: Events<_> = env
            .kcps()
            .watch(
                &WatchParams::default().timeout(60),
                &created.resource_version().unwrap(),
            )
            .await
            .unwrap()
            .boxed();
        server.expire_watches();
        let status = match next_change(&mut events).await {
            WatchEvent::Error(status) => status,
            other => panic!("expected an ERROR event, got {:?}", describe(&other)),
        };
        assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
        assert!(
            status.message.starts_with("too old resource version: "),
            "{}",
            status.message
        );
        let rest = tokio::time::timeout(DEADLINE, events.try_collect::<Vec<_>>())
            .await
            .expect("the stream ends after the ERROR event")
            .unwrap();
        assert!(
            rest.iter().all(|e| matches!(e, WatchEvent::Bookmark(_))),
            "nothing but bookmarks after the ERROR event"
        );
    })
    .await;
}

#[tokio::test]
async fn watch_across_all_namespaces_sees_every_namespace() {
    run("watch-all-namespaces", |env| async move {
        let other = env.namespace("conf-watch-other").await;
        let label = format!("run={}", env.ns);
        let all: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
            kube::Api::all(env.client.clone());
        let rv = all
            .list(&ListParams::default().labels(&label))
            .await
            .unwrap()
            .metadata
            .resource_version
            .unwrap();
        let mut events: Events<_> = all
            .watch(&WatchParams::default().labels(&label).timeout(60), &rv)
            .await
            .unwrap()
            .boxed();
        let labels = [("run", env.ns.as_str())];
        env.config_maps()
            .create(&PostParams::default(), &config_map("here", &labels))
            .await
            .unwrap();
        kube::Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(env.client.clone(), &other)
            .create(&PostParams::default(), &config_map("there", &labels))
            .await
            .unwrap();
        let mut seen = Vec::new();
        for _ in 0..2 {
            match next_change(&mut events).await {
                WatchEvent::Added(cm) => seen.push((cm.namespace().unwrap(), cm.name_any())),
                other => panic!("expected ADDED, got {:?}", describe(&other)),
            }
        }
        assert_eq!(
            seen,
            vec![
                (env.ns.clone(), "here".to_string()),
                (other, "there".to_string())
            ]
        );
    })
    .await;
}

#[tokio::test]
async fn watch_delivers_every_change_of_a_burst_in_order() {
    run("watch-burst", |env| async move {
        let rv = env
            .config_maps()
            .list(&ListParams::default())
            .await
            .unwrap()
            .metadata
            .resource_version
            .unwrap();
        let mut events: Events<_> = env
            .config_maps()
            .watch(&WatchParams::default().labels("burst").timeout(60), &rv)
            .await
            .unwrap()
            .boxed();
        let writers = (0..4).map(|w| {
            let api = env.config_maps();
            async move {
                for i in 0..25 {
                    api.create(
                        &PostParams::default(),
                        &config_map(&format!("cm-{w}-{i}"), &[("burst", "yes")]),
                    )
                    .await
                    .unwrap();
                }
            }
        });
        futures::future::join_all(writers).await;
        let mut seen = std::collections::BTreeSet::new();
        let mut last_rv = 0;
        while seen.len() < 100 {
            match next_change(&mut events).await {
                WatchEvent::Added(cm) => {
                    assert!(
                        rv_of(&cm) > last_rv,
                        "events arrive in resourceVersion order"
                    );
                    last_rv = rv_of(&cm);
                    assert!(seen.insert(cm.name_any()), "each object is announced once");
                }
                other => panic!("expected only ADDED, got {:?}", describe(&other)),
            }
        }
    })
    .await;
}
