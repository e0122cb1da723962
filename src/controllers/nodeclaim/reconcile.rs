//! The NodeClaim controller: finalizer, expiration, launch, registration, initialization,
//! liveness and consistency while alive; instance and Node teardown when deleted. Waiting is
//! always a requeue.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use kube::runtime::controller::Action;

use crate::apis::duration::parse_duration;
use crate::apis::labels::{
    NODECLAIM_TERMINATION_TIMESTAMP_ANNOTATION, NODEPOOL_LABEL, TERMINATION_FINALIZER,
    UNREGISTERED_TAINT_KEY, ZONE_LABEL, conditions,
};
use crate::apis::{ConditionStatus, ConditionsExt, NodeClaim, NodeClaimStatus};
use crate::cloudprovider::{CloudProvider, CloudProviderError};
use crate::operator::events::{Severity, truncate};
use crate::operator::metrics::labels;
use crate::state::{ClusterIndex, nodeclaim_provider_id};

use super::expiration::{Expiration, expiration};
use super::lifecycle::{
    Liveness, Registration, initialization, initialized_node, liveness, merge_launched,
    registration, set_ready,
};
use crate::controllers::{
    Context, Result, absent_ok, ignore_not_found, patch_object, patch_status, with_finalizer,
    without_finalizer,
};

/// How often the instance is polled while it terminates.
const INSTANCE_POLL: Duration = Duration::from_secs(5);
/// Resync of a NodeClaim that is waiting for nothing in particular.
const RESYNC: Duration = Duration::from_secs(60);

/// NodeClaims of a NodeClass kind the provider serves; others belong to another provider.
pub fn is_managed(claim: &NodeClaim, cloud: &dyn CloudProvider) -> bool {
    cloud.serves(&claim.spec.node_class_ref)
}

fn nodepool_of(claim: &NodeClaim) -> String {
    claim
        .labels()
        .get(NODEPOOL_LABEL)
        .cloned()
        .unwrap_or_default()
}

/// The termination deadline: deletion time + terminationGracePeriod.
pub fn termination_deadline(claim: &NodeClaim) -> Option<Timestamp> {
    let deleted = claim.metadata.deletion_timestamp.as_ref()?.0;
    let tgp = parse_duration(claim.spec.termination_grace_period.as_deref()?).ok()?;
    deleted
        .checked_add(SignedDuration::from_secs(tgp.as_secs() as i64))
        .ok()
}

/// The deadline annotation as written (RFC 3339).
pub fn deadline_annotation(claim: &NodeClaim) -> Option<Timestamp> {
    claim
        .annotations()
        .get(NODECLAIM_TERMINATION_TIMESTAMP_ANNOTATION)?
        .parse()
        .ok()
}

fn epoch(ctx: &Context, claim: &NodeClaim) -> Option<(String, String)> {
    let pool = ctx.cluster.read().nodepool(&nodepool_of(claim))?;
    let nodeclass_generation = pool
        .status
        .as_ref()
        .and_then(|s| s.node_class_observed_generation)
        .unwrap_or(0);
    Some((
        pool.name_any(),
        format!(
            "{}/{}",
            pool.metadata.generation.unwrap_or(0),
            nodeclass_generation
        ),
    ))
}

fn record_registration(ctx: &Context, claim: &NodeClaim, success: bool) {
    if let Some((pool, epoch)) = epoch(ctx, claim) {
        ctx.registration_health.record(&pool, &epoch, success);
    }
}

async fn delete_claim(ctx: &Context, claim: &NodeClaim, reason: &str) -> Result<()> {
    let api: Api<NodeClaim> = Api::all(ctx.client.clone());
    ignore_not_found(
        api.delete(&claim.name_any(), &DeleteParams::default())
            .await,
    )?;
    ctx.metrics.nodeclaim_disrupted(
        reason,
        &nodepool_of(claim),
        &ClusterIndex::capacity_type(claim),
    );
    Ok(())
}

pub async fn reconcile(claim: Arc<NodeClaim>, ctx: Arc<Context>) -> Result<Action> {
    if !is_managed(&claim, ctx.cloud.as_ref()) {
        return Ok(Action::await_change());
    }
    if claim.metadata.deletion_timestamp.is_some() {
        return finalize(&claim, &ctx).await;
    }
    let api: Api<NodeClaim> = Api::all(ctx.client.clone());
    let name = claim.name_any();
    // Never launch without the finalizer: it guarantees the instance is deleted with the claim.
    let mut claim = (*claim).clone();
    if let Some(finalizers) = with_finalizer(claim.finalizers(), TERMINATION_FINALIZER) {
        claim = patch_object(
            &api,
            &name,
            serde_json::json!({"metadata": {"finalizers": finalizers}}),
            claim.resource_version().as_deref(),
        )
        .await?;
    }
    let now = ctx.now();
    let mut requeue = RESYNC;

    match expiration(&claim, now) {
        Expiration::Expired => {
            tracing::info!(nodeclaim = %name, "NodeClaim expired");
            delete_claim(&ctx, &claim, "expired").await?;
            // As disruption counts: the pods that must move, not DaemonSet, mirror or
            // finished ones.
            let pods = ctx
                .cluster
                .read()
                .pods_on_node(
                    claim
                        .status
                        .as_ref()
                        .and_then(|s| s.node_name.as_deref())
                        .unwrap_or(""),
                )
                .iter()
                .filter(|p| crate::state::pods::is_reschedulable(p))
                .count();
            ctx.metrics
                .pods_disruption_initiated
                .get_or_create(&labels([
                    ("reason", "expired"),
                    ("nodepool", &nodepool_of(&claim)),
                ]))
                .inc_by(pods as u64);
            return Ok(Action::await_change());
        }
        Expiration::At(after) => requeue = requeue.min(after),
        Expiration::Never => {}
    }

    let before = claim.status.clone().unwrap_or_default();
    let mut status = before.clone();
    let generation = claim.metadata.generation;

    // ---- launch --------------------------------------------------------------------------
    if !status.conditions.is_true(conditions::LAUNCHED) {
        if nodeclaim_provider_id(&claim).is_none() {
            match ctx.cloud.create(&claim).await {
                Ok(launched) => {
                    let merged = merge_launched(&claim, &launched);
                    claim = patch_object(
                        &api,
                        &name,
                        serde_json::json!({"metadata": {
                            "labels": merged.metadata.labels,
                            "annotations": merged.metadata.annotations,
                        }}),
                        None,
                    )
                    .await?;
                    let from = merged.status.unwrap_or_default();
                    status.provider_id = from.provider_id;
                    status.image_id = from.image_id;
                    status.capacity = from.capacity;
                    status.allocatable = from.allocatable;
                }
                Err(error) => return launch_failed(&ctx, &claim, status, error).await,
            }
        }
        status.conditions.set_condition(
            conditions::LAUNCHED,
            ConditionStatus::True,
            conditions::LAUNCHED,
            "",
            generation,
            now,
        );
        // karpenter_nodeclaims_created_total is counted where the NodeClaim is created
        // (provisioning, disruption replacements), as upstream; a launch is not a creation.
    }

    // ---- registration ----------------------------------------------------------------------
    let provider_id = status.provider_id.clone().unwrap_or_default();
    let nodes: Vec<Arc<Node>> = ctx.cluster.read().nodes_by_provider_id(&provider_id);
    if !status.conditions.is_true(conditions::REGISTERED) {
        let mut with_status = claim.clone();
        with_status.status = Some(status.clone());
        match registration(&with_status, &nodes) {
            Registration::NodeNotFound => {
                status.conditions.set_condition(
                    conditions::REGISTERED,
                    ConditionStatus::Unknown,
                    "NodeNotFound",
                    "Node not registered with cluster",
                    generation,
                    now,
                );
            }
            Registration::MultipleNodesFound(names) => {
                status.conditions.set_condition(
                    conditions::REGISTERED,
                    ConditionStatus::False,
                    "MultipleNodesFound",
                    &format!("multiple nodes found for provider ID: {}", names.join(", ")),
                    generation,
                    now,
                );
            }
            Registration::Register(synced) => {
                let node = &nodes[0];
                let had_taint = node
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .is_some_and(|t| t.iter().any(|t| t.key == UNREGISTERED_TAINT_KEY));
                if !had_taint {
                    ctx.event(node.as_ref(), Severity::Warning, "UnregisteredTaintMissing", format!("Missing {UNREGISTERED_TAINT_KEY} taint which prevents registration related race conditions on Karpenter-managed nodes")).await;
                }
                if *synced != **node {
                    let node_api: Api<Node> = Api::all(ctx.client.clone());
                    patch_object(&node_api, &node.name_any(), serde_json::json!({
                        "metadata": {
                            "labels": synced.metadata.labels,
                            "annotations": synced.metadata.annotations,
                            "finalizers": synced.metadata.finalizers,
                            "ownerReferences": synced.metadata.owner_references,
                        },
                        "spec": {"taints": synced.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default()},
                    }), node.resource_version().as_deref()).await?;
                }
                status.node_name = Some(node.name_any());
                status.conditions.set_condition(
                    conditions::REGISTERED,
                    ConditionStatus::True,
                    conditions::REGISTERED,
                    "",
                    generation,
                    now,
                );
                ctx.metrics
                    .nodes_created
                    .get_or_create(&labels([
                        ("nodepool", &nodepool_of(&claim)),
                        (
                            "zone",
                            claim
                                .labels()
                                .get(ZONE_LABEL)
                                .map(String::as_str)
                                .unwrap_or(""),
                        ),
                    ]))
                    .inc();
                record_registration(&ctx, &claim, true);
            }
        }
    }

    // ---- initialization ----------------------------------------------------------------------
    if status.conditions.is_true(conditions::REGISTERED)
        && !status.conditions.is_true(conditions::INITIALIZED)
    {
        let node = nodes.first().map(|n| n.as_ref());
        match initialization(&claim, node) {
            Ok(()) => {
                if let Some(node) = node {
                    let labelled = initialized_node(node);
                    if labelled != *node {
                        let node_api: Api<Node> = Api::all(ctx.client.clone());
                        absent_ok(patch_object(&node_api, &node.name_any(), serde_json::json!({"metadata": {"labels": labelled.metadata.labels}}), None).await)?;
                    }
                }
                status.conditions.set_condition(
                    conditions::INITIALIZED,
                    ConditionStatus::True,
                    conditions::INITIALIZED,
                    "",
                    generation,
                    now,
                );
            }
            Err(why) => {
                status.conditions.set_condition(
                    conditions::INITIALIZED,
                    ConditionStatus::Unknown,
                    why.reason,
                    &why.message,
                    generation,
                    now,
                );
                requeue = requeue.min(Duration::from_secs(10));
            }
        }
    }

    // ---- consistency -----------------------------------------------------------------------
    if status.conditions.is_true(conditions::INITIALIZED)
        && let Some(node) = nodes.first()
    {
        let problems = consistency_problems(&status, node);
        if problems.is_empty() {
            status.conditions.set_condition(
                conditions::CONSISTENT_STATE_FOUND,
                ConditionStatus::True,
                conditions::CONSISTENT_STATE_FOUND,
                "",
                generation,
                now,
            );
        } else {
            let message = problems.join("; ");
            if status.conditions.set_condition(
                conditions::CONSISTENT_STATE_FOUND,
                ConditionStatus::False,
                "ConsistencyCheckFailed",
                &message,
                generation,
                now,
            ) {
                ctx.event(&claim, Severity::Warning, "FailedConsistencyCheck", message)
                    .await;
            }
        }
    }

    // ---- liveness ----------------------------------------------------------------------------
    let mut with_status = claim.clone();
    with_status.status = Some(status.clone());
    match liveness(
        &with_status,
        now,
        ctx.timings.launch_timeout,
        ctx.timings.registration_ttl,
    ) {
        Liveness::Expired(reason) => {
            tracing::info!(nodeclaim = %name, reason, "NodeClaim did not register in time");
            record_registration(&ctx, &claim, false);
            delete_claim(&ctx, &claim, reason).await?;
            return Ok(Action::await_change());
        }
        Liveness::RecheckAfter(after) => requeue = requeue.min(after),
        Liveness::Alive => {}
    }

    set_ready(&mut status, generation, now);
    if status != before {
        patch_status(&api, &claim, &status).await?;
    }
    Ok(Action::requeue(requeue.max(Duration::from_secs(1))))
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

async fn launch_failed(
    ctx: &Context,
    claim: &NodeClaim,
    mut status: NodeClaimStatus,
    error: CloudProviderError,
) -> Result<Action> {
    let api: Api<NodeClaim> = Api::all(ctx.client.clone());
    let now = ctx.now();
    let generation = claim.metadata.generation;
    match &error {
        CloudProviderError::InsufficientCapacity { message, .. } => {
            ctx.event(
                claim,
                Severity::Warning,
                "InsufficientCapacityError",
                format!(
                    "NodeClaim {} event: {}",
                    claim.name_any(),
                    truncate(message, 300)
                ),
            )
            .await;
            delete_claim(ctx, claim, "insufficient_capacity").await?;
            return Ok(Action::await_change());
        }
        CloudProviderError::NodeClassNotReady(message) => {
            ctx.event(
                claim,
                Severity::Warning,
                "NodeClassNotReady",
                truncate(message, 300),
            )
            .await;
            delete_claim(ctx, claim, "nodeclass_not_ready").await?;
            return Ok(Action::await_change());
        }
        CloudProviderError::Create { reason, message } => {
            status.conditions.set_condition(
                conditions::LAUNCHED,
                ConditionStatus::Unknown,
                reason,
                &truncate(message, 300),
                generation,
                now,
            );
        }
        other => {
            status.conditions.set_condition(
                conditions::LAUNCHED,
                ConditionStatus::Unknown,
                "LaunchFailed",
                &truncate(&other.to_string(), 300),
                generation,
                now,
            );
        }
    }
    tracing::warn!(nodeclaim = %claim.name_any(), %error, "launch failed");
    let mut with_status = claim.clone();
    with_status.status = Some(status.clone());
    if let Liveness::Expired(reason) = liveness(
        &with_status,
        now,
        ctx.timings.launch_timeout,
        ctx.timings.registration_ttl,
    ) {
        record_registration(ctx, claim, false);
        delete_claim(ctx, claim, reason).await?;
        return Ok(Action::await_change());
    }
    set_ready(&mut status, generation, now);
    patch_status(&api, claim, &status).await?;
    Ok(Action::requeue(Duration::from_secs(10)))
}

/// Teardown of a deleted NodeClaim: deadline annotation, Nodes, instance, finalizer.
async fn finalize(claim: &NodeClaim, ctx: &Context) -> Result<Action> {
    let mut claim = claim.clone();
    let claim = &mut claim;
    if !claim
        .finalizers()
        .iter()
        .any(|f| f == TERMINATION_FINALIZER)
    {
        return Ok(Action::await_change());
    }
    let api: Api<NodeClaim> = Api::all(ctx.client.clone());
    let name = claim.name_any();
    if deadline_annotation(claim).is_none()
        && let Some(deadline) = termination_deadline(claim)
    {
        *claim = patch_object(&api, &name, serde_json::json!({"metadata": {"annotations": {NODECLAIM_TERMINATION_TIMESTAMP_ANNOTATION: deadline.to_string()}}}), None).await?;
        ctx.event(
            claim,
            Severity::Normal,
            "TerminationGracePeriodExpiring",
            format!("All pods will be deleted by {deadline}"),
        )
        .await;
    }
    if let Some(provider_id) = nodeclaim_provider_id(claim) {
        // Node termination drains; the instance goes only once every Node is gone.
        let nodes = ctx.cluster.read().nodes_by_provider_id(provider_id);
        if !nodes.is_empty() {
            let node_api: Api<Node> = Api::all(ctx.client.clone());
            for node in &nodes {
                if node.metadata.deletion_timestamp.is_none() {
                    ignore_not_found(
                        node_api
                            .delete(&node.name_any(), &DeleteParams::default())
                            .await,
                    )?;
                }
            }
            return Ok(Action::requeue(INSTANCE_POLL));
        }
        match ctx.cloud.delete(claim).await {
            Ok(()) => {
                let mut status = claim.status.clone().unwrap_or_default();
                if status.conditions.set_condition(
                    conditions::INSTANCE_TERMINATING,
                    ConditionStatus::True,
                    conditions::INSTANCE_TERMINATING,
                    "",
                    claim.metadata.generation,
                    ctx.now(),
                ) {
                    absent_ok(patch_status(&api, claim, &status).await)?;
                }
                return Ok(Action::requeue(INSTANCE_POLL));
            }
            Err(e) if e.is_not_found() => {
                if let Some(since) = claim
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.get_condition(conditions::INSTANCE_TERMINATING))
                {
                    let secs = ctx
                        .now()
                        .duration_since(since.last_transition_time.0)
                        .as_secs_f64();
                    ctx.metrics
                        .nodeclaims_instance_termination_duration
                        .get_or_create(&labels([("nodepool", &nodepool_of(claim))]))
                        .observe(secs.max(0.0));
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    if let Some(finalizers) = without_finalizer(claim.finalizers(), TERMINATION_FINALIZER) {
        absent_ok(
            patch_object(
                &api,
                &name,
                serde_json::json!({"metadata": {"finalizers": finalizers}}),
                claim.resource_version().as_deref(),
            )
            .await,
        )?;
    }
    let pool = nodepool_of(claim);
    ctx.metrics
        .nodeclaims_terminated
        .get_or_create(&labels([
            ("nodepool", &pool),
            ("capacity_type", &ClusterIndex::capacity_type(claim)),
            (
                "zone",
                claim
                    .labels()
                    .get(ZONE_LABEL)
                    .map(String::as_str)
                    .unwrap_or(""),
            ),
        ]))
        .inc();
    if let Some(deleted) = &claim.metadata.deletion_timestamp {
        let secs = ctx.now().duration_since(deleted.0).as_secs_f64();
        ctx.metrics
            .nodeclaims_termination_duration
            .get_or_create(&labels([("nodepool", &pool)]))
            .observe(secs.max(0.0));
    }
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::testing::*;

    #[test]
    fn deadline_is_deletion_plus_grace_period() {
        let mut claim = nodeclaim("c", "p", Some("exoscale://i"));
        assert_eq!(termination_deadline(&claim), None);
        claim.metadata.deletion_timestamp = Some(ts(100));
        assert_eq!(
            termination_deadline(&claim),
            None,
            "no terminationGracePeriod: no deadline"
        );
        claim.spec.termination_grace_period = Some("1h".into());
        assert_eq!(termination_deadline(&claim), Some(ts(3700).0));
        claim.annotations_mut().insert(
            NODECLAIM_TERMINATION_TIMESTAMP_ANNOTATION.into(),
            ts(3700).0.to_string(),
        );
        assert_eq!(deadline_annotation(&claim), Some(ts(3700).0));
    }

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

    #[test]
    fn only_nodeclasses_the_provider_serves_are_managed() {
        let cloud = crate::cloudprovider::fake::FakeCloudProvider::new();
        let mut claim = nodeclaim("c", "p", None);
        assert!(is_managed(&claim, &cloud));
        claim.spec.node_class_ref.group = "karpenter.k8s.aws".into();
        assert!(!is_managed(&claim, &cloud));
    }
}
