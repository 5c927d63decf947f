//! kube's event recorder, forgotten once everything it remembers has expired.
//!
//! kube's [`Recorder`] keeps each Event it published for 6 minutes, so that a
//! repeat within them patches the Event into a series instead of creating a
//! new one, and prunes what is older only when it publishes again. At rest
//! nothing is published, so the Events of the last busy moment stay in
//! memory for good (about 3 KiB per control plane, docs/bench-history.md).
//! [`EventRecorder::prune`] swaps in a fresh recorder once no publish has
//! started or finished for longer than that: every Event the old one holds
//! is then older than 6 minutes, and its next publish would have pruned them
//! all before looking, so the swap changes no Event that is written.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, Recorder, Reporter};

/// kube's cache lifetime (`CACHE_TTL` in kube-runtime's `events.rs`, 6
/// minutes), with a minute to spare for clocks and a publish's own time.
const FORGET_AFTER: Duration = Duration::from_secs(7 * 60);

pub struct EventRecorder {
    client: Client,
    reporter: Reporter,
    state: Mutex<State>,
}

struct State {
    recorder: Recorder,
    /// When a publish last started or finished; `None` while the recorder
    /// holds nothing.
    last: Option<Instant>,
    /// Publishes under way on `recorder`.
    in_flight: usize,
}

impl EventRecorder {
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self {
            state: Mutex::new(State {
                recorder: Recorder::new(client.clone(), reporter.clone()),
                last: None,
                in_flight: 0,
            }),
            client,
            reporter,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// [`Recorder::publish`].
    pub async fn publish(
        &self,
        event: &Event,
        reference: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let recorder = {
            let mut state = self.state();
            state.last = Some(Instant::now());
            state.in_flight += 1;
            state.recorder.clone()
        };
        // Counted out when the publish ends, or is dropped unfinished.
        let _in_flight = InFlight(self);
        recorder.publish(event, reference).await
    }

    /// Forget every Event remembered, if all of them have expired.
    pub fn prune(&self) {
        self.prune_at(Instant::now());
    }

    fn prune_at(&self, now: Instant) -> bool {
        let mut state = self.state();
        let expired = state.in_flight == 0
            && state
                .last
                .is_some_and(|last| now.saturating_duration_since(last) > FORGET_AFTER);
        if expired {
            state.recorder = Recorder::new(self.client.clone(), self.reporter.clone());
            state.last = None;
        }
        expired
    }
}

/// A publish under way; its end counts as the recorder's last use.
struct InFlight<'a>(&'a EventRecorder);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut state = self.0.state();
        state.last = Some(Instant::now());
        state.in_flight -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorder() -> EventRecorder {
        // Never contacted: no publish is made.
        let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        let client = Client::try_from(config).unwrap();
        EventRecorder::new(
            client,
            Reporter {
                controller: "test".into(),
                instance: None,
            },
        )
    }

    #[tokio::test]
    async fn the_recorder_is_replaced_only_once_everything_it_holds_expired() {
        let events = recorder();
        let start = Instant::now();
        assert!(!events.prune_at(start + FORGET_AFTER * 2), "nothing held");
        events.state().last = Some(start);
        assert!(!events.prune_at(start + FORGET_AFTER), "not yet expired");
        events.state().in_flight = 1;
        assert!(
            !events.prune_at(start + FORGET_AFTER * 2),
            "a publish under way"
        );
        events.state().in_flight = 0;
        assert!(events.prune_at(start + FORGET_AFTER + Duration::from_secs(1)));
        assert!(events.state().last.is_none());
        assert!(!events.prune_at(start + FORGET_AFTER * 3), "already fresh");
    }
}
