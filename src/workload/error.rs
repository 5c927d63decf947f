//! Errors of workload-cluster access. Each names the Secret (`namespace/name`)
//! and key involved; none carries Secret content, so they are safe to log.

use super::trust::Refused;

/// What went wrong reaching a workload cluster.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("secret {secret} not found")]
    SecretMissing { secret: String },

    #[error("secret {secret} has no key {key:?}")]
    KeyMissing { secret: String, key: &'static str },

    /// The YAML parser's message is not included: it may quote Secret content.
    #[error("secret {secret} key {key:?} is not kubeconfig YAML")]
    NotKubeconfig { secret: String, key: &'static str },

    #[error("secret {secret} key {key:?}: kubeconfig is not usable: {reason}")]
    KubeconfigUnusable {
        secret: String,
        key: &'static str,
        reason: String,
    },

    /// The kubeconfig trust policy ([`super::trust`]) refuses `field` (e.g.
    /// `users[admin].user.exec`); the field's value is never included.
    #[error("secret {secret} key {key:?}: kubeconfig field {field} is refused: {why}")]
    KubeconfigRefused {
        secret: String,
        key: &'static str,
        field: String,
        why: Refused,
    },

    #[error("secret {secret} key {key:?} is not UTF-8 text")]
    NotText { secret: String, key: &'static str },

    #[error("secret {secret} key {key:?} holds no PEM certificate")]
    CertificateNotPem { secret: String, key: &'static str },

    #[error("secret {secret} key {key:?}: certificate does not parse: {reason}")]
    CertificateInvalid {
        secret: String,
        key: &'static str,
        reason: String,
    },

    #[error(
        "secret {secret} key {key:?}: certificate is not a CA (basicConstraints CA:true missing)"
    )]
    CertificateNotCa { secret: String, key: &'static str },

    #[error(
        "secret {secret} has the CA certificate but no key {key:?}: without the CA key nothing can be signed with it"
    )]
    CaKeyMissing { secret: String, key: &'static str },

    #[error("secret {secret} key {key:?} holds no PEM private key")]
    KeyNotPem { secret: String, key: &'static str },

    #[error(
        "secret {secret}: private key {key:?} does not belong to the certificate in \"tls.crt\""
    )]
    KeyMismatch { secret: String, key: &'static str },

    #[error("reading secret {secret}: {source}")]
    ReadSecret {
        secret: String,
        #[source]
        source: kube::Error,
    },

    #[error("building a client for the workload cluster from secret {secret}: {source}")]
    BuildClient {
        secret: String,
        #[source]
        source: kube::Error,
    },

    #[error("listing control-plane Nodes of workload cluster {cluster}: {source}")]
    ListNodes {
        cluster: String,
        #[source]
        source: kube::Error,
    },
}
