//! The Kubernetes client's request rate limit (`KUBE_CLIENT_QPS` / `KUBE_CLIENT_BURST`), as
//! client-go applies it: a token bucket refilled at `qps` holding at most `burst` tokens; a
//! request that finds it empty waits for its turn rather than failing. A watch costs one token
//! when it opens, like any request.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use kube::client::Body;
use tokio::time::Instant;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A token bucket handing out reservations: each call takes a token and says how long to wait
/// for it (zero while the burst lasts). Pure: the instant is passed in.
#[derive(Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    /// Tokens at `at`; negative when reservations are queued ahead.
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    pub fn new(qps: f32, burst: u32, now: Instant) -> Self {
        let burst = f64::from(burst.max(1));
        TokenBucket {
            qps: f64::from(qps).max(f64::MIN_POSITIVE),
            burst,
            tokens: burst,
            at: now,
        }
    }

    /// Takes a token; returns how long to wait before using it.
    pub fn reserve(&mut self, now: Instant) -> Duration {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst) - 1.0;
        self.at = now.max(self.at);
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            // A wait beyond a day would be a configuration error; never sleep for ever.
            Duration::from_secs_f64((-self.tokens / self.qps).min(86_400.0))
        }
    }
}

#[derive(Clone)]
struct RateLimitedService {
    inner: kube::Client,
    bucket: Arc<Mutex<TokenBucket>>,
}

impl tower_service::Service<Request<Body>> for RateLimitedService {
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let wait = self
            .bucket
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .reserve(Instant::now());
        let client = self.inner.clone();
        Box::pin(async move {
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
            client.send(request).await.map_err(BoxError::from)
        })
    }
}

/// `client`, with every request paced by a `qps`/`burst` token bucket shared by its clones.
pub fn rate_limited(client: kube::Client, qps: f32, burst: u32) -> kube::Client {
    let namespace = client.default_namespace().to_string();
    kube::Client::new(
        RateLimitedService {
            inner: client,
            bucket: Arc::new(Mutex::new(TokenBucket::new(qps, burst, Instant::now()))),
        },
        namespace,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_goes_at_once_then_requests_are_spaced_at_the_rate() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(2.0, 3, start);
        let waits: Vec<Duration> = (0..6).map(|_| bucket.reserve(start)).collect();
        let ms: Vec<u128> = waits.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [0, 0, 0, 500, 1000, 1500]);
        // After a quiet spell the bucket is full again, never fuller than the burst.
        let later = start + Duration::from_secs(60);
        let ms: Vec<u128> = (0..4).map(|_| bucket.reserve(later).as_millis()).collect();
        assert_eq!(ms, [0, 0, 0, 500]);
    }

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
        let client = rate_limited(kube::Client::new(api, "default"), 10.0, 2);
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
    }
}
