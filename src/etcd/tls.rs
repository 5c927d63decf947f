//! TLS material for talking to etcd: the server CA, and a client identity that is
//! either loaded from PEM files or minted from the etcd CA (what the
//! `<cluster>-etcd` Secret holds) and renewed before it expires.
//!
//! Every error names the field or flag it came from (the caller passes that label),
//! and nothing here ever prints key material: [`ClientIdentity`] and
//! [`ClientCertMinter`] have hand-written `Debug` impls.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::pki::signer::CaSigner;
use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::serving_certs::{RecordingVerifier, ServingCerts};
use rustls::sign::SigningKey as RustlsSigningKey;
use x509_parser::prelude::{FromDer, X509Certificate};

/// Common name of the client certificates we mint, as Cluster API providers do.
pub const CLIENT_COMMON_NAME: &str = "cluster-api.x-k8s.io";
/// Default lifetime of a minted client certificate.
pub const DEFAULT_MINTED_LIFETIME: Duration = Duration::from_secs(3600);
/// Servers whose TLS sessions a client configuration remembers, to resume
/// rather than redo a handshake when a connection to a member is reopened:
/// more than the members of any etcd cluster.
const RESUMPTION_SERVERS: usize = 16;
/// Minted certificates start this much in the past, to tolerate clock skew.
const BACKDATE: Duration = Duration::from_secs(60);

/// A problem with TLS material; `field` names where it came from (a CLI flag
/// with its path, or a Secret and key).
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{field}: cannot read: {reason}")]
    Unreadable { field: String, reason: String },
    #[error("{field}: no PEM certificate found")]
    NoCertificate { field: String },
    #[error("{field}: not a valid X.509 certificate: {reason}")]
    BadCertificate { field: String, reason: String },
    #[error("{field}: no PEM private key found (expected PKCS#8, SEC1 EC or PKCS#1 RSA)")]
    NoKey { field: String },
    #[error("{field}: unsupported or malformed private key: {reason}")]
    BadKey { field: String, reason: String },
    #[error("{key_field}: key does not match the certificate in {cert_field}")]
    KeyMismatch {
        key_field: String,
        cert_field: String,
    },
    #[error(
        "{field}: certificate is not valid for client authentication (no clientAuth extended key usage)"
    )]
    NotForClientAuth { field: String },
    #[error("{field}: certificate expired at {not_after}")]
    Expired { field: String, not_after: String },
    #[error("{field}: certificate is not a CA (basicConstraints CA:TRUE missing)")]
    NotCa { field: String },
    #[error("cannot mint a client certificate from {field}: {reason}")]
    Mint { field: String, reason: String },
}

/// Read a PEM file, naming `field` in the error.
pub fn read_pem_file(field: &str, path: &std::path::Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError::Unreadable {
        field: field.to_string(),
        reason: e.to_string(),
    })
}

fn parse_certs(field: &str, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = crate::pki::pem::certificates(pem).map_err(|e| TlsError::BadCertificate {
        field: field.to_string(),
        reason: e.to_string(),
    })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            field: field.to_string(),
        });
    }
    for cert in &certs {
        X509Certificate::from_der(cert).map_err(|e| TlsError::BadCertificate {
            field: field.to_string(),
            reason: e.to_string(),
        })?;
    }
    Ok(certs)
}

fn parse_key(field: &str, pem: &[u8]) -> Result<PrivateKeyDer<'static>, TlsError> {
    match crate::pki::pem::private_key(pem) {
        Ok(Some(key)) => Ok(key),
        Ok(None) => Err(TlsError::NoKey {
            field: field.to_string(),
        }),
        // The PEM error never quotes the text.
        Err(e) => Err(TlsError::BadKey {
            field: field.to_string(),
            reason: e.to_string(),
        }),
    }
}

fn signing_key(
    field: &str,
    key: &PrivateKeyDer<'static>,
) -> Result<Arc<dyn RustlsSigningKey>, TlsError> {
    rustls::crypto::ring::sign::any_supported_type(key).map_err(|e| TlsError::BadKey {
        field: field.to_string(),
        reason: e.to_string(),
    })
}

/// Fail unless `key` is the private half of `cert`'s public key.
fn check_key_matches(
    key: &dyn RustlsSigningKey,
    key_field: &str,
    cert: &CertificateDer<'_>,
    cert_field: &str,
) -> Result<(), TlsError> {
    let (_, parsed) = X509Certificate::from_der(cert).map_err(|e| TlsError::BadCertificate {
        field: cert_field.to_string(),
        reason: e.to_string(),
    })?;
    let cert_spki = parsed.tbs_certificate.subject_pki.raw;
    let matches = key
        .public_key()
        .is_some_and(|spki| spki.as_ref() == cert_spki);
    if matches {
        Ok(())
    } else {
        Err(TlsError::KeyMismatch {
            key_field: key_field.to_string(),
            cert_field: cert_field.to_string(),
        })
    }
}

fn not_after(cert: &CertificateDer<'_>) -> SystemTime {
    X509Certificate::from_der(cert)
        .map(|(_, c)| {
            let secs = c.validity().not_after.timestamp();
            SystemTime::UNIX_EPOCH + Duration::from_secs(secs.max(0) as u64)
        })
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

fn subject(cert: &CertificateDer<'_>) -> String {
    X509Certificate::from_der(cert)
        .map(|(_, c)| c.subject().to_string())
        .unwrap_or_default()
}

/// The etcd server CA bundle used to verify every member's serving certificate.
#[derive(Clone)]
pub struct ServerCa {
    pem: Vec<u8>,
    subject: String,
}

impl ServerCa {
    pub fn from_pem(field: &str, pem: &[u8]) -> Result<Self, TlsError> {
        let certs = parse_certs(field, pem)?;
        Ok(Self {
            pem: pem.to_vec(),
            subject: subject(&certs[0]),
        })
    }

    pub fn pem(&self) -> &[u8] {
        &self.pem
    }
}

impl fmt::Debug for ServerCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerCa")
            .field("subject", &self.subject)
            .finish()
    }
}

/// A client certificate and its private key. The key never leaves this type
/// except into the TLS stack.
#[derive(Clone)]
pub struct ClientIdentity {
    cert_pem: String,
    key_pem: String,
    subject: String,
    not_before: SystemTime,
    not_after: SystemTime,
    /// When a minter replaces it ([`renewal_time`]).
    renew_at: SystemTime,
}

/// When a certificate issued at `issued` and valid until `not_after` is
/// renewed: with a third of its lifetime left, and earlier by up to another
/// sixth as `spread` (0 to 1) says. The clusters a process starts with are
/// minted within the same minute; spread, their renewals (a key generation
/// and three new member connections each) fall across a sixth of the
/// lifetime (10 minutes of an hour) rather than all at once.
pub(crate) fn renewal_time(issued: SystemTime, not_after: SystemTime, spread: f64) -> SystemTime {
    let lifetime = not_after.duration_since(issued).unwrap_or_default();
    let spread = if spread.is_finite() {
        spread.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let left = lifetime.mul_f64(1.0 / 3.0 + spread / 6.0);
    not_after.checked_sub(left).unwrap_or(issued)
}

/// A uniform draw in [0, 1) for [`renewal_time`]; 0 (no spread) if the
/// system has no randomness to give.
fn random_spread() -> f64 {
    getrandom::u64().map_or(0.0, |x| (x >> 11) as f64 / (1u64 << 53) as f64)
}

impl ClientIdentity {
    /// Load from PEM, checking the key matches the certificate, that the
    /// certificate may be used for client authentication and has not expired.
    pub fn from_pem(
        cert_field: &str,
        cert_pem: &[u8],
        key_field: &str,
        key_pem: &[u8],
    ) -> Result<Self, TlsError> {
        let certs = parse_certs(cert_field, cert_pem)?;
        let key = parse_key(key_field, key_pem)?;
        let signer = signing_key(key_field, &key)?;
        check_key_matches(signer.as_ref(), key_field, &certs[0], cert_field)?;
        let (_, leaf) =
            X509Certificate::from_der(&certs[0]).map_err(|e| TlsError::BadCertificate {
                field: cert_field.to_string(),
                reason: e.to_string(),
            })?;
        if let Ok(Some(eku)) = leaf.extended_key_usage()
            && !eku.value.client_auth
            && !eku.value.any
        {
            return Err(TlsError::NotForClientAuth {
                field: cert_field.to_string(),
            });
        }
        let not_after = not_after(&certs[0]);
        if not_after < SystemTime::now() {
            return Err(TlsError::Expired {
                field: cert_field.to_string(),
                not_after: leaf.validity().not_after.to_string(),
            });
        }
        let not_before = SystemTime::UNIX_EPOCH
            + Duration::from_secs(leaf.validity().not_before.timestamp().max(0) as u64);
        Ok(Self {
            cert_pem: String::from_utf8_lossy(cert_pem).into_owned(),
            key_pem: String::from_utf8_lossy(key_pem).into_owned(),
            subject: leaf.subject().to_string(),
            not_before,
            not_after,
            renew_at: renewal_time(not_before, not_after, 0.0),
        })
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    pub fn not_before(&self) -> SystemTime {
        self.not_before
    }

    pub fn not_after(&self) -> SystemTime {
        self.not_after
    }

    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// Whether its renewal time has come at `now`.
    fn due_for_renewal(&self, now: SystemTime) -> bool {
        now >= self.renew_at
    }
}

impl fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientIdentity")
            .field("subject", &self.subject)
            .field(
                "not_after",
                &chrono::DateTime::<chrono::Utc>::from(self.not_after),
            )
            .field("key", &"<redacted>")
            .finish()
    }
}

/// A [`CaSigner`] for the etcd CA key read from `field`.
fn ca_signer(field: &str, key: Arc<dyn RustlsSigningKey>) -> Result<CaSigner, TlsError> {
    let mint = |reason: String| TlsError::Mint {
        field: field.to_string(),
        reason,
    };
    let spki = key
        .public_key()
        .ok_or_else(|| mint("cannot derive the CA public key".into()))?;
    let spki = spki.as_ref().to_vec();
    CaSigner::new(key, &spki).map_err(mint)
}

/// Mints short-lived client certificates (ClientAuth, CN `cluster-api.x-k8s.io`)
/// from the etcd CA certificate and key, and re-mints when a third to a half of
/// the lifetime is left ([`renewal_time`]).
pub struct ClientCertMinter {
    ca_field: String,
    ca_cert_pem: String,
    signer: CaSigner,
    lifetime: Duration,
    current: Mutex<Option<Arc<ClientIdentity>>>,
}

impl ClientCertMinter {
    pub fn new(
        ca_cert_field: &str,
        ca_cert_pem: &[u8],
        ca_key_field: &str,
        ca_key_pem: &[u8],
        lifetime: Duration,
    ) -> Result<Self, TlsError> {
        let certs = parse_certs(ca_cert_field, ca_cert_pem)?;
        let (_, ca) =
            X509Certificate::from_der(&certs[0]).map_err(|e| TlsError::BadCertificate {
                field: ca_cert_field.to_string(),
                reason: e.to_string(),
            })?;
        if !ca.is_ca() {
            return Err(TlsError::NotCa {
                field: ca_cert_field.to_string(),
            });
        }
        let key = parse_key(ca_key_field, ca_key_pem)?;
        let key = signing_key(ca_key_field, &key)?;
        check_key_matches(key.as_ref(), ca_key_field, &certs[0], ca_cert_field)?;
        let signer = ca_signer(ca_key_field, key)?;
        let minter = Self {
            ca_field: ca_cert_field.to_string(),
            ca_cert_pem: String::from_utf8_lossy(ca_cert_pem).into_owned(),
            signer,
            lifetime,
            current: Mutex::new(None),
        };
        // Mint once now so that a CA that cannot sign fails at load time.
        minter.current()?;
        Ok(minter)
    }

    /// The current client identity, re-minted when due for renewal.
    pub fn current(&self) -> Result<Arc<ClientIdentity>, TlsError> {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(identity) = current.as_ref()
            && !identity.due_for_renewal(SystemTime::now())
        {
            return Ok(identity.clone());
        }
        let fresh = Arc::new(self.mint()?);
        *current = Some(fresh.clone());
        Ok(fresh)
    }

    /// Mint a fresh client certificate with a new key.
    pub fn mint(&self) -> Result<ClientIdentity, TlsError> {
        let err = |reason: String| TlsError::Mint {
            field: self.ca_field.clone(),
            reason,
        };
        let issuer = Issuer::from_ca_cert_pem(&self.ca_cert_pem, &self.signer)
            .map_err(|e| err(e.to_string()))?;
        let key = KeyPair::generate().map_err(|e| err(e.to_string()))?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, CLIENT_COMMON_NAME);
        params.distinguished_name = dn;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let now = SystemTime::now();
        let (not_before, not_after) = (now - BACKDATE, now + self.lifetime);
        params.not_before = not_before.into();
        params.not_after = not_after.into();
        let cert = params
            .signed_by(&key, &issuer)
            .map_err(|e| err(e.to_string()))?;
        Ok(ClientIdentity {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            subject: format!("CN={CLIENT_COMMON_NAME}"),
            not_before,
            not_after,
            // From the moment of issue: the backdated minute is no part of
            // the lifetime asked for (with 40 s asked, it would make a
            // certificate due at once).
            renew_at: renewal_time(now, not_after, random_spread()),
        })
    }
}

impl fmt::Debug for ClientCertMinter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientCertMinter")
            .field("ca", &self.ca_field)
            .field("lifetime", &self.lifetime)
            .field("ca_key", &"<redacted>")
            .finish()
    }
}

/// Where the client identity comes from.
#[derive(Clone, Debug)]
pub enum ClientCertSource {
    /// Loaded once from PEM.
    Static(Arc<ClientIdentity>),
    /// Minted from the etcd CA and renewed before expiry.
    Minted(Arc<ClientCertMinter>),
}

impl ClientCertSource {
    pub fn current(&self) -> Result<Arc<ClientIdentity>, TlsError> {
        match self {
            ClientCertSource::Static(identity) => Ok(identity.clone()),
            ClientCertSource::Minted(minter) => minter.current(),
        }
    }
}

/// Everything needed to open verified mutual-TLS connections to etcd members.
/// There is deliberately no way to skip server verification.
#[derive(Clone, Debug)]
pub struct ClientTls {
    ca: ServerCa,
    client: Option<ClientCertSource>,
    /// What the members' serving certificates said of their expiry.
    serving_certs: ServingCerts,
}

impl ClientTls {
    pub fn new(ca: ServerCa, client: ClientCertSource) -> Self {
        Self {
            ca,
            client: Some(client),
            serving_certs: ServingCerts::default(),
        }
    }

    /// From PEM files' contents: server CA, client certificate and key.
    pub fn from_pem(
        ca: (&str, &[u8]),
        cert: (&str, &[u8]),
        key: (&str, &[u8]),
    ) -> Result<Self, TlsError> {
        let ca = ServerCa::from_pem(ca.0, ca.1)?;
        let identity = ClientIdentity::from_pem(cert.0, cert.1, key.0, key.1)?;
        Ok(Self::new(ca, ClientCertSource::Static(Arc::new(identity))))
    }

    /// From the etcd CA certificate and key: the CA verifies servers and mints
    /// our client certificates.
    pub fn minted_from_ca(
        ca_cert: (&str, &[u8]),
        ca_key: (&str, &[u8]),
        lifetime: Duration,
    ) -> Result<Self, TlsError> {
        let ca = ServerCa::from_pem(ca_cert.0, ca_cert.1)?;
        let minter = ClientCertMinter::new(ca_cert.0, ca_cert.1, ca_key.0, ca_key.1, lifetime)?;
        Ok(Self::new(ca, ClientCertSource::Minted(Arc::new(minter))))
    }

    /// Server verification only, no client certificate. Only useful to diagnose
    /// a server that does not require client certificates (and in tests that
    /// check the error when one is required).
    pub fn without_client_certificate(ca: ServerCa) -> Self {
        Self {
            ca,
            client: None,
            serving_certs: ServingCerts::default(),
        }
    }

    /// Whether connections present a client certificate.
    pub fn has_client_certificate(&self) -> bool {
        self.client.is_some()
    }

    pub fn server_ca(&self) -> &ServerCa {
        &self.ca
    }

    /// The serving certificates' expiry, as the handshakes of this
    /// configuration (and its clones) verified them.
    pub fn serving_certs(&self) -> &ServingCerts {
        &self.serving_certs
    }

    /// The current client identity, if any (renewed when minted).
    pub fn client_identity(&self) -> Result<Option<Arc<ClientIdentity>>, TlsError> {
        self.client.as_ref().map(|c| c.current()).transpose()
    }

    /// The rustls configuration of connections to members: the server chain is
    /// verified against our CA (and, per connection, the server certificate
    /// against the member's name: rustls always checks the name it connects
    /// to), `identity` is presented as the client certificate, and HTTP/2 is
    /// offered by ALPN. It holds no per-server state except the session
    /// cache, so one configuration serves every member of a cluster.
    pub(crate) fn client_config(
        &self,
        identity: Option<&ClientIdentity>,
    ) -> Result<rustls::ClientConfig, TlsError> {
        let field = "client";
        let mut roots = rustls::RootCertStore::empty();
        // As tonic did: a certificate webpki cannot use as a trust anchor is
        // left out, and a server it would have vouched for fails as signed by
        // an unknown authority.
        roots.add_parsable_certificates(parse_certs("etcd CA", self.ca.pem())?);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        // rustls's own verification, unchanged; it only notes each verified
        // certificate's expiry on the way.
        let webpki = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()
        .map_err(|e| TlsError::BadCertificate {
            field: "etcd CA".into(),
            reason: e.to_string(),
        })?;
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("ring supports rustls's default protocol versions")
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(RecordingVerifier::new(
                webpki,
                self.serving_certs.clone(),
            )));
        let mut config = match identity {
            Some(identity) => {
                let certs = parse_certs(field, identity.cert_pem.as_bytes())?;
                let key = parse_key(field, identity.key_pem.as_bytes())?;
                builder
                    .with_client_auth_cert(certs, key)
                    .map_err(|e| TlsError::BadKey {
                        field: field.into(),
                        reason: e.to_string(),
                    })?
            }
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        // Session tickets of as many servers as an etcd cluster has members
        // (rustls's default keeps room for 256 servers in every configuration).
        config.resumption = rustls::client::Resumption::in_memory_sessions(RESUMPTION_SERVERS);
        Ok(config)
    }
}

impl ClientTls {
    /// Run one TLS handshake with exactly this configuration against `dial`
    /// (`host:port`) and return the TLS error text if it fails, including a
    /// rejection the server sends right after the handshake. Used to explain a
    /// connection that gRPC only reports as "closed".
    pub(crate) fn diagnose_handshake(
        &self,
        host: &str,
        port: u16,
        server_name: &str,
        limit: Duration,
    ) -> Option<String> {
        use std::io::Read;
        use std::net::{TcpStream, ToSocketAddrs};

        let identity = self.client_identity().ok()?;
        let mut config = self.client_config(identity.as_deref()).ok()?;
        // A full handshake, so that the server judges our certificate again.
        config.resumption = rustls::client::Resumption::disabled();
        let name = rustls::pki_types::ServerName::try_from(server_name.to_string()).ok()?;
        let mut conn = rustls::ClientConnection::new(Arc::new(config), name).ok()?;
        let addr = (host, port).to_socket_addrs().ok()?.next()?;
        let mut tcp = TcpStream::connect_timeout(&addr, limit).ok()?;
        tcp.set_read_timeout(Some(limit)).ok()?;
        tcp.set_write_timeout(Some(limit)).ok()?;
        let mut tls = rustls::Stream::new(&mut conn, &mut tcp);
        // A read drives the handshake and then receives the server's verdict
        // on our certificate (an alert), or times out when all is well.
        let mut byte = [0u8; 1];
        match tls.read(&mut byte) {
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => Some(e.to_string()),
            Err(e) => e
                .get_ref()
                .map(|inner| inner.to_string())
                .filter(|t| t.contains("alert") || t.contains("certificate")),
            Ok(_) => None,
        }
    }
}

#[cfg(test)]
mod tests;
