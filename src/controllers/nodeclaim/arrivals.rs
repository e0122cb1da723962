//! Node arrivals a launch pass is waiting for. kube-runtime runs one pass per NodeClaim at a
//! time, so a Node that registers while its launch pass still waits for the status write would
//! otherwise be synced only after that write is answered (up to ~3 s at 1 000 nodes). The launch
//! pass expects its provider ID here; the Node watch announces each Node's provider ID, and the
//! pass syncs the Node beside its own write.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// Provider IDs that a pass in flight is waiting for, each with the pass's wake-up.
#[derive(Default)]
pub struct NodeArrivals {
    expected: Arc<Mutex<HashMap<String, Arc<Notify>>>>,
}

impl NodeArrivals {
    /// Starts expecting a Node with `provider_id`, until the returned guard is dropped. An
    /// announcement made before the guard is awaited is kept, not lost.
    pub fn expect(&self, provider_id: &str) -> Arrival {
        let notify = Arc::new(Notify::new());
        self.lock().insert(provider_id.to_string(), notify.clone());
        Arrival {
            expected: self.expected.clone(),
            provider_id: provider_id.to_string(),
            notify,
        }
    }

    /// A Node with `provider_id` was applied to the cluster index; wakes the pass expecting it.
    pub fn announce(&self, provider_id: &str) {
        if let Some(notify) = self.lock().get(provider_id) {
            notify.notify_one();
        }
    }

    /// How many provider IDs are expected (tests: guards must not outlive their pass).
    pub fn expected(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Notify>>> {
        self.expected.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One expected Node; stops being expected when dropped.
pub struct Arrival {
    expected: Arc<Mutex<HashMap<String, Arc<Notify>>>>,
    provider_id: String,
    notify: Arc<Notify>,
}

impl Arrival {
    pub fn provider_id(&self) -> &str {
        &self.provider_id
    }

    /// Resolves once a Node with the provider ID was announced since [`NodeArrivals::expect`].
    pub async fn announced(&self) {
        self.notify.notified().await
    }
}

impl Drop for Arrival {
    fn drop(&mut self) {
        let mut expected = self.expected.lock().unwrap_or_else(|p| p.into_inner());
        // A later pass may expect the same provider ID again: remove only this guard's entry.
        if expected
            .get(&self.provider_id)
            .is_some_and(|n| Arc::ptr_eq(n, &self.notify))
        {
            expected.remove(&self.provider_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    #[test]
    fn an_announcement_before_the_wait_is_kept() {
        let arrivals = NodeArrivals::default();
        let arrival = arrivals.expect("exoscale://i-1");
        arrivals.announce("exoscale://i-1");
        assert!(arrival.announced().now_or_never().is_some());
    }

    #[test]
    fn another_provider_id_does_not_wake_the_pass() {
        let arrivals = NodeArrivals::default();
        let arrival = arrivals.expect("exoscale://i-1");
        arrivals.announce("exoscale://i-2");
        assert!(arrival.announced().now_or_never().is_none());
    }

    #[test]
    fn a_dropped_guard_is_no_longer_expected_and_keeps_a_newer_one() {
        let arrivals = NodeArrivals::default();
        let first = arrivals.expect("exoscale://i-1");
        let second = arrivals.expect("exoscale://i-1");
        drop(first);
        assert_eq!(arrivals.expected(), 1, "the newer guard is still expected");
        arrivals.announce("exoscale://i-1");
        assert!(second.announced().now_or_never().is_some());
        drop(second);
        assert_eq!(arrivals.expected(), 0);
        // Announcing what nobody expects is a no-op.
        arrivals.announce("exoscale://i-1");
    }
}
