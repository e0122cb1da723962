//! The token bucket behind both clients' rate limits (`KUBE_CLIENT_QPS` / `KUBE_CLIENT_BURST`
//! and `EXOSCALE_API_QPS` / `EXOSCALE_API_BURST`). Each call reserves a token and says how long
//! to wait for it: zero while the burst lasts, then one interval more for each reservation
//! ahead. The balance goes negative by the reservations waiting, so callers are served in the
//! order they asked, each after a single sleep. [`TokenBucket`] is pure (the instant is passed
//! in); [`RateLimiter`] shares one between callers on the clock.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

#[derive(Debug)]
pub struct TokenBucket {
    per_second: f64,
    burst: f64,
    /// Tokens at `at`; negative when reservations are queued ahead.
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    pub fn new(per_second: f64, burst: u32, now: Instant) -> Self {
        let burst = f64::from(burst.max(1));
        TokenBucket {
            per_second: per_second.max(f64::MIN_POSITIVE),
            burst,
            tokens: burst,
            at: now,
        }
    }

    /// Takes a token; returns how long to wait before using it.
    pub fn reserve(&mut self, now: Instant) -> Duration {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.burst) - 1.0;
        self.at = now.max(self.at);
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            // A wait beyond a day would be a configuration error; never sleep for ever.
            Duration::from_secs_f64((-self.tokens / self.per_second).min(86_400.0))
        }
    }
}

/// One [`TokenBucket`] shared by a client's callers. A caller dropped while it sleeps leaves
/// its turn unused: the client then sends less than the limit, never more.
#[derive(Debug)]
pub struct RateLimiter {
    bucket: Mutex<TokenBucket>,
}

impl RateLimiter {
    pub fn new(per_second: f64, burst: u32) -> Self {
        RateLimiter {
            bucket: Mutex::new(TokenBucket::new(per_second, burst, Instant::now())),
        }
    }

    /// Reserves the next turn now; returns how long to wait before using it.
    pub fn reserve(&self) -> Duration {
        self.bucket
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .reserve(Instant::now())
    }

    /// Reserves the next turn and sleeps until it comes.
    pub async fn acquire(&self) {
        let wait = self.reserve();
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_goes_at_once_then_requests_are_spaced_at_the_rate() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(2.0, 3, start);
        let waits: Vec<Duration> = (0..6).map(|_| bucket.reserve(start)).collect();
        let ms: Vec<u128> = waits.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [0, 0, 0, 500, 1000, 1500]);
        // 1.5 s on, the three queued turns have passed: the next waits one interval.
        let on = start + Duration::from_millis(1500);
        assert_eq!(bucket.reserve(on).as_millis(), 500);
        // After a quiet spell the bucket is full again, never fuller than the burst.
        let later = start + Duration::from_secs(60);
        let ms: Vec<u128> = (0..4).map(|_| bucket.reserve(later).as_millis()).collect();
        assert_eq!(ms, [0, 0, 0, 500]);
    }

    #[test]
    fn a_wait_is_never_longer_than_a_day() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(1e-9, 1, start);
        bucket.reserve(start);
        assert_eq!(bucket.reserve(start), Duration::from_secs(86_400));
    }

    /// Five callers asking at once are let through in the order they asked, one interval
    /// apart, each after a single sleep.
    #[tokio::test(start_paused = true)]
    async fn callers_are_served_in_the_order_they_asked() {
        let limiter = RateLimiter::new(10.0, 1);
        let start = Instant::now();
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
