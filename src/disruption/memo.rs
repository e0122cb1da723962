//! Upstream skips emptiness and consolidation when nothing changed since their last run that
//! found nothing: scanning an unchanged cluster again would find nothing again. The cluster
//! state bumps a version on any node, NodeClaim, pod binding or NodePool change; the memo
//! forgets after five minutes regardless (prices and budget windows change without events).
//! A skipped pass still reports what blocks each node (`methods::resting_events`).

use std::time::Duration;

use chrono::{DateTime, Utc};

/// How long an unchanged cluster state is trusted.
pub const CONSOLIDATION_STATE_TTL: Duration = Duration::from_secs(300);

/// One per method; remembers the last fruitless run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConsolidationMemo {
    last_fruitless: Option<(u64, DateTime<Utc>)>,
}

impl ConsolidationMemo {
    /// False when the state version is the one of the last fruitless run, within the TTL.
    pub fn should_run(&self, state_version: u64, now: DateTime<Utc>) -> bool {
        let ttl = chrono::Duration::from_std(CONSOLIDATION_STATE_TTL).unwrap_or_default();
        match self.last_fruitless {
            Some((version, at)) => version != state_version || now - at >= ttl,
            None => true,
        }
    }

    /// Records a run: fruitless runs are remembered, a command clears the memo.
    pub fn record(&mut self, state_version: u64, now: DateTime<Utc>, found_command: bool) {
        self.last_fruitless = (!found_command).then_some((state_version, now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_only_an_unchanged_state_within_the_ttl() {
        let t0 = DateTime::from_timestamp(1_000, 0).unwrap();
        let mut memo = ConsolidationMemo::default();
        assert!(memo.should_run(1, t0));
        memo.record(1, t0, false);
        assert!(!memo.should_run(1, t0 + chrono::Duration::seconds(10)));
        assert!(memo.should_run(2, t0 + chrono::Duration::seconds(10)));
        assert!(memo.should_run(1, t0 + chrono::Duration::seconds(300)));
        memo.record(1, t0, true);
        assert!(memo.should_run(1, t0));
    }
}
