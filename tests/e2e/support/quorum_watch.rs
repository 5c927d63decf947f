//! The one quorum sampler of the end-to-end tests: an [`Observer`] watches the
//! Machines and the real etcd membership concurrently with the controller, as
//! fast as it can, and its [`Record`] is judged by one rule:
//!
//! - every sample counts, those without a leader and those whose snapshot
//!   failed included: a sample without a leader is what a lost quorum looks
//!   like from outside;
//! - healthy voters are compared to the quorum of the voters of THAT sample
//!   (2 of 3 has quorum, 2 of 4 does not);
//! - a sample that sees a leader and has fewer healthy voters than a quorum,
//!   with every probe answered, fails at once;
//! - a run of samples without a leader, or without a snapshot, or below quorum
//!   only because a probe timed out (the sampler itself may have starved on a
//!   2-core machine), is a window that must close, with a sample that has a
//!   leader and a quorum, within two election timeouts plus one probe timeout
//!   (etcd draws each follower's election timeout in `[T, 2T)`, so an election
//!   forced by a fault ends within `2T`; a leadership handover within a few
//!   heartbeats). A window still open when the sampler stops fails;
//! - the sampler itself must look: no gap between two observations longer than
//!   that bound.
//!
//! It also answers, from etcd's own view, whether a removed member was leading
//! when it was removed: the members that stay keep naming a removed leader as
//! theirs until they elect another (about an election timeout), whereas a
//! member whose leadership was moved first is followed by nobody once removed.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k3s_control_plane::harness::sandbox::Sandbox;
use kube::ResourceExt;
use kube::api::ListParams;
use tokio::task::JoinHandle;

/// One observation of the world by the [`Observer`].
#[derive(Clone, Debug)]
pub struct Sample {
    /// When, since the observer started (when the etcd snapshot was asked for).
    pub at: Duration,
    /// Machines with a deletionTimestamp.
    pub deleting: Vec<String>,
    /// Tracked member names missing from the membership.
    pub missing: Vec<String>,
    /// The leader the members that serve reads follow (none during an
    /// election, and when quorum is lost).
    pub leader: Option<u64>,
    /// Healthy voters and voters.
    pub healthy_voters: (usize, usize),
    /// The quorum of this sample's voters: voters / 2 + 1.
    pub quorum: usize,
    /// A member's probe timed out: on a loaded 2-core machine that is as
    /// likely the observer starved as the member.
    pub probe_timed_out: bool,
    /// A probe failed only because etcd is settling after a change of leader
    /// or voters (`quorum::is_settling_reason`: a read that straddled a
    /// handover); like a timeout, it opens a window that must close.
    pub settling: bool,
    /// Every listed member, id and name.
    pub listed: Vec<(u64, String)>,
    /// (member, the leader its own `Status` names), for every member that
    /// answered and names one.
    pub follows: Vec<(u64, u64)>,
    /// The quorum assessment of this sample, in words.
    pub detail: String,
}

/// An observation whose etcd snapshot failed (no member answered the list).
#[derive(Clone, Debug)]
pub struct Unseen {
    pub at: Duration,
    pub error: String,
}

/// Everything an [`Observer`] saw, in order.
#[derive(Clone, Debug, Default)]
pub struct Record {
    pub samples: Vec<Sample>,
    pub unseen: Vec<Unseen>,
    /// The longest a window without a quorum may last (and the longest the
    /// sampler may go without looking).
    pub limit: Duration,
}

/// How one sample stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Standing {
    /// A leader, and at least a quorum of this sample's voters healthy.
    Quorum,
    /// No leader: an election (a handover or a fault), or quorum lost.
    Leaderless(String),
    /// A leader, too few healthy voters, but a probe timed out.
    Inconclusive(String),
    /// A leader, too few healthy voters, every probe answered: quorum lost.
    BelowQuorum(String),
}

impl Sample {
    pub fn standing(&self) -> Standing {
        let (healthy, voters) = self.healthy_voters;
        let numbers = format!(
            "{healthy} of {voters} voters healthy, quorum {} ({})",
            self.quorum, self.detail
        );
        if self.leader.is_none() {
            Standing::Leaderless(format!("no leader; {numbers}"))
        } else if voters > 0 && healthy >= self.quorum {
            Standing::Quorum
        } else if self.probe_timed_out {
            Standing::Inconclusive(format!("a probe timed out; {numbers}"))
        } else if self.settling {
            Standing::Inconclusive(format!("etcd settling after a change of leader; {numbers}"))
        } else {
            Standing::BelowQuorum(numbers)
        }
    }

    fn name_of(&self, id: u64) -> Option<&str> {
        self.listed
            .iter()
            .find(|(i, _)| *i == id)
            .map(|(_, n)| n.as_str())
    }
}

/// What the quorum check found, for the test's report line.
#[derive(Clone, Debug, Default)]
pub struct QuorumSummary {
    pub samples: usize,
    pub unseen: usize,
    /// Windows without a quorum (all closed within the limit).
    pub windows: usize,
    pub longest_window: Duration,
    pub longest_gap: Duration,
    /// The fewest healthy voters of a sample with quorum: (healthy, voters, quorum).
    pub fewest: Option<(usize, usize, usize)>,
}

impl fmt::Display for QuorumSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} samples ({} without a snapshot), {} windows without a leader or quorum (longest {:?}), longest gap {:?}",
            self.samples, self.unseen, self.windows, self.longest_window, self.longest_gap
        )?;
        if let Some((h, v, q)) = self.fewest {
            write!(f, ", fewest healthy {h} of {v} (quorum {q})")?;
        }
        Ok(())
    }
}

impl Record {
    /// Judge every observation by the rule of this module: `Err` says which
    /// sample (or window) failed and why.
    pub fn check_quorum(&self) -> Result<QuorumSummary, String> {
        self.check_quorum_at(None)
    }

    /// [`Record::check_quorum`] while the observer still runs: a window
    /// without quorum still open at `now` fails only once it outlasts the
    /// limit.
    pub fn check_quorum_so_far(&self, now: Duration) -> Result<QuorumSummary, String> {
        self.check_quorum_at(Some(now))
    }

    fn check_quorum_at(&self, now: Option<Duration>) -> Result<QuorumSummary, String> {
        enum Seen<'a> {
            Sample(&'a Sample),
            Unseen(&'a Unseen),
        }
        let mut all: Vec<(Duration, Seen)> = self
            .samples
            .iter()
            .map(|s| (s.at, Seen::Sample(s)))
            .chain(self.unseen.iter().map(|u| (u.at, Seen::Unseen(u))))
            .collect();
        all.sort_by_key(|(at, _)| *at);
        if now.is_none()
            && !self
                .samples
                .iter()
                .any(|s| s.standing() == Standing::Quorum)
        {
            return Err(format!(
                "no sample with a leader and a quorum among {} samples and {} failed snapshots",
                self.samples.len(),
                self.unseen.len()
            ));
        }
        let mut summary = QuorumSummary {
            samples: self.samples.len(),
            unseen: self.unseen.len(),
            ..QuorumSummary::default()
        };
        // (since, the first bad observation, the last one)
        let mut open: Option<(Duration, String, String)> = None;
        let mut previous: Option<Duration> = None;
        for (at, seen) in &all {
            if let Some(before) = previous {
                let gap = at.saturating_sub(before);
                summary.longest_gap = summary.longest_gap.max(gap);
                if gap > self.limit {
                    return Err(format!(
                        "the sampler did not look for {gap:?} (from {before:?} to {at:?}), more than {:?}",
                        self.limit
                    ));
                }
            }
            previous = Some(*at);
            let bad = match seen {
                Seen::Unseen(u) => Some(format!("no snapshot: {}", u.error)),
                Seen::Sample(s) => match s.standing() {
                    Standing::Quorum => {
                        let (h, v) = s.healthy_voters;
                        if summary.fewest.is_none_or(|(fh, _, _)| h < fh) {
                            summary.fewest = Some((h, v, s.quorum));
                        }
                        None
                    }
                    Standing::BelowQuorum(why) => {
                        return Err(format!("at {at:?} etcd was below quorum: {why}"));
                    }
                    Standing::Leaderless(why) | Standing::Inconclusive(why) => Some(why),
                },
            };
            match (bad, open.as_mut()) {
                (None, Some((since, first, last))) => {
                    let lasted = at.saturating_sub(*since);
                    if lasted > self.limit {
                        return Err(format!(
                            "no quorum for {lasted:?} (from {since:?}), more than {:?}: first {first}; last {last}",
                            self.limit
                        ));
                    }
                    summary.windows += 1;
                    summary.longest_window = summary.longest_window.max(lasted);
                    open = None;
                }
                (None, None) => {}
                (Some(why), Some((_, _, last))) => *last = why,
                (Some(why), None) => open = Some((*at, why.clone(), why)),
            }
        }
        if let Some((since, first, last)) = open {
            match now {
                None => {
                    return Err(format!(
                        "the sampler stopped without quorum, none since {since:?}: first {first}; last {last}"
                    ));
                }
                Some(now) if now.saturating_sub(since) > self.limit => {
                    return Err(format!(
                        "no quorum for {:?} so far (since {since:?}), more than {:?}: first {first}; last {last}",
                        now.saturating_sub(since),
                        self.limit
                    ));
                }
                Some(_) => {}
            }
        }
        Ok(summary)
    }

    /// Members that were removed while they led, from etcd's own view: after
    /// the member left the list, a member that stays still named it its
    /// leader. One line per such member.
    pub fn removed_while_leading(&self) -> Vec<String> {
        let mut last_listed: BTreeMap<u64, usize> = BTreeMap::new();
        for (i, s) in self.samples.iter().enumerate() {
            for (id, _) in &s.listed {
                last_listed.insert(*id, i);
            }
        }
        let mut found = Vec::new();
        for (id, last) in last_listed {
            let Some(after) = self.samples.get(last + 1..) else {
                continue;
            };
            if after.is_empty() {
                continue;
            }
            let before = &self.samples[last];
            let name = before
                .name_of(id)
                .map_or_else(|| format!("{id:016x}"), str::to_string);
            let followers: Vec<String> = after
                .iter()
                .flat_map(|s| {
                    s.follows
                        .iter()
                        .filter(|(_, leader)| *leader == id)
                        .map(|(member, _)| {
                            format!("{} at {:?}", s.name_of(*member).unwrap_or("?"), s.at)
                        })
                })
                .collect();
            if let Some(first) = followers.first() {
                let led = before.leader.map_or_else(
                    || "none".to_string(),
                    |l| before.name_of(l).unwrap_or("?").to_string(),
                );
                found.push(format!(
                    "{name} was removed while it led: the last sample listing it ({:?}) saw leader {led}; after its removal {first} still named it its leader ({} such answers)",
                    before.at,
                    followers.len()
                ));
            }
        }
        found
    }

    /// The leaders seen while member `name` was listed, each change once
    /// (samples without a leader skipped), by name.
    pub fn leaders_while_listed(&self, name: &str) -> Vec<String> {
        let mut leaders: Vec<String> = Vec::new();
        for s in self
            .samples
            .iter()
            .filter(|s| s.listed.iter().any(|(_, n)| n == name))
        {
            if let Some(leader) = s.leader.and_then(|l| s.name_of(l))
                && leaders.last().map(String::as_str) != Some(leader)
            {
                leaders.push(leader.to_string());
            }
        }
        leaders
    }

    /// Panic unless [`Record::check_quorum`] and
    /// [`Record::removed_while_leading`] find nothing; returns the summary.
    pub fn assert_safe(&self, what: &str) -> QuorumSummary {
        let summary = self
            .check_quorum()
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let removed = self.removed_while_leading();
        assert!(removed.is_empty(), "{what}: {}", removed.join("; "));
        assert!(
            self.samples.iter().all(|s| s.deleting.len() <= 1),
            "{what}: two Machines deleting in one sample"
        );
        summary
    }
}

/// Watches the world concurrently with the controller, as fast as it can,
/// recording how many Machines are deleting, how many of the tracked members
/// are gone, the leader, and the quorum, at each moment.
pub struct Observer {
    stop: Arc<AtomicBool>,
    origin: Instant,
    record: Arc<Mutex<Record>>,
    task: Option<JoinHandle<()>>,
}

impl Observer {
    pub fn start(sandbox: &Sandbox, tracked_members: Vec<String>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let machines = sandbox.machines_api();
        let admin = sandbox.etcd.connect();
        let timeouts = admin.timeouts();
        let limit = timeouts.election * 2 + timeouts.probe;
        let flag = stop.clone();
        let origin = Instant::now();
        let record = Arc::new(Mutex::new(Record {
            limit,
            ..Record::default()
        }));
        let shared = record.clone();
        let task = tokio::spawn(async move {
            // Since when no observation has had a quorum.
            let mut without_quorum: Option<Instant> = None;
            loop {
                // Asked to stop inside a window without quorum, look on until
                // it closes or outlasts the limit: the verdict needs its end.
                if flag.load(Ordering::Relaxed)
                    && without_quorum.is_none_or(|since| since.elapsed() > limit)
                {
                    break;
                }
                let Ok(list) = machines.list(&ListParams::default()).await else {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                };
                let at = origin.elapsed();
                match admin.snapshot().await {
                    Err(e) => {
                        shared.lock().unwrap().unseen.push(Unseen {
                            at,
                            error: e.to_string(),
                        });
                        without_quorum.get_or_insert_with(Instant::now);
                    }
                    Ok(snap) => {
                        let a = snap.assess_cluster();
                        let sample = Sample {
                            at,
                            deleting: list
                                .items
                                .iter()
                                .filter(|m| m.is_deleting())
                                .map(|m| m.name_any())
                                .collect(),
                            missing: tracked_members
                                .iter()
                                .filter(|n| snap.member_by_name(n).is_none())
                                .cloned()
                                .collect(),
                            leader: snap.leader,
                            healthy_voters: (a.healthy, a.voters),
                            quorum: a.size,
                            // The reason as the quorum rule sees it: a probe
                            // error, or the errors a member's status reports
                            // ("etcdserver: no leader" comes that way).
                            probe_timed_out: snap.members.iter().any(|m| {
                                m.unhealthy_reason()
                                    .is_some_and(|e| e.contains("timed out"))
                            }),
                            settling: snap.members.iter().any(|m| {
                                m.unhealthy_reason().is_some_and(|e| {
                                    k3s_control_plane::quorum::is_settling_reason(
                                        &e,
                                        snap.leader.is_some(),
                                    )
                                })
                            }),
                            listed: snap
                                .members
                                .iter()
                                .map(|m| (m.id, m.name.clone()))
                                .collect(),
                            follows: snap
                                .members
                                .iter()
                                .filter_map(|m| m.status.as_ref().map(|s| (m.id, s.leader)))
                                .filter(|(_, leader)| *leader != 0)
                                .collect(),
                            detail: a.to_string(),
                        };
                        if sample.standing() == Standing::Quorum {
                            without_quorum = None;
                        } else {
                            without_quorum.get_or_insert_with(Instant::now);
                        }
                        shared.lock().unwrap().samples.push(sample);
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        Observer {
            stop,
            origin,
            record,
            task: Some(task),
        }
    }

    /// Everything observed so far (the observer goes on).
    pub fn record_so_far(&self) -> Record {
        self.record.lock().unwrap().clone()
    }

    /// Panic now if what was observed so far already breaks the quorum rule
    /// (a window without quorum still open fails once it outlasts the limit).
    pub fn assert_quorum_so_far(&self, what: &str) {
        if let Err(e) = self
            .record_so_far()
            .check_quorum_so_far(self.origin.elapsed())
        {
            panic!("{what}: {e}");
        }
    }

    /// Stop, and return the samples with a snapshot.
    pub async fn finish(self) -> Vec<Sample> {
        self.record().await.samples
    }

    /// Stop, and return everything observed.
    pub async fn record(mut self) -> Record {
        self.stop.store(true, Ordering::Relaxed);
        self.task.take().expect("finished once").await.unwrap();
        self.record.lock().unwrap().clone()
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}
