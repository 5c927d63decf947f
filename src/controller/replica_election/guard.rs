//! Whether this replica may act now: the guard the replicas' election moves
//! ([`super`] holds the Lease; everything that writes asks the guard).

use std::time::Instant;

use tokio::sync::watch;

/// Whether this process may act now. Cheap to clone; every clone sees the same
/// election. The default guard (no election) always leads.
#[derive(Clone, Debug, Default)]
pub struct LeaderGuard {
    /// `None`: no election, always leading. `Some`: leading while the deadline
    /// it holds lies in the future.
    deadline: Option<watch::Receiver<Option<Instant>>>,
}

impl LeaderGuard {
    /// A guard that always leads: leader election is disabled.
    pub fn always() -> Self {
        LeaderGuard::default()
    }

    /// A guard and the sender that moves its deadline.
    pub(super) fn elected() -> (Self, watch::Sender<Option<Instant>>) {
        let (tx, rx) = watch::channel(None);
        (LeaderGuard { deadline: Some(rx) }, tx)
    }

    /// Whether leader election is in use at all.
    pub fn is_elected(&self) -> bool {
        self.deadline.is_some()
    }

    /// True while this process holds a Lease whose renew deadline has not
    /// passed. Turns false by itself at the deadline, without any task running.
    pub fn is_leading(&self) -> bool {
        match &self.deadline {
            None => true,
            Some(rx) => rx.borrow().is_some_and(|d| Instant::now() < d),
        }
    }

    /// Resolves once [`LeaderGuard::is_leading`] is true.
    pub async fn acquired(&self) {
        let Some(rx) = &self.deadline else { return };
        let mut rx = rx.clone();
        loop {
            if rx.borrow_and_update().is_some_and(|d| Instant::now() < d) {
                return;
            }
            if rx.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }

    /// Resolves the moment [`LeaderGuard::is_leading`] turns false (at once if
    /// it is false now). Never resolves for the default guard.
    pub async fn lost(&self) {
        let Some(rx) = &self.deadline else {
            return std::future::pending().await;
        };
        let mut rx = rx.clone();
        loop {
            let deadline = *rx.borrow_and_update();
            match deadline {
                Some(d) if Instant::now() < d => {
                    tokio::select! {
                        // Re-read: a renewal may have moved the deadline.
                        _ = tokio::time::sleep_until(d.into()) => {}
                        changed = rx.changed() => if changed.is_err() { return },
                    }
                }
                _ => return,
            }
        }
    }
}
