//! The NodePool controller: hash annotations (and their migration to NodeClaims when the hash
//! version changes), status counters from cluster state, NodeClass readiness, validation and
//! registration health.

use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;

use crate::apis::labels::{NODEPOOL_HASH_ANNOTATION, NODEPOOL_HASH_VERSION_ANNOTATION, conditions};
use crate::apis::{ConditionsExt, NodeClaim, NodePool, NodePoolStatus};
use crate::controllers::{Context, Result, absent_ok, patch_object, patch_status};
use crate::operator::metrics::labels;
use crate::state::quantity::parse_milli;

use super::cost::pool_cost;
use super::hash::{hash_annotations, needs_hash_migration};
use super::status::{desired_status, epoch};
use crate::provisioning::input::pools_with_types;

/// At most one status write per NodePool in this long when only its counts (`resources`,
/// `nodes`) changed, as upstream's counter, which polls every 5 s: during a 500-node burst every
/// NodeClaim change re-counted and wrote (1 285 writes in two minutes). Condition changes are
/// written at once.
pub const COUNT_WRITE_INTERVAL: Duration = Duration::from_secs(5);

/// When each NodePool's status was last written by this process.
#[derive(Default)]
pub struct StatusWrites {
    last: std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>,
}

impl StatusWrites {
    /// How long to wait before writing a status that differs from `current` only in its counts;
    /// `None`: write now.
    fn defer(
        &self,
        pool: &str,
        current: Option<&NodePoolStatus>,
        desired: &NodePoolStatus,
        now: std::time::Instant,
    ) -> Option<Duration> {
        let current = current?;
        let counts_only = NodePoolStatus {
            resources: current.resources.clone(),
            nodes: current.nodes,
            ..desired.clone()
        } == *current;
        if !counts_only {
            return None;
        }
        let last = *self
            .last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(pool)?;
        COUNT_WRITE_INTERVAL
            .checked_sub(now.saturating_duration_since(last))
            .filter(|wait| !wait.is_zero())
    }

    fn written(&self, pool: &str, now: std::time::Instant) {
        self.last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(pool.to_string(), now);
    }
}

pub async fn reconcile(pool: Arc<NodePool>, ctx: Arc<Context>) -> Result<Action> {
    // Another Karpenter's pool (its NodeClass is of a kind we do not serve): its hash, status
    // and counts are that Karpenter's to write; ours would call its NodeClass missing.
    if pool.metadata.deletion_timestamp.is_some()
        || !ctx.cloud.serves(&pool.spec.template.spec.node_class_ref)
    {
        return Ok(Action::await_change());
    }
    let name = pool.name_any();
    let api: Api<NodePool> = Api::all(ctx.client.clone());

    // Hash annotations.
    let wanted = hash_annotations(&pool);
    let stale = wanted
        .iter()
        .any(|(k, v)| pool.annotations().get(k) != Some(v));
    if stale {
        let version_changed =
            pool.annotations().get(NODEPOOL_HASH_VERSION_ANNOTATION) != Some(&wanted[1].1);
        patch_object(&api, &name, serde_json::json!({"metadata": {"annotations": {
            NODEPOOL_HASH_ANNOTATION: wanted[0].1, NODEPOOL_HASH_VERSION_ANNOTATION: wanted[1].1,
        }}}), None).await?;
        if version_changed {
            migrate_claims(&ctx, &name, &wanted).await?;
        }
    }

    // Status.
    // From the provider's NodeClass watch: no API call per reconcile. Before its first list a
    // missing NodeClass is unknown, not absent: no status from it.
    if !ctx.cloud.nodeclasses_synced() {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let nodeclass = ctx.cloud.nodeclass(&pool.spec.template.spec.node_class_ref);
    let usage = ctx.cluster.read().nodepool_usage(&name);
    let health = ctx
        .registration_health
        .verdict(&name, &epoch(&pool, nodeclass.as_ref()));
    let status = desired_status(&pool, nodeclass.as_ref(), &usage, health, ctx.now());
    if Some(&status) != pool.status.as_ref() {
        let now = std::time::Instant::now();
        if let Some(wait) =
            ctx.nodepool_status_writes
                .defer(&name, pool.status.as_ref(), &status, now)
        {
            return Ok(Action::requeue(wait));
        }
        patch_status(&api, &pool, &status).await?;
        ctx.nodepool_status_writes.written(&name, now);
    }
    for (resource, quantity) in &usage.resources {
        if let Some(milli) = parse_milli(&quantity.0) {
            ctx.metrics
                .nodepools_usage
                .get_or_create(&labels([("nodepool", &name), ("resource_type", resource)]))
                .set(milli as f64 / 1000.0);
        }
    }
    for (resource, quantity) in pool.spec.limits.iter().flatten() {
        if let Some(milli) = parse_milli(&quantity.0) {
            ctx.metrics
                .nodepools_limit
                .get_or_create(&labels([("nodepool", &name), ("resource_type", resource)]))
                .set(milli as f64 / 1000.0);
        }
    }
    publish_cost(&pool, &ctx).await;
    Ok(Action::requeue(ctx.timings.nodepool_resync))
}

/// `karpenter_nodepools_cost_total` from the instance types the cloud offers the pool now.
async fn publish_cost(pool: &Arc<NodePool>, ctx: &Context) {
    let name = pool.name_any();
    let (found, failed) =
        pools_with_types(ctx.cloud.as_ref(), &ctx.metrics, vec![pool.clone()]).await;
    let claims = ctx.cluster.read().nodeclaims_of_nodepool(&name);
    let cost = match (found.first(), failed.first()) {
        (Some((_, types)), _) => pool_cost(&claims, types),
        (None, Some((_, error))) => {
            tracing::debug!(nodepool = %name, %error, "no instance types to price the NodePool with");
            pool_cost(&claims, &[])
        }
        (None, None) => return,
    };
    let pool_label = labels([("nodepool", &name)]);
    ctx.metrics
        .nodepools_cost
        .get_or_create(&pool_label)
        .set(cost.per_hour);
    let new_errors = ctx.cost.new_errors(&name, &cost.unpriced);
    if new_errors > 0 {
        tracing::warn!(nodepool = %name, nodeclaims = ?cost.unpriced, "NodeClaims without a known price are left out of the NodePool's cost");
        ctx.metrics
            .nodepools_cost_errors
            .get_or_create(&pool_label)
            .inc_by(new_errors as u64);
    }
}

/// Rewrites hash annotations of this pool's non-drifted NodeClaims after a hash-version bump,
/// so the new hash algorithm does not drift every node at once.
async fn migrate_claims(ctx: &Context, pool: &str, wanted: &[(String, String); 2]) -> Result<()> {
    let api: Api<NodeClaim> = Api::all(ctx.client.clone());
    let claims = ctx.cluster.read().nodeclaims_of_nodepool(pool);
    for claim in claims {
        let drifted = claim
            .status
            .as_ref()
            .is_some_and(|s| s.conditions.is_true(conditions::DRIFTED));
        let version = claim
            .annotations()
            .get(NODEPOOL_HASH_VERSION_ANNOTATION)
            .map(String::as_str);
        if needs_hash_migration(version, drifted) {
            absent_ok(patch_object(&api, &claim.name_any(), serde_json::json!({"metadata": {"annotations": {
                NODEPOOL_HASH_ANNOTATION: wanted[0].1, NODEPOOL_HASH_VERSION_ANNOTATION: wanted[1].1,
            }}}), None).await)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::ConditionStatus;

    fn status(nodes: i64, ready: ConditionStatus) -> NodePoolStatus {
        let mut s = NodePoolStatus {
            nodes,
            ..NodePoolStatus::default()
        };
        s.conditions.set_condition(
            conditions::READY,
            ready,
            "Ready",
            "",
            None,
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        );
        s
    }

    #[test]
    fn count_only_changes_are_written_at_most_every_five_seconds_conditions_at_once() {
        let writes = StatusWrites::default();
        let start = std::time::Instant::now();
        let current = status(1, ConditionStatus::True);
        // Never written by this process: write now.
        assert_eq!(
            writes.defer(
                "p",
                Some(&current),
                &status(2, ConditionStatus::True),
                start
            ),
            None
        );
        writes.written("p", start);
        let soon = start + Duration::from_secs(2);
        assert_eq!(
            writes.defer("p", Some(&current), &status(3, ConditionStatus::True), soon),
            Some(Duration::from_secs(3))
        );
        // A condition change is not held back.
        assert_eq!(
            writes.defer(
                "p",
                Some(&current),
                &status(3, ConditionStatus::False),
                soon
            ),
            None
        );
        // Another NodePool has its own pace; after the interval counts go out.
        assert_eq!(
            writes.defer("q", Some(&current), &status(3, ConditionStatus::True), soon),
            None
        );
        let later = start + COUNT_WRITE_INTERVAL;
        assert_eq!(
            writes.defer(
                "p",
                Some(&current),
                &status(3, ConditionStatus::True),
                later
            ),
            None
        );
    }
}
