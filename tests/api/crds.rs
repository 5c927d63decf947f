//! The CRDs we ship: `crds/` is current, and each CRD carries the CAPI contract
//! labels, subresources, printer columns and one CEL rule per validator rule;
//! every schema default passes the CEL rules of its node.

use std::path::Path;

use k3s_control_plane::api::crds::{self, REGENERATE_COMMAND};
use k3s_control_plane::api::validate::Rule;
use serde_json::Value;

#[test]
fn crds_directory_is_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("crds");
    let mut expected_files = Vec::new();
    for crd in crds::ours() {
        let name = crds::file_name(&crd);
        let path = dir.join(&name);
        let on_disk = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{} missing ({e}); regenerate with `{REGENERATE_COMMAND}`",
                path.display()
            )
        });
        assert!(
            on_disk == crds::to_yaml(&crd),
            "{} is stale; regenerate with `{REGENERATE_COMMAND}`",
            path.display()
        );
        expected_files.push(name);
    }
    let mut present: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    present.sort();
    expected_files.sort();
    assert_eq!(
        present, expected_files,
        "crds/ has files we do not generate; regenerate with `{REGENERATE_COMMAND}`"
    );
}

#[test]
fn printed_yaml_is_one_document_per_crd() {
    let text = crds::ours_yaml();
    let docs: Vec<Value> = k3s_control_plane::yaml::documents(&text).unwrap();
    let objects: Vec<Value> = crds::ours()
        .iter()
        .map(|crd| serde_json::to_value(crd).unwrap())
        .collect();
    assert_eq!(docs, objects);
    assert_eq!(docs.len(), 2);
    for d in docs {
        assert_eq!(d["kind"], "CustomResourceDefinition");
    }
}

/// What we ship reads back as the objects we generate (a YAML reader could
/// take an unquoted string for a number or a boolean).
#[test]
fn committed_crds_read_back_as_the_generated_objects() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("crds");
    for crd in crds::ours() {
        let path = dir.join(crds::file_name(&crd));
        let text = std::fs::read_to_string(&path).unwrap();
        let read: Value = k3s_control_plane::yaml::from_str(&text)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            read == serde_json::to_value(&crd).unwrap(),
            "{} reads back as another object; regenerate with `{REGENERATE_COMMAND}`",
            path.display()
        );
    }
}

fn kcp_crd() -> Value {
    let crd = crds::ours()
        .into_iter()
        .find(|c| c.spec.names.kind == "KThreesControlPlane")
        .unwrap();
    serde_json::to_value(crd).unwrap()
}

/// CAPI finds the contract of a version by iterating the CRD's contract
/// labels (a Go map): a version listed under two contracts gets either answer
/// at random (seen on the real v1.12.7 and v1.13.4 managers: topology
/// reconciles flapped). Each version belongs to exactly one contract, and
/// our versions have the v1beta1 contract's shape.
#[test]
fn no_version_is_listed_under_two_capi_contracts() {
    for crd in crds::ours().into_iter().chain(crds::test_support_crds()) {
        let labels = crd.metadata.labels.clone().unwrap_or_default();
        let mut seen: std::collections::BTreeMap<String, String> = Default::default();
        for (key, value) in &labels {
            let Some(contract) = key.strip_prefix("cluster.x-k8s.io/") else {
                continue;
            };
            for version in value.split('_') {
                if let Some(other) = seen.insert(version.to_string(), contract.to_string()) {
                    panic!(
                        "{:?}: version {version} is listed under contracts {other} and {contract}",
                        crd.metadata.name
                    );
                }
            }
        }
    }
}

/// Each CAPI contract lists the versions of its own shape: v1beta3 (the
/// v1beta2 contract's `machineTemplate.spec.infrastructureRef`) under
/// v1beta2, cluster-api-k3s's versions (`machineTemplate.infrastructureRef`)
/// under v1beta1; CAPI's lookup picks v1beta3.
#[test]
fn each_contract_lists_the_versions_of_its_shape() {
    for crd in crds::ours() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let labels = crd.metadata.labels.clone().unwrap_or_default();
        let control_plane = crd.spec.names.kind == "KThreesControlPlane";
        let v1beta1_contract = if control_plane {
            "v1beta1_v1beta2"
        } else {
            "v1beta2"
        };
        assert_eq!(
            labels.get("cluster.x-k8s.io/v1beta1").map(String::as_str),
            Some(v1beta1_contract),
            "{name}"
        );
        assert_eq!(
            labels.get("cluster.x-k8s.io/v1beta2").map(String::as_str),
            Some("v1beta3"),
            "{name}"
        );
        assert_eq!(
            k3s_control_plane::api::contract::version_for_contract(&labels).as_deref(),
            Some("v1beta3"),
            "{name}: what CAPI uses"
        );
        assert_eq!(crd.spec.group, "controlplane.cluster.x-k8s.io");
        let versions: Vec<(&str, bool)> = crd
            .spec
            .versions
            .iter()
            .map(|v| (v.name.as_str(), v.storage))
            .collect();
        let want: &[(&str, bool)] = if control_plane {
            &[("v1beta3", true), ("v1beta2", false), ("v1beta1", false)]
        } else {
            &[("v1beta3", true), ("v1beta2", false)]
        };
        assert_eq!(versions, want, "{name}");
        assert_eq!(
            crd.spec.conversion.as_ref().map(|c| c.strategy.as_str()),
            Some("Webhook"),
            "{name}"
        );
        if !control_plane {
            continue;
        }
        let spec_of = |version: &str| {
            let v = crd
                .spec
                .versions
                .iter()
                .find(|v| v.name == version)
                .unwrap();
            serde_json::to_value(
                v.schema
                    .as_ref()
                    .unwrap()
                    .open_api_v3_schema
                    .as_ref()
                    .unwrap(),
            )
            .unwrap()["properties"]["spec"]["properties"]
                .clone()
        };
        let template = &spec_of("v1beta3")["machineTemplate"]["properties"];
        assert!(
            template["spec"]["properties"]["infrastructureRef"]["properties"]["apiGroup"]
                .is_object(),
            "v1beta3: spec.machineTemplate.spec.infrastructureRef.apiGroup"
        );
        assert!(template.get("infrastructureRef").is_none());
        let template = &spec_of("v1beta2")["machineTemplate"]["properties"];
        assert!(
            template["infrastructureRef"]["properties"]["apiVersion"].is_object(),
            "v1beta2: spec.machineTemplate.infrastructureRef.apiVersion"
        );
    }
}

#[test]
fn kcp_has_scale_and_status_subresources_short_name_and_columns() {
    let crd = kcp_crd();
    assert_eq!(
        crd["spec"]["names"]["shortNames"],
        serde_json::json!(["ktcp"])
    );
    assert_eq!(crd["spec"]["names"]["plural"], "kthreescontrolplanes");
    let version = &crd["spec"]["versions"][0];
    assert_eq!(version["subresources"]["status"], serde_json::json!({}));
    assert_eq!(
        version["subresources"]["scale"],
        serde_json::json!({
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector"
        })
    );
    let columns: Vec<&str> = version["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        columns,
        [
            "Cluster",
            "Initialized",
            "Desired",
            "Replicas",
            "Ready",
            "Updated",
            "Unavailable",
            "Version",
            "Etcd",
            "Etcd Margin",
            "Age"
        ]
    );
    // The etcd quorum columns read status.etcd, absent while etcd is unknown.
    let column = |name: &str| {
        version["additionalPrinterColumns"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap()
            .clone()
    };
    assert_eq!(column("Etcd")["jsonPath"], ".status.etcd.voterHealth");
    assert_eq!(column("Etcd")["type"], "string");
    assert_eq!(
        column("Etcd Margin")["jsonPath"],
        ".status.etcd.quorumMargin"
    );
    assert_eq!(column("Etcd Margin")["type"], "integer");
    let etcd = &version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["etcd"];
    for field in [
        "members",
        "voters",
        "healthyVoters",
        "quorum",
        "quorumMargin",
        "voterHealth",
    ] {
        assert!(etcd["properties"][field].is_object(), "status.etcd.{field}");
    }
}

/// Collect every `x-kubernetes-validations` entry in a schema tree.
fn cel_rules(schema: &Value, out: &mut Vec<(String, String)>) {
    match schema {
        Value::Object(map) => {
            if let Some(Value::Array(rules)) = map.get("x-kubernetes-validations") {
                for r in rules {
                    // A messageExpression is CEL; its messages are string literals.
                    let message = match (r["message"].as_str(), r["messageExpression"].as_str()) {
                        (Some(m), _) => m.to_owned(),
                        (None, Some(e)) => e.to_owned(),
                        (None, None) => String::new(),
                    };
                    out.push((r["rule"].as_str().unwrap_or_default().to_owned(), message));
                }
            }
            for v in map.values() {
                cel_rules(v, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| cel_rules(v, out)),
        _ => {}
    }
}

#[test]
fn each_validator_rule_has_a_cel_rule_naming_its_field() {
    let crd = kcp_crd();
    let mut rules = Vec::new();
    cel_rules(&crd["spec"]["versions"][0]["schema"], &mut rules);
    // One CEL rule per validator rule, each message starting with its field.
    assert_eq!(rules.len(), Rule::ALL.len(), "{rules:#?}");
    for rule in Rule::ALL {
        let prefix = format!("{}: ", rule.field());
        let expected_fragment = match rule {
            Rule::VersionFormat => "k3s",
            Rule::ReplicasAtLeastOne => ">= 1",
            Rule::ReplicasOddWithEmbeddedEtcd => "% 2 == 1",
            Rule::DatastoreEndpointNeedsExternalDatastore => "self.externalDatastore",
            Rule::InfrastructureRefRequired => "infrastructureRef",
            Rule::MaxRetryNotNegative => ">= 0",
            Rule::CertificatesExpiryDaysAtLeastSeven => ">= 7",
            Rule::RetryPeriodNotNegative
            | Rule::MinHealthyPeriodNotNegative
            | Rule::NodeDrainTimeoutNotNegative
            | Rule::NodeVolumeDetachTimeoutNotNegative
            | Rule::NodeDeletionTimeoutNotNegative => ">= 0",
            Rule::ReadinessGatePolarity => "'Positive', 'Negative'",
            Rule::MachineNamingHasRandom => "{{ .random }}",
            Rule::MaxSurgeZeroOrOne => "string(self) in ['0', '1']",
            Rule::RolloutTypeRollingUpdate => "'RollingUpdate'",
            Rule::VersionNoDowngrade => "oldSelf.contains('-')",
            Rule::VersionNoMinorSkip => "+ 1",
            Rule::EtcdBackupOneTarget => "has(self.s3) != has(self.filesystem)",
            Rule::EtcdBackupS3EndpointAndBucket => "self.bucket != ''",
            Rule::EtcdBackupFilesystemPathAbsolute => "startsWith('/')",
            Rule::EtcdBackupScheduleShape => "self.matches(",
            Rule::EtcdBackupRetentionCountAtLeastOne
            | Rule::EtcdBackupSnapshotTimeoutAtLeastOne => ">= 1",
            Rule::EtcdBackupRetentionMaxAgeAtLeastAMinute => ">= 60",
        };
        let names_field = |m: &str| m.starts_with(&prefix) || m.contains(&format!("'{prefix}"));
        let matching: Vec<_> = rules
            .iter()
            .filter(|(r, m)| names_field(m) && r.contains(expected_fragment))
            .collect();
        assert!(
            !matching.is_empty(),
            "{rule:?}: no CEL rule with message '{prefix}…' containing {expected_fragment:?}"
        );
    }
    // The CEL patterns are the validator's patterns (escaped for a CEL string).
    let cel_escaped = |pattern: &str| format!("self.matches('{}')", pattern.replace('\\', "\\\\"));
    // The served v1beta2 keeps its Go durations, checked by the same pattern.
    assert_eq!(crd["spec"]["versions"][1]["name"], "v1beta2");
    let mut v1beta2_rules = Vec::new();
    cel_rules(&crd["spec"]["versions"][1]["schema"], &mut v1beta2_rules);
    let duration = cel_escaped(k3s_control_plane::api::refs::GO_DURATION_PATTERN);
    assert_eq!(
        v1beta2_rules
            .iter()
            .filter(|(r, _)| r.contains(&duration))
            .count(),
        2,
        "{duration}"
    );
    let version = cel_escaped(k3s_control_plane::api::kcp::K3S_VERSION_PATTERN);
    assert!(rules.iter().any(|(r, _)| r == &version), "{version}");
    // Transition rules are exactly the ones that read oldSelf.
    let transition = Rule::ALL.iter().filter(|r| r.is_transition()).count();
    assert_eq!(
        rules.iter().filter(|(r, _)| r.contains("oldSelf")).count(),
        transition,
        "{rules:#?}"
    );

    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    assert_eq!(spec["required"], serde_json::json!(["version"]));
    assert_eq!(spec["properties"]["replicas"]["default"], 1);
}

#[test]
fn unknown_kthrees_config_fields_are_preserved_by_the_schema() {
    let crd = kcp_crd();
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let config = &spec["properties"]["kthreesConfigSpec"];
    assert_eq!(config["x-kubernetes-preserve-unknown-fields"], true);
    assert_eq!(
        config["properties"]["serverConfig"]["x-kubernetes-preserve-unknown-fields"],
        true
    );
    assert_eq!(
        config["properties"]["agentConfig"]["x-kubernetes-preserve-unknown-fields"],
        true
    );
}

#[test]
fn test_support_crds_cover_the_capi_kinds_we_use() {
    let kinds: Vec<String> = crds::test_support_crds()
        .into_iter()
        .map(|c| format!("{}/{}", c.spec.group, c.spec.names.kind))
        .collect();
    for want in [
        "cluster.x-k8s.io/Cluster",
        "cluster.x-k8s.io/Machine",
        "cluster.x-k8s.io/MachineHealthCheck",
        "bootstrap.cluster.x-k8s.io/KThreesConfig",
        "bootstrap.cluster.x-k8s.io/KThreesConfigTemplate",
    ] {
        assert!(
            kinds.iter().any(|k| k == want),
            "{want} missing from {kinds:?}"
        );
    }
}

/// Structural-schema rules a real API server enforces: every node has a type
/// (unless it preserves unknown fields or is int-or-string), and `properties`
/// never sits next to `additionalProperties`.
fn assert_structural(path: &str, schema: &Value) {
    let Value::Object(map) = schema else {
        panic!("{path}: schema is not an object: {schema}");
    };
    let preserves = map.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    let int_or_string = map.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
    assert!(
        map.contains_key("type") || preserves || int_or_string,
        "{path}: no type"
    );
    assert!(
        !(map.contains_key("properties") && map.contains_key("additionalProperties")),
        "{path}: properties and additionalProperties together"
    );
    for key in ["anyOf", "oneOf", "allOf", "not"] {
        assert!(
            !map.contains_key(key),
            "{path}: {key} is not structural here"
        );
    }
    if let Some(Value::Object(props)) = map.get("properties") {
        for (name, sub) in props {
            assert_structural(&format!("{path}.{name}"), sub);
        }
    }
    if let Some(items) = map.get("items") {
        assert_structural(&format!("{path}[]"), items);
    }
    if let Some(extra @ Value::Object(_)) = map.get("additionalProperties") {
        assert_structural(&format!("{path}{{}}"), extra);
    }
}

#[test]
fn all_generated_schemas_are_structural() {
    for crd in crds::ours().into_iter().chain(crds::test_support_crds()) {
        let value = serde_json::to_value(&crd).unwrap();
        let schema = &value["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
        assert_structural(&crd.spec.names.kind, schema);
    }
}

/// Every `default` in our CRDs, checked against the CEL rules of its own
/// node (and below): a real API server does this when the CRD is created and
/// refuses the CRD otherwise (kube-apiserver v1.34.9 refused `default: {}` on
/// `spec.etcdBackup.target`, whose rule wants exactly one of its fields).
fn defaults_pass_their_cel_rules(
    path: &str,
    schema: &Value,
    validator: &kube::core::cel::Validator,
    failures: &mut Vec<String>,
) {
    let Value::Object(map) = schema else { return };
    if let Some(default) = map.get("default")
        && let Err(errors) = validator.validate(schema, default, None)
    {
        failures.push(format!("{path}: default {default} fails {errors:?}"));
    }
    if let Some(Value::Object(props)) = map.get("properties") {
        for (name, sub) in props {
            defaults_pass_their_cel_rules(&format!("{path}.{name}"), sub, validator, failures);
        }
    }
    if let Some(items) = map.get("items") {
        defaults_pass_their_cel_rules(&format!("{path}[]"), items, validator, failures);
    }
    if let Some(extra @ Value::Object(_)) = map.get("additionalProperties") {
        defaults_pass_their_cel_rules(&format!("{path}{{}}"), extra, validator, failures);
    }
}

#[test]
fn every_default_passes_the_cel_rules_of_its_node() {
    let validator = kube::core::cel::Validator::new();
    let mut failures = Vec::new();
    for crd in crds::ours() {
        let value = serde_json::to_value(&crd).unwrap();
        for version in value["spec"]["versions"].as_array().unwrap() {
            let path = format!(
                "{} {}",
                crd.spec.names.kind,
                version["name"].as_str().unwrap()
            );
            let schema = &version["schema"]["openAPIV3Schema"];
            defaults_pass_their_cel_rules(&path, schema, &validator, &mut failures);
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
