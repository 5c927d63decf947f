//! `k3s-control-plane restore NAMESPACE/NAME --snapshot X [--force]`: ask
//! the controller to rebuild a control plane whose etcd lost quorum from a
//! snapshot. It checks what the controller would check, on the same
//! observation and the same rule (`decision::etcd_restore`): the request is
//! refused while etcd has quorum (unless `--force`), the target must be S3,
//! the name a k3s snapshot name, and the snapshot must be in the target
//! whole (etcd's SHA-256). Only then does it set the request annotations;
//! the controller verifies again before it deletes anything.
//!
//! Exit codes: 0 asked; 2 refused (the reason on stderr, nothing changed);
//! 1 any other error.

use std::path::PathBuf;
use std::process::ExitCode;

use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::api::KThreesControlPlane;
use crate::api::names::{ETCD_RESTORE_ANNOTATION, ETCD_RESTORE_FORCE_ANNOTATION};
use crate::controller::observe::observe;
use crate::decision::etcd_restore::{RestoreDecision, RestoreStep, decide_restore, is_under_way};

use super::inspect::{init_quiet_logging, parse_target, read_only_context};
use super::run::management_client;

#[derive(Debug, clap::Args)]
pub struct RestoreArgs {
    /// The KThreesControlPlane: NAMESPACE/NAME.
    #[arg(value_name = "NAMESPACE/NAME")]
    pub target: String,

    /// The snapshot's name in the target of `spec.etcdBackup` (as `etcd
    /// snapshot list` and `status.etcdBackup` show it).
    #[arg(long, value_name = "NAME")]
    pub snapshot: String,

    /// Restore even though etcd still has quorum, or cannot be read to tell:
    /// every write since the snapshot is lost.
    #[arg(long)]
    pub force: bool,

    /// Kubeconfig of the management cluster (default: $KUBECONFIG, then
    /// ~/.kube/config, then in-cluster config).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
}

/// Why the request was not made.
#[derive(Debug, thiserror::Error)]
enum RestoreCliError {
    /// The rule or the snapshot says no: nothing was changed.
    #[error("refused: {0}")]
    Refused(String),
    #[error("{0}")]
    Failed(String),
}

pub async fn run(args: RestoreArgs) -> ExitCode {
    crate::install_crypto_provider();
    init_quiet_logging();
    match execute(&args).await {
        Ok(message) => {
            println!("{message}");
            ExitCode::SUCCESS
        }
        Err(err @ RestoreCliError::Refused(_)) => {
            eprintln!("{err}");
            ExitCode::from(2)
        }
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn execute(args: &RestoreArgs) -> Result<String, RestoreCliError> {
    let (namespace, name) =
        parse_target(&args.target).map_err(|e| RestoreCliError::Failed(e.to_string()))?;
    let client = management_client(args.kubeconfig.as_ref())
        .await
        .map_err(RestoreCliError::Failed)?;
    let ctx = read_only_context(client);
    let kcps: Api<KThreesControlPlane> = Api::namespaced(ctx.client.clone(), &namespace);
    let kcp = kcps
        .get_opt(&name)
        .await
        .map_err(|e| {
            RestoreCliError::Failed(format!(
                "cannot read KThreesControlPlane {namespace}/{name}: {e}"
            ))
        })?
        .ok_or_else(|| {
            RestoreCliError::Failed(format!("KThreesControlPlane {namespace}/{name} not found"))
        })?;
    let version = kcp.resource_version();
    let (mut world, _etcd) = observe(&ctx, kcp)
        .await
        .map_err(|e| RestoreCliError::Failed(e.to_string()))?;
    if is_under_way(&world) {
        return Err(RestoreCliError::Refused(format!(
            "a restore of KThreesControlPlane {namespace}/{name} is under way already (annotation {}); see `k3s-control-plane inspect {namespace}/{name}`",
            crate::api::names::ETCD_RESTORE_ACCEPTED_ANNOTATION
        )));
    }
    // The rule, on the world as observed, with the request as it would be.
    let annotations = world.kcp.metadata.annotations.get_or_insert_default();
    annotations.insert(ETCD_RESTORE_ANNOTATION.into(), args.snapshot.clone());
    annotations.insert(ETCD_RESTORE_FORCE_ANNOTATION.into(), args.force.to_string());
    let why = match decide_restore(&world) {
        Some(RestoreDecision::Step {
            step: RestoreStep::Accept { .. },
            message,
        }) => message,
        Some(other) => return Err(RestoreCliError::Refused(other.message().to_string())),
        None => unreachable!("a request is set"),
    };
    let (verified, location) =
        crate::controller::etcd_restore::verify_snapshot(&ctx, &world, &args.snapshot)
            .await
            .map_err(|why| {
                RestoreCliError::Refused(format!("--snapshot {}: {why}", args.snapshot))
            })?;
    // Conditional on the object checked: changed meanwhile, nothing is set.
    let patch = json!({"metadata": {
        "resourceVersion": version,
        "annotations": {
            ETCD_RESTORE_ANNOTATION: args.snapshot,
            ETCD_RESTORE_FORCE_ANNOTATION: args.force.then_some("true"),
        },
    }});
    kcps.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| {
            RestoreCliError::Failed(format!(
                "cannot annotate KThreesControlPlane {namespace}/{name}: {e} (nothing was changed)"
            ))
        })?;
    Ok(format!(
        "asked for the restore of KThreesControlPlane {namespace}/{name} from {location} ({} bytes, SHA-256 verified): {why}\n\
         The controller verifies it again, deletes the old Machines, creates one that restores it, then scales back up.\n\
         Follow it: k3s-control-plane inspect {namespace}/{name} (condition EtcdRestoring)",
        verified.size
    ))
}
