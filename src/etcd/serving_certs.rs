//! What each member's serving certificate says about its own expiry, seen in
//! the handshakes we make anyway: no extra connection, no extra request.
//!
//! [`RecordingVerifier`] is rustls's own WebPKI verifier (chain against our
//! CA, the member's name, validity now) that, once a certificate has passed,
//! notes its `NotAfter` under the name it was verified for. A resumed session
//! does not verify again, so the last full handshake's value stays.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use rustls::DigitallySignedStruct;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use x509_parser::prelude::{FromDer, X509Certificate};

/// `NotAfter` of the serving certificate last verified, by server name (the
/// member's host as its client URL gives it). Cheap to clone; clones share.
#[derive(Clone, Debug, Default)]
pub struct ServingCerts {
    seen: Arc<Mutex<HashMap<String, SystemTime>>>,
}

impl ServingCerts {
    /// The expiry of the certificate `server_name` last presented, if a full
    /// handshake with it has been made.
    pub fn not_after(&self, server_name: &str) -> Option<SystemTime> {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(server_name)
            .copied()
    }

    fn record(&self, server_name: String, not_after: SystemTime) {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(server_name, not_after);
    }
}

/// The WebPKI verifier, recording each verified certificate's expiry.
#[derive(Debug)]
pub struct RecordingVerifier {
    inner: Arc<WebPkiServerVerifier>,
    seen: ServingCerts,
}

impl RecordingVerifier {
    pub fn new(inner: Arc<WebPkiServerVerifier>, seen: ServingCerts) -> Self {
        Self { inner, seen }
    }
}

pub(crate) fn not_after(cert: &CertificateDer<'_>) -> Option<SystemTime> {
    let (_, parsed) = X509Certificate::from_der(cert.as_ref()).ok()?;
    let seconds = parsed.validity().not_after.timestamp();
    Some(SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(u64::try_from(seconds).ok()?))
}

fn name_of(server_name: &ServerName<'_>) -> String {
    match server_name {
        ServerName::DnsName(name) => name.as_ref().to_string(),
        ServerName::IpAddress(ip) => std::net::IpAddr::from(*ip).to_string(),
        other => format!("{other:?}"),
    }
}

impl ServerCertVerifier for RecordingVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verified = self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )?;
        // Only a certificate that passed is worth remembering.
        if let Some(expiry) = not_after(end_entity) {
            self.seen.record(name_of(server_name), expiry);
        }
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
