//! Preflight, as CAPI's KCP runs it before it adds a Machine (scale-up or a
//! rollout's surge) or removes an outdated one: the control plane must be
//! quiet and whole. Pure.

use std::fmt;

use crate::remediation::model::{ControlPlaneView, EtcdState};

/// The check that failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    MachineDeleting,
    MachineProvisioning,
    NodeNotReady,
    EtcdUnreachable,
    EtcdLearner,
    EtcdMemberUnhealthy,
    /// A Machine's Node shows embedded etcd but it has no member (past the
    /// grace period): the cluster runs one voter fewer than it has servers.
    EtcdMemberMissing,
    /// An up-to-date Machine (a replacement) has no etcd member that is a
    /// healthy voter yet: it has not joined, or is still a learner.
    ReplacementNotVoter,
    /// Members are unhealthy only because etcd is settling after a change of
    /// leader or voters (a just-promoted member, a read that straddled a
    /// leadership change): it passes within a few heartbeats.
    EtcdSettling,
}

impl Check {
    pub const ALL: [Check; 9] = [
        Check::MachineDeleting,
        Check::MachineProvisioning,
        Check::NodeNotReady,
        Check::EtcdUnreachable,
        Check::EtcdLearner,
        Check::EtcdMemberUnhealthy,
        Check::EtcdMemberMissing,
        Check::ReplacementNotVoter,
        Check::EtcdSettling,
    ];

    /// The check a rule suffix (`rollout.<check>`, `scale-up.<check>`) names.
    pub fn from_name(name: &str) -> Option<Check> {
        Check::ALL.into_iter().find(|c| c.as_str() == name)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Check::MachineDeleting => "machine-deleting",
            Check::MachineProvisioning => "machine-provisioning",
            Check::NodeNotReady => "node-not-ready",
            Check::EtcdUnreachable => "etcd-unreachable",
            Check::EtcdLearner => "etcd-learner",
            Check::EtcdMemberUnhealthy => "etcd-member-unhealthy",
            Check::EtcdMemberMissing => "etcd-member-missing",
            Check::ReplacementNotVoter => "replacement-not-voter",
            Check::EtcdSettling => "etcd-settling",
        }
    }

    /// Ordinary progress (a Machine coming or going) rather than a problem
    /// someone may have to look at.
    pub fn is_progress(self) -> bool {
        matches!(
            self,
            Check::MachineDeleting
                | Check::MachineProvisioning
                | Check::EtcdLearner
                | Check::ReplacementNotVoter
                | Check::EtcdSettling
        )
    }
}

/// Why preflight refused, with the Machine or member it is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub check: Check,
    pub message: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

fn fail(check: Check, message: String) -> Result<(), Failure> {
    Err(Failure { check, message })
}

/// Whether a Machine may be added now: no Machine deleting or provisioning,
/// every Node ready, and (when etcd is ours) the membership readable, without
/// a learner and with every member healthy.
pub fn before_adding(view: &ControlPlaneView) -> Result<(), Failure> {
    machines_settled(view)?;
    etcd_settled(view)
}

/// Whether an outdated Machine may be removed by a rollout: as
/// [`before_adding`], and every up-to-date Machine already runs a healthy
/// voting member (the replacement must carry its share of quorum first).
pub fn before_removing_outdated(view: &ControlPlaneView) -> Result<(), Failure> {
    before_adding(view)?;
    let Some(membership) = view.membership() else {
        return Ok(());
    };
    for m in view.machines.iter().filter(|m| !m.outdated) {
        match m.etcd_member.and_then(|id| membership.member(id)) {
            None => {
                return fail(
                    Check::ReplacementNotVoter,
                    format!(
                        "waiting for {}'s etcd member to join before an outdated Machine goes",
                        m.name
                    ),
                );
            }
            Some(member) if !membership.is_healthy_voter(member.id) => {
                return fail(
                    Check::ReplacementNotVoter,
                    format!(
                        "waiting for {}'s etcd member {} to be a healthy voter before an outdated Machine goes",
                        m.name,
                        member.label()
                    ),
                );
            }
            Some(_) => {}
        }
    }
    Ok(())
}

fn machines_settled(view: &ControlPlaneView) -> Result<(), Failure> {
    if let Some(m) = view.machines.iter().find(|m| m.is_deleting()) {
        return fail(
            Check::MachineDeleting,
            format!("waiting for {} to finish deleting", m.name),
        );
    }
    if let Some(m) = view.machines.iter().find(|m| m.node_ref.is_none()) {
        return fail(
            Check::MachineProvisioning,
            format!("waiting for {} to get a node", m.name),
        );
    }
    if let Some(m) = view
        .machines
        .iter()
        .find(|m| m.components_healthy != Some(true))
    {
        let state = match m.components_healthy {
            Some(false) => "not ready",
            _ => "of unknown readiness",
        };
        return fail(
            Check::NodeNotReady,
            format!(
                "waiting for {}'s node {} (it is {state})",
                m.name,
                m.node_ref.as_deref().unwrap_or("?")
            ),
        );
    }
    Ok(())
}

fn etcd_settled(view: &ControlPlaneView) -> Result<(), Failure> {
    match &view.etcd {
        EtcdState::NotManaged => Ok(()),
        EtcdState::Unreachable { reason } => fail(
            Check::EtcdUnreachable,
            format!("etcd membership cannot be read: {reason}"),
        ),
        EtcdState::Observed(membership) => {
            if let Some(l) = membership.members.iter().find(|m| m.learner) {
                return fail(
                    Check::EtcdLearner,
                    format!(
                        "waiting for learner {} to be promoted (the voter set is changing)",
                        l.label()
                    ),
                );
            }
            let unhealthy: Vec<(&crate::quorum::MemberView, String)> = membership
                .members
                .iter()
                .filter_map(|m| {
                    if m.name.is_empty() {
                        Some((m, "added but not started".to_string()))
                    } else {
                        m.unhealthy_reason().map(|why| (m, why))
                    }
                })
                .collect();
            if let Some((m, why)) = unhealthy.first() {
                // Only settling after a change of leader or voters: progress.
                let check = if unhealthy.iter().all(|(_, why)| {
                    crate::quorum::is_settling_reason(why, membership.leader.is_some())
                }) {
                    Check::EtcdSettling
                } else {
                    Check::EtcdMemberUnhealthy
                };
                return fail(
                    check,
                    format!("etcd member {} is unhealthy ({why})", m.label()),
                );
            }
            if let Some((machine, missing)) = view.machines.iter().find_map(|m| {
                m.etcd_member_missing
                    .as_ref()
                    .filter(|x| x.confirmed && !m.is_deleting())
                    .map(|x| (m, x))
            }) {
                return fail(
                    Check::EtcdMemberMissing,
                    format!(
                        "{}'s Node {} shows embedded etcd ({}) but has no etcd member: \
                         remediate it first",
                        machine.name, missing.node, missing.marks
                    ),
                );
            }
            Ok(())
        }
    }
}
