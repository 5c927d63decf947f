//! Single reconciles against the sandbox (real etcd, test API servers): what a
//! steady control plane reports, that nothing is opened or changed needlessly,
//! and that a bad object gets a condition naming the field instead of actions.

use std::sync::Arc;

use k3s_control_plane::api::KThreesControlPlane;
use k3s_control_plane::controller::reconcile::reconcile;
use k3s_control_plane::harness::sandbox::{KCP, Sandbox, controller_context, one_step_settings};
use kube::ResourceExt;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::json;

async fn kcp(sandbox: &Sandbox) -> Arc<KThreesControlPlane> {
    Arc::new(sandbox.kcp_api().get(KCP).await.unwrap())
}

fn condition<'a>(
    kcp: &'a KThreesControlPlane,
    type_: &str,
) -> &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    kcp.conditions()
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {:?}", kcp.conditions()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steady_control_plane_reports_etcd_health_and_reuses_its_connections() {
    let sandbox = Sandbox::start(3).await.unwrap();
    let ctx = sandbox.context();

    reconcile(kcp(&sandbox).await, ctx.clone()).await.unwrap();
    let after_first = ctx.etcd.connections_opened();
    assert!(
        after_first >= 3,
        "every member is probed on its own endpoint: {after_first}"
    );
    let status_rv = sandbox.kcp_api().get(KCP).await.unwrap().resource_version();

    for _ in 0..3 {
        reconcile(kcp(&sandbox).await, ctx.clone()).await.unwrap();
    }
    assert_eq!(
        ctx.etcd.connections_opened(),
        after_first,
        "a reconcile with nothing to do opens no connection"
    );
    assert_eq!(ctx.etcd.len(), 1, "one pooled handle per workload cluster");

    let kcp = sandbox.kcp_api().get(KCP).await.unwrap();
    assert_eq!(
        kcp.resource_version(),
        status_rv,
        "nothing changed, nothing written"
    );
    let etcd = condition(&kcp, "EtcdClusterHealthy");
    assert_eq!(etcd.status, "True");
    assert_eq!(
        etcd.message,
        "3 of 3 voters healthy, quorum needs 2, fault tolerance 1"
    );
    let status = kcp.status.as_ref().unwrap();
    assert_eq!(
        (
            status.replicas,
            status.ready_replicas,
            status.updated_replicas
        ),
        (3, 3, 3)
    );
    assert_eq!(
        status.selector,
        "cluster.x-k8s.io/cluster-name=demo,cluster.x-k8s.io/control-plane"
    );

    // Each Machine says its member is healthy, by the member's name.
    for (i, machine) in sandbox.machines.iter().enumerate() {
        let m = sandbox.machines_api().get(machine).await.unwrap();
        let c = m.condition("EtcdMemberHealthy").expect("EtcdMemberHealthy");
        assert!(c.is_true(), "{machine}: {c:?}");
        assert!(
            c.message.contains(&sandbox.etcd.member(i).name),
            "{}",
            c.message
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_spec_gets_a_condition_naming_the_field_and_no_action() {
    let sandbox = Sandbox::start(3).await.unwrap();
    let ctx = sandbox.context();
    // Even replicas reached the API (no CEL in the test server): the validator refuses.
    sandbox
        .kcp_api()
        .patch(
            KCP,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 2}})),
        )
        .await
        .unwrap();
    let machines_before: Vec<String> = sandbox
        .machines_api()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|m| m.resource_version().unwrap())
        .collect();

    reconcile(kcp(&sandbox).await, ctx.clone()).await.unwrap();

    let kcp = sandbox.kcp_api().get(KCP).await.unwrap();
    let valid = condition(&kcp, "SpecValid");
    assert_eq!(
        (valid.status.as_str(), valid.reason.as_str()),
        ("False", "InvalidSpec")
    );
    assert!(valid.message.contains("spec.replicas"), "{}", valid.message);
    assert!(
        valid.message.contains("default/demo-control-plane"),
        "names the object: {}",
        valid.message
    );
    let machines_after: Vec<String> = sandbox
        .machines_api()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|m| m.resource_version().unwrap())
        .collect();
    assert_eq!(machines_before, machines_after, "no Machine touched");

    let events: kube::Api<k8s_openapi::api::events::v1::Event> = kube::Api::all(sandbox.client());
    let events = events.list(&ListParams::default()).await.unwrap().items;
    assert!(
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("InvalidSpec")
                && e.note
                    .as_deref()
                    .is_some_and(|n| n.contains("spec.replicas"))),
        "an InvalidSpec Event names the field: {events:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_infrastructure_reference_fails_naming_the_object_and_field() {
    let sandbox = Sandbox::start(3).await.unwrap();
    let ctx = sandbox.context();
    // Scale up with an infrastructureRef that names no template kind.
    let patch = json!({"spec": {"replicas": 5, "machineTemplate": {"spec": {"infrastructureRef": {
        "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine",
        "name": "demo-control-plane-template"}}}}});
    sandbox
        .kcp_api()
        .patch(KCP, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();

    let err = reconcile(kcp(&sandbox).await, ctx.clone())
        .await
        .expect_err("no Machine can be cloned from a non-template kind");
    let text = err.to_string();
    assert!(
        text.contains("KThreesControlPlane default/demo-control-plane")
            && text.contains("spec.machineTemplate.spec.infrastructureRef.kind"),
        "{text}"
    );
    let machines = sandbox
        .machines_api()
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(machines.items.len(), 3, "nothing created");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_plane_machine_it_does_not_own_stops_every_action() {
    let sandbox = Sandbox::start(3).await.unwrap();
    let ctx = sandbox.context();
    // A control-plane Machine of the same Cluster, controlled by someone else.
    let foreign: k3s_control_plane::api::Machine = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": "other-cp", "namespace": "default", "labels": {
            "cluster.x-k8s.io/cluster-name": "demo", "cluster.x-k8s.io/control-plane": ""}},
        "spec": {"clusterName": "demo", "bootstrap": {}, "infrastructureRef": {
            "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": "other-cp"}}
    }))
    .unwrap();
    sandbox
        .machines_api()
        .create(&Default::default(), &foreign)
        .await
        .unwrap();
    sandbox
        .kcp_api()
        .patch(
            KCP,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 5}})),
        )
        .await
        .unwrap();
    let versions = || async {
        let mut v: Vec<(String, String)> = sandbox
            .machines_api()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .map(|m| (m.name_any(), m.resource_version().unwrap()))
            .collect();
        v.sort();
        v
    };
    let before = versions().await;
    for _ in 0..2 {
        reconcile(kcp(&sandbox).await, ctx.clone()).await.unwrap();
    }
    assert_eq!(versions().await, before, "nothing created or touched");
    let kcp = sandbox.kcp_api().get(KCP).await.unwrap();
    let remediating = condition(&kcp, "Remediating");
    assert_eq!(remediating.reason, "CannotDecide");
    assert!(
        remediating.message.contains("other-cp")
            && remediating
                .message
                .contains("not owned by this KThreesControlPlane"),
        "{}",
        remediating.message
    );
}

/// Observe, let someone else write, then act on the stale observation: every
/// write that carries state between steps is conditional, so it is refused
/// with a conflict and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_decided_on_a_stale_observation_is_refused_and_writes_nothing() {
    use k3s_control_plane::api::names::{
        PRE_TERMINATE_HOOK_ANNOTATION, REMEDIATION_IN_PROGRESS_ANNOTATION,
    };
    use k3s_control_plane::controller::act::act;
    use k3s_control_plane::controller::observe::observe;
    use k3s_control_plane::decision::plan::{Action, plan};
    use k3s_control_plane::remediation::steps::Step;

    let sandbox = Sandbox::start(3).await.unwrap();
    // One step per reconcile: the test acts between two particular steps.
    let ctx = controller_context(sandbox.client(), one_step_settings());
    let target = sandbox.machines[1].clone();
    // A Machine made by an earlier version: no hook of ours yet.
    sandbox
        .machines_api()
        .patch(
            &target,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {PRE_TERMINATE_HOOK_ANNOTATION: null}}}),
            ),
        )
        .await
        .unwrap();
    sandbox.mark_unhealthy(&target).await.unwrap();

    // Before anything else, the hook goes on the Machine.
    let (world, etcd) = observe(&ctx, (*kcp(&sandbox).await).clone()).await.unwrap();
    let planned = plan(&world).unwrap();
    assert!(
        matches!(&planned.action, Action::AddHooks { machines } if machines == std::slice::from_ref(&target)),
        "{:?}",
        planned.action
    );
    sandbox
        .machines_api()
        .patch(
            &target,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"someone": "else"}}})),
        )
        .await
        .unwrap();
    let err = act(&ctx, &world, &planned, etcd).await.unwrap_err();
    assert!(err.is_conflict(), "{err}");
    let machine = sandbox.machines_api().get(&target).await.unwrap();
    assert!(
        !machine
            .annotations()
            .contains_key(PRE_TERMINATE_HOOK_ANNOTATION)
    );

    // Observed again, it adds the hook; then the remediation is recorded on
    // the control plane.
    reconcile(kcp(&sandbox).await, ctx.clone()).await.unwrap();
    let (world, etcd) = observe(&ctx, (*kcp(&sandbox).await).clone()).await.unwrap();
    let planned = plan(&world).unwrap();
    assert!(
        matches!(
            &planned.action,
            Action::Step {
                step: Step::RecordRemediation { .. },
                ..
            }
        ),
        "{:?}",
        planned.action
    );
    sandbox
        .kcp_api()
        .patch(
            KCP,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"someone": "else"}}})),
        )
        .await
        .unwrap();
    let err = act(&ctx, &world, &planned, etcd).await.unwrap_err();
    assert!(err.is_conflict(), "{err}");
    let now = sandbox.kcp_api().get(KCP).await.unwrap();
    assert!(
        !now.annotations()
            .contains_key(REMEDIATION_IN_PROGRESS_ANNOTATION)
    );
}
