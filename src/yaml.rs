//! YAML in and out, with one set of options: the files we generate, the
//! kubeconfigs we write and read, and the test API server's YAML bodies.
//!
//! The crate is serde-saphyr (kube reads kubeconfigs with it too). Writing, a
//! string that a YAML 1.1 reader such as kubectl or kube-apiserver would take
//! for another type (`"1"`, `"true"`, `"on"`, `"y"`, `"0755"`, `"1_000"`, `"~"`)
//! is quoted; a long string stays on one line and a multi-line one is a
//! literal block. Reading, plain scalars mean what kube-apiserver's YAML 1.1
//! reader makes of them (`on` and `yes` are booleans, `0755` is octal), the
//! last of repeated keys wins, and errors say where (line and column) without
//! quoting the input: a kubeconfig holds a private key.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A document that is not YAML, or not of the type asked for.
pub type ReadError = serde_saphyr::Error;
/// A value that cannot be written as YAML.
pub type WriteError = serde_saphyr::SerializeError;

fn write_options() -> serde_saphyr::SerializerOptions {
    serde_saphyr::ser_options! {
        // Never fold a long string over lines (descriptions stay one line each).
        folded_wrap_chars: usize::MAX,
    }
}

fn read_options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        legacy_octal_numbers: true,
        duplicate_keys: serde_saphyr::DuplicateKeyPolicy::LastWins,
        with_snippet: false,
        // serde_json's nesting limit, well past any Kubernetes object.
        budget: serde_saphyr::budget! { max_depth: 128 },
    }
}

/// One YAML document, no leading `---`.
pub fn to_string<T: Serialize>(value: &T) -> Result<String, WriteError> {
    serde_saphyr::to_string_with_options(value, write_options())
}

/// The one document of `text` (a stream of several is an error).
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, ReadError> {
    serde_saphyr::from_str_with_options(text, read_options())
}

/// [`from_str`] of UTF-8 bytes.
pub fn from_slice<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ReadError> {
    serde_saphyr::from_slice_with_options(bytes, read_options())
}

/// Every document of a `---` separated stream, in order; empty documents
/// (and ones that are only `null` or comments) are left out.
pub fn documents<T: DeserializeOwned>(text: &str) -> Result<Vec<T>, ReadError> {
    serde_saphyr::from_multiple_with_options(text, read_options())
}

/// Where (line, column; from 1) a read failed, if the error says.
pub fn error_location(error: &ReadError) -> Option<(u64, u64)> {
    error.location().map(|at| (at.line(), at.column()))
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    /// Strings a YAML 1.1 or 1.2 reader could take for a number, a boolean, a
    /// null, a timestamp or YAML syntax, as Kubernetes objects hold them.
    const TRICKY: &[&str] = &[
        "1",
        "true",
        "false",
        "0755",
        "0999",
        "007",
        "on",
        "off",
        "yes",
        "no",
        "y",
        "n",
        "Y",
        "N",
        "On",
        "OFF",
        "True",
        "NULL",
        "null",
        "~",
        "",
        "v1.30",
        "1.30",
        "1.3",
        "1e3",
        "1.0e+3",
        "0x1F",
        "0o17",
        "0b101",
        "1_000",
        "+1",
        "-1",
        "-0",
        ".5",
        "1.",
        ".inf",
        "-.inf",
        ".nan",
        "1:20",
        "12:30:00",
        "2001-12-14",
        "=",
        "<<",
        "*a",
        "&a",
        "!t",
        "%d",
        "@a",
        "`b",
        "{x}",
        "[x]",
        "a: b",
        "x #y",
        "#x",
        "- x",
        "-",
        "?",
        ":",
        "---",
        "...",
        " lead",
        "trail ",
        "tab\there",
        "multi\nline\n",
        "multi\nline",
        "'s'",
        "\"q\"",
        "a\\b",
        "ü",
        "${NAMESPACE}",
        "0.0.0.0",
        "10.0.0.1",
        "1,000",
    ];

    #[test]
    fn strings_that_look_like_other_types_read_back_as_the_same_strings() {
        let value = Value::Array(TRICKY.iter().map(|s| json!(s)).collect());
        let yaml = to_string(&value).unwrap();
        let back: Value = from_str(&yaml).unwrap();
        assert_eq!(back, value, "{yaml}");
        // As map keys and values too.
        let map: Value = TRICKY.iter().map(|s| (s.to_string(), json!(s))).collect();
        let yaml = to_string(&map).unwrap();
        assert_eq!(from_str::<Value>(&yaml).unwrap(), map, "{yaml}");
    }

    #[test]
    fn the_yaml_1_1_spellings_are_quoted_for_kubectl() {
        let yaml = to_string(&json!({"a": "on", "b": "yes", "c": "y", "d": "0755", "e": "1_000"}))
            .unwrap();
        for plain in ["a: on", "b: yes", "c: y", "d: 0755", "e: 1_000"] {
            assert!(!yaml.contains(&format!("{plain}\n")), "{yaml}");
        }
    }

    #[test]
    fn numbers_booleans_and_nulls_keep_their_json_types() {
        let value = json!({
            "int": 1, "negative": -3, "float": 1.5, "whole float": 1.0, "big": 1e100,
            "u64": u64::MAX, "i64": i64::MIN, "true": true, "false": false, "null": null,
            "empty list": [], "empty map": {}, "nested": [{"x": [1, [2]], "y": {"z": "1"}}],
        });
        let yaml = to_string(&value).unwrap();
        assert_eq!(from_str::<Value>(&yaml).unwrap(), value, "{yaml}");
    }

    #[test]
    fn long_strings_stay_on_one_line_and_multi_line_ones_are_literal_blocks() {
        let long = "word ".repeat(40).trim_end().to_string();
        let yaml = to_string(&json!({"description": long, "script": "a\nb\n"})).unwrap();
        assert!(yaml.contains(&format!("description: {long}\n")), "{yaml}");
        assert!(yaml.contains("script: |\n  a\n  b\n"), "{yaml}");
    }

    #[test]
    fn plain_scalars_read_as_kube_apiserver_reads_them() {
        let read: Value =
            from_str("[1, 1.5, true, on, yes, off, 0755, \"0755\", v1.30, ~, '1', 0x1F]").unwrap();
        assert_eq!(
            read,
            json!([
                1, 1.5, true, true, true, false, 493, "0755", "v1.30", null, "1", 31
            ])
        );
        // A typed string field keeps the spelling.
        #[derive(serde::Deserialize)]
        struct File {
            permissions: String,
        }
        let file: File = from_str("permissions: 0644").unwrap();
        assert_eq!(file.permissions, "0644");
    }

    #[test]
    fn streams_skip_empty_documents_and_one_document_is_not_a_stream() {
        let text = "# header\n---\nkind: A\n---\n# nothing\n---\n---\nkind: B\n...\n---\nkind: C\n";
        let docs: Vec<Value> = documents(text).unwrap();
        assert_eq!(
            docs,
            [
                json!({"kind": "A"}),
                json!({"kind": "B"}),
                json!({"kind": "C"})
            ]
        );
        assert!(from_str::<Value>(text).is_err());
        assert!(documents::<Value>("").unwrap().is_empty());
    }

    #[test]
    fn the_last_of_repeated_keys_wins() {
        assert_eq!(from_str::<Value>("a: 1\na: 2\n").unwrap(), json!({"a": 2}));
    }

    #[test]
    fn errors_give_the_place_and_never_quote_the_input() {
        let secret = "c2VjcmV0LWtleS1tYXRlcmlhbA";
        let text = format!("users:\n- name: admin\n  user:\n    client-key-data: [{secret}\n");
        let err = from_str::<Value>(&text).unwrap_err();
        assert!(!err.to_string().contains(secret), "{err}");
        assert!(!err.to_string().contains('\n'), "{err}");
        assert!(error_location(&err).is_some(), "{err}");
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Typed {
            port: u16,
        }
        let err = from_str::<Typed>(&format!("port: {secret}\n")).unwrap_err();
        assert_eq!(error_location(&err).map(|(line, _)| line), Some(1), "{err}");
    }
}
