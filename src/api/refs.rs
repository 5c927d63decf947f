//! Small shared pieces of the CAPI and cluster-api-k3s schemas: object references,
//! template metadata and Go duration strings.

use std::collections::BTreeMap;

use std::sync::LazyLock;

use regex::Regex;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Go `time.ParseDuration` syntax. The CRD's CEL rules use the same pattern
/// before calling `duration()`, which would otherwise fail with an evaluation
/// error instead of our message.
pub const GO_DURATION_PATTERN: &str =
    r"^[-+]?(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+$|^[-+]?0$";

/// `maxLength` of every Go duration field. The API server's CEL cost estimate
/// needs a bound on each string a rule reads; no sensible duration comes near it.
pub const GO_DURATION_MAX_LENGTH: usize = 64;

static GO_DURATION: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(GO_DURATION_PATTERN).expect("duration pattern compiles"));

/// CAPI v1beta2 reference whose API version comes from the CRD contract labels
/// (`infrastructureRef`, `bootstrap.configRef`, `controlPlaneRef`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContractVersionedObjectReference {
    /// API group of the referent, e.g. `infrastructure.cluster.x-k8s.io`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_group: String,
    /// Kind of the referent.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// Name of the referent (same namespace).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
}

/// Labels and annotations applied to objects created from a template
/// (`clusterv1.ObjectMeta` in Go, a subset of metav1.ObjectMeta).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateMeta {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl TemplateMeta {
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.annotations.is_empty()
    }
}

/// A Go `time.Duration` string as `metav1.Duration` writes it (`30m`, `1h30m`, `0s`).
///
/// Kept as the original text so objects round-trip byte for byte; parse it with
/// [`GoDuration::parse`] (Go syntax, via `kube::core::Duration`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(transparent)]
pub struct GoDuration(pub String);

/// A Go duration string that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("{text:?} is not a duration like 30s, 30m, 1h30m")]
pub struct DurationParseError {
    pub text: String,
    #[source]
    pub source: Option<kube::core::duration::ParseError>,
}

impl GoDuration {
    pub fn new(text: impl Into<String>) -> Self {
        Self(text.into())
    }

    /// Parse with Go `time.ParseDuration` syntax; the result keeps the sign.
    pub fn parse(&self) -> Result<kube::core::Duration, DurationParseError> {
        // kube's parser is lenient where Go is not (it reads "" as 0s).
        if self.0.len() > GO_DURATION_MAX_LENGTH || !GO_DURATION.is_match(&self.0) {
            return Err(DurationParseError {
                text: self.0.clone(),
                source: None,
            });
        }
        self.0.parse().map_err(|source| DurationParseError {
            text: self.0.clone(),
            source: Some(source),
        })
    }

    /// The non-negative length, or `None` when the text is invalid or negative.
    pub fn non_negative(&self) -> Option<std::time::Duration> {
        self.parse()
            .ok()
            .filter(|d| !d.is_negative())
            .map(Into::into)
    }
}

impl JsonSchema for GoDuration {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "GoDuration".into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        // Not `format: duration`: that means ISO 8601, which Go durations are not.
        schemars::json_schema!({ "type": "string", "maxLength": GO_DURATION_MAX_LENGTH })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn go_duration_syntax_parses() {
        let cases = [
            ("0s", Some(Duration::ZERO)),
            ("0", Some(Duration::ZERO)),
            ("30m", Some(Duration::from_secs(1800))),
            ("1h30m", Some(Duration::from_secs(5400))),
            ("1h0m0s", Some(Duration::from_secs(3600))),
            ("1.5h", Some(Duration::from_secs(5400))),
            ("250ms", Some(Duration::from_millis(250))),
            ("-1h", None),
            ("", None),
            ("1 hour", None),
            ("1d", None),
            ("h", None),
            (".5s", Some(Duration::from_millis(500))),
            ("+5s", Some(Duration::from_secs(5))),
            ("1h-5m", None),
        ];
        for (text, want) in cases {
            assert_eq!(GoDuration::new(text).non_negative(), want, "{text:?}");
        }
    }

    #[test]
    fn negative_duration_parses_with_sign() {
        let d = GoDuration::new("-30s").parse().unwrap();
        assert!(d.is_negative());
    }

    #[test]
    fn parse_error_names_the_text() {
        let err = GoDuration::new("soon").parse().unwrap_err();
        assert!(err.to_string().contains("\"soon\""), "{err}");
    }
}
