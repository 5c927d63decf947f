//! An in-process Kubernetes API server for tests and the demo: a real `kube::Client`
//! talks to it over plain HTTP, or over TLS with client certificates like a k3s API
//! server ([`ServerTls`]) (CRUD, patches, status/scale subresources, finalizers, owner
//! garbage collection, selectors, paging and watch, conversion between a CRD's
//! versions by a registered [`Converter`]), optionally enforcing RBAC for
//! token and client-certificate users ([`TestApiServerBuilder::enforce_rbac`]).
//! Deviations: docs/apiserver.md, "Known deviations from a real API server".

mod auth;
mod builtin;
mod conversion;
mod discovery;
mod error;
mod faults;
mod load;
mod meta;
mod patch;
mod portforward;
mod protobuf;
mod requests;
mod resource;
mod routes;
mod selector;
mod store;
mod tls;
mod watch;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::{coordination, core, events};
use kube::config::{Cluster, Context, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use auth::{AuthorizationRecord, Grant};
pub use conversion::Converter;
pub use error::ApiError;
pub use patch::PatchKind;
pub use resource::{ConversionStrategy, ResourceDef, ScaleDef, Scope};
pub use selector::{FieldSelector, LabelSelector};
pub use tls::ServerTls;

use conversion::Converters;
use faults::Faults;
use resource::Registry;
use store::{ResKey, Store};

/// Why the server could not start or build a client.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("binding the test API server to 127.0.0.1: {0}")]
    Bind(#[source] std::io::Error),
    #[error("serving the test API server on the given listener: {0}")]
    Listener(#[source] std::io::Error),
    #[error("test API server TLS, {what}: {reason}")]
    Tls { what: &'static str, reason: String },
    #[error("loading the kubeconfig of the test API server at {url}: {source}")]
    Kubeconfig {
        url: String,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("loading manifests into the test API server, document {index}: {reason}")]
    Load { index: usize, reason: String },
    #[error("loading manifests into the test API server: not YAML: {reason}")]
    LoadYaml { reason: String },
    #[error("building a kube client for the test API server at {url}: {source}")]
    Client {
        url: String,
        #[source]
        source: kube::Error,
    },
}

/// Configures and starts a [`TestApiServer`].
pub struct TestApiServerBuilder {
    registry: Registry,
    converters: Converters,
    history_limit: usize,
    bookmark_interval: Duration,
    tls: Option<ServerTls>,
    listener: Option<std::net::TcpListener>,
    tokens: HashMap<String, auth::UserInfo>,
    enforce_rbac: bool,
    http1_only: bool,
}

impl TestApiServerBuilder {
    /// Serve this resource.
    pub fn resource(mut self, def: ResourceDef) -> Self {
        self.registry.add(def);
        self
    }

    /// Convert the objects of API group `group` between versions with
    /// `converter`, in place of the conversion webhook of every resource of the
    /// group whose CRD says `spec.conversion.strategy: Webhook`
    /// ([`ResourceDef::from_crd`]): a request in another version than the
    /// storage version has its object converted to the storage version and the
    /// answer back to its own version. Without a converter such requests fail as
    /// with an unreachable webhook (500). One converter per group; it sees each
    /// object's `kind`. A later call for the same group replaces the converter.
    /// It runs with the store locked, so it must not call this server.
    pub fn converter(mut self, group: &str, converter: Converter) -> Self {
        self.converters.register(group, converter);
        self
    }

    /// Namespace, Secret, ConfigMap, Node, Pod, Event (core v1), events.k8s.io/v1 Event
    /// and coordination.k8s.io/v1 Lease, with the real server's status subresources and
    /// common field selectors.
    pub fn with_core_resources(self) -> Self {
        self.resource(
            ResourceDef::of::<core::v1::Namespace>()
                .with_short_names(&["ns"])
                .with_status()
                .with_selectable_field("status.phase"),
        )
        .resource(ResourceDef::of::<core::v1::Secret>().with_selectable_field("type"))
        .resource(ResourceDef::of::<core::v1::ConfigMap>().with_short_names(&["cm"]))
        .resource(
            ResourceDef::of::<core::v1::Node>()
                .with_short_names(&["no"])
                .with_status()
                .with_selectable_field("spec.unschedulable"),
        )
        .resource(
            ResourceDef::of::<core::v1::Pod>()
                .with_short_names(&["po"])
                .with_status()
                .with_selectable_field("spec.nodeName")
                .with_selectable_field("status.phase"),
        )
        .resource(
            ResourceDef::of::<core::v1::Event>()
                .with_short_names(&["ev"])
                .with_selectable_field("involvedObject.kind")
                .with_selectable_field("involvedObject.name")
                .with_selectable_field("involvedObject.namespace")
                .with_selectable_field("involvedObject.uid")
                .with_selectable_field("reason")
                .with_selectable_field("type"),
        )
        .resource(ResourceDef::of::<events::v1::Event>().with_short_names(&["ev"]))
        .resource(ResourceDef::of::<coordination::v1::Lease>())
    }

    /// How many events the watch history keeps (older revisions get 410 Gone). Default 1000.
    pub fn history_limit(mut self, events: usize) -> Self {
        self.history_limit = events;
        self
    }

    /// How often watches with `allowWatchBookmarks=true` get a BOOKMARK. Default 1 s.
    pub fn bookmark_interval(mut self, every: Duration) -> Self {
        self.bookmark_interval = every;
        self
    }

    /// Serve HTTPS with this certificate instead of plain HTTP; with
    /// [`ServerTls::client_ca_pem`] set, only clients presenting a certificate signed by
    /// that CA get through the handshake.
    pub fn tls(mut self, tls: ServerTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// With [TLS](Self::tls), offer only HTTP/1.1 by ALPN, as a server (or a
    /// proxy in front of one) that does not speak HTTP/2. By default both are
    /// offered, as kube-apiserver does.
    pub fn http1_only(mut self) -> Self {
        self.http1_only = true;
        self
    }

    /// Serve on this listener (bound by the caller, for instance to know the port
    /// before the server exists) instead of binding 127.0.0.1 on a free port.
    pub fn listener(mut self, listener: std::net::TcpListener) -> Self {
        self.listener = Some(listener);
        self
    }

    /// Accept `Authorization: Bearer <token>` as user `name` in `groups` (and
    /// `system:authenticated`). Once any user is registered, a request with any other
    /// `Authorization` header gets 401 `Unauthorized`; requests without one are the
    /// test's administrator (see [`enforce_rbac`](Self::enforce_rbac)).
    pub fn user(
        mut self,
        token: impl Into<String>,
        name: impl Into<String>,
        groups: &[&str],
    ) -> Self {
        self.tokens
            .insert(token.into(), auth::UserInfo::new(name, groups));
        self
    }

    /// Accept `token` as the service account `namespace/name`: user
    /// `system:serviceaccount:<namespace>:<name>` in the groups `system:serviceaccounts`,
    /// `system:serviceaccounts:<namespace>` and `system:authenticated`, as the real
    /// service account token authenticator says.
    pub fn service_account(
        mut self,
        token: impl Into<String>,
        namespace: &str,
        name: &str,
    ) -> Self {
        self.tokens.insert(
            token.into(),
            auth::UserInfo::service_account(namespace, name),
        );
        self
    }

    /// Judge every request of an authenticated user (bearer token, or client
    /// certificate with TLS) by RBAC, against the ClusterRoles, ClusterRoleBindings,
    /// Roles and RoleBindings stored when the request arrives
    /// (`rbac.authorization.k8s.io/v1`, served from now on like any resource), and log
    /// each decision ([`TestApiServer::authorization_log`]). Denied: the real 403
    /// `Forbidden`. Requests without credentials are not judged: the test's
    /// administrator sets the world up with [`TestApiServer::client`].
    pub fn enforce_rbac(mut self) -> Self {
        use k8s_openapi::api::rbac::v1 as rbac;
        self.enforce_rbac = true;
        self.resource(ResourceDef::of::<rbac::ClusterRole>())
            .resource(ResourceDef::of::<rbac::ClusterRoleBinding>())
            .resource(ResourceDef::of::<rbac::Role>())
            .resource(ResourceDef::of::<rbac::RoleBinding>())
    }

    /// Bind 127.0.0.1 on a free port (or take the [`listener`](Self::listener)) and
    /// serve until [`TestApiServer::shutdown`] or drop.
    pub async fn start(self) -> Result<TestApiServer, Error> {
        let server_config = self
            .tls
            .as_ref()
            .map(|tls| tls.server_config(self.http1_only))
            .transpose()?;
        let (listener, addr) = match self.listener {
            Some(listener) => {
                listener.set_nonblocking(true).map_err(Error::Listener)?;
                let listener =
                    tokio::net::TcpListener::from_std(listener).map_err(Error::Listener)?;
                let addr = listener.local_addr().map_err(Error::Listener)?;
                (listener, addr)
            }
            None => {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .map_err(Error::Bind)?;
                let addr = listener.local_addr().map_err(Error::Bind)?;
                (listener, addr)
            }
        };
        let store = Arc::new(Store::new(
            self.registry,
            self.converters,
            self.history_limit,
        ));
        let shutdown = CancellationToken::new();
        let (expiry_tx, expiry_rx) = tokio::sync::watch::channel(0u64);
        let faults = Arc::new(Faults::default());
        let port_forwards = Arc::new(portforward::PortForwards::default());
        let auth = Arc::new(auth::Auth::new(self.tokens, self.enforce_rbac));
        let requests = Arc::new(requests::RequestCounts::default());
        let app = Arc::new(routes::App {
            watch: watch::WatchContext {
                store: store.clone(),
                bookmark_interval: self.bookmark_interval,
                shutdown: shutdown.clone(),
                expiry: expiry_rx,
            },
            faults: faults.clone(),
            port_forwards: port_forwards.clone(),
            auth: auth.clone(),
            requests: requests.clone(),
        });
        // The real server's request body limit is 3 MiB (axum's default would be 2 MiB).
        let router = axum::Router::new()
            .route(
                "/api/v1/namespaces/{namespace}/pods/{pod}/portforward",
                axum::routing::get(portforward::handle),
            )
            .fallback(routes::dispatch)
            .layer(axum::middleware::from_fn_with_state(
                app.clone(),
                auth::middleware,
            ))
            .layer(axum::middleware::from_fn_with_state(
                app.clone(),
                requests::middleware,
            ))
            .layer(axum::extract::DefaultBodyLimit::max(3 * 1024 * 1024))
            .with_state(app);
        let stop = shutdown.clone();
        let task = match server_config {
            None => tokio::spawn(serve(listener, router, stop)),
            Some(config) => {
                let (listener, acceptor) =
                    tls::spawn_acceptor(listener, config, stop.clone()).map_err(Error::Listener)?;
                tokio::spawn(async move {
                    serve(listener, router, stop).await;
                    let _ = acceptor.await;
                })
            }
        };
        tracing::debug!(%addr, tls = self.tls.is_some(), "test API server listening");
        Ok(TestApiServer {
            addr,
            tls: self.tls,
            store,
            faults,
            port_forwards,
            auth,
            requests,
            shutdown,
            expiry: expiry_tx,
            task: Mutex::new(Some(task)),
        })
    }
}

async fn serve<L>(listener: L, router: axum::Router, stop: CancellationToken)
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
    for<'a> auth::PeerUser:
        axum::extract::connect_info::Connected<axum::serve::IncomingStream<'a, L>>,
{
    let service = router.into_make_service_with_connect_info::<auth::PeerUser>();
    let served = axum::serve(listener, service)
        .with_graceful_shutdown(stop.cancelled_owned())
        .await;
    if let Err(e) = served {
        tracing::warn!(error = %e, "test API server stopped with an error");
    }
}

/// Base64 as kubeconfig `*-data` fields hold it.
fn base64(text: &str) -> String {
    match serde_json::to_value(k8s_openapi::ByteString(text.as_bytes().to_vec())) {
        Ok(serde_json::Value::String(encoded)) => encoded,
        _ => unreachable!("a ByteString always serializes to a base64 string"),
    }
}

/// A running in-process API server; stops on [`shutdown`](Self::shutdown) or drop.
pub struct TestApiServer {
    addr: SocketAddr,
    tls: Option<ServerTls>,
    store: Arc<Store>,
    faults: Arc<Faults>,
    port_forwards: Arc<portforward::PortForwards>,
    auth: Arc<auth::Auth>,
    requests: Arc<requests::RequestCounts>,
    shutdown: CancellationToken,
    expiry: tokio::sync::watch::Sender<u64>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl TestApiServer {
    pub fn builder() -> TestApiServerBuilder {
        TestApiServerBuilder {
            registry: Registry::default(),
            converters: Converters::default(),
            history_limit: 1000,
            bookmark_interval: Duration::from_secs(1),
            tls: None,
            listener: None,
            tokens: HashMap::new(),
            enforce_rbac: false,
            http1_only: false,
        }
    }

    /// `http://127.0.0.1:<port>`, or `https://127.0.0.1:<port>` with [TLS](TestApiServerBuilder::tls).
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut addr = self.addr;
        if addr.ip().is_unspecified() {
            addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        format!("{scheme}://{addr}")
    }

    /// A client for this server (default namespace `default`). Must be called inside a tokio runtime.
    /// With TLS it is built from [`kubeconfig`](Self::kubeconfig): it trusts only
    /// [`ServerTls::ca_pem`], checks the server's name and presents
    /// [`ServerTls::client_identity`] if set.
    pub fn client(&self) -> kube::Client {
        self.try_client()
            .expect("a kube client for the server's own loopback URL and checked TLS material always builds")
    }

    /// Like [`client`](Self::client), returning the error instead of panicking.
    pub fn try_client(&self) -> Result<kube::Client, Error> {
        // object_store brings a second rustls provider: none is implied.
        crate::install_crypto_provider();
        if self.tls.is_some() {
            return self.client_from(self.kubeconfig());
        }
        let url = self.url();
        let uri: http::Uri = url.parse().expect("a socket address forms a valid URI");
        kube::Client::try_from(kube::Config::new(uri))
            .map_err(|source| Error::Client { url, source })
    }

    /// A client (default namespace `default`) sending `Authorization: Bearer <token>`,
    /// built from [`kubeconfig_with_token`](Self::kubeconfig_with_token), as a pod's
    /// service account client would be. Must be called inside a tokio runtime.
    pub fn client_with_token(&self, token: &str) -> kube::Client {
        self.try_client_with_token(token)
            .expect("a kube client for the server's own URL with a bearer token always builds")
    }

    /// Like [`client_with_token`](Self::client_with_token), returning the error.
    pub fn try_client_with_token(&self, token: &str) -> Result<kube::Client, Error> {
        self.client_from(self.kubeconfig_with_token(token))
    }

    fn client_from(&self, kubeconfig: Kubeconfig) -> Result<kube::Client, Error> {
        crate::install_crypto_provider();
        let url = self.url();
        let config = kube::Config::try_from(kubeconfig).map_err(|source| Error::Kubeconfig {
            url: url.clone(),
            source,
        })?;
        kube::Client::try_from(config).map_err(|source| Error::Client { url, source })
    }

    /// A kubeconfig (cluster, user and context all named `test-apiserver`) pointing at this server.
    /// With TLS it carries `certificate-authority-data` ([`ServerTls::ca_pem`]) and, when
    /// [`ServerTls::client_identity`] is set, that client certificate and key.
    pub fn kubeconfig(&self) -> Kubeconfig {
        let identity = self
            .tls
            .as_ref()
            .and_then(|tls| tls.client_identity.as_ref());
        self.kubeconfig_for(identity.map(|(cert, key)| (cert.as_str(), key.as_str())))
    }

    /// Like [`kubeconfig`](Self::kubeconfig), with this client certificate and key
    /// (PEM) as the user, whoever signed them.
    pub fn kubeconfig_with_identity(&self, cert_pem: &str, key_pem: &str) -> Kubeconfig {
        self.kubeconfig_for(Some((cert_pem, key_pem)))
    }

    /// Like [`kubeconfig`](Self::kubeconfig), with the user's `token:` set (and no
    /// client certificate): the kubeconfig of a [token user](TestApiServerBuilder::user).
    /// With TLS and a client CA the handshake needs a certificate, which would then be
    /// the user: token users need plain HTTP or TLS without a client CA.
    pub fn kubeconfig_with_token(&self, token: &str) -> Kubeconfig {
        let mut kubeconfig = self.kubeconfig_for(None);
        if let Some(user) = kubeconfig.auth_infos[0].auth_info.as_mut() {
            user.token = Some(token.to_string().into());
        }
        kubeconfig
    }

    /// Create the objects of a multi-document YAML manifest (such as the controller's
    /// shipped RBAC) directly in the store, as the administrator, skipping documents
    /// whose kind is not served; returns the skipped ones as `Kind/name`. Namespaced
    /// objects without a namespace go to `default`; the namespace must exist (or come
    /// earlier in the file). Nothing is judged or logged.
    pub fn create_from_yaml(&self, yaml: &str) -> Result<Vec<String>, Error> {
        load::create_from_yaml(&self.store, yaml)
    }

    /// The authorization decisions about token (and client certificate) users'
    /// requests so far, oldest first, with the grant that allowed each; empty unless
    /// [`enforce_rbac`](TestApiServerBuilder::enforce_rbac). The newest 10 000 are
    /// kept. A test can assert that nothing was denied, and which granted rules were
    /// never used.
    pub fn authorization_log(&self) -> Vec<AuthorizationRecord> {
        self.auth.log().0
    }

    /// Every request served so far (by any client, with or without RBAC), counted
    /// by (verb, resource) as RBAC names them: `get`, `list`, `watch`, `create`,
    /// `update`, `patch`, `delete`, `deletecollection`; `resource` is the plural,
    /// `plural/subresource` for a subresource, or the path of a non-resource
    /// request (discovery). For benchmarks: the difference of two snapshots is what
    /// a client did in between.
    pub fn request_counts(&self) -> std::collections::BTreeMap<(String, String), u64> {
        self.requests.snapshot()
    }

    fn kubeconfig_for(&self, identity: Option<(&str, &str)>) -> Kubeconfig {
        let name = "test-apiserver".to_string();
        let auth_info = match identity {
            Some((cert_pem, key_pem)) => kube::config::AuthInfo {
                client_certificate_data: Some(base64(cert_pem)),
                client_key_data: Some(base64(key_pem).into()),
                ..Default::default()
            },
            None => Default::default(),
        };
        Kubeconfig {
            clusters: vec![NamedCluster {
                name: name.clone(),
                cluster: Some(Cluster {
                    server: Some(self.url()),
                    certificate_authority_data: self.tls.as_ref().map(|tls| base64(&tls.ca_pem)),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            auth_infos: vec![NamedAuthInfo {
                name: name.clone(),
                auth_info: Some(auth_info),
                ..Default::default()
            }],
            contexts: vec![NamedContext {
                name: name.clone(),
                context: Some(Context {
                    cluster: name.clone(),
                    user: Some(name.clone()),
                    namespace: None,
                    ..Default::default()
                }),
                ..Default::default()
            }],
            current_context: Some(name),
            api_version: Some("v1".into()),
            kind: Some("Config".into()),
            ..Default::default()
        }
    }

    /// The newest revision (etcd-like, shared by every resource of this server).
    /// Where `pods/{pod}/portforward?ports={port}` in `namespace` leads: each
    /// port-forward becomes a real TCP connection to `target`.
    pub fn set_port_forward_target(
        &self,
        namespace: &str,
        pod: &str,
        port: u16,
        target: SocketAddr,
    ) {
        self.port_forwards
            .set_target((namespace.to_string(), pod.to_string(), port), target);
    }

    /// Port-forwards accepted so far for `namespace/pod` (any port).
    pub fn port_forwards_opened(&self, namespace: &str, pod: &str) -> u64 {
        self.port_forwards.opened(namespace, pod)
    }

    pub fn resource_version(&self) -> u64 {
        self.store.current_rv()
    }

    /// Test hook: forget the event history, so a watch from any older revision gets 410 Gone.
    pub fn compact_history(&self) {
        self.store.compact();
    }

    /// Test hook: compact the history and end every open watch with a 410 Gone ERROR event,
    /// as the real server does to a watcher that fell behind; clients must re-list.
    pub fn expire_watches(&self) {
        self.store.compact();
        self.expiry.send_modify(|n| *n += 1);
    }

    /// Test hook: the next write of `resource` fails with HTTP `code` and is not
    /// carried out. Same as [`fail_next_writes`](Self::fail_next_writes)`(resource, code, 1)`.
    pub fn fail_next_write(&self, resource: &str, code: u16) {
        self.fail_next_writes(resource, code, 1);
    }

    /// Test hook: the next `n` writes of `resource` fail with HTTP `code` and are
    /// not carried out (no revision, no watch event); later writes succeed.
    ///
    /// `resource` is `plural.group` (`plural` in the core group: `secrets`,
    /// `kthreescontrolplanes.controlplane.cluster.x-k8s.io`), or a plural or Kind
    /// naming one served resource. A write is a create (POST), update (PUT, also
    /// `/status` and `/scale`), patch (PATCH, also subresources) or delete (DELETE
    /// of one object) of any object of the resource; reads, watches and
    /// collection deletes are not. Each fault is taken by exactly one request,
    /// answered before the request is looked at. Codes, with the real server's
    /// `Status`: `409` — reason `Conflict` (`Operation cannot be fulfilled on
    /// <plural.group> "<name>": the object has been modified; please apply your
    /// changes to the latest version and try again`) for update, patch and delete,
    /// reason `AlreadyExists` for a create (the only 409 a real create gets);
    /// `500` — reason `InternalError` (`Internal error occurred: ...`). Faults
    /// queue up in the order injected.
    ///
    /// # Panics
    /// If `resource` names no served resource or several, or `code` is not
    /// one of 409, 500.
    pub fn fail_next_writes(&self, resource: &str, code: u16, n: usize) {
        let def = self.resolve(resource);
        self.faults.push(ResKey::of(def), code, n);
    }

    /// Injected write faults of `resource` not yet taken by a write.
    ///
    /// # Panics
    /// If `resource` names no served resource or several.
    pub fn pending_write_faults(&self, resource: &str) -> usize {
        self.faults.pending(&ResKey::of(self.resolve(resource)))
    }

    fn resolve(&self, resource: &str) -> &ResourceDef {
        self.store
            .registry()
            .resolve(resource)
            .unwrap_or_else(|e| panic!("test API server fault injection: {e}"))
    }

    /// Stop serving: open watches end, the listener closes.
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

impl Drop for TestApiServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::{StreamExt, TryStreamExt};
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, PostParams, WatchParams};

    fn config_map(name: &str) -> ConfigMap {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.into());
        cm
    }

    #[tokio::test]
    async fn requests_are_counted_by_verb_and_resource() {
        let server = TestApiServer::builder()
            .with_core_resources()
            .start()
            .await
            .unwrap();
        let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
        cms.create(&PostParams::default(), &config_map("counted"))
            .await
            .unwrap();
        cms.get("counted").await.unwrap();
        cms.get("counted").await.unwrap();
        cms.list(&Default::default()).await.unwrap();
        let counts = server.request_counts();
        let count = |verb: &str, resource: &str| {
            counts
                .get(&(verb.to_string(), resource.to_string()))
                .copied()
                .unwrap_or(0)
        };
        assert_eq!(count("create", "configmaps"), 1);
        assert_eq!(count("get", "configmaps"), 2);
        assert_eq!(count("list", "configmaps"), 1);
        assert_eq!(count("watch", "configmaps"), 0);
        server.shutdown().await;
    }

    #[tokio::test]
    async fn kubeconfig_yields_a_working_client() {
        let server = TestApiServer::builder()
            .with_core_resources()
            .start()
            .await
            .unwrap();
        let yaml = crate::yaml::to_string(&server.kubeconfig()).unwrap();
        let kubeconfig: Kubeconfig = crate::yaml::from_str(&yaml).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .unwrap();
        let client = kube::Client::try_from(config).unwrap();
        let cms: Api<ConfigMap> = Api::default_namespaced(client);
        cms.create(&PostParams::default(), &config_map("from-kubeconfig"))
            .await
            .unwrap();
        assert!(cms.get_opt("from-kubeconfig").await.unwrap().is_some());
        server.shutdown().await;
    }

    #[tokio::test]
    async fn plain_http_serves_on_the_callers_listener() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = TestApiServer::builder()
            .with_core_resources()
            .listener(listener)
            .start()
            .await
            .unwrap();
        assert_eq!(server.url(), format!("http://127.0.0.1:{port}"));
        let cluster = server.kubeconfig().clusters[0].cluster.clone().unwrap();
        assert_eq!(cluster.certificate_authority_data, None);
        let cms: Api<ConfigMap> = Api::default_namespaced(server.client());
        cms.create(&PostParams::default(), &config_map("on-the-port"))
            .await
            .unwrap();
        assert!(cms.get_opt("on-the-port").await.unwrap().is_some());
    }

    #[tokio::test]
    async fn servers_in_one_process_are_independent() {
        let a = TestApiServer::builder()
            .with_core_resources()
            .start()
            .await
            .unwrap();
        let b = TestApiServer::builder()
            .with_core_resources()
            .start()
            .await
            .unwrap();
        assert_ne!(a.url(), b.url());
        Api::<ConfigMap>::default_namespaced(a.client())
            .create(&PostParams::default(), &config_map("only-in-a"))
            .await
            .unwrap();
        let in_b = Api::<ConfigMap>::default_namespaced(b.client())
            .get_opt("only-in-a")
            .await
            .unwrap();
        assert!(in_b.is_none());
    }

    #[tokio::test]
    async fn shutdown_ends_open_watches() {
        let server = TestApiServer::builder()
            .with_core_resources()
            .start()
            .await
            .unwrap();
        let cms: Api<ConfigMap> = Api::default_namespaced(server.client());
        let mut events = Box::pin(cms.watch(&WatchParams::default(), "0").await.unwrap());
        let stopped = tokio::time::timeout(Duration::from_secs(30), async {
            server.shutdown().await;
            while events.try_next().await.ok().flatten().is_some() {}
        });
        stopped
            .await
            .expect("shutdown completes and the watch ends");
    }

    #[tokio::test]
    async fn legacy_single_object_watch_sees_only_that_object() {
        let server = TestApiServer::builder()
            .with_core_resources()
            .start()
            .await
            .unwrap();
        let client = server.client();
        let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
        for name in ["watched", "other"] {
            cms.create(&PostParams::default(), &config_map(name))
                .await
                .unwrap();
        }
        let request = http::Request::get(
            "/api/v1/namespaces/default/configmaps/watched?watch=true&resourceVersion=0&timeoutSeconds=1",
        )
        .body(Vec::new())
        .unwrap();
        let stream = client.request_events::<ConfigMap>(request).await.unwrap();
        let events: Vec<Result<kube::api::WatchEvent<ConfigMap>, kube::Error>> =
            stream.collect().await;
        let names: Vec<String> = events
            .iter()
            .filter_map(|e| match e {
                Ok(kube::api::WatchEvent::Added(cm)) => cm.metadata.name.clone(),
                _ => None,
            })
            .collect();
        assert_eq!(names, vec!["watched".to_string()]);
    }
}
