//! Injected write faults, a test hook: the next writes of a resource are
//! answered with an error instead of being carried out.
//!
//! A write is a create (POST), an update (PUT, also of `/status` and `/scale`),
//! a patch (PATCH, also of subresources) or a delete of one object (DELETE);
//! reads, watches and DELETE of a collection never consume a fault. A pending
//! fault is consumed by the first such request to any object of the resource
//! (every namespace, every served version), answered before the request is
//! looked at (no lookup, no validation) and never applied: no revision, no
//! watch event. Concurrent writers: exactly one request takes each fault.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use super::error::{ApiError, Subject};
use super::resource::ResourceDef;
use super::store::ResKey;

/// The status codes a fault can answer with.
pub const SUPPORTED_CODES: &[u16] = &[409, 500];

/// What kind of write consumed a fault (decides the real error for a 409).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Write {
    Create,
    Update,
    Patch,
    Delete,
}

/// Pending faults per resource, in the order they were injected.
#[derive(Default)]
pub struct Faults {
    pending: Mutex<HashMap<ResKey, VecDeque<u16>>>,
}

impl Faults {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ResKey, VecDeque<u16>>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queue `n` faults answering `code` for the next writes of `res`.
    pub fn push(&self, res: ResKey, code: u16, n: usize) {
        assert!(
            SUPPORTED_CODES.contains(&code),
            "fail_next_write: status {code} is not supported (supported: {SUPPORTED_CODES:?})"
        );
        self.lock()
            .entry(res)
            .or_default()
            .extend(std::iter::repeat_n(code, n));
    }

    /// Faults still pending for `res`.
    pub fn pending(&self, res: &ResKey) -> usize {
        self.lock().get(res).map_or(0, VecDeque::len)
    }

    /// Take the next fault of `def` for this write, as the error to answer
    /// (`name` is asked only then).
    pub fn take(
        &self,
        def: &ResourceDef,
        write: Write,
        name: impl FnOnce() -> String,
    ) -> Option<ApiError> {
        let code = self.lock().get_mut(&ResKey::of(def))?.pop_front()?;
        Some(error(def, write, &name(), code))
    }
}

/// The error a real server gives for `code` on this write.
fn error(def: &ResourceDef, write: Write, name: &str, code: u16) -> ApiError {
    match (code, write) {
        // The only 409 a real create gets: someone else created it first.
        (409, Write::Create) => ApiError::AlreadyExists(Subject::resource(def, name)),
        // The optimistic-lock failure of `Store.Update`/`GuaranteedUpdate`.
        (409, _) => ApiError::Conflict(
            Subject::resource(def, name),
            "the object has been modified; please apply your changes to the latest version and try again".into(),
        ),
        _ => ApiError::InternalError("injected fault (test API server)".into()),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
    use serde_json::json;

    use crate::apiserver::TestApiServer;

    async fn server() -> TestApiServer {
        TestApiServer::builder()
            .with_core_resources()
            .start()
            .await
            .unwrap()
    }

    fn config_map(name: &str, value: &str) -> ConfigMap {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.into());
        cm.data = Some([("key".to_string(), value.to_string())].into());
        cm
    }

    fn status_of<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> Box<kube::core::Status> {
        match r {
            Err(kube::Error::Api(s)) => s,
            other => panic!("expected an API error, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn each_write_verb_takes_one_fault_and_changes_nothing() {
        let server = server().await;
        let cms: Api<ConfigMap> = Api::default_namespaced(server.client());
        let created = cms
            .create(&PostParams::default(), &config_map("cm", "a"))
            .await
            .unwrap();
        let conflict = "Operation cannot be fulfilled on configmaps \"cm\": the object has been modified; please apply your changes to the latest version and try again";
        let patch = Patch::Merge(json!({"data": {"key": "b"}}));
        for verb in ["update", "patch", "delete"] {
            server.fail_next_write("configmaps", 409);
            let rv = server.resource_version();
            let result = match verb {
                "update" => cms
                    .replace("cm", &PostParams::default(), &created)
                    .await
                    .map(drop),
                "patch" => cms
                    .patch("cm", &PatchParams::default(), &patch)
                    .await
                    .map(drop),
                _ => cms.delete("cm", &DeleteParams::default()).await.map(drop),
            };
            let status = status_of(result);
            assert_eq!(
                (status.code, status.reason.as_str()),
                (409, "Conflict"),
                "{verb}"
            );
            assert_eq!(status.message, conflict, "{verb}");
            let details = status.details.expect("Conflict carries details");
            assert_eq!(
                (details.name.as_str(), details.kind.as_str()),
                ("cm", "configmaps")
            );
            assert_eq!(server.resource_version(), rv, "{verb}: nothing was written");
            assert_eq!(server.pending_write_faults("configmaps"), 0);
            let stored = cms.get("cm").await.unwrap();
            assert_eq!(
                stored.metadata.resource_version,
                created.metadata.resource_version
            );
        }
        // The next write is carried out.
        let patched = cms
            .patch("cm", &PatchParams::default(), &patch)
            .await
            .unwrap();
        assert_eq!(patched.data.unwrap()["key"], "b");
    }

    #[tokio::test]
    async fn a_create_fault_is_already_exists_and_creates_nothing() {
        let server = server().await;
        let secrets: Api<Secret> = Api::default_namespaced(server.client());
        let mut secret = Secret::default();
        secret.metadata.name = Some("s".into());
        server.fail_next_writes("Secret", 409, 2);
        for _ in 0..2 {
            let status = status_of(secrets.create(&PostParams::default(), &secret).await);
            assert_eq!(
                (status.code, status.reason.as_str()),
                (409, "AlreadyExists")
            );
            assert_eq!(status.message, "secrets \"s\" already exists");
            assert!(secrets.get_opt("s").await.unwrap().is_none());
        }
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn faults_hit_only_writes_of_their_resource_and_queue_in_order() {
        let server = server().await;
        let cms: Api<ConfigMap> = Api::default_namespaced(server.client());
        let secrets: Api<Secret> = Api::default_namespaced(server.client());
        cms.create(&PostParams::default(), &config_map("cm", "a"))
            .await
            .unwrap();
        server.fail_next_write("configmaps", 500);
        server.fail_next_write("configmaps", 409);
        // Reads, lists and other resources do not take them.
        cms.get("cm").await.unwrap();
        cms.list(&Default::default()).await.unwrap();
        let mut secret = Secret::default();
        secret.metadata.name = Some("s".into());
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
        assert_eq!(server.pending_write_faults("configmaps"), 2);
        let patch = Patch::Merge(json!({"data": {"key": "b"}}));
        let first = status_of(cms.patch("cm", &PatchParams::default(), &patch).await);
        assert_eq!((first.code, first.reason.as_str()), (500, "InternalError"));
        assert!(first.message.starts_with("Internal error occurred: "));
        let second = status_of(cms.patch("cm", &PatchParams::default(), &patch).await);
        assert_eq!(second.code, 409);
        cms.patch("cm", &PatchParams::default(), &patch)
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn resources_are_named_by_plural_group_plural_or_kind() {
        let server = server().await;
        for (queued, name) in ["leases.coordination.k8s.io", "leases", "Lease"]
            .into_iter()
            .enumerate()
        {
            server.fail_next_write(name, 409);
            assert_eq!(server.pending_write_faults("leases"), queued + 1, "{name}");
        }
        // "events" is the core group's plural.group: core v1 Event, not events.k8s.io.
        server.fail_next_write("events", 409);
        assert_eq!(server.pending_write_faults("events"), 1);
        assert_eq!(server.pending_write_faults("events.events.k8s.io"), 0);
        let panics = |name: &str, code: u16| {
            let server = std::panic::AssertUnwindSafe(&server);
            std::panic::catch_unwind(|| server.fail_next_write(name, code)).is_err()
        };
        assert!(
            panics("Event", 409),
            "core and events.k8s.io Event are both Kind Event"
        );
        assert!(panics("widgets", 409), "not served");
        assert!(panics("secrets", 418), "not a supported code");
    }
}
