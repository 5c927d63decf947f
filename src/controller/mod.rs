//! kube-runtime wiring of the KThreesControlPlane controller: the reconcile
//! pipeline (observe -> validate -> decide -> act -> status), its context,
//! metrics and probe endpoints.

pub mod http;
pub mod metrics;
