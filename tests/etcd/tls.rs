//! Mutual TLS against real etcd: each misconfiguration gets its own clear error,
//! and a client certificate minted from the etcd CA works.

use k3s_control_plane::etcd::{ClientTls, EtcdCluster, EtcdError, ServerCa};
use k3s_control_plane::harness::{EtcdTestCluster, TestPki};

fn init() {
    k3s_control_plane::install_crypto_provider();
}

#[tokio::test]
async fn tls_failures_each_have_a_clear_error() {
    init();
    // Member 2's serving certificate lacks its own IP address.
    let c = EtcdTestCluster::builder()
        .members(3)
        .serving_cert_without_ip(2)
        .start()
        .await
        .expect("start cluster");
    let good = c.member(0).client_url();

    // 1. No client certificate: the server requires one.
    let ca = ServerCa::from_pem("ca", c.ca_pem().as_bytes()).unwrap();
    let etcd = EtcdCluster::new(
        std::slice::from_ref(&good),
        ClientTls::without_client_certificate(ca),
    )
    .unwrap();
    let err = etcd.snapshot().await.unwrap_err();
    assert!(
        matches!(err, EtcdError::ClientCertificateRequired { .. }),
        "no client certificate: {err:?}"
    );
    assert!(
        err.to_string().contains("requires a client certificate"),
        "{err}"
    );

    // 2. Wrong CA: the server certificate is not signed by the CA we trust.
    let other = TestPki::new();
    let tls = ClientTls::from_pem(
        ("other-ca", other.server_ca.pair.cert_pem.as_bytes()),
        ("client.crt", c.pki.client.cert_pem.as_bytes()),
        ("client.key", c.pki.client.key_pem.as_bytes()),
    )
    .unwrap();
    let err = EtcdCluster::new(std::slice::from_ref(&good), tls)
        .unwrap()
        .snapshot()
        .await
        .unwrap_err();
    assert!(
        matches!(err, EtcdError::UnknownAuthority { .. }),
        "wrong CA: {err:?}"
    );
    assert!(
        err.to_string().contains("not signed by the given CA"),
        "{err}"
    );

    // 3. A client certificate from another CA is rejected by the server.
    let tls = ClientTls::from_pem(
        ("ca", c.ca_pem().as_bytes()),
        ("client.crt", other.client.cert_pem.as_bytes()),
        ("client.key", other.client.key_pem.as_bytes()),
    )
    .unwrap();
    let err = EtcdCluster::new(std::slice::from_ref(&good), tls)
        .unwrap()
        .snapshot()
        .await
        .unwrap_err();
    assert!(
        matches!(err, EtcdError::ClientCertificateRejected { .. }),
        "foreign client certificate: {err:?}"
    );

    // 4. Server certificate without the dialed IP: name mismatch, never accepted.
    let bad = c.member(2).client_url();
    let err = EtcdCluster::new(&[bad], c.client_tls())
        .unwrap()
        .snapshot()
        .await
        .unwrap_err();
    let ip = c.member(2).ip.to_string();
    assert!(
        matches!(&err, EtcdError::NameMismatch { server_name, .. } if *server_name == ip),
        "name mismatch: {err:?}"
    );
    assert!(
        err.to_string().contains(&format!("not valid for {ip}")),
        "{err}"
    );

    // Through a good seed, the bad member shows as unhealthy with that reason.
    let snap = c.connect().snapshot().await.unwrap();
    let m = snap.member(c.member(2).id).unwrap();
    assert!(
        m.probe_error
            .as_deref()
            .unwrap()
            .contains(&format!("not valid for {ip}")),
        "{:?}",
        m.probe_error
    );
    assert_eq!(snap.assess_cluster().healthy, 2);
}

#[tokio::test]
async fn a_client_certificate_minted_from_the_etcd_ca_works() {
    init();
    let c = EtcdTestCluster::start(1).await.expect("start cluster");
    let etcd = EtcdCluster::new(&c.endpoints(), c.minted_tls()).unwrap();
    let snap = etcd.snapshot().await.unwrap();
    assert_eq!(snap.members.len(), 1);
    assert!(
        snap.members[0].is_healthy(),
        "{:?}",
        snap.members[0].probe_error
    );
    assert_eq!(snap.leader, Some(c.member(0).id));
}

#[tokio::test]
async fn a_renewed_client_certificate_gets_new_connections_and_the_old_ones_are_not_used() {
    init();
    let c = EtcdTestCluster::start(3).await.expect("start cluster");
    // Minted certificates are renewed with a third to a half of their
    // lifetime left, counted from their issue: with 40 s, after 20 to 27 s.
    let tls = ClientTls::minted_from_ca(
        ("server-ca.crt", c.ca_pem().as_bytes()),
        ("server-ca.key", c.ca_key_pem().as_bytes()),
        std::time::Duration::from_secs(40),
    )
    .unwrap();
    let first = tls.client_identity().unwrap().unwrap();
    let etcd = EtcdCluster::new(&c.endpoints(), tls.clone()).unwrap();
    let snap = etcd.snapshot().await.unwrap();
    assert!(snap.members.iter().all(|m| m.is_healthy()), "{snap:?}");
    assert_eq!(etcd.connections_opened(), 3, "one connection per member");
    etcd.snapshot().await.unwrap();
    assert_eq!(etcd.connections_opened(), 3, "reused while the identity is");

    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(40);
    while std::sync::Arc::ptr_eq(&tls.client_identity().unwrap().unwrap(), &first) {
        assert!(std::time::Instant::now() < deadline, "never renewed");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let snap = etcd.snapshot().await.unwrap();
    assert!(
        snap.members.iter().all(|m| m.is_healthy()),
        "with the renewed certificate: {snap:?}"
    );
    assert_eq!(
        etcd.connections_opened(),
        6,
        "a new connection per member for the renewed certificate"
    );
    etcd.snapshot().await.unwrap();
    assert_eq!(etcd.connections_opened(), 6, "and those are reused");
}

/// Each member's serving certificate expiry is seen in the handshakes the
/// snapshot makes anyway: read after a snapshot, with no new connection, and
/// unknown before any handshake.
#[tokio::test]
async fn each_members_serving_certificate_expiry_is_seen_without_a_new_connection() {
    init();
    let lifetime = std::time::Duration::from_secs(600);
    let c = EtcdTestCluster::builder()
        .members(3)
        .serving_cert_lifetime(lifetime)
        .start()
        .await
        .expect("start cluster");
    let etcd = EtcdCluster::new(&c.endpoints(), c.minted_tls()).unwrap();
    let snap = etcd.snapshot().await.unwrap();
    let opened = etcd.connections_opened();
    let now = std::time::SystemTime::now();
    for member in &snap.members {
        let not_after = etcd
            .serving_cert_not_after(member)
            .unwrap_or_else(|| panic!("{}: no expiry seen", member.label()));
        let left = not_after.duration_since(now).expect("not expired yet");
        assert!(
            left <= lifetime && left >= lifetime - std::time::Duration::from_secs(120),
            "{}: {left:?} left, issued for {lifetime:?}",
            member.label()
        );
    }
    assert_eq!(
        etcd.connections_opened(),
        opened,
        "no connection of its own"
    );

    // Before any handshake nothing is known.
    let fresh = EtcdCluster::new(&c.endpoints(), c.minted_tls()).unwrap();
    assert_eq!(fresh.serving_cert_not_after(&snap.members[0]), None);
}
