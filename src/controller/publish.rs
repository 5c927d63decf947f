//! Publishing Kubernetes Events about a KThreesControlPlane (best effort).
//! Which type and reason a wait gets is decided in [`crate::decision::events`].

use kube::Resource;
use kube::runtime::events::{Event, EventType};

use crate::api::KThreesControlPlane;

use super::context::Context;

/// Publish an Event on the KThreesControlPlane; a failure to publish is logged,
/// never fatal (events are best effort in Kubernetes too).
pub async fn publish(
    ctx: &Context,
    kcp: &KThreesControlPlane,
    type_: EventType,
    reason: &str,
    note: &str,
) {
    publish_about(ctx, kcp, type_, reason, note, None).await;
}

/// A reference to a Machine, as the `related` object of an Event.
pub fn machine_ref(namespace: &str, name: &str) -> k8s_openapi::api::core::v1::ObjectReference {
    k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("cluster.x-k8s.io/v1beta2".into()),
        kind: Some("Machine".into()),
        name: Some(name.to_string()),
        namespace: Some(namespace.to_string()),
        ..Default::default()
    }
}

/// [`publish`] with a related object (a Machine, a Secret): Events about
/// different objects are kept apart instead of folded into one series.
pub async fn publish_about(
    ctx: &Context,
    kcp: &KThreesControlPlane,
    type_: EventType,
    reason: &str,
    note: &str,
    related: Option<k8s_openapi::api::core::v1::ObjectReference>,
) {
    let event = Event {
        type_,
        reason: reason.to_string(),
        note: Some(truncate(note, 1000)),
        action: reason.to_string(),
        secondary: related,
    };
    if let Err(err) = ctx.recorder.publish(&event, &kcp.object_ref(&())).await {
        tracing::warn!(%err, reason, "could not publish event");
    }
}

fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}
