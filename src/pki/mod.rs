//! The cluster Secrets the k3s bootstrap provider (cluster-api-k3s) reads, as
//! pure functions from inputs to outputs: no I/O, no API calls.
//!
//! Per workload cluster: `<cluster>-ca` (server CA), `<cluster>-cca` (client
//! CA), `<cluster>-etcd` (etcd server CA, embedded etcd only), all with keys
//! `tls.crt`/`tls.key`; `<cluster>-token` (key `value`, the join token) and
//! `<cluster>-kubeconfig` (key `value`, an admin kubeconfig signed by the
//! client CA). Every Secret is of type `cluster.x-k8s.io/secret`, labelled with
//! the cluster name and controlled by the KThreesControlPlane.
//!
//! - [`ca`]: generate a CA, validate one read from a Secret (any PEM key form:
//!   PKCS#8, SEC1 EC as k3s writes it, PKCS#1 RSA as upstream writes it), issue
//!   client certificates.
//! - [`kubeconfig`]: the admin kubeconfig, what is in it, when to rotate it.
//! - [`pem`]: reading certificates and keys from PEM text.
//! - [`token`]: the join token.
//! - [`secret`]: the Secret objects.
//!
//! Errors name what was being read (e.g. `default/demo-ca[tls.key]`) and never
//! contain key material; [`CertKeyPem`]'s `Debug` redacts the key.

use std::fmt;
use std::time::Duration;

pub mod ca;
pub mod kubeconfig;
pub mod pem;
pub mod secret;
pub(crate) mod signer;
pub mod token;

pub use ca::{CA_LIFETIME, ca_common_name, generate_ca, issue_client_cert, not_after, validate_ca};
pub use kubeconfig::{
    ADMIN_COMMON_NAME, ADMIN_ORGANIZATION, KubeconfigPolicy, admin_kubeconfig, endpoint_url,
    kubeconfig_client_not_after, kubeconfig_server,
};
pub use secret::{
    ca_from_secret, ca_secret, client_ca_secret_name, cluster_secret, kubeconfig_secret,
    server_ca_secret_name, token_secret, token_secret_name,
};
pub use token::generate_token;

/// Common-name prefix of the server CA (`k3s-server-ca@<unix ts>`), as k3s names it.
pub const SERVER_CA_NAME: &str = "k3s-server-ca";
/// Common-name prefix of the client CA (`k3s-client-ca@<unix ts>`).
pub const CLIENT_CA_NAME: &str = "k3s-client-ca";
/// Common-name prefix of the etcd server CA (`etcd-server-ca@<unix ts>`).
pub const ETCD_SERVER_CA_NAME: &str = "etcd-server-ca";

/// Longest lifetime accepted for anything we sign (keeps dates far from the
/// X.509 and calendar limits).
const MAX_LIFETIME: Duration = Duration::from_secs(100 * 366 * 86_400);

/// A certificate and its private key, PEM. Debug never shows the key.
#[derive(Clone, PartialEq, Eq)]
pub struct CertKeyPem {
    pub cert_pem: String,
    pub key_pem: String,
}

impl fmt::Debug for CertKeyPem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertKeyPem")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// A problem with PKI material. `field` names what was being read or made (a
/// Secret and key such as `default/demo-ca[tls.crt]`, or a role such as
/// `client CA`); no variant ever carries key material.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("{field}: missing")]
    Missing { field: String },
    #[error("{field}: not UTF-8 text")]
    NotText { field: String },
    #[error("{field}: no PEM certificate found")]
    NoCertificate { field: String },
    #[error("{field}: not a valid X.509 certificate: {reason}")]
    BadCertificate { field: String, reason: String },
    #[error("{field}: not a CA certificate: {reason}")]
    NotCa { field: String, reason: String },
    #[error("{field}: no PEM private key found (expected PKCS#8, SEC1 EC or PKCS#1 RSA)")]
    NoKey { field: String },
    #[error("{field}: unsupported or malformed private key: {reason}")]
    BadKey { field: String, reason: String },
    #[error("{field}: private key does not match the certificate in {cert_field}")]
    KeyMismatch { field: String, cert_field: String },
    #[error("{field}: not a usable kubeconfig: {reason}")]
    BadKubeconfig { field: String, reason: String },
    #[error("{field}: {reason}")]
    InvalidRequest { field: String, reason: String },
    #[error("{field}: cannot generate or sign: {reason}")]
    Sign { field: String, reason: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_of_a_pair_never_shows_the_key() {
        let ca = generate_ca("k3s-server-ca@1", CA_LIFETIME).unwrap();
        assert!(ca.key_pem.contains("PRIVATE KEY"), "precondition");
        let debug = format!("{ca:?}");
        assert!(!debug.contains("PRIVATE KEY"), "{debug}");
        assert!(debug.contains("<redacted>"), "{debug}");
        assert!(debug.contains("BEGIN CERTIFICATE"), "{debug}");
    }
}
