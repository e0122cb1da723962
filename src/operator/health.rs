//! `/healthz`, `/readyz` (health-probe port) and `/metrics` (metrics port) over axum.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;

use super::metrics::Metrics;

/// A named readiness check: `Err(why)` makes `/readyz` answer 503 naming it.
pub type ReadinessCheck = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

#[derive(Clone, Default)]
pub struct Readiness {
    checks: Vec<(String, ReadinessCheck)>,
}

impl Readiness {
    pub fn with_check(
        mut self,
        name: &str,
        check: impl Fn() -> Result<(), String> + Send + Sync + 'static,
    ) -> Self {
        self.checks.push((name.into(), Arc::new(check)));
        self
    }

    /// Failing checks as `name: reason` lines.
    pub fn failures(&self) -> Vec<String> {
        self.checks
            .iter()
            .filter_map(|(name, check)| check().err().map(|why| format!("{name}: {why}")))
            .collect()
    }
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(readiness): State<Readiness>) -> impl IntoResponse {
    let failures = readiness.failures();
    if failures.is_empty() {
        (StatusCode::OK, "ok".to_string())
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, failures.join("\n"))
    }
}

async fn metrics(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    (
        [(
            CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        metrics.render(),
    )
}

pub fn health_router(readiness: Readiness) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(readiness)
}

pub fn metrics_router(metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/metrics", get(self::metrics))
        .with_state(metrics)
}

/// Binds `addr` (so bind errors surface at start-up) and serves until `shutdown` resolves.
pub async fn bind_and_serve(
    addr: SocketAddr,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = TcpListener::bind(addr).await?;
    Ok(tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, router)
            .with_graceful_shutdown(shutdown)
            .await
        {
            tracing::error!(%addr, %error, "HTTP server failed");
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    async fn get_status(addr: SocketAddr, path: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        let code = response[9..12].parse().unwrap();
        (code, response)
    }

    #[tokio::test]
    async fn readyz_names_failing_checks() {
        let synced = Arc::new(AtomicBool::new(false));
        let flag = synced.clone();
        let readiness = Readiness::default().with_check("cluster-state", move || {
            if flag.load(Ordering::SeqCst) {
                Ok(())
            } else {
                Err("not synced".into())
            }
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let server = bind_and_serve(addr, health_router(readiness), async {
            let _ = rx.await;
        })
        .await
        .unwrap();
        assert_eq!(get_status(addr, "/healthz").await.0, 200);
        let (code, body) = get_status(addr, "/readyz").await;
        assert_eq!(code, 503);
        assert!(body.contains("cluster-state: not synced"), "{body}");
        synced.store(true, Ordering::SeqCst);
        assert_eq!(get_status(addr, "/readyz").await.0, 200);
        tx.send(()).unwrap();
        server.await.unwrap();
    }
}
