use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct InspectArgs {}

pub async fn run(_args: InspectArgs) -> ExitCode {
    eprintln!("k3s-control-plane inspect: not implemented yet");
    ExitCode::FAILURE
}
