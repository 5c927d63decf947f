//! Loading manifests (multi-document YAML, as `kubectl apply -f` takes) straight into
//! the store, e.g. the controller's shipped RBAC, so a test can then judge a token
//! user's requests by exactly those objects.

use serde_json::Value;

use super::Error;
use super::store::Store;

/// Create every document of `yaml` whose `apiVersion` and `kind` the server serves,
/// in order (so a Namespace comes before what lives in it); a namespaced object
/// without `metadata.namespace` goes to `default`. Returns `Kind/name` of the
/// documents skipped because their kind is not served (a ServiceAccount, a
/// Deployment). Empty documents are ignored (and not counted in the document
/// index an error names); a stream that is not YAML creates nothing.
pub fn create_from_yaml(store: &Store, yaml: &str) -> Result<Vec<String>, Error> {
    let documents: Vec<Value> = crate::yaml::documents(yaml).map_err(|e| Error::LoadYaml {
        reason: e.to_string(),
    })?;
    let mut skipped = Vec::new();
    for (index, obj) in documents.into_iter().enumerate() {
        let failed = |reason: String| Error::Load { index, reason };
        let field = |name: &str| obj.get(name).and_then(Value::as_str).unwrap_or_default();
        let (api_version, kind) = (field("apiVersion"), field("kind"));
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let name = super::meta::meta_str(&obj, "name").unwrap_or_default();
        let served = store.registry().all().iter().find(|d| {
            d.group == group && d.kind == kind && d.versions.iter().any(|v| v == version)
        });
        let Some(def) = served else {
            skipped.push(format!("{kind}/{name}"));
            continue;
        };
        let ns = def
            .namespaced()
            .then(|| super::meta::meta_str(&obj, "namespace").unwrap_or("default"))
            .map(str::to_string);
        store
            .create(def, version, ns.as_deref(), obj.clone())
            .map_err(|e| failed(format!("creating {kind}/{name}: {e}")))?;
    }
    Ok(skipped)
}
