//! In-place propagation end to end (the real controller, a real 3-member
//! etcd): a change of `machineTemplate.metadata` or `nodeDrainTimeout` reaches
//! every Machine, its DockerMachine and its KThreesConfig without a rollout,
//! and a key removed from the template is removed again, while keys others
//! set stay.

use crate::support;

use std::collections::BTreeMap;
use std::time::Instant;

use k3s_control_plane::api::names::{
    CLUSTER_NAME_LABEL, CONTROL_PLANE_LABEL, CONTROL_PLANE_NAME_LABEL, SYNCED_METADATA_ANNOTATION,
};
use k3s_control_plane::api::{KThreesConfig, Machine};
use k3s_control_plane::harness::sandbox::{CLUSTER, KCP, NAMESPACE, Sandbox, docker_machine};
use kube::api::{DynamicObject, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use support::*;

const LABEL: &str = "sync.example.com/team";
const ANNOTATION: &str = "sync.example.com/contact";
/// Keys someone else set directly on the objects: never ours to touch.
const FOREIGN_LABEL: &str = "someone.example.com/owner";

fn labels(obj: &impl ResourceExt) -> &BTreeMap<String, String> {
    obj.labels()
}

/// The DockerMachine and KThreesConfig of each sandbox Machine, as CAPD and
/// create.rs would have made them (the sandbox itself makes none, and other
/// tests rely on that), each with a label of someone else's.
async fn create_machine_objects(sandbox: &Sandbox) {
    let infra: Api<DynamicObject> =
        Api::namespaced_with(sandbox.client(), NAMESPACE, &docker_machine());
    let configs: Api<KThreesConfig> = Api::namespaced(sandbox.client(), NAMESPACE);
    for name in &sandbox.machines {
        let meta = ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(NAMESPACE.into()),
            labels: Some(BTreeMap::from([
                (CLUSTER_NAME_LABEL.to_string(), CLUSTER.to_string()),
                (CONTROL_PLANE_LABEL.to_string(), String::new()),
                (CONTROL_PLANE_NAME_LABEL.to_string(), KCP.to_string()),
                (FOREIGN_LABEL.to_string(), "infra-team".to_string()),
            ])),
            ..ObjectMeta::default()
        };
        let mut dm = DynamicObject::new(name, &docker_machine()).within(NAMESPACE);
        dm.metadata = meta.clone();
        dm.data = json!({"spec": {"extraMounts": []}});
        infra.create(&PostParams::default(), &dm).await.unwrap();
        let mut config = KThreesConfig::new(name, Default::default());
        config.metadata = meta;
        configs
            .create(&PostParams::default(), &config)
            .await
            .unwrap();
    }
}

/// Everything the test checks, read in one pass.
struct View {
    machines: Vec<Machine>,
    infra: Vec<DynamicObject>,
    configs: Vec<KThreesConfig>,
}

async fn view(sandbox: &Sandbox) -> Result<View, String> {
    let infra: Api<DynamicObject> =
        Api::namespaced_with(sandbox.client(), NAMESPACE, &docker_machine());
    let configs: Api<KThreesConfig> = Api::namespaced(sandbox.client(), NAMESPACE);
    let mut v = View {
        machines: vec![],
        infra: vec![],
        configs: vec![],
    };
    for name in &sandbox.machines {
        let e = |e: kube::Error| format!("{name}: {e}");
        v.machines
            .push(sandbox.machines_api().get(name).await.map_err(e)?);
        v.infra.push(infra.get(name).await.map_err(e)?);
        v.configs.push(configs.get(name).await.map_err(e)?);
    }
    Ok(v)
}

/// `Err` naming the first object that does not satisfy `ok`.
fn all<T: ResourceExt>(kind: &str, objs: &[T], ok: impl Fn(&T) -> bool) -> Result<(), String> {
    match objs.iter().find(|o| !ok(o)) {
        None => Ok(()),
        Some(o) => Err(format!(
            "{kind} {}: labels {:?}, annotations {:?}",
            o.name_any(),
            o.labels(),
            o.annotations()
        )),
    }
}

fn drain_seconds(m: &Machine) -> Option<i32> {
    m.spec
        .deletion
        .as_ref()
        .and_then(|d| d.node_drain_timeout_seconds)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn template_metadata_and_timeouts_reach_machines_in_place_and_removed_keys_go() {
    init_logs();
    let started = Instant::now();
    let sandbox = Sandbox::start(3).await.unwrap();
    create_machine_objects(&sandbox).await;
    // Someone else's label, set directly on one Machine.
    let first = sandbox.machines[0].clone();
    sandbox
        .machines_api()
        .patch(
            &first,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {FOREIGN_LABEL: "ops"}}})),
        )
        .await
        .unwrap();
    let admin = sandbox.etcd.connect();
    let members_before = snapshot(&sandbox, &admin).await;
    let uids_before: Vec<(String, Option<String>)> = view(&sandbox)
        .await
        .unwrap()
        .machines
        .iter()
        .map(|m| (m.name_any(), m.uid()))
        .collect();
    let observer = Observer::start(&sandbox, sandbox.etcd.member_names());
    let controller = sandbox.start_controller();

    patch_kcp_spec(
        &sandbox,
        json!({"machineTemplate": {
            "metadata": {"labels": {LABEL: "blue"}, "annotations": {ANNOTATION: "ops@example.com"}},
            "spec": {"deletion": {"nodeDrainTimeoutSeconds": 45}},
        }}),
    )
    .await;
    let has_both = |o: &dyn ResourceExtDyn| {
        o.labels_().get(LABEL).map(String::as_str) == Some("blue")
            && o.annotations_().get(ANNOTATION).map(String::as_str) == Some("ops@example.com")
    };
    sandbox
        .wait_for(
            "label, annotation and drain timeout on every Machine, DockerMachine and KThreesConfig",
            LIMIT,
            || async {
                let v = view(&sandbox).await?;
                all("Machine", &v.machines, |m| {
                    has_both(m) && drain_seconds(m) == Some(45)
                })?;
                all("DockerMachine", &v.infra, |o| has_both(o))?;
                all("KThreesConfig", &v.configs, |o| has_both(o))
            },
        )
        .await
        .unwrap();
    let propagated_in = started.elapsed();

    sandbox
        .kcp_api()
        .patch(
            KCP,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"machineTemplate": {"metadata": {"labels": {LABEL: null}}}}}),
            ),
        )
        .await
        .unwrap();
    let v = sandbox
        .wait_for(
            "the template label removed from every object",
            LIMIT,
            || async {
                let v = view(&sandbox).await?;
                let gone = |o: &dyn ResourceExtDyn| !o.labels_().contains_key(LABEL);
                all("Machine", &v.machines, |m| gone(m))?;
                all("DockerMachine", &v.infra, |o| gone(o))?;
                all("KThreesConfig", &v.configs, |o| gone(o))?;
                Ok(v)
            },
        )
        .await
        .unwrap();
    wait_reconciles(&sandbox, &controller.ctx, 2).await;
    let samples = observer.finish().await;
    controller.stop().await;

    // The annotation and timeout stay (still in the template); others' keys
    // and the CAPI labels stay.
    let contract = [
        CLUSTER_NAME_LABEL,
        CONTROL_PLANE_LABEL,
        CONTROL_PLANE_NAME_LABEL,
    ];
    for m in &v.machines {
        assert_eq!(
            m.annotations().get(ANNOTATION).map(String::as_str),
            Some("ops@example.com"),
            "{}",
            m.name_any()
        );
        assert_eq!(drain_seconds(m), Some(45), "{}", m.name_any());
        assert!(
            m.annotations().contains_key(SYNCED_METADATA_ANNOTATION),
            "{}",
            m.name_any()
        );
        assert!(
            contract.iter().all(|l| labels(m).contains_key(*l)),
            "{}: {:?}",
            m.name_any(),
            labels(m)
        );
    }
    let first_now = v.machines.iter().find(|m| m.name_any() == first).unwrap();
    assert_eq!(
        labels(first_now).get(FOREIGN_LABEL).map(String::as_str),
        Some("ops"),
        "someone else's label on the Machine stays"
    );
    for o in &v.infra {
        assert_eq!(
            labels(o).get(FOREIGN_LABEL).map(String::as_str),
            Some("infra-team")
        );
        assert!(contract.iter().all(|l| labels(o).contains_key(*l)));
    }
    for o in &v.configs {
        assert_eq!(
            labels(o).get(FOREIGN_LABEL).map(String::as_str),
            Some("infra-team")
        );
    }

    // No rollout: the same Machines (names and uids), none ever deleting, and
    // the same etcd members throughout.
    let uids_after: Vec<(String, Option<String>)> =
        v.machines.iter().map(|m| (m.name_any(), m.uid())).collect();
    assert_eq!(uids_after, uids_before);
    assert_eq!(machine_names(&sandbox).await.len(), 3);
    assert!(
        samples
            .iter()
            .all(|s| s.deleting.is_empty() && s.missing.is_empty()),
        "a Machine was deleting or a member missing: {:?}",
        samples
            .iter()
            .find(|s| !s.deleting.is_empty() || !s.missing.is_empty())
    );
    assert!(!samples.is_empty(), "the observer sampled");
    let members_after = snapshot(&sandbox, &admin).await;
    assert_eq!(member_names(&members_after), member_names(&members_before));
    let ids = |s: &k3s_control_plane::etcd::MembershipSnapshot| {
        let mut ids: Vec<u64> = s.members.iter().map(|m| m.id).collect();
        ids.sort();
        ids
    };
    assert_eq!(ids(&members_after), ids(&members_before));
    assert_eq!(event_count(&sandbox, "MachineCreated").await, 0);
    assert_eq!(event_count(&sandbox, "MachineDeleting").await, 0);
    // One Event per Machine and change: the add, then the removal.
    assert_eq!(event_count(&sandbox, "MachineMetadataSynced").await, 6);
    eprintln!(
        "e2e_sync: propagated after {propagated_in:?}, whole test {:?}",
        started.elapsed()
    );
}

/// Labels and annotations of any object, behind one reference type so the
/// checks above are written once for the three kinds.
trait ResourceExtDyn {
    fn labels_(&self) -> &BTreeMap<String, String>;
    fn annotations_(&self) -> &BTreeMap<String, String>;
}

impl<T: ResourceExt> ResourceExtDyn for T {
    fn labels_(&self) -> &BTreeMap<String, String> {
        self.labels()
    }
    fn annotations_(&self) -> &BTreeMap<String, String> {
        self.annotations()
    }
}
