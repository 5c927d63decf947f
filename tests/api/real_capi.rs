//! With Cluster API's REAL Machine controller: a person deletes the etcd
//! leader's control-plane Machine (as `kubectl delete machine` does) and CAPI
//! holds the deletion on our pre-terminate hook until our controller has moved
//! etcd leadership off it and removed its member; only then is the hook
//! released and CAPI finishes.
//!
//! Skips (saying so) unless `K3SCP_REAL_CAPI_KUBECONFIG` names the kubeconfig
//! of a management API server where:
//! - CAPI's CRDs (`config/crd/bases` of cluster-api) and the k3s bootstrap
//!   provider's `KThreesConfig` CRD (labelled `cluster.x-k8s.io/v1beta1:
//!   v1beta1_v1beta2`) are installed, and
//! - CAPI's core manager runs (it owns Machine deletion; our CAPI simulation,
//!   `harness::capi_sim`, is NOT started here).
//!
//! The test installs our CRDs and three tiny infrastructure kinds
//! (`DockerCluster`, `DockerMachine`, `DockerMachineTemplate`, created ready),
//! and builds the workload side with the harness: a real 3-member etcd (k3s
//! PKI and member names) and the in-process workload API server with the
//! control-plane Nodes (`spec.providerID` set, so CAPI itself finds them and
//! sets each Machine's `nodeRef`), an `etcd-proxy` DaemonSet pod on each
//! (CAPI's drain skips DaemonSet pods) and the `<cluster>-kubeconfig` /
//! `<cluster>-etcd` Secrets. Our controller runs in-process against the same
//! management API server, watching only the test's namespace
//! (`K3SCP_REAL_CAPI_NAMESPACE`, default `k3scp-real-capi`; it must not hold a
//! Cluster yet: run each time against a fresh prefix; each scenario takes
//! `<prefix>-<scenario>`, so CAPI's manager must watch them all). docs/api.md,
//! "Checked with Cluster API's real Machine controller", records a run.

use crate::docker_support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k3s_control_plane::api::names::{
    CLUSTER_NAME_LABEL, CONTROL_PLANE_LABEL, CONTROL_PLANE_NAME_LABEL,
    K3S_ETCD_NODE_ADDRESS_ANNOTATION, K3S_ETCD_NODE_NAME_ANNOTATION, KCP_FINALIZER,
    NODE_ROLE_CONTROL_PLANE_LABEL, NODE_ROLE_ETCD_LABEL, PRE_TERMINATE_HOOK_ANNOTATION,
    SPEC_HASH_ANNOTATION,
};
use k3s_control_plane::api::{Cluster, KThreesControlPlane, crds};
use k3s_control_plane::apiserver::{ResourceDef, TestApiServer};
use k3s_control_plane::controller::etcd_pool::TransportMode;
use k3s_control_plane::harness::EtcdTestCluster;
use k3s_control_plane::harness::sandbox::{
    CLUSTER, KCP, cluster_object, controller_context, docker_machine, docker_machine_template,
    fast_settings, kcp_object, spawn_controller,
};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Secret};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::{Value, json};

const KUBECONFIG_ENV: &str = "K3SCP_REAL_CAPI_KUBECONFIG";
const NAMESPACE_ENV: &str = "K3SCP_REAL_CAPI_NAMESPACE";
const LIMIT: Duration = Duration::from_secs(180);

fn ar(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: format!("{group}/{version}"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

fn docker_cluster() -> ApiResource {
    ar(
        "infrastructure.cluster.x-k8s.io",
        "v1beta1",
        "DockerCluster",
        "dockerclusters",
    )
}

fn kthrees_config() -> ApiResource {
    ar(
        "bootstrap.cluster.x-k8s.io",
        "v1beta2",
        "KThreesConfig",
        "kthreesconfigs",
    )
}

fn machine_resource() -> ApiResource {
    ar("cluster.x-k8s.io", "v1beta2", "Machine", "machines")
}

/// A minimal infrastructure CRD of CAPI's v1beta2 contract: any fields, a
/// status subresource.
fn infra_crd(kind: &str, plural: &str) -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {
            "name": format!("{plural}.infrastructure.cluster.x-k8s.io"),
            "labels": {"cluster.x-k8s.io/v1beta2": "v1beta1"}
        },
        "spec": {
            "group": "infrastructure.cluster.x-k8s.io", "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
            "versions": [{
                "name": "v1beta1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
            }]
        }
    }))
    .expect("a well-formed CRD")
}

async fn apply_crd(client: &Client, crd: &CustomResourceDefinition) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = crd.name_any();
    // A CRD installed before by someone else (e.g. `kubectl apply
    // --server-side` with a webhook `url`) keeps that manager's clientConfig
    // fields beside the ones applied here, and the server refuses a url and a
    // service together: set the clientConfig first with a merge patch.
    if let Some(config) = crd
        .spec
        .conversion
        .as_ref()
        .and_then(|c| c.webhook.as_ref())
        .and_then(|w| w.client_config.as_ref())
    {
        let mut config = serde_json::to_value(config).unwrap();
        for key in ["url", "service", "caBundle"] {
            config
                .as_object_mut()
                .unwrap()
                .entry(key)
                .or_insert(Value::Null);
        }
        match api
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"spec": {"conversion": {"webhook": {"clientConfig": config}}}}),
                ),
            )
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.is_not_found() => {}
            Err(e) => panic!("set the conversion webhook of CRD {name}: {e}"),
        }
    }
    api.patch(
        &name,
        &PatchParams::apply("k3scp-real-capi-test").force(),
        &Patch::Apply(crd),
    )
    .await
    .unwrap_or_else(|e| panic!("apply CRD {name}: {e}"));
    wait("CRD established", LIMIT, || async {
        let crd = api.get(&name).await.map_err(|e| e.to_string())?;
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        established
            .then_some(())
            .ok_or_else(|| format!("{name} not established"))
    })
    .await;
}

async fn wait<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + limit;
    loop {
        match check().await {
            Ok(v) => return v,
            Err(last) if Instant::now() >= deadline => {
                panic!("timed out after {limit:?} waiting for {what}: {last}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

fn secret(ns: &str, name: String, data: BTreeMap<String, String>) -> Secret {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "labels": {CLUSTER_NAME_LABEL: CLUSTER}},
        "type": "cluster.x-k8s.io/secret",
        "stringData": data,
    }))
    .unwrap()
}

fn in_namespace<T: serde::Serialize + serde::de::DeserializeOwned>(object: T, ns: &str) -> T {
    let mut value = serde_json::to_value(object).unwrap();
    value["metadata"]["namespace"] = json!(ns);
    serde_json::from_value(value).unwrap()
}

fn provider_id(node: &str) -> String {
    format!("k3scp-test:///{node}")
}

fn deleting_reason(machine: &Value) -> Option<String> {
    machine
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Deleting")
        .map(|c| {
            format!(
                "{}/{}",
                c["status"].as_str().unwrap_or(""),
                c["reason"].as_str().unwrap_or("")
            )
        })
}

fn v1beta1_hook_condition(machine: &Value) -> Option<String> {
    machine
        .pointer("/status/deprecated/v1beta1/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == "PreTerminateDeleteHookSucceeded")
        .map(|c| {
            format!(
                "{}/{}",
                c["status"].as_str().unwrap_or(""),
                c["reason"].as_str().unwrap_or("")
            )
        })
}

fn hook(machine: &Value) -> Option<String> {
    machine
        .pointer("/metadata/annotations")?
        .get(PRE_TERMINATE_HOOK_ANNOTATION)
        .and_then(Value::as_str)
        .map(str::to_string)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_capi_holds_a_persons_deletion_of_the_leaders_machine_until_its_member_is_removed() {
    // One scenario at a time, and none beside the other tests that change
    // the real API server's CRDs (crate::REAL_API_SERVER says why).
    let _one = crate::REAL_API_SERVER.lock().await;
    person_deletes_the_leaders_machine(
        "real_capi_holds_a_persons_deletion_of_the_leaders_machine_until_its_member_is_removed",
        "leader",
        None,
    )
    .await;
}

/// The hook is what holds the deletion, not our controller's speed: with our
/// controller stopped CAPI waits on the hook (member still in etcd, Machine
/// still there) for as long as it is down; started again, it finishes the
/// removal as above.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_capi_waits_on_the_hook_while_our_controller_is_down() {
    // One scenario at a time, and none beside the other tests that change
    // the real API server's CRDs (crate::REAL_API_SERVER says why).
    let _one = crate::REAL_API_SERVER.lock().await;
    person_deletes_the_leaders_machine(
        "real_capi_waits_on_the_hook_while_our_controller_is_down",
        "down",
        Some(Duration::from_secs(20)),
    )
    .await;
}

/// `controller_down`: stop our controller before the deletion and start it
/// again this long after.
async fn person_deletes_the_leaders_machine(
    test: &str,
    suffix: &str,
    controller_down: Option<Duration>,
) {
    let Ok(path) = std::env::var(KUBECONFIG_ENV) else {
        docker_support::skip(
            test,
            &format!(
                "{KUBECONFIG_ENV} is not set (it names the kubeconfig of a management API server \
                 running Cluster API's core manager, with CAPI's and the KThreesConfig CRDs installed)"
            ),
        );
        return;
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
    let base = std::env::var(NAMESPACE_ENV).unwrap_or_else(|_| "k3scp-real-capi".into());
    let ns = format!("{base}-{suffix}");
    let kubeconfig = kube::config::Kubeconfig::read_from(&path).expect("read the kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("a usable kubeconfig");
    let client = Client::try_from(config).expect("a client");

    // CAPI's and the bootstrap provider's CRDs must be there (installed by hand).
    let crd_api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for name in [
        "machines.cluster.x-k8s.io",
        "clusters.cluster.x-k8s.io",
        "kthreesconfigs.bootstrap.cluster.x-k8s.io",
    ] {
        crd_api
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("CRD {name} must be installed on the real API server: {e}"));
    }
    for crd in crds::ours() {
        apply_crd(&client, &crd).await;
    }
    for (kind, plural) in [
        ("DockerCluster", "dockerclusters"),
        ("DockerMachine", "dockermachines"),
        ("DockerMachineTemplate", "dockermachinetemplates"),
    ] {
        apply_crd(&client, &infra_crd(kind, plural)).await;
    }

    let namespaces: Api<Namespace> = Api::all(client.clone());
    if namespaces.get_opt(&ns).await.unwrap().is_none() {
        namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
            )
            .await
            .unwrap();
    }
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), &ns);
    assert!(
        clusters
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "namespace {ns} already holds a Cluster: set {NAMESPACE_ENV} to a fresh one"
    );

    // The workload side: real etcd, and a workload API server serving what
    // CAPI's drain and volume-detach wait read.
    let etcd = EtcdTestCluster::builder()
        .members(3)
        .start()
        .await
        .expect("etcd");
    let workload = TestApiServer::builder()
        .with_core_resources()
        .resource(ResourceDef::of::<DaemonSet>())
        .resource(ResourceDef::of::<VolumeAttachment>())
        .start()
        .await
        .expect("workload API server");
    let workload_addr: std::net::SocketAddr = workload
        .url()
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .expect("the workload API server's address");

    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let kubeconfig = k3s_control_plane::yaml::to_string(&workload.kubeconfig()).unwrap();
    secrets
        .create(
            &PostParams::default(),
            &secret(
                &ns,
                format!("{CLUSTER}-kubeconfig"),
                BTreeMap::from([("value".into(), kubeconfig)]),
            ),
        )
        .await
        .unwrap();
    secrets
        .create(
            &PostParams::default(),
            &secret(
                &ns,
                format!("{CLUSTER}-etcd"),
                BTreeMap::from([
                    ("tls.crt".into(), etcd.ca_pem().to_string()),
                    ("tls.key".into(), etcd.ca_key_pem().to_string()),
                ]),
            ),
        )
        .await
        .unwrap();
    for (name, cn) in [
        (format!("{CLUSTER}-ca"), "k3s-server-ca"),
        (format!("{CLUSTER}-cca"), "k3s-client-ca"),
    ] {
        let ca =
            k3s_control_plane::pki::generate_ca(cn, k3s_control_plane::pki::CA_LIFETIME).unwrap();
        secrets
            .create(
                &PostParams::default(),
                &secret(
                    &ns,
                    name,
                    BTreeMap::from([
                        ("tls.crt".into(), ca.cert_pem.clone()),
                        ("tls.key".into(), ca.key_pem.clone()),
                    ]),
                ),
            )
            .await
            .unwrap();
    }
    secrets
        .create(
            &PostParams::default(),
            &secret(
                &ns,
                format!("{CLUSTER}-token"),
                BTreeMap::from([("value".into(), k3s_control_plane::pki::generate_token())]),
            ),
        )
        .await
        .unwrap();

    // Infrastructure: ready from the start (nothing provisions here).
    let docker_clusters: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns, &docker_cluster());
    let mut dc = DynamicObject::new(CLUSTER, &docker_cluster()).within(&ns);
    dc.data = json!({"spec": {"controlPlaneEndpoint": {
        "host": workload_addr.ip().to_string(), "port": workload_addr.port()
    }}});
    docker_clusters
        .create(&PostParams::default(), &dc)
        .await
        .unwrap();
    docker_clusters
        .patch_status(
            CLUSTER,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"ready": true, "initialization": {"provisioned": true}}}),
            ),
        )
        .await
        .unwrap();
    let templates: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns, &docker_machine_template());
    let mut template =
        DynamicObject::new(&format!("{KCP}-template"), &docker_machine_template()).within(&ns);
    template.data = json!({"spec": {"template": {"spec": {"extraMounts": []}}}});
    templates
        .create(&PostParams::default(), &template)
        .await
        .unwrap();

    let cluster = clusters
        .create(
            &PostParams::default(),
            &in_namespace(cluster_object(CLUSTER, KCP), &ns),
        )
        .await
        .expect("create the Cluster");
    let kcps: Api<KThreesControlPlane> = Api::namespaced(client.clone(), &ns);
    let mut kcp = in_namespace(kcp_object(KCP, &cluster, 3), &ns);
    kcp.metadata.finalizers = Some(vec![KCP_FINALIZER.to_string()]);
    let kcp = kcps
        .create(&PostParams::default(), &kcp)
        .await
        .expect("create the KThreesControlPlane");
    kcps.patch_status(KCP, &PatchParams::default(), &Patch::Merge(json!({"status": {"initialized": true, "initialization": {"controlPlaneInitialized": true}}})))
        .await
        .unwrap();

    // Each member's server: Node (with providerID), etcd-proxy DaemonSet pod,
    // KThreesConfig (ready), DockerMachine (provisioned) and the Machine, with
    // our hook from birth as our controller creates it.
    let nodes: Api<Node> = Api::all(workload.client());
    let daemonsets: Api<DaemonSet> = Api::namespaced(workload.client(), "kube-system");
    let ds = daemonsets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "etcd-proxy", "namespace": "kube-system"},
                "spec": {"selector": {"matchLabels": {"app": "etcd-proxy"}},
                    "template": {"metadata": {"labels": {"app": "etcd-proxy"}},
                        "spec": {"containers": [{"name": "etcd-proxy", "image": "alpine/socat"}]}}}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(workload.client(), "kube-system");
    let configs: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &kthrees_config());
    let infra_machines: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns, &docker_machine());
    let machines: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns, &machine_resource());
    let typed_machines: Api<k3s_control_plane::api::Machine> = Api::namespaced(client.clone(), &ns);
    let mut names = vec![];
    for i in 0..3 {
        let m = etcd.member(i);
        let (node, ip, member) = (m.node_name.clone(), m.ip.to_string(), m.name.clone());
        let created: Node = nodes
            .create(&PostParams::default(), &serde_json::from_value(json!({
                "metadata": {"name": node,
                    "labels": {NODE_ROLE_CONTROL_PLANE_LABEL: "true", NODE_ROLE_ETCD_LABEL: "true"},
                    "annotations": {K3S_ETCD_NODE_NAME_ANNOTATION: member, K3S_ETCD_NODE_ADDRESS_ANNOTATION: ip}},
                "spec": {"providerID": provider_id(&node)}
            })).unwrap())
            .await
            .unwrap();
        nodes
            .patch_status(&created.name_any(), &PatchParams::default(), &Patch::Merge(json!({"status": {
                "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": node}],
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]
            }})))
            .await
            .unwrap();
        let pod_name = format!("etcd-proxy-{i}x{i}q{i}");
        pods.create(&PostParams::default(), &serde_json::from_value(json!({
            "metadata": {"name": pod_name, "namespace": "kube-system", "labels": {"app": "etcd-proxy"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "etcd-proxy",
                    "uid": ds.uid().unwrap(), "controller": true, "blockOwnerDeletion": true}]},
            "spec": {"nodeName": node, "containers": [{"name": "etcd-proxy", "image": "alpine/socat"}]}
        })).unwrap())
        .await
        .unwrap();
        pods.patch_status(
            &pod_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running", "hostIP": ip}})),
        )
        .await
        .unwrap();

        let name = node.clone();
        let mut config = DynamicObject::new(&name, &kthrees_config()).within(&ns);
        config.data = json!({"spec": {}});
        configs
            .create(&PostParams::default(), &config)
            .await
            .unwrap();
        configs
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(json!({"status": {"ready": true, "dataSecretName": format!("{name}-bootstrap")}})))
            .await
            .unwrap();
        let mut infra = DynamicObject::new(&name, &docker_machine()).within(&ns);
        infra.data = json!({"spec": {"providerID": provider_id(&node)}});
        infra_machines
            .create(&PostParams::default(), &infra)
            .await
            .unwrap();
        infra_machines
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {
                    "ready": true, "initialization": {"provisioned": true},
                    "addresses": [{"type": "InternalIP", "address": ip}]
                }})),
            )
            .await
            .unwrap();

        let owner = kcp.controller_owner_ref(&()).unwrap();
        let machine: k3s_control_plane::api::Machine = serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": name, "namespace": ns,
                "labels": {CLUSTER_NAME_LABEL: CLUSTER, CONTROL_PLANE_LABEL: "", CONTROL_PLANE_NAME_LABEL: KCP},
                "annotations": {
                    SPEC_HASH_ANNOTATION: k3s_control_plane::rollout::spec_hash(&kcp),
                    PRE_TERMINATE_HOOK_ANNOTATION: k3s_control_plane::remediation::steps::BORN_HOOK_VALUE,
                },
                "ownerReferences": [owner]},
            "spec": {"clusterName": CLUSTER, "version": kcp.spec.version,
                "bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "KThreesConfig", "name": name}},
                "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": name}}
        }))
        .unwrap();
        typed_machines
            .create(&PostParams::default(), &machine)
            .await
            .expect("create a Machine");
        names.push(name);
    }

    // CAPI (not us) finds each Node by providerID and sets the nodeRef, and
    // puts its finalizer on.
    wait(
        "CAPI to set every Machine's nodeRef and finalizer",
        LIMIT,
        || async {
            for name in &names {
                let m = machines.get(name).await.map_err(|e| e.to_string())?;
                if m.data.pointer("/status/nodeRef/name").is_none() {
                    return Err(format!("{name}: no nodeRef yet"));
                }
                if !m
                    .finalizers()
                    .iter()
                    .any(|f| f == "machine.cluster.x-k8s.io")
                {
                    return Err(format!("{name}: no CAPI finalizer yet"));
                }
            }
            Ok(())
        },
    )
    .await;

    let settings = k3s_control_plane::controller::Settings {
        etcd_transport: TransportMode::Direct,
        namespace: Some(ns.clone()),
        ..fast_settings()
    };
    let mut controller = Some(spawn_controller(controller_context(
        client.clone(),
        settings.clone(),
    )));

    // Settled: the KCP reports 3 ready replicas and every Machine carries our hook.
    wait(
        "the control plane to report 3 ready replicas",
        LIMIT,
        || async {
            let k = kcps.get(KCP).await.map_err(|e| e.to_string())?;
            let status = serde_json::to_value(&k.status).unwrap_or_default();
            let ready = status
                .get("readyReplicas")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            (ready == 3)
                .then_some(())
                .ok_or_else(|| format!("status {status}"))
        },
    )
    .await;
    for name in &names {
        let m = machines.get(name).await.unwrap();
        assert_eq!(
            hook(&serde_json::to_value(&m).unwrap()).as_deref(),
            Some(""),
            "{name} carries our hook from birth"
        );
    }

    // A person deletes the etcd leader's Machine.
    let admin = etcd.connect();
    let before = admin.snapshot().await.expect("etcd snapshot");
    let leader = before.leader.expect("a leader");
    let target_index = etcd.index_of(leader).expect("the leader is ours");
    let target = names[target_index].clone();
    let target_member = etcd.member(target_index).name.clone();
    if controller_down.is_some() {
        controller.take().expect("running").stop().await;
        println!("our controller is stopped");
    }
    println!("deleting Machine {target} (runs etcd leader {target_member}, id {leader:x})");
    let started_wall = chrono::Utc::now();
    let started = Instant::now();
    machines
        .delete(&target, &DeleteParams::default())
        .await
        .expect("delete the Machine");

    #[derive(Default)]
    struct Seen {
        reason: Option<String>,
        v1beta1: Option<String>,
        hook: Option<String>,
        leader: Option<String>,
        listed: bool,
    }
    let mut seen = Seen {
        listed: true,
        ..Default::default()
    };
    let mut timeline: Vec<(Duration, String)> = vec![];
    let mut member_gone: Option<Duration> = None;
    let mut machine_gone: Option<Duration> = None;
    let mut waited_on_hook: Option<Duration> = None;
    let mut hook_released: Option<Duration> = None;
    let mut leader_while_listed: Vec<String> = vec![];
    let mut still_held_when_restarted = None;
    while started.elapsed() < LIMIT {
        let now = started.elapsed();
        if let Some(down) = controller_down
            && controller.is_none()
            && now >= down
        {
            still_held_when_restarted =
                Some((machine_gone.is_none(), seen.listed, seen.reason.clone()));
            controller = Some(spawn_controller(controller_context(
                client.clone(),
                settings.clone(),
            )));
            timeline.push((now, "our controller started again".to_string()));
        }
        if machine_gone.is_none() {
            match machines.get_opt(&target).await {
                Ok(Some(m)) => {
                    let v = serde_json::to_value(&m).unwrap();
                    let reason = deleting_reason(&v);
                    if reason != seen.reason {
                        timeline.push((
                            now,
                            format!(
                                "Machine condition Deleting={}",
                                reason.clone().unwrap_or_default()
                            ),
                        ));
                        if reason.as_deref() == Some("True/WaitingForPreTerminateHook")
                            && waited_on_hook.is_none()
                        {
                            waited_on_hook = Some(now);
                        }
                        seen.reason = reason;
                    }
                    let v1 = v1beta1_hook_condition(&v);
                    if v1 != seen.v1beta1 {
                        timeline.push((
                            now,
                            format!(
                                "Machine v1beta1 condition PreTerminateDeleteHookSucceeded={}",
                                v1.clone().unwrap_or_default()
                            ),
                        ));
                        seen.v1beta1 = v1;
                    }
                    let h = hook(&v);
                    if h != seen.hook || now.is_zero() {
                        timeline.push((now, format!("hook annotation: {h:?}")));
                        if h.is_none() && hook_released.is_none() {
                            hook_released = Some(now);
                        }
                        seen.hook = h;
                    }
                }
                Ok(None) => {
                    machine_gone = Some(now);
                    timeline.push((now, format!("Machine {target} is gone (404)")));
                }
                Err(e) => timeline.push((now, format!("get Machine: {e}"))),
            }
        }
        if member_gone.is_none()
            && let Ok(s) = admin.snapshot().await
        {
            let listed = s.members.iter().any(|m| m.name == target_member);
            let leader = s
                .leader
                .and_then(|id| s.members.iter().find(|m| m.id == id))
                .map(|m| m.name.clone());
            if leader != seen.leader {
                timeline.push((now, format!("etcd leader: {leader:?}")));
                seen.leader = leader.clone();
            }
            if listed {
                leader_while_listed.extend(leader);
            } else {
                member_gone = Some(now);
                timeline.push((
                    now,
                    format!("member {target_member} gone from the etcd member list"),
                ));
            }
            seen.listed = listed;
        }
        if machine_gone.is_some() && member_gone.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // After the Machine: CAPI deleted its Node (after the infrastructure), and
    // our controller creates the replacement, with our hook from creation.
    let node_name = etcd.member(target_index).node_name.clone();
    if machine_gone.is_some() {
        let node_gone = wait(
            "CAPI to delete the Node in the workload cluster",
            LIMIT,
            || async {
                match nodes.get_opt(&node_name).await {
                    Ok(None) => Ok(started.elapsed()),
                    Ok(Some(_)) => Err("still there".to_string()),
                    Err(e) => Err(e.to_string()),
                }
            },
        )
        .await;
        timeline.push((
            node_gone,
            format!("Node {node_name} gone from the workload cluster (seen by then)"),
        ));
        let (at, replacement, replacement_hook) =
            wait("the replacement Machine", LIMIT, || async {
                let list = machines
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?;
                list.items
                    .iter()
                    .find(|m| !names.contains(&m.name_any()))
                    .map(|m| {
                        (
                            started.elapsed(),
                            m.name_any(),
                            hook(&serde_json::to_value(m).unwrap()),
                        )
                    })
                    .ok_or_else(|| "none yet".to_string())
            })
            .await;
        timeline.push((
            at,
            format!("replacement Machine {replacement} seen, hook annotation {replacement_hook:?}"),
        ));
        assert_eq!(
            replacement_hook.as_deref(),
            Some(""),
            "the replacement carries our hook from creation"
        );
    }

    // Events (ours and CAPI's), by time relative to the deletion.
    let mut events: Vec<(i64, String)> = vec![];
    let ev2: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), &ns);
    for e in ev2.list(&ListParams::default()).await.unwrap().items {
        let at = e
            .event_time
            .as_ref()
            .map(|t| t.0.as_millisecond())
            .or_else(|| {
                e.metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| t.0.as_millisecond())
            });
        if let Some(at) = at {
            let count = e.series.as_ref().map(|s| s.count).unwrap_or(1);
            events.push((
                at - started_wall.timestamp_millis(),
                format!(
                    "events.k8s.io {} {} (x{count}) by {}: {}",
                    e.type_.unwrap_or_default(),
                    e.reason.unwrap_or_default(),
                    e.reporting_controller.unwrap_or_default(),
                    e.note.unwrap_or_default()
                ),
            ));
        }
    }
    let ev1: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), &ns);
    for e in ev1.list(&ListParams::default()).await.unwrap().items {
        // events.k8s.io Events show up here too; keep the core-only ones.
        if e.event_time.is_some() {
            continue;
        }
        let at = e
            .first_timestamp
            .as_ref()
            .or(e.metadata.creation_timestamp.as_ref())
            .map(|t| t.0.as_millisecond());
        if let Some(at) = at {
            events.push((
                at - started_wall.timestamp_millis(),
                format!(
                    "core/v1 {} {} (x{}) by {}: {}",
                    e.type_.unwrap_or_default(),
                    e.reason.unwrap_or_default(),
                    e.count.unwrap_or(1),
                    e.source.and_then(|s| s.component).unwrap_or_default(),
                    e.message.unwrap_or_default()
                ),
            ));
        }
    }
    events.sort();
    timeline.sort_by_key(|(at, _)| *at);
    println!("--- timeline (sampled every 100 ms from the delete call) ---");
    for (at, what) in &timeline {
        println!("{:>8.1} s  {what}", at.as_secs_f64());
    }
    println!("--- events (relative to the delete call, second resolution for core/v1) ---");
    for (at, what) in &events {
        println!("{:>8.3} s  {what}", *at as f64 / 1000.0);
    }
    let now_machines: Vec<String> = machines
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|m| {
            format!(
                "{} (created {:?})",
                m.name_any(),
                m.metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| t.0.to_string())
            )
        })
        .collect();
    println!("Machines now: {now_machines:?}");

    let member_gone = member_gone.expect("the member was removed from etcd");
    let machine_gone = machine_gone.expect("CAPI finished deleting the Machine");
    let waited_on_hook =
        waited_on_hook.expect("CAPI reported Deleting=True WaitingForPreTerminateHook");
    let hook_released = hook_released.expect("our hook was released");
    assert!(
        member_gone < machine_gone,
        "member gone at {member_gone:?}, Machine gone at {machine_gone:?}"
    );
    assert!(
        waited_on_hook < hook_released,
        "CAPI waited on the hook ({waited_on_hook:?}) before it was released ({hook_released:?})"
    );
    assert!(
        member_gone <= hook_released,
        "hook released ({hook_released:?}) only after the member left ({member_gone:?})"
    );
    assert!(
        leader_while_listed
            .last()
            .is_some_and(|l| *l != target_member),
        "leadership had moved off {target_member} before its removal: leaders seen while listed {leader_while_listed:?}"
    );
    let reasons: Vec<&str> = events.iter().map(|(_, w)| w.as_str()).collect();
    for reason in ["EtcdMemberRemoved", "PreTerminateHookReleased"] {
        assert!(
            reasons.iter().any(|w| w.contains(&format!(" {reason} "))),
            "an Event {reason}: {reasons:#?}"
        );
    }
    if let Some(down) = controller_down {
        assert_eq!(
            still_held_when_restarted,
            Some((
                true,
                true,
                Some("True/WaitingForPreTerminateHook".to_string())
            )),
            "after {down:?} with our controller down: Machine still there, member still listed, CAPI waiting on the hook"
        );
        assert!(member_gone > down && machine_gone > down);
    }
    println!(
        "PASS: CAPI waited on the hook at {:.1} s; member gone at {:.1} s; hook released at {:.1} s; Machine gone at {:.1} s",
        waited_on_hook.as_secs_f64(),
        member_gone.as_secs_f64(),
        hook_released.as_secs_f64(),
        machine_gone.as_secs_f64()
    );
    if let Some(controller) = controller {
        controller.stop().await;
    }
}
