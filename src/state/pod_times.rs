//! When provisioning first saw each pod it was asked to place, when it first decided about it,
//! and since when it thinks the pod can schedule (upstream keeps the same in its cluster state:
//! pod acks and scheduling decisions). The pod metrics read it: `karpenter_pods_provisioning_*`,
//! `karpenter_pods_scheduling_decision_duration_seconds`. Keyed by `namespace/name`, as upstream.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

/// Instants (UNIX seconds) known for one pod.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PodTimes {
    /// First seen by a provisioning round.
    pub acked: Option<i64>,
    /// First placed or found unschedulable.
    pub decided: Option<i64>,
    /// Since when provisioning has placed it (reset when a round cannot place it).
    pub schedulable: Option<i64>,
    /// Its binding / readiness has been timed already.
    pub bound_reported: bool,
    pub started_reported: bool,
}

#[derive(Debug, Default)]
pub struct PodTimeline {
    pods: Mutex<HashMap<String, PodTimes>>,
}

impl PodTimeline {
    fn with<T>(&self, f: impl FnOnce(&mut HashMap<String, PodTimes>) -> T) -> T {
        f(&mut self.pods.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The pods a round starts with; an earlier acknowledgement is kept.
    pub fn ack<'a>(&self, keys: impl IntoIterator<Item = &'a str>, now: i64) {
        self.with(|pods| {
            for key in keys {
                pods.entry(key.to_string())
                    .or_default()
                    .acked
                    .get_or_insert(now);
            }
        })
    }

    /// Records a round's verdict on a pod. Returns the seconds from acknowledgement to this
    /// decision the first time one is made (`karpenter_pods_scheduling_decision_duration_seconds`).
    pub fn decide(&self, key: &str, placed: bool, now: i64) -> Option<f64> {
        self.with(|pods| {
            let times = pods.entry(key.to_string()).or_default();
            if placed {
                times.schedulable.get_or_insert(now);
            } else {
                times.schedulable = None;
            }
            if times.decided.is_some() {
                return None;
            }
            times.decided = Some(now);
            times.acked.map(|acked| (now - acked).max(0) as f64)
        })
    }

    /// The placement instant of a pod provisioning placed, the first time its binding (`bound`)
    /// or readiness (`!bound`) is reported; `None` afterwards or for pods it never placed.
    pub fn report(&self, key: &str, bound: bool) -> Option<i64> {
        self.with(|pods| {
            let times = pods.get_mut(key)?;
            let placed = times.schedulable?;
            let reported = if bound {
                &mut times.bound_reported
            } else {
                &mut times.started_reported
            };
            (!std::mem::replace(reported, true)).then_some(placed)
        })
    }

    pub fn get(&self, key: &str) -> Option<PodTimes> {
        self.with(|pods| pods.get(key).copied())
    }

    /// Forgets pods that no longer exist.
    pub fn retain(&self, present: &HashSet<String>) {
        self.with(|pods| pods.retain(|k, _| present.contains(k)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_decision_is_timed_from_the_first_acknowledgement() {
        let t = PodTimeline::default();
        t.ack(["ns/a", "ns/b"], 100);
        t.ack(["ns/a"], 105);
        assert_eq!(t.decide("ns/a", false, 103), Some(3.0));
        assert_eq!(t.get("ns/a").unwrap().schedulable, None);
        // Later decisions are not timed again; placement starts the schedulable clock once.
        assert_eq!(t.decide("ns/a", true, 110), None);
        assert_eq!(t.decide("ns/a", true, 120), None);
        assert_eq!(t.get("ns/a").unwrap().schedulable, Some(110));
        // A round that cannot place it any more resets it.
        t.decide("ns/a", false, 130);
        assert_eq!(t.get("ns/a").unwrap().schedulable, None);
        t.decide("ns/a", true, 140);
        assert_eq!(t.report("ns/a", true), Some(140));
        assert_eq!(t.report("ns/a", true), None, "reported once");
        assert_eq!(t.report("ns/a", false), Some(140));
        assert_eq!(t.report("ns/b", true), None, "never placed");
        t.retain(&HashSet::from(["ns/b".to_string()]));
        assert!(t.get("ns/a").is_none());
        assert_eq!(t.get("ns/b").unwrap().acked, Some(100));
    }
}
