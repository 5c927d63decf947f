//! The whole provider lifecycle end to end, from nothing: a Cluster and a
//! KThreesControlPlane, no Machine and no Secret. The controller generates the
//! cluster CAs, the join token and the kubeconfig; the simulated
//! infrastructure boots every server from those Secrets (real etcd members
//! signed by the generated etcd CA, a workload API server that serves the
//! generated server CA and accepts only the generated client CA); the
//! controller reaches the workload cluster only through its own kubeconfig.
//! Then day 2 and teardown: scaling with quorum sampled throughout,
//! kubeconfig rotation, pause, deletion without member removal, user CAs, and
//! a lost etcd Secret.

use crate::support;

use std::time::Duration;

use k3s_control_plane::api::names::{CLUSTER_NAME_LABEL, KCP_FINALIZER};
use k3s_control_plane::api::{Cluster, KThreesControlPlane, Machine};
use k3s_control_plane::controller::Settings;
use k3s_control_plane::harness::bringup::BringUp;
use k3s_control_plane::harness::sandbox::{
    CLUSTER, ControllerHandle, KCP, NAMESPACE, Sandbox, VERSION, docker_machine_template,
    fast_settings,
};
use k3s_control_plane::pki::{self, KubeconfigPolicy};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use support::{LIMIT, all_ready, drive, event_count, init_logs, machines, wait_reconciles};

fn condition(kcp: &KThreesControlPlane, type_: &str) -> Option<Condition> {
    kcp.conditions().iter().find(|c| c.type_ == type_).cloned()
}

fn secret_text(secret: &Secret, key: &str) -> String {
    String::from_utf8(secret.data.as_ref().unwrap()[key].0.clone()).unwrap()
}

async fn kcp_now(api: &Api<KThreesControlPlane>) -> KThreesControlPlane {
    api.get(KCP).await.unwrap()
}

/// Wait for a KThreesControlPlane condition with `status` (and a message
/// holding `needle`); returns it.
async fn wait_condition(
    sandbox_wait: &Sandbox,
    type_: &str,
    status: &str,
    needle: &str,
) -> Condition {
    let api = sandbox_wait.kcp_api();
    sandbox_wait
        .wait_for(
            &format!("{type_}={status} saying {needle:?}"),
            LIMIT,
            || async {
                let kcp = api.get(KCP).await.map_err(|e| e.to_string())?;
                match condition(&kcp, type_) {
                    Some(c) if c.status == status && c.message.contains(needle) => Ok(c),
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await
        .unwrap()
}

/// Bring a control plane of `replicas` up from nothing: returns the sandbox
/// (once the first server booted) and the running controller.
async fn bring_up(
    replicas: i32,
    settings: Settings,
    before: impl AsyncFnOnce(&BringUp),
) -> (Sandbox, ControllerHandle) {
    let world = BringUp::start(replicas).await.unwrap();
    before(&world).await;
    let controller = world.start_controller_with(settings);
    let first = world.wait_first_machine(LIMIT).await.unwrap();
    let mut sandbox = world.boot_first(&first).await.unwrap();
    drive(&mut sandbox, "bring-up", all_ready(replicas as usize)).await;
    (sandbox, controller)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_plane_comes_up_from_nothing_one_server_at_a_time() {
    init_logs();
    let world = BringUp::start(3).await.unwrap();
    // In-place fields that must reach the Machines it creates.
    world
        .kcp_api()
        .patch(
            KCP,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"machineTemplate": {
                "spec": {"deletion": {"nodeDrainTimeoutSeconds": 30, "nodeDeletionTimeoutSeconds": 120}},
                "metadata": {"labels": {"team": "platform"}, "annotations": {"note": "cp"}}
            }}})),
        )
        .await
        .unwrap();
    let controller = world.start_controller();

    // The Secrets, generated as cluster-api-k3s names them, owned by the control plane.
    let secrets = world.secrets_api();
    let kcp = world.kcp_api().get(KCP).await.unwrap();
    let expected_owner = kcp.uid().unwrap();
    let deadline = tokio::time::Instant::now() + LIMIT;
    let names = ["-ca", "-cca", "-etcd", "-token", "-kubeconfig"].map(|s| format!("{CLUSTER}{s}"));
    for name in &names {
        let secret = loop {
            if let Some(s) = secrets.get_opt(name).await.unwrap() {
                break s;
            }
            assert!(tokio::time::Instant::now() < deadline, "{name} not created");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(
            secret.type_.as_deref(),
            Some("cluster.x-k8s.io/secret"),
            "{name}"
        );
        assert_eq!(
            secret.labels().get(CLUSTER_NAME_LABEL).map(String::as_str),
            Some(CLUSTER),
            "{name}"
        );
        let owner = &secret.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("KThreesControlPlane", Some(true)),
            "{name}"
        );
        assert_eq!(owner.uid, expected_owner, "{name}");
    }
    let token = secret_text(&secrets.get(&names[3]).await.unwrap(), "value");
    assert!(
        token.len() == 32 && token.chars().all(|c| c.is_ascii_hexdigit()),
        "{token}"
    );
    let kubeconfig = secret_text(&secrets.get(&names[4]).await.unwrap(), "value");
    assert_eq!(
        pki::kubeconfig_server(&kubeconfig, "kubeconfig").unwrap(),
        format!("https://{}", world.endpoint)
    );

    // Exactly one Machine (the init node) until the control plane is initialized.
    let first = world.wait_first_machine(LIMIT).await.unwrap();
    let kcps = world.kcp_api();
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let kcp = kcps.get(KCP).await.unwrap();
        let waiting = condition(&kcp, "ScalingUp").is_some_and(|c| {
            c.status == "True" && c.message.contains("waiting for the first server")
        });
        if waiting {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            condition(&kcp, "ScalingUp")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        world
            .machines_api()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    let kcp = kcps.get(KCP).await.unwrap();
    assert_eq!(condition(&kcp, "Initialized").unwrap().status, "False");
    assert_eq!(condition(&kcp, "Available").unwrap().status, "False");
    assert!(kcp.finalizers().iter().any(|f| f == KCP_FINALIZER));
    let endpoint = world.endpoint;

    let mut sandbox = world.boot_first(&first).await.unwrap();
    let samples = drive(&mut sandbox, "bring-up", all_ready(3)).await;
    assert!(samples > 0);

    let available = wait_condition(&sandbox, "Available", "True", "3 of 3 Machines ready").await;
    assert!(
        available.message.contains("3 of 3 voters healthy"),
        "{}",
        available.message
    );
    let kcp = sandbox
        .wait_for("every status field settled", LIMIT, || async {
            let kcp = kcp_now(&sandbox.kcp_api()).await;
            let s = kcp.status.clone().unwrap_or_default();
            if s.ready_replicas == 3
                && s.available_replicas == Some(3)
                && s.up_to_date_replicas == Some(3)
            {
                Ok(kcp)
            } else {
                Err(format!("{s:?}"))
            }
        })
        .await
        .unwrap();
    let status = kcp.status.clone().unwrap();
    assert_eq!(status.replicas, 3);
    assert!(status.initialized && status.ready);
    assert_eq!(
        status
            .initialization
            .as_ref()
            .unwrap()
            .control_plane_initialized,
        Some(true)
    );
    assert_eq!(status.version.as_deref(), Some(VERSION));
    assert_eq!(
        status.selector,
        format!("{CLUSTER_NAME_LABEL}={CLUSTER},cluster.x-k8s.io/control-plane")
    );
    assert_eq!(status.observed_generation, kcp.metadata.generation);
    for (type_, want) in [
        ("Initialized", "True"),
        ("CertificatesAvailable", "True"),
        ("MachinesReady", "True"),
        ("MachinesUpToDate", "True"),
        ("EtcdClusterHealthy", "True"),
        ("ScalingUp", "False"),
        ("ScalingDown", "False"),
        ("Remediating", "False"),
        ("Deleting", "False"),
        ("Paused", "False"),
    ] {
        assert_eq!(
            condition(&kcp, type_).map(|c| c.status),
            Some(want.to_string()),
            "{type_}"
        );
    }
    let v1beta1 = &status
        .deprecated
        .as_ref()
        .unwrap()
        .v1beta1
        .as_ref()
        .unwrap();
    for type_ in [
        "Ready",
        "Available",
        "CertificatesAvailable",
        "MachinesReady",
        "Resized",
    ] {
        let c = v1beta1
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
            .unwrap_or_else(|| panic!("v1beta1 {type_}"));
        assert_eq!(c.status, "True", "v1beta1 {type_}");
    }
    assert_eq!(v1beta1.ready_replicas, Some(3));

    // What the Machines were made with.
    for m in machines(&sandbox).await {
        let deletion = m.spec.deletion.clone().unwrap_or_default();
        assert_eq!(
            deletion.node_drain_timeout_seconds,
            Some(30),
            "{}",
            m.name_any()
        );
        assert_eq!(deletion.node_deletion_timeout_seconds, Some(120));
        assert_eq!(m.labels().get("team").map(String::as_str), Some("platform"));
        assert_eq!(m.annotations().get("note").map(String::as_str), Some("cp"));
        assert_eq!(m.spec.version.as_deref(), Some(VERSION));
    }
    // The infrastructure template got the Cluster as an owner.
    let templates: Api<DynamicObject> =
        Api::namespaced_with(sandbox.client(), NAMESPACE, &docker_machine_template());
    let template = templates.get(&format!("{KCP}-template")).await.unwrap();
    let cluster: Api<Cluster> = Api::namespaced(sandbox.client(), NAMESPACE);
    let cluster_uid = cluster.get(CLUSTER).await.unwrap().uid().unwrap();
    assert!(
        template
            .owner_references()
            .iter()
            .any(|o| o.kind == "Cluster" && o.uid == cluster_uid)
    );
    // The controller's only way in is its own kubeconfig: the workload API
    // refuses a client without a certificate signed by the generated client CA.
    let mut anonymous = kube::config::Kubeconfig::from_yaml(&kubeconfig).unwrap();
    for user in &mut anonymous.auth_infos {
        let auth = user.auth_info.as_mut().unwrap();
        auth.client_certificate_data = None;
        auth.client_key_data = None;
    }
    let anonymous = kube::Config::from_custom_kubeconfig(anonymous, &Default::default())
        .await
        .unwrap();
    assert_eq!(
        anonymous.cluster_url.to_string(),
        format!("https://{endpoint}/")
    );
    let refused = kube::Client::try_from(anonymous)
        .unwrap()
        .list_core_api_versions()
        .await;
    assert!(
        refused.is_err(),
        "the workload API accepted a client without certificate"
    );
    let owned = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::from_yaml(&kubeconfig).unwrap(),
        &Default::default(),
    )
    .await
    .unwrap();
    kube::Client::try_from(owned)
        .unwrap()
        .list_core_api_versions()
        .await
        .expect("the generated kubeconfig is accepted");
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scaling_three_to_five_to_three_keeps_quorum_at_every_sample() {
    init_logs();
    let (mut sandbox, controller) = bring_up(3, fast_settings(), async |_| {}).await;
    let scale = async |sandbox: &Sandbox, n: i32| {
        sandbox
            .kcp_api()
            .patch(
                KCP,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": n}})),
            )
            .await
            .unwrap();
    };
    scale(&sandbox, 5).await;
    let up = drive(&mut sandbox, "3 -> 5", all_ready(5)).await;
    wait_condition(&sandbox, "Available", "True", "5 of 5 Machines ready").await;
    scale(&sandbox, 3).await;
    let down = drive(&mut sandbox, "5 -> 3", all_ready(3)).await;
    wait_condition(&sandbox, "ScalingDown", "False", "").await;
    assert!(up > 1 && down > 1, "sampled {up} and {down} times");
    assert_eq!(event_count(&sandbox, "EtcdMemberRemoved").await, 2);
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubeconfig_rotation_keeps_access() {
    init_logs();
    let settings = Settings {
        kubeconfig: KubeconfigPolicy::with_lifetime(Duration::from_secs(12)),
        ..fast_settings()
    };
    let (sandbox, controller) = bring_up(1, settings, async |_| {}).await;
    let secrets: Api<Secret> = Api::namespaced(sandbox.client(), NAMESPACE);
    let name = format!("{CLUSTER}-kubeconfig");
    let first = secret_text(&secrets.get(&name).await.unwrap(), "value");
    let first_expiry = pki::kubeconfig_client_not_after(&first, "first").unwrap();
    // Rotated before expiry, again and again, until the first certificate expired.
    let mut rotations = 0;
    let mut last = first.clone();
    while chrono::Utc::now() < first_expiry + chrono::Duration::seconds(2) {
        let now = secret_text(&secrets.get(&name).await.unwrap(), "value");
        if now != last {
            let expiry = pki::kubeconfig_client_not_after(&now, "rotated").unwrap();
            assert!(expiry > pki::kubeconfig_client_not_after(&last, "previous").unwrap());
            rotations += 1;
            last = now;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        rotations >= 1,
        "never rotated before the first certificate expired"
    );
    // The first kubeconfig is useless now; the controller still reaches the
    // workload cluster (its Machine stays ready, read through the workload API).
    let stale = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::from_yaml(&first).unwrap(),
        &Default::default(),
    )
    .await
    .unwrap();
    let stale = kube::Client::try_from(stale).unwrap();
    assert!(
        stale.list_core_api_versions().await.is_err(),
        "an expired client certificate was accepted"
    );
    // With a 12 s lifetime renewed under 9 s left, a reconcile slowed by a
    // loaded machine can read the Node in the instant between two
    // rotations; what must hold is that access comes back, polled with a
    // deadline, not that every sample is ready.
    wait_reconciles(&sandbox, &controller.ctx, 3).await;
    let ready = wait_condition(&sandbox, "MachinesReady", "True", "1 of 1 ready").await;
    assert_eq!(ready.message, "1 of 1 ready");
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_cluster_changes_nothing_until_resumed() {
    init_logs();
    let (sandbox, controller) = bring_up(1, fast_settings(), async |_| {}).await;
    let clusters: Api<Cluster> = Api::namespaced(sandbox.client(), NAMESPACE);
    clusters
        .patch(
            CLUSTER,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"paused": true}})),
        )
        .await
        .unwrap();
    wait_condition(&sandbox, "Paused", "True", "paused by the Cluster").await;
    let kcps = sandbox.kcp_api();
    kcps.patch(
        KCP,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 3}})),
    )
    .await
    .unwrap();
    let first = sandbox.machines[0].clone();
    sandbox.mark_unhealthy(&first).await.unwrap();
    let versions = |items: Vec<Machine>| -> Vec<(String, String)> {
        items
            .iter()
            .map(|m| (m.name_any(), m.resource_version().unwrap()))
            .collect()
    };
    let before = versions(machines(&sandbox).await);
    let secrets: Api<Secret> = Api::namespaced(sandbox.client(), NAMESPACE);
    let secret_versions = |list: Vec<Secret>| -> Vec<String> {
        list.iter().map(|s| s.resource_version().unwrap()).collect()
    };
    let secrets_before = secret_versions(secrets.list(&ListParams::default()).await.unwrap().items);
    wait_reconciles(&sandbox, &controller.ctx, 4).await;
    assert_eq!(
        versions(machines(&sandbox).await),
        before,
        "a paused control plane touched a Machine"
    );
    assert_eq!(
        secret_versions(secrets.list(&ListParams::default()).await.unwrap().items),
        secrets_before
    );
    let kcp = kcp_now(&kcps).await;
    assert_eq!(
        kcp.status.as_ref().unwrap().replicas,
        1,
        "only the Paused condition is written"
    );

    clusters
        .patch(
            CLUSTER,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"paused": false}})),
        )
        .await
        .unwrap();
    wait_condition(&sandbox, "Paused", "False", "").await;
    sandbox
        .wait_for("the control plane acting again", LIMIT, || async {
            let all = machines(&sandbox).await;
            if all.len() > 1 || all.iter().any(|m| m.is_deleting()) {
                Ok(())
            } else {
                Err(format!("{} machines", all.len()))
            }
        })
        .await
        .unwrap();
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_cluster_tears_everything_down_without_removing_a_member() {
    init_logs();
    let (sandbox, controller) = bring_up(3, fast_settings(), async |_| {}).await;
    let members_before = sandbox
        .etcd
        .connect()
        .snapshot()
        .await
        .unwrap()
        .members
        .len();
    assert_eq!(members_before, 3);
    // A worker Machine goes first; CAPI's Cluster finalizer holds the Cluster.
    let worker: Machine = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": "worker-1", "namespace": NAMESPACE, "labels": {CLUSTER_NAME_LABEL: CLUSTER}},
        "spec": {"clusterName": CLUSTER, "bootstrap": {}, "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": "worker-1"}}
    }))
    .unwrap();
    sandbox
        .machines_api()
        .create(&PostParams::default(), &worker)
        .await
        .unwrap();
    let clusters: Api<Cluster> = Api::namespaced(sandbox.client(), NAMESPACE);
    clusters
        .patch(
            CLUSTER,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["cluster.cluster.x-k8s.io"]}})),
        )
        .await
        .unwrap();
    clusters
        .delete(CLUSTER, &DeleteParams::default())
        .await
        .unwrap();

    let waiting = wait_condition(&sandbox, "Deleting", "True", "worker-1").await;
    assert_eq!(waiting.reason, "WaitingForWorkersDeletion");
    wait_reconciles(&sandbox, &controller.ctx, 2).await;
    let control_plane: Vec<Machine> = machines(&sandbox)
        .await
        .into_iter()
        .filter(|m| m.name_any() != "worker-1")
        .collect();
    assert!(
        control_plane.iter().all(|m| !m.is_deleting()),
        "control plane went before the workers"
    );

    sandbox
        .machines_api()
        .delete("worker-1", &DeleteParams::default())
        .await
        .unwrap();
    sandbox
        .wait_for("every Machine gone", LIMIT, || async {
            let left = machines(&sandbox).await;
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("{} left", left.len()))
            }
        })
        .await
        .unwrap();
    // No member was removed: the whole cluster went (its servers still run here).
    let after = sandbox.etcd.connect().snapshot().await.unwrap();
    assert_eq!(
        after.members.len(),
        3,
        "a member was removed during teardown"
    );
    assert_eq!(event_count(&sandbox, "EtcdMemberRemoved").await, 0);
    wait_condition(
        &sandbox,
        "Deleting",
        "True",
        "waiting for the KThreesControlPlane itself",
    )
    .await;

    // CAPI deletes the control plane object next, then lets the Cluster go.
    sandbox
        .kcp_api()
        .delete(KCP, &DeleteParams::default())
        .await
        .unwrap();
    sandbox
        .wait_for(
            "the KThreesControlPlane gone (finalizer removed)",
            LIMIT,
            || async {
                match sandbox
                    .kcp_api()
                    .get_opt(KCP)
                    .await
                    .map_err(|e| e.to_string())?
                {
                    None => Ok(()),
                    Some(k) => Err(format!("finalizers {:?}", k.finalizers())),
                }
            },
        )
        .await
        .unwrap();
    clusters
        .patch(
            CLUSTER,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    let secrets: Api<Secret> = Api::namespaced(sandbox.client(), NAMESPACE);
    sandbox
        .wait_for("the generated Secrets garbage-collected", LIMIT, || async {
            let left = secrets
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?
                .items;
            if left.is_empty() {
                Ok(())
            } else {
                Err(left
                    .iter()
                    .map(|s| s.name_any())
                    .collect::<Vec<_>>()
                    .join(","))
            }
        })
        .await
        .unwrap();
    assert!(clusters.get_opt(CLUSTER).await.unwrap().is_none());
    // Nothing of the deleted cluster is held any more: no pooled etcd
    // connection, no workload client.
    assert!(
        controller.ctx.etcd.is_empty(),
        "{} etcd handles kept after teardown",
        controller.ctx.etcd.len()
    );
    assert!(
        controller.ctx.workloads.is_empty(),
        "{} workload clients kept after teardown",
        controller.ctx.workloads.len()
    );
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_supplied_cas_are_used_and_never_replaced() {
    init_logs();
    let mut supplied = Vec::new();
    let (sandbox, controller) = bring_up(1, fast_settings(), async |world: &BringUp| {
        let secrets = world.secrets_api();
        for (suffix, cn) in [("-ca", "user-server-ca"), ("-cca", "user-client-ca"), ("-etcd", "user-etcd-ca")] {
            let ca = pki::generate_ca(cn, pki::CA_LIFETIME).unwrap();
            let secret: Secret = serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": format!("{CLUSTER}{suffix}"), "namespace": NAMESPACE, "labels": {CLUSTER_NAME_LABEL: CLUSTER}},
                "type": "cluster.x-k8s.io/secret",
                "stringData": {"tls.crt": ca.cert_pem, "tls.key": ca.key_pem}
            }))
            .unwrap();
            supplied.push(secrets.create(&PostParams::default(), &secret).await.unwrap());
        }
    })
    .await;
    let secrets: Api<Secret> = Api::namespaced(sandbox.client(), NAMESPACE);
    for before in &supplied {
        let now = secrets.get(&before.name_any()).await.unwrap();
        assert_eq!(now.uid(), before.uid(), "{} replaced", before.name_any());
        assert_eq!(
            now.resource_version(),
            before.resource_version(),
            "{} rewritten",
            before.name_any()
        );
        assert!(
            now.owner_references().is_empty(),
            "{} adopted",
            before.name_any()
        );
    }
    // The kubeconfig trusts the user's server CA; etcd (booted from the user's
    // etcd CA) is read through certificates minted from it.
    let kubeconfig = secret_text(
        &secrets.get(&format!("{CLUSTER}-kubeconfig")).await.unwrap(),
        "value",
    );
    let parsed = kube::config::Kubeconfig::from_yaml(&kubeconfig).unwrap();
    let ca_data = parsed.clusters[0]
        .cluster
        .as_ref()
        .unwrap()
        .certificate_authority_data
        .clone()
        .unwrap();
    use base64::Engine as _;
    let ca_pem = String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(ca_data)
            .unwrap(),
    )
    .unwrap();
    assert_eq!(ca_pem.trim(), secret_text(&supplied[0], "tls.crt").trim());
    wait_condition(&sandbox, "EtcdClusterHealthy", "True", "").await;
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_or_broken_etcd_secret_blocks_every_removal() {
    init_logs();
    let (sandbox, controller) = bring_up(3, fast_settings(), async |_| {}).await;
    let secrets: Api<Secret> = Api::namespaced(sandbox.client(), NAMESPACE);
    let name = format!("{CLUSTER}-etcd");
    let members = sandbox
        .etcd
        .connect()
        .snapshot()
        .await
        .unwrap()
        .members
        .len();
    secrets
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    let target = sandbox.machines[1].clone();
    sandbox.mark_unhealthy(&target).await.unwrap();
    let blocked = wait_condition(&sandbox, "CertificatesAvailable", "False", &name).await;
    assert!(blocked.message.contains("restore"), "{}", blocked.message);
    wait_reconciles(&sandbox, &controller.ctx, 3).await;
    assert!(
        secrets.get_opt(&name).await.unwrap().is_none(),
        "a new etcd CA was generated for a running cluster"
    );

    // An unreadable one is no better.
    let garbage: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "stringData": {"tls.crt": "not a certificate", "tls.key": "not a key"}
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &garbage)
        .await
        .unwrap();
    wait_condition(
        &sandbox,
        "CertificatesAvailable",
        "False",
        "no PEM certificate",
    )
    .await;
    wait_reconciles(&sandbox, &controller.ctx, 3).await;

    let all = machines(&sandbox).await;
    assert!(
        all.iter().all(|m| !m.is_deleting()),
        "a Machine was deleted on a guess"
    );
    assert_eq!(all.len(), 3);
    assert_eq!(
        sandbox
            .etcd
            .connect()
            .snapshot()
            .await
            .unwrap()
            .members
            .len(),
        members
    );
    assert_eq!(event_count(&sandbox, "EtcdMemberRemoved").await, 0);
    let kcp = kcp_now(&sandbox.kcp_api()).await;
    let remediating = condition(&kcp, "Remediating").unwrap();
    assert!(
        remediating.message.contains(&name),
        "{}",
        remediating.message
    );
    controller.stop().await;
}

/// `k3scp_remediations_total` by outcome.
fn remediation_counts(ctx: &k3s_control_plane::controller::Context) -> Vec<(String, u64)> {
    let mut counts: Vec<(String, u64)> = [
        "started",
        "step",
        "completed",
        "deferred",
        "refused",
        "failed",
    ]
    .into_iter()
    .map(|outcome| {
        let labels = k3s_control_plane::controller::metrics::RemediationLabels {
            outcome: outcome.to_string(),
        };
        (
            outcome.to_string(),
            ctx.metrics.remediations.get_or_create(&labels).get(),
        )
    })
    .collect();
    counts.retain(|(_, n)| *n > 0);
    counts
}

/// A whole healthy life, with nothing wrong at any point: bring-up from
/// nothing, 3 -> 5 -> 3, a version rollout, one MHC remediation, teardown.
/// No Warning Event is emitted (every wait on the way is an expected one), and
/// the remediation metrics count exactly that one remediation: waits of
/// scale-downs and rollouts are no remediation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_life_emits_no_warning_and_counts_one_remediation() {
    init_logs();
    let (mut sandbox, controller) = bring_up(3, fast_settings(), async |_| {}).await;
    let replicas = async |sandbox: &Sandbox, n: i32| {
        sandbox
            .kcp_api()
            .patch(
                KCP,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": n}})),
            )
            .await
            .unwrap();
    };
    replicas(&sandbox, 5).await;
    drive(&mut sandbox, "3 -> 5", all_ready(5)).await;
    replicas(&sandbox, 3).await;
    drive(&mut sandbox, "5 -> 3", all_ready(3)).await;

    const NEW_VERSION: &str = "v1.31.4+k3s1";
    sandbox
        .kcp_api()
        .patch(
            KCP,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"version": NEW_VERSION}})),
        )
        .await
        .unwrap();
    drive(&mut sandbox, "rollout", |all, (healthy, voters)| {
        all_ready(3)(all, (healthy, voters))
            && all
                .iter()
                .all(|m| m.spec.version.as_deref() == Some(NEW_VERSION))
    })
    .await;

    let target = machines(&sandbox).await[0].name_any();
    sandbox.mark_unhealthy(&target).await.unwrap();
    drive(&mut sandbox, "remediation", |all, (healthy, voters)| {
        all_ready(3)(all, (healthy, voters)) && !all.iter().any(|m| m.name_any() == target)
    })
    .await;
    sandbox
        .wait_for("the remediation recorded as done", LIMIT, || async {
            let kcp = sandbox
                .kcp_api()
                .get(KCP)
                .await
                .map_err(|e| e.to_string())?;
            if kcp
                .annotations()
                .contains_key(k3s_control_plane::api::names::REMEDIATION_IN_PROGRESS_ANNOTATION)
            {
                Err("remediation-in-progress still set".into())
            } else {
                Ok(())
            }
        })
        .await
        .unwrap();

    let clusters: Api<Cluster> = Api::namespaced(sandbox.client(), NAMESPACE);
    clusters
        .delete(CLUSTER, &DeleteParams::default())
        .await
        .unwrap();
    // The Cluster's deletion may have taken the control plane with it already.
    match sandbox
        .kcp_api()
        .delete(KCP, &DeleteParams::default())
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => panic!("delete the KThreesControlPlane: {e}"),
    }
    sandbox
        .wait_for("the KThreesControlPlane gone", LIMIT, || async {
            match sandbox
                .kcp_api()
                .get_opt(KCP)
                .await
                .map_err(|e| e.to_string())?
            {
                None => Ok(()),
                Some(k) => Err(format!("finalizers {:?}", k.finalizers())),
            }
        })
        .await
        .unwrap();

    let warned = support::warning_events(&sandbox).await;
    assert!(
        warned.is_empty(),
        "Warning Events in a healthy life: {warned:#?}"
    );
    assert_eq!(
        remediation_counts(&controller.ctx)
            .into_iter()
            .filter(|(o, _)| o != "step")
            .collect::<Vec<_>>(),
        [("started".to_string(), 1), ("completed".to_string(), 1)],
        "remediations counted"
    );
    assert_eq!(event_count(&sandbox, "RemediationStarted").await, 1);
    controller.stop().await;
}

/// A real fault during a removal: a Machine deleted with our hook (its member
/// recorded) is being removed when another member goes down. Removing the
/// member now would leave 1 of 2 voters healthy: the removal waits, and says
/// so with a Warning `RemovalBlocked` carrying the numbers; nothing is removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_down_during_a_removal_is_a_warning_with_the_numbers() {
    use k3s_control_plane::api::names::PRE_TERMINATE_HOOK_ANNOTATION;
    init_logs();
    let mut sandbox = Sandbox::start(3).await.unwrap();
    let admin = sandbox.etcd.connect();
    let leader = sandbox
        .etcd
        .index_of(admin.snapshot().await.unwrap().leader.unwrap())
        .unwrap();
    // The target follows (no leadership move needed); another follower stops.
    let target = (leader + 1) % 3;
    let stopped = (leader + 2) % 3;
    let member = sandbox.etcd.member(target).id;
    let machine = sandbox.machines[target].clone();
    sandbox
        .machines_api()
        .patch(
            &machine,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                PRE_TERMINATE_HOOK_ANNOTATION: k3s_control_plane::remediation::steps::hook_value(Some(member)),
            }}})),
        )
        .await
        .unwrap();
    sandbox
        .machines_api()
        .delete(&machine, &DeleteParams::default())
        .await
        .unwrap();
    sandbox.etcd.stop(stopped).await.unwrap();

    let controller = sandbox.start_controller();
    let numbers = "1 of 2 voters healthy, quorum needs 2";
    let note = sandbox
        .wait_for(
            "a RemovalBlocked Warning with the numbers",
            LIMIT,
            || async {
                let api: Api<k8s_openapi::api::events::v1::Event> =
                    Api::namespaced(sandbox.client(), NAMESPACE);
                api.list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?
                    .items
                    .into_iter()
                    .find(|e| {
                        e.type_.as_deref() == Some("Warning")
                            && e.reason.as_deref() == Some("RemovalBlocked")
                            && e.note.as_deref().is_some_and(|n| n.contains(numbers))
                    })
                    .and_then(|e| e.note)
                    .ok_or_else(|| "none yet".to_string())
            },
        )
        .await
        .unwrap();
    assert!(
        note.contains(&machine) && note.contains("removal.wait.quorum-at-risk"),
        "{note}"
    );
    wait_reconciles(&sandbox, &controller.ctx, 2).await;
    assert_eq!(
        admin.snapshot().await.map(|s| s.members.len()).unwrap_or(3),
        3
    );
    assert_eq!(event_count(&sandbox, "EtcdMemberRemoved").await, 0);
    controller.stop().await;
}
