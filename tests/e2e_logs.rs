//! Logs an operator can run at INFO: while nothing is wrong, nothing is
//! logged at ERROR. A bring-up from nothing passes through every expected
//! wait (no workload API while the first server boots, servers joining one at
//! a time, learners promoted): none of them is an error.
//!
//! A test binary of its own, not a module of tests/e2e: it installs the
//! process-wide tracing subscriber (`init`, which panics if one is set) and
//! fails on any ERROR logged anywhere in the process, so it must not share a
//! process with other tests (the e2e faults log errors on purpose, and their
//! `init_logs` would race for the subscriber).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k3s_control_plane::harness::bringup::BringUp;
use k3s_control_plane::harness::infra_sim::reconcile_infrastructure;
use k3s_control_plane::harness::sandbox::fast_settings;
use tracing::Level;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

const LIMIT: Duration = Duration::from_secs(60);

/// Records every ERROR event (target and message) and counts the rest.
#[derive(Clone, Default)]
struct Recorder {
    errors: Arc<Mutex<Vec<String>>>,
    lines: Arc<Mutex<usize>>,
}

struct Message(String);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!(" {}={value:?}", field.name()));
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Recorder {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        *self.lines.lock().unwrap() += 1;
        if *event.metadata().level() == Level::ERROR {
            let mut message = Message(event.metadata().target().to_string());
            event.record(&mut message);
            self.errors.lock().unwrap().push(message.0);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bring_up_from_nothing_logs_no_error() {
    let recorder = Recorder::default();
    // Everything at DEBUG passes through the recorder; only ERROR is kept.
    tracing_subscriber::registry()
        .with(tracing_subscriber::filter::LevelFilter::DEBUG)
        .with(recorder.clone())
        .init();

    let world = BringUp::start(3).await.unwrap();
    let controller = world.start_controller_with(fast_settings());
    let first = world.wait_first_machine(LIMIT).await.unwrap();
    // The workload API does not exist yet: let the controller try it a few
    // times (its reconciles, counted, not a sleep).
    let tried = controller.ctx.metrics.reconciles.get() + 4;
    let deadline = tokio::time::Instant::now() + LIMIT;
    while controller.ctx.metrics.reconciles.get() < tried {
        assert!(tokio::time::Instant::now() < deadline, "no reconciles");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut sandbox = world.boot_first(&first).await.unwrap();
    let deadline = tokio::time::Instant::now() + LIMIT * 3;
    loop {
        reconcile_infrastructure(&mut sandbox, LIMIT).await.unwrap();
        let ready = sandbox
            .kcp_api()
            .get(k3s_control_plane::harness::sandbox::KCP)
            .await
            .unwrap()
            .status
            .is_some_and(|s| s.ready_replicas == 3);
        if ready {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "not up in time");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    controller.stop().await;
    let errors = recorder.errors.lock().unwrap().clone();
    let lines = *recorder.lines.lock().unwrap();
    assert!(
        lines > 0,
        "nothing was logged at all: the recorder sees nothing"
    );
    assert!(
        errors.is_empty(),
        "{} ERROR lines (of {lines}) while nothing was wrong:\n{}",
        errors.len(),
        errors.join("\n")
    );
}
