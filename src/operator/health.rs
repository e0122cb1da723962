//! `/healthz`, `/readyz` (health-probe port) and `/metrics` (metrics port) over axum.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::http::StatusCode;
use axum::http::header::{ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
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

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The exposition, gzip-compressed when the scraper accepts it (Prometheus does by default):
/// per-node series are ~8 KB a node in text, a thirtieth of that compressed. Encoded on a
/// blocking thread: at 1 000 nodes that is ~8 MB of text and tens of milliseconds.
async fn metrics(State(metrics): State<Arc<Metrics>>, headers: HeaderMap) -> Response {
    let gzip = accepts_gzip(&headers);
    let level = if gzip {
        flate2::Compression::default()
    } else {
        // Only held until it is inflated again for this response.
        flate2::Compression::fast()
    };
    let compressed = tokio::task::spawn_blocking(move || render_gzipped(&metrics, level)).await;
    match compressed {
        Ok(Ok(body)) if gzip => (
            [(CONTENT_TYPE, OPENMETRICS), (CONTENT_ENCODING, "gzip")],
            body,
        )
            .into_response(),
        Ok(Ok(body)) => ([(CONTENT_TYPE, OPENMETRICS)], inflated_in_chunks(body)).into_response(),
        Ok(Err(error)) => {
            tracing::warn!(%error, "cannot compress the metrics exposition");
            (StatusCode::INTERNAL_SERVER_ERROR, "cannot render metrics").into_response()
        }
        Err(error) => {
            tracing::warn!(%error, "metrics rendering did not finish");
            (StatusCode::INTERNAL_SERVER_ERROR, "cannot render metrics").into_response()
        }
    }
}

/// How much plain text a scrape without gzip holds at a time.
const TEXT_CHUNK: usize = 64 * 1024;

/// A plain-text scrape (curl, a scraper without gzip) is served from the compressed exposition,
/// inflated one [`TEXT_CHUNK`] at a time as the client reads: the whole text was the process's
/// largest allocation (~8 MB at 1 000 nodes, in a buffer grown to 16 MB), and the registry's
/// lock is not held while a slow client reads.
fn inflated_in_chunks(compressed: Vec<u8>) -> axum::body::Body {
    let decoder = flate2::read::GzDecoder::new(std::io::Cursor::new(compressed));
    let chunks = futures::stream::unfold(Some(decoder), |decoder| async move {
        let mut decoder = decoder?;
        let mut chunk = vec![0; TEXT_CHUNK];
        let mut filled = 0;
        while filled < chunk.len() {
            match std::io::Read::read(&mut decoder, &mut chunk[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(error) => return Some((Err(error), None)),
            }
        }
        if filled == 0 {
            return None;
        }
        chunk.truncate(filled);
        Some((Ok(axum::body::Bytes::from(chunk)), Some(decoder)))
    });
    axum::body::Body::from_stream(chunks)
}

/// The exposition compressed as it is written: a scrape never holds the whole text.
fn render_gzipped(metrics: &Metrics, level: flate2::Compression) -> std::io::Result<Vec<u8>> {
    struct Gzip {
        encoder: flate2::write::GzEncoder<Vec<u8>>,
        error: Option<std::io::Error>,
    }
    impl std::fmt::Write for Gzip {
        fn write_str(&mut self, text: &str) -> std::fmt::Result {
            std::io::Write::write_all(&mut self.encoder, text.as_bytes()).map_err(|error| {
                self.error = Some(error);
                std::fmt::Error
            })
        }
    }
    let mut out = Gzip {
        encoder: flate2::write::GzEncoder::new(Vec::new(), level),
        error: None,
    };
    if metrics.render_into(&mut out).is_err() {
        return Err(out
            .error
            .unwrap_or_else(|| std::io::Error::other("metrics encoding failed")));
    }
    out.encoder.finish()
}

fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|coding| {
            let mut parts = coding.split(';');
            let name = parts.next().unwrap_or("").trim();
            // `gzip;q=0` refuses it.
            let refused = parts.any(|p| {
                p.trim()
                    .strip_prefix("q=")
                    .and_then(|q| q.trim().parse::<f32>().ok())
                    == Some(0.0)
            });
            name.eq_ignore_ascii_case("gzip") && !refused
        })
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

    /// One GET on a fresh connection: the lowercased head and the raw body.
    async fn get(addr: SocketAddr, path: &str, extra: &str) -> (String, Vec<u8>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\n{extra}Connection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.unwrap();
        let end = response.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
        let head = String::from_utf8_lossy(&response[..end]).to_lowercase();
        let body = &response[end + 4..];
        if head.contains("transfer-encoding: chunked") {
            return (head, dechunked(body));
        }
        (head, body.to_vec())
    }

    /// An HTTP/1.1 chunked body's payload; panics on a malformed one.
    fn dechunked(mut body: &[u8]) -> Vec<u8> {
        let mut payload = Vec::new();
        loop {
            let line = body.windows(2).position(|w| w == b"\r\n").unwrap();
            let size = std::str::from_utf8(&body[..line]).unwrap();
            let size = usize::from_str_radix(size.split(';').next().unwrap().trim(), 16).unwrap();
            body = &body[line + 2..];
            if size == 0 {
                return payload;
            }
            payload.extend_from_slice(&body[..size]);
            assert_eq!(&body[size..size + 2], b"\r\n");
            body = &body[size + 2..];
        }
    }

    async fn get_status(addr: SocketAddr, path: &str) -> (u16, String) {
        let (head, body) = get(addr, path, "").await;
        let code = head[9..12].parse().unwrap();
        (code, String::from_utf8_lossy(&body).into_owned())
    }

    /// Serves `router` on a free local port until the returned sender is used.
    async fn serve(
        router: Router,
    ) -> (
        SocketAddr,
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let server = bind_and_serve(addr, router, async {
            let _ = rx.await;
        })
        .await
        .unwrap();
        (addr, tx, server)
    }

    #[tokio::test]
    async fn metrics_are_gzipped_for_scrapers_that_accept_it() {
        let metrics = Arc::new(Metrics::new());
        metrics
            .nodepools_usage
            .get_or_create(&super::super::metrics::labels([
                ("nodepool", "default"),
                ("resource_type", "cpu"),
            ]))
            .set(2.0);
        let (addr, tx, server) = serve(metrics_router(metrics)).await;
        let (head, plain) = get(addr, "/metrics", "").await;
        assert!(!head.contains("content-encoding"), "{head}");
        let text = String::from_utf8(plain).unwrap();
        assert!(text.contains("karpenter_nodepools_usage"), "{text}");
        let (head, body) = get(addr, "/metrics", "Accept-Encoding: deflate, gzip;q=0.8\r\n").await;
        assert!(head.contains("content-encoding: gzip"), "{head}");
        let mut unzipped = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&body[..]), &mut unzipped)
            .unwrap();
        assert_eq!(unzipped, text);
        let (head, _) = get(addr, "/metrics", "Accept-Encoding: gzip;q=0\r\n").await;
        assert!(
            !head.contains("content-encoding"),
            "gzip;q=0 refuses: {head}"
        );
        tx.send(()).unwrap();
        server.await.unwrap();
    }

    #[tokio::test]
    async fn a_plain_text_scrape_is_streamed_in_bounded_chunks() {
        let metrics = Arc::new(Metrics::new());
        // ~460 KB of text: several chunks.
        for node in 0..6000 {
            metrics
                .nodepools_usage
                .get_or_create(&super::super::metrics::labels([
                    ("nodepool", format!("pool-{node:05}").as_str()),
                    ("resource_type", "cpu"),
                ]))
                .set(f64::from(node));
        }
        let expected = metrics.render();
        assert!(expected.len() > 4 * TEXT_CHUNK, "{}", expected.len());
        let (addr, tx, server) = serve(metrics_router(metrics)).await;
        let (head, plain) = get(addr, "/metrics", "").await;
        assert!(head.contains("transfer-encoding: chunked"), "{head}");
        assert!(!head.contains("content-encoding"), "{head}");
        assert_eq!(String::from_utf8(plain).unwrap(), expected);
        tx.send(()).unwrap();
        server.await.unwrap();
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
        let (addr, tx, server) = serve(health_router(readiness)).await;
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
