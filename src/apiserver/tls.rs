//! Serving the test API server over TLS, optionally mutual, as a k3s API server does:
//! a serving certificate signed by the cluster's server CA and, when a client CA is
//! given, only clients whose certificate that CA signed.
//!
//! TCP connections are accepted by one task; every handshake runs in its own task
//! (bounded by [`HANDSHAKE_TIMEOUT`]) and hands the finished stream to axum through a
//! channel, so a slow or silent client never holds up the others. A failed handshake is
//! logged at debug and dropped.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

use super::Error;

/// A client that has not finished its handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Finished handshakes waiting for axum to take them.
const ACCEPT_QUEUE: usize = 64;

/// TLS material for [`TestApiServerBuilder::tls`](super::TestApiServerBuilder::tls).
///
/// `Debug` prints no key material.
#[derive(Clone)]
pub struct ServerTls {
    /// PEM of the CA(s) clients trust: the CA that signed `cert_pem` (the cluster's
    /// server CA). Written to the kubeconfig as `certificate-authority-data`.
    pub ca_pem: String,
    /// PEM of the serving certificate (then any intermediates). For a server reached at
    /// `https://127.0.0.1:<port>` it needs the IP SAN 127.0.0.1.
    pub cert_pem: String,
    /// PEM of the serving certificate's private key (PKCS#8, SEC1 or PKCS#1).
    pub key_pem: String,
    /// `Some`: every client must present a certificate, verified against this CA PEM
    /// (the cluster's client CA); others are refused during the handshake.
    /// `None`: no client certificate is asked for.
    pub client_ca_pem: Option<String>,
    /// Certificate and key PEM of the identity that [`TestApiServer::client`](super::TestApiServer::client)
    /// and [`TestApiServer::kubeconfig`](super::TestApiServer::kubeconfig) use.
    pub client_identity: Option<(String, String)>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("key_pem", &"<redacted>")
            .field(
                "client_certificates_required",
                &self.client_ca_pem.is_some(),
            )
            .field(
                "client_identity",
                &self
                    .client_identity
                    .as_ref()
                    .map(|_| "<certificate and key redacted>"),
            )
            .finish_non_exhaustive()
    }
}

fn tls_error(what: &'static str, reason: impl std::fmt::Display) -> Error {
    Error::Tls {
        what,
        reason: reason.to_string(),
    }
}

fn certificates(pem: &str, what: &'static str) -> Result<Vec<CertificateDer<'static>>, Error> {
    let certs = crate::pki::pem::certificates(pem.as_bytes()).map_err(|e| tls_error(what, e))?;
    if certs.is_empty() {
        return Err(tls_error(what, "no CERTIFICATE block in the PEM"));
    }
    Ok(certs)
}

fn private_key(pem: &str, what: &'static str) -> Result<PrivateKeyDer<'static>, Error> {
    crate::pki::pem::private_key(pem.as_bytes())
        .map_err(|e| tls_error(what, e))?
        .ok_or_else(|| tls_error(what, "no private key block in the PEM"))
}

impl ServerTls {
    /// The rustls server configuration (ring provider; HTTP/2 and HTTP/1.1 by
    /// ALPN, or HTTP/1.1 alone with `http1_only`), checking
    /// every PEM, the client identity included, so that clients built later cannot fail
    /// on it.
    pub(super) fn server_config(&self, http1_only: bool) -> Result<Arc<ServerConfig>, Error> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_error("protocol versions", e))?;
        let builder = match &self.client_ca_pem {
            Some(pem) => builder.with_client_cert_verifier(client_verifier(pem, provider)?),
            None => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(
                certificates(&self.cert_pem, "cert_pem")?,
                private_key(&self.key_pem, "key_pem")?,
            )
            .map_err(|e| tls_error("cert_pem and key_pem", e))?;
        // axum serves both (its http2 feature is on); kube's client offers
        // HTTP/1.1 alone, which its WebSocket upgrades need.
        config.alpn_protocols = if http1_only {
            vec![b"http/1.1".to_vec()]
        } else {
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        };
        certificates(&self.ca_pem, "ca_pem")?;
        if let Some((cert, key)) = &self.client_identity {
            certificates(cert, "client_identity certificate")?;
            private_key(key, "client_identity key")?;
        }
        Ok(Arc::new(config))
    }
}

/// Client certificates are required and must chain to `ca_pem`.
fn client_verifier(
    ca_pem: &str,
    provider: Arc<CryptoProvider>,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, Error> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(ca_pem, "client_ca_pem")? {
        roots.add(cert).map_err(|e| tls_error("client_ca_pem", e))?;
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| tls_error("client_ca_pem", e))
}

/// The [`axum::serve::Listener`] of a TLS server: streams whose handshake finished.
pub(super) struct TlsListener {
    incoming: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local_addr: SocketAddr,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.incoming.recv().await {
            Some(connection) => connection,
            // The acceptor stopped: the server is shutting down and axum is about to
            // stop asking.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local_addr)
    }
}

/// The client certificate's user, as the real x509 authenticator maps it: the
/// subject's CN is the user name, its O entries the groups. A plain-HTTP connection,
/// or a TLS one without a client certificate, has none.
impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, TlsListener>>
    for super::auth::PeerUser
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, TlsListener>) -> Self {
        let user = stream
            .io()
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
            .and_then(|leaf| certificate_user(leaf.as_ref()));
        Self(user)
    }
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, TcpListener>>
    for super::auth::PeerUser
{
    fn connect_info(_: axum::serve::IncomingStream<'_, TcpListener>) -> Self {
        Self(None)
    }
}

fn certificate_user(der: &[u8]) -> Option<super::auth::UserInfo> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = cert.subject();
    let name = subject
        .iter_common_name()
        .next()?
        .as_str()
        .ok()?
        .to_string();
    let groups: Vec<&str> = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok())
        .collect();
    Some(super::auth::UserInfo::new(name, &groups))
}

/// Accept TCP connections on `tcp` until `stop` or until the returned listener is
/// dropped (the task then ends and the port closes).
pub(super) fn spawn_acceptor(
    tcp: TcpListener,
    config: Arc<ServerConfig>,
    stop: CancellationToken,
) -> io::Result<(TlsListener, JoinHandle<()>)> {
    let local_addr = tcp.local_addr()?;
    let acceptor = TlsAcceptor::from(config);
    let (tx, rx) = mpsc::channel(ACCEPT_QUEUE);
    let task = tokio::spawn(async move {
        loop {
            let (stream, peer) = tokio::select! {
                _ = stop.cancelled() => break,
                _ = tx.closed() => break,
                accepted = tcp.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        accept_error(e, &stop).await;
                        continue;
                    }
                },
            };
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream));
                let stream = tokio::select! {
                    _ = stop.cancelled() => return,
                    done = handshake => match done {
                        Ok(Ok(stream)) => stream,
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "test API server: TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!(%peer, timeout = ?HANDSHAKE_TIMEOUT, "test API server: TLS handshake timed out");
                            return;
                        }
                    },
                };
                // Fails only once the server stopped taking connections.
                let _ = tx.send((stream, peer)).await;
            });
        }
    });
    Ok((
        TlsListener {
            incoming: rx,
            local_addr,
        },
        task,
    ))
}

/// As axum does for plain TCP: a failed connection is skipped; anything else (such as
/// running out of file descriptors) is logged and retried after a pause.
async fn accept_error(e: io::Error, stop: &CancellationToken) {
    if matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    ) {
        return;
    }
    tracing::warn!(error = %e, "test API server: accepting a TCP connection failed");
    tokio::select! {
        _ = stop.cancelled() => {}
        _ = tokio::time::sleep(Duration::from_millis(100)) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_certificate_names_its_user_by_cn_and_groups_by_o() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::default();
        let mut dn = rcgen::DistinguishedName::new();
        dn.push(rcgen::DnType::CommonName, "system:admin");
        dn.push(rcgen::DnType::OrganizationName, "system:masters");
        params.distinguished_name = dn;
        let cert = params.self_signed(&key).unwrap();
        let user = certificate_user(cert.der()).unwrap();
        assert_eq!(user.name, "system:admin");
        assert_eq!(user.groups, vec!["system:masters", "system:authenticated"]);
        assert!(certificate_user(b"not a certificate").is_none());
    }
}
