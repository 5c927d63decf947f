//! Helpers for the CEL rules of our CRDs.

/// `pattern` as a single-quoted CEL string literal.
pub(crate) fn cel_string(pattern: &str) -> String {
    format!("'{}'", pattern.replace('\\', "\\\\").replace('\'', "\\'"))
}
