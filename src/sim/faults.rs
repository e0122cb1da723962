//! Programmable fault injection: each fault matches an API operation (or any) and fires on
//! the Nth matching call, for a number of calls.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::sync::watch;

/// Where held requests wait until the test releases them (crash tests park a controller at a
/// named step this way, then kill it). Clones share one gate.
#[derive(Clone, Debug)]
pub struct HoldGate {
    inner: Arc<GateInner>,
}

#[derive(Debug)]
struct GateInner {
    held: AtomicU32,
    released: watch::Sender<bool>,
}

impl Default for HoldGate {
    fn default() -> Self {
        HoldGate {
            inner: Arc::new(GateInner {
                held: AtomicU32::new(0),
                released: watch::channel(false).0,
            }),
        }
    }
}

impl PartialEq for HoldGate {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl HoldGate {
    pub fn new() -> Self {
        HoldGate::default()
    }

    /// How many requests have been parked so far.
    pub fn held(&self) -> u32 {
        self.inner.held.load(Ordering::SeqCst)
    }

    /// Lets every parked and later request through.
    pub fn release(&self) {
        self.inner.released.send_replace(true);
    }

    pub(crate) async fn park(&self) {
        let mut released = self.inner.released.subscribe();
        if *released.borrow() {
            return;
        }
        self.inner.held.fetch_add(1, Ordering::SeqCst);
        let _ = released.wait_for(|r| *r).await;
    }
}

/// What the sim does instead of (or before) answering normally.
#[derive(Debug, Clone, PartialEq)]
pub enum FaultAction {
    /// Answer with this status and raw body.
    Status { status: u16, body: String },
    /// 429 with `Retry-After: <secs>` and the `rate-limited` body shape.
    RateLimited { retry_after_secs: u64 },
    /// Wait this long, then answer normally.
    Latency(Duration),
    /// 403 with a quota message, without acting.
    QuotaExceeded,
    /// Act normally, then drop the response (headers sent, body broken), as a proxy that lost
    /// the answer would.
    LoseResponse,
    /// Drop the response at once (as `LoseResponse`) and commit the request only after this
    /// delay, as a backend that finishes a create after the client gave up: a lookup made
    /// right away does not find it yet.
    LoseResponseCommitLater(Duration),
    /// Park the request at the gate until it is released: before acting (nothing happens
    /// while parked) or after acting (the change is made, the answer withheld). With
    /// `only_status`, only requests whose answer has that status are held (e.g. the 404 that
    /// tells a controller an instance is gone).
    Hold {
        after_commit: bool,
        only_status: Option<u16>,
        gate: HoldGate,
    },
    /// Act normally, then answer this status and raw body instead: a gateway that gave up
    /// on a backend which went on to finish the request.
    CommitThenStatus { status: u16, body: String },
    /// Accept a mutation, then let its operation end in `failure` with this reason
    /// (one of the API's: busy, conflict, fault, forbidden, unavailable, …) and message.
    FailOperation { reason: String, message: String },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    /// API operation id such as `create-instance`; `None` matches every call.
    pub operation: Option<String>,
    /// Fire from the Nth matching call (1-based) after injection.
    pub nth: u32,
    /// How many consecutive matching calls it affects.
    pub times: u32,
    pub action: FaultAction,
}

impl Fault {
    /// A fault on the next call of `operation`.
    pub fn on(operation: &str, action: FaultAction) -> Fault {
        Fault {
            operation: Some(operation.to_string()),
            nth: 1,
            times: 1,
            action,
        }
    }

    /// A fault on the next call of any operation.
    pub fn any(action: FaultAction) -> Fault {
        Fault {
            operation: None,
            nth: 1,
            times: 1,
            action,
        }
    }

    pub fn nth(mut self, n: u32) -> Fault {
        self.nth = n.max(1);
        self
    }

    pub fn times(mut self, n: u32) -> Fault {
        self.times = n;
        self
    }

    pub fn always(self) -> Fault {
        self.times(u32::MAX)
    }

    /// Shorthand for an error status with the classic `{"message": ...}` body.
    pub fn status(operation: &str, status: u16, message: &str) -> Fault {
        Fault::on(
            operation,
            FaultAction::Status {
                status,
                body: serde_json::json!({ "message": message }).to_string(),
            },
        )
    }
}

/// A fault plus its counters.
#[derive(Debug, Clone)]
pub(crate) struct FaultSlot {
    pub fault: Fault,
    pub matched: u32,
    pub fired: u32,
}

impl FaultSlot {
    pub fn new(fault: Fault) -> Self {
        FaultSlot {
            fault,
            matched: 0,
            fired: 0,
        }
    }

    fn is_spent(&self) -> bool {
        self.fired >= self.fault.times
    }
}

/// Counts the call against every matching fault and returns the action of the first that fires.
pub(crate) fn next_action(slots: &mut Vec<FaultSlot>, operation: &str) -> Option<FaultAction> {
    let mut action = None;
    for slot in slots.iter_mut() {
        if slot.is_spent()
            || slot
                .fault
                .operation
                .as_deref()
                .is_some_and(|op| op != operation)
        {
            continue;
        }
        slot.matched += 1;
        if action.is_none() && slot.matched >= slot.fault.nth {
            slot.fired += 1;
            action = Some(slot.fault.action.clone());
        }
    }
    slots.retain(|s| !s.is_spent());
    action
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fires_on_the_nth_matching_call_only() {
        let mut slots = vec![FaultSlot::new(
            Fault::status("get-instance", 500, "boom").nth(2).times(2),
        )];
        assert_eq!(next_action(&mut slots, "list-zones"), None);
        assert_eq!(next_action(&mut slots, "get-instance"), None);
        assert!(next_action(&mut slots, "get-instance").is_some());
        assert!(next_action(&mut slots, "get-instance").is_some());
        assert_eq!(next_action(&mut slots, "get-instance"), None);
        assert!(slots.is_empty());
    }

    #[test]
    fn any_matches_everything() {
        let mut slots = vec![FaultSlot::new(
            Fault::any(FaultAction::QuotaExceeded).always(),
        )];
        for op in ["a", "b", "c"] {
            assert_eq!(
                next_action(&mut slots, op),
                Some(FaultAction::QuotaExceeded)
            );
        }
    }
}
