//! Workload-cluster access on Secret and Node objects built here (no server):
//! kubeconfig and etcd CA parsing with errors that name Secret and key, the
//! per-cluster cache and its invalidation, control-plane Nodes and endpoints.

use crate::docker_support;

use std::collections::BTreeMap;
use std::sync::Arc;

use k3s_control_plane::workload::secrets::{etcd_access_from_secret, kubeconfig_from_secret};
use k3s_control_plane::workload::{
    ClusterKey, ClusterSecrets, ControlPlaneNode, Error, EtcdAccess, WorkloadCache,
    nodes::control_plane_nodes,
};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeStatus, Secret};
use kube::api::ObjectMeta;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};

const NS: &str = "team-a";

/// Recognizes the expected error variant.
type IsExpected = fn(&Error) -> bool;

fn secret(name: &str, rv: &str, data: &[(&str, &[u8])]) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            uid: Some(format!("uid-{name}")),
            resource_version: Some(rv.into()),
            ..Default::default()
        },
        type_: Some("cluster.x-k8s.io/secret".into()),
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.to_vec())))
                .collect::<BTreeMap<_, _>>(),
        ),
        ..Default::default()
    }
}

struct Ca {
    cert_pem: String,
    key_pem: String,
}

fn ca(name: &str) -> Ca {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    Ca {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}

fn leaf() -> Ca {
    let params = CertificateParams::new(vec!["etcd.example".to_string()]).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    Ca {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}

fn base64(bytes: &[u8]) -> String {
    // ByteString serializes as base64, which is what kubeconfig *-data fields hold.
    serde_json::to_value(ByteString(bytes.to_vec()))
        .unwrap()
        .as_str()
        .unwrap()
        .to_owned()
}

fn kubeconfig_yaml(server_ca: &Ca) -> String {
    format!(
        r#"apiVersion: v1
kind: Config
clusters:
- name: prod
  cluster:
    server: https://172.18.0.3:6443
    certificate-authority-data: {ca}
users:
- name: prod-admin
  user:
    token: SECRET-TOKEN-VALUE
contexts:
- name: prod-admin@prod
  context:
    cluster: prod
    user: prod-admin
current-context: prod-admin@prod
"#,
        ca = base64(server_ca.cert_pem.as_bytes())
    )
}

fn good_kubeconfig_secret(rv: &str) -> Secret {
    secret(
        "prod-kubeconfig",
        rv,
        &[("value", kubeconfig_yaml(&ca("server-ca")).as_bytes())],
    )
}

fn etcd_secret(rv: &str, ca: &Ca) -> Secret {
    secret(
        "prod-etcd",
        rv,
        &[
            ("tls.crt", ca.cert_pem.as_bytes()),
            ("tls.key", ca.key_pem.as_bytes()),
        ],
    )
}

fn install_crypto() {
    k3s_control_plane::install_crypto_provider();
}

#[tokio::test]
async fn kubeconfig_secret_gives_a_config_for_the_workload_server() {
    let config = kubeconfig_from_secret(&good_kubeconfig_secret("1"))
        .await
        .unwrap();
    assert_eq!(config.cluster_url.to_string(), "https://172.18.0.3:6443/");
    assert!(
        config.root_cert.is_some(),
        "CA from certificate-authority-data"
    );
}

#[tokio::test]
async fn bad_kubeconfig_secrets_give_typed_errors_naming_secret_and_key() {
    let not_yaml = secret(
        "prod-kubeconfig",
        "1",
        &[(
            "value",
            b"clusters: [ {server: SECRET-TOKEN-VALUE".as_slice(),
        )],
    );
    let wrong_key = secret(
        "prod-kubeconfig",
        "1",
        &[("kubeconfig", kubeconfig_yaml(&ca("x")).as_bytes())],
    );
    let no_context = secret(
        "prod-kubeconfig",
        "1",
        &[(
            "value",
            b"apiVersion: v1\nkind: Config\nclusters: []\n".as_slice(),
        )],
    );
    let binary = secret(
        "prod-kubeconfig",
        "1",
        &[("value", &[0xff, 0xfe, 0x00][..])],
    );
    let cases: [(&str, Secret, IsExpected); 4] = [
        ("not_yaml", not_yaml, |e| {
            matches!(e, Error::NotKubeconfig { .. })
        }),
        ("wrong_key", wrong_key, |e| {
            matches!(e, Error::KeyMissing { key: "value", .. })
        }),
        ("no_current_context", no_context, |e| {
            matches!(e, Error::KubeconfigUnusable { .. })
        }),
        ("binary_value", binary, |e| {
            matches!(e, Error::NotText { .. })
        }),
    ];
    for (name, s, is_expected) in cases {
        let err = kubeconfig_from_secret(&s).await.unwrap_err();
        assert!(is_expected(&err), "{name}: {err:?}");
        let text = err.to_string();
        assert!(text.contains("team-a/prod-kubeconfig"), "{name}: {text}");
        assert!(text.contains("\"value\""), "{name}: {text}");
        assert!(
            !text.contains("SECRET-TOKEN-VALUE"),
            "{name}: leaks content: {text}"
        );
    }
}

#[test]
fn missing_etcd_secret_means_no_etcd_access() {
    assert_eq!(etcd_access_from_secret(None).unwrap(), EtcdAccess::NoSecret);
}

#[test]
fn etcd_secret_gives_the_ca_and_debug_hides_the_key() {
    let ca = ca("etcd-ca");
    let EtcdAccess::Managed(got) = etcd_access_from_secret(Some(&etcd_secret("1", &ca))).unwrap()
    else {
        panic!("expected a managed etcd");
    };
    assert_eq!(got.cert_pem(), ca.cert_pem);
    assert_eq!(got.key_pem(), ca.key_pem);
    let debug = format!("{got:?}");
    assert!(debug.contains("<redacted>"), "{debug}");
    assert!(!debug.contains("PRIVATE KEY"), "{debug}");
    let key_body = ca.key_pem.lines().nth(1).unwrap();
    assert!(!debug.contains(key_body), "{debug}");
}

#[test]
fn bad_etcd_secrets_give_typed_errors_naming_secret_and_key() {
    let ca = ca("etcd-ca");
    let other = self::ca("other-ca");
    let leaf = leaf();
    let cases: Vec<(&str, Secret, &str, IsExpected)> = vec![
        (
            "ca_without_key",
            secret("prod-etcd", "1", &[("tls.crt", ca.cert_pem.as_bytes())]),
            "tls.key",
            |e| matches!(e, Error::CaKeyMissing { .. }),
        ),
        (
            "key_without_ca",
            secret("prod-etcd", "1", &[("tls.key", ca.key_pem.as_bytes())]),
            "tls.crt",
            |e| matches!(e, Error::KeyMissing { .. }),
        ),
        (
            "ca_not_pem",
            secret(
                "prod-etcd",
                "1",
                &[
                    ("tls.crt", b"not a certificate".as_slice()),
                    ("tls.key", ca.key_pem.as_bytes()),
                ],
            ),
            "tls.crt",
            |e| matches!(e, Error::CertificateNotPem { .. }),
        ),
        (
            "key_not_pem",
            secret(
                "prod-etcd",
                "1",
                &[
                    ("tls.crt", ca.cert_pem.as_bytes()),
                    ("tls.key", b"garbage".as_slice()),
                ],
            ),
            "tls.key",
            |e| matches!(e, Error::KeyNotPem { .. }),
        ),
        (
            "key_of_another_ca",
            secret(
                "prod-etcd",
                "1",
                &[
                    ("tls.crt", ca.cert_pem.as_bytes()),
                    ("tls.key", other.key_pem.as_bytes()),
                ],
            ),
            "tls.key",
            |e| matches!(e, Error::KeyMismatch { .. }),
        ),
        (
            "leaf_certificate_instead_of_ca",
            secret(
                "prod-etcd",
                "1",
                &[
                    ("tls.crt", leaf.cert_pem.as_bytes()),
                    ("tls.key", leaf.key_pem.as_bytes()),
                ],
            ),
            "tls.crt",
            |e| matches!(e, Error::CertificateNotCa { .. }),
        ),
    ];
    for (name, s, key, is_expected) in cases {
        let err = etcd_access_from_secret(Some(&s)).unwrap_err();
        assert!(is_expected(&err), "{name}: {err:?}");
        let text = err.to_string();
        assert!(text.contains("team-a/prod-etcd"), "{name}: {text}");
        assert!(text.contains(&format!("\"{key}\"")), "{name}: {text}");
        assert!(!text.contains("PRIVATE KEY"), "{name}: leaks key: {text}");
    }
}

fn key() -> ClusterKey {
    ClusterKey::new(NS, "prod")
}

#[tokio::test]
async fn cache_reuses_access_until_a_secret_changes() {
    install_crypto();
    let cache = WorkloadCache::new();
    let etcd_ca = ca("etcd-ca");
    let mut secrets = ClusterSecrets {
        kubeconfig: Some(good_kubeconfig_secret("10")),
        etcd: None,
    };
    let first = cache.get(&key(), &secrets).await.unwrap();
    assert_eq!(first.etcd, EtcdAccess::NoSecret);
    let again = cache.get(&key(), &secrets).await.unwrap();
    assert!(
        Arc::ptr_eq(&first, &again),
        "unchanged Secrets reuse the client"
    );

    // The etcd Secret appears: etcd becomes managed.
    secrets.etcd = Some(etcd_secret("20", &etcd_ca));
    let managed = cache.get(&key(), &secrets).await.unwrap();
    assert!(!Arc::ptr_eq(&first, &managed));
    assert!(matches!(managed.etcd, EtcdAccess::Managed(_)));

    // The kubeconfig is rotated (new resourceVersion).
    secrets.kubeconfig = Some(good_kubeconfig_secret("11"));
    let rotated = cache.get(&key(), &secrets).await.unwrap();
    assert!(!Arc::ptr_eq(&managed, &rotated));

    // Recreated Secret with the same resourceVersion but a new uid.
    let mut recreated = good_kubeconfig_secret("11");
    recreated.metadata.uid = Some("uid-new".into());
    secrets.kubeconfig = Some(recreated);
    let after_recreate = cache.get(&key(), &secrets).await.unwrap();
    assert!(!Arc::ptr_eq(&rotated, &after_recreate));
    assert!(Arc::ptr_eq(
        &after_recreate,
        &cache.get(&key(), &secrets).await.unwrap()
    ));

    // Another cluster has its own entry.
    let other = ClusterKey::new("team-b", "prod");
    let other_access = cache.get(&other, &secrets).await.unwrap();
    assert!(!Arc::ptr_eq(&after_recreate, &other_access));
    assert_eq!(cache.len(), 2);
    cache.invalidate(&other);
    assert_eq!(cache.len(), 1);
}

#[tokio::test]
async fn cache_reports_missing_kubeconfig_and_does_not_cache_errors() {
    install_crypto();
    let cache = WorkloadCache::new();
    let mut secrets = ClusterSecrets::default();
    let err = cache.get(&key(), &secrets).await.unwrap_err();
    assert!(matches!(err, Error::SecretMissing { .. }), "{err:?}");
    assert!(err.to_string().contains("team-a/prod-kubeconfig"), "{err}");
    assert!(cache.is_empty());

    // A broken etcd Secret fails the whole access: never act on half a picture.
    secrets.kubeconfig = Some(good_kubeconfig_secret("1"));
    let c = ca("etcd-ca");
    secrets.etcd = Some(secret(
        "prod-etcd",
        "2",
        &[("tls.crt", c.cert_pem.as_bytes())],
    ));
    let err = cache.get(&key(), &secrets).await.unwrap_err();
    assert!(matches!(err, Error::CaKeyMissing { .. }), "{err:?}");
    assert!(cache.is_empty());

    // Fixed Secret: works on the next call.
    secrets.etcd = Some(etcd_secret("3", &c));
    cache.get(&key(), &secrets).await.unwrap();
    assert_eq!(cache.len(), 1);
}

fn node(
    name: &str,
    labels: &[(&str, &str)],
    annotations: &[(&str, &str)],
    addresses: &[(&str, &str)],
) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        },
        status: Some(NodeStatus {
            addresses: Some(
                addresses
                    .iter()
                    .map(|(t, a)| NodeAddress {
                        type_: t.to_string(),
                        address: a.to_string(),
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn workload_nodes() -> Vec<Node> {
    vec![
        node(
            "cp-1",
            &[
                ("node-role.kubernetes.io/control-plane", "true"),
                ("node-role.kubernetes.io/etcd", "true"),
            ],
            &[
                ("etcd.k3s.cattle.io/node-name", "cp-1-1a2b3c4d"),
                ("etcd.k3s.cattle.io/node-address", "10.0.0.11"),
            ],
            &[
                ("Hostname", "cp-1"),
                ("InternalIP", "10.0.0.11"),
                ("ExternalIP", "203.0.113.11"),
            ],
        ),
        node("worker-1", &[], &[], &[("InternalIP", "10.0.0.21")]),
        node(
            "cp-0-legacy",
            &[("node-role.kubernetes.io/master", "true")],
            &[("etcd.k3s.cattle.io/node-name", "cp-0-legacy-9f8e7d6c")],
            &[("InternalIP", "fd00::10")],
        ),
        node(
            "cp-2-no-etcd",
            &[("node-role.kubernetes.io/control-plane", "true")],
            &[("etcd.k3s.cattle.io/node-address", "10.0.0.13")],
            &[("Hostname", "cp-2-no-etcd")],
        ),
        node(
            "cp-3-no-address",
            &[("node-role.kubernetes.io/control-plane", "true")],
            &[],
            &[],
        ),
    ]
}

#[test]
fn control_plane_nodes_are_selected_with_their_etcd_annotations() {
    let cps = control_plane_nodes(&workload_nodes());
    let names: Vec<&str> = cps.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(
        names,
        ["cp-0-legacy", "cp-1", "cp-2-no-etcd", "cp-3-no-address"]
    );
    let cp1: &ControlPlaneNode = &cps[1];
    assert_eq!(cp1.etcd_member_name.as_deref(), Some("cp-1-1a2b3c4d"));
    assert_eq!(cp1.etcd_node_address.as_deref(), Some("10.0.0.11"));
    assert!(cp1.etcd_role);
    assert!(!cps[0].etcd_role);
    assert_eq!(cps[2].etcd_member_name, None);
}

#[test]
fn each_members_client_url_is_derived_from_its_node() {
    let cps = control_plane_nodes(&workload_nodes());
    let urls: Vec<Option<String>> = cps.iter().map(ControlPlaneNode::etcd_client_url).collect();
    assert_eq!(
        urls,
        [
            Some("https://[fd00::10]:2379".into()),
            Some("https://10.0.0.11:2379".into()),
            // No InternalIP: the address k3s annotated for etcd.
            Some("https://10.0.0.13:2379".into()),
            // No address at all: no endpoint, never a guess.
            None,
        ]
    );
    // The engine's transport dials that URL and verifies the node's IP.
    let endpoint = k3s_control_plane::etcd::Transport::Direct
        .resolve("https://[fd00::10]:2379")
        .unwrap();
    assert_eq!(endpoint.server_name, "fd00::10");
}

/// Only with a real cluster (`KUBECONFIG`): list its control-plane Nodes.
#[tokio::test]
async fn lists_control_plane_nodes_of_a_real_cluster() {
    if std::env::var_os("KUBECONFIG").is_none() {
        docker_support::skip(
            "lists_control_plane_nodes_of_a_real_cluster",
            "KUBECONFIG is not set, no real cluster to list Nodes from (none can be installed here)",
        );
        return;
    }
    install_crypto();
    let config = kube::Config::infer().await.unwrap();
    let reads = k3s_control_plane::workload::reads::workload_reads(config).unwrap();
    let nodes = k3s_control_plane::workload::nodes::list_control_plane_nodes(&reads, "real", &[])
        .await
        .unwrap();
    // Every kube-apiserver speaks HTTP/2: the reads went on their own
    // connection, and found what kube's client finds.
    assert!(
        reads.over_h2(),
        "the real API server did not agree on HTTP/2"
    );
    let through_kube: Vec<String> = kube::Api::<Node>::all(reads.client().clone())
        .list(&kube::api::ListParams::default().labels("node-role.kubernetes.io/control-plane"))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    let mut over_h2: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
    over_h2.sort();
    let mut through_kube = through_kube;
    through_kube.sort();
    assert_eq!(over_h2, through_kube);
    eprintln!("{} control-plane Nodes read over HTTP/2", nodes.len());
    for n in &nodes {
        eprintln!(
            "{} etcd={:?} endpoint={:?}",
            n.name,
            n.etcd_member_name,
            n.etcd_client_url()
        );
    }
}

/// One LIST (label `control-plane`) when it finds every expected Node; the
/// legacy `master` label is listed only when one is missing, and then a Node
/// that has only that label is found.
#[tokio::test]
async fn control_plane_nodes_cost_one_list_unless_an_expected_node_is_missing() {
    use k3s_control_plane::apiserver::TestApiServer;
    use k3s_control_plane::workload::WorkloadReads;
    use k3s_control_plane::workload::nodes::list_control_plane_nodes;
    use kube::api::{Api, PostParams};
    install_crypto();
    let server = TestApiServer::builder()
        .with_core_resources()
        .start()
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(server.client());
    for n in [
        node(
            "cp-0",
            &[
                ("node-role.kubernetes.io/control-plane", "true"),
                ("node-role.kubernetes.io/master", "true"),
            ],
            &[],
            &[("InternalIP", "10.0.0.10")],
        ),
        node(
            "legacy-1",
            &[("node-role.kubernetes.io/master", "true")],
            &[],
            &[("InternalIP", "10.0.0.11")],
        ),
        node("worker-2", &[], &[], &[("InternalIP", "10.0.0.12")]),
        // An etcd-only server (k3s --disable-apiserver): the etcd label alone.
        node(
            "etcd-3",
            &[("node-role.kubernetes.io/etcd", "true")],
            &[],
            &[("InternalIP", "10.0.0.13")],
        ),
    ] {
        nodes.create(&PostParams::default(), &n).await.unwrap();
    }
    let node_lists = || {
        server
            .request_counts()
            .get(&("list".to_string(), "nodes".to_string()))
            .copied()
            .unwrap_or(0)
    };
    let names = |found: Vec<ControlPlaneNode>| -> Vec<String> {
        found.into_iter().map(|n| n.name).collect()
    };

    let reads = WorkloadReads::through_client(server.client());
    let before = node_lists();
    let found = list_control_plane_nodes(&reads, "c1", &["cp-0"])
        .await
        .unwrap();
    assert_eq!(names(found), ["cp-0"]);
    assert_eq!(
        node_lists() - before,
        1,
        "every expected Node found: one LIST"
    );

    let before = node_lists();
    let found = list_control_plane_nodes(&reads, "c1", &["cp-0", "legacy-1"])
        .await
        .unwrap();
    assert_eq!(names(found), ["cp-0", "etcd-3", "legacy-1"]);
    assert_eq!(
        node_lists() - before,
        3,
        "a missing Node: the master and etcd labels too"
    );

    // An etcd-only server's Machine: found by the etcd label.
    let found = list_control_plane_nodes(&reads, "c1", &["cp-0", "etcd-3"])
        .await
        .unwrap();
    assert_eq!(names(found), ["cp-0", "etcd-3", "legacy-1"]);
}
