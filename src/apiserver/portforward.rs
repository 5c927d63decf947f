//! `GET /api/v1/namespaces/{ns}/pods/{name}/portforward?ports=N` over WebSocket,
//! speaking the `v4.channel.k8s.io` framing kube's `Portforwarder` expects: every
//! frame starts with a channel byte (port i: data `2i`, error `2i+1`), and each
//! channel's first frame carries the port as 2 little-endian bytes.
//!
//! The test world says where a pod's port really leads
//! ([`super::TestApiServer::set_port_forward_target`]); each WebSocket becomes one
//! real TCP connection to that address. One port per request (what we use).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::response::{IntoResponse, Response};
use futures::{SinkExt, StreamExt};
use http::StatusCode;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;

use super::error::ApiError;
use super::routes::App;

const PROTOCOL: &str = "v4.channel.k8s.io";

/// (namespace, pod, port).
pub type PodPort = (String, String, u16);

/// Where each pod port leads, and how many tunnels each pod has had.
#[derive(Default)]
pub struct PortForwards {
    targets: Mutex<HashMap<PodPort, SocketAddr>>,
    opened: Mutex<HashMap<(String, String), u64>>,
}

impl PortForwards {
    pub fn set_target(&self, key: PodPort, target: SocketAddr) {
        self.targets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, target);
    }

    fn target(&self, key: &PodPort) -> Option<SocketAddr> {
        self.targets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .copied()
    }

    /// Tunnels accepted (WebSocket upgraded) for `namespace/pod`.
    pub fn opened(&self, namespace: &str, pod: &str) -> u64 {
        self.opened
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(namespace.to_string(), pod.to_string()))
            .copied()
            .unwrap_or(0)
    }

    fn count(&self, namespace: &str, pod: &str) {
        *self
            .opened
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry((namespace.to_string(), pod.to_string()))
            .or_default() += 1;
    }
}

pub async fn handle(
    State(app): State<Arc<App>>,
    Path((namespace, pod)): Path<(String, String)>,
    Query(query): Query<HashMap<String, String>>,
    request: Request,
) -> Response {
    upgrade(app, namespace, pod, query, request)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn upgrade(
    app: Arc<App>,
    namespace: String,
    pod: String,
    query: HashMap<String, String>,
    mut request: Request,
) -> Result<Response, ApiError> {
    let port: u16 = match query.get("ports").map(|p| p.split(',').collect::<Vec<_>>()) {
        Some(ports) if ports.len() == 1 => ports[0].trim().parse().map_err(|_| {
            ApiError::BadRequest(format!("invalid port {:?} in query ports", ports[0]))
        })?,
        Some(_) => {
            return Err(ApiError::BadRequest(
                "the test API server forwards exactly one port per request".into(),
            ));
        }
        None => return Err(ApiError::BadRequest("query ports is required".into())),
    };
    // Like the real server: the pod must exist.
    let def = app
        .watch
        .store
        .registry()
        .find("", "v1", "pods")
        .ok_or(ApiError::NoRoute)?
        .clone();
    app.watch.store.get(&def, "v1", Some(&namespace), &pod)?;
    let headers = request.headers();
    let offered = headers
        .get(http::header::SEC_WEBSOCKET_PROTOCOL)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if !offered.split(',').any(|p| p.trim() == PROTOCOL) {
        return Err(ApiError::BadRequest(format!(
            "portforward needs the WebSocket subprotocol {PROTOCOL}, offered {offered:?}"
        )));
    }
    let key = headers
        .get(http::header::SEC_WEBSOCKET_KEY)
        .ok_or_else(|| ApiError::BadRequest("Sec-WebSocket-Key is required".into()))?;
    let accept = derive_accept_key(key.as_bytes());
    let on_upgrade = request
        .extensions_mut()
        .remove::<hyper::upgrade::OnUpgrade>()
        .ok_or_else(|| ApiError::BadRequest("the connection cannot be upgraded".into()))?;
    let target = app
        .port_forwards
        .target(&(namespace.clone(), pod.clone(), port));
    app.port_forwards.count(&namespace, &pod);
    let shutdown = app.watch.shutdown.clone();
    tokio::spawn(async move {
        let Ok(upgraded) = on_upgrade.await else {
            return;
        };
        let ws = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        tokio::select! {
            _ = tunnel(ws, port, target, &namespace, &pod) => {}
            _ = shutdown.cancelled() => {}
        }
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(http::header::CONNECTION, "Upgrade")
        .header(http::header::UPGRADE, "websocket")
        .header(http::header::SEC_WEBSOCKET_ACCEPT, accept)
        .header(http::header::SEC_WEBSOCKET_PROTOCOL, PROTOCOL)
        .body(Body::empty())
        .map_err(|e| ApiError::BadRequest(e.to_string()))
}

async fn tunnel<S>(
    mut ws: WebSocketStream<S>,
    port: u16,
    target: Option<SocketAddr>,
    namespace: &str,
    pod: &str,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let [lo, hi] = port.to_le_bytes();
    for channel in [0u8, 1] {
        if ws
            .send(Message::binary(vec![channel, lo, hi]))
            .await
            .is_err()
        {
            return;
        }
    }
    let connected = match target {
        Some(addr) => tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("dialing {addr}: {e}")),
        None => Err("no target registered".to_string()),
    };
    let mut tcp = match connected {
        Ok(tcp) => tcp,
        Err(reason) => {
            // The kubelet reports a failed dial on the port's error channel.
            let message =
                format!("error forwarding port {port} to pod {namespace}/{pod}: {reason}");
            let mut frame = vec![1u8];
            frame.extend_from_slice(message.as_bytes());
            let _ = ws.send(Message::binary(frame)).await;
            let _ = ws.send(Message::Close(None)).await;
            return;
        }
    };
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        tokio::select! {
            read = tcp.read(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let mut frame = Vec::with_capacity(n + 1);
                    frame.push(0u8);
                    frame.extend_from_slice(&buf[..n]);
                    if ws.send(Message::binary(frame)).await.is_err() {
                        return;
                    }
                }
            },
            message = ws.next() => match message {
                Some(Ok(Message::Binary(bytes))) if bytes.len() > 1 && bytes[0] == 0 => {
                    if tcp.write_all(&bytes[1..]).await.is_err() {
                        break;
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => {
                    let _ = tcp.shutdown().await;
                    return;
                }
                Some(Ok(_)) => {}
            },
        }
    }
    let _ = ws.send(Message::Close(None)).await;
}
