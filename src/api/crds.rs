//! Our CustomResourceDefinitions as installed in a management cluster (with the
//! CAPI contract labels), their YAML form, and the `crds/` directory writer.
//! The CAPI and bootstrap CRDs in [`test_support_crds`] exist only so tests can
//! register those kinds in a test API server; `crds` never prints them.

use std::path::{Path, PathBuf};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use super::names::{
    CONTRACT_LABEL_V1BETA1, CONTRACT_LABEL_V1BETA2, CONTRACT_VALUE_V1BETA1, CONTRACT_VALUE_V1BETA2,
};
use super::{
    Cluster, KThreesConfig, KThreesConfigTemplate, KThreesControlPlane,
    KThreesControlPlaneTemplate, Machine, MachineHealthCheck,
};

/// The command that regenerates `crds/`.
pub const REGENERATE_COMMAND: &str = "cargo run -- crds --out crds/";

/// Our CRDs, labelled for both CAPI contracts.
pub fn ours() -> Vec<CustomResourceDefinition> {
    [
        KThreesControlPlane::crd(),
        KThreesControlPlaneTemplate::crd(),
    ]
    .into_iter()
    .map(with_contract_labels)
    .collect()
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

fn with_contract_labels(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
    let labels = crd.metadata.labels.get_or_insert_with(Default::default);
    labels.insert(CONTRACT_LABEL_V1BETA1.into(), CONTRACT_VALUE_V1BETA1.into());
    labels.insert(CONTRACT_LABEL_V1BETA2.into(), CONTRACT_VALUE_V1BETA2.into());
    crd
}

/// One CRD as a YAML document (no leading `---`).
pub fn to_yaml(crd: &CustomResourceDefinition) -> String {
    serde_yaml::to_string(crd).expect("a CRD always serializes to YAML")
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
