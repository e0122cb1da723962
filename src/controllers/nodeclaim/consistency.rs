//! Consistency: an initialized Node must offer at least 90 % of the capacity the cloud promised,
//! per resource; otherwise `ConsistentStateFound` turns False and a warning event names the gap.

use k8s_openapi::api::core::v1::Node;

use crate::apis::labels::conditions;
use crate::apis::{ConditionStatus, NodeClaimStatus};
use crate::controllers::Result;
use crate::operator::events::Severity;

use super::pass::{Pass, Step};

pub async fn check(pass: &mut Pass<'_>) -> Result<Step> {
    if !pass.is_true(conditions::INITIALIZED) {
        return Ok(Step::Continue);
    }
    let Some(node) = pass.nodes().into_iter().next() else {
        return Ok(Step::Continue);
    };
    let problems = consistency_problems(&pass.status, &node);
    if problems.is_empty() {
        pass.set(
            conditions::CONSISTENT_STATE_FOUND,
            ConditionStatus::True,
            conditions::CONSISTENT_STATE_FOUND,
            "",
        );
        return Ok(Step::Continue);
    }
    let message = problems.join("; ");
    if pass.set(
        conditions::CONSISTENT_STATE_FOUND,
        ConditionStatus::False,
        "ConsistencyCheckFailed",
        &message,
    ) {
        pass.ctx
            .event(
                &pass.claim,
                Severity::Warning,
                "FailedConsistencyCheck",
                message,
            )
            .await;
    }
    Ok(Step::Continue)
}

/// Node capacity must be at least 90 % of what the cloud promised, per resource.
pub fn consistency_problems(status: &NodeClaimStatus, node: &Node) -> Vec<String> {
    use crate::state::quantity::parse_milli;
    let capacity = node
        .status
        .as_ref()
        .and_then(|s| s.capacity.clone())
        .unwrap_or_default();
    status
        .capacity
        .iter()
        .filter_map(|(name, expected)| {
            let expected = parse_milli(&expected.0)?;
            let actual = capacity.get(name).and_then(|q| parse_milli(&q.0)).unwrap_or(0);
            (expected > 0 && actual * 10 < expected * 9).then(|| {
                format!("expected {name} capacity of at least 90% of {expected}m, node reports {actual}m")
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::testing::*;

    #[test]
    fn consistency_flags_nodes_smaller_than_promised() {
        let claim = with_capacity(
            nodeclaim("c", "p", Some("exoscale://i")),
            &[("cpu", "4"), ("memory", "8Gi")],
        );
        let status = claim.status.unwrap();
        let fine = with_node_capacity(
            node("n", Some("exoscale://i"), &[]),
            &[("cpu", "4"), ("memory", "7.5Gi")],
        );
        assert!(consistency_problems(&status, &fine).is_empty());
        let small = with_node_capacity(
            node("n", Some("exoscale://i"), &[]),
            &[("cpu", "2"), ("memory", "8Gi")],
        );
        let problems = consistency_problems(&status, &small);
        assert_eq!(problems.len(), 1);
        assert!(problems[0].contains("cpu"));
    }
}
