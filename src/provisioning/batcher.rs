//! Batching of provisioning triggers: after the first trigger, a window closes once no new
//! trigger arrived for `idle` or `max` elapsed since it opened. Pure, with the time passed in,
//! so the controller's loop and the tests share it.
//!
//! A window that closes while provisioning must wait (state not synced, a launch still waiting
//! for its providerID) is deferred, not dropped: its round runs as soon as the wait is over.
//! Otherwise its pods, already triggered, would wait for their 10-s requeue; at 1 000 nodes
//! that idled ten seconds between every two rounds. The owed round does not wait another idle
//! time either: its batch already closed, and at 1 000 nodes that second wait added about 1 s
//! to each of the dozen rounds after kube-scheduler's last mark (BENCHMARKS, thirty-sixth
//! session). Pods that arrived during the wait keep their own window's idle time, which the
//! owed round joins: closing it at once would split a burst that is still arriving.

use std::collections::HashSet;
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct Batcher {
    idle: Duration,
    max: Duration,
    window: Option<Window>,
    /// A window closed but was not provisioned; owed a round once provisioning may run.
    deferred: bool,
}

/// The trigger a deferred round reopens its window with (not a pod UID, which is a UUID).
const DEFERRED_ROUND: &str = "deferred round";

#[derive(Debug)]
struct Window {
    opened: Instant,
    last_trigger: Instant,
    seen: HashSet<String>,
    /// Opened by a round owed since an earlier window closed, with nothing else pending:
    /// closes at once.
    owed: bool,
}

impl Batcher {
    pub fn new(idle: Duration, max: Duration) -> Self {
        Batcher {
            idle,
            max,
            window: None,
            deferred: false,
        }
    }

    /// Records a trigger (a pod UID, or a node name). A UID already in the window is ignored so a
    /// pod requeued every few seconds does not keep the window open forever.
    pub fn trigger(&mut self, uid: &str, now: Instant) {
        let window = self.window.get_or_insert_with(|| Window {
            opened: now,
            last_trigger: now,
            seen: HashSet::new(),
            owed: false,
        });
        if window.seen.insert(uid.to_string()) {
            window.last_trigger = now;
        }
    }

    /// Asks for a round without holding back one already asked for: opens a window if none
    /// is open (it closes after the idle time), and leaves an open window's deadline alone.
    /// For signals that come in streams (pods bound to new nodes), which as triggers would
    /// keep a window open until its maximum.
    pub fn nudge(&mut self, why: &str, now: Instant) {
        if self.window.is_none() {
            self.trigger(why, now);
        }
    }

    /// When the current window closes, if one is open.
    pub fn deadline(&self) -> Option<Instant> {
        self.window.as_ref().map(|w| {
            if w.owed {
                w.opened
            } else {
                (w.last_trigger + self.idle).min(w.opened + self.max)
            }
        })
    }

    /// Closes the window if its deadline has passed; returns how many distinct triggers it held.
    pub fn take_if_ready(&mut self, now: Instant) -> Option<usize> {
        let deadline = self.deadline()?;
        if now < deadline {
            return None;
        }
        self.window.take().map(|w| w.seen.len())
    }

    pub fn is_open(&self) -> bool {
        self.window.is_some()
    }

    /// Records that the window just taken could not be provisioned.
    pub fn defer(&mut self) {
        self.deferred = true;
    }

    /// Makes a deferred round due when provisioning may run (`ready`, asked only while a round
    /// is owed); true if it did. With nothing else pending it is due at once. Pods that arrived
    /// during the wait opened a window of their own: the owed round joins it without extending
    /// it, so the window still closes one idle time after its last pod (a burst stays whole).
    pub fn resume(&mut self, ready: impl FnOnce() -> bool, now: Instant) -> bool {
        if !self.deferred || !ready() {
            return false;
        }
        self.deferred = false;
        match self.window.as_mut() {
            Some(window) => {
                window.seen.insert(DEFERRED_ROUND.to_string());
            }
            None => {
                self.trigger(DEFERRED_ROUND, now);
                if let Some(window) = self.window.as_mut() {
                    window.owed = true;
                }
            }
        }
        true
    }
}

/// The NodePools last seen Ready. One that became Ready (a new NodePool gets its first status
/// a moment after its creation) may place pods a round just left pending: the controller then
/// asks for a round rather than wait for the pods' requeue. Runs on every cluster change, so
/// it allocates only when the set changed.
#[derive(Debug, Default)]
pub struct ReadyPools(HashSet<String>);

impl ReadyPools {
    /// Records which of `pools` are Ready; true when one was not Ready at the last look.
    pub fn newly_ready<'a>(
        &mut self,
        pools: impl Iterator<Item = &'a crate::apis::NodePool> + Clone,
    ) -> bool {
        use kube::ResourceExt;
        let ready = pools.filter(|p| p.is_ready());
        let mut count = 0;
        let mut newly = false;
        for pool in ready.clone() {
            count += 1;
            newly |= !self
                .0
                .contains(pool.metadata.name.as_deref().unwrap_or_default());
        }
        if newly || count != self.0.len() {
            self.0 = ready.map(|p| p.name_any()).collect();
        }
        newly
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IDLE: Duration = Duration::from_secs(1);
    const MAX: Duration = Duration::from_secs(10);

    #[test]
    fn window_closes_after_idle_time() {
        let t0 = Instant::now();
        let mut b = Batcher::new(IDLE, MAX);
        assert!(b.take_if_ready(t0).is_none(), "no window without a trigger");
        b.trigger("a", t0);
        b.trigger("b", t0 + Duration::from_millis(500));
        assert!(
            b.take_if_ready(t0 + Duration::from_millis(1400)).is_none(),
            "idle timer reset by b"
        );
        assert_eq!(b.take_if_ready(t0 + Duration::from_millis(1500)), Some(2));
        assert!(!b.is_open());
    }

    #[test]
    fn window_closes_at_max_even_with_steady_triggers() {
        let t0 = Instant::now();
        let mut b = Batcher::new(IDLE, MAX);
        for i in 0..34u64 {
            let now = t0 + Duration::from_millis(i * 300);
            b.trigger(&format!("pod-{i}"), now);
            assert!(b.take_if_ready(now).is_none(), "still open at {i}");
        }
        assert_eq!(
            b.deadline(),
            Some(t0 + MAX),
            "max bounds the window, not the idle timer"
        );
        assert_eq!(b.take_if_ready(t0 + MAX), Some(34));
    }

    #[test]
    fn a_deferred_window_reopens_once_provisioning_may_run() {
        let t0 = Instant::now();
        let mut b = Batcher::new(IDLE, MAX);
        b.trigger("a", t0);
        assert_eq!(b.take_if_ready(t0 + IDLE), Some(1));
        assert!(
            !b.resume(|| true, t0 + IDLE),
            "nothing owed before a deferral"
        );
        b.defer();
        let later = t0 + Duration::from_secs(3);
        assert!(!b.resume(|| false, later), "still waiting: no window");
        assert!(!b.is_open());
        assert!(b.resume(|| true, later), "the wait is over");
        assert_eq!(
            b.take_if_ready(later),
            Some(1),
            "the owed round does not wait another idle time"
        );
        assert!(
            !b.resume(|| true, later + Duration::from_secs(2)),
            "a deferral is owed one round"
        );
    }

    #[test]
    fn pods_that_arrive_during_a_deferral_join_the_owed_round() {
        let t0 = Instant::now();
        let mut b = Batcher::new(IDLE, MAX);
        b.trigger("a", t0);
        assert_eq!(b.take_if_ready(t0 + IDLE), Some(1));
        b.defer();
        let arrival = t0 + Duration::from_secs(2);
        b.trigger("b", arrival);
        let over = arrival + Duration::from_millis(300);
        assert!(b.resume(|| true, over));
        assert!(
            b.take_if_ready(over).is_none(),
            "b's window keeps its idle time: more of its burst may follow"
        );
        b.trigger("c", over + Duration::from_millis(500));
        assert_eq!(
            b.deadline(),
            Some(over + Duration::from_millis(500) + IDLE),
            "the owed round does not extend the window; its pods do"
        );
        assert_eq!(
            b.take_if_ready(over + Duration::from_millis(500) + IDLE),
            Some(3),
            "one round for the owed one and the whole burst"
        );
        b.trigger("d", over + Duration::from_secs(3));
        assert_eq!(
            b.deadline(),
            Some(over + Duration::from_secs(3) + IDLE),
            "the next window is an ordinary one"
        );
    }

    #[test]
    fn a_nudge_opens_a_window_but_never_extends_one() {
        let t0 = Instant::now();
        let mut b = Batcher::new(IDLE, MAX);
        b.nudge("displaced", t0);
        assert_eq!(b.deadline(), Some(t0 + IDLE), "opened like a trigger");
        b.nudge("displaced again", t0 + Duration::from_millis(900));
        assert_eq!(b.deadline(), Some(t0 + IDLE), "not held back");
        assert_eq!(b.take_if_ready(t0 + IDLE), Some(1));
        b.trigger("pod", t0 + IDLE);
        b.nudge("displaced", t0 + IDLE + Duration::from_millis(500));
        assert_eq!(
            b.deadline(),
            Some(t0 + IDLE + IDLE),
            "a pod's window keeps its own deadline"
        );
    }

    #[test]
    fn repeated_uid_does_not_extend_the_window() {
        let t0 = Instant::now();
        let mut b = Batcher::new(IDLE, MAX);
        b.trigger("a", t0);
        b.trigger("a", t0 + Duration::from_millis(900));
        assert_eq!(b.take_if_ready(t0 + IDLE), Some(1));
    }

    #[test]
    fn a_nodepool_that_becomes_ready_is_noticed_once() {
        use crate::apis::{ConditionStatus, NodePool};
        let pool = |name: &str, status: Option<ConditionStatus>| {
            let mut p: NodePool = serde_json::from_value(serde_json::json!({
                "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name},
                "spec": {"template": {"spec": {"requirements": [],
                    "nodeClassRef": {"group": "g", "kind": "K", "name": "n"}}}}
            }))
            .unwrap();
            if let Some(status) = status {
                p.set_ready_condition(status, "R", "");
            }
            p
        };
        let (t, u) = (Some(ConditionStatus::True), Some(ConditionStatus::Unknown));
        let mut seen = ReadyPools::default();
        assert!(!seen.newly_ready([pool("a", None)].iter()), "no status yet");
        assert!(!seen.newly_ready([pool("a", u)].iter()));
        assert!(seen.newly_ready([pool("a", t)].iter()), "became Ready");
        assert!(!seen.newly_ready([pool("a", t)].iter()), "already Ready");
        assert!(seen.newly_ready([pool("a", t), pool("b", t)].iter()));
        // Not Ready for a while, then Ready again: noticed again.
        assert!(!seen.newly_ready([pool("a", u), pool("b", t)].iter()));
        assert!(seen.newly_ready([pool("a", t), pool("b", t)].iter()));
    }
}
