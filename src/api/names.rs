//! Exact label, annotation, condition and reason strings of the Cluster API,
//! cluster-api-k3s and k3s contracts. One place, so a typo cannot split a contract.

// --- API groups and versions -------------------------------------------------

/// Our API group (shared with cluster-api-k3s so existing manifests apply).
pub const CONTROLPLANE_GROUP: &str = "controlplane.cluster.x-k8s.io";
/// Bootstrap API group of the k3s bootstrap provider.
pub const BOOTSTRAP_GROUP: &str = "bootstrap.cluster.x-k8s.io";
/// Cluster API core group.
pub const CAPI_GROUP: &str = "cluster.x-k8s.io";
/// The version we serve and the CAPI core version we read.
pub const V1BETA2: &str = "v1beta2";

/// CRD label telling CAPI v1.10 (v1beta1 contract) which of our versions to use.
pub const CONTRACT_LABEL_V1BETA1: &str = "cluster.x-k8s.io/v1beta1";
/// Value of [`CONTRACT_LABEL_V1BETA1`], as cluster-api-k3s sets it.
pub const CONTRACT_VALUE_V1BETA1: &str = "v1beta1_v1beta2";
/// CRD label for the CAPI v1beta2 contract (CAPI >= v1.11): lists the
/// versions whose spec has that contract's shape.
pub const CONTRACT_LABEL_V1BETA2: &str = "cluster.x-k8s.io/v1beta2";
/// Value of [`CONTRACT_LABEL_V1BETA2`] on our CRDs.
pub const CONTRACT_VALUE_V1BETA2: &str = "v1beta3";
/// Value of [`CONTRACT_LABEL_V1BETA1`] on our template CRD (cluster-api-k3s
/// serves the template in v1beta2 only).
pub const CONTRACT_VALUE_V1BETA1_TEMPLATE: &str = "v1beta2";

// --- Labels on Machines and other cluster objects ----------------------------

/// Name of the Cluster an object belongs to.
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";
/// Present (value `""`) on every control-plane Machine.
pub const CONTROL_PLANE_LABEL: &str = "cluster.x-k8s.io/control-plane";
/// Name of the control plane (our KThreesControlPlane) owning the Machine.
pub const CONTROL_PLANE_NAME_LABEL: &str = "cluster.x-k8s.io/control-plane-name";

// --- Annotations ----------------------------------------------------------------

/// On the KThreesControlPlane while a remediation is between "Machine deleted"
/// and "replacement created"; value is [`crate::api::RemediationData`] JSON.
pub const REMEDIATION_IN_PROGRESS_ANNOTATION: &str =
    "controlplane.cluster.x-k8s.io/remediation-in-progress";
/// On a replacement Machine: which remediation sequence it belongs to
/// ([`crate::api::RemediationData`] JSON).
pub const REMEDIATION_FOR_ANNOTATION: &str = "controlplane.cluster.x-k8s.io/remediation-for";
/// On a control-plane Machine: which `machineTemplate.metadata` keys and
/// `spec.deletion` fields we propagated to it (and to its infrastructure object
/// and KThreesConfig), and a hash of their values. Lets a removed template key
/// be removed again without touching anyone else's, and a matching record skip
/// the sync without reading those objects. JSON, see `controller::sync_machines`.
pub const SYNCED_METADATA_ANNOTATION: &str =
    "controlplane.cluster.x-k8s.io/kthrees-synced-metadata";
/// Written by us on an infrastructure clone: the template it came from.
pub const CLONED_FROM_NAME_ANNOTATION: &str = "cluster.x-k8s.io/cloned-from-name";
/// Written by us on an infrastructure clone: the template's `<Kind>.<group>`.
pub const CLONED_FROM_GROUPKIND_ANNOTATION: &str = "cluster.x-k8s.io/cloned-from-groupkind";
/// Set by a user on a Machine to ask for its remediation first.
pub const REMEDIATE_MACHINE_ANNOTATION: &str = "cluster.x-k8s.io/remediate-machine";
/// Set by a user on a Machine to prefer it on scale-down.
pub const DELETE_MACHINE_ANNOTATION: &str = "cluster.x-k8s.io/delete-machine";
/// Prefix of pre-terminate delete hooks; CAPI keeps the infrastructure until every
/// annotation with this prefix is gone.
pub const PRE_TERMINATE_HOOK_PREFIX: &str = "pre-terminate.delete.hook.machine.cluster.x-k8s.io/";
/// Set by a person on a KThreesControlPlane to let ONE member removal go
/// ahead without its etcd snapshot (`spec.etcdBackup`): the value names the
/// Machine, or the member's hex id for a member without a Machine.
pub const ETCD_SNAPSHOT_WAIVED_ANNOTATION: &str =
    "controlplane.cluster.x-k8s.io/etcd-snapshot-waived";
/// Our own pre-terminate hook: held while the etcd member is being removed.
pub const PRE_TERMINATE_HOOK_ANNOTATION: &str =
    "pre-terminate.delete.hook.machine.cluster.x-k8s.io/k3s-control-plane";
/// CAPI's own test for "a pre-terminate hook is present" (Go
/// `clusterv1.PreTerminateDeleteHookAnnotationPrefix`, matched with
/// `strings.HasPrefix`): no trailing `/`, so the bare key counts as a hook too.
/// Use this, not [`PRE_TERMINATE_HOOK_PREFIX`], to decide what CAPI waits on.
pub const CAPI_PRE_TERMINATE_HOOK_PREFIX: &str =
    "pre-terminate.delete.hook.machine.cluster.x-k8s.io";
/// cluster-api-k3s's pre-terminate hook: the bare CAPI prefix as key, with value
/// [`UPSTREAM_PRE_TERMINATE_HOOK_VALUE`]. Its control-plane controller adds it
/// right before deleting a Machine (scale-down, rollout, remediation) and
/// removes it once k3s removed the Node's etcd member. After a migration it is
/// ours to release (docs/migration.md).
pub const UPSTREAM_PRE_TERMINATE_HOOK_ANNOTATION: &str =
    "pre-terminate.delete.hook.machine.cluster.x-k8s.io";
/// Value of [`UPSTREAM_PRE_TERMINATE_HOOK_ANNOTATION`] written by cluster-api-k3s
/// (its `k3sHookName`); under another value the key is someone else's hook.
pub const UPSTREAM_PRE_TERMINATE_HOOK_VALUE: &str = "k3s";

/// The CAPI sharding label: a controller run with `--watch-filter V` reconciles
/// only objects labelled `cluster.x-k8s.io/watch-filter=V`.
pub const WATCH_FILTER_LABEL: &str = "cluster.x-k8s.io/watch-filter";
/// On any CAPI object: reconcile nothing while present (as `Cluster.spec.paused`).
pub const PAUSED_ANNOTATION: &str = "cluster.x-k8s.io/paused";
/// Our finalizer on the KThreesControlPlane (cluster-api-k3s's name, so objects
/// it created are taken over as they are).
pub const KCP_FINALIZER: &str = "kthrees.controlplane.cluster.x-k8s.io";
/// On a control-plane Machine: the hash of the spec it was made from
/// (`kthreesConfigSpec` and the infrastructure template), so "was this Machine
/// made from the current spec?" survives restarts; see [`crate::rollout`].
pub const SPEC_HASH_ANNOTATION: &str = "controlplane.cluster.x-k8s.io/kthrees-spec-hash";
/// On a control-plane Machine made by cluster-api-k3s: the JSON of
/// `kthreesConfigSpec.serverConfig` it was made from. We read it (the only
/// record of what a migrated Machine was made from) and do not write it: our
/// Machines carry the spec hash instead.
pub const SERVER_CONFIGURATION_ANNOTATION: &str =
    "controlplane.cluster.x-k8s.io/kthrees-server-configuration";

// --- k3s Node labels and annotations --------------------------------------------

/// Exact etcd member name of the Node, written by k3s.
pub const K3S_ETCD_NODE_NAME_ANNOTATION: &str = "etcd.k3s.cattle.io/node-name";
/// Address of the Node's etcd member, written by k3s.
pub const K3S_ETCD_NODE_ADDRESS_ANNOTATION: &str = "etcd.k3s.cattle.io/node-address";
/// `true` on Nodes running an etcd member.
pub const NODE_ROLE_ETCD_LABEL: &str = "node-role.kubernetes.io/etcd";
/// Node condition k3s's etcd leader keeps on every etcd Node: `True`
/// (`MemberNotLearner`), or `False` with `MemberIsLearner`, `Unhealthy` or
/// `NotAMember` (k3s `pkg/etcd/etcd.go`, `setEtcdStatusCondition`).
pub const K3S_ETCD_IS_VOTER_CONDITION: &str = "EtcdIsVoter";
/// `EtcdIsVoter=False` reason: no etcd member carries the Node's name.
pub const K3S_NOT_A_MEMBER_REASON: &str = "NotAMember";
/// The finalizer k3s's etcd member controller puts on every etcd Node: deleting
/// the Node removes its member (k3s `pkg/etcd/member_controller.go`).
pub const K3S_ETCD_NODE_FINALIZER: &str = "wrangler.cattle.io/managed-etcd-controller";
/// Control-plane Node role label (current name).
pub const NODE_ROLE_CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";
/// Control-plane Node role label (legacy name, still set by k3s).
pub const NODE_ROLE_MASTER_LABEL: &str = "node-role.kubernetes.io/master";

// --- Secrets ---------------------------------------------------------------------

/// Secret type of CAPI cluster secrets.
pub const CLUSTER_SECRET_TYPE: &str = "cluster.x-k8s.io/secret";
/// Suffix of the workload kubeconfig Secret (`<cluster>-kubeconfig`).
pub const KUBECONFIG_SECRET_SUFFIX: &str = "-kubeconfig";
/// Key of the kubeconfig in its Secret.
pub const KUBECONFIG_SECRET_KEY: &str = "value";
/// Suffix of the etcd CA Secret (`<cluster>-etcd`).
pub const ETCD_CA_SECRET_SUFFIX: &str = "-etcd";
/// Suffix of the server (cluster) CA Secret (`<cluster>-ca`).
pub const SERVER_CA_SECRET_SUFFIX: &str = "-ca";
/// Suffix of the client CA Secret (`<cluster>-cca`).
pub const CLIENT_CA_SECRET_SUFFIX: &str = "-cca";
/// Suffix of the join token Secret (`<cluster>-token`).
pub const TOKEN_SECRET_SUFFIX: &str = "-token";
/// Key of the join token in its Secret.
pub const TOKEN_SECRET_KEY: &str = "value";
/// Certificate key of a TLS Secret.
pub const TLS_CERT_KEY: &str = "tls.crt";
/// Private key of a TLS Secret.
pub const TLS_KEY_KEY: &str = "tls.key";

// --- Condition types (v1beta2 metav1 conditions; v1beta1 uses the same type names) ---
// Those of other controllers we read or take part in; ours, and the reasons we
// give, are in `condition_names`.

/// Set by MachineHealthCheck on every Machine it checks.
pub const HEALTH_CHECK_SUCCEEDED_CONDITION: &str = "HealthCheckSucceeded";
/// Set False by MachineHealthCheck when the owner (us) must remediate.
pub const OWNER_REMEDIATED_CONDITION: &str = "OwnerRemediated";
/// Set by MachineHealthCheck when an external controller remediates (not ours).
pub const EXTERNALLY_REMEDIATED_CONDITION: &str = "ExternallyRemediated";
/// v1beta2 Machine condition describing deletion progress.
pub const DELETING_CONDITION: &str = "Deleting";
/// v1beta1 Machine condition: False while waiting on pre-terminate hooks.
pub const PRE_TERMINATE_DELETE_HOOK_SUCCEEDED_CONDITION: &str = "PreTerminateDeleteHookSucceeded";
/// Ready condition (every object).
pub const READY_CONDITION: &str = "Ready";

// --- Reasons ----------------------------------------------------------------------

/// HealthCheckSucceeded=True reason (v1beta2).
pub const HEALTH_CHECK_SUCCEEDED_REASON: &str = "HealthCheckSucceeded";
/// HealthCheckSucceeded=False: a Node condition matched an unhealthy rule.
pub const UNHEALTHY_NODE_REASON: &str = "UnhealthyNode";
/// HealthCheckSucceeded=False: the Node did not appear in time.
pub const NODE_STARTUP_TIMEOUT_REASON: &str = "NodeStartupTimeout";
/// HealthCheckSucceeded=False (v1beta2): the Node was deleted.
pub const NODE_DELETED_REASON: &str = "NodeDeleted";
/// HealthCheckSucceeded=False (v1beta1): the Node is gone.
pub const NODE_NOT_FOUND_V1BETA1_REASON: &str = "NodeNotFound";
/// HealthCheckSucceeded=False (v1beta2): the remediate-machine annotation is set.
pub const HAS_REMEDIATE_ANNOTATION_REASON: &str = "HasRemediateAnnotation";
/// HealthCheckSucceeded=False (v1beta1): the remediate-machine annotation is set.
pub const HAS_REMEDIATE_MACHINE_ANNOTATION_V1BETA1_REASON: &str = "HasRemediateMachineAnnotation";
/// OwnerRemediated=False as MachineHealthCheck first sets it.
pub const WAITING_FOR_REMEDIATION_REASON: &str = "WaitingForRemediation";
/// v1beta1 OwnerRemediated=False: remediation failed.
pub const REMEDIATION_FAILED_V1BETA1_REASON: &str = "RemediationFailed";
/// v1beta2 Deleting=True reason: CAPI drained and waits on pre-terminate hooks.
pub const WAITING_FOR_PRE_TERMINATE_HOOK_REASON: &str = "WaitingForPreTerminateHook";
/// v1beta1 PreTerminateDeleteHookSucceeded=False reason.
pub const WAITING_EXTERNAL_HOOK_V1BETA1_REASON: &str = "WaitingExternalHook";

/// Where the etcd proxies run in a workload cluster (upstream cluster-api-k3s
/// writes a DaemonSet manifest onto its servers: pods on the pod network,
/// socat relaying over IPv4 to `$(HOSTIP):2379`, tolerating the control-plane
/// taints).
pub const ETCD_PROXY_NAMESPACE: &str = "kube-system";
/// Label selector of the etcd proxy pods.
pub const ETCD_PROXY_SELECTOR: &str = "app=etcd-proxy";
/// Per-cluster override of `run --etcd-transport` on the KThreesControlPlane:
/// `direct` or `port-forward`.
pub const ETCD_TRANSPORT_ANNOTATION: &str = "controlplane.cluster.x-k8s.io/etcd-transport";

/// On a KThreesControlPlane: the backend quota its workload cluster's etcd
/// members run with (bytes, or `8Gi`), for members that do not report theirs
/// (etcd < 3.6). Set it when the servers run with
/// `--etcd-arg=quota-backend-bytes=...`; without it, `run
/// --etcd-quota-backend-bytes` (etcd's 2 GiB default, which k3s keeps).
pub const ETCD_QUOTA_ANNOTATION: &str = "controlplane.cluster.x-k8s.io/etcd-quota-backend-bytes";

/// Name of the kubeconfig Secret of `cluster`.
pub fn kubeconfig_secret_name(cluster: &str) -> String {
    format!("{cluster}{KUBECONFIG_SECRET_SUFFIX}")
}

/// Name of the etcd CA Secret of `cluster`.
pub fn etcd_secret_name(cluster: &str) -> String {
    format!("{cluster}{ETCD_CA_SECRET_SUFFIX}")
}

/// CAPI's annotation for a Machine's certificates expiry (RFC 3339): set by
/// hand on the Machine, or by the control-plane provider on the bootstrap
/// config, from which CAPI copies it into `Machine.status.certificatesExpiryDate`.
pub const CERTIFICATES_EXPIRY_ANNOTATION: &str = "machine.cluster.x-k8s.io/certificates-expiry";

/// On a KThreesControlPlane: the ids of its workload cluster's etcd members
/// (hex, as `etcd status` and `etcdctl member list` print them,
/// comma-separated), which say which cluster is this control plane's when
/// the seeds answer for more than one with the same cluster id (a first
/// server restarted as a cluster of its own, docs/k3s.md T3) and the
/// controller refuses to pick one (docs/etcd.md, "Which cluster is ours").
pub const ETCD_CLUSTER_MEMBERS_ANNOTATION: &str =
    "controlplane.cluster.x-k8s.io/etcd-cluster-members";

/// Set by a person (or `k3s-control-plane restore`) on a KThreesControlPlane
/// whose etcd lost quorum for good: the name of the snapshot in the target of
/// `spec.etcdBackup` to rebuild the control plane from (docs/dr.md).
pub const ETCD_RESTORE_ANNOTATION: &str = "controlplane.cluster.x-k8s.io/etcd-restore";
/// `"true"` beside [`ETCD_RESTORE_ANNOTATION`]: restore even though etcd
/// still has quorum, or cannot be read to tell.
pub const ETCD_RESTORE_FORCE_ANNOTATION: &str = "controlplane.cluster.x-k8s.io/etcd-restore-force";
/// Written by the controller when it accepted a restore (the snapshot was
/// verified in the target): from then on the restore goes to its end. Its
/// value (JSON: snapshot, acceptedAt, forced) names the attempt.
pub const ETCD_RESTORE_ACCEPTED_ANNOTATION: &str =
    "controlplane.cluster.x-k8s.io/etcd-restore-accepted";
/// On the Machine (and its KThreesConfig) that restores the snapshot: the
/// accepted annotation's value of the attempt it belongs to.
pub const ETCD_RESTORE_OF_ANNOTATION: &str = "controlplane.cluster.x-k8s.io/etcd-restore-of";
/// CAPI: a Machine's deletion skips draining its Node.
pub const EXCLUDE_NODE_DRAINING_ANNOTATION: &str = "machine.cluster.x-k8s.io/exclude-node-draining";
/// CAPI: a Machine's deletion does not wait for its Node's volumes to detach.
pub const EXCLUDE_WAIT_FOR_VOLUME_DETACH_ANNOTATION: &str =
    "machine.cluster.x-k8s.io/exclude-wait-for-node-volume-detach";
