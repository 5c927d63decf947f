//! Which etcd members this process defragmented, and at which revision, per
//! workload cluster (kept in the [`super::Context`]). The space rule judges a
//! member unable to shrink only from sizes a defragmentation measured
//! ([`crate::space_rule::MemberSpace::measured`]): etcd's `dbSizeInUse` is only as
//! fresh as the member's last backend commit.

use std::collections::{BTreeMap, HashMap};

use crate::space_rule::Defragmentation;

/// Member id -> what we measured when we defragmented it, per cluster
/// (`namespace/cluster`).
#[derive(Debug, Default)]
pub struct Defragmented(HashMap<String, BTreeMap<u64, Defragmentation>>);

impl Defragmented {
    pub fn record(&mut self, cluster: &str, member: u64, done: Defragmentation) {
        self.0
            .entry(cluster.to_string())
            .or_default()
            .insert(member, done);
    }

    /// What is recorded for `cluster`, keeping only the members still listed.
    pub fn of(&mut self, cluster: &str, members: &[u64]) -> BTreeMap<u64, Defragmentation> {
        let Some(known) = self.0.get_mut(cluster) else {
            return BTreeMap::new();
        };
        known.retain(|id, _| members.contains(id));
        if known.is_empty() {
            self.0.remove(cluster);
            return BTreeMap::new();
        }
        known.clone()
    }

    /// A compaction frees pages a defragmentation had not: nothing measured
    /// before it says what a defragmentation leaves now.
    pub fn forget(&mut self, cluster: &str) {
        self.0.remove(cluster);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(revision: i64) -> Defragmentation {
        Defragmentation {
            revision,
            history_compacted: false,
        }
    }

    #[test]
    fn a_member_no_longer_listed_is_forgotten_and_a_compaction_forgets_all() {
        let mut d = Defragmented::default();
        d.record("ns/a", 1, at(40));
        d.record("ns/a", 2, at(40));
        d.record("ns/b", 1, at(7));
        assert_eq!(d.of("ns/a", &[2, 3]), BTreeMap::from([(2, at(40))]));
        assert_eq!(d.of("ns/a", &[1, 2]), BTreeMap::from([(2, at(40))]));
        d.forget("ns/a");
        assert!(d.of("ns/a", &[1, 2]).is_empty());
        assert_eq!(
            d.of("ns/b", &[1]),
            BTreeMap::from([(1, at(7))]),
            "another cluster's kept"
        );
        assert!(d.of("ns/b", &[]).is_empty());
        assert!(
            d.0.is_empty(),
            "nothing held for clusters with nothing recorded"
        );
    }
}
