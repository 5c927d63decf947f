//! The cluster Secrets (`<cluster>-ca`, `-cca`, `-etcd`, `-token`,
//! `-kubeconfig`): reading them into states for the pure decision
//! ([`crate::lifecycle::plan_secrets`]), and writing what it decided.
//! Look up or generate: a create never replaces a Secret (a 409 means someone
//! was first, and the next reconcile reads theirs); only a kubeconfig we own is
//! ever updated, guarded by its resourceVersion.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{PostParams, Resource};
use kube::{Api, ResourceExt};

use crate::api::KThreesControlPlane;
use crate::api::names::{
    KUBECONFIG_SECRET_KEY, KUBECONFIG_SECRET_SUFFIX, TOKEN_SECRET_KEY, TOKEN_SECRET_SUFFIX,
};
use crate::lifecycle::{CaPurpose, KubeconfigState, SecretState, SecretWrite, SecretsView};
use crate::pki::{self, CertKeyPem, KubeconfigPolicy};
use crate::workload::secrets::{etcd_access_from_secret, secret_ref};

use super::error::{Error, Result};

const TOKEN_KEY: &str = TOKEN_SECRET_KEY;

/// The annotation `kubectl apply` keeps on what it applied: the whole object
/// again, for a Secret its data too.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drop from a Secret the Secret cache keeps what no decision reads: the
/// field-ownership records (as [`super::caches::trim`] does) and a `kubectl apply` copy of the whole
/// Secret, so that a cluster's certificates and keys are held once, not twice.
pub fn trim_secret(secret: &mut Secret) {
    secret.metadata.managed_fields = None;
    if let Some(annotations) = secret.metadata.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
}

/// The five Secrets as read (`None` = not found). Never logged: no `Debug`.
/// Built once per read and not changed after: what their content says is
/// worked out on first use, once for every reconcile the Secret cache shares
/// them with until the Secrets are read again.
#[derive(Default)]
pub struct ClusterSecretObjects {
    pub server_ca: Option<Secret>,
    pub client_ca: Option<Secret>,
    pub etcd_ca: Option<Secret>,
    pub token: Option<Secret>,
    pub kubeconfig: Option<Secret>,
    pub(super) parsed: Parsed,
}

/// What the Secrets' content says, each part worked out at most once per
/// read: checking a CA parses its certificate and its key (and derives the
/// key's public half to compare), and a kubeconfig is YAML parsed twice.
#[derive(Default)]
pub(super) struct Parsed {
    /// Per [`CaPurpose`], in declaration order: usable, or why not.
    cas: [OnceLock<std::result::Result<(), String>>; 3],
    /// Per [`CaPurpose`]: its certificate's notAfter, when it can be read.
    ca_not_after: [OnceLock<Option<DateTime<Utc>>>; 3],
    kubeconfig: OnceLock<KubeconfigContent>,
}

/// A kubeconfig Secret's text, read: where it points, when its client
/// certificate expires (each, or the error naming the field).
struct KubeconfigContent {
    server: std::result::Result<String, String>,
    client_not_after: std::result::Result<DateTime<Utc>, String>,
}

fn purpose_index(purpose: CaPurpose) -> usize {
    match purpose {
        CaPurpose::Server => 0,
        CaPurpose::Client => 1,
        CaPurpose::Etcd => 2,
    }
}

impl ClusterSecretObjects {
    /// Read all five through `api` (the cluster's namespace).
    pub async fn read(api: &Api<Secret>, namespace: &str, cluster: &str) -> Result<Self> {
        let get = |name: String| async move {
            let mut secret = api.get_opt(&name).await.map_err(|source| Error::Observe {
                context: format!("get Secret {namespace}/{name}"),
                source,
            })?;
            secret.iter_mut().for_each(trim_secret);
            Ok::<_, Error>(secret)
        };
        Ok(Self {
            server_ca: get(CaPurpose::Server.secret_name(cluster)).await?,
            client_ca: get(CaPurpose::Client.secret_name(cluster)).await?,
            etcd_ca: get(CaPurpose::Etcd.secret_name(cluster)).await?,
            token: get(format!("{cluster}{TOKEN_SECRET_SUFFIX}")).await?,
            kubeconfig: get(format!("{cluster}{KUBECONFIG_SECRET_SUFFIX}")).await?,
            parsed: Parsed::default(),
        })
    }

    /// Whether the CA Secret of `purpose` holds a CA certificate and its key
    /// (`Err`: why not); `None` when the Secret was not found.
    pub fn ca_validity(&self, purpose: CaPurpose) -> Option<std::result::Result<(), &str>> {
        let secret = self.ca(purpose)?;
        let checked = self.parsed.cas[purpose_index(purpose)].get_or_init(|| {
            etcd_access_from_secret(Some(secret))
                .map(|_| ())
                .map_err(|e| e.to_string())
        });
        Some(checked.as_ref().map(|_| ()).map_err(String::as_str))
    }

    /// When the CA certificate of `purpose` expires; `None` when the Secret
    /// was not found or its `tls.crt` cannot be read (its validity says why).
    pub fn ca_not_after(&self, purpose: CaPurpose) -> Option<DateTime<Utc>> {
        let secret = self.ca(purpose)?;
        *self.parsed.ca_not_after[purpose_index(purpose)].get_or_init(|| {
            let pem = secret.data.as_ref()?.get("tls.crt")?;
            let pem = std::str::from_utf8(&pem.0).ok()?;
            crate::pki::ca::not_after(pem, "tls.crt").ok()
        })
    }

    /// Whether `other` holds the same five Secrets at the same versions (uid
    /// and resourceVersion; both absent counts as the same, a Secret without
    /// either never does).
    pub fn same_versions(&self, other: &ClusterSecretObjects) -> bool {
        let version = |s: &Option<Secret>| -> Option<Option<(String, String)>> {
            match s {
                None => Some(None),
                Some(s) => Some(Some((
                    s.metadata.uid.clone()?,
                    s.metadata.resource_version.clone()?,
                ))),
            }
        };
        let all = |o: &ClusterSecretObjects| {
            [
                version(&o.server_ca),
                version(&o.client_ca),
                version(&o.etcd_ca),
                version(&o.token),
                version(&o.kubeconfig),
            ]
        };
        let (mine, theirs) = (all(self), all(other));
        mine.iter().all(Option::is_some) && mine == theirs
    }

    fn kubeconfig_content(&self, text: &str, field: &str) -> &KubeconfigContent {
        self.parsed.kubeconfig.get_or_init(|| KubeconfigContent {
            server: pki::kubeconfig_server(text, field).map_err(|e| e.to_string()),
            client_not_after: pki::kubeconfig_client_not_after(text, field)
                .map_err(|e| e.to_string()),
        })
    }

    pub fn ca(&self, purpose: CaPurpose) -> Option<&Secret> {
        match purpose {
            CaPurpose::Server => self.server_ca.as_ref(),
            CaPurpose::Client => self.client_ca.as_ref(),
            CaPurpose::Etcd => self.etcd_ca.as_ref(),
        }
    }
}

fn owned_by(secret: &Secret, kcp: &KThreesControlPlane) -> bool {
    let uid = kcp.uid();
    secret
        .owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && Some(&o.uid) == uid.as_ref())
}

/// A CA Secret: usable when `tls.crt` is a CA and `tls.key` its key.
pub fn ca_state(
    objects: &ClusterSecretObjects,
    purpose: CaPurpose,
    kcp: &KThreesControlPlane,
) -> SecretState {
    let (Some(secret), Some(validity)) = (objects.ca(purpose), objects.ca_validity(purpose)) else {
        return SecretState::Missing;
    };
    match validity {
        Ok(()) => SecretState::Valid {
            owned: owned_by(secret, kcp),
        },
        Err(reason) => SecretState::Invalid {
            reason: reason.to_string(),
        },
    }
}

/// The token Secret: usable when key `value` holds non-empty text.
pub fn token_state(secret: Option<&Secret>, kcp: &KThreesControlPlane) -> SecretState {
    let Some(secret) = secret else {
        return SecretState::Missing;
    };
    let value = secret
        .data
        .as_ref()
        .and_then(|d| d.get(TOKEN_KEY))
        .map(|b| b.0.as_slice());
    match value {
        Some(v) if !v.is_empty() && std::str::from_utf8(v).is_ok() => SecretState::Valid {
            owned: owned_by(secret, kcp),
        },
        _ => SecretState::Invalid {
            reason: format!(
                "secret {} has no non-empty text key {TOKEN_KEY:?} (the k3s join token)",
                secret_ref(secret)
            ),
        },
    }
}

/// The kubeconfig Secret: who owns it, where it points, when its client
/// certificate expires.
pub fn kubeconfig_state(
    objects: &ClusterSecretObjects,
    kcp: &KThreesControlPlane,
) -> KubeconfigState {
    let Some(secret) = objects.kubeconfig.as_ref() else {
        return KubeconfigState::Missing;
    };
    let field = format!("secret {}[{KUBECONFIG_SECRET_KEY}]", secret_ref(secret));
    let text = secret
        .data
        .as_ref()
        .and_then(|d| d.get(KUBECONFIG_SECRET_KEY))
        .and_then(|b| std::str::from_utf8(&b.0).ok());
    let owned = owned_by(secret, kcp);
    let Some(text) = text else {
        return KubeconfigState::Present {
            owned,
            client_not_after: None,
            server: None,
            problem: Some(format!("{field}: missing or not UTF-8 text")),
        };
    };
    let content = objects.kubeconfig_content(text, &field);
    let problem = match (&content.server, &content.client_not_after) {
        (Err(e), _) | (_, Err(e)) => Some(e.clone()),
        _ => None,
    };
    KubeconfigState::Present {
        owned,
        client_not_after: content.client_not_after.as_ref().ok().copied(),
        server: content.server.as_ref().ok().cloned(),
        problem,
    }
}

/// The observation the Secrets decision reads.
pub fn secrets_view(
    kcp: &KThreesControlPlane,
    cluster: &str,
    objects: &ClusterSecretObjects,
    endpoint: Option<String>,
    policy: &KubeconfigPolicy,
    now: DateTime<Utc>,
) -> SecretsView {
    SecretsView {
        cluster: cluster.to_string(),
        initialized: kcp.is_initialized(),
        server_ca: ca_state(objects, CaPurpose::Server, kcp),
        client_ca: ca_state(objects, CaPurpose::Client, kcp),
        etcd_ca: ca_state(objects, CaPurpose::Etcd, kcp),
        token: token_state(objects.token.as_ref(), kcp),
        kubeconfig: kubeconfig_state(objects, kcp),
        endpoint,
        now,
        kubeconfig_policy: *policy,
        ca_not_after: CaPurpose::ALL
            .into_iter()
            .filter(|p| objects.ca_validity(*p) == Some(Ok(())))
            .filter_map(|p| Some((p, objects.ca_not_after(p)?)))
            .collect(),
    }
}

/// What to write, with where.
pub struct SecretWriter<'a> {
    pub api: &'a Api<Secret>,
    pub kcp: &'a KThreesControlPlane,
    pub namespace: &'a str,
    pub cluster: &'a str,
    pub endpoint: Option<&'a str>,
    pub policy: &'a KubeconfigPolicy,
}

impl SecretWriter<'_> {
    fn owner(&self) -> Result<OwnerReference> {
        self.kcp
            .controller_owner_ref(&())
            .ok_or_else(|| Error::Precondition {
                step: "cluster-secrets".into(),
                reason: format!(
                    "KThreesControlPlane {}/{}: metadata.uid is not set yet",
                    self.namespace,
                    self.kcp.name_any()
                ),
            })
    }

    fn pki_error(&self, what: &str, err: pki::PkiError) -> Error {
        Error::Precondition {
            step: format!("cluster-secrets: {what}"),
            reason: err.to_string(),
        }
    }

    async fn create(&self, secret: Secret) -> Result<()> {
        let name = secret.name_any();
        match self.api.create(&PostParams::default(), &secret).await {
            Ok(_) => Ok(()),
            // Someone was first: never overwrite; the next reconcile reads theirs.
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(source) => Err(Error::Act {
                step: format!("create Secret {}/{name}", self.namespace),
                source,
            }),
        }
    }

    async fn read_ca(&self, purpose: CaPurpose) -> Result<CertKeyPem> {
        let name = purpose.secret_name(self.cluster);
        let secret = self.api.get(&name).await.map_err(|source| Error::Observe {
            context: format!("get Secret {}/{name}", self.namespace),
            source,
        })?;
        let ca =
            pki::ca_from_secret(&secret).map_err(|e| self.pki_error(&format!("read {name}"), e))?;
        pki::validate_ca(&ca, &format!("{}/{name}", self.namespace))
            .map_err(|e| self.pki_error(&format!("read {name}"), e))?;
        Ok(ca)
    }

    fn kubeconfig_text(&self, server_ca: &CertKeyPem, client_ca: &CertKeyPem) -> Result<String> {
        let endpoint = self.endpoint.ok_or_else(|| Error::Precondition {
            step: "cluster-secrets: kubeconfig".into(),
            reason: format!(
                "Cluster {}/{}: spec.controlPlaneEndpoint is not set",
                self.namespace, self.cluster
            ),
        })?;
        pki::admin_kubeconfig(
            self.cluster,
            endpoint,
            &server_ca.cert_pem,
            client_ca,
            self.policy,
            Utc::now(),
        )
        .map_err(|e| self.pki_error("render the kubeconfig", e))
    }

    /// Carry out one write.
    pub async fn write(&self, write: &SecretWrite) -> Result<()> {
        let owner = self.owner()?;
        match write {
            SecretWrite::GenerateCa { purpose } => {
                let ca = pki::generate_ca(
                    &purpose.common_name(Utc::now().timestamp()),
                    pki::CA_LIFETIME,
                )
                .map_err(|e| self.pki_error("generate a CA", e))?;
                let name = purpose.secret_name(self.cluster);
                self.create(pki::ca_secret(
                    self.namespace,
                    self.cluster,
                    &name,
                    &ca,
                    owner,
                ))
                .await
            }
            SecretWrite::GenerateToken => {
                let data =
                    BTreeMap::from([(TOKEN_KEY.to_string(), pki::generate_token().into_bytes())]);
                self.create(pki::cluster_secret(
                    self.namespace,
                    self.cluster,
                    &format!("{}{TOKEN_SECRET_SUFFIX}", self.cluster),
                    data,
                    owner,
                ))
                .await
            }
            SecretWrite::CreateKubeconfig => {
                let server_ca = self.read_ca(CaPurpose::Server).await?;
                let client_ca = self.read_ca(CaPurpose::Client).await?;
                let text = self.kubeconfig_text(&server_ca, &client_ca)?;
                let data = BTreeMap::from([(KUBECONFIG_SECRET_KEY.to_string(), text.into_bytes())]);
                self.create(pki::cluster_secret(
                    self.namespace,
                    self.cluster,
                    &format!("{}{KUBECONFIG_SECRET_SUFFIX}", self.cluster),
                    data,
                    owner,
                ))
                .await
            }
            SecretWrite::RotateKubeconfig { .. } => {
                let name = format!("{}{KUBECONFIG_SECRET_SUFFIX}", self.cluster);
                let mut current = self.api.get(&name).await.map_err(|source| Error::Observe {
                    context: format!("get Secret {}/{name}", self.namespace),
                    source,
                })?;
                if !owned_by(&current, self.kcp) {
                    // Decided on an older read; someone else's now: leave it.
                    return Ok(());
                }
                let server_ca = self.read_ca(CaPurpose::Server).await?;
                let client_ca = self.read_ca(CaPurpose::Client).await?;
                let text = self.kubeconfig_text(&server_ca, &client_ca)?;
                current.data = Some(BTreeMap::from([(
                    KUBECONFIG_SECRET_KEY.to_string(),
                    k8s_openapi::ByteString(text.into_bytes()),
                )]));
                current.string_data = None;
                // A replace carries the resourceVersion read: a concurrent
                // change is a 409, and the next reconcile decides again.
                self.api
                    .replace(&name, &PostParams::default(), &current)
                    .await
                    .map_err(|source| Error::Act {
                        step: format!("rotate Secret {}/{name}", self.namespace),
                        source,
                    })?;
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::pki::{ca_secret, generate_ca, kubeconfig_secret};

    fn owner() -> OwnerReference {
        OwnerReference {
            api_version: "controlplane.cluster.x-k8s.io/v1beta2".into(),
            kind: "KThreesControlPlane".into(),
            name: "kcp".into(),
            uid: "kcp-uid".into(),
            controller: Some(true),
            ..Default::default()
        }
    }

    fn kcp() -> KThreesControlPlane {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta2",
            "kind": "KThreesControlPlane",
            "metadata": {"name": "kcp", "namespace": "ns", "uid": "kcp-uid"},
            "spec": {"version": "v1.30.2+k3s1"},
        }))
        .unwrap()
    }

    fn objects() -> ClusterSecretObjects {
        let server = generate_ca("k3s-server-ca", Duration::from_secs(3600)).unwrap();
        let client = generate_ca("k3s-client-ca", Duration::from_secs(3600)).unwrap();
        let mut not_a_ca = ca_secret("ns", "c1", "c1-etcd", &server, owner());
        // The server CA's certificate with the client CA's key: not usable.
        not_a_ca.data.as_mut().unwrap().insert(
            "tls.key".into(),
            k8s_openapi::ByteString(client.key_pem.clone().into_bytes()),
        );
        let kubeconfig = pki::admin_kubeconfig(
            "c1",
            "https://10.0.0.1:6443",
            &server.cert_pem,
            &client,
            &KubeconfigPolicy::default(),
            Utc::now(),
        )
        .unwrap();
        ClusterSecretObjects {
            server_ca: Some(ca_secret("ns", "c1", "c1-ca", &server, owner())),
            client_ca: Some(ca_secret("ns", "c1", "c1-cca", &client, owner())),
            etcd_ca: Some(not_a_ca),
            kubeconfig: Some(kubeconfig_secret("ns", "c1", &kubeconfig, owner())),
            ..Default::default()
        }
    }

    /// What the Secrets say is worked out once per read, for every reconcile
    /// the Secret cache shares the read with; the verdicts are those of the
    /// checks themselves.
    #[test]
    fn the_secrets_content_is_checked_once_per_read_and_shared_by_every_reconcile() {
        let read = std::sync::Arc::new(objects());
        let handed_out = read.clone();
        assert!(read.parsed.cas.iter().all(|c| c.get().is_none()));
        assert!(read.parsed.kubeconfig.get().is_none());

        let view = secrets_view(
            &kcp(),
            "c1",
            &handed_out,
            None,
            &KubeconfigPolicy::default(),
            Utc::now(),
        );
        assert_eq!(view.server_ca, SecretState::Valid { owned: true });
        assert_eq!(view.client_ca, SecretState::Valid { owned: true });
        let SecretState::Invalid { reason } = &view.etcd_ca else {
            panic!("a CA whose key is another's: {:?}", view.etcd_ca);
        };
        assert!(reason.contains("ns/c1-etcd"), "{reason}");
        let KubeconfigState::Present {
            server, problem, ..
        } = &view.kubeconfig
        else {
            panic!("{:?}", view.kubeconfig);
        };
        assert_eq!(server.as_deref(), Some("https://10.0.0.1:6443"));
        assert_eq!(problem, &None);

        // Every holder of the read sees the verdicts one of them worked out.
        assert!(read.parsed.cas.iter().all(|c| c.get().is_some()));
        assert!(read.parsed.kubeconfig.get().is_some());
        assert_eq!(read.ca_validity(CaPurpose::Server), Some(Ok(())));
        assert!(matches!(read.ca_validity(CaPurpose::Etcd), Some(Err(_))));
        // A new read starts with nothing worked out.
        assert!(objects().parsed.cas.iter().all(|c| c.get().is_none()));
        assert_eq!(
            ClusterSecretObjects::default().ca_validity(CaPurpose::Etcd),
            None
        );
    }

    /// A cached Secret keeps its data, versions, owners and other
    /// annotations; it loses the ownership records and `kubectl apply`'s
    /// second copy of its data.
    #[test]
    fn a_cached_secret_is_held_once_without_what_no_decision_reads() {
        let mut applied: Secret = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {
                "name": "c1-etcd", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "x", "uid": "o1", "controller": true}],
                "annotations": {
                    LAST_APPLIED: "{\"data\":{\"tls.key\":\"S0VZ\"}}",
                    "example.com/kept": "yes",
                },
                "managedFields": [{"manager": "kubectl", "operation": "Apply", "apiVersion": "v1"}],
            },
            "data": {"tls.key": "S0VZ"},
        }))
        .unwrap();
        let before = applied.clone();
        trim_secret(&mut applied);
        assert_eq!(applied.metadata.managed_fields, None);
        assert_eq!(
            applied.metadata.annotations,
            Some([("example.com/kept".to_string(), "yes".to_string())].into())
        );
        assert_eq!(applied.data, before.data);
        assert_eq!(applied.metadata.uid, before.metadata.uid);
        assert_eq!(
            applied.metadata.resource_version,
            before.metadata.resource_version
        );
        assert_eq!(
            applied.metadata.owner_references,
            before.metadata.owner_references
        );
    }
}
