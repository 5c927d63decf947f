//! TLS loading tables. Fixtures in `src/etcd/testdata` were made with openssl
//! (test-only keys) so that every PEM key form k3s or an operator may hand us
//! is covered: SEC1 EC, PKCS#8 and PKCS#1 RSA.

use super::*;

const CA: &[u8] = include_bytes!("../testdata/ca.crt");
const CA_KEY_SEC1: &[u8] = include_bytes!("../testdata/ca-sec1.key");
const EC_CERT: &[u8] = include_bytes!("../testdata/client-ec.crt");
const EC_KEY_SEC1: &[u8] = include_bytes!("../testdata/client-ec-sec1.key");
const EC_KEY_PKCS8: &[u8] = include_bytes!("../testdata/client-ec-pkcs8.key");
const RSA_CERT: &[u8] = include_bytes!("../testdata/client-rsa.crt");
const RSA_KEY_PKCS1: &[u8] = include_bytes!("../testdata/client-rsa-pkcs1.key");
const SERVER_ONLY_CERT: &[u8] = include_bytes!("../testdata/server-only-ec.crt");
const OTHER_KEY: &[u8] = include_bytes!("../testdata/other-sec1.key");

fn load(cert: &[u8], key: &[u8]) -> Result<ClientIdentity, TlsError> {
    ClientIdentity::from_pem("--cert c.pem", cert, "--key k.pem", key)
}

#[test]
fn client_identity_loads_every_key_form() {
    let cases: [(&str, &[u8], &[u8]); 3] = [
        ("EC key in SEC1 form", EC_CERT, EC_KEY_SEC1),
        ("EC key in PKCS#8 form", EC_CERT, EC_KEY_PKCS8),
        ("RSA key in PKCS#1 form", RSA_CERT, RSA_KEY_PKCS1),
    ];
    for (name, cert, key) in cases {
        let identity = load(cert, key).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(identity.subject().contains("etcd-client"), "{name}");
    }
}

#[test]
fn key_that_does_not_match_the_certificate_names_both_fields() {
    for (name, cert, key) in [
        ("other EC key", EC_CERT, OTHER_KEY),
        ("RSA key for EC cert", EC_CERT, RSA_KEY_PKCS1),
        ("EC key for RSA cert", RSA_CERT, EC_KEY_PKCS8),
    ] {
        let err = load(cert, key).expect_err(name);
        assert!(matches!(err, TlsError::KeyMismatch { .. }), "{name}: {err}");
        assert_eq!(
            err.to_string(),
            "--key k.pem: key does not match the certificate in --cert c.pem",
            "{name}"
        );
    }
}

#[test]
fn bad_input_names_the_field() {
    let cases: [(&str, &[u8], &[u8], &str); 4] = [
        (
            "key file holds a certificate",
            EC_CERT,
            EC_CERT,
            "--key k.pem: no PEM private key",
        ),
        (
            "cert file holds a key",
            EC_KEY_SEC1,
            EC_KEY_SEC1,
            "--cert c.pem: no PEM certificate",
        ),
        (
            "empty cert",
            b"",
            EC_KEY_SEC1,
            "--cert c.pem: no PEM certificate",
        ),
        (
            "server-only certificate",
            SERVER_ONLY_CERT,
            EC_KEY_SEC1,
            "--cert c.pem: certificate is not valid for client authentication",
        ),
    ];
    for (name, cert, key, expected) in cases {
        let err = load(cert, key).expect_err(name);
        assert!(err.to_string().starts_with(expected), "{name}: {err}");
    }
}

#[test]
fn debug_output_never_contains_key_material() {
    let identity = load(EC_CERT, EC_KEY_SEC1).unwrap();
    let debug = format!("{identity:?}");
    assert!(debug.contains("<redacted>"), "{debug}");
    assert!(!debug.contains("PRIVATE KEY"), "{debug}");
    let tls =
        ClientTls::minted_from_ca(("ca", CA), ("ca-key", CA_KEY_SEC1), DEFAULT_MINTED_LIFETIME)
            .unwrap();
    let debug = format!("{tls:?}");
    assert!(!debug.contains("PRIVATE KEY"), "{debug}");
}

#[test]
fn minting_from_a_sec1_ca_key_gives_a_client_certificate() {
    let minter =
        ClientCertMinter::new("ca", CA, "ca-key", CA_KEY_SEC1, Duration::from_secs(3600)).unwrap();
    let identity = minter.current().unwrap();
    let certs = parse_certs("minted", identity.cert_pem().as_bytes()).unwrap();
    let (_, cert) = X509Certificate::from_der(&certs[0]).unwrap();
    assert_eq!(
        cert.subject().to_string(),
        format!("CN={CLIENT_COMMON_NAME}")
    );
    let eku = cert.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.client_auth && !eku.server_auth);
    let ca_certs = parse_certs("ca", CA).unwrap();
    let (_, ca) = X509Certificate::from_der(&ca_certs[0]).unwrap();
    assert_eq!(cert.issuer(), ca.subject());
    cert.verify_signature(Some(ca.public_key()))
        .expect("minted certificate is signed by the CA");
    let lifetime = cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp();
    assert_eq!(lifetime, 3600 + 60, "1h plus one minute backdating");
    // The minted identity round-trips through the same checks as a loaded one.
    load(identity.cert_pem().as_bytes(), identity.key_pem.as_bytes()).unwrap();
}

#[test]
fn minter_reuses_a_fresh_certificate_and_renews_an_old_one() {
    let minter =
        ClientCertMinter::new("ca", CA, "ca-key", CA_KEY_SEC1, Duration::from_secs(3600)).unwrap();
    let first = minter.current().unwrap();
    assert!(Arc::ptr_eq(&first, &minter.current().unwrap()));
    let now = SystemTime::now();
    assert!(!first.due_for_renewal(now));
    assert!(first.due_for_renewal(now + Duration::from_secs(2500)));
    // Age the cached identity: the next call must re-mint.
    {
        let mut current = minter.current.lock().unwrap();
        let mut old = (**current.as_ref().unwrap()).clone();
        // Issued 50 minutes ago for 1h: 10 minutes (< 1/3) left.
        old.not_before = now - Duration::from_secs(3000);
        old.not_after = now + Duration::from_secs(600);
        old.renew_at = renewal_time(old.not_before, old.not_after, 0.5);
        *current = Some(Arc::new(old));
    }
    let renewed = minter.current().unwrap();
    assert!(renewed.not_after() > now + Duration::from_secs(3000));
}

/// A third of the lifetime left, and up to a sixth earlier as the spread
/// says: an hour's certificate is renewed 40 to 30 minutes after issue.
#[test]
fn renewal_falls_between_a_third_and_a_half_of_the_lifetime_left() {
    let issued = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    let expires = issued + Duration::from_secs(3600);
    for (situation, spread, after_issue) in [
        ("no spread: a third left", 0.0, 2400),
        ("half the spread", 0.5, 2100),
        ("the most spread: a half left", 1.0, 1800),
        ("below the range: no spread", -1.0, 2400),
        ("above the range: the most", 7.0, 1800),
        ("not a number: no spread", f64::NAN, 2400),
    ] {
        assert_eq!(
            renewal_time(issued, expires, spread),
            issued + Duration::from_secs(after_issue),
            "{situation}"
        );
    }
}

/// Identities minted in the same second are renewed at different times
/// after their issue, each within its window.
#[test]
fn identities_minted_together_are_renewed_apart() {
    let minter =
        ClientCertMinter::new("ca", CA, "ca-key", CA_KEY_SEC1, Duration::from_secs(3600)).unwrap();
    // How long after its issue each is renewed.
    let renewals: std::collections::BTreeSet<Duration> = (0..8)
        .map(|_| {
            let identity = minter.mint().unwrap();
            let issued = identity.not_before + BACKDATE;
            let earliest = renewal_time(issued, identity.not_after, 1.0);
            let latest = renewal_time(issued, identity.not_after, 0.0);
            assert!(
                (earliest..=latest).contains(&identity.renew_at),
                "renewal outside its window"
            );
            identity
                .renew_at
                .duration_since(identity.not_before)
                .unwrap()
        })
        .collect();
    assert!(
        renewals.len() > 1,
        "every identity renewed at the same time after its issue"
    );
}

#[test]
fn minter_refuses_a_key_that_is_not_the_ca_key() {
    let err = ClientCertMinter::new(
        "--cacert ca.pem",
        CA,
        "--ca-key x.pem",
        OTHER_KEY,
        DEFAULT_MINTED_LIFETIME,
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "--ca-key x.pem: key does not match the certificate in --cacert ca.pem"
    );
}

#[test]
fn minter_refuses_a_leaf_certificate_as_ca() {
    let err = ClientCertMinter::new(
        "--cacert c.pem",
        EC_CERT,
        "--ca-key k.pem",
        EC_KEY_SEC1,
        DEFAULT_MINTED_LIFETIME,
    )
    .unwrap_err();
    assert!(matches!(err, TlsError::NotCa { .. }), "{err}");
}
