//! A world that starts from nothing, as a new user's does: a management API
//! with a Cluster (its control-plane endpoint reserved on 127.0.0.1, its
//! infrastructure provisioned) and a KThreesControlPlane with no Machines and
//! no Secrets. The controller must generate the cluster CAs, the join token and
//! the kubeconfig; the simulated infrastructure then boots each server **from
//! those Secrets**, as the k3s bootstrap provider and k3s would:
//! - the first server starts a new etcd cluster whose certificates are signed
//!   by the generated `<cluster>-etcd` CA, and the workload API server, which
//!   serves a certificate signed by `<cluster>-ca` and accepts only client
//!   certificates signed by `<cluster>-cca`, on the reserved endpoint;
//! - every later server joins with the `<cluster>-token` (a learner, promoted),
//!   see [`super::infra_sim`].
//!
//! The controller reaches the workload cluster only through the kubeconfig it
//! generated. Until the first server boots, the endpoint accepts TCP
//! connections and closes them at once, as a load balancer with no backend.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::PostParams;
use kube::{Api, Resource, ResourceExt};
use rcgen::{ExtendedKeyUsagePurpose, SanType};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::api::names::TOKEN_SECRET_KEY;
use crate::api::{
    Cluster, KThreesConfig, KThreesControlPlane, KThreesControlPlaneTemplate, Machine,
};
use crate::apiserver::{ServerTls, TestApiServer};
use crate::controller::Settings;

use super::capi_sim::MachineDeletionSim;
use super::etcd::EtcdTestCluster;
use super::pki::TestCa;
use super::sandbox::{
    CLUSTER, ControllerHandle, KCP, NAMESPACE, Sandbox, SandboxError, VERSION, cluster_object,
    controller_context, create_machine_template, docker_machine_template, fast_settings,
    kcp_object, management_server, mark_infrastructure_provisioned, spawn_controller,
};
use super::topology_sim::{ClassRefs, TopologySim};

fn err(context: &str) -> impl Fn(kube::Error) -> SandboxError + '_ {
    move |e| SandboxError(format!("{context}: {e}"))
}

/// Accepts and closes connections on the reserved endpoint until it is handed
/// to the workload API server.
struct Refuser {
    stop: oneshot::Sender<()>,
    task: JoinHandle<std::io::Result<std::net::TcpListener>>,
}

impl Refuser {
    fn start(listener: std::net::TcpListener) -> std::io::Result<Self> {
        listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let (stop, mut stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    accepted = listener.accept() => drop(accepted),
                }
            }
            listener.into_std()
        });
        Ok(Refuser { stop, task })
    }

    async fn hand_over(self) -> Result<std::net::TcpListener, SandboxError> {
        let _ = self.stop.send(());
        self.task
            .await
            .map_err(|e| SandboxError(format!("endpoint refuser: {e}")))?
            .map_err(|e| SandboxError(format!("endpoint listener: {e}")))
    }
}

/// The Secrets a server is booted from (read from the management cluster).
struct BootSecrets {
    server_ca: (String, String),
    client_ca: (String, String),
    etcd_ca: (String, String),
}

fn pair(secret: &Secret) -> Result<(String, String), SandboxError> {
    let key = |k: &str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(k))
            .and_then(|b| String::from_utf8(b.0.clone()).ok())
            .ok_or_else(|| SandboxError(format!("Secret {} has no {k}", secret.name_any())))
    };
    Ok((key("tls.crt")?, key("tls.key")?))
}

/// What the bootstrap provider needs for `machine`: its KThreesConfig and the
/// join token. Fails (naming what is missing) when the controller has not
/// provided them.
pub async fn bootstrap_inputs(
    client: &kube::Client,
    machine: &str,
) -> Result<String, SandboxError> {
    let machines: Api<Machine> = Api::namespaced(client.clone(), NAMESPACE);
    let m = machines.get(machine).await.map_err(err("get Machine"))?;
    let config = m
        .spec
        .bootstrap
        .config_ref
        .as_ref()
        .ok_or_else(|| SandboxError(format!("Machine {machine} has no bootstrap.configRef")))?;
    let configs: Api<KThreesConfig> = Api::namespaced(client.clone(), NAMESPACE);
    configs
        .get(&config.name)
        .await
        .map_err(err("get the Machine's KThreesConfig"))?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let token = secrets
        .get(&format!("{CLUSTER}-token"))
        .await
        .map_err(err("get the join token Secret"))?;
    token
        .data
        .as_ref()
        .and_then(|d| d.get(TOKEN_SECRET_KEY))
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
        .filter(|t| !t.is_empty())
        .ok_or_else(|| SandboxError(format!("{CLUSTER}-token has no value")))
}

/// The management side of a world that starts from nothing.
/// The ClusterClass name (and its control-plane template's) of a Cluster
/// made by [`BringUp::start_from_topology`].
pub const TOPOLOGY_CLASS: &str = "k3s";

pub struct BringUp {
    pub management: TestApiServer,
    /// Where the workload API server will answer (`Cluster.spec.controlPlaneEndpoint`).
    pub endpoint: SocketAddr,
    capi: MachineDeletionSim,
    refuser: Refuser,
}

impl BringUp {
    /// A Cluster and a KThreesControlPlane of `replicas`, nothing else: no
    /// Machine, no Secret, no finalizer.
    pub async fn start(replicas: i32) -> Result<Self, SandboxError> {
        Self::start_on(management_server().await?, replicas).await
    }

    /// As [`start`](Self::start), on this management API server (one from
    /// [`management_server_with`](super::sandbox::management_server_with)).
    pub async fn start_on(management: TestApiServer, replicas: i32) -> Result<Self, SandboxError> {
        let world = Self::bare(management)?;
        world.populate(replicas).await?;
        Ok(world)
    }

    /// A Cluster made from a ClusterClass (`spec.topology`: `version`,
    /// `controlPlane.replicas`, `controlPlane.metadata`), a
    /// KThreesControlPlaneTemplate, the machine template, and the simulated
    /// topology controller ([`TopologySim`]), which creates the
    /// KThreesControlPlane from them as CAPI's does.
    pub async fn start_from_topology(
        replicas: i32,
        template: serde_json::Value,
    ) -> Result<(Self, TopologySim), SandboxError> {
        let world = Self::bare(management_server().await?)?;
        let client = world.client();
        let clusters: Api<Cluster> = Api::namespaced(client.clone(), NAMESPACE);
        let mut cluster = cluster_object(CLUSTER, KCP);
        cluster.spec.control_plane_endpoint = Some(crate::api::cluster::ApiEndpoint {
            host: world.endpoint.ip().to_string(),
            port: i32::from(world.endpoint.port()),
        });
        cluster.spec.extra.insert(
            "topology".into(),
            serde_json::json!({
                "classRef": {"name": TOPOLOGY_CLASS},
                "version": VERSION,
                "controlPlane": {"replicas": replicas, "metadata": {"labels": {"topology-label": "from-cluster"}}},
            }),
        );
        clusters
            .create(&PostParams::default(), &cluster)
            .await
            .map_err(err("create Cluster"))?;
        mark_infrastructure_provisioned(&clusters, CLUSTER).await?;
        create_machine_template(&client).await?;
        let templates: Api<KThreesControlPlaneTemplate> =
            Api::namespaced(client.clone(), NAMESPACE);
        let mut template: KThreesControlPlaneTemplate = serde_json::from_value(serde_json::json!({
            "apiVersion": KThreesControlPlaneTemplate::api_version(&()),
            "kind": "KThreesControlPlaneTemplate",
            "metadata": {"name": TOPOLOGY_CLASS, "namespace": NAMESPACE},
            "spec": {"template": {"spec": template}},
        }))
        .map_err(|e| SandboxError(format!("KThreesControlPlaneTemplate: {e}")))?;
        template.metadata.namespace = Some(NAMESPACE.into());
        templates
            .create(&PostParams::default(), &template)
            .await
            .map_err(err("create KThreesControlPlaneTemplate"))?;
        let machine_template = docker_machine_template();
        let sim = TopologySim::start(
            client,
            NAMESPACE,
            CLUSTER,
            ClassRefs {
                control_plane_template: TOPOLOGY_CLASS.into(),
                machine_infrastructure: (
                    machine_template.group,
                    machine_template.kind,
                    format!("{KCP}-template"),
                ),
            },
            KCP,
            Duration::from_millis(200),
        );
        Ok((world, sim))
    }

    fn bare(management: TestApiServer) -> Result<Self, SandboxError> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")
            .map_err(|e| SandboxError(format!("reserve the endpoint: {e}")))?;
        let endpoint = listener
            .local_addr()
            .map_err(|e| SandboxError(format!("endpoint address: {e}")))?;
        let refuser =
            Refuser::start(listener).map_err(|e| SandboxError(format!("endpoint refuser: {e}")))?;
        let capi = MachineDeletionSim::start(management.client());
        Ok(BringUp {
            management,
            endpoint,
            capi,
            refuser,
        })
    }

    pub fn client(&self) -> kube::Client {
        self.management.client()
    }

    pub fn kcp_api(&self) -> Api<KThreesControlPlane> {
        Api::namespaced(self.client(), NAMESPACE)
    }

    pub fn machines_api(&self) -> Api<Machine> {
        Api::namespaced(self.client(), NAMESPACE)
    }

    pub fn secrets_api(&self) -> Api<Secret> {
        Api::namespaced(self.client(), NAMESPACE)
    }

    async fn populate(&self, replicas: i32) -> Result<(), SandboxError> {
        let client = self.client();
        let clusters: Api<Cluster> = Api::namespaced(client.clone(), NAMESPACE);
        let mut cluster = cluster_object(CLUSTER, KCP);
        cluster.spec.control_plane_endpoint = Some(crate::api::cluster::ApiEndpoint {
            host: self.endpoint.ip().to_string(),
            port: i32::from(self.endpoint.port()),
        });
        let cluster = clusters
            .create(&PostParams::default(), &cluster)
            .await
            .map_err(err("create Cluster"))?;
        mark_infrastructure_provisioned(&clusters, CLUSTER).await?;
        create_machine_template(&client).await?;
        let kcp = kcp_object(KCP, &cluster, replicas);
        self.kcp_api()
            .create(&PostParams::default(), &kcp)
            .await
            .map_err(err("create KThreesControlPlane"))?;
        Ok(())
    }

    /// The real controller, with the sandbox's short requeues.
    pub fn start_controller(&self) -> ControllerHandle {
        self.start_controller_with(fast_settings())
    }

    pub fn start_controller_with(&self, settings: Settings) -> ControllerHandle {
        spawn_controller(controller_context(self.client(), settings))
    }

    /// Wait until the controller created the first Machine and return its name.
    pub async fn wait_first_machine(&self, limit: Duration) -> Result<String, SandboxError> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let list = self
                .machines_api()
                .list(&Default::default())
                .await
                .map_err(err("list Machines"))?;
            if let Some(m) = list.items.first() {
                return Ok(m.name_any());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(SandboxError(format!("no Machine created within {limit:?}")));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn boot_secrets(&self) -> Result<BootSecrets, SandboxError> {
        let secrets = self.secrets_api();
        let get = |suffix: &'static str| {
            let secrets = secrets.clone();
            async move {
                let s = secrets
                    .get(&format!("{CLUSTER}{suffix}"))
                    .await
                    .map_err(err("get a cluster CA Secret"))?;
                pair(&s)
            }
        };
        Ok(BootSecrets {
            server_ca: get("-ca").await?,
            client_ca: get("-cca").await?,
            etcd_ca: get("-etcd").await?,
        })
    }

    /// Boot `machine` as the first server: a new etcd cluster from the
    /// generated etcd CA, the workload API server on the endpoint with the
    /// generated server and client CAs, its Node, the Machine's nodeRef. From
    /// here on the world is an ordinary [`Sandbox`].
    pub async fn boot_first(self, machine: &str) -> Result<Sandbox, SandboxError> {
        let client = self.client();
        bootstrap_inputs(&client, machine).await?;
        let secrets = self.boot_secrets().await?;
        let etcd = EtcdTestCluster::builder()
            .members(1)
            .server_ca(&secrets.etcd_ca.0, &secrets.etcd_ca.1)
            .start()
            .await
            .map_err(|e| SandboxError(format!("first server's etcd: {e}")))?;
        let ca_err = |what: &str| {
            let what = what.to_string();
            move |e: rcgen::Error| SandboxError(format!("{what}: {e}"))
        };
        let server_ca = TestCa::from_pem(&secrets.server_ca.0, &secrets.server_ca.1)
            .map_err(ca_err("load the generated server CA"))?;
        let client_ca = TestCa::from_pem(&secrets.client_ca.0, &secrets.client_ca.1)
            .map_err(ca_err("load the generated client CA"))?;
        let serving = server_ca.issue(
            "k3s",
            &[
                SanType::DnsName("localhost".try_into().expect("dns name")),
                SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            ],
            &[ExtendedKeyUsagePurpose::ServerAuth],
        );
        // The harness's own identity on the workload API (k3s's admin).
        let admin = client_ca.issue("system:admin", &[], &[ExtendedKeyUsagePurpose::ClientAuth]);
        let listener = self.refuser.hand_over().await?;
        let workload = TestApiServer::builder()
            .with_core_resources()
            .tls(ServerTls {
                ca_pem: secrets.server_ca.0.clone(),
                cert_pem: serving.cert_pem,
                key_pem: serving.key_pem,
                client_ca_pem: Some(secrets.client_ca.0.clone()),
                client_identity: Some((admin.cert_pem, admin.key_pem)),
            })
            .listener(listener)
            .start()
            .await
            .map_err(|e| SandboxError(format!("workload API server: {e}")))?;
        let mut sandbox = Sandbox::assemble(etcd, self.management, workload, self.capi);
        let (node, ip, member, proxied) = {
            let m = sandbox.etcd.member(0);
            (
                m.node_name.clone(),
                m.ip.to_string(),
                m.name.clone(),
                m.listen_client_addr(),
            )
        };
        sandbox.add_node(&node, &ip, Some(&member)).await?;
        sandbox.add_etcd_proxy(&node, proxied).await?;
        sandbox.provision(machine, &node, &ip).await?;
        sandbox.machines.push(machine.to_string());
        Ok(sandbox)
    }
}
