//! What an infrastructure provider and k3s do for a control-plane Machine of a
//! [`Sandbox`], for tests and the demo where no real machines exist:
//! - [`provision`]: the new server boots and k3s joins etcd as k3s does (a
//!   learner), registers its Node with the k3s etcd annotations and the
//!   Machine reports `status.nodeRef` and addresses while it is a learner,
//!   then it is promoted once in sync;
//! - [`decommission`]: a deleted Machine's server goes away (its etcd process
//!   stops, CAPI deletes its Node).
//! - a Machine whose KThreesConfig runs `k3s server --cluster-reset
//!   --cluster-reset-restore-path` after its install restores that snapshot
//!   instead of joining ([`super::restore`]), and the sandbox's etcd cluster
//!   becomes the restored one: later Machines join it.
//!
//! The etcd member is real (a new etcd process with its own certificates);
//! only the machine around it is simulated.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::DeleteParams;
use tokio::time::Instant;

use kube::ResourceExt;

use crate::api::names::CONTROL_PLANE_LABEL;
use crate::etcd::EtcdError;

use super::bringup::bootstrap_inputs;

use super::sandbox::{Sandbox, SandboxError};

/// What provisioning produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Provisioned {
    pub machine: String,
    pub node: String,
    pub member: String,
    pub member_id: u64,
    pub ip: String,
    /// How many times etcd refused the learner's `MemberAdd` before accepting
    /// it ("unhealthy cluster" until its leader has been connected to every
    /// voter for 5 s, as a k3s server joining retries).
    pub member_add_refusals: u32,
    /// How many `MemberPromote` calls it took (etcd refuses while the learner
    /// is not in sync with the leader).
    pub promote_attempts: u32,
    /// From the boot to a healthy voter with its Node registered.
    pub took: Duration,
}

fn sandbox_err(context: &str) -> impl Fn(String) -> SandboxError + '_ {
    move |e| SandboxError(format!("{context}: {e}"))
}

/// Boot `machine`: a new etcd member joins as a learner and is promoted, its
/// Node registers, and the Machine gets its nodeRef and address. `machine` is
/// then recorded in `sandbox.machines` at its member's index.
pub async fn provision(
    sandbox: &mut Sandbox,
    machine: &str,
    limit: Duration,
) -> Result<Provisioned, SandboxError> {
    let started = Instant::now();
    let deadline = started + limit;
    // A Machine whose KThreesConfig restores a snapshot boots as the first
    // server of the restored cluster instead of joining (docs/k3s.md SR1 to SR10).
    if let Some((plan, files)) = super::restore::restore_plan_of(&sandbox.client(), machine).await?
    {
        let restored =
            super::restore::provision_restore(sandbox, machine, &plan, &files, limit).await?;
        return Ok(Provisioned {
            machine: restored.machine,
            node: restored.node,
            member: restored.member,
            member_id: restored.member_id,
            ip: restored.ip,
            member_add_refusals: 0,
            promote_attempts: 0,
            took: started.elapsed(),
        });
    }
    let index = sandbox
        .etcd
        .add_learner()
        .await
        .map_err(|e| SandboxError(format!("add an etcd learner for {machine}: {e}")))?;
    let (node, ip, member, member_id, member_add_refusals, proxied) = {
        let m = sandbox.etcd.member(index);
        (
            m.node_name.clone(),
            m.ip.to_string(),
            m.name.clone(),
            m.id,
            m.member_add_refusals,
            m.listen_client_addr(),
        )
    };
    // k3s registers the Node (and CAPI sets the nodeRef) while the member
    // is still a learner; promotion comes later (docs/k3s.md L1).
    sandbox.add_node(&node, &ip, Some(&member)).await?;
    sandbox.add_etcd_proxy(&node, proxied).await?;
    sandbox.provision(machine, &node, &ip).await?;
    let promote_attempts = promote(sandbox, member_id, deadline)
        .await
        .map_err(sandbox_err(&format!("promote etcd learner {member}")))?;
    wait_voter_in_sync(sandbox, &member, deadline)
        .await
        .map_err(sandbox_err(&format!("etcd member {member} joining")))?;
    while sandbox.machines.len() < index {
        sandbox.machines.push(String::new());
    }
    if sandbox.machines.len() == index {
        sandbox.machines.push(machine.to_string());
    } else {
        sandbox.machines[index] = machine.to_string();
    }
    Ok(Provisioned {
        machine: machine.to_string(),
        node,
        member,
        member_id,
        ip,
        member_add_refusals,
        promote_attempts,
        took: started.elapsed(),
    })
}

/// `MemberPromote`, sent to the leader, retried while etcd says the learner is
/// not in sync yet (or the cluster is transiently unhealthy).
async fn promote(sandbox: &Sandbox, id: u64, deadline: Instant) -> Result<u32, String> {
    let etcd = sandbox.etcd.connect();
    let mut attempts = 0;
    loop {
        attempts += 1;
        let result = async {
            let snap = etcd.snapshot().await?;
            let leader = snap.leader_member().ok_or_else(|| EtcdError::Client {
                endpoint: snap.listed_by.clone(),
                op: "member promote",
                detail: "no leader".into(),
            })?;
            let url = leader.client_urls.first().cloned().unwrap_or_default();
            let endpoint = sandbox.etcd.transport().resolve(&url)?;
            etcd.clients
                .call(
                    &endpoint,
                    "member promote",
                    Duration::from_secs(3),
                    |mut c| async move { c.member_promote(id).await },
                )
                .await
        }
        .await;
        let retry = match &result {
            Ok(_) => return Ok(attempts),
            Err(EtcdError::Grpc { message, .. }) => {
                message.contains("in sync") || message.contains("not ready")
            }
            Err(err) => err.is_transient() || err.is_unreachable(),
        };
        match result {
            Err(err) if !retry || Instant::now() >= deadline => {
                return Err(format!("{err} (after {attempts} attempt(s))"));
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Wait until `member` is a healthy voter following the leader.
async fn wait_voter_in_sync(
    sandbox: &Sandbox,
    member: &str,
    deadline: Instant,
) -> Result<(), String> {
    let etcd = sandbox.etcd.connect();
    loop {
        let last = match etcd.snapshot().await {
            Ok(snap) => match (snap.member_by_name(member), snap.leader) {
                (Some(m), Some(leader))
                    if !m.learner
                        && m.is_healthy()
                        && m.status.as_ref().map(|s| s.leader) == Some(leader) =>
                {
                    return Ok(());
                }
                (Some(m), _) => format!(
                    "learner={}, health={}",
                    m.learner,
                    m.unhealthy_reason().unwrap_or_else(|| "healthy".into())
                ),
                (None, _) => "not listed".into(),
            },
            Err(err) => err.to_string(),
        };
        if Instant::now() >= deadline {
            return Err(format!("not a healthy voter in time: {last}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A k3s join that failed half-way: the joining server added its etcd member
/// (a voter, as older k3s and `etcdctl member add` do) and never started it.
/// etcd lists it without a name. Returns its id.
pub async fn add_ghost_member(sandbox: &Sandbox, ip: &str) -> Result<u64, SandboxError> {
    let etcd = sandbox.etcd.connect();
    let endpoint = sandbox
        .etcd
        .transport()
        .resolve(&sandbox.etcd.member(0).client_url())
        .map_err(|e| SandboxError(format!("ghost member: {e}")))?;
    let peer = vec![format!("https://{ip}:2380")];
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let urls = peer.clone();
        let result = etcd
            .clients
            .call(
                &endpoint,
                "member add",
                Duration::from_secs(3),
                |mut c| async move { c.member_add(urls, None).await },
            )
            .await;
        match result {
            Ok(resp) => return Ok(resp.member().map_or(0, |m| m.id())),
            Err(err) if err.is_transient() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(err) => return Err(SandboxError(format!("add a ghost member at {ip}: {err}"))),
        }
    }
}

/// What one pass of [`reconcile_infrastructure`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InfraPass {
    /// The Machines booted in this pass, in order, with what each produced.
    pub provisioned: Vec<Provisioned>,
    pub decommissioned: Vec<String>,
}

/// One pass of the simulated infrastructure provider over the Machines, as a
/// real one reacts to them: a control-plane Machine that is new (no nodeRef,
/// not deleting, not booted yet) boots from its bootstrap inputs (its
/// KThreesConfig and the join token must exist) and joins; a booted Machine
/// that is gone is decommissioned.
pub async fn reconcile_infrastructure(
    sandbox: &mut Sandbox,
    limit: Duration,
) -> Result<InfraPass, SandboxError> {
    let list = sandbox
        .machines_api()
        .list(&Default::default())
        .await
        .map_err(|e| SandboxError(format!("list Machines: {e}")))?;
    let mut pass = InfraPass::default();
    let present: std::collections::HashSet<String> =
        list.items.iter().map(|m| m.name_any()).collect();
    for machine in sandbox.machines.clone() {
        if !machine.is_empty() && !present.contains(&machine) {
            decommission(sandbox, &machine).await?;
            if let Some(slot) = sandbox.machines.iter_mut().find(|m| **m == machine) {
                slot.clear();
            }
            pass.decommissioned.push(machine);
        }
    }
    for m in &list.items {
        let name = m.name_any();
        // A machine boots once: one whose restore failed stays as it is.
        let new = m.labels().contains_key(CONTROL_PLANE_LABEL)
            && !m.is_deleting()
            && m.node_name().is_none()
            && !sandbox.machines.contains(&name)
            && !sandbox.restores.iter().any(|r| r.machine == name);
        if new {
            bootstrap_inputs(&sandbox.client(), &name).await?;
            pass.provisioned
                .push(provision(sandbox, &name, limit).await?);
        }
    }
    Ok(pass)
}

/// A deleted Machine's server goes away: its etcd process is stopped (a removed
/// member has usually exited by itself already) and its Node is deleted, as
/// CAPI's Machine controller does.
pub async fn decommission(sandbox: &mut Sandbox, machine: &str) -> Result<(), SandboxError> {
    let Some(index) = sandbox.machines.iter().position(|m| m == machine) else {
        return Err(SandboxError(format!("no sandbox machine {machine}")));
    };
    sandbox
        .etcd
        .stop(index)
        .await
        .map_err(|e| SandboxError(format!("stop the etcd member of {machine}: {e}")))?;
    let node = sandbox.etcd.member(index).node_name.clone();
    let nodes: Api<Node> = Api::all(sandbox.workload.client());
    match nodes.delete(&node, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(SandboxError(format!("delete Node {node}: {e}"))),
    }
}
