//! Metric, label and event names the disruption controller publishes, as upstream spells them
//! (dashboards and alerts written for upstream Karpenter keep working).

// --- metrics -----------------------------------------------------------------------------------
pub const DECISION_EVALUATION_DURATION_SECONDS: &str =
    "karpenter_voluntary_disruption_decision_evaluation_duration_seconds";
pub const DECISIONS_TOTAL: &str = "karpenter_voluntary_disruption_decisions_total";
pub const DECISIONS_BY_NODEPOOL_TOTAL: &str =
    "karpenter_voluntary_disruption_decisions_by_nodepool_total";
pub const ELIGIBLE_NODES: &str = "karpenter_voluntary_disruption_eligible_nodes";
pub const CONSOLIDATION_TIMEOUTS_TOTAL: &str =
    "karpenter_voluntary_disruption_consolidation_timeouts_total";
pub const FAILED_VALIDATIONS_TOTAL: &str =
    "karpenter_voluntary_disruption_failed_validations_total";
pub const QUEUE_FAILURES_TOTAL: &str = "karpenter_voluntary_disruption_queue_failures_total";
pub const CONSOLIDATION_MOVES_TOTAL: &str = "karpenter_consolidation_moves_total";
pub const CONSOLIDATION_SCORE: &str = "karpenter_consolidation_score";
pub const NODEPOOL_ALLOWED_DISRUPTIONS: &str = "karpenter_nodepools_allowed_disruptions";
pub const NODEPOOL_NODES_CONSUMING_BUDGETS: &str = "karpenter_nodepools_nodes_consuming_budgets";
pub const NODECLAIMS_DISRUPTED_TOTAL: &str = "karpenter_nodeclaims_disrupted_total";
pub const PODS_DISRUPTION_INITIATED_TOTAL: &str = "karpenter_pods_disruption_initiated_total";

// --- metric labels -------------------------------------------------------------------------------
pub const LABEL_DECISION: &str = "decision";
pub const LABEL_REASON: &str = "reason";
pub const LABEL_CONSOLIDATION_TYPE: &str = "consolidation_type";
pub const LABEL_NODEPOOL: &str = "nodepool";
pub const LABEL_CAPACITY_TYPE: &str = "capacity_type";
pub const LABEL_CONSOLIDATION_POLICY: &str = "consolidation_policy";
pub const LABEL_TERMINATION_MODE: &str = "termination_mode";

// --- label values ----------------------------------------------------------------------------------
pub const DECISION_DELETE: &str = "delete";
pub const DECISION_REPLACE: &str = "replace";
pub const CONSOLIDATION_TYPE_SINGLE: &str = "single";
pub const CONSOLIDATION_TYPE_MULTI: &str = "multi";
pub const CONSOLIDATION_TYPE_EMPTY: &str = "empty";
pub const TERMINATION_MODE_GRACEFUL: &str = "graceful";
pub const TERMINATION_MODE_EVENTUAL: &str = "eventual";
pub const TERMINATION_MODE_FORCEFUL: &str = "forceful";

// --- event reasons -------------------------------------------------------------------------------
pub const EVENT_DISRUPTION_BLOCKED: &str = "DisruptionBlocked";
pub const EVENT_DISRUPTION_LAUNCHING: &str = "DisruptionLaunching";
pub const EVENT_DISRUPTION_WAITING_READINESS: &str = "DisruptionWaitingReadiness";
pub const EVENT_DISRUPTION_TERMINATING: &str = "DisruptionTerminating";
pub const EVENT_UNCONSOLIDATABLE: &str = "Unconsolidatable";
pub const EVENT_CONSOLIDATION_CANDIDATE: &str = "ConsolidationCandidate";
pub const EVENT_INVALID_DO_NOT_DISRUPT: &str = "InvalidDoNotDisruptAnnotation";
pub const EVENT_DO_NOT_DISRUPT_UNTIL: &str = "DoNotDisruptUntil";
pub const EVENT_DO_NOT_DISRUPT_ELAPSED: &str = "DoNotDisruptGracePeriodElapsed";
pub const EVENT_CONSOLIDATION_REJECTED: &str = "ConsolidationRejected";
pub const EVENT_CONSOLIDATION_APPROVED: &str = "ConsolidationApproved";
/// `Unconsolidatable` events are deduplicated for this long upstream.
pub const UNCONSOLIDATABLE_EVENT_DEDUPE: std::time::Duration = std::time::Duration::from_secs(900);
/// Other disruption events about a node or pod: upstream's recorder default.
pub const EVENT_DEDUPE: std::time::Duration = std::time::Duration::from_secs(120);
/// A NodePool's `DisruptionBlocked` by its budget, per disruption reason.
pub const NODEPOOL_BLOCKED_EVENT_DEDUPE: std::time::Duration = std::time::Duration::from_secs(60);

/// The `DisruptionBlocked` message for a NodePool whose budget allows nothing.
pub fn blocked_by_budget_message(reason: crate::apis::nodepool::DisruptionReason) -> String {
    format!(
        "No allowed disruptions for disruption reason {} due to blocking budget",
        reason.as_str()
    )
}

/// `termination_mode` label of a NodeClaim with the given terminationGracePeriod.
pub fn termination_mode(termination_grace_period: Option<std::time::Duration>) -> &'static str {
    match termination_grace_period {
        None => TERMINATION_MODE_GRACEFUL,
        Some(d) if d.is_zero() => TERMINATION_MODE_FORCEFUL,
        Some(_) => TERMINATION_MODE_EVENTUAL,
    }
}
