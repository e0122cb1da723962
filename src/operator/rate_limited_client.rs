//! The Kubernetes client's request rate limit (`KUBE_CLIENT_QPS` / `KUBE_CLIENT_BURST`), as
//! client-go applies it: a token bucket refilled at `qps` holding at most `burst` tokens; a
//! request that finds it empty waits for its turn rather than failing. A watch costs one token
//! when it opens, like any request. Each wait is observed in
//! `karpenter_exoscale_kube_client_rate_limit_wait_seconds`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::token_bucket::RateLimiter;
use http::{Request, Response};
use kube::client::Body;
use prometheus_client::metrics::histogram::Histogram;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Clone)]
struct RateLimitedService {
    inner: kube::Client,
    limiter: Arc<RateLimiter>,
    /// Where waits are observed (requests that found a token are not).
    waits: Histogram,
}

impl tower_service::Service<Request<Body>> for RateLimitedService {
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let wait = self.limiter.reserve();
        let client = self.inner.clone();
        let waits = self.waits.clone();
        Box::pin(async move {
            if !wait.is_zero() {
                waits.observe(wait.as_secs_f64());
                tokio::time::sleep(wait).await;
            }
            client.send(request).await.map_err(BoxError::from)
        })
    }
}

/// `client`, with every request paced by a `qps`/`burst` token bucket shared by its clones;
/// each wait is observed in `waits`.
pub fn rate_limited(client: kube::Client, qps: f32, burst: u32, waits: Histogram) -> kube::Client {
    let namespace = client.default_namespace().to_string();
    kube::Client::new(
        RateLimitedService {
            inner: client,
            limiter: Arc::new(RateLimiter::new(f64::from(qps), burst)),
            waits,
        },
        namespace,
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use tokio::time::Instant;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn requests_through_the_client_wait_for_their_token() {
        // A stand-in API server answering every request at once, recording when it came.
        #[derive(Clone)]
        struct FakeApi(Arc<Mutex<Vec<Instant>>>);
        impl tower_service::Service<Request<Body>> for FakeApi {
            type Response = Response<Body>;
            type Error = std::convert::Infallible;
            type Future = std::future::Ready<Result<Response<Body>, Self::Error>>;
            fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
                Poll::Ready(Ok(()))
            }
            fn call(&mut self, _: Request<Body>) -> Self::Future {
                self.0.lock().unwrap().push(Instant::now());
                let body = br#"{"kind":"Namespace","apiVersion":"v1","metadata":{"name":"x"}}"#;
                std::future::ready(Ok(Response::builder()
                    .status(200)
                    .header("content-type", "application/json")
                    .body(Body::from(body.to_vec()))
                    .unwrap()))
            }
        }
        let seen: Arc<Mutex<Vec<Instant>>> = Arc::default();
        let api = FakeApi(seen.clone());
        let waits = crate::operator::metrics::duration_histogram();
        let client = rate_limited(kube::Client::new(api, "default"), 10.0, 2, waits.clone());
        let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client);
        let start = Instant::now();
        for _ in 0..5 {
            namespaces.get("x").await.unwrap();
        }
        let offsets: Vec<u128> = seen
            .lock()
            .unwrap()
            .iter()
            .map(|t| t.duration_since(start).as_millis())
            .collect();
        assert_eq!(offsets, [0, 0, 100, 200, 300]);
        // The three that waited are observed, 0.1 s each (one at a time, each asked once the one
        // before was answered); the burst's two are not.
        let mut text = String::new();
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("waits", "", waits);
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let count = text
            .lines()
            .find_map(|l| l.strip_prefix("waits_count "))
            .map(str::trim);
        assert_eq!(count, Some("3"), "{text}");
        let sum: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("waits_sum "))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!((sum - 0.3).abs() < 1e-6, "{text}");
    }
}
