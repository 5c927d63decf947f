//! Label and field selectors on lists; malformed selectors.

use kube::ResourceExt;
use kube::api::{ListParams, PostParams};

use crate::support::*;

async fn names(env: &Env, lp: ListParams) -> Vec<String> {
    // A real cluster puts kube-root-ca.crt into every namespace: not ours, ignore it.
    let mut names: Vec<String> = env
        .config_maps()
        .list(&lp)
        .await
        .unwrap()
        .items
        .iter()
        .map(|c| c.name_any())
        .filter(|n| n != "kube-root-ca.crt")
        .collect();
    names.sort();
    names
}

async fn seed(env: &Env) {
    for (name, labels) in [
        ("a", vec![("app", "web"), ("tier", "front")]),
        ("b", vec![("app", "db"), ("tier", "back")]),
        ("c", vec![("app", "web")]),
    ] {
        env.config_maps()
            .create(&PostParams::default(), &config_map(name, &labels))
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn label_selectors_filter_by_equality_sets_and_existence() {
    run("label-selectors", |env| async move {
        seed(&env).await;
        let cases: &[(&str, &[&str])] = &[
            ("app=web", &["a", "c"]),
            ("app==db", &["b"]),
            ("app!=web", &["b"]),
            ("tier in (front,back)", &["a", "b"]),
            ("tier notin (front)", &["b", "c"]),
            ("tier", &["a", "b"]),
            ("!tier", &["c"]),
            ("app=web,tier", &["a"]),
            ("app in (web),!tier", &["c"]),
        ];
        for (selector, want) in cases {
            assert_eq!(
                names(&env, ListParams::default().labels(selector)).await,
                *want,
                "selector {selector:?}"
            );
        }
    })
    .await;
}

#[tokio::test]
async fn field_selectors_filter_by_name_and_namespace() {
    run("field-selectors", |env| async move {
        seed(&env).await;
        let by_ns = format!("metadata.namespace={}", env.ns);
        let cases: &[(&str, &[&str])] = &[
            ("metadata.name=a", &["a"]),
            ("metadata.name==b", &["b"]),
            ("metadata.name!=a", &["b", "c"]),
            (by_ns.as_str(), &["a", "b", "c"]),
            ("metadata.namespace!=elsewhere,metadata.name=c", &["c"]),
        ];
        for (selector, want) in cases {
            let got = names(&env, ListParams::default().fields(selector)).await;
            assert_eq!(got, *want, "selector {selector:?}");
        }
    })
    .await;
}

#[tokio::test]
async fn malformed_selectors_are_bad_request_400() {
    run("bad-selectors", |env| async move {
        for selector in ["app in (web", "app=web,,tier", "a b c"] {
            let status = status_of(
                env.config_maps()
                    .list(&ListParams::default().labels(selector))
                    .await,
            );
            assert_eq!(status.code, 400, "label selector {selector:?}");
            assert_eq!(status.reason, "BadRequest");
        }
        let status = status_of(
            env.config_maps()
                .list(&ListParams::default().fields("spec.unknown=1"))
                .await,
        );
        assert_eq!(status.code, 400);
    })
    .await;
}
