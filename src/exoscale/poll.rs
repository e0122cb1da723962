//! Operation polling schedule: the upstream clients wait 3 s during the first 30 s, then the
//! interval grows linearly to 60 s at 15 min (exoscale-api.md §3.9). All bounds configurable.

use std::time::Duration;

#[derive(Debug, Clone, PartialEq)]
pub struct PollPolicy {
    pub initial_interval: Duration,
    /// How long the initial interval is kept.
    pub initial_phase: Duration,
    pub max_interval: Duration,
    /// When the interval reaches `max_interval`.
    pub ramp_end: Duration,
    /// Give up waiting after this long.
    pub timeout: Duration,
    /// Stop after this many consecutive failed polls.
    pub max_consecutive_errors: u32,
}

impl Default for PollPolicy {
    fn default() -> Self {
        PollPolicy {
            initial_interval: Duration::from_secs(3),
            initial_phase: Duration::from_secs(30),
            max_interval: Duration::from_secs(60),
            ramp_end: Duration::from_secs(15 * 60),
            timeout: Duration::from_secs(10 * 60),
            max_consecutive_errors: 5,
        }
    }
}

impl PollPolicy {
    /// A fixed short interval, for tests and the simulated cloud.
    pub fn fixed(interval: Duration, timeout: Duration) -> Self {
        PollPolicy {
            initial_interval: interval,
            initial_phase: timeout,
            max_interval: interval,
            ramp_end: timeout,
            timeout,
            max_consecutive_errors: 5,
        }
    }

    /// The wait before the next poll, `elapsed` after the wait started.
    pub fn interval_at(&self, elapsed: Duration) -> Duration {
        if elapsed <= self.initial_phase || self.ramp_end <= self.initial_phase {
            return self.initial_interval;
        }
        let progress = (elapsed - self.initial_phase).as_secs_f64()
            / (self.ramp_end - self.initial_phase).as_secs_f64();
        let span = self.max_interval.as_secs_f64() - self.initial_interval.as_secs_f64();
        let secs = self.initial_interval.as_secs_f64() + span * progress.min(1.0);
        Duration::from_secs_f64(
            secs.clamp(
                self.initial_interval.as_secs_f64(),
                self.max_interval
                    .as_secs_f64()
                    .max(self.initial_interval.as_secs_f64()),
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_upstream_schedule() {
        let p = PollPolicy::default();
        assert_eq!(p.interval_at(Duration::ZERO), Duration::from_secs(3));
        assert_eq!(
            p.interval_at(Duration::from_secs(30)),
            Duration::from_secs(3)
        );
        let mid = p.interval_at(Duration::from_secs(465)).as_secs_f64();
        assert!((mid - 31.5).abs() < 0.01, "{mid}");
        assert_eq!(
            p.interval_at(Duration::from_secs(900)),
            Duration::from_secs(60)
        );
        assert_eq!(
            p.interval_at(Duration::from_secs(5000)),
            Duration::from_secs(60)
        );
    }

    #[test]
    fn fixed_policy_never_grows() {
        let p = PollPolicy::fixed(Duration::from_millis(5), Duration::from_secs(10));
        assert_eq!(
            p.interval_at(Duration::from_secs(9)),
            Duration::from_millis(5)
        );
        assert_eq!(
            p.interval_at(Duration::from_secs(60)),
            Duration::from_millis(5)
        );
    }
}
