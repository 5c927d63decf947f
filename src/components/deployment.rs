//! The controller's Deployment: two replicas behind one Lease, probes,
//! non-root with a read-only root filesystem, resources from measured figures.

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction,
    ObjectFieldSelector, PodAffinityTerm, PodAntiAffinity, PodSecurityContext, PodSpec,
    PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile, SecretVolumeSource,
    SecurityContext, Volume, VolumeMount, WeightedPodAffinityTerm,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{APP_LABEL, NAME, Options, meta, variables};

/// Replicas: one leads, the other is Ready and takes the Lease when it goes.
pub const REPLICAS: i32 = 2;

/// Memory request: the process measured 19.7 MiB idle and 70 MiB holding
/// 100 control planes with managed etcd (benches/scale.rs,
/// docs/bench-history.md); 128 MiB covers that with headroom.
pub const MEMORY_REQUEST: &str = "128Mi";
/// Memory limit: 467.5 MiB measured with 1,000 control planes with managed
/// etcd (3,000 pooled TLS connections); 1 GiB leaves twice that.
pub const MEMORY_LIMIT: &str = "1Gi";
/// CPU request: idle, 0.07 mCPU per control plane (65 mCPU at 1,000); bursts
/// (bring-up, remediation) are short, so no CPU limit throttles them.
pub const CPU_REQUEST: &str = "100m";

/// The default of `components --shard-prefix`.
pub const DEFAULT_SHARD_PREFIX: &str = "k3s-shard";
/// The Pod label telling one shard's Pods from another's (selector of each
/// shard's Deployment and of its anti-affinity). Every shard's Pods also carry
/// [`APP_LABEL`], which the conversion webhook Service selects: any shard's
/// Pod may answer the (stateless) conversion.
pub const SHARD_POD_LABEL: &str = "k3s-control-plane.cluster.x-k8s.io/shard";

/// Watch-filter shards: `count` Deployments, shard `i` (from 0) running
/// `--watch-filter=<prefix>-<i>` under the Lease `k3s-control-plane-shard-<i>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shards {
    pub count: u32,
    pub prefix: String,
}

/// A shard prefix that would make a label value Kubernetes refuses.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "components --shard-prefix {prefix:?}: the watch-filter value {value:?} is not a valid label value ({why})"
)]
pub struct ShardPrefixError {
    pub prefix: String,
    pub value: String,
    pub why: &'static str,
}

/// One shard of [`Shards`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shard {
    pub index: u32,
    /// The `cluster.x-k8s.io/watch-filter` value its control planes carry.
    pub watch_filter: String,
    /// Its Deployment's name, also its Lease's name and its Pods' shard label.
    pub name: String,
}

impl Shards {
    pub fn list(&self) -> Vec<Shard> {
        (0..self.count)
            .map(|index| Shard {
                index,
                watch_filter: format!("{}-{index}", self.prefix),
                name: format!("{NAME}-shard-{index}"),
            })
            .collect()
    }

    /// Every shard's watch-filter value is a valid label value (at most 63
    /// characters of alphanumerics, `-`, `_` and `.`, alphanumeric at both ends).
    pub fn validate(&self) -> Result<(), ShardPrefixError> {
        let last = self.count.saturating_sub(1);
        let value = format!("{}-{last}", self.prefix);
        let fail = |why| ShardPrefixError {
            prefix: self.prefix.clone(),
            value: value.clone(),
            why,
        };
        if value.len() > 63 {
            return Err(fail("longer than 63 characters"));
        }
        if !value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(fail("only alphanumerics, '-', '_' and '.' are allowed"));
        }
        if !value.starts_with(|c: char| c.is_ascii_alphanumeric()) {
            return Err(fail("it must begin with an alphanumeric character"));
        }
        Ok(())
    }
}

/// The container's arguments: the placeholders clusterctl fills in,
/// `--namespace` when the components are scoped to one, and for a shard its
/// own watch-filter value and Lease instead of the variable.
pub fn args(options: &Options, shard: Option<&Shard>) -> Vec<String> {
    let filter = match shard {
        Some(shard) => shard.watch_filter.clone(),
        None => variables::WATCH_FILTER.placeholder(),
    };
    let mut args = vec![
        "run".to_string(),
        "--log-json".to_string(),
        format!("--log-level={}", variables::LOG_LEVEL.placeholder()),
        format!("--concurrency={}", variables::CONCURRENCY.placeholder()),
        format!("--watch-filter={filter}"),
        format!(
            "--etcd-transport={}",
            variables::ETCD_TRANSPORT.placeholder()
        ),
    ];
    if let Some(shard) = shard {
        args.push(format!("--leader-election-lease-name={}", shard.name));
    }
    if let Some(ns) = &options.watch_namespace {
        args.push(format!("--namespace={ns}"));
    }
    args
}

/// The controller's Deployments: one, or one per shard.
pub fn deployments(options: &Options, namespace: &str) -> Vec<Deployment> {
    match &options.shards {
        None => vec![deployment(options, namespace, None)],
        Some(shards) => shards
            .list()
            .iter()
            .map(|shard| deployment(options, namespace, Some(shard)))
            .collect(),
    }
}

pub fn deployment(options: &Options, namespace: &str, shard: Option<&Shard>) -> Deployment {
    let mut labels =
        std::collections::BTreeMap::from([(APP_LABEL.0.to_string(), APP_LABEL.1.to_string())]);
    if let Some(shard) = shard {
        labels.insert(SHARD_POD_LABEL.to_string(), shard.name.clone());
    }
    let field = |path: &str| EnvVarSource {
        field_ref: Some(ObjectFieldSelector {
            field_path: path.to_string(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let probe = |path: &str| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_string()),
            port: IntOrString::String("probes".into()),
            ..Default::default()
        }),
        period_seconds: Some(10),
        ..Default::default()
    };
    let container = Container {
        name: "controller".into(),
        image: Some(variables::IMAGE.placeholder()),
        image_pull_policy: Some("IfNotPresent".into()),
        args: Some(args(options, shard)),
        // POD_NAME: the Lease holder identity and the Events' reporting
        // instance; POD_NAMESPACE: where the Lease lives.
        env: Some(vec![
            EnvVar {
                name: "POD_NAME".into(),
                value_from: Some(field("metadata.name")),
                ..Default::default()
            },
            EnvVar {
                name: "POD_NAMESPACE".into(),
                value_from: Some(field("metadata.namespace")),
                ..Default::default()
            },
        ]),
        ports: Some(vec![
            ContainerPort {
                name: Some("probes".into()),
                container_port: 8080,
                protocol: Some("TCP".into()),
                ..Default::default()
            },
            ContainerPort {
                name: Some("webhook-server".into()),
                container_port: i32::from(crate::webhook::DEFAULT_PORT),
                protocol: Some("TCP".into()),
                ..Default::default()
            },
        ]),
        // The conversion webhook's certificate, as cert-manager keeps it.
        volume_mounts: Some(vec![VolumeMount {
            name: "webhook-cert".into(),
            mount_path: crate::webhook::DEFAULT_CERT_DIR.into(),
            read_only: Some(true),
            ..Default::default()
        }]),
        liveness_probe: Some(probe("/healthz")),
        readiness_probe: Some(probe("/readyz")),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Default::default()
            }),
            ..Default::default()
        }),
        resources: Some(ResourceRequirements {
            requests: Some(
                [
                    ("cpu".to_string(), Quantity(CPU_REQUEST.into())),
                    ("memory".to_string(), Quantity(MEMORY_REQUEST.into())),
                ]
                .into(),
            ),
            limits: Some([("memory".to_string(), Quantity(MEMORY_LIMIT.into()))].into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    Deployment {
        metadata: meta(shard.map_or(NAME, |s| s.name.as_str()), Some(namespace)),
        spec: DeploymentSpec {
            replicas: Some(REPLICAS),
            // The new Pod starts first; an old one stops only once it is Ready.
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_surge: Some(IntOrString::Int(1)),
                    max_unavailable: Some(IntOrString::Int(0)),
                }),
            }),
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels.clone()),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(NAME.into()),
                    volumes: Some(vec![Volume {
                        name: "webhook-cert".into(),
                        secret: Some(SecretVolumeSource {
                            secret_name: Some(super::webhook::SECRET.into()),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }]),
                    // SIGTERM: the controller stops, then releases the Lease.
                    termination_grace_period_seconds: Some(30),
                    affinity: Some(Affinity {
                        pod_anti_affinity: Some(PodAntiAffinity {
                            preferred_during_scheduling_ignored_during_execution: Some(vec![
                                WeightedPodAffinityTerm {
                                    weight: 100,
                                    pod_affinity_term: PodAffinityTerm {
                                        topology_key: "kubernetes.io/hostname".into(),
                                        label_selector: Some(LabelSelector {
                                            match_labels: Some(labels),
                                            ..Default::default()
                                        }),
                                        ..Default::default()
                                    },
                                },
                            ]),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    security_context: Some(PodSecurityContext {
                        run_as_non_root: Some(true),
                        run_as_user: Some(65532),
                        run_as_group: Some(65532),
                        seccomp_profile: Some(SeccompProfile {
                            type_: "RuntimeDefault".into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    containers: vec![container],
                    ..Default::default()
                }),
            },
            ..Default::default()
        },
        ..Default::default()
    }
}
