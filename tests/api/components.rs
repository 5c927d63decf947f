//! The clusterctl artifacts: the committed files are what the code renders,
//! every object carries the provider label, every placeholder has a default,
//! the Deployment's arguments are ones `run` accepts, and the RBAC stays narrow.

use std::collections::BTreeMap;

use clap::Parser;
use k3s_control_plane::components::{
    self, AGGREGATE_TO_MANAGER_LABEL, COMMITTED_DIR, COMPONENTS_FILE, METADATA_FILE, Options,
    PROVIDER_LABEL, PROVIDER_NAME, REGENERATE_COMMAND, variables,
};
use serde_json::Value;

fn committed(file: &str) -> String {
    let path = format!("{}/{COMMITTED_DIR}/{file}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn documents(text: &str) -> Vec<Value> {
    k3s_control_plane::yaml::documents(text).expect("every document is YAML")
}

fn with_defaults(options: &Options) -> Vec<Value> {
    documents(&components::render_substituted(options, &BTreeMap::new()).unwrap())
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

#[test]
fn committed_artifacts_are_what_the_code_renders() {
    assert!(
        committed(COMPONENTS_FILE) == components::render(&Options::default()),
        "{COMMITTED_DIR}/{COMPONENTS_FILE} is stale: run `{REGENERATE_COMMAND}`"
    );
    assert!(
        committed(METADATA_FILE) == components::metadata::render(),
        "{COMMITTED_DIR}/{METADATA_FILE} is stale: run `{REGENERATE_COMMAND}`"
    );
}

/// What we ship reads back as the objects rendered (a YAML reader could take
/// an unquoted string for a number or a boolean).
#[test]
fn committed_components_read_back_as_the_objects_rendered() {
    assert!(
        documents(&committed(COMPONENTS_FILE)) == components::objects(&Options::default()),
        "{COMMITTED_DIR}/{COMPONENTS_FILE} reads back as other objects: run `{REGENERATE_COMMAND}`"
    );
    let metadata: Value = k3s_control_plane::yaml::from_str(&committed(METADATA_FILE)).unwrap();
    let series: Vec<Value> = components::metadata::RELEASE_SERIES
        .iter()
        .map(|(major, minor, contract)| {
            serde_json::json!({"major": major, "minor": minor, "contract": contract})
        })
        .collect();
    assert_eq!(metadata["releaseSeries"], Value::Array(series));
}

#[test]
fn metadata_maps_this_release_series_to_the_v1beta2_contract() {
    let metadata: Value = k3s_control_plane::yaml::from_str(&committed(METADATA_FILE)).unwrap();
    assert_eq!(
        metadata["apiVersion"],
        "clusterctl.cluster.x-k8s.io/v1alpha3"
    );
    assert_eq!(metadata["kind"], "Metadata");
    let (major, minor) = components::metadata::this_series();
    let series = metadata["releaseSeries"].as_array().unwrap();
    assert!(
        series
            .iter()
            .any(|s| s["major"] == major && s["minor"] == minor && s["contract"] == "v1beta2"),
        "{series:?}"
    );
}

#[test]
fn every_object_carries_the_provider_label_and_every_placeholder_a_default() {
    let text = committed(COMPONENTS_FILE);
    let used: Vec<&str> = variables::placeholders(&text)
        .unwrap()
        .into_iter()
        .map(|(_, v)| v.name)
        .collect();
    for v in variables::ALL {
        assert!(
            used.contains(&v.name),
            "{} is declared but never used",
            v.name
        );
    }
    let docs = documents(&text);
    assert!(docs.len() >= 10, "{} documents", docs.len());
    for doc in &docs {
        assert_eq!(
            doc["metadata"]["labels"][PROVIDER_LABEL], PROVIDER_NAME,
            "{} {} lacks the provider label",
            doc["kind"], doc["metadata"]["name"]
        );
    }
    // Namespaced objects all live in the one (placeholder) namespace, as
    // clusterctl requires of a provider's components.
    let namespace = variables::NAMESPACE.placeholder();
    for doc in &docs {
        if let Some(ns) = doc["metadata"]["namespace"].as_str() {
            assert_eq!(ns, namespace, "{} {}", doc["kind"], doc["metadata"]["name"]);
        }
    }
}

#[test]
fn with_defaults_substituted_every_object_is_a_valid_kubernetes_object() {
    use k8s_openapi::api::{apps::v1 as apps, core::v1 as core, rbac::v1 as rbac};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let docs = with_defaults(&Options::default());
    let mut kinds = Vec::new();
    for doc in docs {
        let kind = doc["kind"].as_str().unwrap().to_string();
        let parsed = match kind.as_str() {
            "Namespace" => serde_json::from_value::<core::Namespace>(doc).map(|_| ()),
            "ServiceAccount" => serde_json::from_value::<core::ServiceAccount>(doc).map(|_| ()),
            "CustomResourceDefinition" => {
                serde_json::from_value::<CustomResourceDefinition>(doc).map(|_| ())
            }
            "ClusterRole" => serde_json::from_value::<rbac::ClusterRole>(doc).map(|_| ()),
            "ClusterRoleBinding" => {
                serde_json::from_value::<rbac::ClusterRoleBinding>(doc).map(|_| ())
            }
            "Role" => serde_json::from_value::<rbac::Role>(doc).map(|_| ()),
            "RoleBinding" => serde_json::from_value::<rbac::RoleBinding>(doc).map(|_| ()),
            "Deployment" => serde_json::from_value::<apps::Deployment>(doc).map(|_| ()),
            "Service" => serde_json::from_value::<core::Service>(doc).map(|_| ()),
            // cert-manager's kinds: no Rust types here; the fields they need.
            "Issuer" => {
                assert!(doc["spec"]["selfSigned"].is_object(), "{doc}");
                Ok(())
            }
            "Certificate" => {
                assert!(doc["spec"]["secretName"].is_string(), "{doc}");
                assert!(
                    doc["spec"]["dnsNames"][0]
                        .as_str()
                        .unwrap()
                        .ends_with(".svc"),
                    "{doc}"
                );
                Ok(())
            }
            other => panic!("unexpected kind {other}"),
        };
        parsed.unwrap_or_else(|e| panic!("{kind}: {e}"));
        kinds.push(kind);
    }
    assert_eq!(
        kinds
            .iter()
            .filter(|k| *k == "CustomResourceDefinition")
            .count(),
        2
    );
}

#[test]
fn the_crds_are_ours_with_each_contract_label_listing_its_versions() {
    let docs = with_defaults(&Options::default());
    let crds: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == "CustomResourceDefinition")
        .collect();
    let ours = k3s_control_plane::api::crds::ours();
    assert_eq!(crds.len(), ours.len());
    for (doc, crd) in crds.iter().zip(&ours) {
        let mut expected = serde_json::to_value(crd).unwrap();
        expected["metadata"]["labels"][PROVIDER_LABEL] = PROVIDER_NAME.into();
        assert_eq!(**doc, expected);
        let v1beta1_contract = if doc["spec"]["names"]["kind"] == "KThreesControlPlane" {
            "v1beta1_v1beta2"
        } else {
            "v1beta2"
        };
        assert_eq!(
            doc["metadata"]["labels"]["cluster.x-k8s.io/v1beta1"],
            v1beta1_contract
        );
        assert_eq!(
            doc["metadata"]["labels"]["cluster.x-k8s.io/v1beta2"],
            "v1beta3"
        );
    }
}

#[derive(Parser)]
struct RunCli {
    #[command(flatten)]
    run: k3s_control_plane::cli::run::RunArgs,
}

fn container(docs: &[Value]) -> &Value {
    &find(docs, "Deployment", components::NAME)["spec"]["template"]["spec"]["containers"][0]
}

fn run_args(docs: &[Value]) -> k3s_control_plane::cli::run::RunArgs {
    let args: Vec<String> = container(docs)["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    assert_eq!(args[0], "run");
    RunCli::try_parse_from(&args)
        .unwrap_or_else(|e| panic!("run rejects the Deployment's arguments {args:?}: {e}"))
        .run
}

#[test]
fn the_deployment_runs_two_elected_replicas_that_run_accepts() {
    let docs = with_defaults(&Options::default());
    let deployment = find(&docs, "Deployment", components::NAME);
    assert_eq!(deployment["spec"]["replicas"], 2);
    let args = run_args(&docs);
    assert!(args.leader_elect);
    assert_eq!(
        args.watch_filter.as_deref(),
        Some(""),
        "empty default: no filter"
    );
    assert_eq!(args.concurrency, 10);
    assert_eq!(args.log_level, "info");
    assert!(args.log_json);
    assert_eq!(args.namespace, None);
    let container = container(&docs);
    // The probes reach the port `run` serves them on by default.
    assert_eq!(
        container["ports"][0]["containerPort"],
        args.probe_address.port()
    );
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(
        container["livenessProbe"]["httpGet"]["port"],
        container["ports"][0]["name"]
    );
    let env: Vec<(&str, &str)> = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let path = e["valueFrom"]["fieldRef"]["fieldPath"]
                .as_str()
                .unwrap_or("");
            (e["name"].as_str().unwrap(), path)
        })
        .collect();
    assert!(env.contains(&("POD_NAME", "metadata.name")), "{env:?}");
    assert!(
        env.contains(&("POD_NAMESPACE", "metadata.namespace")),
        "{env:?}"
    );
    let security = &container["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["runAsNonRoot"], true);
    assert_eq!(security["capabilities"]["drop"], serde_json::json!(["ALL"]));
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["serviceAccountName"], components::NAME);
    for key in ["cpu", "memory"] {
        assert!(
            container["resources"]["requests"][key].is_string(),
            "request {key}"
        );
    }
    assert!(container["resources"]["limits"]["memory"].is_string());
    assert_eq!(container["image"], variables::IMAGE.default);
}

#[test]
fn clusterctl_variables_reach_the_controller() {
    let values = BTreeMap::from([
        (variables::CONCURRENCY.name.to_string(), "3".to_string()),
        (
            variables::WATCH_FILTER.name.to_string(),
            "shard-a".to_string(),
        ),
        (variables::LOG_LEVEL.name.to_string(), "debug".to_string()),
        (
            variables::NAMESPACE.name.to_string(),
            "capk3s-system".to_string(),
        ),
    ]);
    let docs = documents(&components::render_substituted(&Options::default(), &values).unwrap());
    let args = run_args(&docs);
    assert_eq!(args.concurrency, 3);
    assert_eq!(args.watch_filter.as_deref(), Some("shard-a"));
    assert_eq!(args.log_level, "debug");
    let deployment = find(&docs, "Deployment", components::NAME);
    assert_eq!(deployment["metadata"]["namespace"], "capk3s-system");
    let binding = find(&docs, "ClusterRoleBinding", components::MANAGER_ROLE);
    assert_eq!(binding["subjects"][0]["namespace"], "capk3s-system");
}

fn rules(role: &Value) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for rule in role["rules"].as_array().unwrap() {
        for group in rule["apiGroups"].as_array().unwrap() {
            for resource in rule["resources"].as_array().unwrap() {
                for verb in rule["verbs"].as_array().unwrap() {
                    out.push((
                        group.as_str().unwrap().to_string(),
                        resource.as_str().unwrap().to_string(),
                        verb.as_str().unwrap().to_string(),
                    ));
                }
            }
        }
    }
    out
}

#[test]
fn rbac_is_narrow_no_wildcard_verbs_no_listing_secrets_leases_only_at_home() {
    let docs = with_defaults(&Options::default());
    let manager = rules(find(&docs, "ClusterRole", components::MANAGER_ROLE));
    let secrets = rules(find(&docs, "ClusterRole", components::SECRETS_ROLE));
    for (group, resource, verb) in manager.iter().chain(&secrets) {
        assert_ne!(verb, "*", "{group}/{resource}");
        assert_ne!(group, "*", "{resource}");
        assert!(
            resource != "*" || group == "infrastructure.cluster.x-k8s.io",
            "wildcard resources only where the kinds are the provider's: {group}"
        );
        assert!(!resource.contains("leases"), "no cluster-wide lease access");
    }
    assert!(
        !manager
            .iter()
            .any(|(g, r, _)| g.is_empty() && r == "secrets"),
        "Secrets only in their own role"
    );
    let infra_verbs: Vec<&str> = manager
        .iter()
        .filter(|(g, _, _)| g == "infrastructure.cluster.x-k8s.io")
        .map(|(_, _, v)| v.as_str())
        .collect();
    assert!(
        !infra_verbs
            .iter()
            .any(|v| ["list", "watch", "update", "deletecollection"].contains(v)),
        "{infra_verbs:?}"
    );
    let secret_verbs: Vec<&str> = secrets.iter().map(|(_, _, v)| v.as_str()).collect();
    assert_eq!(
        secret_verbs,
        ["get", "create", "update"],
        "never list or watch Secrets"
    );

    let namespace = variables::NAMESPACE.default;
    let leases = find(&docs, "Role", components::LEADER_ELECTION_ROLE);
    assert_eq!(leases["metadata"]["namespace"], namespace);
    assert!(
        rules(leases)
            .iter()
            .all(|(g, r, _)| g == "coordination.k8s.io" && r == "leases")
    );
    let binding = find(&docs, "RoleBinding", components::LEADER_ELECTION_ROLE);
    assert_eq!(binding["metadata"]["namespace"], namespace);
    assert_eq!(binding["roleRef"]["kind"], "Role");

    let capi = find(&docs, "ClusterRole", components::CAPI_CORE_ROLE);
    assert_eq!(
        capi["metadata"]["labels"][AGGREGATE_TO_MANAGER_LABEL],
        "true"
    );
    assert!(
        rules(capi)
            .iter()
            .all(|(g, _, _)| g == "controlplane.cluster.x-k8s.io")
    );
    assert!(
        !docs
            .iter()
            .any(|d| d["kind"].as_str().unwrap().ends_with("Binding")
                && d["roleRef"]["name"] == components::CAPI_CORE_ROLE),
        "the CAPI core role is aggregated, never bound to us"
    );
}

#[test]
fn namespace_scoped_components_grant_only_crd_reads_cluster_wide() {
    let options = Options {
        watch_namespace: Some("tenant-a".into()),
        ..Options::default()
    };
    let docs = with_defaults(&options);
    // CRDs are cluster-scoped: reading one by name is all that is granted
    // beyond the namespace.
    let cluster_wide: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == "ClusterRoleBinding")
        .collect();
    assert_eq!(cluster_wide.len(), 1);
    assert_eq!(
        cluster_wide[0]["roleRef"]["name"],
        components::CONTRACT_VERSIONS_ROLE
    );
    let role = find(&docs, "ClusterRole", components::CONTRACT_VERSIONS_ROLE);
    assert_eq!(
        role["rules"],
        serde_json::json!([{"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["get"]}])
    );
    for role in [components::MANAGER_ROLE, components::SECRETS_ROLE] {
        let binding = find(&docs, "RoleBinding", role);
        assert_eq!(binding["metadata"]["namespace"], "tenant-a");
        assert_eq!(binding["roleRef"]["kind"], "ClusterRole");
    }
    assert_eq!(run_args(&docs).namespace.as_deref(), Some("tenant-a"));
}

/// The conversion webhook is wired end to end in the components: the CRD
/// names the Service and takes its CA from the Certificate, the Service
/// selects the controller's Pods on its webhook port, and the Deployment
/// mounts the Certificate's Secret where the controller reads it.
#[test]
fn the_conversion_webhook_is_wired_from_crd_to_pod() {
    let docs = with_defaults(&Options::default());
    let find = |kind: &str| {
        docs.iter()
            .find(|d| {
                d["kind"] == kind
                    && (kind != "CustomResourceDefinition"
                        || d["spec"]["names"]["kind"] == "KThreesControlPlane")
            })
            .unwrap_or_else(|| panic!("no {kind}"))
    };
    let crd = find("CustomResourceDefinition");
    let service = find("Service");
    let certificate = find("Certificate");
    let deployment = find("Deployment");
    let ns = service["metadata"]["namespace"].as_str().unwrap();
    let client = &crd["spec"]["conversion"]["webhook"]["clientConfig"]["service"];
    assert_eq!(crd["spec"]["conversion"]["strategy"], "Webhook");
    assert_eq!(client["name"], service["metadata"]["name"]);
    assert_eq!(client["namespace"], ns);
    assert_eq!(client["path"], "/convert");
    assert_eq!(
        crd["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        format!("{ns}/{}", certificate["metadata"]["name"].as_str().unwrap())
    );
    let versions: Vec<(&str, bool, bool)> = crd["spec"]["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["name"].as_str().unwrap(),
                v["served"].as_bool().unwrap(),
                v["storage"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        versions,
        vec![
            ("v1beta3", true, true),
            ("v1beta2", true, false),
            ("v1beta1", true, false)
        ]
    );
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert!(
        container["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == service["spec"]["ports"][0]["targetPort"]
                && p["containerPort"] == 9443),
        "{container}"
    );
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["secret"]["secretName"] == certificate["spec"]["secretName"])
        .expect("the Certificate's Secret is mounted");
    let mount = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == volume["name"])
        .expect("mounted");
    assert_eq!(
        mount["mountPath"],
        k3s_control_plane::webhook::DEFAULT_CERT_DIR
    );
    for (key, value) in service["spec"]["selector"].as_object().unwrap() {
        assert_eq!(
            &deployment["spec"]["template"]["metadata"]["labels"][key], value,
            "the Service selects the controller"
        );
    }
}

fn args_of(deployment: &Value) -> k3s_control_plane::cli::run::RunArgs {
    let args: Vec<String> = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    RunCli::try_parse_from(&args)
        .unwrap_or_else(|e| panic!("run rejects the shard's arguments {args:?}: {e}"))
        .run
}

fn selector_labels(deployment: &Value) -> BTreeMap<String, String> {
    deployment["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
        .collect()
}

fn pod_labels(deployment: &Value) -> BTreeMap<String, String> {
    deployment["spec"]["template"]["metadata"]["labels"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
        .collect()
}

/// A matchLabels selector selects a Pod when every pair is among its labels.
fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

#[test]
fn three_shards_are_three_deployments_with_their_own_filter_and_lease_sharing_the_rest() {
    use k3s_control_plane::components::deployment::Shards;
    let single = with_defaults(&Options::default());
    let options = Options {
        shards: Some(Shards {
            count: 3,
            prefix: "k3s-shard".into(),
        }),
        ..Options::default()
    };
    let docs = with_defaults(&options);
    let deployments: Vec<&Value> = docs.iter().filter(|d| d["kind"] == "Deployment").collect();
    let names: Vec<&str> = deployments
        .iter()
        .map(|d| d["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "k3s-control-plane-shard-0",
            "k3s-control-plane-shard-1",
            "k3s-control-plane-shard-2"
        ]
    );
    let mut filters = std::collections::BTreeSet::new();
    let mut leases = std::collections::BTreeSet::new();
    for (i, d) in deployments.iter().enumerate() {
        let args = args_of(d);
        assert!(args.leader_elect, "shard {i} elects among its replicas");
        assert_eq!(d["spec"]["replicas"], 2, "shard {i}");
        assert_eq!(
            args.watch_filter.as_deref(),
            Some(format!("k3s-shard-{i}").as_str())
        );
        filters.insert(args.watch_filter.clone().unwrap());
        leases.insert(args.leader_election_lease_name.clone());
        // Its own Pods, nobody else's: a Deployment's selector must not
        // select another Deployment's Pods (they would fight over them).
        for (j, other) in deployments.iter().enumerate() {
            assert_eq!(
                selects(&selector_labels(d), &pod_labels(other)),
                i == j,
                "shard {i}'s selector against shard {j}'s Pods"
            );
        }
        // The anti-affinity spreads this shard's replicas.
        assert_eq!(
            d["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
                [0]["podAffinityTerm"]["labelSelector"]["matchLabels"],
            d["spec"]["selector"]["matchLabels"]
        );
    }
    assert_eq!(filters.len(), 3, "filters unique: {filters:?}");
    assert_eq!(leases.len(), 3, "leases unique: {leases:?}");
    assert!(
        !leases.contains("k3s-control-plane"),
        "no shard takes the unsharded Lease: {leases:?}"
    );
    // The webhook Service selects every shard's Pods (stateless conversion).
    let service = find(&docs, "Service", "k3s-control-plane-webhook-service");
    let service_selector: BTreeMap<String, String> = service["spec"]["selector"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
        .collect();
    for d in &deployments {
        assert!(
            selects(&service_selector, &pod_labels(d)),
            "{}",
            d["metadata"]["name"]
        );
    }
    // Everything but the Deployments is as in the unsharded components.
    let others = |docs: &[Value]| -> Vec<Value> {
        docs.iter()
            .filter(|d| d["kind"] != "Deployment")
            .cloned()
            .collect()
    };
    assert_eq!(others(&docs), others(&single));
    // The shard's value is fixed: the watch-filter variable is not used.
    let text = components::render(&options);
    assert!(
        !text.contains(variables::WATCH_FILTER.name),
        "a shard's filter is not a variable (nor listed as one)"
    );
    assert!(
        text.contains(
            "cluster.x-k8s.io/watch-filter=<value>, one of: k3s-shard-0, k3s-shard-1, k3s-shard-2"
        ),
        "the header says what to label"
    );
}

#[test]
fn a_shard_prefix_that_makes_an_invalid_label_value_is_refused() {
    use k3s_control_plane::components::deployment::Shards;
    let shards = |prefix: &str| Shards {
        count: 3,
        prefix: prefix.into(),
    };
    assert_eq!(shards("k3s-shard").validate(), Ok(()));
    for (prefix, why) in [
        ("team a", "only alphanumerics"),
        ("-x", "begin with an alphanumeric"),
        (&"x".repeat(62), "longer than 63"),
    ] {
        let err = shards(prefix).validate().unwrap_err();
        assert!(err.why.contains(why), "{prefix:?}: {err}");
        assert!(err.to_string().contains("--shard-prefix"), "{err}");
    }
}
