//! Which of our stored snapshots to prune: the pure rule.
//!
//! Only names that parse as ours are ever candidates (k3s's own, and anything
//! else in the folder, are never pruned by us), the newest of ours is always
//! kept, and every pruned name says why.

use std::fmt;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use crate::backup::name::SnapshotName;

/// One object found on a target.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredSnapshot {
    /// The object's name in the target's folder (no folder).
    pub name: String,
    /// The name parsed, when it is a snapshot name at all.
    #[serde(skip)]
    pub parsed: Option<SnapshotName>,
    pub size: u64,
    #[serde(serialize_with = "rfc3339")]
    pub last_modified: SystemTime,
}

impl StoredSnapshot {
    pub fn new(name: &str, size: u64, last_modified: SystemTime) -> Self {
        Self {
            name: name.to_string(),
            parsed: SnapshotName::parse(name),
            size,
            last_modified,
        }
    }

    /// Whether we wrote it.
    pub fn is_ours(&self) -> bool {
        self.parsed.as_ref().is_some_and(SnapshotName::is_ours)
    }
}

fn rfc3339<S: serde::Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&chrono::DateTime::<chrono::Utc>::from(*t).to_rfc3339())
}

/// How many of ours to keep, and for how long.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Retention {
    /// Keep at most this many (newest first); 0 keeps one, as the newest is
    /// always kept. `None`: no limit by count.
    pub count: Option<u32>,
    /// Drop those older than this (by the time in their name). `None`: no
    /// limit by age.
    pub max_age: Option<Duration>,
}

/// Why one snapshot is pruned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PruneReason {
    /// It is the `rank`-th newest of ours (1 = newest) and only `count` are kept.
    BeyondCount { rank: usize, count: u32 },
    /// It is `age` old, more than `max_age`.
    TooOld { age: Duration, max_age: Duration },
}

/// A snapshot to prune, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prune {
    pub name: String,
    pub reason: PruneReason,
}

impl fmt::Display for Prune {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.reason {
            PruneReason::BeyondCount { rank, count } => write!(
                f,
                "{}: number {rank} from the newest of ours, and {count} are kept",
                self.name
            ),
            PruneReason::TooOld { age, max_age } => write!(
                f,
                "{}: {}s old, older than the {}s kept",
                self.name,
                age.as_secs(),
                max_age.as_secs()
            ),
        }
    }
}

/// The snapshots of ours in `stored` that `retention` prunes at `now`, oldest
/// first. Ours are ordered by the time in their name (what we wrote), then by
/// last modification and name so that the order is total. When both limits
/// apply to one snapshot the count is named.
pub fn to_prune(stored: &[StoredSnapshot], retention: &Retention, now: SystemTime) -> Vec<Prune> {
    let mut ours: Vec<(&StoredSnapshot, &SnapshotName)> = stored
        .iter()
        .filter_map(|s| s.parsed.as_ref().filter(|n| n.is_ours()).map(|n| (s, n)))
        .collect();
    // Newest first.
    ours.sort_by(|(a, an), (b, bn)| {
        bn.taken_at
            .cmp(&an.taken_at)
            .then_with(|| b.last_modified.cmp(&a.last_modified))
            .then_with(|| b.name.cmp(&a.name))
    });
    let mut pruned = Vec::new();
    // The newest (index 0) is never pruned.
    for (index, (stored, name)) in ours.iter().enumerate().skip(1) {
        let rank = index + 1;
        let reason = if let Some(count) = retention.count
            && rank > count.max(1) as usize
        {
            Some(PruneReason::BeyondCount { rank, count })
        } else if let Some(max_age) = retention.max_age {
            let age = now
                .duration_since(name.taken_at_time())
                .unwrap_or(Duration::ZERO);
            (age > max_age).then_some(PruneReason::TooOld { age, max_age })
        } else {
            None
        };
        if let Some(reason) = reason {
            pruned.push(Prune {
                name: stored.name.clone(),
                reason,
            });
        }
    }
    pruned.reverse();
    pruned
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    const NOW: u64 = 1_700_100_000;
    const HOUR: u64 = 3600;

    fn t(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    /// A stored object named `name`, modified when its name says (or at NOW).
    fn stored(name: &str) -> StoredSnapshot {
        let modified = SnapshotName::parse(name).map_or(t(NOW), |n| n.taken_at_time());
        StoredSnapshot::new(name, 1024, modified)
    }

    fn ours(reason: &str, hours_ago: u64) -> String {
        format!("capi-{reason}-cp-0-{}", NOW - hours_ago * HOUR)
    }

    fn names(pruned: &[Prune]) -> Vec<&str> {
        pruned.iter().map(|p| p.name.as_str()).collect()
    }

    #[test]
    fn retention_cases() {
        struct Case {
            name: &'static str,
            stored: Vec<String>,
            retention: Retention,
            pruned: Vec<String>,
        }
        let k3s_old = format!("etcd-snapshot-cp-0-{}", NOW - 1000 * HOUR);
        let cases = vec![
            Case {
                name: "no limits prune nothing",
                stored: vec![
                    ours("scheduled", 3),
                    ours("scheduled", 2),
                    ours("scheduled", 1),
                ],
                retention: Retention::default(),
                pruned: vec![],
            },
            Case {
                name: "count keeps the newest N of ours",
                stored: vec![
                    ours("scheduled", 1),
                    ours("scheduled", 4),
                    ours("before-removal", 2),
                    ours("on-demand", 3),
                ],
                retention: Retention {
                    count: Some(2),
                    max_age: None,
                },
                pruned: vec![ours("scheduled", 4), ours("on-demand", 3)],
            },
            Case {
                name: "k3s's own snapshots are neither counted nor pruned",
                stored: vec![
                    k3s_old.clone(),
                    format!("on-demand-cp-1-{}", NOW - 500 * HOUR),
                    ours("scheduled", 2),
                    ours("scheduled", 1),
                ],
                retention: Retention {
                    count: Some(1),
                    max_age: Some(Duration::from_secs(HOUR)),
                },
                pruned: vec![ours("scheduled", 2)],
            },
            Case {
                name: "objects that are not snapshot names are never pruned",
                stored: vec![
                    "notes.txt".into(),
                    ours("scheduled", 5),
                    ours("scheduled", 1),
                ],
                retention: Retention {
                    count: Some(1),
                    max_age: None,
                },
                pruned: vec![ours("scheduled", 5)],
            },
            Case {
                name: "max age drops the old ones",
                stored: vec![
                    ours("scheduled", 30),
                    ours("scheduled", 25),
                    ours("scheduled", 1),
                ],
                retention: Retention {
                    count: None,
                    max_age: Some(Duration::from_secs(24 * HOUR)),
                },
                pruned: vec![ours("scheduled", 30), ours("scheduled", 25)],
            },
            Case {
                name: "the newest of ours is kept however old",
                stored: vec![ours("scheduled", 100), ours("scheduled", 50)],
                retention: Retention {
                    count: None,
                    max_age: Some(Duration::from_secs(HOUR)),
                },
                pruned: vec![ours("scheduled", 100)],
            },
            Case {
                name: "a count of zero keeps the newest",
                stored: vec![ours("scheduled", 2), ours("scheduled", 1)],
                retention: Retention {
                    count: Some(0),
                    max_age: None,
                },
                pruned: vec![ours("scheduled", 2)],
            },
            Case {
                name: "within both limits nothing is pruned",
                stored: vec![ours("scheduled", 2), ours("scheduled", 1)],
                retention: Retention {
                    count: Some(5),
                    max_age: Some(Duration::from_secs(24 * HOUR)),
                },
                pruned: vec![],
            },
            Case {
                name: "nothing of ours: nothing pruned",
                stored: vec![k3s_old.clone()],
                retention: Retention {
                    count: Some(1),
                    max_age: Some(Duration::from_secs(1)),
                },
                pruned: vec![],
            },
        ];
        for case in cases {
            let stored: Vec<StoredSnapshot> = case.stored.iter().map(|n| stored(n)).collect();
            let pruned = to_prune(&stored, &case.retention, t(NOW));
            let expected: Vec<&str> = case.pruned.iter().map(String::as_str).collect();
            assert_eq!(names(&pruned), expected, "{}", case.name);
        }
    }

    #[test]
    fn each_pruned_name_says_why() {
        let stored: Vec<StoredSnapshot> = [
            ours("scheduled", 30),
            ours("scheduled", 2),
            ours("scheduled", 1),
        ]
        .iter()
        .map(|n| stored(n))
        .collect();
        let retention = Retention {
            count: Some(2),
            max_age: Some(Duration::from_secs(HOUR)),
        };
        let pruned = to_prune(&stored, &retention, t(NOW));
        assert_eq!(
            pruned,
            vec![
                Prune {
                    name: ours("scheduled", 30),
                    reason: PruneReason::BeyondCount { rank: 3, count: 2 },
                },
                Prune {
                    name: ours("scheduled", 2),
                    reason: PruneReason::TooOld {
                        age: Duration::from_secs(2 * HOUR),
                        max_age: Duration::from_secs(HOUR),
                    },
                },
            ]
        );
        assert!(
            pruned[0]
                .to_string()
                .contains("number 3 from the newest of ours, and 2 are kept")
        );
        assert!(
            pruned[1]
                .to_string()
                .contains("7200s old, older than the 3600s kept")
        );
    }

    #[test]
    fn same_second_snapshots_order_by_modification_then_name() {
        let a = StoredSnapshot::new("capi-scheduled-cp-0-100", 1, t(100));
        let b = StoredSnapshot::new("capi-scheduled-cp-1-100", 1, t(101));
        let pruned = to_prune(
            &[a, b],
            &Retention {
                count: Some(1),
                max_age: None,
            },
            t(200),
        );
        assert_eq!(names(&pruned), vec!["capi-scheduled-cp-0-100"]);
    }
}
