//! Real etcd clusters on loopback for tests and the demo.
//!
//! Each member gets its OWN address in 127.0.0.0/8 with the standard ports 2379
//! (client) and 2380 (peer), as on real nodes. A cluster claims an address
//! block `127.77.<b>.0/24` with an exclusive `flock` on
//! `/tmp/k3scp-etcd-block-<b>.lock`, held for its life, so threads of one test
//! binary and concurrent processes never collide. At most
//! [`MAX_CLUSTERS_PER_PROCESS`] clusters run at once per process (the machines
//! have 2 cores), and members run k3s's heartbeat/election timing (500/5000 ms),
//! which also keeps a loaded CPU from causing elections. Every wait polls a condition with a
//! deadline. Dropping the cluster kills every member (also on panic), and
//! members get SIGKILL if the process that started them dies.
//!
//! A cluster is built as k3s builds one (docs/k3s.md E5): the first member
//! bootstraps alone (`--initial-cluster-state new`, no cluster token, as
//! k3s), and each other one is added with `MemberAdd` as a learner, started
//! with `--initial-cluster-state existing` and promoted. Member and cluster
//! ids are therefore derived as on k3s: a first server restarted alone on
//! its address gets the same ones (T3).
//!
//! A cluster built [`partitionable`](EtcdTestClusterBuilder::partitionable)
//! has a TCP proxy in front of every member's peer port, so that
//! [`EtcdTestCluster::isolate`] can cut one member's raft traffic, both ways,
//! while its client port stays reachable: a real partition as etcd sees it.

use std::fs::{File, OpenOptions};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use etcd_client::MemberAddOptions;
use nix::fcntl::{Flock, FlockArg};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::sync::{Semaphore, SemaphorePermit};

use crate::etcd::{ClientTls, EtcdCluster, EtcdError, MembershipSnapshot, Timeouts, Transport};
use crate::harness::pki::{PairFiles, TestCa, TestPki, write_pair};

/// How many clusters one process runs at once.
pub const MAX_CLUSTERS_PER_PROCESS: usize = 3;
/// Addresses `.1` to `.MAX_MEMBERS` of a block are usable by members.
pub const MAX_MEMBERS: usize = 9;
const BLOCK_PREFIX: (u8, u8) = (127, 77);
/// Second octet of the client addresses members listen on when their
/// advertised (Node) address must not be reachable.
const HIDDEN_CLIENT_OCTET: u8 = 78;
/// Second octet of each member's loopback-only listeners (metrics, plain
/// HTTP), which k3s puts on `127.0.0.1` (one per member here).
const LOOPBACK_ONLY_OCTET: u8 = 79;
/// k3s's own raft timing (docs/k3s.md R1): every test world runs at it, so
/// detection times, MoveLeader and confirmation limits are exercised as k3s
/// runs them. A builder's `raft_timing` overrides it where a test says why.
const HEARTBEAT_MS: u32 = 500;
const ELECTION_MS: u32 = 5000;
const POLL: Duration = Duration::from_millis(100);
/// The least time a learner etcd accepted is given to answer.
const LEARNER_START_LIMIT: Duration = Duration::from_secs(45);
const CLIENT_PORT: u16 = 2379;
/// The advertised peer port (the proxy's, when there is one).
const PEER_PORT: u16 = 2380;
/// Where a member listens for peers behind its proxy.
const PEER_PORT_BEHIND_PROXY: u16 = 2381;

static CLUSTER_SLOTS: Semaphore = Semaphore::const_new(MAX_CLUSTERS_PER_PROCESS);

#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error(transparent)]
    Binary(#[from] super::etcd_binary::EtcdBinaryError),
    #[error("cluster of {0} members asked; between 1 and {MAX_MEMBERS} are supported")]
    BadSize(usize),
    #[error("no free address block 127.77.<b>.0/24 (all 256 locked or in use)")]
    NoFreeBlock,
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("member {member} exited: {status}; log tail:\n{log}")]
    MemberExited {
        member: String,
        status: String,
        log: String,
    },
    #[error("{what} did not happen within {after:?}: {last}")]
    Timeout {
        what: String,
        after: Duration,
        last: String,
    },
    #[error("no member at index {0}")]
    NoMember(usize),
    #[error("the cluster was not started partitionable (builder: .partitionable())")]
    NotPartitionable,
    #[error("restore of etcd member {member}: {detail}")]
    Restore { member: String, detail: String },
    #[error(transparent)]
    Etcd(#[from] EtcdError),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> HarnessError {
    let what = what.into();
    move |source| HarnessError::Io { what, source }
}

pub use super::etcd_binary::{EtcdBinary, etcd_binary};

/// An exclusively locked address block.
struct Block {
    index: u8,
    _lock: Flock<File>,
}

impl Block {
    fn address(&self, member: usize) -> Ipv4Addr {
        Ipv4Addr::new(BLOCK_PREFIX.0, BLOCK_PREFIX.1, self.index, member as u8 + 1)
    }

    /// Where a member with an unreachable advertised address really listens
    /// for clients (the same block lock covers it).
    fn hidden_address(&self, member: usize) -> Ipv4Addr {
        Ipv4Addr::new(
            BLOCK_PREFIX.0,
            HIDDEN_CLIENT_OCTET,
            self.index,
            member as u8 + 1,
        )
    }

    /// Lock the first free block whose addresses are also free of listeners
    /// (a stray etcd from a killed run must not be mistaken for ours).
    fn claim() -> Result<Self, HarnessError> {
        let start = (std::process::id() % 256) as usize;
        for offset in 0..256 {
            let index = ((start + offset) % 256) as u8;
            let path = format!("/tmp/k3scp-etcd-block-{index}.lock");
            let file = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .map_err(io(format!("open {path}")))?;
            let Ok(lock) = Flock::lock(file, FlockArg::LockExclusiveNonblock) else {
                continue;
            };
            let block = Block { index, _lock: lock };
            let free = (0..MAX_MEMBERS).all(|m| {
                [CLIENT_PORT, PEER_PORT, PEER_PORT_BEHIND_PROXY]
                    .iter()
                    .all(|port| {
                        TcpListener::bind(SocketAddr::from((block.address(m), *port))).is_ok()
                    })
                    && TcpListener::bind(SocketAddr::from((block.hidden_address(m), CLIENT_PORT)))
                        .is_ok()
            });
            if free {
                return Ok(block);
            }
        }
        Err(HarnessError::NoFreeBlock)
    }
}

/// One etcd member process.
#[derive(Debug)]
pub struct TestMember {
    /// The Node name, e.g. `cp-0`.
    pub node_name: String,
    /// The etcd member name, k3s style `<node>-<8 hex>`.
    pub name: String,
    pub ip: Ipv4Addr,
    /// Where it listens for clients: `ip`, or a hidden address when the
    /// advertised one must be unreachable (nothing listens on `ip:2379`).
    pub listen_client_ip: Ipv4Addr,
    /// Member id, known once the member has joined.
    pub id: u64,
    pub learner: bool,
    /// How many times etcd refused this member's `MemberAdd` as transient
    /// (e.g. "unhealthy cluster": etcd adds a member only once its leader has
    /// been connected to every voter for 5 s) before accepting it; 0 for the
    /// first member, which bootstraps the cluster alone.
    pub member_add_refusals: u32,
    /// Extra etcd flags of this member (e.g. a small `--quota-backend-bytes`).
    extra_args: Vec<String>,
    /// `--heartbeat-interval` and `--election-timeout` (ms).
    raft_timing: (u32, u32),
    /// False when the serving certificate deliberately lacks the member's IP:
    /// it cannot be probed on its address, so readiness only waits for it to join.
    pub ip_in_serving_cert: bool,
    /// Listens for peers behind a proxy (see [`EtcdTestCluster::isolate`]).
    behind_proxy: bool,
    /// Runs a cluster of its own ([`EtcdTestCluster::restart_as_new_cluster`]).
    pub foreign_cluster: bool,
    /// Belongs to the cluster a snapshot restore replaced
    /// ([`EtcdTestCluster::adopt_restored`]): the harness no longer seeds
    /// from it, waits for it, or sends membership requests to it.
    pub retired: bool,
    dir: PathBuf,
    serving: PairFiles,
    peer: PairFiles,
    initial_cluster: String,
    initial_state: &'static str,
    child: Option<Child>,
}

impl TestMember {
    /// The advertised client URL (its Node's address).
    pub fn client_url(&self) -> String {
        format!("https://{}:{CLIENT_PORT}", self.ip)
    }

    /// Where the member really accepts client connections.
    pub fn listen_client_addr(&self) -> SocketAddr {
        SocketAddr::from((self.listen_client_ip, CLIENT_PORT))
    }

    /// The advertised peer URL (the proxy's when partitionable).
    pub fn peer_url(&self) -> String {
        format!("https://{}:{PEER_PORT}", self.ip)
    }

    /// Where the member listens for peers.
    pub fn listen_peer_url(&self) -> String {
        format!("https://{}", self.listen_peer_addr())
    }

    fn listen_peer_addr(&self) -> SocketAddr {
        let port = if self.behind_proxy {
            PEER_PORT_BEHIND_PROXY
        } else {
            PEER_PORT
        };
        SocketAddr::from((self.ip, port))
    }

    /// Where its loopback-only listeners are (k3s: `127.0.0.1`).
    pub fn loopback_ip(&self) -> Ipv4Addr {
        let [_, _, block, host] = self.ip.octets();
        Ipv4Addr::new(BLOCK_PREFIX.0, LOOPBACK_ONLY_OCTET, block, host)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("etcd.log")
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    /// Start the member. No `--initial-cluster-token`: k3s sets none (its
    /// `executor.InitialOptions` has only the advertised peer URL, the
    /// initial cluster and its state), so etcd's default `etcd-cluster` goes
    /// into the member id of a member bootstrapped with `new`.
    fn spawn(&mut self, bin: &Path, ca: &Path, peer_ca: &Path) -> Result<(), HarnessError> {
        let log = File::create(self.log_path()).map_err(io("create etcd log"))?;
        let log_err = log.try_clone().map_err(io("clone etcd log"))?;
        let mut cmd = Command::new(bin);
        cmd.arg("--name")
            .arg(&self.name)
            .arg("--data-dir")
            .arg(self.dir.join("data"))
            .arg("--listen-client-urls")
            .arg(format!("https://{}", self.listen_client_addr()))
            .arg("--advertise-client-urls")
            .arg(self.client_url())
            .arg("--listen-peer-urls")
            .arg(self.listen_peer_url())
            .arg("--initial-advertise-peer-urls")
            .arg(self.peer_url())
            .arg("--initial-cluster")
            .arg(&self.initial_cluster)
            .arg("--initial-cluster-state")
            .arg(self.initial_state)
            .arg("--cert-file")
            .arg(&self.serving.cert)
            .arg("--key-file")
            .arg(&self.serving.key)
            .arg("--trusted-ca-file")
            .arg(ca)
            .arg("--client-cert-auth")
            .arg("--peer-cert-file")
            .arg(&self.peer.cert)
            .arg("--peer-key-file")
            .arg(&self.peer.key)
            .arg("--peer-trusted-ca-file")
            .arg(peer_ca)
            .arg("--peer-client-cert-auth")
            .arg("--heartbeat-interval")
            .arg(self.raft_timing.0.to_string())
            .arg("--election-timeout")
            .arg(self.raft_timing.1.to_string())
            .arg("--pre-vote")
            .arg("--logger=zap")
            .arg("--log-level=warn")
            .args(super::etcd_binary::k3s_member_flags(
                &EtcdBinary::at(bin)?.flags,
                self.loopback_ip(),
            ))
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        // SAFETY: only async-signal-safe prctl between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                // Members die with the process that started them, even if it is
                // SIGKILLed and never runs Drop.
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
            });
        }
        let child = cmd
            .spawn()
            .map_err(io(format!("start etcd member {}", self.name)))?;
        self.child = Some(child);
        self.initial_state = "existing";
        Ok(())
    }

    fn signal(&self, signal: Signal) -> Result<(), HarnessError> {
        if let Some(pid) = self.pid() {
            kill(Pid::from_raw(pid as i32), signal).map_err(|e| HarnessError::Io {
                what: format!("{signal} to {}", self.name),
                source: e.into(),
            })?;
        }
        Ok(())
    }

    /// Exit status if the process has exited.
    fn exited(&mut self) -> Option<String> {
        let child = self.child.as_mut()?;
        match child.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            _ => None,
        }
    }

    async fn wait_exit(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            if self.child.is_none() || self.exited().is_some() {
                self.child = None;
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn kill_now(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A member list as one member answered it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnMembership {
    pub cluster_id: u64,
    pub members: Vec<OwnMember>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnMember {
    pub id: u64,
    pub name: String,
    pub learner: bool,
}

/// Options for [`EtcdTestCluster`].
#[derive(Clone, Debug)]
pub struct EtcdTestClusterBuilder {
    members: usize,
    without_ip_san: Vec<usize>,
    learners: usize,
    ready_timeout: Duration,
    /// The etcd server CA to sign with (cert, key PEM), instead of a new one.
    server_ca: Option<(String, String)>,
    partitionable: bool,
    /// `--quota-backend-bytes` per member index.
    quotas: Vec<(usize, u64)>,
    unreachable_client_addresses: bool,
    /// `--heartbeat-interval` and `--election-timeout` (ms) of every member.
    raft_timing: (u32, u32),
    /// How long the members' serving certificates are valid (default a year).
    serving_cert_lifetime: Option<Duration>,
}

impl EtcdTestClusterBuilder {
    /// Give member `index` a backend quota of `bytes` (`--quota-backend-bytes`),
    /// so that filling it raises a real `NOSPACE` alarm on that member.
    pub fn quota_backend_bytes(mut self, index: usize, bytes: u64) -> Self {
        self.quotas.push((index, bytes));
        self
    }

    /// Sign the members' serving and client certificates with this CA (PEM),
    /// as k3s does with the `<cluster>-etcd` CA the bootstrap provider writes
    /// to `/var/lib/rancher/k3s/server/tls/etcd/server-ca.*`.
    pub fn server_ca(mut self, cert_pem: &str, key_pem: &str) -> Self {
        self.server_ca = Some((cert_pem.to_string(), key_pem.to_string()));
        self
    }

    /// Number of voting members at start.
    pub fn members(mut self, n: usize) -> Self {
        self.members = n;
        self
    }

    /// Give member `index` a serving certificate without its IP address
    /// (only `localhost`/127.0.0.1), to test server-name verification.
    pub fn serving_cert_without_ip(mut self, index: usize) -> Self {
        self.without_ip_san.push(index);
        self
    }

    /// Add this many learners once the voters are up.
    pub fn learners(mut self, n: usize) -> Self {
        self.learners = n;
        self
    }

    /// Put every member's peer port behind a proxy, so that
    /// [`EtcdTestCluster::isolate`] can partition a member from its peers
    /// while its client port stays reachable.
    pub fn partitionable(mut self) -> Self {
        self.partitionable = true;
        self
    }

    /// Members advertise (and their certificates carry) their address, but
    /// listen for clients on another one: nothing answers on the advertised
    /// `ip:2379`, as when node addresses are not routable. The harness's own
    /// connections reach them through [`EtcdTestCluster::transport`].
    pub fn unreachable_client_addresses(mut self) -> Self {
        self.unreachable_client_addresses = true;
        self
    }

    /// Raft timing of every member, in milliseconds (default 100 and 1500).
    /// A slower heartbeat costs less CPU while idle: a bench running many
    /// clusters on a few cores can keep etcd's own idle load off them.
    pub fn raft_timing(mut self, heartbeat_ms: u32, election_ms: u32) -> Self {
        self.raft_timing = (heartbeat_ms, election_ms);
        self
    }

    /// Serving certificates valid for `lifetime` from now (e.g. minutes, to
    /// see expiry observed and acted on).
    pub fn serving_cert_lifetime(mut self, lifetime: Duration) -> Self {
        self.serving_cert_lifetime = Some(lifetime);
        self
    }

    pub fn ready_timeout(mut self, limit: Duration) -> Self {
        self.ready_timeout = limit;
        self
    }

    pub async fn start(self) -> Result<EtcdTestCluster, HarnessError> {
        EtcdTestCluster::start_with(self).await
    }
}

/// A running local etcd cluster with a k3s-like PKI and member names.
pub struct EtcdTestCluster {
    pub pki: TestPki,
    members: Vec<TestMember>,
    bin: PathBuf,
    ca_file: PathBuf,
    ca_key_file: PathBuf,
    peer_ca_file: PathBuf,
    client_files: PairFiles,
    admin: EtcdCluster,
    ready_timeout: Duration,
    proxies: Option<peer_proxy::PeerProxies>,
    /// Members listen for clients on hidden addresses.
    hidden_clients: bool,
    /// How the harness itself reaches members.
    transport: Transport,
    // Dropped after the members are killed (field order): the block stays
    // locked, and the slot taken, until the addresses are free again.
    dir: tempfile::TempDir,
    _block: Block,
    _slot: SemaphorePermit<'static>,
}

impl std::fmt::Debug for EtcdTestCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTestCluster")
            .field("block", &self._block.index)
            .field("members", &self.members)
            .finish_non_exhaustive()
    }
}

/// Direct, or a relay from every advertised address of the block to its hidden one.
fn block_transport(block: &Block, hidden: bool) -> Transport {
    if !hidden {
        return Transport::Direct;
    }
    let mut relay = crate::etcd::transport::StaticRelay::default();
    for m in 0..MAX_MEMBERS {
        relay.targets.insert(
            (block.address(m).to_string(), CLIENT_PORT),
            SocketAddr::from((block.hidden_address(m), CLIENT_PORT)),
        );
    }
    Transport::Relayed(std::sync::Arc::new(relay))
}

pub(crate) fn random_suffix() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    format!("{:08x}", hasher.finish() as u32)
}

impl EtcdTestCluster {
    pub fn builder() -> EtcdTestClusterBuilder {
        EtcdTestClusterBuilder {
            members: 3,
            without_ip_san: Vec::new(),
            learners: 0,
            ready_timeout: Duration::from_secs(45),
            server_ca: None,
            partitionable: false,
            quotas: Vec::new(),
            unreachable_client_addresses: false,
            raft_timing: (HEARTBEAT_MS, ELECTION_MS),
            serving_cert_lifetime: None,
        }
    }

    /// Start `n` voting members and wait until they are healthy with a leader.
    ///
    /// Members are started with `PR_SET_PDEATHSIG`, which fires when the
    /// *thread* that spawned them exits: start (and restart) clusters from a
    /// test's own thread or a runtime worker, never from `spawn_blocking`.
    pub async fn start(n: usize) -> Result<Self, HarnessError> {
        Self::builder().members(n).start().await
    }

    async fn start_with(opts: EtcdTestClusterBuilder) -> Result<Self, HarnessError> {
        if opts.members == 0 || opts.members + opts.learners > MAX_MEMBERS {
            return Err(HarnessError::BadSize(opts.members + opts.learners));
        }
        let bin = etcd_binary()?;
        let slot = CLUSTER_SLOTS
            .acquire()
            .await
            .expect("the cluster semaphore is never closed");
        let block = Block::claim()?;
        let dir = tempfile::Builder::new()
            .prefix("k3scp-etcd-")
            .tempdir()
            .map_err(io("create temp dir"))?;
        let mut pki = match &opts.server_ca {
            None => TestPki::new(),
            Some((cert, key)) => {
                TestPki::with_server_ca(TestCa::from_pem(cert, key).map_err(|e| {
                    HarnessError::Io {
                        what: "load the given etcd server CA".into(),
                        source: std::io::Error::other(e.to_string()),
                    }
                })?)
            }
        };
        pki.serving_lifetime = opts.serving_cert_lifetime;
        let tls_dir = dir.path().join("pki");
        let ca = write_pair(&tls_dir, "server-ca", &pki.server_ca.pair).map_err(io("write CA"))?;
        let peer_ca =
            write_pair(&tls_dir, "peer-ca", &pki.peer_ca.pair).map_err(io("write peer CA"))?;
        let client_files =
            write_pair(&tls_dir, "client", &pki.client).map_err(io("write client"))?;

        let proxies = if opts.partitionable {
            Some(peer_proxy::PeerProxies::start().map_err(io("start the peer proxies"))?)
        } else {
            None
        };
        let mut members = Vec::new();
        for i in 0..opts.members {
            let mut member = Self::new_member(
                &pki,
                &block,
                dir.path(),
                i,
                !opts.without_ip_san.contains(&i),
                proxies.as_ref(),
                opts.unreachable_client_addresses,
            )?;
            for (_, bytes) in opts.quotas.iter().filter(|(index, _)| *index == i) {
                member.extra_args = vec![format!("--quota-backend-bytes={bytes}")];
            }
            member.raft_timing = opts.raft_timing;
            members.push(member);
        }
        // As k3s bootstraps (docs/k3s.md E2, E5): the first server alone,
        // `new`, with itself as the whole initial cluster; the others join
        // one by one (see below).
        members[0].initial_cluster = format!("{}={}", members[0].name, members[0].peer_url());
        let tls = ClientTls::from_pem(
            ("server-ca.crt", pki.server_ca.pair.cert_pem.as_bytes()),
            ("client.crt", pki.client.cert_pem.as_bytes()),
            ("client.key", pki.client.key_pem.as_bytes()),
        )
        .expect("the generated PKI is consistent");
        // The admin connection seeds only from members whose certificate is
        // valid for their address.
        let seeds: Vec<String> = members
            .iter()
            .enumerate()
            .filter(|(i, _)| !opts.without_ip_san.contains(i))
            .map(|(_, m)| m.client_url())
            .collect();
        let transport = block_transport(&block, opts.unreachable_client_addresses);
        let admin = EtcdCluster::with_options(
            &seeds,
            tls,
            transport.clone(),
            Timeouts {
                connect: Duration::from_secs(1),
                call: Duration::from_secs(3),
                probe: Duration::from_secs(2),
                confirm: Duration::from_secs(15),
                election: Duration::from_millis(u64::from(opts.raft_timing.1)),
                defrag: crate::etcd::client::DEFAULT_DEFRAG_TIMEOUT,
            },
        )?;
        let mut cluster = Self {
            pki,
            members,
            bin,
            ca_file: ca.cert,
            ca_key_file: ca.key,
            peer_ca_file: peer_ca.cert,
            client_files,
            admin,
            ready_timeout: opts.ready_timeout,
            proxies,
            hidden_clients: opts.unreachable_client_addresses,
            transport,
            dir,
            _block: block,
            _slot: slot,
        };
        cluster.spawn(0)?;
        cluster.wait_ready().await?;
        for i in 1..cluster.members.len() {
            cluster.join_and_promote(i).await?;
        }
        cluster.wait_ready().await?;
        for _ in 0..opts.learners {
            cluster.add_learner().await?;
        }
        Ok(cluster)
    }

    fn new_member(
        pki: &TestPki,
        block: &Block,
        dir: &Path,
        index: usize,
        ip_in_serving_cert: bool,
        proxies: Option<&peer_proxy::PeerProxies>,
        hidden_client: bool,
    ) -> Result<TestMember, HarnessError> {
        let node_name = format!("cp-{index}");
        let name = format!("{node_name}-{}", random_suffix());
        let ip = block.address(index);
        let listen_client_ip = if hidden_client {
            block.hidden_address(index)
        } else {
            ip
        };
        let member_dir = dir.join(&node_name);
        let tls = member_dir.join("tls");
        let serving = write_pair(
            &tls,
            "server-client",
            &pki.serving(&name, ip, ip_in_serving_cert),
        )
        .map_err(io("write serving cert"))?;
        let peer = write_pair(&tls, "peer-server-client", &pki.peer(&name, ip))
            .map_err(io("write peer cert"))?;
        let member = TestMember {
            node_name,
            name,
            ip,
            listen_client_ip,
            id: 0,
            learner: false,
            member_add_refusals: 0,
            extra_args: Vec::new(),
            raft_timing: (HEARTBEAT_MS, ELECTION_MS),
            ip_in_serving_cert,
            behind_proxy: proxies.is_some(),
            foreign_cluster: false,
            retired: false,
            dir: member_dir,
            serving,
            peer,
            initial_cluster: String::new(),
            initial_state: "new",
            child: None,
        };
        if let Some(proxies) = proxies {
            proxies
                .add(
                    index,
                    SocketAddr::from((ip, PEER_PORT)),
                    member.listen_peer_addr(),
                )
                .map_err(io(format!("proxy the peer port of {}", member.name)))?;
        }
        Ok(member)
    }

    fn spawn(&mut self, index: usize) -> Result<(), HarnessError> {
        let (bin, ca, peer_ca) = (
            self.bin.clone(),
            self.ca_file.clone(),
            self.peer_ca_file.clone(),
        );
        self.member_mut(index)?.spawn(&bin, &ca, &peer_ca)?;
        if let Some(proxies) = &self.proxies {
            proxies.set_pid(index, self.members[index].pid());
        }
        Ok(())
    }

    fn member_mut(&mut self, index: usize) -> Result<&mut TestMember, HarnessError> {
        self.members
            .get_mut(index)
            .ok_or(HarnessError::NoMember(index))
    }

    /// Fail fast if a member that should run has exited.
    fn check_alive(&mut self, running: &[usize]) -> Result<(), HarnessError> {
        for &i in running {
            let member = &mut self.members[i];
            if let Some(status) = member.exited() {
                return Err(HarnessError::MemberExited {
                    member: member.name.clone(),
                    status,
                    log: member.log_tail(),
                });
            }
        }
        Ok(())
    }

    /// Poll until every running member answers its own `Status` without errors
    /// and they agree on one leader; record member ids.
    pub async fn wait_ready(&mut self) -> Result<MembershipSnapshot, HarnessError> {
        let running: Vec<usize> = (0..self.members.len())
            .filter(|&i| {
                let m = &self.members[i];
                m.child.is_some() && !m.foreign_cluster && !m.retired
            })
            .collect();
        let names: Vec<(String, bool)> = running
            .iter()
            .map(|&i| {
                let m = &self.members[i];
                (m.name.clone(), m.ip_in_serving_cert)
            })
            .collect();
        let snap = self
            .poll(
                "cluster ready",
                self.ready_timeout,
                |snap| {
                    let Some(leader) = snap.leader else {
                        return Err("no leader yet".to_string());
                    };
                    for (name, probeable) in &names {
                        let Some(m) = snap.member_by_name(name) else {
                            return Err(format!("{name} not listed (or not started) yet"));
                        };
                        if !probeable {
                            continue;
                        }
                        if let Some(reason) = m.unhealthy_reason() {
                            return Err(format!("{name}: {reason}"));
                        }
                        if m.status.as_ref().map(|s| s.leader) != Some(leader) {
                            return Err(format!("{name} does not follow the leader yet"));
                        }
                    }
                    Ok(())
                },
                &running,
            )
            .await?;
        for member in &mut self.members {
            if let Some(m) = snap.member_by_name(&member.name) {
                member.id = m.id;
                member.learner = m.learner;
            }
        }
        Ok(snap)
    }

    /// Poll snapshots until `ready` accepts one, or time out with its last reason.
    pub async fn poll(
        &mut self,
        what: &str,
        limit: Duration,
        ready: impl Fn(&MembershipSnapshot) -> Result<(), String>,
        running: &[usize],
    ) -> Result<MembershipSnapshot, HarnessError> {
        let deadline = Instant::now() + limit;
        loop {
            self.check_alive(running)?;
            let last = match self.admin.snapshot().await {
                Ok(snap) => match ready(&snap) {
                    Ok(()) => return Ok(snap),
                    Err(reason) => reason,
                },
                Err(err) => err.to_string(),
            };
            if Instant::now() >= deadline {
                return Err(HarnessError::Timeout {
                    what: what.to_string(),
                    after: limit,
                    last,
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The next member, not started: on the next address of the block, with
    /// the cluster's raft timing (as its first members were started with).
    fn next_joiner(&self) -> Result<(usize, TestMember), HarnessError> {
        let index = self.members.len();
        if index >= MAX_MEMBERS {
            return Err(HarnessError::BadSize(index + 1));
        }
        let mut member = Self::new_member(
            &self.pki,
            &self._block,
            self.dir.path(),
            index,
            true,
            self.proxies.as_ref(),
            self.hidden_clients,
        )?;
        if let Some(first) = self.members.first() {
            member.raft_timing = first.raft_timing;
        }
        Ok((index, member))
    }

    /// Add a learner (`member add --learner`), start it and wait until it runs.
    pub async fn add_learner(&mut self) -> Result<usize, HarnessError> {
        let (index, member) = self.next_joiner()?;
        // A joining k3s server asks the cluster with a client of its own: a
        // handle that last looked before others removed members (the
        // controller, a person) would rightly refuse the smaller cluster as
        // not the one it proved.
        self.renew_admin()?;
        self.members.push(member);
        if let Err(e) = self.add_as_learner(index).await {
            self.members.pop();
            return Err(e);
        }
        self.spawn(index)?;
        self.wait_learner_started(index).await?;
        Ok(index)
    }

    /// Join member `index` as a k3s server with `server:` joins (docs/k3s.md
    /// E2, L1): `MemberAdd` as a learner (retried while etcd refuses it as
    /// transient: it adds a member only once its leader has been connected
    /// to every voter for 5 s), started with `--initial-cluster-state
    /// existing`, then promoted as soon as etcd accepts (k3s's leader does it
    /// on its 15 s tick; see [`Self::promote`]).
    async fn join_and_promote(&mut self, index: usize) -> Result<(), HarnessError> {
        self.add_as_learner(index).await?;
        self.spawn(index)?;
        self.promote(index).await?;
        Ok(())
    }

    /// The endpoint of a running voter of this cluster (not a learner, not a
    /// member restarted as a cluster of its own): where membership requests go.
    fn running_voter_endpoint(&self) -> Result<crate::etcd::transport::EtcdEndpoint, HarnessError> {
        let receiver = self
            .members
            .iter()
            .find(|m| m.child.is_some() && !m.learner && !m.foreign_cluster && !m.retired)
            .ok_or(HarnessError::NoMember(0))?;
        Ok(self.transport.resolve(&receiver.client_url())?)
    }

    /// `MemberAdd` of member `index` (in the list, not started) as a learner,
    /// recorded as etcd answered: its id, the initial cluster to start it
    /// with (`existing`), and how often etcd refused first.
    async fn add_as_learner(&mut self, index: usize) -> Result<(), HarnessError> {
        let (name, peer_url) = {
            let m = self.member_mut(index)?;
            (m.name.clone(), m.peer_url())
        };
        let (id, initial_cluster, refusals) = self.member_add_learner(&name, &peer_url).await?;
        let member = &mut self.members[index];
        member.id = id;
        member.learner = true;
        member.member_add_refusals = refusals;
        member.initial_cluster = initial_cluster;
        member.initial_state = "existing";
        Ok(())
    }

    /// `MemberPromote` of learner `index`, sent to a running voter (etcd
    /// forwards it to its leader), retried within the ready timeout while
    /// etcd answers that the learner is not in sync yet (it has not caught up
    /// with the leader's log, or not started) or is transiently unhealthy.
    /// Returns the number of attempts.
    pub async fn promote(&mut self, index: usize) -> Result<u32, HarnessError> {
        let id = self.member_mut(index)?.id;
        let endpoint = self.running_voter_endpoint()?;
        let deadline = Instant::now() + self.ready_timeout;
        let mut attempts = 0;
        loop {
            self.check_alive(&[index])?;
            attempts += 1;
            let result = self
                .admin
                .clients
                .call(
                    &endpoint,
                    "member promote",
                    Duration::from_secs(3),
                    |mut c| async move { c.member_promote(id).await },
                )
                .await;
            let err = match result {
                Ok(_) => {
                    self.members[index].learner = false;
                    return Ok(attempts);
                }
                Err(err) => err,
            };
            let retry = match &err {
                EtcdError::Grpc { message, .. } => {
                    message.contains("in sync") || message.contains("not enough started")
                }
                other => other.is_transient() || other.is_unreachable(),
            };
            if !retry || Instant::now() >= deadline {
                return Err(HarnessError::Timeout {
                    what: format!("promotion of {}", self.members[index].name),
                    after: self.ready_timeout,
                    last: format!("{err} (after {attempts} attempt(s))"),
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// What k3s does when a server whose member was removed starts again
    /// (docs/k3s.md T1, T2): the removed member's process has stopped (its
    /// tombstone); the data directory is set aside as a backup, a new member
    /// name `<node>-<8 hex>` is made, and the server joins again as a learner
    /// at the same address. The member keeps its index (it is the same
    /// server); returns the new member name.
    pub async fn rejoin_after_tombstone(&mut self, index: usize) -> Result<String, HarnessError> {
        if self.member_mut(index)?.child.is_some() {
            self.stop(index).await?;
        }
        self.set_data_aside(index)?;
        let name = self.rename(index)?;
        self.add_as_learner(index).await?;
        self.spawn(index)?;
        self.wait_learner_started(index).await?;
        Ok(name)
    }

    /// The first server (no `server:` to rejoin) restarting after its member
    /// was removed, as the January 2026 k3s releases did (docs/k3s.md T3):
    /// its data set aside, a new name `<node>-<8 hex>`, and a new one-member
    /// cluster of its own on the same address. The member is then foreign to
    /// this cluster: the harness's readiness checks leave it out. Returns
    /// the new name.
    pub async fn restart_as_new_cluster(&mut self, index: usize) -> Result<String, HarnessError> {
        if self.member_mut(index)?.child.is_some() {
            self.stop(index).await?;
        }
        self.set_data_aside(index)?;
        let name = self.rename(index)?;
        let member = &mut self.members[index];
        member.initial_cluster = format!("{name}={}", member.peer_url());
        member.learner = false;
        member.initial_state = "new";
        member.foreign_cluster = true;
        self.spawn(index)?;
        let deadline = Instant::now() + self.ready_timeout;
        loop {
            match self.status(index).await {
                Ok(status) if status.leader != 0 => {
                    self.members[index].id = status.leader;
                    return Ok(name);
                }
                Ok(_) => {}
                Err(err) if Instant::now() >= deadline => {
                    return Err(HarnessError::Timeout {
                        what: format!("{name} leading its own cluster"),
                        after: self.ready_timeout,
                        last: err.to_string(),
                    });
                }
                Err(_) => {}
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// A new server booting as k3s's first server (no `server:` to join,
    /// docs/k3s.md E5) on the next address of the block: named
    /// `<node>-<8 hex>`, it starts a one-member cluster of its own
    /// (`--initial-cluster-state new`). It is foreign to this cluster until
    /// [`Self::adopt_restored`]. Returns its index.
    pub async fn start_first_server_beside(&mut self) -> Result<usize, HarnessError> {
        let (index, mut member) = self.next_joiner()?;
        member.initial_cluster = format!("{}={}", member.name, member.peer_url());
        member.initial_state = "new";
        member.foreign_cluster = true;
        self.members.push(member);
        self.spawn(index)?;
        self.wait_leading_alone(index).await?;
        Ok(index)
    }

    /// The first half of k3s's restore (docs/k3s.md SR3): member `index`'s
    /// (stopped) data dir is moved aside as `etcd-old-<unix time>`, as k3s
    /// renames `db/etcd`. Returns where it went.
    pub fn move_data_aside(&mut self, index: usize) -> Result<PathBuf, HarnessError> {
        let member = self
            .members
            .get(index)
            .ok_or(HarnessError::NoMember(index))?;
        if member.child.is_some() {
            return Err(HarnessError::Restore {
                member: member.name.clone(),
                detail: "etcd is still running on its data dir".into(),
            });
        }
        let mut stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        // k3s names it after the second; two moves within one second (a
        // test's back-to-back restores: on etcd 3.6 the reset run between
        // them can take under a second; k3s's are whole server starts
        // apart) take the next free second instead of failing the rename.
        while member.dir.join(format!("etcd-old-{stamp}")).exists() {
            stamp += 1;
        }
        let old = member.dir.join(format!("etcd-old-{stamp}"));
        std::fs::rename(member.dir.join("data"), &old).map_err(io(format!(
            "move the data dir of {} aside to {}",
            member.name,
            old.display()
        )))?;
        Ok(old)
    }

    /// The second half (SR3): etcd's own restore tool writes `snapshot`
    /// into a fresh data dir of member `index`, under its current name and
    /// peer URL, as a one-member cluster: `etcdutl snapshot restore` for
    /// etcd 3.5 and later, `etcdctl snapshot restore` for 3.4 (which has no
    /// etcdutl). The tool verifies the snapshot's hash; its refusal comes
    /// back with its output. Returns the tool's name.
    pub fn restore_snapshot(
        &mut self,
        index: usize,
        snapshot: &Path,
    ) -> Result<&'static str, HarnessError> {
        let member = self
            .members
            .get(index)
            .ok_or(HarnessError::NoMember(index))?;
        let data = member.dir.join("data");
        let binary = EtcdBinary::at(&self.bin)?;
        let (tool, mut cmd) = if binary.version >= (3, 5, 0) {
            (
                "etcdutl",
                Command::new(binary.path.with_file_name("etcdutl")),
            )
        } else {
            let mut cmd = Command::new(binary.etcdctl());
            cmd.env("ETCDCTL_API", "3");
            ("etcdctl", cmd)
        };
        cmd.arg("snapshot")
            .arg("restore")
            .arg(snapshot)
            .arg("--name")
            .arg(&member.name)
            .arg("--data-dir")
            .arg(&data)
            .arg("--initial-cluster")
            .arg(format!("{}={}", member.name, member.peer_url()))
            .arg("--initial-advertise-peer-urls")
            .arg(member.peer_url())
            .stdin(Stdio::null());
        let out = cmd.output().map_err(io(format!(
            "run {tool} snapshot restore for {}",
            member.name
        )))?;
        if !out.status.success() {
            let mut text = String::from_utf8_lossy(&out.stderr).into_owned();
            text.push_str(&String::from_utf8_lossy(&out.stdout));
            return Err(HarnessError::Restore {
                member: member.name.clone(),
                detail: format!(
                    "{tool} snapshot restore {}: {}: {}",
                    snapshot.display(),
                    out.status,
                    text.trim()
                ),
            });
        }
        Ok(tool)
    }

    /// The restored member `index` started as k3s's reset run starts it
    /// (docs/k3s.md SR4, CR1): under a new name `<node>-<8 hex>` with
    /// `--force-new-cluster`, until it leads a cluster of which it is the
    /// only member; then stopped, as that k3s run exits. Returns the name.
    pub async fn start_reset_run(&mut self, index: usize) -> Result<String, HarnessError> {
        let name = self.rename(index)?;
        const FORCE: &str = "--force-new-cluster";
        let member = &mut self.members[index];
        member.initial_cluster = format!("{name}={}", member.peer_url());
        member.initial_state = "new";
        member.extra_args.push(FORCE.to_string());
        self.spawn(index)?;
        let alone = self.wait_leading_alone(index).await;
        self.members[index].extra_args.retain(|a| a != FORCE);
        alone?;
        self.stop(index).await?;
        Ok(name)
    }

    /// Start member `index` normally on its data dir (k3s's next start)
    /// and wait until it leads its one-member cluster.
    pub async fn start_alone(&mut self, index: usize) -> Result<(), HarnessError> {
        self.spawn(index)?;
        self.wait_leading_alone(index).await
    }

    /// From now on member `index` (a restored one-member cluster) is this
    /// cluster: every other member is retired (it belongs to the cluster
    /// the restore replaced, and stays as it is, running or not), and the
    /// harness's own handle is seeded from what is current.
    pub fn adopt_restored(&mut self, index: usize) -> Result<(), HarnessError> {
        self.members
            .get(index)
            .ok_or(HarnessError::NoMember(index))?;
        for (i, m) in self.members.iter_mut().enumerate() {
            if i == index {
                m.foreign_cluster = false;
                m.retired = false;
                m.learner = false;
            } else {
                m.retired = true;
            }
        }
        self.renew_admin()
    }

    /// Wait until member `index` lists itself as the only member of its
    /// cluster and leads it; record its id.
    async fn wait_leading_alone(&mut self, index: usize) -> Result<(), HarnessError> {
        let deadline = Instant::now() + self.ready_timeout;
        let name = self.members[index].name.clone();
        loop {
            self.check_alive(&[index])?;
            let last = match self.own_member_list(index).await {
                Ok(own) => match own.members.as_slice() {
                    [only] if only.name == name => match self.status(index).await {
                        Ok(status) if status.leader == only.id => {
                            let member = &mut self.members[index];
                            member.id = only.id;
                            member.learner = false;
                            return Ok(());
                        }
                        Ok(status) => format!("leader {:016x}", status.leader),
                        Err(err) => err.to_string(),
                    },
                    other => format!(
                        "members {:?}",
                        other.iter().map(|m| m.name.as_str()).collect::<Vec<_>>()
                    ),
                },
                Err(err) => err.to_string(),
            };
            if Instant::now() >= deadline {
                return Err(HarnessError::Timeout {
                    what: format!("{name} leading a one-member cluster"),
                    after: self.ready_timeout,
                    last,
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The member list as member `index` itself answers it, with the cluster
    /// id of its response header.
    pub async fn own_member_list(&self, index: usize) -> Result<OwnMembership, EtcdError> {
        let member = self.members.get(index).ok_or(EtcdError::MemberNotFound {
            member: format!("index {index}"),
        })?;
        let endpoint = self.admin.clients.resolve(&member.client_url())?;
        let resp = self
            .admin
            .clients
            .call(
                &endpoint,
                "member list",
                Duration::from_secs(3),
                |mut c| async move { c.member_list().await },
            )
            .await?;
        Ok(OwnMembership {
            cluster_id: resp.header().map_or(0, |h| h.cluster_id()),
            members: resp
                .members()
                .iter()
                .map(|m| OwnMember {
                    id: m.id(),
                    name: m.name().to_string(),
                    learner: m.is_learner(),
                })
                .collect(),
        })
    }

    /// Member `index`'s directory (k3s's `<data-dir>/server/db`: its data
    /// dir `data` is k3s's `db/etcd`).
    pub fn member_dir(&self, index: usize) -> &Path {
        &self.members[index].dir
    }

    /// `k3s server --cluster-reset` on member `index`, then its next normal
    /// start (docs/k3s.md CR1, CR2): every member stops; `index` forces a new
    /// one-member cluster from its own data under a new name `<node>-<8 hex>`
    /// (same member id and cluster id, etcd's `--force-new-cluster`), then
    /// starts again normally, advertising its node address. The other
    /// members stay stopped: k3s will not start them until their database is
    /// moved away. Returns the new name.
    pub async fn cluster_reset(&mut self, index: usize) -> Result<String, HarnessError> {
        for i in 0..self.members.len() {
            if self.members[i].child.is_some() {
                self.stop(i).await?;
            }
        }
        let name = self.rename(index)?;
        let member = &mut self.members[index];
        member.learner = false;
        const FORCE: &str = "--force-new-cluster";
        member.extra_args.push(FORCE.to_string());
        self.spawn(index)?;
        self.wait_alone(index, &name).await?;
        self.stop(index).await?;
        self.members[index].extra_args.retain(|a| a != FORCE);
        self.spawn(index)?;
        self.wait_alone(index, &name).await?;
        // The harness's own handle knew three members: a lone one cannot
        // prove the others left it, so that handle rightly refuses it
        // (etcd::cluster::choose_cluster); start from what is there now, as
        // a person would after a reset.
        self.renew_admin()?;
        Ok(name)
    }

    /// Replace the harness's own engine handle with a fresh one (nothing
    /// proven yet), seeded as at start.
    fn renew_admin(&mut self) -> Result<(), HarnessError> {
        let seeds: Vec<String> = self
            .members
            .iter()
            .filter(|m| m.ip_in_serving_cert && !m.retired)
            .map(TestMember::client_url)
            .collect();
        self.admin = EtcdCluster::with_options(
            &seeds,
            self.client_tls(),
            self.transport.clone(),
            self.admin.timeouts(),
        )?;
        Ok(())
    }

    /// Set member `index`'s data dir aside as `etcd-backup-<unix time>`, as
    /// k3s does before it starts a member anew (docs/k3s.md T2).
    fn set_data_aside(&self, index: usize) -> Result<(), HarnessError> {
        let dir = &self.members[index].dir;
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let data = dir.join("data");
        if data.exists() {
            std::fs::rename(&data, dir.join(format!("etcd-backup-{stamp}")))
                .map_err(io("set the member's data dir aside"))?;
        }
        Ok(())
    }

    /// Give member `index` a new name `<node>-<8 hex>`, as k3s names a member
    /// it starts anew, with serving and peer certificates for it. Returns it.
    fn rename(&mut self, index: usize) -> Result<String, HarnessError> {
        let member = &self.members[index];
        let name = format!("{}-{}", member.node_name, random_suffix());
        let (ip, ip_in_cert) = (member.ip, member.ip_in_serving_cert);
        let tls = member.dir.join("tls");
        let serving = write_pair(
            &tls,
            "server-client",
            &self.pki.serving(&name, ip, ip_in_cert),
        )
        .map_err(io("write serving cert"))?;
        let peer = write_pair(&tls, "peer-server-client", &self.pki.peer(&name, ip))
            .map_err(io("write peer cert"))?;
        let member = &mut self.members[index];
        member.name = name.clone();
        member.serving = serving;
        member.peer = peer;
        Ok(name)
    }

    /// Wait until member `index` leads a cluster it is alone in.
    async fn wait_alone(&mut self, index: usize, name: &str) -> Result<(), HarnessError> {
        let deadline = Instant::now() + self.ready_timeout;
        loop {
            let last = match self.status(index).await {
                Ok(status) if status.leader != 0 && status.leader == self.members[index].id => {
                    return Ok(());
                }
                Ok(status) => format!("leader {:016x}", status.leader),
                Err(err) => err.to_string(),
            };
            if Instant::now() >= deadline {
                return Err(HarnessError::Timeout {
                    what: format!("{name} leading a cluster of its own"),
                    after: self.ready_timeout,
                    last,
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn wait_learner_started(&mut self, index: usize) -> Result<(), HarnessError> {
        let name = self.members[index].name.clone();
        let running: Vec<usize> = (0..self.members.len())
            .filter(|&i| self.members[i].child.is_some())
            .collect();
        // Once etcd accepted the member, its start is not bounded by the
        // ready timeout a test may shorten to have refused joins retried
        // sooner: a learner started beside a dead voter under load took more
        // than 15 s to answer on etcd 3.6.13 (which, unlike 3.5.1, accepts
        // the learner while a voter is down).
        self.poll(
            "learner started",
            self.ready_timeout.max(LEARNER_START_LIMIT),
            |snap| match snap.member_by_name(&name) {
                Some(m) if m.learner && m.status.is_some() => Ok(()),
                Some(_) => Err(format!("{name} not answering yet")),
                None => Err(format!("{name} has not started")),
            },
            &running,
        )
        .await?;
        Ok(())
    }

    /// `MemberAdd --learner` of `name` at `peer_url`, sent to a running voter
    /// and retried while etcd refuses it as transient. Returns the new id,
    /// the `--initial-cluster` the learner starts with, and the refusals.
    async fn member_add_learner(
        &mut self,
        name: &str,
        peer_url: &str,
    ) -> Result<(u64, String, u32), HarnessError> {
        // A learner promoted since it was added (by infra_sim, or a test's own
        // MemberPromote) is a voter now: refresh the cached flags before
        // choosing the member that receives MemberAdd, or a cluster whose
        // original members are all gone would find none.
        if let Ok(list) = self.admin.member_list(&[]).await {
            for m in &mut self.members {
                if let Some(listed) = list.members.iter().find(|l| l.name == m.name) {
                    m.learner = listed.learner;
                }
            }
        }
        let endpoint = self.running_voter_endpoint()?;
        let deadline = Instant::now() + self.ready_timeout;
        let mut refusals = 0;
        let added = loop {
            let urls = vec![peer_url.to_string()];
            let result = self
                .admin
                .clients
                .call(
                    &endpoint,
                    "member add",
                    Duration::from_secs(3),
                    |mut c| async move {
                        c.member_add(urls, Some(MemberAddOptions::new().with_is_learner()))
                            .await
                    },
                )
                .await;
            match result {
                Ok(resp) => break resp,
                Err(err) if err.is_transient() && Instant::now() < deadline => {
                    tracing::debug!(%err, "member add refused; retrying");
                    refusals += 1;
                    tokio::time::sleep(POLL).await;
                }
                Err(err) => return Err(err.into()),
            }
        };
        let id = added.member().map_or(0, |m| m.id());
        let initial_cluster = added
            .member_list()
            .iter()
            .map(|m| {
                let name = if m.id() == id {
                    name.to_string()
                } else {
                    m.name().to_string()
                };
                format!(
                    "{name}={}",
                    m.peer_urls().first().cloned().unwrap_or_default()
                )
            })
            .collect::<Vec<_>>()
            .join(",");
        Ok((id, initial_cluster, refusals))
    }

    /// SIGTERM a member and wait for it to exit (SIGKILL after 10 s).
    pub async fn stop(&mut self, index: usize) -> Result<(), HarnessError> {
        let member = self.member_mut(index)?;
        let _ = member.signal(Signal::SIGCONT);
        member.signal(Signal::SIGTERM)?;
        if !member.wait_exit(Duration::from_secs(10)).await {
            member.kill_now();
        }
        Ok(())
    }

    /// SIGKILL a member.
    pub fn kill(&mut self, index: usize) -> Result<(), HarnessError> {
        self.member_mut(index)?.kill_now();
        Ok(())
    }

    /// SIGSTOP a member: it stays connected but answers nothing.
    pub fn pause(&self, index: usize) -> Result<(), HarnessError> {
        self.members
            .get(index)
            .ok_or(HarnessError::NoMember(index))?
            .signal(Signal::SIGSTOP)
    }

    /// SIGCONT a paused member.
    pub fn resume(&self, index: usize) -> Result<(), HarnessError> {
        self.members
            .get(index)
            .ok_or(HarnessError::NoMember(index))?
            .signal(Signal::SIGCONT)
    }

    /// Partition member `index` from every peer: its raft traffic, both ways,
    /// goes nowhere (connections are held silent, not refused), while its
    /// client port keeps answering. Needs [`EtcdTestClusterBuilder::partitionable`].
    pub fn isolate(&self, index: usize) -> Result<(), HarnessError> {
        self.members
            .get(index)
            .ok_or(HarnessError::NoMember(index))?;
        self.proxies
            .as_ref()
            .ok_or(HarnessError::NotPartitionable)?
            .isolate(index);
        Ok(())
    }

    /// Undo [`Self::isolate`]: the held connections close and the member
    /// reconnects to its peers.
    pub fn heal(&self, index: usize) -> Result<(), HarnessError> {
        self.members
            .get(index)
            .ok_or(HarnessError::NoMember(index))?;
        self.proxies
            .as_ref()
            .ok_or(HarnessError::NotPartitionable)?
            .heal(index);
        Ok(())
    }

    /// Start a stopped member again on its data dir and wait until the cluster is ready.
    pub async fn restart(&mut self, index: usize) -> Result<(), HarnessError> {
        if self.member_mut(index)?.child.is_some() {
            self.stop(index).await?;
        }
        self.spawn(index)?;
        self.wait_ready().await?;
        Ok(())
    }

    /// Wait until a member's process has exited (e.g. after it was removed).
    pub async fn wait_exited(&mut self, index: usize, limit: Duration) -> Result<(), HarnessError> {
        let member = self.member_mut(index)?;
        if member.wait_exit(limit).await {
            Ok(())
        } else {
            Err(HarnessError::Timeout {
                what: format!("{} exiting", member.name),
                after: limit,
                last: "still running".into(),
            })
        }
    }

    pub fn members(&self) -> &[TestMember] {
        &self.members
    }

    pub fn member(&self, index: usize) -> &TestMember {
        &self.members[index]
    }

    /// Client URLs of all members, in index order (those of a cluster a
    /// snapshot restore replaced left out).
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .filter(|m| !m.retired)
            .map(TestMember::client_url)
            .collect()
    }

    pub fn node_names(&self) -> Vec<String> {
        self.members.iter().map(|m| m.node_name.clone()).collect()
    }

    pub fn member_names(&self) -> Vec<String> {
        self.members.iter().map(|m| m.name.clone()).collect()
    }

    /// Index of the member with this id.
    pub fn index_of(&self, id: u64) -> Option<usize> {
        self.members.iter().position(|m| m.id == id)
    }

    /// TLS with the harness client certificate (loaded from PEM).
    pub fn client_tls(&self) -> ClientTls {
        ClientTls::from_pem(
            ("server-ca.crt", self.pki.server_ca.pair.cert_pem.as_bytes()),
            ("client.crt", self.pki.client.cert_pem.as_bytes()),
            ("client.key", self.pki.client.key_pem.as_bytes()),
        )
        .expect("the generated PKI is consistent")
    }

    /// TLS minting client certificates from the etcd CA, as the controller does.
    pub fn minted_tls(&self) -> ClientTls {
        ClientTls::minted_from_ca(
            ("server-ca.crt", self.pki.server_ca.pair.cert_pem.as_bytes()),
            ("server-ca.key", self.pki.server_ca.pair.key_pem.as_bytes()),
            crate::etcd::tls::DEFAULT_MINTED_LIFETIME,
        )
        .expect("the generated CA can mint")
    }

    /// Write `key` = `value` through member `index` (the data a test needs:
    /// the engine itself never writes keys).
    pub async fn put(&self, index: usize, key: &str, value: Vec<u8>) -> Result<(), EtcdError> {
        let member = self.members.get(index).ok_or(EtcdError::MemberNotFound {
            member: format!("index {index}"),
        })?;
        let endpoint = self.admin.clients.resolve(&member.client_url())?;
        let key = key.to_string();
        self.admin
            .clients
            .call(
                &endpoint,
                "put",
                Duration::from_secs(10),
                |mut c| async move { c.put(key, value, None).await },
            )
            .await
            .map(|_| ())
    }

    /// The value of `key`, read through member `index` (linearizable).
    pub async fn get(&self, index: usize, key: &str) -> Result<Option<Vec<u8>>, EtcdError> {
        let member = self.members.get(index).ok_or(EtcdError::MemberNotFound {
            member: format!("index {index}"),
        })?;
        let endpoint = self.admin.clients.resolve(&member.client_url())?;
        let key = key.to_string();
        let response = self
            .admin
            .clients
            .call(
                &endpoint,
                "get",
                Duration::from_secs(10),
                |mut c| async move { c.get(key, None).await },
            )
            .await?;
        Ok(response.kvs().first().map(|kv| kv.value().to_vec()))
    }

    /// Member `index`'s own `Status` (its sizes, revision, leader).
    pub async fn status(&self, index: usize) -> Result<crate::etcd::MemberStatus, EtcdError> {
        let member = self.members.get(index).ok_or(EtcdError::MemberNotFound {
            member: format!("index {index}"),
        })?;
        let listed = crate::etcd::ListedMember {
            id: member.id,
            name: member.name.clone(),
            peer_urls: vec![member.peer_url()],
            client_urls: vec![member.client_url()],
            learner: member.learner,
        };
        self.admin
            .probe(&listed, Duration::from_secs(2))
            .await
            .map(|(_, status)| status)
    }

    /// Give every member `mib` MiB of live data and as much history (each
    /// of `data-0`... written twice, 1 MiB a value), compact the history,
    /// and write until the freed pages count as free: each member's file is
    /// then about half free pages, ready to be defragmented.
    pub async fn fill_fragmented(&self, mib: usize) -> Result<(), HarnessError> {
        for round in 0..2u8 {
            for i in 0..mib {
                self.put(0, &format!("data-{i}"), vec![b'a' + round; 1024 * 1024])
                    .await?;
            }
        }
        self.admin.compact().await?;
        // The pages a compaction frees count once the backend commits again.
        let limit = Duration::from_secs(30);
        let deadline = Instant::now() + limit;
        loop {
            self.put(0, "tick", b"x".to_vec()).await?;
            let mut last = None;
            for i in 0..self.members.len() {
                let s = self.status(i).await?;
                if s.db_size_in_use * 10 >= s.db_size * 7 {
                    last = Some(format!(
                        "{}: {} of {} bytes in use",
                        self.members[i].name, s.db_size_in_use, s.db_size
                    ));
                }
            }
            let Some(last) = last else {
                return Ok(());
            };
            if Instant::now() >= deadline {
                return Err(HarnessError::Timeout {
                    what: "compacted pages counted as free".into(),
                    after: limit,
                    last,
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Overwrite `keys` keys (`fill-0`...) round-robin with `value_bytes`
    /// of data through member `index` until etcd refuses a write with
    /// `database space exceeded` (a real `NOSPACE`); the number of writes it
    /// took. Most of what it writes is history: each overwrite keeps the
    /// value before it until a compaction.
    pub async fn fill_until_nospace(
        &self,
        index: usize,
        keys: usize,
        value_bytes: usize,
        max_writes: usize,
    ) -> Result<usize, HarnessError> {
        for i in 0..max_writes {
            let value = vec![b'a' + (i % 26) as u8; value_bytes];
            match self
                .put(index, &format!("fill-{}", i % keys.max(1)), value)
                .await
            {
                Ok(()) => {}
                Err(err) if err.to_string().contains("database space exceeded") => return Ok(i),
                Err(err) => return Err(err.into()),
            }
        }
        Err(HarnessError::Timeout {
            what: "NOSPACE".into(),
            after: Duration::ZERO,
            last: format!("{max_writes} writes of {value_bytes} bytes were all accepted"),
        })
    }

    /// A fresh engine handle on this cluster, seeded with every endpoint.
    pub fn connect(&self) -> EtcdCluster {
        EtcdCluster::with_options(
            &self.endpoints(),
            self.client_tls(),
            self.transport.clone(),
            Timeouts::default(),
        )
        .expect("valid endpoints")
    }

    /// How the harness reaches members: directly, or (with
    /// [`EtcdTestClusterBuilder::unreachable_client_addresses`]) at their hidden
    /// listening addresses, still verifying the advertised one.
    pub fn transport(&self) -> Transport {
        self.transport.clone()
    }

    pub fn ca_pem(&self) -> &str {
        &self.pki.server_ca.pair.cert_pem
    }

    pub fn ca_key_pem(&self) -> &str {
        &self.pki.server_ca.pair.key_pem
    }

    pub fn ca_cert_path(&self) -> &Path {
        &self.ca_file
    }

    pub fn ca_key_path(&self) -> &Path {
        &self.ca_key_file
    }

    pub fn client_cert_path(&self) -> &Path {
        &self.client_files.cert
    }

    pub fn client_key_path(&self) -> &Path {
        &self.client_files.key
    }

    /// `etcdctl` (the one beside the etcd binary the harness runs) with this
    /// cluster's client certificate and CA, aimed at `endpoints`: add the
    /// command and run it.
    pub fn etcdctl(&self, endpoints: &str) -> Result<Command, HarnessError> {
        let mut cmd = Command::new(EtcdBinary::find()?.etcdctl());
        cmd.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={endpoints}"))
            .arg(format!("--cacert={}", self.ca_cert_path().display()))
            .arg(format!("--cert={}", self.client_cert_path().display()))
            .arg(format!("--key={}", self.client_key_path().display()));
        Ok(cmd)
    }

    /// A scratch directory that lives as long as the cluster.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for EtcdTestCluster {
    fn drop(&mut self) {
        for member in &mut self.members {
            member.kill_now();
        }
    }
}

/// TCP proxies in front of every member's peer port, so that a test can cut a
/// member's raft traffic both ways while its client port stays reachable: a
/// real partition, as etcd sees one.
///
/// Every member advertises the proxy's address (`<ip>:2380`) and listens
/// behind it (`<ip>:2381`), so every peer connection, to a member or from it,
/// goes through the proxy of the member it is addressed to. Which member
/// dialed is read from the kernel: the dialing socket (local and remote address
/// swapped) in `/proc/net/tcp` gives an inode, found among the members' open
/// file descriptors. A cut connection is not closed but blackholed: both ends
/// are held and nothing is forwarded, as packets into a partition go
/// nowhere; once healed, held connections are closed and members reconnect.
/// The proxies run on a thread of their own, so a test's runtime (or a
/// blocking test) never stalls raft traffic.
mod peer_proxy {
    use std::collections::BTreeSet;
    use std::net::{SocketAddr, SocketAddrV4};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use tokio::net::{TcpListener, TcpStream};
    use tokio::sync::{oneshot, watch};

    type Pids = Arc<Mutex<Vec<Option<u32>>>>;

    pub(super) struct PeerProxies {
        handle: tokio::runtime::Handle,
        /// Indexes of the members cut off from every peer.
        isolated: watch::Sender<BTreeSet<usize>>,
        /// Process id of each member by index, to tell who dialed.
        pids: Pids,
        shutdown: Option<oneshot::Sender<()>>,
        thread: Option<std::thread::JoinHandle<()>>,
    }

    impl PeerProxies {
        pub(super) fn start() -> std::io::Result<Self> {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let handle = runtime.handle().clone();
            let (shutdown, stop) = oneshot::channel::<()>();
            let thread = std::thread::Builder::new()
                .name("etcd-peer-proxies".into())
                .spawn(move || {
                    runtime.block_on(async {
                        let _ = stop.await;
                    });
                    // Dropping the runtime ends every proxy task and closes its sockets.
                })?;
            Ok(Self {
                handle,
                isolated: watch::channel(BTreeSet::new()).0,
                pids: Pids::default(),
                shutdown: Some(shutdown),
                thread: Some(thread),
            })
        }

        /// Forward connections to `listen` (member `index`'s advertised peer
        /// address) to `backend` (where the member listens).
        pub(super) fn add(
            &self,
            index: usize,
            listen: SocketAddr,
            backend: SocketAddr,
        ) -> std::io::Result<()> {
            let listener = std::net::TcpListener::bind(listen)?;
            listener.set_nonblocking(true)?;
            let isolated = self.isolated.subscribe();
            let pids = self.pids.clone();
            self.handle.spawn(async move {
                let Ok(listener) = TcpListener::from_std(listener) else {
                    return;
                };
                loop {
                    match listener.accept().await {
                        Ok((stream, _)) => {
                            tokio::spawn(serve(
                                stream,
                                index,
                                backend,
                                pids.clone(),
                                isolated.clone(),
                            ));
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                    }
                }
            });
            Ok(())
        }

        pub(super) fn set_pid(&self, index: usize, pid: Option<u32>) {
            let mut pids = self.pids.lock().unwrap_or_else(|p| p.into_inner());
            if pids.len() <= index {
                pids.resize(index + 1, None);
            }
            pids[index] = pid;
        }

        pub(super) fn isolate(&self, index: usize) {
            self.isolated.send_modify(|set| {
                set.insert(index);
            });
        }

        pub(super) fn heal(&self, index: usize) {
            self.isolated.send_modify(|set| {
                set.remove(&index);
            });
        }
    }

    impl Drop for PeerProxies {
        fn drop(&mut self) {
            if let Some(shutdown) = self.shutdown.take() {
                let _ = shutdown.send(());
            }
            if let Some(thread) = self.thread.take() {
                let _ = thread.join();
            }
        }
    }

    /// One peer connection to member `receiver`: forwarded while neither end
    /// is isolated, held silent while one is, closed once healed.
    async fn serve(
        mut inbound: TcpStream,
        receiver: usize,
        backend: SocketAddr,
        pids: Pids,
        mut isolated: watch::Receiver<BTreeSet<usize>>,
    ) {
        let sender = sender_of(&inbound, &pids).await;
        let cut = move |set: &BTreeSet<usize>| {
            set.contains(&receiver) || sender.is_some_and(|s| set.contains(&s))
        };
        let mut outbound = None;
        if !cut(&isolated.borrow_and_update()) {
            let Ok(mut stream) = TcpStream::connect(backend).await else {
                return; // the member is down: the dialer sees the connection close
            };
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut inbound, &mut stream) => return,
                changed = isolated.wait_for(cut) => {
                    if changed.is_err() {
                        return;
                    }
                }
            }
            outbound = Some(stream);
        }
        let _ = isolated.wait_for(|set| !cut(set)).await;
        drop((inbound, outbound));
    }

    /// Which member dialed `stream`, by the process owning the other end.
    async fn sender_of(stream: &TcpStream, pids: &Pids) -> Option<usize> {
        let (Ok(SocketAddr::V4(remote)), Ok(SocketAddr::V4(local))) =
            (stream.peer_addr(), stream.local_addr())
        else {
            return None;
        };
        // The dialer's socket is established before ours is accepted; a few
        // tries cover a table read racing with it.
        for _ in 0..5 {
            if let Some(inode) = socket_inode(remote, local) {
                let link = format!("socket:[{inode}]");
                let pids = pids.lock().unwrap_or_else(|p| p.into_inner()).clone();
                if let Some(index) = pids
                    .iter()
                    .position(|pid| pid.is_some_and(|pid| owns_socket(pid, &link)))
                {
                    return Some(index);
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tracing::debug!(%remote, %local, "peer proxy: dialing member not identified");
        None
    }

    /// The inode of the IPv4 socket bound to `local` and connected to `remote`.
    fn socket_inode(local: SocketAddrV4, remote: SocketAddrV4) -> Option<u64> {
        let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
        let (local, remote) = (proc_addr(local), proc_addr(remote));
        table.lines().skip(1).find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() > 9 && fields[1] == local && fields[2] == remote {
                fields[9].parse().ok().filter(|inode| *inode != 0)
            } else {
                None
            }
        })
    }

    /// An address as `/proc/net/tcp` prints it: the address's bytes as a
    /// native-endian word, then the port, both in upper-case hex.
    fn proc_addr(addr: SocketAddrV4) -> String {
        format!(
            "{:08X}:{:04X}",
            u32::from_ne_bytes(addr.ip().octets()),
            addr.port()
        )
    }

    fn owns_socket(pid: u32, link: &str) -> bool {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            return false;
        };
        fds.flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target.as_os_str() == link))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn addresses_are_written_as_the_kernel_does() {
            let addr: SocketAddrV4 = "127.0.0.1:2380".parse().unwrap();
            if cfg!(target_endian = "little") {
                assert_eq!(proc_addr(addr), "0100007F:094C");
            }
        }

        #[test]
        fn the_dialing_process_is_found_by_its_socket() {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (accepted, _) = listener.accept().unwrap();
            let (SocketAddr::V4(remote), SocketAddr::V4(local)) = (
                accepted.peer_addr().unwrap(),
                accepted.local_addr().unwrap(),
            ) else {
                panic!("IPv4");
            };
            let inode = socket_inode(remote, local).expect("dialer's socket listed");
            assert!(owns_socket(
                std::process::id(),
                &format!("socket:[{inode}]")
            ));
            drop(client);
        }
    }
}
