//! Small helpers over JSON objects: metadata access, dot paths, uids, timestamps, name rules.

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Map, Value};

pub fn meta(obj: &Value) -> Option<&Map<String, Value>> {
    obj.get("metadata").and_then(Value::as_object)
}

/// The object's metadata map, created when absent (the object must be a JSON object).
pub fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    let root = obj
        .as_object_mut()
        .expect("objects are validated to be JSON objects before use");
    let m = root
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !m.is_object() {
        *m = Value::Object(Map::new());
    }
    m.as_object_mut()
        .expect("just ensured metadata is an object")
}

pub fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    meta(obj)
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

pub fn finalizers(obj: &Value) -> Vec<String> {
    meta(obj)
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

pub fn owner_uids(obj: &Value) -> Vec<String> {
    meta(obj)
        .and_then(|m| m.get("ownerReferences"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|r| r.get("uid").and_then(Value::as_str))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `obj` has an owner reference to `owner_uid` with `blockOwnerDeletion: true`.
pub fn blocks_owner_deletion(obj: &Value, owner_uid: &str) -> bool {
    meta(obj)
        .and_then(|m| m.get("ownerReferences"))
        .and_then(Value::as_array)
        .is_some_and(|refs| {
            refs.iter().any(|r| {
                r.get("uid").and_then(Value::as_str) == Some(owner_uid)
                    && r.get("blockOwnerDeletion").and_then(Value::as_bool) == Some(true)
            })
        })
}

/// Keep only the owner references whose uid satisfies `keep`.
pub fn retain_owner_refs(obj: &mut Value, keep: impl Fn(&str) -> bool) {
    let m = meta_mut(obj);
    if let Some(Value::Array(refs)) = m.get_mut("ownerReferences") {
        refs.retain(|r| r.get("uid").and_then(Value::as_str).is_some_and(&keep));
        if refs.is_empty() {
            m.remove("ownerReferences");
        }
    }
}

pub fn generation(obj: &Value) -> i64 {
    meta(obj)
        .and_then(|m| m.get("generation"))
        .and_then(Value::as_i64)
        .unwrap_or(0)
}

/// Value at a dot path such as `spec.replicas`.
pub fn get_path<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.')
        .filter(|p| !p.is_empty())
        .try_fold(obj, |v, key| v.get(key))
}

/// Set a dot path, creating intermediate objects.
pub fn set_path(obj: &mut Value, path: &str, value: Value) {
    let mut cur = obj;
    let parts: Vec<&str> = path.split('.').filter(|p| !p.is_empty()).collect();
    for (i, key) in parts.iter().enumerate() {
        if !cur.is_object() {
            *cur = Value::Object(Map::new());
        }
        let map = cur.as_object_mut().expect("just ensured an object");
        if i + 1 == parts.len() {
            map.insert(key.to_string(), value);
            return;
        }
        cur = map
            .entry(key.to_string())
            .or_insert_with(|| Value::Object(Map::new()));
    }
}

/// RFC 3339 with second precision, as Kubernetes' `metav1.Time`.
pub fn now_timestamp() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

static UID_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A random-looking, unique UUID (v4 layout). Uniqueness comes from a process counter;
/// the per-process random seed only keeps uids from different test runs apart.
pub fn new_uid() -> String {
    use std::hash::{BuildHasher, Hasher};
    let n = UID_COUNTER.fetch_add(1, Ordering::Relaxed);
    let seed = std::collections::hash_map::RandomState::new();
    let mut h = seed.build_hasher();
    h.write_u64(n);
    let hi = h.finish();
    let lo = (n << 16) ^ (std::process::id() as u64);
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        (hi >> 32) as u32,
        (hi >> 16) as u16,
        (hi & 0xfff) as u16,
        0x8000 | ((lo >> 48) as u16 & 0x3fff),
        lo & 0xffff_ffff_ffff
    )
}

/// Five characters from the alphabet the real server uses for `generateName` suffixes.
pub fn name_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let uid = new_uid().replace('-', "");
    uid.bytes()
        .rev()
        .take(5)
        .map(|b| ALPHABET[(b as usize * 7 + uid.len()) % ALPHABET.len()] as char)
        .collect()
}

/// Why a name is not a lowercase RFC 1123 subdomain, if it is not.
pub fn invalid_name(name: &str) -> Option<String> {
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.';
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    if name.is_empty()
        || name.len() > 253
        || !name.chars().all(ok_char)
        || !name.starts_with(alnum)
        || !name.ends_with(alnum)
    {
        return Some(format!(
            "Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn dot_paths_read_and_create() {
        let mut obj = json!({"spec": {"replicas": 3}});
        assert_eq!(get_path(&obj, "spec.replicas"), Some(&json!(3)));
        set_path(&mut obj, "status.replicas", json!(2));
        assert_eq!(obj["status"]["replicas"], 2);
    }

    #[test]
    fn uids_are_unique_and_uuid_shaped() {
        let (a, b) = (new_uid(), new_uid());
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(a.matches('-').count(), 4);
    }

    #[test]
    fn name_rules() {
        assert!(invalid_name("kcp-1").is_none());
        assert!(invalid_name("a.b").is_none());
        assert!(invalid_name("KCP").is_some());
        assert!(invalid_name("-a").is_some());
        assert!(invalid_name("").is_some());
        assert_eq!(name_suffix().len(), 5);
    }
}
