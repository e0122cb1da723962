//! The Kubernetes client's request rate limit (`KUBE_CLIENT_QPS` / `KUBE_CLIENT_BURST`), as
//! client-go applies it: a token bucket refilled at `qps` holding at most `burst` tokens; a
//! request that finds it empty waits for its turn rather than failing. A watch costs one token
//! when it opens, like any request. Each wait is observed in
//! `karpenter_exoscale_kube_client_rate_limit_wait_seconds`. A write that carries its
//! [`Fence`] (the fenced client puts it on the request) is checked again when its turn comes.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::fence::Fence;
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
                // A write's fence (see `fenced_client`) was checked before its turn came; the
                // lease may have run out while it waited.
                if let Some(fence) = request.extensions().get::<Fence>() {
                    let what = || format!("{} {}", request.method(), request.uri().path());
                    fence.check(what).map_err(|fenced| {
                        tracing::warn!(%fenced, "write refused after its rate-limit wait");
                        Box::new(fenced) as BoxError
                    })?;
                }
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

    /// A stand-in API server answering every request at once, recording when each came and
    /// its method.
    #[derive(Clone, Default)]
    struct FakeApi(Arc<Mutex<Vec<(Instant, String)>>>);

    impl tower_service::Service<Request<Body>> for FakeApi {
        type Response = Response<Body>;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<Response<Body>, Self::Error>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, request: Request<Body>) -> Self::Future {
            let method = request.method().to_string();
            self.0.lock().unwrap().push((Instant::now(), method));
            let body = br#"{"kind":"Namespace","apiVersion":"v1","metadata":{"name":"x"}}"#;
            std::future::ready(Ok(Response::builder()
                .status(200)
                .header("content-type", "application/json")
                .body(Body::from(body.to_vec()))
                .unwrap()))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn requests_through_the_client_wait_for_their_token() {
        let seen = FakeApi::default();
        let api = seen.clone();
        let waits = crate::operator::metrics::duration_histogram();
        let client = rate_limited(kube::Client::new(api, "default"), 10.0, 2, waits.clone());
        let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client);
        let start = Instant::now();
        for _ in 0..5 {
            namespaces.get("x").await.unwrap();
        }
        let offsets: Vec<u128> = seen
            .0
            .lock()
            .unwrap()
            .iter()
            .map(|(t, _)| t.duration_since(start).as_millis())
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

    /// A write queued behind the rate limit while the replica led is refused if the lease ran
    /// out during its wait: the fence is checked when it is sent, not when it was queued.
    #[tokio::test(start_paused = true)]
    async fn a_write_whose_lease_ran_out_while_it_waited_is_not_sent() {
        let seen = FakeApi::default();
        let waits = crate::operator::metrics::duration_histogram();
        let limited = rate_limited(kube::Client::new(seen.clone(), "default"), 1.0, 1, waits);
        let fence = Fence::closed();
        fence.extend_until(std::time::Instant::now() + std::time::Duration::from_secs(3600));
        let writer = crate::operator::fenced_client::fenced(limited, fence.clone());
        let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(writer);
        let deletes = |n: &kube::Api<k8s_openapi::api::core::v1::Namespace>| {
            let n = n.clone();
            async move { n.delete("x", &Default::default()).await }
        };
        deletes(&namespaces)
            .await
            .expect("the first write has its token");
        let queued = tokio::spawn(deletes(&namespaces));
        // The second write waits a second for its token; the lease is lost meanwhile.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        fence.close();
        let refused = queued.await.unwrap().expect_err("refused after its wait");
        assert!(
            crate::operator::fenced_client::is_fenced(&refused),
            "{refused}"
        );
        let methods: Vec<String> = seen
            .0
            .lock()
            .unwrap()
            .iter()
            .map(|(_, m)| m.clone())
            .collect();
        assert_eq!(methods, ["DELETE"], "only the first write was sent");
        // Reads are not fenced.
        namespaces
            .get("x")
            .await
            .expect("a read after the lease is lost");
    }
}
