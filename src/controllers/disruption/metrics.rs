//! The disruption controller's metric families, under upstream's names.

use std::collections::BTreeMap;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

use crate::disruption::names;
use crate::operator::metrics::{Labels, Metrics};

pub struct DisruptionMetrics {
    counters: BTreeMap<&'static str, Family<Labels, Counter>>,
    pub eligible_nodes: Family<Labels, Gauge>,
    pub allowed_disruptions: Family<Labels, Gauge>,
    pub nodes_consuming_budgets: Family<Labels, Gauge>,
    pub evaluation_duration: Family<Labels, Histogram, fn() -> Histogram>,
    /// `karpenter_consolidation_score` of `Balanced` moves.
    pub consolidation_score: Family<Labels, Histogram, fn() -> Histogram>,
    /// `karpenter_nodeclaims_disrupted_total`, shared with expiration and repair.
    nodeclaims_disrupted: Family<Labels, Counter>,
    /// `karpenter_pods_disruption_initiated_total`, shared with expiration.
    pods_disruption_initiated: Family<Labels, Counter>,
}

/// A Balanced score is savings share / disruption share; 0.5 is the approval threshold (k = 2).
fn score_histogram() -> Histogram {
    Histogram::new([0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 100.0])
}

fn duration_histogram() -> Histogram {
    Histogram::new([0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0])
}

impl DisruptionMetrics {
    pub fn register(metrics: &Metrics) -> Self {
        let mut counters = BTreeMap::new();
        for (name, help) in [
            (
                names::DECISIONS_TOTAL,
                "Disruption decisions, by decision, reason and consolidation type.",
            ),
            (
                names::DECISIONS_BY_NODEPOOL_TOTAL,
                "Disruption decisions, by NodePool.",
            ),
            (
                names::CONSOLIDATION_TIMEOUTS_TOTAL,
                "Consolidation runs that timed out.",
            ),
            (
                names::FAILED_VALIDATIONS_TOTAL,
                "Commands abandoned at validation.",
            ),
            (
                names::QUEUE_FAILURES_TOTAL,
                "Commands that failed while executing.",
            ),
            (
                names::CONSOLIDATION_MOVES_TOTAL,
                "Consolidation moves evaluated, by decision, NodePool and consolidation policy.",
            ),
        ] {
            let family = Family::<Labels, Counter>::default();
            // prometheus-client appends `_total` to counters.
            metrics.register(
                name.strip_suffix("_total").unwrap_or(name),
                help,
                family.clone(),
            );
            counters.insert(name, family);
        }
        let eligible_nodes = Family::<Labels, Gauge>::default();
        metrics.register(
            names::ELIGIBLE_NODES,
            "Nodes eligible for disruption, by reason.",
            eligible_nodes.clone(),
        );
        let allowed_disruptions = Family::<Labels, Gauge>::default();
        metrics.register(
            names::NODEPOOL_ALLOWED_DISRUPTIONS,
            "Nodes the NodePool's budgets allow to disrupt, by reason.",
            allowed_disruptions.clone(),
        );
        let nodes_consuming_budgets = Family::<Labels, Gauge>::default();
        metrics.register(
            names::NODEPOOL_NODES_CONSUMING_BUDGETS,
            "Nodes of the NodePool being disrupted or not ready.",
            nodes_consuming_budgets.clone(),
        );
        let evaluation_duration =
            Family::<Labels, Histogram, fn() -> Histogram>::new_with_constructor(
                duration_histogram as fn() -> Histogram,
            );
        metrics.register(
            names::DECISION_EVALUATION_DURATION_SECONDS,
            "Time to evaluate one disruption method, by reason and consolidation type.",
            evaluation_duration.clone(),
        );
        let consolidation_score =
            Family::<Labels, Histogram, fn() -> Histogram>::new_with_constructor(
                score_histogram as fn() -> Histogram,
            );
        metrics.register(
            names::CONSOLIDATION_SCORE,
            "Balanced consolidation scores (savings share / disruption share; a move that disrupts nothing counts as 1000), by decision, NodePool and policy.",
            consolidation_score.clone(),
        );
        DisruptionMetrics {
            counters,
            eligible_nodes,
            allowed_disruptions,
            nodes_consuming_budgets,
            evaluation_duration,
            consolidation_score,
            nodeclaims_disrupted: metrics.nodeclaims_disrupted.clone(),
            pods_disruption_initiated: metrics.pods_disruption_initiated.clone(),
        }
    }

    /// Increments the counter `metric` (an upstream name from [`names`]).
    pub fn count(&self, metric: &str, labels: &[(&'static str, String)]) {
        self.add(metric, labels, 1);
    }

    /// Adds `amount` to the counter `metric` (an upstream name from [`names`]).
    pub fn add(&self, metric: &str, labels: &[(&'static str, String)], amount: u64) {
        let labels: Labels = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        let family = match metric {
            names::NODECLAIMS_DISRUPTED_TOTAL => Some(&self.nodeclaims_disrupted),
            names::PODS_DISRUPTION_INITIATED_TOTAL => Some(&self.pods_disruption_initiated),
            _ => self.counters.get(metric),
        };
        if let Some(family) = family {
            family.get_or_create(&labels).inc_by(amount);
        } else {
            tracing::debug!(
                metric,
                "counter not registered by the disruption controller"
            );
        }
    }
}
