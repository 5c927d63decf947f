//! The clusterctl provider artifacts, generated from the code so they cannot
//! drift from it: `control-plane-components.yaml` (namespace, CRDs, RBAC,
//! Deployment; every object labelled `cluster.x-k8s.io/provider:
//! control-plane-k3s`, `${NAME:=default}` placeholders for clusterctl) and
//! `metadata.yaml` (release series to CAPI contract). Pure: rendering reads
//! nothing but the code. `hack/clusterctl/` holds the rendered files; a test
//! fails when they are stale.

pub mod deployment;
pub mod metadata;
pub mod rbac;
pub mod variables;
pub mod webhook;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

/// clusterctl's provider label, on every object of the components.
pub const PROVIDER_LABEL: &str = "cluster.x-k8s.io/provider";
/// Our provider's name in it (`<type>-<name>`, as clusterctl forms it).
pub const PROVIDER_NAME: &str = "control-plane-k3s";
/// CAPI core's manager role aggregates ClusterRoles carrying this label.
pub const AGGREGATE_TO_MANAGER_LABEL: &str = "cluster.x-k8s.io/aggregate-to-manager";

/// Name of the ServiceAccount, the Deployment and the roles' prefix.
pub const NAME: &str = "k3s-control-plane";
/// The Pods' label (selector of the Deployment and of the anti-affinity).
pub const APP_LABEL: (&str, &str) = ("app.kubernetes.io/name", NAME);
pub const MANAGER_ROLE: &str = "k3s-control-plane-manager";
pub const SECRETS_ROLE: &str = "k3s-control-plane-secrets";
pub const LEADER_ELECTION_ROLE: &str = "k3s-control-plane-leader-election";
pub const CAPI_CORE_ROLE: &str = "k3s-control-plane-capi-core";
pub const CONTRACT_VERSIONS_ROLE: &str = "k3s-control-plane-contract-versions";

/// File names clusterctl expects in a release.
pub const COMPONENTS_FILE: &str = "control-plane-components.yaml";
pub const METADATA_FILE: &str = "metadata.yaml";
/// Where the rendered files live in this repository.
pub const COMMITTED_DIR: &str = "hack/clusterctl";
/// The command that regenerates [`COMMITTED_DIR`].
pub const REGENERATE_COMMAND: &str = "cargo run -- components --out hack/clusterctl";

/// How the components are scoped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// `None`: the controller watches every namespace (ClusterRoleBindings).
    /// `Some(ns)`: it runs with `--namespace ns` and its roles are bound by
    /// RoleBindings in `ns` only, Secrets included.
    pub watch_namespace: Option<String>,
    /// `None`: one Deployment ([`NAME`]) whose `--watch-filter` is the
    /// `K3S_CONTROL_PLANE_WATCH_FILTER` variable. `Some(shards)`: one
    /// Deployment per shard (see [`deployment::Shards`]), each with its own
    /// filter value and Lease, sharing the CRDs, RBAC and webhook Service.
    pub shards: Option<deployment::Shards>,
}

/// Every object of the components, in apply order (namespace, CRDs, RBAC,
/// Deployment), each labelled with [`PROVIDER_LABEL`].
pub fn objects(options: &Options) -> Vec<Value> {
    let namespace = variables::NAMESPACE.placeholder();
    let mut objects: Vec<Value> = vec![to_value(Namespace {
        metadata: meta(&namespace, None),
        ..Default::default()
    })];
    objects.extend(
        crate::api::crds::ours_in(&namespace)
            .into_iter()
            .map(to_value),
    );
    objects.extend(webhook::objects(&namespace));
    objects.push(to_value(ServiceAccount {
        metadata: meta(NAME, Some(&namespace)),
        ..Default::default()
    }));
    objects.extend(role_objects(options, &namespace));
    objects.extend(
        deployment::deployments(options, &namespace)
            .into_iter()
            .map(to_value),
    );
    for object in &mut objects {
        label(object);
    }
    objects
}

fn role_objects(options: &Options, namespace: &str) -> Vec<Value> {
    let account = Subject {
        kind: "ServiceAccount".into(),
        name: NAME.into(),
        namespace: Some(namespace.to_string()),
        ..Default::default()
    };
    let cluster_role = |name: &str, permissions| ClusterRole {
        metadata: meta(name, None),
        rules: Some(rbac::rules(permissions)),
        ..Default::default()
    };
    let mut capi_core = cluster_role(CAPI_CORE_ROLE, rbac::CAPI_CORE);
    capi_core
        .metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(AGGREGATE_TO_MANAGER_LABEL.into(), "true".into());
    let mut out = vec![
        to_value(cluster_role(MANAGER_ROLE, rbac::MANAGER)),
        to_value(cluster_role(SECRETS_ROLE, rbac::SECRETS)),
        to_value(capi_core),
        to_value(cluster_role(
            CONTRACT_VERSIONS_ROLE,
            rbac::CONTRACT_VERSIONS,
        )),
        to_value(ClusterRoleBinding {
            metadata: meta(CONTRACT_VERSIONS_ROLE, None),
            role_ref: RoleRef {
                api_group: Some("rbac.authorization.k8s.io".into()),
                kind: "ClusterRole".into(),
                name: CONTRACT_VERSIONS_ROLE.into(),
            },
            subjects: Some(vec![account.clone()]),
        }),
    ];
    for role in [MANAGER_ROLE, SECRETS_ROLE] {
        let role_ref = RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: role.into(),
        };
        out.push(match &options.watch_namespace {
            None => to_value(ClusterRoleBinding {
                metadata: meta(role, None),
                role_ref,
                subjects: Some(vec![account.clone()]),
            }),
            Some(watched) => to_value(RoleBinding {
                metadata: meta(role, Some(watched)),
                role_ref,
                subjects: Some(vec![account.clone()]),
            }),
        });
    }
    out.push(to_value(Role {
        metadata: meta(LEADER_ELECTION_ROLE, Some(namespace)),
        rules: Some(rbac::rules(rbac::LEADER_ELECTION)),
    }));
    out.push(to_value(RoleBinding {
        metadata: meta(LEADER_ELECTION_ROLE, Some(namespace)),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: LEADER_ELECTION_ROLE.into(),
        },
        subjects: Some(vec![account]),
    }));
    out
}

/// `control-plane-components.yaml`: a header, then one document per object.
pub fn render(options: &Options) -> String {
    let mut out = format!(
        "# k3s-control-plane {} components for clusterctl (contract {}).\n\
         # Generated by `k3s-control-plane components`; do not edit: {}\n\
         # Variables (clusterctl substitutes them; `components --substitute` does too):\n",
        env!("CARGO_PKG_VERSION"),
        metadata::CONTRACT,
        REGENERATE_COMMAND,
    );
    for v in variables::ALL {
        if options.shards.is_some() && v == variables::WATCH_FILTER {
            // Each shard's value is fixed in its Deployment.
            continue;
        }
        out.push_str(&format!(
            "#   {} (default {:?}): {}\n",
            v.name, v.default, v.sets
        ));
    }
    if let Some(shards) = &options.shards {
        out.push_str(&format!(
            "# Watch-filter shards: {} Deployments; label each Cluster and its KThreesControlPlane\n\
             #   {}=<value>, one of: {}\n",
            shards.count,
            crate::api::names::WATCH_FILTER_LABEL,
            shards
                .list()
                .iter()
                .map(|s| s.watch_filter.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    for object in objects(options) {
        out.push_str("---\n");
        out.push_str(
            &crate::yaml::to_string(&object).expect("JSON values always serialize to YAML"),
        );
    }
    out
}

/// [`render`] with every placeholder replaced (from `values`, else its default).
pub fn render_substituted(
    options: &Options,
    values: &BTreeMap<String, String>,
) -> Result<String, variables::PlaceholderError> {
    variables::substitute(&render(options), values)
}

/// Write [`COMPONENTS_FILE`] and [`METADATA_FILE`] into `dir` (created if missing).
pub fn write_all(dir: &Path, options: &Options) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let components = dir.join(COMPONENTS_FILE);
    std::fs::write(&components, render(options))?;
    let metadata = dir.join(METADATA_FILE);
    std::fs::write(&metadata, metadata::render())?;
    Ok(vec![components, metadata])
}

pub(crate) fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: namespace.map(str::to_string),
        ..Default::default()
    }
}

fn to_value<T: serde::Serialize>(object: T) -> Value {
    serde_json::to_value(object).expect("Kubernetes objects always serialize to JSON")
}

fn label(object: &mut Value) {
    let metadata = object
        .as_object_mut()
        .expect("every object is a JSON object")
        .entry("metadata")
        .or_insert_with(|| Value::Object(Default::default()));
    let labels = metadata
        .as_object_mut()
        .expect("metadata is an object")
        .entry("labels")
        .or_insert_with(|| Value::Object(Default::default()));
    labels
        .as_object_mut()
        .expect("labels is an object")
        .insert(PROVIDER_LABEL.into(), PROVIDER_NAME.into());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(objects: &[Value]) -> Vec<String> {
        objects
            .iter()
            .map(|o| o["kind"].as_str().unwrap().to_string())
            .collect()
    }

    #[test]
    fn cluster_wide_components_bind_the_roles_cluster_wide() {
        let objects = objects(&Options::default());
        let kinds = kinds(&objects);
        assert_eq!(kinds[0], "Namespace");
        assert_eq!(kinds.last().unwrap(), "Deployment");
        assert_eq!(
            kinds.iter().filter(|k| *k == "ClusterRoleBinding").count(),
            3
        );
        for o in &objects {
            assert_eq!(
                o["metadata"]["labels"][PROVIDER_LABEL], PROVIDER_NAME,
                "{o}"
            );
        }
    }

    #[test]
    fn namespace_scoped_components_bind_manager_and_secrets_in_that_namespace_only() {
        let objects = objects(&Options {
            watch_namespace: Some("tenant-a".into()),
            ..Options::default()
        });
        // Only CRDs (cluster-scoped, read by name) are granted cluster-wide.
        let cluster_bindings: Vec<&str> = objects
            .iter()
            .filter(|o| o["kind"] == "ClusterRoleBinding")
            .map(|o| o["roleRef"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(cluster_bindings, [CONTRACT_VERSIONS_ROLE]);
        let bindings: Vec<&Value> = objects
            .iter()
            .filter(|o| o["kind"] == "RoleBinding" && o["metadata"]["namespace"] == "tenant-a")
            .collect();
        let refs: Vec<&str> = bindings
            .iter()
            .map(|b| b["roleRef"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(refs, [MANAGER_ROLE, SECRETS_ROLE]);
        let deployment = objects.last().unwrap();
        let args = &deployment["spec"]["template"]["spec"]["containers"][0]["args"];
        assert!(
            args.as_array()
                .unwrap()
                .iter()
                .any(|a| a == "--namespace=tenant-a"),
            "{args}"
        );
    }
}
