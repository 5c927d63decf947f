//! `k3s-control-plane inspect NAMESPACE/NAME`: what the controller sees of one
//! KThreesControlPlane (members <-> Machines <-> Nodes, quorum arithmetic) and
//! what it would do next, and why; `inspect -n NAMESPACE`: one line per
//! control plane of the namespace, from the same report. Reads only: the
//! same `observe` and `plan` as the controller, never `act`, never a status
//! write.

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
    /// The KThreesControlPlane to inspect: NAMESPACE/NAME, or NAME with
    /// `-n NAMESPACE`. Omitted with `-n`: every one of the namespace, one
    /// line each.
    #[arg(value_name = "NAMESPACE/NAME")]
    pub target: Option<String>,

    /// The namespace: with NAME, that control plane; alone, list them all.
    #[arg(short = 'n', long, value_name = "NAMESPACE")]
    pub namespace: Option<String>,

    /// Kubeconfig of the management cluster (default: $KUBECONFIG, then
    /// ~/.kube/config, then in-cluster config).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,

    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,

    /// What `run` is given about etcd's space: with `--etcd-space-care`, the
    /// report says what the space rule would do next.
    #[command(flatten)]
    pub etcd_space: crate::cli::run::EtcdSpaceArgs,
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
    #[error("-n {given:?}: not a valid namespace (lowercase letters, digits, '-', '.')")]
    BadNamespace { given: String },
    #[error("{0}")]
    Client(String),
    #[error("cannot list KThreesControlPlanes in {namespace}: {source}")]
    List {
        namespace: String,
        #[source]
        source: kube::Error,
    },
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

/// What the arguments ask for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    One { namespace: String, name: String },
    Namespace(String),
}

/// The positional target and `-n`, checked before any cluster is contacted.
pub fn parse_args(target: Option<&str>, namespace: Option<&str>) -> Result<Target, InspectError> {
    match (target, namespace) {
        (Some(given), None) => {
            parse_target(given).map(|(namespace, name)| Target::One { namespace, name })
        }
        (Some(given), Some(ns)) => {
            if given.contains('/') {
                return Err(InspectError::BadTarget {
                    given: given.to_string(),
                    reason: format!("with -n {ns}, give the NAME alone"),
                });
            }
            parse_target(&format!("{ns}/{given}"))
                .map(|(namespace, name)| Target::One { namespace, name })
        }
        (None, Some(ns)) => {
            // The same check as a NAMESPACE/NAME's namespace part.
            parse_target(&format!("{ns}/x"))
                .map(|(namespace, _)| Target::Namespace(namespace))
                .map_err(|_| InspectError::BadNamespace {
                    given: ns.to_string(),
                })
        }
        (None, None) => Err(InspectError::BadTarget {
            given: String::new(),
            reason:
                "expected <namespace>/<name>, or -n <namespace> to list every control plane there"
                    .into(),
        }),
    }
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
    read_only_context_with(client, crate::space_rule::SpaceSettings::default())
}

/// [`read_only_context`], deciding on etcd's space as `run` does with `space`.
pub fn read_only_context_with(
    client: kube::Client,
    space: crate::space_rule::SpaceSettings,
) -> std::sync::Arc<Context> {
    let metrics = Metrics::register(&mut Registry::default());
    let settings = Settings {
        etcd_space: space,
        ..Settings::default()
    };
    Context::new(client, metrics, EtcdPool::default(), settings)
}

/// What `inspect` prints: one report, or the namespace's lines.
enum Printed {
    One(Box<Report>),
    Summary(Vec<SummaryRow>),
}

pub async fn run(args: InspectArgs) -> ExitCode {
    crate::install_crypto_provider();
    init_quiet_logging();
    match execute(&args).await {
        Ok(printed) => {
            let json = match (&printed, args.output) {
                (Printed::One(report), Output::Text) => {
                    print!("{}", render_text(report));
                    return ExitCode::SUCCESS;
                }
                (Printed::Summary(rows), Output::Text) => {
                    print!("{}", render_summary(rows));
                    return ExitCode::SUCCESS;
                }
                (Printed::One(report), Output::Json) => serde_json::to_string_pretty(report),
                (Printed::Summary(rows), Output::Json) => serde_json::to_string_pretty(rows),
            };
            match json {
                Ok(text) => println!("{text}"),
                Err(err) => {
                    eprintln!("error: cannot encode JSON: {err}");
                    return ExitCode::FAILURE;
                }
            }
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("error: {}", one_line(&err.to_string()));
            ExitCode::FAILURE
        }
    }
}

async fn execute(args: &InspectArgs) -> Result<Printed, InspectError> {
    // The arguments are checked before any cluster is contacted.
    let target = parse_args(args.target.as_deref(), args.namespace.as_deref())?;
    let client = management_client(args.kubeconfig.as_ref())
        .await
        .map_err(InspectError::Client)?;
    let ctx = read_only_context_with(client, args.etcd_space.settings());
    match target {
        Target::One { namespace, name } => inspect(&ctx, &namespace, &name)
            .await
            .map(|r| Printed::One(Box::new(r))),
        Target::Namespace(namespace) => inspect_namespace(&ctx, &namespace)
            .await
            .map(Printed::Summary),
    }
}

/// Every KThreesControlPlane of `namespace`, sorted by name, each observed
/// and decided as [`inspect`] does it; one that cannot be observed gets a
/// line saying why and does not stop the others.
pub async fn inspect_namespace(
    ctx: &Context,
    namespace: &str,
) -> Result<Vec<SummaryRow>, InspectError> {
    let kcps: Api<KThreesControlPlane> = Api::namespaced(ctx.client.clone(), namespace);
    let mut list = kcps
        .list(&Default::default())
        .await
        .map_err(|source| InspectError::List {
            namespace: namespace.to_string(),
            source,
        })?
        .items;
    list.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut rows = Vec::with_capacity(list.len());
    for kcp in list {
        let name = kcp.metadata.name.clone().unwrap_or_default();
        let cluster = crate::controller::observe::cluster_name(&kcp);
        let version = kcp.spec.version.clone();
        rows.push(match observe(ctx, kcp).await {
            Ok((world, _etcd)) => SummaryRow::from_report(&Report::from_world(&world)),
            Err(err) => SummaryRow::failed(&name, cluster, &version, one_line(&err.to_string())),
        });
    }
    Ok(rows)
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
    fn arguments_name_one_control_plane_or_a_namespace() {
        let one = |ns: &str, n: &str| Target::One {
            namespace: ns.into(),
            name: n.into(),
        };
        assert_eq!(parse_args(Some("ns/cp"), None).unwrap(), one("ns", "cp"));
        assert_eq!(parse_args(Some("cp"), Some("ns")).unwrap(), one("ns", "cp"));
        assert_eq!(
            parse_args(None, Some("ns")).unwrap(),
            Target::Namespace("ns".into())
        );
        for (target, ns) in [
            (None, None),
            (Some("a/cp"), Some("ns")),
            (None, Some("Bad_NS")),
            (Some("cp"), None),
        ] {
            let err = parse_args(target, ns).unwrap_err().to_string();
            assert!(!err.contains('\n'), "one line: {err:?}");
            assert!(
                err.starts_with("NAMESPACE/NAME") || err.starts_with("-n "),
                "{target:?} {ns:?}: {err}"
            );
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
