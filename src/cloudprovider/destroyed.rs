//! Instances this process saw through to the end of their destruction.
//!
//! A node's teardown asks the cloud whether its instance is gone twice: the Node's finalizer
//! waits for it, then the NodeClaim's finalizer checks again, each with a read on the
//! rate-limited API. An instance this process saw being destroyed and then read as not found is
//! gone for good (instance IDs are never reused), so the second check is answered here and costs
//! no call: 900 reads fewer when 900 nodes are removed. Each record is dropped once it has
//! answered that check. A "not found" for an instance not seen being destroyed (one just
//! created and not yet visible, say) proves nothing and is not kept.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Long enough for both finalizers of one teardown, however slow the API.
const REMEMBER_FOR: Duration = Duration::from_secs(30 * 60);
/// Beyond this many remembered instances (once the stale are dropped) nothing new is kept:
/// teardowns then make every call, as without this record.
const MAX_REMEMBERED: usize = 10_000;

#[derive(Default)]
pub struct DestroyedInstances(Mutex<Remembered>);

#[derive(Default)]
struct Remembered {
    /// Instance ID → when its destruction was accepted (or found under way).
    destroying: HashMap<String, Instant>,
    /// Instance ID → when it was then read as not found.
    gone: HashMap<String, Instant>,
}

impl Remembered {
    fn prune(&mut self, now: Instant) {
        let fresh = |at: &mut Instant| now.saturating_duration_since(*at) < REMEMBER_FOR;
        self.destroying.retain(|_, at| fresh(at));
        self.gone.retain(|_, at| fresh(at));
    }

    fn full(&self) -> bool {
        self.destroying.len() + self.gone.len() >= MAX_REMEMBERED
    }
}

impl DestroyedInstances {
    fn lock(&self) -> std::sync::MutexGuard<'_, Remembered> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The cloud accepted the instance's destruction, or reported it under way.
    pub fn destroying(&self, id: &str) {
        self.destroying_at(id, Instant::now());
    }

    /// The cloud answered "not found" for the instance: remembered as gone only if it was seen
    /// being destroyed.
    pub fn not_found(&self, id: &str) {
        self.not_found_at(id, Instant::now());
    }

    /// Whether the instance is known to be gone (no need to ask the cloud). The answer is given
    /// once: the NodeClaim's check is the last that needs it, and a repeat (its finalizer
    /// write failed) just reads again.
    pub fn take_gone(&self, id: &str) -> bool {
        self.take_gone_at(id, Instant::now())
    }

    fn destroying_at(&self, id: &str, now: Instant) {
        let mut remembered = self.lock();
        if remembered.full() {
            // Only when full: a scan per teardown would cost more than the reads it saves.
            remembered.prune(now);
        }
        if !remembered.full() {
            remembered.destroying.entry(id.to_string()).or_insert(now);
        }
    }

    fn not_found_at(&self, id: &str, now: Instant) {
        let mut remembered = self.lock();
        let since = remembered.destroying.remove(id);
        // Moved from one map to the other: the total does not grow.
        if since.is_some_and(|at| now.saturating_duration_since(at) < REMEMBER_FOR) {
            remembered.gone.insert(id.to_string(), now);
        }
    }

    fn take_gone_at(&self, id: &str, now: Instant) -> bool {
        let mut remembered = self.lock();
        remembered
            .gone
            .remove(id)
            .is_some_and(|at| now.saturating_duration_since(at) < REMEMBER_FOR)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_instance_seen_destroying_is_remembered_gone() {
        let record = DestroyedInstances::default();
        let start = Instant::now();
        record.not_found_at("never-deleted", start);
        assert!(
            !record.take_gone_at("never-deleted", start),
            "a 404 alone proves nothing"
        );

        record.destroying_at("i-1", start);
        assert!(!record.take_gone_at("i-1", start), "still being destroyed");
        record.not_found_at("i-1", start + Duration::from_secs(5));
        assert!(record.take_gone_at("i-1", start + Duration::from_secs(6)));
        assert!(
            !record.take_gone_at("i-1", start + Duration::from_secs(6)),
            "answered once"
        );
        assert!(!record.take_gone_at("i-2", start + Duration::from_secs(6)));
        let remembered = record.lock();
        assert!(remembered.destroying.is_empty() && remembered.gone.is_empty());
    }

    #[test]
    fn the_record_is_forgotten_in_time_and_bounded() {
        let record = DestroyedInstances::default();
        let start = Instant::now();
        record.destroying_at("i-1", start);
        record.not_found_at("i-1", start);
        assert!(!record.take_gone_at("i-1", start + REMEMBER_FOR));
        record.destroying_at("i-2", start);
        // Destroying for longer than it is remembered: the later 404 proves nothing any more.
        record.not_found_at("i-2", start + REMEMBER_FOR);
        assert!(!record.take_gone_at("i-2", start + REMEMBER_FOR));

        let record = DestroyedInstances::default();
        for i in 0..MAX_REMEMBERED {
            record.destroying_at(&format!("i-{i}"), start);
        }
        record.destroying_at("one-too-many", start);
        record.not_found_at("one-too-many", start);
        assert!(
            !record.take_gone_at("one-too-many", start),
            "full: not kept"
        );
        assert_eq!(record.lock().destroying.len(), MAX_REMEMBERED);
        // Once the old entries are stale, a new one is kept again.
        let later = start + REMEMBER_FOR;
        record.destroying_at("after-a-while", later);
        record.not_found_at("after-a-while", later);
        assert!(record.take_gone_at("after-a-while", later));
        assert_eq!(record.lock().destroying.len(), 0);
        assert!(record.lock().gone.is_empty());
    }
}
