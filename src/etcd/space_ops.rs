//! Space operations: defragment one member (and confirm it healthy after),
//! compact the history to the current revision, disarm `NOSPACE`. Each takes
//! a fresh snapshot and is guarded by the pure rule of [`crate::space_rule`] on it,
//! judging health apart from `NOSPACE` (the alarm they repair): the `etcd`
//! CLI and the controller refuse the same things.

use std::time::Instant;

use etcd_client::{AlarmAction, AlarmOptions, AlarmType, CompactionOptions, GetOptions};
use serde::Serialize;
use tracing::{info, instrument};

use crate::etcd::cluster::{EtcdCluster, ListedMember};
use crate::etcd::error::EtcdError;
use crate::etcd::ops::{LeaderMove, POLL_INTERVAL, check_quorum, listed};
use crate::etcd::snapshot::{MemberStatus, MembershipSnapshot, NOSPACE, is_nospace_error};
use crate::space_rule::{ConfiguredQuota, History, Sizes, Thresholds, bytes};

/// A member defragmented, with its sizes before and after.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Defragmented {
    pub member: String,
    #[serde(serialize_with = "hex")]
    pub id: u64,
    pub before: Option<Sizes>,
    pub after: Sizes,
    /// The revision the member reported with `after`.
    pub revision: i64,
    /// The defragmentation call alone.
    pub elapsed_ms: u128,
    /// Until the member served a linearizable read again, after the call.
    pub confirmed_ms: u128,
}

impl Defragmented {
    /// `cp-1: 3.9 MiB -> 0.4 MiB (in use 0.4 MiB) in 38 ms, healthy 2 ms after`.
    pub fn describe(&self) -> String {
        let before = self
            .before
            .map_or_else(|| "?".to_string(), |s| bytes(s.db_size));
        format!(
            "{}: {before} -> {} (in use {}) in {} ms, confirmed healthy {} ms after",
            self.member,
            bytes(self.after.db_size),
            bytes(self.after.in_use),
            self.elapsed_ms,
            self.confirmed_ms
        )
    }
}

/// The history compacted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Compacted {
    /// Nothing below it is kept.
    pub revision: i64,
    /// It already was (etcd said the revision has been compacted).
    pub already: bool,
    /// The member that received the request.
    pub via: String,
    pub elapsed_ms: u128,
}

/// `NOSPACE` disarmed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Disarmed {
    /// The members whose `NOSPACE` alarm was disarmed (none: there was none).
    pub members: Vec<String>,
    /// Every member's size against its quota when it was allowed.
    pub room: String,
}

fn hex<S: serde::Serializer>(id: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{id:016x}"))
}

fn refused(action: String, reason: String) -> EtcdError {
    EtcdError::OperationRefused { action, reason }
}

impl EtcdCluster {
    /// Defragment member `id`: on a fresh snapshot, refused unless every
    /// other member is healthy (apart from `NOSPACE`) and `id` answers and
    /// does not lead (unless it is the only voter); then the member is
    /// defragmented on its own endpoint and confirmed healthy (it serves a
    /// linearizable read again) before this returns.
    #[instrument(skip(self), fields(member = format!("{id:016x}")))]
    pub async fn defragment(&self, id: u64) -> Result<Defragmented, EtcdError> {
        let snap = self.snapshot().await?;
        self.defragment_in(&snap, id).await
    }

    /// [`Self::defragment`] deciding on `snap` (just taken).
    pub async fn defragment_in(
        &self,
        snap: &MembershipSnapshot,
        id: u64,
    ) -> Result<Defragmented, EtcdError> {
        let view = snap.ignoring_nospace();
        check_quorum(&view)?;
        let member = view.member(id).ok_or_else(|| EtcdError::MemberNotFound {
            member: format!("{id:016x}"),
        })?;
        let label = member.label();
        // The quota plays no part in whether it may be defragmented.
        let space = snap.space(&ConfiguredQuota::Default(
            crate::space_rule::DEFAULT_QUOTA_BYTES,
        ));
        space
            .defrag_guard(id)
            .map_err(|reason| refused(format!("defragment {label}"), reason))?;
        let before = space.member(id).and_then(|m| m.sizes);
        let listed = listed(member);
        let endpoint = self.member_endpoint(&listed)?;
        let started = Instant::now();
        self.clients
            .call(
                &endpoint,
                "defragment",
                self.timeouts().defrag,
                |mut c| async move { c.defragment().await },
            )
            .await?;
        let elapsed = started.elapsed();
        let confirmed = Instant::now();
        let status = self.confirm_healthy(&listed).await?;
        let done = Defragmented {
            member: label,
            id,
            before,
            after: Sizes {
                db_size: status.db_size.max(0) as u64,
                in_use: status.db_size_in_use.max(0) as u64,
            },
            revision: status.revision,
            elapsed_ms: elapsed.as_millis(),
            confirmed_ms: confirmed.elapsed().as_millis(),
        };
        info!(result = %done.describe(), "defragmented etcd member");
        Ok(done)
    }

    /// Poll `member` until it answers `Status` without errors other than
    /// `NOSPACE` and, for a voter, serves a linearizable read; its status then.
    pub(crate) async fn confirm_healthy(
        &self,
        member: &ListedMember,
    ) -> Result<MemberStatus, EtcdError> {
        let limit = self.timeouts().confirmation();
        let deadline = Instant::now() + limit;
        loop {
            let last = match self.probe_health(member, self.timeouts().probe).await {
                Ok(probe) => {
                    let status = probe.status().clone();
                    let errors: Vec<&String> = status
                        .errors
                        .iter()
                        .filter(|e| !is_nospace_error(e))
                        .collect();
                    match (probe.read_error(), errors.is_empty()) {
                        (None, true) => return Ok(status),
                        (Some(why), _) => format!("cannot serve a linearizable read: {why}"),
                        (None, false) => format!(
                            "reports errors: {}",
                            errors
                                .iter()
                                .map(|e| e.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    }
                }
                Err(err) => err.to_string(),
            };
            if Instant::now() >= deadline {
                return Err(EtcdError::NotConfirmed {
                    what: format!("{} healthy again", member_label(member)),
                    after: limit,
                    last,
                });
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Move leadership off `from` so that it can be defragmented: as
    /// [`Self::move_leader_off`], judging health apart from `NOSPACE`.
    #[instrument(skip(self), fields(from = format!("{from:016x}")))]
    pub async fn move_leader_for_space(&self, from: u64) -> Result<LeaderMove, EtcdError> {
        let snap = self.snapshot().await?;
        self.move_leader_off_in(&snap.ignoring_nospace(), from, None)
            .await
    }

    /// The current revision and whether the history below it is compacted
    /// already, read from a healthy voter of `snap`: a count-only read at
    /// `revision - 1` fails with "required revision has been compacted"
    /// exactly when nothing below `revision` is kept.
    pub async fn history(&self, snap: &MembershipSnapshot) -> Result<History, EtcdError> {
        let view = snap.ignoring_nospace();
        check_quorum(&view)?;
        let (member, status) = self.current_revision(&view).await?;
        let revision = status.revision;
        if revision <= 1 {
            return Ok(History {
                revision,
                compacted: true,
            });
        }
        let endpoint = self.member_endpoint(&member)?;
        let read = self
            .clients
            .call(
                &endpoint,
                "history read",
                self.timeouts().call,
                |mut c| async move {
                    c.get(
                        HISTORY_KEY,
                        Some(
                            GetOptions::new()
                                .with_revision(revision - 1)
                                .with_count_only(),
                        ),
                    )
                    .await
                },
            )
            .await;
        match read {
            Ok(_) => Ok(History {
                revision,
                compacted: false,
            }),
            Err(err) if is_compacted(&err) => Ok(History {
                revision,
                compacted: true,
            }),
            Err(err) => Err(err),
        }
    }

    /// A healthy voter's status, freshly read (its header carries the
    /// current revision), with the voter.
    async fn current_revision(
        &self,
        view: &MembershipSnapshot,
    ) -> Result<(ListedMember, MemberStatus), EtcdError> {
        let mut last = None;
        let voters = view
            .members
            .iter()
            .filter(|m| !m.learner && m.is_healthy() && !m.client_urls.is_empty());
        for m in voters {
            let member = listed(m);
            match self.probe(&member, self.timeouts().probe).await {
                Ok((_, status)) => return Ok((member, status)),
                Err(err) => last = Some(err),
            }
        }
        Err(last.unwrap_or_else(|| EtcdError::NoReceiver {
            reason: "no healthy voter to read the current revision from".into(),
        }))
    }

    /// Compact the history to the current revision (a compaction goes through
    /// raft, so every member compacts), waiting until it is applied to the
    /// receiving member's backend. Refused without quorum (health apart from
    /// `NOSPACE`); a history compacted already is success.
    #[instrument(skip(self))]
    pub async fn compact(&self) -> Result<Compacted, EtcdError> {
        let snap = self.snapshot().await?;
        let view = snap.ignoring_nospace();
        check_quorum(&view)?;
        let (member, status) = self.current_revision(&view).await?;
        let revision = status.revision;
        let endpoint = self.member_endpoint(&member)?;
        let started = Instant::now();
        let result = self
            .clients
            .call(
                &endpoint,
                "compact",
                self.timeouts().defrag,
                |mut c| async move {
                    c.compact(revision, Some(CompactionOptions::new().with_physical()))
                        .await
                },
            )
            .await;
        let already = match result {
            Ok(_) => false,
            Err(err) if is_compacted(&err) => true,
            Err(err) => return Err(err),
        };
        let done = Compacted {
            revision,
            already,
            via: member_label(&member),
            elapsed_ms: started.elapsed().as_millis(),
        };
        info!(revision, already, via = %done.via, "compacted the etcd history");
        Ok(done)
    }

    /// Disarm every `NOSPACE` alarm, only when every member is healthy (apart
    /// from `NOSPACE`) and has room below its quota (its own if it reports
    /// one, else `quota`), as [`crate::space_rule::ClusterSpace::disarm_guard`]
    /// says with the numbers; the alarms are read afresh, deactivated one by
    /// one, and confirmed gone. With no `NOSPACE` raised there is nothing to
    /// refuse: success, with the numbers.
    #[instrument(skip(self))]
    pub async fn disarm_nospace(
        &self,
        quota: &ConfiguredQuota,
        thresholds: &Thresholds,
    ) -> Result<Disarmed, EtcdError> {
        let snap = self.snapshot().await?;
        let view = snap.ignoring_nospace();
        check_quorum(&view)?;
        let space = snap.space(quota);
        if let Some(reason) = &space.quota_error {
            return Err(refused("disarm NOSPACE".into(), reason.clone()));
        }
        let receiver = view
            .members
            .iter()
            .find(|m| !m.learner && m.is_healthy() && !m.client_urls.is_empty())
            .map(listed)
            .ok_or_else(|| EtcdError::NoReceiver {
                reason: "no healthy voter to send the disarm to".into(),
            })?;
        let endpoint = self.member_endpoint(&receiver)?;
        let alarmed = self.nospace_members(&endpoint).await?;
        if alarmed.is_empty() {
            // Nothing to disarm: say how much room there is, whatever it is.
            let room = space.disarm_guard(thresholds).unwrap_or_else(|why| why);
            return Ok(Disarmed {
                members: vec![],
                room,
            });
        }
        let room = space
            .disarm_guard(thresholds)
            .map_err(|reason| refused("disarm NOSPACE".into(), reason))?;
        for id in &alarmed {
            let id = *id;
            self.clients
                .call(
                    &endpoint,
                    "alarm disarm",
                    self.timeouts().call,
                    |mut c| async move {
                        let mut options = AlarmOptions::new();
                        options.with_member(id);
                        c.alarm(AlarmAction::Deactivate, AlarmType::Nospace, Some(options))
                            .await
                    },
                )
                .await?;
        }
        let limit = self.timeouts().confirmation();
        let deadline = Instant::now() + limit;
        loop {
            let left = self.nospace_members(&endpoint).await?;
            if left.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                return Err(EtcdError::NotConfirmed {
                    what: "NOSPACE disarmed".into(),
                    after: limit,
                    last: format!("{} member(s) still have it", left.len()),
                });
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
        let members = alarmed
            .iter()
            .map(|id| {
                snap.member(*id)
                    .map_or_else(|| format!("{id:016x}"), |m| m.label())
            })
            .collect();
        let done = Disarmed { members, room };
        info!(members = ?done.members, room = %done.room, "disarmed NOSPACE");
        Ok(done)
    }

    /// The members with an active `NOSPACE` alarm, as `endpoint` lists them.
    async fn nospace_members(
        &self,
        endpoint: &crate::etcd::transport::EtcdEndpoint,
    ) -> Result<Vec<u64>, EtcdError> {
        let alarms = self.alarms(endpoint, self.timeouts().call).await?;
        Ok(alarms
            .into_iter()
            .filter(|(_, names)| names.iter().any(|n| n == NOSPACE))
            .map(|(id, _)| id)
            .collect())
    }
}

/// The key of the history read; it need not exist.
const HISTORY_KEY: &str = "compact-probe";

/// etcd's "mvcc: required revision has been compacted" (gRPC OutOfRange).
fn is_compacted(err: &EtcdError) -> bool {
    matches!(err, EtcdError::Grpc { message, .. } if message.contains("required revision has been compacted"))
}

fn member_label(member: &ListedMember) -> String {
    crate::quorum::member_label(member.id, &member.name)
}
