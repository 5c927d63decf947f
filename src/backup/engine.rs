//! The backup operations: save a snapshot from one member into a target,
//! prune by retention, verify what is stored.

use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use serde::Serialize;
use tracing::{info, warn};

use crate::backup::error::BackupError;
use crate::backup::name::SnapshotName;
use crate::backup::retention::{Prune, Retention, to_prune};
use crate::backup::target::{Target, Upload};
use crate::etcd::save::{SaveSnapshotError, SnapshotSink};
use crate::etcd::snapshot_verify::{StreamVerifier, Verified};
use crate::etcd::{EtcdCluster, MembershipSnapshot};

/// A snapshot stored and checked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Saved {
    /// Its name (the object's name in the target's folder).
    pub name: String,
    /// Where it is: `s3://bucket/folder/name` or `file:///dir/name`.
    pub location: String,
    /// The store's revision it holds at least.
    pub revision: i64,
    /// Bytes stored (the database and its trailing SHA-256).
    pub size: u64,
    /// SHA-256 of the database, lower-case hex.
    pub sha256: String,
    /// The member it was streamed from.
    pub member: String,
    #[serde(serialize_with = "millis")]
    pub took: Duration,
}

fn millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_millis() as u64)
}

impl SnapshotSink for Upload<'_> {
    type Error = BackupError;
    async fn write(&mut self, chunk: &[u8]) -> Result<(), BackupError> {
        Upload::write(self, chunk).await
    }
}

/// Stream a snapshot from member `from_member` of `snapshot` (refused unless
/// it is a healthy, started voter) into `target` as `name`, all within
/// `limit`: the target is reached first, the bytes are uploaded as they come
/// and checked against etcd's trailing SHA-256 before the upload completes,
/// and the stored object's size is compared with what was streamed. On any
/// failure nothing is left under `name` (the upload is aborted, or the
/// object deleted). An existing object of that name is never overwritten.
pub async fn save(
    cluster: &EtcdCluster,
    snapshot: &MembershipSnapshot,
    from_member: u64,
    target: &Target,
    name: &SnapshotName,
    limit: Duration,
) -> Result<Saved, BackupError> {
    let started = Instant::now();
    let deadline = started + limit;
    let name = name.to_string();
    let location = target.location(&name);
    let timed_out = |what: &str| BackupError::TimedOut {
        what: format!("{what} of {location}"),
        after: limit,
    };
    let left = || deadline.saturating_duration_since(Instant::now());

    tokio::time::timeout(left(), target.check())
        .await
        .map_err(|_| timed_out("reaching the target"))??;
    if tokio::time::timeout(left(), target.exists(&name))
        .await
        .map_err(|_| timed_out("looking up"))??
    {
        return Err(BackupError::AlreadyExists {
            target: target.describe(),
            object: location,
        });
    }
    let mut upload = tokio::time::timeout(left(), target.put(&name))
        .await
        .map_err(|_| timed_out("starting the upload"))??;

    let streamed = cluster
        .save_snapshot(snapshot, from_member, left(), &mut upload)
        .await;
    let streamed = match streamed {
        Ok(streamed) => streamed,
        Err(err) => {
            if let Err(abort) = upload.abort().await {
                warn!(object = %location, error = %abort, "could not abort the upload");
            }
            return Err(match err {
                SaveSnapshotError::Etcd(e) => BackupError::Etcd(e),
                SaveSnapshotError::Invalid { source, .. } => BackupError::Invalid {
                    object: location,
                    source,
                },
                SaveSnapshotError::Sink(e) => e,
            });
        }
    };

    let finished = tokio::time::timeout(left(), upload.finish()).await;
    let checked = match finished {
        Err(_) => Err(timed_out("completing the upload")),
        Ok(Err(e)) => Err(e),
        Ok(Ok(_)) => match tokio::time::timeout(left(), target.head(&name)).await {
            Err(_) => Err(timed_out("checking")),
            Ok(Err(e)) => Err(e),
            Ok(Ok(stored)) if stored.size != streamed.size => Err(BackupError::SizeMismatch {
                object: location.clone(),
                streamed: streamed.size,
                stored: stored.size,
            }),
            Ok(Ok(_)) => Ok(()),
        },
    };
    if let Err(err) = checked {
        // Whatever was completed is not a snapshot we vouch for.
        if let Err(delete) = target.delete(&name).await {
            warn!(object = %location, error = %delete, "could not delete the unchecked object");
        }
        return Err(err);
    }
    let saved = Saved {
        name,
        location,
        revision: streamed.revision,
        size: streamed.size,
        sha256: streamed.sha256,
        member: streamed.member,
        took: started.elapsed(),
    };
    info!(
        object = %saved.location,
        member = %saved.member,
        revision = saved.revision,
        size = saved.size,
        took_ms = saved.took.as_millis() as u64,
        "etcd snapshot saved"
    );
    Ok(saved)
}

/// What a prune deleted, and how many of ours it kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pruned {
    pub deleted: Vec<Prune>,
    pub kept: usize,
}

/// Delete the snapshots of ours in `target` that `retention` prunes at
/// `now` ([`to_prune`]); nothing that is not ours is touched.
pub async fn prune(
    target: &Target,
    retention: &Retention,
    now: SystemTime,
) -> Result<Pruned, BackupError> {
    let stored = target.list().await?;
    let ours = stored.iter().filter(|s| s.is_ours()).count();
    let chosen = to_prune(&stored, retention, now);
    let mut deleted = Vec::with_capacity(chosen.len());
    for prune in chosen {
        target.delete(&prune.name).await?;
        info!(target = %target.describe(), pruned = %prune, "pruned an etcd snapshot");
        deleted.push(prune);
    }
    Ok(Pruned {
        kept: ours - deleted.len(),
        deleted,
    })
}

/// Read `name` back from `target`, streaming, and check that it is a whole
/// etcd snapshot whose trailing SHA-256 matches.
pub async fn verify_stored(target: &Target, name: &str) -> Result<Verified, BackupError> {
    let mut bytes = target.read(name).await?;
    let mut verifier = StreamVerifier::new();
    while let Some(chunk) = bytes.next().await {
        verifier.update(&chunk?);
    }
    verifier.finish().map_err(|source| BackupError::Invalid {
        object: target.location(name),
        source,
    })
}
