//! Node repair (feature gate `NodeRepair`; karpenter-core §4.6): a managed Node whose condition
//! matches a provider repair policy for longer than its toleration gets its NodeClaim deleted
//! with an immediate termination deadline — unless more than 20 % of its NodePool's nodes are
//! unhealthy, when repair is blocked (a cluster-wide problem is not fixed by killing nodes).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};

use crate::apis::NodeClaim;
use crate::apis::labels::{NODECLAIM_TERMINATION_TIMESTAMP_ANNOTATION, NODEPOOL_LABEL};
use crate::cloudprovider::RepairPolicy;
use crate::operator::events::Severity;
use crate::operator::metrics::labels;
use crate::state::{ClusterIndex, node_provider_id};

use super::{Context, Result, absent_ok, ignore_not_found, patch_object};

pub const INTERVAL: Duration = Duration::from_secs(30);

/// The unhealthy condition of a node and when its toleration ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unhealthy {
    pub condition: String,
    pub repair_at: Timestamp,
}

/// The earliest repair deadline among the policies the node's conditions match.
pub fn unhealthy(node: &Node, policies: &[RepairPolicy]) -> Option<Unhealthy> {
    let node_conditions = node.status.as_ref()?.conditions.as_ref()?;
    node_conditions
        .iter()
        .filter_map(|c| {
            let policy = policies
                .iter()
                .filter(|p| p.condition_type == c.type_ && p.condition_status == c.status)
                .min_by_key(|p| p.toleration)?;
            let since = c.last_transition_time.as_ref()?.0;
            let repair_at = since.checked_add(jiff_secs(policy.toleration)).ok()?;
            Some(Unhealthy {
                condition: c.type_.clone(),
                repair_at,
            })
        })
        .min_by_key(|u| u.repair_at)
}

fn jiff_secs(d: Duration) -> k8s_openapi::jiff::SignedDuration {
    k8s_openapi::jiff::SignedDuration::from_secs(d.as_secs() as i64)
}

/// Upstream threshold: healthy while `unhealthy <= ceil(20 % of nodes)`.
pub fn repair_allowed(total_nodes: usize, unhealthy_nodes: usize) -> bool {
    let threshold = (total_nodes * 20).div_ceil(100);
    unhealthy_nodes <= threshold
}

/// Per NodePool (by the node label; `None` for unlabelled nodes): how many nodes it has and
/// how many of them are unhealthy right now. Computed once per pass, not once per node.
pub fn pool_health(
    index: &ClusterIndex,
    policies: &[RepairPolicy],
) -> BTreeMap<Option<String>, (usize, usize)> {
    let mut out: BTreeMap<Option<String>, (usize, usize)> = BTreeMap::new();
    for node in index.nodes() {
        let entry = out
            .entry(node.labels().get(NODEPOOL_LABEL).cloned())
            .or_default();
        entry.0 += 1;
        if unhealthy(&node, policies).is_some() {
            entry.1 += 1;
        }
    }
    out
}

/// What to do about one node.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    Healthy,
    WaitUntil(Timestamp),
    Blocked {
        unhealthy: usize,
        total: usize,
    },
    Repair {
        nodeclaim: String,
        condition: String,
    },
}

pub fn decide(
    index: &ClusterIndex,
    health: &BTreeMap<Option<String>, (usize, usize)>,
    node: &Node,
    policies: &[RepairPolicy],
    now: Timestamp,
) -> Decision {
    let Some(problem) = unhealthy(node, policies) else {
        return Decision::Healthy;
    };
    if problem.repair_at > now {
        return Decision::WaitUntil(problem.repair_at);
    }
    let Some(claim) = node_provider_id(node).and_then(|pid| index.nodeclaim_by_provider_id(pid))
    else {
        return Decision::Healthy;
    };
    if claim.metadata.deletion_timestamp.is_some() {
        return Decision::Healthy;
    }
    let pool = node.labels().get(NODEPOOL_LABEL).cloned();
    let (total, bad) = health.get(&pool).copied().unwrap_or((1, 1));
    if !repair_allowed(total, bad) {
        return Decision::Blocked {
            unhealthy: bad,
            total,
        };
    }
    Decision::Repair {
        nodeclaim: claim.name_any(),
        condition: problem.condition,
    }
}

/// One pass over all nodes; returns when the next pass is due: at the earliest toleration
/// that ends before [`INTERVAL`] (upstream requeues a Node at its toleration's expiry), else
/// after [`INTERVAL`].
pub async fn repair_once(ctx: &Context) -> Result<Duration> {
    let policies = ctx.cloud.repair_policies();
    if policies.is_empty() || !ctx.cluster.synced() {
        return Ok(INTERVAL);
    }
    let now = ctx.now();
    let decisions: Vec<(Arc<Node>, Decision)> = {
        let index = ctx.cluster.read();
        let health = pool_health(&index, &policies);
        index
            .nodes()
            .into_iter()
            .map(|n| {
                let d = decide(&index, &health, &n, &policies, now);
                (n, d)
            })
            .collect()
    };
    let next = next_pass(&decisions, now);
    let api: Api<NodeClaim> = Api::all(ctx.client.clone());
    for (node, decision) in decisions {
        match decision {
            Decision::Blocked { unhealthy, total } => {
                ctx.event(node.as_ref(), Severity::Warning, "NodeRepairBlocked",
                    format!("Cannot repair: {unhealthy} of {total} nodes of the NodePool are unhealthy (more than 20%)")).await;
            }
            Decision::Repair {
                nodeclaim,
                condition,
            } => {
                tracing::info!(node = %node.name_any(), %nodeclaim, %condition, "repairing unhealthy node");
                // Deadline now: pods are deleted at once, PDBs and do-not-disrupt do not apply.
                let patch = serde_json::json!({"metadata": {"annotations": {NODECLAIM_TERMINATION_TIMESTAMP_ANNOTATION: now.to_string()}}});
                if absent_ok(patch_object(&api, &nodeclaim, patch, None).await)?.is_none() {
                    continue;
                }
                ignore_not_found(api.delete(&nodeclaim, &DeleteParams::default()).await)?;
                let pool = node
                    .labels()
                    .get(NODEPOOL_LABEL)
                    .cloned()
                    .unwrap_or_default();
                ctx.metrics.nodeclaim_disrupted("unhealthy", &pool, "");
                ctx.metrics
                    .nodeclaims_unhealthy_disrupted
                    .get_or_create(&labels([("condition", &condition), ("nodepool", &pool)]))
                    .inc();
            }
            Decision::Healthy | Decision::WaitUntil(_) => {}
        }
    }
    Ok(next)
}

/// Time until the earliest toleration ends (at least a second), at most [`INTERVAL`].
fn next_pass(decisions: &[(Arc<Node>, Decision)], now: Timestamp) -> Duration {
    decisions
        .iter()
        .filter_map(|(_, d)| match d {
            Decision::WaitUntil(at) => Some(at.as_second().saturating_sub(now.as_second())),
            _ => None,
        })
        .min()
        .map_or(INTERVAL, |secs| {
            Duration::from_secs(u64::try_from(secs).unwrap_or(0).max(1)).min(INTERVAL)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloudprovider::default_repair_policies;
    use crate::state::testing::*;
    use k8s_openapi::api::core::v1::NodeCondition;

    fn with_condition(mut n: Node, type_: &str, status: &str, since: i64) -> Node {
        n.status.get_or_insert_with(Default::default).conditions = Some(vec![NodeCondition {
            type_: type_.into(),
            status: status.into(),
            last_transition_time: Some(ts(since)),
            ..Default::default()
        }]);
        n.labels_mut().insert(NODEPOOL_LABEL.into(), "pool".into());
        n
    }

    #[test]
    fn the_next_pass_comes_when_the_earliest_toleration_ends() {
        let now = Timestamp::from_second(1_000).unwrap();
        let at = |s: i64| Timestamp::from_second(s).unwrap();
        let node = Arc::new(Node::default());
        let waiting = |s: i64| (node.clone(), Decision::WaitUntil(at(s)));
        assert_eq!(next_pass(&[], now), INTERVAL);
        assert_eq!(
            next_pass(
                &[
                    waiting(1_020),
                    waiting(1_007),
                    (node.clone(), Decision::Healthy)
                ],
                now
            ),
            Duration::from_secs(7)
        );
        assert_eq!(next_pass(&[waiting(5_000)], now), INTERVAL);
        assert_eq!(next_pass(&[waiting(1_000)], now), Duration::from_secs(1));
    }

    #[test]
    fn threshold_is_twenty_percent_rounded_up() {
        assert!(repair_allowed(10, 2));
        assert!(!repair_allowed(10, 3));
        assert!(repair_allowed(1, 1));
        assert!(repair_allowed(4, 1));
        assert!(!repair_allowed(4, 2));
    }

    #[test]
    fn repairs_after_toleration_unless_too_many_are_sick() {
        let policies = default_repair_policies();
        let mut index = ClusterIndex::default();
        for i in 0..10 {
            let pid = format!("exoscale://{i}");
            index.apply_nodeclaim(registered(nodeclaim(&format!("c{i}"), "pool", Some(&pid))));
            let n = if i == 0 {
                with_condition(node(&format!("n{i}"), Some(&pid), &[]), "Ready", "False", 0)
            } else {
                with_condition(node(&format!("n{i}"), Some(&pid), &[]), "Ready", "True", 0)
            };
            index.apply_node(n);
        }
        let sick = index.node("n0").unwrap();
        assert_eq!(
            decide(
                &index,
                &pool_health(&index, &policies),
                &sick,
                &policies,
                ts(60).0
            ),
            Decision::WaitUntil(ts(900).0)
        );
        assert_eq!(
            decide(
                &index,
                &pool_health(&index, &policies),
                &sick,
                &policies,
                ts(900).0
            ),
            Decision::Repair {
                nodeclaim: "c0".into(),
                condition: "Ready".into()
            }
        );
        for i in 1..3 {
            index.apply_node(with_condition(
                node(&format!("n{i}"), Some(&format!("exoscale://{i}")), &[]),
                "Ready",
                "False",
                0,
            ));
        }
        assert_eq!(
            decide(
                &index,
                &pool_health(&index, &policies),
                &sick,
                &policies,
                ts(900).0
            ),
            Decision::Blocked {
                unhealthy: 3,
                total: 10
            }
        );
    }

    #[test]
    fn shortest_matching_toleration_wins() {
        let policies = vec![
            RepairPolicy::new("Ready", "False", Duration::from_secs(900)),
            RepairPolicy::new("NetworkUnavailable", "True", Duration::from_secs(300)),
        ];
        let mut n = with_condition(node("n", None, &[]), "Ready", "False", 0);
        n.status
            .as_mut()
            .unwrap()
            .conditions
            .as_mut()
            .unwrap()
            .push(NodeCondition {
                type_: "NetworkUnavailable".into(),
                status: "True".into(),
                last_transition_time: Some(ts(100)),
                ..Default::default()
            });
        assert_eq!(
            unhealthy(&n, &policies).unwrap(),
            Unhealthy {
                condition: "NetworkUnavailable".into(),
                repair_at: ts(400).0
            }
        );
    }
}
