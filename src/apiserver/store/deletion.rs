//! Deletion: DELETE and DELETE-collection, finalizers, terminating namespaces and
//! owner-reference garbage collection (background, foreground, orphan).

use std::collections::HashSet;

use serde_json::{Value, json};

use super::{
    DeleteOptions, EventType, FOREGROUND, NAMESPACES, ObjKey, Propagation, ResKey, State, Store,
    lookup, namespace_has_content, ns_key, obj_key,
};
use crate::apiserver::error::{ApiError, Subject};
use crate::apiserver::meta::{self, meta_mut, meta_str};
use crate::apiserver::resource::ResourceDef;
use crate::apiserver::selector::{FieldSelector, LabelSelector};

impl Store {
    pub fn delete(
        &self,
        def: &ResourceDef,
        version: &str,
        ns: Option<&str>,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<Value, ApiError> {
        let mut st = self.lock();
        let obj = lookup(&st, def, ns, name)?.clone();
        if let Some(uid) = &opts.precondition_uid
            && Some(uid.as_str()) != meta_str(&obj, "uid")
        {
            return Err(ApiError::Conflict(
                Subject::resource(def, name),
                format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta_str(&obj, "uid").unwrap_or_default()
                ),
            ));
        }
        if let Some(rv) = &opts.precondition_rv
            && Some(rv.as_str()) != meta_str(&obj, "resourceVersion")
        {
            return Err(ApiError::Conflict(
                Subject::resource(def, name),
                format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    meta_str(&obj, "resourceVersion").unwrap_or_default()
                ),
            ));
        }
        // The real server reads the object in the request's version first: one
        // it cannot convert is not deleted.
        self.shown(def, version, obj.clone())?;
        let out = self.delete_object(&mut st, &ResKey::of(def), &obj_key(&obj), opts.propagation);
        drop(st);
        self.shown(def, version, out)
    }

    /// Delete every object of a collection that matches the selectors; returns the affected objects.
    pub fn delete_collection(
        &self,
        def: &ResourceDef,
        version: &str,
        ns: Option<&str>,
        labels: &LabelSelector,
        fields: &FieldSelector,
        policy: Propagation,
    ) -> Result<(Vec<Value>, u64), ApiError> {
        let mut st = self.lock();
        let res = ResKey::of(def);
        // Selected as a list in the request's version selects them (see `list`);
        // nothing is deleted when one of them cannot be converted.
        let mut keys: Vec<ObjKey> = Vec::new();
        for (key, stored) in st
            .objects
            .get(&res)
            .into_iter()
            .flatten()
            .filter(|(k, _)| ns.is_none_or(|n| k.0 == n))
        {
            let selected = self.shown_if(def, version, stored, |o| {
                labels.matches(o) && fields.matches(o)
            })?;
            if selected.is_some() {
                keys.push(key.clone());
            }
        }
        let deleted: Vec<Value> = keys
            .iter()
            .map(|k| self.delete_object(&mut st, &res, k, policy))
            .collect();
        let rv = st.rv;
        drop(st);
        let items = deleted
            .into_iter()
            .map(|obj| self.shown(def, version, obj))
            .collect::<Result<_, _>>()?;
        Ok((items, rv))
    }

    /// Finalizer-aware deletion of one stored object: mark it (if it has finalizers, or
    /// for foreground deletion) or remove it.
    fn delete_object(
        &self,
        st: &mut State,
        res: &ResKey,
        key: &ObjKey,
        policy: Propagation,
    ) -> Value {
        let Some(obj) = st.objects.get(res).and_then(|m| m.get(key)).cloned() else {
            return Value::Null;
        };
        let uid = meta_str(&obj, "uid").unwrap_or_default().to_string();
        if policy == Propagation::Orphan {
            st.orphan_on_delete.insert(uid.clone());
        }
        let mut finalizers = meta::finalizers(&obj);
        if meta_str(&obj, "deletionTimestamp").is_some() {
            return obj;
        }
        if policy == Propagation::Foreground {
            finalizers.push(FOREGROUND.to_string());
        }
        let is_namespace = (res.group.as_str(), res.plural.as_str()) == NAMESPACES;
        if is_namespace && (!finalizers.is_empty() || namespace_has_content(st, &key.1)) {
            return self.terminate_namespace(st, key, obj);
        }
        if finalizers.is_empty() {
            return self.remove(st, res, key, obj);
        }
        let mut marked = obj.clone();
        let rv = st.rv + 1;
        let m = meta_mut(&mut marked);
        m.insert("deletionTimestamp".into(), json!(meta::now_timestamp()));
        m.insert("deletionGracePeriodSeconds".into(), json!(0));
        m.insert("finalizers".into(), json!(finalizers));
        m.insert("resourceVersion".into(), json!(rv.to_string()));
        st.objects
            .entry(res.clone())
            .or_default()
            .insert(key.clone(), marked.clone());
        self.record(
            st,
            res.clone(),
            EventType::Modified,
            marked.clone(),
            Some(obj),
        );
        if policy == Propagation::Foreground {
            self.collect_dependents(st, &uid, Propagation::Foreground);
            self.release_foreground(st, &uid);
            if let Some(current) = st.objects.get(res).and_then(|m| m.get(key)) {
                return current.clone();
            }
        }
        marked
    }

    /// Really remove an object, then collect its dependents (or orphan them), let owners
    /// waiting in foreground deletion go, and, for a Namespace, delete everything in it.
    pub(super) fn remove(
        &self,
        st: &mut State,
        res: &ResKey,
        key: &ObjKey,
        mut last: Value,
    ) -> Value {
        let prev = st.objects.get_mut(res).and_then(|m| m.remove(key));
        let rv = st.rv + 1;
        meta_mut(&mut last).insert("resourceVersion".into(), json!(rv.to_string()));
        self.record(st, res.clone(), EventType::Deleted, last.clone(), prev);
        let uid = meta_str(&last, "uid").unwrap_or_default().to_string();
        let policy = if st.orphan_on_delete.remove(&uid) {
            Propagation::Orphan
        } else {
            Propagation::Background
        };
        self.collect_dependents(st, &uid, policy);
        for owner in meta::owner_uids(&last) {
            self.release_foreground(st, &owner);
        }
        if !key.0.is_empty() {
            self.finish_namespace(st, &key.0);
        }
        if (res.group.as_str(), res.plural.as_str()) == NAMESPACES {
            self.delete_namespace_content(st, &key.1);
        }
        last
    }

    /// A Namespace with content (or finalizers) turns `Terminating`: its content is
    /// deleted, and it goes once empty and without finalizers.
    fn terminate_namespace(&self, st: &mut State, key: &ObjKey, obj: Value) -> Value {
        let ns = key.1.clone();
        let mut marked = obj.clone();
        meta::set_path(&mut marked, "status.phase", json!("Terminating"));
        let rv = st.rv + 1;
        let m = meta_mut(&mut marked);
        m.insert("deletionTimestamp".into(), json!(meta::now_timestamp()));
        m.insert("deletionGracePeriodSeconds".into(), json!(0));
        m.insert("resourceVersion".into(), json!(rv.to_string()));
        st.objects
            .entry(ns_key())
            .or_default()
            .insert(key.clone(), marked.clone());
        self.record(st, ns_key(), EventType::Modified, marked.clone(), Some(obj));
        self.delete_namespace_content(st, &ns);
        self.finish_namespace(st, &ns);
        st.objects
            .get(&ns_key())
            .and_then(|m| m.get(key))
            .cloned()
            .unwrap_or(marked)
    }

    /// Remove a terminating Namespace once it is empty and has no finalizers left.
    /// Delete every object in namespace `ns` (finalizers respected).
    fn delete_namespace_content(&self, st: &mut State, ns: &str) {
        let inside: Vec<(ResKey, ObjKey)> = st
            .objects
            .iter()
            .flat_map(|(r, m)| {
                m.keys()
                    .filter(|k| k.0 == ns)
                    .map(move |k| (r.clone(), k.clone()))
            })
            .collect();
        for (r, k) in inside {
            self.delete_object(st, &r, &k, Propagation::Background);
        }
    }

    fn finish_namespace(&self, st: &mut State, ns: &str) {
        let key = (String::new(), ns.to_string());
        let Some(namespace) = st.objects.get(&ns_key()).and_then(|m| m.get(&key)).cloned() else {
            return;
        };
        if meta_str(&namespace, "deletionTimestamp").is_none()
            || !meta::finalizers(&namespace).is_empty()
            || namespace_has_content(st, ns)
        {
            return;
        }
        self.remove(st, &ns_key(), &key, namespace);
    }

    /// Garbage collection of an owner's dependents. Background (owner gone) and
    /// foreground (owner waiting): a dependent with no other live owner is deleted
    /// (finalizers respected); one with other live owners loses only the reference.
    /// Orphan: every dependent loses the reference.
    fn collect_dependents(&self, st: &mut State, owner_uid: &str, policy: Propagation) {
        if owner_uid.is_empty() {
            return;
        }
        let dependents: Vec<(ResKey, ObjKey)> = st
            .objects
            .iter()
            .flat_map(|(r, m)| {
                m.iter()
                    .filter(|(_, v)| meta::owner_uids(v).iter().any(|u| u == owner_uid))
                    .map(move |(k, _)| (r.clone(), k.clone()))
            })
            .collect();
        if dependents.is_empty() {
            return;
        }
        // A foreground owner still exists but no longer counts as keeping dependents alive.
        let mut live: HashSet<String> = st
            .objects
            .values()
            .flat_map(|m| {
                m.values()
                    .filter_map(|v| meta_str(v, "uid").map(str::to_string))
            })
            .collect();
        live.remove(owner_uid);
        for (res, key) in dependents {
            let Some(obj) = st.objects.get(&res).and_then(|m| m.get(&key)).cloned() else {
                continue;
            };
            let other_owners = meta::owner_uids(&obj).iter().any(|u| live.contains(u));
            if policy == Propagation::Orphan || other_owners {
                let mut updated = obj.clone();
                meta::retain_owner_refs(&mut updated, |u| {
                    u != owner_uid && (policy == Propagation::Foreground || live.contains(u))
                });
                if updated != obj {
                    let rv = st.rv + 1;
                    meta_mut(&mut updated).insert("resourceVersion".into(), json!(rv.to_string()));
                    st.objects
                        .entry(res.clone())
                        .or_default()
                        .insert(key, updated.clone());
                    self.record(st, res, EventType::Modified, updated, Some(obj));
                }
            } else {
                self.delete_object(st, &res, &key, Propagation::Background);
            }
        }
    }

    /// An owner in foreground deletion loses its `foregroundDeletion` finalizer (and is
    /// deleted when no other finalizer remains) once no dependent with
    /// `blockOwnerDeletion: true` points at it.
    fn release_foreground(&self, st: &mut State, owner_uid: &str) {
        let Some((res, key, owner)) = st.objects.iter().find_map(|(r, m)| {
            m.iter()
                .find(|(_, v)| meta_str(v, "uid") == Some(owner_uid))
                .map(|(k, v)| (r.clone(), k.clone(), v.clone()))
        }) else {
            return;
        };
        if meta_str(&owner, "deletionTimestamp").is_none()
            || !meta::finalizers(&owner).iter().any(|f| f == FOREGROUND)
        {
            return;
        }
        let blocked = st
            .objects
            .values()
            .flat_map(|m| m.values())
            .any(|v| meta::blocks_owner_deletion(v, owner_uid));
        if blocked {
            return;
        }
        let mut released = owner.clone();
        let rest: Vec<String> = meta::finalizers(&owner)
            .into_iter()
            .filter(|f| f != FOREGROUND)
            .collect();
        if rest.is_empty() {
            meta_mut(&mut released).remove("finalizers");
            self.remove(st, &res, &key, released);
            return;
        }
        let rv = st.rv + 1;
        let m = meta_mut(&mut released);
        m.insert("finalizers".into(), json!(rest));
        m.insert("resourceVersion".into(), json!(rv.to_string()));
        st.objects
            .entry(res.clone())
            .or_default()
            .insert(key, released.clone());
        self.record(st, res, EventType::Modified, released, Some(owner));
    }
}
