//! The one protobuf body the test API server reads: `DeleteOptions`.
//!
//! controller-runtime clients (Cluster API's, for one) send requests about
//! built-in kinds as `application/vnd.kubernetes.protobuf`, and client-go falls
//! back to JSON on a 415 only for CBOR, not for protobuf: a DELETE of a Node
//! from Cluster API's Machine controller carries a protobuf `DeleteOptions`.
//! Object bodies (create, update) in protobuf still get 415.
//!
//! Wire format: the `k8s\0` magic, then `runtime.Unknown` (field 2 `raw`
//! holds the message), whose `raw` is `meta.v1.DeleteOptions`:
//! 1 `gracePeriodSeconds`, 2 `preconditions` {1 `uid`, 2 `resourceVersion`},
//! 3 `orphanDependents`, 4 `propagationPolicy`, 5 `dryRun` (repeated).

use serde_json::{Map, Value, json};

const MAGIC: &[u8] = b"k8s\0";

/// The DeleteOptions of a protobuf body, as the JSON the JSON path would have
/// read; `None` if the body is not a well-formed protobuf envelope.
pub fn delete_options(body: &[u8]) -> Option<Value> {
    let unknown = body.strip_prefix(MAGIC)?;
    let mut raw: &[u8] = &[];
    for field in fields(unknown)? {
        if let (2, Field::Bytes(bytes)) = field {
            raw = bytes;
        }
    }
    let mut out = Map::new();
    let mut dry_run = vec![];
    for field in fields(raw)? {
        match field {
            (1, Field::Varint(v)) => {
                out.insert("gracePeriodSeconds".into(), json!(v as i64));
            }
            (2, Field::Bytes(pre)) => {
                let mut p = Map::new();
                for f in fields(pre)? {
                    match f {
                        (1, Field::Bytes(s)) => {
                            p.insert("uid".into(), json!(std::str::from_utf8(s).ok()?));
                        }
                        (2, Field::Bytes(s)) => {
                            p.insert(
                                "resourceVersion".into(),
                                json!(std::str::from_utf8(s).ok()?),
                            );
                        }
                        _ => {}
                    }
                }
                out.insert("preconditions".into(), Value::Object(p));
            }
            (3, Field::Varint(v)) => {
                out.insert("orphanDependents".into(), json!(v != 0));
            }
            (4, Field::Bytes(s)) => {
                out.insert(
                    "propagationPolicy".into(),
                    json!(std::str::from_utf8(s).ok()?),
                );
            }
            (5, Field::Bytes(s)) => dry_run.push(json!(std::str::from_utf8(s).ok()?)),
            _ => {}
        }
    }
    if !dry_run.is_empty() {
        out.insert("dryRun".into(), Value::Array(dry_run));
    }
    Some(Value::Object(out))
}

enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

fn varint(buf: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = buf.split_first()?;
        *buf = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

fn fields(mut buf: &[u8]) -> Option<Vec<(u64, Field<'_>)>> {
    let mut out = vec![];
    while !buf.is_empty() {
        let key = varint(&mut buf)?;
        let field = match key & 7 {
            0 => Field::Varint(varint(&mut buf)?),
            1 => {
                buf = buf.get(8..)?;
                Field::Fixed
            }
            2 => {
                let len = usize::try_from(varint(&mut buf)?).ok()?;
                let bytes = buf.get(..len)?;
                buf = &buf[len..];
                Field::Bytes(bytes)
            }
            5 => {
                buf = buf.get(4..)?;
                Field::Fixed
            }
            _ => return None,
        };
        out.push((key >> 3, field));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_field(field: u8, data: &[u8]) -> Vec<u8> {
        let mut out = vec![(field << 3) | 2, data.len() as u8];
        out.extend_from_slice(data);
        out
    }

    fn envelope(raw: &[u8]) -> Vec<u8> {
        let type_meta = [bytes_field(1, b"v1"), bytes_field(2, b"DeleteOptions")].concat();
        let unknown = [
            bytes_field(1, &type_meta),
            bytes_field(2, raw),
            bytes_field(4, b""),
        ]
        .concat();
        [MAGIC, &unknown].concat()
    }

    #[test]
    fn an_empty_delete_options_reads_as_no_options() {
        assert_eq!(delete_options(&envelope(&[])), Some(json!({})));
    }

    #[test]
    fn policy_preconditions_grace_and_dry_run_are_read() {
        let pre = [bytes_field(1, b"abc"), bytes_field(2, b"42")].concat();
        let raw = [
            vec![1 << 3, 30],
            bytes_field(2, &pre),
            bytes_field(4, b"Foreground"),
            bytes_field(5, b"All"),
        ]
        .concat();
        assert_eq!(
            delete_options(&envelope(&raw)),
            Some(json!({
                "gracePeriodSeconds": 30, "propagationPolicy": "Foreground",
                "preconditions": {"uid": "abc", "resourceVersion": "42"}, "dryRun": ["All"]
            }))
        );
    }

    #[test]
    fn a_body_without_the_magic_or_truncated_is_refused() {
        assert_eq!(delete_options(b"{}"), None);
        let mut body = envelope(&bytes_field(4, b"Orphan"));
        body.truncate(body.len() - 3);
        assert_eq!(delete_options(&body), None);
    }
}
