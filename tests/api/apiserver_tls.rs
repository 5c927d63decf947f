//! The test API server over TLS, as a workload cluster's k3s API server: a serving
//! certificate signed by the server CA (`<cluster>-ca`), client certificates required
//! and verified against the client CA (`<cluster>-cca`), reached by a real
//! `kube::Client` only through a kubeconfig.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use futures::StreamExt;
use k3s_control_plane::apiserver::{Error, ServerTls, TestApiServer};
use k3s_control_plane::harness::{CertPair, TestCa};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use kube::config::Kubeconfig;
use rcgen::{ExtendedKeyUsagePurpose, SanType};

/// Upper bound for anything that should succeed or fail quickly.
const DEADLINE: Duration = Duration::from_secs(10);

struct Pki {
    server_ca: TestCa,
    client_ca: TestCa,
    /// Serving certificate for 127.0.0.1, signed by the server CA.
    serving: CertPair,
    /// Client certificate signed by the client CA.
    client: CertPair,
}

fn pki() -> Pki {
    k3s_control_plane::install_crypto_provider();
    let server_ca = TestCa::new("k3s-server-ca@1700000000");
    let client_ca = TestCa::new("k3s-client-ca@1700000000");
    let serving = serving_cert(
        &server_ca,
        &[
            SanType::DnsName("kubernetes".try_into().unwrap()),
            SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        ],
    );
    let client = client_cert(&client_ca);
    Pki {
        server_ca,
        client_ca,
        serving,
        client,
    }
}

fn serving_cert(ca: &TestCa, sans: &[SanType]) -> CertPair {
    ca.issue("k3s", sans, &[ExtendedKeyUsagePurpose::ServerAuth])
}

fn client_cert(ca: &TestCa) -> CertPair {
    ca.issue("system:admin", &[], &[ExtendedKeyUsagePurpose::ClientAuth])
}

/// Client certificates required (client CA), no identity for `server.client()`.
fn mutual(pki: &Pki) -> ServerTls {
    ServerTls {
        ca_pem: pki.server_ca.pair.cert_pem.clone(),
        cert_pem: pki.serving.cert_pem.clone(),
        key_pem: pki.serving.key_pem.clone(),
        client_ca_pem: Some(pki.client_ca.pair.cert_pem.clone()),
        client_identity: None,
    }
}

async fn start(tls: ServerTls) -> TestApiServer {
    TestApiServer::builder()
        .with_core_resources()
        .tls(tls)
        .start()
        .await
        .unwrap()
}

/// A client built from a kubeconfig, as the controller builds one from the
/// `<cluster>-kubeconfig` Secret (serialized and parsed back first).
fn client_from(kubeconfig: &Kubeconfig) -> kube::Client {
    let yaml = k3s_control_plane::yaml::to_string(kubeconfig).unwrap();
    let parsed: Kubeconfig = k3s_control_plane::yaml::from_str(&yaml).unwrap();
    kube::Client::try_from(kube::Config::try_from(parsed).unwrap()).unwrap()
}

fn config_map(name: &str) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    cm.data = Some([("k".to_string(), "v".to_string())].into());
    cm
}

/// Create a ConfigMap, failing the test if it neither succeeds nor fails in time.
async fn create(client: &kube::Client, name: &str) -> Result<ConfigMap, kube::Error> {
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    tokio::time::timeout(
        DEADLINE,
        cms.create(&PostParams::default(), &config_map(name)),
    )
    .await
    .expect("the request ends (succeeds or fails) before the deadline")
}

async fn get(client: &kube::Client, name: &str) -> Option<ConfigMap> {
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    tokio::time::timeout(DEADLINE, cms.get_opt(name))
        .await
        .expect("the request ends before the deadline")
        .expect("the trusted client can read")
}

/// The error and all its sources, for matching on the TLS reason.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(" <- ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The request was refused below HTTP (no API answer) and created nothing, checked
/// with a client the server does accept.
async fn assert_refused(
    refused: Result<ConfigMap, kube::Error>,
    name: &str,
    trusted: &kube::Client,
) -> String {
    let err = refused.expect_err("the server must refuse this client");
    assert!(
        !matches!(err, kube::Error::Api(_)),
        "refused during the TLS handshake, not answered by the API: {err:?}"
    );
    assert!(
        get(trusted, name).await.is_none(),
        "the refused request must not have reached the server"
    );
    chain(&err)
}

/// The server's TLS alert, or (should the server's close overtake it) a reset connection.
fn assert_tls_refusal(reason: &str, alert: &str) {
    assert!(
        reason.contains(&format!("received fatal alert: {alert}"))
            || reason.contains("reset by peer"),
        "expected the server's {alert} alert: {reason}"
    );
}

fn socket_addr(server: &TestApiServer) -> SocketAddr {
    server
        .url()
        .strip_prefix("https://")
        .expect("https URL")
        .parse()
        .unwrap()
}

fn base64(text: &str) -> String {
    serde_json::to_value(k8s_openapi::ByteString(text.as_bytes().to_vec()))
        .unwrap()
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn client_signed_by_the_client_ca_creates_reads_and_watches() {
    let pki = pki();
    let mut tls = mutual(&pki);
    tls.client_identity = Some((pki.client.cert_pem.clone(), pki.client.key_pem.clone()));
    let server = start(tls).await;
    assert!(
        server.url().starts_with("https://127.0.0.1:"),
        "{}",
        server.url()
    );

    let kubeconfig = server.kubeconfig();
    let cluster = kubeconfig.clusters[0].cluster.as_ref().unwrap();
    assert_eq!(cluster.server.as_deref(), Some(server.url().as_str()));
    assert_eq!(
        cluster.certificate_authority_data.as_deref(),
        Some(base64(&pki.server_ca.pair.cert_pem).as_str())
    );
    let user = kubeconfig.auth_infos[0].auth_info.as_ref().unwrap();
    assert_eq!(
        user.client_certificate_data.as_deref(),
        Some(base64(&pki.client.cert_pem).as_str())
    );
    assert!(user.client_key_data.is_some());

    // Both ways of getting a client: the kubeconfig (as the controller does) and client().
    for (client, name) in [
        (client_from(&kubeconfig), "from-kubeconfig"),
        (server.client(), "from-client"),
    ] {
        let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
        let mut events = Box::pin(
            tokio::time::timeout(DEADLINE, cms.watch(&WatchParams::default(), "0"))
                .await
                .unwrap()
                .unwrap(),
        );
        create(&client, name).await.unwrap();
        let read = get(&client, name).await.expect("the ConfigMap was stored");
        assert_eq!(read.data, config_map(name).data);
        let seen = tokio::time::timeout(DEADLINE, async {
            while let Some(event) = events.next().await {
                if let Ok(WatchEvent::Added(cm)) = event
                    && cm.metadata.name.as_deref() == Some(name)
                {
                    return true;
                }
            }
            false
        })
        .await;
        assert_eq!(seen, Ok(true), "the watch delivers ADDED for {name}");
    }
    tokio::time::timeout(DEADLINE, server.shutdown())
        .await
        .expect("shutdown completes");
}

#[tokio::test]
async fn client_without_certificate_is_refused() {
    let pki = pki();
    let server = start(mutual(&pki)).await;
    let trusted =
        client_from(&server.kubeconfig_with_identity(&pki.client.cert_pem, &pki.client.key_pem));
    // server.client() presents no certificate: no client_identity was given.
    let refused = create(&server.client(), "anonymous").await;
    let reason = assert_refused(refused, "anonymous", &trusted).await;
    assert_tls_refusal(&reason, "CertificateRequired");
    create(&trusted, "trusted")
        .await
        .expect("a certified client gets in");
}

#[tokio::test]
async fn client_signed_by_another_ca_is_refused() {
    let pki = pki();
    let server = start(mutual(&pki)).await;
    let trusted =
        client_from(&server.kubeconfig_with_identity(&pki.client.cert_pem, &pki.client.key_pem));
    // Signed by the server CA: trusted for serving, not for clients.
    for other_ca in [TestCa::new("another-client-ca"), pki.server_ca] {
        let stranger = client_cert(&other_ca);
        let client =
            client_from(&server.kubeconfig_with_identity(&stranger.cert_pem, &stranger.key_pem));
        let refused = create(&client, "stranger").await;
        let reason = assert_refused(refused, "stranger", &trusted).await;
        assert_tls_refusal(&reason, "UnknownCA");
    }
    create(&trusted, "trusted")
        .await
        .expect("a certified client gets in");
}

#[tokio::test]
async fn client_trusting_another_server_ca_cannot_connect() {
    let pki = pki();
    let server = start(mutual(&pki)).await;
    let mut kubeconfig = server.kubeconfig_with_identity(&pki.client.cert_pem, &pki.client.key_pem);
    create(&client_from(&kubeconfig), "with-the-right-ca")
        .await
        .expect("the kubeconfig as given works");

    let other = TestCa::new("another-server-ca");
    kubeconfig.clusters[0]
        .cluster
        .as_mut()
        .unwrap()
        .certificate_authority_data = Some(base64(&other.pair.cert_pem));
    let err = create(&client_from(&kubeconfig), "with-another-ca")
        .await
        .expect_err("the server's chain does not lead to the trusted CA");
    let reason = chain(&err);
    assert!(reason.contains("UnknownIssuer"), "{reason}");
}

#[tokio::test]
async fn server_certificate_without_the_loopback_ip_is_rejected() {
    let pki = pki();
    let mut tls = mutual(&pki);
    let wrong_name = serving_cert(
        &pki.server_ca,
        &[
            SanType::DnsName("kubernetes".try_into().unwrap()),
            SanType::IpAddress(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))),
        ],
    );
    tls.cert_pem = wrong_name.cert_pem;
    tls.key_pem = wrong_name.key_pem;
    let server = start(tls).await;
    let client =
        client_from(&server.kubeconfig_with_identity(&pki.client.cert_pem, &pki.client.key_pem));
    let err = create(&client, "to-the-wrong-name")
        .await
        .expect_err("the serving certificate is not valid for 127.0.0.1");
    let reason = chain(&err);
    assert!(
        reason.contains("not valid for name \"127.0.0.1\""),
        "{reason}"
    );
}

#[tokio::test]
async fn listener_serves_on_the_pre_bound_port() {
    let pki = pki();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = TestApiServer::builder()
        .with_core_resources()
        .listener(listener)
        .tls(mutual(&pki))
        .start()
        .await
        .unwrap();
    assert_eq!(server.url(), format!("https://127.0.0.1:{port}"));
    let client =
        client_from(&server.kubeconfig_with_identity(&pki.client.cert_pem, &pki.client.key_pem));
    create(&client, "on-the-port").await.unwrap();
    assert!(get(&client, "on-the-port").await.is_some());
}

#[tokio::test]
async fn without_client_ca_a_client_without_certificate_works() {
    let pki = pki();
    let mut tls = mutual(&pki);
    tls.client_ca_pem = None;
    let server = start(tls).await;
    let kubeconfig = server.kubeconfig();
    let user = kubeconfig.auth_infos[0].auth_info.as_ref().unwrap();
    assert!(user.client_certificate_data.is_none() && user.client_key_data.is_none());
    create(&server.client(), "anonymous")
        .await
        .expect("no client certificate is asked for");
    assert!(get(&client_from(&kubeconfig), "anonymous").await.is_some());
}

#[tokio::test]
async fn a_stalled_handshake_does_not_hold_up_other_clients() {
    let pki = pki();
    let server = start(mutual(&pki)).await;
    // Connected but silent: its handshake waits for a ClientHello that never comes.
    let mut silent = Vec::new();
    for _ in 0..3 {
        silent.push(
            tokio::net::TcpStream::connect(socket_addr(&server))
                .await
                .unwrap(),
        );
    }
    let client =
        client_from(&server.kubeconfig_with_identity(&pki.client.cert_pem, &pki.client.key_pem));
    // Well under the server's 10 s handshake timeout.
    tokio::time::timeout(Duration::from_secs(5), create(&client, "not-held-up"))
        .await
        .expect("served while other handshakes are pending")
        .unwrap();
    drop(silent);
}

#[tokio::test]
async fn shutdown_ends_open_watches_and_closes_the_port() {
    let pki = pki();
    let server = start(mutual(&pki)).await;
    let addr = socket_addr(&server);
    let client =
        client_from(&server.kubeconfig_with_identity(&pki.client.cert_pem, &pki.client.key_pem));
    let cms: Api<ConfigMap> = Api::default_namespaced(client);
    let mut events = Box::pin(cms.watch(&WatchParams::default(), "0").await.unwrap());
    tokio::time::timeout(Duration::from_secs(30), async {
        server.shutdown().await;
        while let Some(Ok(_)) = events.next().await {}
    })
    .await
    .expect("shutdown completes and the watch ends");
    let refused = tokio::time::timeout(DEADLINE, async {
        while tokio::net::TcpStream::connect(addr).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(refused.is_ok(), "the port is closed after shutdown");
}

#[tokio::test]
async fn debug_prints_no_key_material() {
    let pki = pki();
    let mut tls = mutual(&pki);
    tls.client_identity = Some((pki.client.cert_pem.clone(), pki.client.key_pem.clone()));
    let printed = format!("{tls:?}");
    assert!(!printed.contains("PRIVATE KEY"), "{printed}");
    assert!(
        printed.contains("client_certificates_required: true"),
        "{printed}"
    );
}

#[tokio::test]
async fn bad_pem_fails_start_naming_the_field() {
    let pki = pki();
    for (field, tls) in [
        (
            "key_pem",
            ServerTls {
                key_pem: "not a key".into(),
                ..mutual(&pki)
            },
        ),
        (
            "client_ca_pem",
            ServerTls {
                client_ca_pem: Some(String::new()),
                ..mutual(&pki)
            },
        ),
        (
            "cert_pem and key_pem",
            ServerTls {
                key_pem: pki.client.key_pem.clone(),
                ..mutual(&pki)
            },
        ),
    ] {
        let err = TestApiServer::builder()
            .with_core_resources()
            .tls(tls)
            .start()
            .await
            .err()
            .expect("start refuses unusable TLS material");
        assert!(
            matches!(&err, Error::Tls { what, .. } if *what == field),
            "{field}: {err}"
        );
    }
}
