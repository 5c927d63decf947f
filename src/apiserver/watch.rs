//! Watch streams: newline-delimited JSON `WatchEvent`s from the store's history, with
//! selectors, bookmarks, timeouts and 410 Gone for compacted revisions.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::error::ApiError;
use super::resource::ResourceDef;
use super::selector::{FieldSelector, LabelSelector};
use super::store::{EventType, ResKey, Store, StoredEvent, WatchStart};

/// What one watch request asked for.
pub struct WatchRequest {
    pub def: ResourceDef,
    pub version: String,
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub resource_version: Option<String>,
    pub bookmarks: bool,
    pub send_initial_events: bool,
    pub timeout: Duration,
    /// Send `PartialObjectMetadata` instead of whole objects.
    pub metadata_only: bool,
}

/// Server-wide watch settings and signals.
#[derive(Clone)]
pub struct WatchContext {
    pub store: Arc<Store>,
    pub bookmark_interval: Duration,
    /// Cancelled on server shutdown: every stream ends.
    pub shutdown: CancellationToken,
    /// Bumped by `expire_watches`: every open stream ends with 410 Gone.
    pub expiry: tokio::sync::watch::Receiver<u64>,
}

/// Start a watch: the body streams events until timeout, shutdown, expiry or client disconnect.
/// A too-old resourceVersion is reported in the stream (an ERROR event with 410 Gone, as the
/// real server's watch cache does); other bad requests are answered before streaming.
pub fn start(ctx: WatchContext, req: WatchRequest) -> Result<Body, ApiError> {
    // Subscribe before reading the start point so no later revision is missed.
    let revisions = ctx.store.subscribe();
    let mut expiry = ctx.expiry.clone();
    expiry.borrow_and_update();
    let start = ctx.store.watch_start(
        &req.def,
        req.namespace.as_deref(),
        req.resource_version.as_deref(),
        req.send_initial_events,
    );
    let start = match start {
        Err(err) if err.code() != 410 => return Err(err),
        other => other,
    };
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(256);
    tokio::spawn(run(ctx, req, start, revisions, expiry, tx));
    Ok(Body::from_stream(
        tokio_stream::wrappers::ReceiverStream::new(rx),
    ))
}

async fn run(
    ctx: WatchContext,
    req: WatchRequest,
    start: Result<WatchStart, ApiError>,
    mut revisions: tokio::sync::watch::Receiver<u64>,
    mut expiry: tokio::sync::watch::Receiver<u64>,
    tx: mpsc::Sender<Result<Bytes, Infallible>>,
) {
    let deadline = tokio::time::sleep(req.timeout);
    tokio::pin!(deadline);
    let res = ResKey::of(&req.def);
    let mut bookmark_tick = tokio::time::interval(ctx.bookmark_interval);
    bookmark_tick.reset();

    let mut position = match start {
        Err(err) => {
            let _ = send(&tx, error_event(&err)).await;
            return;
        }
        Ok(WatchStart::From(rv)) => rv,
        Ok(WatchStart::Snapshot { objects, rv }) => {
            for stored in objects {
                let obj = match shown_if(&ctx.store, &req, &stored, |o| matches(&req, o)) {
                    Ok(Some(obj)) => obj,
                    Ok(None) => continue,
                    Err(err) => {
                        let _ = send(&tx, error_event(&err)).await;
                        return;
                    }
                };
                if !send(&tx, event("ADDED", presented(&req, obj))).await {
                    return;
                }
            }
            if req.send_initial_events && req.bookmarks {
                let mut mark = bookmark(&req, rv);
                mark["object"]["metadata"]["annotations"] =
                    json!({"k8s.io/initial-events-end": "true"});
                if !send(&tx, mark).await {
                    return;
                }
            }
            rv
        }
    };

    loop {
        revisions.borrow_and_update();
        match ctx.store.events_since(position) {
            Err(err) => {
                let _ = send(&tx, error_event(&err)).await;
                return;
            }
            Ok((events, newest)) => {
                for ev in events.iter().filter(|e| e.res == res) {
                    let line = match translate(&ctx.store, &req, ev) {
                        Ok(Some(line)) => line,
                        Ok(None) => continue,
                        // The real watch ends with an ERROR when an object
                        // cannot be decoded into its version; clients re-list.
                        Err(err) => {
                            let _ = send(&tx, error_event(&err)).await;
                            return;
                        }
                    };
                    if !send(&tx, line).await {
                        return;
                    }
                }
                position = newest;
            }
        }
        tokio::select! {
            changed = revisions.changed() => if changed.is_err() { return },
            _ = bookmark_tick.tick(), if req.bookmarks => {
                if !send(&tx, bookmark(&req, position)).await {
                    return;
                }
            }
            _ = expiry.changed() => {
                let err = ApiError::Gone(format!("too old resource version: {position} ({})", ctx.store.current_rv()));
                let _ = send(&tx, error_event(&err)).await;
                return;
            }
            _ = &mut deadline => return,
            _ = ctx.shutdown.cancelled() => return,
            _ = tx.closed() => return,
        }
    }
}

fn matches(req: &WatchRequest, obj: &Value) -> bool {
    let ns_ok = req
        .namespace
        .as_deref()
        .is_none_or(|ns| obj.pointer("/metadata/namespace").and_then(Value::as_str) == Some(ns));
    ns_ok && req.labels.matches(obj) && req.fields.matches(obj)
}

/// The event a watcher with these selectors sees for a stored event, as the real server:
/// an object that starts matching arrives as ADDED, one that stops matching as DELETED.
/// Selectors see the objects in the watch's version.
fn translate(
    store: &Store,
    req: &WatchRequest,
    ev: &StoredEvent,
) -> Result<Option<Value>, ApiError> {
    let before = match &ev.prev {
        Some(prev) => shown_if(store, req, prev, |o| matches(req, o))?.is_some(),
        None => false,
    };
    // One that matched is sent whatever it is now (it may go as DELETED).
    let object = if before {
        shown_if(store, req, &ev.object, |_| true)?
    } else {
        shown_if(store, req, &ev.object, |o| matches(req, o))?
    };
    let Some(object) = object else {
        return Ok(None);
    };
    let now = !before || matches(req, &object);
    let kind = match ev.kind {
        EventType::Added => now.then_some("ADDED"),
        EventType::Deleted => (now || before).then_some("DELETED"),
        EventType::Modified => match (before, now) {
            (true, true) => Some("MODIFIED"),
            (false, true) => Some("ADDED"),
            (true, false) => Some("DELETED"),
            (false, false) => None,
        },
    };
    Ok(kind.map(|kind| event(kind, presented(req, object))))
}

/// A stored object in the watch's version if `keep` accepts it there (see
/// `Store::shown_if`); one outside the watch's namespace is never converted
/// (nothing of it is sent).
fn shown_if(
    store: &Store,
    req: &WatchRequest,
    stored: &Value,
    keep: impl Fn(&Value) -> bool,
) -> Result<Option<Value>, ApiError> {
    let namespace = stored
        .pointer("/metadata/namespace")
        .and_then(Value::as_str);
    if req
        .namespace
        .as_deref()
        .is_some_and(|ns| Some(ns) != namespace)
    {
        return Ok(None);
    }
    store.shown_if(&req.def, &req.version, stored, keep)
}

/// The `meta.k8s.io/v1` PartialObjectMetadata view of an object.
pub fn partial_object(obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or(json!({})),
    })
}

/// The object (already in the watch's version) as this watch shows it: whole, or
/// only its metadata.
fn presented(req: &WatchRequest, obj: Value) -> Value {
    if req.metadata_only {
        partial_object(&obj)
    } else {
        obj
    }
}

fn event(kind: &str, object: Value) -> Value {
    json!({"type": kind, "object": object})
}

fn bookmark(req: &WatchRequest, rv: u64) -> Value {
    event(
        "BOOKMARK",
        json!({
            "kind": req.def.kind,
            "apiVersion": req.def.api_version(&req.version),
            "metadata": {"resourceVersion": rv.to_string()},
        }),
    )
}

fn error_event(err: &ApiError) -> Value {
    event("ERROR", err.to_status())
}

async fn send(tx: &mpsc::Sender<Result<Bytes, Infallible>>, value: Value) -> bool {
    let mut line = serde_json::to_vec(&value).expect("JSON values always serialize");
    line.push(b'\n');
    tx.send(Ok(Bytes::from(line))).await.is_ok()
}
