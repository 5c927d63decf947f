//! Prometheus metrics of the controller, served on `/metrics`.
//!
//! Counters get their `_total` suffix from prometheus-client itself.

use std::collections::HashMap;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::api::kcp::EtcdQuorumStatus;

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
pub struct EtcdRestoreLabels {
    /// The restore step carried out: accepted, refused (the snapshot could
    /// not be verified), retired-machine, machine-created, restored.
    pub step: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EtcdSnapshotLabels {
    /// before-removal, scheduled.
    pub purpose: String,
    /// taken, failed.
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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClusterLabels {
    /// `<namespace>/<cluster>`.
    pub cluster: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CertificateLabels {
    /// `<namespace>/<cluster>`.
    pub cluster: String,
    pub machine: String,
    /// Which certificate: for a Machine, where the expiry that counts came
    /// from (`etcd-serving`: its member; `k3s-serving`: its supervisor port;
    /// `machine`: a value on the Machine), or a cluster CA: `server-ca`,
    /// `client-ca`, `etcd-server-ca` (no Machine).
    pub certificate: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MemberLabels {
    /// `<namespace>/<cluster>`.
    pub cluster: String,
    /// The etcd member's name (its id while unnamed).
    pub member: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SpaceStepLabels {
    /// defragment, move-leader, compact, disarm-nospace.
    pub step: String,
}

/// Every metric the controller exports, registered in one registry.
#[derive(Clone)]
pub struct Metrics {
    pub reconciles: Counter,
    /// Decisions to act taken on cached objects that a fresh read found
    /// behind, and so taken again on the fresh ones.
    pub stale_cache_decisions: Counter,
    /// Machine LISTs a shard took because its label-selected Machine cache
    /// was not known to hold the cluster's Machines whole.
    pub uncovered_machine_lists: Counter,
    /// Removal steps decided within the reconcile of the step before them,
    /// on a fresh read, instead of after a trip through the work queue.
    pub chained_steps: Counter,
    /// Chained passes that decided on the workload cluster and etcd as the
    /// pass before observed them (its step touched neither).
    pub reused_workload_observations: Counter,
    /// Acting passes that reached their action (a Machine created or
    /// deleted, a hook written, an etcd step): what a shard did.
    pub actions: Counter,
    /// Acting passes refused because a read taken before acting showed the
    /// control plane no longer carries this shard's watch-filter label
    /// (rule `shard.not-ours`).
    pub shard_refusals: Counter,
    /// Control planes that left this process's watch (deleted, or relabelled
    /// to another shard), whose connections, caches and series were dropped.
    pub released_control_planes: Counter,
    pub errors: Family<ErrorLabels, Counter>,
    pub remediations: Family<RemediationLabels, Counter>,
    /// etcd snapshots for `spec.etcdBackup`, by purpose and outcome.
    pub etcd_snapshots: Family<EtcdSnapshotLabels, Counter>,
    /// Steps of restores from a snapshot a person asked for.
    pub etcd_restores: Family<EtcdRestoreLabels, Counter>,
    pub etcd_operation_seconds: Family<EtcdOpLabels, Histogram>,
    pub reconcile_seconds: Histogram,
    /// 1 while this process leads (holds a valid Lease, or election is
    /// disabled) and may act, else 0.
    pub leader: Gauge,
    /// 1 for the transport each cluster's etcd was last reached by, 0 for the other.
    pub etcd_transport: Family<EtcdTransportLabels, Gauge>,
    /// `status.etcd.quorumMargin` per cluster, only while etcd was read.
    pub etcd_quorum_margin: Family<ClusterLabels, Gauge>,
    /// `status.etcd.voters` per cluster, only while etcd was read.
    pub etcd_voters: Family<ClusterLabels, Gauge>,
    /// `status.etcd.healthyVoters` per cluster, only while etcd was read.
    pub etcd_healthy_voters: Family<ClusterLabels, Gauge>,
    /// Unix time each Machine's certificates expire, where known.
    pub certificate_expiry: Family<CertificateLabels, Gauge>,
    /// Which certificate series each cluster has, to drop those of Machines gone.
    certificate_series:
        std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, Vec<CertificateLabels>>>>,
    /// Each member's backend file (`dbSize`), only while etcd was read.
    pub etcd_db_size: Family<MemberLabels, Gauge>,
    /// What is in use of it (`dbSizeInUse`).
    pub etcd_db_in_use: Family<MemberLabels, Gauge>,
    /// Its quota (reported, the annotation's, or the default).
    pub etcd_quota: Family<MemberLabels, Gauge>,
    /// 1 while a NOSPACE alarm is raised in the cluster, else 0.
    pub etcd_nospace: Family<ClusterLabels, Gauge>,
    /// Steps taken on etcd's space (`run --etcd-space-care`).
    pub etcd_space_steps: Family<SpaceStepLabels, Counter>,
    /// The members each cluster's space series were last set for, so that a
    /// member gone takes its series with it.
    space_members: std::sync::Arc<std::sync::Mutex<HashMap<String, Vec<String>>>>,
}

impl Metrics {
    /// Creates the metrics and registers them (prefix `k3scp`) in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Metrics {
            reconciles: Counter::default(),
            stale_cache_decisions: Counter::default(),
            uncovered_machine_lists: Counter::default(),
            chained_steps: Counter::default(),
            reused_workload_observations: Counter::default(),
            actions: Counter::default(),
            shard_refusals: Counter::default(),
            released_control_planes: Counter::default(),
            errors: Family::default(),
            remediations: Family::default(),
            etcd_snapshots: Family::default(),
            etcd_restores: Family::default(),
            etcd_operation_seconds: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.001, 2.0, 16))
            }),
            reconcile_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            leader: Gauge::default(),
            etcd_transport: Family::default(),
            etcd_quorum_margin: Family::default(),
            etcd_voters: Family::default(),
            etcd_healthy_voters: Family::default(),
            certificate_expiry: Family::default(),
            certificate_series: Default::default(),
            etcd_db_size: Family::default(),
            etcd_db_in_use: Family::default(),
            etcd_quota: Family::default(),
            etcd_nospace: Family::default(),
            etcd_space_steps: Family::default(),
            space_members: Default::default(),
        };
        let sub = registry.sub_registry_with_prefix("k3scp");
        sub.register(
            "reconciles",
            "Reconciles of KThreesControlPlanes",
            metrics.reconciles.clone(),
        );
        sub.register(
            "stale_cache_decisions",
            "Decisions to act taken on cached Clusters, Machines or Secrets that a fresh read found behind, so taken again on what was read",
            metrics.stale_cache_decisions.clone(),
        );
        sub.register(
            "uncovered_machine_lists",
            "Machine LISTs a shard took because its label-selected Machine cache was not known to hold the cluster's Machines whole (a Machine without the shard's label, or the cache behind)",
            metrics.uncovered_machine_lists.clone(),
        );
        sub.register(
            "chained_steps",
            "Removal steps decided and taken right after the step before them, in the same reconcile, on a fresh read",
            metrics.chained_steps.clone(),
        );
        sub.register(
            "reused_workload_observations",
            "Chained passes that decided on the Nodes and etcd snapshot of the pass before, whose step touched neither",
            metrics.reused_workload_observations.clone(),
        );
        sub.register(
            "actions",
            "Acting passes that reached their one action (Machine created or deleted, hook written, etcd step)",
            metrics.actions.clone(),
        );
        sub.register(
            "shard_refusals",
            "Acting passes refused because the control plane no longer carries this shard's watch-filter label (rule shard.not-ours)",
            metrics.shard_refusals.clone(),
        );
        sub.register(
            "released_control_planes",
            "Control planes that left this process's watch (deleted or relabelled to another shard); what was held for them was dropped",
            metrics.released_control_planes.clone(),
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
            "etcd_snapshots",
            "etcd snapshots taken for spec.etcdBackup, by purpose and outcome",
            metrics.etcd_snapshots.clone(),
        );
        sub.register(
            "etcd_restore_steps",
            "Steps of etcd restores a person asked for, by step",
            metrics.etcd_restores.clone(),
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
        sub.register(
            "etcd_quorum_margin",
            "Healthy etcd voters minus quorum: how many more can be lost before quorum is (0: the next loss breaks quorum; negative: lost); absent while etcd is unknown",
            metrics.etcd_quorum_margin.clone(),
        );
        sub.register(
            "certificate_expiry_seconds",
            "Unix time a Machine's certificates expire (certificate=etcd-serving or k3s-serving: as our TLS handshake with its etcd member or its k3s supervisor port verified it; machine: the Machine's own certificates-expiry value) or a cluster CA expires (machine empty)",
            metrics.certificate_expiry.clone(),
        );
        sub.register(
            "etcd_voters",
            "Voting etcd members; absent while etcd is unknown",
            metrics.etcd_voters.clone(),
        );
        sub.register(
            "etcd_healthy_voters",
            "Healthy voting etcd members; absent while etcd is unknown",
            metrics.etcd_healthy_voters.clone(),
        );
        sub.register_with_unit(
            "etcd_db_size",
            "Each etcd member's backend file (dbSize, free pages included: what the quota is checked against); absent while etcd is unknown",
            prometheus_client::registry::Unit::Bytes,
            metrics.etcd_db_size.clone(),
        );
        sub.register_with_unit(
            "etcd_db_in_use",
            "What is in use of each etcd member's backend file (dbSizeInUse: what a defragmentation leaves); absent while etcd is unknown",
            prometheus_client::registry::Unit::Bytes,
            metrics.etcd_db_in_use.clone(),
        );
        sub.register_with_unit(
            "etcd_quota",
            "Each etcd member's backend quota (its own from etcd 3.6, else the control plane's annotation or --etcd-quota-backend-bytes); absent while unknown",
            prometheus_client::registry::Unit::Bytes,
            metrics.etcd_quota.clone(),
        );
        sub.register(
            "etcd_nospace",
            "1 while a NOSPACE alarm is raised in the cluster's etcd (it refuses writes), else 0; absent while etcd is unknown",
            metrics.etcd_nospace.clone(),
        );
        sub.register(
            "etcd_space_steps",
            "Steps taken on etcd's space with --etcd-space-care, by step",
            metrics.etcd_space_steps.clone(),
        );
        metrics
    }

    /// The space of `cluster`'s etcd as this reconcile's decision record
    /// has it; `None` (etcd not read) removes its series, and a member no
    /// longer listed loses its own.
    pub fn etcd_space(&self, cluster: &str, space: Option<&crate::space_rule::ClusterSpace>) {
        let mut known = self.space_members.lock().unwrap_or_else(|p| p.into_inner());
        let previous = known.remove(cluster).unwrap_or_default();
        let labels = |member: &str| MemberLabels {
            cluster: cluster.to_string(),
            member: member.to_string(),
        };
        let current: Vec<String> = space
            .map(|s| s.members.iter().map(|m| m.label.clone()).collect())
            .unwrap_or_default();
        for gone in previous.iter().filter(|m| !current.contains(m)) {
            for family in [&self.etcd_db_size, &self.etcd_db_in_use, &self.etcd_quota] {
                family.remove(&labels(gone));
            }
        }
        let cluster_labels = ClusterLabels {
            cluster: cluster.to_string(),
        };
        let Some(space) = space else {
            self.etcd_nospace.remove(&cluster_labels);
            return;
        };
        let gauge = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        for m in &space.members {
            let l = labels(&m.label);
            match m.sizes {
                Some(s) => {
                    self.etcd_db_size.get_or_create(&l).set(gauge(s.db_size));
                    self.etcd_db_in_use.get_or_create(&l).set(gauge(s.in_use));
                }
                None => {
                    self.etcd_db_size.remove(&l);
                    self.etcd_db_in_use.remove(&l);
                }
            }
            match m.quota {
                Some(q) => {
                    self.etcd_quota.get_or_create(&l).set(gauge(q));
                }
                None => {
                    self.etcd_quota.remove(&l);
                }
            }
        }
        self.etcd_nospace
            .get_or_create(&cluster_labels)
            .set(i64::from(space.nospace));
        known.insert(cluster.to_string(), current);
    }

    /// A step taken on etcd's space.
    pub fn etcd_space_step(&self, step: &str) {
        self.etcd_space_steps
            .get_or_create(&SpaceStepLabels {
                step: step.to_string(),
            })
            .inc();
    }

    /// The quorum of `cluster` (`<namespace>/<cluster>`) as read this
    /// reconcile; `None` (etcd unknown, not ours, or the control plane
    /// going) removes its series, so no stale margin is scraped.
    pub fn etcd_quorum(&self, cluster: &str, quorum: Option<&EtcdQuorumStatus>) {
        let labels = ClusterLabels {
            cluster: cluster.to_string(),
        };
        let families = [
            &self.etcd_quorum_margin,
            &self.etcd_voters,
            &self.etcd_healthy_voters,
        ];
        match quorum {
            Some(q) => {
                for (family, value) in
                    families
                        .into_iter()
                        .zip([q.quorum_margin, q.voters, q.healthy_voters])
                {
                    family.get_or_create(&labels).set(i64::from(value));
                }
            }
            None => {
                for family in families {
                    family.remove(&labels);
                }
            }
        }
    }

    /// The certificate expiry series of `cluster`: exactly `expiries`
    /// (Machine, Unix time); the cluster's other series go.
    /// `expiries`: (Machine, certificate, notAfter as Unix time); a cluster
    /// CA has no Machine (empty).
    pub fn certificate_expiries<'a>(
        &self,
        cluster: &str,
        expiries: impl Iterator<Item = (&'a str, &'a str, i64)>,
    ) {
        let wanted: std::collections::HashMap<CertificateLabels, i64> = expiries
            .map(|(machine, certificate, at)| {
                (
                    CertificateLabels {
                        cluster: cluster.to_string(),
                        machine: machine.to_string(),
                        certificate: certificate.to_string(),
                    },
                    at,
                )
            })
            .collect();
        // prometheus-client cannot list a family's series: a Machine that is
        // gone is dropped by name when the cluster's set changes.
        let mut known = self
            .certificate_series
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let previous = known.remove(cluster).unwrap_or_default();
        for labels in previous {
            if !wanted.contains_key(&labels) {
                self.certificate_expiry.remove(&labels);
            }
        }
        for (labels, at) in &wanted {
            self.certificate_expiry.get_or_create(labels).set(*at);
        }
        if !wanted.is_empty() {
            known.insert(cluster.to_string(), wanted.into_keys().collect());
        }
    }

    /// Every cluster's etcd series dropped, e.g. when this process stops
    /// acting: a standby knows nothing current of any etcd.
    pub fn forget_etcd_quorums(&self) {
        self.etcd_quorum_margin.clear();
        self.etcd_voters.clear();
        self.etcd_healthy_voters.clear();
        self.etcd_db_size.clear();
        self.etcd_db_in_use.clear();
        self.etcd_quota.clear();
        self.etcd_nospace.clear();
        self.space_members
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// Drops every cluster's etcd series when the guard is dropped (the
    /// controller loop ended or was dropped on losing the lease).
    pub fn forget_etcd_quorums_on_drop(&self) -> ForgetEtcdQuorums {
        ForgetEtcdQuorums(self.clone())
    }

    /// Remove every per-cluster series of `cluster` (its control plane is gone).
    pub fn forget_cluster(&self, cluster: &str) {
        self.etcd_quorum(cluster, None);
        self.etcd_space(cluster, None);
        for t in ["direct", "port-forward"] {
            self.etcd_transport.remove(&EtcdTransportLabels {
                cluster: cluster.to_string(),
                transport: t.to_string(),
            });
        }
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

    pub fn etcd_snapshot(&self, purpose: &str, outcome: &str) {
        self.etcd_snapshots
            .get_or_create(&EtcdSnapshotLabels {
                purpose: purpose.to_string(),
                outcome: outcome.to_string(),
            })
            .inc();
    }

    pub fn etcd_restore_step(&self, step: &str) {
        self.etcd_restores
            .get_or_create(&EtcdRestoreLabels {
                step: step.to_string(),
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

/// See [`Metrics::forget_etcd_quorums_on_drop`].
pub struct ForgetEtcdQuorums(Metrics);

impl Drop for ForgetEtcdQuorums {
    fn drop(&mut self) {
        self.0.forget_etcd_quorums();
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

    fn text(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        text
    }

    fn quorum(healthy: i32, voters: i32) -> EtcdQuorumStatus {
        EtcdQuorumStatus {
            members: voters,
            voters,
            healthy_voters: healthy,
            quorum: voters / 2 + 1,
            quorum_margin: healthy - (voters / 2 + 1),
            voter_health: format!("{healthy}/{voters}"),
        }
    }

    #[test]
    fn etcd_quorum_gauges_per_cluster_and_gone_when_etcd_is_unknown() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        metrics.etcd_quorum("ns/a", Some(&quorum(3, 3)));
        metrics.etcd_quorum("ns/b", Some(&quorum(1, 3)));
        let t = text(&registry);
        assert!(
            t.contains("k3scp_etcd_quorum_margin{cluster=\"ns/a\"} 1"),
            "{t}"
        );
        assert!(
            t.contains("k3scp_etcd_quorum_margin{cluster=\"ns/b\"} -1"),
            "{t}"
        );
        assert!(t.contains("k3scp_etcd_voters{cluster=\"ns/a\"} 3"), "{t}");
        assert!(
            t.contains("k3scp_etcd_healthy_voters{cluster=\"ns/b\"} 1"),
            "{t}"
        );
        // One more loss: the margin follows.
        metrics.etcd_quorum("ns/a", Some(&quorum(2, 3)));
        let t = text(&registry);
        assert!(
            t.contains("k3scp_etcd_quorum_margin{cluster=\"ns/a\"} 0"),
            "{t}"
        );
        // Unknown (or deleted): no series at all, not a stale healthy one.
        metrics.etcd_quorum("ns/a", None);
        let t = text(&registry);
        assert!(!t.contains("cluster=\"ns/a\""), "{t}");
        assert!(
            t.contains("k3scp_etcd_quorum_margin{cluster=\"ns/b\"} -1"),
            "{t}"
        );
        // Losing the lease: nothing current is known of any cluster.
        drop(metrics.forget_etcd_quorums_on_drop());
        let t = text(&registry);
        assert!(!t.contains("k3scp_etcd_quorum_margin{"), "{t}");
    }

    fn space(
        members: &[(&str, Option<(u64, u64)>)],
        nospace: bool,
    ) -> crate::space_rule::ClusterSpace {
        crate::space_rule::ClusterSpace {
            members: members
                .iter()
                .enumerate()
                .map(|(i, (label, sizes))| crate::space_rule::MemberSpace {
                    id: i as u64 + 1,
                    label: label.to_string(),
                    leader: i == 0,
                    learner: false,
                    sizes: sizes
                        .map(|(db_size, in_use)| crate::space_rule::Sizes { db_size, in_use }),
                    quota: Some(2 << 30),
                    quota_source: crate::space_rule::QuotaSource::Default,
                    problem: None,
                    nospace: false,
                    measured: false,
                })
                .collect(),
            nospace,
            alarms_unknown: None,
            quota_error: None,
            history: None,
            busy: None,
        }
    }

    #[test]
    fn etcd_space_gauges_per_member_gone_with_the_member_or_when_etcd_is_unknown() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        metrics.etcd_space(
            "ns/a",
            Some(&space(
                &[("cp-0", Some((4096, 1024))), ("cp-1", Some((8192, 8192)))],
                false,
            )),
        );
        let t = text(&registry);
        for line in [
            "k3scp_etcd_db_size_bytes{cluster=\"ns/a\",member=\"cp-0\"} 4096",
            "k3scp_etcd_db_in_use_bytes{cluster=\"ns/a\",member=\"cp-0\"} 1024",
            "k3scp_etcd_db_size_bytes{cluster=\"ns/a\",member=\"cp-1\"} 8192",
            "k3scp_etcd_quota_bytes{cluster=\"ns/a\",member=\"cp-1\"} 2147483648",
            "k3scp_etcd_nospace{cluster=\"ns/a\"} 0",
        ] {
            assert!(t.contains(line), "{line} in {t}");
        }
        // cp-1 removed, cp-0's Status unanswered, NOSPACE raised.
        metrics.etcd_space("ns/a", Some(&space(&[("cp-0", None)], true)));
        let t = text(&registry);
        assert!(!t.contains("member=\"cp-1\""), "{t}");
        assert!(
            !t.contains("k3scp_etcd_db_size_bytes{cluster=\"ns/a\",member=\"cp-0\"}"),
            "{t}"
        );
        assert!(
            t.contains("k3scp_etcd_quota_bytes{cluster=\"ns/a\",member=\"cp-0\"} 2147483648"),
            "{t}"
        );
        assert!(t.contains("k3scp_etcd_nospace{cluster=\"ns/a\"} 1"), "{t}");
        // Unknown: no series at all.
        metrics.etcd_space("ns/a", None);
        let t = text(&registry);
        assert!(!t.contains("cluster=\"ns/a\""), "{t}");
        metrics.etcd_space_step("defragment");
        assert!(
            text(&registry).contains("k3scp_etcd_space_steps_total{step=\"defragment\"} 1"),
            "{}",
            text(&registry)
        );
    }
}
