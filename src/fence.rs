//! Write fencing: whether this replica may mutate anything right now.
//!
//! A replica may write only while it leads, and it leads only until its renew deadline: the
//! instant its last successful Lease renewal started plus the renew deadline. The deadline is
//! checked at call time by every mutating call (the kube client layer, the Exoscale client), so
//! a replica cut off from the API server stops writing at that instant even if nothing else
//! noticed the partition. Another replica can take the Lease only a full lease duration after
//! it last saw the Lease change, which is later than this deadline (`duration > renew_deadline`).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use thiserror::Error;

/// Refusal of a write by a replica that does not (or no longer) lead.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
#[error("refused {what}: this replica does not hold the leader Lease (fenced)")]
pub struct Fenced {
    pub what: String,
}

#[derive(Debug)]
enum State {
    /// Writes always allowed: leader election disabled, or a tool that never competes.
    Open,
    /// Writes allowed until the instant, if any.
    Until(Option<Instant>),
}

/// Shared handle; clones see the same state. The elector extends or closes it.
#[derive(Debug, Clone)]
pub struct Fence {
    state: Arc<Mutex<State>>,
}

impl Fence {
    /// A fence that always allows writes (`DISABLE_LEADER_ELECTION=true`, one-shot tools).
    pub fn open() -> Self {
        Fence {
            state: Arc::new(Mutex::new(State::Open)),
        }
    }

    /// A fence that allows nothing until an elector extends it.
    pub fn closed() -> Self {
        Fence {
            state: Arc::new(Mutex::new(State::Until(None))),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a write may be sent at `now`.
    pub fn allows_at(&self, now: Instant) -> bool {
        match *self.lock() {
            State::Open => true,
            State::Until(deadline) => deadline.is_some_and(|d| now < d),
        }
    }

    /// Whether a write may be sent now.
    pub fn allows(&self) -> bool {
        self.allows_at(Instant::now())
    }

    /// `Ok` when a write described by `what` may be sent now.
    pub fn check(&self, what: impl FnOnce() -> String) -> Result<(), Fenced> {
        if self.allows() {
            Ok(())
        } else {
            Err(Fenced { what: what() })
        }
    }

    /// The instant writes stop being allowed (`None`: closed, or open forever).
    pub fn deadline(&self) -> Option<Instant> {
        match *self.lock() {
            State::Open => None,
            State::Until(deadline) => deadline,
        }
    }

    /// How long from now a write may still run: until the deadline, none when closed (`None`:
    /// open forever). A write must be answered within this, or be given up with an unknown
    /// outcome.
    pub fn time_left(&self) -> Option<std::time::Duration> {
        match *self.lock() {
            State::Open => None,
            State::Until(deadline) => Some(deadline.map_or(std::time::Duration::ZERO, |d| {
                d.saturating_duration_since(Instant::now())
            })),
        }
    }

    /// Allows writes until `deadline` (a successful renewal). Never moves the deadline back.
    pub fn extend_until(&self, deadline: Instant) {
        let mut state = self.lock();
        if let State::Until(current) = &mut *state {
            *current = Some(current.map_or(deadline, |c| c.max(deadline)));
        }
    }

    /// Stops allowing writes at once (the Lease is someone else's, or released).
    pub fn close(&self) {
        let mut state = self.lock();
        if let State::Until(current) = &mut *state {
            *current = None;
        }
    }

    /// Allows every write from now on (leader election turned off after the clients were built).
    pub fn open_forever(&self) {
        *self.lock() = State::Open;
    }

    pub fn is_open_forever(&self) -> bool {
        matches!(*self.lock(), State::Open)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_closed_fence_allows_writes_only_before_the_deadline() {
        let fence = Fence::closed();
        let t0 = Instant::now();
        assert!(!fence.allows_at(t0));
        fence.extend_until(t0 + Duration::from_secs(10));
        assert!(fence.allows_at(t0 + Duration::from_secs(9)));
        assert!(!fence.allows_at(t0 + Duration::from_secs(10)));
        // An older renewal answering late never shortens the deadline.
        fence.extend_until(t0 + Duration::from_secs(5));
        assert!(fence.allows_at(t0 + Duration::from_secs(9)));
        let clone = fence.clone();
        fence.close();
        assert!(!clone.allows_at(t0));
        assert_eq!(
            clone.check(|| "DELETE /instance/x".into()),
            Err(Fenced {
                what: "DELETE /instance/x".into()
            })
        );
    }

    #[test]
    fn an_open_fence_always_allows() {
        let fence = Fence::open();
        fence.close();
        assert!(fence.allows());
        assert!(fence.check(|| unreachable!()).is_ok());
        assert!(fence.is_open_forever());
    }
}
