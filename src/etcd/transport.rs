//! How a member's advertised client URL is reached: the one seam between "where
//! to dial" and "which name the server certificate must be valid for".
//!
//! Only [`Transport::Direct`] exists now. A port-forward transport (through the
//! workload API server to an etcd proxy) will dial a local port but keep
//! `server_name` = the node address, so verification never weakens.

use serde::Serialize;

use crate::etcd::error::EtcdError;

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
        }
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

#[cfg(test)]
mod tests {
    use super::*;

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
