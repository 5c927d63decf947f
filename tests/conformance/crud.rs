//! Create, get, replace: server-set fields, resourceVersion, conflicts, generation, names.

use kube::api::{ListParams, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn create_sets_uid_creation_timestamp_generation_and_resource_version() {
    run("create-sets-server-fields", |env| async move {
        let created = env
            .kcps()
            .create(&PostParams::default(), &kcp("kcp-1"))
            .await
            .unwrap();
        assert!(created.uid().is_some_and(|u| !u.is_empty()));
        assert!(created.creation_timestamp().is_some());
        assert_eq!(created.meta().generation, Some(1));
        assert!(rv_of(&created) > 0);
        assert_eq!(created.namespace().as_deref(), Some(env.ns.as_str()));
        let fetched = env.kcps().get("kcp-1").await.unwrap();
        assert_eq!(fetched.uid(), created.uid());
        assert_eq!(fetched.resource_version(), created.resource_version());
        assert_eq!(field(&fetched, "/spec/version"), "v1.30.2+k3s2");
    })
    .await;
}

#[tokio::test]
async fn create_of_existing_name_is_already_exists_409() {
    run("create-existing", |env| async move {
        env.kcps()
            .create(&PostParams::default(), &kcp("kcp-1"))
            .await
            .unwrap();
        let status = status_of(
            env.kcps()
                .create(&PostParams::default(), &kcp("kcp-1"))
                .await,
        );
        assert_eq!(status.code, 409);
        assert_eq!(status.reason, "AlreadyExists");
        assert_eq!(
            status.message,
            format!("kthreescontrolplanes.{KCP_GROUP} \"kcp-1\" already exists")
        );
    })
    .await;
}

#[tokio::test]
async fn generate_name_creates_distinct_names_with_the_prefix() {
    run("generate-name", |env| async move {
        let mut template = kcp("");
        template.metadata.name = None;
        template.metadata.generate_name = Some("kcp-".into());
        let a = env
            .kcps()
            .create(&PostParams::default(), &template)
            .await
            .unwrap();
        let b = env
            .kcps()
            .create(&PostParams::default(), &template)
            .await
            .unwrap();
        assert!(a.name_any().starts_with("kcp-") && a.name_any().len() > 4);
        assert_ne!(a.name_any(), b.name_any());
    })
    .await;
}

#[tokio::test]
async fn namespace_comes_from_the_url_and_a_different_one_is_bad_request_400() {
    run("namespace-from-url", |env| async move {
        let created = env
            .config_maps()
            .create(&PostParams::default(), &config_map("cm", &[]))
            .await
            .unwrap();
        assert_eq!(created.namespace().as_deref(), Some(env.ns.as_str()));
        let mut elsewhere = config_map("cm-2", &[]);
        elsewhere.metadata.namespace = Some("some-other-namespace".into());
        let status = status_of(
            env.config_maps()
                .create(&PostParams::default(), &elsewhere)
                .await,
        );
        assert_eq!(status.code, 400);
        assert_eq!(status.reason, "BadRequest");
    })
    .await;
}

#[tokio::test]
async fn invalid_name_is_invalid_422() {
    run("invalid-name", |env| async move {
        let status = status_of(
            env.kcps()
                .create(&PostParams::default(), &kcp("Not_A_Name"))
                .await,
        );
        assert_eq!(status.code, 422);
        assert_eq!(status.reason, "Invalid");
    })
    .await;
}

#[tokio::test]
async fn replace_with_stale_resource_version_is_conflict_409() {
    run("replace-stale", |env| async move {
        let created = env
            .kcps()
            .create(&PostParams::default(), &kcp("kcp-1"))
            .await
            .unwrap();
        let mut first = created.clone();
        first.data["spec"]["replicas"] = json!(5);
        let replaced = env
            .kcps()
            .replace("kcp-1", &PostParams::default(), &first)
            .await
            .unwrap();
        assert!(rv_of(&replaced) > rv_of(&created));
        let mut stale = created.clone();
        stale.data["spec"]["replicas"] = json!(1);
        let status = status_of(
            env.kcps()
                .replace("kcp-1", &PostParams::default(), &stale)
                .await,
        );
        assert_eq!(status.code, 409);
        assert_eq!(status.reason, "Conflict");
        assert!(
            status.message.contains("the object has been modified"),
            "{}",
            status.message
        );
        assert_eq!(
            field(&env.kcps().get("kcp-1").await.unwrap(), "/spec/replicas"),
            5
        );
    })
    .await;
}

#[tokio::test]
async fn generation_bumps_on_spec_changes_only() {
    run("generation", |env| async move {
        let created = env
            .kcps()
            .create(&PostParams::default(), &kcp("kcp-1"))
            .await
            .unwrap();
        let mut labelled = created.clone();
        labelled.labels_mut().insert("team".into(), "a".into());
        let labelled = env
            .kcps()
            .replace("kcp-1", &PostParams::default(), &labelled)
            .await
            .unwrap();
        assert_eq!(
            labelled.meta().generation,
            Some(1),
            "a metadata change keeps the generation"
        );
        assert!(rv_of(&labelled) > rv_of(&created));
        let mut scaled = labelled.clone();
        scaled.data["spec"]["replicas"] = json!(5);
        let scaled = env
            .kcps()
            .replace("kcp-1", &PostParams::default(), &scaled)
            .await
            .unwrap();
        assert_eq!(
            scaled.meta().generation,
            Some(2),
            "a spec change bumps the generation"
        );
    })
    .await;
}

#[tokio::test]
async fn unchanged_replace_keeps_the_resource_version() {
    run("noop-replace", |env| async move {
        let created = env
            .kcps()
            .create(&PostParams::default(), &kcp("kcp-1"))
            .await
            .unwrap();
        let again = env
            .kcps()
            .replace("kcp-1", &PostParams::default(), &created)
            .await
            .unwrap();
        assert_eq!(again.resource_version(), created.resource_version());
    })
    .await;
}

#[tokio::test]
async fn resource_version_of_a_list_is_at_least_that_of_its_items() {
    run("list-rv", |env| async move {
        let created = env
            .kcps()
            .create(&PostParams::default(), &kcp("kcp-1"))
            .await
            .unwrap();
        let list = env.kcps().list(&ListParams::default()).await.unwrap();
        let list_rv: u64 = list.metadata.resource_version.unwrap().parse().unwrap();
        assert!(list_rv >= rv_of(&created));
        assert_eq!(list.items.len(), 1);
    })
    .await;
}

#[tokio::test]
async fn create_in_a_missing_namespace_is_not_found_404() {
    run("missing-namespace", |env| async move {
        let missing = format!("{}-missing", env.ns);
        let cms: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
            kube::Api::namespaced(env.client.clone(), &missing);
        let status = status_of(
            cms.create(&PostParams::default(), &config_map("cm", &[]))
                .await,
        );
        assert_eq!(status.code, 404);
        assert_eq!(
            status.message,
            format!("namespaces \"{missing}\" not found")
        );
    })
    .await;
}

#[tokio::test]
async fn secret_string_data_is_stored_as_base64_data_with_default_type() {
    run("secret-string-data", |env| async move {
        let mut secret = k8s_openapi::api::core::v1::Secret::default();
        secret.metadata.name = Some("creds".into());
        secret.string_data = Some([("password".to_string(), "hunter2".to_string())].into());
        env.secrets()
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
        let stored = env.secrets().get("creds").await.unwrap();
        assert!(stored.string_data.is_none());
        let data = stored.data.expect("data is filled from stringData");
        assert_eq!(
            data.get("password").map(|b| b.0.as_slice()),
            Some(b"hunter2".as_slice())
        );
        assert_eq!(stored.type_.as_deref(), Some("Opaque"));
    })
    .await;
}

#[tokio::test]
async fn create_with_a_resource_version_set_is_refused_500() {
    run("create-with-rv", |env| async move {
        let created = env
            .kcps()
            .create(&PostParams::default(), &kcp("kcp-1"))
            .await
            .unwrap();
        let mut copy = kcp("kcp-2");
        copy.metadata.resource_version = created.resource_version();
        let status = status_of(env.kcps().create(&PostParams::default(), &copy).await);
        assert_eq!(status.code, 500);
        assert_eq!(
            status.message,
            "resourceVersion should not be set on objects to be created"
        );
    })
    .await;
}

#[tokio::test]
async fn concurrent_replaces_from_one_resource_version_let_exactly_one_win() {
    run("concurrent-replace", |env| async move {
        let created = env
            .kcps()
            .create(&PostParams::default(), &kcp("kcp-1"))
            .await
            .unwrap();
        let attempts = (1..=5).map(|replicas| {
            let (api, mut obj) = (env.kcps(), created.clone());
            obj.data["spec"]["replicas"] = json!(replicas);
            async move { api.replace("kcp-1", &PostParams::default(), &obj).await }
        });
        let results = futures::future::join_all(attempts).await;
        let wins = results.iter().filter(|r| r.is_ok()).count();
        let conflicts = results
            .iter()
            .filter(|r| matches!(r, Err(kube::Error::Api(s)) if s.code == 409))
            .count();
        assert_eq!((wins, conflicts), (1, 4));
    })
    .await;
}

/// The generic registry (`Store.Update`) accepts a PUT without
/// `metadata.resourceVersion` only when the strategy's
/// `AllowUnconditionalUpdate()` is true: built-ins such as ConfigMap, not
/// custom resources. The error names the resource (plural), not the Kind.
#[tokio::test]
async fn replace_without_resource_version_is_invalid_422_for_a_custom_resource() {
    run("replace-unconditional-cr", |env| async move {
        env.kcps()
            .create(&PostParams::default(), &kcp("kcp-1"))
            .await
            .unwrap();
        let mut blind = kcp("kcp-1");
        blind.data["spec"]["replicas"] = json!(5);
        let main = status_of(
            env.kcps()
                .replace("kcp-1", &PostParams::default(), &blind)
                .await,
        );
        blind.data["status"] = json!({"replicas": 5});
        let status = status_of(
            env.kcps()
                .replace_status("kcp-1", &PostParams::default(), &blind)
                .await,
        );
        for status in [main, status] {
            assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"));
            assert!(
                status.message.starts_with(&format!(
                    "kthreescontrolplanes.{KCP_GROUP} \"kcp-1\" is invalid: metadata.resourceVersion: Invalid value: "
                )) && status.message.ends_with("must be specified for an update"),
                "{}",
                status.message
            );
            let details = status.details.expect("Invalid carries details");
            assert_eq!(
                (details.name.as_str(), details.group.as_str(), details.kind.as_str()),
                ("kcp-1", KCP_GROUP, "kthreescontrolplanes")
            );
            assert_eq!(details.causes.len(), 1, "{:?}", details.causes);
            assert_eq!(details.causes[0].field, "metadata.resourceVersion");
            assert_eq!(details.causes[0].reason, "FieldValueInvalid");
        }
        let stored = env.kcps().get("kcp-1").await.unwrap();
        assert_eq!(field(&stored, "/spec/replicas"), 3, "nothing was written");
        assert!(field(&stored, "/status/replicas").is_null());
        assert_eq!(stored.meta().generation, Some(1));
    })
    .await;
}

#[tokio::test]
async fn replace_without_resource_version_is_unconditional_for_a_config_map() {
    run("replace-unconditional-cm", |env| async move {
        let created = env
            .config_maps()
            .create(&PostParams::default(), &config_map("cm", &[]))
            .await
            .unwrap();
        let mut blind = config_map("cm", &[]);
        blind.data = Some([("key".to_string(), "blind".to_string())].into());
        let replaced = env
            .config_maps()
            .replace("cm", &PostParams::default(), &blind)
            .await
            .unwrap();
        assert_eq!(replaced.data.as_ref().unwrap()["key"], "blind");
        assert!(rv_of(&replaced) > rv_of(&created));
    })
    .await;
}
