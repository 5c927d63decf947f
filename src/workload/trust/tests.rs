//! Every refused field through `kubeconfig_from_secret`: the exact variant and
//! field path (so each test fails if its check is removed: kube itself would
//! accept the kubeconfig, or fail differently), the Secret and key named, the
//! value never quoted.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::ObjectMeta;

use super::Refused;
use crate::workload::Error;
use crate::workload::secrets::kubeconfig_from_secret;

/// Every refused value in these tests contains this marker; no message may.
const MARK: &str = "SECRET-VALUE";

fn secret_with(text: &str) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some("prod-kubeconfig".into()),
            namespace: Some("team-a".into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "value".to_string(),
            ByteString(text.as_bytes().to_vec()),
        )])),
        ..Default::default()
    }
}

fn ca_data() -> String {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let key = rcgen::KeyPair::generate().unwrap();
    let pem = params.self_signed(&key).unwrap().pem();
    match serde_json::to_value(ByteString(pem.into_bytes())).unwrap() {
        serde_json::Value::String(b64) => b64,
        _ => unreachable!(),
    }
}

/// A kubeconfig the policy accepts, with `user_extra` lines added to user
/// `admin` and `cluster_extra` lines to cluster `prod` (each indented 4).
/// User `other` (not selected) runs a credential plugin.
fn kubeconfig(current: &str, cluster_extra: &[&str], user_extra: &[&str]) -> String {
    let indent = |lines: &[&str]| {
        lines
            .iter()
            .map(|l| format!("    {l}\n"))
            .collect::<String>()
    };
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: prod
  cluster:
    server: https://172.18.0.3:6443
    certificate-authority-data: {ca}
{cluster_extra}users:
- name: admin
  user:
    token: {MARK}-token
{user_extra}- name: other
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: /bin/{MARK}-plugin
contexts:
- name: admin@prod
  context:
    cluster: prod
    user: admin
- name: other@prod
  context:
    cluster: prod
    user: other
current-context: {current}
",
        ca = ca_data(),
        cluster_extra = indent(cluster_extra),
        user_extra = indent(user_extra),
    )
}

fn install_crypto() {
    crate::install_crypto_provider();
}

/// Refused with exactly `why` on `field`; the message names Secret, key and
/// field and quotes no value.
async fn assert_refused(text: &str, field: &str, why: Refused) {
    install_crypto();
    let err = kubeconfig_from_secret(&secret_with(text))
        .await
        .expect_err(&format!("{field} must be refused"));
    match &err {
        Error::KubeconfigRefused {
            secret,
            key,
            field: f,
            why: w,
        } => {
            assert_eq!((secret.as_str(), *key), ("team-a/prod-kubeconfig", "value"));
            assert_eq!((f.as_str(), *w), (field, why), "{err}");
        }
        other => panic!("{field}: expected KubeconfigRefused, got {other:?}"),
    }
    let message = err.to_string();
    for expected in ["team-a/prod-kubeconfig", "\"value\"", field] {
        assert!(message.contains(expected), "{message}");
    }
    assert!(!message.contains(MARK), "leaks a value: {message}");
    assert!(!format!("{err:?}").contains(MARK), "leaks a value: {err:?}");
}

async fn user_refused(line: &str, field: &str, why: Refused) {
    let text = kubeconfig("admin@prod", &[], &[line]);
    assert_refused(&text, &format!("users[admin].user.{field}"), why).await;
}

async fn cluster_refused(line: &str, field: &str, why: Refused) {
    let text = kubeconfig("admin@prod", &[line], &[]);
    assert_refused(&text, &format!("clusters[prod].cluster.{field}"), why).await;
}

#[tokio::test]
async fn the_base_kubeconfig_is_accepted_with_the_selected_entries() {
    install_crypto();
    let config = kubeconfig_from_secret(&secret_with(&kubeconfig("admin@prod", &[], &[])))
        .await
        .unwrap();
    assert_eq!(config.cluster_url.to_string(), "https://172.18.0.3:6443/");
    assert!(config.root_cert.is_some());
    assert!(!config.accept_invalid_certs);
    assert!(
        config.auth_info.token.is_some(),
        "the selected user's token"
    );
    assert!(config.auth_info.exec.is_none());
}

#[tokio::test]
async fn exec_credential_plugin_is_refused() {
    user_refused(
        &format!("exec: {{apiVersion: client.authentication.k8s.io/v1, command: /bin/{MARK}, args: [{MARK}]}}"),
        "exec",
        Refused::Exec,
    )
    .await;
}

#[tokio::test]
async fn auth_provider_is_refused() {
    user_refused(
        &format!("auth-provider: {{name: oidc, config: {{id-token: {MARK}}}}}"),
        "auth-provider",
        Refused::AuthProvider,
    )
    .await;
}

#[tokio::test]
async fn token_file_is_refused() {
    user_refused(
        &format!("tokenFile: /var/run/{MARK}/token"),
        "tokenFile",
        Refused::TokenFile,
    )
    .await;
}

#[tokio::test]
async fn client_certificate_path_is_refused() {
    user_refused(
        &format!("client-certificate: /etc/{MARK}/tls.crt"),
        "client-certificate",
        Refused::ClientCertificateFile,
    )
    .await;
}

#[tokio::test]
async fn client_key_path_is_refused() {
    user_refused(
        &format!("client-key: /etc/{MARK}/tls.key"),
        "client-key",
        Refused::ClientKeyFile,
    )
    .await;
}

#[tokio::test]
async fn basic_auth_username_and_password_are_refused() {
    user_refused(&format!("username: {MARK}"), "username", Refused::BasicAuth).await;
    user_refused(&format!("password: {MARK}"), "password", Refused::BasicAuth).await;
}

#[tokio::test]
async fn insecure_skip_tls_verify_is_refused_and_false_is_fine() {
    cluster_refused(
        "insecure-skip-tls-verify: true",
        "insecure-skip-tls-verify",
        Refused::InsecureSkipTlsVerify,
    )
    .await;
    install_crypto();
    let text = kubeconfig("admin@prod", &["insecure-skip-tls-verify: false"], &[]);
    let config = kubeconfig_from_secret(&secret_with(&text)).await.unwrap();
    assert!(!config.accept_invalid_certs);
}

#[tokio::test]
async fn certificate_authority_path_is_refused() {
    cluster_refused(
        &format!("certificate-authority: /etc/{MARK}/ca.crt"),
        "certificate-authority",
        Refused::CertificateAuthorityFile,
    )
    .await;
}

#[tokio::test]
async fn proxy_url_is_refused() {
    cluster_refused(
        &format!("proxy-url: http://{MARK}.example:3128"),
        "proxy-url",
        Refused::ProxyUrl,
    )
    .await;
}

#[tokio::test]
async fn the_user_actually_selected_is_checked_and_named() {
    install_crypto();
    // `other` runs a plugin but no current context selects it: accepted.
    kubeconfig_from_secret(&secret_with(&kubeconfig("admin@prod", &[], &[])))
        .await
        .unwrap();
    // The current context selects `other`: refused, naming it.
    assert_refused(
        &kubeconfig("other@prod", &[], &[]),
        "users[other].user.exec",
        Refused::Exec,
    )
    .await;
}

#[tokio::test]
async fn of_two_users_with_one_name_the_first_is_the_one_checked_and_used() {
    install_crypto();
    let plugin = format!("exec: {{command: /bin/{MARK}}}");
    // A second `admin` runs a plugin: kube uses the first (a token), so accepted.
    let text = kubeconfig("admin@prod", &[], &[]).replace(
        "- name: other\n",
        &format!("- name: admin\n  user:\n    {plugin}\n- name: other\n"),
    );
    let config = kubeconfig_from_secret(&secret_with(&text)).await.unwrap();
    assert!(config.auth_info.exec.is_none());
    assert!(config.auth_info.token.is_some());
    // The first `admin` runs it: refused, though a clean `admin` follows.
    let text = kubeconfig("admin@prod", &[], &[&plugin]).replace(
        "- name: other\n",
        "- name: admin\n  user:\n    token: clean\n- name: other\n",
    );
    assert_refused(&text, "users[admin].user.exec", Refused::Exec).await;
}

#[tokio::test]
async fn an_unselectable_context_is_unusable_not_refused() {
    install_crypto();
    let err = kubeconfig_from_secret(&secret_with(&kubeconfig("nobody@prod", &[], &[])))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::KubeconfigUnusable { reason, .. } if reason.contains("nobody@prod")),
        "{err:?}"
    );
    let missing_cluster =
        kubeconfig("admin@prod", &[], &[]).replace("cluster: prod", "cluster: gone");
    let err = kubeconfig_from_secret(&secret_with(&missing_cluster))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::KubeconfigUnusable { reason, .. } if reason.contains("gone")),
        "{err:?}"
    );
}

/// A plain-http server is refused outside the sandbox feature, naming the
/// Secret, the key and `clusters[<name>].cluster.server`; https is always
/// accepted; the sandbox build (tests, demo) accepts http.
#[test]
fn a_plain_http_server_is_refused_outside_the_sandbox_feature() {
    use super::{PLAIN_HTTP_ALLOWED, Refusal, Verdict, trusted_with};
    use kube::config::Kubeconfig;
    let with_server = |server: &str| {
        let text = kubeconfig("admin@prod", &[], &[]).replace("https://172.18.0.3:6443", server);
        Kubeconfig::from_yaml(&text).unwrap()
    };
    // (server, plain http allowed, refused)
    let table = [
        ("http://172.18.0.3:6443", false, true),
        ("HTTP://172.18.0.3:6443", false, true),
        ("  http://172.18.0.3:6443", false, true),
        ("https://172.18.0.3:6443", false, false),
        ("http://172.18.0.3:6443", true, false),
        ("https://172.18.0.3:6443", true, false),
    ];
    for (server, allowed, refused) in table {
        match trusted_with(&with_server(server), allowed) {
            Err(Verdict::Refused(Refusal { field, why })) => {
                assert!(refused, "{server} (allowed {allowed}) refused: {field}");
                assert_eq!(
                    (field.as_str(), why),
                    ("clusters[prod].cluster.server", Refused::PlainHttp)
                );
                let err = Error::KubeconfigRefused {
                    secret: "team-a/prod-kubeconfig".into(),
                    key: "value",
                    field,
                    why,
                };
                let message = err.to_string();
                for expected in [
                    "team-a/prod-kubeconfig",
                    "\"value\"",
                    "clusters[prod].cluster.server",
                    "https://",
                ] {
                    assert!(message.contains(expected), "{message}");
                }
            }
            Ok(_) => assert!(!refused, "{server} (allowed {allowed}) accepted"),
            Err(other) => panic!("{server}: {other:?}"),
        }
    }
    assert_eq!(PLAIN_HTTP_ALLOWED, cfg!(feature = "sandbox"));
}
