//! Lists across namespaces and within one, cluster-scoped resources, paging.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};

use crate::support::*;

#[tokio::test]
async fn list_across_all_namespaces_and_within_one() {
    run("list-namespaces", |env| async move {
        let other = env.namespace("conf-list-other").await;
        let run_label = format!("run={}", env.ns);
        let labels = [("run", env.ns.as_str())];
        env.config_maps()
            .create(&PostParams::default(), &config_map("here", &labels))
            .await
            .unwrap();
        Api::<ConfigMap>::namespaced(env.client.clone(), &other)
            .create(&PostParams::default(), &config_map("there", &labels))
            .await
            .unwrap();
        let all = Api::<ConfigMap>::all(env.client.clone())
            .list(&ListParams::default().labels(&run_label))
            .await
            .unwrap();
        let found: BTreeSet<(String, String)> = all
            .items
            .iter()
            .map(|c| (c.namespace().unwrap(), c.name_any()))
            .collect();
        assert_eq!(
            found,
            BTreeSet::from([
                (env.ns.clone(), "here".into()),
                (other.clone(), "there".into())
            ])
        );
        let mine = env
            .config_maps()
            .list(&ListParams::default().labels(&run_label))
            .await
            .unwrap();
        assert_eq!(mine.items.len(), 1);
        assert_eq!(mine.items[0].name_any(), "here");
    })
    .await;
}

#[tokio::test]
async fn cluster_scoped_resources_are_served_without_namespace() {
    run("cluster-scoped", |env| async move {
        let namespaces = Api::<Namespace>::all(env.client.clone());
        let mine = namespaces.get(&env.ns).await.unwrap();
        assert!(mine.namespace().is_none());
        let listed = namespaces
            .list(&ListParams::default().fields(&format!("metadata.name={}", env.ns)))
            .await
            .unwrap();
        assert_eq!(listed.items.len(), 1);
    })
    .await;
}

#[tokio::test]
async fn list_pages_with_limit_and_continue() {
    run("paging", |env| async move {
        for i in 0..5 {
            env.config_maps()
                .create(
                    &PostParams::default(),
                    &config_map(&format!("cm-{i}"), &[("paged", "yes")]),
                )
                .await
                .unwrap();
        }
        let mut seen = Vec::new();
        let mut token: Option<String> = None;
        let mut pages = 0;
        loop {
            let mut lp = ListParams::default().labels("paged=yes").limit(2);
            if let Some(t) = &token {
                lp = lp.continue_token(t);
            }
            let page = env.config_maps().list(&lp).await.unwrap();
            assert!(page.items.len() <= 2);
            pages += 1;
            seen.extend(page.items.iter().map(|c| c.name_any()));
            token = page.metadata.continue_.filter(|t| !t.is_empty());
            if token.is_none() {
                break;
            }
            assert!(pages < 10, "paging does not terminate");
        }
        assert_eq!(pages, 3);
        assert_eq!(seen, (0..5).map(|i| format!("cm-{i}")).collect::<Vec<_>>());
    })
    .await;
}
