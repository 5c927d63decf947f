//! `run --watch-filter` and `--namespace`: the real controller loop on a
//! management test API server reconciles only the control planes labelled
//! `cluster.x-k8s.io/watch-filter=<value>` in the namespace it watches. A
//! reconciled control plane without a Cluster gets a status saying it waits
//! for one; one outside the filter gets none.

use std::time::Duration;

use k3s_control_plane::api::KThreesControlPlane;
use k3s_control_plane::api::names::WATCH_FILTER_LABEL;
use k3s_control_plane::controller::Settings;
use k3s_control_plane::harness::sandbox::{
    controller_context, fast_settings, management_server, spawn_controller,
};
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

fn kcp(name: &str, namespace: &str, shard: Option<&str>) -> KThreesControlPlane {
    let labels = match shard {
        Some(v) => json!({WATCH_FILTER_LABEL: v}),
        None => json!({}),
    };
    serde_json::from_value(json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta3", "kind": "KThreesControlPlane",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"replicas": 1, "version": "v1.30.2+k3s2",
                 "machineTemplate": {"spec": {"infrastructureRef": {
                     "apiGroup": "infrastructure.cluster.x-k8s.io",
                     "kind": "DockerMachineTemplate", "name": "t"}}}}
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_labelled_control_planes_in_the_watched_namespace_are_reconciled() {
    k3s_control_plane::install_crypto_provider();
    let server = management_server().await.unwrap();
    let client = server.client();
    for ns in ["team-a", "team-b"] {
        let namespace: k8s_openapi::api::core::v1::Namespace =
            serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
        Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .unwrap();
    }
    for (name, ns, shard) in [
        ("ours", "team-a", Some("shard-a")),
        ("other-shard", "team-a", Some("shard-b")),
        ("unlabelled", "team-a", None),
        ("other-namespace", "team-b", Some("shard-a")),
    ] {
        Api::<KThreesControlPlane>::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &kcp(name, ns, shard))
            .await
            .unwrap();
    }
    let settings = Settings {
        watch_filter: Some("shard-a".into()),
        namespace: Some("team-a".into()),
        ..fast_settings()
    };
    let ctx = controller_context(client.clone(), settings);
    let controller = spawn_controller(ctx.clone());
    let status_of = |ns: &'static str, name: &'static str| {
        let api = Api::<KThreesControlPlane>::namespaced(client.clone(), ns);
        async move { api.get(name).await.unwrap().status }
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while status_of("team-a", "ours").await.is_none() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the labelled control plane was never reconciled"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Let the controller go round several more times (idle requeue is 5 s;
    // a requeue after the refusal comes sooner), then look at the others.
    let seen = ctx.metrics.reconciles.get();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while ctx.metrics.reconciles.get() < seen + 2 {
        assert!(tokio::time::Instant::now() < deadline, "no more reconciles");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(status_of("team-a", "other-shard").await.is_none());
    assert!(status_of("team-a", "unlabelled").await.is_none());
    assert!(status_of("team-b", "other-namespace").await.is_none());
    controller.stop().await;
}
