//! End to end: certificate expiry. Real etcd members whose serving
//! certificates (signed by the cluster's etcd CA) live 10 minutes; the
//! controller sees their expiry in the handshakes it makes anyway, tells CAPI
//! (the KThreesConfig annotation), says so (condition, metric), and rolls the
//! Machines out only when `rollout.before.certificatesExpiryDays` asks; a value
//! set by hand on a Machine wins over what was seen.

use crate::support;

use std::time::Duration;

use k3s_control_plane::api::KThreesConfig;
use k3s_control_plane::api::names::CERTIFICATES_EXPIRY_ANNOTATION;
use k3s_control_plane::harness::EtcdTestCluster;
use k3s_control_plane::harness::sandbox::{NAMESPACE, Sandbox};
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use serde_json::json;
use support::*;

const EXPIRING: &str = "CertificatesExpiring";

fn condition<'a>(
    kcp: &'a k3s_control_plane::api::KThreesControlPlane,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    kcp.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
}

/// The message of `CertificatesExpiring=True`, once the control plane says so.
async fn wait_expiring(sandbox: &Sandbox) -> String {
    sandbox
        .wait_for("CertificatesExpiring=True", LIMIT, || async {
            let kcp = kcp(sandbox).await;
            match condition(&kcp, EXPIRING) {
                Some(c) if c.status == "True" => Ok(c.message.clone()),
                other => Err(format!("{other:?}")),
            }
        })
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiring_serving_certificates_are_reported_and_rolled_out_only_when_asked() {
    init_logs();
    let sandbox = Sandbox::start_with(
        EtcdTestCluster::builder()
            .members(3)
            .serving_cert_lifetime(Duration::from_secs(600)),
        3,
    )
    .await
    .unwrap();
    let [hand_set, with_config, plain] = [0, 1, 2].map(|i| sandbox.machines[i].clone());
    // Someone set machine 0's expiry by hand: it wins over what etcd shows.
    annotate_machine(
        &sandbox,
        &hand_set,
        json!({CERTIFICATES_EXPIRY_ANNOTATION: "2099-01-01T00:00:00Z"}),
    )
    .await;
    // Machine 1's bootstrap config exists: it gets the annotation CAPI reads.
    let configs: Api<KThreesConfig> = Api::namespaced(sandbox.client(), NAMESPACE);
    let config: KThreesConfig = serde_json::from_value(json!({
        "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2", "kind": "KThreesConfig",
        "metadata": {"name": with_config, "namespace": NAMESPACE},
        "spec": {},
    }))
    .unwrap();
    configs
        .create(&PostParams::default(), &config)
        .await
        .unwrap();

    let controller = sandbox.start_controller();

    // Reported: the two Machines whose member's certificate expires soon.
    let expiring = wait_expiring(&sandbox).await;
    assert!(
        expiring.contains(&with_config) && expiring.contains(&plain),
        "{expiring}"
    );
    assert!(
        !expiring.contains(&hand_set),
        "the hand-set value is far: {expiring}"
    );
    assert!(
        expiring.contains("set spec.rollout.before.certificatesExpiryDays"),
        "{expiring}"
    );
    // Told to CAPI on the config, as KubeadmControlPlane does.
    let written = sandbox
        .wait_for("the KThreesConfig annotation", LIMIT, || async {
            let config = configs.get(&with_config).await.map_err(|e| e.to_string())?;
            config
                .annotations()
                .get(CERTIFICATES_EXPIRY_ANNOTATION)
                .cloned()
                .ok_or_else(|| "not yet".to_string())
        })
        .await
        .unwrap();
    let written = chrono::DateTime::parse_from_rfc3339(&written).expect("RFC 3339");
    let left = written.with_timezone(&chrono::Utc) - chrono::Utc::now();
    assert!(
        left <= chrono::Duration::minutes(10) && left > chrono::Duration::minutes(5),
        "{written} is the member's NotAfter ({left} left)"
    );

    // The cluster's etcd CA (the sandbox's, years ahead) has its series too,
    // with no Machine; far from expiry it adds nothing to the condition.
    let ca = k3s_control_plane::controller::metrics::CertificateLabels {
        cluster: format!(
            "{NAMESPACE}/{}",
            k3s_control_plane::harness::sandbox::CLUSTER
        ),
        machine: String::new(),
        certificate: "etcd-server-ca".into(),
    };
    let ca_expiry = controller
        .ctx
        .metrics
        .certificate_expiry
        .get_or_create(&ca)
        .get();
    assert!(
        ca_expiry > (chrono::Utc::now() + chrono::Duration::days(365)).timestamp(),
        "the etcd CA's notAfter: {ca_expiry}"
    );
    assert!(!expiring.contains("cluster CA"), "{expiring}");

    // Without rolloutBefore, nothing is rolled: the Machines stay, up to date
    // as far as their spec goes.
    wait_reconciles(&sandbox, &controller.ctx, 3).await;
    assert_eq!(machine_names(&sandbox).await.len(), 3, "nothing rolled out");

    // Asked to roll a week before expiry: the two Machines are outdated for
    // their certificates and a replacement is made; the hand-set one is not.
    patch_kcp_spec(
        &sandbox,
        json!({"rollout": {"before": {"certificatesExpiryDays": 7}}}),
    )
    .await;
    let outdated = sandbox
        .wait_for(
            "UpToDate=False (certificatesExpiring) on two Machines",
            LIMIT,
            || async {
                let all = machines(&sandbox).await;
                let mut outdated = Vec::new();
                for m in &all {
                    if let Some(c) = m
                        .status
                        .as_ref()
                        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "UpToDate"))
                        && c.status == "False"
                        && c.message.contains("certificates expire at")
                    {
                        outdated.push(m.name_any());
                    }
                }
                outdated.sort();
                if outdated.len() == 2 {
                    Ok(outdated)
                } else {
                    Err(format!("{outdated:?}"))
                }
            },
        )
        .await
        .unwrap();
    let mut want = vec![with_config.clone(), plain.clone()];
    want.sort();
    assert_eq!(outdated, want);
    sandbox
        .wait_for("a replacement Machine", LIMIT, || async {
            let names = machine_names(&sandbox).await;
            names
                .iter()
                .find(|n| !sandbox.machines.contains(n))
                .cloned()
                .ok_or_else(|| format!("{names:?}"))
        })
        .await
        .unwrap();
    controller.stop().await;
}

/// The k3s serving certificate on each server's supervisor port (6443) is
/// probed by a verified handshake, at most once a day per Machine: the one
/// that expires before the etcd serving certificate is what counts (and is
/// named `k3s-serving` in the metric); one that fails verification (no node
/// IP in its SANs) or a port that does not answer leaves the etcd value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_k3s_serving_certificate_is_probed_once_a_day_and_counts_when_it_expires_first() {
    use k3s_control_plane::controller::metrics::CertificateLabels;
    init_logs();
    let sandbox = Sandbox::start(3).await.unwrap();
    let [expiring, unverifiable, silent] = [0, 1, 2].map(|i| sandbox.machines[i].clone());
    let expiring_port = sandbox
        .serve_k3s_supervisor(0, Duration::from_secs(600), true)
        .await
        .unwrap();
    let unverifiable_port = sandbox
        .serve_k3s_supervisor(1, Duration::from_secs(300), false)
        .await
        .unwrap();

    let controller = sandbox.start_controller();
    let series = |machine: &str, certificate: &str| CertificateLabels {
        cluster: format!(
            "{NAMESPACE}/{}",
            k3s_control_plane::harness::sandbox::CLUSTER
        ),
        machine: machine.to_string(),
        certificate: certificate.into(),
    };
    let metric = |labels: &CertificateLabels| {
        controller
            .ctx
            .metrics
            .certificate_expiry
            .get_or_create(labels)
            .get()
    };
    let seen = sandbox
        .wait_for("the k3s serving certificate's expiry", LIMIT, || async {
            match metric(&series(&expiring, "k3s-serving")) {
                0 => Err("not yet".to_string()),
                at => Ok(at),
            }
        })
        .await
        .unwrap();
    assert_eq!(
        seen,
        expiring_port.not_after.timestamp(),
        "the NotAfter the handshake verified"
    );
    let condition_message = wait_expiring(&sandbox).await;
    assert!(condition_message.contains(&expiring), "{condition_message}");
    assert!(
        !condition_message.contains(&unverifiable),
        "a certificate that fails verification tells nothing: {condition_message}"
    );
    assert!(!condition_message.contains(&silent), "{condition_message}");
    for machine in [&unverifiable, &silent] {
        assert_eq!(metric(&series(machine, "k3s-serving")), 0, "{machine}");
        assert!(
            metric(&series(machine, "etcd-serving")) > chrono::Utc::now().timestamp() + 86_400,
            "{machine}: the etcd serving certificate (a year) still counts"
        );
    }
    assert!(
        unverifiable_port.accepted() >= 1,
        "the unverifiable one was tried"
    );

    // Many reconciles later: each port was probed once.
    wait_reconciles(&sandbox, &controller.ctx, 5).await;
    assert_eq!(expiring_port.accepted(), 1, "at most once a day");
    assert_eq!(
        unverifiable_port.accepted(),
        1,
        "a failed probe waits a day too"
    );
    controller.stop().await;

    // Why the unverifiable one told nothing: the name check, said with the
    // address (what the controller logs as a warning).
    use k3s_control_plane::workload::serving_probe::{ProbeError, client_config, probe};
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(sandbox.client(), NAMESPACE);
    let ca = secrets
        .get(&format!(
            "{}-ca",
            k3s_control_plane::harness::sandbox::CLUSTER
        ))
        .await
        .unwrap();
    let pem = String::from_utf8(ca.data.unwrap()["tls.crt"].0.clone()).unwrap();
    let err = probe(
        client_config(&pem, "server CA").unwrap(),
        unverifiable_port.address,
        Duration::from_secs(5),
    )
    .await
    .expect_err("no node IP among its SANs");
    let text = err.to_string();
    assert!(matches!(err, ProbeError::Verify { .. }), "{text}");
    assert!(
        text.contains(&unverifiable_port.address.ip().to_string()),
        "{text}"
    );
    let good = probe(
        client_config(&pem, "server CA").unwrap(),
        expiring_port.address,
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    assert_eq!(good, expiring_port.not_after);
}
