//! Errors come back as Kubernetes `Status` objects with the real codes, reasons and messages.

use kube::api::PostParams;

use crate::support::*;

#[tokio::test]
async fn get_of_a_missing_object_is_not_found_404_with_details() {
    run("not-found", |env| async move {
        let status = status_of(env.kcps().get("kcp-1").await);
        assert_eq!(status.code, 404);
        assert_eq!(status.reason, "NotFound");
        assert_eq!(
            status.status,
            Some(kube::core::response::StatusSummary::Failure)
        );
        assert_eq!(
            status.message,
            format!("kthreescontrolplanes.{KCP_GROUP} \"kcp-1\" not found")
        );
        let details = status.details.expect("NotFound carries details");
        assert_eq!(details.name, "kcp-1");
        assert_eq!(details.group, KCP_GROUP);
        assert_eq!(details.kind, "kthreescontrolplanes");
        let status = status_of(env.secrets().get("missing").await);
        assert_eq!(status.message, "secrets \"missing\" not found");
    })
    .await;
}

#[tokio::test]
async fn unsupported_method_is_method_not_allowed_405() {
    run("method-not-allowed", |env| async move {
        env.config_maps()
            .create(&PostParams::default(), &config_map("cm", &[]))
            .await
            .unwrap();
        let url = format!("/api/v1/namespaces/{}/configmaps/cm", env.ns);
        let request = http::Request::post(url)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(b"{}".to_vec())
            .unwrap();
        let status = status_of(env.client.request::<serde_json::Value>(request).await);
        assert_eq!(status.code, 405);
        assert_eq!(status.reason, "MethodNotAllowed");
    })
    .await;
}

#[tokio::test]
async fn create_through_the_all_namespaces_url_is_method_not_allowed_405() {
    run("create-all-namespaces", |env| async move {
        let all: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
            kube::Api::all(env.client.clone());
        let mut cm = config_map("cm", &[]);
        cm.metadata.namespace = Some(env.ns.clone());
        let status = status_of(all.create(&PostParams::default(), &cm).await);
        assert_eq!(status.code, 405);
    })
    .await;
}
