//! The conversion webhook's objects in the clusterctl components, as every
//! CAPI provider ships them: a Service in front of the controller's port 9443,
//! and a cert-manager Issuer (self-signed) and Certificate whose Secret the
//! Deployment mounts and whose CA cert-manager injects into the CRD
//! (`cert-manager.io/inject-ca-from`). cert-manager is a CAPI prerequisite:
//! `clusterctl init` installs it.

use serde_json::{Value, json};

use crate::api::crds::{WEBHOOK_CERTIFICATE, WEBHOOK_SERVICE};

use super::APP_LABEL;

/// The Issuer of the webhook's certificate.
pub const ISSUER: &str = "k3s-control-plane-selfsigned-issuer";
/// The Secret cert-manager writes the certificate into.
pub const SECRET: &str = "k3s-control-plane-webhook-service-cert";

pub fn objects(namespace: &str) -> Vec<Value> {
    let dns = [
        format!("{WEBHOOK_SERVICE}.{namespace}.svc"),
        format!("{WEBHOOK_SERVICE}.{namespace}.svc.cluster.local"),
    ];
    vec![
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": WEBHOOK_SERVICE, "namespace": namespace},
            "spec": {
                "selector": {APP_LABEL.0: APP_LABEL.1},
                "ports": [{"name": "webhook", "port": 443, "targetPort": "webhook-server", "protocol": "TCP"}],
            },
        }),
        json!({
            "apiVersion": "cert-manager.io/v1", "kind": "Issuer",
            "metadata": {"name": ISSUER, "namespace": namespace},
            "spec": {"selfSigned": {}},
        }),
        json!({
            "apiVersion": "cert-manager.io/v1", "kind": "Certificate",
            "metadata": {"name": WEBHOOK_CERTIFICATE, "namespace": namespace},
            "spec": {
                "dnsNames": dns,
                "issuerRef": {"kind": "Issuer", "name": ISSUER},
                "secretName": SECRET,
            },
        }),
    ]
}
