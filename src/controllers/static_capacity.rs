//! Static NodePools (`spec.replicas`, feature gate `StaticCapacity`; upstream's
//! `static.provisioning` and `static.deprovisioning`): the NodePool keeps exactly `replicas`
//! NodeClaims, whatever the pods. Missing ones are created from the template (bounded by
//! `limits.nodes`, and only while the NodePool is Ready); extra ones are deleted — never-launched
//! NodeClaims first, then empty nodes, then the cheapest to disrupt, nodes with a
//! `do-not-disrupt` pod last — as far as the NodePool's disruption budgets allow. Drifted static
//! nodes are replaced one for one by the disruption controller (`Method::StaticDrift`).
//!
//! [`plan`] is the pure decision; [`reconcile`] gathers its input from the cluster state and acts.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::controller::Action;

use crate::apis::labels::{DISRUPTED_TAINT_KEY, DO_NOT_DISRUPT_ANNOTATION, conditions};
use crate::apis::nodepool::{Budget, DisruptionReason};
use crate::apis::{ConditionsExt, NodeClaim, NodePool};
use crate::disruption::budgets::{BudgetCounts, PoolBudget};
use crate::operator::metrics::labels;
use crate::provisioning::input::{nodeclaim_to_create, pools_with_types, usage_of};
use crate::provisioning::template::nodepool_template;
use crate::scheduling::NewNodeClaim;
use crate::state::{ClusterIndex, nodeclaim_provider_id, pods::is_reschedulable};

use super::{Context, FIELD_MANAGER, Result, ignore_not_found};

/// Upstream requeues static NodePools every minute besides their change events.
pub const RESYNC: Duration = Duration::from_secs(60);
/// How soon a NodePool at its node limit, or waiting for budget, is looked at again.
pub const RECHECK: Duration = Duration::from_secs(30);
/// How soon a NodePool held back by a NodeClaim create whose answer was lost looks again.
const LOST_CREATE_RECHECK: Duration = Duration::from_secs(2);

/// One NodeClaim of a static NodePool, reduced to what the decision needs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StaticClaim {
    pub name: String,
    /// Has a provider ID: an instance exists (or existed).
    pub resolved: bool,
    /// Has a deletion timestamp: on its way out, no longer counted.
    pub deleting: bool,
    /// Its Node carries the `karpenter.sh/disrupted` taint: a disruption command (static drift)
    /// is replacing it.
    pub disrupting: bool,
    pub initialized: bool,
    pub ready: bool,
    /// Pods that would need a new home if the node went away.
    pub reschedulable_pods: usize,
    /// A pod on the node says `karpenter.sh/do-not-disrupt: "true"`.
    pub do_not_disrupt: bool,
}

/// What one pass does for a static NodePool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Exactly `replicas` NodeClaims (counting those being replaced).
    Steady,
    /// Create this many NodeClaims.
    Create(usize),
    /// Below `replicas`, but `limits.nodes` allows no more.
    LimitReached { missing: usize },
    /// Delete these NodeClaims, in this order.
    Delete(Vec<String>),
    /// Above `replicas`, but the budgets allow no deletion now.
    WaitingForBudget { excess: usize },
}

/// The pure decision for one static NodePool.
pub fn plan(
    replicas: i64,
    node_limit: Option<i64>,
    budgets: &[Budget],
    now: DateTime<Utc>,
    claims: &[StaticClaim],
) -> Plan {
    let replicas = replicas.max(0) as usize;
    let counted: Vec<&StaticClaim> = claims.iter().filter(|c| !c.deleting).collect();
    let active = counted.iter().filter(|c| !c.disrupting).count();
    if counted.len() < replicas {
        let missing = replicas - counted.len();
        let room = node_limit.map_or(usize::MAX, |limit| {
            (limit.max(0) as usize).saturating_sub(counted.len())
        });
        return match missing.min(room) {
            0 => Plan::LimitReached { missing },
            n => Plan::Create(n),
        };
    }
    if active <= replicas {
        return Plan::Steady;
    }
    let excess = active - replicas;
    let mut candidates: Vec<&StaticClaim> = counted.into_iter().filter(|c| !c.disrupting).collect();
    // Never launched first (they hold nothing), then empty nodes, then the cheapest to move;
    // a node with a do-not-disrupt pod goes last.
    candidates.sort_by(|a, b| {
        let key = |c: &StaticClaim| (c.resolved, c.do_not_disrupt, c.reschedulable_pods);
        key(a).cmp(&key(b)).then_with(|| a.name.cmp(&b.name))
    });
    let mut budget = scale_down_budget(budgets, now, claims);
    let mut picked = Vec::new();
    for c in candidates.into_iter().take(excess) {
        if c.resolved {
            if budget == 0 {
                break;
            }
            budget -= 1;
        }
        picked.push(c.name.clone());
    }
    if picked.is_empty() {
        Plan::WaitingForBudget { excess }
    } else {
        Plan::Delete(picked)
    }
}

/// Nodes a scale-down may remove now: the NodePool's budgets that apply to every reason (a
/// scale-down is none of upstream's three reasons), counted as the disruption controller counts.
fn scale_down_budget(budgets: &[Budget], now: DateTime<Utc>, claims: &[StaticClaim]) -> usize {
    let general: Vec<Budget> = budgets
        .iter()
        .filter(|b| b.reasons.as_ref().is_none_or(Vec::is_empty))
        .cloned()
        .collect();
    let counts =
        claims
            .iter()
            .filter(|c| c.initialized)
            .fold(BudgetCounts::default(), |mut counts, c| {
                counts.nodes += 1;
                if !c.ready || c.deleting || c.disrupting {
                    counts.disrupting += 1;
                }
                counts
            });
    // Any reason: only budgets without `reasons` are passed.
    let (budget, _errors) = PoolBudget::compute(&general, counts, now, DisruptionReason::Empty);
    budget.remaining
}

/// The static NodePool's NodeClaims, as [`plan`] sees them.
pub fn static_claims(index: &ClusterIndex, pool: &str) -> Vec<StaticClaim> {
    index
        .nodeclaims()
        .into_iter()
        .filter(|c| {
            c.labels()
                .get(crate::apis::labels::NODEPOOL_LABEL)
                .map(String::as_str)
                == Some(pool)
        })
        .map(|claim| {
            let provider_id = nodeclaim_provider_id(&claim);
            let node = provider_id.and_then(|p| index.nodes_by_provider_id(p).into_iter().next());
            let pods = node
                .as_ref()
                .map(|n| index.pods_on_node(&n.name_any()))
                .unwrap_or_default();
            let conds = claim.status.as_ref().map(|s| &s.conditions);
            StaticClaim {
                name: claim.name_any(),
                resolved: provider_id.is_some(),
                deleting: claim.metadata.deletion_timestamp.is_some(),
                disrupting: node.as_ref().is_some_and(|n| {
                    n.spec
                        .as_ref()
                        .and_then(|s| s.taints.as_ref())
                        .is_some_and(|t| t.iter().any(|t| t.key == DISRUPTED_TAINT_KEY))
                }),
                initialized: conds.is_some_and(|c| c.is_true(conditions::INITIALIZED)),
                ready: node.as_deref().is_some_and(crate::state::node_ready),
                reschedulable_pods: pods.iter().filter(|p| is_reschedulable(p)).count(),
                do_not_disrupt: pods.iter().any(|p| {
                    p.annotations()
                        .get(DO_NOT_DISRUPT_ANNOTATION)
                        .map(String::as_str)
                        == Some("true")
                }),
            }
        })
        .collect()
}

fn node_limit(pool: &NodePool) -> Option<i64> {
    let limit = pool.spec.limits.as_ref()?.get("nodes")?;
    crate::scheduling::Quantity::parse(&limit.0)
        .ok()
        .map(|q| q.milli() as i64 / 1000)
}

/// One pass for one NodePool (a kube-rs Controller over NodePools, woken by their NodeClaims).
pub async fn reconcile(pool: Arc<NodePool>, ctx: Arc<Context>) -> Result<Action> {
    let Some(replicas) = pool.spec.replicas else {
        return Ok(Action::await_change());
    };
    if !ctx.feature_gates.static_capacity
        || pool.metadata.deletion_timestamp.is_some()
        || !ctx.cloud.serves(&pool.spec.template.spec.node_class_ref)
    {
        return Ok(Action::await_change());
    }
    // A partial view would under-count the NodeClaims and create too many.
    if !ctx.cluster.synced() {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let name = pool.name_any();
    let decision = {
        let index = ctx.cluster.read();
        let claims = static_claims(&index, &name);
        let now = DateTime::<Utc>::from_timestamp(ctx.clock.now_unix(), 0).unwrap_or_default();
        plan(
            replicas,
            node_limit(&pool),
            &pool.spec.disruption.budgets,
            now,
            &claims,
        )
    };
    match decision {
        Plan::Steady => Ok(Action::requeue(RESYNC)),
        Plan::Create(count) => create(&pool, count, &ctx).await,
        Plan::LimitReached { missing } => {
            tracing::info!(nodepool = %name, missing, "static NodePool: node limit reached");
            Ok(Action::requeue(RECHECK))
        }
        Plan::Delete(names) => {
            let api: Api<NodeClaim> = Api::all(ctx.client.clone());
            for claim in &names {
                ignore_not_found(api.delete(claim, &DeleteParams::default()).await)?;
                tracing::info!(nodepool = %name, nodeclaim = %claim, replicas,
                    "static NodePool above its replicas: deleted NodeClaim");
            }
            Ok(Action::requeue(RESYNC))
        }
        Plan::WaitingForBudget { excess } => {
            tracing::debug!(nodepool = %name, excess, "static NodePool above its replicas; its disruption budgets allow no deletion now");
            Ok(Action::requeue(RECHECK))
        }
    }
}

/// Creates `count` NodeClaims from the template, over the instance types the cloud offers it.
async fn create(pool: &Arc<NodePool>, count: usize, ctx: &Context) -> Result<Action> {
    let name = pool.name_any();
    if !pool.is_ready() {
        // Its status change wakes this reconciler again.
        return Ok(Action::requeue(RESYNC));
    }
    let (found, failed) =
        pools_with_types(ctx.cloud.as_ref(), &ctx.metrics, vec![pool.clone()]).await;
    if let Some((_, error)) = failed.first() {
        tracing::warn!(nodepool = %name, %error, "static NodePool: no instance types");
        return Ok(Action::requeue(RECHECK));
    }
    let Some((merged, types)) = found.into_iter().next() else {
        return Ok(Action::requeue(RECHECK));
    };
    let usage = usage_of(&ctx.cluster.read(), &name);
    let template = match nodepool_template(&merged, usage) {
        Ok(t) => t,
        Err(error) => {
            tracing::warn!(nodepool = %name, %error, "static NodePool: bad template");
            return Ok(Action::requeue(RECHECK));
        }
    };
    let Some(claim) = NewNodeClaim::from_template(&template, &types) else {
        tracing::warn!(nodepool = %name, "static NodePool: no instance type satisfies the template");
        return Ok(Action::requeue(RECHECK));
    };
    // A create whose answer was lost may have made one of the missing replicas already.
    if !ctx
        .lost_creates
        .caught_up(&ctx.client, &ctx.cluster, 1)
        .await
    {
        return Ok(Action::requeue(LOST_CREATE_RECHECK));
    }
    let api: Api<NodeClaim> = Api::all(ctx.client.clone());
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    for _ in 0..count {
        let object = nodeclaim_to_create(ctx.cloud.as_ref(), pool.clone(), &claim);
        let made = api.create(&params, &object).await.inspect_err(|e| {
            ctx.lost_creates.failed(e);
        })?;
        if let Some(uid) = made.metadata.uid.as_deref() {
            ctx.cloud.nodeclaim_created(uid);
        }
        ctx.metrics
            .nodeclaims_created
            .get_or_create(&labels([
                ("reason", "provisioned"),
                ("nodepool", &name),
                ("min_values_relaxed", "false"),
            ]))
            .inc();
        tracing::info!(nodepool = %name, nodeclaim = %made.name_any(), "static NodePool below its replicas: created NodeClaim");
        // Counted at once, so a wake-up before the watch delivers it does not create it again.
        ctx.cluster
            .update(|index| index.apply_created_nodeclaim(made));
    }
    Ok(Action::requeue(RESYNC))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(name: &str) -> StaticClaim {
        StaticClaim {
            name: name.into(),
            resolved: true,
            initialized: true,
            ready: true,
            ..Default::default()
        }
    }

    fn budget(nodes: &str) -> Budget {
        serde_json::from_value(serde_json::json!({"nodes": nodes})).unwrap()
    }

    fn now() -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000, 0).unwrap()
    }

    #[test]
    fn missing_replicas_are_created_within_the_node_limit() {
        let claims = [claim("a")];
        assert_eq!(plan(3, None, &[], now(), &claims), Plan::Create(2));
        assert_eq!(plan(3, Some(2), &[], now(), &claims), Plan::Create(1));
        assert_eq!(
            plan(3, Some(1), &[], now(), &claims),
            Plan::LimitReached { missing: 2 }
        );
        // A deleting NodeClaim no longer counts: its replacement is created at once.
        let mut gone = claim("b");
        gone.deleting = true;
        assert_eq!(
            plan(2, None, &[], now(), &[claim("a"), gone]),
            Plan::Create(1)
        );
    }

    #[test]
    fn a_node_being_replaced_counts_until_it_is_deleted() {
        let mut old = claim("old");
        old.disrupting = true;
        // Static drift launched "new" for "old": 2 claims for 2 replicas... plus one.
        let claims = [claim("a"), claim("new"), old];
        assert_eq!(plan(2, None, &[], now(), &claims), Plan::Steady);
    }

    #[test]
    fn scale_down_removes_unlaunched_then_empty_then_cheapest_and_do_not_disrupt_last() {
        let mut busy = claim("busy");
        busy.reschedulable_pods = 5;
        let mut light = claim("light");
        light.reschedulable_pods = 1;
        let mut protected = claim("protected");
        protected.do_not_disrupt = true;
        let empty = claim("empty");
        let mut unlaunched = claim("unlaunched");
        unlaunched.resolved = false;
        unlaunched.initialized = false;
        let claims = [busy, protected, light, empty, unlaunched];
        assert_eq!(
            plan(1, None, &[], now(), &claims),
            Plan::Delete(vec![
                "unlaunched".into(),
                "empty".into(),
                "light".into(),
                "busy".into()
            ])
        );
    }

    #[test]
    fn scale_down_stays_within_the_budgets() {
        let claims: Vec<_> = ["a", "b", "c", "d"].into_iter().map(claim).collect();
        // One node at a time.
        assert_eq!(
            plan(1, None, &[budget("1")], now(), &claims),
            Plan::Delete(vec!["a".into()])
        );
        // A node already going away uses the budget up.
        let mut claims = claims;
        claims[0].deleting = true;
        assert_eq!(
            plan(1, None, &[budget("1")], now(), &claims),
            Plan::WaitingForBudget { excess: 2 }
        );
        // A budget for another reason does not limit a scale-down.
        let drift_only: Budget =
            serde_json::from_value(serde_json::json!({"nodes": "0", "reasons": ["Drifted"]}))
                .unwrap();
        assert_eq!(
            plan(1, None, &[drift_only], now(), &claims),
            Plan::Delete(vec!["b".into(), "c".into()])
        );
    }

    #[test]
    fn unlaunched_claims_go_without_budget() {
        let mut unlaunched = claim("u");
        unlaunched.resolved = false;
        unlaunched.initialized = false;
        let claims = [claim("a"), unlaunched];
        assert_eq!(
            plan(1, None, &[budget("0")], now(), &claims),
            Plan::Delete(vec!["u".into()])
        );
        assert_eq!(plan(2, None, &[budget("0")], now(), &claims), Plan::Steady);
    }
}
