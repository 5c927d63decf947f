//! A gRPC channel on one HTTP/2 connection to one member, driven by h2
//! itself.
//!
//! tonic's channel puts a request queue (a tower `Buffer`) in front of
//! hyper's HTTP/2 client, whose dispatcher has a queue of its own: two tokio
//! mpsc channels per connection. Each starts with a block of 32 slots and,
//! once 32 requests have passed through it, takes a second block that it
//! keeps for good. With one request per member per idle pass that is about
//! 35 KiB per connection after half an hour, three connections per control
//! plane (docs/bench-history.md, "Where the RSS at rest grows"). An h2
//! `SendRequest` is a handle on the connection's own state: a request opens
//! a stream under its lock, with no queue in between.
//!
//! What tonic's lazy channel did is kept: the connection is opened on first
//! use and again after it broke, under one time limit covering TCP and TLS;
//! concurrent calls share one connection and one connect.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use h2::client::SendRequest;
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type GrpcRequest = http::Request<tonic::body::Body>;
type GrpcResponse = http::Response<tonic::body::Body>;

/// hyper's HTTP/2 client windows, which tonic's channel used: large enough
/// that a snapshot streams without waiting on window updates.
const STREAM_WINDOW: u32 = 2 * 1024 * 1024;
const CONNECTION_WINDOW: u32 = 5 * 1024 * 1024;

/// Why a connection could not be opened. The text carries every cause, as
/// [`crate::etcd::error::classify`] reads the text.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectError {
    #[error("tcp connect error: {0}")]
    Tcp(std::io::Error),
    #[error("tls handshake error: {0}")]
    Tls(std::io::Error),
    #[error("connection error: connect timed out after {0:?}")]
    TimedOut(Duration),
    #[error("http2 handshake error: {0}")]
    Http2(h2::Error),
}

/// Where the connection goes and how it is secured.
#[derive(Clone)]
pub(crate) struct Target {
    /// `host:port` to dial.
    pub authority: http::uri::Authority,
    /// The name the server certificate must be valid for.
    pub server_name: ServerName<'static>,
    pub tls: Arc<rustls::ClientConfig>,
    /// Covers TCP and TLS.
    pub connect_timeout: Duration,
}

/// A cloneable gRPC channel (etcd-client's `Channel::Custom` takes it).
#[derive(Clone)]
pub(crate) struct H2Channel {
    shared: Arc<Shared>,
}

struct Shared {
    target: Target,
    /// The open connection's request handle and its generation, `None`
    /// before the first call. Locked while a connection is being opened, so
    /// that concurrent calls wait for that one.
    current: tokio::sync::Mutex<Option<Open>>,
}

struct Open {
    sender: SendRequest<Bytes>,
    generation: u64,
}

impl H2Channel {
    /// A channel that connects on its first call.
    pub(crate) fn lazy(target: Target) -> Self {
        Self {
            shared: Arc::new(Shared {
                target,
                current: tokio::sync::Mutex::new(None),
            }),
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
        let shared = self.shared.clone();
        Box::pin(async move { shared.send(request).await })
    }
}

impl Shared {
    async fn send(&self, request: GrpcRequest) -> Result<GrpcResponse, BoxError> {
        let mut sender = self.ready_sender().await?;
        let (parts, body) = request.into_parts();
        let mut head = http::Request::from_parts(parts, ());
        *head.uri_mut() = self.absolute(head.uri())?;
        let end_of_stream = body.is_end_stream();
        let (response, stream) = sender.send_request(head, end_of_stream)?;
        if !end_of_stream {
            // Its own task, as hyper does: a streaming request keeps
            // sending while the response is read.
            tokio::spawn(send_body(body, stream));
        }
        let response = response.await?;
        Ok(response.map(|recv| {
            tonic::body::Body::new(ResponseBody {
                recv,
                state: Read::Data,
            })
        }))
    }

    /// The request's path on this member: h2 needs the scheme and authority
    /// that tonic's channel used to add.
    fn absolute(&self, uri: &http::Uri) -> Result<http::Uri, BoxError> {
        let mut parts = http::uri::Parts::default();
        parts.scheme = Some(http::uri::Scheme::HTTPS);
        parts.authority = Some(self.target.authority.clone());
        parts.path_and_query = uri.path_and_query().cloned();
        Ok(http::Uri::from_parts(parts)?)
    }

    /// A request handle that may open a stream now: the current
    /// connection's, or a new connection's when there is none or it broke.
    async fn ready_sender(&self) -> Result<SendRequest<Bytes>, BoxError> {
        let mut broken = None;
        loop {
            let (sender, generation, fresh) = {
                let mut current = self.current.lock().await;
                match current.as_ref() {
                    Some(open) if Some(open.generation) != broken => {
                        (open.sender.clone(), open.generation, false)
                    }
                    _ => {
                        let generation = current.as_ref().map_or(0, |o| o.generation + 1);
                        // A task of its own: its TCP, TLS and HTTP/2
                        // futures then live on a worker's stack, not on
                        // the deep stack of whatever call needed them.
                        let sender = tokio::spawn(connect(self.target.clone())).await??;
                        *current = Some(Open {
                            sender: sender.clone(),
                            generation,
                        });
                        (sender, generation, true)
                    }
                }
            };
            match sender.ready().await {
                Ok(sender) => return Ok(sender),
                // A connection just opened that cannot take a request: say why.
                Err(e) if fresh => return Err(e.into()),
                // The connection broke since its last request: open another.
                Err(_) => broken = Some(generation),
            }
        }
    }
}

/// TCP, then TLS verifying the member's name, then the HTTP/2 preface; the
/// connection is driven by a task of its own until it closes.
async fn connect(target: Target) -> Result<SendRequest<Bytes>, ConnectError> {
    let handshake = async {
        let tcp = TcpStream::connect(target.authority.as_str())
            .await
            .map_err(ConnectError::Tcp)?;
        let _ = tcp.set_nodelay(true);
        tokio_rustls::TlsConnector::from(target.tls.clone())
            .connect(target.server_name.clone(), tcp)
            .await
            .map_err(ConnectError::Tls)
    };
    let tls = tokio::time::timeout(target.connect_timeout, handshake)
        .await
        .map_err(|_| ConnectError::TimedOut(target.connect_timeout))??;
    let (sender, connection) = h2::client::Builder::new()
        .enable_push(false)
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .handshake::<_, Bytes>(tls)
        .await
        .map_err(ConnectError::Http2)?;
    let authority = target.authority.clone();
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(%authority, error = %e, "etcd connection closed");
        }
    });
    Ok(sender)
}

/// Send a request body on its stream, as the stream's flow control allows.
/// Ends quietly when the stream is reset: the response says why.
async fn send_body(mut body: tonic::body::Body, mut stream: h2::SendStream<Bytes>) {
    loop {
        let Some(frame) = body.frame().await else {
            let _ = stream.send_data(Bytes::new(), true);
            return;
        };
        let frame = match frame {
            Ok(frame) => frame,
            Err(_) => {
                stream.send_reset(h2::Reason::CANCEL);
                return;
            }
        };
        match frame.into_data() {
            Ok(mut data) => {
                while !data.is_empty() {
                    stream.reserve_capacity(data.len());
                    match std::future::poll_fn(|cx| stream.poll_capacity(cx)).await {
                        Some(Ok(0)) => continue,
                        Some(Ok(granted)) => {
                            let chunk = data.split_to(granted.min(data.len()));
                            if stream.send_data(chunk, false).is_err() {
                                return;
                            }
                        }
                        Some(Err(_)) | None => return,
                    }
                }
            }
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    let _ = stream.send_trailers(trailers);
                }
                return;
            }
        }
    }
}

/// A response body: its data, then its trailers (where gRPC puts the
/// status). Data read is given back to the connection's flow control.
struct ResponseBody {
    recv: h2::RecvStream,
    state: Read,
}

enum Read {
    Data,
    Trailers,
    Done,
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        let this = self.get_mut();
        loop {
            match this.state {
                Read::Data => match ready!(this.recv.poll_data(cx)) {
                    Some(Ok(data)) => {
                        let _ = this.recv.flow_control().release_capacity(data.len());
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                    Some(Err(e)) => {
                        this.state = Read::Done;
                        return Poll::Ready(Some(Err(e)));
                    }
                    None => this.state = Read::Trailers,
                },
                Read::Trailers => {
                    let trailers = ready!(this.recv.poll_trailers(cx));
                    this.state = Read::Done;
                    return Poll::Ready(match trailers {
                        Ok(Some(trailers)) => Some(Ok(Frame::trailers(trailers))),
                        Ok(None) => None,
                        Err(e) => Some(Err(e)),
                    });
                }
                Read::Done => return Poll::Ready(None),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.state, Read::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn channel_to(authority: &str) -> Shared {
        let roots = rustls::RootCertStore::empty();
        let tls = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        Shared {
            target: Target {
                authority: authority.parse().unwrap(),
                server_name: ServerName::try_from("cp-0.example").unwrap(),
                tls: Arc::new(tls),
                connect_timeout: Duration::from_secs(2),
            },
            current: tokio::sync::Mutex::new(None),
        }
    }

    /// tonic's client names only the method's path; the stream is opened
    /// with the https scheme and the dial address, whatever name the
    /// certificate is checked against.
    #[test]
    fn a_request_goes_to_the_dial_address_over_https() {
        for (authority, path, expected) in [
            (
                "127.0.0.1:2379",
                "/etcdserverpb.Maintenance/Status",
                "https://127.0.0.1:2379/etcdserverpb.Maintenance/Status",
            ),
            (
                "[fd00::1]:2379",
                "/etcdserverpb.Cluster/MemberList",
                "https://[fd00::1]:2379/etcdserverpb.Cluster/MemberList",
            ),
            (
                "cp-0.example:2379",
                "/etcdserverpb.KV/Range",
                "https://cp-0.example:2379/etcdserverpb.KV/Range",
            ),
        ] {
            let uri: http::Uri = path.parse().unwrap();
            assert_eq!(
                channel_to(authority).absolute(&uri).unwrap().to_string(),
                expected
            );
        }
    }

    /// A TLS HTTP/2 server for `cp-0.example` that answers every request
    /// with 200 and shuts a connection down after its first request; the client
    /// configuration trusting it; and the count of connections accepted.
    async fn closing_server() -> (
        std::net::SocketAddr,
        Arc<rustls::ClientConfig>,
        Arc<std::sync::atomic::AtomicUsize>,
    ) {
        let cert = rcgen::generate_simple_self_signed(vec!["cp-0.example".into()]).unwrap();
        let der = cert.cert.der().clone();
        let key =
            rustls::pki_types::PrivateKeyDer::try_from(cert.signing_key.serialize_der()).unwrap();
        let mut server = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(vec![der.clone()], key)
            .unwrap();
        server.alpn_protocols = vec![b"h2".to_vec()];
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der).unwrap();
        let mut client = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        client.alpn_protocols = vec![b"h2".to_vec()];
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
        let count = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let tls = acceptor.accept(tcp).await.unwrap();
                    let mut connection = h2::server::handshake(tls).await.unwrap();
                    if let Some(Ok((_request, mut respond))) = connection.accept().await {
                        let _ = respond.send_response(http::Response::new(()), true);
                    }
                    // As a member that stops: GOAWAY, the answer flushed,
                    // then the connection closed.
                    connection.graceful_shutdown();
                    while let Some(Ok(_)) = connection.accept().await {}
                });
            }
        });
        (addr, Arc::new(client), accepted)
    }

    /// A member restarted between two calls: the second call finds its
    /// connection closed and opens another, instead of failing once.
    #[tokio::test]
    async fn a_call_after_the_connection_broke_opens_another() {
        let (addr, tls, accepted) = closing_server().await;
        let mut shared = channel_to(&addr.to_string());
        shared.target.tls = tls;
        let request = || {
            http::Request::builder()
                .uri("/etcdserverpb.Maintenance/Status")
                .body(())
                .unwrap()
        };

        let mut first = shared.ready_sender().await.unwrap();
        let (response, _) = first.send_request(request(), true).unwrap();
        assert_eq!(response.await.unwrap().status(), 200);
        // Wait (with a deadline) until the client has seen the close.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while first.clone().ready().await.is_ok() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the close was never seen"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }

        let mut second = shared.ready_sender().await.expect("a new connection");
        let (response, _) = second.send_request(request(), true).unwrap();
        assert_eq!(response.await.unwrap().status(), 200);
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    /// Nothing listens: the error says it is a TCP connect error, which
    /// `classify` reads as unreachable.
    #[tokio::test]
    async fn a_refused_connection_is_a_tcp_connect_error() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let shared = channel_to(&addr.to_string());
        let Err(error) = shared.ready_sender().await else {
            panic!("a connection to {addr}, where nothing listens");
        };
        let text = error.to_string();
        assert!(text.starts_with("tcp connect error: "), "{text}");
    }
}
