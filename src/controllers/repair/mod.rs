//! Node repair (feature gate `NodeRepair`; karpenter-core §4.6): a managed Node whose condition
//! matches a provider repair policy for longer than its toleration gets its NodeClaim deleted
//! with an immediate termination deadline — unless more than 20 % of its NodePool's nodes are
//! unhealthy, when repair is blocked (a cluster-wide problem is not fixed by killing nodes).
//!
//! A per-Node reconciler, as upstream: a Node is looked at when it changes and requeued at the
//! instant its toleration ends, so a healthy cluster costs nothing between changes.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use kube::runtime::controller::Action;

use crate::apis::NodeClaim;
use crate::apis::labels::{NODECLAIM_TERMINATION_TIMESTAMP_ANNOTATION, NODEPOOL_LABEL};
use crate::cloudprovider::RepairPolicy;
use crate::operator::events::Severity;
use crate::operator::metrics::labels;
use crate::state::{ClusterIndex, node_provider_id};

use super::{Context, Result, absent_ok, ignore_not_found, patch_object};

/// How soon a blocked repair (or one waiting for the cluster state to sync) is looked at again.
pub const RECHECK: Duration = Duration::from_secs(30);

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

/// How many nodes the NodePool (by the node label; unlabelled nodes form one group) has, and
/// how many of them are unhealthy right now.
pub fn pool_health(
    index: &ClusterIndex,
    pool: Option<&str>,
    policies: &[RepairPolicy],
) -> (usize, usize) {
    index
        .nodes()
        .iter()
        .filter(|n| n.labels().get(NODEPOOL_LABEL).map(String::as_str) == pool)
        .fold((0, 0), |(total, bad), n| {
            (
                total + 1,
                bad + usize::from(unhealthy(n, policies).is_some()),
            )
        })
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
    // Another Karpenter's node is judged by its own repair policies, not ours.
    if claim.metadata.deletion_timestamp.is_some() || !index.manages_claim(&claim) {
        return Decision::Healthy;
    }
    let pool = node.labels().get(NODEPOOL_LABEL).map(String::as_str);
    let (total, bad) = pool_health(index, pool, policies);
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

/// Reconciles one Node: repairs it once its toleration has ended, else comes back then.
pub async fn reconcile(node: Arc<Node>, ctx: Arc<Context>) -> Result<Action> {
    let policies = ctx.cloud.repair_policies();
    if policies.is_empty() {
        return Ok(Action::await_change());
    }
    if !ctx.cluster.synced() {
        return Ok(Action::requeue(RECHECK));
    }
    let now = ctx.now();
    let decision = {
        let index = ctx.cluster.read();
        // The stored copy: the change that triggered this reconcile may be older.
        let current = index.node(&node.name_any()).unwrap_or(node.clone());
        decide(&index, &current, &policies, now)
    };
    match decision {
        Decision::Healthy => Ok(Action::await_change()),
        Decision::WaitUntil(at) => {
            let secs = at.as_second().saturating_sub(now.as_second());
            Ok(Action::requeue(Duration::from_secs(
                u64::try_from(secs).unwrap_or(0).max(1),
            )))
        }
        Decision::Blocked { unhealthy, total } => {
            ctx.event(node.as_ref(), Severity::Warning, "NodeRepairBlocked",
                format!("Cannot repair: {unhealthy} of {total} nodes of the NodePool are unhealthy (more than 20%)")).await;
            // Other nodes recovering (or going) unblocks this one; their changes do not
            // trigger this Node, so look again.
            Ok(Action::requeue(RECHECK))
        }
        Decision::Repair {
            nodeclaim,
            condition,
        } => {
            tracing::info!(node = %node.name_any(), %nodeclaim, %condition, "repairing unhealthy node");
            let api: Api<NodeClaim> = Api::all(ctx.client.clone());
            // Deadline now: pods are deleted at once, PDBs and do-not-disrupt do not apply.
            let patch = serde_json::json!({"metadata": {"annotations": {NODECLAIM_TERMINATION_TIMESTAMP_ANNOTATION: now.to_string()}}});
            if absent_ok(patch_object(&api, &nodeclaim, patch, None).await)?.is_none() {
                return Ok(Action::await_change());
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
            Ok(Action::await_change())
        }
    }
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
            decide(&index, &sick, &policies, ts(60).0),
            Decision::WaitUntil(ts(900).0)
        );
        assert_eq!(
            decide(&index, &sick, &policies, ts(900).0),
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
            decide(&index, &sick, &policies, ts(900).0),
            Decision::Blocked {
                unhealthy: 3,
                total: 10
            }
        );
    }

    /// Another Karpenter's unhealthy node is its to repair: ours never deletes its claim.
    #[test]
    fn another_providers_nodes_are_not_repaired() {
        let policies = default_repair_policies();
        let mut index = crate::state::testing::managed_index();
        let claim = registered(nodeclaim("theirs", "kwok", Some("kwok://0")));
        index.apply_nodeclaim(crate::state::testing::foreign(claim));
        index.apply_node(with_condition(
            node("n0", Some("kwok://0"), &[]),
            "Ready",
            "False",
            0,
        ));
        let sick = index.node("n0").unwrap();
        assert_eq!(
            decide(&index, &sick, &policies, ts(900).0),
            Decision::Healthy
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
