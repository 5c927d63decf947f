//! Resource registry: which kinds a test API server serves, under which URLs and with which subresources.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::core::ApiResource;

/// Whether objects of a resource live in a namespace or at cluster scope.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    Namespaced,
    Cluster,
}

/// The JSON paths (dot form, without the leading dot) a scale subresource maps to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScaleDef {
    pub spec_replicas_path: String,
    pub status_replicas_path: String,
    pub label_selector_path: Option<String>,
}

/// How an object written in one version is read in another: a CRD's
/// `spec.conversion.strategy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ConversionStrategy {
    /// Only `apiVersion` changes (the CRD default, and every built-in here).
    #[default]
    None,
    /// The group's registered converter changes the shape (see `conversion`),
    /// as a CRD's conversion webhook does.
    Webhook,
}

/// One served resource: every version shares one store, which keeps each object
/// once, in [`storage_version`](Self::storage_version); reads and writes in another
/// version convert by [`conversion`](Self::conversion).
#[derive(Clone, Debug)]
pub struct ResourceDef {
    pub group: String,
    /// Served versions, in registration (CRD) order.
    pub versions: Vec<String>,
    /// The version objects are stored in (a CRD's `storage: true` version).
    pub storage_version: String,
    pub conversion: ConversionStrategy,
    pub kind: String,
    pub plural: String,
    pub scope: Scope,
    pub status: bool,
    pub scale: Option<ScaleDef>,
    /// Extra field-selectable paths (dot form, e.g. `spec.nodeName`) beyond
    /// `metadata.name` and `metadata.namespace`.
    pub selectable_fields: Vec<String>,
    /// Short names for kubectl (`cm`, `kcp`), served in discovery.
    pub short_names: Vec<String>,
    /// A PUT without `metadata.resourceVersion` overwrites whatever is stored
    /// (the strategy's `AllowUnconditionalUpdate`): true for most built-in kinds
    /// (ConfigMap, Secret, Pod, Node, Namespace, Event, ...); false for custom
    /// resources and Leases, which answer 422 Invalid
    /// (`metadata.resourceVersion: Invalid value: 0x0: must be specified for an update`).
    pub unconditional_update: bool,
}

/// Built-in resources whose strategy refuses an unconditional update
/// (`AllowUnconditionalUpdate() == false` in kubernetes/pkg/registry).
const BUILTIN_CONDITIONAL_ONLY: &[(&str, &str)] = &[("coordination.k8s.io", "leases")];

impl ResourceDef {
    /// A resource described by hand; updates behave as for a custom resource
    /// (a PUT must carry `metadata.resourceVersion`).
    pub fn new(api: ApiResource, scope: Scope) -> Self {
        Self {
            group: api.group,
            storage_version: api.version.clone(),
            versions: vec![api.version],
            conversion: ConversionStrategy::None,
            kind: api.kind,
            plural: api.plural,
            scope,
            status: false,
            scale: None,
            selectable_fields: Vec::new(),
            short_names: Vec::new(),
            unconditional_update: false,
        }
    }

    /// A built-in type from k8s-openapi (scope from its `ResourceScope`); a PUT
    /// without `metadata.resourceVersion` is unconditional as for the real
    /// built-in (all but Lease among those served here).
    pub fn of<K>() -> Self
    where
        K: k8s_openapi::Resource,
        <K as k8s_openapi::Resource>::Scope: ScopeOf,
    {
        let api = ApiResource {
            group: K::GROUP.to_string(),
            version: K::VERSION.to_string(),
            api_version: K::API_VERSION.to_string(),
            kind: K::KIND.to_string(),
            plural: K::URL_PATH_SEGMENT.to_string(),
        };
        let conditional_only = BUILTIN_CONDITIONAL_ONLY.contains(&(K::GROUP, K::URL_PATH_SEGMENT));
        Self::new(api, <<K as k8s_openapi::Resource>::Scope as ScopeOf>::SCOPE)
            .with_unconditional_update(!conditional_only)
    }

    /// Whether a PUT without `metadata.resourceVersion` is accepted (see
    /// [`unconditional_update`](Self::unconditional_update)).
    pub fn with_unconditional_update(mut self, allow: bool) -> Self {
        self.unconditional_update = allow;
        self
    }

    /// Every served version of a CRD with its scope, status/scale subresources,
    /// storage version and conversion strategy. Subresources and selectable fields
    /// are taken from the first served version.
    pub fn from_crd(crd: &CustomResourceDefinition) -> Self {
        let spec = &crd.spec;
        let served: Vec<_> = spec.versions.iter().filter(|v| v.served).collect();
        // The API server refuses a CRD without exactly one storage version; a
        // hand-written one without any is stored in its first served version.
        let storage_version = spec
            .versions
            .iter()
            .find(|v| v.storage)
            .or(served.first().copied())
            .map(|v| v.name.clone())
            .unwrap_or_default();
        let conversion = match spec.conversion.as_ref().map(|c| c.strategy.as_str()) {
            Some("Webhook") => ConversionStrategy::Webhook,
            _ => ConversionStrategy::None,
        };
        let subresources = served.first().and_then(|v| v.subresources.as_ref());
        let scale = subresources
            .and_then(|s| s.scale.as_ref())
            .map(|s| ScaleDef {
                spec_replicas_path: trim_path(&s.spec_replicas_path),
                status_replicas_path: trim_path(&s.status_replicas_path),
                label_selector_path: s.label_selector_path.as_deref().map(trim_path),
            });
        let selectable_fields = served
            .first()
            .and_then(|v| v.selectable_fields.as_ref())
            .map(|fields| fields.iter().map(|f| trim_path(&f.json_path)).collect())
            .unwrap_or_default();
        Self {
            group: spec.group.clone(),
            versions: served.iter().map(|v| v.name.clone()).collect(),
            storage_version,
            conversion,
            kind: spec.names.kind.clone(),
            plural: spec.names.plural.clone(),
            scope: if spec.scope == "Cluster" {
                Scope::Cluster
            } else {
                Scope::Namespaced
            },
            status: subresources.is_some_and(|s| s.status.is_some()),
            scale,
            selectable_fields,
            short_names: spec.names.short_names.clone().unwrap_or_default(),
            unconditional_update: false,
        }
    }

    /// Serve a `/status` subresource (and protect `.status` on main-resource writes).
    pub fn with_status(mut self) -> Self {
        self.status = true;
        self
    }

    /// Serve a `/scale` subresource mapped onto the given paths (dot form, e.g. `.spec.replicas`).
    pub fn with_scale(
        mut self,
        spec_replicas: &str,
        status_replicas: &str,
        selector: Option<&str>,
    ) -> Self {
        self.scale = Some(ScaleDef {
            spec_replicas_path: trim_path(spec_replicas),
            status_replicas_path: trim_path(status_replicas),
            label_selector_path: selector.map(trim_path),
        });
        self
    }

    /// Accept a field selector on this path (e.g. `spec.nodeName`).
    pub fn with_selectable_field(mut self, path: &str) -> Self {
        self.selectable_fields.push(trim_path(path));
        self
    }

    /// Short names kubectl accepts for this resource.
    pub fn with_short_names(mut self, names: &[&str]) -> Self {
        self.short_names.extend(names.iter().map(|n| n.to_string()));
        self
    }

    /// The name used in error messages: `plural.group` (or `plural` for the core group).
    pub fn qualified_plural(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// The name used in Invalid errors: `Kind.group` (or `Kind` for the core group).
    pub fn qualified_kind(&self) -> String {
        if self.group.is_empty() {
            self.kind.clone()
        } else {
            format!("{}.{}", self.kind, self.group)
        }
    }

    pub fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_string()
        } else {
            format!("{}/{}", self.group, version)
        }
    }

    pub fn namespaced(&self) -> bool {
        self.scope == Scope::Namespaced
    }
}

fn trim_path(path: &str) -> String {
    path.trim_start_matches('.').to_string()
}

/// Maps k8s-openapi's scope marker types onto [`Scope`].
pub trait ScopeOf {
    const SCOPE: Scope;
}

impl ScopeOf for k8s_openapi::NamespaceResourceScope {
    const SCOPE: Scope = Scope::Namespaced;
}

impl ScopeOf for k8s_openapi::ClusterResourceScope {
    const SCOPE: Scope = Scope::Cluster;
}

/// The set of resources one server serves, looked up by URL parts.
#[derive(Clone, Debug, Default)]
pub struct Registry {
    defs: Vec<ResourceDef>,
}

impl Registry {
    /// Add a resource; a later definition of the same group and plural merges its
    /// versions in (the first definition's storage version and conversion stay).
    pub fn add(&mut self, def: ResourceDef) {
        if let Some(existing) = self
            .defs
            .iter_mut()
            .find(|d| d.group == def.group && d.plural == def.plural)
        {
            for v in def.versions {
                if !existing.versions.contains(&v) {
                    existing.versions.push(v);
                }
            }
        } else {
            self.defs.push(def);
        }
    }

    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<&ResourceDef> {
        self.defs.iter().find(|d| {
            d.group == group && d.plural == plural && d.versions.iter().any(|v| v == version)
        })
    }

    pub fn all(&self) -> &[ResourceDef] {
        &self.defs
    }

    /// The resource a test names: its `plural.group` (`plural` in the core
    /// group, e.g. `secrets`, `leases.coordination.k8s.io`), else its plural,
    /// else its Kind, when exactly one served resource matches.
    pub fn resolve(&self, name: &str) -> Result<&ResourceDef, String> {
        let by: [&dyn Fn(&ResourceDef) -> bool; 3] = [
            &|d| d.qualified_plural() == name,
            &|d| d.plural == name,
            &|d| d.kind == name,
        ];
        for matches in by {
            let found: Vec<&ResourceDef> = self.defs.iter().filter(|d| matches(d)).collect();
            match found.as_slice() {
                [one] => return Ok(one),
                [] => continue,
                many => {
                    let names: Vec<String> = many.iter().map(|d| d.qualified_plural()).collect();
                    return Err(format!(
                        "{name:?} names several resources ({}): use plural.group",
                        names.join(", ")
                    ));
                }
            }
        }
        Err(format!("{name:?} is not a resource this server serves"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Namespace, Secret};

    #[test]
    fn builtin_scope_and_names_come_from_k8s_openapi() {
        let secret = ResourceDef::of::<Secret>();
        assert_eq!(
            (secret.group.as_str(), secret.plural.as_str()),
            ("", "secrets")
        );
        assert_eq!(secret.scope, Scope::Namespaced);
        assert_eq!(ResourceDef::of::<Namespace>().scope, Scope::Cluster);
        assert_eq!(secret.qualified_plural(), "secrets");
    }

    #[test]
    fn unconditional_update_follows_the_real_strategies() {
        use k8s_openapi::api::coordination::v1::Lease;
        use k8s_openapi::api::core::v1::ConfigMap;
        assert!(ResourceDef::of::<Secret>().unconditional_update);
        assert!(ResourceDef::of::<ConfigMap>().unconditional_update);
        assert!(ResourceDef::of::<Namespace>().unconditional_update);
        assert!(!ResourceDef::of::<Lease>().unconditional_update);
        let by_hand = ResourceDef::new(
            kube::core::ApiResource::erase::<Secret>(&()),
            Scope::Namespaced,
        );
        assert!(!by_hand.unconditional_update, "described by hand: a CR");
        assert!(by_hand.with_unconditional_update(true).unconditional_update);
    }

    #[test]
    fn crd_registration_reads_served_versions_scope_and_subresources() {
        let crd: CustomResourceDefinition = serde_json::from_value(serde_json::json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com"},
            "spec": {"group": "example.com", "scope": "Namespaced",
              "names": {"kind": "Widget", "plural": "widgets"},
              "versions": [
                {"name": "v1", "served": true, "storage": true,
                 "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas",
                   "statusReplicasPath": ".status.replicas", "labelSelectorPath": ".status.selector"}}},
                {"name": "v0", "served": false, "storage": false}]}
        }))
        .unwrap();
        let def = ResourceDef::from_crd(&crd);
        assert_eq!(def.versions, vec!["v1"]);
        assert!(def.status);
        assert_eq!(
            def.scale.as_ref().unwrap().spec_replicas_path,
            "spec.replicas"
        );
        assert_eq!(def.qualified_plural(), "widgets.example.com");
        assert!(!def.unconditional_update);
        assert_eq!(def.storage_version, "v1");
        assert_eq!(def.conversion, ConversionStrategy::None);
    }

    #[test]
    fn crd_registration_reads_the_storage_version_and_the_webhook_strategy() {
        let crd: CustomResourceDefinition = serde_json::from_value(serde_json::json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com"},
            "spec": {"group": "example.com", "scope": "Namespaced",
              "names": {"kind": "Widget", "plural": "widgets"},
              "conversion": {"strategy": "Webhook", "webhook": {"conversionReviewVersions": ["v1"]}},
              "versions": [
                {"name": "v1", "served": true, "storage": false},
                {"name": "v2", "served": true, "storage": true}]}
        }))
        .unwrap();
        let def = ResourceDef::from_crd(&crd);
        assert_eq!(def.versions, vec!["v1", "v2"]);
        assert_eq!(def.storage_version, "v2");
        assert_eq!(def.conversion, ConversionStrategy::Webhook);
    }
}
