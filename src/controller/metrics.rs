//! Prometheus metrics of the controller, served on `/metrics`.
//!
//! Counters get their `_total` suffix from prometheus-client itself.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// The pipeline stage that failed (observe, validate, act, status).
    pub stage: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RemediationLabels {
    /// completed, refused, deferred, failed, started.
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EtcdOpLabels {
    /// snapshot, move_leader, remove_member.
    pub operation: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EtcdTransportLabels {
    /// `<namespace>/<cluster>`.
    pub cluster: String,
    /// direct or port-forward.
    pub transport: String,
}

/// Every metric the controller exports, registered in one registry.
#[derive(Clone)]
pub struct Metrics {
    pub reconciles: Counter,
    pub errors: Family<ErrorLabels, Counter>,
    pub remediations: Family<RemediationLabels, Counter>,
    pub etcd_operation_seconds: Family<EtcdOpLabels, Histogram>,
    pub reconcile_seconds: Histogram,
    /// 1 while this process leads (holds a valid Lease, or election is
    /// disabled) and may act, else 0.
    pub leader: Gauge,
    /// 1 for the transport each cluster's etcd was last reached by, 0 for the other.
    pub etcd_transport: Family<EtcdTransportLabels, Gauge>,
}

impl Metrics {
    /// Creates the metrics and registers them (prefix `k3scp`) in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Metrics {
            reconciles: Counter::default(),
            errors: Family::default(),
            remediations: Family::default(),
            etcd_operation_seconds: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.001, 2.0, 16))
            }),
            reconcile_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            leader: Gauge::default(),
            etcd_transport: Family::default(),
        };
        let sub = registry.sub_registry_with_prefix("k3scp");
        sub.register(
            "reconciles",
            "Reconciles of KThreesControlPlanes",
            metrics.reconciles.clone(),
        );
        sub.register(
            "reconcile_errors",
            "Failed reconciles by pipeline stage",
            metrics.errors.clone(),
        );
        sub.register(
            "remediations",
            "Remediation and scale-down decisions by outcome",
            metrics.remediations.clone(),
        );
        sub.register(
            "etcd_operation_duration_seconds",
            "Latency of etcd operations against workload clusters",
            metrics.etcd_operation_seconds.clone(),
        );
        sub.register(
            "reconcile_duration_seconds",
            "Duration of one reconcile",
            metrics.reconcile_seconds.clone(),
        );
        sub.register(
            "leader",
            "1 while this process leads and may act (leader election), else 0",
            metrics.leader.clone(),
        );
        sub.register(
            "etcd_transport",
            "1 for the transport (direct, port-forward) each cluster's etcd is reached by",
            metrics.etcd_transport.clone(),
        );
        metrics
    }

    /// `cluster` uses `transport` now (the other transport's series drops to 0).
    pub fn etcd_transport(&self, cluster: &str, transport: &str) {
        for t in ["direct", "port-forward"] {
            self.etcd_transport
                .get_or_create(&EtcdTransportLabels {
                    cluster: cluster.to_string(),
                    transport: t.to_string(),
                })
                .set(i64::from(t == transport));
        }
    }

    pub fn error(&self, stage: &str) {
        self.errors
            .get_or_create(&ErrorLabels {
                stage: stage.to_string(),
            })
            .inc();
    }

    pub fn remediation(&self, outcome: &str) {
        self.remediations
            .get_or_create(&RemediationLabels {
                outcome: outcome.to_string(),
            })
            .inc();
    }

    pub fn etcd_operation(&self, operation: &str, took: Duration) {
        self.etcd_operation_seconds
            .get_or_create(&EtcdOpLabels {
                operation: operation.to_string(),
            })
            .observe(took.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exports_counters_with_total_suffix_and_labels() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        metrics.reconciles.inc();
        metrics.error("observe");
        metrics.remediation("refused");
        metrics.etcd_operation("move_leader", Duration::from_millis(120));
        metrics.leader.set(1);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("k3scp_reconciles_total 1"), "{text}");
        assert!(text.contains("k3scp_leader 1"), "{text}");
        assert!(
            text.contains("k3scp_reconcile_errors_total{stage=\"observe\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("k3scp_remediations_total{outcome=\"refused\"} 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "k3scp_etcd_operation_duration_seconds_count{operation=\"move_leader\"} 1"
            ),
            "{text}"
        );
    }
}
