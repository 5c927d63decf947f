//! The conversion webhook: KThreesControlPlane(Template) objects in
//! cluster-api-k3s's `v1beta1` and `v1beta2`, converted to and from the
//! `v1beta3` we store ([`crate::api::conversion`]). Served over TLS by the
//! controller process; the API server reaches it through the Service the
//! clusterctl components carry, trusting the CA cert-manager injects into the
//! CRD.

pub mod review;
pub mod server;

pub use server::{ApiVersionLookup, DEFAULT_CERT_DIR, DEFAULT_PORT, Webhook, WebhookError};
