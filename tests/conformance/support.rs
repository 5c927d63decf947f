//! Shared set-up: one fresh namespace per test on the test API server or a real cluster.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use futures::FutureExt;
use k3s_control_plane::apiserver::{ResourceDef, Scope, TestApiServer};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

pub const KCP_GROUP: &str = "controlplane.cluster.x-k8s.io";
pub const DEADLINE: Duration = Duration::from_secs(30);
/// A finalizer no controller owns, so objects stay until the test removes it.
pub const HOLD: &str = "conformance.k3s-control-plane.io/hold";

/// `KThreesControlPlane` v1beta3 (stored), described by hand as a client sees it.
pub fn kcp_resource() -> ApiResource {
    ApiResource {
        group: KCP_GROUP.into(),
        version: "v1beta3".into(),
        api_version: format!("{KCP_GROUP}/v1beta3"),
        kind: "KThreesControlPlane".into(),
        plural: "kthreescontrolplanes".into(),
    }
}

/// A KThreesControlPlane that is valid for the real CRD.
pub fn kcp(name: &str) -> DynamicObject {
    DynamicObject::new(name, &kcp_resource()).data(json!({
        "spec": {
            "version": "v1.30.2+k3s2",
            "replicas": 3,
            "machineTemplate": {"spec": {
                "infrastructureRef": {
                    "apiGroup": "infrastructure.cluster.x-k8s.io",
                    "kind": "DockerMachineTemplate",
                    "name": "cp-template"
                }
            }}
        }
    }))
}

pub fn config_map(name: &str, labels: &[(&str, &str)]) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    cm.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    cm.data = Some([("key".to_string(), "value".to_string())].into());
    cm
}

/// One test's world: a client, its own namespace, and the in-process server when local.
pub struct Env {
    pub client: Client,
    pub ns: String,
    pub server: Option<TestApiServer>,
    extra: std::sync::Mutex<Vec<String>>,
}

static SEQ: AtomicU32 = AtomicU32::new(0);

fn unique_suffix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{:x}{:x}{}",
        std::process::id() % 0xfff,
        nanos % 0xffff,
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

impl Env {
    async fn new(test: &str) -> Self {
        k3s_control_plane::install_crypto_provider();
        let (client, server) = if std::env::var_os("KUBECONFIG").is_some() {
            (
                Client::try_default()
                    .await
                    .expect("KUBECONFIG is set but no client could be built from it"),
                None,
            )
        } else {
            let server = TestApiServer::builder()
                .with_core_resources()
                .resource(
                    ResourceDef::new(kcp_resource(), Scope::Namespaced)
                        .with_status()
                        .with_scale(
                            ".spec.replicas",
                            ".status.replicas",
                            Some(".status.selector"),
                        ),
                )
                .start()
                .await
                .expect("test API server starts");
            (server.client(), Some(server))
        };
        let short: String = test
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
            .take(30)
            .collect();
        let env = Self {
            client,
            ns: String::new(),
            server,
            extra: Default::default(),
        };
        let ns = env
            .namespace(&format!("conf-{}", short.trim_end_matches('-')))
            .await;
        Self { ns, ..env }
    }

    /// Create an extra namespace, removed at clean-up.
    pub async fn namespace(&self, prefix: &str) -> String {
        let name = format!("{prefix}-{}", unique_suffix());
        let mut ns = Namespace::default();
        ns.metadata.name = Some(name.clone());
        Api::<Namespace>::all(self.client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .expect("namespace is created");
        self.extra.lock().unwrap().push(name.clone());
        name
    }

    pub fn kcps(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), &self.ns, &kcp_resource())
    }

    pub fn config_maps(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    pub fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Drop the server's watch history (local only); false against a real cluster.
    pub fn compact(&self) -> bool {
        self.server.as_ref().map(|s| s.compact_history()).is_some()
    }

    /// Remove test finalizers so namespaces can go, then delete the namespaces.
    async fn cleanup(&self) {
        let namespaces: Vec<String> = self.extra.lock().unwrap().clone();
        for ns in &namespaces {
            let kcps: Api<DynamicObject> =
                Api::namespaced_with(self.client.clone(), ns, &kcp_resource());
            let cms: Api<ConfigMap> = Api::namespaced(self.client.clone(), ns);
            let unhold = Patch::Merge(json!({"metadata": {"finalizers": null}}));
            if let Ok(list) = kcps.list(&ListParams::default()).await {
                for o in list.items.iter().filter(|o| !o.finalizers().is_empty()) {
                    let _ = kcps
                        .patch(&o.name_any(), &PatchParams::default(), &unhold)
                        .await;
                }
            }
            if let Ok(list) = cms.list(&ListParams::default()).await {
                for o in list.items.iter().filter(|o| !o.finalizers().is_empty()) {
                    let _ = cms
                        .patch(&o.name_any(), &PatchParams::default(), &unhold)
                        .await;
                }
            }
            let _ = Api::<Namespace>::all(self.client.clone())
                .delete(ns, &DeleteParams::default())
                .await;
        }
        if let Some(server) = &self.server {
            server.shutdown().await;
        }
    }
}

/// Run a test body with a fresh environment, cleaning up even when the body panics.
pub async fn run<F, Fut>(test: &str, body: F)
where
    F: FnOnce(Arc<Env>) -> Fut,
    Fut: Future<Output = ()>,
{
    let env = Arc::new(Env::new(test).await);
    let outcome = AssertUnwindSafe(body(env.clone())).catch_unwind().await;
    env.cleanup().await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// Poll until `check` yields a value, failing after [`DEADLINE`].
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "timed out after {DEADLINE:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The API status of a failed call (panics on success or a non-API error).
pub fn status_of<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> Box<kube::core::Status> {
    match result {
        Err(kube::Error::Api(status)) => status,
        other => panic!("expected an API error status, got {other:?}"),
    }
}

pub fn rv_of(obj: &impl ResourceExt) -> u64 {
    obj.resource_version()
        .expect("objects carry a resourceVersion")
        .parse()
        .expect("numeric resourceVersion")
}

pub fn field<'a>(obj: &'a DynamicObject, pointer: &str) -> &'a Value {
    obj.data.pointer(pointer).unwrap_or(&Value::Null)
}
