//! Membership operations: move leadership off a member, remove a member, and
//! the safe removal the CLI and controller use. Each is idempotent (already done
//! = success) and confirmed after the fact by reading the cluster again.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use backon::{ExponentialBuilder, Retryable};
use serde::Serialize;
use tracing::{info, instrument, warn};

use crate::etcd::cluster::{EtcdCluster, ListedMember};
use crate::etcd::error::EtcdError;
use crate::etcd::snapshot::{MemberSnapshot, MembershipSnapshot};
use crate::quorum::Assessment;

/// Outcome of moving leadership off a member.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "result", rename_all = "camelCase")]
pub enum LeaderMove {
    /// The member did not lead; nothing was done.
    #[serde(rename_all = "camelCase")]
    NotLeader {
        member: String,
        leader: Option<String>,
    },
    /// Leadership moved and the new leader was confirmed.
    #[serde(rename_all = "camelCase")]
    Moved {
        from: String,
        to: String,
        elapsed_ms: u128,
    },
}

/// Outcome of removing a member.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "result", rename_all = "camelCase")]
pub enum Removal {
    /// The member was removed and its absence confirmed.
    #[serde(rename_all = "camelCase")]
    Removed {
        member: String,
        /// The member that received the request.
        via: String,
        /// How many requests were needed (etcd refuses for a few seconds after
        /// the receiving member reconnected).
        attempts: usize,
    },
    /// The member was not (or no longer) in the cluster.
    #[serde(rename_all = "camelCase")]
    AlreadyGone { member: String },
}

/// Outcome of a safe removal: the assessment that allowed it, the leadership
/// move (if the target led) and the removal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SafeRemoval {
    pub assessment: Assessment,
    pub leader_move: Option<LeaderMove>,
    pub removal: Removal,
}

pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(50);

impl EtcdCluster {
    /// Move leadership off `target` (a member id). A no-op if it does not lead;
    /// refused with [`EtcdError::QuorumLost`] if the cluster has no quorum.
    /// The transferee is `to` if given (must be a healthy voter), otherwise the
    /// most up-to-date healthy voter. The request goes to the leader's own
    /// endpoint and the new leader is confirmed by polling its status.
    #[instrument(skip(self), fields(target = format!("{target:016x}")))]
    pub async fn move_leader_off(
        &self,
        target: u64,
        to: Option<u64>,
    ) -> Result<LeaderMove, EtcdError> {
        let snap = self.snapshot().await?;
        self.move_leader_off_in(&snap, target, to).await
    }

    pub(crate) async fn move_leader_off_in(
        &self,
        snap: &MembershipSnapshot,
        target: u64,
        to: Option<u64>,
    ) -> Result<LeaderMove, EtcdError> {
        check_quorum(snap)?;
        let target_member = snap
            .member(target)
            .ok_or_else(|| EtcdError::MemberNotFound {
                member: format!("{target:016x}"),
            })?;
        if snap.leader != Some(target) {
            return Ok(LeaderMove::NotLeader {
                member: target_member.label(),
                leader: snap.leader_member().map(MemberSnapshot::label),
            });
        }
        let transferee = match to {
            Some(id) => {
                let member = snap.member(id).ok_or_else(|| EtcdError::MemberNotFound {
                    member: format!("{id:016x}"),
                })?;
                check_transferee(member, target)?;
                member
            }
            None => snap
                .choose_transferee(target)
                .ok_or_else(|| EtcdError::NoTransferee {
                    target: target_member.label(),
                })?,
        };
        let started = Instant::now();
        let leader_endpoint = self.member_endpoint(&listed(target_member))?;
        let transferee_id = transferee.id;
        let sent = self
            .clients
            .call(
                &leader_endpoint,
                "move leader",
                self.timeouts().move_leader(),
                |mut c| async move { c.move_leader(transferee_id).await },
            )
            .await;
        match sent {
            Ok(_) => {}
            Err(EtcdError::NotLeader { .. }) => {
                // Leadership changed since the snapshot: fine if it left the target.
                let now = self.snapshot().await?;
                if now.leader != Some(target) {
                    return Ok(LeaderMove::NotLeader {
                        member: target_member.label(),
                        leader: now.leader_member().map(MemberSnapshot::label),
                    });
                }
                return Err(EtcdError::NotLeader {
                    endpoint: leader_endpoint.dial,
                });
            }
            Err(err) => return Err(err),
        }
        let new_leader = self
            .await_leader_other_than(target, &listed(transferee))
            .await?;
        let to_label = snap
            .member(new_leader)
            .map_or_else(|| format!("{new_leader:016x}"), MemberSnapshot::label);
        info!(from = %target_member.label(), to = %to_label, "moved etcd leadership");
        Ok(LeaderMove::Moved {
            from: target_member.label(),
            to: to_label,
            elapsed_ms: started.elapsed().as_millis(),
        })
    }

    /// Poll `observer`'s status until it reports a leader other than `target`.
    async fn await_leader_other_than(
        &self,
        target: u64,
        observer: &ListedMember,
    ) -> Result<u64, EtcdError> {
        let deadline = Instant::now() + self.timeouts().confirmation();
        loop {
            let last = match self.probe(observer, self.timeouts().probe).await {
                Ok((_, status)) if status.leader != 0 && status.leader != target => {
                    return Ok(status.leader);
                }
                Ok((_, status)) => format!("leader is still {:016x}", status.leader),
                Err(err) => err.to_string(),
            };
            if Instant::now() >= deadline {
                return Err(EtcdError::NotConfirmed {
                    what: format!("leadership leaving {target:016x}"),
                    after: self.timeouts().confirmation(),
                    last,
                });
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Remove member `id`. Does NOT check quorum (see [`Self::safe_remove`]).
    /// The request goes to a member that stays; etcd's transient "unhealthy
    /// cluster" refusal is retried within the confirm timeout; a member already
    /// gone is success; the removal is confirmed from a remaining member.
    #[instrument(skip(self), fields(member = format!("{id:016x}")))]
    pub async fn remove_member(&self, id: u64) -> Result<Removal, EtcdError> {
        self.remove_member_via(id, None).await
    }

    /// [`Self::remove_member`], asking `via` first when it is a started voter
    /// that stays (the member the decision chose), then the others in list order.
    pub async fn remove_member_via(&self, id: u64, via: Option<u64>) -> Result<Removal, EtcdError> {
        let list = self.member_list(&[]).await?;
        let Some(target) = list.members.iter().find(|m| m.id == id).cloned() else {
            return Ok(Removal::AlreadyGone {
                member: format!("{id:016x}"),
            });
        };
        let label = label_of(&target);
        let mut receivers: Vec<&ListedMember> = list
            .members
            .iter()
            .filter(|m| m.id != id && !m.learner && !m.client_urls.is_empty())
            .collect();
        // Stable: the chosen receiver first, the others keep their order.
        receivers.sort_by_key(|m| Some(m.id) != via);
        if receivers.is_empty() {
            return Err(EtcdError::NoReceiver {
                reason: format!("{label} is the only started voting member"),
            });
        }

        let mut errors = Vec::new();
        for receiver in receivers {
            match self.remove_via(receiver, id).await {
                Ok(RemoveAttempt::Removed(attempts)) => {
                    self.confirm_gone(receiver, id).await?;
                    self.forget_member(&target);
                    info!(member = %label, via = %label_of(receiver), attempts, "removed etcd member");
                    return Ok(Removal::Removed {
                        member: label,
                        via: label_of(receiver),
                        attempts,
                    });
                }
                Ok(RemoveAttempt::NotFound) => {
                    self.forget_member(&target);
                    return Ok(Removal::AlreadyGone { member: label });
                }
                Err(err) if err.is_unreachable() => {
                    warn!(via = %label_of(receiver), error = %err, "member remove: receiver unreachable, trying another");
                    errors.push(err);
                }
                Err(err) => return Err(err),
            }
        }
        Err(if errors.len() == 1 {
            errors.remove(0)
        } else {
            EtcdError::AllEndpointsFailed(errors)
        })
    }

    async fn remove_via(
        &self,
        receiver: &ListedMember,
        id: u64,
    ) -> Result<RemoveAttempt, EtcdError> {
        let endpoint = self.member_endpoint(receiver)?;
        let attempts = AtomicUsize::new(0);
        let limit = self.timeouts().call;
        let backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(200))
            .with_max_delay(Duration::from_secs(1))
            .with_total_delay(Some(self.timeouts().confirmation()))
            .without_max_times();
        let result = (|| async {
            attempts.fetch_add(1, Ordering::Relaxed);
            self.clients
                .call(&endpoint, "member remove", limit, |mut c| async move {
                    c.member_remove(id).await
                })
                .await
        })
        .retry(backoff)
        .sleep(tokio::time::sleep)
        .when(EtcdError::is_transient)
        .notify(|err, after| {
            info!(error = %err, retry_in = ?after, "member remove refused for now, retrying");
        })
        .await;
        match result {
            Ok(_) => Ok(RemoveAttempt::Removed(attempts.load(Ordering::Relaxed))),
            Err(EtcdError::MemberNotFound { .. }) => Ok(RemoveAttempt::NotFound),
            Err(err) => Err(err),
        }
    }

    /// Poll `receiver`'s member list until `id` is absent.
    async fn confirm_gone(&self, receiver: &ListedMember, id: u64) -> Result<(), EtcdError> {
        let endpoint = self.member_endpoint(receiver)?;
        let deadline = Instant::now() + self.timeouts().confirmation();
        loop {
            let last = match self.member_list_from(&endpoint, self.timeouts().call).await {
                Ok(list) if list.members.iter().all(|m| m.id != id) => return Ok(()),
                Ok(_) => "still listed".to_string(),
                Err(err) => err.to_string(),
            };
            if Instant::now() >= deadline {
                return Err(EtcdError::NotConfirmed {
                    what: format!("removal of {id:016x}"),
                    after: self.timeouts().confirmation(),
                    last,
                });
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Forget a removed member's endpoints: its client and seed.
    fn forget_member(&self, member: &ListedMember) {
        for url in &member.client_urls {
            if let Ok(endpoint) = self.clients.resolve(url) {
                self.clients.forget(&endpoint);
            }
        }
        self.forget_seeds(&member.client_urls);
        self.note_removed(member.id);
    }

    /// Remove `id` only if quorum allows it: snapshot, assess with the quorum
    /// rule (refuse with the assessment if unsafe), move leadership off the
    /// target if it leads, then remove it.
    #[instrument(skip(self), fields(member = format!("{id:016x}")))]
    pub async fn safe_remove(&self, id: u64) -> Result<SafeRemoval, EtcdError> {
        let snap = self.snapshot().await?;
        self.safe_remove_in(&snap, id).await
    }

    /// [`Self::safe_remove`] deciding on `snap` (just taken). The verdicts come
    /// in this order, each taking precedence over the ones after it: quorum
    /// lost in the cluster as it stands (nothing can be committed, whatever
    /// else could not be read because of it), the target already gone, the
    /// removal unsafe, alarms unknown.
    pub(crate) async fn safe_remove_in(
        &self,
        snap: &MembershipSnapshot,
        id: u64,
    ) -> Result<SafeRemoval, EtcdError> {
        self.safe_remove_via_in(snap, id, None).await
    }

    /// The removal a decision planned some time ago, checked again at the
    /// moment it is carried out: [`Self::safe_remove`] on a snapshot taken
    /// now (quorum on the membership as it is, alarms known, leadership moved
    /// off the target if it leads again), the request sent to `via` (the
    /// member the decision chose) first.
    #[instrument(skip(self), fields(member = format!("{id:016x}"), via = format!("{via:016x}")))]
    pub async fn safe_remove_via(&self, id: u64, via: u64) -> Result<SafeRemoval, EtcdError> {
        let snap = self.snapshot().await?;
        self.safe_remove_via_in(&snap, id, Some(via)).await
    }

    async fn safe_remove_via_in(
        &self,
        snap: &MembershipSnapshot,
        id: u64,
        via: Option<u64>,
    ) -> Result<SafeRemoval, EtcdError> {
        check_quorum(snap)?;
        let assessment = snap.assess_removal(id);
        if snap.member(id).is_none() {
            return Ok(SafeRemoval {
                assessment,
                leader_move: None,
                removal: Removal::AlreadyGone {
                    member: format!("{id:016x}"),
                },
            });
        }
        if !assessment.is_safe() {
            // Unknown alarms could only make it less safe.
            return Err(EtcdError::UnsafeRemoval {
                assessment: Box::new(assessment),
            });
        }
        if let Some(reason) = &snap.alarms_error {
            return Err(EtcdError::AlarmsUnknown {
                reason: reason.clone(),
            });
        }
        let leader_move = if snap.leader == Some(id) {
            Some(self.move_leader_off_in(snap, id, None).await?)
        } else {
            None
        };
        let removal = self.remove_member_via(id, via).await?;
        Ok(SafeRemoval {
            assessment,
            leader_move,
            removal,
        })
    }
}

/// Quorum lost in the cluster as it stands refuses any change, with the numbers.
pub(crate) fn check_quorum(snap: &MembershipSnapshot) -> Result<(), EtcdError> {
    let cluster = snap.assess_cluster();
    if cluster.has_quorum() {
        Ok(())
    } else {
        Err(EtcdError::QuorumLost {
            assessment: Box::new(cluster),
        })
    }
}

enum RemoveAttempt {
    Removed(usize),
    NotFound,
}

fn check_transferee(member: &MemberSnapshot, target: u64) -> Result<(), EtcdError> {
    let reason = if member.id == target {
        Some("it is the member leadership moves off".to_string())
    } else if member.learner {
        Some("it is a learner".to_string())
    } else {
        member
            .unhealthy_reason()
            .map(|r| format!("it is unhealthy: {r}"))
    };
    match reason {
        Some(reason) => Err(EtcdError::InvalidTransferee {
            member: member.label(),
            reason,
        }),
        None => Ok(()),
    }
}

pub(crate) fn listed(member: &MemberSnapshot) -> ListedMember {
    ListedMember {
        id: member.id,
        name: member.name.clone(),
        peer_urls: member.peer_urls.clone(),
        client_urls: member.client_urls.clone(),
        learner: member.learner,
    }
}

fn label_of(member: &ListedMember) -> String {
    if member.name.is_empty() {
        format!("unnamed member {:016x}", member.id)
    } else {
        member.name.clone()
    }
}
