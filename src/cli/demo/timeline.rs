//! The demo's timeline: one line per new Event and per Machine change (and, in
//! the self-contained demo, per Secret created and per change of the control
//! plane's `Initialized`/`Available` conditions), with times relative to the
//! clock's origin (the controller's start for the bring-up, the mark for the
//! remediation).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::api::condition_names::{AVAILABLE, INITIALIZED};
use crate::api::names::{
    DELETING_CONDITION, HEALTH_CHECK_SUCCEEDED_CONDITION, OWNER_REMEDIATED_CONDITION,
    PRE_TERMINATE_HOOK_ANNOTATION, REMEDIATION_FOR_ANNOTATION,
};
use crate::api::{KThreesControlPlane, Machine};

use super::DemoError;

/// Relative timestamps from one origin.
#[derive(Clone, Default)]
pub(super) struct Clock(Arc<OnceLock<Instant>>);

impl Clock {
    pub(super) fn start(&self) {
        let _ = self.0.set(Instant::now());
    }

    pub(super) fn elapsed(&self) -> Duration {
        self.0.get().map(Instant::elapsed).unwrap_or_default()
    }

    pub(super) fn stamp(&self) -> String {
        format!("[{:6.2}s]", self.elapsed().as_secs_f64())
    }
}

pub(super) fn secs(d: Duration) -> String {
    format!("{:.2}s", d.as_secs_f64())
}

pub(super) fn say(text: impl AsRef<str>) {
    println!("{}", text.as_ref());
}

// ---------------------------------------------------------------------------
// The timeline: one line per new Event and per Machine change.

/// The watch tasks; aborted on drop. `events` records (time, reason, note) of
/// each Event, (time, `Machine/created` or `Machine/deleted`, name) of
/// Machines coming and going, (time, `Secret/created`, name) of Secrets and
/// (time, `Condition/<type>`, `<status> (<reason>): <message>`) of the
/// control plane's conditions.
pub(super) struct Timeline {
    tasks: Vec<JoinHandle<()>>,
    events: Arc<Mutex<Vec<(Duration, String, String)>>>,
}

impl Drop for Timeline {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

pub(super) const MACHINE_CREATED: &str = "Machine/created";
pub(super) const MACHINE_DELETED: &str = "Machine/deleted";
pub(super) const SECRET_CREATED: &str = "Secret/created";

/// The record kind of a change of the control plane's condition `type_`.
pub(super) fn condition_record(type_: &str) -> String {
    format!("Condition/{type_}")
}

/// What the timeline watches besides Events and Machines.
#[derive(Clone, Copy)]
pub(super) struct Watches {
    /// Secrets created (their names and owner, never their content).
    pub secrets: bool,
    /// The KThreesControlPlanes' `Initialized` and `Available` conditions.
    pub control_planes: bool,
}

impl Watches {
    pub(super) const EVENTS_AND_MACHINES: Watches = Watches {
        secrets: false,
        control_planes: false,
    };
    pub(super) const ALL: Watches = Watches {
        secrets: true,
        control_planes: true,
    };
}

type Records = Arc<Mutex<Vec<(Duration, String, String)>>>;

fn push(recorded: &Records, at: Duration, what: &str, note: String) {
    recorded
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((at, what.to_string(), note));
}

impl Timeline {
    /// The first record of `what` (an Event reason, or [`MACHINE_CREATED`] /
    /// [`MACHINE_DELETED`]) whose note satisfies `matches`: when, and the note.
    pub(super) fn first(
        &self,
        what: &str,
        matches: impl Fn(&str) -> bool,
    ) -> Option<(Duration, String)> {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|(_, r, note)| r == what && matches(note))
            .map(|(t, _, note)| (*t, note.clone()))
    }
}

fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    <K as kube::Resource>::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Watch Events (events.k8s.io/v1) and Machines in `namespace` (all when
/// `None`), and what `watches` adds; returns once every watch has listed what
/// exists (that is not printed: only what happens afterwards).
pub(super) async fn start_timeline(
    client: Client,
    namespace: Option<&str>,
    clock: Clock,
    watches: Watches,
) -> Result<Timeline, DemoError> {
    let recorded: Records = Arc::new(Mutex::new(Vec::new()));
    let mut ready = Vec::new();
    let mut synced = || {
        let (tx, rx) = oneshot::channel();
        ready.push(rx);
        tx
    };
    let mut tasks = vec![
        tokio::spawn(watch_events(
            api(&client, namespace),
            clock.clone(),
            recorded.clone(),
            synced(),
        )),
        tokio::spawn(watch_machines(
            api(&client, namespace),
            clock.clone(),
            recorded.clone(),
            synced(),
        )),
    ];
    if watches.secrets {
        tasks.push(tokio::spawn(watch_secrets(
            api(&client, namespace),
            clock.clone(),
            recorded.clone(),
            synced(),
        )));
    }
    if watches.control_planes {
        tasks.push(tokio::spawn(watch_control_planes(
            api(&client, namespace),
            clock.clone(),
            recorded.clone(),
            synced(),
        )));
    }
    let timeline = Timeline {
        tasks,
        events: recorded,
    };
    let all_synced = async {
        for rx in ready {
            let _ = rx.await;
        }
    };
    tokio::time::timeout(Duration::from_secs(20), all_synced)
        .await
        .map_err(|_| DemoError::Failed("watching Events and Machines did not start".into()))?;
    Ok(timeline)
}

/// One line per Secret created: its name, type and controlling owner. Never
/// its content.
async fn watch_secrets(
    api: Api<Secret>,
    clock: Clock,
    recorded: Records,
    synced: oneshot::Sender<()>,
) {
    let mut synced = Some(synced);
    let mut initial = true;
    let mut known: std::collections::HashSet<String> = Default::default();
    let mut stream = watcher(api, watcher::Config::default()).boxed();
    while let Some(item) = stream.next().await {
        let secret = match item {
            Ok(watcher::Event::Init) => continue,
            Ok(watcher::Event::InitDone) => {
                initial = false;
                if let Some(tx) = synced.take() {
                    let _ = tx.send(());
                }
                continue;
            }
            Ok(watcher::Event::InitApply(s)) if initial && synced.is_some() => {
                known.insert(s.name_any());
                continue;
            }
            Ok(watcher::Event::InitApply(s) | watcher::Event::Apply(s)) => s,
            Ok(watcher::Event::Delete(s)) => {
                known.remove(&s.name_any());
                continue;
            }
            Err(err) => {
                tracing::debug!(%err, "secret watch");
                continue;
            }
        };
        let name = secret.name_any();
        if !known.insert(name.clone()) {
            continue;
        }
        let owner = secret
            .owner_references()
            .iter()
            .find(|o| o.controller == Some(true))
            .map(|o| format!(", owned by {} {}", o.kind, o.name))
            .unwrap_or_default();
        say(format!(
            "{} Secret {name}: created (type {}{owner})",
            clock.stamp(),
            secret.type_.as_deref().unwrap_or("Opaque")
        ));
        push(&recorded, clock.elapsed(), SECRET_CREATED, name);
    }
}

/// One line per change of a KThreesControlPlane's `Initialized` or
/// `Available` condition (status, reason or message).
async fn watch_control_planes(
    api: Api<KThreesControlPlane>,
    clock: Clock,
    recorded: Records,
    synced: oneshot::Sender<()>,
) {
    let mut synced = Some(synced);
    let mut initial = true;
    let mut known: HashMap<(String, &'static str), String> = HashMap::new();
    let mut stream = watcher(api, watcher::Config::default()).boxed();
    while let Some(item) = stream.next().await {
        let (kcp, quiet) = match item {
            Ok(watcher::Event::Init) | Ok(watcher::Event::Delete(_)) => continue,
            Ok(watcher::Event::InitDone) => {
                initial = false;
                if let Some(tx) = synced.take() {
                    let _ = tx.send(());
                }
                continue;
            }
            Ok(watcher::Event::InitApply(k)) => (k, initial && synced.is_some()),
            Ok(watcher::Event::Apply(k)) => (k, false),
            Err(err) => {
                tracing::debug!(%err, "control plane watch");
                continue;
            }
        };
        for type_ in [INITIALIZED, AVAILABLE] {
            let Some(c) = kcp.conditions().iter().find(|c| c.type_ == type_) else {
                continue;
            };
            let value = if c.message.is_empty() {
                format!("{} ({})", c.status, c.reason)
            } else {
                format!("{} ({}): {}", c.status, c.reason, c.message)
            };
            let previous = known.insert((kcp.name_any(), type_), value.clone());
            if quiet || previous.as_ref() == Some(&value) {
                continue;
            }
            say(format!(
                "{} KThreesControlPlane {}: {type_}={value}",
                clock.stamp(),
                kcp.name_any()
            ));
            push(&recorded, clock.elapsed(), &condition_record(type_), value);
        }
    }
}

pub(super) async fn watch_events(
    api: Api<Event>,
    clock: Clock,
    recorded: Arc<Mutex<Vec<(Duration, String, String)>>>,
    synced: oneshot::Sender<()>,
) {
    let mut synced = Some(synced);
    let mut initial = true;
    // Event name -> series count seen, so a repeat prints once per repeat.
    let mut seen: HashMap<String, i32> = HashMap::new();
    let mut stream = watcher(api, watcher::Config::default()).boxed();
    while let Some(item) = stream.next().await {
        let event = match item {
            Ok(watcher::Event::Init) => continue,
            Ok(watcher::Event::InitDone) => {
                initial = false;
                if let Some(tx) = synced.take() {
                    let _ = tx.send(());
                }
                continue;
            }
            Ok(watcher::Event::InitApply(e)) if initial && synced.is_some() => {
                seen.insert(e.name_any(), e.series.as_ref().map_or(1, |s| s.count));
                continue;
            }
            Ok(watcher::Event::InitApply(e) | watcher::Event::Apply(e)) => e,
            Ok(watcher::Event::Delete(_)) => continue,
            Err(err) => {
                tracing::debug!(%err, "event watch");
                continue;
            }
        };
        let count = event.series.as_ref().map_or(1, |s| s.count);
        let previous = seen.insert(event.name_any(), count);
        if previous.is_some_and(|p| p >= count) {
            continue;
        }
        let reason = event.reason.clone().unwrap_or_default();
        let note = event.note.clone().unwrap_or_default();
        let kind = match event.type_.as_deref() {
            Some("Warning") => "Warning ",
            _ => "",
        };
        if count > 1 {
            // A repeat in an Event series: kube's recorder groups Events by
            // reason and object (not by note) and keeps the first note, so the
            // note would name the first occurrence; say only that it repeated.
            say(format!(
                "{} {kind}{reason} again (x{count} in its Event series, which keeps the first note)",
                clock.stamp()
            ));
        } else {
            say(format!("{} {kind}{reason}: {note}", clock.stamp()));
        }
        recorded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((clock.elapsed(), reason, note));
    }
}

/// What the timeline shows of a Machine; a change in any of these is a line.
type Facets = BTreeMap<&'static str, String>;

pub(super) fn machine_facets(machine: &Machine) -> Facets {
    let mut facets = Facets::new();
    if machine.is_deleting() {
        facets.insert("deleting", String::new());
    }
    if let Some(node) = machine.node_name() {
        facets.insert("nodeRef", node.to_string());
    }
    let annotations = machine.annotations();
    if annotations.contains_key(PRE_TERMINATE_HOOK_ANNOTATION) {
        facets.insert("hook", String::new());
    }
    if let Some(record) = annotations.get(REMEDIATION_FOR_ANNOTATION) {
        let text = serde_json::from_str::<serde_json::Value>(record)
            .map(|v| {
                format!(
                    "{} (retry {})",
                    v["machine"].as_str().unwrap_or("?"),
                    v["retryCount"]
                )
            })
            .unwrap_or_else(|_| record.clone());
        facets.insert("remediationFor", text);
    }
    for type_ in [
        HEALTH_CHECK_SUCCEEDED_CONDITION,
        OWNER_REMEDIATED_CONDITION,
        DELETING_CONDITION,
    ] {
        if let Some(c) = machine.condition(type_) {
            let value = if c.reason.is_empty() {
                c.status.to_string()
            } else {
                format!("{} ({})", c.status, c.reason)
            };
            facets.insert(type_, value);
        }
    }
    facets
}

/// Phrases for what changed between two observations of one Machine.
pub(super) fn describe_changes(before: &Facets, after: &Facets) -> Vec<String> {
    let mut keys: Vec<&&str> = before.keys().chain(after.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter_map(|key| {
            let (old, new) = (before.get(*key), after.get(*key));
            if old == new {
                return None;
            }
            Some(match (*key, new) {
                ("deleting", Some(_)) => "deletion requested (deletionTimestamp set)".to_string(),
                ("deleting", None) => "no longer deleting".to_string(),
                ("hook", Some(_)) => "pre-terminate hook added (CAPI must wait for us)".to_string(),
                ("hook", None) => "pre-terminate hook released".to_string(),
                ("nodeRef", Some(node)) => format!("nodeRef -> Node {node}"),
                ("nodeRef", None) => "nodeRef cleared".to_string(),
                ("remediationFor", Some(v)) => format!("remediation-for {v}"),
                ("remediationFor", None) => "remediation-for removed".to_string(),
                (condition, Some(v)) => format!("{condition}={v}"),
                (condition, None) => format!("{condition} condition removed"),
            })
        })
        .collect()
}

pub(super) async fn watch_machines(
    api: Api<Machine>,
    clock: Clock,
    recorded: Arc<Mutex<Vec<(Duration, String, String)>>>,
    synced: oneshot::Sender<()>,
) {
    let record = |what: &str, name: String| {
        recorded.lock().unwrap_or_else(|p| p.into_inner()).push((
            clock.elapsed(),
            what.to_string(),
            name,
        ));
    };
    let mut synced = Some(synced);
    let mut initial = true;
    let mut known: HashMap<String, Facets> = HashMap::new();
    let mut stream = watcher(api, watcher::Config::default()).boxed();
    while let Some(item) = stream.next().await {
        match item {
            Ok(watcher::Event::Init) => {}
            Ok(watcher::Event::InitDone) => {
                initial = false;
                if let Some(tx) = synced.take() {
                    let _ = tx.send(());
                }
            }
            Ok(watcher::Event::InitApply(m)) if initial && synced.is_some() => {
                known.insert(key(&m), machine_facets(&m));
            }
            Ok(watcher::Event::InitApply(m) | watcher::Event::Apply(m)) => {
                let facets = machine_facets(&m);
                let line = match known.get(&key(&m)) {
                    None => {
                        record(MACHINE_CREATED, m.name_any());
                        let mut details = describe_changes(&Facets::new(), &facets);
                        details.insert(0, "created".to_string());
                        Some(details.join("; "))
                    }
                    Some(before) => {
                        let details = describe_changes(before, &facets);
                        (!details.is_empty()).then(|| details.join("; "))
                    }
                };
                if let Some(line) = line {
                    say(format!(
                        "{} Machine {}: {line}",
                        clock.stamp(),
                        m.name_any()
                    ));
                }
                known.insert(key(&m), facets);
            }
            Ok(watcher::Event::Delete(m)) => {
                known.remove(&key(&m));
                record(MACHINE_DELETED, m.name_any());
                say(format!(
                    "{} Machine {}: deleted (gone from the API)",
                    clock.stamp(),
                    m.name_any()
                ));
            }
            Err(err) => tracing::debug!(%err, "machine watch"),
        }
    }
}

pub(super) fn key(machine: &Machine) -> String {
    format!(
        "{}/{}",
        machine.namespace().unwrap_or_default(),
        machine.name_any()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facets(pairs: &[(&'static str, &str)]) -> Facets {
        pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
    }

    #[test]
    fn machine_changes_are_described_one_phrase_each() {
        let before = facets(&[("nodeRef", "cp-1"), ("HealthCheckSucceeded", "True")]);
        let after = facets(&[
            ("nodeRef", "cp-1"),
            ("HealthCheckSucceeded", "False (UnhealthyNode)"),
            ("hook", ""),
            ("deleting", ""),
        ]);
        assert_eq!(
            describe_changes(&before, &after),
            vec![
                "HealthCheckSucceeded=False (UnhealthyNode)",
                "deletion requested (deletionTimestamp set)",
                "pre-terminate hook added (CAPI must wait for us)",
            ]
        );
        assert_eq!(
            describe_changes(&after, &before),
            vec![
                "HealthCheckSucceeded=True",
                "no longer deleting",
                "pre-terminate hook released",
            ]
        );
        assert!(describe_changes(&after, &after).is_empty());
    }
}
