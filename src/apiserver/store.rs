//! The object store: one revision counter per server (like etcd), objects as JSON, and a bounded event history.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{Value, json};

use super::builtin;
use super::conversion::Converters;
use super::error::{ApiError, Subject};
use super::meta::{self, meta_mut, meta_str};
use super::patch::PatchKind;
use super::resource::{Registry, ResourceDef};
use super::selector::{FieldSelector, LabelSelector};

/// Identifies a resource's storage: all versions of one group/plural share it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResKey {
    pub group: String,
    pub plural: String,
}

impl ResKey {
    pub fn of(def: &ResourceDef) -> Self {
        Self {
            group: def.group.clone(),
            plural: def.plural.clone(),
        }
    }
}

/// `(namespace, name)`; the namespace is empty for cluster-scoped objects.
pub type ObjKey = (String, String);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

/// One committed change, kept in the history for watches.
#[derive(Debug)]
pub struct StoredEvent {
    pub rv: u64,
    pub res: ResKey,
    pub kind: EventType,
    pub object: Value,
    /// The object before a modification (to tell when it stops or starts matching a selector).
    pub prev: Option<Value>,
}

/// Which part of an object a write may change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Main,
    Status,
}

/// How a deletion treats the object's dependents (`propagationPolicy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Propagation {
    /// Delete the object now; the garbage collector deletes dependents afterwards.
    #[default]
    Background,
    /// Keep the object (finalizer `foregroundDeletion`) until blocking dependents are gone.
    Foreground,
    /// Delete the object; dependents stay and lose the owner reference.
    Orphan,
}

/// The finalizer of an owner waiting for its dependents (foreground deletion).
const FOREGROUND: &str = "foregroundDeletion";

/// Options of a DELETE.
#[derive(Clone, Debug, Default)]
pub struct DeleteOptions {
    pub propagation: Propagation,
    pub precondition_uid: Option<String>,
    pub precondition_rv: Option<String>,
}

/// Which objects a list returns, and which page of them.
#[derive(Clone, Copy, Debug)]
pub struct ListQuery<'a> {
    pub labels: &'a LabelSelector,
    pub fields: &'a FieldSelector,
    /// Page size; `None` or 0 returns everything.
    pub limit: Option<usize>,
    pub continue_token: Option<&'a str>,
}

/// A page of a list.
#[derive(Debug)]
pub struct ListPage {
    pub items: Vec<Value>,
    pub resource_version: u64,
    pub continue_token: Option<String>,
    pub remaining: Option<usize>,
}

/// Where a watch starts reading the history.
pub enum WatchStart {
    /// Current objects (as synthetic ADDED events), then changes after `rv`.
    Snapshot { objects: Vec<Value>, rv: u64 },
    /// Changes after `rv` only.
    From(u64),
}

const NAMESPACES: (&str, &str) = ("", "namespaces");

struct State {
    rv: u64,
    objects: HashMap<ResKey, BTreeMap<ObjKey, Value>>,
    history: VecDeque<Arc<StoredEvent>>,
    history_limit: usize,
    /// Every event with `rv > compacted` is in `history`.
    compacted: u64,
    /// Uids deleted with `propagationPolicy=Orphan` that still wait on finalizers.
    orphan_on_delete: HashSet<String>,
}

/// Thread-safe store shared by the HTTP handlers and the watch streams. Each
/// object is kept once, in its resource's storage version; every method takes
/// and returns objects in the version of the request (`version`).
pub struct Store {
    state: Mutex<State>,
    registry: Registry,
    converters: Converters,
    revision: tokio::sync::watch::Sender<u64>,
}

/// An object as stored, and as the request's version shows it (the same
/// object, but for `apiVersion`, unless the resource converts its shape).
struct Current {
    stored: Value,
    shown: Value,
}

impl Store {
    pub fn new(registry: Registry, converters: Converters, history_limit: usize) -> Self {
        let mut objects = HashMap::new();
        for def in registry.all() {
            objects.insert(ResKey::of(def), BTreeMap::new());
        }
        let store = Self {
            state: Mutex::new(State {
                rv: 1,
                objects,
                history: VecDeque::new(),
                history_limit: history_limit.max(1),
                compacted: 1,
                orphan_on_delete: HashSet::new(),
            }),
            registry,
            converters,
            revision: tokio::sync::watch::channel(1).0,
        };
        store.seed_namespaces();
        store
    }

    /// A fresh cluster has these namespaces.
    fn seed_namespaces(&self) {
        let Some(def) = self
            .registry
            .find(NAMESPACES.0, "v1", NAMESPACES.1)
            .cloned()
        else {
            return;
        };
        for name in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            let obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
            self.create(&def, "v1", None, obj)
                .expect("seeding a fresh store cannot conflict");
        }
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// A stored object as `version` of `def` shows it.
    pub fn shown(
        &self,
        def: &ResourceDef,
        version: &str,
        stored: Value,
    ) -> Result<Value, ApiError> {
        self.converters.convert(def, stored, version)
    }

    /// A stored object as `version` of `def` shows it, if `keep` accepts it
    /// there. Where only `apiVersion` would change, `keep` judges the stored
    /// object, so what it refuses is never copied (lists and watches filter
    /// many objects).
    pub fn shown_if(
        &self,
        def: &ResourceDef,
        version: &str,
        stored: &Value,
        keep: impl Fn(&Value) -> bool,
    ) -> Result<Option<Value>, ApiError> {
        if self.converters.changes_shape(def, version) {
            let shown = self.shown(def, version, stored.clone())?;
            return Ok(keep(&shown).then_some(shown));
        }
        if !keep(stored) {
            return Ok(None);
        }
        self.shown(def, version, stored.clone()).map(Some)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic in another handler must not take the whole test server down.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Subscribe to revision changes (the value is the newest revision).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.revision.subscribe()
    }

    pub fn current_rv(&self) -> u64 {
        self.lock().rv
    }

    /// Drop all history: any watch from an older revision now gets 410 Gone.
    pub fn compact(&self) {
        let mut st = self.lock();
        st.history.clear();
        st.compacted = st.rv;
    }

    pub fn create(
        &self,
        def: &ResourceDef,
        version: &str,
        ns: Option<&str>,
        mut obj: Value,
    ) -> Result<Value, ApiError> {
        check_type(def, version, &obj)?;
        if meta_str(&obj, "resourceVersion")
            .and_then(|rv| rv.parse::<u64>().ok())
            .is_some_and(|rv| rv != 0)
        {
            return Err(ApiError::Internal(
                "resourceVersion should not be set on objects to be created".into(),
            ));
        }
        let ns = object_namespace(def, ns, &obj)?;
        let mut st = self.lock();
        let res = ResKey::of(def);
        let name = match meta_str(&obj, "name") {
            Some(n) => n.to_string(),
            None => match meta_str(&obj, "generateName") {
                Some(prefix) => {
                    let prefix = prefix.to_string();
                    let taken = |n: &str| {
                        st.objects
                            .get(&res)
                            .is_some_and(|m| m.contains_key(&(ns.clone(), n.to_string())))
                    };
                    let mut name = format!("{prefix}{}", meta::name_suffix());
                    while taken(&name) {
                        name = format!("{prefix}{}", meta::name_suffix());
                    }
                    name
                }
                None => {
                    return Err(ApiError::Invalid {
                        subject: Box::new(Subject::kind(def, "")),
                        field: "metadata.name".into(),
                        detail: "Required value: name or generateName is required".into(),
                    });
                }
            },
        };
        if let Some(why) = meta::invalid_name(&name) {
            return Err(ApiError::Invalid {
                subject: Box::new(Subject::kind(def, &name)),
                field: "metadata.name".into(),
                detail: why,
            });
        }
        if def.namespaced()
            && st.objects.contains_key(&ns_key())
            && !st.objects[&ns_key()].contains_key(&(String::new(), ns.clone()))
        {
            return Err(ApiError::NotFound(Subject {
                group: String::new(),
                kind: "namespaces".into(),
                qualified: "namespaces".into(),
                name: ns.clone(),
            }));
        }
        let terminating = st
            .objects
            .get(&ns_key())
            .and_then(|m| m.get(&(String::new(), ns.clone())))
            .is_some_and(|n| meta_str(n, "deletionTimestamp").is_some());
        if def.namespaced() && terminating {
            return Err(ApiError::Forbidden(
                Subject::resource(def, &name),
                format!(
                    "unable to create new content in namespace {ns} because it is being terminated"
                ),
            ));
        }
        let key = (ns.clone(), name.clone());
        let rv = st.rv + 1;
        builtin::normalize(&res, &mut obj);
        obj["apiVersion"] = json!(def.api_version(version));
        obj["kind"] = json!(def.kind);
        if def.status {
            obj.as_object_mut()
                .expect("checked object")
                .remove("status");
        }
        if (res.group.as_str(), res.plural.as_str()) == NAMESPACES {
            meta::set_path(&mut obj, "status.phase", json!("Active"));
        }
        let m = meta_mut(&mut obj);
        m.insert("name".into(), json!(name));
        if def.namespaced() {
            m.insert("namespace".into(), json!(ns));
        } else {
            m.remove("namespace");
        }
        for server_owned in [
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
        ] {
            m.remove(server_owned);
        }
        m.insert("uid".into(), json!(meta::new_uid()));
        m.insert("creationTimestamp".into(), json!(meta::now_timestamp()));
        m.insert("generation".into(), json!(1));
        m.insert("resourceVersion".into(), json!(rv.to_string()));
        // Converted when written, as the real storage encodes it (a conversion
        // failure comes before AlreadyExists there too).
        let stored = self.converters.to_storage(def, obj)?;
        if st.objects.get(&res).is_some_and(|m| m.contains_key(&key)) {
            return Err(ApiError::AlreadyExists(Subject::resource(def, &name)));
        }
        st.objects
            .entry(res.clone())
            .or_default()
            .insert(key, stored.clone());
        self.record(&mut st, res, EventType::Added, stored.clone(), None);
        drop(st);
        self.shown(def, version, stored)
    }

    pub fn get(
        &self,
        def: &ResourceDef,
        version: &str,
        ns: Option<&str>,
        name: &str,
    ) -> Result<Value, ApiError> {
        let stored = lookup(&self.lock(), def, ns, name)?.clone();
        self.shown(def, version, stored)
    }

    pub fn list(
        &self,
        def: &ResourceDef,
        version: &str,
        ns: Option<&str>,
        query: &ListQuery<'_>,
    ) -> Result<ListPage, ApiError> {
        let ListQuery {
            labels,
            fields,
            limit,
            continue_token,
        } = *query;
        let st = self.lock();
        let start_after = match continue_token.filter(|t| !t.is_empty()) {
            Some(token) => Some(
                token
                    .split_once('/')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .ok_or_else(|| {
                        ApiError::BadRequest(format!("invalid continue token {token:?}"))
                    })?,
            ),
            None => None,
        };
        let empty = BTreeMap::new();
        let all = st.objects.get(&ResKey::of(def)).unwrap_or(&empty);
        // Selectors see the object in the version asked for (selectable fields
        // are per version); one object that cannot be converted fails the list.
        let mut matching: Vec<(&ObjKey, Value)> = Vec::new();
        for (key, stored) in all
            .iter()
            .filter(|(k, _)| ns.is_none_or(|n| k.0 == n))
            .filter(|(k, _)| start_after.as_ref().is_none_or(|after| *k > after))
        {
            if let Some(shown) = self.shown_if(def, version, stored, |o| {
                labels.matches(o) && fields.matches(o)
            })? {
                matching.push((key, shown));
            }
        }
        let limit = limit.filter(|l| *l > 0).unwrap_or(usize::MAX);
        let (page, rest) = matching.split_at(matching.len().min(limit));
        let continue_token = (!rest.is_empty()).then(|| {
            let (last_key, _) = page
                .last()
                .expect("a non-empty rest implies a non-empty page");
            format!("{}/{}", last_key.0, last_key.1)
        });
        Ok(ListPage {
            items: page.iter().map(|(_, v)| v.clone()).collect(),
            resource_version: st.rv,
            continue_token,
            remaining: (!rest.is_empty()).then_some(rest.len()),
        })
    }

    /// PUT: replace the object (or only its status).
    pub fn replace(
        &self,
        def: &ResourceDef,
        version: &str,
        ns: Option<&str>,
        name: &str,
        body: Value,
        target: Target,
    ) -> Result<Value, ApiError> {
        check_type(def, version, &body)?;
        if let Some(body_name) = meta_str(&body, "name")
            && body_name != name
        {
            return Err(ApiError::BadRequest(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        if def.namespaced()
            && let (Some(body_ns), Some(url_ns)) = (meta_str(&body, "namespace"), ns)
            && body_ns != url_ns
        {
            return Err(ApiError::BadRequest(
                "the namespace of the provided object does not match the namespace sent on the request".into(),
            ));
        }
        let mut st = self.lock();
        let stored = lookup(&st, def, ns, name)?.clone();
        // As the generic registry's Update: without a resourceVersion the write
        // is unconditional only where the strategy allows it (built-ins); for a
        // custom resource (or a Lease) it is Invalid. The error names the
        // resource (plural) where other Invalid errors name the Kind: upstream
        // builds it from the qualified resource.
        if body_resource_version(&body).is_none() && !def.unconditional_update {
            return Err(ApiError::Invalid {
                subject: Box::new(Subject::resource(def, name)),
                field: "metadata.resourceVersion".into(),
                detail: "Invalid value: 0x0: must be specified for an update".into(),
            });
        }
        let current = Current {
            shown: self.shown(def, version, stored.clone())?,
            stored,
        };
        let out = self.commit_update(&mut st, def, &current, body, target)?;
        drop(st);
        self.shown(def, version, out)
    }

    /// PATCH: apply the patch to the stored object, then write it like a PUT.
    /// An apply patch of an absent object creates it.
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &self,
        def: &ResourceDef,
        version: &str,
        ns: Option<&str>,
        name: &str,
        kind: PatchKind,
        patch: &Value,
        target: Target,
    ) -> Result<(Value, bool), ApiError> {
        let mut st = self.lock();
        let stored = match lookup(&st, def, ns, name) {
            Ok(o) => o.clone(),
            Err(ApiError::NotFound(_)) if kind == PatchKind::Apply && target == Target::Main => {
                drop(st);
                let mut obj = patch.clone();
                if !obj.is_object() {
                    return Err(ApiError::BadRequest("apply body must be an object".into()));
                }
                if meta_str(&obj, "name").is_some_and(|n| n != name) {
                    return Err(ApiError::BadRequest(format!(
                        "the name of the object ({}) does not match the name on the URL ({name})",
                        meta_str(&obj, "name").unwrap_or_default()
                    )));
                }
                meta_mut(&mut obj).insert("name".into(), json!(name));
                return self.create(def, version, ns, obj).map(|o| (o, true));
            }
            Err(e) => return Err(e),
        };
        if kind == PatchKind::Apply {
            check_type(def, version, patch)?;
        }
        // The patch applies to the object as read in the request's version.
        let current = Current {
            shown: self.shown(def, version, stored.clone())?,
            stored,
        };
        let patched = kind.apply(&current.shown, patch).map_err(|e| match e {
            ApiError::Invalid { field, detail, .. } => ApiError::Invalid {
                subject: Box::new(Subject::kind(def, name)),
                field,
                detail,
            },
            other => other,
        })?;
        if !patched.is_object() {
            return Err(ApiError::BadRequest(
                "the patched object is not a JSON object".into(),
            ));
        }
        if meta_str(&patched, "name") != Some(name) {
            return Err(ApiError::BadRequest(
                "a patch may not change metadata.name".into(),
            ));
        }
        let out = self.commit_update(&mut st, def, &current, patched, target)?;
        drop(st);
        Ok((self.shown(def, version, out)?, false))
    }

    /// The write path shared by PUT and PATCH: the update is judged in the
    /// request's version ([`prepare_update`]), converted to the storage
    /// version, and committed there (no-op detection, generation, revision,
    /// event). Returns the object as stored.
    fn commit_update(
        &self,
        st: &mut State,
        def: &ResourceDef,
        current: &Current,
        new: Value,
        target: Target,
    ) -> Result<Value, ApiError> {
        let new = prepare_update(def, &current.shown, new, target)?;
        let mut new = self.converters.to_storage(def, new)?;
        let old = &current.stored;
        if new == *old {
            // The real server skips unchanged writes: no new revision, no event.
            return Ok(old.clone());
        }
        // Only a change of the stored spec counts, whatever the version written.
        if spec_part(def, &new) != spec_part(def, old) {
            meta_mut(&mut new).insert("generation".into(), json!(meta::generation(old) + 1));
        }
        let res = ResKey::of(def);
        let key = obj_key(&new);
        let being_deleted = meta_str(old, "deletionTimestamp").is_some();
        if being_deleted && meta::finalizers(&new).is_empty() {
            return Ok(self.remove(st, &res, &key, new));
        }
        let rv = st.rv + 1;
        meta_mut(&mut new).insert("resourceVersion".into(), json!(rv.to_string()));
        st.objects
            .entry(res.clone())
            .or_default()
            .insert(key, new.clone());
        self.record(st, res, EventType::Modified, new.clone(), Some(old.clone()));
        Ok(new)
    }

    fn record(
        &self,
        st: &mut State,
        res: ResKey,
        kind: EventType,
        object: Value,
        prev: Option<Value>,
    ) {
        st.rv += 1;
        let rv = st.rv;
        debug_assert_eq!(
            meta_str(&object, "resourceVersion"),
            Some(rv.to_string()).as_deref()
        );
        st.history.push_back(Arc::new(StoredEvent {
            rv,
            res,
            kind,
            object,
            prev,
        }));
        while st.history.len() > st.history_limit {
            if let Some(ev) = st.history.pop_front() {
                st.compacted = ev.rv;
            }
        }
        self.revision.send_replace(rv);
    }

    /// Where a watch from `resource_version` starts (None/"0" = current state first).
    pub fn watch_start(
        &self,
        def: &ResourceDef,
        ns: Option<&str>,
        resource_version: Option<&str>,
        send_initial: bool,
    ) -> Result<WatchStart, ApiError> {
        let st = self.lock();
        let from = resource_version.filter(|rv| !rv.is_empty() && *rv != "0");
        if from.is_none() || send_initial {
            let objects = st
                .objects
                .get(&ResKey::of(def))
                .map(|m| {
                    m.iter()
                        .filter(|(k, _)| ns.is_none_or(|n| k.0 == n))
                        .map(|(_, v)| v.clone())
                        .collect()
                })
                .unwrap_or_default();
            return Ok(WatchStart::Snapshot { objects, rv: st.rv });
        }
        let rv = parse_rv(from.unwrap_or_default())?;
        if rv < st.compacted {
            return Err(too_old(rv, st.compacted));
        }
        Ok(WatchStart::From(rv))
    }

    /// Events after `after`, or 410 Gone when some of them were already compacted away.
    pub fn events_since(&self, after: u64) -> Result<(Vec<Arc<StoredEvent>>, u64), ApiError> {
        let st = self.lock();
        if after < st.compacted {
            return Err(too_old(after, st.compacted));
        }
        let first = st.history.partition_point(|e| e.rv <= after);
        Ok((st.history.range(first..).cloned().collect(), st.rv))
    }
}

/// An update as the generic registry's strategy prepares it, on objects in the
/// request's version: the resourceVersion precondition, the status subresource's
/// split, server-owned metadata kept, no finalizer added while deleting.
fn prepare_update(
    def: &ResourceDef,
    old: &Value,
    mut new: Value,
    target: Target,
) -> Result<Value, ApiError> {
    let name = meta_str(old, "name").unwrap_or_default().to_string();
    if let Some(rv) = body_resource_version(&new)
        && Some(rv) != meta_str(old, "resourceVersion")
    {
        return Err(conflict(def, &name));
    }
    if target == Target::Status {
        let status = new.get("status").cloned();
        new = old.clone();
        let root = new.as_object_mut().expect("stored objects are objects");
        match status {
            Some(s) => root.insert("status".into(), s),
            None => root.remove("status"),
        };
    } else if def.status {
        let root = new.as_object_mut().expect("checked object");
        match old.get("status") {
            Some(s) => root.insert("status".into(), s.clone()),
            None => root.remove("status"),
        };
    }
    new["apiVersion"] = old["apiVersion"].clone();
    new["kind"] = old["kind"].clone();
    {
        let old_meta = meta::meta(old).cloned().unwrap_or_default();
        let m = meta_mut(&mut new);
        for protected in [
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "resourceVersion",
        ] {
            match old_meta.get(protected) {
                Some(v) => m.insert(protected.into(), v.clone()),
                None => m.remove(protected),
            };
        }
    }
    let being_deleted = meta_str(old, "deletionTimestamp").is_some();
    if being_deleted {
        let before = meta::finalizers(old);
        let added: Vec<String> = meta::finalizers(&new)
            .into_iter()
            .filter(|f| !before.contains(f))
            .collect();
        if !added.is_empty() {
            return Err(ApiError::Invalid {
                subject: Box::new(Subject::kind(def, &name)),
                field: "metadata.finalizers".into(),
                detail: format!(
                    "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"
                ),
            });
        }
    }
    builtin::normalize(&ResKey::of(def), &mut new);
    Ok(new)
}

/// The `metadata.resourceVersion` a write carries; empty counts as none (the
/// real server parses "" as 0, "unset").
fn body_resource_version(obj: &Value) -> Option<&str> {
    meta_str(obj, "resourceVersion").filter(|rv| !rv.is_empty())
}

pub fn parse_rv(rv: &str) -> Result<u64, ApiError> {
    rv.parse()
        .map_err(|_| ApiError::BadRequest(format!("invalid resource version: {rv:?}")))
}

fn too_old(rv: u64, oldest: u64) -> ApiError {
    ApiError::Gone(format!("too old resource version: {rv} ({oldest})"))
}

fn conflict(def: &ResourceDef, name: &str) -> ApiError {
    ApiError::Conflict(
        Subject::resource(def, name),
        "the object has been modified; please apply your changes to the latest version and try again".into(),
    )
}

fn namespace_has_content(st: &State, ns: &str) -> bool {
    st.objects.values().any(|m| m.keys().any(|k| k.0 == ns))
}

fn ns_key() -> ResKey {
    ResKey {
        group: NAMESPACES.0.into(),
        plural: NAMESPACES.1.into(),
    }
}

fn obj_key(obj: &Value) -> ObjKey {
    (
        meta_str(obj, "namespace").unwrap_or_default().to_string(),
        meta_str(obj, "name").unwrap_or_default().to_string(),
    )
}

fn lookup<'a>(
    st: &'a State,
    def: &ResourceDef,
    ns: Option<&str>,
    name: &str,
) -> Result<&'a Value, ApiError> {
    let key = (
        if def.namespaced() {
            ns.unwrap_or_default()
        } else {
            ""
        }
        .to_string(),
        name.to_string(),
    );
    st.objects
        .get(&ResKey::of(def))
        .and_then(|m| m.get(&key))
        .ok_or_else(|| ApiError::NotFound(Subject::resource(def, name)))
}

/// What `metadata.generation` tracks: everything but metadata (and status, when it is a subresource).
fn spec_part(def: &ResourceDef, obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Some(root) = v.as_object_mut() {
        root.remove("metadata");
        root.remove("apiVersion");
        root.remove("kind");
        if def.status {
            root.remove("status");
        }
    }
    v
}

fn check_type(def: &ResourceDef, version: &str, obj: &Value) -> Result<(), ApiError> {
    if !obj.is_object() {
        return Err(ApiError::BadRequest(
            "the request body must be a JSON object".into(),
        ));
    }
    if let Some(kind) = obj.get("kind").and_then(Value::as_str)
        && !kind.is_empty()
        && kind != def.kind
    {
        return Err(ApiError::BadRequest(format!(
            "the API version in the data ({}) does not match the expected API version ({}), or kind {kind} is not {}",
            obj.get("apiVersion")
                .and_then(Value::as_str)
                .unwrap_or_default(),
            def.api_version(version),
            def.kind
        )));
    }
    if let Some(api_version) = obj.get("apiVersion").and_then(Value::as_str)
        && !api_version.is_empty()
        && api_version != def.api_version(version)
    {
        return Err(ApiError::BadRequest(format!(
            "the API version in the data ({api_version}) does not match the expected API version ({})",
            def.api_version(version)
        )));
    }
    Ok(())
}

/// The namespace an object is created in: the URL's, which the body may repeat but not contradict.
fn object_namespace(
    def: &ResourceDef,
    url_ns: Option<&str>,
    obj: &Value,
) -> Result<String, ApiError> {
    if !def.namespaced() {
        return Ok(String::new());
    }
    let body_ns = meta_str(obj, "namespace");
    match (url_ns, body_ns) {
        (Some(u), Some(b)) if u != b => Err(ApiError::BadRequest(
            "the namespace of the provided object does not match the namespace sent on the request"
                .into(),
        )),
        (Some(u), _) => Ok(u.to_string()),
        // Only the store's own callers get here (HTTP requires the namespace in the URL).
        (None, Some(b)) => Ok(b.to_string()),
        (None, None) => Err(ApiError::BadRequest(
            "a namespace is required to create a namespaced object".into(),
        )),
    }
}

mod deletion;

#[cfg(test)]
mod tests;
