//! A Prometheus summary, which prometheus-client does not have: upstream exports
//! `karpenter_pods_startup_duration_seconds` as one, and queries of its `quantile` series
//! find nothing in a histogram of the same name.
//!
//! As client_golang's default summary: quantiles over the last 10 minutes (five 2-minute
//! buckets that age out one at a time), `_sum` and `_count` over the process lifetime. The
//! quantiles here are exact over the observations kept; a bucket keeps its latest
//! [`MAX_PER_BUCKET`] observations, so memory stays bounded whatever the pod churn.

use std::collections::VecDeque;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Upstream's objectives: minimum, median, 90th, 99th percentile and maximum.
pub const QUANTILES: [f64; 5] = [0.0, 0.5, 0.9, 0.99, 1.0];
/// How long an observation counts towards the quantiles (client_golang's `MaxAge`).
const MAX_AGE: Duration = Duration::from_secs(600);
/// Buckets the window ages out by (client_golang's `AgeBuckets`).
const AGE_BUCKETS: u32 = 5;
/// Observations one bucket keeps (the latest ones); 8 bytes each.
pub const MAX_PER_BUCKET: usize = 20_000;

#[derive(Debug, Default)]
struct Bucket {
    values: Vec<f64>,
    /// Where the next observation goes once `values` is full (the oldest one's place).
    next: usize,
}

#[derive(Debug, Default)]
struct State {
    /// Newest last, each with the instant it started.
    buckets: VecDeque<(Instant, Bucket)>,
    sum: f64,
    count: u64,
}

#[derive(Debug, Default)]
pub struct Summary {
    state: Mutex<State>,
}

impl State {
    fn age(&mut self, now: Instant) {
        while self
            .buckets
            .front()
            .is_some_and(|(started, _)| now.saturating_duration_since(*started) >= MAX_AGE)
        {
            self.buckets.pop_front();
        }
    }
}

impl Summary {
    pub fn observe(&self, value: f64) {
        self.observe_at(value, Instant::now());
    }

    /// Records `value` as observed at `now`.
    pub fn observe_at(&self, value: f64, now: Instant) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.sum += value;
        state.count += 1;
        state.age(now);
        let bucket_span = MAX_AGE / AGE_BUCKETS;
        let fresh = state
            .buckets
            .back()
            .is_some_and(|(started, _)| now.saturating_duration_since(*started) < bucket_span);
        if !fresh {
            state.buckets.push_back((now, Bucket::default()));
        }
        let Some((_, bucket)) = state.buckets.back_mut() else {
            return;
        };
        if bucket.values.len() < MAX_PER_BUCKET {
            bucket.values.push(value);
        } else {
            bucket.values[bucket.next] = value;
            bucket.next = (bucket.next + 1) % MAX_PER_BUCKET;
        }
    }

    /// Each of [`QUANTILES`] over the window at `now` (NaN when it is empty, as
    /// client_golang), then the lifetime sum and count.
    pub fn snapshot_at(&self, now: Instant) -> ([f64; QUANTILES.len()], f64, u64) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.age(now);
        let mut values: Vec<f64> = state
            .buckets
            .iter()
            .flat_map(|(_, b)| b.values.iter().copied())
            .filter(|v| !v.is_nan())
            .collect();
        let (sum, count) = (state.sum, state.count);
        drop(state);
        values.sort_by(f64::total_cmp);
        let quantile = |q: f64| {
            if values.is_empty() {
                return f64::NAN;
            }
            // The smallest value with at least q of the observations at or below it.
            let rank = (q * values.len() as f64).ceil() as usize;
            values[rank.clamp(1, values.len()) - 1]
        };
        (QUANTILES.map(quantile), sum, count)
    }

    /// The family in the OpenMetrics text format: `# TYPE … summary`, one sample per
    /// quantile, then `_sum` and `_count`.
    pub fn encode(&self, out: &mut impl Write, name: &str, help: &str) -> std::fmt::Result {
        let (quantiles, sum, count) = self.snapshot_at(Instant::now());
        encode_snapshot(out, name, help, &quantiles, sum, count)
    }
}

fn encode_snapshot(
    out: &mut impl Write,
    name: &str,
    help: &str,
    quantiles: &[f64],
    sum: f64,
    count: u64,
) -> std::fmt::Result {
    writeln!(out, "# HELP {name} {}", help.trim_end_matches('.'))?;
    writeln!(out, "# TYPE {name} summary")?;
    for (q, v) in QUANTILES.iter().zip(quantiles) {
        writeln!(out, "{name}{{quantile=\"{q}\"}} {}", number(*v))?;
    }
    writeln!(out, "{name}_sum {}", number(sum))?;
    writeln!(out, "{name}_count {count}")
}

/// OpenMetrics numbers: `NaN`, `+Inf`, `-Inf`, otherwise the shortest exact decimal.
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_cover_the_last_ten_minutes_and_sum_and_count_everything() {
        let t0 = Instant::now();
        let s = Summary::default();
        let (empty, _, _) = s.snapshot_at(t0);
        assert!(empty.iter().all(|q| q.is_nan()), "no observation yet");
        for v in 1..=100 {
            s.observe_at(v as f64, t0);
        }
        let (q, sum, count) = s.snapshot_at(t0);
        assert_eq!(q, [1.0, 50.0, 90.0, 99.0, 100.0]);
        assert_eq!((sum, count), (5050.0, 100));

        // Four minutes later a second bucket holds a slow one; both still count.
        let later = t0 + Duration::from_secs(240);
        s.observe_at(1000.0, later);
        assert_eq!(s.snapshot_at(later).0[4], 1000.0);
        // Ten minutes after the first bucket began it is gone; the lifetime totals stay.
        let (q, sum, count) = s.snapshot_at(t0 + MAX_AGE);
        assert_eq!(q, [1000.0; 5]);
        assert_eq!((sum, count), (6050.0, 101));
        let (q, _, count) = s.snapshot_at(later + MAX_AGE);
        assert!(q.iter().all(|v| v.is_nan()), "window empty again");
        assert_eq!(count, 101);
    }

    #[test]
    fn a_bucket_keeps_its_latest_observations_only() {
        let t0 = Instant::now();
        let s = Summary::default();
        for _ in 0..MAX_PER_BUCKET {
            s.observe_at(1.0, t0);
        }
        for _ in 0..MAX_PER_BUCKET {
            s.observe_at(2.0, t0);
        }
        let (q, _, count) = s.snapshot_at(t0);
        assert_eq!(q[0], 2.0, "the older half was overwritten");
        assert_eq!(count, 2 * MAX_PER_BUCKET as u64);
        let state = s.state.lock().unwrap();
        assert_eq!(state.buckets[0].1.values.len(), MAX_PER_BUCKET);
    }

    #[test]
    fn encodes_as_an_openmetrics_summary() {
        let mut text = String::new();
        encode_snapshot(
            &mut text,
            "karpenter_pods_startup_duration_seconds",
            "Time from pod creation until the pod is Ready.",
            &[2.0, 3.5, f64::NAN, 1e6, 7.0],
            1234.5,
            9,
        )
        .unwrap();
        assert_eq!(
            text,
            "# HELP karpenter_pods_startup_duration_seconds Time from pod creation until the pod is Ready\n\
             # TYPE karpenter_pods_startup_duration_seconds summary\n\
             karpenter_pods_startup_duration_seconds{quantile=\"0\"} 2.0\n\
             karpenter_pods_startup_duration_seconds{quantile=\"0.5\"} 3.5\n\
             karpenter_pods_startup_duration_seconds{quantile=\"0.9\"} NaN\n\
             karpenter_pods_startup_duration_seconds{quantile=\"0.99\"} 1000000.0\n\
             karpenter_pods_startup_duration_seconds{quantile=\"1\"} 7.0\n\
             karpenter_pods_startup_duration_seconds_sum 1234.5\n\
             karpenter_pods_startup_duration_seconds_count 9\n"
        );
    }
}
