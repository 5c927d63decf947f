//! The conversion webhook: cluster-api-k3s users' `v1beta1`
//! KThreesControlPlane objects, converted to and from the `v1beta2` we store
//! ([`crate::api::v1beta1`] holds the conversion). Served over TLS by the
//! controller process; the API server reaches it through the Service the
//! clusterctl components carry, trusting the CA cert-manager injects into the
//! CRD.

pub mod review;
pub mod server;

pub use server::{DEFAULT_CERT_DIR, DEFAULT_PORT, Webhook, WebhookError};
