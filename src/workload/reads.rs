//! The reads a reconcile makes of a workload API server (the control-plane
//! Node LIST, once per pass), sent on one HTTP/2 connection of our own
//! ([`H2Connection`]) rather than through kube's client.
//!
//! kube's `Client` puts a tower `Buffer` in front of hyper, and hyper's
//! HTTP/1.1 dispatcher has a queue of its own: two tokio mpsc channels per
//! workload cluster, each of which takes a second 32-slot block for good
//! once 32 requests have passed, about half an hour into a fleet at rest
//! (docs/bench-history.md, "Where the RSS at rest grows"). Here a request
//! opens a stream on the connection with no queue in between.
//!
//! The request is kube's own (`kube::core::Request`), and so are the layers
//! it passes through (base URI, credentials, extra headers) and the TLS
//! configuration (the one the kube client uses, chain and name verified),
//! offering HTTP/2 and HTTP/1.1 by ALPN. A server that does not agree on
//! HTTP/2 (every kube-apiserver does; a proxy in front of one may not) is
//! remembered, and its reads go through the kube client from then on.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use kube::api::{ListParams, ObjectList};
use kube::client::ConfigExt;
use kube::core::Status;
use kube::{Api, Client, Config, Resource};
use rustls::pki_types::ServerName;
use serde::de::DeserializeOwned;
use tower::util::BoxCloneSyncService;
use tower::{ServiceBuilder, ServiceExt};

use super::client::{Assembled, KubeStack, assemble_for};
use crate::h2_connection::{BoxError, ConnectError, H2Connection, ResponseBody, Target};

/// How long one read may take, head and body, when the kubeconfig sets no
/// read timeout (kube's client then waits forever).
pub const READ_LIMIT: Duration = Duration::from_secs(30);

/// kube's connect timeout when the kubeconfig sets none.
const CONNECT_LIMIT: Duration = Duration::from_secs(30);

type ReadService =
    BoxCloneSyncService<http::Request<Empty<Bytes>>, http::Response<ResponseBody>, BoxError>;

/// The reads of `config`'s server on an HTTP/2 connection of their own
/// where it is HTTPS, with the kube client of the same stack (made on first
/// need), both on one TLS configuration.
pub fn workload_reads(config: Config) -> Result<WorkloadReads, kube::Error> {
    Ok(match assemble_for(config.clone())? {
        Assembled::Client(client) => WorkloadReads::through_client(client),
        Assembled::Http(stack) => WorkloadReads::through_stack(stack),
        Assembled::Https(stack, tls) => WorkloadReads::new(&config, *tls, stack)?,
    })
}

/// Reads of one workload API server, and its kube client for every other
/// request (port-forwards, a server without HTTP/2), made on first need: a
/// `kube::Client` is a tower `Buffer` with a task and a queue of its own,
/// which a cluster reached directly at rest never uses.
pub struct WorkloadReads {
    client: OnceLock<Client>,
    /// What the client is made of; `None` when it was given made.
    stack: Option<KubeStack>,
    /// `None`: the kube client only (plain HTTP, or a proxy in the kubeconfig).
    h2: Option<H2Reads>,
}

struct H2Reads {
    service: ReadService,
    server: String,
    limit: Duration,
    /// The server agreed on another protocol than HTTP/2.
    http1_only: AtomicBool,
}

impl WorkloadReads {
    /// Reads through `client` alone.
    pub fn through_client(client: Client) -> Self {
        Self {
            client: OnceLock::from(client),
            stack: None,
            h2: None,
        }
    }

    /// Reads through the kube client that `stack` makes on first need.
    pub fn through_stack(stack: KubeStack) -> Self {
        Self {
            client: OnceLock::new(),
            stack: Some(stack),
            h2: None,
        }
    }

    /// Reads on an HTTP/2 connection to `config`'s server, secured by `tls`
    /// (the kube client's configuration; its ALPN is set here), with the
    /// kube client of `stack` for servers that do not speak HTTP/2.
    pub fn new(
        config: &Config,
        mut tls: rustls::ClientConfig,
        stack: KubeStack,
    ) -> Result<Self, kube::Error> {
        let url = &config.cluster_url;
        let invalid = |reason: &str| {
            kube::Error::Service(format!("the kubeconfig server {url}: {reason}").into())
        };
        let host = url.host().ok_or_else(|| invalid("no host"))?;
        let port = url.port_u16().unwrap_or(443);
        let authority: http::uri::Authority = format!("{host}:{port}")
            .parse()
            .map_err(|e: http::uri::InvalidUri| invalid(&e.to_string()))?;
        let name = match &config.tls_server_name {
            Some(name) => name.clone(),
            None => host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
        };
        let server_name =
            ServerName::try_from(name).map_err(|e| invalid(&format!("server name: {e}")))?;
        tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let connection = Arc::new(H2Connection::lazy(Target {
            authority,
            server_name,
            tls: Arc::new(tls),
            connect_timeout: config.connect_timeout.unwrap_or(CONNECT_LIMIT),
            windows: None,
            alpn_h2_only: true,
        }));
        let send = tower::service_fn(move |request: http::Request<Empty<Bytes>>| {
            let connection = connection.clone();
            async move { connection.send(request).await }
        });
        // kube's layers, in kube's order (as `workload_client` assembles them).
        let service = ServiceBuilder::new()
            .layer(config.base_uri_layer())
            .option_layer(config.auth_layer()?)
            .layer(config.extra_headers_layer()?)
            .service(send)
            .map_err(Into::<BoxError>::into);
        Ok(Self {
            client: OnceLock::new(),
            stack: Some(stack),
            h2: Some(H2Reads {
                service: BoxCloneSyncService::new(service),
                server: url.to_string(),
                limit: config.read_timeout.unwrap_or(READ_LIMIT),
                http1_only: AtomicBool::new(false),
            }),
        })
    }

    /// The kube client of the same server (every other request goes
    /// there), made on the first call.
    pub fn client(&self) -> &Client {
        self.client.get_or_init(|| {
            self.stack
                .as_ref()
                .expect("a WorkloadReads has its client or what to make it of")
                .client()
        })
    }

    /// Whether the kube client has been made.
    pub fn client_made(&self) -> bool {
        self.client.get().is_some()
    }

    /// Whether reads go on an HTTP/2 connection of their own (not yet known
    /// to be refused by the server).
    pub fn over_h2(&self) -> bool {
        self.active_h2().is_some()
    }

    /// The HTTP/2 reads, unless there are none or the server refused them.
    fn active_h2(&self) -> Option<&H2Reads> {
        self.h2
            .as_ref()
            .filter(|h2| !h2.http1_only.load(Ordering::Relaxed))
    }

    /// LIST a cluster-scoped resource, as `Api::<K>::all(client).list(params)`.
    pub async fn list_all<K>(&self, params: &ListParams) -> Result<ObjectList<K>, kube::Error>
    where
        K: Resource<DynamicType = ()> + DeserializeOwned + Clone + std::fmt::Debug,
    {
        let Some(h2) = self.active_h2() else {
            return Api::<K>::all(self.client().clone()).list(params).await;
        };
        let request = kube::core::Request::new(K::url_path(&(), None))
            .list(params)
            .map_err(kube::Error::BuildRequest)?;
        match h2.get(request.map(|_| Empty::new())).await {
            Ok(body) => serde_json::from_slice(&body).map_err(kube::Error::SerdeError),
            Err(Failure::NotHttp2(why)) => {
                tracing::debug!(server = %h2.server, %why, "workload API reads through the kube client");
                h2.http1_only.store(true, Ordering::Relaxed);
                Api::<K>::all(self.client().clone()).list(params).await
            }
            Err(Failure::Kube(e)) => Err(e),
        }
    }
}

enum Failure {
    NotHttp2(String),
    Kube(kube::Error),
}

impl H2Reads {
    /// The body of a successful answer to `request`; an error answer as
    /// kube's client reports it (the server's `Status`).
    async fn get(&self, request: http::Request<Empty<Bytes>>) -> Result<Bytes, Failure> {
        let exchange = async {
            let response = self.service.clone().oneshot(request).await.map_err(|e| {
                match e.downcast_ref::<ConnectError>() {
                    Some(ConnectError::NotHttp2(why)) => Failure::NotHttp2(why.clone()),
                    _ => Failure::Kube(kube::Error::Service(e)),
                }
            })?;
            let (head, body) = response.into_parts();
            let body = body
                .collect()
                .await
                .map_err(|e| Failure::Kube(kube::Error::Service(e.into())))?
                .to_bytes();
            if head.status.is_client_error() || head.status.is_server_error() {
                return Err(Failure::Kube(api_error(head.status, &body)));
            }
            Ok(body)
        };
        tokio::time::timeout(self.limit, exchange)
            .await
            .unwrap_or_else(|_| {
                Err(Failure::Kube(kube::Error::Service(
                    format!("{}: no answer within {:?}", self.server, self.limit).into(),
                )))
            })
    }
}

/// An error answer as kube's client reads it: the server's `Status`, or one
/// made of the text and the code.
fn api_error(code: http::StatusCode, body: &[u8]) -> kube::Error {
    let text = String::from_utf8_lossy(body);
    let status = serde_json::from_str::<Status>(&text).unwrap_or_else(|_| {
        Status::failure(text.trim(), "Failed to parse error data").with_code(code.as_u16())
    });
    kube::Error::Api(status.boxed())
}

#[cfg(test)]
#[cfg(feature = "sandbox")]
pub(crate) mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use k8s_openapi::api::core::v1::Node;
    use kube::api::PostParams;
    use kube::config::{KubeConfigOptions, Kubeconfig};
    use rcgen::{ExtendedKeyUsagePurpose, SanType};

    use super::*;
    use crate::apiserver::{ServerTls, TestApiServer, TestApiServerBuilder};
    use crate::harness::pki::TestCa;

    async fn reads_of(kubeconfig: Kubeconfig) -> WorkloadReads {
        let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .expect("kube config");
        workload_reads(config).expect("reads")
    }

    /// `builder` on HTTPS for 127.0.0.1, its certificate signed by `ca`.
    pub(crate) async fn https(builder: TestApiServerBuilder, ca: &TestCa) -> TestApiServer {
        crate::install_crypto_provider();
        let serving = ca.issue(
            "workload",
            &[SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST))],
            &[ExtendedKeyUsagePurpose::ServerAuth],
        );
        builder
            .tls(ServerTls {
                ca_pem: ca.pair.cert_pem.clone(),
                cert_pem: serving.cert_pem,
                key_pem: serving.key_pem,
                client_ca_pem: None,
                client_identity: None,
            })
            .start()
            .await
            .expect("https test server")
    }

    async fn add_node(server: &TestApiServer, name: &str) {
        let mut node = Node::default();
        node.metadata.name = Some(name.into());
        node.metadata.labels = Some(
            [(
                "node-role.kubernetes.io/control-plane".to_string(),
                "true".to_string(),
            )]
            .into(),
        );
        Api::<Node>::all(server.client())
            .create(&PostParams::default(), &node)
            .await
            .expect("node");
    }

    fn node_lists(server: &TestApiServer) -> u64 {
        server
            .request_counts()
            .get(&("list".to_string(), "nodes".to_string()))
            .copied()
            .unwrap_or(0)
    }

    fn control_plane() -> ListParams {
        ListParams::default().labels("node-role.kubernetes.io/control-plane")
    }

    /// A server that speaks HTTP/2 (as kube-apiserver does) is read on the
    /// HTTP/2 connection: one LIST per read, the kube client's answer, and
    /// no kube client made.
    #[tokio::test]
    async fn a_server_that_speaks_http2_is_read_over_it() {
        let ca = TestCa::new("workload-ca");
        let server = https(TestApiServer::builder().with_core_resources(), &ca).await;
        add_node(&server, "cp-0").await;
        let reads = reads_of(server.kubeconfig()).await;
        assert!(reads.over_h2());

        let before = node_lists(&server);
        let nodes = reads
            .list_all::<Node>(&control_plane())
            .await
            .expect("list");
        assert_eq!(nodes.items.len(), 1);
        assert_eq!(nodes.items[0].metadata.name.as_deref(), Some("cp-0"));
        assert!(reads.over_h2(), "the server agreed on HTTP/2");
        // A second read on the same connection.
        reads
            .list_all::<Node>(&control_plane())
            .await
            .expect("list");
        assert_eq!(node_lists(&server) - before, 2);
        assert!(
            !reads.client_made(),
            "reads over HTTP/2 made a kube client (a Buffer, its task and queue)"
        );
    }

    /// A server (or a proxy) that offers HTTP/1.1 alone: the read goes
    /// through the kube client, and so do the next ones.
    #[tokio::test]
    async fn a_server_without_http2_is_read_through_the_kube_client() {
        let ca = TestCa::new("workload-ca");
        let server = https(
            TestApiServer::builder().with_core_resources().http1_only(),
            &ca,
        )
        .await;
        add_node(&server, "cp-0").await;
        let reads = reads_of(server.kubeconfig()).await;

        let nodes = reads
            .list_all::<Node>(&control_plane())
            .await
            .expect("list");
        assert_eq!(nodes.items.len(), 1);
        assert!(!reads.over_h2(), "HTTP/1.1 was remembered");
        assert!(reads.client_made());
        reads
            .list_all::<Node>(&control_plane())
            .await
            .expect("list");
    }

    /// The kubeconfig's credentials go with every read: a token the server
    /// does not know is refused with the server's own 401, as the kube
    /// client reports it; the right one is let through.
    #[tokio::test]
    async fn credentials_go_with_the_read_and_a_refusal_is_the_servers_status() {
        let ca = TestCa::new("workload-ca");
        let builder = TestApiServer::builder().with_core_resources().user(
            "right-token",
            "admin",
            &["system:masters"],
        );
        let server = https(builder, &ca).await;
        add_node(&server, "cp-0").await;

        let wrong = reads_of(server.kubeconfig_with_token("wrong-token")).await;
        match wrong.list_all::<Node>(&control_plane()).await {
            Err(kube::Error::Api(status)) => assert_eq!(status.code, 401, "{status:?}"),
            other => panic!("a wrong token was not refused: {other:?}"),
        }
        assert!(wrong.over_h2(), "a refusal is no reason to leave HTTP/2");

        let right = reads_of(server.kubeconfig_with_token("right-token")).await;
        let nodes = right
            .list_all::<Node>(&control_plane())
            .await
            .expect("list");
        assert_eq!(nodes.items.len(), 1);
        assert!(right.over_h2());
    }

    /// The server's certificate is verified against the kubeconfig's CA:
    /// another CA's server fails the handshake, and the read is not retried
    /// through the kube client.
    #[tokio::test]
    async fn a_server_certificate_from_another_ca_is_refused() {
        let ca = TestCa::new("workload-ca");
        let server = https(TestApiServer::builder().with_core_resources(), &ca).await;
        let mut kubeconfig = server.kubeconfig();
        let other = TestCa::new("other-ca");
        kubeconfig.clusters[0]
            .cluster
            .as_mut()
            .expect("cluster")
            .certificate_authority_data = Some(base64_pem(&other.pair.cert_pem));
        let reads = reads_of(kubeconfig).await;
        let before = node_lists(&server);
        let error = reads
            .list_all::<Node>(&control_plane())
            .await
            .expect_err("a server signed by a CA the kubeconfig does not name was read");
        let text = format!("{error}: {:?}", std::error::Error::source(&error));
        assert!(text.contains("tls handshake error"), "{text}");
        assert!(
            reads.over_h2(),
            "a TLS failure is no reason to leave HTTP/2"
        );
        assert_eq!(node_lists(&server), before, "nothing reached the server");
    }

    fn base64_pem(pem: &str) -> String {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(pem)
    }
}
