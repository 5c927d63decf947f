//! How a member's advertised client URL is reached: the one seam between "where
//! to dial" and "which name the server certificate must be valid for".
//!
//! [`Transport::Direct`] dials the URL. [`Transport::Relayed`] dials a local
//! address standing in for the member's host (a port-forward through the
//! workload API server, see [`crate::workload::portforward`]) but keeps
//! `server_name` = the URL's host, so verification never weakens.

use std::net::SocketAddr;
use std::sync::Arc;

use serde::Serialize;

use crate::etcd::error::EtcdError;

/// Something that reaches `host:port` through a local address of its own.
pub trait Relay: Send + Sync + std::fmt::Debug {
    /// The local address whose connections lead to `host:port`.
    fn local_addr(&self, host: &str, port: u16) -> Result<SocketAddr, EtcdError>;
    /// What to call this relay in status and metrics, e.g. `port-forward`.
    fn kind(&self) -> &'static str;
    /// Why the relay last failed to reach `host`, if it did (a closed local
    /// connection says nothing by itself).
    fn failure(&self, _host: &str) -> Option<String> {
        None
    }
    /// What `host` was last relayed through (e.g. `kube-system/etcd-proxy-x`).
    fn route(&self, _host: &str) -> Option<String> {
        None
    }
}

/// Default etcd client port, used when a URL has none.
pub const DEFAULT_CLIENT_PORT: u16 = 2379;

/// Where to dial, and which name the server certificate must be valid for.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdEndpoint {
    /// `https://host:port` to open the TCP/TLS connection to.
    pub dial: String,
    /// The IP address or DNS name verified against the server certificate.
    pub server_name: String,
}

/// Resolves member client URLs to endpoints.
#[derive(Clone, Debug, Default)]
pub enum Transport {
    /// Dial the URL itself; verify its host.
    #[default]
    Direct,
    /// Dial the relay's local address for the URL's host; verify the host.
    Relayed(Arc<dyn Relay>),
}

impl Transport {
    pub fn resolve(&self, client_url: &str) -> Result<EtcdEndpoint, EtcdError> {
        match self {
            Transport::Direct => {
                let (host, port) = parse_https_url(client_url)?;
                let dial_host = if host.contains(':') {
                    format!("[{host}]")
                } else {
                    host.clone()
                };
                Ok(EtcdEndpoint {
                    dial: format!("https://{dial_host}:{port}"),
                    server_name: host,
                })
            }
            Transport::Relayed(relay) => {
                let (host, port) = parse_https_url(client_url)?;
                let local = relay.local_addr(&host, port)?;
                Ok(EtcdEndpoint {
                    dial: format!("https://{local}"),
                    server_name: host,
                })
            }
        }
    }

    /// The relay's recorded failure for the member behind `endpoint`.
    pub fn failure(&self, endpoint: &EtcdEndpoint) -> Option<String> {
        match self {
            Transport::Direct => None,
            Transport::Relayed(relay) => relay.failure(&endpoint.server_name),
        }
    }

    /// `direct`, or the relay's kind (`port-forward`).
    pub fn kind(&self) -> &'static str {
        match self {
            Transport::Direct => "direct",
            Transport::Relayed(relay) => relay.kind(),
        }
    }
}

/// A fixed map host -> address: the member listens somewhere other than the
/// address it advertises (test worlds whose advertised addresses are not
/// reachable).
#[derive(Debug, Default)]
pub struct StaticRelay {
    pub targets: std::collections::HashMap<(String, u16), SocketAddr>,
}

impl Relay for StaticRelay {
    fn local_addr(&self, host: &str, port: u16) -> Result<SocketAddr, EtcdError> {
        self.targets
            .get(&(host.to_string(), port))
            .copied()
            .ok_or_else(|| EtcdError::InvalidEndpoint {
                url: format!("https://{host}:{port}"),
                reason: "no relay target for this address".into(),
            })
    }

    fn kind(&self) -> &'static str {
        "static"
    }
}

/// Split an `https://host[:port]` URL into host (no IPv6 brackets) and port.
pub fn parse_https_url(url: &str) -> Result<(String, u16), EtcdError> {
    let invalid = |reason: &str| EtcdError::InvalidEndpoint {
        url: url.to_string(),
        reason: reason.to_string(),
    };
    let uri: http::Uri = url
        .parse()
        .map_err(|e: http::uri::InvalidUri| invalid(&e.to_string()))?;
    match uri.scheme_str() {
        Some("https") => {}
        Some(other) => {
            return Err(invalid(&format!(
                "scheme {other:?} is not allowed, etcd is only reached over https"
            )));
        }
        None => return Err(invalid("expected https://host:port")),
    }
    let host = uri
        .host()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| invalid("no host"))?;
    if uri.path() != "/" && !uri.path().is_empty() {
        return Err(invalid("a client URL has no path"));
    }
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    Ok((host, uri.port_u16().unwrap_or(DEFAULT_CLIENT_PORT)))
}

/// Host part of a URL (peer or client), without port or brackets.
pub fn url_host(url: &str) -> Option<String> {
    let uri: http::Uri = url.parse().ok()?;
    uri.host()
        .map(|h| h.trim_start_matches('[').trim_end_matches(']').to_string())
}

/// Refuse a member's advertised client URL on this host's own loopback
/// (`127.0.0.1`, `::1`, `localhost`): k3s advertises it while a server runs
/// `--cluster-reset` (docs/k3s.md CR1), and dialling it would reach whatever
/// listens on the controller's host, not that member.
pub fn refuse_reset_loopback(client_url: &str) -> Result<(), EtcdError> {
    let host = url_host(client_url).unwrap_or_default();
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host.parse::<std::net::IpAddr>().is_ok_and(|ip| {
            ip == std::net::Ipv4Addr::LOCALHOST || ip == std::net::Ipv6Addr::LOCALHOST
        });
    if loopback {
        return Err(EtcdError::Unreachable {
            endpoint: client_url.to_string(),
            reason: "the member advertises this host's loopback as its client URL (k3s does so during --cluster-reset); not dialled: it would reach whatever listens here, not that member".into(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_advertising_the_reset_loopback_is_not_dialled() {
        for url in [
            "https://127.0.0.1:2379",
            "https://[::1]:2379",
            "https://localhost:2379",
        ] {
            let err = refuse_reset_loopback(url).unwrap_err();
            assert!(
                err.to_string().contains(url) && err.to_string().contains("--cluster-reset"),
                "{err}"
            );
        }
        // Other loopback addresses are real members (the test harness gives
        // each its own 127.x address), and node addresses are of course fine.
        for url in [
            "https://127.77.3.1:2379",
            "https://10.0.0.5:2379",
            "https://[fd00::1]:2379",
        ] {
            assert!(refuse_reset_loopback(url).is_ok(), "{url}");
        }
    }

    #[test]
    fn direct_dials_the_url_and_verifies_its_host() {
        let cases = [
            ("https://10.0.0.5:2379", "https://10.0.0.5:2379", "10.0.0.5"),
            ("https://10.0.0.5", "https://10.0.0.5:2379", "10.0.0.5"),
            (
                "https://cp-0.example:2379/",
                "https://cp-0.example:2379",
                "cp-0.example",
            ),
            (
                "https://[fd00::1]:2379",
                "https://[fd00::1]:2379",
                "fd00::1",
            ),
        ];
        for (url, dial, name) in cases {
            let endpoint = Transport::Direct.resolve(url).unwrap();
            assert_eq!(endpoint.dial, dial, "{url}");
            assert_eq!(endpoint.server_name, name, "{url}");
        }
    }

    #[test]
    fn relayed_dials_the_local_address_and_still_verifies_the_host() {
        let mut relay = StaticRelay::default();
        relay.targets.insert(
            ("10.0.0.5".into(), 2379),
            "127.0.0.1:40001".parse().unwrap(),
        );
        let transport = Transport::Relayed(Arc::new(relay));
        let endpoint = transport.resolve("https://10.0.0.5:2379").unwrap();
        assert_eq!(endpoint.dial, "https://127.0.0.1:40001");
        assert_eq!(endpoint.server_name, "10.0.0.5");
        let err = transport.resolve("https://10.0.0.6:2379").unwrap_err();
        assert!(err.to_string().contains("10.0.0.6"), "{err}");
    }

    #[test]
    fn malformed_or_plaintext_urls_are_refused() {
        for url in [
            "http://10.0.0.5:2379",
            "10.0.0.5:2379",
            "https://",
            "https://h:2379/x",
            "not a url",
        ] {
            let err = Transport::Direct.resolve(url).unwrap_err();
            assert!(
                matches!(err, EtcdError::InvalidEndpoint { .. }),
                "{url}: {err}"
            );
        }
    }
}
