//! The Exoscale client's rate limit, so a burst of launches cannot get the account throttled
//! (applied by [`crate::token_bucket::RateLimiter`]).

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
