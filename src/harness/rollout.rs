//! Driving a control plane through a rollout one reconcile at a time, with the
//! simulated infrastructure between reconciles, and recording what etcd and
//! the Machines looked like around every step: the tests assert on the record
//! (quorum, one Machine deleting, the leader never removed), the rollout
//! benchmark reads its clocks (the controller's own time vs. waiting on etcd).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use kube::ResourceExt;

use crate::api::{KThreesControlPlane, Machine};
use crate::controller::reconcile::reconcile;

use super::infra_sim::{Provisioned, reconcile_infrastructure};
use super::sandbox::{Sandbox, SandboxError};

/// How to drive.
#[derive(Clone, Debug)]
pub struct Drive {
    /// A new controller Context for every reconcile: no pool, no memory, as
    /// after a crash and restart between any two steps.
    pub crash_after_every_step: bool,
    /// Give up after this long.
    pub limit: Duration,
}

/// The world around one reconcile.
#[derive(Clone, Debug)]
pub struct StepRecord {
    /// The etcd leader just before the reconcile.
    pub leader_before: Option<u64>,
    /// Members present before and gone after the reconcile and the
    /// infrastructure pass after it.
    pub removed_members: Vec<u64>,
    /// After the step: healthy voters and voters (None: etcd unreadable).
    pub healthy_voters: Option<(usize, usize)>,
    /// After the step: Machines with a deletionTimestamp.
    pub deleting: Vec<String>,
    /// After the step: Machines without one.
    pub live: usize,
    /// How long the reconcile took.
    pub reconcile_took: Duration,
    /// The reconcile's error, if any (a conflict is ordinary).
    pub error: Option<String>,
}

/// What a drive did and how long each part took.
#[derive(Clone, Debug, Default)]
pub struct DriveRecord {
    pub steps: Vec<StepRecord>,
    /// Every Machine name seen during the drive.
    pub machines_seen: BTreeSet<String>,
    /// Machines the infrastructure booted (each joined etcd as a learner and
    /// was promoted).
    pub provisioned: Vec<Provisioned>,
    pub wall: Duration,
    /// Inside `reconcile` (observing, deciding, acting, its etcd operations).
    pub controller: Duration,
    /// Inside the infrastructure passes: servers booting, their members
    /// joining as learners past etcd's start-up guard and being promoted.
    pub waiting_on_etcd: Duration,
}

impl DriveRecord {
    /// Removals of a member that was the leader just before the step.
    pub fn leader_removals(&self) -> Vec<u64> {
        self.steps
            .iter()
            .flat_map(|s| {
                s.removed_members
                    .iter()
                    .filter(|m| s.leader_before == Some(**m))
                    .copied()
            })
            .collect()
    }

    /// The fewest healthy voters after any step, with the voters then.
    pub fn min_healthy_voters(&self) -> Option<(usize, usize)> {
        self.steps
            .iter()
            .filter_map(|s| s.healthy_voters)
            .min_by_key(|(healthy, _)| *healthy)
    }

    /// Time in reconciles that removed a member: etcd's `MemberRemove`, which
    /// etcd refuses until every voter has been connected to the leader for
    /// 5 s (the controller retries it), so mostly waiting on etcd.
    pub fn member_removal_time(&self) -> Duration {
        self.steps
            .iter()
            .filter(|s| !s.removed_members.is_empty())
            .map(|s| s.reconcile_took)
            .sum()
    }

    /// The most live Machines after any step.
    pub fn max_live(&self) -> usize {
        self.steps.iter().map(|s| s.live).max().unwrap_or(0)
    }

    /// The most Machines deleting at once after any step.
    pub fn max_deleting(&self) -> usize {
        self.steps
            .iter()
            .map(|s| s.deleting.len())
            .max()
            .unwrap_or(0)
    }
}

async fn members_and_leader(
    sandbox: &Sandbox,
) -> Option<(BTreeSet<u64>, Option<u64>, (usize, usize))> {
    let snap = sandbox.etcd.connect().snapshot().await.ok()?;
    let a = snap.assess_cluster();
    Some((
        snap.members.iter().map(|m| m.id).collect(),
        snap.leader,
        (a.healthy, a.voters),
    ))
}

/// Reconcile `sandbox`'s control plane one step at a time until `done` holds
/// for the Machines and the control plane, recording every step.
pub async fn drive_until(
    sandbox: &mut Sandbox,
    drive: &Drive,
    mut done: impl FnMut(&[Machine], &KThreesControlPlane) -> bool,
) -> Result<DriveRecord, SandboxError> {
    let started = Instant::now();
    let mut record = DriveRecord::default();
    // One step per reconcile: every step is recorded on its own.
    let client = sandbox.client();
    let one_step =
        || super::sandbox::controller_context(client.clone(), super::sandbox::one_step_settings());
    let mut ctx = one_step();
    let kcps = sandbox.kcp_api();
    let name = super::sandbox::KCP;
    loop {
        let before = members_and_leader(sandbox).await;
        let kcp = kcps
            .get(name)
            .await
            .map_err(|e| SandboxError(format!("get KThreesControlPlane {name}: {e}")))?;
        if drive.crash_after_every_step {
            ctx = one_step();
        }
        let t = Instant::now();
        let result = reconcile(std::sync::Arc::new(kcp), ctx.clone()).await;
        let reconcile_took = t.elapsed();
        record.controller += reconcile_took;
        let t = Instant::now();
        let pass = reconcile_infrastructure(sandbox, drive.limit).await?;
        record.waiting_on_etcd += t.elapsed();
        record.provisioned.extend(pass.provisioned);

        let after = members_and_leader(sandbox).await;
        let machines = sandbox
            .machines_api()
            .list(&Default::default())
            .await
            .map_err(|e| SandboxError(format!("list Machines: {e}")))?
            .items;
        record
            .machines_seen
            .extend(machines.iter().map(|m| m.name_any()));
        record.steps.push(StepRecord {
            leader_before: before.as_ref().and_then(|b| b.1),
            removed_members: match (&before, &after) {
                (Some(b), Some(a)) => b.0.difference(&a.0).copied().collect(),
                _ => vec![],
            },
            healthy_voters: after.as_ref().map(|a| a.2),
            deleting: machines
                .iter()
                .filter(|m| m.is_deleting())
                .map(|m| m.name_any())
                .collect(),
            live: machines.iter().filter(|m| !m.is_deleting()).count(),
            reconcile_took,
            error: result.err().map(|e| e.to_string()),
        });
        let kcp = kcps
            .get(name)
            .await
            .map_err(|e| SandboxError(format!("get KThreesControlPlane {name}: {e}")))?;
        if done(&machines, &kcp) {
            record.wall = started.elapsed();
            return Ok(record);
        }
        if started.elapsed() > drive.limit {
            return Err(SandboxError(format!(
                "not done after {} steps in {:?}; last step: {:?}",
                record.steps.len(),
                drive.limit,
                record.steps.last()
            )));
        }
        // Pacing only: what the controller waits for is awaited by the loop.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
