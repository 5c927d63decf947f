//! The authorization attributes of a request, derived from its method, path and query
//! alone as kube-apiserver's `RequestInfoFactory` does (before routing: a request for a
//! resource that is not served is judged too, and a denied one gets 403, not 404).

use std::collections::HashMap;

use http::{HeaderMap, Method};

/// What RBAC judges: verb, API group, resource, subresource, namespace and name of a
/// resource request, or the verb and path of a non-resource request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attributes {
    pub verb: String,
    pub resource_request: bool,
    pub api_group: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    /// The URL path (what a non-resource rule and message name).
    pub path: String,
}

/// `/namespaces/{ns}/{these}` are subresources of the namespace, not resources in it.
const NAMESPACE_SUBRESOURCES: &[&str] = &["status", "finalize"];

/// Pod subresources whose WebSocket upgrade also needs `create` (see [`compound_create`]).
const POD_STREAMING: &[&str] = &["exec", "attach", "portforward"];

/// The attributes of a request.
///
/// - `GET` without a name is `list`, or `watch` with `watch=true`; a `metadata.name=x`
///   field selector then supplies the name (so `resourceNames` can allow a list or
///   watch of one object). `DELETE` without a name is `deletecollection`.
/// - A `GET ...?watch=true` on one object (this server's single-object watch; the real
///   one spells it `/watch/.../name`) is `watch` of that name.
/// - A WebSocket upgrade of `pods/portforward` (a `GET`) is `get`; see
///   [`compound_create`] for the second check it gets.
/// - `/api/v1/namespaces/{ns}` (and its `status`/`finalize`) is in namespace `ns`.
pub fn of(method: &Method, path: &str, query: &HashMap<String, String>) -> Attributes {
    let mut attrs = Attributes {
        verb: method.as_str().to_ascii_lowercase(),
        path: path.to_string(),
        ..Default::default()
    };
    let parts: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let rest: &[&str] = match parts.as_slice() {
        ["api", _version, rest @ ..] if !rest.is_empty() => rest,
        ["apis", group, _version, rest @ ..] if !rest.is_empty() => {
            attrs.api_group = group.to_string();
            rest
        }
        _ => return attrs,
    };
    attrs.resource_request = true;
    attrs.verb = match *method {
        Method::POST => "create",
        Method::GET | Method::HEAD => "get",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "",
    }
    .to_string();
    let mut rest = rest;
    if rest[0] == "namespaces" && rest.len() > 1 {
        attrs.namespace = rest[1].to_string();
        if rest.len() > 2 && !NAMESPACE_SUBRESOURCES.contains(&rest[2]) {
            rest = &rest[2..];
        }
    }
    attrs.resource = rest[0].to_string();
    if let Some(name) = rest.get(1) {
        attrs.name = name.to_string();
    }
    if let Some(sub) = rest.get(2) {
        attrs.subresource = sub.to_string();
    }
    let watch = query.get("watch").is_some_and(|w| w == "true" || w == "1");
    if attrs.verb == "get" && attrs.name.is_empty() {
        attrs.verb = if watch { "watch" } else { "list" }.to_string();
        if let Some(name) = query.get("fieldSelector").and_then(|f| exact_name(f)) {
            attrs.name = name;
        }
    } else if attrs.verb == "get" && attrs.subresource.is_empty() && watch {
        attrs.verb = "watch".to_string();
    }
    if attrs.verb == "delete" && attrs.name.is_empty() {
        attrs.verb = "deletecollection".to_string();
    }
    attrs
}

/// The second authorization a WebSocket upgrade (`GET`) of `pods/exec`, `pods/attach`
/// or `pods/portforward` needs after `get`: the same attributes with verb `create`,
/// as their SPDY `POST` has. Compound authorization of the feature
/// `AuthorizePodWebsocketUpgradeCreatePermission` (KEP 4006; on by default in
/// current Kubernetes, beta since 1.35 by the feature-gate table; earlier servers
/// check `get` only), so a role needs both verbs.
pub fn compound_create(attrs: &Attributes, headers: &HeaderMap) -> Option<Attributes> {
    (attrs.verb == "get"
        && attrs.api_group.is_empty()
        && attrs.resource == "pods"
        && POD_STREAMING.contains(&attrs.subresource.as_str())
        && is_websocket_upgrade(headers))
    .then(|| Attributes {
        verb: "create".into(),
        ..attrs.clone()
    })
}

/// The name a field selector pins down (`metadata.name=x` or `metadata.name==x`,
/// possibly among other requirements), as `RequiresExactMatch` finds it.
fn exact_name(selector: &str) -> Option<String> {
    selector.split(',').find_map(|term| {
        let (key, value) = term
            .split_once("==")
            .or_else(|| term.split_once('='))
            .filter(|(k, _)| !k.ends_with('!'))?;
        (key.trim() == "metadata.name" && !value.is_empty() && !value.contains('/'))
            .then(|| value.trim().to_string())
    })
}

fn is_websocket_upgrade(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(method: Method, path: &str, query: &[(&str, &str)]) -> Attributes {
        let query = query
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        of(&method, path, &query)
    }

    fn short(a: &Attributes) -> (&str, &str, &str, &str, &str, &str) {
        (
            &a.verb,
            &a.api_group,
            &a.resource,
            &a.subresource,
            &a.namespace,
            &a.name,
        )
    }

    #[test]
    fn verbs_follow_method_name_and_watch() {
        let get = attrs(Method::GET, "/api/v1/namespaces/ns/secrets/s", &[]);
        assert_eq!(short(&get), ("get", "", "secrets", "", "ns", "s"));
        let list = attrs(Method::GET, "/api/v1/namespaces/ns/secrets", &[]);
        assert_eq!(list.verb, "list");
        let watch = attrs(Method::GET, "/api/v1/secrets", &[("watch", "true")]);
        assert_eq!(short(&watch), ("watch", "", "secrets", "", "", ""));
        let one = attrs(
            Method::GET,
            "/api/v1/namespaces/ns/secrets/s",
            &[("watch", "1")],
        );
        assert_eq!(short(&one), ("watch", "", "secrets", "", "ns", "s"));
        let del = attrs(Method::DELETE, "/api/v1/namespaces/ns/secrets", &[]);
        assert_eq!(del.verb, "deletecollection");
        let put = attrs(Method::PUT, "/api/v1/namespaces/ns/secrets/s", &[]);
        assert_eq!(put.verb, "update");
    }

    #[test]
    fn a_name_field_selector_names_the_list() {
        let list = attrs(
            Method::GET,
            "/apis/cluster.x-k8s.io/v1beta2/namespaces/ns/machines",
            &[("fieldSelector", "metadata.name=m-1"), ("watch", "true")],
        );
        assert_eq!(
            short(&list),
            ("watch", "cluster.x-k8s.io", "machines", "", "ns", "m-1")
        );
        let not = attrs(
            Method::GET,
            "/api/v1/secrets",
            &[("fieldSelector", "metadata.name!=m-1")],
        );
        assert_eq!(not.name, "");
    }

    #[test]
    fn subresources_namespaces_and_non_resource_paths() {
        let status = attrs(
            Method::PATCH,
            "/apis/cluster.x-k8s.io/v1beta2/namespaces/ns/machines/m/status",
            &[],
        );
        assert_eq!(
            short(&status),
            ("patch", "cluster.x-k8s.io", "machines", "status", "ns", "m")
        );
        let ns = attrs(Method::GET, "/api/v1/namespaces/ns", &[]);
        assert_eq!(short(&ns), ("get", "", "namespaces", "", "ns", "ns"));
        let fin = attrs(Method::PUT, "/api/v1/namespaces/ns/finalize", &[]);
        assert_eq!(
            short(&fin),
            ("update", "", "namespaces", "finalize", "ns", "ns")
        );
        let all = attrs(Method::GET, "/api/v1/namespaces", &[]);
        assert_eq!(short(&all), ("list", "", "namespaces", "", "", ""));
        for path in ["/api", "/api/v1", "/apis/g/v1", "/version", "/openapi/v2"] {
            let a = attrs(Method::GET, path, &[]);
            assert!(!a.resource_request, "{path}");
            assert_eq!((a.verb.as_str(), a.path.as_str()), ("get", path));
        }
    }

    #[test]
    fn a_websocket_port_forward_is_get_then_create() {
        let mut headers = HeaderMap::new();
        let path = "/api/v1/namespaces/ns/pods/p/portforward";
        let a = of(&Method::GET, path, &HashMap::new());
        assert_eq!(short(&a), ("get", "", "pods", "portforward", "ns", "p"));
        assert_eq!(compound_create(&a, &headers), None, "not an upgrade");
        headers.insert(http::header::UPGRADE, "websocket".parse().unwrap());
        let create = compound_create(&a, &headers).unwrap();
        assert_eq!(
            short(&create),
            ("create", "", "pods", "portforward", "ns", "p")
        );
    }
}
