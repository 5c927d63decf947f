//! Shared helpers of the end-to-end tests: reading the management cluster
//! (Machines, the control plane, Events, conditions), a concurrent observer of
//! "how many at once", and waits that use the controller's own progress.
#![allow(dead_code)]

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use k3s_control_plane::api::conditions::{self, V1Beta1Condition};
use k3s_control_plane::api::{KThreesControlPlane, Machine};
use k3s_control_plane::controller::Context;
use k3s_control_plane::etcd::{EtcdCluster, MembershipSnapshot};
use k3s_control_plane::harness::infra_sim::reconcile_infrastructure;
use k3s_control_plane::harness::sandbox::{KCP, NAMESPACE, Sandbox};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

/// The deadline of every wait: generous for a loaded 2-core machine; a passing
/// run takes a fraction of it.
pub const LIMIT: Duration = Duration::from_secs(60);

pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

pub async fn machines(sandbox: &Sandbox) -> Vec<Machine> {
    sandbox
        .machines_api()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
}

pub async fn machine_names(sandbox: &Sandbox) -> Vec<String> {
    let mut names: Vec<String> = machines(sandbox)
        .await
        .iter()
        .map(|m| m.name_any())
        .collect();
    names.sort();
    names
}

pub async fn kcp(sandbox: &Sandbox) -> KThreesControlPlane {
    sandbox.kcp_api().get(KCP).await.unwrap()
}

/// Merge-patch the control plane's spec.
pub async fn patch_kcp_spec(sandbox: &Sandbox, spec: serde_json::Value) {
    sandbox
        .kcp_api()
        .patch(
            KCP,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": spec })),
        )
        .await
        .unwrap();
}

/// Merge-patch the control plane's annotations (`null` removes one).
pub async fn annotate_kcp(sandbox: &Sandbox, annotations: serde_json::Value) {
    sandbox
        .kcp_api()
        .patch(
            KCP,
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"annotations": annotations}})),
        )
        .await
        .unwrap();
}

pub async fn annotate_machine(sandbox: &Sandbox, machine: &str, annotations: serde_json::Value) {
    sandbox
        .machines_api()
        .patch(
            machine,
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"annotations": annotations}})),
        )
        .await
        .unwrap();
}

/// Every occurrence of Events with `reason` about the control plane: the
/// recorder folds repeats into a series, so a series counts `count` times.
pub async fn event_count(sandbox: &Sandbox, reason: &str) -> usize {
    events(sandbox, reason)
        .await
        .iter()
        .map(|e| {
            e.series
                .as_ref()
                .map(|s| s.count.max(1) as usize)
                .unwrap_or(1)
        })
        .sum()
}

/// Every Warning Event in the namespace so far, as "reason (regarding): note":
/// a healthy life has none.
pub async fn warning_events(sandbox: &Sandbox) -> Vec<String> {
    let api: Api<Event> = Api::namespaced(sandbox.client(), NAMESPACE);
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .map(|e| {
            format!(
                "{} ({}): {}",
                e.reason.unwrap_or_default(),
                e.regarding.and_then(|r| r.name).unwrap_or_default(),
                e.note.unwrap_or_default()
            )
        })
        .collect()
}

/// events.k8s.io/v1 Events with `reason` regarding the control plane.
pub async fn events(sandbox: &Sandbox, reason: &str) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(sandbox.client(), NAMESPACE);
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(KCP))
        .collect()
}

/// Notes of all Events with `reason`, for assertions and failure messages.
pub async fn event_notes(sandbox: &Sandbox, reason: &str) -> Vec<String> {
    events(sandbox, reason)
        .await
        .into_iter()
        .filter_map(|e| e.note)
        .collect()
}

/// The Machine's `OwnerRemediated` condition as (reason, message), if set.
pub fn owner_remediated(machine: &Machine) -> Option<(String, String)> {
    machine
        .condition("OwnerRemediated")
        .map(|c| (c.reason.to_string(), c.message.to_string()))
}

/// Wait until `machine` has `OwnerRemediated` with `reason` and a message
/// containing every one of `needles`; returns the message.
pub async fn wait_owner_remediated(
    sandbox: &Sandbox,
    machine: &str,
    reason: &str,
    needles: &[&str],
) -> String {
    sandbox
        .wait_for(
            &format!("{machine} OwnerRemediated={reason} saying {needles:?}"),
            LIMIT,
            || async {
                let m = sandbox
                    .machines_api()
                    .get(machine)
                    .await
                    .map_err(|e| e.to_string())?;
                match owner_remediated(&m) {
                    Some((r, message))
                        if r == reason && needles.iter().all(|n| message.contains(n)) =>
                    {
                        Ok(message)
                    }
                    other => Err(format!("OwnerRemediated is {other:?}")),
                }
            },
        )
        .await
        .unwrap()
}

/// Reconciles done so far by the controller of `ctx`.
pub fn reconciles(ctx: &Context) -> u64 {
    ctx.metrics.reconciles.get()
}

/// Wait until the controller of `ctx` has started `more` further reconciles:
/// proof that it looked at the world again (with `more >= 2`, at least one
/// whole reconcile ran after the call: one object is never reconciled twice at
/// once). The control plane is poked with a test annotation so that an idle
/// controller does not make the test wait for its periodic requeue.
pub async fn wait_reconciles(sandbox: &Sandbox, ctx: &Arc<Context>, more: u64) {
    let target = reconciles(ctx) + more;
    let deadline = tokio::time::Instant::now() + LIMIT;
    let mut pokes = 0u64;
    loop {
        let done = reconciles(ctx);
        if done >= target {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{done} of {target} reconciles after {LIMIT:?}"
        );
        pokes += 1;
        annotate_kcp(
            sandbox,
            json!({"e2e.k3s-control-plane.test/poke": pokes.to_string()}),
        )
        .await;
        let _ = sandbox
            .wait_for(
                "a reconcile after a poke",
                Duration::from_secs(1),
                || async {
                    if reconciles(ctx) > done {
                        Ok(())
                    } else {
                        Err(String::new())
                    }
                },
            )
            .await;
    }
}

/// Member names of a snapshot, sorted.
pub fn member_names(snapshot: &MembershipSnapshot) -> Vec<String> {
    let mut names: Vec<String> = snapshot.members.iter().map(|m| m.name.clone()).collect();
    names.sort();
    names
}

/// Wait until `member` (by name) is no longer in the membership.
pub async fn wait_member_gone(
    sandbox: &Sandbox,
    admin: &k3s_control_plane::etcd::EtcdCluster,
    member: &str,
) {
    sandbox
        .wait_for(&format!("member {member} to be removed"), LIMIT, || async {
            let snap = admin.snapshot().await.map_err(|e| e.to_string())?;
            match snap.member_by_name(member) {
                Some(_) => Err(format!("{member} still a member")),
                None => Ok(()),
            }
        })
        .await
        .unwrap();
}

/// A snapshot taken with retries (a member that was just removed or stopped
/// may make one attempt fail).
pub async fn snapshot(sandbox: &Sandbox, admin: &EtcdCluster) -> MembershipSnapshot {
    sandbox
        .wait_for("an etcd snapshot", LIMIT, || async {
            admin.snapshot().await.map_err(|e| e.to_string())
        })
        .await
        .unwrap()
}

/// An address of the sandbox's loopback block that no etcd member uses
/// (members take `.1` upwards; `k` counts down from `.9`).
pub fn spare_ip(sandbox: &Sandbox, k: u8) -> String {
    let [a, b, c, _] = sandbox.etcd.member(0).ip.octets();
    Ipv4Addr::new(a, b, c, 9 - k).to_string()
}

/// Add a provisioned control-plane Machine whose node runs no etcd member
/// (k3s `--disable-etcd`), on a spare address.
pub async fn add_memberless_machine(sandbox: &Sandbox, name: &str, k: u8) -> Machine {
    let ip = spare_ip(sandbox, k);
    sandbox.add_node(name, &ip, None).await.unwrap();
    let kcp = kcp(sandbox).await;
    sandbox
        .add_machine(&kcp, name, Some((name, &ip)))
        .await
        .unwrap()
}

/// Give a (replacement) Machine a node without an etcd member, on a spare address.
pub async fn provision_memberless(sandbox: &Sandbox, machine: &str, k: u8) {
    let ip = spare_ip(sandbox, k);
    sandbox.add_node(machine, &ip, None).await.unwrap();
    sandbox.provision(machine, machine, &ip).await.unwrap();
}

/// Mark a Machine as a MachineHealthCheck with external remediation does:
/// `HealthCheckSucceeded=False` and `ExternallyRemediated` (no `OwnerRemediated`).
pub async fn mark_externally_remediated(sandbox: &Sandbox, machine: &str) {
    let api = sandbox.machines_api();
    let mut current = api.get(machine).await.unwrap();
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let generation = current.metadata.generation;
    for (type_, reason) in [
        ("HealthCheckSucceeded", "UnhealthyNode"),
        ("ExternallyRemediated", "WaitingForRemediation"),
    ] {
        conditions::set(
            current.conditions_mut(),
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                type_: type_.into(),
                status: "False".into(),
                reason: reason.into(),
                message: "marked by an external-remediation MachineHealthCheck".into(),
                observed_generation: generation,
                last_transition_time: now.clone(),
            },
        );
        conditions::set_v1beta1(
            current.v1beta1_conditions_mut(),
            V1Beta1Condition {
                type_: type_.into(),
                status: "False".into(),
                severity: Some("Warning".into()),
                last_transition_time: Some(now.clone()),
                reason: Some(reason.into()),
                message: None,
            },
        );
    }
    let status = current.status.clone().unwrap_or_default();
    let patch =
        json!({"status": {"conditions": status.conditions, "deprecated": status.deprecated}});
    api.patch_status(machine, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

mod quorum_watch;
#[allow(unused_imports)]
pub use quorum_watch::*;

/// Healthy voters and quorum of the real membership right now.
pub async fn quorum_sample(sandbox: &Sandbox) -> Option<(usize, usize, usize, String)> {
    let snap = sandbox.etcd.connect().snapshot().await.ok()?;
    let a = snap.assess_cluster();
    Some((a.healthy, a.voters, a.size, a.to_string()))
}

/// Run the simulated infrastructure until `done` holds, checking at every pass
/// that at most one Machine is deleting and at most one provisioning, while
/// the shared quorum sampler (this module's [`Observer`]) watches etcd
/// throughout: every sample counts, below quorum fails, a window without a
/// leader must close within two election timeouts, and no member may be
/// removed while it leads. Returns how many samples it took.
pub async fn drive(
    sandbox: &mut Sandbox,
    what: &str,
    done: impl Fn(&[Machine], (usize, usize)) -> bool,
) -> usize {
    let observer = Observer::start(sandbox, vec![]);
    let deadline = tokio::time::Instant::now() + LIMIT * 3;
    loop {
        reconcile_infrastructure(sandbox, LIMIT).await.unwrap();
        let all = machines(sandbox).await;
        let deleting = all.iter().filter(|m| m.is_deleting()).count();
        let provisioning = all
            .iter()
            .filter(|m| !m.is_deleting() && m.node_name().is_none())
            .count();
        assert!(
            deleting <= 1,
            "{what}: {deleting} Machines deleting at once"
        );
        assert!(
            provisioning <= 1,
            "{what}: {provisioning} Machines provisioning at once"
        );
        observer.assert_quorum_so_far(what);
        if let Some((healthy, voters, _, _)) = quorum_sample(sandbox).await
            && done(&all, (healthy, voters))
        {
            let record = observer.record().await;
            let summary = record.assert_safe(what);
            eprintln!("{what}: quorum sampler: {summary}");
            return summary.samples;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not done in time"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub fn all_ready(n: usize) -> impl Fn(&[Machine], (usize, usize)) -> bool {
    move |all, (healthy, voters)| {
        all.len() == n
            && all
                .iter()
                .all(|m| !m.is_deleting() && m.node_name().is_some())
            && healthy == n
            && voters == n
    }
}

/// `n` Machines ready and voting, none of them `gone` (a remediated or
/// removed Machine, replaced).
pub fn replaced(gone: &str, n: usize) -> impl Fn(&[Machine], (usize, usize)) -> bool {
    let ready = all_ready(n);
    let gone = gone.to_string();
    move |all, counts| all.iter().all(|m| m.name_any() != gone) && ready(all, counts)
}

/// The control plane's remediation-in-progress record cleared.
pub async fn wait_in_progress_cleared(sandbox: &Sandbox) {
    sandbox
        .wait_for("remediation-in-progress to be cleared", LIMIT, || async {
            let kcp = kcp(sandbox).await;
            match kcp
                .annotations()
                .get(k3s_control_plane::api::names::REMEDIATION_IN_PROGRESS_ANNOTATION)
            {
                Some(v) => Err(format!("still annotated: {v}")),
                None => Ok(()),
            }
        })
        .await
        .unwrap();
}
