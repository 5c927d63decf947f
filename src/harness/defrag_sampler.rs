//! Watching defragmentations from outside: every member sampled back to back
//! (a read served from its own backend, which waits while that member is
//! defragmented, then its `Status` for its file size), and what the samples
//! show: when each member was held, when its file shrank.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use crate::etcd::{EtcdCluster, ListedMember};

use super::etcd::EtcdTestCluster;

/// One look at one member.
#[derive(Clone, Copy, Debug)]
pub struct ReadSample {
    /// The member's index in the harness.
    pub member: usize,
    /// When the read was sent and when the `Status` after it was answered
    /// (or failed): while a member is defragmented, one of them waits.
    pub read: (Instant, Instant),
    /// Its file size right after, when its `Status` answered.
    pub db_size: Option<i64>,
}

/// Sampling every member until [`ReadSampler::finish`].
pub struct ReadSampler {
    stop: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<Vec<ReadSample>>>,
}

/// What the samples of one member show.
#[derive(Clone, Copy, Debug)]
pub struct DefragWindow {
    pub member: usize,
    /// Its longest read: the time its backend was held.
    pub held: (Instant, Instant),
    /// Its median read.
    pub typical: Duration,
    /// The first sample whose file was under 3/4 of `before`.
    pub shrank: Option<Instant>,
}

impl DefragWindow {
    pub fn held_for(&self) -> Duration {
        self.held.1 - self.held.0
    }
}

impl EtcdTestCluster {
    /// Start sampling every member on a connection of its own.
    pub fn sample_local_reads(&self) -> ReadSampler {
        let handle = Arc::new(self.connect());
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = self
            .members()
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let member = ListedMember {
                    id: m.id,
                    name: m.name.clone(),
                    peer_urls: vec![m.peer_url()],
                    client_urls: vec![m.client_url()],
                    learner: m.learner,
                };
                tokio::spawn(sample(handle.clone(), i, member, stop.clone()))
            })
            .collect();
        ReadSampler { stop, tasks }
    }
}

async fn sample(
    handle: Arc<EtcdCluster>,
    index: usize,
    member: ListedMember,
    stop: Arc<AtomicBool>,
) -> Vec<ReadSample> {
    let mut samples = Vec::new();
    let Ok(endpoint) = handle.member_endpoint(&member) else {
        return samples;
    };
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        let read = handle
            .clients
            .call_keeping_connection(
                &endpoint,
                "local read",
                Duration::from_secs(60),
                |mut c| async move {
                    c.get(
                        "sample",
                        Some(
                            etcd_client::GetOptions::new()
                                .with_serializable()
                                .with_count_only(),
                        ),
                    )
                    .await
                },
            )
            .await;
        let db_size = handle
            .probe(&member, Duration::from_secs(60))
            .await
            .ok()
            .map(|(_, s)| s.db_size);
        let ended = Instant::now();
        samples.push(ReadSample {
            member: index,
            read: (started, ended),
            db_size,
        });
        if read.is_err() && db_size.is_none() {
            // The member is gone (or the cluster was dropped): do not spin.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    samples
}

impl ReadSampler {
    /// Stop and return every sample.
    pub async fn finish(self) -> Vec<ReadSample> {
        self.stop.store(true, Ordering::Relaxed);
        let mut all = Vec::new();
        for task in self.tasks {
            all.extend(task.await.unwrap_or_default());
        }
        all
    }
}

/// Each member's window, given its file size `before` (by index).
pub fn defrag_windows(samples: &[ReadSample], before: &[i64]) -> Vec<DefragWindow> {
    (0..before.len())
        .filter_map(|i| {
            let mine: Vec<&ReadSample> = samples.iter().filter(|s| s.member == i).collect();
            let longest = mine.iter().max_by_key(|s| s.read.1 - s.read.0)?;
            let mut durations: Vec<Duration> = mine.iter().map(|s| s.read.1 - s.read.0).collect();
            durations.sort();
            Some(DefragWindow {
                member: i,
                held: longest.read,
                typical: durations[durations.len() / 2],
                shrank: mine
                    .iter()
                    .find(|s| s.db_size.is_some_and(|size| size * 4 < before[i] * 3))
                    .map(|s| s.read.1),
            })
        })
        .collect()
}

/// Check what the members showed while defragmented in `order` (indexes):
/// each one's backend was held (its longest sample far longer than its
/// median), its file shrank, in that order, and each one was held only
/// after the one before it was released. The windows, or what was wrong
/// (members named by `names`).
pub fn one_at_a_time(
    samples: &[ReadSample],
    before: &[i64],
    order: &[usize],
    names: &[String],
) -> Result<Vec<DefragWindow>, String> {
    let windows = defrag_windows(samples, before);
    let name = |i: usize| names.get(i).cloned().unwrap_or_else(|| i.to_string());
    for w in &windows {
        if w.held_for() <= w.typical * 5 {
            return Err(format!(
                "{}: no sample waited noticeably (longest {:?}, median {:?})",
                name(w.member),
                w.held_for(),
                w.typical
            ));
        }
        if w.shrank.is_none() {
            return Err(format!("{}: its file never shrank", name(w.member)));
        }
    }
    for pair in order.windows(2) {
        let (a, b) = (&windows[pair[0]], &windows[pair[1]]);
        if a.shrank >= b.shrank {
            return Err(format!(
                "{} shrank after {}, against the order {order:?}",
                name(a.member),
                name(b.member)
            ));
        }
        if a.held.1 > b.held.0 {
            return Err(format!(
                "{} was still held when {} was: {:?} overlaps {:?}",
                name(a.member),
                name(b.member),
                a.held,
                b.held
            ));
        }
    }
    Ok(windows)
}
