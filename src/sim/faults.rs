//! Programmable fault injection: each fault matches an API operation (or any) and fires on
//! the Nth matching call, for a number of calls.

use std::time::Duration;

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
