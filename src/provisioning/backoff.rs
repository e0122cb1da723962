//! Runaway guard: a pod that stays pending although a node launched for it has registered
//! (e.g. the node came up with a taint the pod does not tolerate and its NodePool did not ask
//! for) gets no further node at once. Each further launch for it waits twice as long as the
//! last (1 min, 2 min, 4 min … 10 min); otherwise every round would launch yet another node
//! that the pod cannot use. Pure: time is passed in.

use std::collections::HashMap;
use std::time::{Duration, Instant};

const FIRST_WAIT: Duration = Duration::from_secs(60);
const MAX_WAIT: Duration = Duration::from_secs(600);
/// Pods not seen for this long are forgotten.
const FORGET_AFTER: Duration = Duration::from_secs(3600);

#[derive(Debug, Clone)]
struct Launches {
    /// The NodeClaim launched for the pod most recently.
    last_claim: String,
    /// NodeClaims launched for the pod since it was first seen pending.
    count: u32,
    last_at: Instant,
    seen_at: Instant,
    /// Set once the last claim's node registered and the pod still stayed pending.
    blocked_until: Option<Instant>,
}

/// Per pending pod (by UID): the NodeClaims launched for it and its backoff.
#[derive(Debug, Default)]
pub struct LaunchBackoff {
    pods: HashMap<String, Launches>,
}

/// A pod left out of a round, with what to tell its owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    pub until: Instant,
    pub wait: Duration,
    /// Whether this is news (the backoff just began), worth an event.
    pub began: bool,
}

impl LaunchBackoff {
    /// Records that `claim` was launched for pod `uid`.
    pub fn launched(&mut self, uid: &str, claim: &str, now: Instant) {
        let entry = self.pods.entry(uid.to_string()).or_insert(Launches {
            last_claim: String::new(),
            count: 0,
            last_at: now,
            seen_at: now,
            blocked_until: None,
        });
        entry.last_claim = claim.to_string();
        entry.count += 1;
        entry.last_at = now;
        entry.seen_at = now;
        entry.blocked_until = None;
    }

    /// The NodeClaim launched last for `uid`, if any.
    pub fn last_claim(&self, uid: &str) -> Option<&str> {
        self.pods.get(uid).map(|l| l.last_claim.as_str())
    }

    /// Whether pod `uid` sits out this round. `registered` tells whether the node of its last
    /// NodeClaim has registered (while a launched node is still coming, the pod waits for it
    /// anyway and no backoff starts).
    pub fn check(&mut self, uid: &str, registered: bool, now: Instant) -> Option<Blocked> {
        let entry = self.pods.get_mut(uid)?;
        entry.seen_at = now;
        if let Some(until) = entry.blocked_until {
            return (now < until).then(|| Blocked {
                until,
                wait: until.saturating_duration_since(entry.last_at),
                began: false,
            });
        }
        if !registered {
            return None;
        }
        let doublings = entry.count.saturating_sub(1).min(10);
        let wait = FIRST_WAIT.saturating_mul(1 << doublings).min(MAX_WAIT);
        let until = entry.last_at + wait;
        entry.blocked_until = Some(until);
        (now < until).then_some(Blocked {
            until,
            wait,
            began: true,
        })
    }

    /// Forgets pods that are no longer pending (bound, gone) or not seen for an hour.
    pub fn retain_pending(&mut self, pending: &dyn Fn(&str) -> bool, now: Instant) {
        self.pods.retain(|uid, l| {
            pending(uid) && now.saturating_duration_since(l.seen_at) < FORGET_AFTER
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_secs(60);

    #[test]
    fn a_pod_waits_for_its_launched_node_without_backoff() {
        let mut b = LaunchBackoff::default();
        let t0 = Instant::now();
        assert_eq!(b.check("p", false, t0), None, "never launched for");
        b.launched("p", "c1", t0);
        assert_eq!(b.last_claim("p"), Some("c1"));
        assert_eq!(
            b.check("p", false, t0 + MIN * 5),
            None,
            "node not registered yet"
        );
    }

    #[test]
    fn launches_for_a_pod_its_nodes_cannot_take_back_off_exponentially() {
        let mut b = LaunchBackoff::default();
        let t0 = Instant::now();
        b.launched("p", "c1", t0);
        let blocked = b.check("p", true, t0 + Duration::from_secs(5)).unwrap();
        assert!(blocked.began);
        assert_eq!(blocked.wait, MIN);
        let again = b.check("p", true, t0 + Duration::from_secs(30)).unwrap();
        assert!(!again.began, "one event per backoff");
        assert_eq!(b.check("p", true, t0 + MIN), None, "the wait is over");
        b.launched("p", "c2", t0 + MIN);
        let blocked = b.check("p", true, t0 + MIN * 2).unwrap();
        assert_eq!(blocked.wait, MIN * 2);
        b.launched("p", "c3", t0 + MIN * 3);
        b.launched("p", "c4", t0 + MIN * 3);
        b.launched("p", "c5", t0 + MIN * 3);
        b.launched("p", "c6", t0 + MIN * 3);
        b.launched("p", "c7", t0 + MIN * 3);
        let blocked = b.check("p", true, t0 + MIN * 3).unwrap();
        assert_eq!(blocked.wait, MAX_WAIT, "capped");
    }

    #[test]
    fn pods_no_longer_pending_are_forgotten() {
        let mut b = LaunchBackoff::default();
        let t0 = Instant::now();
        b.launched("bound", "c1", t0);
        b.launched("pending", "c2", t0);
        b.retain_pending(&|uid| uid == "pending", t0);
        assert_eq!(b.last_claim("bound"), None);
        assert_eq!(b.last_claim("pending"), Some("c2"));
        b.retain_pending(&|_| true, t0 + FORGET_AFTER);
        assert_eq!(b.last_claim("pending"), None);
    }
}
