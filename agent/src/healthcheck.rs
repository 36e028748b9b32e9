//! kube-proxy's health check node ports: for each LoadBalancer service
//! with externalTrafficPolicy Local, an HTTP server on its
//! `healthCheckNodePort` answers 200 while this node has a ready endpoint
//! of the service and 503 otherwise (also when only terminating endpoints
//! are left, so that the load balancer drains the node, and when the agent
//! itself is unhealthy). The body is kube-proxy's:
//! `{"service":{"namespace":..,"name":..},"localEndpoints":N,"serviceProxyHealthy":true}`.

use std::{
    collections::{BTreeMap, HashMap},
    convert::Infallible,
    net::{Ipv4Addr, SocketAddr},
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{
    body::Incoming, server::conn::http1, service::service_fn, Request, Response, StatusCode,
};
use hyper_util::rt::TokioIo;
use tokio::{net::TcpListener, sync::watch, task::JoinHandle};
use tracing::{info, warn};

use crate::{health::Health, translate::ObjectKey};

/// Wanted health checks: port -> (service, local ready endpoints).
pub type HealthChecks = BTreeMap<u16, (ObjectKey, u32)>;

type Shared = Arc<Mutex<HealthChecks>>;

fn answer(state: &Shared, port: u16, health: &Health) -> Response<Full<Bytes>> {
    let entry = match state.lock() {
        Ok(s) => s.get(&port).cloned(),
        Err(poisoned) => poisoned.into_inner().get(&port).cloned(),
    };
    let healthy = health.report().healthy;
    let (status, body) = match entry {
        Some((svc, n)) => {
            let ok = n > 0 && healthy;
            let body = serde_json::json!({
                "service": {"namespace": &*svc.namespace, "name": &*svc.name},
                "localEndpoints": n,
                "serviceProxyHealthy": healthy,
            });
            (
                if ok {
                    StatusCode::OK
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                },
                body,
            )
        }
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            serde_json::json!({"localEndpoints": 0}),
        ),
    };
    let mut resp = Response::new(Full::new(Bytes::from(body.to_string())));
    *resp.status_mut() = status;
    let headers = resp.headers_mut();
    headers.insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    headers.insert(
        "X-Content-Type-Options",
        hyper::header::HeaderValue::from_static("nosniff"),
    );
    resp
}

async fn serve(listener: TcpListener, port: u16, state: Shared, health: Arc<Health>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let (state, health) = (state.clone(), health.clone());
        tokio::spawn(async move {
            let service = service_fn(move |_req: Request<Incoming>| {
                let resp = answer(&state, port, &health);
                async move { Ok::<_, Infallible>(resp) }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// Serves the wanted health checks until `shutdown`; binds new ports as
/// they appear (retrying every few seconds while a port is taken) and
/// closes those no longer wanted.
pub async fn run(
    mut wanted: watch::Receiver<HealthChecks>,
    health: Arc<Health>,
    mut shutdown: watch::Receiver<bool>,
) {
    let state: Shared = Arc::new(Mutex::new(HealthChecks::new()));
    let mut servers: HashMap<u16, JoinHandle<()>> = HashMap::new();
    loop {
        let current = wanted.borrow_and_update().clone();
        match state.lock() {
            Ok(mut s) => *s = current.clone(),
            Err(poisoned) => *poisoned.into_inner() = current.clone(),
        }
        servers.retain(|port, task| {
            let keep = current.contains_key(port);
            if !keep {
                task.abort();
                info!(port, "health check node port closed");
            }
            keep
        });
        for (port, (svc, _)) in &current {
            if servers.contains_key(port) {
                continue;
            }
            match TcpListener::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, *port))).await {
                Ok(listener) => {
                    info!(port, service = %svc, "serving health check node port");
                    servers.insert(
                        *port,
                        tokio::spawn(serve(listener, *port, state.clone(), health.clone())),
                    );
                }
                Err(e) => {
                    warn!(port, service = %svc, error = %e, "cannot bind health check node port; will retry")
                }
            }
        }
        tokio::select! {
            changed = wanted.changed() => if changed.is_err() { break },
            _ = tokio::time::sleep(Duration::from_secs(5)), if servers.len() < current.len() => {}
            _ = shutdown.changed() => break,
        }
    }
    for task in servers.into_values() {
        task.abort();
    }
}
