//! `k3s-control-plane inspect NAMESPACE/NAME`: what the controller sees of one
//! KThreesControlPlane (members <-> Machines <-> Nodes, quorum arithmetic) and
//! what it would do next, and why. Reads only: the same `observe` and `plan`
//! as the controller, never `act`, never a status write.

use std::path::PathBuf;
use std::process::ExitCode;

use kube::Api;
use prometheus_client::registry::Registry;

use crate::api::KThreesControlPlane;
use crate::controller::etcd_pool::EtcdPool;
use crate::controller::metrics::Metrics;
use crate::controller::observe::observe;
use crate::controller::{Context, Settings};

use super::run::management_client;

mod render;
mod report;

pub use render::*;
pub use report::*;

#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    /// The KThreesControlPlane to inspect.
    #[arg(value_name = "NAMESPACE/NAME")]
    pub target: String,

    /// Kubeconfig of the management cluster (default: $KUBECONFIG, then
    /// ~/.kube/config, then in-cluster config).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,

    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
}

/// Why `inspect` could not produce a report; one line each, naming the
/// argument or the object.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error("NAMESPACE/NAME {given:?}: {reason}")]
    BadTarget { given: String, reason: String },
    #[error("{0}")]
    Client(String),
    #[error("KThreesControlPlane {namespace}/{name} not found")]
    NotFound { namespace: String, name: String },
    #[error("cannot read KThreesControlPlane {namespace}/{name}: {source}")]
    Read {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("{0}")]
    Observe(#[from] crate::controller::Error),
}

/// `NAMESPACE/NAME` split and checked (DNS-1123 characters, both parts present).
pub fn parse_target(given: &str) -> Result<(String, String), InspectError> {
    let bad = |reason: &str| InspectError::BadTarget {
        given: given.to_string(),
        reason: reason.to_string(),
    };
    let Some((namespace, name)) = given.split_once('/') else {
        return Err(bad(
            "expected <namespace>/<name>, e.g. default/my-control-plane",
        ));
    };
    if namespace.is_empty() || name.is_empty() || name.contains('/') {
        return Err(bad(
            "expected <namespace>/<name>, e.g. default/my-control-plane",
        ));
    }
    let valid = |s: &str| {
        s.len() <= 253
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
            && s.starts_with(|c: char| c.is_ascii_alphanumeric())
            && s.ends_with(|c: char| c.is_ascii_alphanumeric())
    };
    if !valid(namespace) {
        return Err(bad(&format!(
            "namespace {namespace:?} is not a valid name (lowercase letters, digits, '-', '.')"
        )));
    }
    if !valid(name) {
        return Err(bad(&format!(
            "name {name:?} is not a valid name (lowercase letters, digits, '-', '.')"
        )));
    }
    Ok((namespace.to_string(), name.to_string()))
}

/// Logging for interactive commands: warnings only unless `RUST_LOG` says
/// otherwise, on stderr so stdout stays the report.
pub fn init_quiet_logging() {
    init_logging_or("warn");
}

/// Logs to stderr, filtered by `RUST_LOG` or else by `default`.
pub fn init_logging_or(default: &str) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| default.into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// A read-only controller context on `client` (production settings; it is
/// only used to observe).
pub fn read_only_context(client: kube::Client) -> std::sync::Arc<Context> {
    let metrics = Metrics::register(&mut Registry::default());
    Context::new(client, metrics, EtcdPool::default(), Settings::default())
}

pub async fn run(args: InspectArgs) -> ExitCode {
    crate::install_crypto_provider();
    init_quiet_logging();
    match execute(&args).await {
        Ok(report) => {
            match args.output {
                Output::Text => print!("{}", render_text(&report)),
                Output::Json => match serde_json::to_string_pretty(&report) {
                    Ok(text) => println!("{text}"),
                    Err(err) => {
                        eprintln!("error: cannot encode JSON: {err}");
                        return ExitCode::FAILURE;
                    }
                },
            }
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("error: {}", one_line(&err.to_string()));
            ExitCode::FAILURE
        }
    }
}

async fn execute(args: &InspectArgs) -> Result<Report, InspectError> {
    // The argument is checked before any cluster is contacted.
    let (namespace, name) = parse_target(&args.target)?;
    let client = management_client(args.kubeconfig.as_ref())
        .await
        .map_err(InspectError::Client)?;
    let ctx = read_only_context(client);
    inspect(&ctx, &namespace, &name).await
}

/// Observe the control plane and decide, as one reconcile would, without acting.
pub async fn inspect(ctx: &Context, namespace: &str, name: &str) -> Result<Report, InspectError> {
    let kcps: Api<KThreesControlPlane> = Api::namespaced(ctx.client.clone(), namespace);
    let kcp = kcps
        .get_opt(name)
        .await
        .map_err(|source| InspectError::Read {
            namespace: namespace.to_string(),
            name: name.to_string(),
            source,
        })?
        .ok_or_else(|| InspectError::NotFound {
            namespace: namespace.to_string(),
            name: name.to_string(),
        })?;
    let (world, _etcd) = observe(ctx, kcp).await?;
    Ok(Report::from_world(&world))
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_is_namespace_slash_name() {
        assert_eq!(
            parse_target("default/demo-control-plane").unwrap(),
            ("default".to_string(), "demo-control-plane".to_string())
        );
    }

    #[test]
    fn malformed_targets_name_the_argument() {
        for bad in [
            "demo",
            "/demo",
            "default/",
            "a/b/c",
            "Default/x",
            "ns/x_y",
            "",
        ] {
            let err = parse_target(bad).unwrap_err().to_string();
            assert!(err.starts_with("NAMESPACE/NAME"), "{bad:?} gave {err:?}");
            assert!(!err.contains('\n'), "one line: {err:?}");
        }
    }

    #[test]
    fn table_aligns_columns() {
        let text = table(
            &["A", "BB"],
            &[vec!["xxx".into(), "y".into()], vec!["z".into(), "w".into()]],
        );
        assert_eq!(text, "A    BB\nxxx  y\nz    w\n");
    }
}
