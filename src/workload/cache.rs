//! One workload client per cluster, keyed by (namespace, cluster) and rebuilt
//! only when the kubeconfig or etcd Secret changes (uid or resourceVersion), so
//! a rotated kubeconfig or CA takes effect on the next reconcile.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::Api;

use super::error::Error;
use super::reads::WorkloadReads;
use super::secrets::{
    EtcdAccess, SecretIdentity, etcd_access_from_secret, etcd_secret_name, kubeconfig_from_secret,
    kubeconfig_secret_name, secret_ref,
};

/// A workload cluster: namespace and name of its CAPI Cluster.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClusterKey {
    pub namespace: String,
    pub cluster: String,
}

impl ClusterKey {
    pub fn new(namespace: impl Into<String>, cluster: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            cluster: cluster.into(),
        }
    }
}

impl std::fmt::Display for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.cluster)
    }
}

/// The two Secrets as read by the caller (`None` = not found). `Debug` shows
/// only each Secret's name, uid and resourceVersion, never its data.
#[derive(Clone, Default)]
pub struct ClusterSecrets {
    pub kubeconfig: Option<Secret>,
    pub etcd: Option<Secret>,
}

impl std::fmt::Debug for ClusterSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterSecrets")
            .field("kubeconfig", &self.kubeconfig.as_ref().map(SecretIdentity))
            .field("etcd", &self.etcd.as_ref().map(SecretIdentity))
            .finish()
    }
}

/// Identity of one Secret version.
type Fingerprint = Option<(Option<String>, Option<String>)>;

fn fingerprint(secret: Option<&Secret>) -> Fingerprint {
    secret.map(|s| (s.uid(), s.resource_version()))
}

impl ClusterSecrets {
    /// Read both Secrets of `key` through `api` (scoped to the cluster's namespace).
    pub async fn read(api: &Api<Secret>, key: &ClusterKey) -> Result<Self, Error> {
        let get = |name: String| async move {
            api.get_opt(&name)
                .await
                .map_err(|source| Error::ReadSecret {
                    secret: format!("{}/{name}", key.namespace),
                    source,
                })
        };
        Ok(Self {
            kubeconfig: get(kubeconfig_secret_name(&key.cluster)).await?,
            etcd: get(etcd_secret_name(&key.cluster)).await?,
        })
    }

    fn fingerprints(&self) -> (Fingerprint, Fingerprint) {
        (
            fingerprint(self.kubeconfig.as_ref()),
            fingerprint(self.etcd.as_ref()),
        )
    }
}

/// Everything needed to act on one workload cluster.
pub struct WorkloadAccess {
    pub key: ClusterKey,
    /// The reads of each reconcile (the Node LIST), on a connection of
    /// their own with no request queue, and the kube client of the workload
    /// cluster's API server (`reads.client()`, made on first need).
    pub reads: WorkloadReads,
    /// The etcd CA, or "not managed".
    pub etcd: EtcdAccess,
}

impl std::fmt::Debug for WorkloadAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkloadAccess")
            .field("key", &self.key)
            .field("etcd", &self.etcd)
            .finish_non_exhaustive()
    }
}

impl WorkloadAccess {
    /// Build from the Secrets; fails with a typed error naming the Secret and key.
    pub async fn build(key: &ClusterKey, secrets: &ClusterSecrets) -> Result<Self, Error> {
        let kubeconfig = secrets
            .kubeconfig
            .as_ref()
            .ok_or_else(|| Error::SecretMissing {
                secret: format!("{}/{}", key.namespace, kubeconfig_secret_name(&key.cluster)),
            })?;
        let config = kubeconfig_from_secret(kubeconfig).await?;
        let etcd = etcd_access_from_secret(secrets.etcd.as_ref())?;
        let reads = super::reads::workload_reads(config).map_err(|source| Error::BuildClient {
            secret: secret_ref(kubeconfig),
            source,
        })?;
        Ok(Self {
            key: key.clone(),
            reads,
            etcd,
        })
    }
}

struct Entry {
    fingerprints: (Fingerprint, Fingerprint),
    access: Arc<WorkloadAccess>,
}

/// Per-cluster cache of [`WorkloadAccess`].
#[derive(Default)]
pub struct WorkloadCache {
    entries: Mutex<HashMap<ClusterKey, Entry>>,
}

impl WorkloadCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// The cached access for `key` if both Secrets are unchanged, else a new one
    /// (which replaces the old). Errors are not cached: the next call retries.
    #[tracing::instrument(skip(self, secrets), fields(cluster = %key))]
    pub async fn get(
        &self,
        key: &ClusterKey,
        secrets: &ClusterSecrets,
    ) -> Result<Arc<WorkloadAccess>, Error> {
        let wanted = secrets.fingerprints();
        if let Some(entry) = self.entries.lock().expect("cache lock").get(key)
            && entry.fingerprints == wanted
        {
            return Ok(entry.access.clone());
        }
        let access = Arc::new(WorkloadAccess::build(key, secrets).await?);
        tracing::debug!(
            etcd_managed = matches!(access.etcd, EtcdAccess::Managed(_)),
            "built workload cluster access"
        );
        self.entries.lock().expect("cache lock").insert(
            key.clone(),
            Entry {
                fingerprints: wanted,
                access: access.clone(),
            },
        );
        Ok(access)
    }

    /// Read the Secrets through `api` and return the (possibly cached) access.
    pub async fn get_with_api(
        &self,
        api: &Api<Secret>,
        key: &ClusterKey,
    ) -> Result<Arc<WorkloadAccess>, Error> {
        let secrets = ClusterSecrets::read(api, key).await?;
        self.get(key, &secrets).await
    }

    /// Drop the entry of `key` (e.g. when the Cluster is deleted).
    pub fn invalidate(&self, key: &ClusterKey) {
        self.entries.lock().expect("cache lock").remove(key);
    }

    /// Number of cached clusters.
    pub fn len(&self) -> usize {
        self.entries.lock().expect("cache lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;
    use kube::api::ObjectMeta;

    use super::*;

    fn secret(name: &str, data: &[(&str, &str)]) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("team-a".into()),
                uid: Some(format!("uid-{name}")),
                resource_version: Some("42".into()),
                labels: Some(BTreeMap::from([("label".into(), "LABEL-VALUE".into())])),
                ..Default::default()
            },
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                    .collect(),
            ),
            string_data: Some(BTreeMap::from([("extra".into(), "STRING-DATA".into())])),
            ..Default::default()
        }
    }

    fn base64(text: &str) -> String {
        match serde_json::to_value(ByteString(text.as_bytes().to_vec())).unwrap() {
            serde_json::Value::String(b64) => b64,
            _ => unreachable!(),
        }
    }

    #[test]
    fn debug_of_cluster_secrets_shows_identities_and_no_data() {
        let key_pem = rcgen::KeyPair::generate().unwrap().serialize_pem();
        let kubeconfig = format!(
            "users:\n- user:\n    client-key-data: {}\n",
            base64(&key_pem)
        );
        let secrets = ClusterSecrets {
            kubeconfig: Some(secret("prod-kubeconfig", &[("value", &kubeconfig)])),
            etcd: Some(secret(
                "prod-etcd",
                &[("tls.crt", &key_pem), ("tls.key", &key_pem)],
            )),
        };
        let shown = format!("{secrets:?}");
        for expected in [
            "team-a/prod-kubeconfig",
            "uid-prod-kubeconfig",
            "team-a/prod-etcd",
            "uid-prod-etcd",
            "42",
        ] {
            assert!(shown.contains(expected), "{expected} missing: {shown}");
        }
        let pem_line = key_pem.lines().nth(1).unwrap();
        for leaked in [
            "BEGIN",
            "PRIVATE KEY",
            pem_line,
            &base64(&key_pem)[..24],
            &base64(&kubeconfig)[..24],
            "client-key-data",
            "ByteString",
            "STRING-DATA",
            "LABEL-VALUE",
        ] {
            assert!(!shown.contains(leaked), "Debug leaks {leaked:?}: {shown}");
        }
        let pretty = format!("{secrets:#?}");
        assert!(!pretty.contains("BEGIN") && !pretty.contains(pem_line));
        let empty = format!("{:?}", ClusterSecrets::default());
        assert_eq!(empty, "ClusterSecrets { kubeconfig: None, etcd: None }");
    }
}
