//! etcd connections per workload cluster, reused across reconciles: a reconcile
//! with nothing new to learn opens no new connection. An entry is replaced when
//! the `<cluster>-etcd` Secret changes (new CA), never silently kept stale.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::etcd::{ClientTls, EtcdCluster, EtcdError, Timeouts, Transport};

/// Lifetime of the client certificates we mint from the etcd CA (renewed
/// automatically well before expiry).
pub const CLIENT_CERT_LIFETIME: Duration = Duration::from_secs(3600);

/// What identifies one pooled connection set.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PoolKey {
    pub namespace: String,
    pub cluster: String,
}

struct Entry {
    /// `metadata.resourceVersion` (and uid) of the etcd CA Secret it was built from.
    secret_version: String,
    cluster: Arc<EtcdCluster>,
}

/// The pool; cheap to clone.
#[derive(Clone, Default)]
pub struct EtcdPool {
    entries: Arc<Mutex<HashMap<PoolKey, Entry>>>,
    timeouts: Option<Timeouts>,
    /// Handles built so far (a new cluster, or a changed CA Secret).
    built: Arc<std::sync::atomic::AtomicU64>,
}

/// The etcd CA as read from the `<cluster>-etcd` Secret.
pub struct EtcdCaPem<'a> {
    /// Names the Secret and key in errors, e.g. `ns/c1-etcd[tls.crt]`.
    pub cert_field: &'a str,
    pub cert: &'a [u8],
    pub key_field: &'a str,
    pub key: &'a [u8],
    pub secret_version: &'a str,
}

impl EtcdPool {
    pub fn with_timeouts(timeouts: Timeouts) -> Self {
        EtcdPool {
            timeouts: Some(timeouts),
            ..EtcdPool::default()
        }
    }

    /// The cluster handle for `key`, reusing the pooled one while the CA Secret
    /// is unchanged; `seeds` (client URLs derived from Nodes) only matter when a
    /// new handle is built (a handle learns members' URLs itself).
    pub fn get(
        &self,
        key: &PoolKey,
        ca: &EtcdCaPem<'_>,
        seeds: &[String],
    ) -> Result<Arc<EtcdCluster>, EtcdError> {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = entries.get(key)
            && entry.secret_version == ca.secret_version
        {
            return Ok(entry.cluster.clone());
        }
        let tls = ClientTls::minted_from_ca(
            (ca.cert_field, ca.cert),
            (ca.key_field, ca.key),
            CLIENT_CERT_LIFETIME,
        )
        .map_err(EtcdError::from)?;
        let cluster = Arc::new(EtcdCluster::with_options(
            seeds,
            tls,
            Transport::Direct,
            self.timeouts.unwrap_or_default(),
        )?);
        self.built
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // The old handle (and every connection and certificate it holds) is
        // dropped here: nothing minted from a previous CA is used again.
        entries.insert(
            key.clone(),
            Entry {
                secret_version: ca.secret_version.to_string(),
                cluster: cluster.clone(),
            },
        );
        Ok(cluster)
    }

    /// Forget a cluster (its KThreesControlPlane or Cluster went away).
    pub fn drop_cluster(&self, key: &PoolKey) {
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }

    /// Connections opened by every pooled handle (a gauge for tests and metrics).
    pub fn connections_opened(&self) -> u64 {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries
            .values()
            .map(|e| e.cluster.connections_opened())
            .sum()
    }

    /// Handles built since start: one per workload cluster, plus one per CA change.
    pub fn handles_built(&self) -> u64 {
        self.built.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
