//! Discovery documents: `/` (the path list), `/version`, `/api`, `/apis`, and the per-group-version resource lists.

use std::cmp::Ordering;
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

/// Each group's served versions, highest priority first: the order of the real
/// discovery documents, whose first version is the group's preferred version
/// (for CRDs whatever their storage version or the order they list versions in).
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
    for versions in out.values_mut() {
        versions.sort_by(|a, b| kube_aware_priority(b, a));
    }
    out
}

/// Kubernetes' version priority (apimachinery's `CompareKubeAwareVersionStrings`):
/// `vN` before `vNbetaM` before `vNalphaM`, higher numbers first within each;
/// any other name after those, alphabetically. `Greater` = `a` is preferred.
fn kube_aware_priority(a: &str, b: &str) -> Ordering {
    match (kube_version(a), kube_version(b)) {
        (Some(a), Some(b)) => a.cmp(&b),
        (Some(_), None) => Ordering::Greater,
        (None, Some(_)) => Ordering::Less,
        (None, None) => b.cmp(a),
    }
}

/// `(stability, major, minor)` of a `v1`, `v2beta3`, `v1alpha1`: GA 2, beta 1, alpha 0.
fn kube_version(version: &str) -> Option<(u8, u64, u64)> {
    let rest = version.strip_prefix('v')?;
    let digits = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    let major = rest[..digits].parse().ok()?;
    let (stability, minor) = match &rest[digits..] {
        "" => return Some((2, major, 0)),
        tail => match tail.strip_prefix("beta") {
            Some(minor) => (1, minor),
            None => (0, tail.strip_prefix("alpha")?),
        },
    };
    if minor.is_empty() || !minor.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((stability, major, minor.parse().ok()?))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_sort_by_kubernetes_priority() {
        let mut versions = vec![
            "v1alpha1",
            "v1beta1",
            "foo1",
            "v1",
            "v2beta1",
            "v1beta2",
            "v10",
            "v2",
            "v11alpha2",
            "bar",
        ];
        versions.sort_by(|a, b| kube_aware_priority(b, a));
        assert_eq!(
            versions,
            [
                "v10",
                "v2",
                "v1",
                "v2beta1",
                "v1beta2",
                "v1beta1",
                "v11alpha2",
                "v1alpha1",
                "bar",
                "foo1"
            ]
        );
    }

    #[test]
    fn a_groups_preferred_version_is_its_highest_priority_one() {
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        // Listed oldest first and stored in the middle, as a CRD may be.
        let crd: CustomResourceDefinition = serde_json::from_value(json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com"},
            "spec": {"group": "example.com", "scope": "Namespaced",
              "names": {"kind": "Widget", "plural": "widgets"},
              "versions": [
                {"name": "v1beta1", "served": true, "storage": false},
                {"name": "v1beta2", "served": true, "storage": true},
                {"name": "v1beta3", "served": true, "storage": false}]}
        }))
        .unwrap();
        let mut registry = Registry::default();
        registry.add(super::super::resource::ResourceDef::from_crd(&crd));
        let group = document(&registry, &["apis", "example.com"]).unwrap();
        assert_eq!(group["preferredVersion"]["version"], "v1beta3");
        let versions: Vec<&str> = group["versions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["version"].as_str().unwrap())
            .collect();
        assert_eq!(versions, ["v1beta3", "v1beta2", "v1beta1"]);
    }
}
