//! Deletions the controller did not start: a person's `kubectl delete
//! machine` of the etcd leader's Machine, two Machines deleted at once, a
//! deleting Machine whose member cannot be mapped, and five servers with two
//! dead members that a MachineHealthCheck marks (Cluster API issue #10125).
//!
//! Real etcd, the test API servers, CAPI's Machine deletion simulated
//! (`harness::capi_sim`), the infrastructure simulated (`harness::infra_sim`:
//! a new Machine's server joins etcd as a learner and is promoted), and the
//! real controller loop. A concurrent [`Sampler`] records, as fast as it can,
//! the Machines (listed before and after each etcd snapshot), the membership
//! and the control plane's status, so that orderings ("the member was gone
//! before the Machine") are checked on what was actually seen, not inferred.

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k3s_control_plane::api::names::{
    K3S_ETCD_NODE_ADDRESS_ANNOTATION, K3S_ETCD_NODE_NAME_ANNOTATION, PRE_TERMINATE_HOOK_ANNOTATION,
};
use k3s_control_plane::api::{KThreesControlPlane, Machine};
use k3s_control_plane::etcd::EtcdCluster;
use k3s_control_plane::harness::etcd::EtcdTestCluster;
use k3s_control_plane::harness::infra_sim::reconcile_infrastructure;
use k3s_control_plane::harness::sandbox::{KCP, Sandbox};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use support::{LIMIT, init_logs, kcp, machines, spare_ip, wait_reconciles};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// k3s's raft election timeout, which the sandbox's members run with.
const ELECTION: Duration = Duration::from_secs(5);
/// A leadership handover (or a member's exit) may leave a sample without a
/// leader; quorum lost is a cluster that does not come back within this.
const HANDOVER: Duration = Duration::from_secs(10);

/// A Machine as one listing saw it.
#[derive(Clone, Debug)]
struct SeenMachine {
    deleting: bool,
    hooked: bool,
    node: Option<String>,
}

/// The membership as one snapshot saw it.
#[derive(Clone, Debug)]
struct SeenMembers {
    /// name -> (id, learner, healthy)
    members: BTreeMap<String, (u64, bool, bool)>,
    leader: Option<u64>,
    healthy: usize,
    voters: usize,
    quorum: usize,
    /// A probe timed out: the health counts say nothing (a starved sampler).
    probe_timed_out: bool,
}

impl SeenMembers {
    fn has(&self, name: &str) -> bool {
        self.members.contains_key(name)
    }
}

/// The control plane's spec and status as one read saw them.
#[derive(Clone, Debug)]
struct SeenKcp {
    desired: i32,
    ready: i32,
    available: Option<(String, String)>,
    scaling_up: Option<(String, String)>,
}

#[derive(Clone, Debug)]
struct Sample {
    at: Duration,
    /// Machines listed before the snapshot.
    before: BTreeMap<String, SeenMachine>,
    /// None: no member answered the snapshot.
    etcd: Option<SeenMembers>,
    /// Machines listed after the snapshot.
    after: BTreeMap<String, SeenMachine>,
    kcp: Option<SeenKcp>,
}

async fn list_machines(api: &Api<Machine>) -> Option<BTreeMap<String, SeenMachine>> {
    let list = api.list(&ListParams::default()).await.ok()?;
    Some(
        list.items
            .iter()
            .map(|m| {
                (
                    m.name_any(),
                    SeenMachine {
                        deleting: m.is_deleting(),
                        hooked: m.annotations().contains_key(PRE_TERMINATE_HOOK_ANNOTATION),
                        node: m.node_name().map(str::to_string),
                    },
                )
            })
            .collect(),
    )
}

async fn seen_members(admin: &EtcdCluster) -> Option<SeenMembers> {
    let snap = admin.snapshot().await.ok()?;
    let a = snap.assess_cluster();
    Some(SeenMembers {
        members: snap
            .members
            .iter()
            .filter(|m| !m.name.is_empty())
            .map(|m| (m.name.clone(), (m.id, m.learner, m.is_healthy())))
            .collect(),
        leader: snap.leader,
        healthy: a.healthy,
        voters: a.voters,
        quorum: a.size,
        probe_timed_out: snap.members.iter().any(|m| {
            m.probe_error
                .as_deref()
                .is_some_and(|e| e.contains("timed out"))
        }),
    })
}

fn condition(kcp: &KThreesControlPlane, type_: &str) -> Option<(String, String)> {
    kcp.conditions()
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.message.clone()))
}

/// Samples the world concurrently with the controller and the simulated
/// infrastructure until finished.
struct Sampler {
    stop: Arc<AtomicBool>,
    task: Option<JoinHandle<Vec<Sample>>>,
}

impl Sampler {
    fn start(sandbox: &Sandbox) -> Self {
        let machines = sandbox.machines_api();
        let kcps = sandbox.kcp_api();
        let admin = sandbox.etcd.connect();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let started = Instant::now();
        let task = tokio::spawn(async move {
            let mut samples = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                let Some(before) = list_machines(&machines).await else {
                    continue;
                };
                let etcd = seen_members(&admin).await;
                let Some(after) = list_machines(&machines).await else {
                    continue;
                };
                let kcp = kcps.get(KCP).await.ok().map(|k| SeenKcp {
                    desired: k.desired_replicas(),
                    ready: k.status.as_ref().map_or(0, |s| s.ready_replicas),
                    available: condition(&k, "Available"),
                    scaling_up: condition(&k, "ScalingUp"),
                });
                samples.push(Sample {
                    at: started.elapsed(),
                    before,
                    etcd,
                    after,
                    kcp,
                });
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            samples
        });
        Sampler {
            stop,
            task: Some(task),
        }
    }

    async fn finish(mut self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.take().expect("finished once").await.unwrap()
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// The longest stretch of samples without quorum (or without any member
/// answering), from its first sample to the next sample with quorum, and
/// what its first sample saw. A sample whose probe timed out says nothing.
fn longest_quorum_gap(samples: &[Sample]) -> (Duration, String) {
    let mut longest = (Duration::ZERO, String::new());
    let mut open: Option<(Duration, String)> = None;
    for s in samples {
        let bad = match &s.etcd {
            None => Some("no member answered".to_string()),
            Some(e) if e.probe_timed_out => continue,
            Some(e) if e.healthy < e.quorum || e.leader.is_none() => Some(format!(
                "{} of {} voters healthy, quorum {}, leader {:?}",
                e.healthy, e.voters, e.quorum, e.leader
            )),
            Some(_) => None,
        };
        match (bad, &open) {
            (Some(what), None) => open = Some((s.at, format!("at {:?}: {what}", s.at))),
            (None, Some((since, what))) => {
                if s.at - *since > longest.0 {
                    longest = (s.at - *since, what.clone());
                }
                open = None;
            }
            _ => {}
        }
    }
    if let (Some((since, what)), Some(last)) = (open, samples.last()) {
        let gap = last.at - since;
        if gap > longest.0 {
            longest = (gap, format!("{what} (never back)"));
        }
    }
    longest
}

fn assert_quorum_kept(samples: &[Sample], what: &str) {
    let (gap, detail) = longest_quorum_gap(samples);
    assert!(
        gap < HANDOVER,
        "{what}: without quorum for {gap:?} (more than two election timeouts of {ELECTION:?}): {detail}"
    );
    eprintln!("{what}: longest stretch without quorum or leader: {gap:?} {detail}");
}

/// No sample saw `machine` gone (listed before the snapshot) while the
/// snapshot still listed `member`: the member was removed before the Machine
/// disappeared. Also: `machine` is seen gone at all.
fn assert_member_gone_before_machine(samples: &[Sample], machine: &str, member: &str) {
    let mut seen_gone = false;
    for s in samples {
        if s.before.contains_key(machine) {
            continue;
        }
        seen_gone = true;
        if let Some(e) = &s.etcd {
            assert!(
                !e.has(member),
                "at {:?} Machine {machine} was gone while its member {member} was still in etcd",
                s.at
            );
        }
    }
    assert!(seen_gone, "no sample saw {machine} gone");
}

/// When `member` was first seen missing from a snapshot.
fn member_removed_at(samples: &[Sample], member: &str) -> Option<usize> {
    samples
        .iter()
        .position(|s| s.etcd.as_ref().is_some_and(|e| !e.has(member)))
}

/// Every Machine of the sandbox carries our pre-terminate hook (the
/// controller puts it on live Machines that lack it before anything else).
async fn wait_all_hooked(sandbox: &Sandbox) {
    sandbox
        .wait_for(
            "every Machine to carry our pre-terminate hook",
            LIMIT,
            || async {
                let all = machines(sandbox).await;
                let missing: Vec<String> = all
                    .iter()
                    .filter(|m| !m.annotations().contains_key(PRE_TERMINATE_HOOK_ANNOTATION))
                    .map(|m| m.name_any())
                    .collect();
                if all.is_empty() || !missing.is_empty() {
                    return Err(format!("without the hook: {missing:?}"));
                }
                Ok(())
            },
        )
        .await
        .unwrap();
}

/// `kubectl delete machine <name>`: a plain DELETE (background propagation).
async fn kubectl_delete_machine(sandbox: &Sandbox, name: &str) {
    sandbox
        .machines_api()
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
}

/// Events about the control plane with `reason`, oldest first.
async fn events_with(sandbox: &Sandbox, reason: &str) -> Vec<Event> {
    let mut events = support::events(sandbox, reason).await;
    events.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
    events
}

/// Run the simulated infrastructure (new Machines boot and join, gone ones
/// are decommissioned) until `done` holds of the Machines and the membership;
/// at most `limit`. Returns the time taken.
async fn drive_infrastructure(
    sandbox: &mut Sandbox,
    what: &str,
    limit: Duration,
    done: impl Fn(&[Machine], &SeenMembers) -> bool,
) -> Duration {
    let started = Instant::now();
    let mut refused = 0;
    loop {
        // A server whose join etcd refuses (a voter it cannot reach: "unhealthy
        // cluster") retries, as k3s does.
        if let Err(e) = reconcile_infrastructure(sandbox, Duration::from_secs(10)).await {
            assert!(e.0.contains("unhealthy"), "{what}: {e}");
            refused += 1;
            eprintln!(
                "{what}: at {:?} a join was refused ({refused}): {e}",
                started.elapsed()
            );
        }
        let all = machines(sandbox).await;
        // A fresh handle each time, as a person runs etcdctl: this loop looks
        // only every few seconds, and a handle that last looked before two
        // removals by others rightly refuses the smaller cluster as not the
        // one it proved (docs/etcd.md, "Which cluster is ours").
        let etcd = seen_members(&sandbox.etcd.connect()).await;
        if let Some(etcd) = &etcd
            && done(&all, etcd)
        {
            return started.elapsed();
        }
        if started.elapsed() >= limit {
            let k = kcp(sandbox).await;
            for c in k.conditions() {
                eprintln!(
                    "{what}: {} {} {}: {}",
                    c.type_, c.status, c.reason, c.message
                );
            }
        }
        assert!(
            started.elapsed() < limit,
            "{what}: not done after {limit:?}: Machines {:?}, etcd {etcd:?}",
            all.iter()
                .map(|m| format!(
                    "{}{}{}",
                    m.name_any(),
                    if m.is_deleting() { " (deleting)" } else { "" },
                    if m.node_name().is_none() {
                        " (no node)"
                    } else {
                        ""
                    }
                ))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `n` Machines, none deleting, each with a Node, none of `gone`; `n` voters,
/// all healthy, no learner.
fn settled(n: usize, gone: Vec<String>) -> impl Fn(&[Machine], &SeenMembers) -> bool {
    move |all, etcd| {
        all.len() == n
            && all
                .iter()
                .all(|m| !m.is_deleting() && m.node_name().is_some())
            && !all.iter().any(|m| gone.contains(&m.name_any()))
            && etcd.members.len() == n
            && etcd
                .members
                .values()
                .all(|(_, learner, healthy)| !learner && *healthy)
    }
}

/// A person deletes the etcd leader's Machine with `kubectl delete machine`.
/// The controller moves leadership off it, removes its member through a
/// member that stays, and only then releases the hook; the Machine goes, a
/// replacement is created and its member joins and becomes a voter. All of it
/// is Normal, and while the control plane is short the status says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_deleting_the_etcd_leaders_machine_moves_leadership_and_removes_the_member_before_the_machine_goes()
 {
    init_logs();
    let mut sandbox = Sandbox::start(3).await.unwrap();
    let admin = sandbox.etcd.connect();
    let controller = sandbox.start_controller();
    wait_all_hooked(&sandbox).await;

    let leader = support::snapshot(&sandbox, &admin)
        .await
        .leader
        .expect("a leader");
    let index = sandbox.etcd.index_of(leader).unwrap();
    let target = sandbox.machines[index].clone();
    let member = sandbox.etcd.member(index).name.clone();
    let originals = sandbox.etcd.member_names();
    let original_machines = sandbox.machines.clone();

    let sampler = Sampler::start(&sandbox);
    let started = Instant::now();
    kubectl_delete_machine(&sandbox, &target).await;
    let took = drive_infrastructure(
        &mut sandbox,
        "the leader's Machine deleted by a person",
        LIMIT * 2,
        settled(3, vec![target.clone()]),
    )
    .await;
    let samples = sampler.finish().await;
    eprintln!(
        "leader's Machine deleted: replaced and its member a voter in {took:?} ({} samples)",
        samples.len()
    );

    // Its member went before the Machine did.
    assert_member_gone_before_machine(&samples, &target, &member);
    let removed = member_removed_at(&samples, &member).expect("its member was seen removed");

    // Leadership left it before its member was removed: the last sample that
    // still listed the member saw another leader, and so did every one after.
    let last_with = samples[..removed]
        .iter()
        .rposition(|s| s.etcd.as_ref().is_some_and(|e| e.has(&member)))
        .expect("a sample with the member still in etcd");
    let seen = samples[last_with].etcd.as_ref().unwrap();
    assert!(
        seen.leader.is_some() && seen.leader != Some(leader),
        "at {:?}, the last sample before {member} was removed, the leader was {:?} (the target is {leader:x})",
        samples[last_with].at,
        seen.leader
    );
    let window = samples[..removed]
        .iter()
        .filter(|s| {
            s.etcd
                .as_ref()
                .is_some_and(|e| e.has(&member) && e.leader.is_some() && e.leader != Some(leader))
        })
        .count();
    eprintln!("{window} sample(s) saw {member} still in etcd under another leader");
    let moved = events_with(&sandbox, "EtcdLeadershipMoved").await;
    let removed_events = events_with(&sandbox, "EtcdMemberRemoved").await;
    assert_eq!(moved.len(), 1, "one leadership move: {moved:#?}");
    assert_eq!(removed_events.len(), 1, "one member removed");
    assert!(
        moved[0].event_time.as_ref().map(|t| t.0)
            <= removed_events[0].event_time.as_ref().map(|t| t.0),
        "leadership moved after the member was removed"
    );
    assert_quorum_kept(&samples, "the leader's Machine deleted");

    // The replacement's member joined and is a voter (settled() checked 3
    // healthy voters, none a learner): it is a new one.
    let now = support::snapshot(&sandbox, &admin).await;
    let newcomers: Vec<&str> = now
        .members
        .iter()
        .map(|m| m.name.as_str())
        .filter(|n| !originals.iter().any(|o| o == n))
        .collect();
    assert_eq!(newcomers.len(), 1, "one new member: {now:?}");
    let replacement = machines(&sandbox)
        .await
        .into_iter()
        .find(|m| !original_machines.contains(&m.name_any()))
        .expect("a replacement Machine");
    assert!(
        replacement
            .annotations()
            .contains_key(PRE_TERMINATE_HOOK_ANNOTATION),
        "the replacement carries our hook from its creation"
    );

    // While short, the status said fewer ready replicas than desired.
    let short: Vec<&SeenKcp> = samples
        .iter()
        .filter(|s| s.before.len() < 3 || s.before.values().any(|m| m.deleting || m.node.is_none()))
        .filter_map(|s| s.kcp.as_ref())
        .collect();
    assert!(
        short.iter().any(|k| k.desired == 3 && k.ready == 2),
        "no sample while short saw readyReplicas 2 of 3 desired: {:?}",
        short
            .iter()
            .map(|k| (k.desired, k.ready))
            .collect::<Vec<_>>()
    );
    assert!(
        short.iter().all(|k| k.ready <= 3),
        "more ready than Machines"
    );
    let scaling = short
        .iter()
        .filter_map(|k| k.scaling_up.clone())
        .find(|(status, message)| status == "True" && message.contains("to 3 replicas"));
    assert!(
        scaling.is_some(),
        "ScalingUp never said True ... to 3 replicas while short: {:?}",
        short.iter().map(|k| &k.scaling_up).collect::<Vec<_>>()
    );
    let mut available: Vec<String> = short
        .iter()
        .filter_map(|k| k.available.as_ref().map(|(s, m)| format!("{s}: {m}")))
        .collect();
    available.dedup();
    eprintln!("Available while short: {available:#?}; ScalingUp: {scaling:?}");

    // A healthy path: nothing but Normal Events.
    let warned = support::warning_events(&sandbox).await;
    assert!(warned.is_empty(), "Warning Events: {warned:#?}");
    eprintln!("whole test: {:?}", started.elapsed());
    controller.stop().await;
}

/// Two Machines deleted at the same moment are removed one at a time: the
/// second Machine's member is not removed while the first still holds our
/// hook, quorum is never lost beyond a handover, and both go, each after its
/// member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_machines_deleted_at_once_are_removed_one_at_a_time() {
    init_logs();
    let mut sandbox = Sandbox::start(3).await.unwrap();
    let controller = sandbox.start_controller();
    wait_all_hooked(&sandbox).await;

    let targets = [sandbox.machines[0].clone(), sandbox.machines[1].clone()];
    let members = [
        sandbox.etcd.member(0).name.clone(),
        sandbox.etcd.member(1).name.clone(),
    ];
    let sampler = Sampler::start(&sandbox);
    tokio::join!(
        kubectl_delete_machine(&sandbox, &targets[0]),
        kubectl_delete_machine(&sandbox, &targets[1]),
    );
    let took = drive_infrastructure(
        &mut sandbox,
        "two Machines deleted at once",
        LIMIT * 3,
        settled(3, targets.to_vec()),
    )
    .await;
    let samples = sampler.finish().await;
    eprintln!(
        "two Machines deleted at once: both replaced in {took:?} ({} samples)",
        samples.len()
    );

    for (machine, member) in targets.iter().zip(&members) {
        assert_member_gone_before_machine(&samples, machine, member);
    }
    // Never two Machines whose members are gone still held by our hook: a
    // snapshot without both members followed by a listing where both still
    // carry the hook (a hook is never put back on a deleting Machine).
    for s in &samples {
        let Some(e) = &s.etcd else { continue };
        let gone = members.iter().all(|m| !e.has(m));
        let both_held = targets
            .iter()
            .all(|t| s.after.get(t).is_some_and(|m| m.hooked));
        assert!(
            !(gone && both_held),
            "at {:?} both members were removed while both Machines still held the hook",
            s.at
        );
    }
    // Which went first, and its hook was released before the other's member
    // was removed.
    let removed: Vec<usize> = members
        .iter()
        .map(|m| member_removed_at(&samples, m).expect("both members removed"))
        .collect();
    let (first, second) = if removed[0] <= removed[1] {
        (0, 1)
    } else {
        (1, 0)
    };
    let released = samples
        .iter()
        .position(|s| s.after.get(&targets[first]).is_none_or(|m| !m.hooked))
        .expect("the first Machine's hook released");
    assert!(
        released < removed[second],
        "{}'s member removed (first seen at {:?}) before {}'s hook was released (first seen at {:?})",
        targets[second],
        samples[removed[second]].at,
        targets[first],
        samples[released].at
    );
    eprintln!(
        "{} first: member gone at {:?}, hook released by {:?}; {}'s member gone at {:?}",
        targets[first],
        samples[removed[first]].at,
        samples[released].at,
        targets[second],
        samples[removed[second]].at
    );
    assert_quorum_kept(&samples, "two Machines deleted at once");
    // One deletion waiting for an older one is ordinary: no Warning.
    let warned = support::warning_events(&sandbox).await;
    assert!(warned.is_empty(), "Warning Events: {warned:#?}");
    controller.stop().await;
}

/// A deleting Machine whose member cannot be attached to it (its Node has
/// another name and address, and no k3s annotation) while that member is
/// claimed by no Machine: the hook stays, the member stays, and the control
/// plane says which member and how to map it. Once the Node is annotated as
/// k3s does, the removal goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unmapped_target_is_held_and_says_which_member_and_how_to_map_it() {
    init_logs();
    let sandbox = Sandbox::start(3).await.unwrap();
    let admin = sandbox.etcd.connect();
    let controller = sandbox.start_controller();
    wait_all_hooked(&sandbox).await;

    let leader = support::snapshot(&sandbox, &admin)
        .await
        .leader
        .expect("a leader");
    let index = (0..3)
        .find(|i| sandbox.etcd.member(*i).id != leader)
        .unwrap();
    let target = sandbox.machines[index].clone();
    let member = sandbox.etcd.member(index).name.clone();

    // The Machine's Node as the controller will see it: another name, another
    // address, the etcd label but not (yet) k3s's member annotations.
    let node = format!("{target}-renamed");
    let ip = spare_ip(&sandbox, 0);
    sandbox.add_node(&node, &ip, Some(&member)).await.unwrap();
    let nodes: Api<Node> = Api::all(sandbox.workload.client());
    nodes
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                K3S_ETCD_NODE_NAME_ANNOTATION: null,
                K3S_ETCD_NODE_ADDRESS_ANNOTATION: null,
            }}})),
        )
        .await
        .unwrap();
    sandbox.provision(&target, &node, &ip).await.unwrap();

    kubectl_delete_machine(&sandbox, &target).await;
    // CAPI drained and waits on the hook; the control plane says why it holds.
    let needles = [
        member.as_str(),
        K3S_ETCD_NODE_NAME_ANNOTATION,
        node.as_str(),
        target.as_str(),
    ];
    let said = sandbox
        .wait_for(
            "a condition naming the unclaimed member and the annotation",
            LIMIT,
            || async {
                let kcp = kcp(&sandbox).await;
                kcp.conditions()
                    .iter()
                    .find(|c| needles.iter().all(|n| c.message.contains(n)))
                    .map(|c| format!("{} {} {}: {}", c.type_, c.status, c.reason, c.message))
                    .ok_or_else(|| {
                        format!(
                            "{:?}",
                            kcp.conditions()
                                .iter()
                                .map(|c| format!("{}: {}", c.type_, c.message))
                                .collect::<Vec<_>>()
                        )
                    })
            },
        )
        .await
        .unwrap();
    eprintln!("condition: {said}");
    let blocked = sandbox
        .wait_for(
            "a RemovalBlocked Event naming the member",
            LIMIT,
            || async {
                support::event_notes(&sandbox, "RemovalBlocked")
                    .await
                    .into_iter()
                    .find(|n| needles.iter().all(|x| n.contains(x)))
                    .ok_or_else(|| "none yet".to_string())
            },
        )
        .await
        .unwrap();
    eprintln!("Event: {blocked}");

    // Held over several reconciles: the hook stays, the member stays.
    wait_reconciles(&sandbox, &controller.ctx, 5).await;
    let held = sandbox.machines_api().get(&target).await.unwrap();
    assert!(held.is_deleting());
    assert!(
        held.annotations()
            .contains_key(PRE_TERMINATE_HOOK_ANNOTATION),
        "the hook was released on a guess"
    );
    assert!(
        held.condition("Deleting")
            .is_some_and(|c| c.reason == "WaitingForPreTerminateHook"),
        "CAPI is waiting on the hook"
    );
    let snap = support::snapshot(&sandbox, &admin).await;
    assert!(
        snap.member_by_name(&member).is_some(),
        "the member was removed on a guess"
    );
    assert_eq!(snap.members.len(), 3);

    // k3s writes its annotation on the Node: the member is the Machine's, and
    // the removal goes on.
    nodes
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                K3S_ETCD_NODE_NAME_ANNOTATION: member,
            }}})),
        )
        .await
        .unwrap();
    let since = Instant::now();
    sandbox
        .wait_for(&format!("{target} gone"), LIMIT, || async {
            match sandbox
                .machines_api()
                .get_opt(&target)
                .await
                .map_err(|e| e.to_string())?
            {
                None => Ok(()),
                Some(m) => Err(format!("still there: {:?}", m.annotations())),
            }
        })
        .await
        .unwrap();
    let snap = support::snapshot(&sandbox, &admin).await;
    assert!(
        snap.member_by_name(&member).is_none(),
        "{target} went while its member {member} stayed"
    );
    eprintln!(
        "annotated: member removed and Machine gone in {:?}",
        since.elapsed()
    );
    controller.stop().await;
}

/// Five servers, two of whose etcd members are dead and whose Machines a
/// MachineHealthCheck marked (Cluster API issue #10125: KCP stuck there). The
/// controller replaces them one at a time, never below quorum, and ends with
/// five healthy voters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_servers_with_two_dead_are_recovered_one_at_a_time() {
    init_logs();
    // A join etcd refuses is retried within 15 s (k3s retries forever).
    let mut sandbox = Sandbox::start_with(
        EtcdTestCluster::builder()
            .members(5)
            .ready_timeout(Duration::from_secs(15)),
        5,
    )
    .await
    .unwrap();
    let admin = sandbox.etcd.connect();
    let leader = support::snapshot(&sandbox, &admin)
        .await
        .leader
        .expect("a leader");
    let dead: Vec<usize> = (0..5)
        .rev()
        .filter(|i| sandbox.etcd.member(*i).id != leader)
        .take(2)
        .collect();
    let targets: Vec<String> = dead.iter().map(|i| sandbox.machines[*i].clone()).collect();
    let members: Vec<String> = dead
        .iter()
        .map(|i| sandbox.etcd.member(*i).name.clone())
        .collect();
    for i in &dead {
        sandbox.etcd.stop(*i).await.unwrap();
    }
    for t in &targets {
        sandbox.mark_unhealthy(t).await.unwrap();
    }

    let sampler = Sampler::start(&sandbox);
    let controller = sandbox.start_controller();
    let took = drive_infrastructure(
        &mut sandbox,
        "five servers, two dead",
        LIMIT * 3,
        settled(5, targets.clone()),
    )
    .await;
    let samples = sampler.finish().await;
    eprintln!(
        "five servers, two dead: recovered to 5 healthy voters in {took:?} ({} samples)",
        samples.len()
    );

    for (machine, member) in targets.iter().zip(&members) {
        assert_member_gone_before_machine(&samples, machine, member);
    }
    for s in &samples {
        let deleting: Vec<&String> = s
            .before
            .iter()
            .filter(|(_, m)| m.deleting)
            .map(|(n, _)| n)
            .collect();
        assert!(
            deleting.len() <= 1,
            "at {:?} two Machines deleting at once: {deleting:?}",
            s.at
        );
    }
    // One at a time: the second dead Machine was not deleted before the
    // first one's replacement was created.
    let first_deleting = |t: &String| {
        samples
            .iter()
            .position(|s| s.before.get(t).is_some_and(|m| m.deleting))
    };
    let (a, b) = (
        first_deleting(&targets[0]).expect("deleted"),
        first_deleting(&targets[1]).expect("deleted"),
    );
    let (first, later) = if a <= b { (0, b) } else { (1, a) };
    let replaced_before = samples[later]
        .before
        .keys()
        .any(|n| !samples[0].before.contains_key(n));
    assert!(
        replaced_before,
        "the second dead Machine was deleted before {}'s replacement existed",
        targets[first]
    );
    assert_quorum_kept(&samples, "five servers, two dead");
    let remediations = support::event_count(&sandbox, "RemediationStarted").await;
    assert_eq!(remediations, 2, "two remediations");
    controller.stop().await;
}
