//! The one clock type: every time-dependent decision (signatures, expiry, TTLs, disruption)
//! reads the time through [`Clock`] so that tests inject it.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// A source of the current UNIX time, and of a monotonic time for waits that a wall-clock
/// jump must not shorten.
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now_unix(&self) -> i64;
    /// Time since an arbitrary origin fixed for the process; never goes back, and does not
    /// follow the wall clock when it is set.
    fn monotonic(&self) -> Duration;
}

/// The real clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_unix(&self) -> i64 {
        chrono::Utc::now().timestamp()
    }

    fn monotonic(&self) -> Duration {
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        ORIGIN.get_or_init(Instant::now).elapsed()
    }
}

/// A clock that moves only when told; clones share the instant. `advance` moves both times;
/// `set` moves only the wall clock, as an operator or NTP setting it would.
#[derive(Debug, Clone, Default)]
pub struct FixedClock {
    unix: Arc<AtomicI64>,
    monotonic_secs: Arc<AtomicU64>,
}

impl FixedClock {
    pub fn at(unix: i64) -> Self {
        FixedClock {
            unix: Arc::new(AtomicI64::new(unix)),
            monotonic_secs: Arc::default(),
        }
    }

    pub fn set(&self, unix: i64) {
        self.unix.store(unix, Ordering::SeqCst);
    }

    pub fn advance(&self, by: Duration) {
        let secs = i64::try_from(by.as_secs()).unwrap_or(i64::MAX);
        self.unix.fetch_add(secs, Ordering::SeqCst);
        self.monotonic_secs
            .fetch_add(by.as_secs(), Ordering::SeqCst);
    }
}

impl Clock for FixedClock {
    fn now_unix(&self) -> i64 {
        self.unix.load(Ordering::SeqCst)
    }

    fn monotonic(&self) -> Duration {
        Duration::from_secs(self.monotonic_secs.load(Ordering::SeqCst))
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
        // Setting the wall clock does not move the monotonic time; advancing does.
        assert_eq!(clock.monotonic(), Duration::from_secs(5));
        assert!(SystemClock.now_unix() > 1_700_000_000);
        let before = SystemClock.monotonic();
        assert!(SystemClock.monotonic() >= before);
    }
}
