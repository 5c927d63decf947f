//! Trust policy for a workload kubeconfig read from a `<cluster>-kubeconfig`
//! Secret. Whoever can write that Secret must not be able to run commands inside
//! the controller, make it read its own files, or weaken TLS; so before a
//! `kube::Config` is built, the entries the current context selects (the exact
//! ones kube would use) are checked, and only those entries are handed to kube.
//!
//! Refused, in the selected user: `exec` (client-go credential plugin: a command
//! run in the controller), `auth-provider` (legacy plugins: gcp/azure/oidc, which
//! run commands or refresh tokens against outside endpoints), `tokenFile`,
//! `client-certificate`, `client-key` (paths read from the controller's disk; the
//! `-data` forms are accepted), `username`/`password` (basic auth, removed from
//! Kubernetes in 1.19 and never written by Cluster API). In the selected cluster:
//! `certificate-authority` (a path; `certificate-authority-data` is accepted),
//! `insecure-skip-tls-verify: true`, `proxy-url` (the controller's egress is the
//! operator's choice, e.g. `HTTPS_PROXY` in its environment, not a Secret
//! writer's). A refused field counts when present, even when empty or when its
//! `-data` form is present too. Entries no context selects are ignored: kube
//! never reads them. The selected cluster's `server` must be `https://`: over
//! plain HTTP anyone on the path could forge the Node list that maps etcd
//! members to Machines (and read the Secret's credentials). Only a build with
//! the `sandbox` feature (tests, benches, the demo, whose in-process API servers
//! speak HTTP) accepts `http://`; the shipped controller is built without it.

use std::fmt;

use kube::config::{Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext};

/// Why a kubeconfig field is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// `users[].user.exec`.
    Exec,
    /// `users[].user.auth-provider`.
    AuthProvider,
    /// `users[].user.tokenFile`.
    TokenFile,
    /// `users[].user.client-certificate` (a path).
    ClientCertificateFile,
    /// `users[].user.client-key` (a path).
    ClientKeyFile,
    /// `users[].user.username` or `.password`.
    BasicAuth,
    /// `clusters[].cluster.certificate-authority` (a path).
    CertificateAuthorityFile,
    /// `clusters[].cluster.insecure-skip-tls-verify: true`.
    InsecureSkipTlsVerify,
    /// `clusters[].cluster.proxy-url`.
    ProxyUrl,
    /// `clusters[].cluster.server` with an `http://` URL (outside the
    /// `sandbox` feature).
    PlainHttp,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Exec => {
                "a credential plugin runs a command inside the controller; use client-certificate-data/client-key-data or token"
            }
            Self::AuthProvider => {
                "auth-provider plugins run commands or contact outside endpoints from the controller; use client-certificate-data/client-key-data or token"
            }
            Self::TokenFile => {
                "a token file is read from the controller's disk; put the token in the kubeconfig (token)"
            }
            Self::ClientCertificateFile => {
                "a client certificate path is read from the controller's disk; use client-certificate-data"
            }
            Self::ClientKeyFile => {
                "a client key path is read from the controller's disk; use client-key-data"
            }
            Self::BasicAuth => {
                "basic authentication is not accepted (Kubernetes removed it in 1.19); use a client certificate or a token"
            }
            Self::CertificateAuthorityFile => {
                "a CA path is read from the controller's disk; use certificate-authority-data"
            }
            Self::InsecureSkipTlsVerify => {
                "TLS verification of the workload API server must stay on; give its CA in certificate-authority-data"
            }
            Self::ProxyUrl => {
                "a proxy is the controller's configuration (HTTPS_PROXY in its environment), not the Secret's"
            }
            Self::PlainHttp => {
                "the workload API server must be reached over https:// (over plain http the Node list that maps etcd members to Machines, and the credentials sent, are open to anyone on the path); plain http is accepted only by builds with the sandbox feature"
            }
        })
    }
}

/// A refusal: which field (`users[admin].user.exec`) and why. Carries no value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub field: String,
    pub why: Refused,
}

/// What the current context selects could not be found (kube would fail too).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unusable(pub String);

/// Why a kubeconfig cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Refused(Refusal),
    Unusable(Unusable),
}

/// A name as shown in a field path: control characters escaped (no log injection).
fn shown(name: &str) -> String {
    name.escape_debug().to_string()
}

/// The entries the current context selects, exactly as kube-client picks them
/// (`ConfigLoader::load`): the first context, cluster and user of each name; a
/// user that is named but missing means anonymous, as in client-go.
struct Selected {
    context: NamedContext,
    cluster: NamedCluster,
    user: Option<NamedAuthInfo>,
}

fn select(kubeconfig: &Kubeconfig) -> Result<Selected, Unusable> {
    let context_name = kubeconfig
        .current_context
        .as_deref()
        .ok_or_else(|| Unusable("current-context is not set".into()))?;
    let context = kubeconfig
        .contexts
        .iter()
        .find(|c| c.name == context_name)
        .filter(|c| c.context.is_some())
        .ok_or_else(|| Unusable(format!("context {} not found", shown(context_name))))?;
    let ctx = context.context.as_ref().expect("filtered on is_some");
    let cluster = kubeconfig
        .clusters
        .iter()
        .find(|c| c.name == ctx.cluster)
        .filter(|c| c.cluster.is_some())
        .ok_or_else(|| {
            Unusable(format!(
                "cluster {} of context {} not found",
                shown(&ctx.cluster),
                shown(context_name)
            ))
        })?;
    let user = ctx
        .user
        .as_deref()
        .and_then(|name| kubeconfig.auth_infos.iter().find(|u| u.name == name))
        .cloned();
    Ok(Selected {
        context: context.clone(),
        cluster: cluster.clone(),
        user,
    })
}

/// Whether this build accepts an `http://` workload API server: only with the
/// `sandbox` feature (tests, benches, the demo).
pub const PLAIN_HTTP_ALLOWED: bool = cfg!(feature = "sandbox");

/// Whether `server` is a plain-HTTP URL (the scheme is case-insensitive).
fn is_plain_http(server: &str) -> bool {
    server
        .trim_start()
        .get(..7)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("http://"))
}

fn check(selected: &Selected, plain_http_allowed: bool) -> Result<(), Refusal> {
    let refuse = |field: String, why| Err(Refusal { field, why });
    if let Some(named) = &selected.user
        && let Some(user) = &named.auth_info
    {
        let at = |field: &str| format!("users[{}].user.{field}", shown(&named.name));
        let checks = [
            (user.exec.is_some(), "exec", Refused::Exec),
            (
                user.auth_provider.is_some(),
                "auth-provider",
                Refused::AuthProvider,
            ),
            (user.token_file.is_some(), "tokenFile", Refused::TokenFile),
            (
                user.client_certificate.is_some(),
                "client-certificate",
                Refused::ClientCertificateFile,
            ),
            (
                user.client_key.is_some(),
                "client-key",
                Refused::ClientKeyFile,
            ),
            (user.username.is_some(), "username", Refused::BasicAuth),
            (user.password.is_some(), "password", Refused::BasicAuth),
        ];
        if let Some((_, field, why)) = checks.into_iter().find(|(present, ..)| *present) {
            return refuse(at(field), why);
        }
    }
    let named = &selected.cluster;
    let cluster = named.cluster.as_ref().expect("selected clusters have one");
    let at = |field: &str| format!("clusters[{}].cluster.{field}", shown(&named.name));
    let checks = [
        (
            cluster.insecure_skip_tls_verify == Some(true),
            "insecure-skip-tls-verify",
            Refused::InsecureSkipTlsVerify,
        ),
        (
            cluster.certificate_authority.is_some(),
            "certificate-authority",
            Refused::CertificateAuthorityFile,
        ),
        (cluster.proxy_url.is_some(), "proxy-url", Refused::ProxyUrl),
        (
            !plain_http_allowed && cluster.server.as_deref().is_some_and(is_plain_http),
            "server",
            Refused::PlainHttp,
        ),
    ];
    if let Some((_, field, why)) = checks.into_iter().find(|(present, ..)| *present) {
        return refuse(at(field), why);
    }
    Ok(())
}

/// Check what the current context of `kubeconfig` selects against the policy
/// and return a kubeconfig holding only those entries, so kube cannot read
/// anything that was not checked.
pub fn trusted(kubeconfig: &Kubeconfig) -> Result<Kubeconfig, Verdict> {
    trusted_with(kubeconfig, PLAIN_HTTP_ALLOWED)
}

/// [`trusted`], with `http://` servers accepted or not whatever the build.
pub fn trusted_with(
    kubeconfig: &Kubeconfig,
    plain_http_allowed: bool,
) -> Result<Kubeconfig, Verdict> {
    let selected = select(kubeconfig).map_err(Verdict::Unusable)?;
    check(&selected, plain_http_allowed).map_err(Verdict::Refused)?;
    Ok(Kubeconfig {
        current_context: Some(selected.context.name.clone()),
        contexts: vec![selected.context],
        clusters: vec![selected.cluster],
        auth_infos: selected.user.into_iter().collect(),
        api_version: Some("v1".into()),
        kind: Some("Config".into()),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests;
