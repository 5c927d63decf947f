//! Snapshot names in k3s's own format, `<prefix>-<node>-<unix seconds>`
//! (`.zip` appended when compressed), so that k3s lists our snapshots and
//! restores them by name (`--cluster-reset-restore-path=<name>`), with prefixes
//! of our own so that neither side's retention prunes the other's.
//!
//! k3s prunes by name prefix (its `--etcd-snapshot-name`, default
//! `etcd-snapshot`; `on-demand` for `k3s etcd-snapshot save`) and reads the
//! time from the digits after the last `-` (docs/k3s.md, Snapshots). Our
//! prefixes all start with `capi-`, which neither default is a prefix of,
//! and we prune only names that parse as ours.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

/// Why a snapshot was taken: each reason has its own name prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SnapshotReason {
    /// Before a member is removed (scale down, remediation, rollout).
    BeforeRemoval,
    /// On the backup schedule.
    Scheduled,
    /// Asked for by a person (`k3s-control-plane etcd snapshot save`).
    OnDemand,
}

impl SnapshotReason {
    pub const ALL: [SnapshotReason; 3] = [
        SnapshotReason::BeforeRemoval,
        SnapshotReason::Scheduled,
        SnapshotReason::OnDemand,
    ];

    /// The name prefix. None starts with k3s's default prefixes
    /// (`etcd-snapshot`, `on-demand`), and k3s's defaults start with none of
    /// them, so k3s's prefix-based retention never counts ours.
    pub fn prefix(self) -> &'static str {
        match self {
            SnapshotReason::BeforeRemoval => "capi-before-removal",
            SnapshotReason::Scheduled => "capi-scheduled",
            SnapshotReason::OnDemand => "capi-on-demand",
        }
    }

    /// `before-removal`, `scheduled`, `on-demand`: for people and JSON.
    pub fn as_str(self) -> &'static str {
        &self.prefix()["capi-".len()..]
    }
}

impl fmt::Display for SnapshotReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// k3s's suffix for a compressed snapshot (k3s `pkg/etcd/snapshot/types.go`).
pub const COMPRESSED_EXTENSION: &str = ".zip";

/// Whose a name is: one of our prefixes, or anything else (k3s's own, a
/// person's), kept as written.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Prefix {
    Ours(SnapshotReason),
    /// A name we did not write: everything before the timestamp, node
    /// included when the prefix is not one of k3s's defaults (k3s's names
    /// cannot be split into prefix and node in general: both may hold `-`).
    Other(String),
}

/// A snapshot name: `<prefix>-<node>-<unix seconds>[.zip]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SnapshotName {
    pub prefix: Prefix,
    /// The node the snapshot was taken on (for ours, the etcd member's node
    /// name); empty for a foreign name whose node could not be told apart.
    pub node: String,
    /// Unix seconds, as k3s writes them (`time.Now().Round(time.Second)`).
    pub taken_at: i64,
    pub compressed: bool,
}

/// Why a name cannot be made.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("node name {0:?} cannot be part of a snapshot name: {1}")]
    InvalidNode(String, &'static str),
    #[error("snapshot time is before 1970")]
    BeforeEpoch,
}

/// k3s's default prefixes, which a foreign name is split at when it has one.
const K3S_PREFIXES: [&str; 2] = ["etcd-snapshot", "on-demand"];

impl SnapshotName {
    /// Our name for a snapshot of `node`'s member taken at `at`.
    pub fn ours(reason: SnapshotReason, node: &str, at: SystemTime) -> Result<Self, NameError> {
        check_node(node)?;
        let taken_at = at
            .duration_since(UNIX_EPOCH)
            .map_err(|_| NameError::BeforeEpoch)?
            .as_secs() as i64;
        Ok(Self {
            prefix: Prefix::Ours(reason),
            node: node.to_string(),
            taken_at,
            compressed: false,
        })
    }

    /// Parse a snapshot's file or object name (no folder). `None` when it
    /// does not end in `-<digits>` (optionally `.zip`): k3s then falls back
    /// to the file's time, we treat it as not a snapshot name at all.
    pub fn parse(name: &str) -> Option<Self> {
        let (base, compressed) = match name.strip_suffix(COMPRESSED_EXTENSION) {
            Some(base) => (base, true),
            None => (name, false),
        };
        let (head, digits) = base.rsplit_once('-')?;
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || head.is_empty() {
            return None;
        }
        let taken_at: i64 = digits.parse().ok()?;
        for reason in SnapshotReason::ALL {
            if let Some(node) = head
                .strip_prefix(reason.prefix())
                .and_then(|rest| rest.strip_prefix('-'))
                && check_node(node).is_ok()
                && !compressed
            {
                return Some(Self {
                    prefix: Prefix::Ours(reason),
                    node: node.to_string(),
                    taken_at,
                    compressed,
                });
            }
        }
        let (prefix, node) = K3S_PREFIXES
            .iter()
            .find_map(|p| {
                head.strip_prefix(p)
                    .and_then(|rest| rest.strip_prefix('-'))
                    .map(|node| (p.to_string(), node.to_string()))
            })
            .unwrap_or_else(|| (head.to_string(), String::new()));
        Some(Self {
            prefix: Prefix::Other(prefix),
            node,
            taken_at,
            compressed,
        })
    }

    /// Whether we wrote it (and so may prune it).
    pub fn is_ours(&self) -> bool {
        matches!(self.prefix, Prefix::Ours(_))
    }

    pub fn reason(&self) -> Option<SnapshotReason> {
        match self.prefix {
            Prefix::Ours(reason) => Some(reason),
            Prefix::Other(_) => None,
        }
    }

    /// When it was taken, from the name.
    pub fn taken_at_time(&self) -> SystemTime {
        UNIX_EPOCH + std::time::Duration::from_secs(self.taken_at.max(0) as u64)
    }
}

impl fmt::Display for SnapshotName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.prefix {
            Prefix::Ours(reason) => write!(f, "{}-{}", reason.prefix(), self.node)?,
            Prefix::Other(prefix) if self.node.is_empty() => f.write_str(prefix)?,
            Prefix::Other(prefix) => write!(f, "{prefix}-{}", self.node)?,
        }
        write!(f, "-{}", self.taken_at)?;
        if self.compressed {
            f.write_str(COMPRESSED_EXTENSION)?;
        }
        Ok(())
    }
}

/// A node name as Kubernetes allows it (a DNS-1123 subdomain: lower-case
/// alphanumerics, `-` and `.`), which also keeps the name one path segment
/// and a valid resource name for k3s's `ETCDSnapshotFile`.
fn check_node(node: &str) -> Result<(), NameError> {
    let invalid = |why| Err(NameError::InvalidNode(node.to_string(), why));
    if node.is_empty() {
        return invalid("it is empty");
    }
    if node.len() > 200 {
        return invalid("it is longer than 200 characters");
    }
    if !node
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    {
        return invalid("only lower-case letters, digits, '-' and '.' are allowed");
    }
    let edge_ok = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if !edge_ok(node.as_bytes()[0]) || !edge_ok(node.as_bytes()[node.len() - 1]) {
        return invalid("it must start and end with a letter or digit");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn our_names_are_in_k3s_format_with_a_prefix_per_reason() {
        let cases = [
            (
                SnapshotReason::BeforeRemoval,
                "cp-0",
                "capi-before-removal-cp-0-1700000000",
            ),
            (
                SnapshotReason::Scheduled,
                "cp-1.example",
                "capi-scheduled-cp-1.example-1700000000",
            ),
            (
                SnapshotReason::OnDemand,
                "node",
                "capi-on-demand-node-1700000000",
            ),
        ];
        for (reason, node, expected) in cases {
            let name = SnapshotName::ours(reason, node, at(1_700_000_000)).unwrap();
            assert_eq!(name.to_string(), expected);
            let parsed = SnapshotName::parse(expected).expect(expected);
            assert_eq!(parsed, name, "{expected} round-trips");
            assert!(parsed.is_ours());
            assert_eq!(parsed.reason(), Some(reason));
        }
    }

    #[test]
    fn k3s_names_parse_as_not_ours() {
        let cases = [
            (
                "etcd-snapshot-server-0-1700000000",
                "etcd-snapshot",
                "server-0",
                false,
            ),
            (
                "on-demand-server-0-1700000001",
                "on-demand",
                "server-0",
                false,
            ),
            (
                "on-demand-server-0-1700000001.zip",
                "on-demand",
                "server-0",
                true,
            ),
            ("nightly-server-0-1700000002", "nightly-server-0", "", false),
        ];
        for (text, prefix, node, compressed) in cases {
            let name = SnapshotName::parse(text).expect(text);
            assert!(!name.is_ours(), "{text}");
            assert_eq!(name.prefix, Prefix::Other(prefix.into()), "{text}");
            assert_eq!(name.node, node, "{text}");
            assert_eq!(name.compressed, compressed, "{text}");
            assert_eq!(name.to_string(), text, "{text} prints as written");
        }
    }

    #[test]
    fn a_compressed_name_with_our_prefix_is_not_ours() {
        // We never compress: a .zip under our prefix is someone else's.
        let name = SnapshotName::parse("capi-scheduled-cp-0-1700000000.zip").unwrap();
        assert!(!name.is_ours());
    }

    #[test]
    fn names_without_a_timestamp_do_not_parse() {
        for text in [
            "",
            "etcd-snapshot",
            "capi-scheduled-cp-0-",
            "capi-scheduled-cp-0-17x",
            "-1700000000",
            ".metadata",
        ] {
            assert_eq!(SnapshotName::parse(text), None, "{text:?}");
        }
    }

    #[test]
    fn our_prefix_with_an_invalid_node_is_not_ours() {
        let name = SnapshotName::parse("capi-scheduled-CP_0-1700000000").unwrap();
        assert!(!name.is_ours());
    }

    #[test]
    fn neither_side_prefix_matches_the_other() {
        // k3s prunes names that start with its --etcd-snapshot-name.
        for reason in SnapshotReason::ALL {
            for k3s in K3S_PREFIXES {
                assert!(!reason.prefix().starts_with(k3s), "{reason:?} vs {k3s}");
                assert!(!k3s.starts_with(reason.prefix()), "{reason:?} vs {k3s}");
            }
            for other in SnapshotReason::ALL {
                if other != reason {
                    assert!(!other.prefix().starts_with(reason.prefix()));
                }
            }
        }
    }

    #[test]
    fn invalid_node_names_are_refused() {
        for node in ["", "Upper", "a_b", "-a", "a-", "a/b"] {
            assert!(
                SnapshotName::ours(SnapshotReason::Scheduled, node, at(1)).is_err(),
                "{node:?}"
            );
        }
    }
}
