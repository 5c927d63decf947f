//! One HTTP/2 connection over verified TLS, driven by h2 itself: opened on
//! first use, opened again after it broke, with no request queue in front
//! of it.
//!
//! hyper's clients (and tonic's channel above hyper) put tokio mpsc queues
//! in front of every connection: tonic a tower `Buffer`, kube's client a
//! `Buffer` too, and hyper's dispatcher one of its own. Each queue starts
//! with a block of 32 slots and, once 32 requests have passed through it,
//! takes a second block that it keeps for good: with one request per idle
//! pass, each held connection grows by tens of KiB after half an hour
//! (docs/bench-history.md, "Where the RSS at rest grows"). An h2
//! `SendRequest` is a handle on the connection's own state: a request opens
//! a stream under its lock, with no queue in between.
//!
//! Used by the etcd member channel (`etcd::h2_channel`) and by the workload
//! API reads (`workload::reads`). Concurrent calls share one connection and
//! one connect; one time limit covers TCP and TLS.

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

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a connection could not be opened. The text carries every cause, as
/// the callers' error classification reads the text.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectError {
    #[error("tcp connect error: {0}")]
    Tcp(std::io::Error),
    #[error("tls handshake error: {0}")]
    Tls(std::io::Error),
    #[error("connection error: connect timed out after {0:?}")]
    TimedOut(Duration),
    /// The TLS handshake (verified) agreed on another protocol by ALPN, or
    /// on none, and the target asked for HTTP/2 by ALPN only.
    #[error("the server does not speak HTTP/2 (ALPN: {0})")]
    NotHttp2(String),
    #[error("http2 handshake error: {0}")]
    Http2(h2::Error),
}

/// HTTP/2 flow-control windows.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Windows {
    pub stream: u32,
    pub connection: u32,
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
    /// `None`: h2's defaults (64 KiB).
    pub windows: Option<Windows>,
    /// Speak HTTP/2 only if ALPN chose `h2` ([`ConnectError::NotHttp2`]
    /// otherwise); `false` speaks it regardless, as gRPC clients do.
    pub alpn_h2_only: bool,
}

/// The connection's shared state; callers keep it in an `Arc`.
pub(crate) struct H2Connection {
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

impl H2Connection {
    /// A connection opened on the first request.
    pub(crate) fn lazy(target: Target) -> Self {
        Self {
            target,
            current: tokio::sync::Mutex::new(None),
        }
    }

    /// Send `request` (its URI's path and query; the scheme is https and the
    /// authority the dial address) and wait for the response head.
    pub(crate) async fn send<B>(
        &self,
        request: http::Request<B>,
    ) -> Result<http::Response<ResponseBody>, BoxError>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Send,
    {
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
        Ok(response.map(|recv| ResponseBody {
            recv,
            state: Read::Data,
        }))
    }

    /// The request's URI on this connection: h2 needs the scheme and
    /// authority that the callers leave out or may have set otherwise.
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

/// TCP, then TLS verifying the server's name, then the HTTP/2 preface; the
/// connection is driven by a task of its own until it closes, which h2 does
/// once every handle on it is dropped.
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
    if target.alpn_h2_only {
        match tls.get_ref().1.alpn_protocol() {
            Some(b"h2") => {}
            Some(other) => {
                return Err(ConnectError::NotHttp2(
                    String::from_utf8_lossy(other).into_owned(),
                ));
            }
            None => return Err(ConnectError::NotHttp2("none agreed".into())),
        }
    }
    let mut builder = h2::client::Builder::new();
    builder.enable_push(false);
    if let Some(windows) = target.windows {
        builder
            .initial_window_size(windows.stream)
            .initial_connection_window_size(windows.connection);
    }
    let (sender, connection) = builder
        .handshake::<_, Bytes>(tls)
        .await
        .map_err(ConnectError::Http2)?;
    let authority = target.authority.clone();
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(%authority, error = %e, "HTTP/2 connection closed");
        }
    });
    Ok(sender)
}

/// Send a request body on its stream, as the stream's flow control allows.
/// Ends quietly when the stream is reset: the response says why.
async fn send_body<B>(body: B, mut stream: h2::SendStream<Bytes>)
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Send,
{
    let mut body = std::pin::pin!(body);
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
pub(crate) struct ResponseBody {
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

    fn channel_to(authority: &str) -> H2Connection {
        let roots = rustls::RootCertStore::empty();
        let tls = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        H2Connection::lazy(Target {
            authority: authority.parse().unwrap(),
            server_name: ServerName::try_from("cp-0.example").unwrap(),
            tls: Arc::new(tls),
            connect_timeout: Duration::from_secs(2),
            windows: None,
            alpn_h2_only: false,
        })
    }

    /// tonic's client names only the method's path, kube's layers an
    /// absolute URI of the kubeconfig's server: the stream is opened with the
    /// https scheme and the dial address, whatever name the certificate is
    /// checked against.
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
            (
                "10.0.0.5:6443",
                "https://10.0.0.5:6443/api/v1/nodes?&labelSelector=a",
                "https://10.0.0.5:6443/api/v1/nodes?&labelSelector=a",
            ),
        ] {
            let uri: http::Uri = path.parse().unwrap();
            assert_eq!(
                channel_to(authority).absolute(&uri).unwrap().to_string(),
                expected
            );
        }
    }

    /// What a test server saw.
    #[derive(Default)]
    struct Seen {
        accepted: std::sync::atomic::AtomicUsize,
        /// Connections the client closed (or that the server shut down).
        ended: std::sync::atomic::AtomicUsize,
    }

    /// A TLS HTTP/2 server for `cp-0.example` that answers every request
    /// with 200 and, with `close_after_one`, shuts a connection down after
    /// its first request; the client configuration trusting it; what it saw.
    async fn server(
        close_after_one: bool,
    ) -> (std::net::SocketAddr, Arc<rustls::ClientConfig>, Arc<Seen>) {
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
        let seen = Arc::new(Seen::default());
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
        let counts = seen.clone();
        tokio::spawn(async move {
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                counts
                    .accepted
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let acceptor = acceptor.clone();
                let counts = counts.clone();
                tokio::spawn(async move {
                    let tls = acceptor.accept(tcp).await.unwrap();
                    let mut connection = h2::server::handshake(tls).await.unwrap();
                    while let Some(Ok((_request, mut respond))) = connection.accept().await {
                        let _ = respond.send_response(http::Response::new(()), true);
                        if close_after_one {
                            // As a member that stops: GOAWAY, the answer
                            // flushed, then the connection closed.
                            connection.graceful_shutdown();
                        }
                    }
                    counts
                        .ended
                        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                });
            }
        });
        (addr, Arc::new(client), seen)
    }

    fn status_request() -> http::Request<()> {
        http::Request::builder()
            .uri("/etcdserverpb.Maintenance/Status")
            .body(())
            .unwrap()
    }

    /// A connection whose handles are all dropped (a cluster's connections
    /// replaced when its client certificate is renewed) is closed, not left
    /// open on either side.
    #[tokio::test]
    async fn a_connection_closes_when_its_last_handle_is_dropped() {
        let (addr, tls, seen) = server(false).await;
        let mut connection = channel_to(&addr.to_string());
        connection.target.tls = tls;
        let mut sender = connection.ready_sender().await.unwrap();
        let (response, _) = sender.send_request(status_request(), true).unwrap();
        assert_eq!(response.await.unwrap().status(), 200);
        assert_eq!(seen.ended.load(std::sync::atomic::Ordering::SeqCst), 0);

        drop(sender);
        drop(connection);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while seen.ended.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the connection stayed open after its last handle was dropped"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(seen.accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    /// A member restarted between two calls: the second call finds its
    /// connection closed and opens another, instead of failing once.
    #[tokio::test]
    async fn a_call_after_the_connection_broke_opens_another() {
        let (addr, tls, seen) = server(true).await;
        let mut shared = channel_to(&addr.to_string());
        shared.target.tls = tls;
        let request = status_request;

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
        assert_eq!(seen.accepted.load(std::sync::atomic::Ordering::SeqCst), 2);
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
