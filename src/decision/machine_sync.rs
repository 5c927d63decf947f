//! Which Machines need the template's metadata and node timeouts in place,
//! as CAPI KCP's `syncMachines` decides it: changes of
//! `machineTemplate.metadata` (labels, annotations) and of
//! `machineTemplate.node{Drain,VolumeDetach,Deletion}Timeout` reach existing
//! control-plane Machines without a rollout; the labels and annotations also
//! reach each Machine's infrastructure object and KThreesConfig. Pure: the
//! controller applies what [`plan_sync`] says (`controller::sync_machines`).
//!
//! What was propagated is recorded on the Machine
//! ([`SYNCED_METADATA_ANNOTATION`]): the keys (so that a key removed from the
//! template is removed again, and only keys we put there) and a hash of the
//! values (so that a Machine whose record matches the template costs no
//! request at all). A new Machine is born with the same metadata and record
//! ([`born_metadata`]), so it needs no sync right after creation.
//!
//! The control plane's own `cluster.x-k8s.io/watch-filter` label is
//! propagated as if the template had it (the control plane's value wins):
//! a shard watches only Machines with its label, and a bootstrap or
//! infrastructure provider sharded the same way only its own objects. It is
//! also checked on the Machine itself, so a Machine that lost it gets it back.

use std::collections::{BTreeMap, BTreeSet};

use kube::ResourceExt;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::api::machine::MachineDeletionSpec;
use crate::api::names::{
    CLONED_FROM_GROUPKIND_ANNOTATION, CLONED_FROM_NAME_ANNOTATION, CLUSTER_NAME_LABEL,
    CONTROL_PLANE_LABEL, CONTROL_PLANE_NAME_LABEL, PRE_TERMINATE_HOOK_ANNOTATION,
    REMEDIATION_FOR_ANNOTATION, SPEC_HASH_ANNOTATION, SYNCED_METADATA_ANNOTATION,
    UPSTREAM_PRE_TERMINATE_HOOK_ANNOTATION, WATCH_FILTER_LABEL,
};
use crate::api::{KThreesControlPlane, Machine};

/// Labels the CAPI contract owns: never taken from the template, never removed.
const RESERVED_LABELS: [&str; 3] = [
    CLUSTER_NAME_LABEL,
    CONTROL_PLANE_LABEL,
    CONTROL_PLANE_NAME_LABEL,
];

/// Annotations this controller writes for other purposes: a template key of
/// the same name must not overwrite them, nor its removal delete them (a
/// removed pre-terminate hook would let CAPI delete a Machine mid-removal; an
/// overwritten spec hash would hide or fake a rollout).
const RESERVED_ANNOTATIONS: [&str; 7] = [
    SYNCED_METADATA_ANNOTATION,
    UPSTREAM_PRE_TERMINATE_HOOK_ANNOTATION,
    SPEC_HASH_ANNOTATION,
    REMEDIATION_FOR_ANNOTATION,
    PRE_TERMINATE_HOOK_ANNOTATION,
    CLONED_FROM_NAME_ANNOTATION,
    CLONED_FROM_GROUPKIND_ANNOTATION,
];

/// `spec.deletion` field names of a v1beta2 Machine, as the record lists them.
const DRAIN: &str = "nodeDrainTimeoutSeconds";
const VOLUME_DETACH: &str = "nodeVolumeDetachTimeoutSeconds";
const NODE_DELETION: &str = "nodeDeletionTimeoutSeconds";

/// The value of [`SYNCED_METADATA_ANNOTATION`]. Absent means "nothing
/// propagated" (Machines created before this feature, or with an empty
/// template), which is the same as an empty record.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncedRecord {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub annotations: Vec<String>,
    /// `spec.deletion` fields we set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deletion: Vec<String>,
    /// FNV-1a 64 of the propagated values (a change detector, not a secret).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hash: String,
}

impl SyncedRecord {
    fn is_empty(&self) -> bool {
        *self == SyncedRecord::default()
    }

    fn parse(machine: &Machine) -> Option<SyncedRecord> {
        machine
            .annotations()
            .get(SYNCED_METADATA_ANNOTATION)
            .and_then(|v| serde_json::from_str(v).ok())
    }
}

/// What the template asks every control-plane Machine to carry.
#[derive(Clone, Debug, Default, PartialEq)]
struct Desired {
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    deletion: BTreeMap<&'static str, i32>,
}

impl Desired {
    fn of(kcp: &KThreesControlPlane) -> Desired {
        let meta = &kcp.spec.machine_template.metadata;
        let mut labels: BTreeMap<String, String> = meta
            .labels
            .iter()
            .filter(|(k, _)| !RESERVED_LABELS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        // The shard the control plane is in (its own label decides, over the
        // template's): its Machines must be in that shard's watch too.
        if let Some(shard) = kcp.labels().get(WATCH_FILTER_LABEL) {
            labels.insert(WATCH_FILTER_LABEL.to_string(), shard.clone());
        }
        let annotations = meta
            .annotations
            .iter()
            .filter(|(k, _)| !RESERVED_ANNOTATIONS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut deletion = BTreeMap::new();
        if let Some(d) = deletion_timeouts(kcp) {
            for (field, value) in [
                (DRAIN, d.node_drain_timeout_seconds),
                (VOLUME_DETACH, d.node_volume_detach_timeout_seconds),
                (NODE_DELETION, d.node_deletion_timeout_seconds),
            ] {
                if let Some(v) = value {
                    deletion.insert(field, v);
                }
            }
        }
        Desired {
            labels,
            annotations,
            deletion,
        }
    }

    fn record(&self) -> SyncedRecord {
        if self.labels.is_empty() && self.annotations.is_empty() && self.deletion.is_empty() {
            return SyncedRecord::default();
        }
        // BTreeMaps serialize in key order: the text is canonical.
        let canonical = json!({
            "labels": self.labels,
            "annotations": self.annotations,
            "deletion": self.deletion,
        })
        .to_string();
        SyncedRecord {
            labels: self.labels.keys().cloned().collect(),
            annotations: self.annotations.keys().cloned().collect(),
            deletion: self.deletion.keys().map(|k| k.to_string()).collect(),
            hash: format!("{:016x}", fnv1a64(canonical.as_bytes())),
        }
    }
}

/// FNV-1a, 64 bits: stable across Rust versions and processes (std's
/// `DefaultHasher` promises neither), which a stored hash needs.
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The record annotation a new Machine is born with (none when the template
/// propagates nothing), so that it needs no sync right after creation.
pub fn synced_record(kcp: &KThreesControlPlane) -> Option<(String, String)> {
    let record = Desired::of(kcp).record();
    (!record.is_empty()).then(|| {
        (
            SYNCED_METADATA_ANNOTATION.to_string(),
            serde_json::to_string(&record).expect("a record serializes"),
        )
    })
}

/// The metadata a new Machine, its infrastructure clone and its KThreesConfig
/// are born with, so that none of them needs a sync right after creation.
pub struct BornMetadata {
    /// The template's labels under `contract` (which win).
    pub labels: BTreeMap<String, String>,
    /// The template's annotations (without the ones reserved for us).
    pub annotations: BTreeMap<String, String>,
    /// The record for the Machine.
    pub record: Option<(String, String)>,
}

pub fn born_metadata(
    kcp: &KThreesControlPlane,
    contract: BTreeMap<String, String>,
) -> BornMetadata {
    let desired = Desired::of(kcp);
    let mut labels = desired.labels;
    labels.extend(contract);
    BornMetadata {
        labels,
        annotations: desired.annotations,
        record: synced_record(kcp),
    }
}

/// What one Machine needs: `Some(value)` sets, `None` removes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MachineSync {
    pub machine: String,
    /// On the Machine, its infrastructure object and its KThreesConfig.
    pub labels: BTreeMap<String, Option<String>>,
    /// On the Machine, its infrastructure object and its KThreesConfig.
    pub annotations: BTreeMap<String, Option<String>>,
    /// `spec.deletion` of the Machine.
    pub deletion: BTreeMap<&'static str, Option<i32>>,
    /// The Machine's new record; `None` removes it (nothing propagated any more).
    pub record: Option<String>,
}

impl MachineSync {
    /// Whether the infrastructure object and the KThreesConfig need a patch.
    pub fn touches_metadata(&self) -> bool {
        !self.labels.is_empty() || !self.annotations.is_empty()
    }

    /// Merge patch of the labels and annotations (`null` removes a key).
    pub fn metadata_patch(&self) -> Value {
        let mut meta = serde_json::Map::new();
        if !self.labels.is_empty() {
            meta.insert("labels".into(), json!(self.labels));
        }
        if !self.annotations.is_empty() {
            meta.insert("annotations".into(), json!(self.annotations));
        }
        json!({ "metadata": meta })
    }

    /// The Machine's merge patch: metadata, `spec.deletion` and the record,
    /// conditional on `resource_version`.
    pub fn machine_patch(&self, resource_version: Option<&str>) -> Value {
        let mut annotations = self.annotations.clone();
        annotations.insert(SYNCED_METADATA_ANNOTATION.to_string(), self.record.clone());
        let mut patch = json!({"metadata": {
            "resourceVersion": resource_version,
            "annotations": annotations,
        }});
        if !self.labels.is_empty() {
            patch["metadata"]["labels"] = json!(self.labels);
        }
        if !self.deletion.is_empty() {
            patch["spec"] = json!({ "deletion": self.deletion });
        }
        patch
    }

    /// The keys set and removed, for the log and the Event (values are left
    /// out: annotations may carry anything).
    pub fn describe(&self) -> String {
        fn keys<V>(map: &BTreeMap<impl AsRef<str>, Option<V>>, set: bool) -> Vec<&str> {
            map.iter()
                .filter(|(_, v)| v.is_some() == set)
                .map(|(k, _)| k.as_ref())
                .collect()
        }
        let mut parts = vec![];
        for (what, list) in [
            ("labels set", keys(&self.labels, true)),
            ("labels removed", keys(&self.labels, false)),
            ("annotations set", keys(&self.annotations, true)),
            ("annotations removed", keys(&self.annotations, false)),
        ] {
            if !list.is_empty() {
                parts.push(format!("{what}: {}", list.join(", ")));
            }
        }
        let deletion: Vec<String> = self
            .deletion
            .iter()
            .map(|(k, v)| match v {
                Some(s) => format!("{k}={s}"),
                None => format!("{k} removed"),
            })
            .collect();
        if !deletion.is_empty() {
            parts.push(format!("spec.deletion: {}", deletion.join(", ")));
        }
        if parts.is_empty() {
            "record only".to_string()
        } else {
            parts.join("; ")
        }
    }
}

/// What `machine` needs so that it (and its objects) carry what the template
/// says, or `None`: deleting Machines are left alone, and a Machine whose
/// record matches the template needs nothing. Only keys the record lists are
/// removed; without a record nothing is.
pub fn plan_sync(kcp: &KThreesControlPlane, machine: &Machine) -> Option<MachineSync> {
    if machine.is_deleting() {
        return None;
    }
    let desired = Desired::of(kcp);
    let want = desired.record();
    // An unreadable record is no record: propagate, remove nothing.
    let had = SyncedRecord::parse(machine).unwrap_or_default();
    // The shard label is checked on the Machine itself, not only in the
    // record: without it the Machine is out of its shard's watch.
    let shard_label_in_place = desired.labels.get(WATCH_FILTER_LABEL)
        == machine.labels().get(WATCH_FILTER_LABEL)
        || !desired.labels.contains_key(WATCH_FILTER_LABEL);
    if had == want && shard_label_in_place {
        return None;
    }
    let mut sync = MachineSync {
        machine: machine.name_any(),
        record: (!want.is_empty())
            .then(|| serde_json::to_string(&want).expect("a record serializes")),
        ..MachineSync::default()
    };
    for (k, v) in &desired.labels {
        sync.labels.insert(k.clone(), Some(v.clone()));
    }
    for k in &had.labels {
        if !desired.labels.contains_key(k) && !RESERVED_LABELS.contains(&k.as_str()) {
            sync.labels.insert(k.clone(), None);
        }
    }
    for (k, v) in &desired.annotations {
        sync.annotations.insert(k.clone(), Some(v.clone()));
    }
    for k in &had.annotations {
        if !desired.annotations.contains_key(k) && !RESERVED_ANNOTATIONS.contains(&k.as_str()) {
            sync.annotations.insert(k.clone(), None);
        }
    }
    for (field, seconds) in &desired.deletion {
        sync.deletion.insert(field, Some(*seconds));
    }
    let recorded: BTreeSet<&str> = had.deletion.iter().map(String::as_str).collect();
    for field in [DRAIN, VOLUME_DETACH, NODE_DELETION] {
        if recorded.contains(field) && !desired.deletion.contains_key(field) {
            sync.deletion.insert(field, None);
        }
    }
    Some(sync)
}

/// `spec.deletion` of a new Machine from the control plane's
/// `machineTemplate.node*Timeout` (Go durations; v1beta2 Machines take seconds).
pub fn deletion_timeouts(kcp: &crate::api::KThreesControlPlane) -> Option<MachineDeletionSpec> {
    let d = &kcp.spec.machine_template.spec.deletion;
    let spec = MachineDeletionSpec {
        node_drain_timeout_seconds: d.node_drain_timeout_seconds,
        node_volume_detach_timeout_seconds: d.node_volume_detach_timeout_seconds,
        node_deletion_timeout_seconds: d.node_deletion_timeout_seconds,
        ..MachineDeletionSpec::default()
    };
    (!spec.is_empty()).then_some(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kcp(metadata: Value, drain_seconds: Option<i32>) -> KThreesControlPlane {
        let mut template = json!({
            "metadata": metadata,
            "spec": {"infrastructureRef": {
                "apiGroup": "infrastructure.cluster.x-k8s.io",
                "kind": "DockerMachineTemplate", "name": "t"
            }}
        });
        if let Some(d) = drain_seconds {
            template["spec"]["deletion"] = json!({"nodeDrainTimeoutSeconds": d});
        }
        serde_json::from_value(json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta3", "kind": "KThreesControlPlane",
            "metadata": {"name": "cp", "namespace": "ns", "uid": "u1"},
            "spec": {"replicas": 3, "version": "v1.30.2+k3s2", "machineTemplate": template}
        }))
        .unwrap()
    }

    fn machine(labels: Value, annotations: Value) -> Machine {
        serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": "m1", "namespace": "ns", "resourceVersion": "7",
                         "labels": labels, "annotations": annotations},
            "spec": {
                "clusterName": "c",
                "bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "KThreesConfig", "name": "m1"}},
                "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": "m1"}
            }
        }))
        .unwrap()
    }

    /// A Machine as a previous sync to `kcp` left it: record and values.
    fn synced(kcp: &KThreesControlPlane, extra_labels: Value) -> Machine {
        let born = born_metadata(
            kcp,
            BTreeMap::from([
                (CLUSTER_NAME_LABEL.to_string(), "c".to_string()),
                (CONTROL_PLANE_LABEL.to_string(), String::new()),
                (CONTROL_PLANE_NAME_LABEL.to_string(), "cp".to_string()),
            ]),
        );
        let mut labels = json!(born.labels);
        for (k, v) in extra_labels.as_object().unwrap() {
            labels[k] = v.clone();
        }
        let mut annotations = json!(born.annotations);
        if let Some((k, v)) = born.record {
            annotations[k] = json!(v);
        }
        machine(labels, annotations)
    }

    fn set(pairs: &[(&str, &str)]) -> BTreeMap<String, Option<String>> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), Some(v.to_string())))
            .collect()
    }

    fn in_shard(mut kcp: KThreesControlPlane, shard: &str) -> KThreesControlPlane {
        kcp.labels_mut()
            .insert(WATCH_FILTER_LABEL.to_string(), shard.to_string());
        kcp
    }

    /// The control plane's shard label reaches its Machines (and their
    /// objects), so that its shard's label-selected watch holds them.
    #[test]
    fn the_control_planes_shard_label_follows_it_to_its_machines() {
        let plain = || kcp(json!({}), None);
        let templated = || kcp(json!({"labels": {WATCH_FILTER_LABEL: "s9"}}), None);
        #[derive(Debug, PartialEq)]
        enum Want {
            NoSync,
            Set(&'static str),
            Remove,
            SyncWithoutIt,
        }
        let shard_label = |sync: Option<MachineSync>| match sync {
            None => Want::NoSync,
            Some(s) => match s.labels.get(WATCH_FILTER_LABEL) {
                Some(Some(v)) if v == "s0" => Want::Set("s0"),
                Some(Some(v)) if v == "s1" => Want::Set("s1"),
                Some(Some(v)) => panic!("unexpected value {v}"),
                Some(None) => Want::Remove,
                None => Want::SyncWithoutIt,
            },
        };
        let cases: Vec<(&str, KThreesControlPlane, Machine, Want)> = vec![
            (
                "born in a shard: nothing to do",
                in_shard(plain(), "s0"),
                synced(&in_shard(plain(), "s0"), json!({})),
                Want::NoSync,
            ),
            (
                "made before the control plane was put in a shard",
                in_shard(plain(), "s0"),
                synced(&plain(), json!({})),
                Want::Set("s0"),
            ),
            (
                "moved to another shard",
                in_shard(plain(), "s1"),
                synced(&in_shard(plain(), "s0"), json!({})),
                Want::Set("s1"),
            ),
            (
                "taken out of sharding: the label we put there goes",
                plain(),
                synced(&in_shard(plain(), "s0"), json!({})),
                Want::Remove,
            ),
            (
                "someone removed it from the Machine: put back",
                in_shard(plain(), "s0"),
                {
                    let mut m = synced(&in_shard(plain(), "s0"), json!({}));
                    m.labels_mut().remove(WATCH_FILTER_LABEL);
                    m
                },
                Want::Set("s0"),
            ),
            (
                "the control plane's label wins over the template's",
                in_shard(templated(), "s0"),
                synced(&templated(), json!({})),
                Want::Set("s0"),
            ),
            (
                "never sharded, never labelled: nothing to do",
                plain(),
                synced(&plain(), json!({})),
                Want::NoSync,
            ),
        ];
        for (situation, kcp, machine, want) in cases {
            assert_eq!(shard_label(plan_sync(&kcp, &machine)), want, "{situation}");
        }
        let born = born_metadata(&in_shard(plain(), "s0"), BTreeMap::new());
        assert_eq!(
            born.labels.get(WATCH_FILTER_LABEL).map(String::as_str),
            Some("s0"),
            "a new Machine is born in its shard"
        );
    }

    #[test]
    fn a_label_added_to_the_template_is_set_everywhere() {
        let before = kcp(json!({}), None);
        let after = kcp(json!({"labels": {"team": "blue"}}), None);
        let sync = plan_sync(&after, &synced(&before, json!({}))).expect("a sync");
        assert_eq!(sync.labels, set(&[("team", "blue")]));
        assert!(sync.annotations.is_empty() && sync.deletion.is_empty());
        assert!(sync.touches_metadata());
        let record: SyncedRecord = serde_json::from_str(sync.record.as_deref().unwrap()).unwrap();
        assert_eq!(record.labels, vec!["team"]);
        assert_eq!(
            sync.metadata_patch(),
            json!({"metadata": {"labels": {"team": "blue"}}})
        );
    }

    #[test]
    fn a_changed_label_value_is_set_again() {
        let before = kcp(json!({"labels": {"team": "blue"}}), None);
        let after = kcp(json!({"labels": {"team": "red"}}), None);
        let sync = plan_sync(&after, &synced(&before, json!({}))).expect("a sync");
        assert_eq!(sync.labels, set(&[("team", "red")]));
        assert_ne!(sync.record, synced_record(&before).map(|r| r.1));
    }

    #[test]
    fn a_label_removed_from_the_template_removes_only_our_key() {
        let before = kcp(json!({"labels": {"team": "blue", "tier": "cp"}}), None);
        let after = kcp(json!({"labels": {"tier": "cp"}}), None);
        let m = synced(&before, json!({"someone.example/owner": "ops"}));
        let sync = plan_sync(&after, &m).expect("a sync");
        assert_eq!(
            sync.labels,
            BTreeMap::from([
                ("team".to_string(), None),
                ("tier".to_string(), Some("cp".to_string())),
            ])
        );
    }

    #[test]
    fn a_foreign_key_is_never_touched() {
        let before = kcp(
            json!({"labels": {"team": "blue"}, "annotations": {"note": "x"}}),
            None,
        );
        let after = kcp(json!({}), None);
        let mut m = synced(&before, json!({"someone.example/owner": "ops"}));
        m.annotations_mut()
            .insert("someone.example/why".into(), "because".into());
        let sync = plan_sync(&after, &m).expect("a sync");
        assert!(!sync.labels.contains_key("someone.example/owner"));
        assert!(!sync.annotations.contains_key("someone.example/why"));
        assert_eq!(sync.labels, BTreeMap::from([("team".to_string(), None)]));
        assert_eq!(
            sync.annotations,
            BTreeMap::from([("note".to_string(), None)])
        );
        // Nothing propagated any more: the record goes too.
        assert_eq!(sync.record, None);
        assert_eq!(
            sync.machine_patch(Some("7"))["metadata"]["annotations"][SYNCED_METADATA_ANNOTATION],
            Value::Null
        );
    }

    #[test]
    fn capi_labels_are_never_propagated_nor_removed() {
        // A template naming the contract labels, and a record that (edited by
        // hand) lists them: neither sets nor removes them.
        let after = kcp(
            json!({"labels": {CLUSTER_NAME_LABEL: "other", "team": "blue"}}),
            None,
        );
        let record = json!({"labels": [CLUSTER_NAME_LABEL, CONTROL_PLANE_LABEL, CONTROL_PLANE_NAME_LABEL], "hash": "0"});
        let m = machine(
            json!({CLUSTER_NAME_LABEL: "c", CONTROL_PLANE_LABEL: "", CONTROL_PLANE_NAME_LABEL: "cp"}),
            json!({SYNCED_METADATA_ANNOTATION: record.to_string()}),
        );
        let sync = plan_sync(&after, &m).expect("a sync");
        assert_eq!(sync.labels, set(&[("team", "blue")]));
    }

    #[test]
    fn reserved_annotations_are_never_propagated_nor_removed() {
        let after = kcp(
            json!({"annotations": {PRE_TERMINATE_HOOK_ANNOTATION: "x", SPEC_HASH_ANNOTATION: "0000", "note": "y"}}),
            None,
        );
        let record = json!({"annotations": [PRE_TERMINATE_HOOK_ANNOTATION, REMEDIATION_FOR_ANNOTATION, SPEC_HASH_ANNOTATION], "hash": "0"});
        let m = machine(
            json!({}),
            json!({SYNCED_METADATA_ANNOTATION: record.to_string(), PRE_TERMINATE_HOOK_ANNOTATION: "etcd"}),
        );
        let sync = plan_sync(&after, &m).expect("a sync");
        assert_eq!(sync.annotations, set(&[("note", "y")]));
    }

    #[test]
    fn a_changed_timeout_is_set_on_the_machine_only() {
        let before = kcp(json!({}), Some(30));
        let after = kcp(json!({}), Some(60));
        let sync = plan_sync(&after, &synced(&before, json!({}))).expect("a sync");
        assert_eq!(sync.deletion, BTreeMap::from([(DRAIN, Some(60))]));
        assert!(
            !sync.touches_metadata(),
            "infra and config have no timeouts"
        );
        assert_eq!(
            sync.machine_patch(Some("7"))["spec"],
            json!({"deletion": {DRAIN: 60}})
        );
        assert_eq!(
            sync.machine_patch(Some("7"))["metadata"]["resourceVersion"],
            "7"
        );
    }

    #[test]
    fn a_timeout_removed_from_the_template_is_removed_if_we_set_it() {
        let before = kcp(json!({"labels": {"team": "blue"}}), Some(30));
        let after = kcp(json!({"labels": {"team": "blue"}}), None);
        let sync = plan_sync(&after, &synced(&before, json!({}))).expect("a sync");
        assert_eq!(sync.deletion, BTreeMap::from([(DRAIN, None)]));
    }

    #[test]
    fn a_matching_record_needs_nothing() {
        for template in [
            kcp(
                json!({"labels": {"team": "blue"}, "annotations": {"note": "x"}}),
                Some(30),
            ),
            kcp(json!({}), None),
        ] {
            assert_eq!(plan_sync(&template, &synced(&template, json!({}))), None);
        }
    }

    #[test]
    fn a_machine_without_record_gets_everything_and_loses_nothing() {
        let after = kcp(
            json!({"labels": {"team": "blue"}, "annotations": {"note": "x"}}),
            Some(30),
        );
        let m = machine(
            json!({CLUSTER_NAME_LABEL: "c", "old": "label"}),
            json!({"old": "annotation"}),
        );
        let sync = plan_sync(&after, &m).expect("a sync");
        assert_eq!(sync.labels, set(&[("team", "blue")]));
        assert_eq!(sync.annotations, set(&[("note", "x")]));
        assert_eq!(sync.deletion, BTreeMap::from([(DRAIN, Some(30))]));
        assert!(sync.record.is_some());
    }

    #[test]
    fn a_machine_without_record_and_an_empty_template_needs_nothing() {
        // No request for Machines created before this feature with nothing to propagate.
        assert_eq!(
            plan_sync(&kcp(json!({}), None), &machine(json!({}), json!({}))),
            None
        );
    }

    #[test]
    fn an_unreadable_record_counts_as_none() {
        let after = kcp(json!({"labels": {"team": "blue"}}), None);
        let m = machine(
            json!({"gone": "x"}),
            json!({SYNCED_METADATA_ANNOTATION: "not json"}),
        );
        let sync = plan_sync(&after, &m).expect("a sync");
        assert_eq!(sync.labels, set(&[("team", "blue")]));
    }

    #[test]
    fn a_deleting_machine_is_skipped() {
        let after = kcp(json!({"labels": {"team": "blue"}}), None);
        let mut m = machine(json!({}), json!({}));
        m.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        ));
        assert_eq!(plan_sync(&after, &m), None);
    }

    #[test]
    fn a_machine_born_from_the_template_needs_no_sync() {
        // What create.rs writes is what plan_sync expects.
        let template = kcp(
            json!({"labels": {"team": "blue"}, "annotations": {"note": "x"}}),
            Some(300),
        );
        let born = born_metadata(
            &template,
            BTreeMap::from([(CLUSTER_NAME_LABEL.to_string(), "c".to_string())]),
        );
        assert_eq!(born.labels.get("team").map(String::as_str), Some("blue"));
        assert_eq!(
            born.labels.get(CLUSTER_NAME_LABEL).map(String::as_str),
            Some("c")
        );
        let (key, value) = born.record.expect("a record");
        let m = machine(json!(born.labels), json!({key: value}));
        assert_eq!(plan_sync(&template, &m), None);
    }

    #[test]
    fn the_record_hash_is_stable_and_value_sensitive() {
        // Stored on Machines: it must not change between builds.
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        let a = synced_record(&kcp(json!({"labels": {"team": "blue"}}), None))
            .unwrap()
            .1;
        let b = synced_record(&kcp(json!({"labels": {"team": "red"}}), None))
            .unwrap()
            .1;
        assert_ne!(a, b);
        assert_eq!(synced_record(&kcp(json!({}), None)), None);
    }

    #[test]
    fn describe_names_keys_not_values() {
        let before = kcp(json!({"labels": {"old": "1"}}), None);
        let after = kcp(
            json!({"labels": {"team": "blue"}, "annotations": {"secretish": "s3cr3t"}}),
            Some(60),
        );
        let text = plan_sync(&after, &synced(&before, json!({})))
            .unwrap()
            .describe();
        assert_eq!(
            text,
            "labels set: team; labels removed: old; annotations set: secretish; spec.deletion: nodeDrainTimeoutSeconds=60"
        );
        assert!(!text.contains("s3cr3t"));
    }
}
