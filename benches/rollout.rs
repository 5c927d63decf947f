//! A 3-node rollout on loopback (harness): v1.30 -> v1.31 on a fresh
//! `Sandbox::start(3)` (real 3-member TLS etcd, test API servers, CAPI's
//! deletion and the infrastructure simulated), driven one reconcile at a time
//! by `harness::rollout::drive_until` with one controller Context, for
//! maxSurge 1 and 0. Each run's wall time is split into:
//! - **joins**: the simulated infrastructure booting each new server, whose
//!   member is added as a learner (etcd refuses `MemberAdd` until its leader
//!   has been connected to every voter for 5 s) and promoted once in sync;
//! - **member removals**: reconciles that removed a member (`MemberRemove`,
//!   refused by the same 5 s guard after each join and retried);
//! - **controller**: every other reconcile (observe, decide, create the
//!   Machine, hooks, leadership move, status);
//! - **pacing**: the driver's 20 ms between steps.
//!
//! The floor to compare with is etcd's own: 3 × (join + removal). Run:
//! `cargo bench --bench rollout` (needs etcd on PATH).

use std::time::Duration;

use k3s_control_plane::api::{KThreesControlPlane, Machine};
use k3s_control_plane::harness::rollout::{Drive, DriveRecord, drive_until};
use k3s_control_plane::harness::sandbox::Sandbox;
use kube::api::{Patch, PatchParams};
use serde_json::json;

const RUNS: usize = 3;
const NEW_VERSION: &str = "v1.31.4+k3s1";

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn done(machines: &[Machine], kcp: &KThreesControlPlane) -> bool {
    machines.len() == 3
        && machines.iter().all(|m| {
            !m.is_deleting()
                && m.node_name().is_some()
                && m.spec.version.as_deref() == Some(NEW_VERSION)
        })
        && kcp.status.as_ref().and_then(|s| s.up_to_date_replicas) == Some(3)
}

async fn run(max_surge: i32) -> DriveRecord {
    let mut sandbox = Sandbox::start(3).await.expect("sandbox");
    sandbox
        .kcp_api()
        .patch(
            k3s_control_plane::harness::sandbox::KCP,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {
                "version": NEW_VERSION,
                "rollout": {"strategy": {"rollingUpdate": {"maxSurge": max_surge}}}
            }})),
        )
        .await
        .expect("patch version");
    let record = drive_until(
        &mut sandbox,
        &Drive {
            crash_after_every_step: false,
            limit: Duration::from_secs(300),
        },
        done,
    )
    .await
    .expect("rollout");
    assert_eq!(record.machines_seen.len(), 6, "each Machine replaced once");
    record
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    k3s_control_plane::install_crypto_provider();
    println!(
        "| maxSurge | run | steps | wall ms | controller ms | member removals ms | joins ms | pacing ms | MemberAdd refusals |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for max_surge in [1, 0] {
        for i in 0..RUNS {
            let r = run(max_surge).await;
            let removals = r.member_removal_time();
            let own = r.controller.saturating_sub(removals);
            let pacing = r.wall.saturating_sub(r.controller + r.waiting_on_etcd);
            let refusals: u32 = r.provisioned.iter().map(|p| p.member_add_refusals).sum();
            println!(
                "| {max_surge} | {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {refusals} |",
                i + 1,
                r.steps.len(),
                ms(r.wall),
                ms(own),
                ms(removals),
                ms(r.waiting_on_etcd),
                ms(pacing),
            );
        }
    }
}
