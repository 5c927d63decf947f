//! RBAC evaluation against the stored `rbac.authorization.k8s.io/v1` objects, at
//! request time, with the rules of kube-apiserver's RBAC authorizer
//! (`plugin/pkg/auth/authorizer/rbac`): ClusterRoleBindings grant everywhere,
//! RoleBindings only in their namespace; a rule matches on API group, resource (with
//! `resource/subresource`, `*/subresource` and `*`), verb and resource name.
//!
//! Deviation: an aggregated ClusterRole's rules are computed here, at request time, as
//! the union of the rules of the ClusterRoles its `aggregationRule` selects (the real
//! aggregation controller writes that union into the role shortly after a change).

use std::collections::BTreeMap;

use k8s_openapi::api::rbac::v1::{
    AggregationRule, ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::de::DeserializeOwned;

use super::UserInfo;
use super::request::Attributes;
use crate::apiserver::selector::{FieldSelector, LabelSelector as Labels};
use crate::apiserver::store::{ListQuery, Store};

pub const GROUP: &str = "rbac.authorization.k8s.io";

/// Which binding and role allowed a request, and the rule that matched.
#[derive(Clone, Debug, PartialEq)]
pub struct Grant {
    /// `ClusterRoleBinding` or `RoleBinding`.
    pub binding_kind: String,
    /// The RoleBinding's namespace; `None` for a ClusterRoleBinding.
    pub binding_namespace: Option<String>,
    pub binding_name: String,
    /// `ClusterRole` or `Role`: the binding's `roleRef`.
    pub role_kind: String,
    pub role_name: String,
    /// The role the rule is written in: `role_name`, or under aggregation the
    /// ClusterRole that contributed it.
    pub rule_source: String,
    pub rule: PolicyRule,
}

/// The outcome of evaluating one request.
#[derive(Debug, Default)]
pub struct Decision {
    pub grant: Option<Grant>,
    /// Bindings whose role is missing: the real authorizer's denial reason
    /// (`RBAC: clusterrole.rbac.authorization.k8s.io "x" not found`).
    pub errors: Vec<String>,
}

/// The stored RBAC objects, read once per request.
pub struct Policy {
    cluster_roles: BTreeMap<String, ClusterRole>,
    cluster_role_bindings: Vec<ClusterRoleBinding>,
    roles: BTreeMap<(String, String), Role>,
    role_bindings: Vec<RoleBinding>,
}

impl Policy {
    pub fn load(store: &Store) -> Self {
        Self {
            cluster_roles: objects::<ClusterRole>(store, "clusterroles")
                .into_iter()
                .map(|r| (r.metadata.name.clone().unwrap_or_default(), r))
                .collect(),
            cluster_role_bindings: objects(store, "clusterrolebindings"),
            roles: objects::<Role>(store, "roles")
                .into_iter()
                .map(|r| {
                    let key = (
                        r.metadata.namespace.clone().unwrap_or_default(),
                        r.metadata.name.clone().unwrap_or_default(),
                    );
                    (key, r)
                })
                .collect(),
            role_bindings: objects(store, "rolebindings"),
        }
    }

    /// Visit, as `VisitRulesFor` does, the ClusterRoleBindings and then the
    /// RoleBindings of the request's namespace that apply to `user`, stopping at the
    /// first rule that allows the request.
    pub fn authorize(&self, user: &UserInfo, attrs: &Attributes) -> Decision {
        let mut decision = Decision::default();
        for binding in &self.cluster_role_bindings {
            if !applies(binding.subjects.as_deref(), user, "") {
                continue;
            }
            let role_ref = &binding.role_ref;
            if role_ref.kind != "ClusterRole" {
                continue;
            }
            let binding_name = binding.metadata.name.clone().unwrap_or_default();
            match self.cluster_role_rules(&role_ref.name) {
                Some(rules) => {
                    if let Some((source, rule)) = first_match(&rules, attrs) {
                        decision.grant = Some(Grant {
                            binding_kind: "ClusterRoleBinding".into(),
                            binding_namespace: None,
                            binding_name,
                            role_kind: role_ref.kind.clone(),
                            role_name: role_ref.name.clone(),
                            rule_source: source,
                            rule,
                        });
                        return decision;
                    }
                }
                None => decision
                    .errors
                    .push(not_found("clusterrole", &role_ref.name)),
            }
        }
        if attrs.namespace.is_empty() {
            return decision;
        }
        for binding in &self.role_bindings {
            let ns = binding.metadata.namespace.as_deref().unwrap_or_default();
            if ns != attrs.namespace || !applies(binding.subjects.as_deref(), user, ns) {
                continue;
            }
            let role_ref = &binding.role_ref;
            let rules = match role_ref.kind.as_str() {
                "ClusterRole" => self.cluster_role_rules(&role_ref.name),
                "Role" => self
                    .roles
                    .get(&(ns.to_string(), role_ref.name.clone()))
                    .map(|r| own_rules(&role_ref.name, r.rules.as_deref())),
                _ => continue,
            };
            let Some(rules) = rules else {
                let singular = role_ref.kind.to_ascii_lowercase();
                decision.errors.push(not_found(&singular, &role_ref.name));
                continue;
            };
            if let Some((source, rule)) = first_match(&rules, attrs) {
                decision.grant = Some(Grant {
                    binding_kind: "RoleBinding".into(),
                    binding_namespace: Some(ns.to_string()),
                    binding_name: binding.metadata.name.clone().unwrap_or_default(),
                    role_kind: role_ref.kind.clone(),
                    role_name: role_ref.name.clone(),
                    rule_source: source,
                    rule,
                });
                return decision;
            }
        }
        decision
    }

    /// A ClusterRole's effective rules with the role each comes from: its own, or
    /// with an `aggregationRule` the union of the selected ClusterRoles' (effective)
    /// rules, which is what the aggregation controller would have written.
    fn cluster_role_rules(&self, name: &str) -> Option<Vec<(String, PolicyRule)>> {
        let mut seen = vec![name.to_string()];
        self.cluster_roles
            .get(name)
            .map(|role| self.effective(name, role, &mut seen))
    }

    fn effective(
        &self,
        name: &str,
        role: &ClusterRole,
        seen: &mut Vec<String>,
    ) -> Vec<(String, PolicyRule)> {
        let Some(aggregation) = &role.aggregation_rule else {
            return own_rules(name, role.rules.as_deref());
        };
        let mut rules: Vec<(String, PolicyRule)> = Vec::new();
        for (other_name, other) in &self.cluster_roles {
            if seen.contains(other_name) || !selected(aggregation, other) {
                continue;
            }
            seen.push(other_name.clone());
            for (source, rule) in self.effective(other_name, other, seen) {
                if !rules.iter().any(|(_, r)| *r == rule) {
                    rules.push((source, rule));
                }
            }
        }
        rules
    }
}

fn own_rules(name: &str, rules: Option<&[PolicyRule]>) -> Vec<(String, PolicyRule)> {
    rules
        .unwrap_or_default()
        .iter()
        .map(|r| (name.to_string(), r.clone()))
        .collect()
}

fn not_found(singular: &str, name: &str) -> String {
    format!("{singular}.{GROUP} \"{name}\" not found")
}

/// Every stored object of an RBAC resource; one that does not parse grants nothing.
fn objects<K: DeserializeOwned>(store: &Store, plural: &str) -> Vec<K> {
    let Some(def) = store.registry().find(GROUP, "v1", plural) else {
        return Vec::new();
    };
    let (labels, fields) = (Labels::default(), FieldSelector::default());
    let query = ListQuery {
        labels: &labels,
        fields: &fields,
        limit: None,
        continue_token: None,
    };
    store
        .list(def, "v1", None, &query)
        .map(|page| page.items)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|item| serde_json::from_value(item).ok())
        .collect()
}

/// `appliesToUser`: a ServiceAccount subject without a namespace means the binding's.
fn applies(subjects: Option<&[Subject]>, user: &UserInfo, binding_ns: &str) -> bool {
    subjects
        .unwrap_or_default()
        .iter()
        .any(|s| match s.kind.as_str() {
            "User" => user.name == s.name,
            "Group" => user.groups.contains(&s.name),
            "ServiceAccount" => {
                let ns = s
                    .namespace
                    .as_deref()
                    .filter(|n| !n.is_empty())
                    .unwrap_or(binding_ns);
                !ns.is_empty() && user.name == format!("system:serviceaccount:{ns}:{}", s.name)
            }
            _ => false,
        })
}

fn first_match(rules: &[(String, PolicyRule)], attrs: &Attributes) -> Option<(String, PolicyRule)> {
    rules
        .iter()
        .find(|(_, rule)| rule_allows(rule, attrs))
        .cloned()
}

/// `RuleAllows` of the RBAC authorizer.
pub fn rule_allows(rule: &PolicyRule, attrs: &Attributes) -> bool {
    let has = |list: &[String], wanted: &str| list.iter().any(|x| x == "*" || x == wanted);
    if !attrs.resource_request {
        return has(&rule.verbs, &attrs.verb)
            && rule
                .non_resource_urls
                .as_deref()
                .unwrap_or_default()
                .iter()
                .any(|url| non_resource_url_matches(url, &attrs.path));
    }
    let combined = if attrs.subresource.is_empty() {
        attrs.resource.clone()
    } else {
        format!("{}/{}", attrs.resource, attrs.subresource)
    };
    has(&rule.verbs, &attrs.verb)
        && has(
            rule.api_groups.as_deref().unwrap_or_default(),
            &attrs.api_group,
        )
        && resource_matches(
            rule.resources.as_deref().unwrap_or_default(),
            &combined,
            &attrs.subresource,
        )
        && rule
            .resource_names
            .as_deref()
            .filter(|names| !names.is_empty())
            .is_none_or(|names| names.contains(&attrs.name))
}

/// `ResourceMatches`: `*`, the exact `resource` or `resource/subresource`, or
/// `*/subresource`. `resource/*` matches only a subresource literally named `*`, and
/// a rule for `resource` does not cover its subresources.
fn resource_matches(rule_resources: &[String], combined: &str, subresource: &str) -> bool {
    rule_resources.iter().any(|r| {
        r == "*"
            || r == combined
            || (!subresource.is_empty()
                && r.len() == subresource.len() + 2
                && r.starts_with("*/")
                && r.ends_with(subresource))
    })
}

/// `NonResourceURLMatches`: exact, or a prefix ending in `*`.
fn non_resource_url_matches(rule: &str, path: &str) -> bool {
    rule == "*"
        || rule == path
        || rule
            .strip_suffix('*')
            .is_some_and(|prefix| path.starts_with(prefix))
}

/// Whether `role`'s labels match any of the aggregation rule's selectors.
fn selected(aggregation: &AggregationRule, role: &ClusterRole) -> bool {
    let empty = BTreeMap::new();
    let labels = role.metadata.labels.as_ref().unwrap_or(&empty);
    aggregation
        .cluster_role_selectors
        .as_deref()
        .unwrap_or_default()
        .iter()
        .any(|selector| label_selector_matches(selector, labels))
}

/// A `metav1.LabelSelector`: every `matchLabels` pair and `matchExpressions` term.
/// An empty selector matches everything, as upstream.
pub fn label_selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let pairs = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let expressions = selector.match_expressions.iter().flatten().all(|e| {
        let values = e.values.as_deref().unwrap_or_default();
        let value = labels.get(&e.key);
        match e.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    pairs && expressions
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(groups: &[&str], resources: &[&str], verbs: &[&str], names: &[&str]) -> PolicyRule {
        let strings = |xs: &[&str]| xs.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        PolicyRule {
            api_groups: Some(strings(groups)),
            resources: Some(strings(resources)),
            verbs: strings(verbs),
            resource_names: (!names.is_empty()).then(|| strings(names)),
            non_resource_urls: None,
        }
    }

    fn req(verb: &str, group: &str, resource: &str, sub: &str, name: &str) -> Attributes {
        Attributes {
            verb: verb.into(),
            resource_request: true,
            api_group: group.into(),
            resource: resource.into(),
            subresource: sub.into(),
            namespace: "ns".into(),
            name: name.into(),
            path: String::new(),
        }
    }

    #[test]
    fn subresources_need_their_own_rule() {
        let status = req("patch", "cluster.x-k8s.io", "machines", "status", "m");
        let main = rule(&["cluster.x-k8s.io"], &["machines"], &["patch"], &[]);
        assert!(!rule_allows(&main, &status));
        let exact = rule(&["cluster.x-k8s.io"], &["machines/status"], &["patch"], &[]);
        assert!(rule_allows(&exact, &status));
        assert!(!rule_allows(
            &exact,
            &req("patch", "cluster.x-k8s.io", "machines", "", "m")
        ));
        let any = rule(&["cluster.x-k8s.io"], &["*/status"], &["patch"], &[]);
        assert!(rule_allows(&any, &status));
        let slash_star = rule(&["cluster.x-k8s.io"], &["machines/*"], &["patch"], &[]);
        assert!(!rule_allows(&slash_star, &status), "not supported upstream");
        let star = rule(&["*"], &["*"], &["*"], &[]);
        assert!(rule_allows(&star, &status));
    }

    #[test]
    fn resource_names_never_match_a_request_without_a_name() {
        let named = rule(&[""], &["secrets"], &["get", "list"], &["s"]);
        assert!(rule_allows(&named, &req("get", "", "secrets", "", "s")));
        assert!(!rule_allows(&named, &req("get", "", "secrets", "", "t")));
        assert!(!rule_allows(&named, &req("list", "", "secrets", "", "")));
        assert!(!rule_allows(
            &named,
            &req("get", "apps", "secrets", "", "s")
        ));
    }

    #[test]
    fn label_selectors_of_aggregation_rules() {
        let labels: BTreeMap<String, String> =
            [("rbac.example.com/aggregate".to_string(), "true".to_string())].into();
        let sel: LabelSelector = serde_json::from_value(serde_json::json!({
            "matchLabels": {"rbac.example.com/aggregate": "true"}}))
        .unwrap();
        assert!(label_selector_matches(&sel, &labels));
        assert!(!label_selector_matches(&sel, &BTreeMap::new()));
        let expr: LabelSelector = serde_json::from_value(serde_json::json!({
            "matchExpressions": [{"key": "rbac.example.com/aggregate", "operator": "NotIn", "values": ["true"]}]})).unwrap();
        assert!(!label_selector_matches(&expr, &labels));
        assert!(label_selector_matches(&expr, &BTreeMap::new()));
    }
}
