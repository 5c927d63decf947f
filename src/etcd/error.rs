//! Errors of the etcd engine, classified so that each one tells the user what is wrong.
//!
//! etcd-client reports every TLS or connection failure as a gRPC `Unavailable`
//! status on the first call; the real cause is only in the error's source chain.
//! [`classify`] reads that chain and turns it into a variant a person can act on.

use std::error::Error as StdError;
use std::time::Duration;

use crate::etcd::tls::TlsError;
use crate::quorum::Assessment;

/// Everything that can go wrong talking to etcd.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    #[error(transparent)]
    Tls(#[from] TlsError),

    #[error("invalid etcd endpoint {url:?}: {reason}")]
    InvalidEndpoint { url: String, reason: String },

    #[error("etcd endpoint {endpoint} is unreachable: {reason}")]
    Unreachable { endpoint: String, reason: String },

    #[error("{op} on {endpoint} timed out after {after:?}")]
    Timeout {
        endpoint: String,
        op: &'static str,
        after: Duration,
    },

    #[error("server certificate of {endpoint} is not signed by the given CA ({detail})")]
    UnknownAuthority { endpoint: String, detail: String },

    #[error(
        "server certificate of {endpoint} is not valid for {server_name} (it lacks that IP/DNS subject alternative name)"
    )]
    NameMismatch {
        endpoint: String,
        server_name: String,
    },

    #[error("{endpoint} requires a client certificate, and none was presented")]
    ClientCertificateRequired { endpoint: String },

    #[error("{endpoint} rejected the client certificate ({detail}); is it signed by the etcd CA?")]
    ClientCertificateRejected { endpoint: String, detail: String },

    #[error("TLS handshake with {endpoint} failed: {detail}")]
    Handshake { endpoint: String, detail: String },

    #[error("{endpoint} is not the etcd leader (leadership moves must be sent to the leader)")]
    NotLeader { endpoint: String },

    #[error(
        "etcd cluster is temporarily unhealthy (reported by {endpoint}: {message}); retry later"
    )]
    TransientlyUnhealthy { endpoint: String, message: String },

    #[error("etcd member {member} not found")]
    MemberNotFound { member: String },

    #[error("refusing to remove {target}: {assessment}", target = assessment.target.as_deref().unwrap_or("member"))]
    UnsafeRemoval { assessment: Box<Assessment> },

    #[error(
        "members disagree about the cluster id: {first_endpoint} reports {first:016x}, {member} ({endpoint}) reports {other:016x}"
    )]
    ClusterIdMismatch {
        first_endpoint: String,
        first: u64,
        member: String,
        endpoint: String,
        other: u64,
    },

    /// Endpoints on the seeds answer for more than one etcd cluster and
    /// nothing says which one is ours: refused rather than guessed. The same
    /// cluster id does not make them one cluster: a first server restarted
    /// alone on its address shares it (docs/k3s.md T3); only members do.
    #[error(
        "the seeds answer for more than one etcd cluster and nothing tells which is ours ({}): refusing to pick one. To say which, annotate the KThreesControlPlane with {annotation}=<ids of that cluster's members, hex, comma-separated>",
        clusters.join("; "),
        annotation = crate::api::names::ETCD_CLUSTER_MEMBERS_ANNOTATION
    )]
    SplitClusters { clusters: Vec<String> },

    /// No endpoint that answered is the cluster this handle proved before:
    /// another cluster id, or the same id with none of the members it knew
    /// (e.g. a removed server restarted as a new one-member cluster while
    /// the real members are unreachable).
    #[error(
        "no endpoint answers for etcd cluster {known:016x} with any of the members known of it ({}), the one managed so far; only other clusters answered ({}). If the cluster was restored from a snapshot or its members replaced meanwhile, annotate the KThreesControlPlane with {annotation}=<ids of its members now, hex, comma-separated>, or restart the controller",
        members.iter().map(|id| format!("{id:016x}")).collect::<Vec<_>>().join(","),
        found.join("; "),
        annotation = crate::api::names::ETCD_CLUSTER_MEMBERS_ANNOTATION
    )]
    KnownClusterGone {
        known: u64,
        members: Vec<u64>,
        found: Vec<String>,
    },

    /// The members a person pinned (the annotation) are in no cluster that
    /// answered on the seeds.
    #[error(
        "no endpoint answers for an etcd cluster with any of the members pinned by {annotation} ({}); only other clusters answered ({}). Correct or remove the annotation on the KThreesControlPlane",
        pinned.iter().map(|id| format!("{id:016x}")).collect::<Vec<_>>().join(","),
        found.join("; "),
        annotation = crate::api::names::ETCD_CLUSTER_MEMBERS_ANNOTATION
    )]
    PinnedClusterGone {
        pinned: Vec<u64>,
        found: Vec<String>,
    },

    #[error("no healthy voting member can take over leadership from {target}")]
    NoTransferee { target: String },

    #[error("{member} cannot take over leadership: {reason}")]
    InvalidTransferee { member: String, reason: String },

    #[error("{what} was not confirmed within {after:?}: {last}")]
    NotConfirmed {
        what: String,
        after: Duration,
        last: String,
    },

    /// Fewer voters are healthy than quorum needs, so etcd cannot commit
    /// anything (no removal, no leadership move, no alarm read). Takes
    /// precedence over what could not be read because of it.
    #[error("quorum lost: {assessment}")]
    QuorumLost { assessment: Box<Assessment> },

    /// An operation refused by its guard, with the numbers that refused it:
    /// a step on etcd's space ([`crate::space_rule`]), or a snapshot from a
    /// member that is not a healthy voter ([`super::save`]).
    #[error("refusing to {action}: {reason}")]
    OperationRefused { action: String, reason: String },

    #[error("cannot read etcd alarms ({reason}); refusing to decide without them")]
    AlarmsUnknown { reason: String },

    #[error("no member left to send the request to: {reason}")]
    NoReceiver { reason: String },

    #[error("{op} on {endpoint} failed: gRPC {code}: {message}")]
    Grpc {
        endpoint: String,
        op: &'static str,
        /// The gRPC status code name, e.g. `FailedPrecondition`.
        code: String,
        message: String,
    },

    #[error("{op} on {endpoint} failed: {detail}")]
    Client {
        endpoint: String,
        op: &'static str,
        detail: String,
    },

    #[error("no etcd endpoint answered: {}", join_errors(.0))]
    AllEndpointsFailed(Vec<EtcdError>),
}

/// gRPC status codes we react to (tonic is not a direct dependency).
mod grpc_code {
    pub const UNKNOWN: i32 = 2;
    pub const NOT_FOUND: i32 = 5;
    pub const FAILED_PRECONDITION: i32 = 9;
    pub const UNAVAILABLE: i32 = 14;
}

fn join_errors(errors: &[EtcdError]) -> String {
    errors
        .iter()
        .map(|e| e.to_string())
        .collect::<Vec<_>>()
        .join("; ")
}

impl EtcdError {
    /// A transient condition worth retrying with a bound (etcd rejects
    /// reconfiguration for a few seconds after a member reconnected).
    pub fn is_transient(&self) -> bool {
        matches!(self, EtcdError::TransientlyUnhealthy { .. })
    }

    /// The connection was closed under a request without a stated reason. With
    /// TLS 1.3 a server rejects the client certificate after the client thinks
    /// the handshake is done, and the alert saying why is often lost in the
    /// race: worth a diagnostic handshake.
    pub(crate) fn may_hide_tls_rejection(&self) -> bool {
        match self {
            EtcdError::Grpc { code, .. } => code == "Cancelled" || code == "Unknown",
            EtcdError::Unreachable { reason, .. } | EtcdError::Client { detail: reason, .. } => {
                // How a peer that rejected our certificate after the TLS 1.3
                // handshake looks from gRPC, depending on timing.
                let reason = reason.to_ascii_lowercase();
                reason.contains("connection closed")
                    || reason.contains("reset")
                    || reason.contains("broken pipe")
                    || reason.contains("brokenpipe")
            }
            _ => false,
        }
    }

    /// Re-classify a diagnostic handshake's error text.
    pub(crate) fn from_handshake(
        text: &str,
        endpoint: &str,
        server_name: &str,
        presented_client_cert: bool,
    ) -> Option<EtcdError> {
        classify_tls(text, endpoint, server_name, presented_client_cert)
    }

    /// The endpoint could not be reached or did not answer in time: the member
    /// counts as down, not as misconfigured.
    pub fn is_unreachable(&self) -> bool {
        matches!(
            self,
            EtcdError::Unreachable { .. } | EtcdError::Timeout { .. }
        )
    }
}

/// The text of an error and all its sources, outermost first.
pub(crate) fn chain_text(err: &(dyn StdError + 'static)) -> String {
    let mut parts = vec![err.to_string()];
    let mut source = err.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = s.source();
    }
    parts.join(": ")
}

/// Turn an etcd-client error from `op` on `endpoint` (dialed, verifying
/// `server_name`, presenting a client certificate or not) into an
/// [`EtcdError`] that says what is wrong.
pub(crate) fn classify(
    err: etcd_client::Error,
    op: &'static str,
    endpoint: &str,
    server_name: &str,
    presented_client_cert: bool,
) -> EtcdError {
    let text = chain_text(&err);
    let endpoint = endpoint.to_string();
    if let Some(tls) = classify_tls(&text, &endpoint, server_name, presented_client_cert) {
        return tls;
    }
    if let etcd_client::Error::GRpcStatus(status) = &err {
        let message = status.message().to_string();
        let code = status.code() as i32;
        return match code {
            grpc_code::FAILED_PRECONDITION if message.contains("not leader") => {
                EtcdError::NotLeader { endpoint }
            }
            grpc_code::UNAVAILABLE if message.contains("unhealthy cluster") => {
                EtcdError::TransientlyUnhealthy { endpoint, message }
            }
            grpc_code::NOT_FOUND if message.contains("member not found") => {
                EtcdError::MemberNotFound {
                    member: format!("(as reported by {endpoint})"),
                }
            }
            grpc_code::UNAVAILABLE | grpc_code::UNKNOWN
                if looks_unreachable(&text) || status.source().is_some() =>
            {
                EtcdError::Unreachable {
                    endpoint,
                    reason: unreachable_reason(&text),
                }
            }
            _ => EtcdError::Grpc {
                endpoint,
                op,
                code: format!("{:?}", status.code()),
                message,
            },
        };
    }
    if looks_unreachable(&text) {
        return EtcdError::Unreachable {
            endpoint,
            reason: unreachable_reason(&text),
        };
    }
    EtcdError::Client {
        endpoint,
        op,
        detail: text,
    }
}

fn classify_tls(
    text: &str,
    endpoint: &str,
    server_name: &str,
    presented_client_cert: bool,
) -> Option<EtcdError> {
    let endpoint = endpoint.to_string();
    if text.contains("UnknownIssuer") || text.contains("BadSignature") {
        return Some(EtcdError::UnknownAuthority {
            endpoint,
            detail: "UnknownIssuer".into(),
        });
    }
    if text.contains("not valid for name") || text.contains("NotValidForName") {
        return Some(EtcdError::NameMismatch {
            endpoint,
            server_name: server_name.to_string(),
        });
    }
    // TLS 1.3 servers say "certificate required"; Go before 1.21 says "bad
    // certificate" for a missing one too, so we use what we know we sent.
    if text.contains("CertificateRequired")
        || (!presented_client_cert && text.contains("alert: BadCertificate"))
    {
        return Some(EtcdError::ClientCertificateRequired { endpoint });
    }
    for alert in [
        "BadCertificate",
        "UnknownCA",
        "UnsupportedCertificate",
        "CertificateExpired",
        "CertificateUnknown",
        "CertificateRevoked",
    ] {
        if text.contains(&format!("alert: {alert}")) {
            return Some(EtcdError::ClientCertificateRejected {
                endpoint,
                detail: format!("server sent TLS alert {alert}"),
            });
        }
    }
    if text.contains("invalid peer certificate") {
        return Some(EtcdError::Handshake {
            endpoint,
            detail: tail_after(text, "invalid peer certificate"),
        });
    }
    if text.contains("received fatal alert") || text.contains("HandshakeTimeout") {
        return Some(EtcdError::Handshake {
            endpoint,
            detail: tail_after(text, "received fatal alert"),
        });
    }
    None
}

fn looks_unreachable(text: &str) -> bool {
    [
        "Connection refused",
        "connection refused",
        "tcp connect error",
        "No route to host",
        "Network is unreachable",
        "connection reset",
        "Connection reset",
        "broken pipe",
        "error trying to connect",
        "transport error",
        "connection error",
        "operation timed out",
        "timed out",
    ]
    .iter()
    .any(|needle| text.contains(needle))
}

fn unreachable_reason(text: &str) -> String {
    for needle in [
        "Connection refused",
        "No route to host",
        "Network is unreachable",
        "Connection reset",
        "connection reset",
        "timed out",
    ] {
        if text.contains(needle) {
            return needle.to_lowercase();
        }
    }
    text.to_string()
}

fn tail_after(text: &str, marker: &str) -> String {
    text.find(marker)
        .map(|i| text[i..].to_string())
        .unwrap_or_else(|| text.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Error texts as rustls and etcd produce them, and what the user is told.
    #[test]
    fn tls_failure_texts_are_classified() {
        let ep = "https://10.0.0.1:2379";
        let cases: [(&str, &str, bool, &str); 7] = [
            (
                "unknown issuer",
                "transport error: invalid peer certificate: UnknownIssuer",
                true,
                "server certificate of https://10.0.0.1:2379 is not signed by the given CA",
            ),
            (
                "name mismatch",
                "invalid peer certificate: certificate not valid for name \"10.0.0.1\"; certificate is only valid for IpAddress(127.0.0.1)",
                true,
                "server certificate of https://10.0.0.1:2379 is not valid for 10.0.0.1",
            ),
            (
                "TLS 1.3 certificate_required alert",
                "received fatal alert: CertificateRequired",
                false,
                "https://10.0.0.1:2379 requires a client certificate",
            ),
            (
                "Go's bad_certificate when none was sent",
                "received fatal alert: BadCertificate",
                false,
                "https://10.0.0.1:2379 requires a client certificate",
            ),
            (
                "bad_certificate for the one we sent",
                "received fatal alert: BadCertificate",
                true,
                "https://10.0.0.1:2379 rejected the client certificate",
            ),
            (
                "unknown_ca for the one we sent",
                "received fatal alert: UnknownCA",
                true,
                "https://10.0.0.1:2379 rejected the client certificate",
            ),
            (
                "other certificate problem",
                "invalid peer certificate: Expired",
                true,
                "TLS handshake with https://10.0.0.1:2379 failed: invalid peer certificate: Expired",
            ),
        ];
        for (name, text, presented, expected) in cases {
            let err = classify_tls(text, ep, "10.0.0.1", presented)
                .unwrap_or_else(|| panic!("{name}: not classified"));
            assert!(err.to_string().starts_with(expected), "{name}: {err}");
        }
        assert!(classify_tls("Connection refused", ep, "10.0.0.1", true).is_none());
    }

    #[test]
    fn unreachable_reasons_are_short() {
        assert_eq!(
            unreachable_reason(
                "transport error: tcp connect error: Connection refused (os error 111)"
            ),
            "connection refused"
        );
        assert!(looks_unreachable(
            "error trying to connect: deadline has elapsed timed out"
        ));
    }
}
