//! Scale (issue 12): the real `k3s-control-plane run` binary, in its own
//! process with its production defaults (idle requeue 60 s, concurrency 10),
//! against a management test API server holding N Clusters,
//! KThreesControlPlanes (3 replicas, initialized) and 3 provisioned Machines
//! each, with MANAGED etcd:
//!
//! - a few real 3-member TLS etcd clusters on loopback (`ETCD_CLUSTERS`),
//!   each shared by N/3 control planes: every control plane's
//!   `<cluster>-etcd` Secret holds the CA of the etcd cluster it uses, and its
//!   3 Nodes carry that cluster's k3s member annotations
//!   (`etcd.k3s.cattle.io/node-name`, `-node-address`) and member addresses as
//!   InternalIP, so every control plane holds its own pooled TLS etcd clients;
//! - one workload test API server per cluster (`<cluster>-kubeconfig`): the
//!   controller lists every control-plane Node of a workload API, so clusters
//!   sharing one would see each other's Nodes (members without Machines).
//!
//! Per N: VmRSS/VmHWM, CPU over a 60 s idle window (after every control plane
//! has a status and the first idle requeue round passed), the etcd
//! connections the process holds and the new ones during the window, the API
//! requests in the window (management and workload servers, by verb and
//! resource, from the test API server's request counter) per reconcile, and
//! the time until every control plane has a status. An empty management
//! server gives the idle-process baseline.
//!
//! Then remediation: K control planes, each on its OWN 3-member etcd (started
//! by helper processes of this binary, 3 clusters each: the harness runs at
//! most 3 per process), CAPI's Machine deletion simulated; the etcd leader's
//! Machine of S of them is marked alone, one after another (single), then
//! that of K others at the same moment; mark -> Machine gone, p50/p99.
//!
//! Run: `cargo bench --bench scale -- [N...] [--remediations K] [--singles S]
//! [--window SECONDS] [--perf SECONDS] [--unmanaged N] [--no-fleet]
//! [--no-remediation] [--remediation-concurrency C] [--controller-arg ARG]...
//! [--etcd-heartbeat-ms MS] [--workload-http] [--sharded N]... [--shards S]
//! [--shards-alone]` (needs etcd on PATH; `--sharded N`: N control planes
//! labelled round-robin for S watch-filter shards (default 3), one `run
//! --watch-filter` process each, measured per process over the same window,
//! then with `--shards-alone` once more each with the other shards stopped; `--perf`: profile the
//! largest N's idle process after its window with `perf record`;
//! `--controller-arg`: passed to every controller's `run` (the fleet's, the
//! shards' and the remediation's), e.g. `--controller-arg=--max-chained-steps=0`
//! or `--controller-arg=--etcd-space-care`;
//! `--etcd-heartbeat-ms`: the remediation world's etcd heartbeat, default 100,
//! election timeout 15 times it: 165 members at 100 ms keep most of 2 cores
//! busy while idle, which a real management cluster, whose workload etcd runs
//! elsewhere, does not pay); `--workload-http`: workload API servers on
//! plain HTTP with no CA in their kubeconfigs, as this bench had them before;
//! by default they speak mutual TLS as k3s does, with the cluster's server CA
//! in the kubeconfig and an admin client certificate).
//!
//! Instructions (`--instructions [--callgrind-dir DIR]`): every controller
//! process runs under `valgrind --tool=callgrind --instr-atstart=no`
//! (bring-up at valgrind's base slowdown); each window turns callgrind's
//! instrumentation on and zeroes its counters at its start
//! (`callgrind_control`), dumps them at its end and reads the dump's Ir
//! total: instructions per idle reconcile and per control plane per second,
//! beyond the empty process's rate, per process and against the single
//! process. Each edge waits (up to 30 s) for a moment with no reconcile in
//! flight, and the reconciles counted are those that ended in the window
//! (the table shows those in flight at each edge). Unlike /proc CPU time,
//! the count hardly moves with what else the machine runs (the same
//! process's Ir per reconcile moved 0.2-0.3 % between two runs), but it is
//! not blind to it: a process starved by a heavy neighbour had its etcd
//! connections time out and made them again in the window, up to +20 % per
//! reconcile at N = 50 (the table marks a window with new connections,
//! writes or WARN/ERROR lines NOT idle). Under callgrind a busy process
//! falls behind its requeues (the table shows the reconciles one per control
//! plane per 60 s would give), so compare Ir per reconcile; Ir per control
//! plane per second is what the process got through, not what it needs. The
//! memory and CPU figures are valgrind's. No quiet wait (`wait_quiet`) in
//! this mode.
//!
//! Heap profile: `K3SCP_BENCH_WRAP="heaptrack -o /tmp/scale"` starts every
//! controller process under that command (split on whitespace); the /proc
//! figures and the stop signal then go to the controller process itself. Its
//! memory figures include the profiler's own overhead: use them only for the
//! profile, not as the bench's RSS.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k3s_control_plane::api::condition_names::ETCD_CLUSTER_HEALTHY;
use k3s_control_plane::api::names::{
    CLUSTER_NAME_LABEL, CONTROL_PLANE_LABEL, CONTROL_PLANE_NAME_LABEL,
    K3S_ETCD_NODE_ADDRESS_ANNOTATION, K3S_ETCD_NODE_NAME_ANNOTATION, KCP_FINALIZER,
    NODE_ROLE_CONTROL_PLANE_LABEL, NODE_ROLE_ETCD_LABEL, SPEC_HASH_ANNOTATION, WATCH_FILTER_LABEL,
};
use k3s_control_plane::api::{Cluster, KThreesConfig, KThreesControlPlane, Machine};
use k3s_control_plane::apiserver::TestApiServer;
use k3s_control_plane::decision::machine_sync::born_metadata;
use k3s_control_plane::harness::EtcdTestCluster;
use k3s_control_plane::harness::capi_sim::MachineDeletionSim;
use k3s_control_plane::harness::sandbox::{
    NAMESPACE, VERSION, cluster_object, docker_machine_template, kcp_object, management_server,
    mark_infrastructure_provisioned, mark_initialized, mark_machine_unhealthy,
};
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tokio::time::Instant;

use common::{
    ControllerProcess, clock_ticks_per_second, count_instructions, counting_instructions,
    established, established_to_port, mib,
};

/// Shared etcd clusters behind the fleet (the harness runs at most 3 per process).
const ETCD_CLUSTERS: usize = 3;
/// The remediation world's etcd heartbeat unless `--etcd-heartbeat-ms` says otherwise:
/// the harness's own (its election timeout is 15 times it).
const ETCD_HEARTBEAT_MS: u32 = 100;
const ETCD_CLIENT_PORT: u16 = 2379;
/// The binary's default idle requeue; the window starts this long (plus a
/// margin) after every control plane has a status.
const IDLE_REQUEUE: Duration = Duration::from_secs(60);
const ROUND_MARGIN: Duration = Duration::from_secs(8);
const READY_LIMIT: Duration = Duration::from_secs(300);

// ---------------------------------------------------------------- the world

/// What one control plane's etcd is: CA and members (node index j runs member j).
#[derive(Clone, serde::Serialize, serde::Deserialize)]
struct EtcdInfo {
    ca_pem: String,
    ca_key_pem: String,
    /// (member name, ip), in member order.
    members: Vec<(String, String)>,
    /// Index of the leader when reported.
    leader: usize,
}

async fn etcd_info(etcd: &EtcdTestCluster) -> EtcdInfo {
    let snapshot = etcd.connect().snapshot().await.expect("etcd snapshot");
    let leader = snapshot
        .leader
        .and_then(|id| etcd.index_of(id))
        .expect("a leader");
    EtcdInfo {
        ca_pem: etcd.ca_pem().to_string(),
        ca_key_pem: etcd.ca_key_pem().to_string(),
        members: etcd
            .members()
            .iter()
            .map(|m| (m.name.clone(), m.ip.to_string()))
            .collect(),
        leader,
    }
}

/// The Secrets a brought-up control plane has besides kubeconfig and etcd
/// (`-ca`, `-cca`, `-token`): one set of contents reused by every cluster.
struct CommonSecrets {
    ca: (String, String),
    cca: (String, String),
    token: String,
    /// Serving certificate (from `ca`, for 127.0.0.1) and admin client
    /// certificate (from `cca`) of every workload API server, which speaks
    /// mutual TLS as k3s does; `None`: plain HTTP (`--workload-http`).
    workload_tls: Option<((String, String), (String, String))>,
}

impl CommonSecrets {
    fn new() -> Self {
        let ca = k3s_control_plane::pki::generate_ca(
            "k3s-server-ca",
            k3s_control_plane::pki::CA_LIFETIME,
        )
        .expect("CA");
        let cca = k3s_control_plane::pki::generate_ca(
            "k3s-client-ca",
            k3s_control_plane::pki::CA_LIFETIME,
        )
        .expect("client CA");
        let workload_tls = (!workload_http()).then(|| {
            use k3s_control_plane::harness::pki::TestCa;
            use rcgen::{ExtendedKeyUsagePurpose, SanType};
            let server = TestCa::from_pem(&ca.cert_pem, &ca.key_pem).expect("server CA");
            let client = TestCa::from_pem(&cca.cert_pem, &cca.key_pem).expect("client CA");
            let serving = server.issue(
                "k3s",
                &[SanType::IpAddress(std::net::IpAddr::V4(
                    std::net::Ipv4Addr::LOCALHOST,
                ))],
                &[ExtendedKeyUsagePurpose::ServerAuth],
            );
            let admin = client.issue("system:admin", &[], &[ExtendedKeyUsagePurpose::ClientAuth]);
            (
                (serving.cert_pem, serving.key_pem),
                (admin.cert_pem, admin.key_pem),
            )
        });
        CommonSecrets {
            ca: (ca.cert_pem, ca.key_pem),
            cca: (cca.cert_pem, cca.key_pem),
            token: k3s_control_plane::pki::generate_token(),
            workload_tls,
        }
    }
}

/// `--workload-http`: workload API servers on plain HTTP, as before they
/// spoke TLS (a kubeconfig without a CA; not what Cluster API writes).
fn workload_http() -> bool {
    std::env::args().any(|a| a == "--workload-http")
}

fn cluster_name(i: usize) -> String {
    format!("c{i:04}")
}

fn machine_name(cluster: &str, j: usize) -> String {
    format!("{cluster}-cp-{j}")
}

/// One managed control plane as `Sandbox::populate` builds it: the cluster
/// Secrets, an infrastructure-provisioned Cluster, the machine template, an
/// initialized KThreesControlPlane with our finalizer, 3 Machines made from its
/// current spec (spec-hash annotation) and provisioned (nodeRef, InternalIP),
/// and in its workload API 3 ready control-plane Nodes annotated with the
/// members of `etcd`. Not `managed`: a declared external datastore
/// (`spec.externalDatastore`), Nodes without k3s's etcd marks and no
/// `<cluster>-etcd` Secret, so the controller has no etcd to connect to
/// (`EtcdNotManaged`).
async fn add_cluster(
    management: &kube::Client,
    common: &CommonSecrets,
    i: usize,
    etcd: &EtcdInfo,
    managed: bool,
    shard: Option<&str>,
) -> TestApiServer {
    let cluster = cluster_name(i);
    let kcp_name = format!("{cluster}-control-plane");
    let mut workload = TestApiServer::builder().with_core_resources();
    if let Some((serving, admin)) = &common.workload_tls {
        workload = workload.tls(k3s_control_plane::apiserver::ServerTls {
            ca_pem: common.ca.0.clone(),
            cert_pem: serving.0.clone(),
            key_pem: serving.1.clone(),
            client_ca_pem: Some(common.cca.0.clone()),
            client_identity: Some(admin.clone()),
        });
    }
    let workload = workload.start().await.expect("workload API server");

    let nodes: Api<Node> = Api::all(workload.client());
    for (j, (member, ip)) in etcd.members.iter().enumerate() {
        let node = machine_name(&cluster, j);
        let object: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {
                "name": node,
                "labels": if managed {
                    json!({NODE_ROLE_CONTROL_PLANE_LABEL: "true", NODE_ROLE_ETCD_LABEL: "true"})
                } else {
                    // External-datastore servers: no etcd marks (k3s adds them
                    // only with embedded etcd, and they would make etcd managed).
                    json!({NODE_ROLE_CONTROL_PLANE_LABEL: "true"})
                },
                "annotations": if managed {
                    json!({K3S_ETCD_NODE_NAME_ANNOTATION: member, K3S_ETCD_NODE_ADDRESS_ANNOTATION: ip})
                } else {
                    json!({})
                },
            },
        }))
        .expect("Node");
        nodes
            .create(&PostParams::default(), &object)
            .await
            .expect("create Node");
        let status = json!({"status": {
            "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": node}],
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]
        }});
        nodes
            .patch_status(&node, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .expect("Node status");
    }

    let secrets: Api<Secret> = Api::namespaced(management.clone(), NAMESPACE);
    let kubeconfig =
        k3s_control_plane::yaml::to_string(&workload.kubeconfig()).expect("kubeconfig");
    let pair = |(cert, key): &(String, String)| json!({"tls.crt": cert, "tls.key": key});
    for (suffix, data) in [
        ("kubeconfig", json!({"value": kubeconfig})),
        (
            "etcd",
            pair(&(etcd.ca_pem.clone(), etcd.ca_key_pem.clone())),
        ),
        ("ca", pair(&common.ca)),
        ("cca", pair(&common.cca)),
        ("token", json!({"value": common.token})),
    ] {
        if suffix == "etcd" && !managed {
            continue;
        }
        let secret: Secret = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": format!("{cluster}-{suffix}"), "labels": {CLUSTER_NAME_LABEL: cluster}},
            "type": "cluster.x-k8s.io/secret",
            "stringData": data
        }))
        .expect("Secret");
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .expect("create Secret");
    }

    let clusters: Api<Cluster> = Api::namespaced(management.clone(), NAMESPACE);
    let mut cluster_obj = cluster_object(&cluster, &kcp_name);
    if let Some(shard) = shard {
        // As clusterctl / ClusterClass would: the Cluster and its control
        // plane carry the shard's watch-filter label.
        cluster_obj
            .labels_mut()
            .insert(WATCH_FILTER_LABEL.to_string(), shard.to_string());
    }
    let created_cluster = clusters
        .create(&PostParams::default(), &cluster_obj)
        .await
        .expect("create Cluster");
    mark_infrastructure_provisioned(&clusters, &cluster)
        .await
        .expect("Cluster provisioned");

    let templates: Api<DynamicObject> =
        Api::namespaced_with(management.clone(), NAMESPACE, &docker_machine_template());
    let mut template =
        DynamicObject::new(&format!("{kcp_name}-template"), &docker_machine_template())
            .within(NAMESPACE);
    template.data = json!({"spec": {"template": {"spec": {"extraMounts": []}}}});
    templates
        .create(&PostParams::default(), &template)
        .await
        .expect("create DockerMachineTemplate");

    let kcps: Api<KThreesControlPlane> = Api::namespaced(management.clone(), NAMESPACE);
    let mut object = kcp_object(&kcp_name, &created_cluster, 3);
    object.metadata.finalizers = Some(vec![KCP_FINALIZER.to_string()]);
    if let Some(shard) = shard {
        object
            .labels_mut()
            .insert(WATCH_FILTER_LABEL.to_string(), shard.to_string());
    }
    if !managed {
        // An external datastore: no etcd of ours to connect to.
        object.spec.external_datastore = Some(true);
    }
    let kcp = kcps
        .create(&PostParams::default(), &object)
        .await
        .expect("create KThreesControlPlane");
    mark_initialized(&kcps, &kcp_name)
        .await
        .expect("initialize KThreesControlPlane");

    let owner = kcp.controller_owner_ref(&()).expect("KCP uid");
    let hash = k3s_control_plane::rollout::spec_hash(&kcp);
    let machines: Api<Machine> = Api::namespaced(management.clone(), NAMESPACE);
    // Born as the controller makes its Machines: with the control plane's
    // metadata (in a shard, its watch-filter label) and the sync record.
    let born = born_metadata(
        &kcp,
        BTreeMap::from([
            (CLUSTER_NAME_LABEL.to_string(), cluster.clone()),
            (CONTROL_PLANE_LABEL.to_string(), String::new()),
            (CONTROL_PLANE_NAME_LABEL.to_string(), kcp_name.clone()),
        ]),
    );
    let mut annotations = born.annotations.clone();
    annotations.insert(SPEC_HASH_ANNOTATION.to_string(), hash.clone());
    annotations.extend(born.record.clone());
    for (j, (_, ip)) in etcd.members.iter().enumerate() {
        let name = machine_name(&cluster, j);
        let object: Machine = serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {
                "name": name, "namespace": NAMESPACE,
                "labels": born.labels,
                "annotations": annotations,
                "ownerReferences": [owner],
            },
            "spec": {
                "clusterName": cluster,
                "bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "KThreesConfig", "name": name}},
                "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": name},
                "version": VERSION
            }
        }))
        .expect("Machine");
        machines
            .create(&PostParams::default(), &object)
            .await
            .expect("create Machine");
        // Its bootstrap config, as the bootstrap provider's would be: where
        // the controller writes the certificate expiry for CAPI to copy.
        let config: KThreesConfig = serde_json::from_value(json!({
            "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2", "kind": "KThreesConfig",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": born.labels},
            "spec": {}
        }))
        .expect("KThreesConfig");
        Api::<KThreesConfig>::namespaced(management.clone(), NAMESPACE)
            .create(&PostParams::default(), &config)
            .await
            .expect("create KThreesConfig");
        let status = json!({"status": {
            "nodeRef": {"name": name},
            "addresses": [{"type": "InternalIP", "address": ip}],
            "phase": "Running"
        }});
        machines
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .expect("provision Machine");
    }
    workload
}

/// Has a status from a reconcile that read its 3 Machines, their Nodes and
/// etcd (healthy; not managed: `EtcdNotManaged`).
fn reconciled(kcp: &KThreesControlPlane, managed: bool) -> bool {
    kcp.status.as_ref().is_some_and(|s| {
        s.ready_replicas == 3
            && k3s_control_plane::api::conditions::get(&s.conditions, ETCD_CLUSTER_HEALTHY)
                .is_some_and(|c| {
                    if managed {
                        c.status == "True"
                    } else {
                        c.reason == "EtcdNotManaged"
                    }
                })
    })
}

/// Resolves when `expected` KThreesControlPlanes are [`reconciled`]; the watch
/// is running when this returns.
async fn all_reconciled(
    client: kube::Client,
    expected: usize,
    managed: bool,
) -> tokio::task::JoinHandle<Instant> {
    let kcps: Api<KThreesControlPlane> = Api::namespaced(client, NAMESPACE);
    let (watch_ready, watching) = tokio::sync::oneshot::channel();
    let done = tokio::spawn(async move {
        let mut events = watcher::watcher(kcps, watcher::Config::default()).boxed();
        let mut ready = Some(watch_ready);
        let mut seen = HashSet::new();
        while let Some(event) = events.try_next().await.expect("KCP watch") {
            match event {
                Event::InitDone => {
                    if let Some(ready) = ready.take() {
                        let _ = ready.send(());
                    }
                }
                Event::Apply(kcp) | Event::InitApply(kcp) if reconciled(&kcp, managed) => {
                    seen.insert(kcp.name_any());
                }
                _ => {}
            }
            if seen.len() == expected && ready.is_none() {
                return Instant::now();
            }
        }
        panic!("the KThreesControlPlane watch ended");
    });
    watching.await.expect("KCP watch started");
    done
}

/// Wait (polling, up to `limit`) until no other cargo, rustc or test binary
/// runs, so CPU figures are not polluted. Returns whether it is quiet.
async fn wait_quiet(limit: Duration) -> bool {
    // Instructions do not depend on what else runs: no wait, but still say.
    let limit = if counting_instructions() {
        Duration::ZERO
    } else {
        limit
    };
    let deadline = Instant::now() + limit;
    let me = std::process::id().to_string();
    loop {
        let out = std::process::Command::new("pgrep")
            .args(["-fa", "cargo|rustc|deps/"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
            .unwrap_or_default();
        let others: Vec<&str> = out
            .lines()
            .filter(|l| {
                let mut fields = l.split_whitespace();
                let (pid, exe) = (fields.next().unwrap_or(""), fields.next().unwrap_or(""));
                let build_or_test = exe == "cargo"
                    || exe.ends_with("/cargo")
                    || exe.ends_with("rustc")
                    || exe.contains("/deps/");
                build_or_test
                    && pid != me
                    && !exe.contains("deps/scale-")
                    && !l.contains("--bench scale")
            })
            .collect();
        if others.is_empty() {
            return true;
        }
        if Instant::now() >= deadline {
            eprintln!(
                "note: other builds/tests still running, measuring anyway:\n  {}",
                others
                    .iter()
                    .map(|l| l.chars().take(120).collect::<String>())
                    .collect::<Vec<_>>()
                    .join("\n  ")
            );
            return false;
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

// ---------------------------------------------------------------- idle window

type Counts = BTreeMap<(String, String), u64>;

fn sum_counts<'a>(all: impl IntoIterator<Item = &'a TestApiServer>) -> Counts {
    let mut out = Counts::new();
    for server in all {
        for (k, v) in server.request_counts() {
            *out.entry(k).or_default() += v;
        }
    }
    out
}

fn diff(after: &Counts, before: &Counts) -> Counts {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect()
}

/// Reads (get, list), watches and writes; the Lease requests of leader
/// election apart (a fixed cost, not per control plane).
#[derive(Default, Clone, Copy)]
struct Split {
    reads: u64,
    watches: u64,
    writes: u64,
    leases: u64,
}

fn split(counts: &Counts) -> Split {
    let mut s = Split::default();
    for ((verb, resource), n) in counts {
        if resource == "leases" {
            s.leases += n;
            continue;
        }
        match verb.as_str() {
            "get" | "list" => s.reads += n,
            "watch" => s.watches += n,
            _ => s.writes += n,
        }
    }
    s
}

struct Window {
    seconds: f64,
    cpu_ticks: u64,
    reconciles: u64,
    management: Counts,
    workload: Counts,
    etcd_at_start: usize,
    etcd_at_end: usize,
    /// Connections to etcd seen during the window (1 s samples) that were not
    /// there at its start.
    etcd_new: usize,
    /// The other connections (workload and management API servers) at the
    /// window's start, and those seen during it that were not there then.
    other_at_start: usize,
    other_new: usize,
    /// etcd operations by name (k3scp_etcd_operation_duration_seconds_count).
    etcd_operations: BTreeMap<String, f64>,
    memory_end: (u64, u64),
    /// `--instructions`: the instructions (callgrind's Ir) the process
    /// executed over the window.
    instructions: Option<u64>,
    /// WARN and ERROR lines the process logged during the window.
    log_problems: usize,
    /// Reconciles that ended in the window, and those in flight at its
    /// start and at its end (begun, `k3scp_reconciles_total`, minus ended,
    /// `k3scp_reconcile_duration_seconds_count`).
    finished: u64,
    in_flight: (u64, u64),
}

/// Reconciles begun (counted at a reconcile's start) and ended (its
/// duration observed at its end).
fn begun_ended(metrics: &BTreeMap<String, f64>) -> (u64, u64) {
    let get = |name: &str| metrics.get(name).copied().unwrap_or(0.0) as u64;
    (
        get("k3scp_reconciles_total"),
        get("k3scp_reconcile_duration_seconds_count"),
    )
}

/// `--instructions`: waits (up to `limit`) for a moment with no reconcile
/// in flight, so that an instruction window cuts none in two: idle
/// reconciles come in bursts (every control plane got its status within
/// seconds, so they requeue together) and a window edge inside a burst
/// would count the instructions of reconciles it does not count. Looks at
/// /metrics (which the process executes) only after 0.5 s without a CPU
/// tick of the process (which costs it nothing). A process busy all along
/// (behind its requeues) has no such moment: then the deadline passes and
/// the edge cuts, at most, the reconciles in flight (shown).
async fn wait_between_reconciles(process: &ControllerProcess, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let ticks = process.cpu_ticks();
        tokio::time::sleep(Duration::from_millis(500)).await;
        if process.cpu_ticks() == ticks {
            let (begun, ended) = begun_ended(&process.metrics().await);
            if begun == ended {
                return;
            }
        }
        if Instant::now() >= deadline {
            return;
        }
    }
}

/// How long a window edge may wait for a moment between reconciles.
const EDGE_LIMIT: Duration = Duration::from_secs(30);

fn etcd_operation_counts(metrics: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    metrics
        .iter()
        .filter_map(|(k, v)| {
            let rest = k.strip_prefix("k3scp_etcd_operation_duration_seconds_count{")?;
            Some((rest.trim_end_matches('}').to_string(), *v))
        })
        .collect()
}

async fn idle_window(
    process: &ControllerProcess,
    management: &TestApiServer,
    workloads: &[TestApiServer],
    length: Duration,
) -> Window {
    let refs: Vec<&TestApiServer> = workloads.iter().collect();
    idle_window_refs(process, management, &refs, length).await
}

async fn idle_window_refs(
    process: &ControllerProcess,
    management: &TestApiServer,
    workloads: &[&TestApiServer],
    length: Duration,
) -> Window {
    let problems0 = process.log_lines_matching(&["ERROR", "WARN"]).len();
    if counting_instructions() {
        wait_between_reconciles(process, EDGE_LIMIT).await;
        process.instructions_start().await;
    }
    let conns0 = established_to_port(process.pid, ETCD_CLIENT_PORT);
    let metrics0 = process.metrics().await;
    let (m0, w0) = (
        management.request_counts(),
        sum_counts(workloads.iter().copied()),
    );
    let ticks0 = process.cpu_ticks();
    let started = Instant::now();
    // Every connection, not only etcd's: one to a workload or the
    // management API server that was not there before is a new handshake too.
    let mut seen: HashSet<(String, String)> = established(process.pid);
    let others_at_start = seen.len() - conns0.len();
    let etcd_port = format!(":{ETCD_CLIENT_PORT:04X}");
    let (mut new, mut other_new) = (0, 0);
    while started.elapsed() < length {
        tokio::time::sleep(Duration::from_secs(1).min(length - started.elapsed().min(length)))
            .await;
        for c in established(process.pid) {
            let to_etcd = c.1.ends_with(&etcd_port);
            if seen.insert(c) {
                if to_etcd {
                    new += 1;
                } else {
                    other_new += 1;
                }
            }
        }
    }
    if counting_instructions() {
        wait_between_reconciles(process, EDGE_LIMIT).await;
    }
    let ticks1 = process.cpu_ticks();
    let seconds = started.elapsed().as_secs_f64();
    let (m1, w1) = (
        management.request_counts(),
        sum_counts(workloads.iter().copied()),
    );
    let metrics1 = process.metrics().await;
    let conns1 = established_to_port(process.pid, ETCD_CLIENT_PORT);
    // Both /metrics reads are inside the counted span, as they are in every window.
    let instructions = if counting_instructions() {
        Some(process.instructions_end().await)
    } else {
        None
    };
    let reconciles =
        |m: &BTreeMap<String, f64>| m.get("k3scp_reconciles_total").copied().unwrap_or(0.0) as u64;
    let ops0 = etcd_operation_counts(&metrics0);
    let etcd_operations = etcd_operation_counts(&metrics1)
        .into_iter()
        .map(|(k, v)| {
            let before = ops0.get(&k).copied().unwrap_or(0.0);
            (k, v - before)
        })
        .filter(|(_, v)| *v > 0.0)
        .collect();
    Window {
        seconds,
        cpu_ticks: ticks1 - ticks0,
        reconciles: reconciles(&metrics1) - reconciles(&metrics0),
        management: diff(&m1, &m0),
        workload: diff(&w1, &w0),
        etcd_at_start: conns0.len(),
        etcd_at_end: conns1.len(),
        etcd_new: new,
        other_at_start: others_at_start,
        other_new,
        etcd_operations,
        memory_end: process.memory(),
        instructions,
        finished: begun_ended(&metrics1).1 - begun_ended(&metrics0).1,
        in_flight: (
            begun_ended(&metrics0).0 - begun_ended(&metrics0).1,
            begun_ended(&metrics1).0 - begun_ended(&metrics1).1,
        ),
        log_problems: process
            .log_lines_matching(&["ERROR", "WARN"])
            .len()
            .saturating_sub(problems0),
    }
}

struct FleetRun {
    n: usize,
    /// etcd managed (a `<cluster>-etcd` Secret each).
    managed: bool,
    populate: Duration,
    all_status_after: Duration,
    /// CPU ticks the process used from its start until every control plane had a status.
    cpu_to_status: u64,
    reconciles_to_status: u64,
    memory_at_status: (u64, u64),
    window: Window,
    quiet: bool,
    /// JSON bytes of the watched objects at the end.
    cached_json: usize,
}

fn mcpu(window: &Window, ticks_per_second: u64) -> f64 {
    window.cpu_ticks as f64 / ticks_per_second as f64 / window.seconds * 1000.0
}

async fn idle_empty(length: Duration) -> FleetRun {
    let server = management_server().await.expect("management server");
    let spawned = Instant::now();
    let process = ControllerProcess::spawn(&server, READY_LIMIT).await;
    let ready = spawned.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let memory_at_status = process.memory();
    let quiet = wait_quiet(Duration::from_secs(180)).await;
    let window = idle_window(&process, &server, &[], length).await;
    process.stop().await;
    FleetRun {
        n: 0,
        managed: false,
        populate: Duration::ZERO,
        all_status_after: ready,
        cpu_to_status: 0,
        reconciles_to_status: 0,
        memory_at_status,
        window,
        quiet,
        cached_json: 0,
    }
}

/// `perf record --call-graph dwarf` of the idle process for `seconds` (after
/// the window, so it does not count in it). Printed and saved to
/// `target/scale-perf-<n>.txt`: self time by symbol, and the inclusive
/// (children) share of the controller's own functions.
fn perf_profile(pid: u32, n: usize, seconds: u64) {
    let data = format!("/tmp/scale-perf-{n}.data");
    let recorded = std::process::Command::new("perf")
        .args([
            "record",
            "-F",
            "499",
            "--call-graph",
            "dwarf,16384",
            "-o",
            &data,
        ])
        .args(["-p", &pid.to_string(), "--", "sleep", &seconds.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
    if !recorded.is_ok_and(|s| s.success()) {
        eprintln!("N={n}: perf record failed (is perf installed and permitted?)");
        return;
    }
    let report = |args: &[&str]| {
        std::process::Command::new("perf")
            .args(["report", "-i", &data, "--stdio", "-g", "none"])
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            // perf pads lines and ends them with empty columns ("-  -").
            .map(|l| l.trim_end().trim_end_matches(['-', ' ']).to_string())
            .collect::<Vec<_>>()
    };
    let own = report(&[
        "--no-children",
        "--sort",
        "dso,symbol",
        "--percent-limit",
        "0.5",
    ]);
    let inclusive: Vec<String> =
        report(&["--children", "--sort", "symbol", "--percent-limit", "1"])
            .into_iter()
            .filter(|l| l.contains("k3s_control_plane::") || l.contains("kube_runtime::"))
            .collect();
    let text = format!(
        "self time (dso, symbol):\n{}\n\ninclusive, the controller's functions:\n{}\n",
        own.join("\n"),
        inclusive.join("\n")
    );
    let path = format!("{}/target/scale-perf-{n}.txt", env!("CARGO_MANIFEST_DIR"));
    let _ = std::fs::write(&path, &text);
    println!("N={n}: perf profile of the idle process over {seconds} s ({path}):");
    for line in own.iter().take(25) {
        println!("  {line}");
    }
    println!("  inclusive (children), the controller's functions:");
    for line in inclusive.iter().take(40) {
        println!("  {}", line.chars().take(220).collect::<String>());
    }
}

/// Clusters `0..n` with their control planes and workload API servers, 16 at
/// a time, each on etcd cluster `i % etcd.len()` and labelled for the shard
/// `shard(i)` names (if any); the workload servers in cluster order.
async fn populate_fleet(
    client: &kube::Client,
    n: usize,
    etcd: &[EtcdInfo],
    common: &CommonSecrets,
    managed: bool,
    shard: impl Fn(usize) -> Option<String>,
) -> Vec<TestApiServer> {
    let mut workloads: Vec<(usize, TestApiServer)> = futures::stream::iter(0..n)
        .map(|i| {
            let client = client.clone();
            let shard = shard(i);
            async move {
                let etcd = &etcd[i % etcd.len()];
                let workload =
                    add_cluster(&client, common, i, etcd, managed, shard.as_deref()).await;
                (i, workload)
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    workloads.sort_by_key(|(i, _)| *i);
    workloads.into_iter().map(|(_, w)| w).collect()
}

async fn fleet(
    n: usize,
    etcd: &[EtcdInfo],
    common: &CommonSecrets,
    length: Duration,
    profile: Option<u64>,
    managed: bool,
    controller_args: &[String],
) -> FleetRun {
    let management = management_server().await.expect("management server");
    let client = management.client();
    let started = Instant::now();
    let workloads = populate_fleet(&client, n, etcd, common, managed, |_| None).await;
    let populate = started.elapsed();
    eprintln!("N={n}: populated in {:.1} s", populate.as_secs_f64());

    let done = all_reconciled(client.clone(), n, managed).await;
    let spawned = Instant::now();
    let args: Vec<&str> = controller_args.iter().map(String::as_str).collect();
    let process = ControllerProcess::spawn_with(&management.kubeconfig(), &args, READY_LIMIT).await;
    let limit = bring_up_limit(n);
    let all_done = match tokio::time::timeout(limit, done).await {
        Ok(done) => done.expect("KCP watch task"),
        Err(_) => panic!(
            "N={n}: not every KThreesControlPlane has a status within {limit:?}:\n{}",
            process.log_tail()
        ),
    };
    let all_status_after = all_done - spawned;
    let cpu_to_status = process.cpu_ticks();
    let memory_at_status = process.memory();
    let reconciles_to_status = process.reconciles().await;
    eprintln!(
        "N={n}: all have a status {:.2} s after spawn ({reconciles_to_status} reconciles); \
         waiting for the first idle requeue round",
        all_status_after.as_secs_f64()
    );
    tokio::time::sleep_until(all_done + IDLE_REQUEUE + ROUND_MARGIN).await;
    let copied = capi_copies_certificate_expiry(&client).await;
    eprintln!(
        "N={n}: CAPI's Machine controller copied {copied} certificate expiries to Machine status"
    );
    let quiet = wait_quiet(Duration::from_secs(180)).await;
    eprintln!("N={n}: idle window of {} s", length.as_secs());
    let window = idle_window(&process, &management, &workloads, length).await;
    if let Some(seconds) = profile {
        perf_profile(process.pid, n, seconds);
    }
    let errors = process.log_lines_matching(&["ERROR", "WARN"]);
    if !errors.is_empty() {
        eprintln!(
            "N={n}: {} WARN/ERROR log lines:\n{}",
            errors.len(),
            errors.join("\n")
        );
    }
    process.stop().await;
    let cached_json = watched_json_bytes(&client).await;
    drop(workloads);
    FleetRun {
        n,
        managed,
        populate,
        all_status_after,
        cpu_to_status,
        reconciles_to_status,
        memory_at_status,
        window,
        quiet,
        cached_json,
    }
}

/// How long N control planes may take to all have a status: under valgrind
/// (`--instructions`, instrumentation off) the bring-up runs several times slower.
fn bring_up_limit(n: usize) -> Duration {
    let native = Duration::from_secs(120 + n as u64);
    if counting_instructions() {
        native * 5
    } else {
        native
    }
}

/// The watch-filter value of shard `s`, as `components --shards` names them.
fn shard_value(s: usize) -> String {
    format!("k3s-shard-{s}")
}

/// The TCP port of a test API server's URL.
fn port_of(server: &TestApiServer) -> u16 {
    server
        .url()
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .expect("a port in the server's URL")
}

/// `--sharded N`: N control planes labelled round-robin for `shards`
/// watch-filter shards, one `run` process per shard.
struct ShardedRun {
    n: usize,
    shards: usize,
    populate: Duration,
    all_status_after: Duration,
    /// Per shard: control planes labelled for it.
    planes: Vec<usize>,
    memory_at_status: Vec<(u64, u64)>,
    reconciles_to_status: Vec<u64>,
    /// Per shard, the idle window (its `workload` counts: its own clusters'
    /// workload API servers only; `management`: the shared server, all shards).
    windows: Vec<Window>,
    /// The shared management server's requests over the windows, all shards.
    management: Counts,
    /// Control planes whose workload API server held connections from more
    /// than one shard process at the end of the window (each shard connects
    /// only to the workload clusters it reconciles), and from none.
    by_two_or_more: usize,
    by_none: usize,
    /// Per shard: clusters it held a workload connection to that were not its own.
    foreign: Vec<usize>,
    /// Per shard, /metrics at the end: k3scp_shard_refusals_total and
    /// k3scp_released_control_planes_total.
    refusals: Vec<f64>,
    released: Vec<f64>,
    quiet: bool,
    /// `--shards-alone`: per shard, a window with the other shards stopped.
    alone_windows: Vec<Window>,
}

async fn sharded_fleet(
    n: usize,
    shards: usize,
    etcd: &[EtcdInfo],
    common: &CommonSecrets,
    length: Duration,
    controller_args: &[String],
    alone: bool,
) -> ShardedRun {
    let management = management_server().await.expect("management server");
    let client = management.client();
    let started = Instant::now();
    let workloads = populate_fleet(&client, n, etcd, common, true, |i| {
        Some(shard_value(i % shards))
    })
    .await;
    let populate = started.elapsed();
    eprintln!(
        "sharded N={n}: populated in {:.1} s",
        populate.as_secs_f64()
    );
    let planes: Vec<usize> = (0..shards)
        .map(|s| (0..n).filter(|i| i % shards == s).count())
        .collect();

    let done = all_reconciled(client.clone(), n, true).await;
    let spawned = Instant::now();
    let mut processes = Vec::new();
    for s in 0..shards {
        let filter = format!("--watch-filter={}", shard_value(s));
        let lease = format!("--leader-election-lease-name=k3s-control-plane-shard-{s}");
        let args: Vec<&str> = [filter.as_str(), lease.as_str()]
            .into_iter()
            .chain(controller_args.iter().map(String::as_str))
            .collect();
        processes.push(
            ControllerProcess::spawn_with(&management.kubeconfig(), &args, READY_LIMIT).await,
        );
    }
    let limit = bring_up_limit(n);
    let all_done = match tokio::time::timeout(limit, done).await {
        Ok(done) => done.expect("KCP watch task"),
        Err(_) => panic!(
            "sharded N={n}: not every KThreesControlPlane has a status within {limit:?}:\n{}",
            processes
                .iter()
                .map(ControllerProcess::log_tail)
                .collect::<Vec<_>>()
                .join("\n---\n")
        ),
    };
    let all_status_after = all_done - spawned;
    let memory_at_status: Vec<(u64, u64)> = processes.iter().map(|p| p.memory()).collect();
    let mut reconciles_to_status = Vec::new();
    for p in &processes {
        reconciles_to_status.push(p.reconciles().await);
    }
    eprintln!(
        "sharded N={n}: all have a status {:.2} s after the first spawn ({reconciles_to_status:?} reconciles); \
         waiting for the first idle requeue round",
        all_status_after.as_secs_f64()
    );
    tokio::time::sleep_until(all_done + IDLE_REQUEUE + ROUND_MARGIN).await;
    let copied = capi_copies_certificate_expiry(&client).await;
    eprintln!("sharded N={n}: CAPI's Machine controller copied {copied} certificate expiries");
    let quiet = wait_quiet(Duration::from_secs(180)).await;
    eprintln!(
        "sharded N={n}: idle window of {} s, {shards} processes at once",
        length.as_secs()
    );
    // Each window reads its own shard's workload servers.
    let mut by_shard: Vec<Vec<usize>> = (0..shards).map(|_| Vec::new()).collect();
    for i in 0..n {
        by_shard[i % shards].push(i);
    }
    let m0 = management.request_counts();
    let windows: Vec<Window> =
        futures::future::join_all(processes.iter().enumerate().map(|(s, process)| {
            let servers: Vec<&TestApiServer> = by_shard[s].iter().map(|&i| &workloads[i]).collect();
            idle_window_of(process, &management, servers, length)
        }))
        .await;
    let m1 = management.request_counts();
    // Who holds connections to which workload API server.
    // /proc writes 127.0.0.1 as 0100007F (little-endian hex).
    let port_to_cluster: HashMap<String, usize> = workloads
        .iter()
        .enumerate()
        .map(|(i, w)| {
            assert!(w.url().contains("127.0.0.1"), "{}", w.url());
            (format!("0100007F:{:04X}", port_of(w)), i)
        })
        .collect();
    let mut holders: Vec<HashSet<usize>> = vec![HashSet::new(); n];
    let mut foreign = vec![0; shards];
    for (s, process) in processes.iter().enumerate() {
        let mut seen = HashSet::new();
        for (_, remote) in established(process.pid) {
            if let Some(&i) = port_to_cluster.get(&remote)
                && seen.insert(i)
            {
                holders[i].insert(s);
                if i % shards != s {
                    foreign[s] += 1;
                }
            }
        }
    }
    let by_two_or_more = holders.iter().filter(|h| h.len() > 1).count();
    let by_none = holders.iter().filter(|h| h.is_empty()).count();
    let mut refusals = Vec::new();
    let mut released = Vec::new();
    for process in &processes {
        let metrics = process.metrics().await;
        refusals.push(
            metrics
                .get("k3scp_shard_refusals_total")
                .copied()
                .unwrap_or(f64::NAN),
        );
        released.push(
            metrics
                .get("k3scp_released_control_planes_total")
                .copied()
                .unwrap_or(f64::NAN),
        );
        let errors = process.log_lines_matching(&["ERROR", "WARN"]);
        if !errors.is_empty() {
            eprintln!(
                "sharded N={n}: {} WARN/ERROR log lines:\n{}",
                errors.len(),
                errors.join("\n")
            );
        }
    }
    // Each shard on its own: the others stopped (SIGSTOP), so what one
    // process costs is not what three processes and the world cost on 2 cores.
    let mut alone_windows = Vec::new();
    if alone {
        use nix::sys::signal::{Signal, kill};
        use nix::unistd::Pid;
        for (s, process) in processes.iter().enumerate() {
            let others: Vec<Pid> = processes
                .iter()
                .enumerate()
                .filter(|(o, _)| *o != s)
                .map(|(_, p)| Pid::from_raw(p.pid as i32))
                .collect();
            for pid in &others {
                kill(*pid, Signal::SIGSTOP).expect("SIGSTOP a shard");
            }
            tokio::time::sleep(Duration::from_secs(3)).await;
            eprintln!(
                "sharded N={n}: shard {s} alone (the others stopped), idle window of {} s",
                length.as_secs()
            );
            let servers: Vec<&TestApiServer> = by_shard[s].iter().map(|&i| &workloads[i]).collect();
            alone_windows.push(idle_window_of(process, &management, servers, length).await);
            for pid in &others {
                kill(*pid, Signal::SIGCONT).expect("SIGCONT a shard");
            }
        }
    }
    for process in processes {
        process.stop().await;
    }
    drop(workloads);
    ShardedRun {
        alone_windows,
        n,
        shards,
        populate,
        all_status_after,
        planes,
        memory_at_status,
        reconciles_to_status,
        windows,
        management: diff(&m1, &m0),
        by_two_or_more,
        by_none,
        foreign,
        refusals,
        released,
        quiet,
    }
}

/// [`idle_window`] over the workload servers given by reference.
async fn idle_window_of(
    process: &ControllerProcess,
    management: &TestApiServer,
    workloads: Vec<&TestApiServer>,
    length: Duration,
) -> Window {
    idle_window_refs(process, management, &workloads, length).await
}

fn print_sharded(r: &ShardedRun, idle: Option<&FleetRun>, single: Option<&FleetRun>, ticks: u64) {
    println!();
    println!(
        "sharded: {} control planes across {} `run` processes (one per watch-filter shard, labels round-robin), \
         managed etcd on {ETCD_CLUSTERS} shared 3-member TLS etcd clusters; populate {:.1} s; every control plane \
         had a status {:.2} s after the first spawn{}",
        r.n,
        r.shards,
        r.populate.as_secs_f64(),
        r.all_status_after.as_secs_f64(),
        if r.quiet {
            ""
        } else {
            " (window NOT quiet: other builds ran)"
        }
    );
    println!(
        "| process | CPs | VmRSS at status | VmRSS / VmHWM end of window | MiB per CP beyond idle | idle mCPU | \
         mCPU per CP beyond idle | CPU ms per reconcile beyond idle | reconciles in window (to status) | workload reads per reconcile | etcd conns | \
         new etcd conns | foreign clusters held |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let idle_rss = idle.map(|e| mib(e.window.memory_end.0));
    let idle_cpu = idle.map(|e| mcpu(&e.window, ticks));
    let row = |name: String,
               planes: usize,
               at_status: f64,
               w: &Window,
               to_status: String,
               foreign: String| {
        let cpu = mcpu(w, ticks);
        let per_mib = idle_rss.map_or("-".into(), |e| {
            format!("{:.3}", (mib(w.memory_end.0) - e) / planes.max(1) as f64)
        });
        let per_mcpu = idle_cpu.map_or("-".into(), |e| {
            format!("{:.3}", (cpu - e) / planes.max(1) as f64)
        });
        // mCPU x s = ms: what a reconcile cost beyond the idle process,
        // whatever share of a round the window caught.
        let per_reconcile_ms = match idle_cpu {
            Some(e) if w.reconciles > 0 => {
                format!("{:.2}", (cpu - e) * w.seconds / w.reconciles as f64)
            }
            _ => "-".into(),
        };
        let wl = split(&w.workload);
        let per_reconcile = if w.reconciles == 0 {
            "-".to_string()
        } else {
            format!(
                "{:.2}",
                (wl.reads + wl.watches + wl.writes) as f64 / w.reconciles as f64
            )
        };
        println!(
            "| {name} | {planes} | {at_status:.1} MiB | {:.1} / {:.1} MiB | {per_mib} | {cpu:.1} | {per_mcpu} | {per_reconcile_ms} | {} ({to_status}) | {per_reconcile} | {} -> {} | {} | {foreign} |",
            mib(w.memory_end.0),
            mib(w.memory_end.1),
            w.reconciles,
            w.etcd_at_start,
            w.etcd_at_end,
            w.etcd_new,
        );
    };
    if let Some(single) = single {
        row(
            format!("single process (N={}, baseline)", single.n),
            single.n,
            mib(single.memory_at_status.0),
            &single.window,
            single.reconciles_to_status.to_string(),
            "-".into(),
        );
    }
    for (s, w) in r.windows.iter().enumerate() {
        row(
            format!("shard {s} (`{}`)", shard_value(s)),
            r.planes[s],
            mib(r.memory_at_status[s].0),
            w,
            r.reconciles_to_status[s].to_string(),
            r.foreign[s].to_string(),
        );
    }
    for (s, w) in r.alone_windows.iter().enumerate() {
        row(
            format!("shard {s} alone (the others stopped)"),
            r.planes[s],
            mib(r.memory_at_status[s].0),
            w,
            r.reconciles_to_status[s].to_string(),
            "-".into(),
        );
    }
    let reconciles: u64 = r.windows.iter().map(|w| w.reconciles).sum();
    let m = split(&r.management);
    let per = |x: u64| {
        if reconciles == 0 {
            "-".to_string()
        } else {
            format!("{:.2}", x as f64 / reconciles as f64)
        }
    };
    println!(
        "sharded N={}: management server, all shards over the window: {} reconciles; reads / watches / writes per idle reconcile {} / {} / {}; lease requests {}; [{}]",
        r.n,
        reconciles,
        per(m.reads),
        per(m.watches),
        per(m.writes),
        m.leases,
        top(&r.management, 12)
    );
    println!(
        "sharded N={}: control planes reconciled by two or more shards (workload API connections held by more than one process): {}; by none: {}; shard refusals {:?}, released {:?}",
        r.n, r.by_two_or_more, r.by_none, r.refusals, r.released
    );
    for (s, w) in r.windows.iter().enumerate() {
        println!(
            "sharded N={} shard {s}: window {:.1} s; other TCP connections {} at the start, {} new; workload: [{}]; etcd operations: {:?}",
            r.n,
            w.seconds,
            w.other_at_start,
            w.other_new,
            top(&w.workload, 6),
            w.etcd_operations
        );
    }
    let mut rows: Vec<(String, usize, &Window)> = Vec::new();
    if let Some(single) = single {
        rows.push((
            format!("single process (N={}, baseline)", single.n),
            single.n,
            &single.window,
        ));
    }
    let baseline = if single.is_some() { 0 } else { usize::MAX };
    for (s, w) in r.windows.iter().enumerate() {
        rows.push((format!("shard {s}, the shards together"), r.planes[s], w));
    }
    for (s, w) in r.alone_windows.iter().enumerate() {
        rows.push((
            format!("shard {s} alone (the others stopped)"),
            r.planes[s],
            w,
        ));
    }
    print_instructions(&rows, idle.map(|e| &e.window), baseline);
}

/// What CAPI's Machine controller does for a control-plane Machine
/// (cluster-api `internal/controllers/machine/machine_controller.go`,
/// `reconcileCertificateExpiry`): the bootstrap config's
/// `machine.cluster.x-k8s.io/certificates-expiry` annotation, copied into
/// `Machine.status.certificatesExpiryDate`. Returns how many were copied.
async fn capi_copies_certificate_expiry(client: &kube::Client) -> usize {
    let configs: Api<KThreesConfig> = Api::namespaced(client.clone(), NAMESPACE);
    let machines: Api<Machine> = Api::namespaced(client.clone(), NAMESPACE);
    let mut copied = 0;
    for config in configs
        .list(&Default::default())
        .await
        .expect("list KThreesConfigs")
    {
        let Some(value) = config
            .annotations()
            .get(k3s_control_plane::api::names::CERTIFICATES_EXPIRY_ANNOTATION)
        else {
            continue;
        };
        let status = json!({"status": {"certificatesExpiryDate": value}});
        if machines
            .patch_status(
                &config.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&status),
            )
            .await
            .is_ok()
        {
            copied += 1;
        }
    }
    copied
}

/// JSON size of what the controller's watches hold (every KThreesControlPlane,
/// Cluster and Machine, as the server returns them): a floor for the caches'
/// share of the RSS.
async fn watched_json_bytes(client: &kube::Client) -> usize {
    async fn size<K>(api: Api<K>) -> usize
    where
        K: Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
    {
        api.list(&Default::default())
            .await
            .map(|l| {
                l.items
                    .iter()
                    .map(|o| serde_json::to_vec(o).map_or(0, |v| v.len()))
                    .sum()
            })
            .unwrap_or(0)
    }
    size(Api::<KThreesControlPlane>::namespaced(
        client.clone(),
        NAMESPACE,
    ))
    .await
        + size(Api::<Cluster>::namespaced(client.clone(), NAMESPACE)).await
        + size(Api::<Machine>::namespaced(client.clone(), NAMESPACE)).await
}

// ---------------------------------------------------------------- remediation

/// Helper-process mode: start `count` (≤ 3) etcd clusters, print each one's
/// [`EtcdInfo`] as a JSON line, then `ready`, and keep them until stdin closes.
fn etcd_helper(count: usize, heartbeat_ms: u32) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async {
        let clusters: Vec<EtcdTestCluster> = futures::future::join_all((0..count).map(|_| {
            EtcdTestCluster::builder()
                .members(3)
                .raft_timing(heartbeat_ms, heartbeat_ms * 15)
                .start()
        }))
        .await
        .into_iter()
        .map(|c| c.expect("etcd cluster"))
        .collect();
        let mut out = std::io::stdout().lock();
        for c in &clusters {
            let info = etcd_info(c).await;
            writeln!(out, "{}", serde_json::to_string(&info).expect("json")).expect("stdout");
        }
        writeln!(out, "ready").expect("stdout");
        out.flush().expect("stdout");
        drop(out);
        // Until the parent closes stdin (or dies).
        let _ = tokio::task::spawn_blocking(|| {
            let mut line = String::new();
            while std::io::stdin().lock().read_line(&mut line).unwrap_or(0) > 0 {}
        })
        .await;
        drop(clusters);
    });
}

/// Dedicated etcd clusters from helper processes; killed when dropped.
struct EtcdHelpers {
    children: Vec<std::process::Child>,
    infos: Vec<EtcdInfo>,
}

fn start_helpers(clusters: usize, heartbeat_ms: u32) -> EtcdHelpers {
    let exe = std::env::current_exe().expect("own path");
    let mut infos = Vec::new();
    let mut children = Vec::new();
    let helpers = clusters.div_ceil(3);
    // A few at a time: 2 cores, etcd's elections must not time out.
    for batch in (0..helpers).collect::<Vec<_>>().chunks(3) {
        let mut started = Vec::new();
        for &h in batch {
            let count = (clusters - h * 3).min(3);
            let child = std::process::Command::new(&exe)
                .args(["--etcd-helper", &count.to_string()])
                .args(["--etcd-heartbeat-ms", &heartbeat_ms.to_string()])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("spawn etcd helper");
            started.push(child);
        }
        for mut child in started {
            let stdout = child.stdout.take().expect("helper stdout");
            for line in std::io::BufReader::new(stdout).lines() {
                let line = line.expect("helper output");
                if line == "ready" {
                    break;
                }
                infos.push(serde_json::from_str(&line).expect("helper EtcdInfo"));
            }
            children.push(child);
        }
        eprintln!("remediation: {} etcd clusters up", infos.len());
    }
    assert_eq!(infos.len(), clusters, "every helper reported its clusters");
    EtcdHelpers { children, infos }
}

impl Drop for EtcdHelpers {
    fn drop(&mut self) {
        for child in &mut self.children {
            drop(child.stdin.take());
        }
        for child in &mut self.children {
            let _ = child.wait();
        }
    }
}

/// What the controller did between two /metrics samples: errors by stage,
/// remediation outcomes, etcd operations (count, total seconds), reconciles
/// (count, total seconds).
fn metric_diff(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
) -> Vec<(String, f64)> {
    after
        .iter()
        .filter(|(k, _)| {
            k.starts_with("k3scp_reconcile_errors_total")
                || k.starts_with("k3scp_remediations_total")
                || k.starts_with("k3scp_reconciles_total")
                || k.starts_with("k3scp_etcd_operation_duration_seconds_count")
                || k.starts_with("k3scp_etcd_operation_duration_seconds_sum")
                || k.starts_with("k3scp_reconcile_duration_seconds_count")
                || k.starts_with("k3scp_reconcile_duration_seconds_sum")
                || k.starts_with("k3scp_chained_steps_total")
                || k.starts_with("k3scp_reused_workload_observations_total")
        })
        .filter_map(|(k, v)| {
            let d = v - before.get(k).copied().unwrap_or(0.0);
            (d != 0.0).then(|| (k.clone(), d))
        })
        .collect()
}

struct RemediationFigures {
    singles: Vec<Duration>,
    batch: Vec<Duration>,
    k: usize,
    all_status_after: Duration,
    /// Metrics and log messages of the batch.
    diagnostics: Vec<String>,
    concurrency: Option<u16>,
    /// `run` arguments beyond `--concurrency`.
    controller_args: Vec<String>,
    /// CPU of this bench's world (this process and every process under it:
    /// the controller, the etcd helpers and their etcd members) per single
    /// remediation, split: (world, controller, this bench process) seconds.
    single_cpu: Vec<(f64, f64, f64)>,
    /// The same over the whole batch, and the batch's wall time.
    batch_cpu: (f64, f64, f64),
    /// The world's CPU while idle, in cores, split the same way.
    idle_cores: (f64, f64, f64),
    /// The etcd members' `--heartbeat-interval` (election timeout 15x).
    heartbeat_ms: u32,
    batch_wall: Duration,
    cores: usize,
}

/// CPU ticks of `root` and every live process under it: utime + stime, plus
/// cutime + cstime (children that ended and were waited for, such as an
/// etcd member that exits once removed). Other work on the machine (another
/// build) is not counted.
fn tree_ticks(root: u32) -> u64 {
    let mut parent_and_ticks = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue; // gone meanwhile
        };
        let Some(close) = stat.rfind(')') else {
            continue;
        };
        // From field 3 (state): ppid is field 4, utime..cstime fields 14-17.
        let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
        let number = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let ticks = number(11) + number(12) + number(13) + number(14);
        parent_and_ticks.push((pid, number(1) as u32, ticks));
    }
    let mut inside = HashSet::from([root]);
    // Parents may be listed after their children: repeat until no change.
    loop {
        let before = inside.len();
        for (pid, ppid, _) in &parent_and_ticks {
            if inside.contains(ppid) {
                inside.insert(*pid);
            }
        }
        if inside.len() == before {
            break;
        }
    }
    parent_and_ticks
        .iter()
        .filter(|(pid, _, _)| inside.contains(pid))
        .map(|(_, _, ticks)| ticks)
        .sum()
}

/// (world, controller, this process) CPU ticks now.
fn cpu_split(process: &ControllerProcess) -> (u64, u64, u64) {
    (
        tree_ticks(std::process::id()),
        process.cpu_ticks(),
        common::cpu_ticks(std::process::id()),
    )
}

fn cpu_seconds(from: (u64, u64, u64), to: (u64, u64, u64), ticks: u64) -> (f64, f64, f64) {
    let s = |a: u64, b: u64| (b - a) as f64 / ticks as f64;
    (s(from.0, to.0), s(from.1, to.1), s(from.2, to.2))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    // Nearest rank.
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

async fn remediation(
    k: usize,
    singles: usize,
    concurrency: Option<u16>,
    controller_args: &[String],
    heartbeat_ms: u32,
) -> RemediationFigures {
    let total = k + singles;
    let helpers = start_helpers(total, heartbeat_ms);
    let common = CommonSecrets::new();
    let management = management_server().await.expect("management server");
    let client = management.client();
    let _capi = MachineDeletionSim::start(client.clone());
    let workloads: Vec<TestApiServer> = futures::stream::iter(0..total)
        .map(|i| {
            let (client, info, common) = (client.clone(), &helpers.infos[i], &common);
            async move { add_cluster(&client, common, i, info, true, None).await }
        })
        .buffer_unordered(8)
        .collect()
        .await;

    let machines: Api<Machine> = Api::namespaced(client.clone(), NAMESPACE);
    let gone: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let (watch_ready, watching) = tokio::sync::oneshot::channel();
    let record = gone.clone();
    let watch = tokio::spawn(async move {
        let mut events = watcher::watcher(machines, watcher::Config::default()).boxed();
        let mut ready = Some(watch_ready);
        while let Some(event) = events.next().await {
            let now = Instant::now();
            match event {
                Ok(Event::InitDone) => {
                    if let Some(ready) = ready.take() {
                        let _ = ready.send(());
                    }
                }
                Ok(Event::Delete(m)) => {
                    record
                        .lock()
                        .expect("lock")
                        .entry(m.name_any())
                        .or_insert(now);
                }
                _ => {}
            }
        }
    });
    watching.await.expect("Machine watch started");

    let done = all_reconciled(client.clone(), total, true).await;
    let spawned = Instant::now();
    let flag = concurrency.map(|c| format!("--concurrency={c}"));
    let args: Vec<&str> = flag
        .iter()
        .chain(controller_args)
        .map(String::as_str)
        .collect();
    let process = ControllerProcess::spawn_with(&management.kubeconfig(), &args, READY_LIMIT).await;
    let all_done = tokio::time::timeout(Duration::from_secs(180), done)
        .await
        .unwrap_or_else(|_| panic!("remediation world not reconciled:\n{}", process.log_tail()))
        .expect("KCP watch task");
    let all_status_after = all_done - spawned;
    // Past etcd's 5 s reconfiguration guard and the status write's second reconcile.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let machines: Api<Machine> = Api::namespaced(client.clone(), NAMESPACE);
    let target = |i: usize| machine_name(&cluster_name(i), helpers.infos[i].leader);
    let wait_gone = |names: Vec<String>, marked: Instant| {
        let gone = gone.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(300);
            loop {
                {
                    let gone = gone.lock().expect("lock");
                    if names.iter().all(|n| gone.contains_key(n)) {
                        return names.iter().map(|n| gone[n] - marked).collect::<Vec<_>>();
                    }
                }
                assert!(
                    Instant::now() < deadline,
                    "remediations not done within 300 s"
                );
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    };

    let quiet = wait_quiet(Duration::from_secs(180)).await;
    let _ = quiet;
    let ticks = clock_ticks_per_second();
    // What the world burns doing nothing (etcd heartbeats, the controller
    // and API servers idle), before any mark: the share of the cores a
    // remediation cannot have.
    let idle_from = (cpu_split(&process), Instant::now());
    tokio::time::sleep(Duration::from_secs(10)).await;
    let idle = {
        let (world, controller, bench) = cpu_seconds(idle_from.0, cpu_split(&process), ticks);
        let wall = idle_from.1.elapsed().as_secs_f64();
        (world / wall, controller / wall, bench / wall)
    };
    let mut single_times = Vec::new();
    let mut single_metrics: BTreeMap<String, f64> = BTreeMap::new();
    let mut single_cpu = Vec::new();
    for i in 0..singles {
        let name = target(i);
        let before = process.metrics().await;
        let cpu0 = cpu_split(&process);
        let marked = Instant::now();
        mark_machine_unhealthy(&machines, &name)
            .await
            .expect("mark");
        single_times.extend(wait_gone(vec![name], marked).await);
        single_cpu.push(cpu_seconds(cpu0, cpu_split(&process), ticks));
        for (k, v) in metric_diff(&before, &process.metrics().await) {
            *single_metrics.entry(k).or_default() += v;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let mut diagnostics: Vec<String> = single_metrics
        .iter()
        .map(|(k, v)| format!("singles, summed from mark to gone: {k} +{v:.3}"))
        .collect();
    let names: Vec<String> = (singles..total).map(target).collect();
    let metrics0 = process.metrics().await;
    let ticks0 = process.cpu_ticks();
    let log0 = process.log_lines().len();
    let cpu0 = cpu_split(&process);
    let marked = Instant::now();
    futures::future::join_all(names.iter().map(|n| mark_machine_unhealthy(&machines, n)))
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .expect("mark");
    let batch = wait_gone(names, marked).await;
    let busy = marked.elapsed();
    let batch_cpu = cpu_seconds(cpu0, cpu_split(&process), ticks);
    let cpu = (process.cpu_ticks() - ticks0) as f64 / clock_ticks_per_second() as f64;
    let metrics1 = process.metrics().await;
    diagnostics.extend(
        metric_diff(&metrics0, &metrics1)
            .into_iter()
            .map(|(k, d)| format!("batch: {k} +{d:.3}")),
    );
    diagnostics.push(format!(
        "controller CPU {cpu:.2} s over the {:.2} s until the last Machine was gone",
        busy.as_secs_f64()
    ));
    // WARN/ERROR lines logged meanwhile, by message.
    let mut messages: BTreeMap<String, usize> = BTreeMap::new();
    for line in &process.log_lines()[log0..] {
        if line.contains("WARN") || line.contains("ERROR") {
            let message = line
                .split_once("WARN")
                .or_else(|| line.split_once("ERROR"))
                .map(|(_, m)| m)
                .unwrap_or(line);
            // Drop names and numbers so that like messages group.
            let key: String = message
                .split_whitespace()
                .filter(|w| !w.chars().any(|c| c.is_ascii_digit()))
                .collect::<Vec<_>>()
                .join(" ")
                .chars()
                .take(200)
                .collect();
            *messages.entry(key).or_default() += 1;
        }
    }
    for (m, n) in messages {
        diagnostics.push(format!("log x{n}: {m}"));
    }
    process.stop().await;
    watch.abort();
    drop(workloads);
    drop(helpers);
    RemediationFigures {
        singles: single_times,
        batch,
        k,
        all_status_after,
        diagnostics,
        concurrency,
        controller_args: controller_args.to_vec(),
        single_cpu,
        batch_cpu,
        idle_cores: idle,
        heartbeat_ms,
        batch_wall: busy,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
    }
}

// ---------------------------------------------------------------- report

/// `--instructions`: per process, the instructions (callgrind's Ir) over its
/// window, per idle reconcile and per control plane per second, beyond the
/// empty process's rate (`idle`), and each against the `baseline` row (the
/// single process). Rows: (name, control planes, window).
fn print_instructions(rows: &[(String, usize, &Window)], idle: Option<&Window>, baseline: usize) {
    let rows: Vec<_> = rows
        .iter()
        .filter_map(|(name, planes, w)| Some((name, *planes, *w, w.instructions? as f64)))
        .collect();
    if rows.is_empty() {
        return;
    }
    let idle_rate = idle
        .and_then(|w| Some(w.instructions? as f64 / w.seconds))
        .unwrap_or(0.0);
    println!();
    println!(
        "instructions (callgrind Ir, counted only over each window: valgrind runs the \
         processes, so their memory and CPU figures above are valgrind's, not the controller's); \
         empty process: {:.3e} Ir/s{}",
        idle_rate,
        if idle.is_none() {
            " (none measured: 0 taken)"
        } else {
            ""
        }
    );
    println!(
        "| process | CPs | window s | reconciles ended (one per CP per 60 s would be; in flight at start, end) | WARN/ERROR | \
         new etcd / other connections | \
         workload requests / etcd ops per reconcile | Ir in window | Ir per reconcile | \
         Ir per reconcile beyond idle | Ir per CP per s beyond idle | \
         ratio to single: per reconcile / per CP per s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let figures = |planes: usize, w: &Window, ir: f64| {
        let beyond = ir - idle_rate * w.seconds;
        (
            beyond / w.finished.max(1) as f64,
            beyond / w.seconds / planes.max(1) as f64,
        )
    };
    let base = rows
        .get(baseline)
        .map(|(_, planes, w, ir)| figures(*planes, w, *ir));
    let mut not_idle = false;
    for (name, planes, w, ir) in &rows {
        let (per_reconcile, per_cp_s) = figures(*planes, w, *ir);
        // New connections (handshakes), writes or WARN/ERROR lines: the
        // window did more than idle reconciles, and its Ir counts it.
        let busy = w.etcd_new + w.other_new + w.log_problems > 0
            || split(&w.management).writes + split(&w.workload).writes > 0;
        not_idle |= busy;
        let name = if busy {
            format!("{name} (NOT idle)")
        } else {
            name.to_string()
        };
        let wl = split(&w.workload);
        let etcd_ops: f64 = w.etcd_operations.values().sum();
        let per = |x: f64| {
            if w.finished == 0 {
                "-".to_string()
            } else {
                format!("{:.2}", x / w.finished as f64)
            }
        };
        let ratio = base.map_or("-".to_string(), |(r, c)| {
            format!("{:.3} / {:.3}", per_reconcile / r, per_cp_s / c)
        });
        println!(
            "| {name} | {planes} | {:.1} | {} ({:.0}; {}, {}) | {} | {} / {} | {} / {} | {:.4e} | {:.4e} | {:.4e} | {:.4e} | {ratio} |",
            w.seconds,
            w.finished,
            *planes as f64 * w.seconds / IDLE_REQUEUE.as_secs_f64(),
            w.in_flight.0,
            w.in_flight.1,
            w.log_problems,
            w.etcd_new,
            w.other_new,
            per((wl.reads + wl.watches + wl.writes) as f64),
            per(etcd_ops),
            ir,
            ir / w.finished.max(1) as f64,
            per_reconcile,
            per_cp_s,
        );
    }
    if not_idle {
        println!(
            "NOT idle: a window with new connections, writes or WARN/ERROR lines (under \
             valgrind, a starved process's etcd connections time out and are made again): its \
             Ir per reconcile counts those handshakes and writes; measure again, alone"
        );
    }
}

fn top(counts: &Counts, limit: usize) -> String {
    let mut v: Vec<_> = counts.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1));
    v.iter()
        .take(limit)
        .map(|((verb, res), n)| format!("{verb} {res} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn label(r: &FleetRun) -> String {
    if r.managed || r.n == 0 {
        r.n.to_string()
    } else {
        format!("{} (etcd not managed)", r.n)
    }
}

fn print_fleet(runs: &[FleetRun], ticks: u64) {
    let empty = runs.iter().find(|r| r.n == 0);
    let rows: Vec<(String, usize, &Window)> = runs
        .iter()
        .filter(|r| r.n > 0)
        .map(|r| (format!("N={}", label(r)), r.n, &r.window))
        .collect();
    print_instructions(&rows, empty.map(|e| &e.window), usize::MAX);
    println!();
    println!(
        "controller process (`k3s-control-plane run`, {} build, defaults: idle requeue 60 s, \
         concurrency 10), managed etcd on {ETCD_CLUSTERS} shared 3-member TLS etcd clusters",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
    println!(
        "| N | VmRSS at status | VmRSS / VmHWM end of window | MiB per CP beyond idle | idle mCPU | mCPU per CP beyond idle | \
         etcd conns | new etcd conns in window | reconciles in window | mgmt reads/watches/writes per reconcile | \
         workload reads per reconcile | leases | all have status after | populate |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in runs {
        let w = &r.window;
        let cpu = mcpu(w, ticks);
        let (per_mib, per_mcpu) = match (empty, r.n) {
            (Some(e), n) if n > 0 => (
                format!(
                    "{:.3}",
                    (mib(w.memory_end.0) - mib(e.window.memory_end.0)) / n as f64
                ),
                format!("{:.3}", (cpu - mcpu(&e.window, ticks)) / n as f64),
            ),
            _ => ("-".into(), "-".into()),
        };
        let (m, wl) = (split(&w.management), split(&w.workload));
        let per = |x: u64| {
            if w.reconciles == 0 {
                "-".to_string()
            } else {
                format!("{:.2}", x as f64 / w.reconciles as f64)
            }
        };
        println!(
            "| {} | {:.1} MiB | {:.1} / {:.1} MiB | {per_mib} | {cpu:.1} | {per_mcpu} | {} -> {} | {} | {} | {} / {} / {} | {} | {} | {:.2} s{} | {:.1} s |",
            label(r),
            mib(r.memory_at_status.0),
            mib(w.memory_end.0),
            mib(w.memory_end.1),
            w.etcd_at_start,
            w.etcd_at_end,
            w.etcd_new,
            w.reconciles,
            per(m.reads),
            per(m.watches),
            per(m.writes),
            per(wl.reads + wl.watches + wl.writes),
            m.leases,
            r.all_status_after.as_secs_f64(),
            if r.n == 0 { " (ready)" } else { "" },
            r.populate.as_secs_f64(),
        );
    }
    for r in runs {
        let w = &r.window;
        println!(
            "N={}: window {:.1} s{}; other TCP connections (workload and management API servers) {} at the start, {} new in the window; {} reconciles and {:.1} s of controller CPU until all had a status; watched objects {:.1} KiB JSON per CP; management requests: [{}]; workload: [{}]; etcd operations: {:?}",
            label(r),
            w.seconds,
            if r.quiet {
                ""
            } else {
                " (NOT quiet: other builds ran)"
            },
            w.other_at_start,
            w.other_new,
            r.reconciles_to_status,
            r.cpu_to_status as f64 / ticks as f64,
            r.cached_json as f64 / 1024.0 / r.n.max(1) as f64,
            top(&w.management, 12),
            top(&w.workload, 6),
            w.etcd_operations
        );
    }
}

fn print_remediation(r: &RemediationFigures) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mut singles = r.singles.clone();
    singles.sort();
    let mut batch = r.batch.clone();
    batch.sort();
    println!();
    println!(
        "remediation (etcd leader's Machine marked; {} control planes each on its own 3-member etcd; \
         etcd heartbeat {} ms; controller concurrency {}{}; all had a status {:.2} s after spawn)",
        r.k + r.singles.len(),
        r.heartbeat_ms,
        r.concurrency
            .map_or("10 (default)".to_string(), |c| c.to_string()),
        if r.controller_args.is_empty() {
            String::new()
        } else {
            format!(", run {}", r.controller_args.join(" "))
        },
        r.all_status_after.as_secs_f64()
    );
    println!("| mark -> Machine gone | runs | p50 | p99 | min | max |");
    println!("|---|---|---|---|---|---|");
    for (what, v) in [("single, one at a time", &singles), ("all at once", &batch)] {
        if v.is_empty() {
            continue;
        }
        println!(
            "| {what} | {} | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms |",
            v.len(),
            ms(percentile(v, 0.5)),
            ms(percentile(v, 0.99)),
            ms(v[0]),
            ms(v[v.len() - 1])
        );
    }
    if !singles.is_empty() && !batch.is_empty() {
        println!(
            "p99 all at once / p99 single = {:.2} (budget <= 2)",
            ms(percentile(&batch, 0.99)) / ms(percentile(&singles, 0.99))
        );
    }
    let (idle_world, idle_controller, idle_bench) = r.idle_cores;
    println!(
        "world idle, before any mark (10 s): {:.2} cores = controller {:.3} + bench process {:.3} + etcd {:.2}",
        idle_world,
        idle_controller,
        idle_bench,
        idle_world - idle_controller - idle_bench
    );
    if !r.single_cpu.is_empty() {
        // What one remediation costs this world, and so the least wall time
        // K of them need on these cores if nothing else ran.
        let n = r.single_cpu.len() as f64;
        let mean = |f: fn(&(f64, f64, f64)) -> f64| r.single_cpu.iter().map(f).sum::<f64>() / n;
        let (machine, controller, bench) = (mean(|c| c.0), mean(|c| c.1), mean(|c| c.2));
        let mean_single = r.singles.iter().map(Duration::as_secs_f64).sum::<f64>() / n;
        // Beyond what the world burns idle over the same time.
        let marginal = machine - idle_world * mean_single;
        println!(
            "CPU a single remediation adds to the idle world: {:.0} ms ({:.0} ms in all over its mean {:.0} ms, less idle {:.2} cores)",
            marginal * 1e3,
            machine * 1e3,
            mean_single * 1e3,
            idle_world
        );
        println!(
            "CPU floor for {} at once on the cores the idle world leaves: {} x {:.0} ms / ({} - {:.2}) cores = {:.0} ms",
            r.k,
            r.k,
            marginal * 1e3,
            r.cores,
            idle_world,
            r.k as f64 * marginal * 1e3 / (r.cores as f64 - idle_world).max(0.01)
        );
        println!(
            "CPU per single remediation, mark to gone (mean of {}): world {:.0} ms = controller {:.0} ms + bench process (API servers, CAPI simulation) {:.0} ms + etcd (members and their helper processes) {:.0} ms",
            r.single_cpu.len(),
            machine * 1e3,
            controller * 1e3,
            bench * 1e3,
            (machine - controller - bench) * 1e3
        );
        println!(
            "CPU floor for {} at once: {} x {:.0} ms / {} cores = {:.0} ms",
            r.k,
            r.k,
            machine * 1e3,
            r.cores,
            r.k as f64 * machine * 1e3 / r.cores as f64
        );
    }
    let (machine, controller, bench) = r.batch_cpu;
    println!(
        "batch: world busy {:.2} CPU-s in {:.2} s wall ({:.0} % of {} cores) = controller {:.2} + bench process {:.2} + etcd {:.2}; per remediation {:.0} ms of world CPU",
        machine,
        r.batch_wall.as_secs_f64(),
        100.0 * machine / (r.batch_wall.as_secs_f64() * r.cores as f64),
        r.cores,
        controller,
        bench,
        machine - controller - bench,
        machine * 1e3 / r.k.max(1) as f64
    );
    println!("during the batch:");
    for d in &r.diagnostics {
        println!("  {d}");
    }
}

struct Options {
    fleets: Vec<usize>,
    /// Fleets run again without a `<cluster>-etcd` Secret (the etcd clients' share).
    unmanaged: Vec<usize>,
    remediations: usize,
    singles: usize,
    window: Duration,
    fleet: bool,
    remediation: bool,
    /// `run --concurrency` of the remediation controller (default: the binary's, 10).
    concurrency: Option<u16>,
    /// Further `run` arguments of every controller the bench starts.
    controller_args: Vec<String>,
    /// The remediation world's etcd heartbeat (ms).
    heartbeat_ms: u32,
    /// Seconds of `perf record` after the largest N's window.
    perf: Option<u64>,
    /// `--sharded N`: fleets of N spread over `shards` processes.
    sharded: Vec<usize>,
    /// `--shards S` (default 3).
    shards: usize,
    /// `--shards-alone`: after the shards' common window, one more window per
    /// shard with the other shard processes stopped (SIGSTOP).
    shards_alone: bool,
    /// `--instructions`: every controller under callgrind, instructions
    /// counted over each window; `--callgrind-dir DIR`: where the dumps go
    /// (default `target/scale-callgrind/<unix time>`).
    instructions: bool,
    callgrind_dir: Option<std::path::PathBuf>,
}

fn options() -> Options {
    let mut o = Options {
        fleets: Vec::new(),
        unmanaged: Vec::new(),
        remediations: 50,
        singles: 5,
        window: Duration::from_secs(60),
        fleet: true,
        remediation: true,
        perf: None,
        concurrency: None,
        controller_args: Vec::new(),
        heartbeat_ms: ETCD_HEARTBEAT_MS,
        sharded: Vec::new(),
        shards: 3,
        shards_alone: false,
        instructions: false,
        callgrind_dir: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |what: &str| -> u64 {
            args.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{what} takes a number"))
        };
        match arg.as_str() {
            "--bench" => {}
            "--remediations" => o.remediations = value("--remediations") as usize,
            "--singles" => o.singles = value("--singles") as usize,
            "--window" => o.window = Duration::from_secs(value("--window")),
            "--no-fleet" => o.fleet = false,
            "--unmanaged" => o.unmanaged.push(value("--unmanaged") as usize),
            "--sharded" => o.sharded.push(value("--sharded") as usize),
            "--shards" => o.shards = value("--shards") as usize,
            "--shards-alone" => o.shards_alone = true,
            "--instructions" => o.instructions = true,
            "--callgrind-dir" => {
                o.callgrind_dir = Some(
                    args.next()
                        .expect("--callgrind-dir takes a directory")
                        .into(),
                )
            }
            "--perf" => o.perf = Some(value("--perf")),
            "--remediation-concurrency" => {
                o.concurrency = Some(value("--remediation-concurrency") as u16)
            }
            "--no-remediation" => o.remediation = false,
            "--workload-http" => {} // read by `workload_http`
            "--etcd-heartbeat-ms" => o.heartbeat_ms = value("--etcd-heartbeat-ms") as u32,
            "--controller-arg" => o
                .controller_args
                .push(args.next().expect("--controller-arg takes an argument")),
            a if a.starts_with("--controller-arg=") => o
                .controller_args
                .push(a["--controller-arg=".len()..].to_string()),
            n => o.fleets.push(
                n.parse()
                    .unwrap_or_else(|_| panic!("unknown argument {n:?}")),
            ),
        }
    }
    if o.fleets.is_empty() && o.unmanaged.is_empty() && o.sharded.is_empty() {
        o.fleets = vec![100, 300, 1000];
    }
    o
}

fn main() {
    k3s_control_plane::install_crypto_provider();
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--list" || a == "--test") {
        return; // `cargo test --benches` / tooling probes: nothing to list.
    }
    if let Some(at) = args.iter().position(|a| a == "--etcd-helper") {
        let count = args
            .get(at + 1)
            .and_then(|c| c.parse().ok())
            .expect("--etcd-helper COUNT");
        let heartbeat_ms = args
            .iter()
            .position(|a| a == "--etcd-heartbeat-ms")
            .and_then(|at| args.get(at + 1))
            .and_then(|ms| ms.parse().ok())
            .unwrap_or(ETCD_HEARTBEAT_MS);
        etcd_helper(count, heartbeat_ms);
        return;
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "error,kube_client::client::builder=off".into()),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let o = options();
    if o.instructions {
        let dir = o.callgrind_dir.clone().unwrap_or_else(|| {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            format!(
                "{}/target/scale-callgrind/{now}",
                env!("CARGO_MANIFEST_DIR")
            )
            .into()
        });
        count_instructions(&dir);
        eprintln!(
            "every controller under callgrind (instrumentation on only in the windows), dumps in {}",
            dir.display()
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async {
        let started = Instant::now();
        let ticks = clock_ticks_per_second();
        if o.fleet {
            // The empty process hardly moves: a long --window is for the fleets.
            let mut runs = vec![idle_empty(o.window.min(Duration::from_secs(60))).await];
            print_fleet(&runs, ticks);
            let etcd: Vec<EtcdTestCluster> =
                futures::future::join_all((0..ETCD_CLUSTERS).map(|_| EtcdTestCluster::start(3)))
                    .await
                    .into_iter()
                    .map(|c| c.expect("etcd cluster"))
                    .collect();
            let mut infos = Vec::new();
            for c in &etcd {
                infos.push(etcd_info(c).await);
            }
            let common = CommonSecrets::new();
            for &n in &o.fleets {
                let profile = (Some(&n) == o.fleets.iter().max())
                    .then_some(o.perf)
                    .flatten();
                runs.push(
                    fleet(
                        n,
                        &infos,
                        &common,
                        o.window,
                        profile,
                        true,
                        &o.controller_args,
                    )
                    .await,
                );
                print_fleet(&runs, ticks);
            }
            for &n in &o.unmanaged {
                runs.push(
                    fleet(
                        n,
                        &infos,
                        &common,
                        o.window,
                        None,
                        false,
                        &o.controller_args,
                    )
                    .await,
                );
                print_fleet(&runs, ticks);
            }
            for &n in &o.sharded {
                let run = sharded_fleet(
                    n,
                    o.shards,
                    &infos,
                    &common,
                    o.window,
                    &o.controller_args,
                    o.shards_alone,
                )
                .await;
                // The single-process baseline beside it: the largest managed
                // fleet of this run, if any.
                let single = runs
                    .iter()
                    .filter(|r| r.managed && r.n > 0)
                    .max_by_key(|r| r.n);
                print_sharded(&run, runs.iter().find(|r| r.n == 0), single, ticks);
            }
            drop(etcd);
        }
        if o.remediation {
            let figures = remediation(
                o.remediations,
                o.singles,
                o.concurrency,
                &o.controller_args,
                o.heartbeat_ms,
            )
            .await;
            print_remediation(&figures);
        }
        println!("(whole bench {:.0} s)", started.elapsed().as_secs_f64());
    });
}
