//! The admin HTTP server: `/healthz` (kube-proxy's port, 10256), `/readyz`
//! and `/metrics` (kube-proxy's metrics port, 10249). Both listeners serve
//! every path.

use std::{convert::Infallible, net::SocketAddr, sync::Arc};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{
    body::Incoming, server::conn::http1, service::service_fn, Request, Response, StatusCode,
};
use hyper_util::rt::TokioIo;
use tokio::{net::TcpListener, sync::watch};
use tracing::{debug, warn};

use crate::{health::Health, metrics::Metrics};

/// Liveness: the sync loop keeps up and the API answers (`health.rs`).
pub const HEALTHZ_PATH: &str = "/healthz";
/// Same as `/healthz`, under the name newer components use.
pub const LIVEZ_PATH: &str = "/livez";
/// Readiness: the first complete sync reached the maps.
pub const READYZ_PATH: &str = "/readyz";
/// The counters and gauges, in OpenMetrics text.
pub const METRICS_PATH: &str = "/metrics";

#[derive(Clone)]
pub struct Admin {
    pub health: Arc<Health>,
    pub metrics: Arc<Metrics>,
}

fn respond(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        resp.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    resp
}

fn rfc3339(t: Option<std::time::SystemTime>) -> Option<String> {
    let t = k8s_openapi::jiff::Timestamp::try_from(t?).ok()?;
    Some(t.to_string())
}

impl Admin {
    fn handle(&self, req: &Request<Incoming>) -> Response<Full<Bytes>> {
        match req.uri().path() {
            HEALTHZ_PATH | LIVEZ_PATH => {
                let report = self.health.report();
                let body = serde_json::json!({
                    "lastUpdated": rfc3339(report.last_sync),
                    "currentTime": rfc3339(Some(std::time::SystemTime::now())),
                    "healthy": report.healthy,
                    "ready": report.ready,
                    "reasons": report.reasons,
                    "pendingSeconds": report.pending_seconds,
                    "apiDownSeconds": report.api_down_seconds,
                });
                let status = if report.healthy {
                    StatusCode::OK
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                };
                respond(status, "application/json", body.to_string())
            }
            READYZ_PATH => {
                let report = self.health.report();
                if report.ready {
                    respond(StatusCode::OK, "text/plain", "ok\n".into())
                } else {
                    respond(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "text/plain",
                        "waiting for the first full sync\n".into(),
                    )
                }
            }
            METRICS_PATH => respond(
                StatusCode::OK,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                self.metrics.encode(),
            ),
            _ => respond(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
        }
    }

    /// Serves on an already bound listener until `shutdown` turns true.
    pub async fn serve(self, listener: TcpListener, mut shutdown: watch::Receiver<bool>) {
        loop {
            let (stream, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        warn!(error = %e, "admin accept failed");
                        continue;
                    }
                },
                _ = shutdown.changed() => return,
            };
            let admin = self.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req: Request<Incoming>| {
                    let resp = admin.handle(&req);
                    async move { Ok::<_, Infallible>(resp) }
                });
                if let Err(e) = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await
                {
                    debug!(%peer, error = %e, "admin connection ended");
                }
            });
        }
    }
}

/// Binds an admin address (`0` port allowed, for tests).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}
