//! HTTP routing: parses Kubernetes REST paths and query parameters and calls the store.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, Method, StatusCode, Uri};
use serde_json::{Value, json};

use super::discovery;
use super::error::ApiError;
use super::faults::{Faults, Write};
use super::meta;
use super::patch::PatchKind;
use super::resource::ResourceDef;
use super::selector::{FieldSelector, LabelSelector};
use super::store::{DeleteOptions, ListQuery, Propagation, Target};
use super::watch::{self, WatchContext, WatchRequest, partial_object};

/// Shared state of the HTTP handlers.
#[derive(Clone)]
pub struct App {
    pub watch: WatchContext,
    /// Injected write faults (test hook).
    pub faults: Arc<Faults>,
    /// Where pods' forwarded ports lead (test hook).
    pub port_forwards: Arc<super::portforward::PortForwards>,
    /// Token users, RBAC enforcement and the decision log.
    pub auth: Arc<super::auth::Auth>,
    /// Requests served, by (verb, resource).
    pub requests: Arc<super::requests::RequestCounts>,
}

/// A parsed resource URL.
struct Route {
    def: ResourceDef,
    version: String,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

type Query = HashMap<String, String>;

pub async fn dispatch(
    State(app): State<Arc<App>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let query: Query = axum::extract::Query::try_from_uri(&uri)
        .map(|q| q.0)
        .unwrap_or_default();
    let segments: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    let result = match discovery::document(app.watch.store.registry(), &segments) {
        Some(doc) if method == Method::GET => Ok(axum::Json(doc).into_response()),
        Some(_) => Err(ApiError::MethodNotAllowed),
        None => match parse_route(&app, &segments) {
            Ok(route) => handle(&app, route, method, &query, &headers, &body).await,
            Err(e) => Err(e),
        },
    };
    result.unwrap_or_else(IntoResponse::into_response)
}

fn parse_route(app: &App, segments: &[&str]) -> Result<Route, ApiError> {
    let (group, version, rest) = match segments {
        ["api", version, rest @ ..] if !rest.is_empty() => ("", *version, rest),
        ["apis", group, version, rest @ ..] if !rest.is_empty() => (*group, *version, rest),
        _ => return Err(ApiError::NoRoute),
    };
    let registry = app.watch.store.registry();
    let namespace_subresource =
        rest.len() == 3 && group.is_empty() && matches!(rest[2], "status" | "finalize");
    let (namespace, plural, tail) =
        if rest[0] == "namespaces" && rest.len() >= 3 && !namespace_subresource {
            (Some(rest[1].to_string()), rest[2], &rest[3..])
        } else {
            (None, rest[0], &rest[1..])
        };
    if tail.len() > 2 {
        return Err(ApiError::NoRoute);
    }
    let def = registry
        .find(group, version, plural)
        .ok_or(ApiError::NoRoute)?
        .clone();
    let name = tail.first().map(|s| s.to_string());
    let subresource = tail.get(1).map(|s| s.to_string());
    if !def.namespaced() && namespace.is_some() {
        return Err(ApiError::NoRoute);
    }
    if def.namespaced() && namespace.is_none() && name.is_some() {
        return Err(ApiError::NoRoute);
    }
    match subresource.as_deref() {
        None => {}
        Some("status") if def.status => {}
        Some("scale") if def.scale.is_some() => {}
        Some(_) => return Err(ApiError::NoRoute),
    }
    Ok(Route {
        def,
        version: version.to_string(),
        namespace,
        name,
        subresource,
    })
}

async fn handle(
    app: &App,
    route: Route,
    method: Method,
    query: &Query,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response, ApiError> {
    if query.get("dryRun").is_some_and(|d| !d.is_empty()) {
        return Err(ApiError::BadRequest(
            "dryRun is not supported by the test API server".into(),
        ));
    }
    let store = &app.watch.store;
    let partial = wants_partial_metadata(headers);
    let ns = route.namespace.as_deref();
    let (def, version) = (&route.def, route.version.as_str());
    // The all-namespaces URL of a namespaced resource only lists and watches.
    if def.namespaced() && ns.is_none() && method != Method::GET {
        return Err(ApiError::MethodNotAllowed);
    }
    if let Some(write) = write_of(&method, route.name.as_deref(), route.subresource.as_deref()) {
        let name = || match route.name.as_deref() {
            Some(n) => n.to_string(),
            // A create names its object in the body (or only a generateName prefix).
            None => parse_body(headers, body)
                .ok()
                .and_then(|b| {
                    meta::meta_str(&b, "name")
                        .or_else(|| meta::meta_str(&b, "generateName"))
                        .map(str::to_string)
                })
                .unwrap_or_default(),
        };
        if let Some(fault) = app.faults.take(def, write, name) {
            tracing::debug!(resource = %def.qualified_plural(), ?write, code = fault.code(), "injected write fault");
            return Err(fault);
        }
    }
    match (route.name.as_deref(), route.subresource.as_deref(), method) {
        (name, None, Method::GET) if name.is_none() || is_watch(query) => {
            let labels =
                LabelSelector::parse(query.get("labelSelector").map(String::as_str).unwrap_or(""))?;
            // The legacy single-object watch (`.../name?watch=true`) is a name field selector.
            let field_query = match (name, query.get("fieldSelector")) {
                (Some(n), Some(f)) if !f.is_empty() => format!("{f},metadata.name={n}"),
                (Some(n), _) => format!("metadata.name={n}"),
                (None, f) => f.cloned().unwrap_or_default(),
            };
            let fields = FieldSelector::parse(&field_query, &def.selectable_fields)?;
            if is_watch(query) {
                let timeout = match query.get("timeoutSeconds") {
                    Some(t) => t.parse::<u64>().map_err(|_| {
                        ApiError::BadRequest(format!("invalid timeoutSeconds {t:?}"))
                    })?,
                    None => 0,
                };
                // Absent or 0: the server picks (real: 30-60 min at random).
                let timeout = if timeout == 0 { 1800 } else { timeout };
                let req = WatchRequest {
                    def: def.clone(),
                    version: version.to_string(),
                    namespace: route.namespace.clone(),
                    labels,
                    fields,
                    resource_version: query.get("resourceVersion").cloned(),
                    bookmarks: query
                        .get("allowWatchBookmarks")
                        .is_some_and(|b| b == "true" || b == "1"),
                    send_initial_events: query
                        .get("sendInitialEvents")
                        .is_some_and(|b| b == "true" || b == "1"),
                    timeout: Duration::from_secs(timeout),
                    metadata_only: partial,
                };
                let body = watch::start(app.watch.clone(), req)?;
                return Ok(
                    ([(http::header::CONTENT_TYPE, "application/json")], body).into_response()
                );
            }
            let limit = match query.get("limit") {
                Some(l) => Some(
                    l.parse::<usize>()
                        .map_err(|_| ApiError::BadRequest(format!("invalid limit {l:?}")))?,
                ),
                None => None,
            };
            let list_query = ListQuery {
                labels: &labels,
                fields: &fields,
                limit,
                continue_token: query.get("continue").map(String::as_str),
            };
            let page = store.list(def, version, ns, &list_query)?;
            let mut metadata = json!({"resourceVersion": page.resource_version.to_string()});
            if let Some(token) = page.continue_token {
                metadata["continue"] = json!(token);
                metadata["remainingItemCount"] = json!(page.remaining.unwrap_or(0));
            }
            Ok(respond(
                partial,
                StatusCode::OK,
                list(def, version, metadata, page.items),
            ))
        }
        (None, None, Method::POST) => {
            let obj = parse_body(headers, body)?;
            let created = store.create(def, version, ns, obj)?;
            Ok(respond(partial, StatusCode::CREATED, created))
        }
        (None, None, Method::DELETE) => {
            let labels =
                LabelSelector::parse(query.get("labelSelector").map(String::as_str).unwrap_or(""))?;
            let fields = FieldSelector::parse(
                query.get("fieldSelector").map(String::as_str).unwrap_or(""),
                &def.selectable_fields,
            )?;
            let opts = delete_options(query, headers, body)?;
            let (items, rv) =
                store.delete_collection(def, version, ns, &labels, &fields, opts.propagation)?;
            Ok(respond(
                partial,
                StatusCode::OK,
                list(
                    def,
                    version,
                    json!({"resourceVersion": rv.to_string()}),
                    items,
                ),
            ))
        }
        (Some(name), None, Method::GET) => Ok(respond(
            partial,
            StatusCode::OK,
            store.get(def, version, ns, name)?,
        )),
        (Some(name), Some("status"), Method::GET) => Ok(respond(
            partial,
            StatusCode::OK,
            store.get(def, version, ns, name)?,
        )),
        (Some(name), sub @ (None | Some("status")), Method::PUT) => {
            let target = if sub.is_some() {
                Target::Status
            } else {
                Target::Main
            };
            let obj = parse_body(headers, body)?;
            Ok(respond(
                partial,
                StatusCode::OK,
                store.replace(def, version, ns, name, obj, target)?,
            ))
        }
        (Some(name), sub @ (None | Some("status")), Method::PATCH) => {
            let target = if sub.is_some() {
                Target::Status
            } else {
                Target::Main
            };
            let kind = PatchKind::from_content_type(
                headers
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok()),
            )?;
            if kind == PatchKind::Apply && query.get("fieldManager").is_none_or(String::is_empty) {
                return Err(ApiError::BadRequest(
                    "PATCH, application/apply-patch+yaml requests require fieldManager to be set"
                        .into(),
                ));
            }
            let patch = kind.parse_body(body)?;
            let (obj, created) = store.patch(def, version, ns, name, kind, &patch, target)?;
            Ok(respond(
                partial,
                if created {
                    StatusCode::CREATED
                } else {
                    StatusCode::OK
                },
                obj,
            ))
        }
        (Some(name), None, Method::DELETE) => {
            let opts = delete_options(query, headers, body)?;
            Ok(respond(
                partial,
                StatusCode::OK,
                store.delete(def, version, ns, name, &opts)?,
            ))
        }
        (Some(name), Some("scale"), method) => scale(app, &route, name, method, headers, body),
        _ => Err(ApiError::MethodNotAllowed),
    }
}

/// The `/scale` subresource as an `autoscaling/v1` Scale mapped onto the object's paths.
fn scale(
    app: &App,
    route: &Route,
    name: &str,
    method: Method,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response, ApiError> {
    let store = &app.watch.store;
    let (def, version, ns) = (
        &route.def,
        route.version.as_str(),
        route.namespace.as_deref(),
    );
    let paths = def.scale.clone().ok_or(ApiError::NoRoute)?;
    let to_scale = |obj: &Value| -> Value {
        let m = meta::meta(obj).cloned().unwrap_or_default();
        let mut status = json!({"replicas": meta::get_path(obj, &paths.status_replicas_path).cloned().unwrap_or(json!(0))});
        if let Some(sel) = paths
            .label_selector_path
            .as_deref()
            .and_then(|p| meta::get_path(obj, p))
        {
            status["selector"] = sel.clone();
        }
        json!({
            "kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {"name": m.get("name"), "namespace": m.get("namespace"), "uid": m.get("uid"),
                         "resourceVersion": m.get("resourceVersion"), "creationTimestamp": m.get("creationTimestamp")},
            "spec": {"replicas": meta::get_path(obj, &paths.spec_replicas_path).cloned().unwrap_or(json!(0))},
            "status": status,
        })
    };
    let current = store.get(def, version, ns, name)?;
    let desired = match method {
        Method::GET => return Ok(json_response(StatusCode::OK, to_scale(&current))),
        Method::PUT => parse_body(headers, body)?,
        Method::PATCH => {
            let kind = PatchKind::from_content_type(
                headers
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok()),
            )?;
            kind.apply(&to_scale(&current), &kind.parse_body(body)?)?
        }
        _ => return Err(ApiError::MethodNotAllowed),
    };
    let replicas = desired
        .pointer("/spec/replicas")
        .cloned()
        .ok_or_else(|| ApiError::Invalid {
            subject: Box::new(super::error::Subject {
                group: "autoscaling".into(),
                kind: "Scale".into(),
                qualified: "Scale.autoscaling".into(),
                name: name.into(),
            }),
            field: "spec.replicas".into(),
            detail: "Required value".into(),
        })?;
    let mut updated = current.clone();
    meta::set_path(&mut updated, &paths.spec_replicas_path, replicas);
    // A Scale with a resourceVersion is conditional on it; one without keeps the
    // stored one (unconditional), as the real scale subresource of a CR does.
    if let Some(rv) = desired
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .filter(|rv| !rv.is_empty())
    {
        meta::meta_mut(&mut updated).insert("resourceVersion".into(), json!(rv));
    }
    let written = store.replace(def, version, ns, name, updated, Target::Main)?;
    Ok(json_response(StatusCode::OK, to_scale(&written)))
}

/// Which write a request is, if it is one a fault can hit (see `faults`).
fn write_of(method: &Method, name: Option<&str>, subresource: Option<&str>) -> Option<Write> {
    match (method, name, subresource) {
        (&Method::POST, None, None) => Some(Write::Create),
        (&Method::PUT, Some(_), _) => Some(Write::Update),
        (&Method::PATCH, Some(_), _) => Some(Write::Patch),
        (&Method::DELETE, Some(_), None) => Some(Write::Delete),
        _ => None,
    }
}

fn is_watch(query: &Query) -> bool {
    query.get("watch").is_some_and(|w| w == "true" || w == "1")
}

fn list(def: &ResourceDef, version: &str, metadata: Value, items: Vec<Value>) -> Value {
    json!({"kind": format!("{}List", def.kind), "apiVersion": def.api_version(version), "metadata": metadata, "items": items})
}

fn delete_options(
    query: &Query,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<DeleteOptions, ApiError> {
    let opts: Value = if body.is_empty() {
        json!({})
    } else if is_protobuf(headers) {
        // controller-runtime sends DeleteOptions of built-in kinds as protobuf
        // (client-go does not fall back to JSON on a 415 for protobuf).
        super::protobuf::delete_options(body).ok_or_else(|| {
            ApiError::BadRequest("the protobuf DeleteOptions body could not be decoded".into())
        })?
    } else {
        parse_body(headers, body)?
    };
    if opts
        .get("dryRun")
        .and_then(Value::as_array)
        .is_some_and(|d| !d.is_empty())
    {
        return Err(ApiError::BadRequest(
            "dryRun is not supported by the test API server".into(),
        ));
    }
    let policy = opts
        .get("propagationPolicy")
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| query.get("propagationPolicy").cloned());
    let orphan_dependents = opts.get("orphanDependents").and_then(Value::as_bool);
    let propagation = match (policy.as_deref(), orphan_dependents) {
        (Some("Orphan"), _) | (None, Some(true)) => Propagation::Orphan,
        (Some("Foreground"), _) => Propagation::Foreground,
        (Some("Background") | None, _) => Propagation::Background,
        (Some(other), _) => {
            return Err(ApiError::BadRequest(format!(
                "propagationPolicy: Unsupported value: {other:?}: supported values: \"Foreground\", \"Background\", \"Orphan\""
            )));
        }
    };
    let precondition = |field: &str| {
        opts.pointer(&format!("/preconditions/{field}"))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    Ok(DeleteOptions {
        propagation,
        precondition_uid: precondition("uid"),
        precondition_rv: precondition("resourceVersion"),
    })
}

fn is_protobuf(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().starts_with("application/vnd.kubernetes.protobuf"))
}

/// A create/update/delete body: JSON (or YAML); CBOR gets 415, on which
/// client-go retries with JSON; protobuf gets 415 too, except a DELETE's
/// `DeleteOptions` (see `delete_options`): client-go does not fall back from
/// protobuf, and controller-runtime sends protobuf for built-in kinds.
fn parse_body(headers: &HeaderMap, body: &Bytes) -> Result<Value, ApiError> {
    let content_type = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    match content_type.as_str() {
        "" | "application/json" | "*/*" => parse_json(body),
        "application/yaml" => crate::yaml::from_slice(body)
            .map_err(|e| ApiError::BadRequest(format!("the request body is not valid YAML: {e}"))),
        _ => Err(ApiError::UnsupportedMediaType(
            "application/json, application/yaml".into(),
        )),
    }
}

fn parse_json(body: &Bytes) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::BadRequest(format!("the request body is not valid JSON: {e}")))
}

/// kube's `*_metadata` calls ask for `PartialObjectMetadata(List)` in the Accept header.
fn wants_partial_metadata(headers: &HeaderMap) -> bool {
    headers
        .get_all(http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("as=PartialObjectMetadata"))
}

/// An object or list response, reduced to metadata when the client asked for that.
fn respond(partial: bool, code: StatusCode, value: Value) -> Response {
    if !partial {
        return json_response(code, value);
    }
    let reduced = match value.get("items").and_then(Value::as_array) {
        Some(items) => json!({
            "kind": "PartialObjectMetadataList",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": value.get("metadata").cloned().unwrap_or(json!({})),
            "items": items.iter().map(partial_object).collect::<Vec<_>>(),
        }),
        None => partial_object(&value),
    };
    json_response(code, reduced)
}

fn json_response(code: StatusCode, value: Value) -> Response {
    (code, axum::Json(value)).into_response()
}
