//! An rcgen signer backed by a rustls signing key, so that CA keys in any PEM
//! form (PKCS#8, SEC1 as k3s writes them, PKCS#1 as cluster-api-k3s writes
//! them) can sign; rcgen with ring only reads PKCS#8. Shared by the cluster
//! CAs ([`super::ca`]) and the etcd client-certificate minter.

use std::sync::Arc;

use rustls::SignatureScheme;
use rustls::sign::SigningKey as RustlsSigningKey;
use x509_parser::prelude::FromDer;

pub(crate) struct CaSigner {
    key: Arc<dyn RustlsSigningKey>,
    scheme: SignatureScheme,
    algorithm: &'static rcgen::SignatureAlgorithm,
    /// The subjectPublicKey bits (not the whole SPKI), as rcgen wants them.
    public_key: Vec<u8>,
}

impl CaSigner {
    /// `spki_der`: the key's SubjectPublicKeyInfo (from its certificate).
    pub(crate) fn new(key: Arc<dyn RustlsSigningKey>, spki_der: &[u8]) -> Result<Self, String> {
        let candidates: [(SignatureScheme, &'static rcgen::SignatureAlgorithm); 4] = [
            (
                SignatureScheme::ECDSA_NISTP256_SHA256,
                &rcgen::PKCS_ECDSA_P256_SHA256,
            ),
            (
                SignatureScheme::ECDSA_NISTP384_SHA384,
                &rcgen::PKCS_ECDSA_P384_SHA384,
            ),
            (SignatureScheme::ED25519, &rcgen::PKCS_ED25519),
            (SignatureScheme::RSA_PKCS1_SHA256, &rcgen::PKCS_RSA_SHA256),
        ];
        let (scheme, algorithm) = candidates
            .into_iter()
            .find(|(scheme, _)| key.choose_scheme(&[*scheme]).is_some())
            .ok_or("unsupported key algorithm (expected ECDSA P-256/P-384, Ed25519 or RSA)")?;
        let (_, info) = x509_parser::x509::SubjectPublicKeyInfo::from_der(spki_der)
            .map_err(|e| format!("cannot read its public key: {e}"))?;
        Ok(Self {
            key,
            scheme,
            algorithm,
            public_key: info.subject_public_key.data.to_vec(),
        })
    }
}

impl rcgen::PublicKeyData for CaSigner {
    fn der_bytes(&self) -> &[u8] {
        &self.public_key
    }

    fn algorithm(&self) -> &'static rcgen::SignatureAlgorithm {
        self.algorithm
    }
}

impl rcgen::SigningKey for CaSigner {
    fn sign(&self, msg: &[u8]) -> Result<Vec<u8>, rcgen::Error> {
        let signer = self
            .key
            .choose_scheme(&[self.scheme])
            .ok_or(rcgen::Error::RemoteKeyError)?;
        signer.sign(msg).map_err(|_| rcgen::Error::RemoteKeyError)
    }
}
