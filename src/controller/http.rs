//! `/healthz`, `/readyz` and `/metrics` for the controller.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;

/// What the probe endpoints need: the registry, whether the controller is
/// ready (the management API answered for our kind), and a line on leadership.
///
/// Readiness does not depend on leadership: a standby replica is Ready (it
/// would act the moment it takes the Lease), so a rolling update, which waits
/// for the new Pod to be Ready before stopping the old leader, proceeds.
#[derive(Clone)]
pub struct Probes {
    registry: Arc<Registry>,
    ready: Arc<AtomicBool>,
    leadership: Arc<Mutex<String>>,
}

impl Probes {
    pub fn new(registry: Arc<Registry>) -> Self {
        Probes {
            registry,
            ready: Arc::new(AtomicBool::new(false)),
            leadership: Arc::new(Mutex::new(String::new())),
        }
    }

    /// The line `/readyz` adds about leadership (who leads, or why not us).
    pub fn set_leadership(&self, line: impl Into<String>) {
        *self.leadership.lock().unwrap_or_else(|p| p.into_inner()) = line.into();
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }

    pub fn router(self) -> Router {
        Router::new()
            .route("/healthz", get(|| async { "ok" }))
            .route("/readyz", get(readyz))
            .route("/metrics", get(metrics))
            .with_state(self)
    }

    /// Serves the probes on `addr` until the process ends; returns the bound address.
    pub async fn serve(self, addr: SocketAddr) -> std::io::Result<SocketAddr> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let bound = listener.local_addr()?;
        let router = self.router();
        tokio::spawn(async move {
            if let Err(err) = axum::serve(listener, router).await {
                tracing::error!(%err, "probe server stopped");
            }
        });
        Ok(bound)
    }
}

async fn readyz(State(probes): State<Probes>) -> impl IntoResponse {
    let (code, mut body) = if probes.ready.load(Ordering::SeqCst) {
        (StatusCode::OK, "ok".to_string())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "the management API has not yet answered for KThreesControlPlanes".to_string(),
        )
    };
    let leadership = probes
        .leadership
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    if !leadership.is_empty() {
        body.push('\n');
        body.push_str(&leadership);
    }
    (code, body)
}

async fn metrics(State(probes): State<Probes>) -> impl IntoResponse {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &probes.registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: probes\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    }

    #[tokio::test]
    async fn probes_answer_health_readiness_and_metrics() {
        let mut registry = Registry::default();
        let metrics = crate::controller::metrics::Metrics::register(&mut registry);
        metrics.reconciles.inc();
        let probes = Probes::new(Arc::new(registry));
        let addr = probes
            .clone()
            .serve("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();

        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        let not_ready = get(addr, "/readyz").await;
        assert!(not_ready.starts_with("HTTP/1.1 503"), "{not_ready}");
        probes.set_ready(true);
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
        // A standby is ready too; the body says who leads.
        probes.set_leadership("standby: b waits; Lease ns/l held by a");
        let standby = get(addr, "/readyz").await;
        assert!(standby.starts_with("HTTP/1.1 200"), "{standby}");
        assert!(
            standby.ends_with("ok\nstandby: b waits; Lease ns/l held by a"),
            "{standby}"
        );
        let metrics = get(addr, "/metrics").await;
        assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
        assert!(metrics.contains("k3scp_reconciles_total 1"), "{metrics}");
    }
}
