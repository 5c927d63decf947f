//! Reading PEM text with rustls's own parser (rustls-pki-types), in the shapes
//! the callers want. Errors describe the problem without quoting the text: the
//! BEGIN line or label of a malformed section can hold a whole private key
//! (one pasted without its line breaks).

use std::fmt;

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// PEM text that could not be read. Neither `Display` nor `Debug` shows any
/// of the text.
pub struct PemError(pem::Error);

impl fmt::Display for PemError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match &self.0 {
            pem::Error::MissingSectionEnd { .. } => "a PEM section has no END line",
            pem::Error::IllegalSectionStart { .. } => "a PEM BEGIN line is malformed",
            pem::Error::Base64Decode(_) => "a PEM section is not valid base64",
            pem::Error::SectionTooLarge => "a PEM section is larger than 256 MiB",
            pem::Error::NoItemsFound => "no PEM section of the kind wanted",
            _ => "not readable as PEM",
        })
    }
}

impl fmt::Debug for PemError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PemError({self})")
    }
}

impl std::error::Error for PemError {}

/// Every certificate of `pem`, in order, other sections skipped (none: empty).
pub fn certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, PemError> {
    CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(PemError)
}

/// The first certificate of `pem`, if there is one.
pub fn first_certificate(pem: &[u8]) -> Result<Option<CertificateDer<'static>>, PemError> {
    CertificateDer::pem_slice_iter(pem)
        .next()
        .transpose()
        .map_err(PemError)
}

/// The first private key of `pem` (PKCS#8, SEC1 EC or PKCS#1 RSA), if there is one.
pub fn private_key(pem: &[u8]) -> Result<Option<PrivateKeyDer<'static>>, PemError> {
    match PrivateKeyDer::from_pem_slice(pem) {
        Ok(key) => Ok(Some(key)),
        Err(pem::Error::NoItemsFound) => Ok(None),
        Err(e) => Err(PemError(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::{CA_LIFETIME, generate_ca};

    #[test]
    fn reads_certificates_and_the_key_skipping_other_sections() {
        let ca = generate_ca("k3s-server-ca@1", CA_LIFETIME).unwrap();
        let other = generate_ca("k3s-client-ca@1", CA_LIFETIME).unwrap();
        let bundle = format!("{}{}{}", ca.key_pem, ca.cert_pem, other.cert_pem);
        let certs = certificates(bundle.as_bytes()).unwrap();
        assert_eq!(certs.len(), 2);
        let first = first_certificate(bundle.as_bytes()).unwrap().unwrap();
        assert_eq!(first, certs[0]);
        assert!(private_key(bundle.as_bytes()).unwrap().is_some());
        assert!(certificates(ca.key_pem.as_bytes()).unwrap().is_empty());
        assert_eq!(first_certificate(b"hello").unwrap(), None);
        assert!(private_key(ca.cert_pem.as_bytes()).unwrap().is_none());
        assert!(private_key(b"").unwrap().is_none());
    }

    #[test]
    fn errors_never_quote_the_text() {
        let ca = generate_ca("k3s-server-ca@1", CA_LIFETIME).unwrap();
        let body: String = ca
            .key_pem
            .lines()
            .filter(|l| !l.starts_with("-----"))
            .collect();
        let one_line = ca.key_pem.replace('\n', "");
        let truncated = ca.key_pem.lines().take(3).collect::<Vec<_>>().join("\n");
        let bad_begin =
            ca.key_pem
                .replacen("PRIVATE KEY-----\n", &format!("PRIVATE KEY {body}\n"), 1);
        let bad_base64 = ca.key_pem.replacen('M', "!", 1);
        for (name, text) in [
            ("one line", one_line),
            ("truncated", truncated),
            ("bad BEGIN line", bad_begin),
            ("bad base64", bad_base64),
        ] {
            let err = private_key(text.as_bytes()).expect_err(name);
            for shown in [err.to_string(), format!("{err:?}")] {
                assert!(!shown.contains(&body[..40]), "{name}: {shown}");
                assert!(!shown.contains(&body[40..80]), "{name}: {shown}");
                assert!(!shown.contains('['), "{name}: {shown}");
            }
        }
    }
}
