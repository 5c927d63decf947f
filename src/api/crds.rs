//! Our CustomResourceDefinitions as installed in a management cluster (with the
//! CAPI contract labels), their YAML form, and the `crds/` directory writer.
//! The CAPI and bootstrap CRDs in [`test_support_crds`] exist only so tests can
//! register those kinds in a test API server; `crds` never prints them.

use std::path::{Path, PathBuf};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use super::names::{CONTRACT_LABEL_V1BETA1, CONTRACT_VALUE_V1BETA1};
use super::{
    Cluster, KThreesConfig, KThreesConfigTemplate, KThreesControlPlane,
    KThreesControlPlaneTemplate, Machine, MachineHealthCheck,
};

/// The command that regenerates `crds/`.
pub const REGENERATE_COMMAND: &str = "cargo run -- crds --out crds/";

/// Where the conversion webhook's Service and Certificate live when the CRDs
/// are installed on their own (`crds/`); the clusterctl components use their
/// namespace variable instead.
pub const DEFAULT_WEBHOOK_NAMESPACE: &str = "k3s-control-plane-system";
/// The conversion webhook's Service (port 443 -> the controller's 9443).
pub const WEBHOOK_SERVICE: &str = "k3s-control-plane-webhook-service";
/// The cert-manager Certificate whose CA is injected into the CRD.
pub const WEBHOOK_CERTIFICATE: &str = "k3s-control-plane-serving-cert";

/// Our CRDs, labelled for both CAPI contracts, with the webhook in its
/// default namespace.
pub fn ours() -> Vec<CustomResourceDefinition> {
    ours_in(DEFAULT_WEBHOOK_NAMESPACE)
}

/// Our CRDs, the conversion webhook's Service and Certificate in `namespace`.
pub fn ours_in(namespace: &str) -> Vec<CustomResourceDefinition> {
    [
        with_v1beta1(KThreesControlPlane::crd(), namespace),
        KThreesControlPlaneTemplate::crd(),
    ]
    .into_iter()
    .map(with_contract_labels)
    .collect()
}

/// Serve cluster-api-k3s's `v1beta1` beside our stored `v1beta2`, converted
/// by our webhook; cert-manager injects the CA the API server trusts it with.
fn with_v1beta1(mut crd: CustomResourceDefinition, namespace: &str) -> CustomResourceDefinition {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
        CustomResourceConversion, CustomResourceDefinitionVersion, CustomResourceValidation,
        JSONSchemaProps, ServiceReference, WebhookClientConfig, WebhookConversion,
    };
    let stored = crd.spec.versions[0].clone();
    let schema: JSONSchemaProps = serde_json::from_value(super::v1beta1::schema())
        .expect("the v1beta1 schema is a JSONSchemaProps");
    crd.spec.versions.push(CustomResourceDefinitionVersion {
        name: "v1beta1".into(),
        served: true,
        storage: false,
        deprecated: Some(true),
        deprecation_warning: Some(
            "controlplane.cluster.x-k8s.io/v1beta1 KThreesControlPlane is converted to v1beta2; use v1beta2".into(),
        ),
        schema: Some(CustomResourceValidation {
            open_api_v3_schema: Some(schema),
        }),
        subresources: stored.subresources.clone(),
        additional_printer_columns: stored.additional_printer_columns.clone(),
        selectable_fields: None,
    });
    crd.spec.conversion = Some(CustomResourceConversion {
        strategy: "Webhook".into(),
        webhook: Some(WebhookConversion {
            conversion_review_versions: vec!["v1".into()],
            client_config: Some(WebhookClientConfig {
                service: Some(ServiceReference {
                    namespace: namespace.into(),
                    name: WEBHOOK_SERVICE.into(),
                    path: Some("/convert".into()),
                    port: Some(443),
                }),
                ..Default::default()
            }),
        }),
    });
    crd.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(
            "cert-manager.io/inject-ca-from".into(),
            format!("{namespace}/{WEBHOOK_CERTIFICATE}"),
        );
    crd
}

/// CRDs of the CAPI and bootstrap kinds we read or create (tests only).
pub fn test_support_crds() -> Vec<CustomResourceDefinition> {
    vec![
        Cluster::crd(),
        Machine::crd(),
        MachineHealthCheck::crd(),
        with_contract_labels(KThreesConfig::crd()),
        with_contract_labels(KThreesConfigTemplate::crd()),
    ]
}

/// The CAPI contract labels: each contract maps to versions of its own
/// shape, and no version is listed under two contracts (CAPI iterates the
/// labels, a Go map, and takes the first that lists a version: a version
/// under two answers either at random). Our versions have the v1beta1
/// contract's spec shape (`spec.machineTemplate.infrastructureRef`), so only
/// that contract is declared until a version of the v1beta2 contract's shape
/// exists.
fn with_contract_labels(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
    let labels = crd.metadata.labels.get_or_insert_with(Default::default);
    labels.insert(CONTRACT_LABEL_V1BETA1.into(), CONTRACT_VALUE_V1BETA1.into());
    crd
}

/// One CRD as a YAML document (no leading `---`).
pub fn to_yaml(crd: &CustomResourceDefinition) -> String {
    crate::yaml::to_string(crd).expect("a CRD always serializes to YAML")
}

/// All of our CRDs as one multi-document YAML stream.
pub fn ours_yaml() -> String {
    ours()
        .iter()
        .map(|crd| format!("---\n{}", to_yaml(crd)))
        .collect()
}

/// File name of a CRD in `crds/`: `<group>_<plural>.yaml`, as controller-gen names them.
pub fn file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural)
}

/// Write one file per CRD into `dir` (created if missing); returns the paths.
pub fn write_all(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    ours()
        .iter()
        .map(|crd| {
            let path = dir.join(file_name(crd));
            std::fs::write(&path, to_yaml(crd))?;
            Ok(path)
        })
        .collect()
}
