//! The `Balanced` consolidation policy: a move is approved only if the share of the NodePool's
//! cost it saves is at least 1/K of the share of the NodePool's disruption it causes.

use std::collections::BTreeMap;

use crate::apis::nodepool::ConsolidationPolicy;

use super::candidates::Candidate;
use super::command::Command;
use super::model::ClusterView;

/// Upstream's `BalancedK`: savings must be at least half as large (in share) as disruption.
pub const BALANCED_K: u32 = 2;

/// Totals of one NodePool the shares are taken of.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PoolTotals {
    /// Σ price of the pool's candidates.
    pub cost: f64,
    /// Σ reschedule disruption cost of the pool's nodes.
    pub disruption_cost: f64,
}

/// Per-pool totals over every candidate (before method filters) and every node of the pool.
pub fn pool_totals(
    view: &ClusterView,
    all_candidates: &[Candidate],
) -> BTreeMap<String, PoolTotals> {
    let mut totals: BTreeMap<String, PoolTotals> = BTreeMap::new();
    let by_name: BTreeMap<&str, &Candidate> = all_candidates
        .iter()
        .map(|c| (c.name.as_str(), c))
        .collect();
    for c in all_candidates {
        totals.entry(c.node_pool.clone()).or_default().cost += c.price;
    }
    for n in &view.nodes {
        let Some(pool) = n.node_pool() else { continue };
        let cost = match by_name.get(n.name.as_str()) {
            Some(c) => c.reschedule_disruption_cost,
            None => {
                1.0 + n
                    .pods
                    .iter()
                    .filter(|p| p.is_reschedulable())
                    .map(|p| p.eviction_cost().max(0.0))
                    .sum::<f64>()
            }
        };
        if let Some(t) = totals.get_mut(pool) {
            t.disruption_cost += cost;
        }
    }
    totals
}

/// A move's savings and disruption as shares of its NodePool's totals.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Score {
    pub savings_fraction: f64,
    pub disruption_fraction: f64,
}

impl Score {
    pub fn new(savings: f64, disruption: f64, totals: PoolTotals) -> Self {
        if totals.cost <= 0.0 || totals.disruption_cost <= 0.0 {
            return Score::default();
        }
        Score {
            savings_fraction: savings / totals.cost,
            disruption_fraction: disruption / totals.disruption_cost,
        }
    }

    pub fn value(self) -> f64 {
        if self.savings_fraction <= 0.0 {
            0.0
        } else if self.disruption_fraction == 0.0 {
            f64::INFINITY
        } else {
            self.savings_fraction / self.disruption_fraction
        }
    }

    pub fn approved(self) -> bool {
        self.value() >= 1.0 / f64::from(BALANCED_K)
    }
}

fn balanced(c: &Candidate) -> bool {
    c.consolidation_policy == ConsolidationPolicy::Balanced
}

/// The score of the command in each `Balanced` NodePool it touches; savings are shared among
/// pools in proportion to the price of their candidates. Other pools are not scored.
pub fn scores(cmd: &Command, totals: &BTreeMap<String, PoolTotals>) -> BTreeMap<String, Score> {
    let savings = cmd.estimated_savings();
    let source_cost: f64 = cmd.candidates.iter().map(|c| c.price).sum();
    let mut pools: BTreeMap<&str, Vec<&Candidate>> = BTreeMap::new();
    for c in &cmd.candidates {
        pools.entry(c.node_pool.as_str()).or_default().push(c);
    }
    let several = pools.len() > 1;
    pools
        .into_iter()
        .filter(|(_, cands)| cands.iter().any(|c| balanced(c)))
        .map(|(pool, cands)| {
            let pool_cost: f64 = cands.iter().map(|c| c.price).sum();
            let pool_savings = if several && source_cost > 0.0 {
                savings * pool_cost / source_cost
            } else {
                savings
            };
            let disruption: f64 = cands.iter().map(|c| c.reschedule_disruption_cost).sum();
            let t = totals.get(pool).copied().unwrap_or_default();
            (pool.to_string(), Score::new(pool_savings, disruption, t))
        })
        .collect()
}

/// Whether every `Balanced` NodePool of the command approves it.
pub fn approve(cmd: &Command, totals: &BTreeMap<String, PoolTotals>) -> bool {
    scores(cmd, totals).values().all(|s| s.approved())
}

/// The `ConsolidationApproved` message of a scored pool.
pub fn approved_message(score: Score) -> String {
    format!(
        "Consolidation approved by the Balanced policy: score {:.2} >= threshold {:.2} (k: {BALANCED_K}; saves {:.1}% of the NodePool's cost for {:.1}% of its disruption)",
        score.value(),
        1.0 / f64::from(BALANCED_K),
        score.savings_fraction * 100.0,
        score.disruption_fraction * 100.0,
    )
}

/// The best a single candidate could score (deleting it outright): skip it if even that fails.
pub fn can_pass_threshold(c: &Candidate, totals: &BTreeMap<String, PoolTotals>) -> bool {
    if !balanced(c) {
        return true;
    }
    match totals.get(&c.node_pool) {
        Some(t) if t.cost > 0.0 => Score::new(c.price, c.reschedule_disruption_cost, *t).approved(),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn score_compares_savings_share_with_disruption_share() {
        let totals = PoolTotals {
            cost: 10.0,
            disruption_cost: 100.0,
        };
        // Saves 10 % of the cost for 10 % of the disruption: score 1, approved.
        assert!(Score::new(1.0, 10.0, totals).approved());
        // Saves 10 % for 30 % of the disruption: score 1/3 < 1/2.
        assert!(!Score::new(1.0, 30.0, totals).approved());
        // Exactly 1/2 passes.
        assert!(Score::new(1.0, 20.0, totals).approved());
        assert_eq!(Score::new(0.0, 0.0, totals).value(), 0.0);
        assert!(Score::new(1.0, 0.0, totals).value().is_infinite());
        assert!(!Score::new(1.0, 1.0, PoolTotals::default()).approved());
    }
}
