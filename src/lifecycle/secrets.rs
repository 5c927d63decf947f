//! Which cluster Secrets to write: the CAs (`<cluster>-ca`, `<cluster>-cca`,
//! and `<cluster>-etcd` with embedded etcd), the join token
//! (`<cluster>-token`) and the admin kubeconfig (`<cluster>-kubeconfig`, once
//! the Cluster has a control-plane endpoint). Look up or generate: a Secret
//! that exists is never overwritten, except a kubeconfig we generated
//! ourselves, which is rotated well before its client certificate expires or
//! when the endpoint moved. A Secret that exists but cannot be used blocks
//! everything else, with the Secret and key named.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use crate::pki::KubeconfigPolicy;
use serde::Serialize;

/// The three CAs a k3s control plane needs from the management cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CaPurpose {
    /// `<cluster>-ca`: signs the API servers' serving certificates
    /// (`/var/lib/rancher/k3s/server/tls/server-ca.*`).
    Server,
    /// `<cluster>-cca`: signs client certificates, ours included (`client-ca.*`).
    Client,
    /// `<cluster>-etcd`: signs k3s's etcd certificates (`tls/etcd/server-ca.*`).
    Etcd,
}

impl CaPurpose {
    pub const ALL: [CaPurpose; 3] = [CaPurpose::Server, CaPurpose::Client, CaPurpose::Etcd];

    /// The Secret name suffix, as cluster-api-k3s names them.
    pub fn suffix(self) -> &'static str {
        match self {
            CaPurpose::Server => "-ca",
            CaPurpose::Client => "-cca",
            CaPurpose::Etcd => "-etcd",
        }
    }

    /// The `certificate` label of its expiry metric, after k3s's file name.
    pub fn certificate_label(self) -> &'static str {
        match self {
            CaPurpose::Server => "server-ca",
            CaPurpose::Client => "client-ca",
            CaPurpose::Etcd => "etcd-server-ca",
        }
    }

    pub fn secret_name(self, cluster: &str) -> String {
        format!("{cluster}{}", self.suffix())
    }

    /// The common name of a generated CA, as k3s names its own (`<name>@<unix time>`).
    pub fn common_name(self, unix_time: i64) -> String {
        let base = match self {
            CaPurpose::Server => "k3s-server-ca",
            CaPurpose::Client => "k3s-client-ca",
            CaPurpose::Etcd => "etcd-server-ca",
        };
        format!("{base}@{unix_time}")
    }
}

/// A Secret as observed (no key material).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum SecretState {
    Missing,
    /// Present and usable; `owned`: controller owner reference to this control plane.
    Valid {
        owned: bool,
    },
    /// Present but unusable; the reason names the Secret and key.
    Invalid {
        reason: String,
    },
}

/// The kubeconfig Secret as observed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum KubeconfigState {
    Missing,
    Present {
        owned: bool,
        /// notAfter of its client certificate, when it could be read.
        client_not_after: Option<DateTime<Utc>>,
        /// The server URL it points at, when it could be read.
        server: Option<String>,
        /// Why it could not be read, naming the Secret and key.
        problem: Option<String>,
    },
}

/// What the Secrets decision reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretsView {
    pub cluster: String,
    /// Once the control plane is initialized its servers run on these CAs: a
    /// CA that disappears is restored by a person, never generated anew (a new
    /// CA would not match what the servers trust).
    pub initialized: bool,
    pub server_ca: SecretState,
    pub client_ca: SecretState,
    pub etcd_ca: SecretState,
    pub token: SecretState,
    pub kubeconfig: KubeconfigState,
    /// `https://<host>:<port>` of `Cluster.spec.controlPlaneEndpoint`, once set.
    pub endpoint: Option<String>,
    pub now: DateTime<Utc>,
    /// When an owned kubeconfig's client certificate is renewed.
    pub kubeconfig_policy: KubeconfigPolicy,
    /// notAfter of each usable CA's certificate (generated or brought).
    pub ca_not_after: BTreeMap<CaPurpose, DateTime<Utc>>,
}

impl SecretsView {
    /// Nothing read yet (every Secret missing, no endpoint).
    pub fn unobserved(cluster: &str, now: DateTime<Utc>) -> Self {
        SecretsView {
            cluster: cluster.to_string(),
            initialized: false,
            server_ca: SecretState::Missing,
            client_ca: SecretState::Missing,
            etcd_ca: SecretState::Missing,
            token: SecretState::Missing,
            kubeconfig: KubeconfigState::Missing,
            endpoint: None,
            now,
            kubeconfig_policy: KubeconfigPolicy::default(),
            ca_not_after: BTreeMap::new(),
        }
    }

    fn ca(&self, purpose: CaPurpose) -> &SecretState {
        match purpose {
            CaPurpose::Server => &self.server_ca,
            CaPurpose::Client => &self.client_ca,
            CaPurpose::Etcd => &self.etcd_ca,
        }
    }

    /// The CAs this control plane needs (the etcd CA only with embedded etcd).
    ///
    /// The etcd CA too when the spec declares an external datastore: the
    /// bootstrap provider writes it onto every server whatever the spec says,
    /// and a server that runs embedded etcd after all must run it on a CA we
    /// hold, or its membership could never be read.
    pub fn needed_cas(&self) -> Vec<CaPurpose> {
        CaPurpose::ALL.to_vec()
    }
}

/// One Secret write.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "write", rename_all = "kebab-case")]
pub enum SecretWrite {
    GenerateCa { purpose: CaPurpose },
    GenerateToken,
    CreateKubeconfig,
    RotateKubeconfig { reason: String },
}

impl std::fmt::Display for SecretWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SecretWrite::GenerateCa { purpose } => write!(f, "generate the {purpose:?} CA"),
            SecretWrite::GenerateToken => write!(f, "generate the join token"),
            SecretWrite::CreateKubeconfig => write!(f, "create the admin kubeconfig"),
            SecretWrite::RotateKubeconfig { reason } => {
                write!(f, "rotate the admin kubeconfig ({reason})")
            }
        }
    }
}

/// The decision on the cluster Secrets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SecretPlan {
    pub writes: Vec<SecretWrite>,
    /// A Secret exists but cannot be used: nothing else may happen. Names the
    /// Secret and key.
    pub blocked: Option<String>,
    /// Every needed CA exists and is usable.
    pub certificates_available: bool,
    /// Why there is no kubeconfig yet (no endpoint, or its CAs are being made).
    pub kubeconfig_pending: Option<String>,
}

/// Decide which Secrets to write.
pub fn plan_secrets(view: &SecretsView) -> SecretPlan {
    let mut problems = Vec::new();
    let mut writes = Vec::new();
    for purpose in view.needed_cas() {
        match view.ca(purpose) {
            SecretState::Missing if view.initialized => problems.push(format!(
                "Secret {} is missing but the control plane is initialized: its servers trust that CA, so a new one is not generated; restore the Secret",
                purpose.secret_name(&view.cluster)
            )),
            SecretState::Missing => writes.push(SecretWrite::GenerateCa { purpose }),
            SecretState::Invalid { reason } => problems.push(reason.clone()),
            SecretState::Valid { .. } => {}
        }
    }
    match &view.token {
        SecretState::Missing => writes.push(SecretWrite::GenerateToken),
        SecretState::Invalid { reason } => problems.push(reason.clone()),
        SecretState::Valid { .. } => {}
    }
    let certificates_available = view
        .needed_cas()
        .into_iter()
        .all(|p| matches!(view.ca(p), SecretState::Valid { .. }));
    if !problems.is_empty() {
        return SecretPlan {
            writes: vec![],
            blocked: Some(problems.join("; ")),
            certificates_available: false,
            kubeconfig_pending: Some("a cluster Secret cannot be used".into()),
        };
    }
    let kubeconfig_cas_ready = matches!(view.server_ca, SecretState::Valid { .. })
        && matches!(view.client_ca, SecretState::Valid { .. });
    let mut kubeconfig_pending = None;
    match (&view.endpoint, &view.kubeconfig) {
        (None, KubeconfigState::Missing) => {
            kubeconfig_pending = Some("waiting for Cluster.spec.controlPlaneEndpoint".into());
        }
        (Some(_), KubeconfigState::Missing) if !kubeconfig_cas_ready => {
            kubeconfig_pending = Some("waiting for the server and client CAs".into());
        }
        (Some(_), KubeconfigState::Missing) => writes.push(SecretWrite::CreateKubeconfig),
        (
            endpoint,
            KubeconfigState::Present {
                owned: true,
                client_not_after,
                server,
                problem,
            },
        ) if kubeconfig_cas_ready => {
            if let Some(reason) = rotation_reason(
                view,
                endpoint.as_deref(),
                *client_not_after,
                server.as_deref(),
                problem.as_deref(),
            ) {
                writes.push(SecretWrite::RotateKubeconfig { reason });
            }
        }
        // Someone else's kubeconfig is used as it is; ours waits for its CAs.
        (_, KubeconfigState::Present { .. }) => {}
    }
    SecretPlan {
        writes,
        blocked: None,
        certificates_available,
        kubeconfig_pending,
    }
}

fn rotation_reason(
    view: &SecretsView,
    endpoint: Option<&str>,
    not_after: Option<DateTime<Utc>>,
    server: Option<&str>,
    problem: Option<&str>,
) -> Option<String> {
    if let Some(problem) = problem {
        return Some(format!("ours and unreadable: {problem}"));
    }
    if let (Some(wanted), Some(server)) = (endpoint, server)
        && wanted != server
    {
        return Some(format!("the endpoint moved from {server} to {wanted}"));
    }
    let not_after = not_after?;
    let policy = &view.kubeconfig_policy;
    policy.needs_rotation(not_after, view.now).then(|| {
        format!(
            "client certificate expires at {} ({}s left, renewing with less than {}s left)",
            not_after.to_rfc3339(),
            (not_after - view.now).num_seconds(),
            policy.renew_before.as_secs()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-12-01T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    const URL: &str = "https://10.0.0.1:6443";

    fn valid(owned: bool) -> SecretState {
        SecretState::Valid { owned }
    }

    fn complete() -> SecretsView {
        SecretsView {
            cluster: "c".into(),
            initialized: false,
            server_ca: valid(true),
            client_ca: valid(true),
            etcd_ca: valid(true),
            token: valid(true),
            kubeconfig: KubeconfigState::Present {
                owned: true,
                client_not_after: Some(now() + chrono::Duration::days(300)),
                server: Some(URL.into()),
                problem: None,
            },
            endpoint: Some(URL.into()),
            now: now(),
            kubeconfig_policy: KubeconfigPolicy::default(),
            ca_not_after: BTreeMap::new(),
        }
    }

    fn with(change: impl FnOnce(&mut SecretsView)) -> SecretsView {
        let mut v = complete();
        change(&mut v);
        v
    }

    #[test]
    fn table() {
        let missing_everything = with(|v| {
            v.server_ca = SecretState::Missing;
            v.client_ca = SecretState::Missing;
            v.etcd_ca = SecretState::Missing;
            v.token = SecretState::Missing;
            v.kubeconfig = KubeconfigState::Missing;
        });
        // (situation, view, writes, certificates available, kubeconfig pending)
        type Case<'a> = (
            &'a str,
            SecretsView,
            Vec<SecretWrite>,
            bool,
            Option<&'a str>,
        );
        let cases: Vec<Case> = vec![
            (
                "everything present and fresh: nothing to write",
                complete(),
                vec![],
                true,
                None,
            ),
            (
                "a new cluster: the three CAs and the token; the kubeconfig once the CAs exist",
                missing_everything.clone(),
                vec![
                    SecretWrite::GenerateCa {
                        purpose: CaPurpose::Server,
                    },
                    SecretWrite::GenerateCa {
                        purpose: CaPurpose::Client,
                    },
                    SecretWrite::GenerateCa {
                        purpose: CaPurpose::Etcd,
                    },
                    SecretWrite::GenerateToken,
                ],
                false,
                Some("waiting for the server and client CAs"),
            ),
            (
                "user-supplied CAs (not ours) are used as they are",
                with(|v| {
                    v.server_ca = valid(false);
                    v.client_ca = valid(false);
                    v.etcd_ca = valid(false);
                }),
                vec![],
                true,
                None,
            ),
            (
                "no endpoint yet: no kubeconfig, and it says why",
                with(|v| {
                    v.endpoint = None;
                    v.kubeconfig = KubeconfigState::Missing;
                }),
                vec![],
                true,
                Some("waiting for Cluster.spec.controlPlaneEndpoint"),
            ),
            (
                "endpoint set and CAs there: create the kubeconfig",
                with(|v| v.kubeconfig = KubeconfigState::Missing),
                vec![SecretWrite::CreateKubeconfig],
                true,
                None,
            ),
            (
                "someone else's kubeconfig near expiry is left alone",
                with(|v| {
                    v.kubeconfig = KubeconfigState::Present {
                        owned: false,
                        client_not_after: Some(now() + chrono::Duration::days(1)),
                        server: Some(URL.into()),
                        problem: None,
                    }
                }),
                vec![],
                true,
                None,
            ),
        ];
        for (situation, view, writes, certificates, pending) in cases {
            let plan = plan_secrets(&view);
            assert_eq!(plan.writes, writes, "{situation}");
            assert_eq!(plan.certificates_available, certificates, "{situation}");
            assert_eq!(plan.kubeconfig_pending.as_deref(), pending, "{situation}");
            assert_eq!(plan.blocked, None, "{situation}");
        }
    }

    #[test]
    fn an_unusable_user_secret_blocks_everything_and_is_never_overwritten() {
        let view = with(|v| {
            v.client_ca = SecretState::Invalid {
                reason: "Secret ns/c-cca: key tls.key is missing".into(),
            };
            v.token = SecretState::Missing;
        });
        let plan = plan_secrets(&view);
        assert!(plan.writes.is_empty(), "{:?}", plan.writes);
        assert_eq!(
            plan.blocked.as_deref(),
            Some("Secret ns/c-cca: key tls.key is missing")
        );
        assert!(!plan.certificates_available);
    }

    #[test]
    fn a_ca_lost_after_initialization_is_not_generated_anew() {
        let plan = plan_secrets(&with(|v| {
            v.initialized = true;
            v.etcd_ca = SecretState::Missing;
        }));
        assert!(plan.writes.is_empty(), "{:?}", plan.writes);
        let blocked = plan.blocked.expect("refused");
        assert!(
            blocked.contains("c-etcd") && blocked.contains("restore"),
            "{blocked}"
        );
        // The token is not a CA: a lost one is generated again.
        let plan = plan_secrets(&with(|v| {
            v.initialized = true;
            v.token = SecretState::Missing;
        }));
        assert_eq!(plan.writes, vec![SecretWrite::GenerateToken]);
    }

    #[test]
    fn owned_kubeconfig_rotation() {
        let cert = |left: chrono::Duration| {
            with(|v| {
                v.kubeconfig = KubeconfigState::Present {
                    owned: true,
                    client_not_after: Some(now() + left),
                    server: Some(URL.into()),
                    problem: None,
                }
            })
        };
        let fresh = plan_secrets(&cert(chrono::Duration::days(293)));
        assert!(fresh.writes.is_empty(), "{:?}", fresh.writes);
        let due = plan_secrets(&cert(chrono::Duration::days(291)));
        assert!(
            matches!(&due.writes[..], [SecretWrite::RotateKubeconfig { reason }] if reason.contains("expires")),
            "{:?}",
            due.writes
        );
        let moved = plan_secrets(&with(|v| v.endpoint = Some("https://10.0.0.2:6443".into())));
        assert!(
            matches!(&moved.writes[..], [SecretWrite::RotateKubeconfig { reason }] if reason.contains("10.0.0.2")),
            "{:?}",
            moved.writes
        );
        let unreadable = plan_secrets(&with(|v| {
            v.kubeconfig = KubeconfigState::Present {
                owned: true,
                client_not_after: None,
                server: None,
                problem: Some("Secret ns/c-kubeconfig[value]: not a kubeconfig".into()),
            }
        }));
        assert!(
            matches!(&unreadable.writes[..], [SecretWrite::RotateKubeconfig { reason }] if reason.contains("not a kubeconfig")),
            "{:?}",
            unreadable.writes
        );
    }

    #[test]
    fn ca_names_follow_cluster_api_k3s() {
        assert_eq!(CaPurpose::Server.secret_name("demo"), "demo-ca");
        assert_eq!(CaPurpose::Client.secret_name("demo"), "demo-cca");
        assert_eq!(CaPurpose::Etcd.secret_name("demo"), "demo-etcd");
        assert_eq!(CaPurpose::Etcd.common_name(7), "etcd-server-ca@7");
    }
}
