//! An HTTP proxy in front of kube-apiserver that holds chosen requests until the test releases
//! them: a controller restarted behind it sees some lists arrive and others not (e.g. Nodes
//! listed, Pods not yet), the partial view a slow or paginated list gives at start-up.
//!
//! The controller speaks plain HTTP to the proxy on loopback; the proxy forwards over TLS with
//! the control plane's CA, streaming answers (watches included) back as they come.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::Response;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Which requests to hold: method and path-and-query.
pub type HoldRule = Arc<dyn Fn(&Method, &str) -> bool + Send + Sync>;

/// Holds the LIST (not the watch) of one resource path, e.g. `/api/v1/pods`.
pub fn list_of(path: &'static str) -> HoldRule {
    Arc::new(move |method, path_and_query| {
        let (p, query) = path_and_query
            .split_once('?')
            .unwrap_or((path_and_query, ""));
        method == Method::GET && p == path && !query.split('&').any(|kv| kv == "watch=true")
    })
}

struct Shared {
    upstream: String,
    client: reqwest::Client,
    rule: HoldRule,
    released: watch::Receiver<bool>,
    held: AtomicUsize,
}

pub struct KubeProxy {
    addr: SocketAddr,
    release: watch::Sender<bool>,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl KubeProxy {
    /// Forwards to `upstream` (`https://…`, trusting `ca_pem`), holding what `rule` matches.
    pub async fn start(upstream: &str, ca_pem: &str, rule: HoldRule) -> KubeProxy {
        let ca = reqwest::Certificate::from_pem(ca_pem.as_bytes()).expect("control plane CA");
        let client = reqwest::Client::builder()
            .add_root_certificate(ca)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("proxy client");
        let (release, released) = watch::channel(false);
        let shared = Arc::new(Shared {
            upstream: upstream.trim_end_matches('/').to_string(),
            client,
            rule,
            released,
            held: AtomicUsize::new(0),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind kube proxy");
        let addr = listener.local_addr().expect("kube proxy address");
        let app = axum::Router::new()
            .fallback(forward)
            .with_state(shared.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        KubeProxy {
            addr,
            release,
            shared,
            task,
        }
    }

    /// Requests held so far (released ones included).
    pub fn held(&self) -> usize {
        self.shared.held.load(Ordering::SeqCst)
    }

    /// Lets every held request through, and holds nothing from now on.
    pub fn release(&self) {
        let _ = self.release.send(true);
    }

    /// A kubeconfig like `original`'s, its server this proxy, written beside it.
    pub fn kubeconfig(&self, original: &Path) -> PathBuf {
        let text = std::fs::read_to_string(original).expect("read the kubeconfig");
        let rewritten: String = text
            .lines()
            .map(|line| match line.trim_start().strip_prefix("server: ") {
                Some(_) => format!("    server: http://{}", self.addr),
                None => line.to_string(),
            })
            .collect::<Vec<_>>()
            .join("\n");
        let path = original.with_file_name(format!("kubeconfig-proxy-{}", self.addr.port()));
        std::fs::write(&path, rewritten + "\n").expect("write the proxy kubeconfig");
        path
    }
}

impl Drop for KubeProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Hop-by-hop headers a proxy must not pass on.
fn end_to_end(headers: &HeaderMap) -> HeaderMap {
    let mut out = headers.clone();
    for name in [
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::HOST,
        header::CONTENT_LENGTH,
    ] {
        out.remove(name);
    }
    out.remove("keep-alive");
    out
}

async fn forward(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let method = request.method().clone();
    let target = request
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    if (shared.rule)(&method, &target) && !*shared.released.borrow() {
        shared.held.fetch_add(1, Ordering::SeqCst);
        let mut released = shared.released.clone();
        let _ = released.wait_for(|r| *r).await;
    }
    let headers = end_to_end(request.headers());
    let body = match axum::body::to_bytes(request.into_body(), 64 << 20).await {
        Ok(body) => body,
        Err(e) => return failed(format!("reading the request body: {e}")),
    };
    let sent = shared
        .client
        .request(method, format!("{}{target}", shared.upstream))
        .headers(headers)
        .body(body)
        .send()
        .await;
    let answer = match sent {
        Ok(answer) => answer,
        Err(e) => return failed(format!("forwarding: {e}")),
    };
    let mut response = Response::builder().status(answer.status());
    if let Some(out) = response.headers_mut() {
        *out = end_to_end(answer.headers());
    }
    // Chunk by chunk, so a watch's events pass as they come.
    let chunks = futures::stream::unfold(answer, |mut answer| async move {
        match answer.chunk().await {
            Ok(Some(chunk)) => Some((Ok::<_, reqwest::Error>(chunk), answer)),
            Ok(None) | Err(_) => None,
        }
    });
    response
        .body(Body::from_stream(chunks))
        .unwrap_or_else(|e| failed(format!("building the answer: {e}")))
}

fn failed(message: String) -> Response {
    let mut response = Response::new(Body::from(message));
    *response.status_mut() = StatusCode::BAD_GATEWAY;
    response
}
