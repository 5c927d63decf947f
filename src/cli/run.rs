use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct RunArgs {}

pub async fn run(_args: RunArgs) -> ExitCode {
    eprintln!("k3s-control-plane run: not implemented yet");
    ExitCode::FAILURE
}
