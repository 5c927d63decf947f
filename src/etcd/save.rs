//! Streaming an etcd snapshot (`Maintenance.Snapshot`) from one chosen
//! member's own endpoint, checked as it passes.
//!
//! The member is chosen by the caller on a membership snapshot and must be a
//! started, healthy voter: a learner may lag, and an unhealthy member may be
//! cut off from the quorum and hold an old state. A `NOSPACE` alarm does not
//! refuse (the data is whole, and a full cluster is when a backup matters);
//! `CORRUPT` does. The chunks go to a caller's sink as they come, so memory
//! does not grow with the database.

use std::future::Future;
use std::time::{Duration, Instant};

use tracing::{info, instrument};

use super::snapshot_verify::{StreamVerifier, VerifyError};
use crate::etcd::cluster::EtcdCluster;
use crate::etcd::error::EtcdError;
use crate::etcd::ops::listed;
use crate::etcd::snapshot::{MemberSnapshot, MembershipSnapshot};

/// Where the snapshot's bytes go, in order.
pub trait SnapshotSink {
    type Error;
    fn write(&mut self, chunk: &[u8]) -> impl Future<Output = Result<(), Self::Error>> + Send;
}

/// Bytes kept in memory (tests, small clusters).
impl SnapshotSink for Vec<u8> {
    type Error = std::convert::Infallible;
    async fn write(&mut self, chunk: &[u8]) -> Result<(), Self::Error> {
        self.extend_from_slice(chunk);
        Ok(())
    }
}

/// A snapshot streamed whole and verified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamedSnapshot {
    /// The member it came from (its name, or its id while unnamed).
    pub member: String,
    pub member_id: u64,
    /// The store's revision the snapshot holds at least: from the member's
    /// `Status` just before streaming (etcd does not fill the snapshot
    /// response's header; see [`EtcdCluster::save_snapshot`]).
    pub revision: i64,
    /// Bytes streamed, the trailing SHA-256 included (what a file holds).
    pub size: u64,
    /// SHA-256 of the database, lower-case hex (etcd's trailing hash).
    pub sha256: String,
    pub took: Duration,
}

/// Why a snapshot was not streamed.
#[derive(Debug, thiserror::Error)]
pub enum SaveSnapshotError<E> {
    /// Refused, or etcd failed (unreachable, TLS, timeout, gRPC).
    #[error(transparent)]
    Etcd(#[from] EtcdError),
    /// The member sent bytes that are not a whole snapshot.
    #[error("the snapshot streamed from {member} is not whole: {source}")]
    Invalid {
        member: String,
        #[source]
        source: VerifyError,
    },
    /// The sink failed.
    #[error("{0}")]
    Sink(E),
}

/// The member to take a snapshot from when none is named
/// ([`MembershipSnapshot::snapshot_source`]).
pub fn snapshot_source(snap: &MembershipSnapshot) -> Option<&MemberSnapshot> {
    snap.snapshot_source(None)
}

fn refused(member: &str, reason: String) -> EtcdError {
    EtcdError::OperationRefused {
        action: format!("take an etcd snapshot from {member}"),
        reason,
    }
}

impl EtcdCluster {
    /// Stream a snapshot from member `member_id` of `snap` into `sink`,
    /// verifying etcd's trailing SHA-256 on the fly, all within `limit`.
    /// Refused (an [`EtcdError`] naming the member and why) unless the member
    /// is a started, healthy voter in `snap` (`NOSPACE` aside).
    ///
    /// The revision: etcd 3.4 and 3.5 send each snapshot chunk with
    /// `RemainingBytes` and `Blob` only, never a filled response header
    /// (etcd `server/etcdserver/api/v3rpc/maintenance.go`, `Snapshot`), so it
    /// is read from a `Status` of the same member taken just before
    /// streaming (a header's revision is used should a later etcd fill it).
    /// Writes between the two only make the snapshot newer.
    #[instrument(skip(self, snap, sink), fields(member = format!("{member_id:016x}")))]
    pub async fn save_snapshot<S: SnapshotSink>(
        &self,
        snap: &MembershipSnapshot,
        member_id: u64,
        limit: Duration,
        sink: &mut S,
    ) -> Result<StreamedSnapshot, SaveSnapshotError<S::Error>> {
        let started = Instant::now();
        let member = snap
            .member(member_id)
            .ok_or_else(|| EtcdError::MemberNotFound {
                member: format!("{member_id:016x}"),
            })?;
        let label = member.label();
        let view = snap.ignoring_nospace();
        if let Some(why) = view
            .member(member_id)
            .and_then(MemberSnapshot::snapshot_refusal)
        {
            return Err(refused(&label, why).into());
        }
        let listed = listed(member);
        let endpoint = self.member_endpoint(&listed)?;
        let probe_limit = self.timeouts().probe.min(limit);
        let (_, status) = self.probe(&listed, probe_limit).await?;
        if status.is_learner {
            return Err(refused(&label, "it reports itself a learner".into()).into());
        }
        let left = limit.saturating_sub(started.elapsed());

        enum Stop<E> {
            Sink(E),
        }
        let streamed = self
            .clients
            .call(&endpoint, "snapshot", left, |mut client| async move {
                let mut stream = client.snapshot().await?;
                let mut verifier = StreamVerifier::new();
                let mut header_revision = None;
                while let Some(message) = stream.message().await? {
                    if header_revision.is_none() {
                        header_revision = message.header().map(|h| h.revision()).filter(|r| *r > 0);
                    }
                    let blob = message.blob();
                    verifier.update(blob);
                    if let Err(e) = sink.write(blob).await {
                        return Ok(Err(Stop::Sink(e)));
                    }
                }
                Ok(Ok((verifier, header_revision)))
            })
            .await?;
        let (verifier, header_revision) = match streamed {
            Ok(done) => done,
            Err(Stop::Sink(e)) => return Err(SaveSnapshotError::Sink(e)),
        };
        let verified = verifier
            .finish()
            .map_err(|source| SaveSnapshotError::Invalid {
                member: label.clone(),
                source,
            })?;
        let done = StreamedSnapshot {
            member: label,
            member_id,
            revision: header_revision.unwrap_or(status.revision),
            size: verified.size,
            sha256: verified.sha256,
            took: started.elapsed(),
        };
        info!(
            member = %done.member,
            revision = done.revision,
            size = done.size,
            took_ms = done.took.as_millis() as u64,
            "streamed an etcd snapshot"
        );
        Ok(done)
    }
}
