//! The etcd leadership moves this process started and has not yet seen
//! finish, by cluster (held in the [`super::super::context::Context`], read
//! by [`super`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::decision::world::LeadershipMove;

/// The moves started, by cluster (`namespace/cluster`): at most one each, as
/// one removal runs at a time.
#[derive(Clone, Default)]
pub struct LeadershipMoves(Arc<Mutex<HashMap<String, (LeadershipMove, Instant)>>>);

impl LeadershipMoves {
    pub(super) fn get(&self, cluster: &str) -> Option<(LeadershipMove, Instant)> {
        self.lock().get(cluster).cloned()
    }

    pub(super) fn insert(&self, cluster: &str, started: LeadershipMove) {
        self.lock()
            .insert(cluster.to_string(), (started, Instant::now()));
    }

    /// Forget the move of `cluster` if it is still `which` (a newer one stays).
    pub(super) fn forget(&self, cluster: &str, which: &LeadershipMove) {
        let mut moves = self.lock();
        if moves.get(cluster).is_some_and(|(m, _)| m == which) {
            moves.remove(cluster);
        }
    }

    /// Everything held for `cluster` (its control plane is gone).
    pub fn forget_cluster(&self, cluster: &str) {
        self.lock().remove(cluster);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (LeadershipMove, Instant)>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}
