//! Certificate authorities: generate one (ECDSA P-256, named as k3s names its
//! CAs), validate one read from a Secret, and issue client certificates.
//!
//! A CA read from a Secret may hold its key in any PEM form: PKCS#8 (what we
//! write), SEC1 `EC PRIVATE KEY` (k3s) or PKCS#1 `RSA PRIVATE KEY` (what
//! upstream cluster-api-k3s writes). rcgen with ring reads only PKCS#8, so
//! signing goes through a rustls signing key, which reads all three.

use std::time::{Duration, SystemTime};

use chrono::{DateTime, Datelike, TimeDelta, Utc};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::CertificateDer;
use x509_parser::prelude::{FromDer, X509Certificate};

use super::signer::CaSigner;
use super::{CertKeyPem, MAX_LIFETIME, PkiError};
use crate::api::names::{TLS_CERT_KEY, TLS_KEY_KEY};

/// Lifetime of the CAs we generate: 10 years, as upstream.
pub const CA_LIFETIME: Duration = Duration::from_secs(10 * 365 * 86_400);
/// A generated CA is valid from this long before its creation (clock skew).
const CA_BACKDATE: Duration = Duration::from_secs(3600);
/// An issued client certificate is valid from this long before `now`.
const CLIENT_BACKDATE: Duration = Duration::from_secs(5 * 60);

/// The common name k3s gives a CA: `<prefix>@<unix seconds>`, e.g.
/// `k3s-server-ca@1700000000` (see [`super::SERVER_CA_NAME`] and siblings).
pub fn ca_common_name(prefix: &str, now: DateTime<Utc>) -> String {
    format!("{prefix}@{}", now.timestamp())
}

/// Self-signed CA, ECDSA P-256, CN as k3s names them (`k3s-server-ca@<unix ts>`,
/// `k3s-client-ca@<ts>`, `etcd-server-ca@<ts>`), key usages
/// KeyCertSign|CrlSign|DigitalSignature, basic constraints CA,
/// not_before = now - 1h, not_after = now + lifetime. The key is PKCS#8 PEM.
pub fn generate_ca(common_name: &str, lifetime: Duration) -> Result<CertKeyPem, PkiError> {
    let field = format!("CA {common_name}");
    let (not_before, not_after) = validity(Utc::now(), CA_BACKDATE, lifetime, &field)?;
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(sign_error(&field))?;
    let mut params = CertificateParams::default();
    params.distinguished_name = distinguished_name(common_name, None);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = not_before.into();
    params.not_after = not_after.into();
    let cert = params.self_signed(&key).map_err(sign_error(&field))?;
    Ok(CertKeyPem {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// Check a CA pair read from a Secret: the first PEM certificate parses and is
/// a CA (basic constraints CA, keyCertSign if key usages are present), the key
/// parses (PKCS#8, SEC1 or PKCS#1), matches the certificate's public key and
/// can sign. `field` prefixes error messages: `default/demo-ca` gives
/// `default/demo-ca[tls.crt]` and `default/demo-ca[tls.key]`. Expiry is not
/// checked here; see [`not_after`].
pub fn validate_ca(pair: &CertKeyPem, field: &str) -> Result<(), PkiError> {
    LoadedCa::load(
        pair,
        &format!("{field}[{TLS_CERT_KEY}]"),
        &format!("{field}[{TLS_KEY_KEY}]"),
    )
    .map(|_| ())
}

/// Sign a client certificate (ExtKeyUsage ClientAuth, KeyUsage DigitalSignature,
/// a fresh ECDSA P-256 key) with `ca`: subject CN `common_name` and O the
/// organization, if any (at most one: Kubernetes reads each O as a group, and
/// one is all the admin certificate needs). Valid from `now` - 5 min to
/// `now + lifetime`.
pub fn issue_client_cert(
    ca: &CertKeyPem,
    common_name: &str,
    organizations: &[&str],
    lifetime: Duration,
    now: DateTime<Utc>,
) -> Result<CertKeyPem, PkiError> {
    issue_client_cert_from(ca, "issuing CA", common_name, organizations, lifetime, now)
}

/// [`issue_client_cert`], with errors about the CA naming `ca_field`
/// (`<ca_field> certificate`, `<ca_field> key`).
pub(crate) fn issue_client_cert_from(
    ca: &CertKeyPem,
    ca_field: &str,
    common_name: &str,
    organizations: &[&str],
    lifetime: Duration,
    now: DateTime<Utc>,
) -> Result<CertKeyPem, PkiError> {
    let field = format!("client certificate {common_name}");
    let organization = match organizations {
        [] => None,
        [one] => Some(*one),
        _ => {
            return Err(PkiError::InvalidRequest {
                field,
                reason: format!(
                    "{} organizations given, at most one is supported",
                    organizations.len()
                ),
            });
        }
    };
    let (not_before, not_after) = validity(now, CLIENT_BACKDATE, lifetime, &field)?;
    let ca = LoadedCa::load(
        ca,
        &format!("{ca_field} certificate"),
        &format!("{ca_field} key"),
    )?;
    let issuer =
        Issuer::from_ca_cert_der(&ca.cert_der, &ca.signer).map_err(sign_error(ca_field))?;
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(sign_error(&field))?;
    let mut params = CertificateParams::default();
    params.distinguished_name = distinguished_name(common_name, organization);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.use_authority_key_identifier_extension = true;
    params.not_before = not_before.into();
    params.not_after = not_after.into();
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(sign_error(ca_field))?;
    Ok(CertKeyPem {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// notAfter of the first certificate in `cert_pem`; errors name `field`.
pub fn not_after(cert_pem: &str, field: &str) -> Result<DateTime<Utc>, PkiError> {
    let der = first_certificate(cert_pem, field)?;
    let (_, cert) = parse_certificate(&der, field)?;
    let timestamp = cert.validity().not_after.timestamp();
    DateTime::from_timestamp(timestamp, 0).ok_or_else(|| PkiError::BadCertificate {
        field: field.to_string(),
        reason: format!("notAfter {timestamp} is out of range"),
    })
}

/// The first certificate of a PEM text (other sections are skipped).
pub(crate) fn first_certificate(
    pem: &str,
    field: &str,
) -> Result<CertificateDer<'static>, PkiError> {
    match super::pem::first_certificate(pem.as_bytes()) {
        Ok(None) => Err(PkiError::NoCertificate {
            field: field.to_string(),
        }),
        Err(e) => Err(PkiError::BadCertificate {
            field: field.to_string(),
            reason: e.to_string(),
        }),
        Ok(Some(der)) => {
            parse_certificate(&der, field)?;
            Ok(der)
        }
    }
}

fn parse_certificate<'a>(
    der: &'a CertificateDer<'_>,
    field: &str,
) -> Result<(&'a [u8], X509Certificate<'a>), PkiError> {
    X509Certificate::from_der(der).map_err(|e| PkiError::BadCertificate {
        field: field.to_string(),
        reason: e.to_string(),
    })
}

fn distinguished_name(common_name: &str, organization: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    if let Some(organization) = organization {
        dn.push(DnType::OrganizationName, organization);
    }
    dn.push(DnType::CommonName, common_name);
    dn
}

/// rcgen errors describe the failing step, never key bytes.
fn sign_error(field: &str) -> impl FnOnce(rcgen::Error) -> PkiError + '_ {
    move |e| PkiError::Sign {
        field: field.to_string(),
        reason: e.to_string(),
    }
}

/// `(now - backdate, now + lifetime)` as system times, refusing a zero or
/// absurd lifetime and dates X.509 cannot carry (rcgen would panic on those).
fn validity(
    now: DateTime<Utc>,
    backdate: Duration,
    lifetime: Duration,
    field: &str,
) -> Result<(SystemTime, SystemTime), PkiError> {
    let invalid = |reason: String| PkiError::InvalidRequest {
        field: field.to_string(),
        reason,
    };
    if lifetime.is_zero() {
        return Err(invalid("lifetime is zero".into()));
    }
    if lifetime > MAX_LIFETIME {
        return Err(invalid(format!(
            "lifetime {}s is longer than 100 years",
            lifetime.as_secs()
        )));
    }
    let delta = |d: Duration| TimeDelta::from_std(d).unwrap_or(TimeDelta::MAX);
    let start = now.checked_sub_signed(delta(backdate));
    let end = now.checked_add_signed(delta(lifetime));
    match (start, end) {
        (Some(start), Some(end)) if start.year() >= 1950 && end.year() <= 9999 => {
            Ok((SystemTime::from(start), SystemTime::from(end)))
        }
        _ => Err(invalid(format!(
            "validity from {now} for {}s is outside the years 1950-9999",
            lifetime.as_secs()
        ))),
    }
}

/// A CA certificate with a key that matches it and can sign.
struct LoadedCa {
    cert_der: CertificateDer<'static>,
    signer: CaSigner,
}

impl LoadedCa {
    fn load(pair: &CertKeyPem, cert_field: &str, key_field: &str) -> Result<Self, PkiError> {
        let cert_der = first_certificate(&pair.cert_pem, cert_field)?;
        let (_, cert) = parse_certificate(&cert_der, cert_field)?;
        let not_ca = |reason: &str| PkiError::NotCa {
            field: cert_field.to_string(),
            reason: reason.to_string(),
        };
        if !cert.is_ca() {
            return Err(not_ca("basicConstraints CA:TRUE missing"));
        }
        match cert.key_usage() {
            Ok(Some(usage)) if !usage.value.key_cert_sign() => {
                return Err(not_ca("keyUsage lacks keyCertSign"));
            }
            Ok(_) => {}
            Err(e) => {
                return Err(PkiError::BadCertificate {
                    field: cert_field.to_string(),
                    reason: e.to_string(),
                });
            }
        }
        let key = match super::pem::private_key(pair.key_pem.as_bytes()) {
            Ok(Some(key)) => key,
            Ok(None) => {
                return Err(PkiError::NoKey {
                    field: key_field.to_string(),
                });
            }
            // The PEM error never quotes the text.
            Err(e) => {
                return Err(PkiError::BadKey {
                    field: key_field.to_string(),
                    reason: e.to_string(),
                });
            }
        };
        let bad_key = |reason: String| PkiError::BadKey {
            field: key_field.to_string(),
            reason,
        };
        let key = rustls::crypto::ring::sign::any_supported_type(&key)
            .map_err(|e| bad_key(e.to_string()))?;
        let spki = key
            .public_key()
            .map(|spki| spki.as_ref().to_vec())
            .ok_or_else(|| bad_key("cannot derive its public key".into()))?;
        if spki != cert.tbs_certificate.subject_pki.raw {
            return Err(PkiError::KeyMismatch {
                field: key_field.to_string(),
                cert_field: cert_field.to_string(),
            });
        }
        let signer = CaSigner::new(key, &spki).map_err(bad_key)?;
        let cert_der = cert_der.into_owned();
        Ok(Self { cert_der, signer })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rustls::pki_types::UnixTime;
    use std::sync::Arc;

    /// Test-only CAs made with openssl: upstream cluster-api-k3s style (RSA,
    /// PKCS#1 key, CN `kubernetes`) and k3s style (EC P-256, SEC1 key).
    pub(crate) fn upstream_rsa_ca() -> CertKeyPem {
        CertKeyPem {
            cert_pem: include_str!("testdata/upstream-ca.crt").into(),
            key_pem: include_str!("testdata/upstream-ca-pkcs1.key").into(),
        }
    }

    pub(crate) fn k3s_sec1_ca() -> CertKeyPem {
        CertKeyPem {
            cert_pem: include_str!("testdata/k3s-ca.crt").into(),
            key_pem: include_str!("testdata/k3s-ca-sec1.key").into(),
        }
    }

    fn der(pem: &str) -> CertificateDer<'static> {
        first_certificate(pem, "test").unwrap()
    }

    fn close(a: DateTime<Utc>, b: DateTime<Utc>, seconds: i64) -> bool {
        (a - b).num_seconds().abs() <= seconds
    }

    /// Full path validation for client authentication (chain, validity, EKU)
    /// as a TLS server would do it, with `ca` as the only root.
    pub(crate) fn verify_as_client(ca_pem: &str, leaf_pem: &str) -> Result<(), rustls::Error> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der(ca_pem)).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .unwrap();
        verifier
            .verify_client_cert(&der(leaf_pem), &[], UnixTime::now())
            .map(|_| ())
    }

    #[test]
    fn generated_ca_validates_and_is_a_ca_with_the_name_given() {
        let before = Utc::now();
        let name = ca_common_name(super::super::SERVER_CA_NAME, before);
        assert_eq!(name, format!("k3s-server-ca@{}", before.timestamp()));
        let ca = generate_ca(&name, CA_LIFETIME).unwrap();
        validate_ca(&ca, "default/demo-ca").unwrap();
        assert!(ca.key_pem.starts_with("-----BEGIN PRIVATE KEY-----"));

        let cert_der = der(&ca.cert_pem);
        let (_, cert) = X509Certificate::from_der(&cert_der).unwrap();
        assert!(cert.is_ca());
        assert_eq!(cert.subject().to_string(), format!("CN={name}"));
        assert_eq!(cert.subject(), cert.issuer(), "self-signed");
        cert.verify_signature(None)
            .expect("self-signature verifies");
        let usage = cert.key_usage().unwrap().expect("key usage present").value;
        assert!(usage.key_cert_sign() && usage.crl_sign() && usage.digital_signature());
        assert!(!usage.key_encipherment());
        let spki = &cert.tbs_certificate.subject_pki;
        assert_eq!(
            spki.algorithm.algorithm,
            x509_parser::oid_registry::OID_KEY_TYPE_EC_PUBLIC_KEY
        );
        let curve = spki
            .algorithm
            .parameters
            .as_ref()
            .unwrap()
            .as_oid()
            .unwrap();
        assert_eq!(curve, x509_parser::oid_registry::OID_EC_P256);

        let not_before =
            DateTime::from_timestamp(cert.validity().not_before.timestamp(), 0).unwrap();
        assert!(close(not_before, before - TimeDelta::hours(1), 2));
        let expected_end = before + TimeDelta::from_std(CA_LIFETIME).unwrap();
        assert!(close(
            not_after(&ca.cert_pem, "x").unwrap(),
            expected_end,
            2
        ));
        assert_eq!(CA_LIFETIME.as_secs(), 3650 * 86_400);
    }

    #[test]
    fn validate_ca_rejects_a_certificate_that_is_not_a_ca() {
        let ca = generate_ca("k3s-client-ca@1", CA_LIFETIME).unwrap();
        let leaf =
            issue_client_cert(&ca, "leaf", &[], Duration::from_secs(60), Utc::now()).unwrap();
        let err = validate_ca(&leaf, "default/demo-cca").unwrap_err();
        assert!(matches!(err, PkiError::NotCa { .. }), "{err}");
        assert_eq!(
            err.to_string(),
            "default/demo-cca[tls.crt]: not a CA certificate: basicConstraints CA:TRUE missing"
        );
        // Using it as an issuer fails the same way, before anything is signed.
        let err =
            issue_client_cert(&leaf, "x", &[], Duration::from_secs(60), Utc::now()).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("issuing CA certificate: not a CA"),
            "{err}"
        );
    }

    #[test]
    fn validate_ca_rejects_a_key_that_is_not_the_certificates() {
        let a = generate_ca("a", CA_LIFETIME).unwrap();
        let b = generate_ca("b", CA_LIFETIME).unwrap();
        for (name, pair) in [
            (
                "another EC key",
                CertKeyPem {
                    cert_pem: a.cert_pem.clone(),
                    key_pem: b.key_pem.clone(),
                },
            ),
            (
                "an RSA key for an EC certificate",
                CertKeyPem {
                    cert_pem: a.cert_pem.clone(),
                    key_pem: upstream_rsa_ca().key_pem,
                },
            ),
        ] {
            let err = validate_ca(&pair, "default/demo-ca").expect_err(name);
            assert!(matches!(err, PkiError::KeyMismatch { .. }), "{name}: {err}");
            assert_eq!(
                err.to_string(),
                "default/demo-ca[tls.key]: private key does not match the certificate in default/demo-ca[tls.crt]",
                "{name}"
            );
        }
    }

    #[test]
    fn validate_ca_rejects_garbage_naming_the_field_and_never_the_key() {
        let ca = generate_ca("k3s-server-ca@1", CA_LIFETIME).unwrap();
        let key_body: String = ca
            .key_pem
            .lines()
            .filter(|l| !l.starts_with("-----"))
            .collect();
        // A PKCS#8 section whose content is not a key (the CA certificate's DER).
        let not_a_key = ca.cert_pem.replace("CERTIFICATE", "PRIVATE KEY");
        let bad_base64_cert = "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n";
        // Pasted without its line breaks, the key is all one BEGIN line.
        let one_line_key = ca.key_pem.replace('\n', "");
        let truncated_key: String = ca
            .key_pem
            .lines()
            .take(4)
            .map(|l| format!("{l}\n"))
            .collect();
        let cases: [(&str, &str, &str, &str); 9] = [
            (
                "empty certificate",
                "",
                &ca.key_pem,
                "default/demo-ca[tls.crt]: no PEM certificate found",
            ),
            (
                "garbage certificate",
                "hello",
                &ca.key_pem,
                "default/demo-ca[tls.crt]: no PEM certificate found",
            ),
            (
                "certificate that is not base64",
                bad_base64_cert,
                &ca.key_pem,
                "default/demo-ca[tls.crt]: not a valid X.509 certificate",
            ),
            (
                "certificate field holds the key",
                &ca.key_pem,
                &ca.key_pem,
                "default/demo-ca[tls.crt]: no PEM certificate found",
            ),
            (
                "garbage key",
                &ca.cert_pem,
                "hello",
                "default/demo-ca[tls.key]: no PEM private key found",
            ),
            (
                "key field holds the certificate",
                &ca.cert_pem,
                &ca.cert_pem,
                "default/demo-ca[tls.key]: no PEM private key found",
            ),
            (
                "key section that is not a key",
                &ca.cert_pem,
                &not_a_key,
                "default/demo-ca[tls.key]: unsupported or malformed private key",
            ),
            (
                "key without its line breaks",
                &ca.cert_pem,
                &one_line_key,
                "default/demo-ca[tls.key]: unsupported or malformed private key",
            ),
            (
                "key without its END line",
                &ca.cert_pem,
                &truncated_key,
                "default/demo-ca[tls.key]: unsupported or malformed private key",
            ),
        ];
        for (name, cert_pem, key_pem, expected) in cases {
            let pair = CertKeyPem {
                cert_pem: cert_pem.to_string(),
                key_pem: key_pem.to_string(),
            };
            let err = validate_ca(&pair, "default/demo-ca").expect_err(name);
            let message = err.to_string();
            assert!(message.starts_with(expected), "{name}: {message}");
            assert!(!message.contains(&key_body[60..100]), "{name}: {message}");
            assert!(
                !format!("{err:?}").contains("PRIVATE KEY"),
                "{name}: {err:?}"
            );
        }
    }

    #[test]
    fn client_certificate_chains_to_the_ca_with_the_identity_asked_for() {
        let ca = generate_ca("k3s-client-ca@1", CA_LIFETIME).unwrap();
        let now = Utc::now();
        let lifetime = Duration::from_secs(365 * 86_400);
        let client =
            issue_client_cert(&ca, "kubernetes-admin", &["system:masters"], lifetime, now).unwrap();

        let (ca_der, leaf_der) = (der(&ca.cert_pem), der(&client.cert_pem));
        let (_, ca_cert) = X509Certificate::from_der(&ca_der).unwrap();
        let (_, leaf) = X509Certificate::from_der(&leaf_der).unwrap();
        assert_eq!(leaf.issuer(), ca_cert.subject());
        leaf.verify_signature(Some(ca_cert.public_key()))
            .expect("signed by the CA");
        verify_as_client(&ca.cert_pem, &client.cert_pem).expect("valid for client auth");
        let other = generate_ca("k3s-client-ca@1", CA_LIFETIME).unwrap();
        verify_as_client(&other.cert_pem, &client.cert_pem)
            .expect_err("another CA with the same name does not verify it");

        let cn: Vec<_> = leaf
            .subject()
            .iter_common_name()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert_eq!(cn, ["kubernetes-admin"]);
        let o: Vec<_> = leaf
            .subject()
            .iter_organization()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert_eq!(o, ["system:masters"]);
        let eku = leaf
            .extended_key_usage()
            .unwrap()
            .expect("EKU present")
            .value;
        assert!(eku.client_auth && !eku.server_auth && !eku.any);
        assert!(!leaf.is_ca());

        let expected = now + TimeDelta::from_std(lifetime).unwrap();
        let got = not_after(&client.cert_pem, "client").unwrap();
        assert!(close(got, expected, 2), "{got} vs {expected}");
        let start = DateTime::from_timestamp(leaf.validity().not_before.timestamp(), 0).unwrap();
        assert!(close(start, now - TimeDelta::minutes(5), 2), "{start}");
        // The client key is the certificate's.
        validate_pair_matches(&client);
    }

    fn validate_pair_matches(pair: &CertKeyPem) {
        let key = KeyPair::from_pem(&pair.key_pem).unwrap();
        let leaf_der = der(&pair.cert_pem);
        let (_, leaf) = X509Certificate::from_der(&leaf_der).unwrap();
        assert_eq!(
            key.public_key_raw(),
            leaf.public_key().subject_public_key.data.as_ref()
        );
    }

    #[test]
    fn cas_with_upstream_and_k3s_key_forms_validate_and_sign() {
        for (name, ca) in [
            ("upstream RSA PKCS#1", upstream_rsa_ca()),
            ("k3s EC SEC1", k3s_sec1_ca()),
        ] {
            validate_ca(&ca, name).unwrap_or_else(|e| panic!("{name}: {e}"));
            let client = issue_client_cert(
                &ca,
                "kubernetes-admin",
                &["system:masters"],
                Duration::from_secs(3600),
                Utc::now(),
            )
            .unwrap_or_else(|e| panic!("{name}: {e}"));
            let ca_der = der(&ca.cert_pem);
            let (_, ca_cert) = X509Certificate::from_der(&ca_der).unwrap();
            let leaf_der = der(&client.cert_pem);
            let (_, leaf) = X509Certificate::from_der(&leaf_der).unwrap();
            leaf.verify_signature(Some(ca_cert.public_key()))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            verify_as_client(&ca.cert_pem, &client.cert_pem)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }

    #[test]
    fn unsupported_requests_are_refused_before_signing() {
        let ca = generate_ca("k3s-client-ca@1", CA_LIFETIME).unwrap();
        let now = Utc::now();
        let hour = Duration::from_secs(3600);
        let err = issue_client_cert(&ca, "admin", &["a", "b"], hour, now).unwrap_err();
        assert_eq!(
            err.to_string(),
            "client certificate admin: 2 organizations given, at most one is supported"
        );
        let err = issue_client_cert(&ca, "admin", &[], Duration::ZERO, now).unwrap_err();
        assert_eq!(
            err.to_string(),
            "client certificate admin: lifetime is zero"
        );
        let err = issue_client_cert(&ca, "admin", &[], MAX_LIFETIME * 2, now).unwrap_err();
        assert!(err.to_string().contains("longer than 100 years"), "{err}");
        let err = issue_client_cert(&ca, "admin", &[], hour, DateTime::<Utc>::MAX_UTC).unwrap_err();
        assert!(
            err.to_string().contains("outside the years 1950-9999"),
            "{err}"
        );
        let err = generate_ca("x", Duration::ZERO).unwrap_err();
        assert_eq!(err.to_string(), "CA x: lifetime is zero");
    }

    #[test]
    fn not_after_reads_the_first_certificate_and_names_the_field() {
        let ca = generate_ca("a", Duration::from_secs(86_400)).unwrap();
        let later = generate_ca("b", Duration::from_secs(2 * 86_400)).unwrap();
        let bundle = format!("{}{}", ca.cert_pem, later.cert_pem);
        assert_eq!(
            not_after(&bundle, "x").unwrap(),
            not_after(&ca.cert_pem, "x").unwrap()
        );
        let err = not_after("nothing", "default/demo-kubeconfig[value]").unwrap_err();
        assert_eq!(
            err.to_string(),
            "default/demo-kubeconfig[value]: no PEM certificate found"
        );
    }
}
