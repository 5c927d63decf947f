//! The `${NAME:=default}` placeholders of the components YAML, which clusterctl
//! substitutes (`clusterctl init --control-plane k3s` takes each from the
//! environment or clusterctl's config, else the default), and the same
//! substitution for users who apply the file without clusterctl.

use std::collections::BTreeMap;

/// One placeholder: its variable name, default and what it sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variable {
    pub name: &'static str,
    pub default: &'static str,
    pub sets: &'static str,
}

impl Variable {
    /// `${NAME:=default}`, the form clusterctl (drone/envsubst) understands.
    pub fn placeholder(&self) -> String {
        format!("${{{}:={}}}", self.name, self.default)
    }
}

pub const NAMESPACE: Variable = Variable {
    name: "K3S_CONTROL_PLANE_NAMESPACE",
    default: "k3s-control-plane-system",
    sets: "the namespace of the controller, its ServiceAccount and its Lease",
};
pub const IMAGE: Variable = Variable {
    name: "K3S_CONTROL_PLANE_IMAGE",
    default: "k3s-control-plane:dev",
    sets: "the controller image (hack/image.sh builds k3s-control-plane:dev)",
};
pub const LOG_LEVEL: Variable = Variable {
    name: "K3S_CONTROL_PLANE_LOG_LEVEL",
    default: "info",
    sets: "run --log-level: error, warn, info, debug or trace",
};
pub const CONCURRENCY: Variable = Variable {
    name: "K3S_CONTROL_PLANE_CONCURRENCY",
    default: "10",
    sets: "run --concurrency: control planes reconciled at once",
};
pub const WATCH_FILTER: Variable = Variable {
    name: "K3S_CONTROL_PLANE_WATCH_FILTER",
    default: "",
    sets: "run --watch-filter: only objects labelled cluster.x-k8s.io/watch-filter=<value> (empty: all)",
};
pub const ETCD_TRANSPORT: Variable = Variable {
    name: "K3S_CONTROL_PLANE_ETCD_TRANSPORT",
    default: "auto",
    sets: "run --etcd-transport: auto, direct or port-forward",
};

/// Every placeholder the components use.
pub const ALL: [Variable; 6] = [
    NAMESPACE,
    IMAGE,
    LOG_LEVEL,
    CONCURRENCY,
    WATCH_FILTER,
    ETCD_TRANSPORT,
];

/// A placeholder that is not `${NAME:=default}` with a known name.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("components: placeholder at byte {at} ({text:?}): {why}")]
pub struct PlaceholderError {
    pub at: usize,
    pub text: String,
    pub why: &'static str,
}

/// Every `${...}` in `text`, in order, as (byte offset, variable).
pub fn placeholders(text: &str) -> Result<Vec<(usize, Variable)>, PlaceholderError> {
    let mut found = Vec::new();
    let mut rest = 0;
    while let Some(start) = text[rest..].find("${").map(|i| i + rest) {
        let Some(len) = text[start..].find('}') else {
            return Err(PlaceholderError {
                at: start,
                text: text[start..].chars().take(40).collect(),
                why: "no closing brace",
            });
        };
        let inner = &text[start + 2..start + len];
        let error = |why| PlaceholderError {
            at: start,
            text: text[start..=start + len].to_string(),
            why,
        };
        let (name, default) = inner
            .split_once(":=")
            .ok_or_else(|| error("no default (expected ${NAME:=default})"))?;
        let variable = ALL
            .iter()
            .find(|v| v.name == name)
            .ok_or_else(|| error("not a variable the components declare"))?;
        if variable.default != default {
            return Err(error("default differs from the declared one"));
        }
        found.push((start, *variable));
        rest = start + len + 1;
    }
    Ok(found)
}

/// Replace every placeholder with `values[name]`, else its default: what
/// clusterctl does, for `components --substitute`.
pub fn substitute(
    text: &str,
    values: &BTreeMap<String, String>,
) -> Result<String, PlaceholderError> {
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    for (at, variable) in placeholders(text)? {
        out.push_str(&text[copied..at]);
        out.push_str(
            values
                .get(variable.name)
                .map(String::as_str)
                .unwrap_or(variable.default),
        );
        copied = at + variable.placeholder().len();
    }
    out.push_str(&text[copied..]);
    Ok(out)
}

/// The variables' values from the process environment (those set).
pub fn from_environment() -> BTreeMap<String, String> {
    ALL.iter()
        .filter_map(|v| {
            std::env::var(v.name)
                .ok()
                .map(|value| (v.name.to_string(), value))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_found_in_order() {
        let text = format!(
            "a: {}\nb: x{}y",
            IMAGE.placeholder(),
            WATCH_FILTER.placeholder()
        );
        let found: Vec<&str> = placeholders(&text)
            .unwrap()
            .into_iter()
            .map(|(_, v)| v.name)
            .collect();
        assert_eq!(
            found,
            ["K3S_CONTROL_PLANE_IMAGE", "K3S_CONTROL_PLANE_WATCH_FILTER"]
        );
    }

    #[test]
    fn a_placeholder_without_default_or_unknown_is_an_error() {
        let err = placeholders("image: ${K3S_CONTROL_PLANE_IMAGE}").unwrap_err();
        assert_eq!(err.why, "no default (expected ${NAME:=default})");
        assert_eq!(err.text, "${K3S_CONTROL_PLANE_IMAGE}");
        let err = placeholders("x: ${SOMETHING_ELSE:=1}").unwrap_err();
        assert_eq!(err.why, "not a variable the components declare");
        let err = placeholders("x: ${K3S_CONTROL_PLANE_CONCURRENCY:=3}").unwrap_err();
        assert_eq!(err.why, "default differs from the declared one");
        let err = placeholders("x: ${K3S_CONTROL_PLANE_CONCURRENCY:=10").unwrap_err();
        assert_eq!(err.why, "no closing brace");
    }

    #[test]
    fn substitute_takes_the_given_value_else_the_default() {
        let text = format!(
            "ns: {}\nargs: [--watch-filter={}, --concurrency={}]",
            NAMESPACE.placeholder(),
            WATCH_FILTER.placeholder(),
            CONCURRENCY.placeholder()
        );
        let values = BTreeMap::from([(CONCURRENCY.name.to_string(), "4".to_string())]);
        assert_eq!(
            substitute(&text, &values).unwrap(),
            "ns: k3s-control-plane-system\nargs: [--watch-filter=, --concurrency=4]"
        );
    }
}
