//! `k3s-control-plane run`: the controller against a management cluster.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::controller::etcd_pool::EtcdPool;
use crate::controller::http::Probes;
use crate::controller::metrics::Metrics;
use crate::controller::replica_election::{self, Election, ElectionConfig};
use crate::controller::{self, Context, Settings};

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Kubeconfig of the management cluster (default: in-cluster config, then
    /// $KUBECONFIG, then ~/.kube/config).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Where /healthz, /readyz and /metrics are served.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub probe_address: SocketAddr,
    /// Port of the conversion webhook (HTTPS, `POST /convert`) that serves
    /// cluster-api-k3s's v1beta1 KThreesControlPlane; `0` turns it off.
    #[arg(long, default_value_t = crate::webhook::DEFAULT_PORT)]
    pub webhook_port: u16,
    /// Directory with the webhook's `tls.crt` and `tls.key` (the Secret
    /// cert-manager issues, mounted); reloaded when renewed. Without them the
    /// webhook stays off (v1beta2 needs no conversion) and a warning says so.
    #[arg(long, default_value = crate::webhook::DEFAULT_CERT_DIR)]
    pub webhook_cert_dir: PathBuf,
    /// Log as JSON lines.
    #[arg(long)]
    pub log_json: bool,
    /// Elect one leader among the replicas with a coordination.k8s.io Lease;
    /// only the leader reconciles. `--leader-elect=false` acts without a Lease
    /// (one replica only).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set,
          num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub leader_elect: bool,
    /// Name of the Lease.
    #[arg(long, default_value = "k3s-control-plane")]
    pub leader_election_lease_name: String,
    /// Namespace of the Lease (default: the Pod's, from $POD_NAMESPACE, else `default`).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub leader_election_namespace: String,
    /// How long the Lease stays the holder's after its last renewal; another
    /// replica takes over after that (whole seconds, e.g. 15s).
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub leader_election_lease_duration: Duration,
    /// How long after its last successful renewal the leader stops acting;
    /// shorter than the lease duration (the difference covers clock skew).
    /// Renewals come every half of it.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub leader_election_renew_deadline: Duration,
    /// How etcd members are reached: `direct` (https://<node InternalIP>:2379),
    /// `port-forward` (through the workload API server to the `etcd-proxy` pod,
    /// kube-system `app=etcd-proxy`, on each member's node) or `auto` (direct,
    /// port-forward when direct cannot connect; remembered per cluster). A
    /// KThreesControlPlane's `controlplane.cluster.x-k8s.io/etcd-transport`
    /// annotation overrides it. TLS is verified against the node address either way.
    #[arg(long, value_enum, default_value = "auto")]
    pub etcd_transport: crate::controller::etcd_pool::TransportMode,
    /// Reconcile only KThreesControlPlanes (and Clusters) labelled
    /// `cluster.x-k8s.io/watch-filter=<value>`, the CAPI sharding convention.
    /// Empty: no filter (what the components' default placeholder gives).
    #[arg(long)]
    pub watch_filter: Option<String>,
    /// Control planes reconciled at once (each one is only ever reconciled
    /// by one worker at a time).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrency: u16,
    /// How long the cluster Secrets one reconcile read serve the next ones
    /// (`0`: every reconcile reads them). Secrets are not watched (that would
    /// need list/watch on Secrets); a reconcile about to act reads them again
    /// whatever this says, so this only bounds how late a changed or deleted
    /// Secret shows in the status of a control plane that is otherwise idle.
    /// With `--watch-filter`, also how long a cluster's Machines are served
    /// from the shard's cache before they are listed once more.
    #[arg(long, default_value = "30m", value_parser = parse_duration)]
    pub secret_refresh: Duration,
    /// Removal steps (of a remediation or scale-down) one reconcile takes
    /// back to back after its first. Each is decided on a fresh read once the
    /// one before it has landed; the object goes back to the queue after this
    /// many, at the first step that has to wait, or when that removal is
    /// over. `0`: one step per reconcile.
    #[arg(long, default_value_t = 8)]
    pub max_chained_steps: u32,
    /// The raft election timeout of the workload clusters' etcd (k3s starts
    /// etcd with 5s). A leadership move waits up to two of them, and a move
    /// or a removal is confirmed for up to three.
    #[arg(long, default_value = "5s", value_parser = parse_election_timeout)]
    pub etcd_election_timeout: Duration,
    /// Log level of the controller's own messages: error, warn, info, debug
    /// or trace. Client libraries stay at warn; RUST_LOG, when set, overrides both.
    #[arg(long, default_value = "info", value_parser = ["error", "warn", "info", "debug", "trace"])]
    pub log_level: String,
    /// Watch only this namespace (default: all).
    #[arg(long)]
    pub namespace: Option<String>,
    #[command(flatten)]
    pub etcd_space: EtcdSpaceArgs,
    /// How long one defragmentation may take (about the time to copy a
    /// member's live data).
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub etcd_defrag_timeout: Duration,
    /// How long the client certificates minted from each workload cluster's
    /// etcd CA live. Each is renewed with a third to a half of its life left
    /// (a key generation and new member connections per cluster): shorter
    /// limits what a leaked key is worth, longer renews less often. 5m to
    /// 1440m.
    #[arg(long, default_value = "60m", value_parser = parse_client_cert_lifetime)]
    pub etcd_client_cert_lifetime: Duration,
}

/// etcd's space: `run` acts on it, `inspect` shows what `run` would do.
#[derive(Debug, Clone, clap::Args)]
pub struct EtcdSpaceArgs {
    /// Keep the workload clusters' etcd below its quota: defragment members
    /// one at a time when fragmented and big, and recover from NOSPACE
    /// (compact when the in-use size is at the quota, defragment, disarm).
    /// Off by default: sizes are reported (metrics, inspect) either way.
    #[arg(long)]
    pub etcd_space_care: bool,
    /// With --etcd-space-care: defragment a member when at least this
    /// fraction of its file is free (1 - dbSizeInUse/dbSize)...
    #[arg(long, default_value_t = 0.5, value_parser = parse_fraction)]
    pub etcd_defrag_fragmentation: f64,
    /// ...and its file is at least this fraction of its quota.
    #[arg(long, default_value_t = 0.5, value_parser = parse_fraction)]
    pub etcd_defrag_quota_fraction: f64,
    /// The room below its quota a member must have for NOSPACE to be
    /// disarmed, as a fraction of the quota.
    #[arg(long, default_value_t = 0.1, value_parser = parse_fraction)]
    pub etcd_space_headroom: f64,
    /// The workload clusters' etcd backend quota, for members that do not
    /// report theirs (etcd < 3.6): bytes, or with Ki, Mi, Gi. k3s sets none,
    /// so etcd's 2Gi applies; a control plane's annotation
    /// controlplane.cluster.x-k8s.io/etcd-quota-backend-bytes overrides it.
    #[arg(long, default_value = "2Gi", value_parser = crate::space_rule::parse_quota)]
    pub etcd_quota_backend_bytes: u64,
}

impl EtcdSpaceArgs {
    pub fn settings(&self) -> crate::space_rule::SpaceSettings {
        crate::space_rule::SpaceSettings {
            care: self.etcd_space_care,
            thresholds: crate::space_rule::Thresholds {
                fragmentation: self.etcd_defrag_fragmentation,
                quota_fraction: self.etcd_defrag_quota_fraction,
                headroom: self.etcd_space_headroom,
            },
            default_quota: self.etcd_quota_backend_bytes,
        }
    }
}

/// A fraction between 0 and 1, e.g. `0.5`.
pub fn parse_fraction(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!(
            "{text:?} is not a fraction between 0 and 1 (e.g. 0.5)"
        )),
    }
}

/// `15s`, `1500ms`, `2m` or plain seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?}: expected a duration such as 15s, 1500ms or 2m"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        _ => return Err(format!("{text:?}: unit must be ms, s or m")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{text:?}: {e}"))
}

/// `--etcd-client-cert-lifetime`: long enough that a renewal is not every
/// few passes, short enough to be short-lived.
pub fn parse_client_cert_lifetime(text: &str) -> Result<Duration, String> {
    let lifetime = parse_duration(text)?;
    let (shortest, longest) = (Duration::from_secs(5 * 60), Duration::from_secs(24 * 3600));
    if lifetime < shortest || lifetime > longest {
        return Err(format!(
            "{text:?}: a client certificate lifetime must be between 5m and 1440m"
        ));
    }
    Ok(lifetime)
}

/// The longest election timeout etcd accepts (`maxElectionMs`, 50000 ms, in
/// etcd's `server/embed/config.go`): a longer one cannot be the workload
/// cluster's, and multiples of it must not overflow.
const MAX_ELECTION_TIMEOUT: Duration = Duration::from_secs(50);

/// `--etcd-election-timeout`: a duration etcd could run with.
pub fn parse_election_timeout(text: &str) -> Result<Duration, String> {
    let timeout = parse_duration(text)?;
    if timeout.is_zero() || timeout > MAX_ELECTION_TIMEOUT {
        return Err(format!(
            "{text:?}: etcd's election timeout is more than 0 and at most 50s (etcd refuses more than 50000ms)"
        ));
    }
    Ok(timeout)
}

/// A kube client from `--kubeconfig`, or the default chain.
pub async fn management_client(kubeconfig: Option<&PathBuf>) -> Result<kube::Client, String> {
    let config = management_config(kubeconfig).await?;
    kube::Client::try_from(config).map_err(|e| format!("management cluster client: {e}"))
}

/// The management cluster's configuration from `--kubeconfig`, or the default chain.
pub async fn management_config(kubeconfig: Option<&PathBuf>) -> Result<kube::Config, String> {
    Ok(match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| format!("--kubeconfig {}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .map_err(|e| format!("--kubeconfig {}: {e}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| format!("no management cluster configuration: {e}"))?,
    })
}

pub fn init_logging(json: bool) {
    init_logging_at(json, "info")
}

/// Logging with the controller's messages at `level` (RUST_LOG overrides).
pub fn init_logging_at(json: bool, level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| log_filter(level).into());
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// The filter for `--log-level`: ours at `level`, the client libraries at warn.
pub fn log_filter(level: &str) -> String {
    format!("{level},kube=warn,tower=warn,hyper=warn,h2=warn,rustls=warn")
}

/// Cancels `shutdown` on the first SIGINT or SIGTERM (what Kubernetes sends a
/// Pod it stops). The handlers are installed before this returns, so a signal
/// that comes at any later moment is seen (a handler installed only once a
/// task first runs leaves a window in which the signal's default action kills
/// the process).
fn cancel_on_signal(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (mut term, mut int) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(term), Ok(int)) => (term, int),
        (Err(err), _) | (_, Err(err)) => {
            tracing::warn!(%err, "cannot handle SIGTERM and SIGINT: a signal ends the process without releasing the leader lease");
            return;
        }
    };
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!("terminating: stopping the controller");
        shutdown.cancel();
    });
}

/// How long in-flight reconciles may go on once the process is told to stop.
/// Then they are dropped, cancelled at their next await point as when the
/// Lease runs out (every step is idempotent and resumed from what the next
/// leader observes). With the release of the Lease, a stop takes under a
/// second.
const RECONCILE_GRACE: Duration = Duration::from_millis(400);

/// Runs `controller` until it ends, or until [`RECONCILE_GRACE`] after
/// `shutdown`.
async fn until_stopped(controller: impl Future<Output = ()>, shutdown: &CancellationToken) {
    tokio::pin!(controller);
    tokio::select! {
        () = &mut controller => return,
        () = shutdown.cancelled() => {}
    }
    if tokio::time::timeout(RECONCILE_GRACE, controller)
        .await
        .is_err()
    {
        tracing::warn!(grace = ?RECONCILE_GRACE, "reconciles still running after the grace period: cancelled");
    }
}

pub async fn run(args: RunArgs) -> ExitCode {
    init_logging_at(args.log_json, &args.log_level);
    match super::heap::serve_large_allocations_from_own_mappings() {
        super::heap::HeapSetup::Set => tracing::info!(
            threshold_bytes = super::heap::MMAP_THRESHOLD,
            "heap: allocations from the threshold up get mappings of their own"
        ),
        super::heap::HeapSetup::LeftToEnvironment => {
            tracing::info!("heap: the mmap threshold is MALLOC_MMAP_THRESHOLD_'s")
        }
        super::heap::HeapSetup::Unchanged => tracing::info!("heap: the allocator's defaults"),
    }
    let shutdown = CancellationToken::new();
    cancel_on_signal(shutdown.clone());
    let election = if args.leader_elect {
        match ElectionConfig::new(
            args.leader_election_lease_name.clone(),
            args.leader_election_namespace.clone(),
            replica_election::default_identity(),
            args.leader_election_lease_duration,
            args.leader_election_renew_deadline,
        ) {
            Ok(config) => Some(config),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        None
    };
    let config = match management_config(args.kubeconfig.as_ref()).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let client = match kube::Client::try_from(config.clone()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: management cluster client: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let probes = Probes::new(Arc::new(registry));
    match probes.clone().serve(args.probe_address).await {
        Ok(addr) => tracing::info!(%addr, "serving /healthz, /readyz, /metrics"),
        Err(e) => {
            eprintln!("error: --probe-address {}: {e}", args.probe_address);
            return ExitCode::FAILURE;
        }
    }
    // Ready once the management API answers for our kind (CRD installed, RBAC
    // in place); until then /readyz says why not and the loop retries.
    // Leadership does not enter readiness: a standby is Ready.
    let kcps: kube::Api<crate::api::KThreesControlPlane> = match &args.namespace {
        Some(ns) => kube::Api::namespaced(client.clone(), ns),
        None => kube::Api::all(client.clone()),
    };
    let ready_probes = probes.clone();
    tokio::spawn(async move {
        loop {
            match kcps.list(&kube::api::ListParams::default().limit(1)).await {
                Ok(_) => {
                    ready_probes.set_ready(true);
                    return;
                }
                Err(err) => {
                    tracing::warn!(%err, "KThreesControlPlanes cannot be listed yet (are the CRDs installed?)");
                    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
                }
            }
        }
    });
    if args.webhook_port != 0 {
        let addr = SocketAddr::from(([0, 0, 0, 0], args.webhook_port));
        if !args.webhook_cert_dir.join("tls.crt").exists() {
            tracing::warn!(
                dir = %args.webhook_cert_dir.display(),
                "conversion webhook off: no tls.crt in the certificate directory; KThreesControlPlane(Template) requests in v1beta1 and v1beta2 will fail (only the stored v1beta3 needs no conversion)"
            );
        } else {
            match crate::webhook::Webhook::bind(addr, &args.webhook_cert_dir).await {
                Ok(webhook) => {
                    let versions = std::sync::Arc::new(
                        crate::controller::contract_versions::ContractVersions::new(client.clone()),
                    );
                    let webhook = webhook.with_api_versions(std::sync::Arc::new(move |group, kind| {
                        let versions = versions.clone();
                        Box::pin(async move {
                            versions
                                .api_version(&group, &kind)
                                .await
                                .inspect_err(|e| tracing::debug!(error = %e, "conversion: API version unknown"))
                                .ok()
                        })
                    }));
                    tracing::info!(%addr, "serving the conversion webhook (POST /convert)");
                    tokio::spawn(webhook.serve(shutdown.clone()));
                }
                Err(e) => {
                    eprintln!("error: conversion webhook: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
    }
    let settings = Settings {
        etcd_transport: args.etcd_transport,
        watch_filter: args.watch_filter.clone().filter(|v| !v.is_empty()),
        namespace: args.namespace.clone().filter(|v| !v.is_empty()),
        concurrency: args.concurrency,
        secret_refresh: args.secret_refresh,
        max_chained_steps: args.max_chained_steps,
        etcd_space: args.etcd_space.settings(),
        ..Settings::default()
    };
    let etcd_pool = EtcdPool::with_timeouts(crate::etcd::Timeouts {
        defrag: args.etcd_defrag_timeout,
        ..crate::etcd::Timeouts::for_election_timeout(args.etcd_election_timeout)
    })
    .with_client_cert_lifetime(args.etcd_client_cert_lifetime);
    match election {
        None => {
            probes.set_leadership("leader election disabled: this process acts");
            metrics.leader.set(1);
            let ctx = Context::new(client, metrics, etcd_pool, settings);
            until_stopped(
                controller::run(ctx, shutdown.clone().cancelled_owned()),
                &shutdown,
            )
            .await;
        }
        Some(election) => {
            tracing::info!(
                lease = %format!("{}/{}", election.namespace, election.lease_name),
                identity = %election.identity,
                lease_duration = ?election.lease_duration,
                renew_deadline = ?election.renew_deadline,
                "leader election"
            );
            let report_metrics = metrics.clone();
            let report_probes = probes.clone();
            let election = Election::start(client, election, move |state| {
                report_metrics.leader.set(i64::from(state.leading));
                report_probes.set_leadership(state.to_string());
            });
            // The controller's own client writes only while we lead.
            let fenced = match replica_election::fenced_client(config, election.guard()) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("error: management cluster client: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let ctx =
                Context::new_with_leader(fenced, metrics, etcd_pool, settings, election.guard());
            until_stopped(
                replica_election::run_elected(ctx, shutdown.clone()),
                &shutdown,
            )
            .await;
            // Only now, with the controller stopped, hand the Lease over.
            election.stop().await;
        }
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    fn parse(args: &[&str]) -> Result<RunArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("run").chain(args.iter().copied())).map(|c| c.run)
    }

    #[test]
    fn leader_election_is_on_by_default_and_can_be_turned_off() {
        let args = parse(&[]).unwrap();
        assert!(args.leader_elect);
        assert_eq!(args.leader_election_lease_name, "k3s-control-plane");
        assert_eq!(args.leader_election_lease_duration, Duration::from_secs(15));
        assert_eq!(args.leader_election_renew_deadline, Duration::from_secs(10));
        assert!(parse(&["--leader-elect"]).unwrap().leader_elect);
        assert!(!parse(&["--leader-elect=false"]).unwrap().leader_elect);
        assert!(parse(&["--leader-elect=true"]).unwrap().leader_elect);
        assert!(parse(&["--leader-elect=maybe"]).is_err());
        let args = parse(&[
            "--leader-election-lease-duration",
            "3s",
            "--leader-election-renew-deadline=2000ms",
            "--leader-election-namespace",
            "ops",
        ])
        .unwrap();
        assert_eq!(args.leader_election_lease_duration, Duration::from_secs(3));
        assert_eq!(args.leader_election_renew_deadline, Duration::from_secs(2));
        assert_eq!(args.leader_election_namespace, "ops");
    }

    #[test]
    fn etcd_space_care_is_off_by_default_with_etcds_quota_and_fractions_are_checked() {
        let args = parse(&[]).unwrap();
        let space = args.etcd_space.settings();
        assert!(!space.care);
        assert_eq!(space.default_quota, crate::space_rule::DEFAULT_QUOTA_BYTES);
        assert_eq!(space.thresholds, crate::space_rule::Thresholds::default());
        assert_eq!(args.etcd_defrag_timeout, Duration::from_secs(300));
        assert_eq!(args.etcd_client_cert_lifetime, Duration::from_secs(3600));
        let args = parse(&[
            "--etcd-space-care",
            "--etcd-quota-backend-bytes=8Gi",
            "--etcd-defrag-fragmentation=0.3",
            "--etcd-defrag-quota-fraction",
            "0.25",
            "--etcd-space-headroom=0.2",
        ])
        .unwrap();
        let space = args.etcd_space.settings();
        assert!(space.care);
        assert_eq!(space.default_quota, 8 << 30);
        assert_eq!(
            space.thresholds,
            crate::space_rule::Thresholds {
                fragmentation: 0.3,
                quota_fraction: 0.25,
                headroom: 0.2,
            }
        );
        assert!(parse(&["--etcd-defrag-fragmentation=1.5"]).is_err());
        assert!(parse(&["--etcd-quota-backend-bytes=8GB"]).is_err());
    }

    #[test]
    fn components_defaults_parse_and_an_empty_watch_filter_is_no_filter() {
        let args = parse(&[
            "--log-level=info",
            "--concurrency=10",
            "--watch-filter=",
            "--etcd-transport=auto",
        ])
        .unwrap();
        assert_eq!(args.concurrency, 10);
        assert_eq!(args.watch_filter.as_deref(), Some(""));
        assert_eq!(args.log_level, "info");
        assert!(parse(&["--concurrency=0"]).is_err());
        assert!(parse(&["--log-level=loud"]).is_err());
        assert_eq!(parse(&[]).unwrap().concurrency, 10);
        assert!(log_filter("debug").starts_with("debug,kube=warn"));
    }

    #[tokio::test]
    async fn a_stop_waits_for_reconciles_only_the_grace_period() {
        let shutdown = CancellationToken::new();
        // A controller that ends by itself: nothing to wait for.
        until_stopped(async {}, &shutdown).await;
        shutdown.cancel();
        // One that ends within the grace is waited for...
        let start = std::time::Instant::now();
        until_stopped(tokio::time::sleep(Duration::from_millis(50)), &shutdown).await;
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(50) && took < RECONCILE_GRACE,
            "{took:?}"
        );
        // ...one that does not is dropped once it is over.
        let start = std::time::Instant::now();
        until_stopped(std::future::pending(), &shutdown).await;
        let took = start.elapsed();
        assert!(
            took >= RECONCILE_GRACE && took < RECONCILE_GRACE + Duration::from_millis(300),
            "{took:?}"
        );
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("15"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("0.5s"), Ok(Duration::from_millis(500)));
        assert!(parse_duration("15h").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn election_timeouts_are_what_etcd_accepts() {
        assert_eq!(
            parse(&[]).unwrap().etcd_election_timeout,
            Duration::from_secs(5)
        );
        for ok in ["1ms", "5s", "50s"] {
            assert!(parse_election_timeout(ok).is_ok(), "{ok}");
        }
        for refused in ["0s", "50001ms", "60m", "99999999999999m"] {
            let err = parse_election_timeout(refused).unwrap_err();
            assert!(err.contains("at most 50s"), "{refused}: {err}");
        }
        assert!(parse(&["--etcd-election-timeout=2m"]).is_err());
    }

    #[test]
    fn client_certificate_lifetimes_are_between_five_minutes_and_a_day() {
        for (text, seconds) in [("5m", 300), ("60m", 3600), ("1440m", 86400)] {
            assert_eq!(
                parse_client_cert_lifetime(text),
                Ok(Duration::from_secs(seconds))
            );
        }
        for refused in ["299s", "1441m", "0s", "10x"] {
            assert!(parse_client_cert_lifetime(refused).is_err(), "{refused}");
        }
        assert_eq!(
            parse(&["--etcd-client-cert-lifetime=10m"])
                .unwrap()
                .etcd_client_cert_lifetime,
            Duration::from_secs(600)
        );
        assert!(parse(&["--etcd-client-cert-lifetime=1m"]).is_err());
    }

    #[test]
    fn chained_steps_default_to_eight_and_zero_means_one_step_per_reconcile() {
        assert_eq!(parse(&[]).unwrap().max_chained_steps, 8);
        assert_eq!(
            parse(&["--max-chained-steps=0"]).unwrap().max_chained_steps,
            0
        );
        assert_eq!(
            Settings::default().max_chained_steps,
            parse(&[]).unwrap().max_chained_steps
        );
        assert!(parse(&["--max-chained-steps=-1"]).is_err());
    }
}
