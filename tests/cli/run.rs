//! `k3s-control-plane run` as a process: its probes say whether the management
//! API serves our kind, and its metrics count reconciles.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k3s_control_plane::api::KThreesControlPlane;
use k3s_control_plane::apiserver::TestApiServer;
use k3s_control_plane::harness::sandbox::management_server;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Controller(Child);

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start(server: &TestApiServer, dir: &tempfile::TempDir) -> (Controller, String) {
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        k3s_control_plane::yaml::to_string(&server.kubeconfig()).unwrap(),
    )
    .unwrap();
    let probes = format!("127.0.0.1:{}", free_port());
    let child = Command::new(env!("CARGO_BIN_EXE_k3s-control-plane"))
        .args([
            "run",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--probe-address",
            &probes,
        ])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    (Controller(child), probes)
}

/// Status code and body of GET `path`, or None while nothing listens.
async fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: probes\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let code = response.get(9..12)?.parse().ok()?;
    Some((code, response))
}

async fn wait_for_code(addr: &str, path: &str, code: u16) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = get(addr, path).await;
        if let Some((c, body)) = &got
            && *c == code
        {
            return body.clone();
        }
        assert!(
            Instant::now() < deadline,
            "{path} never answered {code}: {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn ready_once_the_management_api_serves_our_kind_and_metrics_count_reconciles() {
    let server = management_server().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (_controller, probes) = start(&server, &dir);
    wait_for_code(&probes, "/healthz", 200).await;
    wait_for_code(&probes, "/readyz", 200).await;

    // A control plane appears: it is reconciled, and the metrics say so.
    let kcp: KThreesControlPlane = serde_json::from_value(serde_json::json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta3", "kind": "KThreesControlPlane",
        "metadata": {"name": "cp", "namespace": "default"},
        "spec": {"replicas": 1, "version": "v1.30.2+k3s2",
                 "machineTemplate": {"spec": {"infrastructureRef": {"kind": "DockerMachineTemplate", "name": "t"}}}}
    }))
    .unwrap();
    let kcps: kube::Api<KThreesControlPlane> = kube::Api::namespaced(server.client(), "default");
    kcps.create(&Default::default(), &kcp).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, metrics) = get(&probes, "/metrics").await.expect("metrics answer");
        let reconciles = metrics
            .lines()
            .find_map(|l| l.strip_prefix("k3scp_reconciles_total "))
            .and_then(|n| n.trim().parse::<u64>().ok());
        if reconciles.is_some_and(|n| n >= 1) {
            break;
        }
        assert!(Instant::now() < deadline, "no reconcile counted: {metrics}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Without a Cluster owning it, the controller refuses to decide and says why.
    // The counter moves when a reconcile starts; its status lands a little later.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let status = kcps.get("cp").await.unwrap().status.unwrap_or_default();
        if let Some(c) = status.conditions.iter().find(|c| c.type_ == "Remediating") {
            assert!(c.message.contains("owner reference"), "{c:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no Remediating condition: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn not_ready_while_our_crd_is_not_installed() {
    // A management cluster without our CRDs: alive, but not ready.
    let server = TestApiServer::builder()
        .with_core_resources()
        .start()
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (_controller, probes) = start(&server, &dir);
    wait_for_code(&probes, "/healthz", 200).await;
    let body = wait_for_code(&probes, "/readyz", 503).await;
    assert!(
        body.contains("has not yet answered for KThreesControlPlanes"),
        "{body}"
    );
}
