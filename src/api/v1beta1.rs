//! `controlplane.cluster.x-k8s.io/v1beta1` KThreesControlPlane, as
//! cluster-api-k3s serves it: its schema (served, deprecated). The conversion
//! is [`super::conversion::v1beta1_v1beta2`].

use serde_json::{Value, json};

/// The OpenAPI schema of v1beta1, as cluster-api-k3s documents its fields.
/// Validation of the spec's content is the controller's (it validates the
/// stored object every reconcile, and says so in `SpecValid`).
pub fn schema() -> Value {
    let duration = json!({"type": "string", "maxLength": 64});
    let string = json!({"type": "string", "maxLength": 253});
    json!({
        "type": "object",
        "description": "KThreesControlPlane (cluster-api-k3s v1beta1), converted by our webhook and stored as v1beta3.",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": {
                "type": "object",
                "required": ["version"],
                "properties": {
                    "replicas": {"type": "integer", "format": "int32"},
                    "version": {"type": "string", "maxLength": 64},
                    "infrastructureTemplate": {
                        "type": "object",
                        "description": "v1beta2: spec.machineTemplate.infrastructureRef",
                        "properties": {
                            "apiVersion": string, "kind": string, "name": string,
                            "namespace": string, "uid": string,
                            "resourceVersion": string, "fieldPath": string,
                        },
                    },
                    "kthreesConfigSpec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "upgradeAfter": {"type": "string", "format": "date-time", "description": "v1beta2: spec.rolloutAfter"},
                    "nodeDrainTimeout": {"type": "string", "maxLength": 64, "description": "v1beta2: spec.machineTemplate.nodeDrainTimeout"},
                    "machineTemplate": {
                        "type": "object",
                        "properties": {
                            "metadata": {
                                "type": "object",
                                "properties": {
                                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                                    "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
                                },
                            },
                        },
                    },
                    "remediationStrategy": {
                        "type": "object",
                        "properties": {
                            "maxRetry": {"type": "integer", "format": "int32"},
                            "retryPeriod": duration,
                            "minHealthyPeriod": duration,
                        },
                    },
                },
            },
            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
        },
    })
}
