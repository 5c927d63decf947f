//! A plain count of the requests served, by (verb, resource), for benchmarks: how
//! many reads, watches and writes a client made, without RBAC or a token. The verb
//! and resource are derived as RBAC derives them (`list`/`watch` for a GET without a
//! name, `resource/subresource` for a subresource); a non-resource request (discovery,
//! `/version`) counts under its path.

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;

use super::auth::request;
use super::routes::App;

/// Requests per (verb, resource), since the server started.
#[derive(Default)]
pub struct RequestCounts(Mutex<BTreeMap<(String, String), u64>>);

impl RequestCounts {
    fn record(&self, verb: String, resource: String) {
        let mut counts = self.0.lock().unwrap_or_else(|p| p.into_inner());
        *counts.entry((verb, resource)).or_default() += 1;
    }

    pub fn snapshot(&self) -> BTreeMap<(String, String), u64> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Counts every request before it is authenticated or routed.
pub async fn middleware(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let query: HashMap<String, String> = axum::extract::Query::try_from_uri(request.uri())
        .map(|q| q.0)
        .unwrap_or_default();
    let attrs = request::of(request.method(), request.uri().path(), &query);
    let resource = if !attrs.resource_request {
        attrs.path
    } else if attrs.subresource.is_empty() {
        attrs.resource
    } else {
        format!("{}/{}", attrs.resource, attrs.subresource)
    };
    app.requests.record(attrs.verb, resource);
    next.run(request).await
}
