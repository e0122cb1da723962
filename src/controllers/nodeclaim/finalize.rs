//! Teardown of a deleted NodeClaim: the termination deadline annotation, its Nodes (drained by
//! the Node termination controller), then the instance, then the finalizer.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use kube::runtime::controller::Action;

use crate::apis::labels::{
    NODECLAIM_TERMINATION_TIMESTAMP_ANNOTATION, TERMINATION_FINALIZER, ZONE_LABEL, conditions,
};
use crate::apis::{ConditionStatus, ConditionsExt, NodeClaim};
use crate::controllers::node::termination::AWAITING_CLUSTER_STATE;
use crate::controllers::{
    Context, Result, absent_ok, ignore_not_found, patch_nodeclaim_status, patch_object,
    remove_finalizer,
};
use crate::operator::events::Severity;
use crate::operator::metrics::labels;
use crate::state::{ClusterIndex, Kind, nodeclaim_provider_id};

use super::reconcile::{deadline_annotation, nodepool_of, termination_deadline};

/// How often the instance is polled while it terminates.
const INSTANCE_POLL: Duration = Duration::from_secs(5);
/// How soon a teardown waiting for the Node list looks again.
const NODE_LIST_POLL: Duration = Duration::from_secs(1);

/// Teardown of a deleted NodeClaim: deadline annotation, Nodes, instance, finalizer.
pub async fn finalize(claim: &NodeClaim, ctx: &Context) -> Result<Action> {
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
    if nodeclaim_provider_id(claim).is_none()
        && let Some(launched) = ctx
            .recent_launches
            .provider_id_of(&claim.uid().unwrap_or_default(), std::time::Instant::now())
    {
        // Launched here, but deleted before the status write recorded the instance: that
        // instance is the one to delete. Looked up by its label instead, it may not be listed
        // yet, and "none listed" would let the finalizer go while it boots.
        claim
            .status
            .get_or_insert_with(Default::default)
            .provider_id = Some(launched);
    }
    if let Some(provider_id) = nodeclaim_provider_id(claim) {
        // Before the Node list is complete (or while its watch is down), no Node in the index
        // does not mean no Node: the instance would go before its Node was drained.
        if !ctx.cluster.read().current(Kind::Node) {
            ctx.event(
                claim,
                Severity::Normal,
                AWAITING_CLUSTER_STATE,
                "Termination waits for the Node list before it deletes the instance",
            )
            .await;
            return Ok(Action::requeue(NODE_LIST_POLL));
        }
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
    }
    // Without a provider ID the instance may still exist: a create whose answer was lost and
    // whose lookup found nothing yet. The provider finds it by its NodeClaim label; the
    // finalizer goes only once it answers that no instance is left.
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
                absent_ok(patch_nodeclaim_status(ctx, claim, &status).await)?;
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
        Err(e) => {
            // The finalizer stays until the instance is proven gone; say why on the NodeClaim,
            // not only in the log (a provider ID someone mistyped blocks it for good).
            ctx.event(
                claim,
                Severity::Warning,
                "InstanceTerminationFailed",
                format!("Cannot terminate the instance yet; the finalizer stays: {e}"),
            )
            .await;
            return Err(e.into());
        }
    }
    remove_finalizer(&api, claim, TERMINATION_FINALIZER).await?;
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
