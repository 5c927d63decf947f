//! Our CustomResourceDefinitions as installed in a management cluster (with the
//! CAPI contract labels), their YAML form, and the `crds/` directory writer.
//! The CAPI and bootstrap CRDs in [`test_support_crds`] exist only so tests can
//! register those kinds in a test API server; `crds` never prints them.

use std::path::{Path, PathBuf};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceConversion, CustomResourceDefinitionVersion, CustomResourceValidation,
    JSONSchemaProps, ServiceReference, WebhookClientConfig, WebhookConversion,
};

use super::names::{
    CONTRACT_LABEL_V1BETA1, CONTRACT_LABEL_V1BETA2, CONTRACT_VALUE_V1BETA1,
    CONTRACT_VALUE_V1BETA1_TEMPLATE, CONTRACT_VALUE_V1BETA2,
};
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

/// Our CRDs, the conversion webhook's Service and Certificate in `namespace`:
/// `v1beta3` stored (the CAPI v1beta2 contract's shape), cluster-api-k3s's
/// `v1beta2` (and, for the control plane, its deprecated `v1beta1`) served
/// and converted by our webhook.
pub fn ours_in(namespace: &str) -> Vec<CustomResourceDefinition> {
    let control_plane = served_beside(
        KThreesControlPlane::crd(),
        &[
            version_of(super::v1beta2::KThreesControlPlane::crd()),
            v1beta1_version(),
        ],
    );
    let template = served_beside(
        KThreesControlPlaneTemplate::crd(),
        &[version_of(
            super::v1beta2::KThreesControlPlaneTemplate::crd(),
        )],
    );
    vec![
        with_contract_labels(
            with_conversion_webhook(control_plane, namespace),
            CONTRACT_VALUE_V1BETA1,
        ),
        with_contract_labels(
            with_conversion_webhook(template, namespace),
            CONTRACT_VALUE_V1BETA1_TEMPLATE,
        ),
    ]
}

/// The one version of a derived CRD, served and not stored.
fn version_of(crd: CustomResourceDefinition) -> CustomResourceDefinitionVersion {
    let mut version = crd
        .spec
        .versions
        .into_iter()
        .next()
        .expect("a derived CRD has its version");
    version.storage = false;
    version
}

/// cluster-api-k3s's v1beta1 KThreesControlPlane, deprecated.
fn v1beta1_version() -> CustomResourceDefinitionVersion {
    let stored = KThreesControlPlane::crd().spec.versions.remove(0);
    let schema: JSONSchemaProps = serde_json::from_value(super::v1beta1::schema())
        .expect("the v1beta1 schema is a JSONSchemaProps");
    CustomResourceDefinitionVersion {
        name: "v1beta1".into(),
        served: true,
        storage: false,
        deprecated: Some(true),
        deprecation_warning: Some(
            "controlplane.cluster.x-k8s.io/v1beta1 KThreesControlPlane is deprecated; use v1beta3 (or cluster-api-k3s's v1beta2)".into(),
        ),
        schema: Some(CustomResourceValidation {
            open_api_v3_schema: Some(schema),
        }),
        subresources: stored.subresources,
        additional_printer_columns: stored.additional_printer_columns,
        selectable_fields: None,
    }
}

/// `crd` (its one version stored) with `versions` served beside it.
fn served_beside(
    mut crd: CustomResourceDefinition,
    versions: &[CustomResourceDefinitionVersion],
) -> CustomResourceDefinition {
    crd.spec.versions.extend(versions.iter().cloned());
    crd
}

/// Convert through our webhook; cert-manager injects the CA the API server
/// trusts it with.
fn with_conversion_webhook(
    mut crd: CustomResourceDefinition,
    namespace: &str,
) -> CustomResourceDefinition {
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
        with_bootstrap_contract_label(KThreesConfig::crd()),
        with_bootstrap_contract_label(KThreesConfigTemplate::crd()),
    ]
}

/// The CAPI contract labels: each contract maps to the versions of its own
/// spec shape, and no version is listed under two contracts (CAPI iterates
/// the labels, a Go map, and takes the first that lists a version: a version
/// under two answers either at random). `v1beta3` has the v1beta2 contract's
/// shape (`spec.machineTemplate.spec.infrastructureRef`); cluster-api-k3s's
/// versions the v1beta1 contract's.
fn with_contract_labels(
    mut crd: CustomResourceDefinition,
    v1beta1_contract: &str,
) -> CustomResourceDefinition {
    let labels = crd.metadata.labels.get_or_insert_with(Default::default);
    labels.insert(CONTRACT_LABEL_V1BETA1.into(), v1beta1_contract.into());
    labels.insert(CONTRACT_LABEL_V1BETA2.into(), CONTRACT_VALUE_V1BETA2.into());
    crd
}

/// The bootstrap provider's contract label (tests only).
fn with_bootstrap_contract_label(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
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
