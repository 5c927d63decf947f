//! Authentication and RBAC authorization, as kube-apiserver runs them before a request
//! reaches its handler.
//!
//! Authentication: `Authorization: Bearer <token>` of a registered user
//! ([`TestApiServerBuilder::user`](super::TestApiServerBuilder::user)), or with mutual
//! TLS the client certificate (CN the user, O the groups). Every authenticated user is
//! also in `system:authenticated`. Any other `Authorization` header is 401
//! `Unauthorized`. Members of `system:masters` are never judged (the real
//! privileged-group authorizer). Deviation: a request without credentials is the test's own
//! administrator (never judged, never logged): tests build their world with the
//! credential-less [`TestApiServer::client`](super::TestApiServer::client).
//!
//! Authorization ([`TestApiServerBuilder::enforce_rbac`](super::TestApiServerBuilder::enforce_rbac)):
//! each request of an authenticated user is judged against the RBAC objects stored at
//! that moment ([`rbac`]), plus the built-in `system:discovery` and
//! `system:public-info-viewer` bindings; a denial is the real 403. Every decision is
//! kept in a bounded log ([`AuthorizationRecord`]).

mod rbac;
pub(super) mod request;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::HeaderMap;
use k8s_openapi::api::rbac::v1::PolicyRule;

use super::error::{ApiError, Subject};
use super::routes::App;

pub use rbac::Grant;
pub use request::Attributes;

/// Decisions kept by the log; older ones are dropped (and counted).
const LOG_LIMIT: usize = 10_000;

/// Who a request is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub groups: Vec<String>,
}

impl UserInfo {
    /// A user with these groups and `system:authenticated`, as the real
    /// authenticator chain adds it to everyone it authenticates.
    pub fn new(name: impl Into<String>, groups: &[&str]) -> Self {
        let mut groups: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
        if !groups.iter().any(|g| g == "system:authenticated") {
            groups.push("system:authenticated".into());
        }
        Self {
            name: name.into(),
            groups,
        }
    }

    /// The user of a service account token: `system:serviceaccount:<ns>:<name>` in
    /// `system:serviceaccounts`, `system:serviceaccounts:<ns>`, `system:authenticated`.
    pub fn service_account(namespace: &str, name: &str) -> Self {
        Self::new(
            format!("system:serviceaccount:{namespace}:{name}"),
            &[
                "system:serviceaccounts",
                &format!("system:serviceaccounts:{namespace}"),
            ],
        )
    }
}

/// One authorization decision about a request of an authenticated user.
#[derive(Clone, Debug, PartialEq)]
pub struct AuthorizationRecord {
    pub user: String,
    pub verb: String,
    /// `""` for the core group.
    pub api_group: String,
    /// Empty for a non-resource request (see `path`).
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    /// The URL path; what a non-resource request is judged on.
    pub path: String,
    /// Whether this is a resource request (else a non-resource one, e.g. `/version`).
    pub resource_request: bool,
    pub allowed: bool,
    /// The binding, role and rule that allowed it (`None` when denied).
    pub grant: Option<Grant>,
}

/// Token users, whether RBAC is enforced, and the decision log. `Debug` shows no token.
#[derive(Default)]
pub struct Auth {
    tokens: HashMap<String, UserInfo>,
    enforce: bool,
    log: Mutex<Log>,
}

#[derive(Default)]
struct Log {
    records: VecDeque<AuthorizationRecord>,
    dropped: u64,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let users: Vec<&str> = self.tokens.values().map(|u| u.name.as_str()).collect();
        f.debug_struct("Auth")
            .field("token_users", &users)
            .field("enforce_rbac", &self.enforce)
            .finish_non_exhaustive()
    }
}

impl Auth {
    pub fn new(tokens: HashMap<String, UserInfo>, enforce: bool) -> Self {
        Self {
            tokens,
            enforce,
            log: Default::default(),
        }
    }

    /// Whether requests are looked at at all; otherwise the server behaves as if it
    /// had no authentication (as before this module existed).
    fn active(&self) -> bool {
        self.enforce || !self.tokens.is_empty()
    }

    /// `Ok(None)`: no credentials (the test's administrator); `Err`: credentials that
    /// name nobody (401). A verified client certificate wins over a token, as the x509
    /// authenticator comes first in the real chain.
    fn authenticate(
        &self,
        headers: &HeaderMap,
        peer: Option<&UserInfo>,
    ) -> Result<Option<UserInfo>, ApiError> {
        if let Some(user) = peer {
            return Ok(Some(user.clone()));
        }
        let Some(header) = headers.get(http::header::AUTHORIZATION) else {
            return Ok(None);
        };
        let value = header.to_str().map_err(|_| ApiError::Unauthorized)?.trim();
        let token = match value.split_once(' ') {
            Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => token.trim(),
            _ => return Err(ApiError::Unauthorized),
        };
        match self.tokens.get(token) {
            Some(user) => Ok(Some(user.clone())),
            None => {
                tracing::debug!("test API server: unknown bearer token, 401");
                Err(ApiError::Unauthorized)
            }
        }
    }

    fn record(&self, record: AuthorizationRecord) {
        let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        if log.records.len() == LOG_LIMIT {
            log.records.pop_front();
            log.dropped += 1;
        }
        log.records.push_back(record);
    }

    /// The decisions kept (the newest [`LOG_LIMIT`]), oldest first, and how many older
    /// ones were dropped.
    pub fn log(&self) -> (Vec<AuthorizationRecord>, u64) {
        let log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        (log.records.iter().cloned().collect(), log.dropped)
    }
}

/// The user a verified client certificate names (put on the connection by the TLS
/// listener).
#[derive(Clone, Debug, Default)]
pub struct PeerUser(pub Option<UserInfo>);

/// The axum middleware in front of every route: authenticate, then (with
/// enforcement) authorize, before routing, as the real filter chain does.
pub async fn middleware(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let auth = &app.auth;
    if !auth.active() {
        return next.run(request).await;
    }
    let peer = request
        .extensions()
        .get::<axum::extract::ConnectInfo<PeerUser>>()
        .and_then(|c| c.0.0.as_ref());
    let user = match auth.authenticate(request.headers(), peer) {
        Ok(Some(user)) => user,
        Ok(None) => return next.run(request).await,
        Err(e) => return e.into_response(),
    };
    // `system:masters` bypasses authorization, as the real privileged-group
    // authorizer does (a k3s admin certificate has O=system:masters).
    if !auth.enforce || user.groups.iter().any(|g| g == "system:masters") {
        return next.run(request).await;
    }
    let query: HashMap<String, String> = axum::extract::Query::try_from_uri(request.uri())
        .map(|q| q.0)
        .unwrap_or_default();
    let attrs = request::of(request.method(), request.uri().path(), &query);
    let compound = request::compound_create(&attrs, request.headers());
    for attrs in std::iter::once(attrs).chain(compound) {
        if let Err(denied) = judge(&app, &user, &attrs) {
            return denied.into_response();
        }
    }
    next.run(request).await
}

/// One authorization decision, logged.
fn judge(app: &App, user: &UserInfo, attrs: &Attributes) -> Result<(), ApiError> {
    let decision = match builtin_grant(user, attrs) {
        Some(grant) => rbac::Decision {
            grant: Some(grant),
            errors: Vec::new(),
        },
        None => rbac::Policy::load(&app.watch.store).authorize(user, attrs),
    };
    let allowed = decision.grant.is_some();
    tracing::debug!(user = %user.name, verb = %attrs.verb, group = %attrs.api_group,
        resource = %attrs.resource, subresource = %attrs.subresource,
        namespace = %attrs.namespace, name = %attrs.name, allowed, "test API server: RBAC");
    app.auth.record(AuthorizationRecord {
        user: user.name.clone(),
        verb: attrs.verb.clone(),
        api_group: attrs.api_group.clone(),
        resource: attrs.resource.clone(),
        subresource: attrs.subresource.clone(),
        namespace: attrs.namespace.clone(),
        name: attrs.name.clone(),
        path: attrs.path.clone(),
        resource_request: attrs.resource_request,
        allowed,
        grant: decision.grant,
    });
    if allowed {
        Ok(())
    } else {
        Err(forbidden(user, attrs, &decision.errors))
    }
}

/// Non-resource URLs every authenticated user may `get`: the default
/// `system:discovery` and `system:public-info-viewer` ClusterRoles, bound to
/// `system:authenticated` by the default ClusterRoleBindings of the same names.
const DISCOVERY_URLS: &[&str] = &[
    "/api",
    "/api/*",
    "/apis",
    "/apis/*",
    "/healthz",
    "/livez",
    "/openapi",
    "/openapi/*",
    "/readyz",
    "/version",
    "/version/",
];

fn builtin_grant(user: &UserInfo, attrs: &Attributes) -> Option<Grant> {
    if attrs.resource_request || !user.groups.iter().any(|g| g == "system:authenticated") {
        return None;
    }
    let rule = PolicyRule {
        non_resource_urls: Some(DISCOVERY_URLS.iter().map(|u| u.to_string()).collect()),
        verbs: vec!["get".into()],
        ..Default::default()
    };
    rbac::rule_allows(&rule, attrs).then(|| Grant {
        binding_kind: "ClusterRoleBinding".into(),
        binding_namespace: None,
        binding_name: "system:discovery".into(),
        role_kind: "ClusterRole".into(),
        role_name: "system:discovery".into(),
        rule_source: "system:discovery".into(),
        rule,
    })
}

/// The real 403 (`responsewriters.Forbidden`): `forbiddenMessage` wrapped by
/// `NewForbidden(group/resource, name)`, with the RBAC authorizer's reason when a
/// binding's role is missing.
fn forbidden(user: &UserInfo, attrs: &Attributes, errors: &[String]) -> ApiError {
    let mut message = if !attrs.resource_request {
        format!(
            "User {:?} cannot {} path {:?}",
            user.name, attrs.verb, attrs.path
        )
    } else {
        let resource = if attrs.subresource.is_empty() {
            attrs.resource.clone()
        } else {
            format!("{}/{}", attrs.resource, attrs.subresource)
        };
        let scope = if attrs.namespace.is_empty() {
            "at the cluster scope".to_string()
        } else {
            format!("in the namespace {:?}", attrs.namespace)
        };
        format!(
            "User {:?} cannot {} resource {:?} in API group {:?} {scope}",
            user.name, attrs.verb, resource, attrs.api_group
        )
    };
    match errors {
        [] => {}
        [one] => message = format!("{message}: RBAC: {one}"),
        many => message = format!("{message}: RBAC: [{}]", many.join(", ")),
    }
    let subject = attrs.resource_request.then(|| Subject {
        group: attrs.api_group.clone(),
        kind: attrs.resource.clone(),
        qualified: if attrs.api_group.is_empty() {
            attrs.resource.clone()
        } else {
            format!("{}.{}", attrs.resource, attrs.api_group)
        },
        name: attrs.name.clone(),
    });
    ApiError::Denied(subject.map(Box::new), message)
}
