//! The KThreesControlPlane rules, three ways on the same objects: the Rust
//! validator, the CRD's own CEL rules evaluated client-side (kube's `cel`
//! feature, kube-cel), and, when `KUBECONFIG` points at a cluster, the API server.
//! A second table does the same for `spec.version` changes on UPDATE (the
//! transition rules, CEL `oldSelf`).

use crate::docker_support;

use k3s_control_plane::api::etcd_backup::{
    BackupTarget, EtcdBackup, FilesystemBackupTarget, S3BackupTarget,
};
use k3s_control_plane::api::kcp::{
    KThreesControlPlaneRemediation, MachineReadinessGate, VERSION_MAX_LENGTH,
};
use k3s_control_plane::api::refs::ContractVersionedObjectReference;
use k3s_control_plane::api::validate::Rule;
use k3s_control_plane::api::{
    KThreesControlPlane, KThreesControlPlaneSpec, check_version_change, validate_kcp,
    validate_kcp_update,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResourceExt;
use serde_json::Value;

fn good() -> KThreesControlPlane {
    let mut kcp = KThreesControlPlane::new(
        "cp",
        KThreesControlPlaneSpec {
            replicas: Some(3),
            version: "v1.30.2+k3s2".into(),
            kthrees_config_spec: Default::default(),
            machine_template: Default::default(),
            rollout: Default::default(),
            remediation: Default::default(),
            machine_naming: Default::default(),
            external_datastore: None,
            etcd_backup: None,
        },
    );
    kcp.spec.machine_template.spec.infrastructure_ref = ContractVersionedObjectReference {
        api_group: "infrastructure.cluster.x-k8s.io".into(),
        kind: "DockerMachineTemplate".into(),
        name: "cp-template".into(),
    };
    kcp.metadata.namespace = Some("team-a".into());
    kcp
}

fn strategy(kcp: &mut KThreesControlPlane) -> &mut KThreesControlPlaneRemediation {
    &mut kcp.spec.remediation
}

/// A version of exactly `VERSION_MAX_LENGTH` characters that the pattern accepts.
const LONGEST_VERSION: &str = "v999999999.999999999.999999999-abcdefghijklmnopqrst+k3s999999999";

#[test]
fn longest_accepted_version_is_the_schema_max_length() {
    assert_eq!(LONGEST_VERSION.len(), VERSION_MAX_LENGTH);
    let schema = crd_schema();
    assert_eq!(
        schema["properties"]["spec"]["properties"]["version"]["maxLength"],
        VERSION_MAX_LENGTH
    );
}

fn max_surge(kcp: &mut KThreesControlPlane, value: IntOrString) {
    kcp.spec
        .rollout
        .strategy
        .rolling_update
        .get_or_insert_with(Default::default)
        .max_surge = Some(value);
}

fn rollout_type(kcp: &mut KThreesControlPlane, value: &str) {
    kcp.spec.rollout.strategy.type_ = Some(value.into());
}

fn s3_backup() -> EtcdBackup {
    EtcdBackup {
        target: BackupTarget {
            s3: Some(S3BackupTarget {
                endpoint: "s3.example.com".into(),
                bucket: "snapshots".into(),
                folder: Some("cluster-a".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        schedule: Some("0 */12 * * *".into()),
        ..Default::default()
    }
}

type Case = (&'static str, fn(&mut KThreesControlPlane), &'static [Rule]);

/// Every situation: name, how it differs from `good()`, the rules it breaks.
fn cases() -> Vec<Case> {
    vec![
        ("three_replicas_with_embedded_etcd", |_| {}, &[]),
        (
            "replicas_unset_defaults_to_one",
            |k| k.spec.replicas = None,
            &[],
        ),
        ("one_replica", |k| k.spec.replicas = Some(1), &[]),
        ("five_replicas", |k| k.spec.replicas = Some(5), &[]),
        (
            "two_replicas_with_a_declared_external_datastore",
            |k| {
                k.spec.replicas = Some(2);
                k.spec.external_datastore = Some(true);
                k.spec.kthrees_config_spec.server_config.datastore_endpoint =
                    Some("postgres://db:5432/k3s".into());
            },
            &[],
        ),
        (
            // The bootstrap provider drops the field: the servers would run
            // embedded etcd while we believed otherwise.
            "datastore_endpoint_without_the_declaration",
            |k| {
                k.spec.kthrees_config_spec.server_config.datastore_endpoint =
                    Some("postgres://db:5432/k3s".into());
            },
            &[Rule::DatastoreEndpointNeedsExternalDatastore],
        ),
        (
            "two_replicas_with_a_datastore_endpoint_only",
            |k| {
                k.spec.replicas = Some(2);
                k.spec.kthrees_config_spec.server_config.datastore_endpoint =
                    Some("postgres://db:5432/k3s".into());
            },
            &[
                Rule::ReplicasOddWithEmbeddedEtcd,
                Rule::DatastoreEndpointNeedsExternalDatastore,
            ],
        ),
        (
            "external_datastore_declared_false",
            |k| {
                k.spec.replicas = Some(2);
                k.spec.external_datastore = Some(false);
            },
            &[Rule::ReplicasOddWithEmbeddedEtcd],
        ),
        (
            "prerelease_k3s_version",
            |k| k.spec.version = "v1.31.0-rc1+k3s1".into(),
            &[],
        ),
        (
            "remediation_with_valid_periods",
            |k| {
                let s = strategy(k);
                s.max_retry = Some(0);
                s.retry_period_seconds = Some(0);
                s.min_healthy_period_seconds = Some(5400);
            },
            &[],
        ),
        (
            "version_without_k3s_suffix",
            |k| k.spec.version = "v1.30.2".into(),
            &[Rule::VersionFormat],
        ),
        (
            "version_without_leading_v",
            |k| k.spec.version = "1.30.2+k3s2".into(),
            &[Rule::VersionFormat],
        ),
        (
            // The longest version the pattern accepts is exactly the schema's
            // maxLength, so maxLength never rejects a version the rules accept.
            "version_of_max_length",
            |k| k.spec.version = LONGEST_VERSION.into(),
            &[],
        ),
        (
            "prerelease_tag_over_twenty_characters",
            |k| k.spec.version = "v1.31.0-abcdefghijklmnopqrstu+k3s1".into(),
            &[Rule::VersionFormat],
        ),
        (
            "version_number_over_nine_digits",
            |k| k.spec.version = "v1.1000000000.0+k3s1".into(),
            &[Rule::VersionFormat],
        ),
        (
            // Rust's `\d` would match a fullwidth digit; the API server's RE2 does not.
            "version_with_non_ascii_digit",
            |k| k.spec.version = "v1.3\u{ff10}.2+k3s2".into(),
            &[Rule::VersionFormat],
        ),
        (
            "version_empty",
            |k| k.spec.version = String::new(),
            &[Rule::VersionFormat],
        ),
        (
            "two_replicas_with_embedded_etcd",
            |k| k.spec.replicas = Some(2),
            &[Rule::ReplicasOddWithEmbeddedEtcd],
        ),
        (
            "four_replicas_with_empty_datastore_endpoint",
            |k| {
                k.spec.replicas = Some(4);
                k.spec.kthrees_config_spec.server_config.datastore_endpoint = Some(String::new());
            },
            &[Rule::ReplicasOddWithEmbeddedEtcd],
        ),
        (
            "zero_replicas",
            |k| k.spec.replicas = Some(0),
            &[Rule::ReplicasAtLeastOne],
        ),
        (
            "negative_replicas",
            |k| k.spec.replicas = Some(-3),
            &[Rule::ReplicasAtLeastOne],
        ),
        (
            "missing_infrastructure_ref",
            |k| k.spec.machine_template.spec.infrastructure_ref = Default::default(),
            &[Rule::InfrastructureRefRequired],
        ),
        (
            "infrastructure_ref_without_name",
            |k| k.spec.machine_template.spec.infrastructure_ref.name = String::new(),
            &[Rule::InfrastructureRefRequired],
        ),
        (
            "certificates_expiry_days_below_seven",
            |k| k.spec.rollout.before.certificates_expiry_days = Some(6),
            &[Rule::CertificatesExpiryDaysAtLeastSeven],
        ),
        (
            "negative_max_retry",
            |k| strategy(k).max_retry = Some(-1),
            &[Rule::MaxRetryNotNegative],
        ),
        (
            "negative_retry_period",
            |k| strategy(k).retry_period_seconds = Some(-60),
            &[Rule::RetryPeriodNotNegative],
        ),
        (
            "negative_min_healthy_period",
            |k| strategy(k).min_healthy_period_seconds = Some(-1),
            &[Rule::MinHealthyPeriodNotNegative],
        ),
        (
            "deletion_timeouts_of_zero_mean_no_limit",
            |k| {
                let d = &mut k.spec.machine_template.spec.deletion;
                d.node_drain_timeout_seconds = Some(0);
                d.node_volume_detach_timeout_seconds = Some(0);
                d.node_deletion_timeout_seconds = Some(0);
            },
            &[],
        ),
        (
            "negative_node_drain_timeout",
            |k| {
                k.spec
                    .machine_template
                    .spec
                    .deletion
                    .node_drain_timeout_seconds = Some(-1)
            },
            &[Rule::NodeDrainTimeoutNotNegative],
        ),
        (
            "negative_node_volume_detach_timeout",
            |k| {
                k.spec
                    .machine_template
                    .spec
                    .deletion
                    .node_volume_detach_timeout_seconds = Some(-1)
            },
            &[Rule::NodeVolumeDetachTimeoutNotNegative],
        ),
        (
            "negative_node_deletion_timeout",
            |k| {
                k.spec
                    .machine_template
                    .spec
                    .deletion
                    .node_deletion_timeout_seconds = Some(-1)
            },
            &[Rule::NodeDeletionTimeoutNotNegative],
        ),
        (
            "readiness_gates_of_both_polarities",
            |k| {
                k.spec.machine_template.spec.readiness_gates = vec![
                    MachineReadinessGate {
                        condition_type: "NetworkReady".into(),
                        polarity: None,
                    },
                    MachineReadinessGate {
                        condition_type: "DiskPressure".into(),
                        polarity: Some("Negative".into()),
                    },
                ]
            },
            &[],
        ),
        (
            "readiness_gate_of_another_polarity",
            |k| {
                k.spec.machine_template.spec.readiness_gates = vec![MachineReadinessGate {
                    condition_type: "NetworkReady".into(),
                    polarity: Some("Sideways".into()),
                }]
            },
            &[Rule::ReadinessGatePolarity],
        ),
        (
            "machine_naming_with_random",
            |k| {
                k.spec.machine_naming.template =
                    Some("{{ .kthreesControlPlane.name }}-cp-{{ .random }}".into())
            },
            &[],
        ),
        (
            "machine_naming_without_random",
            |k| k.spec.machine_naming.template = Some("{{ .kthreesControlPlane.name }}-cp".into()),
            &[Rule::MachineNamingHasRandom],
        ),
        (
            "etcd_backup_to_s3_on_a_schedule",
            |k| k.spec.etcd_backup = Some(s3_backup()),
            &[],
        ),
        (
            "etcd_backup_to_a_filesystem_path",
            |k| {
                k.spec.etcd_backup = Some(EtcdBackup {
                    target: BackupTarget {
                        filesystem: Some(FilesystemBackupTarget {
                            path: "/var/lib/k3scp/snapshots".into(),
                        }),
                        ..Default::default()
                    },
                    ..Default::default()
                })
            },
            &[],
        ),
        (
            "etcd_backup_without_a_target",
            |k| k.spec.etcd_backup = Some(EtcdBackup::default()),
            &[Rule::EtcdBackupOneTarget],
        ),
        (
            "etcd_backup_with_two_targets",
            |k| {
                let mut backup = s3_backup();
                backup.target.filesystem = Some(FilesystemBackupTarget {
                    path: "/snapshots".into(),
                });
                k.spec.etcd_backup = Some(backup);
            },
            &[Rule::EtcdBackupOneTarget],
        ),
        (
            "etcd_backup_s3_without_a_bucket",
            |k| {
                let mut backup = s3_backup();
                backup.target.s3.as_mut().unwrap().bucket = String::new();
                k.spec.etcd_backup = Some(backup);
            },
            &[Rule::EtcdBackupS3EndpointAndBucket],
        ),
        (
            "etcd_backup_to_a_relative_path",
            |k| {
                k.spec.etcd_backup = Some(EtcdBackup {
                    target: BackupTarget {
                        filesystem: Some(FilesystemBackupTarget {
                            path: "snapshots".into(),
                        }),
                        ..Default::default()
                    },
                    ..Default::default()
                })
            },
            &[Rule::EtcdBackupFilesystemPathAbsolute],
        ),
        (
            "etcd_backup_schedule_of_four_fields",
            |k| {
                let mut backup = s3_backup();
                backup.schedule = Some("0 */12 * *".into());
                k.spec.etcd_backup = Some(backup);
            },
            &[Rule::EtcdBackupScheduleShape],
        ),
        (
            "etcd_backup_keeping_none_for_no_time_with_no_time_to_take_one",
            |k| {
                let mut backup = s3_backup();
                backup.retention.count = Some(0);
                backup.retention.max_age_seconds = Some(59);
                backup.snapshot_timeout_seconds = Some(0);
                k.spec.etcd_backup = Some(backup);
            },
            &[
                Rule::EtcdBackupRetentionCountAtLeastOne,
                Rule::EtcdBackupRetentionMaxAgeAtLeastAMinute,
                Rule::EtcdBackupSnapshotTimeoutAtLeastOne,
            ],
        ),
        (
            "empty_rollout_strategy",
            |k| k.spec.rollout.strategy = Default::default(),
            &[],
        ),
        (
            "rolling_update_type",
            |k| rollout_type(k, "RollingUpdate"),
            &[],
        ),
        (
            "other_rollout_type",
            |k| rollout_type(k, "Other"),
            &[Rule::RolloutTypeRollingUpdate],
        ),
        (
            "empty_rollout_type",
            |k| rollout_type(k, ""),
            &[Rule::RolloutTypeRollingUpdate],
        ),
        ("max_surge_0", |k| max_surge(k, IntOrString::Int(0)), &[]),
        ("max_surge_1", |k| max_surge(k, IntOrString::Int(1)), &[]),
        (
            "max_surge_2",
            |k| max_surge(k, IntOrString::Int(2)),
            &[Rule::MaxSurgeZeroOrOne],
        ),
        (
            "max_surge_minus_1",
            |k| max_surge(k, IntOrString::Int(-1)),
            &[Rule::MaxSurgeZeroOrOne],
        ),
        (
            "max_surge_string_0",
            |k| max_surge(k, IntOrString::String("0".into())),
            &[],
        ),
        (
            "max_surge_string_1",
            |k| max_surge(k, IntOrString::String("1".into())),
            &[],
        ),
        (
            "max_surge_percentage",
            |k| max_surge(k, IntOrString::String("50%".into())),
            &[Rule::MaxSurgeZeroOrOne],
        ),
        (
            "max_surge_string_with_space",
            |k| max_surge(k, IntOrString::String(" 1".into())),
            &[Rule::MaxSurgeZeroOrOne],
        ),
        (
            "max_surge_2_with_other_type",
            |k| {
                rollout_type(k, "Other");
                max_surge(k, IntOrString::Int(2));
            },
            &[Rule::RolloutTypeRollingUpdate, Rule::MaxSurgeZeroOrOne],
        ),
        (
            "several_problems_at_once",
            |k| {
                k.spec.version = "latest".into();
                k.spec.replicas = Some(2);
                k.spec.machine_template.spec.infrastructure_ref = Default::default();
            },
            &[
                Rule::VersionFormat,
                Rule::ReplicasOddWithEmbeddedEtcd,
                Rule::InfrastructureRefRequired,
            ],
        ),
    ]
}

fn object(mutate: fn(&mut KThreesControlPlane)) -> KThreesControlPlane {
    let mut kcp = good();
    mutate(&mut kcp);
    kcp
}

#[test]
fn validator_rejects_each_bad_object_naming_object_and_field() {
    for (name, mutate, broken) in cases() {
        let kcp = object(mutate);
        match validate_kcp(&kcp) {
            Ok(()) => assert!(broken.is_empty(), "{name}: accepted, want {broken:?}"),
            Err(errors) => {
                let mut got = errors.rules();
                got.sort_by_key(|r| format!("{r:?}"));
                let mut want = broken.to_vec();
                want.sort_by_key(|r| format!("{r:?}"));
                assert_eq!(got, want, "{name}: {errors}");
                for e in &errors.0 {
                    let text = e.to_string();
                    assert!(
                        text.starts_with(&format!("team-a/cp: {}: ", e.rule.field())),
                        "{name}: {text}"
                    );
                }
            }
        }
    }
}

#[test]
fn max_surge_verdicts_are_what_the_controller_reads() {
    // The validator accepts exactly what max_surge() can act on.
    for (name, mutate, broken) in cases() {
        let kcp = object(mutate);
        assert_eq!(
            kcp.max_surge().is_none(),
            broken.contains(&Rule::MaxSurgeZeroOrOne),
            "{name}: max_surge() = {:?}",
            kcp.max_surge()
        );
    }
    let err = validate_kcp(&object(|k| max_surge(k, IntOrString::String("50%".into()))))
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        r#"team-a/cp: spec.rollout.strategy.rollingUpdate.maxSurge: must be 0 or 1 (got "50%")"#
    );
}

/// The template kind shares `RolloutStrategy`, so its CRD refuses the same
/// rollout strategies (its messages name the KThreesControlPlane's field),
/// in the stored v1beta3 and in cluster-api-k3s's v1beta2.
#[test]
fn template_crd_has_the_rollout_strategy_rules() {
    let crd = k3s_control_plane::api::crds::ours()
        .into_iter()
        .find(|c| c.spec.names.kind == "KThreesControlPlaneTemplate")
        .unwrap();
    let validator = kube::core::cel::Validator::new();
    for (version, field, wrap) in [
        (
            "v1beta3",
            "spec.rollout.strategy",
            (|strategy: Value| serde_json::json!({"rollout": {"strategy": strategy}}))
                as fn(Value) -> Value,
        ),
        (
            "v1beta2",
            "spec.rolloutStrategy",
            |strategy: Value| serde_json::json!({"rolloutStrategy": strategy}),
        ),
    ] {
        let served = crd
            .spec
            .versions
            .iter()
            .find(|v| v.name == version)
            .unwrap();
        let schema = serde_json::to_value(
            served
                .schema
                .as_ref()
                .and_then(|s| s.open_api_v3_schema.as_ref())
                .unwrap(),
        )
        .unwrap();
        let verdict = |strategy: Value| -> Vec<String> {
            let template = serde_json::json!({
                "apiVersion": format!("controlplane.cluster.x-k8s.io/{version}"),
                "kind": "KThreesControlPlaneTemplate",
                "metadata": {"name": "t", "namespace": "team-a"},
                "spec": {"template": {"spec": wrap(strategy)}}
            });
            match validator.validate(&schema, &template, None) {
                Ok(()) => Vec::new(),
                Err(errors) => errors.iter().map(|e| e.message.clone()).collect(),
            }
        };
        assert_eq!(
            verdict(serde_json::json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0}})),
            Vec::<String>::new(),
            "{version}"
        );
        assert_eq!(
            verdict(serde_json::json!({"rollingUpdate": {"maxSurge": "50%"}})),
            [format!("{field}.rollingUpdate.maxSurge: must be 0 or 1")],
            "{version}"
        );
        assert_eq!(
            verdict(serde_json::json!({"type": "Other"})),
            [format!("{field}.type: must be RollingUpdate")],
            "{version}"
        );
    }
}

#[test]
fn even_replicas_message_has_the_count() {
    let err = validate_kcp(&object(|k| k.spec.replicas = Some(2)))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("team-a/cp: spec.replicas: must be odd while etcd is embedded (got 2)"),
        "{err}"
    );
}

fn crd_schema() -> Value {
    let crd = KThreesControlPlane::crd();
    serde_json::to_value(
        crd.spec.versions[0]
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .unwrap(),
    )
    .unwrap()
}

/// The rule a CEL failure belongs to, from the field its message names.
fn rule_of_cel_message(message: &str) -> Vec<Rule> {
    Rule::ALL
        .into_iter()
        .filter(|r| message.starts_with(&format!("{}: ", r.field())))
        .collect()
}

#[test]
fn crd_cel_rules_give_the_same_verdicts_as_the_validator() {
    let schema = crd_schema();
    let validator = kube::core::cel::Validator::new();
    for (name, mutate, broken) in cases() {
        let kcp = object(mutate);
        let value = serde_json::to_value(&kcp).unwrap();
        let cel = validator.validate(&schema, &value, None);
        let rust = validate_kcp(&kcp);
        match (&cel, &rust) {
            (Ok(()), Ok(())) => {}
            (Err(cel_errors), Err(rust_errors)) => {
                for e in cel_errors.iter() {
                    assert!(
                        matches!(e.kind, kube::core::cel::ErrorKind::ValidationFailure),
                        "{name}: CEL rule did not evaluate cleanly: {e} ({:?})",
                        e.kind
                    );
                }
                // Each CEL failure maps to a validator rule for the same field.
                let mut cel_fields: Vec<&str> = cel_errors
                    .iter()
                    .map(|e| {
                        let rules = rule_of_cel_message(&e.message);
                        assert!(!rules.is_empty(), "{name}: CEL message names no field: {e}");
                        rules[0].field()
                    })
                    .collect();
                let mut rust_fields: Vec<&str> = rust_errors.0.iter().map(|e| e.field()).collect();
                cel_fields.sort();
                rust_fields.sort();
                assert_eq!(cel_fields, rust_fields, "{name}");
            }
            _ => panic!("{name}: CEL says {cel:?}, validator says {rust:?} (want {broken:?})"),
        }
    }
}

/// The real API server of `KUBECONFIG` with our KThreesControlPlane CRD applied
/// and established, in namespace `default`; `None` (saying why) without one.
async fn api_server(test: &str) -> Option<kube::Api<KThreesControlPlane>> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{Api, Patch, PatchParams};
    use kube::runtime::wait::{await_condition, conditions};

    if std::env::var_os("KUBECONFIG").is_none() {
        docker_support::skip(
            test,
            "KUBECONFIG is not set, no real API server to ask (none can be installed here)",
        );
        return None;
    }
    k3s_control_plane::install_crypto_provider();
    let client = kube::Client::try_default()
        .await
        .expect("client from KUBECONFIG");
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = k3s_control_plane::api::crds::ours()
        .into_iter()
        .find(|c| c.spec.names.kind == "KThreesControlPlane")
        .unwrap();
    let crd_name = crd.metadata.name.clone().unwrap();
    crds.patch(
        &crd_name,
        &PatchParams::apply("k3s-control-plane-tests").force(),
        &Patch::Apply(&crd),
    )
    .await
    .expect("apply CRD");
    // Watched, not polled: returns as soon as the CRD is Established.
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        await_condition(crds, &crd_name, conditions::is_crd_established()),
    )
    .await
    .unwrap_or_else(|_| panic!("CRD {crd_name} not established within 30s"))
    .expect("watch CRD");
    Some(Api::namespaced(client, "default"))
}

/// Against a real API server, when `KUBECONFIG` is set: install the CRD, create
/// each object, and expect rejection naming the field exactly for bad ones.
#[tokio::test]
async fn api_server_rejects_the_same_objects() {
    use kube::api::{DeleteParams, PostParams};
    // Not beside the other tests that change the real API server's CRDs
    // (crate::REAL_API_SERVER says why).
    let _serial = crate::REAL_API_SERVER.lock().await;
    let Some(api) = api_server("api_server_rejects_the_same_objects").await else {
        return;
    };
    for (i, (name, mutate, broken)) in cases().into_iter().enumerate() {
        let mut kcp = object(mutate);
        kcp.metadata.namespace = Some("default".into());
        kcp.metadata.name = Some(format!("validation-case-{i}"));
        match api.create(&PostParams::default(), &kcp).await {
            Ok(_) => {
                let _ = api
                    .delete(
                        kcp.metadata.name.as_deref().unwrap(),
                        &DeleteParams::default(),
                    )
                    .await;
                assert!(
                    broken.is_empty(),
                    "{name}: API server accepted it, want {broken:?}"
                );
            }
            Err(kube::Error::Api(status)) => {
                assert!(!broken.is_empty(), "{name}: rejected: {}", status.message);
                for rule in broken {
                    assert!(
                        status.message.contains(rule.field()),
                        "{name}: {} not named in {:?}",
                        rule.field(),
                        status.message
                    );
                }
            }
            Err(e) => panic!("{name}: {e}"),
        }
    }
}

/// One `spec.version` change on UPDATE: name, old version, new version, the
/// rules the new object breaks.
type UpdateCase = (&'static str, &'static str, &'static str, &'static [Rule]);

fn update_cases() -> Vec<UpdateCase> {
    use Rule::{VersionFormat, VersionNoDowngrade as Down, VersionNoMinorSkip as Skip};
    vec![
        ("same_version", "v1.30.2+k3s2", "v1.30.2+k3s2", &[]),
        ("patch_upgrade", "v1.30.2+k3s2", "v1.30.5+k3s1", &[]),
        ("k3s_revision_bump", "v1.30.2+k3s1", "v1.30.2+k3s2", &[]),
        ("one_minor_upgrade", "v1.30.9+k3s2", "v1.31.0+k3s1", &[]),
        // Numbers compare as numbers, not text.
        ("minor_9_to_10", "v1.9.3+k3s1", "v1.10.0+k3s1", &[]),
        ("minor_skip", "v1.30.2+k3s2", "v1.32.0+k3s1", &[Skip]),
        ("patch_downgrade", "v1.30.5+k3s1", "v1.30.2+k3s2", &[Down]),
        ("patch_10_to_9", "v1.30.10+k3s1", "v1.30.9+k3s1", &[Down]),
        ("minor_downgrade", "v1.31.0+k3s1", "v1.30.9+k3s3", &[Down]),
        (
            "k3s_revision_downgrade",
            "v1.30.2+k3s2",
            "v1.30.2+k3s1",
            &[Down],
        ),
        (
            "k3s_revision_10_to_9",
            "v1.30.2+k3s10",
            "v1.30.2+k3s9",
            &[Down],
        ),
        (
            "prerelease_to_its_release",
            "v1.31.0-rc1+k3s1",
            "v1.31.0+k3s1",
            &[],
        ),
        (
            "release_to_its_prerelease",
            "v1.31.0+k3s1",
            "v1.31.0-rc1+k3s1",
            &[Down],
        ),
        // Pre-release tags are not ordered: same numbers, no downgrade.
        (
            "prerelease_tag_back",
            "v1.31.0-rc2+k3s1",
            "v1.31.0-rc1+k3s1",
            &[],
        ),
        (
            "prerelease_tag_with_dots",
            "v1.31.0-rc.1+k3s1",
            "v1.31.0-rc.2+k3s1",
            &[],
        ),
        (
            "release_to_next_revision_prerelease",
            "v1.31.0+k3s1",
            "v1.31.0-rc1+k3s2",
            &[],
        ),
        (
            "prerelease_of_next_minor",
            "v1.30.2+k3s2",
            "v1.31.0-rc1+k3s1",
            &[],
        ),
        (
            "prerelease_downgrade_by_patch",
            "v1.31.1-rc1+k3s1",
            "v1.31.0+k3s1",
            &[Down],
        ),
        (
            "prerelease_two_minors_up",
            "v1.30.2+k3s2",
            "v1.32.0-rc1+k3s1",
            &[Skip],
        ),
        ("major_upgrade", "v1.30.2+k3s2", "v2.0.0+k3s1", &[Skip]),
        (
            "major_upgrade_next_minor",
            "v1.30.2+k3s2",
            "v2.31.0+k3s1",
            &[Skip],
        ),
        // A lower major is a downgrade, reported once as that.
        ("major_downgrade", "v2.0.0+k3s1", "v1.30.2+k3s2", &[Down]),
        // A bad new version is the format rule's alone, even against a newer old one.
        (
            "to_unparseable",
            "v1.31.0+k3s1",
            "v1.30.2",
            &[VersionFormat],
        ),
        // An old version the pattern no longer takes (written before it
        // tightened) is not compared. The API server cannot be given one.
        ("from_unparseable", "v1.31.0", "v1.29.0+k3s1", &[]),
    ]
}

fn with_version(version: &str) -> KThreesControlPlane {
    let mut kcp = good();
    kcp.spec.version = version.into();
    kcp
}

fn sorted(mut rules: Vec<Rule>) -> Vec<Rule> {
    rules.sort_by_key(|r| format!("{r:?}"));
    rules
}

#[test]
fn validator_checks_version_changes_on_update_only() {
    for (name, from, to, broken) in update_cases() {
        let (old, new) = (with_version(from), with_version(to));
        let got = match validate_kcp_update(&old, &new) {
            Ok(()) => Vec::new(),
            Err(errors) => {
                for e in &errors.0 {
                    let text = e.to_string();
                    assert!(
                        text.starts_with("team-a/cp: spec.version: "),
                        "{name}: {text}"
                    );
                    if e.rule.is_transition() {
                        assert!(
                            e.message.contains(from) && e.message.contains(to),
                            "{name}: {text} does not name both versions"
                        );
                    }
                }
                sorted(errors.rules())
            }
        };
        assert_eq!(got, sorted(broken.to_vec()), "{name}");

        // The bare check agrees, and displays as the CEL message does.
        let transition: Vec<Rule> = broken
            .iter()
            .copied()
            .filter(|r| r.is_transition())
            .collect();
        match check_version_change(from, to) {
            Ok(()) => assert!(transition.is_empty(), "{name}: passed, want {transition:?}"),
            Err(e) => {
                assert_eq!(vec![e.rule], transition, "{name}: {e}");
                assert_eq!(e.to_string(), format!("spec.version: {}", e.message));
            }
        }

        // Without an old object no transition rule runs.
        if let Err(errors) = validate_kcp(&new) {
            assert!(
                !errors.rules().iter().any(|r| r.is_transition()),
                "{name}: validate_kcp ran a transition rule: {errors}"
            );
        }
    }
}

#[test]
fn version_change_messages_say_what_to_do() {
    let skip = check_version_change("v1.30.2+k3s2", "v1.32.0+k3s1").unwrap_err();
    assert_eq!(
        skip.to_string(),
        "spec.version: cannot skip a minor version: v1.30.2+k3s2 to v1.32.0+k3s1 (one minor version at a time: from v1.30 to the next)"
    );
    let down = check_version_change("v1.31.2+k3s1", "v1.30.2+k3s2").unwrap_err();
    assert_eq!(
        down.to_string(),
        "spec.version: cannot downgrade from v1.31.2+k3s1 to v1.30.2+k3s2"
    );
    let major = check_version_change("v1.30.2+k3s2", "v2.0.0+k3s1").unwrap_err();
    assert_eq!(
        major.to_string(),
        "spec.version: cannot change the major version: v1.30.2+k3s2 to v2.0.0+k3s1"
    );
}

#[test]
fn crd_transition_rules_give_the_same_verdicts_and_messages_as_the_validator() {
    let schema = crd_schema();
    let validator = kube::core::cel::Validator::new();
    for (name, from, to, broken) in update_cases() {
        let (old, new) = (with_version(from), with_version(to));
        let old_value = serde_json::to_value(&old).unwrap();
        let new_value = serde_json::to_value(&new).unwrap();

        // On create (no old object) the transition rules do not run.
        let created = validator.validate(&schema, &new_value, None);
        assert_eq!(
            created.is_err(),
            validate_kcp(&new).is_err(),
            "{name}: create: CEL says {created:?}"
        );

        let cel = match validator.validate(&schema, &new_value, Some(&old_value)) {
            Ok(()) => Vec::new(),
            Err(errors) => errors.into_vec(),
        };
        for e in &cel {
            assert!(
                matches!(e.kind, kube::core::cel::ErrorKind::ValidationFailure),
                "{name}: CEL rule did not evaluate cleanly: {e} ({:?})",
                e.kind
            );
        }
        let rust = validate_kcp_update(&old, &new)
            .err()
            .map(|e| e.0)
            .unwrap_or_default();
        let cel_fields: Vec<&str> = cel
            .iter()
            .map(|e| {
                let rules = rule_of_cel_message(&e.message);
                assert!(!rules.is_empty(), "{name}: CEL message names no field: {e}");
                rules[0].field()
            })
            .collect();
        let rust_fields: Vec<&str> = rust.iter().map(|e| e.field()).collect();
        assert_eq!(
            cel_fields, rust_fields,
            "{name}: CEL {cel:?}, validator {rust:?}"
        );
        assert_eq!(rust.len(), broken.len(), "{name}: {rust:?}");
        // A transition rule's CEL message is the validator's, word for word.
        for e in rust.iter().filter(|e| e.rule.is_transition()) {
            let want = format!("{}: {}", e.field(), e.message);
            assert!(
                cel.iter().any(|c| c.message == want),
                "{name}: no CEL message {want:?} in {cel:?}"
            );
        }
    }
}

/// Against a real API server, when `KUBECONFIG` is set: create each old object,
/// patch in the new version, and expect the same verdicts, the message naming
/// the field and both versions.
#[tokio::test]
async fn api_server_checks_the_same_version_changes() {
    use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
    // Not beside the other tests that change the real API server's CRDs
    // (crate::REAL_API_SERVER says why).
    let _serial = crate::REAL_API_SERVER.lock().await;
    let Some(api) = api_server("api_server_checks_the_same_version_changes").await else {
        return;
    };
    for (i, (name, from, to, broken)) in update_cases().into_iter().enumerate() {
        let mut old = with_version(from);
        if validate_kcp(&old).is_err() {
            eprintln!(
                "{name} skipped on the API server: it cannot be given the old version {from:?}"
            );
            continue;
        }
        let object = format!("version-change-{i}");
        old.metadata.namespace = Some("default".into());
        old.metadata.name = Some(object.clone());
        // A leftover from an interrupted run would make create fail.
        let _ = api.delete(&object, &DeleteParams::default()).await;
        api.create(&PostParams::default(), &old)
            .await
            .unwrap_or_else(|e| panic!("{name}: create with {from}: {e}"));
        let patch = serde_json::json!({"spec": {"version": to}});
        let result = api
            .patch(&object, &PatchParams::default(), &Patch::Merge(&patch))
            .await;
        let _ = api.delete(&object, &DeleteParams::default()).await;
        match result {
            Ok(_) => assert!(
                broken.is_empty(),
                "{name}: API server accepted {from} -> {to}, want {broken:?}"
            ),
            Err(kube::Error::Api(status)) => {
                assert!(!broken.is_empty(), "{name}: rejected: {}", status.message);
                assert!(
                    status.message.contains("spec.version"),
                    "{name}: {}",
                    status.message
                );
                if broken.iter().any(|r| r.is_transition()) {
                    let rust =
                        validate_kcp_update(&with_version(from), &with_version(to)).unwrap_err();
                    for e in rust.0.iter().filter(|e| e.rule.is_transition()) {
                        assert!(
                            status.message.contains(&e.message),
                            "{name}: {:?} not in {:?}",
                            e.message,
                            status.message
                        );
                    }
                }
            }
            Err(e) => panic!("{name}: {e}"),
        }
    }
}

/// Against a real API server, when `KUBECONFIG` is set: what the CRD promises
/// beyond validation. Defaults (`replicas` 1 and cluster-api-k3s's
/// `serverConfig` defaults filled into an object that has none), the scale
/// subresource (read and written), and the printer columns `kubectl get`
/// shows, in the order the CRD declares them.
#[tokio::test]
async fn api_server_applies_defaults_scale_and_printer_columns() {
    use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
    // Not beside the other tests that change the real API server's CRDs
    // (crate::REAL_API_SERVER says why).
    let _serial = crate::REAL_API_SERVER.lock().await;
    let Some(api) = api_server("api_server_applies_defaults_scale_and_printer_columns").await
    else {
        return;
    };
    let mut kcp = good();
    kcp.spec.replicas = None;
    kcp.metadata.namespace = Some("default".into());
    kcp.metadata.name = Some("defaults-and-columns".into());
    let _ = api
        .delete("defaults-and-columns", &DeleteParams::default())
        .await;
    let created = api.create(&PostParams::default(), &kcp).await.unwrap();
    let server = &created.spec.kthrees_config_spec.server_config;
    assert_eq!(created.spec.replicas, Some(1), "replicas defaulted");
    assert_eq!(server.disable_cloud_controller, Some(true));
    assert_eq!(server.cloud_provider_name.as_deref(), Some("external"));

    let scale = api.get_scale("defaults-and-columns").await.unwrap();
    assert_eq!(scale.spec.and_then(|s| s.replicas), Some(1));
    api.patch_scale(
        "defaults-and-columns",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"replicas": 3}})),
    )
    .await
    .unwrap();
    assert_eq!(
        api.get("defaults-and-columns").await.unwrap().spec.replicas,
        Some(3),
        "the scale subresource writes spec.replicas"
    );

    // What `kubectl get` asks for: a Table, with our printer columns.
    let request = http::Request::get(
        "/apis/controlplane.cluster.x-k8s.io/v1beta3/namespaces/default/kthreescontrolplanes/defaults-and-columns",
    )
    .header(
        "Accept",
        "application/json;as=Table;v=v1;g=meta.k8s.io",
    )
    .body(Vec::new())
    .unwrap();
    let client = kube::Client::try_default().await.unwrap();
    let table: Value = client.request(request).await.unwrap();
    let columns: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    let crd = k3s_control_plane::api::crds::ours()
        .into_iter()
        .find(|c| c.spec.names.kind == "KThreesControlPlane")
        .unwrap();
    let declared: Vec<String> = crd.spec.versions[0]
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| c.name.clone())
        .collect();
    let mut want = vec!["Name"];
    want.extend(declared.iter().map(String::as_str));
    assert_eq!(columns, want);
    let cells = table["rows"][0]["cells"].as_array().unwrap();
    let version_column = columns.iter().position(|c| *c == "Version").unwrap();
    assert_eq!(cells[version_column], "v1.30.2+k3s2");
    let desired_column = columns.iter().position(|c| *c == "Desired").unwrap();
    assert_eq!(cells[desired_column], 3);
    let _ = api
        .delete("defaults-and-columns", &DeleteParams::default())
        .await;
}
