use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct EtcdArgs {}

pub async fn run(_args: EtcdArgs) -> ExitCode {
    eprintln!("k3s-control-plane etcd: not implemented yet");
    ExitCode::FAILURE
}
