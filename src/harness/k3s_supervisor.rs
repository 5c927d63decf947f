//! A k3s server's supervisor port (6443) as far as TLS goes: the certificate
//! k3s's dynamic listener serves there, issued by the cluster's server CA
//! with CN and O `k3s` and the node's names and addresses as SANs (docs/k3s.md
//! C6). It completes handshakes and closes; it counts the connections it
//! accepted, so a test can tell how often it was probed.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rcgen::{ExtendedKeyUsagePurpose, SanType};
use tokio::task::JoinHandle;

use super::pki::{CertPair, TestCa};

/// One server's supervisor port; stops listening when dropped.
pub struct SupervisorPort {
    pub address: SocketAddr,
    /// The serving certificate's expiry, as issued.
    pub not_after: chrono::DateTime<chrono::Utc>,
    accepted: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Drop for SupervisorPort {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The certificate k3s's dynamic listener serves for `node` at `ip`; without
/// the node IP in its SANs when `ip_in_cert` is false (a client dialling the
/// IP must then refuse it).
pub fn supervisor_certificate(
    server_ca: &TestCa,
    node: &str,
    ip: Ipv4Addr,
    lifetime: Duration,
    ip_in_cert: bool,
) -> CertPair {
    let mut sans = vec![
        SanType::DnsName("kubernetes".try_into().expect("dns name")),
        SanType::DnsName("kubernetes.default".try_into().expect("dns name")),
        SanType::DnsName("localhost".try_into().expect("dns name")),
        SanType::DnsName(node.try_into().expect("dns name")),
        SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)),
    ];
    if ip_in_cert {
        sans.push(SanType::IpAddress(IpAddr::V4(ip)));
    }
    server_ca.issue_valid_for(
        "k3s",
        &sans,
        &[ExtendedKeyUsagePurpose::ServerAuth],
        lifetime,
    )
}

impl SupervisorPort {
    /// Listen on `ip:port` with `cert`.
    pub async fn serve(ip: Ipv4Addr, port: u16, cert: &CertPair) -> std::io::Result<Self> {
        let invalid = |e: String| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
        let chain = crate::pki::pem::certificates(cert.cert_pem.as_bytes())
            .map_err(|e| invalid(e.to_string()))?;
        let key = crate::pki::pem::private_key(cert.key_pem.as_bytes())
            .map_err(|e| invalid(e.to_string()))?
            .ok_or_else(|| invalid("no key".into()))?;
        let not_after = crate::pki::not_after(&cert.cert_pem, "supervisor certificate")
            .map_err(|e| invalid(e.to_string()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| invalid(e.to_string()))?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind((ip, port)).await?;
        let address = listener.local_addr()?;
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = accepted.clone();
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    // The handshake is all a probe asks for; a refused one
                    // fails on the client's side.
                    let _ =
                        tokio::time::timeout(Duration::from_secs(5), acceptor.accept(tcp)).await;
                });
            }
        });
        Ok(SupervisorPort {
            address,
            not_after,
            accepted,
            task,
        })
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}
