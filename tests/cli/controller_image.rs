//! The controller image: built with hack/image.sh from the repository's
//! Dockerfile (`FROM scratch`, the binary and the libraries it links, USER
//! 65532), then run as a container with a read-only root filesystem against
//! the in-process management API server (over mutual TLS). It must come up:
//! answer its probes, take the leader Lease and write a KThreesControlPlane's
//! status.
//!
//! The image staged here holds a debug build of the shipped binary (no
//! `sandbox` feature; a cold release build takes minutes on 2 cores; see
//! docs/operations.md for the release image). Skipped, with the reason printed, only where no Docker
//! engine answers.

use crate::docker_support;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::{Duration, Instant};

use docker_support::{ContainerGuard, docker, image_size, run_suffix};
use k3s_control_plane::api::KThreesControlPlane;
use k3s_control_plane::apiserver::{ServerTls, TestApiServer};
use k3s_control_plane::harness::TestCa;
use k3s_control_plane::harness::sandbox::management_builder;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use rcgen::{ExtendedKeyUsagePurpose, SanType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const IMAGE: &str = "k3s-control-plane:test";

/// The controller as shipped: the `k3s-control-plane-shipped` package
/// (hack/shipped), `src/main.rs` over the library built without the
/// `sandbox` feature (no test API server, no simulated world, no `demo`).
/// Built once per run, in this target directory: only the library and the
/// binary compile, the dependencies are the tests' own, and the sandbox
/// binary the other tests run keeps its name.
fn shipped_binary() -> &'static std::path::Path {
    static BUILT: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    BUILT.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let t0 = Instant::now();
        let out = Command::new(cargo)
            .args(["build", "-p", "k3s-control-plane-shipped"])
            .arg("--message-format=json-render-diagnostics")
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .expect("run cargo build");
        assert!(
            out.status.success(),
            "cargo build -p k3s-control-plane-shipped failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!("shipped binary built in {:.1?}", t0.elapsed());
        // Where cargo put it (CARGO_TARGET_DIR may move the target directory).
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|m| m["target"]["name"] == "k3s-control-plane-shipped")
            .find_map(|m| m["executable"].as_str().map(std::path::PathBuf::from))
            .expect("cargo build reported no k3s-control-plane-shipped executable")
    })
}

/// The binary's symbol names (demangled), from `nm`.
fn symbols(binary: &std::path::Path) -> String {
    let out = Command::new("nm")
        .args(["--demangle", "--defined-only"])
        .arg(binary)
        .output()
        .expect("run nm (binutils)");
    assert!(out.status.success(), "nm {}", binary.display());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The shipped controller has no `demo` command and links none of the test
/// infrastructure; the binary the tests run (default features) has both, so
/// the checks can tell.
#[test]
fn the_shipped_binary_has_no_demo_and_links_no_test_infrastructure() {
    let shipped = shipped_binary();
    let help = |binary: &std::path::Path| {
        let out = Command::new(binary).arg("--help").output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let tests_binary = std::path::Path::new(env!("CARGO_BIN_EXE_k3s-control-plane"));
    assert!(
        help(tests_binary).contains("demo"),
        "{}",
        help(tests_binary)
    );
    let shipped_help = help(shipped);
    assert!(
        shipped_help.contains("run") && !shipped_help.contains("demo"),
        "{shipped_help}"
    );
    let test_infrastructure = [
        "k3s_control_plane::apiserver::",
        "k3s_control_plane::harness::",
        "k3s_control_plane::cli::demo::",
    ];
    let with = symbols(tests_binary);
    let without = symbols(shipped);
    for module in test_infrastructure {
        assert!(
            with.contains(module),
            "the tests' binary has no {module} symbol"
        );
        let found: Vec<&str> = without
            .lines()
            .filter(|l| l.contains(module))
            .take(3)
            .collect();
        assert!(
            found.is_empty(),
            "the shipped binary links {module}: {found:?}"
        );
    }
    assert!(without.contains("k3s_control_plane::controller::"));
    let size = |p: &std::path::Path| std::fs::metadata(p).unwrap().len() as f64 / 1e6;
    eprintln!(
        "binary size (debug): {:.1} MB with the sandbox, {:.1} MB shipped",
        size(tests_binary),
        size(shipped)
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The management API as `harness::sandbox::management_builder` serves it, but
/// over mutual TLS, as a real one: a serving certificate for 127.0.0.1 from its
/// own CA, client certificates required; the kubeconfig carries the CA and a
/// client identity, so the container trusts nothing else.
async fn management_server_tls() -> TestApiServer {
    let server_ca = TestCa::new("mgmt-server-ca");
    let client_ca = TestCa::new("mgmt-client-ca");
    let serving = server_ca.issue(
        "kube-apiserver",
        &[SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into())],
        &[ExtendedKeyUsagePurpose::ServerAuth],
    );
    let client = client_ca.issue(
        "k3s-control-plane",
        &[],
        &[ExtendedKeyUsagePurpose::ClientAuth],
    );
    management_builder()
        .tls(ServerTls {
            ca_pem: server_ca.pair.cert_pem.clone(),
            cert_pem: serving.cert_pem,
            key_pem: serving.key_pem,
            client_ca_pem: Some(client_ca.pair.cert_pem.clone()),
            client_identity: Some((client.cert_pem, client.key_pem)),
        })
        .start()
        .await
        .expect("management API server")
}

/// Status code of GET `path`, or None while nothing listens.
async fn get_code(addr: &str, path: &str) -> Option<u16> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: probes\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    response.get(9..12)?.parse().ok()
}

/// Poll `check` every 100 ms until it yields, or panic with `what` and the logs.
async fn wait_for<T, F, Fut>(what: &str, container: &ContainerGuard, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let last = match check().await {
            Ok(value) => return value,
            Err(why) => why,
        };
        assert!(
            Instant::now() < deadline,
            "{what}: not within 30s: {last}\ncontainer running: {}\n{}",
            container.running(),
            container.logs_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_runs_the_controller_non_root_on_a_read_only_root() {
    if let Some(reason) = docker_support::skip_reason() {
        docker_support::skip(
            "the_image_runs_the_controller_non_root_on_a_read_only_root",
            &reason,
        );
        return;
    }
    // The image this run replaces is removed afterwards, so that reruns do
    // not pile up dangling images.
    let previous = docker(&["image", "inspect", "--format", "{{.Id}}", IMAGE]).ok();
    let t0 = Instant::now();
    let built = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/hack/image.sh"))
        .arg(IMAGE)
        .env("IMAGE_BINARY", shipped_binary())
        .output()
        .expect("run hack/image.sh");
    assert!(
        built.status.success(),
        "hack/image.sh failed:\n{}{}",
        String::from_utf8_lossy(&built.stdout),
        String::from_utf8_lossy(&built.stderr)
    );
    // Its last step runs `--version` in the image.
    let stdout = String::from_utf8_lossy(&built.stdout);
    assert!(
        stdout.contains(env!("CARGO_PKG_VERSION")),
        "--version in the image: {stdout}"
    );
    let id = docker(&["image", "inspect", "--format", "{{.Id}}", IMAGE]).unwrap();
    if let Some(previous) = previous.filter(|p| *p != id) {
        let _ = docker(&["image", "rm", &previous]);
    }
    let size = image_size(IMAGE).unwrap();
    eprintln!(
        "containers: controller image {IMAGE} (debug binary) built in {:.2?}, {:.1} MB",
        t0.elapsed(),
        size as f64 / 1e6
    );
    let user = docker(&["image", "inspect", "--format", "{{.Config.User}}", IMAGE]).unwrap();
    assert_eq!(user, "65532:65532", "the image runs as non-root");

    k3s_control_plane::install_crypto_provider();
    let server = management_server_tls().await;
    assert!(server.url().starts_with("https://127.0.0.1:"));
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        k3s_control_plane::yaml::to_string(&server.kubeconfig()).unwrap(),
    )
    .unwrap();
    // Readable by the image's user (65532), which does not own it.
    std::fs::set_permissions(&kubeconfig, std::fs::Permissions::from_mode(0o644)).unwrap();
    let probes = format!("127.0.0.1:{}", free_port());
    let name = format!("k3scp-controller-{}", run_suffix());
    let container = ContainerGuard(name.clone());
    let t1 = Instant::now();
    docker(&[
        "run",
        "-d",
        "--name",
        &name,
        // The test API server listens on the host's loopback.
        "--network",
        "host",
        "--read-only",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--label",
        "org.k3scp.test=controller-image",
        "-v",
        &format!("{}:/etc/k3scp/kubeconfig:ro", kubeconfig.display()),
        "-e",
        "RUST_LOG=info",
        IMAGE,
        "run",
        "--kubeconfig",
        "/etc/k3scp/kubeconfig",
        "--probe-address",
        &probes,
    ])
    .unwrap_or_else(|e| panic!("start the controller container: {e}"));
    let inspected = docker(&[
        "inspect",
        "--format",
        "{{.Config.User}} {{.HostConfig.ReadonlyRootfs}}",
        &name,
    ])
    .unwrap();
    assert_eq!(inspected, "65532:65532 true");

    wait_for("/readyz answers 200", &container, || async {
        match get_code(&probes, "/readyz").await {
            Some(200) => Ok(()),
            other => Err(format!("/readyz: {other:?}")),
        }
    })
    .await;
    let leases: Api<Lease> = Api::namespaced(server.client(), "default");
    let holder = wait_for("the leader Lease taken", &container, || async {
        let lease = leases
            .get_opt("k3s-control-plane")
            .await
            .map_err(|e| e.to_string())?;
        lease
            .and_then(|l| l.spec?.holder_identity)
            .ok_or_else(|| "no holder yet".to_string())
    })
    .await;
    eprintln!(
        "containers: controller container ready and leading (Lease holder {holder}) {:.2?} after `docker run`",
        t1.elapsed()
    );

    // It reconciles: without an owning Cluster it says so in the status it writes.
    let kcp: KThreesControlPlane = serde_json::from_value(serde_json::json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta3", "kind": "KThreesControlPlane",
        "metadata": {"name": "cp", "namespace": "default"},
        "spec": {"replicas": 1, "version": "v1.30.2+k3s2",
                 "machineTemplate": {"spec": {"infrastructureRef": {"kind": "DockerMachineTemplate", "name": "t"}}}}
    }))
    .unwrap();
    let kcps: Api<KThreesControlPlane> = Api::namespaced(server.client(), "default");
    kcps.create(&Default::default(), &kcp).await.unwrap();
    let message = wait_for("a status written by the container", &container, || async {
        let status = kcps
            .get("cp")
            .await
            .map_err(|e| e.to_string())?
            .status
            .unwrap_or_default();
        status
            .conditions
            .iter()
            .find(|c| c.type_ == "Remediating")
            .map(|c| c.message.clone())
            .ok_or_else(|| format!("no Remediating condition: {status:?}"))
    })
    .await;
    assert!(message.contains("owner reference"), "{message}");
    assert!(container.running(), "{}", container.logs_tail());

    // A clean stop: SIGTERM, exit 0 within the grace period.
    docker(&["stop", "--time", "10", &name]).unwrap();
    let exit = docker(&["inspect", "--format", "{{.State.ExitCode}}", &name]).unwrap();
    assert_eq!(
        exit,
        "0",
        "exit code after SIGTERM\n{}",
        container.logs_tail()
    );
}
