//! The kube `Client` of one workload cluster: kube's own stack (as
//! `Client::try_from(config)` builds it), assembled from kube's public parts
//! (`ConfigExt`, `ClientBuilder`) so that its rustls configuration remembers
//! the TLS sessions of a few servers instead of rustls's default 256. That
//! default preallocates about 14 KiB in every configuration, and the
//! controller holds one client per workload cluster, each talking to one API
//! server. TLS is verified exactly as kube configures it (the configuration
//! is kube's own `rustls_client_config`); only `resumption` differs.

use std::time::Duration;

use http::{HeaderMap, Request, Response};
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::retry::RetryPolicy;
use kube::client::{Body, ClientBuilder, ConfigExt};
use kube::{Client, Config};
use tower::retry::RetryLayer;
use tower::util::BoxCloneSyncService;
use tower::{ServiceBuilder, ServiceExt};
use tower_http::classify::ServerErrorsFailureClass;
use tower_http::trace::TraceLayer;
use tracing::Span;

/// Servers whose TLS sessions a workload client remembers, to resume rather
/// than redo a handshake when its connection is reopened: a kubeconfig names
/// one API server; a few leave room for a load balancer's names.
pub const RESUMPTION_SERVERS: usize = 4;

/// How long the kube client keeps an idle connection (hyper's default).
const POOL_IDLE: Duration = Duration::from_secs(90);

/// A client for `config`, as `Client::try_from(config)` would build it but
/// with a session cache of [`RESUMPTION_SERVERS`], and without a TLS
/// configuration when the server URL is `http://`: kube's connector would
/// never use one there, and without a CA in the kubeconfig kube builds the
/// platform verifier, which copies the whole OS root store (about 80 KiB)
/// into every client.
pub fn workload_client(config: Config) -> Result<Client, kube::Error> {
    Ok(match assemble_for(config)? {
        Assembled::Client(client) => client,
        Assembled::Http(stack) | Assembled::Https(stack, _) => stack.client(),
    })
}

/// What [`assemble_for`] made of a kubeconfig.
pub enum Assembled {
    /// kube's own client (a proxy in the kubeconfig).
    Client(Client),
    /// Plain HTTP.
    Http(KubeStack),
    /// HTTPS, and the TLS configuration the stack's connector uses (a clone
    /// holds the same verifier, identity and session cache).
    Https(KubeStack, Box<rustls::ClientConfig>),
}

/// kube's stack for `config`, not yet a client.
pub fn assemble_for(config: Config) -> Result<Assembled, kube::Error> {
    if config.proxy_url.is_some() {
        // The trust policy refuses a kubeconfig's proxy-url; should one get
        // here, kube's own handling (and its errors) apply unchanged.
        return Ok(Assembled::Client(Client::try_from(config)?));
    }
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    if config.cluster_url.scheme() == Some(&http::uri::Scheme::HTTP) {
        return Ok(Assembled::Http(assemble(config, tcp)?));
    }
    let mut tls = config.rustls_client_config()?;
    tls.resumption = rustls::client::Resumption::in_memory_sessions(RESUMPTION_SERVERS);
    let mut https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls.clone())
        .https_or_http();
    if let Some(name) = &config.tls_server_name {
        let name = rustls::pki_types::ServerName::try_from(name.clone())
            .map_err(kube::client::RustlsTlsError::InvalidServerName)
            .map_err(kube::Error::RustlsTls)?;
        https = https.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    let stack = assemble(config, https.enable_http1().wrap_connector(tcp))?;
    Ok(Assembled::Https(stack, Box::new(tls)))
}

type ResponseBody = UnsyncBoxBody<bytes::Bytes, tower::BoxError>;

/// kube's request stack for one server: what `kube::Client` wraps (in a
/// tower `Buffer` with a task of its own, made only when a client is needed:
/// [`KubeStack::client`]).
#[derive(Clone)]
pub struct KubeStack {
    service: BoxCloneSyncService<Request<Body>, Response<ResponseBody>, tower::BoxError>,
    default_namespace: String,
}

impl KubeStack {
    pub fn client(&self) -> Client {
        // No `with_valid_until`: that is the expiry of an exec plugin's
        // credentials, and the trust policy refuses exec.
        ClientBuilder::new(self.service.clone(), self.default_namespace.clone()).build()
    }
}

/// kube's stack over `connector` (`make_generic_builder`): timeouts, the
/// hyper client, then its layers in its order (no gzip, no proxy: those kube
/// features are off).
fn assemble<C>(config: Config, connector: C) -> Result<KubeStack, kube::Error>
where
    C: tower::Service<http::Uri> + Clone + Send + Sync + 'static,
    C::Response: hyper::rt::Read
        + hyper::rt::Write
        + hyper_util::client::legacy::connect::Connection
        + Send
        + Unpin
        + 'static,
    C::Future: Send + 'static,
    C::Error: Into<tower::BoxError>,
{
    let mut connector = hyper_timeout::TimeoutConnector::new(connector);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    // With a timer the pool closes a connection idle for 90 s (hyper's
    // default); without one it keeps it until the next request. The reads of
    // every pass go on a connection of their own (`WorkloadReads`), so this
    // one is idle once bring-up and day-2 requests are done.
    let http_client: hyper_util::client::legacy::Client<_, Body> =
        hyper_util::client::legacy::Builder::new(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(POOL_IDLE)
            .build(connector);

    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(|req: &Request<Body>| {
                    tracing::debug_span!(
                        "HTTP",
                        http.method = %req.method(),
                        http.url = %req.uri(),
                        http.status_code = tracing::field::Empty,
                        otel.name = req.extensions().get::<&'static str>().unwrap_or(&"HTTP"),
                        otel.kind = "client",
                        otel.status_code = tracing::field::Empty,
                    )
                })
                .on_request(|_req: &Request<Body>, _span: &Span| {
                    tracing::debug!("requesting");
                })
                .on_response(
                    |res: &Response<Incoming>, _latency: Duration, span: &Span| {
                        let status = res.status();
                        span.record("http.status_code", status.as_u16());
                        if status.is_client_error() || status.is_server_error() {
                            span.record("otel.status_code", "ERROR");
                        }
                    },
                )
                .on_body_chunk(())
                .on_eos(|_: Option<&HeaderMap>, _duration: Duration, _span: &Span| {
                    tracing::debug!("stream closed");
                })
                // DEBUG, not kube's ERROR: a workload API that does not
                // answer (a server still booting, a cluster going away) is
                // an expected state, reported once per change by the
                // reconcile's conditions, never by every request.
                .on_failure(
                    |ec: ServerErrorsFailureClass, _latency: Duration, span: &Span| {
                        span.record("otel.status_code", "ERROR");
                        match ec {
                            ServerErrorsFailureClass::StatusCode(status) => {
                                span.record("http.status_code", status.as_u16());
                                tracing::debug!("failed with status {}", status)
                            }
                            ServerErrorsFailureClass::Error(err) => {
                                tracing::debug!("failed with error {}", err)
                            }
                        }
                    },
                ),
        )
        .map_err(tower::BoxError::from)
        .service(http_client);
    // The trace layer's body type names its closures: boxed to be named.
    let service = service
        .map_response(|response| response.map(|body| body.map_err(Into::into).boxed_unsync()));
    Ok(KubeStack {
        service: BoxCloneSyncService::new(service),
        default_namespace: config.default_namespace,
    })
}

#[cfg(test)]
#[cfg(feature = "sandbox")]
mod tests {
    use k8s_openapi::api::core::v1::Node;
    use kube::Api;
    use kube::api::ListParams;
    use kube::config::KubeConfigOptions;

    use super::*;
    use crate::apiserver::TestApiServer;
    use crate::harness::pki::TestCa;

    async fn config_of(kubeconfig: kube::config::Kubeconfig) -> Config {
        Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .expect("kube config")
    }

    async fn lists_nodes(client: Client) -> Result<usize, kube::Error> {
        let nodes: Api<Node> = Api::all(client);
        Ok(nodes.list(&ListParams::default()).await?.items.len())
    }

    /// An HTTPS server whose certificate `server_ca` signed, for 127.0.0.1.
    async fn https_server(server_ca: &TestCa) -> TestApiServer {
        crate::workload::reads::tests::https(
            TestApiServer::builder().with_core_resources(),
            server_ca,
        )
        .await
    }

    #[tokio::test]
    async fn an_http_server_is_reached_without_tls() {
        crate::install_crypto_provider();
        let server = TestApiServer::builder()
            .with_core_resources()
            .start()
            .await
            .expect("http test server");
        let config = config_of(server.kubeconfig()).await;
        assert_eq!(config.cluster_url.scheme_str(), Some("http"));
        let client = workload_client(config).expect("client");
        assert_eq!(lists_nodes(client).await.expect("list over http"), 0);
    }

    #[tokio::test]
    async fn https_is_verified_against_the_kubeconfig_ca() {
        crate::install_crypto_provider();
        let server_ca = TestCa::new("workload-server-ca");
        let server = https_server(&server_ca).await;
        let config = config_of(server.kubeconfig()).await;
        assert_eq!(config.cluster_url.scheme_str(), Some("https"));
        let client = workload_client(config.clone()).expect("client");
        assert_eq!(lists_nodes(client).await.expect("list over https"), 0);

        // The same server, trusted through another CA: the handshake fails.
        let mut untrusted = config;
        untrusted.root_cert = Some(vec![
            crate::pki::pem::first_certificate(TestCa::new("other-ca").pair.cert_pem.as_bytes())
                .expect("PEM")
                .expect("a certificate")
                .to_vec(),
        ]);
        let client = workload_client(untrusted).expect("client");
        assert!(
            lists_nodes(client).await.is_err(),
            "a server certificate from a CA the kubeconfig does not name was accepted"
        );
    }
}
