use std::process::ExitCode;

use clap::{Parser, Subcommand};
use k3s_control_plane::cli;

/// Cluster API control-plane provider for k3s with etcd-safe remediation.
#[derive(Parser)]
#[command(name = "k3s-control-plane", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the controller against a management cluster.
    Run(cli::run::RunArgs),
    /// Print our CustomResourceDefinitions as YAML (or write them with --out DIR).
    Crds(cli::crds::CrdsArgs),
    /// Print the clusterctl components YAML (or metadata.yaml), or write both with --out DIR.
    Components(cli::components::ComponentsArgs),
    /// Inspect and operate on a k3s embedded etcd cluster directly.
    Etcd(cli::etcd::EtcdArgs),
    /// Show members, machines, nodes, quorum and the next remediation decision.
    Inspect(cli::inspect::InspectArgs),
    /// Ask the controller to restore a control plane that lost etcd quorum from a snapshot.
    Restore(cli::restore::RestoreArgs),
    /// Self-contained demo: real etcd, simulated management cluster.
    #[cfg(feature = "sandbox")]
    Demo(cli::demo::DemoArgs),
}

#[tokio::main]
async fn main() -> ExitCode {
    k3s_control_plane::install_crypto_provider();
    let args = Cli::parse();
    match args.command {
        Command::Run(a) => cli::run::run(a).await,
        Command::Crds(a) => cli::crds::run_with(a),
        Command::Components(a) => cli::components::run(a),
        Command::Etcd(a) => cli::etcd::run(a).await,
        Command::Inspect(a) => cli::inspect::run(a).await,
        Command::Restore(a) => cli::restore::run(a).await,
        #[cfg(feature = "sandbox")]
        Command::Demo(a) => cli::demo::run(a).await,
    }
}
