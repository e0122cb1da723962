//! A disruption decision: which nodes go, and what (if anything) is launched first.

use std::collections::HashSet;
use std::sync::Arc;

use crate::apis::nodepool::DisruptionReason;
use crate::scheduling::{InstanceType, NewNodeClaim, Requirements};

use super::candidates::{Candidate, DisruptionClass};
use super::names;

/// The disruption methods, in the order each loop tries them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Method {
    Emptiness,
    /// A drifted node of a static NodePool, replaced one for one from the template.
    StaticDrift,
    Drift,
    MultiNodeConsolidation,
    SingleNodeConsolidation,
}

impl Method {
    pub const ORDER: [Method; 5] = [
        Method::Emptiness,
        Method::StaticDrift,
        Method::Drift,
        Method::MultiNodeConsolidation,
        Method::SingleNodeConsolidation,
    ];

    pub fn reason(self) -> DisruptionReason {
        match self {
            Method::Emptiness => DisruptionReason::Empty,
            Method::Drift | Method::StaticDrift => DisruptionReason::Drifted,
            Method::MultiNodeConsolidation | Method::SingleNodeConsolidation => {
                DisruptionReason::Underutilized
            }
        }
    }

    /// `consolidation_type` metric label ("" for drift).
    pub fn consolidation_type(self) -> &'static str {
        match self {
            Method::Emptiness => names::CONSOLIDATION_TYPE_EMPTY,
            Method::Drift | Method::StaticDrift => "",
            Method::MultiNodeConsolidation => names::CONSOLIDATION_TYPE_MULTI,
            Method::SingleNodeConsolidation => names::CONSOLIDATION_TYPE_SINGLE,
        }
    }

    pub fn class(self) -> DisruptionClass {
        match self {
            Method::Drift | Method::StaticDrift => DisruptionClass::Eventual,
            _ => DisruptionClass::Graceful,
        }
    }

    /// Emptiness and consolidation are re-checked after `COMMAND_VALIDATION_DELAY`.
    pub fn needs_validation(self) -> bool {
        !matches!(self, Method::Drift | Method::StaticDrift)
    }
}

/// Delete the candidates, or replace them with new capacity first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Delete,
    Replace,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Delete => names::DECISION_DELETE,
            Decision::Replace => names::DECISION_REPLACE,
        }
    }
}

/// A command the orchestration queue executes.
#[derive(Clone, Debug)]
pub struct Command {
    pub method: Method,
    pub candidates: Vec<Candidate>,
    /// NodeClaims to launch (and wait for) before the candidates are deleted; instance types
    /// cheapest first.
    pub replacements: Vec<NewNodeClaim>,
    /// Emptiness only: eligible empty nodes the budget left out when the command was decided.
    /// Validation, 15 s later, takes those still empty that the budget then allows (see
    /// [`super::validation::validate`]).
    pub standby: Vec<Candidate>,
}

impl Command {
    pub fn decision(&self) -> Decision {
        if self.replacements.is_empty() {
            Decision::Delete
        } else {
            Decision::Replace
        }
    }

    pub fn candidate_names(&self) -> Vec<&str> {
        self.candidates.iter().map(|c| c.name.as_str()).collect()
    }

    /// Upstream's description of the command for one of its candidates (the
    /// `ConsolidationCandidate` event): the whole command when it has one candidate, else the
    /// candidate as part of an n-node move.
    pub fn describe_for(&self, candidate: &str) -> String {
        let decision = self.decision().as_str();
        if self.candidates.len() > 1 {
            return format!(
                "{decision}: [{candidate}] (part of {}-node consolidation)",
                self.candidates.len()
            );
        }
        let mut pools: Vec<&str> = self
            .candidates
            .iter()
            .map(|c| c.node_pool.as_str())
            .collect();
        pools.dedup();
        let replacements = match self.replacements.len() {
            0 => String::new(),
            1 => " -> [1 replacement]".to_string(),
            n => format!(" -> [{n} replacements]"),
        };
        format!(
            "{}: {decision}: nodepools=[{}]: [{}]{replacements}",
            self.method.reason().as_str(),
            pools.join(","),
            self.candidate_names().join(", ")
        )
    }

    /// Σ candidate prices minus the cheapest launch price of the replacements.
    pub fn estimated_savings(&self) -> f64 {
        let current: f64 = self.candidates.iter().map(|c| c.price).sum();
        let new: f64 = self
            .replacements
            .iter()
            .map(|r| {
                r.instance_types
                    .iter()
                    .filter_map(|it| it.cheapest_price(&r.requirements))
                    .fold(f64::INFINITY, f64::min)
            })
            .filter(|p| p.is_finite())
            .sum();
        current - new
    }
}

/// The highest price any available offering compatible with `reqs` could cost: a replacement
/// must be cheaper even if the provider picks its most expensive option.
pub fn worst_launch_price(it: &InstanceType, reqs: &Requirements) -> Option<f64> {
    it.offerings
        .iter()
        .filter(|o| o.available && o.compatible(reqs))
        .map(|o| o.price)
        .max_by(f64::total_cmp)
}

/// Keeps instance types whose worst launch price is strictly below `max_price`, in order.
pub fn cheaper_than(
    types: &[Arc<InstanceType>],
    reqs: &Requirements,
    max_price: f64,
) -> Vec<Arc<InstanceType>> {
    types
        .iter()
        .filter(|it| worst_launch_price(it, reqs).is_some_and(|p| p < max_price))
        .cloned()
        .collect()
}

/// Every name in `subset` appears in `superset`.
pub fn instance_types_subset(subset: &[Arc<InstanceType>], superset: &[Arc<InstanceType>]) -> bool {
    let names: HashSet<&str> = superset.iter().map(|it| it.name.as_str()).collect();
    subset.iter().all(|it| names.contains(it.name.as_str()))
}
