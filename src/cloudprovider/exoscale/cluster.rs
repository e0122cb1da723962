//! The provider's Kubernetes side, behind two small traits so it runs against in-memory doubles
//! in tests: where ExoscaleNodeClasses are read from, and the bootstrap tokens and CA bundle a
//! launch needs.

use std::collections::BTreeSet;

use futures::future::BoxFuture;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::apis::labels::NODECLAIM_TOKENS_ANNOTATION;
use crate::apis::{ExoscaleNodeClass, NodeClaim};
use crate::providers::bootstrap_token::{self, BootstrapToken, TokenOwner};
use crate::providers::cluster_ca;

/// Where NodeClasses are read from (a reflector store in production).
pub trait NodeClassSource: Send + Sync {
    fn get(&self, name: &str) -> Option<ExoscaleNodeClass>;
    /// Whether what it holds is complete and current (listed, its watch sound since).
    fn synced(&self) -> bool {
        true
    }
}

/// The reflector store of ExoscaleNodeClasses and whether its watch is sound. After a watch
/// failure the store keeps serving what it last saw, possibly for good (a conversion or RBAC
/// error after an upgrade keeps the re-list failing): launches would use an old spec and
/// drift would be judged against one. Until the next complete list it reports itself not
/// synced, and the provider refuses to read from it.
pub struct WatchedNodeClasses {
    store: Store<ExoscaleNodeClass>,
    current: std::sync::atomic::AtomicBool,
}

impl WatchedNodeClasses {
    pub fn new(store: Store<ExoscaleNodeClass>) -> Self {
        WatchedNodeClasses {
            store,
            current: std::sync::atomic::AtomicBool::new(true),
        }
    }

    /// Follows the watch: a failure makes the store stale, a completed (re-)list current.
    pub fn follow<E>(&self, event: Result<&kube::runtime::watcher::Event<ExoscaleNodeClass>, E>) {
        use std::sync::atomic::Ordering::SeqCst;
        match event {
            Err(_) => self.current.store(false, SeqCst),
            Ok(kube::runtime::watcher::Event::InitDone) => self.current.store(true, SeqCst),
            Ok(_) => {}
        }
    }
}

impl NodeClassSource for WatchedNodeClasses {
    fn get(&self, name: &str) -> Option<ExoscaleNodeClass> {
        NodeClassSource::get(&self.store, name)
    }
    fn synced(&self) -> bool {
        self.current.load(std::sync::atomic::Ordering::SeqCst) && self.store.synced()
    }
}

impl NodeClassSource for Store<ExoscaleNodeClass> {
    fn get(&self, name: &str) -> Option<ExoscaleNodeClass> {
        Store::get(self, &ObjectRef::new(name)).map(|nc| (*nc).clone())
    }
    fn synced(&self) -> bool {
        use futures::FutureExt;
        self.wait_until_ready()
            .now_or_never()
            .is_some_and(|r| r.is_ok())
    }
}

/// A token create that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenCreateFailure {
    pub message: String,
    /// The Secret the API server may have stored anyway (its answer was lost): it must be
    /// deleted, or kept on record until it can be.
    pub maybe_stored: Option<String>,
}

impl std::fmt::Display for TokenCreateFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Cluster-side needs of a launch: bootstrap tokens and the CA bundle.
pub trait NodeBootstrap: Send + Sync {
    fn create_token<'a>(
        &'a self,
        nodeclaim: TokenOwner<'a>,
    ) -> BoxFuture<'a, std::result::Result<BootstrapToken, TokenCreateFailure>>;
    /// Deletes the token Secrets of these names (never listed: found by recorded name).
    fn delete_tokens<'a>(
        &'a self,
        secret_names: &'a [String],
    ) -> BoxFuture<'a, std::result::Result<(), String>>;
    fn cluster_ca(&self) -> BoxFuture<'_, std::result::Result<Vec<u8>, String>>;
}

/// Tokens as `kube-system` Secrets and the CA from the cluster (cached for
/// [`cluster_ca::CA_MAX_AGE`], so a rotation reaches new nodes without a restart).
pub struct KubeNodeBootstrap {
    client: kube::Client,
    ca: cluster_ca::CaCache,
    ttl: std::time::Duration,
}

impl KubeNodeBootstrap {
    /// Tokens valid for `ttl` (the registration TTL plus a margin, see
    /// [`bootstrap_token::TOKEN_TTL_MARGIN`]).
    pub fn new(client: kube::Client, ttl: std::time::Duration) -> Self {
        KubeNodeBootstrap {
            client,
            ca: cluster_ca::CaCache::new(
                std::sync::Arc::new(crate::clock::SystemClock),
                cluster_ca::CA_MAX_AGE,
            ),
            ttl,
        }
    }
}

impl NodeBootstrap for KubeNodeBootstrap {
    fn create_token<'a>(
        &'a self,
        nodeclaim: TokenOwner<'a>,
    ) -> BoxFuture<'a, std::result::Result<BootstrapToken, TokenCreateFailure>> {
        Box::pin(async move {
            bootstrap_token::create_for_nodeclaim(
                &self.client,
                nodeclaim,
                chrono::Utc::now(),
                self.ttl,
            )
            .await
            .map_err(|e| TokenCreateFailure {
                message: e.to_string(),
                maybe_stored: e.maybe_stored().map(str::to_string),
            })
        })
    }

    fn delete_tokens<'a>(
        &'a self,
        secret_names: &'a [String],
    ) -> BoxFuture<'a, std::result::Result<(), String>> {
        Box::pin(async move {
            // Every name is tried: one refused delete must not leave the others' tokens valid.
            let mut failed = Vec::new();
            for name in secret_names {
                if let Err(e) = bootstrap_token::delete_token(&self.client, name).await {
                    failed.push(e.to_string());
                }
            }
            if failed.is_empty() {
                Ok(())
            } else {
                Err(failed.join("; "))
            }
        })
    }

    fn cluster_ca(&self) -> BoxFuture<'_, std::result::Result<Vec<u8>, String>> {
        Box::pin(async move { self.ca.get(|| cluster_ca::fetch(&self.client)).await })
    }
}

/// The token Secrets recorded on a NodeClaim.
pub fn recorded_tokens(claim: &NodeClaim) -> BTreeSet<String> {
    bootstrap_token::recorded(
        claim
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(NODECLAIM_TOKENS_ANNOTATION))
            .map(String::as_str),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use std::task::{Context, Poll};

    /// An API server that refuses (403) the delete of the Secret whose name ends in `1` and
    /// deletes the others, recording their names.
    #[derive(Clone)]
    struct RefusesOne {
        deleted: Arc<Mutex<Vec<String>>>,
    }

    impl tower_service::Service<http::Request<kube::client::Body>> for RefusesOne {
        type Response = http::Response<http_body_util::Full<bytes::Bytes>>;
        type Error = Box<dyn std::error::Error + Send + Sync>;
        type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: http::Request<kube::client::Body>) -> Self::Future {
            let name = request.uri().path().rsplit('/').next().unwrap_or_default();
            let (status, body) = if name.ends_with('1') {
                (
                    403,
                    r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"refused by the test","reason":"Forbidden","code":403}"#,
                )
            } else {
                self.deleted.lock().unwrap().push(name.to_string());
                (
                    200,
                    r#"{"kind":"Status","apiVersion":"v1","status":"Success"}"#,
                )
            };
            std::future::ready(Ok(http::Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .body(http_body_util::Full::new(bytes::Bytes::from(body)))
                .unwrap()))
        }
    }

    #[tokio::test]
    async fn a_refused_token_delete_does_not_leave_the_other_tokens() {
        let deleted = Arc::new(Mutex::new(Vec::new()));
        let client = kube::Client::new(
            RefusesOne {
                deleted: deleted.clone(),
            },
            "default",
        );
        let bootstrap = KubeNodeBootstrap::new(client, std::time::Duration::from_secs(60));
        let names = [
            "bootstrap-token-aaaaa1".to_string(),
            "bootstrap-token-bbbbb2".to_string(),
            "bootstrap-token-ccccc3".to_string(),
        ];
        let error = bootstrap.delete_tokens(&names).await.unwrap_err();
        assert!(error.contains("bootstrap-token-aaaaa1"), "{error}");
        assert_eq!(
            *deleted.lock().unwrap(),
            ["bootstrap-token-bbbbb2", "bootstrap-token-ccccc3"]
        );
    }
}
