//! Deadlines on the kube client's requests. kube's client has no read timeout (its watcher
//! guards only an open watch's silence), so a request to an API server that stopped answering
//! (a black-holed connection, a hung proxy) would hold its task forever:
//!
//! - a non-watch request must be answered in full (headers and body) within
//!   [`RequestTimeouts::request`], its body at most [`MAX_BODY_BYTES`];
//! - a watch must be opened (its headers answered) within [`RequestTimeouts::watch_open`];
//!   its stream is then left to kube's watcher, whose idle timeout ends a silent one. A
//!   re-watch that hangs is an error, so cluster state marks the kind unsynced;
//! - a write that carries its [`Fence`] (see `fenced_client`) is given up at the fence's
//!   deadline too: delivered later, it could land after another replica took over.
//!
//! A request given up has an unknown outcome, as after any lost answer.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{Request, Response};
use http_body_util::BodyExt;
use kube::client::Body;
use thiserror::Error;
use tokio::time::Instant;

use crate::fence::Fence;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Largest non-watch answer read (a list page of 500 Pods is a few megabytes).
pub const MAX_BODY_BYTES: usize = 128 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestTimeouts {
    /// A whole non-watch request, sent to fully read.
    pub request: Duration,
    /// A watch, sent to its answer's headers.
    pub watch_open: Duration,
}

impl Default for RequestTimeouts {
    /// The API server gives up on a request after 60 s by itself (`--request-timeout`); a
    /// connection that stopped answering is given up earlier. A watch's headers come at once.
    fn default() -> Self {
        RequestTimeouts {
            request: Duration::from_secs(30),
            watch_open: Duration::from_secs(15),
        }
    }
}

/// A request given up before its answer was complete.
#[derive(Debug, Error)]
pub enum Unanswered {
    #[error("{what}: no complete answer within {after:?}; gave up (its outcome is unknown)")]
    TimedOut { what: String, after: Duration },
    #[error("{what}: answer larger than {limit} bytes; gave up")]
    TooLarge { what: String, limit: usize },
    #[error("{what}: answer body failed: {source}")]
    Body { what: String, source: BoxError },
}

#[derive(Clone)]
struct TimedService {
    inner: kube::Client,
    timeouts: RequestTimeouts,
}

fn is_watch(request: &Request<Body>) -> bool {
    request
        .uri()
        .query()
        .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"))
}

/// The instant a request must be answered by: its timeout, or its write fence's deadline.
fn deadline_of(request: &Request<Body>, timeout: Duration, now: Instant) -> (Instant, Duration) {
    let fence_left = request
        .extensions()
        .get::<Fence>()
        .and_then(Fence::time_left);
    let after = fence_left.map_or(timeout, |left| left.min(timeout));
    (now + after, after)
}

async fn read_bounded(body: Body, what: &str, limit: usize) -> Result<Bytes, Unanswered> {
    let mut body = std::pin::pin!(body);
    let mut read = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| Unanswered::Body {
            what: what.to_string(),
            source: Box::new(e),
        })?;
        if let Ok(data) = frame.into_data() {
            if read.len() + data.len() > limit {
                return Err(Unanswered::TooLarge {
                    what: what.to_string(),
                    limit,
                });
            }
            read.extend_from_slice(&data);
        }
    }
    Ok(read.freeze())
}

impl tower_service::Service<Request<Body>> for TimedService {
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let client = self.inner.clone();
        let what = format!("{} {}", request.method(), request.uri().path());
        let watch = is_watch(&request);
        let timeout = if watch {
            self.timeouts.watch_open
        } else {
            self.timeouts.request
        };
        // The fence may have closed since the fenced layer let the write through (a rate-limit
        // wait, or a lost renewal in between): not sent at all, rather than sent with no time.
        if let Some(fence) = request.extensions().get::<Fence>()
            && !fence.allows()
        {
            let refused = crate::fence::Fenced { what };
            return Box::pin(std::future::ready(Err(Box::new(refused) as BoxError)));
        }
        let (deadline, after) = deadline_of(&request, timeout, Instant::now());
        let timed_out = move |what: String| Box::new(Unanswered::TimedOut { what, after });
        Box::pin(async move {
            let answered = tokio::time::timeout_at(deadline, client.send(request)).await;
            let response = match answered {
                Err(_) => return Err(timed_out(what) as BoxError),
                Ok(response) => response.map_err(BoxError::from)?,
            };
            if watch {
                return Ok(response);
            }
            let (parts, body) = response.into_parts();
            let read = tokio::time::timeout_at(deadline, read_bounded(body, &what, MAX_BODY_BYTES));
            match read.await {
                Err(_) => Err(timed_out(what) as BoxError),
                Ok(Err(unanswered)) => Err(Box::new(unanswered) as BoxError),
                Ok(Ok(bytes)) => Ok(Response::from_parts(parts, Body::from(bytes))),
            }
        })
    }
}

/// `client`, with every request held to `timeouts` (and a fenced write to its fence's deadline).
pub fn timed(client: kube::Client, timeouts: RequestTimeouts) -> kube::Client {
    let namespace = client.default_namespace().to_string();
    kube::Client::new(
        TimedService {
            inner: client,
            timeouts,
        },
        namespace,
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

    use futures::StreamExt;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, PostParams};

    use super::*;
    use crate::operator::fenced_client::fenced;

    /// What the fake API server does with a request.
    #[derive(Clone, Copy)]
    enum Server {
        /// Never answers.
        Silent,
        /// Answers headers at once, then never finishes the body.
        StallsBody,
        /// Answers at once with a body of this many bytes.
        Answers(usize),
    }

    #[derive(Clone)]
    struct Fake {
        server: Server,
        calls: Arc<AtomicUsize>,
    }

    impl tower_service::Service<Request<Body>> for Fake {
        type Response = Response<
            http_body_util::StreamBody<
                futures::stream::BoxStream<'static, Result<http_body::Frame<Bytes>, BoxError>>,
            >,
        >;
        type Error = BoxError;
        type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<Body>) -> Self::Future {
            self.calls.fetch_add(1, SeqCst);
            let server = self.server;
            Box::pin(async move {
                let frames: futures::stream::BoxStream<'static, _> = match server {
                    Server::Silent => return futures::future::pending().await,
                    Server::StallsBody => futures::stream::once(async {
                        Ok(http_body::Frame::data(Bytes::from_static(b"{\"kind\":")))
                    })
                    .chain(futures::stream::pending())
                    .boxed(),
                    Server::Answers(len) => {
                        let mut body = br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x","namespace":"default"},"data":{"pad":""#.to_vec();
                        body.resize(len.saturating_sub(3).max(body.len()), b'a');
                        body.extend_from_slice(b"\"}}");
                        futures::stream::once(async move {
                            Ok(http_body::Frame::data(Bytes::from(body)))
                        })
                        .boxed()
                    }
                };
                Ok(Response::new(http_body_util::StreamBody::new(frames)))
            })
        }
    }

    fn client_of(server: Server) -> (kube::Client, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let fake = Fake {
            server,
            calls: calls.clone(),
        };
        (kube::Client::new(fake, "default"), calls)
    }

    fn short() -> RequestTimeouts {
        RequestTimeouts {
            request: Duration::from_secs(30),
            watch_open: Duration::from_secs(15),
        }
    }

    fn is_timeout(error: &kube::Error) -> bool {
        matches!(error, kube::Error::Service(e)
            if matches!(e.downcast_ref::<Unanswered>(), Some(Unanswered::TimedOut { .. })))
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_that_never_answers_is_given_up_at_its_timeout() {
        let (inner, _) = client_of(Server::Silent);
        let api: Api<ConfigMap> = Api::default_namespaced(timed(inner, short()));
        let started = Instant::now();
        let error = api.get("x").await.unwrap_err();
        assert!(is_timeout(&error), "{error}");
        assert_eq!(started.elapsed(), Duration::from_secs(30));
        assert!(
            error
                .to_string()
                .contains("GET /api/v1/namespaces/default/configmaps/x")
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_stalls_is_given_up_within_the_same_timeout() {
        let (inner, _) = client_of(Server::StallsBody);
        let api: Api<ConfigMap> = Api::default_namespaced(timed(inner, short()));
        let started = Instant::now();
        let error = api.get("x").await.unwrap_err();
        assert!(is_timeout(&error), "{error}");
        assert_eq!(started.elapsed(), Duration::from_secs(30));
    }

    #[tokio::test(start_paused = true)]
    async fn an_oversized_answer_is_refused_and_a_normal_one_read() {
        let (inner, _) = client_of(Server::Answers(MAX_BODY_BYTES + 1));
        let api: Api<ConfigMap> = Api::default_namespaced(timed(inner, short()));
        let error = api.get("x").await.unwrap_err();
        assert!(error.to_string().contains("larger than"), "{error}");
        let (inner, _) = client_of(Server::Answers(1000));
        let api: Api<ConfigMap> = Api::default_namespaced(timed(inner, short()));
        let read = api.get("x").await.unwrap();
        assert!(read.data.unwrap()["pad"].len() > 800);
    }

    #[tokio::test(start_paused = true)]
    async fn a_fenced_write_is_given_up_at_the_fence_deadline() {
        let (inner, calls) = client_of(Server::Silent);
        let fence = Fence::closed();
        fence.extend_until(std::time::Instant::now() + Duration::from_secs(4));
        let api: Api<ConfigMap> =
            Api::default_namespaced(fenced(timed(inner, short()), fence.clone()));
        let started = Instant::now();
        let error = api
            .create(&PostParams::default(), &ConfigMap::default())
            .await
            .unwrap_err();
        assert!(is_timeout(&error), "{error}");
        assert_eq!(calls.load(SeqCst), 1);
        // Given up when the fence's 4 s ran out (less what the std clock the fence reads moved
        // meanwhile), not at the 30-s request timeout.
        let waited = started.elapsed();
        assert!(
            waited > Duration::ZERO && waited <= Duration::from_secs(4),
            "{waited:?}"
        );
    }

    #[tokio::test]
    async fn a_write_whose_fence_closed_on_the_way_is_not_sent() {
        let (inner, calls) = client_of(Server::Answers(10));
        let fence = Fence::closed();
        fence.extend_until(std::time::Instant::now() + Duration::from_secs(10));
        // The fenced layer let it through; then the Lease was lost before it was sent.
        let mut request = Request::post("/api/v1/namespaces/default/configmaps")
            .body(Body::empty())
            .unwrap();
        request.extensions_mut().insert(fence.clone());
        fence.close();
        let mut service = TimedService {
            inner,
            timeouts: short(),
        };
        let error = tower_service::Service::call(&mut service, request)
            .await
            .unwrap_err();
        assert!(
            error.downcast_ref::<crate::fence::Fenced>().is_some(),
            "{error}"
        );
        assert_eq!(calls.load(SeqCst), 0, "sent although fenced");
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_must_open_in_time_but_may_then_stay_quiet() {
        let (inner, _) = client_of(Server::Silent);
        let api: Api<ConfigMap> = Api::default_namespaced(timed(inner, short()));
        let started = Instant::now();
        let error = api
            .watch(&Default::default(), "0")
            .await
            .err()
            .expect("a watch that never opens fails");
        assert!(is_timeout(&error), "{error}");
        assert_eq!(started.elapsed(), Duration::from_secs(15));

        // Opened, a watch's silence is left to kube's watcher: it is not cut at any timeout.
        let (inner, _) = client_of(Server::StallsBody);
        let api: Api<ConfigMap> = Api::default_namespaced(timed(inner, short()));
        let mut events = api.watch(&Default::default(), "0").await.unwrap().boxed();
        let quiet = tokio::time::timeout(Duration::from_secs(600), events.next()).await;
        assert!(quiet.is_err(), "an open watch was cut");
    }
}
