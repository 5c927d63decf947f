//! The conversion webhook's HTTPS server: `POST /convert` with a
//! `ConversionReview`, served with the certificate cert-manager writes into
//! the mounted Secret (`tls.crt`, `tls.key`), reloaded when it is renewed.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

use super::review::{answer, needed_versions};
use crate::api::conversion::KnownApiVersions;

/// Looks up the API version of a kind by (group, kind): the contract
/// version its CRD's labels give (wired by `run` to the controller's
/// `ContractVersions`). `None` when it cannot be told.
pub type ApiVersionLookup = Arc<
    dyn Fn(String, String) -> futures::future::BoxFuture<'static, Option<String>> + Send + Sync,
>;

/// CAPI's convention for where a provider's webhook certificate is mounted.
pub const DEFAULT_CERT_DIR: &str = "/tmp/k8s-webhook-server/serving-certs";
/// CAPI's convention for the webhook port.
pub const DEFAULT_PORT: u16 = 9443;
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const RELOAD_EVERY: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("webhook certificate {path}: {reason}")]
    Certificate { path: String, reason: String },
    #[error("webhook address {addr}: {source}")]
    Bind { addr: SocketAddr, source: io::Error },
}

fn cert_error(path: &Path, reason: impl ToString) -> WebhookError {
    WebhookError::Certificate {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// `tls.crt` and `tls.key` of `dir` as a rustls key, and when they last changed.
fn load(dir: &Path) -> Result<(Arc<CertifiedKey>, SystemTime), WebhookError> {
    let cert_path = dir.join("tls.crt");
    let key_path = dir.join("tls.key");
    let modified = |p: &Path| {
        std::fs::metadata(p)
            .and_then(|m| m.modified())
            .map_err(|e| cert_error(p, e))
    };
    let changed = modified(&cert_path)?.max(modified(&key_path)?);
    let cert_pem = std::fs::read(&cert_path).map_err(|e| cert_error(&cert_path, e))?;
    let key_pem = std::fs::read(&key_path).map_err(|e| cert_error(&key_path, e))?;
    let chain = crate::pki::pem::certificates(&cert_pem).map_err(|e| cert_error(&cert_path, e))?;
    if chain.is_empty() {
        return Err(cert_error(&cert_path, "no PEM certificate"));
    }
    let key = crate::pki::pem::private_key(&key_pem)
        .map_err(|e| cert_error(&key_path, e))?
        .ok_or_else(|| cert_error(&key_path, "no PEM private key"))?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|e| cert_error(&key_path, e))?;
    let certified = CertifiedKey::new(chain, signing);
    certified
        .keys_match()
        .map_err(|e| cert_error(&key_path, format!("does not match tls.crt: {e}")))?;
    Ok((Arc::new(certified), changed))
}

/// The certificate in use, swapped when the files change (cert-manager renews
/// it in place).
#[derive(Debug)]
struct ReloadingCert {
    dir: PathBuf,
    current: RwLock<(Arc<CertifiedKey>, SystemTime)>,
}

impl ReloadingCert {
    fn reload_if_changed(&self) {
        let (_, seen) = *self.current.read().unwrap_or_else(|p| p.into_inner());
        match load(&self.dir) {
            Ok((key, changed)) if changed != seen => {
                tracing::info!(dir = %self.dir.display(), "webhook certificate renewed: reloaded");
                *self.current.write().unwrap_or_else(|p| p.into_inner()) = (key, changed);
            }
            Ok(_) => {}
            // Mid-rotation the two files may not match yet: keep serving the old one.
            Err(e) => tracing::debug!(error = %e, "webhook certificate not reloaded"),
        }
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .0
                .clone(),
        )
    }
}

struct TlsListener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((stream, peer)) = self.tcp.accept().await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, self.acceptor.accept(stream)).await {
                Ok(Ok(tls)) => return (tls, peer),
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "webhook: TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "webhook: TLS handshake timed out"),
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

async fn convert(
    axum::extract::State(lookup): axum::extract::State<Option<ApiVersionLookup>>,
    body: axum::body::Bytes,
) -> (StatusCode, axum::Json<serde_json::Value>) {
    let review: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                axum::Json(serde_json::json!({"error": format!("not a ConversionReview: {e}")})),
            );
        }
    };
    // A version that cannot be told is left out: the object's annotation may
    // still hold it, and otherwise the conversion names what is missing.
    let mut versions = KnownApiVersions::new();
    if let Some(lookup) = &lookup {
        for (group, kind) in needed_versions(&review) {
            if let Some(v) = lookup(group.clone(), kind.clone()).await {
                versions.insert((group, kind), v);
            }
        }
    }
    match answer(&review, &versions) {
        Ok(response) => (StatusCode::OK, axum::Json(response)),
        Err(e) => (
            StatusCode::BAD_REQUEST,
            axum::Json(serde_json::json!({"error": e})),
        ),
    }
}

/// A bound, not yet serving webhook.
pub struct Webhook {
    listener: TlsListener,
    cert: Arc<ReloadingCert>,
    versions: Option<ApiVersionLookup>,
}

impl Webhook {
    /// Load the certificate of `cert_dir` and bind `addr`.
    pub async fn bind(addr: SocketAddr, cert_dir: &Path) -> Result<Self, WebhookError> {
        let cert = Arc::new(ReloadingCert {
            dir: cert_dir.to_path_buf(),
            current: RwLock::new(load(cert_dir)?),
        });
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("ring supports rustls's default protocol versions")
        .with_no_client_auth()
        .with_cert_resolver(cert.clone());
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let tcp = TcpListener::bind(addr)
            .await
            .map_err(|source| WebhookError::Bind { addr, source })?;
        Ok(Webhook {
            listener: TlsListener {
                tcp,
                acceptor: TlsAcceptor::from(Arc::new(config)),
            },
            cert,
            versions: None,
        })
    }

    /// Look up the API versions a conversion may need (an infrastructure
    /// template's, from its CRD's contract labels).
    pub fn with_api_versions(mut self, lookup: ApiVersionLookup) -> Self {
        self.versions = Some(lookup);
        self
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.tcp.local_addr()
    }

    /// Serve until `stop`.
    pub async fn serve(self, stop: CancellationToken) {
        let cert = self.cert.clone();
        let reload_stop = stop.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = reload_stop.cancelled() => return,
                    _ = tokio::time::sleep(RELOAD_EVERY) => cert.reload_if_changed(),
                }
            }
        });
        let app = Router::new()
            .route("/convert", post(convert))
            .with_state(self.versions.clone());
        let _ = axum::serve(self.listener, app)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await;
    }
}
