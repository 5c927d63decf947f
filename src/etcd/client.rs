//! One single-endpoint etcd client per member endpoint.
//!
//! etcd answers `MoveLeader` only on the leader and `MemberRemove` must reach a
//! member that stays, so requests are addressed to a chosen member, never
//! load-balanced. Each member has one pooled HTTP/2 connection
//! ([`H2Channel`]), cached per dial address and rebuilt when the client
//! certificate is renewed; the connections of a cluster share one TLS
//! configuration.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::Client;
use rustls::pki_types::ServerName;

use crate::etcd::error::{EtcdError, classify};
use crate::etcd::h2_channel::H2Channel;
use crate::etcd::tls::{ClientIdentity, ClientTls};
use crate::etcd::transport::{EtcdEndpoint, Transport, parse_https_url};

/// Time limits for talking to etcd.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    /// TCP + TLS connection establishment.
    pub connect: Duration,
    /// One request (member list, move leader, member remove).
    pub call: Duration,
    /// One health probe (`Status` on a member's own endpoint): short, so that a
    /// stopped (SIGSTOPped) member is counted unhealthy quickly.
    pub probe: Duration,
    /// How long to wait for a leadership move or a removal to be confirmed,
    /// and how long to retry a removal etcd reports as transiently unsafe.
    pub confirm: Duration,
    /// The cluster's raft election timeout. A leadership move may take an
    /// election to settle: its call waits at least two of them, and the
    /// confirmations at least three, whatever `call` and `confirm` say.
    pub election: Duration,
    /// One defragmentation: etcd answers once the member's backend is
    /// rewritten, which takes about as long as copying its live data.
    pub defrag: Duration,
}

/// k3s runs its embedded etcd with a 5000 ms election timeout and a 500 ms
/// heartbeat (k3s `pkg/etcd/etcd.go`, the `ETCDConfig` it starts etcd with).
pub const K3S_ELECTION_TIMEOUT: Duration = Duration::from_secs(5);

/// How long one defragmentation may take (etcd 3.4 rewrote about 1 GB of live
/// data in tens of seconds on a slow disk; 2 GiB, the default quota, fits).
pub const DEFAULT_DEFRAG_TIMEOUT: Duration = Duration::from_secs(300);

impl Default for Timeouts {
    fn default() -> Self {
        Self::for_election_timeout(K3S_ELECTION_TIMEOUT)
    }
}

impl Timeouts {
    /// Limits for a cluster whose raft election timeout is `election`.
    pub fn for_election_timeout(election: Duration) -> Self {
        Self {
            connect: Duration::from_secs(2),
            call: Duration::from_secs(5),
            probe: Duration::from_secs(2),
            confirm: Duration::from_secs(15),
            election,
            defrag: DEFAULT_DEFRAG_TIMEOUT,
        }
    }

    /// The limit of one MoveLeader call: etcd answers once the transferee
    /// leads, which can take an election.
    pub fn move_leader(&self) -> Duration {
        self.call.max(self.election * 2)
    }

    /// How long a leadership move or a removal is awaited.
    pub fn confirmation(&self) -> Duration {
        self.confirm.max(self.election * 3)
    }
}

struct Pooled {
    identity: Option<Arc<ClientIdentity>>,
    channel: H2Channel,
}

/// A TLS configuration and the identity it presents.
struct SharedConfig {
    identity: Option<Arc<ClientIdentity>>,
    config: Arc<rustls::ClientConfig>,
}

/// A cache of per-endpoint clients sharing one TLS configuration.
pub(crate) struct MemberClients {
    tls: ClientTls,
    transport: Transport,
    timeouts: Timeouts,
    pool: Mutex<HashMap<EtcdEndpoint, Pooled>>,
    /// The TLS configuration of the current identity, shared by every member
    /// connection (rebuilt when the identity is renewed).
    config: Mutex<Option<SharedConfig>>,
    /// Connections opened so far (for metrics and the "no new connection when
    /// nothing changed" guarantee).
    opened: std::sync::atomic::AtomicU64,
}

fn same_identity(a: &Option<Arc<ClientIdentity>>, b: &Option<Arc<ClientIdentity>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (None, None) => true,
        _ => false,
    }
}

impl MemberClients {
    /// The TLS configuration every member connection uses.
    pub(crate) fn tls(&self) -> &ClientTls {
        &self.tls
    }

    pub(crate) fn new(tls: ClientTls, transport: Transport, timeouts: Timeouts) -> Self {
        Self {
            tls,
            transport,
            timeouts,
            pool: Mutex::new(HashMap::new()),
            config: Mutex::new(None),
            opened: std::sync::atomic::AtomicU64::new(0),
        }
    }

    pub(crate) fn connections_opened(&self) -> u64 {
        self.opened.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn timeouts(&self) -> Timeouts {
        self.timeouts
    }

    pub(crate) fn resolve(&self, client_url: &str) -> Result<EtcdEndpoint, EtcdError> {
        self.transport.resolve(client_url)
    }

    /// The client for `endpoint` over its pooled connection, which is opened
    /// on first use (lazily: TLS problems show on the first call).
    async fn client(&self, endpoint: &EtcdEndpoint) -> Result<Client, EtcdError> {
        let identity = self.tls.client_identity()?;
        let channel = {
            // Held while a connection is made (no await), so that concurrent
            // calls on one endpoint share one connection.
            let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
            match pool
                .get(endpoint)
                .filter(|pooled| same_identity(&pooled.identity, &identity))
            {
                Some(pooled) => pooled.channel.clone(),
                None => {
                    let config = self.config_for(&identity)?;
                    let channel = self.channel(endpoint, config)?;
                    self.opened
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    pool.insert(
                        endpoint.clone(),
                        Pooled {
                            identity: identity.clone(),
                            channel: channel.clone(),
                        },
                    );
                    channel
                }
            }
        };
        // A client is a dozen service handles on the channel (a few KiB):
        // made per call rather than kept for every pooled connection.
        let channel = tower::util::BoxCloneSyncService::new(channel);
        Client::from_channel(etcd_client::Channel::Custom(channel), None)
            .await
            .map_err(|e| {
                classify(
                    e,
                    "connect",
                    &self.label(endpoint),
                    &endpoint.server_name,
                    identity.is_some(),
                )
            })
    }

    /// The TLS configuration for `identity`: the one in use while the identity
    /// is, a new one for a renewed identity.
    fn config_for(
        &self,
        identity: &Option<Arc<ClientIdentity>>,
    ) -> Result<Arc<rustls::ClientConfig>, EtcdError> {
        let mut current = self.config.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(shared) = current.as_ref()
            && same_identity(&shared.identity, identity)
        {
            return Ok(shared.config.clone());
        }
        let config = Arc::new(self.tls.client_config(identity.as_deref())?);
        *current = Some(SharedConfig {
            identity: identity.clone(),
            config: config.clone(),
        });
        Ok(config)
    }

    /// One HTTP/2 connection to `endpoint`, opened on first use and reopened
    /// when it breaks: TCP to the dial address, then TLS with `config`,
    /// verifying the server certificate against the member's name
    /// (`server_name`, never the dial address).
    fn channel(
        &self,
        endpoint: &EtcdEndpoint,
        config: Arc<rustls::ClientConfig>,
    ) -> Result<H2Channel, EtcdError> {
        let invalid = |reason: String| EtcdError::InvalidEndpoint {
            url: endpoint.dial.clone(),
            reason,
        };
        let origin: http::Uri = endpoint
            .dial
            .parse()
            .map_err(|e: http::uri::InvalidUri| invalid(e.to_string()))?;
        if origin.scheme() != Some(&http::uri::Scheme::HTTPS) {
            return Err(invalid("not https".into()));
        }
        let authority = origin
            .authority()
            .ok_or_else(|| invalid("no host".into()))?
            .clone();
        let server_name = ServerName::try_from(endpoint.server_name.clone())
            .map_err(|e| invalid(format!("{}: {e}", endpoint.server_name)))?;
        Ok(H2Channel::to_member(
            authority,
            server_name,
            config,
            self.timeouts.connect,
        ))
    }

    /// Run `call` against `endpoint` within `limit`, classifying failures. A
    /// timeout or an unreachable endpoint drops the cached connection.
    pub(crate) async fn call<T, F, Fut>(
        &self,
        endpoint: &EtcdEndpoint,
        op: &'static str,
        limit: Duration,
        call: F,
    ) -> Result<T, EtcdError>
    where
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.call_with(endpoint, op, limit, true, call).await
    }

    /// [`Self::call`], but a timeout keeps the cached connection: for a request
    /// whose slowness says nothing about the connection (a linearizable read
    /// waits for the member's quorum, not for its endpoint).
    pub(crate) async fn call_keeping_connection<T, F, Fut>(
        &self,
        endpoint: &EtcdEndpoint,
        op: &'static str,
        limit: Duration,
        call: F,
    ) -> Result<T, EtcdError>
    where
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.call_with(endpoint, op, limit, false, call).await
    }

    async fn call_with<T, F, Fut>(
        &self,
        endpoint: &EtcdEndpoint,
        op: &'static str,
        limit: Duration,
        forget_on_timeout: bool,
        call: F,
    ) -> Result<T, EtcdError>
    where
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let client = self.client(endpoint).await?;
        match tokio::time::timeout(limit, call(client)).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => {
                let presented = self.tls.has_client_certificate();
                let label = self.label(endpoint);
                let mut err = classify(err, op, &label, &endpoint.server_name, presented);
                if let Some(reason) = self.transport.failure(endpoint) {
                    // The relay closed the connection because it could not open
                    // its tunnel: that, not a TLS guess, is the reason.
                    err = EtcdError::Unreachable {
                        endpoint: label,
                        reason,
                    };
                } else if err.may_hide_tls_rejection()
                    && let Some(tls_err) = self.diagnose(endpoint).await
                {
                    err = tls_err;
                }
                if err.is_unreachable() {
                    // Start from a fresh connection next time.
                    self.forget(endpoint);
                }
                Err(err)
            }
            Err(_) => {
                if forget_on_timeout {
                    self.forget(endpoint);
                }
                Err(EtcdError::Timeout {
                    endpoint: self.label(endpoint),
                    op,
                    after: limit,
                })
            }
        }
    }

    /// How `endpoint` is named in errors: its URL, or the member's address and
    /// the relay (the local address of a tunnel means nothing to a reader).
    pub(crate) fn label(&self, endpoint: &EtcdEndpoint) -> String {
        match &self.transport {
            Transport::Direct => endpoint.dial.clone(),
            relayed => format!(
                "https://{} (through {} {})",
                endpoint.server_name,
                relayed.kind(),
                endpoint.dial.trim_start_matches("https://")
            ),
        }
    }

    /// The transport in use.
    pub(crate) fn transport(&self) -> &Transport {
        &self.transport
    }

    /// A diagnostic handshake to find the TLS reason behind a closed connection.
    async fn diagnose(&self, endpoint: &EtcdEndpoint) -> Option<EtcdError> {
        let (host, port) = parse_https_url(&endpoint.dial).ok()?;
        let tls = self.tls.clone();
        let server_name = endpoint.server_name.clone();
        let limit = self.timeouts.connect;
        let text = tokio::task::spawn_blocking(move || {
            tls.diagnose_handshake(&host, port, &server_name, limit)
        })
        .await
        .ok()??;
        EtcdError::from_handshake(
            &text,
            &endpoint.dial,
            &endpoint.server_name,
            self.tls.has_client_certificate(),
        )
    }

    /// Drop the cached client of `endpoint` (e.g. its member was removed).
    pub(crate) fn forget(&self, endpoint: &EtcdEndpoint) {
        self.pool
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(endpoint);
    }
}

#[cfg(test)]
mod timeout_tests {
    use super::*;

    /// At k3s's 5 s election timeout a leadership move may take an election:
    /// the call waits two, the confirmation three, never less than the
    /// constants tuned for fast test clusters.
    #[test]
    fn move_and_confirmation_limits_follow_the_election_timeout() {
        let k3s = Timeouts::default();
        assert_eq!(k3s.election, K3S_ELECTION_TIMEOUT);
        assert_eq!(k3s.move_leader(), Duration::from_secs(10));
        assert_eq!(k3s.confirmation(), Duration::from_secs(15));
        let slow = Timeouts::for_election_timeout(Duration::from_secs(10));
        assert_eq!(slow.move_leader(), Duration::from_secs(20));
        assert_eq!(slow.confirmation(), Duration::from_secs(30));
        let fast = Timeouts::for_election_timeout(Duration::from_millis(1500));
        assert_eq!(fast.move_leader(), fast.call);
        assert_eq!(fast.confirmation(), fast.confirm);
    }
}
