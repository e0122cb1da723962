//! Bounded exponential back-off with jitter that honours `Retry-After`.

use std::time::Duration;

use super::error::Error;

#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Total attempts including the first (1 disables retries).
    pub max_attempts: u32,
    pub base_delay: Duration,
    pub max_delay: Duration,
    /// A `Retry-After` longer than this is not waited for; the error is returned instead.
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
            max_retry_after: Duration::from_secs(120),
        }
    }
}

impl RetryPolicy {
    pub fn none() -> Self {
        RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        }
    }

    /// The wait before retry number `attempt` (0 = first retry), or `None` to give up.
    /// `jitter` in `[0, 1)` spreads the exponential delay over its upper half.
    pub fn delay(&self, attempt: u32, error: &Error, jitter: f64) -> Option<Duration> {
        if attempt + 1 >= self.max_attempts {
            return None;
        }
        let exp = self
            .base_delay
            .saturating_mul(2u32.saturating_pow(attempt.min(16)))
            .min(self.max_delay);
        let jittered = exp.mul_f64(0.5 + 0.5 * jitter.clamp(0.0, 1.0));
        match error {
            Error::RateLimited {
                retry_after: Some(after),
                ..
            } => (*after <= self.max_retry_after).then(|| (*after).max(jittered)),
            _ => Some(jittered),
        }
    }
}

/// Whether a failed request may be re-sent. Requests that may have changed state on the
/// server (a non-idempotent POST that reached it) are only retried on 429 or when the
/// connection was never established.
pub fn is_retryable(error: &Error, idempotent: bool) -> bool {
    match error {
        Error::RateLimited { .. } => true,
        Error::Transport { connect: true, .. } => true,
        Error::Transport { .. } | Error::Timeout { .. } => idempotent,
        Error::Server { status, .. } => idempotent && matches!(status, 500 | 502 | 503 | 504),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server() -> Error {
        Error::Server {
            status: 503,
            message: String::new(),
        }
    }

    #[test]
    fn exponential_and_capped() {
        let p = RetryPolicy {
            max_attempts: 10,
            base_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(8),
            max_retry_after: Duration::from_secs(60),
        };
        let d: Vec<_> = (0..6)
            .map(|a| p.delay(a, &server(), 1.0).unwrap())
            .collect();
        assert_eq!(
            d.iter().map(|d| d.as_secs()).collect::<Vec<_>>(),
            vec![1, 2, 4, 8, 8, 8]
        );
        assert_eq!(p.delay(1, &server(), 0.0), Some(Duration::from_secs(1)));
        assert_eq!(p.delay(9, &server(), 0.5), None);
    }

    #[test]
    fn retry_after_is_honoured_and_bounded() {
        let p = RetryPolicy::default();
        let limited = |s| Error::RateLimited {
            retry_after: Some(Duration::from_secs(s)),
            message: String::new(),
        };
        assert_eq!(p.delay(0, &limited(10), 0.0), Some(Duration::from_secs(10)));
        assert_eq!(p.delay(0, &limited(1000), 0.0), None);
        assert_eq!(RetryPolicy::none().delay(0, &server(), 0.0), None);
    }

    #[test]
    fn posts_are_only_retried_when_nothing_happened() {
        assert!(is_retryable(&server(), true));
        assert!(!is_retryable(&server(), false));
        let connect = Error::Transport {
            message: String::new(),
            connect: true,
        };
        let lost = Error::Transport {
            message: String::new(),
            connect: false,
        };
        assert!(is_retryable(&connect, false));
        assert!(!is_retryable(&lost, false));
        assert!(is_retryable(&lost, true));
        assert!(!is_retryable(
            &Error::NotFound {
                message: String::new()
            },
            true
        ));
    }
}
