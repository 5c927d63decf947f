//! etcd connections per workload cluster, reused across reconciles: a reconcile
//! with nothing new to learn opens no new connection. An entry is replaced when
//! the `<cluster>-etcd` Secret changes (new CA), never silently kept stale.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::etcd::{ClientTls, EtcdCluster, EtcdError, Timeouts, Transport};
use crate::workload::portforward::PortForwardRelay;

/// How etcd members are reached (`run --etcd-transport`, or the
/// KThreesControlPlane annotation `controlplane.cluster.x-k8s.io/etcd-transport`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum TransportMode {
    /// Direct first; port-forward when direct cannot connect (remembered per cluster).
    #[default]
    Auto,
    /// `https://<node InternalIP>:2379`.
    Direct,
    /// Through the workload API server to the `etcd-proxy` pod on each member's node.
    PortForward,
}

impl TransportMode {
    pub fn as_str(self) -> &'static str {
        match self {
            TransportMode::Auto => "auto",
            TransportMode::Direct => "direct",
            TransportMode::PortForward => "port-forward",
        }
    }

    /// The annotation's value: `direct` or `port-forward` (`auto` too).
    pub fn parse(value: &str) -> Option<Self> {
        match value.trim() {
            "auto" => Some(TransportMode::Auto),
            "direct" => Some(TransportMode::Direct),
            "port-forward" => Some(TransportMode::PortForward),
            _ => None,
        }
    }
}

/// A concrete way to reach members (what a pooled handle uses).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TransportKind {
    Direct,
    PortForward,
}

impl TransportKind {
    pub fn as_str(self) -> &'static str {
        match self {
            TransportKind::Direct => "direct",
            TransportKind::PortForward => "port-forward",
        }
    }
}

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
    /// `metadata.resourceVersion` (and uid) of the etcd CA Secret it was built
    /// from (and, for port-forward, of the kubeconfig Secret).
    secret_version: String,
    cluster: Arc<EtcdCluster>,
    relay: Option<Arc<PortForwardRelay>>,
}

/// The pool; cheap to clone.
#[derive(Clone, Default)]
pub struct EtcdPool {
    entries: Arc<Mutex<HashMap<(PoolKey, TransportKind), Entry>>>,
    /// Clusters `auto` switched to port-forward, with why.
    fell_back: Arc<Mutex<HashMap<PoolKey, String>>>,
    timeouts: Option<Timeouts>,
    /// Of the client certificates minted from each etcd CA; `None`:
    /// [`CLIENT_CERT_LIFETIME`].
    client_cert_lifetime: Option<Duration>,
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

    /// Client certificates minted for new handles live `lifetime`.
    pub fn with_client_cert_lifetime(self, lifetime: Duration) -> Self {
        EtcdPool {
            client_cert_lifetime: Some(lifetime),
            ..self
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
        self.get_with(key, ca, seeds, None)
    }

    /// [`Self::get`] through `port_forward` (the workload API client and the
    /// kubeconfig Secret's version), or directly when `None`.
    pub fn get_with(
        &self,
        key: &PoolKey,
        ca: &EtcdCaPem<'_>,
        seeds: &[String],
        port_forward: Option<(&kube::Client, &str)>,
    ) -> Result<Arc<EtcdCluster>, EtcdError> {
        let kind = if port_forward.is_some() {
            TransportKind::PortForward
        } else {
            TransportKind::Direct
        };
        let version = match port_forward {
            Some((_, kubeconfig)) => format!("{} {kubeconfig}", ca.secret_version),
            None => ca.secret_version.to_string(),
        };
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let entry_key = (key.clone(), kind);
        if let Some(entry) = entries.get(&entry_key)
            && entry.secret_version == version
        {
            return Ok(entry.cluster.clone());
        }
        let tls = ClientTls::minted_from_ca(
            (ca.cert_field, ca.cert),
            (ca.key_field, ca.key),
            self.client_cert_lifetime.unwrap_or(CLIENT_CERT_LIFETIME),
        )
        .map_err(EtcdError::from)?;
        let relay = match port_forward {
            Some((client, _)) => Some(Arc::new(PortForwardRelay::new(client.clone())?)),
            None => None,
        };
        let transport = match &relay {
            Some(relay) => Transport::Relayed(relay.clone()),
            None => Transport::Direct,
        };
        let cluster = Arc::new(EtcdCluster::with_options(
            seeds,
            tls,
            transport,
            self.timeouts.unwrap_or_default(),
        )?);
        self.built
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // The old handle (and every connection and certificate it holds) is
        // dropped here: nothing minted from a previous CA is used again.
        entries.insert(
            entry_key,
            Entry {
                secret_version: version,
                cluster: cluster.clone(),
                relay,
            },
        );
        Ok(cluster)
    }

    /// Remember that `auto` uses port-forward for `key`, and why.
    pub fn remember_fallback(&self, key: &PoolKey, why: String) {
        self.fell_back
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.clone(), why);
    }

    /// Why `auto` uses port-forward for `key`, if it does.
    pub fn fallback(&self, key: &PoolKey) -> Option<String> {
        self.fell_back
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .cloned()
    }

    /// Port-forwards opened by every pooled port-forward handle.
    pub fn tunnels_opened(&self) -> u64 {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries
            .values()
            .filter_map(|e| e.relay.as_ref())
            .map(|r| r.tunnels_opened())
            .sum()
    }

    /// Forget a cluster (its KThreesControlPlane or Cluster went away).
    pub fn drop_cluster(&self, key: &PoolKey) {
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(k, _), _| k != key);
        self.fell_back
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

#[cfg(test)]
mod tests {
    use super::*;

    const CA: &[u8] = include_bytes!("../etcd/testdata/ca.crt");
    const CA_KEY: &[u8] = include_bytes!("../etcd/testdata/ca-sec1.key");

    fn lifetime_of_minted(pool: &EtcdPool) -> Duration {
        let handle = pool
            .get(
                &PoolKey {
                    namespace: "ns".into(),
                    cluster: "c1".into(),
                },
                &EtcdCaPem {
                    cert_field: "ns/c1-etcd[tls.crt]",
                    cert: CA,
                    key_field: "ns/c1-etcd[tls.key]",
                    key: CA_KEY,
                    secret_version: "1",
                },
                &["https://10.0.0.1:2379".to_string()],
            )
            .expect("a handle");
        let identity = handle
            .clients
            .tls()
            .client_identity()
            .expect("minted")
            .expect("a client certificate");
        identity
            .not_after()
            .duration_since(identity.not_before())
            .unwrap()
    }

    /// `--etcd-client-cert-lifetime` reaches the certificates minted for new
    /// handles (plus the minute they are backdated).
    #[test]
    fn minted_client_certificates_live_as_long_as_the_pool_says() {
        crate::install_crypto_provider();
        let backdate = Duration::from_secs(60);
        assert_eq!(
            lifetime_of_minted(&EtcdPool::default()),
            CLIENT_CERT_LIFETIME + backdate
        );
        let ten_minutes = Duration::from_secs(600);
        assert_eq!(
            lifetime_of_minted(&EtcdPool::default().with_client_cert_lifetime(ten_minutes)),
            ten_minutes + backdate
        );
    }
}
