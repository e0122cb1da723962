//! Rate limit for events a controller would otherwise repeat on every short requeue (a node
//! being drained is looked at several times a second early in the eviction backoff).
//!
//! Pure: the caller passes a monotonic `now`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// At most one event per key this often.
pub const MIN_EVENT_INTERVAL: Duration = Duration::from_secs(10);

/// The last time an event went out, per key (a node, or a node and a reason).
#[derive(Debug)]
pub struct EventThrottle<K> {
    last: BTreeMap<K, Instant>,
}

impl<K> Default for EventThrottle<K> {
    fn default() -> Self {
        EventThrottle {
            last: BTreeMap::new(),
        }
    }
}

impl<K: Ord> EventThrottle<K> {
    /// Whether an event for `key` may go out at `now`; if so, `now` is recorded as its last.
    pub fn allow(&mut self, key: K, now: Instant) -> bool {
        match self.last.get(&key) {
            Some(last) if now.saturating_duration_since(*last) < MIN_EVENT_INTERVAL => false,
            _ => {
                self.last.insert(key, now);
                true
            }
        }
    }

    /// Forgets the keys `keep` rejects (their node is gone or released).
    pub fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        self.last.retain(|k, _| keep(k));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_event_per_key_every_ten_seconds() {
        let t0 = Instant::now();
        let mut throttle = EventThrottle::default();
        assert!(throttle.allow("n1", t0));
        assert!(!throttle.allow("n1", t0 + Duration::from_millis(100)));
        assert!(!throttle.allow("n1", t0 + Duration::from_millis(9_999)));
        assert!(throttle.allow("n2", t0 + Duration::from_secs(1)), "per key");
        assert!(throttle.allow("n1", t0 + MIN_EVENT_INTERVAL));
        assert!(!throttle.allow("n1", t0 + MIN_EVENT_INTERVAL + Duration::from_secs(9)));
        assert!(throttle.allow("n1", t0 + MIN_EVENT_INTERVAL * 2));
    }

    #[test]
    fn forgotten_keys_may_publish_at_once() {
        let t0 = Instant::now();
        let mut throttle = EventThrottle::default();
        assert!(throttle.allow("n1", t0));
        assert!(throttle.allow("n2", t0));
        throttle.retain(|k| *k == "n2");
        assert!(throttle.allow("n1", t0 + Duration::from_secs(1)));
        assert!(!throttle.allow("n2", t0 + Duration::from_secs(1)));
    }
}
