//! Against a real k3s server with embedded etcd (`rancher/k3s` through
//! testcontainers): our engine reads the membership over verified mutual TLS
//! with the certificates k3s generated, and our mapping pairs the member with
//! the Node by the annotation k3s itself writes.
//!
//! Needs Docker and the `rancher/k3s` image already present locally (there is
//! no registry on the project's machines): otherwise the test prints why it is
//! skipped and passes.

use crate::docker_support;

use std::process::Command;
use std::time::{Duration, Instant};

use k3s_control_plane::etcd::{ClientTls, EtcdCluster};
use k3s_control_plane::membership::{MachineRef, MatchRule, MemberRef, map_members};
use k3s_control_plane::workload::nodes::list_control_plane_nodes;
use testcontainers::core::{ContainerPort, ExecCommand};
use testcontainers::runners::AsyncRunner;
use testcontainers::{Image, ImageExt};
use testcontainers_modules::k3s::K3s;

/// Why the test cannot run here, if it cannot.
fn skip_reason(image: &str) -> Option<String> {
    match Command::new("docker")
        .args(["image", "inspect", image])
        .output()
    {
        Err(e) => Some(format!("docker is not available ({e})")),
        Ok(out) if !out.status.success() => Some(format!(
            "image {image} is not present locally and no registry can be reached; `docker load` it to run this test"
        )),
        Ok(_) => None,
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn read_file(container: &testcontainers::ContainerAsync<K3s>, path: &str) -> Vec<u8> {
    let mut result = container
        .exec(ExecCommand::new(["cat", path]))
        .await
        .unwrap_or_else(|e| panic!("cat {path} in the k3s container: {e}"));
    result.stdout_to_vec().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_k3s_embedded_etcd_is_read_and_mapped_to_its_node() {
    k3s_control_plane::install_crypto_provider();
    let probe = K3s::default();
    let image = format!("{}:{}", probe.name(), probe.tag());
    if let Some(reason) = skip_reason(&image) {
        docker_support::skip(
            "real_k3s_embedded_etcd_is_read_and_mapped_to_its_node",
            &reason,
        );
        return;
    }
    let conf = tempfile::tempdir().unwrap();
    let etcd_port = free_port();
    let container = K3s::default()
        .with_conf_mount(conf.path())
        .with_cmd([
            "server",
            "--cluster-init",
            "--snapshotter=native",
            "--disable=traefik",
        ])
        .with_mapped_port(etcd_port, ContainerPort::Tcp(2379))
        .with_privileged(true)
        .with_userns_mode("host")
        .with_startup_timeout(Duration::from_secs(180))
        .start()
        .await
        .expect("k3s container starts");

    let dir = "/var/lib/rancher/k3s/server/tls/etcd";
    let ca = read_file(&container, &format!("{dir}/server-ca.crt")).await;
    let cert = read_file(&container, &format!("{dir}/client.crt")).await;
    let key = read_file(&container, &format!("{dir}/client.key")).await;
    let tls = ClientTls::from_pem(
        ("server-ca.crt", &ca),
        ("client.crt", &cert),
        ("client.key", &key),
    )
    .unwrap();
    // k3s's serving certificate carries 127.0.0.1: the server name is verified.
    let etcd = EtcdCluster::new(&[format!("https://127.0.0.1:{etcd_port}")], tls).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let snapshot = loop {
        match etcd.snapshot().await {
            Ok(s) if s.leader.is_some() => break s,
            _ if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(500)).await,
            other => panic!("no etcd snapshot from k3s: {other:?}"),
        }
    };
    assert_eq!(snapshot.members.len(), 1, "{snapshot:?}");
    let member = &snapshot.members[0];
    assert!(
        k3s_control_plane::membership::node_of_member_name(&member.name).is_some(),
        "k3s names members <node>-<8 hex>: {}",
        member.name
    );

    // The Node k3s registered carries the exact member name.
    let kubeconfig = container.image().read_kube_config().unwrap();
    let api_port = container.get_host_port_ipv4(6443).await.unwrap();
    let kubeconfig = kubeconfig.replace(":6443", &format!(":{api_port}"));
    let config = kube::config::Kubeconfig::from_yaml(&kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(config, &Default::default())
        .await
        .unwrap();
    // The controller's reads: over HTTP/2, which k3s's API server speaks.
    let reads = k3s_control_plane::workload::reads::workload_reads(config).unwrap();
    let nodes = list_control_plane_nodes(&reads, "k3s-container", &[])
        .await
        .unwrap();
    assert!(reads.over_h2(), "k3s's API server agreed on HTTP/2");
    assert_eq!(nodes.len(), 1);
    let node = &nodes[0];
    assert_eq!(node.etcd_member_name.as_deref(), Some(member.name.as_str()));

    let machines = vec![MachineRef {
        machine: "m0".into(),
        node_name: Some(node.name.clone()),
        addresses: node.internal_ips.iter().map(ToString::to_string).collect(),
        node_annotations: [(
            "etcd.k3s.cattle.io/node-name".to_string(),
            node.etcd_member_name.clone().unwrap_or_default(),
        )]
        .into(),
    }];
    let members = vec![MemberRef {
        id: member.id,
        name: member.name.clone(),
        peer_urls: member.peer_urls.clone(),
    }];
    let map = map_members(&machines, &members);
    assert_eq!(map.pairs.len(), 1, "{map:?}");
    assert_eq!(map.pairs[0].rule, MatchRule::NodeAnnotation);
}
