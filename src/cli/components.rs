//! `k3s-control-plane components`: print the clusterctl components YAML (or
//! with `--metadata` the `metadata.yaml`), or with `--out DIR` write both (how
//! `hack/clusterctl/` is regenerated).

use std::path::PathBuf;
use std::process::ExitCode;

use crate::components::deployment::{DEFAULT_SHARD_PREFIX, Shards};
use crate::components::{self, Options, variables};

/// Arguments of `components`.
#[derive(clap::Args, Debug, Default)]
pub struct ComponentsArgs {
    /// Write control-plane-components.yaml and metadata.yaml into this directory.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Print metadata.yaml instead of the components.
    #[arg(long, conflicts_with = "out")]
    pub metadata: bool,
    /// Replace each ${NAME:=default} placeholder with $NAME from the
    /// environment, else its default, as clusterctl does (for `kubectl apply`
    /// without clusterctl).
    #[arg(long, conflicts_with_all = ["out", "metadata"])]
    pub substitute: bool,
    /// Scope the controller to this namespace: it runs with `--namespace` and
    /// its roles (Secrets included) are bound by RoleBindings there only.
    #[arg(long, value_name = "NAMESPACE")]
    pub watch_namespace: Option<String>,
    /// Watch-filter shards: one Deployment per shard
    /// (`k3s-control-plane-shard-<i>`, i from 0), each running
    /// `--watch-filter=<prefix>-<i>` under its own Lease; the CRDs, RBAC and
    /// conversion webhook Service are shared. Label each Cluster and its
    /// KThreesControlPlane `cluster.x-k8s.io/watch-filter=<prefix>-<i>`.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=64))]
    pub shards: Option<u32>,
    /// The shards' watch-filter values are `<prefix>-<i>`.
    #[arg(long, value_name = "PREFIX", default_value = DEFAULT_SHARD_PREFIX, requires = "shards")]
    pub shard_prefix: String,
}

pub fn run(args: ComponentsArgs) -> ExitCode {
    let options = Options {
        watch_namespace: args.watch_namespace,
        shards: args.shards.map(|count| Shards {
            count,
            prefix: args.shard_prefix.clone(),
        }),
    };
    if let Some(Err(e)) = options.shards.as_ref().map(Shards::validate) {
        eprintln!("{e}");
        return ExitCode::FAILURE;
    }
    if let Some(dir) = args.out {
        return match components::write_all(&dir, &options) {
            Ok(paths) => {
                for p in paths {
                    eprintln!("wrote {}", p.display());
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("components: cannot write into {}: {e}", dir.display());
                ExitCode::FAILURE
            }
        };
    }
    if args.metadata {
        print!("{}", components::metadata::render());
        return ExitCode::SUCCESS;
    }
    if args.substitute {
        return match components::render_substituted(&options, &variables::from_environment()) {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        };
    }
    print!("{}", components::render(&options));
    ExitCode::SUCCESS
}
