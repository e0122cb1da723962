//! Client-side token bucket, so a burst of launches cannot get the account throttled.

use std::time::{Duration, Instant};

use tokio::sync::Mutex;

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

    /// Takes a token, or says how long until one is available.
    pub fn try_take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.updated).as_secs_f64();
        let capacity = f64::from(self.limit.burst.max(1));
        self.tokens = (self.tokens + elapsed * self.limit.per_second).min(capacity);
        self.updated = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            let rate = self.limit.per_second.max(f64::MIN_POSITIVE);
            Err(Duration::from_secs_f64((1.0 - self.tokens) / rate))
        }
    }
}

/// Async wrapper: `acquire` waits until the bucket grants a token.
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
        loop {
            let wait = match self.bucket.lock().await.try_take(Instant::now()) {
                Ok(()) => return,
                Err(wait) => wait,
            };
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_sustained_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(
            RateLimit {
                per_second: 2.0,
                burst: 3,
            },
            t0,
        );
        for _ in 0..3 {
            assert_eq!(b.try_take(t0), Ok(()));
        }
        let wait = b.try_take(t0).unwrap_err();
        assert_eq!(wait, Duration::from_millis(500));
        assert_eq!(b.try_take(t0 + Duration::from_millis(500)), Ok(()));
        assert!(b.try_take(t0 + Duration::from_millis(600)).is_err());
        // Idle time refills only up to the burst size.
        let later = t0 + Duration::from_secs(100);
        for _ in 0..3 {
            assert_eq!(b.try_take(later), Ok(()));
        }
        assert!(b.try_take(later).is_err());
    }

    #[tokio::test]
    async fn acquire_grants_the_burst_without_waiting_on_a_condition() {
        let limiter = RateLimiter::new(RateLimit {
            per_second: 1000.0,
            burst: 5,
        });
        for _ in 0..10 {
            limiter.acquire().await;
        }
        let bucket = limiter.bucket.lock().await;
        assert!(bucket.tokens < 5.0);
    }
}
