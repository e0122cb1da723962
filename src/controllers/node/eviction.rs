//! The eviction queue (karpenter-core §4.2 "Eviction queue"): remembers, per pod, when the
//! eviction API may be asked again, so a node requeued every second does not re-evict every
//! blocking pod each time. Each pod backs off exponentially from 100 ms to 10 s while a
//! PodDisruptionBudget refuses it (or `karpenter.sh/do-not-disrupt` holds it).
//!
//! Pure: the caller passes a monotonic `now`; nothing here sleeps or talks to the API.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::drain::{PodAction, WaitReason};

/// First retry delay after a refused eviction.
pub const INITIAL_BACKOFF: Duration = Duration::from_millis(100);
/// Retry delays double up to this.
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// The API server's refusal when several PDBs select one pod (HTTP 500, not 429).
const MULTIPLE_PDBS_MESSAGE: &str = "more than one PodDisruptionBudget";

/// Identifies one pod incarnation: a pod recreated under the same name is a new entry.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodKey {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl PodKey {
    pub fn new(namespace: &str, name: &str, uid: Option<&str>) -> Self {
        PodKey {
            namespace: namespace.into(),
            name: name.into(),
            uid: uid.unwrap_or_default().into(),
        }
    }
}

impl std::fmt::Display for PodKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What the eviction API answered, classified the way the queue acts on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvictionResponse {
    /// 200/201: the pod is being deleted.
    Evicted,
    /// 404 (pod gone) or 409 (UID precondition: a different pod now): nothing left to evict.
    Gone,
    /// 429 (a PDB allows no disruption) or several PDBs select the pod: retry later.
    Blocked,
    /// Anything else: retry later too, and report it.
    Failed,
}

impl EvictionResponse {
    pub fn classify(code: u16, message: &str) -> Self {
        match code {
            200 | 201 => EvictionResponse::Evicted,
            404 | 409 => EvictionResponse::Gone,
            429 => EvictionResponse::Blocked,
            _ if message.contains(MULTIPLE_PDBS_MESSAGE) => EvictionResponse::Blocked,
            _ => EvictionResponse::Failed,
        }
    }
}

#[derive(Clone, Debug)]
struct Entry {
    node: String,
    /// Consecutive attempts that did not evict (refusals or do-not-disrupt holds).
    failures: u32,
    /// No eviction is sent before this.
    not_before: Option<Instant>,
    /// The last answer was a PDB refusal.
    blocked: bool,
    /// The API accepted an eviction or a forced deletion: neither is sent again while a stale
    /// cache still shows the pod running. Dropped once the pod is terminating or gone from the
    /// drain plan.
    accepted: bool,
}

/// Per-pod eviction state across reconciles of every terminating node.
#[derive(Debug, Default)]
pub struct EvictionQueue {
    entries: BTreeMap<PodKey, Entry>,
}

/// The delay after `failures` consecutive refusals: 100 ms, 200 ms, 400 ms, … capped at 10 s.
pub fn backoff_after(failures: u32) -> Duration {
    if failures == 0 {
        return Duration::ZERO;
    }
    let factor = 1u32.checked_shl(failures - 1).unwrap_or(u32::MAX);
    INITIAL_BACKOFF
        .checked_mul(factor)
        .map_or(MAX_BACKOFF, |d| d.min(MAX_BACKOFF))
}

impl EvictionQueue {
    /// Enqueues a pod (no-op when present).
    fn add(&mut self, key: &PodKey, node: &str) {
        self.entries.entry(key.clone()).or_insert_with(|| Entry {
            node: node.into(),
            failures: 0,
            not_before: None,
            blocked: false,
            accepted: false,
        });
    }

    /// Whether an eviction for `key` may be sent at `now` (its backoff elapsed).
    pub fn ready(&self, key: &PodKey, now: Instant) -> bool {
        self.entries
            .get(key)
            .is_some_and(|e| !e.accepted && e.not_before.is_none_or(|t| now >= t))
    }

    /// Decides, for one pod of a drain plan, whether to send an eviction now, and keeps the
    /// queue in step with the plan: forced deletions bypass the queue, terminating pods leave
    /// it, do-not-disrupt pods wait with backoff, later tiers are not enqueued yet.
    pub fn should_evict(
        &mut self,
        key: &PodKey,
        node: &str,
        action: &PodAction,
        now: Instant,
    ) -> bool {
        match action {
            // Deleted already; the cache has not caught up yet.
            PodAction::ForceDelete {
                already_deleting: false,
                ..
            } if self.accepted(key) => false,
            PodAction::ForceDelete { .. } | PodAction::Wait(WaitReason::Terminating) => {
                self.forget(key);
                false
            }
            PodAction::Wait(WaitReason::LaterTier) => false,
            PodAction::Wait(WaitReason::DoNotDisrupt) => {
                self.add(key, node);
                if self.ready(key, now) {
                    self.back_off(key, now);
                }
                false
            }
            PodAction::Evict => {
                self.add(key, node);
                self.ready(key, now)
            }
        }
    }

    /// Whether a forced deletion of the pod should be sent: not when one (or an eviction) was
    /// accepted while the cache still shows the pod running, so a stale cache neither re-sends
    /// it nor counts the pod twice.
    pub fn should_force_delete(&self, key: &PodKey, already_deleting: bool) -> bool {
        already_deleting || !self.accepted(key)
    }

    /// Records a forced deletion the API accepted.
    pub fn force_deleted(&mut self, key: &PodKey, node: &str) {
        self.add(key, node);
        if let Some(entry) = self.entries.get_mut(key) {
            entry.accepted = true;
            entry.blocked = false;
        }
    }

    fn accepted(&self, key: &PodKey) -> bool {
        self.entries.get(key).is_some_and(|e| e.accepted)
    }

    /// Records the eviction API's answer; returns whether the pod stays queued.
    pub fn record(&mut self, key: &PodKey, response: EvictionResponse, now: Instant) -> bool {
        match response {
            EvictionResponse::Evicted => {
                if let Some(entry) = self.entries.get_mut(key) {
                    entry.accepted = true;
                    entry.blocked = false;
                }
                false
            }
            EvictionResponse::Gone => {
                self.forget(key);
                false
            }
            EvictionResponse::Blocked | EvictionResponse::Failed => {
                self.back_off(key, now);
                if let Some(entry) = self.entries.get_mut(key) {
                    entry.blocked = response == EvictionResponse::Blocked;
                }
                self.entries.contains_key(key)
            }
        }
    }

    fn back_off(&mut self, key: &PodKey, now: Instant) {
        if let Some(entry) = self.entries.get_mut(key) {
            entry.failures = entry.failures.saturating_add(1);
            entry.not_before = Some(now + backoff_after(entry.failures));
        }
    }

    pub fn forget(&mut self, key: &PodKey) {
        self.entries.remove(key);
    }

    /// Drops `node`'s entries for pods no longer in its drain plan (evicted, deleted, ...).
    pub fn retain_node(&mut self, node: &str, mut keep: impl FnMut(&PodKey) -> bool) {
        self.entries.retain(|k, e| e.node != node || keep(k));
    }

    /// Drops the entries of every node `keep` rejects: nodes gone from the cluster without a
    /// finished termination here (someone else removed the finalizer) are never released.
    pub fn retain_nodes(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.entries.retain(|_, e| keep(&e.node));
    }

    /// Drops every entry of a node whose termination finished.
    pub fn forget_node(&mut self, node: &str) {
        self.retain_node(node, |_| false);
    }

    /// Pods of `node` whose last eviction a PodDisruptionBudget refused.
    pub fn blocked_on(&self, node: &str) -> Vec<&PodKey> {
        self.entries
            .iter()
            .filter(|(_, e)| e.node == node && e.blocked)
            .map(|(k, _)| k)
            .collect()
    }

    /// How long until the next of `node`'s pods may be evicted again (zero when one is due).
    pub fn next_due(&self, node: &str, now: Instant) -> Option<Duration> {
        self.entries
            .values()
            .filter(|e| e.node == node && !e.accepted)
            .map(|e| {
                e.not_before
                    .map_or(Duration::ZERO, |t| t.saturating_duration_since(now))
            })
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> PodKey {
        PodKey::new("ns", name, Some(&format!("uid-{name}")))
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn backoff_doubles_from_100ms_and_caps_at_10s() {
        let delays: Vec<Duration> = (0..=10).map(backoff_after).collect();
        assert_eq!(
            delays,
            vec![
                ms(0),
                ms(100),
                ms(200),
                ms(400),
                ms(800),
                ms(1600),
                ms(3200),
                ms(6400),
                MAX_BACKOFF,
                MAX_BACKOFF,
                MAX_BACKOFF
            ]
        );
        assert_eq!(backoff_after(u32::MAX), MAX_BACKOFF, "no overflow");
    }

    #[test]
    fn a_pdb_blocked_pod_is_not_re_evicted_before_its_backoff_elapses() {
        let t0 = Instant::now();
        let mut q = EvictionQueue::default();
        let pod = key("web");
        assert!(q.should_evict(&pod, "n1", &PodAction::Evict, t0));
        assert!(q.record(&pod, EvictionResponse::Blocked, t0));
        assert_eq!(q.blocked_on("n1"), vec![&pod]);

        // Node reconciles keep coming; the pod is only due once each backoff has passed.
        let mut at = t0;
        let mut expected = INITIAL_BACKOFF;
        for _ in 0..12 {
            assert!(!q.should_evict(&pod, "n1", &PodAction::Evict, at + expected - ms(1)));
            assert_eq!(q.next_due("n1", at), Some(expected));
            at += expected;
            assert!(q.should_evict(&pod, "n1", &PodAction::Evict, at));
            assert!(q.record(&pod, EvictionResponse::Blocked, at));
            expected = (expected * 2).min(MAX_BACKOFF);
        }
        assert_eq!(q.next_due("n1", at), Some(MAX_BACKOFF));

        // The PDB finally allows it: the entry is done, and not re-sent while the cache
        // still shows the pod running.
        at += MAX_BACKOFF;
        assert!(q.should_evict(&pod, "n1", &PodAction::Evict, at));
        assert!(!q.record(&pod, EvictionResponse::Evicted, at));
        assert!(q.blocked_on("n1").is_empty());
        assert_eq!(q.next_due("n1", at), None);
        assert!(!q.should_evict(&pod, "n1", &PodAction::Evict, at + MAX_BACKOFF));
        assert!(!q.should_evict(&pod, "n1", &PodAction::Wait(WaitReason::Terminating), at));
        assert!(
            q.should_evict(&pod, "n1", &PodAction::Evict, at),
            "the entry is gone: a new incarnation would be evicted at once"
        );
    }

    #[test]
    fn responses_are_classified_like_upstream() {
        use EvictionResponse::*;
        assert_eq!(EvictionResponse::classify(200, ""), Evicted);
        assert_eq!(EvictionResponse::classify(201, ""), Evicted);
        assert_eq!(EvictionResponse::classify(404, "not found"), Gone);
        assert_eq!(EvictionResponse::classify(409, "precondition"), Gone);
        assert_eq!(EvictionResponse::classify(429, "budget"), Blocked);
        assert_eq!(
            EvictionResponse::classify(
                500,
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
            ),
            Blocked
        );
        assert_eq!(EvictionResponse::classify(500, "etcd down"), Failed);
    }

    #[test]
    fn gone_pods_leave_the_queue_and_failures_back_off_without_counting_as_blocked() {
        let t0 = Instant::now();
        let mut q = EvictionQueue::default();
        let (a, b) = (key("a"), key("b"));
        assert!(q.should_evict(&a, "n1", &PodAction::Evict, t0));
        assert!(q.should_evict(&b, "n1", &PodAction::Evict, t0));
        assert!(!q.record(&a, EvictionResponse::Gone, t0));
        assert!(q.record(&b, EvictionResponse::Failed, t0));
        assert!(q.blocked_on("n1").is_empty());
        assert_eq!(q.next_due("n1", t0), Some(ms(100)), "only b is left");
        assert!(!q.ready(&a, t0));
        assert!(!q.ready(&b, t0 + ms(99)));
        assert!(q.ready(&b, t0 + ms(100)));
    }

    #[test]
    fn forced_terminating_and_later_tier_pods_bypass_the_queue() {
        let t0 = Instant::now();
        let mut q = EvictionQueue::default();
        let pod = key("web");
        assert!(q.should_evict(&pod, "n1", &PodAction::Evict, t0));
        q.record(&pod, EvictionResponse::Blocked, t0);
        let forced = PodAction::ForceDelete {
            grace_period_seconds: 1,
            already_deleting: false,
        };
        assert!(!q.should_evict(&pod, "n1", &forced, t0));
        assert_eq!(
            q.next_due("n1", t0),
            None,
            "a forced deletion drops the entry"
        );

        assert!(!q.should_evict(&pod, "n1", &PodAction::Wait(WaitReason::LaterTier), t0));
        assert_eq!(q.next_due("n1", t0), None, "later tiers are not queued yet");

        assert!(q.should_evict(&pod, "n1", &PodAction::Evict, t0));
        assert!(!q.should_evict(&pod, "n1", &PodAction::Wait(WaitReason::Terminating), t0));
        assert_eq!(q.next_due("n1", t0), None, "a terminating pod is dropped");
    }

    #[test]
    fn do_not_disrupt_waits_with_backoff_and_never_evicts() {
        let t0 = Instant::now();
        let mut q = EvictionQueue::default();
        let pod = key("precious");
        let hold = PodAction::Wait(WaitReason::DoNotDisrupt);
        assert!(!q.should_evict(&pod, "n1", &hold, t0));
        assert_eq!(q.next_due("n1", t0), Some(ms(100)));
        // Not due yet: the backoff does not grow with every reconcile.
        assert!(!q.should_evict(&pod, "n1", &hold, t0 + ms(50)));
        assert_eq!(q.next_due("n1", t0), Some(ms(100)));
        assert!(!q.should_evict(&pod, "n1", &hold, t0 + ms(100)));
        assert_eq!(q.next_due("n1", t0 + ms(100)), Some(ms(200)));
        // The annotation is removed: the eviction waits out the current backoff.
        assert!(!q.should_evict(&pod, "n1", &PodAction::Evict, t0 + ms(299)));
        assert!(q.should_evict(&pod, "n1", &PodAction::Evict, t0 + ms(300)));
    }

    #[test]
    fn entries_are_pruned_per_node() {
        let t0 = Instant::now();
        let mut q = EvictionQueue::default();
        let (a, b, c) = (key("a"), key("b"), key("c"));
        q.add(&a, "n1");
        q.add(&b, "n1");
        q.add(&c, "n2");

        q.retain_node("n1", |k| k == &a);
        assert!(q.ready(&a, t0) && !q.ready(&b, t0) && q.ready(&c, t0));
        q.forget_node("n1");
        assert!(!q.ready(&a, t0));
        assert_eq!(q.next_due("n1", t0), None);
        assert!(q.ready(&c, t0), "other nodes' entries stay");
        assert_eq!(q.next_due("n2", t0), Some(Duration::ZERO));
    }

    #[test]
    fn entries_of_vanished_nodes_are_dropped() {
        let t0 = Instant::now();
        let mut q = EvictionQueue::default();
        let (a, b) = (key("a"), key("b"));
        assert!(q.should_evict(&a, "gone", &PodAction::Evict, t0));
        assert!(q.record(&a, EvictionResponse::Blocked, t0));
        assert!(q.should_evict(&b, "kept", &PodAction::Evict, t0));
        assert!(q.record(&b, EvictionResponse::Blocked, t0));
        q.retain_nodes(|node| node == "kept");
        assert_eq!(q.next_due("gone", t0), None);
        assert!(q.blocked_on("gone").is_empty());
        assert_eq!(q.next_due("kept", t0), Some(INITIAL_BACKOFF));
        assert_eq!(q.blocked_on("kept"), vec![&b]);
    }

    #[test]
    fn a_forced_deletion_is_sent_once_while_the_cache_still_shows_the_pod_running() {
        let t0 = Instant::now();
        let mut q = EvictionQueue::default();
        let pod = key("slow");
        let forced = |already_deleting| PodAction::ForceDelete {
            grace_period_seconds: 30,
            already_deleting,
        };
        assert!(!q.should_evict(&pod, "n1", &forced(false), t0));
        assert!(q.should_force_delete(&pod, false));
        q.force_deleted(&pod, "n1");
        // Next pass, stale cache: the pod still looks untouched.
        assert!(!q.should_evict(&pod, "n1", &forced(false), t0));
        assert!(!q.should_force_delete(&pod, false));
        assert!(q.blocked_on("n1").is_empty());
        assert_eq!(q.next_due("n1", t0), None, "nothing to evict");
        // The cache catches up: a deletion running past the deadline may be shortened again.
        assert!(!q.should_evict(&pod, "n1", &forced(true), t0));
        assert!(q.should_force_delete(&pod, true));
        // Once terminating, the entry is dropped.
        assert!(!q.should_evict(&pod, "n1", &PodAction::Wait(WaitReason::Terminating), t0));
        assert!(q.should_force_delete(&pod, false));
    }

    #[test]
    fn an_accepted_eviction_is_not_followed_by_a_forced_deletion_on_a_stale_cache() {
        let t0 = Instant::now();
        let mut q = EvictionQueue::default();
        let pod = key("web");
        assert!(q.should_evict(&pod, "n1", &PodAction::Evict, t0));
        assert!(!q.record(&pod, EvictionResponse::Evicted, t0));
        let forced = PodAction::ForceDelete {
            grace_period_seconds: 5,
            already_deleting: false,
        };
        assert!(!q.should_evict(&pod, "n1", &forced, t0));
        assert!(!q.should_force_delete(&pod, false));
    }

    #[test]
    fn a_recreated_pod_is_a_new_entry() {
        let t0 = Instant::now();
        let mut q = EvictionQueue::default();
        let old = PodKey::new("ns", "web-0", Some("uid-1"));
        let new = PodKey::new("ns", "web-0", Some("uid-2"));
        assert!(q.should_evict(&old, "n1", &PodAction::Evict, t0));
        q.record(&old, EvictionResponse::Blocked, t0);
        assert!(q.should_evict(&new, "n1", &PodAction::Evict, t0));
    }
}
