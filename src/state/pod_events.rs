//! When pods last came to or left each node, recorded as the watch delivers them, the way
//! upstream's pod-events controller stamps `lastPodEventTime` as it happens. Stamping from a
//! periodic diff instead lagged by up to a pass: disruption then chose nodes emptied seconds
//! before, which the next stamp made ineligible, and its 15 s validation abandoned the command.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::clock::{Clock, SystemClock};

use super::held_pod::HeldPod;
use super::pods::{is_daemonset_pod, is_terminal};

/// The node a pod counts on for pod events: bound, not terminating and not finished, and not a
/// DaemonSet's. So the start of its termination (or its end) is the event, not its removal
/// seconds later.
pub fn counted_on(pod: &HeldPod) -> Option<&str> {
    if pod.metadata.deletion_timestamp.is_some() || is_terminal(pod) || is_daemonset_pod(pod) {
        return None;
    }
    pod.spec.as_ref()?.node_name.as_deref()
}

/// The last pod event of each node, in UNIX seconds from the injected clock.
#[derive(Debug)]
pub struct PodEventMarks {
    clock: Arc<dyn Clock>,
    at: HashMap<String, i64>,
}

impl Default for PodEventMarks {
    fn default() -> Self {
        PodEventMarks {
            clock: Arc::new(SystemClock),
            at: HashMap::new(),
        }
    }
}

impl PodEventMarks {
    pub fn set_clock(&mut self, clock: Arc<dyn Clock>) {
        self.clock = clock;
    }

    /// A pod counted on `before` now counts on `after`: each side that changed had an event.
    pub fn moved(&mut self, before: Option<&str>, after: Option<&str>) {
        if before == after {
            return;
        }
        let now = self.clock.now_unix();
        for node in [before, after].into_iter().flatten() {
            self.at.insert(node.to_string(), now);
        }
    }

    pub fn last(&self, node: &str) -> Option<DateTime<Utc>> {
        self.at
            .get(node)
            .and_then(|&secs| DateTime::from_timestamp(secs, 0))
    }

    pub fn forget(&mut self, node: &str) {
        self.at.remove(node);
    }

    pub fn retain(&mut self, mut live: impl FnMut(&str) -> bool) {
        self.at.retain(|node, _| live(node));
    }
}
