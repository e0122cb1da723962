//! The Exoscale client's rate limit, so a burst of launches cannot get the account throttled.

use std::sync::Mutex;

use tokio::time::Instant;

use crate::token_bucket::TokenBucket;

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
            bucket: Mutex::new(TokenBucket::new(
                limit.per_second,
                limit.burst,
                Instant::now(),
            )),
        }
    }

    pub async fn acquire(&self) {
        let wait = self
            .bucket
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .reserve(Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

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
