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

/// A reconcile under way when its control plane is relabelled to another
/// shard still holds the object as it was (labelled for this shard). The pass
/// that is about to act (here: add our finalizer) reads the control plane
/// first and refuses (rule `shard.not-ours`) without an error: nothing is
/// written. (Our finalizer patch is also conditional on the resourceVersion,
/// so without the check this call fails with a conflict; the Machine and etcd
/// steps are not, see tests/e2e/shards.rs.) The same call with the label ours
/// again does act.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_under_way_when_its_control_plane_moves_to_another_shard_writes_nothing() {
    use k3s_control_plane::controller::reconcile::reconcile;
    use k3s_control_plane::harness::sandbox::{KCP, NAMESPACE, cluster_object, kcp_object};
    use kube::ResourceExt;
    use kube::api::{Patch, PatchParams};
    use std::sync::Arc;
    k3s_control_plane::install_crypto_provider();
    let server = management_server().await.unwrap();
    let client = server.client();
    let clusters: Api<k3s_control_plane::api::Cluster> = Api::namespaced(client.clone(), NAMESPACE);
    let cluster = clusters
        .create(&PostParams::default(), &cluster_object("c1", KCP))
        .await
        .unwrap();
    let kcps: Api<KThreesControlPlane> = Api::namespaced(client.clone(), NAMESPACE);
    let mut object = kcp_object(KCP, &cluster, 3);
    object
        .labels_mut()
        .insert(WATCH_FILTER_LABEL.into(), "shard-a".into());
    let created = kcps.create(&PostParams::default(), &object).await.unwrap();
    assert!(created.finalizers().is_empty());
    let relabel = |value: &'static str| {
        let kcps = kcps.clone();
        async move {
            kcps.patch(
                KCP,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {WATCH_FILTER_LABEL: value}}})),
            )
            .await
            .unwrap()
        }
    };
    // Relabelled after shard a's watch delivered `created`.
    relabel("shard-b").await;
    let ctx = controller_context(
        client.clone(),
        Settings {
            watch_filter: Some("shard-a".into()),
            ..fast_settings()
        },
    );
    reconcile(Arc::new(created.clone()), ctx.clone())
        .await
        .unwrap();
    assert_eq!(ctx.metrics.shard_refusals.get(), 1, "refused once");
    assert_eq!(ctx.metrics.actions.get(), 0, "no action reached");
    assert!(
        kcps.get(KCP).await.unwrap().finalizers().is_empty(),
        "the finalizer was added by a shard that no longer has the control plane"
    );
    // Control: labelled for shard a again, the same call on the object as it
    // is now acts.
    let current = relabel("shard-a").await;
    reconcile(Arc::new(current), ctx.clone()).await.unwrap();
    assert_eq!(ctx.metrics.actions.get(), 1);
    assert!(!kcps.get(KCP).await.unwrap().finalizers().is_empty());
    assert_eq!(ctx.metrics.shard_refusals.get(), 1);
}
