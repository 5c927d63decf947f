//! Leader election among the controller's replicas: of several (a rolling
//! update of the Deployment, `clusterctl move`) exactly one acts. (Not etcd's
//! leader: moving that one is [`super::etcd_leader_move`].)
//!
//! The Lease (`coordination.k8s.io/v1`) is acquired and renewed by
//! [kube-lease-manager](https://docs.rs/kube-lease-manager). On top of it, this
//! module keeps its own, stricter view of whether this process may act: the
//! [`LeaderGuard`]. The guard is valid only until the **renew deadline**
//! (`renewTime` of the last renewal we made, plus `renew_deadline`), which is
//! strictly before another replica may take the Lease (`renewTime` plus
//! `lease_duration`, on its clock). The guard never trusts a renewal it has
//! not seen land in the Lease with our identity as holder.
//!
//! What consults the guard:
//! - [`run_elected`] starts the kube-runtime Controller when the guard becomes
//!   valid and drops it (cancelling every in-flight reconcile at its next await
//!   point) the moment the guard runs out;
//! - every reconcile checks it on entry and races it while running
//!   ([`super::run`]);
//! - every write request of the controller's management client is refused
//!   while it is invalid ([`fenced_client`]).
//!
//! So no reconcile, and no write to the management cluster, starts after the
//! renew deadline; the margin `lease_duration - renew_deadline` covers the
//! clock skew between replicas and the latency of a request already sent.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder, LeaseParams};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::context::Context;

pub mod guard;
pub use guard::LeaderGuard;

/// How the replicas elect their leader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElectionConfig {
    /// The Lease's name and namespace.
    pub lease_name: String,
    pub namespace: String,
    /// This replica's holder identity (the Pod's name, or hostname and pid).
    pub identity: String,
    /// How long a Lease stays ours after its last renewal, for the others
    /// (`spec.leaseDurationSeconds`); whole seconds.
    pub lease_duration: Duration,
    /// How long after its last renewal this replica stops acting; shorter than
    /// `lease_duration`.
    pub renew_deadline: Duration,
}

impl ElectionConfig {
    /// Checks the timings: whole seconds for the lease (the Lease API counts in
    /// seconds), a renew deadline of at least 2 s and shorter than the lease.
    pub fn new(
        lease_name: impl Into<String>,
        namespace: impl Into<String>,
        identity: impl Into<String>,
        lease_duration: Duration,
        renew_deadline: Duration,
    ) -> Result<Self, String> {
        if lease_duration.subsec_nanos() != 0 || lease_duration < Duration::from_secs(3) {
            return Err(format!(
                "--leader-election-lease-duration {lease_duration:?}: must be whole seconds, at least 3s"
            ));
        }
        if renew_deadline < Duration::from_secs(2) || renew_deadline >= lease_duration {
            return Err(format!(
                "--leader-election-renew-deadline {renew_deadline:?}: must be at least 2s and shorter than the lease duration ({lease_duration:?})"
            ));
        }
        let config = ElectionConfig {
            lease_name: lease_name.into(),
            namespace: namespace.into(),
            identity: identity.into(),
            lease_duration,
            renew_deadline,
        };
        if config.lease_name.is_empty() || config.namespace.is_empty() || config.identity.is_empty()
        {
            return Err("leader election: empty lease name, namespace or identity".into());
        }
        Ok(config)
    }

    /// How long after a renewal the next one is made: half the renew deadline
    /// (whole seconds, at least 1), so one failed renewal can still be retried
    /// before the deadline.
    pub fn renew_interval(&self) -> Duration {
        Duration::from_secs((self.renew_deadline.as_secs() / 2).max(1))
    }

    /// kube-lease-manager's `grace`: it renews `grace` seconds before the
    /// Lease would expire, i.e. `renew_interval` after the last renewal.
    fn grace_secs(&self) -> u64 {
        self.lease_duration.as_secs() - self.renew_interval().as_secs()
    }

    /// How often the leader reads its Lease back to move the guard's deadline.
    fn poll_interval(&self) -> Duration {
        (self.renew_deadline / 5).clamp(Duration::from_millis(100), Duration::from_secs(2))
    }

    fn lease(&self) -> String {
        format!("{}/{}", self.namespace, self.lease_name)
    }
}

/// This replica's default identity: `$POD_NAME`, else `<hostname>_<pid>`.
pub fn default_identity() -> String {
    if let Ok(name) = std::env::var("POD_NAME")
        && !name.is_empty()
    {
        return name;
    }
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    format!("{host}_{}", std::process::id())
}

/// The management client of a controller that may only write while `guard`
/// leads: every request other than GET is refused (never sent) once the guard
/// has run out. Reads, watches included, go through.
pub fn fenced_client(config: kube::Config, guard: LeaderGuard) -> Result<Client, kube::Error> {
    let fence = tower::filter::FilterLayer::new(
        move |request: http::Request<kube::client::Body>| -> Result<_, NotLeading> {
            if request.method() == http::Method::GET || guard.is_leading() {
                Ok(request)
            } else {
                Err(NotLeading {
                    method: request.method().to_string(),
                    path: request.uri().path().to_string(),
                })
            }
        },
    );
    Ok(kube::client::ClientBuilder::try_from(config)?
        .with_layer(&fence)
        .build())
}

/// A write refused because this process does not hold a valid Lease.
#[derive(Debug, thiserror::Error)]
#[error("not the leader: {method} {path} refused without a valid lease")]
pub struct NotLeading {
    pub method: String,
    pub path: String,
}

/// What the election says about this replica: for `/readyz`, the `leader`
/// metric and the logs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leadership {
    /// This process holds the Lease and may act.
    pub leading: bool,
    pub identity: String,
    /// `namespace/name` of the Lease.
    pub lease: String,
    /// The holder last read from the Lease.
    pub holder: Option<String>,
    /// Why the Lease cannot be used (API or RBAC error), if it cannot.
    pub error: Option<String>,
}

impl fmt::Display for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.leading {
            write!(f, "leader: {} holds Lease {}", self.identity, self.lease)
        } else if let Some(error) = &self.error {
            write!(
                f,
                "standby: {} cannot use Lease {}: {error}",
                self.identity, self.lease
            )
        } else {
            write!(
                f,
                "standby: {} waits; Lease {} held by {}",
                self.identity,
                self.lease,
                self.holder.as_deref().unwrap_or("nobody")
            )
        }
    }
}

/// A running election: acquires and renews the Lease in the background and
/// moves the guard.
pub struct Election {
    guard: LeaderGuard,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Election {
    /// Starts electing with `client` (a client without fence: the Lease itself
    /// must be written while we do not lead). `report` hears every change of
    /// [`Leadership`].
    pub fn start(
        client: Client,
        config: ElectionConfig,
        report: impl Fn(&Leadership) + Send + Sync + 'static,
    ) -> Election {
        let (guard, tx) = LeaderGuard::elected();
        let stop = CancellationToken::new();
        let task = tokio::spawn(elect(client, config, tx, Arc::new(report), stop.clone()));
        Election { guard, stop, task }
    }

    pub fn guard(&self) -> LeaderGuard {
        self.guard.clone()
    }

    /// Stops acting at once and releases the Lease so another replica can take
    /// it without waiting for it to expire. Call after the controller stopped.
    /// Returns within `RELEASE_TIMEOUT` (500 ms) and a little, whatever the election
    /// was doing (building its manager, reading the Lease, acquiring it).
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

type Report = Arc<dyn Fn(&Leadership) + Send + Sync>;

/// How long a stopping replica waits for its Lease to be released (a patch
/// and a read); past it the process goes on stopping and the Lease expires by
/// itself, `lease_duration` after its last renewal.
const RELEASE_TIMEOUT: Duration = Duration::from_millis(500);

async fn build_manager(client: Client, config: &ElectionConfig) -> Result<LeaseManager, String> {
    let params = LeaseParams::new(
        config.identity.clone(),
        config.lease_duration.as_secs(),
        config.grace_secs(),
    )
    .with_field_manager(field_manager(&config.identity));
    LeaseManagerBuilder::new(client, config.lease_name.clone())
        .with_namespace(config.namespace.clone())
        .with_parameters(params)
        .build()
        .await
        .map_err(|e| e.to_string())
}

/// A field manager name within the API's 128 characters.
fn field_manager(identity: &str) -> String {
    let mut name = format!("k3s-control-plane-{identity}");
    if name.len() > 128 {
        let mut end = 128;
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        name.truncate(end);
    }
    name
}

/// The local instant at which the wall-clock time `at` was (or now, if `at`
/// lies in the future: our clock stepped back).
fn instant_of(at: SystemTime) -> Instant {
    let age = SystemTime::now()
        .duration_since(at)
        .unwrap_or(Duration::ZERO);
    let now = Instant::now();
    now.checked_sub(age).unwrap_or(now)
}

async fn elect(
    client: Client,
    config: ElectionConfig,
    deadline: watch::Sender<Option<Instant>>,
    report: Report,
    stop: CancellationToken,
) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), &config.namespace);
    let mut state = Leadership {
        leading: false,
        identity: config.identity.clone(),
        lease: config.lease(),
        holder: None,
        error: None,
    };
    let mut reported: Option<Leadership> = None;
    let mut say = |state: &Leadership| {
        if reported.as_ref() == Some(state) {
            return;
        }
        let was_leading = reported.as_ref().is_some_and(|r| r.leading);
        if state.leading && !was_leading {
            info!(lease = %state.lease, identity = %state.identity, "acquired the leader lease: acting");
        } else if !state.leading && was_leading {
            warn!(lease = %state.lease, identity = %state.identity, "no longer leading: stopped acting");
        } else if let Some(error) = &state.error {
            warn!(lease = %state.lease, %error, "the leader lease cannot be used");
        } else if !state.leading {
            info!(lease = %state.lease, holder = state.holder.as_deref().unwrap_or("nobody"), "standby");
        }
        report(state);
        reported = Some(state.clone());
    };
    say(&state);
    let retry = Duration::from_secs(2);
    loop {
        // Building reads (or creates) the Lease: a stop does not wait for it.
        let built = tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            built = build_manager(client.clone(), &config) => built,
        };
        let manager = match built {
            Ok(manager) => manager,
            Err(error) => {
                deadline.send_replace(None);
                state.leading = false;
                state.error = Some(error);
                say(&state);
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(retry) => continue,
                }
            }
        };
        state.error = None;
        let (mut channel, task) = manager.watch().await;
        let mut manager_leads = *channel.borrow_and_update();
        let mut next_read = Instant::now();
        loop {
            let wake = match *deadline.borrow() {
                Some(d) if Instant::now() < d => next_read.min(d),
                _ => next_read,
            };
            tokio::select! {
                biased;
                _ = stop.cancelled() => {
                    // Stop acting first, then release: closing the channel
                    // makes the manager release the Lease and end.
                    deadline.send_replace(None);
                    drop(channel);
                    match tokio::time::timeout(RELEASE_TIMEOUT, task).await {
                        Ok(Ok(Ok(_))) => info!(lease = %config.lease(), "released the leader lease"),
                        Ok(Ok(Err(err))) => warn!(lease = %config.lease(), %err, "could not release the leader lease; it expires by itself"),
                        _ => warn!(lease = %config.lease(), "releasing the leader lease did not finish; it expires by itself"),
                    }
                    state.leading = false;
                    say(&state);
                    return;
                }
                changed = channel.changed() => {
                    if changed.is_err() {
                        // The manager ended on its own: start anew.
                        deadline.send_replace(None);
                        let error = match task.await {
                            Ok(Err(err)) => err.to_string(),
                            Ok(Ok(_)) => "the lease manager stopped".into(),
                            Err(err) => err.to_string(),
                        };
                        state.leading = false;
                        state.error = Some(error);
                        say(&state);
                        tokio::select! {
                            _ = stop.cancelled() => return,
                            _ = tokio::time::sleep(retry) => break,
                        }
                    }
                    manager_leads = *channel.borrow_and_update();
                    if !manager_leads {
                        deadline.send_replace(None);
                    }
                    next_read = Instant::now();
                }
                _ = tokio::time::sleep_until(wake.into()) => {}
            }
            if Instant::now() >= next_read {
                next_read = Instant::now()
                    + if manager_leads {
                        config.poll_interval()
                    } else {
                        config.renew_interval()
                    };
                let read = tokio::select! {
                    biased;
                    // Back to the top of the loop, which stops.
                    _ = stop.cancelled() => continue,
                    read = tokio::time::timeout(
                        config.poll_interval().max(Duration::from_secs(1)),
                        leases.get_opt(&config.lease_name),
                    ) => read,
                };
                match read {
                    Ok(Ok(lease)) => {
                        let spec = lease.and_then(|l| l.spec).unwrap_or_default();
                        let before =
                            std::mem::replace(&mut state.holder, spec.holder_identity.clone());
                        // Another replica released the Lease (it was stopped):
                        // the manager would only look again when the old
                        // Lease would have expired; start it anew to take
                        // the Lease now.
                        if !manager_leads
                            && state.holder.is_none()
                            && before.is_some_and(|h| h != config.identity)
                        {
                            info!(lease = %config.lease(), "the leader released the lease: trying to take it now");
                            drop(channel);
                            tokio::select! {
                                biased;
                                _ = stop.cancelled() => return,
                                _ = tokio::time::timeout(config.renew_deadline, task) => break,
                            }
                        }
                        let ours = state.holder.as_deref() == Some(config.identity.as_str());
                        match (manager_leads && ours, spec.renew_time) {
                            (true, Some(renewed)) => {
                                let until = instant_of(renewed.0.into()) + config.renew_deadline;
                                deadline.send_if_modified(|d| {
                                    let changed = *d != Some(until);
                                    *d = Some(until);
                                    changed
                                });
                            }
                            _ => {
                                deadline.send_if_modified(|d| d.take().is_some());
                            }
                        }
                    }
                    // The Lease could not be read: keep the deadline, it runs
                    // out by itself if no renewal is seen in time.
                    Ok(Err(err)) => tracing::debug!(%err, "reading the leader lease"),
                    Err(_) => tracing::debug!("reading the leader lease timed out"),
                }
            }
            state.leading = deadline.borrow().is_some_and(|d| Instant::now() < d);
            say(&state);
        }
    }
}

/// Runs the controller whenever this process leads, until `shutdown`: started
/// when the guard becomes valid, dropped the moment it runs out (in-flight
/// reconciles are cancelled at their next await point, as a crash would stop
/// them), started again when the Lease comes back. On `shutdown` the
/// controller stops gracefully (in-flight reconciles finish, still only while
/// the guard holds).
pub async fn run_elected(ctx: Arc<Context>, shutdown: CancellationToken) {
    let guard = ctx.leader.clone();
    loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => return,
            _ = guard.acquired() => {}
        }
        info!("leading: starting the controller");
        let controller = super::run(ctx.clone(), shutdown.clone().cancelled_owned());
        tokio::select! {
            biased;
            _ = guard.lost() => {
                warn!("the lease was lost or not renewed before the renew deadline: controller stopped, in-flight reconciles cancelled");
            }
            _ = controller => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(duration: u64, deadline: u64) -> Result<ElectionConfig, String> {
        ElectionConfig::new(
            "l",
            "ns",
            "me",
            Duration::from_secs(duration),
            Duration::from_secs(deadline),
        )
    }

    #[test]
    fn timings_are_checked_and_renewal_comes_at_half_the_deadline() {
        let c = config(15, 10).unwrap();
        assert_eq!(c.renew_interval(), Duration::from_secs(5));
        assert_eq!(c.grace_secs(), 10);
        assert_eq!(c.poll_interval(), Duration::from_secs(2));
        let c = config(3, 2).unwrap();
        assert_eq!(c.renew_interval(), Duration::from_secs(1));
        assert_eq!(c.grace_secs(), 2);
        assert!(config(10, 10).is_err());
        assert!(config(10, 1).is_err());
        assert!(config(2, 1).is_err());
        assert!(
            ElectionConfig::new(
                "l",
                "ns",
                "me",
                Duration::from_millis(3500),
                Duration::from_secs(2)
            )
            .is_err()
        );
    }

    #[test]
    fn field_manager_fits_the_api_limit() {
        assert_eq!(field_manager("pod-0"), "k3s-control-plane-pod-0");
        let long = field_manager(&"é".repeat(100));
        assert!(long.len() <= 128 && long.len() >= 127, "{}", long.len());
    }

    #[tokio::test]
    async fn default_guard_always_leads() {
        let guard = LeaderGuard::always();
        assert!(guard.is_leading());
        assert!(!guard.is_elected());
        guard.acquired().await;
        let lost = tokio::time::timeout(Duration::from_millis(50), guard.lost()).await;
        assert!(lost.is_err(), "the default guard is never lost");
    }

    #[tokio::test]
    async fn guard_runs_out_at_its_deadline_and_follows_renewals() {
        let (guard, tx) = LeaderGuard::elected();
        assert!(!guard.is_leading());
        // lost() is immediate while not leading.
        tokio::time::timeout(Duration::from_millis(50), guard.lost())
            .await
            .unwrap();
        let start = Instant::now();
        tx.send_replace(Some(start + Duration::from_millis(200)));
        guard.acquired().await;
        assert!(guard.is_leading());
        // A renewal moves the deadline: lost() follows it.
        let renew = tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            renew.send_replace(Some(start + Duration::from_millis(400)));
        });
        guard.lost().await;
        let took = start.elapsed();
        assert!(!guard.is_leading());
        assert!(
            took >= Duration::from_millis(400) && took < Duration::from_millis(1000),
            "{took:?}"
        );
        // Withdrawn at once.
        tx.send_replace(Some(Instant::now() + Duration::from_secs(60)));
        assert!(guard.is_leading());
        tx.send_replace(None);
        assert!(!guard.is_leading());
    }

    /// A context whose management API is unreachable: any request it made
    /// would fail with a connection error.
    fn unreachable_context(guard: LeaderGuard) -> Arc<Context> {
        let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        let client = fenced_client(config, guard.clone()).unwrap();
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = super::super::metrics::Metrics::register(&mut registry);
        Context::new_with_leader(
            client,
            metrics,
            super::super::etcd_pool::EtcdPool::default(),
            super::super::Settings::default(),
            guard,
        )
    }

    #[tokio::test]
    async fn a_reconcile_without_a_valid_lease_returns_without_a_request() {
        let (guard, tx) = LeaderGuard::elected();
        // Held once, run out since.
        tx.send_replace(Some(Instant::now() - Duration::from_millis(1)));
        let ctx = unreachable_context(guard);
        let kcp: crate::api::KThreesControlPlane = serde_json::from_value(serde_json::json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta3", "kind": "KThreesControlPlane",
            "metadata": {"name": "cp", "namespace": "default"},
            "spec": {"replicas": 1, "version": "v1.30.2+k3s2",
                     "machineTemplate": {"spec": {"infrastructureRef": {"kind": "DockerMachineTemplate", "name": "t"}}}}
        }))
        .unwrap();
        let requeue = super::super::guarded_reconcile(Arc::new(kcp), ctx.clone())
            .await
            .unwrap();
        assert_eq!(requeue, kube::runtime::controller::Action::await_change());
        assert_eq!(ctx.metrics.reconciles.get(), 0, "no reconcile started");
    }

    #[tokio::test]
    async fn the_fenced_client_refuses_writes_but_not_reads_without_a_lease() {
        let (guard, tx) = LeaderGuard::elected();
        let ctx = unreachable_context(guard);
        let secrets: Api<k8s_openapi::api::core::v1::Secret> =
            Api::namespaced(ctx.client.clone(), "default");
        let write = secrets
            .create(&Default::default(), &Default::default())
            .await
            .unwrap_err();
        assert!(write.to_string().contains("not the leader"), "{write}");
        // A read is sent (and fails: nothing listens there).
        let read = secrets.get("s").await.unwrap_err();
        assert!(!read.to_string().contains("not the leader"), "{read}");
        // Leading: the write is sent too.
        tx.send_replace(Some(Instant::now() + Duration::from_secs(60)));
        let write = secrets
            .create(&Default::default(), &Default::default())
            .await
            .unwrap_err();
        assert!(!write.to_string().contains("not the leader"), "{write}");
    }

    #[tokio::test]
    async fn stop_returns_at_once_while_the_api_does_not_answer() {
        // An API server that accepts connections and never answers: the
        // election hangs in its first request (building the lease manager).
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (accepted, mut first) = tokio::sync::mpsc::channel(1);
        let _silent = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
                let _ = accepted.try_send(());
            }
        });
        let client =
            Client::try_from(kube::Config::new(format!("http://{addr}").parse().unwrap())).unwrap();
        let election = Election::start(client, config(15, 10).unwrap(), |_| {});
        first.recv().await.unwrap();
        let stopping = Instant::now();
        tokio::time::timeout(Duration::from_secs(1), election.stop())
            .await
            .expect("the election stops while its request is unanswered");
        assert!(
            stopping.elapsed() < Duration::from_millis(100),
            "{:?}",
            stopping.elapsed()
        );
    }

    #[test]
    fn instants_of_wall_clock_times() {
        let now = Instant::now();
        let ago = instant_of(SystemTime::now() - Duration::from_secs(2));
        let d = now.saturating_duration_since(ago);
        assert!(d >= Duration::from_millis(1900) && d <= Duration::from_millis(2100));
        // A time in the future (clock stepped back) counts as now.
        let future = instant_of(SystemTime::now() + Duration::from_secs(5));
        assert!(future >= now);
    }
}
