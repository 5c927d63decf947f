//! `k3s-control-plane crds`: print our CRDs as multi-document YAML, or with
//! `--out DIR` write one file per CRD (how `crds/` is regenerated).

use std::path::PathBuf;
use std::process::ExitCode;

use crate::api::crds;

/// Arguments of `crds`.
#[derive(clap::Args, Debug, Default)]
pub struct CrdsArgs {
    /// Write one `<group>_<plural>.yaml` per CRD into this directory instead of printing.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

/// Print our CRDs to stdout (`kubectl apply -f -` ready).
pub fn run() -> ExitCode {
    run_with(CrdsArgs::default())
}

/// Print or write our CRDs.
pub fn run_with(args: CrdsArgs) -> ExitCode {
    match args.out {
        None => {
            print!("{}", crds::ours_yaml());
            ExitCode::SUCCESS
        }
        Some(dir) => match crds::write_all(&dir) {
            Ok(paths) => {
                for p in paths {
                    eprintln!("wrote {}", p.display());
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("crds: cannot write into {}: {e}", dir.display());
                ExitCode::FAILURE
            }
        },
    }
}
