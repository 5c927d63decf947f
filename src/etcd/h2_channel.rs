//! The gRPC channel of one etcd member: etcd-client's `Channel::Custom` over
//! one [`H2Connection`] (no request queue in front of it: see that module).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::pki_types::ServerName;

use crate::h2_connection::{BoxError, H2Connection, Target, Windows};

type GrpcRequest = http::Request<tonic::body::Body>;
type GrpcResponse = http::Response<tonic::body::Body>;

/// hyper's HTTP/2 client windows, which tonic's channel used: large enough
/// that a snapshot streams without waiting on window updates.
const MEMBER_WINDOWS: Windows = Windows {
    stream: 2 * 1024 * 1024,
    connection: 5 * 1024 * 1024,
};

/// A cloneable gRPC channel (etcd-client's `Channel::Custom` takes it).
#[derive(Clone)]
pub(crate) struct H2Channel {
    connection: Arc<H2Connection>,
}

impl H2Channel {
    /// A channel to one member that connects on its first call: TCP to
    /// `authority`, TLS with `tls` verifying `server_name`, both within
    /// `connect_timeout`. gRPC speaks HTTP/2 whatever ALPN says, as tonic did.
    pub(crate) fn to_member(
        authority: http::uri::Authority,
        server_name: ServerName<'static>,
        tls: Arc<rustls::ClientConfig>,
        connect_timeout: Duration,
    ) -> Self {
        Self {
            connection: Arc::new(H2Connection::lazy(Target {
                authority,
                server_name,
                tls,
                connect_timeout,
                windows: Some(MEMBER_WINDOWS),
                alpn_h2_only: false,
            })),
        }
    }
}

impl tower::Service<GrpcRequest> for H2Channel {
    type Response = GrpcResponse;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<GrpcResponse, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Readiness is the connection's, awaited in `call`.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: GrpcRequest) -> Self::Future {
        let connection = self.connection.clone();
        Box::pin(async move {
            let response = connection.send(request).await?;
            Ok(response.map(tonic::body::Body::new))
        })
    }
}
