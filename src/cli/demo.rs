use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct DemoArgs {}

pub async fn run(_args: DemoArgs) -> ExitCode {
    eprintln!("k3s-control-plane demo: not implemented yet");
    ExitCode::FAILURE
}
