//! The conversion webhook over HTTPS with real `ConversionReview`s, both ways
//! and malformed; upstream-style samples of both versions (tests/fixtures/)
//! round-trip; and, when `KUBECONFIG` points at a real API server, a v1beta1
//! object applied there is read back as v1beta2 and the reverse.

use crate::docker_support;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;

use k3s_control_plane::api::conversion::{KnownApiVersions, V1BETA1, V1BETA2, V1BETA3};
use k3s_control_plane::harness::{CertPair, TestCa};
use k3s_control_plane::webhook::Webhook;
use rcgen::{ExtendedKeyUsagePurpose, SanType};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

fn convert(
    object: &Value,
    desired: &str,
) -> Result<Value, k3s_control_plane::api::conversion::ConversionError> {
    k3s_control_plane::api::conversion::convert(object, desired, &KnownApiVersions::new())
}

fn fixture(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    k3s_control_plane::yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// A webhook on 127.0.0.1 with a certificate from a new CA; the CA's PEM.
async fn webhook(dir: &Path) -> (SocketAddr, String, CancellationToken) {
    k3s_control_plane::install_crypto_provider();
    let ca = TestCa::new("webhook-ca");
    let serving: CertPair = ca.issue(
        "k3s-control-plane-webhook-service.k3s-control-plane-system.svc",
        &[SanType::IpAddress(Ipv4Addr::LOCALHOST.into())],
        &[ExtendedKeyUsagePurpose::ServerAuth],
    );
    std::fs::write(dir.join("tls.crt"), &serving.cert_pem).unwrap();
    std::fs::write(dir.join("tls.key"), &serving.key_pem).unwrap();
    let webhook = Webhook::bind("127.0.0.1:0".parse().unwrap(), dir)
        .await
        .unwrap();
    let addr = webhook.local_addr().unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(webhook.serve(stop.clone()));
    (addr, ca.pair.cert_pem.clone(), stop)
}

/// POST `body` to `https://addr/convert`, verifying the server against `ca`.
async fn post(addr: SocketAddr, ca: &str, body: &[u8]) -> (u16, Value) {
    let mut roots = rustls::RootCertStore::empty();
    for cert in k3s_control_plane::pki::pem::certificates(ca.as_bytes()).unwrap() {
        roots.add(cert).unwrap();
    }
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut tls = connector.connect(name, tcp).await.expect("TLS verified");
    let head = format!(
        "POST /convert HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).await.unwrap();
    tls.write_all(body).await.unwrap();
    let mut response = Vec::new();
    let _ = tls.read_to_end(&mut response).await;
    let text = String::from_utf8(response).unwrap();
    let status: u16 = text[9..12].parse().unwrap();
    let (_, body) = text.split_once("\r\n\r\n").unwrap();
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

fn review(desired: &str, objects: Vec<Value>) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
        "request": {"uid": "0f1e2d3c", "desiredAPIVersion": desired, "objects": objects},
    }))
    .unwrap()
}

#[tokio::test]
async fn the_webhook_converts_a_real_conversion_review_both_ways_over_https() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, ca, stop) = webhook(dir.path()).await;
    let upstream = fixture("upstream-kcp-v1beta1.yaml");

    let (status, answer) = post(addr, &ca, &review(V1BETA2, vec![upstream.clone()])).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["kind"], "ConversionReview");
    assert_eq!(answer["response"]["uid"], "0f1e2d3c");
    assert_eq!(
        answer["response"]["result"]["status"], "Success",
        "{answer}"
    );
    let stored = answer["response"]["convertedObjects"][0].clone();
    assert_eq!(stored["apiVersion"], V1BETA2);
    assert_eq!(
        stored["spec"]["machineTemplate"]["infrastructureRef"],
        upstream["spec"]["infrastructureTemplate"]
    );

    let (status, answer) = post(addr, &ca, &review(V1BETA1, vec![stored])).await;
    assert_eq!(status, 200);
    assert_eq!(
        answer["response"]["convertedObjects"][0], upstream,
        "round trip"
    );

    // An object that cannot be converted: a Failure naming it and the field.
    let mut bad = upstream.clone();
    bad["spec"]["rolloutStrategy"] = json!({"type": "RollingUpdate"});
    let (status, answer) = post(addr, &ca, &review(V1BETA2, vec![bad])).await;
    assert_eq!(status, 200);
    assert_eq!(answer["response"]["result"]["status"], "Failure");
    let message = answer["response"]["result"]["message"].as_str().unwrap();
    assert!(message.contains("spec.rolloutStrategy"), "{message}");

    // Not a ConversionReview at all.
    let (status, answer) = post(addr, &ca, b"{\"kind\": \"Pod\"}").await;
    assert_eq!(status, 400, "{answer}");
    stop.cancel();
}

#[test]
fn upstream_samples_of_both_versions_round_trip_through_every_version() {
    for (name, version) in [
        ("upstream-kcp-v1beta1.yaml", V1BETA1),
        ("upstream-kcp-v1beta2.yaml", V1BETA2),
        ("upstream-kcp-template-v1beta2.yaml", V1BETA2),
    ] {
        let sample = fixture(name);
        assert_eq!(sample["apiVersion"], version, "{name}");
        let others: &[&str] = if sample["kind"] == "KThreesControlPlaneTemplate" {
            &[V1BETA3]
        } else {
            &[V1BETA1, V1BETA2, V1BETA3]
        };
        for other in others {
            let there = convert(&sample, other).unwrap();
            assert_eq!(there["apiVersion"], *other, "{name}");
            assert_eq!(
                convert(&there, version).unwrap(),
                sample,
                "{name}: round trip through {other}"
            );
        }
        // Whatever it was written as, it is stored as an object we can read.
        let stored = convert(&sample, V1BETA3).unwrap();
        if sample["kind"] == "KThreesControlPlane" {
            let kcp: k3s_control_plane::api::KThreesControlPlane =
                serde_json::from_value(stored).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(kcp.infrastructure_ref().is_some(), "{name}");
        } else {
            let _: k3s_control_plane::api::KThreesControlPlaneTemplate =
                serde_json::from_value(stored).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }
}

/// cluster-api-k3s users' YAML applies unchanged, as `kubectl apply
/// --server-side` sends it, to a management server storing v1beta3 (the
/// test API server, converting with our conversion as the real one calls our
/// webhook): each sample reads back in its own version as written, and is
/// stored as a v1beta3 object the controller reads.
#[tokio::test]
async fn upstream_yaml_of_both_versions_applies_unchanged() {
    use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
    let server = k3s_control_plane::harness::sandbox::management_server()
        .await
        .unwrap();
    for name in [
        "upstream-kcp-v1beta1.yaml",
        "upstream-kcp-v1beta2.yaml",
        "upstream-kcp-template-v1beta2.yaml",
    ] {
        let sample = fixture(name);
        let (group, version) = sample["apiVersion"]
            .as_str()
            .unwrap()
            .split_once('/')
            .unwrap();
        let kind = sample["kind"].as_str().unwrap();
        let api = |version: &str| {
            Api::<DynamicObject>::namespaced_with(
                server.client(),
                sample["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or("default"),
                &ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind)),
            )
        };
        let object_name = sample["metadata"]["name"].as_str().unwrap();
        api(version)
            .patch(
                object_name,
                &PatchParams::apply("kubectl").force(),
                &Patch::Apply(&sample),
            )
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let back = serde_json::to_value(api(version).get(object_name).await.unwrap()).unwrap();
        assert_eq!(back["spec"], sample["spec"], "{name}: read back as written");
        let stored = serde_json::to_value(api("v1beta3").get(object_name).await.unwrap()).unwrap();
        assert_eq!(stored["apiVersion"], V1BETA3, "{name}");
        if kind == "KThreesControlPlane" {
            let kcp: k3s_control_plane::api::KThreesControlPlane =
                serde_json::from_value(stored).unwrap();
            let infra = kcp
                .infrastructure_ref()
                .expect("the infrastructure reference");
            assert_eq!(infra.api_group, "infrastructure.cluster.x-k8s.io", "{name}");
            api("v1beta3")
                .delete(object_name, &Default::default())
                .await
                .unwrap();
        }
    }
}

/// Against a real API server, when `KUBECONFIG` is set: the CRD with its
/// webhook at this test's own HTTPS address (`url` + `caBundle`, as a Service
/// would be reached in a cluster), a v1beta1 object applied and read back as
/// v1beta2, and a v1beta2 object read as v1beta1.
#[tokio::test]
async fn api_server_converts_through_the_webhook() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{
        Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams,
        PostParams,
    };
    use kube::runtime::wait::{await_condition, conditions};
    // Not beside the other tests that change the real API server's CRDs
    // (crate::REAL_API_SERVER says why).
    let _serial = crate::REAL_API_SERVER.lock().await;

    if std::env::var_os("KUBECONFIG").is_none() {
        docker_support::skip(
            "api_server_converts_through_the_webhook",
            "KUBECONFIG is not set, no real API server to ask (none can be installed here)",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (addr, ca, stop) = webhook(dir.path()).await;
    let client = kube::Client::try_default()
        .await
        .expect("client from KUBECONFIG");
    let mut crd = k3s_control_plane::api::crds::ours()
        .into_iter()
        .find(|c| c.spec.names.kind == "KThreesControlPlane")
        .unwrap();
    let hook = crd
        .spec
        .conversion
        .as_mut()
        .unwrap()
        .webhook
        .as_mut()
        .unwrap();
    let config = hook.client_config.as_mut().unwrap();
    config.service = None;
    config.url = Some(format!("https://{addr}/convert"));
    config.ca_bundle = Some(k8s_openapi::ByteString(ca.into_bytes()));
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd_name = crd.metadata.name.clone().unwrap();
    // Whoever installed the CRD (`kubectl apply -f crds/`) co-owns its
    // `clientConfig.service`: an apply without it would leave it beside our
    // `url`, which the server refuses ("exactly one of url or service").
    // Swap it for our address with a merge patch first (no CRD yet: nothing
    // to swap); the apply below then owns `url` and `caBundle`.
    let url = config.url.clone().unwrap();
    let ca_bundle = serde_json::to_value(config.ca_bundle.as_ref().unwrap()).unwrap();
    match crds
        .patch(
            &crd_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"conversion": {"webhook": {"clientConfig":
                {"service": null, "url": url, "caBundle": ca_bundle}}}}})),
        )
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.is_not_found() => {}
        Err(e) => panic!("point the CRD's webhook at this test: {e}"),
    }
    crds.patch(
        &crd_name,
        &PatchParams::apply("k3s-control-plane-tests").force(),
        &Patch::Apply(&crd),
    )
    .await
    .expect("apply CRD");
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        await_condition(crds.clone(), &crd_name, conditions::is_crd_established()),
    )
    .await
    .expect("CRD established")
    .unwrap();

    let api = |version: &str| {
        let gvk = GroupVersionKind::gvk(
            "controlplane.cluster.x-k8s.io",
            version,
            "KThreesControlPlane",
        );
        Api::<DynamicObject>::namespaced_with(
            client.clone(),
            "default",
            &ApiResource::from_gvk(&gvk),
        )
    };
    let v1 = api("v1beta1");
    let v2 = api("v1beta2");
    let upstream = fixture("upstream-kcp-v1beta1.yaml");
    let name = upstream["metadata"]["name"].as_str().unwrap().to_string();
    let _ = v2.delete(&name, &DeleteParams::default()).await;
    let object: DynamicObject = serde_json::from_value(upstream.clone()).unwrap();
    // The CRD's new webhook configuration may take a moment to be used.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match v1.create(&PostParams::default(), &object).await {
            Ok(_) => break,
            Err(e) if tokio::time::Instant::now() < deadline => {
                eprintln!("create as v1beta1: {e}; retrying");
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            Err(e) => panic!("create as v1beta1: {e}"),
        }
    }
    let stored = serde_json::to_value(v2.get(&name).await.expect("read as v1beta2")).unwrap();
    assert_eq!(stored["apiVersion"], V1BETA2);
    assert_eq!(
        stored["spec"]["machineTemplate"]["infrastructureRef"],
        upstream["spec"]["infrastructureTemplate"]
    );
    assert_eq!(
        stored["spec"]["rolloutAfter"],
        upstream["spec"]["upgradeAfter"]
    );
    assert_eq!(
        stored["spec"]["machineTemplate"]["nodeDrainTimeout"],
        upstream["spec"]["nodeDrainTimeout"]
    );
    // Our CRD defaults applied on the way in (upstream's defaulting).
    assert_eq!(
        stored["spec"]["kthreesConfigSpec"]["serverConfig"]["cloudProviderName"],
        "external"
    );
    // A v1beta2-only field set, then read as v1beta1: kept in conversion-data
    // and back in v1beta2 after a v1beta1 write.
    v2.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"rolloutBefore": {"certificatesExpiryDays": 21}}})),
    )
    .await
    .expect("set a v1beta2-only field");
    let served = v1.get(&name).await.expect("read as v1beta1");
    let served_json = serde_json::to_value(&served).unwrap();
    assert_eq!(served_json["apiVersion"], V1BETA1);
    assert!(
        served_json["spec"].get("rolloutBefore").is_none(),
        "{served_json}"
    );
    v1.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 3}})),
    )
    .await
    .expect("write as v1beta1");
    let stored = serde_json::to_value(v2.get(&name).await.unwrap()).unwrap();
    assert_eq!(stored["spec"]["replicas"], 3);
    assert_eq!(
        stored["spec"]["rolloutBefore"]["certificatesExpiryDays"], 21,
        "{stored}"
    );
    v2.delete(&name, &DeleteParams::default()).await.unwrap();

    // Put the CRD back as shipped, so other tests on this server see it
    // (the merge patch above co-owns `url`: swap it back the same way).
    let shipped = k3s_control_plane::api::crds::ours()
        .into_iter()
        .find(|c| c.spec.names.kind == "KThreesControlPlane")
        .unwrap();
    let service = serde_json::to_value(
        &shipped
            .spec
            .conversion
            .as_ref()
            .unwrap()
            .webhook
            .as_ref()
            .unwrap()
            .client_config
            .as_ref()
            .unwrap()
            .service,
    )
    .unwrap();
    crds.patch(
        &crd_name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"conversion": {"webhook": {"clientConfig":
            {"service": service, "url": null, "caBundle": null}}}}})),
    )
    .await
    .expect("point the CRD's webhook back at its Service");
    crds.patch(
        &crd_name,
        &PatchParams::apply("k3s-control-plane-tests").force(),
        &Patch::Apply(&shipped),
    )
    .await
    .expect("restore CRD");
    stop.cancel();
}
