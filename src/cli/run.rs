//! `k3s-control-plane run`: the controller against a management cluster.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use prometheus_client::registry::Registry;

use crate::controller::etcd_pool::EtcdPool;
use crate::controller::http::Probes;
use crate::controller::metrics::Metrics;
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
    /// Log as JSON lines.
    #[arg(long)]
    pub log_json: bool,
}

/// A kube client from `--kubeconfig`, or the default chain.
pub async fn management_client(kubeconfig: Option<&PathBuf>) -> Result<kube::Client, String> {
    let config = match kubeconfig {
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
    };
    kube::Client::try_from(config).map_err(|e| format!("management cluster client: {e}"))
}

pub fn init_logging(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,kube=warn,tower=warn,hyper=warn,h2=warn".into());
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

pub async fn run(args: RunArgs) -> ExitCode {
    init_logging(args.log_json);
    let client = match management_client(args.kubeconfig.as_ref()).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
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
    let kcps: kube::Api<crate::api::KThreesControlPlane> = kube::Api::all(client.clone());
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
    let ctx = Context::new(client, metrics, EtcdPool::default(), Settings::default());
    controller::run(ctx, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await;
    ExitCode::SUCCESS
}
