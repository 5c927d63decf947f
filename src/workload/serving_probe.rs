//! The k3s serving certificate on a server's supervisor port (6443 unless
//! `https-listen-port` says otherwise), read by one verified TLS handshake.
//!
//! k3s serves its supervisor and API proxy there with a certificate its
//! dynamic listener issues from the cluster's server CA, with the node's
//! addresses among its SANs (docs/k3s.md C6). We verify the chain against
//! the cluster's server CA and the name against the address we dial, as any
//! client would; no client certificate is sent and nothing is requested: the
//! handshake alone tells the certificate's `NotAfter`.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use rustls::pki_types::{CertificateDer, ServerName};
use thiserror::Error;

/// Why the probe told nothing.
#[derive(Debug, Error)]
pub enum ProbeError {
    #[error("the server CA in {field} cannot be used: {reason}")]
    ServerCa { field: String, reason: String },
    #[error("{address}: no TLS handshake within {limit:?}")]
    Timeout {
        address: SocketAddr,
        limit: Duration,
    },
    #[error("{address}: {reason}")]
    Connect { address: SocketAddr, reason: String },
    /// Verification failed (chain, name or validity): the reason says which.
    #[error("{address}: the serving certificate was not accepted for {name}: {reason}")]
    Verify {
        address: SocketAddr,
        name: IpAddr,
        reason: String,
    },
    #[error("{address}: the serving certificate's NotAfter cannot be read")]
    Unreadable { address: SocketAddr },
}

/// A TLS client that trusts only `server_ca_pem` (the cluster's server CA,
/// named `field` in errors). Built once per probe round.
pub fn client_config(
    server_ca_pem: &str,
    field: &str,
) -> Result<Arc<rustls::ClientConfig>, ProbeError> {
    let bad = |reason: String| ProbeError::ServerCa {
        field: field.to_string(),
        reason,
    };
    let mut roots = rustls::RootCertStore::empty();
    let certs: Vec<CertificateDer<'static>> =
        crate::pki::pem::certificates(server_ca_pem.as_bytes()).map_err(|e| bad(e.to_string()))?;
    let (added, _) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(bad("no usable CA certificate".into()));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports rustls's default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// One verified handshake with `address`, its name checked as `address.ip()`;
/// the serving certificate's `NotAfter`.
pub async fn probe(
    config: Arc<rustls::ClientConfig>,
    address: SocketAddr,
    limit: Duration,
) -> Result<DateTime<Utc>, ProbeError> {
    let connector = tokio_rustls::TlsConnector::from(config);
    let name = ServerName::IpAddress(address.ip().into());
    let handshake = async {
        let tcp =
            tokio::net::TcpStream::connect(address)
                .await
                .map_err(|e| ProbeError::Connect {
                    address,
                    reason: e.to_string(),
                })?;
        connector.connect(name, tcp).await.map_err(|e| {
            match e
                .get_ref()
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            {
                Some(tls) => ProbeError::Verify {
                    address,
                    name: address.ip(),
                    reason: tls.to_string(),
                },
                None => ProbeError::Connect {
                    address,
                    reason: e.to_string(),
                },
            }
        })
    };
    let stream = tokio::time::timeout(limit, handshake)
        .await
        .map_err(|_| ProbeError::Timeout { address, limit })??;
    let (_, session) = stream.get_ref();
    let leaf = session
        .peer_certificates()
        .and_then(|chain| chain.first())
        .ok_or(ProbeError::Unreadable { address })?;
    let not_after =
        crate::etcd::serving_certs::not_after(leaf).ok_or(ProbeError::Unreadable { address })?;
    Ok(DateTime::<Utc>::from(not_after))
}
