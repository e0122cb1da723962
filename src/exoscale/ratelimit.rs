//! Client-side token bucket, so a burst of launches cannot get the account throttled.

use std::time::{Duration, Instant};

use std::sync::Mutex;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// Sustained requests per second.
    pub per_second: f64,
    /// Requests allowed at once after an idle period.
    pub burst: u32,
}

impl Default for RateLimit {
    fn default() -> Self {
        RateLimit {
            per_second: 10.0,
            burst: 20,
        }
    }
}

/// Pure token bucket over explicit instants.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    limit: RateLimit,
    tokens: f64,
    updated: Instant,
}

impl TokenBucket {
    pub fn new(limit: RateLimit, now: Instant) -> Self {
        TokenBucket {
            limit,
            tokens: f64::from(limit.burst.max(1)),
            updated: now,
        }
    }

    /// Reserves the next token and says how long to wait for it: zero while the burst lasts,
    /// then one interval more for each reservation ahead. The balance goes negative by the
    /// reservations waiting, so callers are served in the order they asked, each after one
    /// sleep (a sleep-and-retry loop wakes every waiter at each token, and under a launch of
    /// hundreds of nodes the last to ask could be served first, or wait half a minute).
    pub fn reserve(&mut self, now: Instant) -> Duration {
        let elapsed = now.saturating_duration_since(self.updated).as_secs_f64();
        let capacity = f64::from(self.limit.burst.max(1));
        self.tokens = (self.tokens + elapsed * self.limit.per_second).min(capacity);
        self.updated = now;
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            let rate = self.limit.per_second.max(f64::MIN_POSITIVE);
            Duration::from_secs_f64(-self.tokens / rate)
        }
    }
}

/// Async wrapper: `acquire` reserves a token and sleeps until its turn. A caller dropped
/// while it sleeps leaves its turn unused: the client then sends less than the limit, never
/// more.
#[derive(Debug)]
pub struct RateLimiter {
    bucket: Mutex<TokenBucket>,
}

impl RateLimiter {
    pub fn new(limit: RateLimit) -> Self {
        RateLimiter {
            bucket: Mutex::new(TokenBucket::new(limit, Instant::now())),
        }
    }

    pub async fn acquire(&self) {
        let wait = self
            .bucket
            .lock()
            .expect("rate limiter lock")
            .reserve(Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_burst_is_free_then_each_reservation_waits_one_interval_more() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(
            RateLimit {
                per_second: 2.0,
                burst: 3,
            },
            t0,
        );
        for _ in 0..3 {
            assert_eq!(b.reserve(t0), Duration::ZERO);
        }
        // Reserved at once, served in the order asked: 0.5 s apart.
        assert_eq!(b.reserve(t0), Duration::from_millis(500));
        assert_eq!(b.reserve(t0), Duration::from_millis(1000));
        assert_eq!(b.reserve(t0), Duration::from_millis(1500));
        // 1.5 s on, the three queued turns have passed: the next waits one interval.
        assert_eq!(
            b.reserve(t0 + Duration::from_millis(1500)),
            Duration::from_millis(500)
        );
        // Idle time refills only up to the burst size.
        let later = t0 + Duration::from_secs(100);
        for _ in 0..3 {
            assert_eq!(b.reserve(later), Duration::ZERO);
        }
        assert_eq!(b.reserve(later), Duration::from_millis(500));
    }

    /// Five callers asking at once are let through in the order they asked, one interval
    /// apart, each after a single sleep.
    #[tokio::test(start_paused = true)]
    async fn callers_are_served_in_the_order_they_asked() {
        let limiter = RateLimiter::new(RateLimit {
            per_second: 10.0,
            burst: 1,
        });
        let start = tokio::time::Instant::now();
        let served = futures::future::join_all((0..5u64).map(|i| {
            let limiter = &limiter;
            async move {
                limiter.acquire().await;
                (i, start.elapsed())
            }
        }))
        .await;
        for (i, at) in served {
            let expected = Duration::from_millis(100 * i);
            let off = at.abs_diff(expected);
            assert!(
                off < Duration::from_millis(2),
                "caller {i} served at {at:?}"
            );
        }
    }
}
