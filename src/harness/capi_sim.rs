//! What Cluster API's own Machine controller does when a Machine is deleted, and
//! nothing more, for tests and the demo where no CAPI runs:
//! - a Machine gets CAPI's finalizer `machine.cluster.x-k8s.io` when it appears;
//! - once it is deleting, CAPI drains its node: `Deleting=True` reason
//!   `DrainingNode` for [`DRAIN`] (there are no Pods to evict; the time lets the
//!   controller meet the drain wait as it does on a real cluster);
//! - once drained and any annotation whose key starts with
//!   `pre-terminate.delete.hook.machine.cluster.x-k8s.io` remains (CAPI's prefix
//!   test has no `/`, so cluster-api-k3s's bare key counts too), CAPI reports
//!   that it waits on the hooks: v1beta2
//!   condition `Deleting=True` reason `WaitingForPreTerminateHook`, and the
//!   v1beta1 condition `PreTerminateDeleteHookSucceeded=False` reason
//!   `WaitingExternalHook` under `status.deprecated.v1beta1.conditions`;
//! - once no pre-terminate hook remains it removes its finalizer, so the API
//!   server deletes the Machine.
//!
//! The infrastructure is not simulated.

use std::time::Duration;

use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

pub const MACHINE_FINALIZER: &str = "machine.cluster.x-k8s.io";
/// CAPI's hook prefix, matched as CAPI does (`strings.HasPrefix`, no `/`).
pub const PRE_TERMINATE_HOOK_PREFIX: &str = crate::api::names::CAPI_PRE_TERMINATE_HOOK_PREFIX;

/// `cluster.x-k8s.io/v1beta2` Machines, untyped: the simulator only touches
/// metadata and conditions.
pub fn machine_resource() -> ApiResource {
    ApiResource {
        group: "cluster.x-k8s.io".into(),
        version: "v1beta2".into(),
        api_version: "cluster.x-k8s.io/v1beta2".into(),
        kind: "Machine".into(),
        plural: "machines".into(),
    }
}

/// Runs until dropped (aborts its task on drop).
pub struct MachineDeletionSim {
    task: JoinHandle<()>,
}

impl Drop for MachineDeletionSim {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl MachineDeletionSim {
    /// Starts simulating CAPI's Machine deletion for every Machine `client` can see.
    pub fn start(client: Client) -> Self {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &machine_resource());
        let task = tokio::spawn(async move {
            let mut events = watcher(api, watcher::Config::default())
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(event) = events.next().await {
                let Ok(machine) = event else { continue };
                let namespace = machine.namespace().unwrap_or_default();
                let ns_api: Api<DynamicObject> =
                    Api::namespaced_with(client.clone(), &namespace, &machine_resource());
                if let Err(err) = step(&ns_api, &machine).await {
                    // A conflict or a vanished object: the next event retries.
                    tracing::debug!(machine = %machine.name_any(), %err, "capi sim step failed");
                }
            }
        });
        MachineDeletionSim { task }
    }
}

fn pre_terminate_hooks(machine: &DynamicObject) -> Vec<String> {
    machine
        .annotations()
        .keys()
        .filter(|k| k.starts_with(PRE_TERMINATE_HOOK_PREFIX))
        .cloned()
        .collect()
}

async fn step(api: &Api<DynamicObject>, machine: &DynamicObject) -> kube::Result<()> {
    let name = machine.name_any();
    let finalizers = machine.finalizers().to_vec();
    let has_finalizer = finalizers.iter().any(|f| f == MACHINE_FINALIZER);
    if machine.metadata.deletion_timestamp.is_none() {
        if !has_finalizer {
            let mut with = finalizers.clone();
            with.push(MACHINE_FINALIZER.to_string());
            let patch = json!({"metadata": {"finalizers": with, "resourceVersion": machine.resource_version()}});
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        return Ok(());
    }
    if !has_finalizer {
        return Ok(());
    }
    if pre_terminate_hooks(machine).is_empty() {
        let without: Vec<String> = finalizers
            .into_iter()
            .filter(|f| f != MACHINE_FINALIZER)
            .collect();
        let patch = json!({"metadata": {"finalizers": without, "resourceVersion": machine.resource_version()}});
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        return Ok(());
    }
    if waiting_condition_set(machine) {
        return Ok(());
    }
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let status = machine
        .data
        .get("status")
        .cloned()
        .unwrap_or_else(|| json!({}));
    if draining(machine) {
        // The drain ends on its own (the task below); a drain left from before
        // this simulator started is ended here.
        if drain_started(machine)
            .is_some_and(|since| chrono::Utc::now() - since > chrono::Duration::seconds(2))
        {
            return wait_on_hooks(api, machine).await;
        }
        return Ok(());
    }
    let conditions = upsert(
        status.get("conditions"),
        json!({
            "type": "Deleting", "status": "True", "reason": "DrainingNode",
            "message": "Drain not completed yet",
            "lastTransitionTime": now, "observedGeneration": machine.metadata.generation,
        }),
    );
    api.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": {"conditions": conditions}})),
    )
    .await?;
    let api = api.clone();
    tokio::spawn(async move {
        tokio::time::sleep(DRAIN).await;
        // Retried on conflicts with the controller's own writes.
        for _ in 0..20 {
            match api.get(&name).await {
                Ok(machine) if draining(&machine) && !waiting_condition_set(&machine) => {
                    match wait_on_hooks(&api, &machine).await {
                        Ok(()) => return,
                        Err(err) => {
                            tracing::debug!(%name, %err, "capi sim: ending the drain failed")
                        }
                    }
                }
                _ => return,
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    Ok(())
}

/// Drained: CAPI reports that it waits on the pre-terminate hooks.
async fn wait_on_hooks(api: &Api<DynamicObject>, machine: &DynamicObject) -> kube::Result<()> {
    let name = machine.name_any();
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let status = machine
        .data
        .get("status")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let conditions = upsert(
        status.get("conditions"),
        json!({
            "type": "Deleting", "status": "True", "reason": "WaitingForPreTerminateHook",
            "message": "Waiting for pre-terminate hooks to succeed",
            "lastTransitionTime": now, "observedGeneration": machine.metadata.generation,
        }),
    );
    let v1beta1 = upsert(
        status.pointer("/deprecated/v1beta1/conditions"),
        json!({
            "type": "PreTerminateDeleteHookSucceeded", "status": "False", "severity": "Info",
            "reason": "WaitingExternalHook", "lastTransitionTime": now,
        }),
    );
    let patch = json!({"status": {
        "conditions": conditions,
        "deprecated": {"v1beta1": {"conditions": v1beta1}},
    }});
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// How long draining a node takes here.
pub const DRAIN: Duration = Duration::from_millis(500);

fn deleting_condition(machine: &DynamicObject) -> Option<&Value> {
    machine
        .data
        .pointer("/status/conditions")
        .and_then(Value::as_array)?
        .iter()
        .find(|c| c["type"] == "Deleting" && c["status"] == "True")
}

/// When the drain started, if it is under way.
fn drain_started(machine: &DynamicObject) -> Option<chrono::DateTime<chrono::Utc>> {
    deleting_condition(machine)
        .filter(|c| c["reason"] == "DrainingNode")
        .and_then(|c| c["lastTransitionTime"].as_str())
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&chrono::Utc))
}

/// The drain has started (or is over: CAPI waits on the hooks).
fn draining(machine: &DynamicObject) -> bool {
    deleting_condition(machine).is_some_and(|c| {
        c["reason"] == "DrainingNode" || c["reason"] == "WaitingForPreTerminateHook"
    })
}

fn waiting_condition_set(machine: &DynamicObject) -> bool {
    machine
        .data
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c["type"] == "Deleting"
                    && c["status"] == "True"
                    && c["reason"] == "WaitingForPreTerminateHook"
            })
        })
}

/// The condition list with `condition` replacing the one of the same type.
fn upsert(existing: Option<&Value>, condition: Value) -> Value {
    let mut list: Vec<Value> = existing
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c["type"] != condition["type"])
        .collect();
    list.push(condition);
    Value::Array(list)
}

/// How long tests and the demo wait for the simulator to act.
pub const SIM_DEADLINE: Duration = Duration::from_secs(20);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upsert_replaces_condition_of_same_type_and_keeps_others() {
        let existing = json!([
            {"type": "Ready", "status": "True"},
            {"type": "Deleting", "status": "False", "reason": "NotDeleting"}
        ]);
        let got = upsert(
            Some(&existing),
            json!({"type": "Deleting", "status": "True"}),
        );
        assert_eq!(
            got,
            json!([{"type": "Ready", "status": "True"}, {"type": "Deleting", "status": "True"}])
        );
    }

    #[test]
    fn only_pre_terminate_hooks_count_as_hooks() {
        let mut machine = DynamicObject::new("m1", &machine_resource());
        machine.metadata.annotations = Some(
            [
                (
                    format!("{PRE_TERMINATE_HOOK_PREFIX}/k3s-control-plane"),
                    String::new(),
                ),
                (
                    "pre-drain.delete.hook.machine.cluster.x-k8s.io/x".to_string(),
                    String::new(),
                ),
            ]
            .into(),
        );
        assert_eq!(
            pre_terminate_hooks(&machine),
            vec![format!("{PRE_TERMINATE_HOOK_PREFIX}/k3s-control-plane")]
        );
    }

    #[test]
    fn the_bare_prefix_key_of_cluster_api_k3s_counts_as_a_hook() {
        let mut machine = DynamicObject::new("m1", &machine_resource());
        machine.metadata.annotations = Some(
            [(
                "pre-terminate.delete.hook.machine.cluster.x-k8s.io".to_string(),
                "k3s".to_string(),
            )]
            .into(),
        );
        assert_eq!(
            pre_terminate_hooks(&machine),
            vec!["pre-terminate.delete.hook.machine.cluster.x-k8s.io".to_string()]
        );
    }
}
