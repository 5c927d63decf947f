//! Pure parsing of the two Secrets CAPI keeps per cluster: `<cluster>-kubeconfig`
//! (key `value`) and `<cluster>-etcd` (keys `tls.crt`, `tls.key`).

use std::fmt;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::config::{KubeConfigOptions, Kubeconfig};
use x509_parser::prelude::{FromDer, X509Certificate};

use super::error::Error;
use super::trust::{self, Refusal, Unusable, Verdict};
use crate::api::names::{KUBECONFIG_SECRET_KEY, TLS_CERT_KEY, TLS_KEY_KEY};

pub use crate::api::names::{etcd_secret_name, kubeconfig_secret_name};

/// `namespace/name` of a Secret, for messages.
pub fn secret_ref(secret: &Secret) -> String {
    format!(
        "{}/{}",
        secret.namespace().unwrap_or_default(),
        secret.name_any()
    )
}

/// `Debug` of a Secret that shows which one and which version it is
/// (`namespace/name`, uid, resourceVersion), never its data, labels or
/// annotations. For types holding Secrets, so they can be logged.
pub struct SecretIdentity<'a>(pub &'a Secret);

impl fmt::Debug for SecretIdentity<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secret")
            .field("secret", &secret_ref(self.0))
            .field("uid", &self.0.metadata.uid)
            .field("resource_version", &self.0.metadata.resource_version)
            .finish_non_exhaustive()
    }
}

fn key_bytes<'a>(secret: &'a Secret, key: &'static str) -> Option<&'a [u8]> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| b.0.as_slice())
}

fn key_text<'a>(secret: &'a Secret, key: &'static str) -> Result<Option<&'a str>, Error> {
    key_bytes(secret, key)
        .map(|b| {
            std::str::from_utf8(b).map_err(|_| Error::NotText {
                secret: secret_ref(secret),
                key,
            })
        })
        .transpose()
}

/// Build a `kube::Config` from the kubeconfig in `secret` (key `value`), after
/// the trust policy ([`super::trust`]): no credential plugins, no paths on the
/// controller's disk, no disabled TLS verification, no proxy; refusals name the
/// field. Nothing is contacted: a Client made from it connects on first use.
pub async fn kubeconfig_from_secret(secret: &Secret) -> Result<kube::Config, Error> {
    let key = KUBECONFIG_SECRET_KEY;
    let name = secret_ref(secret);
    let text = key_text(secret, key)?.ok_or_else(|| Error::KeyMissing {
        secret: name.clone(),
        key,
    })?;
    let kubeconfig = Kubeconfig::from_yaml(text).map_err(|_| Error::NotKubeconfig {
        secret: name.clone(),
        key,
    })?;
    // Only the entries the policy checked reach kube.
    let kubeconfig = trust::trusted(&kubeconfig).map_err(|verdict| match verdict {
        Verdict::Refused(Refusal { field, why }) => Error::KubeconfigRefused {
            secret: name.clone(),
            key,
            field,
            why,
        },
        Verdict::Unusable(Unusable(reason)) => Error::KubeconfigUnusable {
            secret: name.clone(),
            key,
            reason,
        },
    })?;
    kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| Error::KubeconfigUnusable {
            secret: name,
            key,
            reason: e.to_string(),
        })
}

/// The workload cluster's etcd CA: certificate and private key, PEM.
/// `Debug` shows the certificate only; the key never appears in output.
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdCa {
    cert_pem: String,
    key_pem: String,
}

impl EtcdCa {
    /// The CA certificate (PEM), also what clients trust for etcd servers.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }
    /// The CA private key (PEM), for minting client certificates only.
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }
}

impl fmt::Debug for EtcdCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdCa")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// Whether the management cluster manages the workload cluster's etcd.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EtcdAccess {
    /// No `<cluster>-etcd` Secret: the membership cannot be read, so nothing
    /// may be removed (the controller reports etcd as unknown, not unmanaged).
    NoSecret,
    /// The CA that signs k3s's etcd certificates.
    Managed(EtcdCa),
}

/// The certificate and key texts (PEM) of a CA Secret, unchecked: what
/// [`etcd_access_from_secret`] has found usable can be taken again cheaply.
pub fn ca_pem_texts(secret: &Secret) -> Result<(&str, &str), Error> {
    let name = secret_ref(secret);
    let cert_pem = key_text(secret, TLS_CERT_KEY)?.ok_or_else(|| Error::KeyMissing {
        secret: name.clone(),
        key: TLS_CERT_KEY,
    })?;
    let key_pem = key_text(secret, TLS_KEY_KEY)?.ok_or_else(|| Error::CaKeyMissing {
        secret: name,
        key: TLS_KEY_KEY,
    })?;
    Ok((cert_pem, key_pem))
}

/// Interpret the `<cluster>-etcd` Secret; `None` (not found) means no access.
pub fn etcd_access_from_secret(secret: Option<&Secret>) -> Result<EtcdAccess, Error> {
    let Some(secret) = secret else {
        return Ok(EtcdAccess::NoSecret);
    };
    let name = secret_ref(secret);
    let (cert_pem, key_pem) = ca_pem_texts(secret)?;
    let cert_der = first_certificate(cert_pem).ok_or_else(|| Error::CertificateNotPem {
        secret: name.clone(),
        key: TLS_CERT_KEY,
    })?;
    let (_, cert) =
        X509Certificate::from_der(&cert_der).map_err(|e| Error::CertificateInvalid {
            secret: name.clone(),
            key: TLS_CERT_KEY,
            reason: e.to_string(),
        })?;
    if !cert.is_ca() {
        return Err(Error::CertificateNotCa {
            secret: name,
            key: TLS_CERT_KEY,
        });
    }
    if !has_private_key(key_pem) {
        return Err(Error::KeyNotPem {
            secret: name,
            key: TLS_KEY_KEY,
        });
    }
    // A key that is not the CA's would mint certificates etcd rejects with an
    // opaque TLS error; say so here instead.
    let key_pair = rcgen::KeyPair::from_pem(key_pem).map_err(|_| Error::KeyNotPem {
        secret: name.clone(),
        key: TLS_KEY_KEY,
    })?;
    if key_pair.public_key_raw() != cert.public_key().subject_public_key.data.as_ref() {
        return Err(Error::KeyMismatch {
            secret: name,
            key: TLS_KEY_KEY,
        });
    }
    Ok(EtcdAccess::Managed(EtcdCa {
        cert_pem: cert_pem.to_owned(),
        key_pem: key_pem.to_owned(),
    }))
}

fn first_certificate(pem: &str) -> Option<Vec<u8>> {
    crate::pki::pem::first_certificate(pem.as_bytes())
        .ok()
        .flatten()
        .map(|c| c.as_ref().to_vec())
}

fn has_private_key(pem: &str) -> bool {
    matches!(crate::pki::pem::private_key(pem.as_bytes()), Ok(Some(_)))
}
