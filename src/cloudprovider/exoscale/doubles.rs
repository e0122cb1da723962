//! In-memory implementations of the provider's Kubernetes side, for tests (built with
//! `cfg(test)` or the `test-doubles` feature the integration tests enable; never in the binary).

use std::collections::BTreeMap;
use std::sync::{Mutex, RwLock};

use futures::future::BoxFuture;

use crate::apis::ExoscaleNodeClass;
use crate::providers::bootstrap_token::{BootstrapToken, TokenOwner};

use super::cluster::{NodeBootstrap, NodeClassSource, TokenCreateFailure};

/// NodeClasses held in memory (tests, `simulate`).
#[derive(Default)]
pub struct StaticNodeClasses(RwLock<BTreeMap<String, ExoscaleNodeClass>>);

impl StaticNodeClasses {
    pub fn insert(&self, nodeclass: ExoscaleNodeClass) {
        let name = nodeclass.metadata.name.clone().unwrap_or_default();
        self.0.write().expect("lock").insert(name, nodeclass);
    }

    pub fn remove(&self, name: &str) {
        self.0.write().expect("lock").remove(name);
    }
}

impl NodeClassSource for StaticNodeClasses {
    fn get(&self, name: &str) -> Option<ExoscaleNodeClass> {
        self.0.read().expect("lock").get(name).cloned()
    }
}

/// Tokens kept in memory with a fixed CA (tests, `simulate`).
pub struct InMemoryNodeBootstrap {
    ca: Vec<u8>,
    tokens: Mutex<BTreeMap<String, BootstrapToken>>,
    fail_creates: Mutex<u32>,
    lose_create_answers: Mutex<u32>,
    fail_deletes: Mutex<u32>,
    deletes: Mutex<Vec<String>>,
}

impl InMemoryNodeBootstrap {
    pub fn new(ca_pem: impl Into<Vec<u8>>) -> Self {
        InMemoryNodeBootstrap {
            ca: ca_pem.into(),
            tokens: Mutex::new(BTreeMap::new()),
            fail_creates: Mutex::new(0),
            lose_create_answers: Mutex::new(0),
            fail_deletes: Mutex::new(0),
            deletes: Mutex::new(Vec::new()),
        }
    }

    /// Live tokens by NodeClaim.
    pub fn tokens(&self) -> BTreeMap<String, BootstrapToken> {
        self.tokens.lock().expect("lock").clone()
    }

    /// Every token Secret name a delete was asked for, in order, deleted or not.
    pub fn delete_requests(&self) -> Vec<String> {
        self.deletes.lock().expect("lock").clone()
    }

    /// The next `n` token creations fail.
    pub fn fail_next_creates(&self, n: u32) {
        *self.fail_creates.lock().expect("lock") = n;
    }

    /// The next `n` token creations store their token but lose the answer (a timeout).
    pub fn lose_next_create_answers(&self, n: u32) {
        *self.lose_create_answers.lock().expect("lock") = n;
    }

    /// The next `n` delete calls fail (after being recorded in `delete_requests`).
    pub fn fail_next_deletes(&self, n: u32) {
        *self.fail_deletes.lock().expect("lock") = n;
    }
}

fn take_one(counter: &Mutex<u32>) -> bool {
    let mut n = counter.lock().expect("lock");
    let take = *n > 0;
    if take {
        *n -= 1;
    }
    take
}

impl NodeBootstrap for InMemoryNodeBootstrap {
    fn create_token<'a>(
        &'a self,
        nodeclaim: TokenOwner<'a>,
    ) -> BoxFuture<'a, std::result::Result<BootstrapToken, TokenCreateFailure>> {
        Box::pin(async move {
            if take_one(&self.fail_creates) {
                return Err(TokenCreateFailure {
                    message: "secrets is forbidden (injected)".to_string(),
                    maybe_stored: None,
                });
            }
            let token = BootstrapToken::generate();
            self.tokens
                .lock()
                .expect("lock")
                .insert(nodeclaim.name.to_string(), token.clone());
            if take_one(&self.lose_create_answers) {
                return Err(TokenCreateFailure {
                    message: "timed out waiting for the answer (injected)".to_string(),
                    maybe_stored: Some(token.secret_name()),
                });
            }
            Ok(token)
        })
    }

    fn delete_tokens<'a>(
        &'a self,
        secret_names: &'a [String],
    ) -> BoxFuture<'a, std::result::Result<(), String>> {
        Box::pin(async move {
            self.deletes
                .lock()
                .expect("lock")
                .extend(secret_names.iter().cloned());
            if take_one(&self.fail_deletes) {
                return Err("secrets: connection reset (injected)".to_string());
            }
            self.tokens
                .lock()
                .expect("lock")
                .retain(|_, token| !secret_names.contains(&token.secret_name()));
            Ok(())
        })
    }

    fn cluster_ca(&self) -> BoxFuture<'_, std::result::Result<Vec<u8>, String>> {
        Box::pin(async move { Ok(self.ca.clone()) })
    }
}
