//! Cluster API's ClusterClass topology controller, as far as it writes the
//! control plane, simulated for the tests that cannot run CAPI's manager.
//! Follows cluster-api (`exp/topology/desiredstate/desired_state.go`,
//! `computeControlPlane` and `computeControlPlaneVersion`;
//! `internal/contract/controlplane.go`, `IsProvisioning` and `IsUpgrading`):
//!
//! - the control plane is the template's `spec.template.spec`, with
//!   `spec.version`, `spec.replicas` (from `Cluster.spec.topology.controlPlane`),
//!   `spec.machineTemplate.metadata` (the topology's control-plane metadata)
//!   and `spec.machineTemplate.spec.infrastructureRef` (the class's machine
//!   infrastructure template, as `apiGroup`/`kind`/`name`: the v1beta2
//!   contract's paths, since our CRD lists v1beta3 under that contract);
//!   the object's labels carry `cluster.x-k8s.io/cluster-name` and
//!   `topology.cluster.x-k8s.io/owned`, its owner is the Cluster;
//! - written by server-side apply, field manager `capi-topology`, forced;
//! - a new control plane gets the topology's version; an existing one keeps
//!   its `spec.version` while it is provisioning (`status.version` unset) or
//!   upgrading (`spec.version` above `status.version`), and otherwise takes
//!   the topology's version (one minor at a time is the user's business: the
//!   upgrade plan of a one-minor change is that version).
//!
//! Not simulated: the ClusterClass object itself (the class is given as a
//! [`ClassRefs`]), template cloning and rotation (the machine template is
//! referenced as given), variables and patches, runtime hooks, workers.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams};
use kube::{Client, Resource, ResourceExt};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::api::names::CLUSTER_NAME_LABEL;
use crate::api::{Cluster, KThreesControlPlane, KThreesControlPlaneTemplate};

/// The field manager CAPI's topology controller applies with.
pub const FIELD_MANAGER: &str = "capi-topology";
/// Label on every object the topology owns.
pub const TOPOLOGY_OWNED_LABEL: &str = "topology.cluster.x-k8s.io/owned";

/// What the ClusterClass names for the control plane.
#[derive(Clone, Debug)]
pub struct ClassRefs {
    /// `KThreesControlPlaneTemplate` name.
    pub control_plane_template: String,
    /// The machine infrastructure template (group, kind, name).
    pub machine_infrastructure: (String, String, String),
}

/// The desired control plane of `cluster` (pure).
pub fn desired_control_plane(
    cluster: &Cluster,
    template: &KThreesControlPlaneTemplate,
    class: &ClassRefs,
    name: &str,
    current: Option<&KThreesControlPlane>,
) -> Option<Value> {
    let topology = cluster.spec.extra.get("topology")?;
    let topology_version = topology["version"].as_str()?;
    let mut spec = serde_json::to_value(&template.spec.template.spec).ok()?;
    let control_plane = &topology["controlPlane"];
    if let Some(replicas) = control_plane["replicas"].as_i64() {
        spec["replicas"] = json!(replicas);
    }
    spec["version"] = json!(control_plane_version(topology_version, current));
    let (group, kind, template_name) = &class.machine_infrastructure;
    if spec.get("machineTemplate").is_none() {
        spec["machineTemplate"] = json!({});
    }
    spec["machineTemplate"]["spec"]["infrastructureRef"] =
        json!({"apiGroup": group, "kind": kind, "name": template_name});
    if let Some(metadata) = control_plane.get("metadata").filter(|m| m.is_object()) {
        spec["machineTemplate"]["metadata"] = metadata.clone();
    }
    let mut labels = template.spec.template.metadata.labels.clone();
    labels.insert(CLUSTER_NAME_LABEL.into(), cluster.name_any());
    labels.insert(TOPOLOGY_OWNED_LABEL.into(), String::new());
    Some(json!({
        "apiVersion": KThreesControlPlane::api_version(&()),
        "kind": KThreesControlPlane::kind(&()),
        "metadata": {
            "name": name,
            "namespace": cluster.namespace(),
            "labels": labels,
            "annotations": template.spec.template.metadata.annotations,
            "ownerReferences": [{
                "apiVersion": Cluster::api_version(&()), "kind": "Cluster",
                "name": cluster.name_any(), "uid": cluster.uid(),
            }],
        },
        "spec": spec,
    }))
}

/// `computeControlPlaneVersion`, without hooks and workers.
pub fn control_plane_version(topology: &str, current: Option<&KThreesControlPlane>) -> String {
    let Some(current) = current else {
        return topology.to_string();
    };
    let status_version = current.status.as_ref().and_then(|s| s.version.as_deref());
    let provisioning = status_version.is_none_or(str::is_empty);
    let upgrading = status_version.is_some_and(|s| {
        let (spec, status) = (
            crate::api::validate::K3sVersion::parse(&current.spec.version),
            crate::api::validate::K3sVersion::parse(s),
        );
        matches!((spec, status), (Some(a), Some(b)) if a > b)
    });
    if provisioning || upgrading {
        current.spec.version.clone()
    } else {
        topology.to_string()
    }
}

/// One pass: apply the desired control plane of `cluster` (if its topology
/// and the template are there); returns the version written.
pub async fn reconcile(
    client: &Client,
    namespace: &str,
    cluster: &str,
    class: &ClassRefs,
    name: &str,
) -> kube::Result<Option<String>> {
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), namespace);
    let templates: Api<KThreesControlPlaneTemplate> = Api::namespaced(client.clone(), namespace);
    let kcps: Api<KThreesControlPlane> = Api::namespaced(client.clone(), namespace);
    let Some(cluster) = clusters.get_opt(cluster).await? else {
        return Ok(None);
    };
    let Some(template) = templates.get_opt(&class.control_plane_template).await? else {
        return Ok(None);
    };
    let current = kcps.get_opt(name).await?;
    let Some(desired) = desired_control_plane(&cluster, &template, class, name, current.as_ref())
    else {
        return Ok(None);
    };
    let version = desired["spec"]["version"].as_str().map(str::to_string);
    kcps.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&desired),
    )
    .await?;
    Ok(version)
}

/// The simulated topology controller, reconciling every `every` until dropped.
pub struct TopologySim {
    task: JoinHandle<()>,
    paused: Arc<AtomicBool>,
}

impl Drop for TopologySim {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TopologySim {
    pub fn start(
        client: Client,
        namespace: &str,
        cluster: &str,
        class: ClassRefs,
        name: &str,
        every: Duration,
    ) -> Self {
        let paused = Arc::new(AtomicBool::new(false));
        let (namespace, cluster, name) =
            (namespace.to_string(), cluster.to_string(), name.to_string());
        let flag = paused.clone();
        let task = tokio::spawn(async move {
            loop {
                if !flag.load(Ordering::SeqCst)
                    && let Err(e) = reconcile(&client, &namespace, &cluster, &class, &name).await
                {
                    tracing::debug!(error = %e, "topology simulation pass failed");
                }
                tokio::time::sleep(every).await;
            }
        });
        TopologySim { task, paused }
    }

    /// Stop writing (as a topology controller that is down or waits on a hook).
    pub fn pause(&self) {
        self.paused.store(true, Ordering::SeqCst);
    }

    pub fn resume(&self) {
        self.paused.store(false, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(version: &str) -> Cluster {
        serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": "demo", "namespace": "default", "uid": "c-uid"},
            "spec": {"topology": {"classRef": {"name": "k3s"}, "version": version,
                     "controlPlane": {"replicas": 3, "metadata": {"labels": {"team": "a"}}}}}
        }))
        .unwrap()
    }

    fn template() -> KThreesControlPlaneTemplate {
        serde_json::from_value(json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta3", "kind": "KThreesControlPlaneTemplate",
            "metadata": {"name": "k3s", "namespace": "default"},
            "spec": {"template": {"spec": {
                "kthreesConfigSpec": {"serverConfig": {"tlsSan": ["0.0.0.0"]}},
                "remediation": {"maxRetry": 3}
            }}}
        }))
        .unwrap()
    }

    fn class() -> ClassRefs {
        ClassRefs {
            control_plane_template: "k3s".into(),
            machine_infrastructure: (
                "infrastructure.cluster.x-k8s.io".into(),
                "DockerMachineTemplate".into(),
                "cp-template".into(),
            ),
        }
    }

    fn kcp(spec_version: &str, status_version: Option<&str>) -> KThreesControlPlane {
        serde_json::from_value(json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta3", "kind": "KThreesControlPlane",
            "metadata": {"name": "cp", "namespace": "default"},
            "spec": {"version": spec_version},
            "status": {"version": status_version},
        }))
        .unwrap()
    }

    #[test]
    fn the_control_plane_is_the_template_with_what_the_topology_gives() {
        let desired =
            desired_control_plane(&cluster("v1.30.2+k3s2"), &template(), &class(), "cp", None)
                .unwrap();
        let spec = &desired["spec"];
        assert_eq!(spec["version"], "v1.30.2+k3s2");
        assert_eq!(spec["replicas"], 3);
        assert_eq!(spec["remediation"]["maxRetry"], 3);
        assert_eq!(
            spec["kthreesConfigSpec"]["serverConfig"]["tlsSan"],
            json!(["0.0.0.0"])
        );
        assert_eq!(spec["machineTemplate"]["metadata"]["labels"]["team"], "a");
        assert_eq!(
            spec["machineTemplate"]["spec"]["infrastructureRef"],
            json!({"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachineTemplate", "name": "cp-template"})
        );
        assert_eq!(desired["metadata"]["labels"][TOPOLOGY_OWNED_LABEL], "");
        let _: KThreesControlPlane = serde_json::from_value(desired).unwrap();
    }

    #[test]
    fn the_version_moves_only_when_the_control_plane_is_stable() {
        let to = "v1.31.0+k3s1";
        let cases = [
            ("a new control plane takes the topology's", None, to),
            (
                "provisioning: status.version unset",
                Some(kcp("v1.30.2+k3s2", None)),
                "v1.30.2+k3s2",
            ),
            (
                "upgrading: spec above status",
                Some(kcp("v1.30.2+k3s2", Some("v1.30.1+k3s1"))),
                "v1.30.2+k3s2",
            ),
            (
                "stable: the upgrade starts",
                Some(kcp("v1.30.2+k3s2", Some("v1.30.2+k3s2"))),
                to,
            ),
        ];
        for (situation, current, want) in cases {
            assert_eq!(
                control_plane_version(to, current.as_ref()),
                want,
                "{situation}"
            );
        }
    }
}
