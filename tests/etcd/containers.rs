//! A containerised etcd world: three real etcd members, each in its own
//! container on a user-defined Docker network, with the k3s-like PKI and member
//! names of the loopback harness and certificates carrying the container IPs.
//! The test process reaches them over verified mutual TLS on those IPs (the
//! host routes to a user-defined bridge), and the project's decision code runs
//! on the real snapshots:
//!
//! 1. a member partitioned for real (`docker network disconnect`) counts as
//!    unhealthy, removing a healthy member is refused and nothing is removed;
//!    reconnected, it counts healthy again;
//! 2. remediation of a stopped member (`docker stop`): decided by
//!    `remediation::decide_remediation`, removed with the quorum-checked removal;
//! 3. a scale-down: `decide_scale_down` picks the leader's Machine, leadership
//!    moves off it first, then it is removed.
//!
//! The etcd image is built here from Debian's etcd binary and the libraries it
//! links (`FROM scratch`); no registry is needed. Skipped, with the reason
//! printed, only where no Docker engine answers.

use crate::docker_support;

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use chrono::{TimeZone, Utc};
use docker_support::{ContainerGuard, NetworkGuard, build_image, docker, run_suffix};
use k3s_control_plane::etcd::{
    ClientTls, EtcdCluster, EtcdError, LeaderMove, MembershipSnapshot, Removal, Timeouts, Transport,
};
use k3s_control_plane::harness::etcd::etcd_binary;
use k3s_control_plane::harness::pki::{TestPki, write_pair};
use k3s_control_plane::membership::node_of_member_name;
use k3s_control_plane::quorum::Blocker;
use k3s_control_plane::remediation::{
    ControlPlaneView, EtcdState, MachineView, Membership, Outcome, RemediationStrategy, Rule,
    ScaleDownDecision, decide_remediation, decide_scale_down,
};

const IMAGE: &str = "k3scp-etcd:test";
const MEMBERS: usize = 3;
const POLL: Duration = Duration::from_millis(100);

/// Build (or reuse) the etcd image: the binary and its libraries only.
fn etcd_image() -> Result<bool, String> {
    let ctx = tempfile::tempdir().map_err(|e| e.to_string())?;
    let root = ctx.path().join("rootfs");
    let bin = etcd_binary().map_err(|e| e.to_string())?;
    docker_support::stage_binary(&root, &bin, "/usr/bin/etcd")
        .map_err(|e| format!("stage {bin:?}: {e}"))?;
    let dockerfile = ctx.path().join("Dockerfile");
    std::fs::write(
        &dockerfile,
        "FROM scratch\nCOPY rootfs/ /\nENTRYPOINT [\"/usr/bin/etcd\"]\n",
    )
    .map_err(|e| e.to_string())?;
    build_image(IMAGE, ctx.path(), &dockerfile)
}

/// A network with a subnet of our own choosing (static IPs need one, and a
/// reconnected member must get its address, the one its certificates carry,
/// back). Candidates are tried until one does not overlap an existing network.
fn create_network(name: &str) -> Result<(NetworkGuard, [u8; 3]), String> {
    let start = std::process::id() as usize;
    let mut last = String::new();
    for i in 0..64 {
        let third = 100 + ((start + i) % 150) as u8;
        let prefix = [10, 213, third];
        match docker(&[
            "network",
            "create",
            "--driver",
            "bridge",
            "--subnet",
            &format!("10.213.{third}.0/24"),
            "--label",
            "org.k3scp.test=etcd-containers",
            name,
        ]) {
            Ok(_) => return Ok((NetworkGuard(name.to_string()), prefix)),
            Err(e) => last = e,
        }
    }
    Err(format!("no free subnet 10.213.x.0/24: {last}"))
}

struct Member {
    name: String,
    ip: Ipv4Addr,
    container: ContainerGuard,
}

impl Member {
    fn client_url(&self) -> String {
        format!("https://{}:2379", self.ip)
    }
}

/// The world: declared so that containers go before their network.
struct World {
    members: Vec<Member>,
    network: NetworkGuard,
    pki: TestPki,
    _dir: tempfile::TempDir,
}

impl World {
    async fn start() -> World {
        let suffix = run_suffix();
        let net_name = format!("k3scp-etcd-{suffix}");
        let (network, prefix) = create_network(&net_name).expect("create the Docker network");
        let dir = tempfile::tempdir().unwrap();
        let pki = TestPki::new();
        let ca = write_pair(&dir.path().join("ca"), "server-ca", &pki.server_ca.pair).unwrap();
        let peer_ca = write_pair(&dir.path().join("ca"), "peer-ca", &pki.peer_ca.pair).unwrap();
        let planned: Vec<(String, String, Ipv4Addr)> = (0..MEMBERS)
            .map(|i| {
                let node = format!("cp-{i}");
                // k3s names members `<node>-<8 hex>`.
                let name = format!("{node}-{}", run_suffix());
                (
                    node,
                    name,
                    Ipv4Addr::new(prefix[0], prefix[1], prefix[2], 10 + i as u8),
                )
            })
            .collect();
        let initial_cluster = planned
            .iter()
            .map(|(_, name, ip)| format!("{name}=https://{ip}:2380"))
            .collect::<Vec<_>>()
            .join(",");
        let mut members = Vec::new();
        for (node, name, ip) in planned {
            let tls = dir.path().join(&node);
            write_pair(&tls, "server-client", &pki.serving(&name, ip, true)).unwrap();
            write_pair(&tls, "peer-server-client", &pki.peer(&name, ip)).unwrap();
            for f in [&ca.cert, &peer_ca.cert] {
                std::fs::copy(f, tls.join(f.file_name().unwrap())).unwrap();
            }
            let container = format!("k3scp-{suffix}-{node}");
            let args = member_args(&name, ip, &initial_cluster, &suffix);
            let mut run: Vec<String> = [
                "run",
                "-d",
                "--name",
                &container,
                "--hostname",
                &node,
                "--network",
                &net_name,
                "--ip",
                &ip.to_string(),
                "--label",
                "org.k3scp.test=etcd-containers",
                "-v",
                &format!("{}:/etc/etcd/tls:ro", tls.display()),
                IMAGE,
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            run.extend(args);
            // Guard first, so a failed `run` that still created it is removed.
            let guard = ContainerGuard(container.clone());
            docker(&run).unwrap_or_else(|e| panic!("start {container}: {e}"));
            members.push(Member {
                name,
                ip,
                container: guard,
            });
        }
        World {
            members,
            network,
            pki,
            _dir: dir,
        }
    }

    /// The engine, as the controller builds it: client certificates minted
    /// from the etcd CA, chain and IP verified, every member's URL a seed.
    fn engine(&self) -> EtcdCluster {
        let tls = ClientTls::minted_from_ca(
            ("server-ca.crt", self.pki.server_ca.pair.cert_pem.as_bytes()),
            ("server-ca.key", self.pki.server_ca.pair.key_pem.as_bytes()),
            Duration::from_secs(3600),
        )
        .unwrap();
        let seeds: Vec<String> = self.members.iter().map(Member::client_url).collect();
        EtcdCluster::with_options(&seeds, tls, Transport::Direct, timeouts()).unwrap()
    }

    fn member(&self, name: &str) -> &Member {
        self.members
            .iter()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("no member {name}"))
    }

    /// Container logs of every member, for failure messages.
    fn logs(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("--- {} ---\n{}", m.name, m.container.logs_tail()))
            .collect()
    }

    /// Poll snapshots until `ready` accepts one, or panic with the last reason.
    async fn poll(
        &self,
        etcd: &EtcdCluster,
        what: &str,
        limit: Duration,
        ready: impl Fn(&MembershipSnapshot) -> Result<(), String>,
    ) -> MembershipSnapshot {
        let deadline = Instant::now() + limit;
        loop {
            let last = match etcd.snapshot().await {
                Ok(snap) => match ready(&snap) {
                    Ok(()) => return snap,
                    Err(why) => why,
                },
                Err(e) => e.to_string(),
            };
            assert!(
                Instant::now() < deadline,
                "{what}: not within {limit:?}: {last}\n{}",
                self.logs()
            );
            tokio::time::sleep(POLL).await;
        }
    }
}

fn timeouts() -> Timeouts {
    Timeouts {
        connect: Duration::from_secs(1),
        call: Duration::from_secs(3),
        probe: Duration::from_secs(2),
        confirm: Duration::from_secs(15),
        // The containers' --election-timeout.
        election: Duration::from_millis(1500),
        defrag: k3s_control_plane::etcd::client::DEFAULT_DEFRAG_TIMEOUT,
    }
}

fn member_args(name: &str, ip: Ipv4Addr, initial_cluster: &str, token: &str) -> Vec<String> {
    let tls = "/etc/etcd/tls";
    [
        format!("--name={name}"),
        "--data-dir=/var/lib/etcd".into(),
        // Every address of the container: the network address comes and goes
        // with `docker network disconnect/connect`.
        "--listen-client-urls=https://0.0.0.0:2379".into(),
        format!("--advertise-client-urls=https://{ip}:2379"),
        "--listen-peer-urls=https://0.0.0.0:2380".into(),
        format!("--initial-advertise-peer-urls=https://{ip}:2380"),
        format!("--initial-cluster={initial_cluster}"),
        "--initial-cluster-state=new".into(),
        format!("--initial-cluster-token=k3scp-{token}"),
        format!("--cert-file={tls}/server-client.crt"),
        format!("--key-file={tls}/server-client.key"),
        format!("--trusted-ca-file={tls}/server-ca.crt"),
        "--client-cert-auth".into(),
        format!("--peer-cert-file={tls}/peer-server-client.crt"),
        format!("--peer-key-file={tls}/peer-server-client.key"),
        format!("--peer-trusted-ca-file={tls}/peer-ca.crt"),
        "--peer-client-cert-auth".into(),
        // As the loopback harness: a loaded 2-core machine must not cause elections.
        "--heartbeat-interval=100".into(),
        "--election-timeout=1500".into(),
        "--pre-vote".into(),
        "--logger=zap".into(),
        "--log-level=warn".into(),
    ]
    .into()
}

fn all_healthy(n: usize) -> impl Fn(&MembershipSnapshot) -> Result<(), String> {
    move |snap| {
        if snap.members.len() != n {
            return Err(format!("{} members listed, want {n}", snap.members.len()));
        }
        if snap.leader.is_none() {
            return Err("no leader".into());
        }
        match snap.members.iter().find_map(|m| {
            m.unhealthy_reason()
                .map(|why| format!("{}: {why}", m.label()))
        }) {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }
}

/// The control plane as the controller would see it: one Machine per member's
/// node (healthy components, a node), mapped by the k3s member name, with the
/// real membership. `created` orders the Machines (oldest first).
fn view(snap: &MembershipSnapshot, desired: u32, created: &[&str]) -> ControlPlaneView {
    let machines = snap
        .members
        .iter()
        .map(|m| {
            let node = node_of_member_name(&m.name).expect("k3s member name");
            let age = created.iter().position(|n| *n == node).unwrap_or(99) as i64;
            let mut machine = MachineView::new(
                &format!("kcp-{node}"),
                Utc.timestamp_opt(1_700_000_000 + age, 0).unwrap(),
            );
            machine.node_ref = Some(node.to_string());
            machine.components_healthy = Some(true);
            machine.etcd_member = Some(m.id);
            machine
        })
        .collect();
    ControlPlaneView {
        name: "kcp".into(),
        initialized: true,
        desired_replicas: desired,
        strategy: RemediationStrategy::default(),
        remediation_in_progress: None,
        etcd: EtcdState::Observed(Membership {
            members: snap.member_views(),
            leader: snap.leader,
        }),
        failure_domains: Vec::new(),
        pending_topology_version: None,
        machines,
    }
}

fn node_of(snap: &MembershipSnapshot, id: u64) -> String {
    let member = snap.member(id).expect("member in snapshot");
    node_of_member_name(&member.name).unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerised_etcd_partition_remediation_and_scale_down() {
    k3s_control_plane::install_crypto_provider();
    if let Some(reason) = docker_support::skip_reason() {
        docker_support::skip(
            "containerised_etcd_partition_remediation_and_scale_down",
            &reason,
        );
        return;
    }
    let t0 = Instant::now();
    let built = etcd_image().expect("build the etcd image");
    let image_time = t0.elapsed();
    let t1 = Instant::now();
    let world = World::start().await;
    let etcd = world.engine();
    let snap = world
        .poll(
            &etcd,
            "3 healthy members",
            Duration::from_secs(30),
            all_healthy(3),
        )
        .await;
    eprintln!(
        "containers: etcd image {} in {image_time:.2?}; 3-member TLS cluster in containers healthy with a leader {:.2?} after `docker run` of the first (network {})",
        if built { "built" } else { "reused" },
        t1.elapsed(),
        world.network.0,
    );
    for m in &world.members {
        let listed = snap.member_by_name(&m.name).expect("member listed by name");
        assert_eq!(listed.client_urls, vec![m.client_url()], "{}", m.name);
        assert!(m.container.running(), "{} runs", m.name);
    }

    // Verification is real: with our valid client certificate but a CA that did
    // not sign the serving certificates, the members are refused.
    let foreign = TestPki::new();
    let stranger = EtcdCluster::with_options(
        &[world.members[0].client_url()],
        ClientTls::from_pem(
            ("other-ca.crt", foreign.server_ca.pair.cert_pem.as_bytes()),
            ("client.crt", world.pki.client.cert_pem.as_bytes()),
            ("client.key", world.pki.client.key_pem.as_bytes()),
        )
        .unwrap(),
        Transport::Direct,
        timeouts(),
    )
    .unwrap();
    let refused = stranger
        .snapshot()
        .await
        .expect_err("an unknown CA is refused");
    assert!(
        matches!(refused, EtcdError::UnknownAuthority { .. }),
        "refused for the CA, got: {refused}"
    );

    // --- 1. A real partition: the member's container leaves the network. ---
    let leader = snap.leader.unwrap();
    let followers: Vec<u64> = snap
        .members
        .iter()
        .map(|m| m.id)
        .filter(|id| *id != leader)
        .collect();
    let (cut, healthy_follower) = (followers[0], followers[1]);
    let cut_member = world.member(&snap.member(cut).unwrap().name);
    let t = Instant::now();
    docker(&[
        "network",
        "disconnect",
        &world.network.0,
        &cut_member.container.0,
    ])
    .unwrap();
    let cut_name = cut_member.name.clone();
    let parted = world
        .poll(
            &etcd,
            "the partitioned member counted unhealthy",
            Duration::from_secs(20),
            |s| match s.member(cut) {
                None => Err("partitioned member not listed".into()),
                Some(m) if m.probe_error.is_none() => Err(format!("{cut_name} still healthy")),
                Some(_) if s.leader.is_none() => Err("no leader among the others".into()),
                Some(_) => Ok(()),
            },
        )
        .await;
    eprintln!(
        "containers: partitioned {} counted unhealthy after {:.2?}: {}",
        cut_member.name,
        t.elapsed(),
        parted.member(cut).unwrap().probe_error.as_deref().unwrap()
    );
    assert_eq!(
        parted.members.len(),
        3,
        "the partitioned member is still listed"
    );
    assert!(parted.member(healthy_follower).unwrap().is_healthy());
    // Removing a healthy member would leave one healthy voter of two.
    let verdict = parted.assess_removal(healthy_follower);
    assert!(!verdict.is_safe(), "{verdict}");
    assert!(
        verdict.blockers.contains(&Blocker::QuorumLost {
            healthy: 1,
            voters: 2,
            quorum: 2
        }),
        "{verdict:?}"
    );
    assert_eq!(verdict.unhealthy.len(), 1);
    assert_eq!(verdict.unhealthy[0].member, cut_member.name);
    // The remediation rules refuse it too, with the numbers.
    let mut v = view(&parted, 3, &[]);
    let healthy_node = node_of(&parted, healthy_follower);
    let target = v
        .machines
        .iter_mut()
        .find(|m| m.node_ref.as_deref() == Some(&healthy_node))
        .unwrap();
    target.health_check_succeeded = Some(false);
    target.owner_remediated = Some(false);
    let decision = decide_remediation(&v, Utc::now());
    assert_eq!(
        decision.rule,
        Rule::EtcdQuorumAtRisk,
        "{}",
        decision.message
    );
    assert!(matches!(decision.outcome, Outcome::Wait { .. }));
    // And the engine's own quorum-checked removal refuses without touching etcd.
    let err = etcd
        .safe_remove(healthy_follower)
        .await
        .expect_err("unsafe removal refused");
    assert!(matches!(err, EtcdError::UnsafeRemoval { .. }), "{err}");
    let after = etcd.snapshot().await.unwrap();
    assert_eq!(after.members.len(), 3, "nothing was removed");

    // Heal: reconnect with the same address (the one its certificates carry).
    let t = Instant::now();
    docker(&[
        "network",
        "connect",
        "--ip",
        &cut_member.ip.to_string(),
        &world.network.0,
        &cut_member.container.0,
    ])
    .unwrap();
    world
        .poll(
            &etcd,
            "healed: 3 healthy",
            Duration::from_secs(30),
            all_healthy(3),
        )
        .await;
    eprintln!(
        "containers: {} reconnected, counted healthy again after {:.2?}",
        cut_member.name,
        t.elapsed()
    );

    // --- 2. Remediation of a stopped member: the leader's container stops. ---
    let snap = etcd.snapshot().await.unwrap();
    let dead = snap.leader.expect("a leader");
    let dead_member = world.member(&snap.member(dead).unwrap().name);
    docker(&["stop", "--time", "5", &dead_member.container.0]).unwrap();
    assert!(!dead_member.container.running());
    let dead_name = dead_member.name.clone();
    let down = world
        .poll(
            &etcd,
            "the stopped member counted unhealthy, a new leader elected",
            Duration::from_secs(30),
            |s| {
                let m = s.member(dead).ok_or("stopped member not listed")?;
                if m.probe_error.is_none() {
                    return Err(format!("{dead_name} still healthy"));
                }
                match s.leader {
                    Some(l) if l != dead => {}
                    _ => return Err("no new leader yet".into()),
                }
                let healthy = s.members.iter().filter(|m| m.is_healthy()).count();
                if healthy != 2 {
                    return Err(format!("{healthy} healthy, want 2"));
                }
                Ok(())
            },
        )
        .await;
    let mut v = view(&down, 3, &[]);
    let dead_node = node_of(&down, dead);
    let target = v
        .machines
        .iter_mut()
        .find(|m| m.node_ref.as_deref() == Some(&dead_node))
        .unwrap();
    target.health_check_succeeded = Some(false);
    target.owner_remediated = Some(false);
    let decision = decide_remediation(&v, Utc::now());
    let Outcome::Remediate(plan) = &decision.outcome else {
        panic!("remediation refused: {}", decision.message);
    };
    assert_eq!(plan.machine, format!("kcp-{dead_node}"));
    assert_eq!(plan.member, Some(dead));
    let assessment = plan.assessment.as_ref().unwrap();
    assert_eq!((assessment.voters, assessment.healthy), (2, 2));
    let removed = etcd.safe_remove(dead).await.expect("remediation removal");
    assert!(
        removed.leader_move.is_none(),
        "a stopped member does not lead"
    );
    assert!(
        matches!(&removed.removal, Removal::Removed { member, .. } if *member == dead_name),
        "{:?}",
        removed.removal
    );
    let snap = world
        .poll(
            &etcd,
            "2 healthy after remediation",
            Duration::from_secs(20),
            all_healthy(2),
        )
        .await;
    assert!(snap.member(dead).is_none());

    // --- 3. Scale-down 2 -> 1: the leader's Machine is the oldest, so it goes. ---
    let leader = snap.leader.unwrap();
    let leader_node = node_of(&snap, leader);
    let other = snap.members.iter().find(|m| m.id != leader).unwrap().id;
    let v = view(&snap, 1, &[&leader_node]);
    let ScaleDownDecision::Go {
        scale_down,
        message,
    } = decide_scale_down(&v)
    else {
        panic!("scale-down refused: {:?}", decide_scale_down(&v));
    };
    assert_eq!(
        scale_down.machine,
        format!("kcp-{leader_node}"),
        "{message}"
    );
    assert_eq!(scale_down.member, Some(leader));
    assert_eq!(scale_down.transferee, Some(other), "{message}");
    let moved = etcd
        .move_leader_off(leader, scale_down.transferee)
        .await
        .expect("leadership moves off the target");
    assert!(matches!(moved, LeaderMove::Moved { .. }), "{moved:?}");
    let removed = etcd.safe_remove(leader).await.expect("scale-down removal");
    assert!(
        removed.leader_move.is_none(),
        "leadership had already moved"
    );
    assert!(matches!(removed.removal, Removal::Removed { .. }));
    let last = world
        .poll(
            &etcd,
            "1 healthy member left",
            Duration::from_secs(20),
            all_healthy(1),
        )
        .await;
    assert_eq!(last.leader, Some(other));
    eprintln!("containers: whole world test {:.2?}", t0.elapsed());
}
