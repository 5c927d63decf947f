//! A whole local world for end-to-end tests and the demo: a real etcd cluster
//! as the workload cluster's embedded etcd, a test API server as the management
//! cluster (our CRDs, CAPI's, a Cluster, a KThreesControlPlane with its
//! Machines, the kubeconfig and etcd CA Secrets) and one as the workload
//! cluster (control-plane Nodes annotated as k3s does), plus the simulation of
//! CAPI's Machine deletion.
//!
//! Each Machine's Node has the InternalIP of its member's own loopback address
//! and the k3s etcd annotations, so endpoints are derived exactly as on real
//! k3s nodes: nothing in the production path is overridden for tests.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeCondition, NodeStatus, Pod, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, OwnerReference, Time};
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::api::conditions::V1Beta1Condition;
use crate::api::conversion::KnownApiVersions;
use crate::api::machine::{
    Bootstrap, MachineAddress, MachineNodeReference, MachineSpec, MachineStatus,
};
use crate::api::names::{
    CLUSTER_NAME_LABEL, CONTRACT_LABEL_V1BETA1, CONTROL_PLANE_LABEL, CONTROL_PLANE_NAME_LABEL,
    K3S_ETCD_NODE_ADDRESS_ANNOTATION, K3S_ETCD_NODE_NAME_ANNOTATION, NODE_ROLE_CONTROL_PLANE_LABEL,
    NODE_ROLE_ETCD_LABEL,
};
use crate::api::refs::ContractVersionedObjectReference;
use crate::api::{Cluster, KThreesControlPlane, Machine, crds};
use crate::apiserver::{ResourceDef, Scope, TestApiServer, TestApiServerBuilder};
use crate::controller::etcd_pool::EtcdPool;
use crate::controller::metrics::Metrics;
use crate::controller::{self, Context, Settings};
use crate::etcd::Timeouts;

use super::capi_sim::MachineDeletionSim;
use super::etcd::EtcdTestCluster;
use super::our_crds::with_our_crds;

pub const NAMESPACE: &str = "default";
pub const CLUSTER: &str = "demo";
pub const KCP: &str = "demo-control-plane";
pub const VERSION: &str = "v1.30.2+k3s2";

/// Anything that went wrong building the sandbox (test support: a message).
#[derive(Debug, thiserror::Error)]
#[error("sandbox: {0}")]
pub struct SandboxError(pub String);

fn err(context: &str) -> impl Fn(kube::Error) -> SandboxError + '_ {
    move |e| SandboxError(format!("{context}: {e}"))
}

/// The infrastructure kinds the sandbox's Machines reference (CAPD's names).
pub fn docker_machine_template() -> ApiResource {
    ApiResource {
        group: "infrastructure.cluster.x-k8s.io".into(),
        version: "v1beta1".into(),
        api_version: "infrastructure.cluster.x-k8s.io/v1beta1".into(),
        kind: "DockerMachineTemplate".into(),
        plural: "dockermachinetemplates".into(),
    }
}

pub fn docker_machine() -> ApiResource {
    ApiResource {
        group: "infrastructure.cluster.x-k8s.io".into(),
        version: "v1beta1".into(),
        api_version: "infrastructure.cluster.x-k8s.io/v1beta1".into(),
        kind: "DockerMachine".into(),
        plural: "dockermachines".into(),
    }
}

/// A management-cluster test API server with every kind the controller uses.
pub async fn management_server() -> Result<TestApiServer, SandboxError> {
    management_server_with(|builder| builder).await
}

/// As [`management_server`], with the builder adjusted first (e.g. RBAC
/// enforcement and a service account's token).
pub async fn management_server_with(
    configure: impl FnOnce(TestApiServerBuilder) -> TestApiServerBuilder,
) -> Result<TestApiServer, SandboxError> {
    // With object_store's S3 client, rustls has both ring and aws-lc-rs and
    // no longer picks a provider itself: kube's client config would panic.
    crate::install_crypto_provider();
    let server = configure(management_builder())
        .start()
        .await
        .map_err(|e| SandboxError(format!("management API server: {e}")))?;
    install_crd_objects(&server.client()).await?;
    Ok(server)
}

/// Every kind the controller uses, as a management cluster serves them: the
/// core kinds, our CRDs with our conversion ([`with_our_crds`]), CAPI's and
/// the bootstrap provider's, the infrastructure kinds and the
/// CustomResourceDefinitions (their objects: [`install_crd_objects`]). Every
/// test server standing in for a management cluster starts from this.
pub fn management_builder() -> TestApiServerBuilder {
    let mut builder = with_our_crds(
        TestApiServer::builder().with_core_resources(),
        infrastructure_api_versions(),
    );
    for crd in crds::test_support_crds() {
        builder = builder.resource(ResourceDef::from_crd(&crd));
    }
    builder
        .resource(ResourceDef::new(
            docker_machine_template(),
            Scope::Namespaced,
        ))
        .resource(ResourceDef::new(docker_machine(), Scope::Namespaced).with_status())
        .resource(ResourceDef::of::<CustomResourceDefinition>())
}

/// The API version of each infrastructure kind the sandbox serves, as our
/// conversion webhook would read it from the contract labels of its CRD
/// ([`infrastructure_crd`]).
fn infrastructure_api_versions() -> KnownApiVersions {
    [docker_machine_template(), docker_machine()]
        .into_iter()
        .map(|r| ((r.group, r.kind), r.api_version))
        .collect()
}

/// The CustomResourceDefinition objects of every kind the sandbox serves, as
/// a management cluster has them: the controller reads their CAPI contract
/// labels to tell the API version of a kind referenced by group only.
pub async fn install_crd_objects(client: &kube::Client) -> Result<(), SandboxError> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let infrastructure = [docker_machine_template(), docker_machine()]
        .into_iter()
        .map(|r| infrastructure_crd(&r));
    for crd in crds::ours()
        .into_iter()
        .chain(crds::test_support_crds())
        .chain(infrastructure)
    {
        match api.create(&PostParams::default(), &crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => {
                return Err(SandboxError(format!(
                    "create CustomResourceDefinition {}: {e}",
                    crd.name_any()
                )));
            }
        }
    }
    Ok(())
}

/// A CRD object for an infrastructure kind, labelled for the v1beta1
/// contract at its one version (as a provider of that contract labels it).
pub fn infrastructure_crd(resource: &ApiResource) -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {
            "name": format!("{}.{}", resource.plural, resource.group),
            "labels": {CONTRACT_LABEL_V1BETA1: resource.version},
        },
        "spec": {
            "group": resource.group, "scope": "Namespaced",
            "names": {"kind": resource.kind, "plural": resource.plural},
            "versions": [{"name": resource.version, "served": true, "storage": true,
                          "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}],
        },
    }))
    .expect("a well-formed CustomResourceDefinition")
}

/// A `Cluster` whose control plane is the KThreesControlPlane `kcp`.
pub fn cluster_object(name: &str, kcp: &str) -> Cluster {
    serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "controlPlaneRef": {"apiGroup": "controlplane.cluster.x-k8s.io", "kind": "KThreesControlPlane", "name": kcp},
            "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerCluster", "name": name}
        }
    }))
    .expect("a well-formed Cluster")
}

/// A KThreesControlPlane owned by `cluster` (as created, with its uid), with
/// `replicas` machines cloned from `<name>-template`.
pub fn kcp_object(name: &str, cluster: &Cluster, replicas: i32) -> KThreesControlPlane {
    let cluster_name = cluster.name_any();
    serde_json::from_value(json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta3", "kind": "KThreesControlPlane",
        "metadata": {
            "name": name, "namespace": NAMESPACE,
            "labels": {CLUSTER_NAME_LABEL: cluster_name},
            "ownerReferences": [{
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "name": cluster_name,
                "uid": cluster.uid().unwrap_or_default(), "controller": true, "blockOwnerDeletion": true
            }]
        },
        "spec": {
            "replicas": replicas, "version": VERSION,
            "machineTemplate": {"spec": {"infrastructureRef": {
                "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachineTemplate",
                "name": format!("{name}-template")
            }}},
            "kthreesConfigSpec": {"serverConfig": {"disableComponents": ["traefik"]}},
            "remediation": {"minHealthyPeriodSeconds": 3600}
        }
    }))
    .expect("a well-formed KThreesControlPlane")
}

/// The infrastructure template `<kcp>-template` the control plane clones from.
pub async fn create_machine_template(client: &kube::Client) -> Result<(), SandboxError> {
    let templates: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), NAMESPACE, &docker_machine_template());
    let mut template = DynamicObject::new(&format!("{KCP}-template"), &docker_machine_template())
        .within(NAMESPACE);
    template.data = json!({"spec": {"template": {"spec": {"extraMounts": []}}}});
    templates
        .create(&PostParams::default(), &template)
        .await
        .map_err(err("create DockerMachineTemplate"))?;
    Ok(())
}

/// What CAPI's Cluster controller reports once the infrastructure provider is
/// done: `status.initialization.infrastructureProvisioned`.
pub async fn mark_infrastructure_provisioned(
    clusters: &Api<Cluster>,
    name: &str,
) -> Result<(), SandboxError> {
    let status = json!({"status": {"initialization": {"infrastructureProvisioned": true}}});
    clusters
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .map_err(err("mark Cluster infrastructure provisioned"))?;
    Ok(())
}

/// Mark a control plane initialized, as its first server joining would.
pub async fn mark_initialized(
    kcps: &Api<KThreesControlPlane>,
    name: &str,
) -> Result<(), SandboxError> {
    let status = json!({"status": {"initialized": true, "initialization": {"controlPlaneInitialized": true}}});
    kcps.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .map_err(err("initialize KThreesControlPlane status"))?;
    Ok(())
}

/// The running controller, stoppable (a clean shutdown) or abortable (a crash).
pub struct ControllerHandle {
    pub ctx: Arc<Context>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl ControllerHandle {
    /// Graceful shutdown; waits for the controller loop to end.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }
}

impl Drop for ControllerHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Settings for tests and the demo: short requeues, the same rules.
pub fn fast_settings() -> Settings {
    Settings {
        wait_requeue: Duration::from_millis(500),
        idle_requeue: Duration::from_secs(5),
        error_backoff_min: Duration::from_millis(200),
        error_backoff_max: Duration::from_secs(5),
        orphan_grace: Duration::from_secs(3),
        ..Settings::default()
    }
}

/// [`fast_settings`] with one removal step per reconcile (no chaining): for
/// tests that stop, or strike, between two particular steps.
pub fn one_step_settings() -> Settings {
    Settings {
        max_chained_steps: 0,
        ..fast_settings()
    }
}

/// A controller context on `client` (a management API), with `settings`.
pub fn controller_context(client: kube::Client, settings: Settings) -> Arc<Context> {
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Metrics::register(&mut registry);
    let timeouts = Timeouts {
        confirm: Duration::from_secs(30),
        ..Timeouts::default()
    };
    Context::new(client, metrics, EtcdPool::with_timeouts(timeouts), settings)
}

/// Run the real controller loop with `ctx` until the handle stops or drops.
pub fn spawn_controller(ctx: Arc<Context>) -> ControllerHandle {
    let (stop, stopped) = oneshot::channel::<()>();
    let run_ctx = ctx.clone();
    let task = tokio::spawn(async move {
        controller::run(run_ctx, async {
            let _ = stopped.await;
        })
        .await;
    });
    ControllerHandle {
        ctx,
        stop: Some(stop),
        task,
    }
}

pub struct Sandbox {
    pub etcd: EtcdTestCluster,
    pub management: TestApiServer,
    pub workload: TestApiServer,
    _capi: MachineDeletionSim,
    /// Machine names, in member order (machine i runs member i).
    pub machines: Vec<String>,
    /// What each snapshot restore did, in order, failed ones included
    /// ([`super::restore`]).
    pub restores: Vec<super::restore_record::RestoreRecord>,
}

impl Sandbox {
    /// A world of `members` control-plane Machines, each running one member of a
    /// real `members`-member etcd cluster; the control plane is initialized.
    pub async fn start(members: usize) -> Result<Self, SandboxError> {
        Self::start_with(EtcdTestCluster::builder().members(members), members).await
    }

    /// As [`start`](Self::start), with the etcd cluster built by `etcd` (e.g.
    /// `partitionable()`), which must start `members` voters.
    pub async fn start_with(
        etcd: super::etcd::EtcdTestClusterBuilder,
        members: usize,
    ) -> Result<Self, SandboxError> {
        let etcd = etcd
            .start()
            .await
            .map_err(|e| SandboxError(format!("etcd cluster: {e}")))?;
        let management = management_server().await?;
        let workload = TestApiServer::builder()
            .with_core_resources()
            .start()
            .await
            .map_err(|e| SandboxError(format!("workload API server: {e}")))?;
        let capi = MachineDeletionSim::start(management.client());
        let mut sandbox = Sandbox {
            etcd,
            management,
            workload,
            _capi: capi,
            machines: vec![],
            restores: vec![],
        };
        sandbox.populate(members).await?;
        Ok(sandbox)
    }

    pub fn client(&self) -> kube::Client {
        self.management.client()
    }

    /// The last restore `machine`'s boot carried out or tried
    /// ([`super::restore`]), with every step it took.
    pub fn restore_of(&self, machine: &str) -> Option<&super::restore_record::RestoreRecord> {
        self.restores.iter().rev().find(|r| r.machine == machine)
    }

    pub fn machines_api(&self) -> Api<Machine> {
        Api::namespaced(self.client(), NAMESPACE)
    }

    pub fn kcp_api(&self) -> Api<KThreesControlPlane> {
        Api::namespaced(self.client(), NAMESPACE)
    }

    async fn populate(&mut self, members: usize) -> Result<(), SandboxError> {
        let client = self.client();
        let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
        let kubeconfig = crate::yaml::to_string(&self.workload.kubeconfig())
            .map_err(|e| SandboxError(format!("workload kubeconfig: {e}")))?;
        let secret = |name: String, data: BTreeMap<String, String>| Secret {
            metadata: ObjectMeta {
                name: Some(name),
                labels: Some(BTreeMap::from([(
                    CLUSTER_NAME_LABEL.to_string(),
                    CLUSTER.to_string(),
                )])),
                ..ObjectMeta::default()
            },
            type_: Some("cluster.x-k8s.io/secret".into()),
            string_data: Some(data),
            ..Secret::default()
        };
        secrets
            .create(
                &PostParams::default(),
                &secret(
                    format!("{CLUSTER}-kubeconfig"),
                    BTreeMap::from([("value".into(), kubeconfig)]),
                ),
            )
            .await
            .map_err(err("create kubeconfig Secret"))?;
        secrets
            .create(
                &PostParams::default(),
                &secret(
                    format!("{CLUSTER}-etcd"),
                    BTreeMap::from([
                        ("tls.crt".into(), self.etcd.ca_pem().to_string()),
                        ("tls.key".into(), self.etcd.ca_key_pem().to_string()),
                    ]),
                ),
            )
            .await
            .map_err(err("create etcd CA Secret"))?;

        let clusters: Api<Cluster> = Api::namespaced(client.clone(), NAMESPACE);
        let cluster = cluster_object(CLUSTER, KCP);
        let cluster = clusters
            .create(&PostParams::default(), &cluster)
            .await
            .map_err(err("create Cluster"))?;
        mark_infrastructure_provisioned(&clusters, CLUSTER).await?;

        create_machine_template(&client).await?;

        // A control plane that was brought up before: our finalizer is on it
        // and the cluster Secrets exist (here as a user would supply them).
        for (name, ca) in [
            (format!("{CLUSTER}-ca"), "k3s-server-ca"),
            (format!("{CLUSTER}-cca"), "k3s-client-ca"),
        ] {
            let ca = crate::pki::generate_ca(ca, crate::pki::CA_LIFETIME)
                .map_err(|e| SandboxError(format!("generate {name}: {e}")))?;
            secrets
                .create(
                    &PostParams::default(),
                    &secret(
                        name.clone(),
                        BTreeMap::from([
                            ("tls.crt".into(), ca.cert_pem.clone()),
                            ("tls.key".into(), ca.key_pem.clone()),
                        ]),
                    ),
                )
                .await
                .map_err(err("create CA Secret"))?;
        }
        secrets
            .create(
                &PostParams::default(),
                &secret(
                    format!("{CLUSTER}-token"),
                    BTreeMap::from([("value".into(), crate::pki::generate_token())]),
                ),
            )
            .await
            .map_err(err("create token Secret"))?;
        let kcps = self.kcp_api();
        let mut kcp = kcp_object(KCP, &cluster, members as i32);
        kcp.metadata.finalizers = Some(vec![crate::api::names::KCP_FINALIZER.to_string()]);
        let kcp = kcps
            .create(&PostParams::default(), &kcp)
            .await
            .map_err(err("create KThreesControlPlane"))?;
        mark_initialized(&kcps, KCP).await?;

        for i in 0..members {
            let member = self.etcd.member(i);
            let (node, ip, member_name) = (
                member.node_name.clone(),
                member.ip.to_string(),
                member.name.clone(),
            );
            let proxied = member.listen_client_addr();
            self.add_node(&node, &ip, Some(&member_name)).await?;
            self.store_node_key(i, &node).await?;
            self.add_etcd_proxy(&node, proxied).await?;
            let machine = node.clone();
            self.add_machine(&kcp, &machine, Some((&node, &ip))).await?;
            self.machines.push(machine);
        }
        Ok(())
    }

    /// Start the simulated k3s on this sandbox's workload cluster and etcd
    /// ([`super::k3s_agent`]).
    pub fn start_k3s_agent(
        &self,
        settings: super::k3s_agent::K3sAgentSettings,
    ) -> super::k3s_agent::K3sAgent {
        super::k3s_agent::K3sAgent::start(
            Api::all(self.workload.client()),
            self.etcd.connect(),
            self.etcd.transport(),
            settings,
        )
    }

    /// k3s writing the name of the member it runs into its Node's
    /// `etcd.k3s.cattle.io/node-name` annotation (N1).
    async fn annotate_member_name(&self, index: usize, name: &str) -> Result<(), SandboxError> {
        let node = self.etcd.member(index).node_name.clone();
        let nodes: Api<Node> = Api::all(self.workload.client());
        nodes
            .patch(
                &node,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"metadata": {"annotations": {
                    K3S_ETCD_NODE_NAME_ANNOTATION: name,
                }}})),
            )
            .await
            .map_err(|e| SandboxError(format!("annotate Node {node} with its new member: {e}")))?;
        Ok(())
    }

    /// k3s restarting on the server of etcd member `index` after its member
    /// was removed (docs/k3s.md T1, T2): the tombstone makes it back up its
    /// data, take a new member name and join again as a learner; once
    /// running, it writes the new name into its Node's
    /// `etcd.k3s.cattle.io/node-name` annotation (N1). Returns the new name.
    pub async fn restart_k3s_server(&mut self, index: usize) -> Result<String, SandboxError> {
        let name = self
            .etcd
            .rejoin_after_tombstone(index)
            .await
            .map_err(|e| SandboxError(format!("rejoin etcd member {index}: {e}")))?;
        self.annotate_member_name(index, &name).await?;
        Ok(name)
    }

    /// k3s restarting on the first server after its member was removed, as
    /// the January 2026 releases did (docs/k3s.md T3): with no `server:` to
    /// rejoin it starts a new one-member cluster of its own on the same
    /// address. Its Node in the workload cluster is left as it was (the new
    /// cluster's k3s writes to its own datastore). Returns the new name.
    pub async fn restart_first_server_alone(
        &mut self,
        index: usize,
    ) -> Result<String, SandboxError> {
        self.etcd
            .restart_as_new_cluster(index)
            .await
            .map_err(|e| SandboxError(format!("restart etcd member {index} as a new cluster: {e}")))
    }

    /// `k3s server --cluster-reset` on the server of etcd member `index`,
    /// then its next normal start (docs/k3s.md CR1, CR2): one member left,
    /// under a new name that its Node's `etcd.k3s.cattle.io/node-name`
    /// annotation then carries; the other servers' etcd stays down and their
    /// Nodes keep their etcd marks. Returns the new name.
    pub async fn cluster_reset(&mut self, index: usize) -> Result<String, SandboxError> {
        let name = self
            .etcd
            .cluster_reset(index)
            .await
            .map_err(|e| SandboxError(format!("cluster reset on etcd member {index}: {e}")))?;
        self.annotate_member_name(index, &name).await?;
        Ok(name)
    }

    /// k3s's supervisor port (6443) on the server of etcd member `index`,
    /// serving a certificate issued by the cluster's server CA (the
    /// `<cluster>-ca` Secret) that expires in `lifetime`, with the node IP in
    /// its SANs unless `ip_in_cert` is false.
    pub async fn serve_k3s_supervisor(
        &self,
        index: usize,
        lifetime: Duration,
        ip_in_cert: bool,
    ) -> Result<super::k3s_supervisor::SupervisorPort, SandboxError> {
        let secrets: Api<Secret> = Api::namespaced(self.client(), NAMESPACE);
        let name = format!("{CLUSTER}-ca");
        let secret = secrets
            .get(&name)
            .await
            .map_err(|e| SandboxError(format!("get Secret {name}: {e}")))?;
        let field = |key: &str| {
            secret
                .data
                .as_ref()
                .and_then(|d| d.get(key))
                .and_then(|b| String::from_utf8(b.0.clone()).ok())
                .ok_or_else(|| SandboxError(format!("Secret {name} has no {key}")))
        };
        let ca = super::pki::TestCa::from_pem(&field("tls.crt")?, &field("tls.key")?)
            .map_err(|e| SandboxError(format!("load the server CA: {e}")))?;
        let member = self.etcd.member(index);
        let cert = super::k3s_supervisor::supervisor_certificate(
            &ca,
            &member.node_name,
            member.ip,
            lifetime,
            ip_in_cert,
        );
        super::k3s_supervisor::SupervisorPort::serve(
            member.ip,
            crate::decision::k3s_serving::DEFAULT_PORT,
            &cert,
        )
        .await
        .map_err(|e| SandboxError(format!("listen on {}:6443: {e}", member.ip)))
    }

    /// The Node's object in etcd, where k3s's API server keeps it
    /// (`/registry/minions/<node>`, docs/k3s.md SR11): what a snapshot of
    /// the cluster carries and a fresh server's etcd lacks. Written through
    /// member `index`; the sandbox's workload API itself is not backed by
    /// this etcd.
    pub async fn store_node_key(&self, index: usize, node: &str) -> Result<(), SandboxError> {
        let key = format!("{}{node}", crate::decision::etcd_restore::NODE_KEY_PREFIX);
        let value = serde_json::to_vec(&json!({"kind": "Node", "metadata": {"name": node}}))
            .expect("a Node serializes");
        self.etcd
            .put(index, &key, value)
            .await
            .map_err(|e| SandboxError(format!("store {key} in etcd: {e}")))
    }

    /// A control-plane Node in the workload cluster, as k3s registers it.
    /// `member`: the etcd member it runs (None: `--disable-etcd`).
    pub async fn add_node(
        &self,
        name: &str,
        ip: &str,
        member: Option<&str>,
    ) -> Result<(), SandboxError> {
        let nodes: Api<Node> = Api::all(self.workload.client());
        let mut labels = BTreeMap::from([(
            NODE_ROLE_CONTROL_PLANE_LABEL.to_string(),
            "true".to_string(),
        )]);
        let mut annotations = BTreeMap::new();
        if let Some(member) = member {
            labels.insert(NODE_ROLE_ETCD_LABEL.to_string(), "true".to_string());
            annotations.insert(
                K3S_ETCD_NODE_NAME_ANNOTATION.to_string(),
                member.to_string(),
            );
            annotations.insert(K3S_ETCD_NODE_ADDRESS_ANNOTATION.to_string(), ip.to_string());
        }
        let node = Node {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                labels: Some(labels),
                annotations: Some(annotations),
                ..ObjectMeta::default()
            },
            status: Some(NodeStatus {
                addresses: Some(vec![
                    NodeAddress {
                        type_: "InternalIP".into(),
                        address: ip.to_string(),
                    },
                    NodeAddress {
                        type_: "Hostname".into(),
                        address: name.to_string(),
                    },
                ]),
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    reason: Some("KubeletReady".into()),
                    ..NodeCondition::default()
                }]),
                ..NodeStatus::default()
            }),
            ..Node::default()
        };
        let created = nodes
            .create(&PostParams::default(), &node)
            .await
            .map_err(err("create Node"))?;
        // Status is a subresource: write it as kubelet does.
        nodes
            .patch_status(
                &created.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": node.status})),
            )
            .await
            .map_err(err("write Node status"))?;
        Ok(())
    }

    /// The `etcd-proxy` pod upstream's DaemonSet runs on a server node
    /// (kube-system, `app=etcd-proxy`, on the pod network, socat relaying over
    /// IPv4 to `$(HOSTIP):2379`), Running; its forwarded port 2379 leads to
    /// `member` (the node's etcd client address).
    pub async fn add_etcd_proxy(
        &self,
        node: &str,
        member: std::net::SocketAddr,
    ) -> Result<(), SandboxError> {
        use crate::api::names::ETCD_PROXY_NAMESPACE;
        let pods: Api<Pod> = Api::namespaced(self.workload.client(), ETCD_PROXY_NAMESPACE);
        let pod: Pod = serde_json::from_value(json!({
            // As the DaemonSet controller names its pods: `generateName`
            // `<daemonset>-`, the server adds 5 characters (never one taken;
            // a suffix of our own once named two pods alike).
            "metadata": {"generateName": "etcd-proxy-", "labels": {"app": "etcd-proxy"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "etcd-proxy",
                    "uid": "etcd-proxy-daemonset", "controller": true, "blockOwnerDeletion": true}]},
            "spec": {
                "nodeName": node,
                "tolerations": [
                    {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"},
                    {"key": "node-role.kubernetes.io/master", "effect": "NoSchedule"},
                ],
                "containers": [{"name": "etcd-proxy", "image": "alpine/socat",
                    "env": [{"name": "HOSTIP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}],
                    "args": ["TCP4-LISTEN:2379,fork,reuseaddr", "TCP4:$(HOSTIP):2379"]}]
            }
        }))
        .map_err(|e| SandboxError(format!("etcd proxy pod: {e}")))?;
        let name = pods
            .create(&PostParams::default(), &pod)
            .await
            .map_err(err("create etcd proxy Pod"))?
            .name_any();
        pods.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(
                &json!({"status": {"phase": "Running", "hostIP": member.ip().to_string()}}),
            ),
        )
        .await
        .map_err(err("write etcd proxy Pod status"))?;
        self.workload
            .set_port_forward_target(ETCD_PROXY_NAMESPACE, &name, 2379, member);
        Ok(())
    }

    /// The name of the etcd proxy pod on `node` (generated, as the
    /// DaemonSet's are), found as the controller finds it: by label and node.
    pub async fn etcd_proxy_pod(&self, node: &str) -> Result<String, SandboxError> {
        use crate::api::names::ETCD_PROXY_NAMESPACE;
        let pods: Api<Pod> = Api::namespaced(self.workload.client(), ETCD_PROXY_NAMESPACE);
        let list = pods
            .list(&kube::api::ListParams::default().labels("app=etcd-proxy"))
            .await
            .map_err(err("list etcd proxy Pods"))?;
        list.items
            .into_iter()
            .find(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
            .map(|p| p.name_any())
            .ok_or_else(|| SandboxError(format!("no etcd proxy pod on node {node}")))
    }

    /// A control-plane Machine owned by the KCP; `node`: (node name, address)
    /// once provisioned.
    pub async fn add_machine(
        &self,
        kcp: &KThreesControlPlane,
        name: &str,
        node: Option<(&str, &str)>,
    ) -> Result<Machine, SandboxError> {
        let owner: OwnerReference = kcp
            .controller_owner_ref(&())
            .ok_or_else(|| SandboxError("KThreesControlPlane has no uid".into()))?;
        let machine = Machine {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(NAMESPACE.to_string()),
                labels: Some(BTreeMap::from([
                    (CLUSTER_NAME_LABEL.to_string(), CLUSTER.to_string()),
                    (CONTROL_PLANE_LABEL.to_string(), String::new()),
                    (CONTROL_PLANE_NAME_LABEL.to_string(), KCP.to_string()),
                ])),
                // As if this control plane had made it from its current spec,
                // with our pre-terminate hook from birth.
                annotations: Some(BTreeMap::from([
                    (
                        crate::api::names::SPEC_HASH_ANNOTATION.to_string(),
                        crate::rollout::spec_hash(kcp),
                    ),
                    (
                        crate::api::names::PRE_TERMINATE_HOOK_ANNOTATION.to_string(),
                        crate::remediation::steps::BORN_HOOK_VALUE.to_string(),
                    ),
                ])),
                owner_references: Some(vec![owner]),
                ..ObjectMeta::default()
            },
            spec: MachineSpec {
                cluster_name: CLUSTER.to_string(),
                bootstrap: Bootstrap {
                    config_ref: Some(ContractVersionedObjectReference {
                        api_group: "bootstrap.cluster.x-k8s.io".into(),
                        kind: "KThreesConfig".into(),
                        name: name.to_string(),
                    }),
                    ..Bootstrap::default()
                },
                infrastructure_ref: ContractVersionedObjectReference {
                    api_group: "infrastructure.cluster.x-k8s.io".into(),
                    kind: "DockerMachine".into(),
                    name: name.to_string(),
                },
                version: Some(VERSION.to_string()),
                ..MachineSpec::default()
            },
            status: None,
        };
        let machines = self.machines_api();
        let created = machines
            .create(&PostParams::default(), &machine)
            .await
            .map_err(err("create Machine"))?;
        if let Some((node, ip)) = node {
            self.provision(name, node, ip).await?;
        }
        Ok(created)
    }

    /// What the infrastructure and CAPI report once a Machine's node joined.
    pub async fn provision(&self, machine: &str, node: &str, ip: &str) -> Result<(), SandboxError> {
        let status = MachineStatus {
            node_ref: Some(MachineNodeReference {
                name: node.to_string(),
            }),
            addresses: vec![MachineAddress {
                type_: "InternalIP".into(),
                address: ip.to_string(),
            }],
            phase: Some("Running".into()),
            ..MachineStatus::default()
        };
        self.machines_api()
            .patch_status(
                machine,
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": status})),
            )
            .await
            .map_err(err("provision Machine"))?;
        Ok(())
    }

    /// Mark a Machine unhealthy exactly as a MachineHealthCheck does (owner
    /// remediation): `HealthCheckSucceeded=False` and `OwnerRemediated=False`
    /// (reason `WaitingForRemediation`), in the v1beta2 and v1beta1 lists.
    pub async fn mark_unhealthy(&self, machine: &str) -> Result<(), SandboxError> {
        mark_machine_unhealthy(&self.machines_api(), machine).await
    }

    /// A controller context on the management API server, with short requeues.
    pub fn context(&self) -> Arc<Context> {
        controller_context(self.client(), fast_settings())
    }

    /// Start the real controller loop against this sandbox.
    pub fn start_controller(&self) -> ControllerHandle {
        spawn_controller(self.context())
    }

    /// Start the real controller loop with these settings.
    pub fn start_controller_with(&self, settings: Settings) -> ControllerHandle {
        spawn_controller(controller_context(self.client(), settings))
    }

    /// Put a sandbox together from parts that already run (the bring-up world
    /// builds it once its first server booted).
    pub(crate) fn assemble(
        etcd: EtcdTestCluster,
        management: TestApiServer,
        workload: TestApiServer,
        capi: MachineDeletionSim,
    ) -> Self {
        Sandbox {
            etcd,
            management,
            workload,
            _capi: capi,
            machines: vec![],
            restores: vec![],
        }
    }

    /// Poll `check` until it yields a value or `limit` passes; the error says
    /// what was awaited and the last answer.
    pub async fn wait_for<T, F, Fut>(
        &self,
        what: &str,
        limit: Duration,
        mut check: F,
    ) -> Result<T, SandboxError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, String>>,
    {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            match check().await {
                Ok(value) => return Ok(value),
                Err(last) if tokio::time::Instant::now() >= deadline => {
                    return Err(SandboxError(format!(
                        "timed out after {limit:?} waiting for {what}: {last}"
                    )));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
}

/// Mark a Machine unhealthy exactly as a MachineHealthCheck does, as
/// [`Sandbox::mark_unhealthy`] does, in any world (`api`: its Machines).
pub async fn mark_machine_unhealthy(api: &Api<Machine>, machine: &str) -> Result<(), SandboxError> {
    let mut current = api.get(machine).await.map_err(err("get Machine"))?;
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let v2 = |type_: &str, reason: &str, message: &str| Condition {
        type_: type_.into(),
        status: "False".into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: current.metadata.generation,
        last_transition_time: now.clone(),
    };
    let v1 = |type_: &str, reason: &str, message: &str| V1Beta1Condition {
        type_: type_.into(),
        status: "False".into(),
        severity: Some("Warning".into()),
        last_transition_time: Some(now.clone()),
        reason: Some(reason.into()),
        message: Some(message.into()),
    };
    let health = v2(
        "HealthCheckSucceeded",
        "UnhealthyNode",
        "Condition Ready on Node is reporting status Unknown for more than 5m0s",
    );
    let owner = v2(
        "OwnerRemediated",
        "WaitingForRemediation",
        "Waiting for remediation",
    );
    let health_v1 = v1(
        "HealthCheckSucceeded",
        "UnhealthyNode",
        "Condition Ready on node is reporting status Unknown for more than 5m0s",
    );
    let owner_v1 = v1("OwnerRemediated", "WaitingForRemediation", "");
    crate::api::conditions::set(current.conditions_mut(), health);
    crate::api::conditions::set(current.conditions_mut(), owner);
    crate::api::conditions::set_v1beta1(current.v1beta1_conditions_mut(), health_v1);
    crate::api::conditions::set_v1beta1(current.v1beta1_conditions_mut(), owner_v1);
    let status = current.status.clone().unwrap_or_default();
    let patch =
        json!({"status": {"conditions": status.conditions, "deprecated": status.deprecated}});
    api.patch_status(machine, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(err("mark Machine unhealthy"))?;
    Ok(())
}
