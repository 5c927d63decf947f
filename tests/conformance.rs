//! Conformance suite for the in-process test API server: every behaviour our controller
//! relies on, checked through a real `kube::Client`. Runs against `TestApiServer` by
//! default and, unchanged, against a real cluster when `KUBECONFIG` is set (install our
//! CRDs first: `k3s-control-plane crds | kubectl apply -f -`).

#[path = "conformance/support.rs"]
mod support;

#[path = "conformance/clients.rs"]
mod clients;
#[path = "conformance/crud.rs"]
mod crud;
#[path = "conformance/deletion.rs"]
mod deletion;
#[path = "conformance/errors.rs"]
mod errors;
#[path = "conformance/faults.rs"]
mod faults;
#[path = "conformance/lists.rs"]
mod lists;
#[path = "conformance/patches.rs"]
mod patches;
#[path = "conformance/portforward.rs"]
mod portforward;
#[path = "conformance/rbac.rs"]
mod rbac;
#[path = "conformance/runtime.rs"]
mod runtime;
#[path = "conformance/selectors.rs"]
mod selectors;
#[path = "conformance/subresources.rs"]
mod subresources;
#[path = "conformance/watch.rs"]
mod watch;
