//! A k3s-like etcd PKI for local clusters: an etcd server CA (as in the
//! `<cluster>-etcd` Secret), a peer CA, per-member serving and peer
//! certificates carrying the member's IP, and a client certificate.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

/// A certificate and its key, PEM encoded.
#[derive(Clone)]
pub struct CertPair {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for CertPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertPair")
            .field("key_pem", &"<redacted>")
            .finish_non_exhaustive()
    }
}

/// A certificate authority that can sign.
pub struct TestCa {
    pub pair: CertPair,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").finish_non_exhaustive()
    }
}

fn validity(params: &mut CertificateParams, days: u64) {
    let now = SystemTime::now();
    params.not_before = (now - Duration::from_secs(3600)).into();
    params.not_after = (now + Duration::from_secs(days * 86_400)).into();
}

fn dn(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn
}

impl TestCa {
    /// A self-signed CA named like k3s names its CAs (`etcd-server-ca@<ts>`).
    pub fn new(common_name: &str) -> Self {
        let key = KeyPair::generate().expect("generate CA key");
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        validity(&mut params, 3650);
        let cert = params.self_signed(&key).expect("self-sign CA");
        Self {
            pair: CertPair {
                cert_pem: cert.pem(),
                key_pem: key.serialize_pem(),
            },
            issuer: Issuer::new(params, key),
        }
    }

    /// A CA from its PEM certificate and key (e.g. a generated `<cluster>-etcd`).
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, rcgen::Error> {
        let key = KeyPair::from_pem(key_pem)?;
        Ok(Self {
            pair: CertPair {
                cert_pem: cert_pem.to_string(),
                key_pem: key_pem.to_string(),
            },
            issuer: Issuer::from_ca_cert_pem(cert_pem, key)?,
        })
    }

    /// Sign a leaf certificate, valid for a year.
    pub fn issue(
        &self,
        common_name: &str,
        sans: &[SanType],
        usages: &[ExtendedKeyUsagePurpose],
    ) -> CertPair {
        self.issue_valid_for(common_name, sans, usages, Duration::from_secs(365 * 86_400))
    }

    /// Sign a leaf certificate valid from an hour ago until `lifetime` from now.
    pub fn issue_valid_for(
        &self,
        common_name: &str,
        sans: &[SanType],
        usages: &[ExtendedKeyUsagePurpose],
        lifetime: Duration,
    ) -> CertPair {
        let key = KeyPair::generate().expect("generate leaf key");
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(common_name);
        params.subject_alt_names = sans.to_vec();
        params.extended_key_usages = usages.to_vec();
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let now = SystemTime::now();
        params.not_before = (now - Duration::from_secs(3600)).into();
        params.not_after = (now + lifetime).into();
        let cert = params.signed_by(&key, &self.issuer).expect("sign leaf");
        CertPair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

/// SANs k3s puts on etcd certificates: the node IP, plus localhost.
pub fn member_sans(ip: Ipv4Addr, include_ip: bool) -> Vec<SanType> {
    let mut sans = vec![
        SanType::DnsName("localhost".try_into().expect("dns name")),
        SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)),
    ];
    if include_ip {
        sans.push(SanType::IpAddress(IpAddr::V4(ip)));
    }
    sans
}

/// The PKI of one test cluster.
#[derive(Debug)]
pub struct TestPki {
    /// etcd server CA: verifies serving certs and client certs (k3s uses one
    /// CA for both, `server-ca`), and is what `<cluster>-etcd` holds.
    pub server_ca: TestCa,
    /// etcd peer CA (`peer-ca`).
    pub peer_ca: TestCa,
    /// A client certificate (`client.crt`), signed by the server CA.
    pub client: CertPair,
    /// How long serving certificates are valid (`None`: a year).
    pub serving_lifetime: Option<Duration>,
}

impl Default for TestPki {
    fn default() -> Self {
        Self::new()
    }
}

impl TestPki {
    pub fn new() -> Self {
        let stamp = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Self::with_server_ca(TestCa::new(&format!("etcd-server-ca@{stamp}")))
    }

    /// A PKI whose etcd server CA is `server_ca` (the peer CA is new).
    pub fn with_server_ca(server_ca: TestCa) -> Self {
        let stamp = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let peer_ca = TestCa::new(&format!("etcd-peer-ca@{stamp}"));
        let client = server_ca.issue("etcd-client", &[], &[ExtendedKeyUsagePurpose::ClientAuth]);
        Self {
            server_ca,
            peer_ca,
            client,
            serving_lifetime: None,
        }
    }

    /// Serving certificate of a member (k3s `server-client.crt`: server and
    /// client auth). `include_ip = false` makes a certificate that is NOT valid
    /// for the member's address, to test name verification.
    pub fn serving(&self, name: &str, ip: Ipv4Addr, include_ip: bool) -> CertPair {
        self.server_ca.issue_valid_for(
            name,
            &member_sans(ip, include_ip),
            &[
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
            self.serving_lifetime
                .unwrap_or(Duration::from_secs(365 * 86_400)),
        )
    }

    /// Peer certificate of a member (server and client auth for raft traffic).
    pub fn peer(&self, name: &str, ip: Ipv4Addr) -> CertPair {
        self.peer_ca.issue(
            name,
            &member_sans(ip, true),
            &[
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        )
    }
}

/// Paths of a certificate and key written to disk.
#[derive(Clone, Debug)]
pub struct PairFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Write `pair` as `<dir>/<stem>.crt` and `<dir>/<stem>.key` (key mode 0600).
pub fn write_pair(dir: &Path, stem: &str, pair: &CertPair) -> std::io::Result<PairFiles> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    let cert = dir.join(format!("{stem}.crt"));
    let key = dir.join(format!("{stem}.key"));
    std::fs::write(&cert, &pair.cert_pem)?;
    std::fs::write(&key, &pair.key_pem)?;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))?;
    Ok(PairFiles { cert, key })
}
