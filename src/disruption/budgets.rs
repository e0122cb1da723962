//! Disruption budgets: how many nodes of a NodePool may be voluntarily disrupted at once, for a
//! given reason, at a given instant (UTC).

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::apis::duration::parse_duration;
use crate::apis::nodepool::{Budget, DisruptionReason};

use super::DisruptionError;
use super::cron::Schedule;

/// What an absent limit means; upstream uses `math.MaxInt32`.
pub const UNLIMITED: usize = i32::MAX as usize;

/// A budget's `nodes`: a count or a percentage of the NodePool's nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodesLimit {
    Count(usize),
    Percent(u32),
}

impl NodesLimit {
    pub fn parse(value: &str) -> Result<Self, DisruptionError> {
        let invalid = || DisruptionError::InvalidBudgetNodes(value.to_string());
        if let Some(pct) = value.strip_suffix('%') {
            let p: u32 = pct.parse().map_err(|_| invalid())?;
            if p > 100 {
                return Err(invalid());
            }
            return Ok(NodesLimit::Percent(p));
        }
        value.parse().map(NodesLimit::Count).map_err(|_| invalid())
    }

    /// Percentages round **up**, as Kubernetes does for `maxUnavailable`: 5 % of 10 nodes is 1.
    pub fn resolve(self, num_nodes: usize) -> usize {
        match self {
            NodesLimit::Count(n) => n,
            NodesLimit::Percent(p) => (num_nodes * p as usize).div_ceil(100),
        }
    }
}

/// A parsed budget.
#[derive(Clone, Debug)]
pub struct ParsedBudget {
    pub nodes: NodesLimit,
    pub window: Option<(Schedule, Duration)>,
    pub reasons: Option<Vec<DisruptionReason>>,
}

impl ParsedBudget {
    pub fn parse(budget: &Budget) -> Result<Self, DisruptionError> {
        let nodes = NodesLimit::parse(&budget.nodes)?;
        let window = match (&budget.schedule, &budget.duration) {
            (None, None) => None,
            (Some(schedule), Some(duration)) => {
                let cron = parse_schedule(schedule)?;
                Some((cron, parse_duration(duration)?))
            }
            _ => return Err(DisruptionError::ScheduleWithoutDuration),
        };
        Ok(ParsedBudget {
            nodes,
            window,
            reasons: budget.reasons.clone(),
        })
    }

    /// Active when the first schedule hit after `now - duration` is not after `now`. A window
    /// reaching back beyond the first representable instant covers all time: always active
    /// (its `nodes` limit applies), as a duration too long for `TimeDelta` already was.
    pub fn is_active(&self, now: DateTime<Utc>) -> bool {
        let Some((cron, duration)) = &self.window else {
            return true;
        };
        let Some(checkpoint) = chrono::Duration::from_std(*duration)
            .ok()
            .and_then(|duration| now.checked_sub_signed(duration))
        else {
            return true;
        };
        cron.next_after(checkpoint).is_some_and(|hit| hit <= now)
    }

    pub fn applies_to(&self, reason: DisruptionReason) -> bool {
        limits(&self.reasons, reason)
    }
}

/// Whether a budget with these `reasons` limits `reason` (none listed: every reason).
fn limits(reasons: &Option<Vec<DisruptionReason>>, reason: DisruptionReason) -> bool {
    reasons.as_ref().is_none_or(|r| r.contains(&reason))
}

/// A budget's schedule, read as upstream reads it (see `cron`).
pub fn parse_schedule(schedule: &str) -> Result<Schedule, DisruptionError> {
    Schedule::parse(schedule).map_err(|e| DisruptionError::InvalidSchedule(schedule.to_string(), e))
}

/// Allowed disruptions for `reason` across `budgets`: the most restrictive active budget wins.
/// A budget that cannot be parsed fails closed (0) and its error is returned alongside.
pub fn allowed_disruptions(
    budgets: &[Budget],
    now: DateTime<Utc>,
    num_nodes: usize,
    reason: DisruptionReason,
) -> (usize, Vec<DisruptionError>) {
    let mut allowed = UNLIMITED;
    let mut errors = Vec::new();
    for budget in budgets {
        let value_for_budget = match ParsedBudget::parse(budget) {
            Ok(parsed) if !parsed.applies_to(reason) => continue,
            Ok(parsed) if parsed.is_active(now) => parsed.nodes.resolve(num_nodes),
            Ok(_) => UNLIMITED,
            // Only an unreadable budget that limits this reason is this reason's news.
            Err(_) if !limits(&budget.reasons, reason) => continue,
            Err(e) => {
                errors.push(e);
                0
            }
        };
        allowed = allowed.min(value_for_budget);
    }
    (allowed, errors)
}

/// One NodePool's node counts as budgets see them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BudgetCounts {
    /// Managed, initialized nodes whose instance is not terminating.
    pub nodes: usize,
    /// Among them, NotReady nodes and nodes marked for deletion: they consume budget.
    pub disrupting: usize,
}

/// The budget of one NodePool for one reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolBudget {
    /// Value of `karpenter_nodepools_allowed_disruptions`.
    pub allowed: usize,
    /// Value of `karpenter_nodepools_nodes_consuming_budgets`.
    pub disrupting: usize,
    /// What this loop may still disrupt: `max(allowed - disrupting, 0)`.
    pub remaining: usize,
    /// The pool has nodes but its budget allows none: publish a `DisruptionBlocked` event.
    pub blocked: bool,
}

impl PoolBudget {
    pub fn compute(
        budgets: &[Budget],
        counts: BudgetCounts,
        now: DateTime<Utc>,
        reason: DisruptionReason,
    ) -> (Self, Vec<DisruptionError>) {
        let (allowed, errors) = allowed_disruptions(budgets, now, counts.nodes, reason);
        let budget = PoolBudget {
            allowed,
            disrupting: counts.disrupting,
            remaining: allowed.saturating_sub(counts.disrupting),
            blocked: counts.nodes > 0 && allowed == 0,
        };
        (budget, errors)
    }
}

/// Remaining budget per NodePool name, consumed as candidates are picked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BudgetMapping {
    pub pools: BTreeMap<String, PoolBudget>,
}

impl BudgetMapping {
    pub fn remaining(&self, pool: &str) -> usize {
        self.pools.get(pool).map_or(0, |b| b.remaining)
    }

    /// Takes one unit of the pool's budget; false when none is left.
    pub fn take(&mut self, pool: &str) -> bool {
        match self.pools.get_mut(pool) {
            Some(b) if b.remaining > 0 => {
                b.remaining -= 1;
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn budget(nodes: &str) -> Budget {
        Budget {
            nodes: nodes.into(),
            schedule: None,
            duration: None,
            reasons: None,
        }
    }

    fn at(h: u32, m: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 3, 10, h, m, 0).unwrap()
    }

    #[test]
    fn counts_and_percentages_round_up() {
        assert_eq!(NodesLimit::parse("3").unwrap().resolve(100), 3);
        assert_eq!(NodesLimit::parse("20%").unwrap().resolve(10), 2);
        assert_eq!(NodesLimit::parse("5%").unwrap().resolve(10), 1);
        assert_eq!(NodesLimit::parse("10%").unwrap().resolve(0), 0);
        assert_eq!(NodesLimit::parse("100%").unwrap().resolve(7), 7);
        assert_eq!(NodesLimit::parse("0%").unwrap().resolve(7), 0);
        for bad in ["", "-1", "101%", "x%", "1.5"] {
            let err = NodesLimit::parse(bad).unwrap_err();
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[test]
    fn most_restrictive_active_budget_wins() {
        let budgets = vec![budget("20%"), budget("5")];
        let (allowed, errors) =
            allowed_disruptions(&budgets, at(12, 0), 10, DisruptionReason::Empty);
        assert_eq!(allowed, 2);
        assert!(errors.is_empty());
        assert_eq!(
            allowed_disruptions(&[], at(12, 0), 10, DisruptionReason::Empty).0,
            UNLIMITED
        );
    }

    #[test]
    fn reasons_restrict_which_methods_a_budget_limits() {
        let mut drift_only = budget("0");
        drift_only.reasons = Some(vec![DisruptionReason::Drifted]);
        let budgets = vec![budget("100%"), drift_only];
        assert_eq!(
            allowed_disruptions(&budgets, at(1, 0), 4, DisruptionReason::Drifted).0,
            0
        );
        assert_eq!(
            allowed_disruptions(&budgets, at(1, 0), 4, DisruptionReason::Empty).0,
            4
        );
        assert_eq!(
            allowed_disruptions(&budgets, at(1, 0), 4, DisruptionReason::Underutilized).0,
            4
        );
    }

    #[test]
    fn scheduled_zero_budget_blocks_only_inside_its_window() {
        let mut b = budget("0");
        b.schedule = Some("0 9 * * *".into());
        b.duration = Some("8h".into());
        let budgets = vec![budget("10"), b];
        let allowed = |h, m| allowed_disruptions(&budgets, at(h, m), 10, DisruptionReason::Empty).0;
        assert_eq!(allowed(8, 59), 10);
        assert_eq!(allowed(9, 0), 0);
        assert_eq!(allowed(12, 30), 0);
        assert_eq!(allowed(16, 59), 0);
        assert_eq!(allowed(17, 0), 10, "window is [09:00, 17:00)");
        assert_eq!(allowed(23, 0), 10);
    }

    #[test]
    fn schedule_windows_span_midnight() {
        let mut b = budget("0");
        b.schedule = Some("0 22 * * *".into());
        b.duration = Some("4h".into());
        let parsed = ParsedBudget::parse(&b).unwrap();
        assert!(!parsed.is_active(at(21, 59)));
        assert!(parsed.is_active(at(22, 0)));
        assert!(parsed.is_active(at(23, 59)));
        assert!(parsed.is_active(at(0, 30)));
        assert!(parsed.is_active(at(1, 59)));
        assert!(!parsed.is_active(at(2, 0)));
        assert!(!parsed.is_active(at(12, 0)));
    }

    #[test]
    fn descriptors_and_weekday_names_parse() {
        let mut b = budget("0");
        b.schedule = Some("@daily".into());
        b.duration = Some("1h".into());
        let daily = ParsedBudget::parse(&b).unwrap();
        assert!(daily.is_active(at(0, 30)));
        assert!(!daily.is_active(at(1, 30)));
        // 2026-03-10 is a Tuesday.
        b.schedule = Some("0 0 * * TUE".into());
        b.duration = Some("24h".into());
        assert!(ParsedBudget::parse(&b).unwrap().is_active(at(15, 0)));
        b.schedule = Some("0 0 * * MON".into());
        assert!(!ParsedBudget::parse(&b).unwrap().is_active(at(15, 0)));
    }

    #[test]
    fn unparsable_budgets_fail_closed_with_an_error() {
        let mut b = budget("10");
        b.schedule = Some("not a cron".into());
        b.duration = Some("1h".into());
        let (allowed, errors) = allowed_disruptions(&[b], at(1, 0), 10, DisruptionReason::Empty);
        assert_eq!(allowed, 0);
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].to_string().contains("not a cron"),
            "{}",
            errors[0]
        );
        let mut half = budget("1");
        half.schedule = Some("0 9 * * *".into());
        assert!(ParsedBudget::parse(&half).is_err());
        // An unreadable budget limited to drift says nothing about emptiness.
        let mut drift_only = budget("10");
        drift_only.schedule = Some("0 0 * * 7".into());
        drift_only.duration = Some("1h".into());
        drift_only.reasons = Some(vec![DisruptionReason::Drifted]);
        let budgets = [drift_only, budget("5")];
        let (allowed, errors) =
            allowed_disruptions(&budgets, at(1, 0), 10, DisruptionReason::Empty);
        assert_eq!((allowed, errors.len()), (5, 0));
        let (allowed, errors) =
            allowed_disruptions(&budgets, at(1, 0), 10, DisruptionReason::Drifted);
        assert_eq!((allowed, errors.len()), (0, 1));
    }

    #[test]
    fn a_window_reaching_back_beyond_representable_time_is_always_active() {
        // CRD-valid; `now - 3000000000h` is before chrono's first year.
        let mut b = budget("3");
        b.schedule = Some("0 9 * * *".into());
        b.duration = Some("3000000000h".into());
        let parsed = ParsedBudget::parse(&b).unwrap();
        assert!(parsed.is_active(at(8, 0)));
        let budgets = vec![budget("10"), b];
        let (allowed, errors) =
            allowed_disruptions(&budgets, at(8, 0), 10, DisruptionReason::Empty);
        assert_eq!((allowed, errors.len()), (3, 0));
        // The same through the pool budget static capacity uses.
        let counts = BudgetCounts {
            nodes: 10,
            disrupting: 0,
        };
        let (pool, _) = PoolBudget::compute(&budgets, counts, at(8, 0), DisruptionReason::Empty);
        assert_eq!(pool.allowed, 3);
    }

    #[test]
    fn disrupting_nodes_consume_the_budget() {
        let counts = BudgetCounts {
            nodes: 10,
            disrupting: 1,
        };
        let (b, _) =
            PoolBudget::compute(&[budget("20%")], counts, at(1, 0), DisruptionReason::Empty);
        assert_eq!(
            (b.allowed, b.disrupting, b.remaining, b.blocked),
            (2, 1, 1, false)
        );
        let counts = BudgetCounts {
            nodes: 10,
            disrupting: 3,
        };
        let (b, _) =
            PoolBudget::compute(&[budget("20%")], counts, at(1, 0), DisruptionReason::Empty);
        assert_eq!(b.remaining, 0);
        let (b, _) = PoolBudget::compute(&[budget("0")], counts, at(1, 0), DisruptionReason::Empty);
        assert!(b.blocked);
        let mut mapping = BudgetMapping::default();
        mapping.pools.insert(
            "a".into(),
            PoolBudget {
                allowed: 1,
                disrupting: 0,
                remaining: 1,
                blocked: false,
            },
        );
        assert!(mapping.take("a"));
        assert!(!mapping.take("a"));
        assert!(!mapping.take("unknown"));
    }
}
