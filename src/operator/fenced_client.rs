//! A kube client whose mutating requests pass the write [`Fence`] at call time.
//!
//! Every write the controllers make (NodeClaim/Node deletes and patches, evictions, status,
//! events) goes through this client, so a replica past its renew deadline cannot write even
//! from a reconcile that started while it led. Reads (GET, including list and watch) pass.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Method, Request, Response};
use kube::client::Body;

use crate::fence::Fence;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Clone)]
struct FencedService {
    inner: kube::Client,
    fence: Fence,
}

fn is_read(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

impl tower_service::Service<Request<Body>> for FencedService {
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<Body>) -> Self::Future {
        if !is_read(request.method()) {
            let what = || format!("{} {}", request.method(), request.uri().path());
            if let Err(fenced) = self.fence.check(what) {
                tracing::warn!(%fenced, "write refused");
                return Box::pin(std::future::ready(Err(Box::new(fenced) as BoxError)));
            }
            // A rate limiter below may hold the write back: it checks again before sending.
            request.extensions_mut().insert(self.fence.clone());
        }
        let client = self.inner.clone();
        Box::pin(async move { client.send(request).await.map_err(BoxError::from) })
    }
}

/// `client`, with every non-read request checked against `fence` when it is sent.
pub fn fenced(client: kube::Client, fence: Fence) -> kube::Client {
    let namespace = client.default_namespace().to_string();
    kube::Client::new(
        FencedService {
            inner: client,
            fence,
        },
        namespace,
    )
}

/// Whether a kube error is a refusal by the fence (not worth a retry or a warning).
pub fn is_fenced(error: &kube::Error) -> bool {
    match error {
        kube::Error::Service(inner) => inner.downcast_ref::<crate::fence::Fenced>().is_some(),
        _ => false,
    }
}
