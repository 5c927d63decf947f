//! The admin kubeconfig of `<cluster>-kubeconfig`, laid out as upstream
//! cluster-api-k3s (pkg/kubeconfig) writes it: cluster `<cluster>`, user
//! `<cluster>-admin`, context `<cluster>-admin@<cluster>` (current), the server
//! CA as certificate authority, and a client certificate signed by the client
//! CA with CN `kubernetes-admin`, O `system:masters`. Also what the controller
//! needs to read back: the client certificate's expiry and the server URL.

use std::net::Ipv6Addr;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use chrono::{DateTime, TimeDelta, Utc};
use kube::config::{Context, Kubeconfig};
use serde::Serialize;

use super::ca::{first_certificate, issue_client_cert_from, not_after};
use super::{CertKeyPem, PkiError};

/// Common name of the admin client certificate.
pub const ADMIN_COMMON_NAME: &str = "kubernetes-admin";
/// Organization (Kubernetes group) of the admin client certificate.
pub const ADMIN_ORGANIZATION: &str = "system:masters";

/// How long the admin client certificate lives and when to replace it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KubeconfigPolicy {
    /// Lifetime of a new client certificate.
    pub lifetime: Duration,
    /// Rotate once less than this is left before notAfter.
    pub renew_before: Duration,
}

impl Default for KubeconfigPolicy {
    /// One year, rotated once less than 80% of it is left (CAPI's
    /// `ClientCertificateRenewalDuration`).
    fn default() -> Self {
        Self::with_lifetime(Duration::from_secs(365 * 86_400))
    }
}

impl KubeconfigPolicy {
    /// `lifetime`, with `renew_before` = 80% of it.
    pub fn with_lifetime(lifetime: Duration) -> Self {
        Self {
            lifetime,
            renew_before: lifetime / 5 * 4,
        }
    }

    /// Whether a certificate valid until `not_after` must be replaced at `now`:
    /// less than `renew_before` is left (or it has expired).
    pub fn needs_rotation(&self, not_after: DateTime<Utc>, now: DateTime<Utc>) -> bool {
        let renew_before = TimeDelta::from_std(self.renew_before).unwrap_or(TimeDelta::MAX);
        match now.checked_add_signed(renew_before) {
            Some(threshold) => not_after < threshold,
            None => true,
        }
    }
}

/// `https://<host>:<port>`, with an IPv6 host in brackets
/// (`https://[fd00::1]:6443`). A host already in brackets is kept as is.
pub fn endpoint_url(host: &str, port: u16) -> String {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if bare.parse::<Ipv6Addr>().is_ok() || (host.contains(':') && !host.starts_with('[')) {
        format!("https://[{bare}]:{port}")
    } else {
        format!("https://{host}:{port}")
    }
}

/// The admin kubeconfig YAML of `cluster` for `server` (build it with
/// [`endpoint_url`]): the first certificate of `server_ca_cert_pem` as
/// certificate authority, and a fresh client certificate from `client_ca`
/// valid for `policy.lifetime` from `now`.
pub fn admin_kubeconfig(
    cluster: &str,
    server: &str,
    server_ca_cert_pem: &str,
    client_ca: &CertKeyPem,
    policy: &KubeconfigPolicy,
    now: DateTime<Utc>,
) -> Result<String, PkiError> {
    check_server(server)?;
    let server_ca = first_certificate(server_ca_cert_pem, "server CA certificate")?;
    let client = issue_client_cert_from(
        client_ca,
        "client CA",
        ADMIN_COMMON_NAME,
        &[ADMIN_ORGANIZATION],
        policy.lifetime,
        now,
    )?;
    let user = format!("{cluster}-admin");
    let context = format!("{user}@{cluster}");
    let config = KubeconfigOut {
        api_version: "v1",
        clusters: vec![Named {
            name: cluster,
            cluster: ClusterOut {
                certificate_authority_data: BASE64.encode(der_to_pem(&server_ca)),
                server,
            },
        }],
        contexts: vec![NamedContext {
            name: &context,
            context: ContextOut {
                cluster,
                user: &user,
            },
        }],
        current_context: &context,
        kind: "Config",
        preferences: Empty {},
        users: vec![NamedUser {
            name: &user,
            user: UserOut {
                client_certificate_data: BASE64.encode(&client.cert_pem),
                client_key_data: BASE64.encode(&client.key_pem),
            },
        }],
    };
    crate::yaml::to_string(&config).map_err(|e| PkiError::Sign {
        field: format!("kubeconfig of {cluster}"),
        reason: format!("cannot serialize: {e}"),
    })
}

/// notAfter of the client certificate inside a kubeconfig text (the current
/// context's user, `client-certificate-data`). Errors name `field` (e.g.
/// `default/demo-kubeconfig[value]`).
pub fn kubeconfig_client_not_after(
    kubeconfig_yaml: &str,
    field: &str,
) -> Result<DateTime<Utc>, PkiError> {
    let config = parse(kubeconfig_yaml, field)?;
    let (_, context) = current_context(&config, field)?;
    let bad = |reason: String| PkiError::BadKubeconfig {
        field: field.to_string(),
        reason,
    };
    let user = context
        .user
        .as_deref()
        .ok_or_else(|| bad("the current context names no user".into()))?;
    let auth = config
        .auth_infos
        .iter()
        .find(|u| u.name == user)
        .ok_or_else(|| {
            bad(format!(
                "user {user:?} of the current context is not defined"
            ))
        })?;
    let data = auth
        .auth_info
        .as_ref()
        .and_then(|a| a.client_certificate_data.as_deref())
        .ok_or_else(|| bad(format!("user {user:?} has no client-certificate-data")))?;
    let cert_field = format!("{field} users[{user}].client-certificate-data");
    let pem = BASE64
        .decode(data.trim())
        .map_err(|e| PkiError::BadCertificate {
            field: cert_field.clone(),
            reason: format!("not base64: {e}"),
        })?;
    let pem = String::from_utf8(pem).map_err(|_| PkiError::NotText {
        field: cert_field.clone(),
    })?;
    not_after(&pem, &cert_field)
}

/// The server URL of the current context's cluster (to detect an endpoint
/// change). Errors name `field`.
pub fn kubeconfig_server(kubeconfig_yaml: &str, field: &str) -> Result<String, PkiError> {
    let config = parse(kubeconfig_yaml, field)?;
    let (_, context) = current_context(&config, field)?;
    let bad = |reason: String| PkiError::BadKubeconfig {
        field: field.to_string(),
        reason,
    };
    let name = &context.cluster;
    let cluster = config
        .clusters
        .iter()
        .find(|c| &c.name == name)
        .ok_or_else(|| {
            bad(format!(
                "cluster {name:?} of the current context is not defined"
            ))
        })?;
    cluster
        .cluster
        .as_ref()
        .and_then(|c| c.server.clone())
        .filter(|s| !s.is_empty())
        .ok_or_else(|| bad(format!("cluster {name:?} has no server")))
}

/// Parse without letting YAML error messages through: they may quote values
/// of the document, and a kubeconfig holds a private key.
fn parse(text: &str, field: &str) -> Result<Kubeconfig, PkiError> {
    crate::yaml::from_str::<Kubeconfig>(text).map_err(|e| PkiError::BadKubeconfig {
        field: field.to_string(),
        reason: match crate::yaml::error_location(&e) {
            Some((line, column)) => {
                format!("invalid YAML or structure at line {line} column {column}")
            }
            None => "invalid YAML or structure".into(),
        },
    })
}

fn current_context<'a>(
    config: &'a Kubeconfig,
    field: &str,
) -> Result<(&'a str, &'a Context), PkiError> {
    let bad = |reason: String| PkiError::BadKubeconfig {
        field: field.to_string(),
        reason,
    };
    let name = config
        .current_context
        .as_deref()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| bad("no current-context".into()))?;
    let context = config
        .contexts
        .iter()
        .find(|c| c.name == name)
        .and_then(|c| c.context.as_ref())
        .ok_or_else(|| bad(format!("current-context {name:?} is not defined")))?;
    Ok((name, context))
}

/// The server must be an absolute https URL with a host.
fn check_server(server: &str) -> Result<(), PkiError> {
    let invalid = |reason: &str| PkiError::InvalidRequest {
        field: format!("server {server:?}"),
        reason: reason.to_string(),
    };
    let uri: http::Uri = server
        .parse()
        .map_err(|_| invalid("not a URL (build it with endpoint_url)"))?;
    if uri.scheme_str() != Some("https") {
        return Err(invalid("scheme is not https"));
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(invalid("no host"));
    }
    Ok(())
}

fn der_to_pem(der: &[u8]) -> String {
    let body = BASE64.encode(der);
    let mut pem = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in body.as_bytes().chunks(64) {
        // Base64 output is ASCII.
        pem.push_str(std::str::from_utf8(line).unwrap_or_default());
        pem.push('\n');
    }
    pem.push_str("-----END CERTIFICATE-----\n");
    pem
}

// The document as client-go's clientcmd writes it (same keys, same order).

#[derive(Serialize)]
struct KubeconfigOut<'a> {
    #[serde(rename = "apiVersion")]
    api_version: &'a str,
    clusters: Vec<Named<'a>>,
    contexts: Vec<NamedContext<'a>>,
    #[serde(rename = "current-context")]
    current_context: &'a str,
    kind: &'a str,
    preferences: Empty,
    users: Vec<NamedUser<'a>>,
}

#[derive(Serialize)]
struct Empty {}

#[derive(Serialize)]
struct Named<'a> {
    cluster: ClusterOut<'a>,
    name: &'a str,
}

#[derive(Serialize)]
struct ClusterOut<'a> {
    #[serde(rename = "certificate-authority-data")]
    certificate_authority_data: String,
    server: &'a str,
}

#[derive(Serialize)]
struct NamedContext<'a> {
    context: ContextOut<'a>,
    name: &'a str,
}

#[derive(Serialize)]
struct ContextOut<'a> {
    cluster: &'a str,
    user: &'a str,
}

#[derive(Serialize)]
struct NamedUser<'a> {
    name: &'a str,
    user: UserOut,
}

#[derive(Serialize)]
struct UserOut {
    #[serde(rename = "client-certificate-data")]
    client_certificate_data: String,
    #[serde(rename = "client-key-data")]
    client_key_data: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::ca::tests::{upstream_rsa_ca, verify_as_client};
    use crate::pki::{CA_LIFETIME, generate_ca};
    use kube::config::KubeConfigOptions;
    use x509_parser::prelude::{FromDer, X509Certificate};

    struct Fixture {
        server_ca: CertKeyPem,
        client_ca: CertKeyPem,
        now: DateTime<Utc>,
        yaml: String,
    }

    fn fixture(server: &str) -> Fixture {
        let server_ca = generate_ca("k3s-server-ca@1", CA_LIFETIME).unwrap();
        let client_ca = generate_ca("k3s-client-ca@1", CA_LIFETIME).unwrap();
        let now = Utc::now();
        let yaml = admin_kubeconfig(
            "demo",
            server,
            &server_ca.cert_pem,
            &client_ca,
            &KubeconfigPolicy::default(),
            now,
        )
        .unwrap();
        Fixture {
            server_ca,
            client_ca,
            now,
            yaml,
        }
    }

    fn decode(data: &str) -> String {
        String::from_utf8(BASE64.decode(data).unwrap()).unwrap()
    }

    #[test]
    fn admin_kubeconfig_names_cluster_user_and_context_as_upstream() {
        let f = fixture("https://10.0.0.1:6443");
        let config = Kubeconfig::from_yaml(&f.yaml).unwrap();
        assert_eq!(config.current_context.as_deref(), Some("demo-admin@demo"));
        assert_eq!(config.api_version.as_deref(), Some("v1"));
        assert_eq!(config.kind.as_deref(), Some("Config"));

        let [cluster] = &config.clusters[..] else {
            panic!("one cluster: {:?}", config.clusters)
        };
        assert_eq!(cluster.name, "demo");
        let cluster = cluster.cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://10.0.0.1:6443"));
        let ca_pem = decode(cluster.certificate_authority_data.as_ref().unwrap());
        assert_eq!(
            first_certificate(&ca_pem, "kubeconfig CA").unwrap(),
            first_certificate(&f.server_ca.cert_pem, "server CA").unwrap(),
            "the certificate authority is the server CA"
        );

        let [context] = &config.contexts[..] else {
            panic!("one context")
        };
        assert_eq!(context.name, "demo-admin@demo");
        let context = context.context.as_ref().unwrap();
        assert_eq!(context.cluster, "demo");
        assert_eq!(context.user.as_deref(), Some("demo-admin"));

        let [user] = &config.auth_infos[..] else {
            panic!("one user")
        };
        assert_eq!(user.name, "demo-admin");
        let user = user.auth_info.as_ref().unwrap();
        let cert_pem = decode(user.client_certificate_data.as_ref().unwrap());
        let cert_der = first_certificate(&cert_pem, "client").unwrap();
        let (_, cert) = X509Certificate::from_der(&cert_der).unwrap();
        assert_eq!(
            cert.subject().to_string(),
            "O=system:masters, CN=kubernetes-admin"
        );
        assert!(
            cert.extended_key_usage()
                .unwrap()
                .unwrap()
                .value
                .client_auth
        );
        verify_as_client(&f.client_ca.cert_pem, &cert_pem).expect("signed by the client CA");
        verify_as_client(&f.server_ca.cert_pem, &cert_pem)
            .expect_err("not signed by the server CA");
        assert!(user.client_key_data.is_some());
        // Nothing of the CA keys ends up in the kubeconfig.
        for ca in [&f.server_ca, &f.client_ca] {
            let body: String = ca
                .key_pem
                .lines()
                .filter(|l| !l.starts_with("---"))
                .collect();
            assert!(!f.yaml.contains(&BASE64.encode(&ca.key_pem)));
            assert!(!f.yaml.contains(&body));
        }
    }

    #[tokio::test]
    async fn kube_accepts_the_admin_kubeconfig() {
        crate::install_crypto_provider();
        let f = fixture("https://[fd00::10]:6443");
        let config = Kubeconfig::from_yaml(&f.yaml).unwrap();
        let config = kube::Config::from_custom_kubeconfig(config, &KubeConfigOptions::default())
            .await
            .unwrap();
        assert_eq!(config.cluster_url.to_string(), "https://[fd00::10]:6443/");
        assert_eq!(config.root_cert.as_ref().map(Vec::len), Some(1));
        // Building a client loads the identity into rustls; nothing is contacted.
        kube::Client::try_from(config).expect("rustls accepts the client certificate and key");
    }

    #[test]
    fn expiry_and_server_round_trip() {
        let f = fixture("https://10.0.0.1:6443");
        let field = "default/demo-kubeconfig[value]";
        let expected = f.now + TimeDelta::days(365);
        let got = kubeconfig_client_not_after(&f.yaml, field).unwrap();
        assert!(
            (got - expected).num_seconds().abs() <= 2,
            "{got} vs {expected}"
        );
        assert_eq!(
            kubeconfig_server(&f.yaml, field).unwrap(),
            "https://10.0.0.1:6443"
        );

        let short = KubeconfigPolicy::with_lifetime(Duration::from_secs(3600));
        let yaml = admin_kubeconfig(
            "demo",
            "https://lb.example:6443",
            &f.server_ca.cert_pem,
            &f.client_ca,
            &short,
            f.now,
        )
        .unwrap();
        let got = kubeconfig_client_not_after(&yaml, field).unwrap();
        assert!((got - (f.now + TimeDelta::hours(1))).num_seconds().abs() <= 2);
        assert_eq!(
            kubeconfig_server(&yaml, field).unwrap(),
            "https://lb.example:6443"
        );
    }

    #[test]
    fn an_upstream_client_ca_signs_the_admin_certificate() {
        let server_ca = generate_ca("k3s-server-ca@1", CA_LIFETIME).unwrap();
        let client_ca = upstream_rsa_ca();
        let yaml = admin_kubeconfig(
            "demo",
            "https://10.0.0.1:6443",
            &server_ca.cert_pem,
            &client_ca,
            &KubeconfigPolicy::default(),
            Utc::now(),
        )
        .unwrap();
        let config = Kubeconfig::from_yaml(&yaml).unwrap();
        let data = config.auth_infos[0]
            .auth_info
            .as_ref()
            .unwrap()
            .client_certificate_data
            .clone()
            .unwrap();
        verify_as_client(&client_ca.cert_pem, &decode(&data)).unwrap();
    }

    #[test]
    fn admin_kubeconfig_refuses_bad_inputs_naming_them() {
        let ca = generate_ca("k3s-server-ca@1", CA_LIFETIME).unwrap();
        let policy = KubeconfigPolicy::default();
        let now = Utc::now();
        let make = |server: &str, server_ca: &str, client_ca: &CertKeyPem| {
            admin_kubeconfig("demo", server, server_ca, client_ca, &policy, now)
                .unwrap_err()
                .to_string()
        };
        let https = "https://10.0.0.1:6443";
        assert_eq!(
            make("10.0.0.1:6443", &ca.cert_pem, &ca),
            "server \"10.0.0.1:6443\": scheme is not https"
        );
        assert_eq!(
            make("http://10.0.0.1:6443", &ca.cert_pem, &ca),
            "server \"http://10.0.0.1:6443\": scheme is not https"
        );
        assert!(make("", &ca.cert_pem, &ca).starts_with("server \"\": not a URL"));
        assert_eq!(
            make(https, "", &ca),
            "server CA certificate: no PEM certificate found"
        );
        let no_key = CertKeyPem {
            cert_pem: ca.cert_pem.clone(),
            key_pem: String::new(),
        };
        assert!(
            make(https, &ca.cert_pem, &no_key).starts_with("client CA key: no PEM private key"),
            "{}",
            make(https, &ca.cert_pem, &no_key)
        );
    }

    #[test]
    fn reading_a_broken_kubeconfig_names_the_field_and_quotes_nothing() {
        let f = fixture("https://10.0.0.1:6443");
        let field = "default/demo-kubeconfig[value]";
        let key_line = f
            .yaml
            .lines()
            .find(|l| l.contains("client-key-data"))
            .unwrap()
            .to_string();
        let key_value = key_line.split(": ").nth(1).unwrap().to_string();
        // The start of any PEM key's base64 is the same header; quote the middle.
        let key_part = &key_value[60..120];

        let no_current = f.yaml.replace("current-context: demo-admin@demo\n", "");
        let unknown_user = f.yaml.replace("user: demo-admin", "user: nobody");
        let no_cert = f
            .yaml
            .lines()
            .filter(|l| !l.contains("client-certificate-data"))
            .collect::<Vec<_>>()
            .join("\n");
        // The key where a list is expected: serde would quote the value.
        let wrong_type = format!("apiVersion: v1\nclusters: {key_value}\n");
        let cases: [(&str, &str, &str); 5] = [
            ("not YAML", "a: [", "not a usable kubeconfig: invalid YAML"),
            (
                "wrong type",
                &wrong_type,
                "not a usable kubeconfig: invalid YAML",
            ),
            (
                "no current context",
                &no_current,
                "not a usable kubeconfig: no current-context",
            ),
            (
                "unknown user",
                &unknown_user,
                "user \"nobody\" of the current context is not defined",
            ),
            (
                "no certificate",
                &no_cert,
                "user \"demo-admin\" has no client-certificate-data",
            ),
        ];
        for (name, yaml, expected) in cases {
            let err = kubeconfig_client_not_after(yaml, field).expect_err(name);
            let message = err.to_string();
            assert!(message.starts_with(field), "{name}: {message}");
            assert!(message.contains(expected), "{name}: {message}");
            assert!(!message.contains(key_part), "{name}: {message}");
        }
        let err = kubeconfig_server(&no_current, field).unwrap_err();
        assert_eq!(
            err.to_string(),
            "default/demo-kubeconfig[value]: not a usable kubeconfig: no current-context"
        );
        let no_server = f
            .yaml
            .replace("server: https://10.0.0.1:6443", "server: ''");
        let err = kubeconfig_server(&no_server, field).unwrap_err();
        assert!(
            err.to_string().ends_with("cluster \"demo\" has no server"),
            "{err}"
        );
        let bad_cert = f
            .yaml
            .replace("client-certificate-data: ", "client-certificate-data: x");
        let err = kubeconfig_client_not_after(&bad_cert, field).unwrap_err();
        assert!(
            err.to_string().starts_with(
                "default/demo-kubeconfig[value] users[demo-admin].client-certificate-data:"
            ),
            "{err}"
        );
    }

    #[test]
    fn rotation_is_due_once_less_than_renew_before_is_left() {
        let policy = KubeconfigPolicy::default();
        assert_eq!(policy.lifetime, Duration::from_secs(365 * 86_400));
        assert_eq!(policy.renew_before, Duration::from_secs(292 * 86_400));
        let now = Utc::now();
        let threshold = now + TimeDelta::days(292);
        assert!(!policy.needs_rotation(threshold + TimeDelta::seconds(1), now));
        assert!(
            !policy.needs_rotation(threshold, now),
            "exactly renew_before left"
        );
        assert!(policy.needs_rotation(threshold - TimeDelta::seconds(1), now));
        assert!(
            policy.needs_rotation(now - TimeDelta::days(1), now),
            "expired"
        );
        assert!(
            !policy.needs_rotation(now + TimeDelta::days(365), now),
            "fresh"
        );

        let hour = KubeconfigPolicy::with_lifetime(Duration::from_secs(3600));
        assert_eq!(hour.renew_before, Duration::from_secs(2880));
        assert!(hour.needs_rotation(now + TimeDelta::seconds(2879), now));
        assert!(!hour.needs_rotation(now + TimeDelta::seconds(2881), now));
        let forever = KubeconfigPolicy {
            lifetime: Duration::MAX,
            renew_before: Duration::MAX,
        };
        assert!(forever.needs_rotation(DateTime::<Utc>::MAX_UTC, now));
    }

    #[test]
    fn endpoint_url_brackets_ipv6_hosts() {
        assert_eq!(endpoint_url("10.0.0.1", 6443), "https://10.0.0.1:6443");
        assert_eq!(
            endpoint_url("lb.example.com", 443),
            "https://lb.example.com:443"
        );
        assert_eq!(endpoint_url("fd00::1", 6443), "https://[fd00::1]:6443");
        assert_eq!(endpoint_url("[fd00::1]", 6443), "https://[fd00::1]:6443");
        assert_eq!(endpoint_url("::1", 6443), "https://[::1]:6443");
        for url in [
            endpoint_url("fd00::1", 6443),
            endpoint_url("10.0.0.1", 6443),
        ] {
            check_server(&url).unwrap();
        }
    }
}
