//! Discovery documents: `/` (the path list), `/version`, `/api`, `/apis`, and the per-group-version resource lists.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::resource::Registry;

/// The discovery document for these path segments, if the path is a discovery path.
pub fn document(registry: &Registry, segments: &[&str]) -> Option<Value> {
    match segments {
        // A real API server lists its paths at `/` (Cluster API's ClusterCache
        // probes a workload cluster with `GET /` before it uses it).
        [] => {
            let mut paths = vec![
                "/api".to_string(),
                "/api/v1".to_string(),
                "/apis".to_string(),
            ];
            for (g, vs) in groups(registry) {
                paths.push(format!("/apis/{g}"));
                paths.extend(vs.iter().map(|v| format!("/apis/{g}/{v}")));
            }
            paths.push("/version".to_string());
            Some(json!({"paths": paths}))
        }
        ["version"] => Some(json!({
            "major": "1", "minor": "34", "gitVersion": "v1.34.0-k3s-control-plane-test",
            "gitCommit": "", "gitTreeState": "clean", "buildDate": "1970-01-01T00:00:00Z",
            "goVersion": "n/a", "compiler": "rustc", "platform": "linux/amd64"
        })),
        ["api"] => Some(
            json!({"kind": "APIVersions", "apiVersion": "v1", "versions": ["v1"], "serverAddressByClientCIDRs": []}),
        ),
        ["api", "v1"] => Some(resource_list(registry, "", "v1")),
        ["apis"] => Some(json!({
            "kind": "APIGroupList", "apiVersion": "v1",
            "groups": groups(registry).iter().map(|(g, vs)| group(g, vs)).collect::<Vec<_>>(),
        })),
        ["apis", g] => groups(registry).get(*g).map(|vs| {
            let mut doc = group(g, vs);
            doc["kind"] = json!("APIGroup");
            doc["apiVersion"] = json!("v1");
            doc
        }),
        ["apis", g, v]
            if groups(registry)
                .get(*g)
                .is_some_and(|vs| vs.iter().any(|x| x == v)) =>
        {
            Some(resource_list(registry, g, v))
        }
        _ => None,
    }
}

fn groups(registry: &Registry) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for def in registry.all().iter().filter(|d| !d.group.is_empty()) {
        let versions = out.entry(def.group.clone()).or_default();
        for v in &def.versions {
            if !versions.contains(v) {
                versions.push(v.clone());
            }
        }
    }
    out
}

fn group(name: &str, versions: &[String]) -> Value {
    let gv = |v: &String| json!({"groupVersion": format!("{name}/{v}"), "version": v});
    json!({"name": name, "versions": versions.iter().map(gv).collect::<Vec<_>>(), "preferredVersion": gv(&versions[0])})
}

fn resource_list(registry: &Registry, group: &str, version: &str) -> Value {
    let verbs = json!([
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch"
    ]);
    let mut resources = Vec::new();
    for def in registry
        .all()
        .iter()
        .filter(|d| d.group == group && d.versions.iter().any(|v| v == version))
    {
        resources.push(json!({"name": def.plural, "singularName": def.kind.to_lowercase(), "namespaced": def.namespaced(), "kind": def.kind, "verbs": verbs, "shortNames": def.short_names}));
        if def.status {
            resources.push(json!({"name": format!("{}/status", def.plural), "singularName": "", "namespaced": def.namespaced(), "kind": def.kind, "verbs": ["get", "patch", "update"]}));
        }
        if def.scale.is_some() {
            resources.push(json!({"name": format!("{}/scale", def.plural), "singularName": "", "namespaced": def.namespaced(), "group": "autoscaling", "version": "v1", "kind": "Scale", "verbs": ["get", "patch", "update"]}));
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources})
}
