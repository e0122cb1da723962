//! Node termination (karpenter-core §4.2): a deleted Node with our finalizer gets its NodeClaim
//! deleted, the `karpenter.sh/disrupted:NoSchedule` taint, a drain in upstream's order through
//! the eviction API (PDBs answer 429 → `FailedDraining` and a requeue) until the NodeClaim's
//! termination deadline forces deletion, then the instance is deleted until the provider reports
//! it gone, and the finalizer is released.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod, Taint as CoreTaint};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, EvictParams, Preconditions};
use kube::runtime::controller::Action;

use crate::apis::labels::{
    DISRUPTED_TAINT_KEY, NODE_EXCLUDE_FROM_LB_LABEL, NODECLASS_LABEL, NODEPOOL_LABEL,
    TERMINATION_FINALIZER, ZONE_LABEL, conditions,
};
use crate::apis::{ConditionStatus, ConditionsExt, NodeClaim};
use crate::controllers::nodeclaim::reconcile::deadline_annotation;
use crate::controllers::{
    Context, Result, absent_ok, ignore_not_found, patch_object, patch_status, without_finalizer,
};
use crate::operator::events::Severity;
use crate::operator::metrics::labels;
use crate::state::node_provider_id;

use super::drain::{PodAction, plan};

/// Pods bound right after tainting are caught by waiting this long after draining starts.
pub const MIN_DRAIN_TIME: Duration = Duration::from_secs(5);
const DRAIN_REQUEUE: Duration = Duration::from_secs(1);
const INSTANCE_POLL: Duration = Duration::from_secs(5);

/// Nodes Karpenter manages: labelled with our NodeClass or a NodePool.
pub fn is_managed(node: &Node) -> bool {
    let labels = node.labels();
    labels.contains_key(NODECLASS_LABEL) || labels.contains_key(NODEPOOL_LABEL)
}

fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// The taint list with `karpenter.sh/disrupted:NoSchedule` replacing any taint of that key;
/// `None` when already there.
pub fn with_disrupted_taint(taints: &[CoreTaint]) -> Option<Vec<CoreTaint>> {
    let present = taints
        .iter()
        .any(|t| t.key == DISRUPTED_TAINT_KEY && t.effect == "NoSchedule" && t.value.is_none());
    if present {
        return None;
    }
    let mut out: Vec<CoreTaint> = taints
        .iter()
        .filter(|t| t.key != DISRUPTED_TAINT_KEY)
        .cloned()
        .collect();
    out.push(CoreTaint {
        key: DISRUPTED_TAINT_KEY.into(),
        effect: "NoSchedule".into(),
        value: None,
        time_added: None,
    });
    Some(out)
}

/// A NodeClaim stand-in carrying only the provider ID, to delete an instance whose NodeClaim
/// is already gone.
fn claim_for(provider_id: &str, name: &str) -> NodeClaim {
    let mut claim = NodeClaim::new(name, serde_json::from_value(serde_json::json!({
        "requirements": [],
        "nodeClassRef": {"group": crate::apis::labels::EXOSCALE_GROUP, "kind": "ExoscaleNodeClass", "name": ""}
    })).expect("static NodeClaim spec"));
    claim.status = Some(crate::apis::NodeClaimStatus {
        provider_id: Some(provider_id.into()),
        ..Default::default()
    });
    claim
}

pub async fn reconcile(node: Arc<Node>, ctx: Arc<Context>) -> Result<Action> {
    if node.metadata.deletion_timestamp.is_none()
        || !node.finalizers().iter().any(|f| f == TERMINATION_FINALIZER)
    {
        return Ok(Action::await_change());
    }
    let name = node.name_any();
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let claims: Api<NodeClaim> = Api::all(ctx.client.clone());
    let provider_id = node_provider_id(&node).map(str::to_string);
    let claim = provider_id
        .as_deref()
        .and_then(|pid| ctx.cluster.read().nodeclaim_by_provider_id(pid));

    // 1. Deleting a Node deletes its NodeClaim.
    if let Some(claim) = &claim
        && claim.metadata.deletion_timestamp.is_none()
    {
        ignore_not_found(
            claims
                .delete(&claim.name_any(), &DeleteParams::default())
                .await,
        )?;
    }

    // 2. A NotReady node whose instance is gone has nothing left to drain.
    if let Some(pid) = &provider_id
        && !node_ready(&node)
        && matches!(ctx.cloud.get(pid).await, Err(e) if e.is_not_found())
    {
        return release(&ctx, &node).await;
    }

    // 3-4. Deadline, taint, exclusion from load balancers.
    let deadline: Option<Timestamp> = claim.as_deref().and_then(deadline_annotation);
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let needs_label = node
        .labels()
        .get(NODE_EXCLUDE_FROM_LB_LABEL)
        .map(String::as_str)
        != Some("karpenter");
    if let Some(tainted) = with_disrupted_taint(&taints) {
        patch_object(
            &nodes,
            &name,
            serde_json::json!({
                "metadata": {"labels": {NODE_EXCLUDE_FROM_LB_LABEL: "karpenter"}},
                "spec": {"taints": tainted},
            }),
            node.resource_version().as_deref(),
        )
        .await?;
        // The patch bumps the Node; the next reconcile sees the taint and drains.
        return Ok(Action::requeue(DRAIN_REQUEUE));
    } else if needs_label {
        patch_object(
            &nodes,
            &name,
            serde_json::json!({"metadata": {"labels": {NODE_EXCLUDE_FROM_LB_LABEL: "karpenter"}}}),
            None,
        )
        .await?;
    }

    // 5. Drain.
    let now = ctx.now();
    let pods: Vec<Arc<Pod>> = ctx.cluster.read().pods_on_node(&name);
    let drain = plan(&pods, now, deadline);
    if !drain.is_drained() {
        set_claim_condition(
            &ctx,
            claim.as_deref(),
            conditions::DRAINED,
            ConditionStatus::Unknown,
            "Draining",
            "Draining the node",
        )
        .await?;
        let mut blocked = Vec::new();
        for (namespace, pod_name, uid, action) in &drain.pods {
            let api: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
            let preconditions = Some(Preconditions {
                uid: uid.clone(),
                resource_version: None,
            });
            match action {
                PodAction::ForceDelete {
                    grace_period_seconds,
                } => {
                    let params = DeleteParams {
                        grace_period_seconds: Some(*grace_period_seconds as u32),
                        preconditions,
                        ..Default::default()
                    };
                    if ignore_not_found(api.delete(pod_name, &params).await)?.is_some() {
                        tracing::info!(node = %name, pod = %pod_name, grace = grace_period_seconds, "deleting pod: termination deadline reached");
                    }
                }
                PodAction::Evict => {
                    let params = EvictParams {
                        delete_options: Some(DeleteParams {
                            preconditions,
                            ..Default::default()
                        }),
                        ..Default::default()
                    };
                    let code = match api.evict(pod_name, &params).await {
                        Ok(_) => 200,
                        Err(kube::Error::Api(status)) => status.code,
                        Err(e) => return Err(e.into()),
                    };
                    ctx.metrics
                        .pods_eviction_requests
                        .get_or_create(&labels([("code", &code.to_string())]))
                        .inc();
                    match code {
                        200 | 201 | 404 | 409 => {}
                        429 => blocked.push(format!("{namespace}/{pod_name}")),
                        _ => tracing::warn!(node = %name, pod = %pod_name, code, "eviction failed"),
                    }
                }
                PodAction::Wait(_) => {}
            }
        }
        let message = if blocked.is_empty() {
            format!(
                "Failed to drain node, {} pods are waiting to be evicted",
                drain.pods.len()
            )
        } else {
            format!(
                "Failed to drain node, eviction blocked by a PodDisruptionBudget for {}",
                blocked.join(", ")
            )
        };
        ctx.event(node.as_ref(), Severity::Warning, "FailedDraining", message)
            .await;
        return Ok(Action::requeue(DRAIN_REQUEUE));
    }
    if let Some(claim) = &claim {
        let draining_since = claim
            .status
            .as_ref()
            .and_then(|s| s.conditions.get_condition(conditions::DRAINED))
            .filter(|c| c.status == ConditionStatus::Unknown)
            .map(|c| c.last_transition_time.0);
        match draining_since {
            None if !claim
                .status
                .as_ref()
                .is_some_and(|s| s.conditions.is_true(conditions::DRAINED)) =>
            {
                set_claim_condition(
                    &ctx,
                    Some(claim),
                    conditions::DRAINED,
                    ConditionStatus::Unknown,
                    "Draining",
                    "Draining the node",
                )
                .await?;
                return Ok(Action::requeue(MIN_DRAIN_TIME));
            }
            Some(since) => {
                let waited = now.duration_since(since).as_secs();
                if waited < MIN_DRAIN_TIME.as_secs() as i64 {
                    return Ok(Action::requeue(Duration::from_secs(
                        (MIN_DRAIN_TIME.as_secs() as i64 - waited).max(1) as u64,
                    )));
                }
                set_claim_condition(
                    &ctx,
                    Some(claim),
                    conditions::DRAINED,
                    ConditionStatus::True,
                    conditions::DRAINED,
                    "",
                )
                .await?;
                ctx.metrics
                    .nodes_drained
                    .get_or_create(&labels([(
                        "nodepool",
                        node.labels()
                            .get(NODEPOOL_LABEL)
                            .map(String::as_str)
                            .unwrap_or(""),
                    )]))
                    .inc();
            }
            None => {}
        }
    }

    // 7. Instance termination.
    if let Some(pid) = &provider_id {
        let target = claim
            .as_deref()
            .cloned()
            .unwrap_or_else(|| claim_for(pid, &name));
        match ctx.cloud.delete(&target).await {
            Ok(()) => {
                set_claim_condition(
                    &ctx,
                    claim.as_deref(),
                    conditions::INSTANCE_TERMINATING,
                    ConditionStatus::True,
                    conditions::INSTANCE_TERMINATING,
                    "",
                )
                .await?;
                return Ok(Action::requeue(INSTANCE_POLL));
            }
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
    }
    release(&ctx, &node).await
}

/// Removes the finalizer and counts the termination.
async fn release(ctx: &Context, node: &Node) -> Result<Action> {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    if let Some(finalizers) = without_finalizer(node.finalizers(), TERMINATION_FINALIZER) {
        absent_ok(
            patch_object(
                &nodes,
                &node.name_any(),
                serde_json::json!({"metadata": {"finalizers": finalizers}}),
                node.resource_version().as_deref(),
            )
            .await,
        )?;
    }
    let pool = node
        .labels()
        .get(NODEPOOL_LABEL)
        .cloned()
        .unwrap_or_default();
    let zone = node.labels().get(ZONE_LABEL).cloned().unwrap_or_default();
    ctx.metrics
        .nodes_terminated
        .get_or_create(&labels([("nodepool", &pool), ("zone", &zone)]))
        .inc();
    let now = ctx.now();
    if let Some(deleted) = &node.metadata.deletion_timestamp {
        ctx.metrics
            .nodes_termination_duration
            .get_or_create(&labels([("nodepool", &pool)]))
            .observe(now.duration_since(deleted.0).as_secs_f64().max(0.0));
    }
    if let Some(created) = &node.metadata.creation_timestamp {
        ctx.metrics
            .nodes_lifetime_duration
            .get_or_create(&labels([("nodepool", &pool)]))
            .observe(now.duration_since(created.0).as_secs_f64().max(0.0));
    }
    Ok(Action::await_change())
}

async fn set_claim_condition(
    ctx: &Context,
    claim: Option<&NodeClaim>,
    type_: &str,
    status: ConditionStatus,
    reason: &str,
    message: &str,
) -> Result<()> {
    let Some(claim) = claim else { return Ok(()) };
    let mut new = claim.status.clone().unwrap_or_default();
    if new.conditions.set_condition(
        type_,
        status,
        reason,
        message,
        claim.metadata.generation,
        ctx.now(),
    ) {
        let api: Api<NodeClaim> = Api::all(ctx.client.clone());
        absent_ok(patch_status(&api, &claim.name_any(), &new).await)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disrupted_taint_replaces_same_key_once() {
        let existing = vec![
            CoreTaint {
                key: "other".into(),
                effect: "NoExecute".into(),
                ..Default::default()
            },
            CoreTaint {
                key: DISRUPTED_TAINT_KEY.into(),
                effect: "NoExecute".into(),
                ..Default::default()
            },
        ];
        let out = with_disrupted_taint(&existing).unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(out[1].key, DISRUPTED_TAINT_KEY);
        assert_eq!(out[1].effect, "NoSchedule");
        assert_eq!(with_disrupted_taint(&out), None);
    }

    #[test]
    fn provider_id_stand_in_claim_carries_the_id() {
        let claim = claim_for("exoscale://abc", "node-1");
        assert_eq!(
            claim.status.unwrap().provider_id.as_deref(),
            Some("exoscale://abc")
        );
    }
}
