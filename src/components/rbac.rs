//! What the controller may do in the management cluster, and why: exactly the
//! requests it makes (tests/e2e/rbac.rs runs the controller as this account
//! against an API server that enforces these rules and records every request).

use k8s_openapi::api::rbac::v1::PolicyRule;

/// One grant of the manager role, with the reason it is needed.
#[derive(Clone, Copy, Debug)]
pub struct Permission {
    pub group: &'static str,
    pub resources: &'static [&'static str],
    pub verbs: &'static [&'static str],
    pub why: &'static str,
}

impl Permission {
    pub fn rule(&self) -> PolicyRule {
        PolicyRule {
            api_groups: Some(vec![self.group.to_string()]),
            resources: Some(self.resources.iter().map(|r| r.to_string()).collect()),
            verbs: self.verbs.iter().map(|v| v.to_string()).collect(),
            ..Default::default()
        }
    }
}

/// The manager role, bound cluster-wide (or in the one watched namespace).
pub const MANAGER: &[Permission] = &[
    Permission {
        group: "controlplane.cluster.x-k8s.io",
        resources: &["kthreescontrolplanes"],
        verbs: &["get", "list", "watch", "patch"],
        why: "our objects: watched, finalizer and remediation record patched",
    },
    Permission {
        group: "controlplane.cluster.x-k8s.io",
        resources: &["kthreescontrolplanes/status"],
        verbs: &["get", "patch"],
        why: "the CAPI status contract (read back before a conditional write)",
    },
    Permission {
        group: "cluster.x-k8s.io",
        resources: &["machines"],
        verbs: &["list", "watch", "create", "patch", "delete"],
        why: "control-plane Machines: watched (never read one by one), created, hook and metadata patched, deleted",
    },
    Permission {
        group: "cluster.x-k8s.io",
        resources: &["machines/status"],
        verbs: &["patch"],
        why: "the v1beta2 UpToDate condition on each Machine",
    },
    Permission {
        group: "cluster.x-k8s.io",
        resources: &["clusters"],
        verbs: &["get", "list", "watch"],
        why: "the owning Cluster: endpoint, pause, its control-plane reference",
    },
    Permission {
        group: "bootstrap.cluster.x-k8s.io",
        resources: &["kthreesconfigs"],
        verbs: &["create", "patch", "delete"],
        why: "each new Machine's bootstrap config (deleted again if the Machine cannot be made; metadata kept in sync)",
    },
    // Infrastructure kinds are whatever the Cluster's provider defines
    // (DockerMachineTemplate, AWSMachineTemplate, ...), so no resource list can
    // name them; the verbs are the four we use and nothing else: no list, no
    // watch, no update.
    Permission {
        group: "infrastructure.cluster.x-k8s.io",
        resources: &["*"],
        verbs: &["get", "create", "patch", "delete"],
        why: "the machine template read and owned by the Cluster, cloned for each new Machine, metadata kept in sync",
    },
    Permission {
        group: "events.k8s.io",
        resources: &["events"],
        verbs: &["create", "patch"],
        why: "Events naming each rule that fired",
    },
];

/// Secrets: a separate ClusterRole so it can be bound per namespace (a
/// RoleBinding in each watched namespace) where the controller watches one.
/// Granted on every Secret where bound: RBAC cannot narrow it (`resourceNames`
/// takes exact names, the cluster names are unknown at render time, and
/// `create` cannot be limited by name). The controller reads by name only
/// (never lists or watches: no cache of every Secret in the management
/// cluster), creates the cluster Secrets when missing, and updates only its
/// own kubeconfig (rotation): its behaviour, not a limit of the grant.
pub const SECRETS: &[Permission] = &[Permission {
    group: "",
    resources: &["secrets"],
    verbs: &["get", "create", "update"],
    why: "the cluster Secrets (<cluster>-ca, -cca, -etcd, -token, -kubeconfig) and a restore's <cluster>-etcd-restore-s3",
}];

/// CRDs are cluster-scoped: a separate ClusterRole, bound cluster-wide even
/// when the controller watches one namespace. Read by name only.
pub const CONTRACT_VERSIONS: &[Permission] = &[Permission {
    group: "apiextensions.k8s.io",
    resources: &["customresourcedefinitions"],
    verbs: &["get"],
    why: "the CAPI contract labels of an infrastructure kind referenced by group only (v1beta2 contract), to know which API version to use, as CAPI does",
}];

/// Leader election: a Role in the controller's own namespace only.
pub const LEADER_ELECTION: &[Permission] = &[Permission {
    group: "coordination.k8s.io",
    resources: &["leases"],
    verbs: &["get", "create", "patch"],
    why: "one Lease shared by the replicas (taken and renewed by patch); only its holder acts",
}];

/// Aggregated into CAPI core's manager role (label
/// `cluster.x-k8s.io/aggregate-to-manager`), which reads and patches our
/// control planes (owner references, paused, the contract fields).
pub const CAPI_CORE: &[Permission] = &[Permission {
    group: "controlplane.cluster.x-k8s.io",
    resources: &[
        "kthreescontrolplanes",
        "kthreescontrolplanes/status",
        "kthreescontrolplanetemplates",
    ],
    verbs: &[
        "get", "list", "watch", "create", "update", "patch", "delete",
    ],
    why: "CAPI core (Cluster and ClusterClass controllers) manages our objects",
}];

pub fn rules(permissions: &[Permission]) -> Vec<PolicyRule> {
    permissions.iter().map(Permission::rule).collect()
}
