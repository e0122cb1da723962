//! The one clock type: every time-dependent decision (signatures, expiry, TTLs, disruption)
//! reads the time through [`Clock`] so that tests inject it.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

/// A source of the current UNIX time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now_unix(&self) -> i64;
}

/// The real clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_unix(&self) -> i64 {
        chrono::Utc::now().timestamp()
    }
}

/// A clock that moves only when told; clones share the instant.
#[derive(Debug, Clone, Default)]
pub struct FixedClock(Arc<AtomicI64>);

impl FixedClock {
    pub fn at(unix: i64) -> Self {
        FixedClock(Arc::new(AtomicI64::new(unix)))
    }

    pub fn set(&self, unix: i64) {
        self.0.store(unix, Ordering::SeqCst);
    }

    pub fn advance(&self, by: Duration) {
        let secs = i64::try_from(by.as_secs()).unwrap_or(i64::MAX);
        self.0.fetch_add(secs, Ordering::SeqCst);
    }
}

impl Clock for FixedClock {
    fn now_unix(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fixed_clock_moves_only_when_told_and_clones_move_together() {
        let clock = FixedClock::at(100);
        let other = clock.clone();
        assert_eq!(clock.now_unix(), 100);
        clock.advance(Duration::from_secs(5));
        assert_eq!(other.now_unix(), 105);
        other.set(7);
        assert_eq!(clock.now_unix(), 7);
        assert!(SystemClock.now_unix() > 1_700_000_000);
    }
}
