//! Round trips of realistic objects through our types: deserialize, serialize,
//! and compare as JSON values, so nothing another controller wrote is lost when
//! we send an object back. Plus the accessors the controller relies on.

use k3s_control_plane::api::condition_names::{REMEDIATING, owner_remediated};
use k3s_control_plane::api::conditions::ConditionSource;
use k3s_control_plane::api::names::*;
use k3s_control_plane::api::{
    Cluster, KThreesConfig, KThreesControlPlane, Machine, MachineHealthCheck, validate_kcp,
};
use k3s_control_plane::remediation::model::RemediationData;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

fn fixture(name: &str) -> Value {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    k3s_control_plane::yaml::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A control-plane fixture in cluster-api-k3s's v1beta2, as the API server
/// stores it: converted to v1beta3 by our conversion.
fn stored(name: &str) -> Value {
    use k3s_control_plane::api::conversion::{KnownApiVersions, V1BETA3, convert};
    convert(&fixture(name), V1BETA3, &KnownApiVersions::new())
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Parse `name` as `T`, write it back, and require the same JSON.
fn round_trip<T: DeserializeOwned + Serialize>(name: &str) -> T {
    round_trip_value(name, fixture(name))
}

/// Parse `original` as `T`, write it back, and require the same JSON.
fn round_trip_value<T: DeserializeOwned + Serialize>(name: &str, original: Value) -> T {
    let typed: T = serde_json::from_value(original.clone())
        .unwrap_or_else(|e| panic!("{name}: does not deserialize: {e}"));
    let back = serde_json::to_value(&typed).unwrap();
    if back != original {
        let diff = json_patch::diff(&original, &back);
        panic!(
            "{name}: round trip changed the object:\n{}",
            serde_json::to_string_pretty(&diff).unwrap()
        );
    }
    typed
}

#[test]
fn machine_with_health_check_conditions_round_trips() {
    let m: Machine = round_trip("machine-unhealthy.yaml");
    assert_eq!(m.spec.cluster_name, "prod");
    assert_eq!(m.spec.version.as_deref(), Some("v1.30.2+k3s2"));
    assert_eq!(m.spec.failure_domain.as_deref(), Some("zone-b"));
    let config = m.spec.bootstrap.config_ref.as_ref().unwrap();
    assert_eq!(
        (config.kind.as_str(), config.name.as_str()),
        ("KThreesConfig", "prod-control-plane-7xk2p")
    );
    assert_eq!(m.spec.infrastructure_ref.kind, "DockerMachine");
    assert_eq!(m.node_name(), Some("prod-control-plane-7xk2p"));
    assert!(
        m.addresses()
            .iter()
            .any(|a| a.type_ == "InternalIP" && a.address == "172.18.0.5")
    );
    let hc = m.condition(HEALTH_CHECK_SUCCEEDED_CONDITION).unwrap();
    assert!(hc.is_false());
    assert_eq!(hc.reason, UNHEALTHY_NODE_REASON);
    assert_eq!(hc.source, ConditionSource::V1Beta2);
    let or = m.condition(OWNER_REMEDIATED_CONDITION).unwrap();
    assert!(or.is_false());
    assert_eq!(or.reason, WAITING_FOR_REMEDIATION_REASON);
    // The deprecated list is read too.
    assert_eq!(m.v1beta1_conditions().len(), 4);
    let labels = m.metadata.labels.as_ref().unwrap();
    assert_eq!(labels[CONTROL_PLANE_LABEL], "");
    assert_eq!(labels[CONTROL_PLANE_NAME_LABEL], "prod-control-plane");
    let annotations = m.metadata.annotations.as_ref().unwrap();
    let data = RemediationData::parse(
        &annotations[REMEDIATION_FOR_ANNOTATION],
        "team-a/prod-control-plane-7xk2p",
        REMEDIATION_FOR_ANNOTATION,
    )
    .unwrap();
    assert_eq!(
        (data.machine.as_str(), data.retry_count),
        ("prod-control-plane-4hv9q", 1)
    );
    assert!(
        annotations
            .keys()
            .any(|k| k.starts_with(PRE_TERMINATE_HOOK_PREFIX))
    );
}

#[test]
fn machine_with_only_v1beta1_conditions_is_understood() {
    let mut value = fixture("machine-unhealthy.yaml");
    value["status"]
        .as_object_mut()
        .unwrap()
        .remove("conditions");
    let m: Machine = serde_json::from_value(value).unwrap();
    let or = m.condition(OWNER_REMEDIATED_CONDITION).unwrap();
    assert!(or.is_false());
    assert_eq!(or.reason, WAITING_FOR_REMEDIATION_REASON);
    assert_eq!(or.source, ConditionSource::V1Beta1);
}

#[test]
fn setting_a_condition_keeps_the_unknown_fields() {
    let original = fixture("machine-unhealthy.yaml");
    let mut m: Machine = serde_json::from_value(original.clone()).unwrap();
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::from_second(1_714_558_000).unwrap(),
    );
    k3s_control_plane::api::conditions::set(
        m.conditions_mut(),
        k3s_control_plane::api::conditions::new_condition(
            OWNER_REMEDIATED_CONDITION,
            "False",
            owner_remediated::REASON_REMEDIATION_IN_PROGRESS,
            "removing etcd member",
            Some(2),
            now,
        ),
    );
    let back = serde_json::to_value(&m).unwrap();
    // Only the OwnerRemediated reason and message changed (same status keeps the time).
    let diff = json_patch::diff(&original, &back);
    let paths: Vec<String> = serde_json::to_value(&diff)
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .map(|op| op["path"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        paths,
        [
            "/status/conditions/3/message",
            "/status/conditions/3/reason"
        ],
        "{diff:?}"
    );
}

#[test]
fn cluster_round_trips() {
    let c: Cluster = round_trip("cluster.yaml");
    assert!(c.control_plane_initialized());
    assert_eq!(c.control_plane_failure_domains(), ["zone-a", "zone-b"]);
    let cp = c.spec.control_plane_ref.as_ref().unwrap();
    assert_eq!(
        (cp.kind.as_str(), cp.name.as_str()),
        ("KThreesControlPlane", "prod-control-plane")
    );
}

#[test]
fn machine_health_check_round_trips() {
    let mhc: MachineHealthCheck = round_trip("machinehealthcheck.yaml");
    assert_eq!(mhc.spec.cluster_name, "prod");
    let checks = mhc.spec.checks.as_ref().unwrap();
    assert_eq!(checks.unhealthy_node_conditions.len(), 2);
    assert_eq!(
        checks.unhealthy_node_conditions[0].timeout_seconds,
        Some(300)
    );
    assert!(
        mhc.spec
            .remediation
            .as_ref()
            .unwrap()
            .template_ref
            .is_none()
    );
}

#[test]
fn upstream_quickstart_kcp_round_trips_and_validates() {
    let kcp: KThreesControlPlane = round_trip_value(
        "kcp-docker-quickstart.yaml",
        stored("kcp-docker-quickstart.yaml"),
    );
    assert_eq!(kcp.desired_replicas(), 3);
    assert!(kcp.etcd_is_embedded());
    assert_eq!(
        kcp.spec.kthrees_config_spec.server_config.tls_san,
        ["0.0.0.0"]
    );
    validate_kcp(&kcp).unwrap();
}

#[test]
fn full_kcp_round_trips_keeping_unmodelled_fields() {
    let kcp: KThreesControlPlane = round_trip_value("kcp-full.yaml", stored("kcp-full.yaml"));
    validate_kcp(&kcp).unwrap();
    let config = &kcp.spec.kthrees_config_spec;
    assert_eq!(config.server_config.extra["futureFlag"], Value::Bool(true));
    assert!(config.agent_config.extra.contains_key("futureList"));
    assert!(config.extra.contains_key("futureBlock"));
    assert_eq!(
        config.server_config.kube_api_server_args,
        ["anonymous-auth=true"]
    );
    assert_eq!(config.server_config.cluster_dns, "10.46.0.10");
    assert_eq!(kcp.max_retry(), Some(3));
    assert_eq!(
        kcp.retry_period(),
        Some(std::time::Duration::from_secs(600))
    );
    assert_eq!(
        kcp.min_healthy_period(),
        Some(std::time::Duration::from_secs(7200))
    );
    let status = kcp.status.as_ref().unwrap();
    assert_eq!(status.last_remediation.as_ref().unwrap().retry_count, 1);
    assert_eq!(
        status
            .initialization
            .as_ref()
            .unwrap()
            .control_plane_initialized,
        Some(true)
    );
    assert!(k3s_control_plane::api::conditions::is_true(
        kcp.conditions(),
        REMEDIATING
    ));
}

#[test]
fn kcp_defaults_when_strategy_is_absent() {
    let kcp: KThreesControlPlane =
        serde_json::from_value(stored("kcp-docker-quickstart.yaml")).unwrap();
    assert_eq!(kcp.max_retry(), None);
    assert_eq!(kcp.retry_period(), Some(std::time::Duration::ZERO));
    assert_eq!(
        kcp.min_healthy_period(),
        Some(std::time::Duration::from_secs(3600))
    );
}

#[test]
fn kthrees_config_round_trips() {
    let cfg: KThreesConfig = round_trip("kthreesconfig.yaml");
    let status = cfg.status.as_ref().unwrap();
    assert!(status.ready);
    assert_eq!(
        status.data_secret_name.as_deref(),
        Some("prod-control-plane-7xk2p")
    );
    assert_eq!(cfg.spec.agent_config.node_name, "prod-control-plane-7xk2p");
}

#[test]
fn kcp_status_written_by_cluster_api_k3s_still_deserializes() {
    // cluster-api-k3s writes v1beta1-style conditions (severity, reason omitted
    // when True) in status.conditions; taking over such an object must not fail.
    let mut value = fixture("kcp-docker-quickstart.yaml");
    value["status"] = serde_json::json!({
        "initialized": true,
        "ready": true,
        "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": "2024-05-01T09:10:00Z"},
            {"type": "MachinesReady", "status": "False", "severity": "Warning",
             "reason": "NodeNotReady", "lastTransitionTime": "2024-05-01T09:10:00Z"}
        ],
        "v1beta2": {"conditions": []}
    });
    let kcp: KThreesControlPlane = serde_json::from_value(value).unwrap();
    let status = kcp.status.unwrap();
    assert!(status.initialized);
    assert_eq!(status.conditions.len(), 2);
    assert_eq!(status.conditions[1].reason, "NodeNotReady");
}
