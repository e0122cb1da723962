//! `explain node NAME` (or a NodeClaim's name): its NodePool, price and utilisation, each
//! disruption method's verdict on it (eligible within the budget, or what blocks it), and its
//! drift status.

use std::collections::BTreeMap;

use kube::ResourceExt;
use serde::Serialize;

use crate::apis::labels::{NODEPOOL_LABEL, conditions};
use crate::apis::{ConditionStatus, ConditionsExt};
use crate::disruption::command::Method;
use crate::disruption::methods::{DisruptionEvent, budget_mapping, eligible_candidates};
use crate::scheduling::labels::INSTANCE_TYPE;

use super::{Env, ExplainError, Live, node_price, priced, view_of};

/// One disruption method's verdict on the node.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MethodVerdict {
    pub method: String,
    pub eligible: bool,
    /// Why not, or (when eligible) what the NodePool's budget allows now.
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeExplanation {
    pub node: String,
    pub nodeclaim: Option<String>,
    pub nodepool: Option<String>,
    pub instance_type: Option<String>,
    pub price_per_hour: Option<f64>,
    /// Requested over allocatable, per resource (`cpu`, `memory`), 0..1.
    pub utilisation: BTreeMap<String, f64>,
    pub pods: usize,
    pub methods: Vec<MethodVerdict>,
    /// The NodeClaim's `Drifted` condition: its reason and message, when True.
    pub drifted: Option<String>,
    pub currency: String,
    pub warnings: Vec<String>,
}

fn method_name(m: Method) -> String {
    format!("{m:?}")
}

/// Explains the node named `name` (a Node, or a NodeClaim whose Node it finds).
pub async fn explain_node(
    live: &Live,
    env: &Env,
    name: &str,
) -> Result<NodeExplanation, ExplainError> {
    let index = &live.index;
    let claim = index.nodeclaim(name).or_else(|| {
        index
            .nodeclaims()
            .into_iter()
            .find(|c| c.status.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name))
    });
    let node_name = claim
        .as_ref()
        .and_then(|c| c.status.as_ref().and_then(|s| s.node_name.clone()))
        .unwrap_or_else(|| name.to_string());
    let node = index.node(&node_name);
    if node.is_none() && claim.is_none() {
        return Err(ExplainError::NotFound(format!("node or nodeclaim {name}")));
    }
    let super::Priced {
        pools,
        mut warnings,
    } = priced(live, env).await?;
    let labels = node
        .as_ref()
        .map(|n| n.labels().clone())
        .or_else(|| claim.as_ref().map(|c| c.labels().clone()))
        .unwrap_or_default();
    let price_per_hour = node_price(&pools, &labels);

    let pods = index.pods_on_node(&node_name);
    let view = view_of(live, env, pools);
    let state = view.node(&node_name);
    // The requests and allocatable the scheduler itself works with (init containers and pod
    // overhead included).
    let mut utilisation = BTreeMap::new();
    if let Some(existing) = state.map(|s| &s.scheduling) {
        for resource in ["cpu", "memory"] {
            let total = existing.allocatable.get(resource).milli();
            if total <= 0 {
                continue;
            }
            let requested: i128 = existing
                .pods
                .iter()
                .map(|p| p.requests.get(resource).milli())
                .sum();
            utilisation.insert(resource.to_string(), requested as f64 / total as f64);
        }
    }
    let mut methods = Vec::new();
    for method in Method::ORDER {
        let (eligible, events) = eligible_candidates(&view, method);
        let verdict = if let Some(c) = eligible.iter().find(|c| c.name == node_name) {
            let (budgets, _) = budget_mapping(&view, method.reason());
            let remaining = budgets.remaining(&c.node_pool);
            MethodVerdict {
                method: method_name(method),
                eligible: true,
                detail: format!(
                    "eligible; the NodePool's budget allows {remaining} more {:?} disruption(s) now",
                    method.reason()
                ),
            }
        } else {
            let said = events.iter().find_map(|e| match e {
                DisruptionEvent::Blocked { node, message, .. }
                | DisruptionEvent::Unconsolidatable { node, message, .. }
                    if *node == node_name =>
                {
                    Some(message.clone())
                }
                _ => None,
            });
            let detail = said.unwrap_or_else(|| match (method, state) {
                (_, None) => "not a Karpenter-managed node".to_string(),
                (Method::Drift | Method::StaticDrift, Some(s)) if s.drifted_since.is_none() => {
                    "not drifted".to_string()
                }
                (Method::Drift, Some(_)) => "its NodePool is static (StaticDrift replaces it)".into(),
                (Method::StaticDrift, Some(_)) => "its NodePool is not static".into(),
                (_, Some(s)) if !s.consolidatable => {
                    "not consolidatable yet: consolidateAfter has not elapsed since its pods last changed".into()
                }
                (Method::Emptiness, Some(_)) => "has pods that would have to move".into(),
                (_, Some(_)) => {
                    "empty nodes are left to Emptiness, or the NodePool's consolidationPolicy excludes it".into()
                }
            });
            MethodVerdict {
                method: method_name(method),
                eligible: false,
                detail,
            }
        };
        methods.push(verdict);
    }

    warnings.extend(live.unread.iter().cloned());
    let drifted = claim.as_ref().and_then(|c| {
        let condition = c
            .status
            .as_ref()?
            .conditions
            .get_condition(conditions::DRIFTED)?;
        (condition.status == ConditionStatus::True).then(|| {
            let mut text = condition.reason.clone();
            if !condition.message.is_empty() {
                text = format!("{text}: {}", condition.message);
            }
            // The provider's DriftDetected event names the field and both values.
            if let Some(note) = live.drift_notes.get(&c.name_any()) {
                text = format!("{text} ({note})");
            }
            text
        })
    });
    if node.is_none() {
        warnings.push(format!("nodeclaim {name} has no Node yet"));
    }
    Ok(NodeExplanation {
        node: node_name,
        nodeclaim: claim.map(|c| c.name_any()),
        nodepool: labels.get(NODEPOOL_LABEL).cloned(),
        instance_type: labels.get(INSTANCE_TYPE).cloned(),
        price_per_hour,
        utilisation,
        pods: pods.len(),
        methods,
        drifted,
        currency: env.currency.clone(),
        warnings,
    })
}
