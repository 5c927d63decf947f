//! The control plane's lifecycle around remediation and scaling, as pure
//! decisions on an observed [`LifecycleView`]: teardown, pause, the finalizer,
//! waiting for the Cluster's infrastructure, the cluster Secrets (CAs, join
//! token, kubeconfig) and the refusal of mixed management. Only when every one
//! of them says "go on" does the reconcile reach the membership-backed
//! remediation and scaling rules.
//!
//! Order, as CAPI's KubeadmControlPlane and cluster-api-k3s reconcile:
//! pause > deletion > finalizer > infrastructure > certificates > token >
//! kubeconfig (once the endpoint is set) > mixed management > the rest.
//! Pause comes before deletion, as in CAPI: `clusterctl move` pauses a Cluster
//! and then deletes it from the source management cluster, where we must not
//! tear the control plane down.

pub mod decide;
pub mod deletion;
pub mod secrets;

pub use decide::{ClusterState, Lifecycle, LifecycleView, OwnedMachine, decide_lifecycle_step};
pub use deletion::{DeletionStep, DeletionView, decide_deletion};
pub use secrets::{
    CaPurpose, KubeconfigState, SecretPlan, SecretState, SecretWrite, SecretsView, plan_secrets,
};
