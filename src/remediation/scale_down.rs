//! Scale-down: which machine to remove, and whether it is safe now.
//!
//! Selection is CAPI KCP's `selectMachineForScaleDown`: the first non-empty set
//! of (1) outdated machines with `cluster.x-k8s.io/delete-machine`, (2) any with
//! it, (3) outdated machines with unhealthy control-plane components or etcd
//! member, (4) outdated machines, (5) all; then `MachineInFailureDomainWithMostMachines`:
//! an eligible machine outside the Cluster's failure domains goes first (the
//! oldest such one's domain); otherwise the domain with the most eligible
//! machines, then the most machines overall, then (deterministic here, random
//! upstream) the domain name; and the oldest eligible machine in that domain.
//! Preflight excludes the target: no machine deleting, every other machine has
//! a node and healthy components and etcd member; then the same quorum and
//! leadership plan as remediation.

use std::fmt;

use super::decide::{Rule, etcd_removal_plan};
use super::model::{ControlPlaneView, MachineView};
use crate::quorum::Assessment;

/// Which eligible set the pick came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EligibleSet {
    OutdatedWithDeleteAnnotation,
    WithDeleteAnnotation,
    OutdatedWithUnhealthyComponents,
    Outdated,
    All,
}

impl fmt::Display for EligibleSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EligibleSet::OutdatedWithDeleteAnnotation => {
                "outdated machines with cluster.x-k8s.io/delete-machine"
            }
            EligibleSet::WithDeleteAnnotation => "machines with cluster.x-k8s.io/delete-machine",
            EligibleSet::OutdatedWithUnhealthyComponents => {
                "outdated machines with unhealthy control-plane components or etcd member"
            }
            EligibleSet::Outdated => "outdated machines",
            EligibleSet::All => "all machines",
        })
    }
}

/// The machine selected for scale-down and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScaleDownPick {
    pub machine: String,
    pub set: EligibleSet,
    pub eligible: usize,
    pub failure_domain: Option<String>,
    /// How the failure domain was chosen, with its counts.
    pub failure_domain_reason: String,
}

impl fmt::Display for ScaleDownPick {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} from {} ({} eligible); {}; oldest eligible machine there",
            self.machine, self.set, self.eligible, self.failure_domain_reason
        )
    }
}

fn has_unhealthy_components(view: &ControlPlaneView, m: &MachineView) -> bool {
    // Upstream only counts machines with a node, and only False (not unknown).
    m.node_ref.is_some()
        && (m.components_healthy == Some(false)
            || (view.etcd_managed() && view.etcd_member_unhealthy(m)))
}

/// Select the machine to remove on scale-down; `None` without machines.
pub fn select_machine_for_scale_down(view: &ControlPlaneView) -> Option<ScaleDownPick> {
    let all: Vec<&MachineView> = view.machines.iter().collect();
    let outdated: Vec<&MachineView> = all
        .iter()
        .copied()
        .filter(|m| m.outdated && !m.is_deleting())
        .collect();
    let tiers: [(EligibleSet, Vec<&MachineView>); 4] = [
        (
            EligibleSet::OutdatedWithDeleteAnnotation,
            outdated
                .iter()
                .copied()
                .filter(|m| m.delete_requested)
                .collect(),
        ),
        (
            EligibleSet::WithDeleteAnnotation,
            all.iter().copied().filter(|m| m.delete_requested).collect(),
        ),
        (
            EligibleSet::OutdatedWithUnhealthyComponents,
            outdated
                .iter()
                .copied()
                .filter(|m| has_unhealthy_components(view, m))
                .collect(),
        ),
        (EligibleSet::Outdated, outdated.clone()),
    ];
    let (set, eligible) = tiers
        .into_iter()
        .find(|(_, machines)| !machines.is_empty())
        .unwrap_or((EligibleSet::All, all.clone()));
    if eligible.is_empty() {
        return None;
    }

    let (failure_domain, failure_domain_reason) =
        failure_domain_with_most_machines(view, &eligible);
    let machine = eligible
        .iter()
        .filter(|m| m.failure_domain == failure_domain)
        .min_by(|a, b| a.age_key().cmp(&b.age_key()))?;
    Some(ScaleDownPick {
        machine: machine.name.clone(),
        set,
        eligible: eligible.len(),
        failure_domain,
        failure_domain_reason,
    })
}

fn failure_domain_with_most_machines(
    view: &ControlPlaneView,
    eligible: &[&MachineView],
) -> (Option<String>, String) {
    let known = |fd: &Option<String>| {
        fd.as_ref()
            .is_some_and(|f| view.failure_domains.contains(f))
    };
    if let Some(oldest_outside) = eligible
        .iter()
        .filter(|m| !known(&m.failure_domain))
        .min_by(|a, b| a.age_key().cmp(&b.age_key()))
    {
        let fd = oldest_outside.failure_domain.clone();
        let reason = match &fd {
            None => format!(
                "{} has no failure domain, so it goes first",
                oldest_outside.name
            ),
            Some(f) => format!(
                "{} is in failure domain {f}, which the Cluster no longer offers, so it goes first",
                oldest_outside.name
            ),
        };
        return (fd, reason);
    }
    let count = |machines: &[&MachineView], fd: &str| {
        machines
            .iter()
            .filter(|m| m.failure_domain.as_deref() == Some(fd))
            .count()
    };
    let all: Vec<&MachineView> = view.machines.iter().collect();
    let best = view
        .failure_domains
        .iter()
        .map(|fd| (count(eligible, fd), count(&all, fd), fd))
        .filter(|(eligible_here, _, _)| *eligible_here > 0)
        // Most eligible, then most overall, then the smallest name.
        .max_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)).then_with(|| b.2.cmp(a.2)));
    match best {
        Some((e, a, fd)) => (
            Some(fd.clone()),
            format!("failure domain {fd} has the most machines ({e} eligible, {a} in total)"),
        ),
        None => (None, "no failure domain".into()),
    }
}

/// The scale-down to carry out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScaleDown {
    pub machine: String,
    pub member: Option<u64>,
    pub transferee: Option<u64>,
    pub assessment: Option<Assessment>,
    pub pick: ScaleDownPick,
}

/// Why scale-down waits (or cannot happen).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScaleDownRule {
    NotNeeded,
    MachineDeleting,
    OtherMachineUnhealthy,
    /// Quorum or leadership refused (the remediation rule that fired).
    Etcd(Rule),
}

impl ScaleDownRule {
    pub fn as_str(self) -> &'static str {
        match self {
            ScaleDownRule::NotNeeded => "scale-down.not-needed",
            ScaleDownRule::MachineDeleting => "scale-down.machine-deleting",
            ScaleDownRule::OtherMachineUnhealthy => "scale-down.other-machine-unhealthy",
            ScaleDownRule::Etcd(rule) => rule.as_str(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScaleDownDecision {
    Go {
        scale_down: Box<ScaleDown>,
        message: String,
    },
    Wait {
        rule: ScaleDownRule,
        message: String,
    },
}

/// Decide a scale-down step (one machine) for `view`.
pub fn decide_scale_down(view: &ControlPlaneView) -> ScaleDownDecision {
    // Deleting machines count, as upstream: the preflight below then waits for them.
    let count = view.machines.len();
    let Some(pick) =
        select_machine_for_scale_down(view).filter(|_| count as u32 > view.desired_replicas)
    else {
        return ScaleDownDecision::Wait {
            rule: ScaleDownRule::NotNeeded,
            message: format!(
                "{count} machines for {} desired replicas: nothing to scale down",
                view.desired_replicas
            ),
        };
    };
    removal_of(view, pick)
}

/// Decide removing one outdated Machine for a rollout: the same selection
/// (outdated machines first), preflight and etcd plan as a scale-down, but
/// without requiring more Machines than `replicas` (a rollout with maxSurge 0
/// removes first).
pub fn decide_outdated_removal(view: &ControlPlaneView) -> ScaleDownDecision {
    match select_machine_for_scale_down(view).filter(|p| p.set != EligibleSet::All) {
        Some(pick) => removal_of(view, pick),
        None => ScaleDownDecision::Wait {
            rule: ScaleDownRule::NotNeeded,
            message: "no outdated machine to remove".into(),
        },
    }
}

fn removal_of(view: &ControlPlaneView, pick: ScaleDownPick) -> ScaleDownDecision {
    let deleting = view.deleting_machine_names();
    if !deleting.is_empty() {
        return ScaleDownDecision::Wait {
            rule: ScaleDownRule::MachineDeleting,
            message: format!(
                "waiting for machine deletion to complete before removing {} (deleting: {})",
                pick.machine,
                deleting.join(", ")
            ),
        };
    }
    let problems: Vec<String> = view
        .machines
        .iter()
        .filter(|m| m.name != pick.machine)
        .filter_map(|m| machine_problem(view, m))
        .collect();
    if !problems.is_empty() {
        return ScaleDownDecision::Wait {
            rule: ScaleDownRule::OtherMachineUnhealthy,
            message: format!(
                "waiting for the control plane to be healthy before removing {}: {}",
                pick.machine,
                problems.join("; ")
            ),
        };
    }
    let target = view
        .machine(&pick.machine)
        .expect("the pick comes from the view");
    match etcd_removal_plan(view, target) {
        Err((rule, message)) => ScaleDownDecision::Wait {
            rule: ScaleDownRule::Etcd(rule),
            message,
        },
        Ok((member, transferee, assessment)) => {
            let mut message = format!("scale-down removes {pick}");
            if let Some(a) = &assessment {
                message.push_str(&format!("; {a}"));
            }
            ScaleDownDecision::Go {
                scale_down: Box::new(ScaleDown {
                    machine: pick.machine.clone(),
                    member,
                    transferee,
                    assessment,
                    pick,
                }),
                message,
            }
        }
    }
}

fn machine_problem(view: &ControlPlaneView, m: &MachineView) -> Option<String> {
    if m.node_ref.is_none() {
        return Some(format!("{} has no node yet", m.name));
    }
    match m.components_healthy {
        Some(true) => {}
        Some(false) => return Some(format!("{} has unhealthy control-plane components", m.name)),
        None => {
            return Some(format!(
                "{} control-plane component health is unknown",
                m.name
            ));
        }
    }
    if view.etcd_managed()
        && let Some(member) = view.member_of(m)
        && let Some(reason) = member.unhealthy_reason()
    {
        return Some(format!(
            "{} etcd member {} is unhealthy ({reason})",
            m.name,
            member.label()
        ));
    }
    None
}
