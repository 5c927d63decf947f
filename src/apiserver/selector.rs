//! Label and field selectors: parsing the query-string syntax and matching objects.

use std::collections::BTreeSet;

use serde_json::Value;

use super::error::ApiError;

/// One label requirement.
#[derive(Clone, Debug, PartialEq, Eq)]
enum LabelRequirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed `labelSelector`: all requirements must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<LabelRequirement>);

impl LabelSelector {
    pub fn parse(input: &str) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for part in split_top_level(input)? {
            let part = part.trim();
            if part.is_empty() {
                if input.trim().is_empty() {
                    continue;
                }
                return Err(bad(input, "empty requirement"));
            }
            reqs.push(parse_requirement(part).map_err(|why| bad(part, &why))?);
        }
        Ok(Self(reqs))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            LabelRequirement::Equals(k, v) => get(k) == Some(v.as_str()),
            LabelRequirement::NotEquals(k, v) => get(k) != Some(v.as_str()),
            LabelRequirement::In(k, set) => get(k).is_some_and(|v| set.contains(v)),
            LabelRequirement::NotIn(k, set) => get(k).is_none_or(|v| !set.contains(v)),
            LabelRequirement::Exists(k) => get(k).is_some(),
            LabelRequirement::NotExists(k) => get(k).is_none(),
        })
    }
}

fn bad(input: &str, why: &str) -> ApiError {
    ApiError::BadRequest(format!("unable to parse requirement: {why}: {input:?}"))
}

/// Split on commas that are not inside `( )`.
fn split_top_level(input: &str) -> Result<Vec<&str>, ApiError> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in input.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&input[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err(bad(input, "unbalanced parentheses"));
        }
    }
    if depth != 0 {
        return Err(bad(input, "unbalanced parentheses"));
    }
    parts.push(&input[start..]);
    Ok(parts)
}

fn parse_requirement(part: &str) -> Result<LabelRequirement, String> {
    if let Some(key) = part.strip_prefix('!') {
        return Ok(LabelRequirement::NotExists(valid_key(key.trim())?));
    }
    for (op, ctor) in [
        (
            "!=",
            LabelRequirement::NotEquals as fn(String, String) -> LabelRequirement,
        ),
        ("==", LabelRequirement::Equals),
        ("=", LabelRequirement::Equals),
    ] {
        if let Some((k, v)) = part.split_once(op) {
            return Ok(ctor(valid_key(k.trim())?, valid_value(v.trim())?));
        }
    }
    let words: Vec<&str> = part.splitn(2, char::is_whitespace).collect();
    if words.len() == 2 {
        let key = valid_key(words[0])?;
        let rest = words[1].trim();
        let (op, set) = if let Some(s) = rest.strip_prefix("notin") {
            ("notin", s)
        } else if let Some(s) = rest.strip_prefix("in") {
            ("in", s)
        } else {
            return Err(format!("unknown operator in {rest:?}"));
        };
        let set = set.trim();
        let inner = set
            .strip_prefix('(')
            .and_then(|s| s.strip_suffix(')'))
            .ok_or_else(|| "expected a parenthesised set of values".to_string())?;
        let values = inner
            .split(',')
            .map(|v| valid_value(v.trim()))
            .collect::<Result<BTreeSet<_>, _>>()?;
        if values.iter().all(String::is_empty) {
            return Err("for 'in', 'notin' operators, values set can't be empty".into());
        }
        return Ok(if op == "in" {
            LabelRequirement::In(key, values)
        } else {
            LabelRequirement::NotIn(key, values)
        });
    }
    Ok(LabelRequirement::Exists(valid_key(part)?))
}

fn valid_key(key: &str) -> Result<String, String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix
        && (p.is_empty()
            || p.len() > 253
            || !p
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.'))
    {
        return Err(format!("invalid label key prefix {p:?}"));
    }
    if name.is_empty() || name.len() > 63 || !is_label_token(name) {
        return Err(format!("invalid label key {key:?}"));
    }
    Ok(key.to_string())
}

fn valid_value(value: &str) -> Result<String, String> {
    if value.len() > 63 || (!value.is_empty() && !is_label_token(value)) {
        return Err(format!("invalid label value {value:?}"));
    }
    Ok(value.to_string())
}

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`
fn is_label_token(s: &str) -> bool {
    let alnum = |c: char| c.is_ascii_alphanumeric();
    s.starts_with(alnum)
        && s.ends_with(alnum)
        && s.chars().all(|c| alnum(c) || matches!(c, '-' | '_' | '.'))
}

/// A parsed `fieldSelector` over `metadata.name`, `metadata.namespace` and the resource's selectable fields.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    pub fn parse(input: &str, selectable: &[String]) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for part in input.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (field, equal, value) = if let Some((f, v)) = part.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, true, v)
            } else {
                return Err(ApiError::BadRequest(format!(
                    "invalid selector: '{input}'; can't understand '{part}'"
                )));
            };
            let field = field.trim();
            if field != "metadata.name"
                && field != "metadata.namespace"
                && !selectable.iter().any(|s| s == field)
            {
                return Err(ApiError::BadRequest(format!(
                    "field label not supported: {field}"
                )));
            }
            reqs.push((field.to_string(), equal, value.trim().to_string()));
        }
        Ok(Self(reqs))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(field, equal, value)| {
            let pointer = format!("/{}", field.replace('.', "/"));
            let actual = match obj.pointer(&pointer) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => String::new(),
                Some(other) => other.to_string(),
            };
            (actual == *value) == *equal
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "namespace": "ns1", "labels": labels}})
    }

    #[test]
    fn label_selector_table() {
        let o = obj(json!({"app": "web", "tier": "front"}));
        let cases = [
            ("app=web", true),
            ("app==web", true),
            ("app!=web", false),
            ("app!=db", true),
            ("missing!=x", true),
            ("app in (web,db)", true),
            ("app in (db)", false),
            ("app notin (db)", true),
            ("missing notin (db)", true),
            ("app", true),
            ("!app", false),
            ("!missing", true),
            ("app=web,tier=front", true),
            ("app=web,tier in (back, middle)", false),
            ("", true),
        ];
        for (sel, want) in cases {
            assert_eq!(
                LabelSelector::parse(sel).unwrap().matches(&o),
                want,
                "selector {sel:?}"
            );
        }
    }

    #[test]
    fn malformed_label_selectors_are_bad_requests() {
        for sel in [
            "app in (web",
            "a b c",
            "app=web,,x=y",
            "bad key=1",
            "app in ()",
            "-x=1",
        ] {
            let err = LabelSelector::parse(sel).unwrap_err();
            assert_eq!(err.code(), 400, "selector {sel:?}");
        }
    }

    #[test]
    fn field_selector_table() {
        let o = obj(json!({}));
        let cases = [
            ("metadata.name=a", true),
            ("metadata.name==a", true),
            ("metadata.name!=a", false),
            ("metadata.namespace=ns1,metadata.name=a", true),
            ("metadata.namespace=ns2", false),
        ];
        for (sel, want) in cases {
            assert_eq!(
                FieldSelector::parse(sel, &[]).unwrap().matches(&o),
                want,
                "selector {sel:?}"
            );
        }
        assert_eq!(
            FieldSelector::parse("spec.x=1", &[]).unwrap_err().code(),
            400
        );
        let with_extra =
            FieldSelector::parse("spec.nodeName=n1", &["spec.nodeName".into()]).unwrap();
        assert!(with_extra.matches(&json!({"spec": {"nodeName": "n1"}})));
    }
}
