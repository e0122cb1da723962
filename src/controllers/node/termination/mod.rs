//! Node termination (karpenter-core §4.2): a deleted Node with our finalizer gets its NodeClaim
//! deleted, the `karpenter.sh/disrupted:NoSchedule` taint, a drain in upstream's order through
//! the eviction API — each pod paced by the [`EvictionQueue`]'s backoff while PDBs refuse it —
//! until the NodeClaim's termination deadline forces deletion; then it waits for the node's
//! VolumeAttachments to go (or the deadline), deletes the instance until the provider reports it
//! gone, and releases the finalizer.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Taint as CoreTaint};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use kube::runtime::controller::Action;

use crate::apis::labels::{
    DISRUPTED_TAINT_KEY, NODE_EXCLUDE_FROM_LB_LABEL, NODEPOOL_LABEL, TERMINATION_FINALIZER,
    ZONE_LABEL, conditions,
};
use crate::apis::{ConditionStatus, ConditionsExt, NodeClaim};
use crate::cloudprovider::NodeClassKind;
use crate::controllers::nodeclaim::reconcile::deadline_annotation;
use crate::controllers::{
    Context, Result, absent_ok, ignore_not_found, patch_nodeclaim_status, patch_object,
    remove_finalizer,
};
use crate::state::HeldPod as Pod;

use crate::operator::events::Severity;
use crate::operator::metrics::labels;
use crate::state::node_provider_id;

use super::eviction::EvictionQueue;
use super::throttle::EventThrottle;
use crate::state::{Kind, node_ready};

mod detaching;
mod draining;

/// Pods bound right after tainting are caught by waiting this long after draining starts.
pub const MIN_DRAIN_TIME: Duration = Duration::from_secs(5);
const DRAIN_REQUEUE: Duration = Duration::from_secs(1);
const VOLUME_REQUEUE: Duration = Duration::from_secs(1);
const INSTANCE_POLL: Duration = Duration::from_secs(5);

/// Event reason while termination waits for cluster state to be complete.
pub const AWAITING_CLUSTER_STATE: &str = "AwaitingClusterState";

/// What termination still waits for before it may act, if anything. A kind not yet listed, or
/// whose watch failed, is not an empty one: a restarted controller whose Node list came before
/// its Pod list would otherwise find a node being drained without pods, call it drained and
/// delete its instance, PodDisruptionBudgets and all. Without its NodeClaim the node would
/// lose its termination deadline and the drain's bookkeeping.
fn awaiting_cluster_state(ctx: &Context) -> Option<String> {
    let index = ctx.cluster.read();
    let mut waiting = Vec::new();
    if !index.current(Kind::Pod) {
        waiting.push("the Pod list (a node whose pods are not all known is not drained)");
    }
    if !index.listed(Kind::NodeClaim) {
        waiting.push("the NodeClaim list");
    }
    (!waiting.is_empty()).then(|| waiting.join(" and "))
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

/// A NodeClaim stand-in carrying only the provider ID (and the provider's default NodeClass
/// kind), to delete an instance whose NodeClaim is already gone.
fn claim_for(provider_id: &str, name: &str, kind: Option<NodeClassKind>) -> NodeClaim {
    let kind = kind.unwrap_or(NodeClassKind {
        group: String::new(),
        kind: String::new(),
    });
    let spec = crate::apis::NodeClaimSpec {
        node_class_ref: crate::apis::NodeClassReference {
            group: kind.group,
            kind: kind.kind,
            name: String::new(),
        },
        ..serde_json::from_value(serde_json::json!({
            "requirements": [],
            "nodeClassRef": {"group": "", "kind": "", "name": ""}
        }))
        .expect("static NodeClaim spec")
    };
    let mut claim = NodeClaim::new(name, spec);
    claim.status = Some(crate::apis::NodeClaimStatus {
        provider_id: Some(provider_id.into()),
        ..Default::default()
    });
    claim
}

/// What the termination controller remembers across reconciles of all nodes.
#[derive(Debug, Default)]
pub struct Termination {
    evictions: Mutex<EvictionQueue>,
    /// Node events repeated while a node is requeued (by node name and reason).
    node_events: Mutex<EventThrottle<(String, &'static str)>>,
}

impl Termination {
    fn queue(&self) -> MutexGuard<'_, EvictionQueue> {
        // The queue holds no invariant a panicking holder could break half-way.
        self.evictions.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn node_events(&self) -> MutexGuard<'_, EventThrottle<(String, &'static str)>> {
        self.node_events.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a repeated event `reason` about `node` may go out at `now`.
    fn node_event_due(&self, node: &str, reason: &'static str, now: Instant) -> bool {
        self.node_events().allow((node.to_string(), reason), now)
    }

    /// Forgets everything about a node whose termination finished.
    fn forget_node(&self, node: &str) {
        self.queue().forget_node(node);
        self.node_events().retain(|(n, _)| n != node);
    }

    /// Drops what is remembered about nodes no longer in cluster state (their finalizer was
    /// removed elsewhere, so `release` never ran). `current` is kept: the controller's own
    /// watch may see a node before cluster state does.
    fn forget_vanished_nodes(&self, ctx: &Context, current: &str) {
        let cluster = ctx.cluster.read();
        let keep = |node: &str| node == current || cluster.node(node).is_some();
        self.queue().retain_nodes(keep);
        self.node_events().retain(|(node, _)| keep(node));
    }
}

pub async fn reconcile(
    node: Arc<Node>,
    ctx: Arc<Context>,
    state: Arc<Termination>,
) -> Result<Action> {
    let name = node.name_any();
    state.forget_vanished_nodes(&ctx, &name);
    if node.metadata.deletion_timestamp.is_none()
        || !node.finalizers().iter().any(|f| f == TERMINATION_FINALIZER)
    {
        return Ok(Action::await_change());
    }
    // Another Karpenter's node carries the same finalizer: its termination is that one's.
    {
        let index = ctx.cluster.read();
        if index.listed(Kind::NodeClaim) && !index.manages_node(&node) {
            return Ok(Action::await_change());
        }
    }
    if let Some(waiting) = awaiting_cluster_state(&ctx) {
        ctx.event(
            node.as_ref(),
            Severity::Normal,
            AWAITING_CLUSTER_STATE,
            format!("Termination waits for {waiting}"),
        )
        .await;
        return Ok(Action::requeue(DRAIN_REQUEUE));
    }
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let claims: Api<NodeClaim> = Api::all(ctx.client.clone());
    let provider_id = node_provider_id(&node).map(str::to_string);
    let cached_claim = provider_id
        .as_deref()
        .and_then(|pid| ctx.cluster.read().nodeclaim_by_provider_id(pid));

    // 1. Deleting a Node deletes its NodeClaim.
    if let Some(claim) = &cached_claim
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
        return release(&ctx, &state, &node).await;
    }

    // 3-4. Deadline, taint, exclusion from load balancers.
    let deadline: Option<Timestamp> = cached_claim.as_deref().and_then(deadline_annotation);
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

    let claim: Option<NodeClaim> = cached_claim.as_deref().cloned();

    // Each status patch returns the NodeClaim as written, so later steps build on it.
    let mut pass = Pass {
        ctx: &ctx,
        state: &state,
        node: &node,
        name: name.clone(),
        claim,
        now: ctx.now(),
        deadline,
        pods: ctx.cluster.read().pods_on_node(&name),
    };
    // 5. Drain.
    if let Some(action) = draining::drain(&mut pass).await? {
        return Ok(action);
    }
    // 6. Volume detachment.
    if let Some(action) = detaching::detach_volumes(&mut pass).await? {
        return Ok(action);
    }
    let mut claim = pass.claim;

    // 7. Instance termination.
    if let Some(pid) = &provider_id {
        let target = claim.clone().unwrap_or_else(|| {
            claim_for(
                pid,
                &name,
                ctx.cloud.supported_node_classes().into_iter().next(),
            )
        });
        match ctx.cloud.delete(&target).await {
            Ok(()) => {
                set_claim_condition(
                    &ctx,
                    &mut claim,
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
    release(&ctx, &state, &node).await
}

/// Removes the finalizer and counts the termination.
async fn release(ctx: &Context, state: &Termination, node: &Node) -> Result<Action> {
    state.forget_node(&node.name_any());
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    remove_finalizer(&nodes, node, TERMINATION_FINALIZER).await?;
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

/// One termination reconcile's shared state for the drain and volume steps.
pub(super) struct Pass<'a> {
    ctx: &'a Context,
    state: &'a Termination,
    node: &'a Node,
    name: String,
    /// The NodeClaim as last written (status patches return it).
    claim: Option<NodeClaim>,
    now: Timestamp,
    deadline: Option<Timestamp>,
    pods: Vec<Arc<Pod>>,
}

impl Pass<'_> {
    async fn set_claim_condition(
        &mut self,
        type_: &str,
        status: ConditionStatus,
        reason: &str,
        message: &str,
    ) -> Result<()> {
        set_claim_condition(self.ctx, &mut self.claim, type_, status, reason, message).await
    }
}

/// Sets a condition on the NodeClaim (if any) and keeps `claim` at the version written.
async fn set_claim_condition(
    ctx: &Context,
    claim: &mut Option<NodeClaim>,
    type_: &str,
    status: ConditionStatus,
    reason: &str,
    message: &str,
) -> Result<()> {
    let Some(current) = claim.as_mut() else {
        return Ok(());
    };
    let mut new = current.status.clone().unwrap_or_default();
    if new.conditions.set_condition(
        type_,
        status,
        reason,
        message,
        current.metadata.generation,
        ctx.now(),
    ) {
        match absent_ok(patch_nodeclaim_status(ctx, current, &new).await)? {
            Some(written) => *current = written,
            None => current.status = Some(new),
        }
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
        let kind = NodeClassKind {
            group: "example.com".into(),
            kind: "ExampleNodeClass".into(),
        };
        let claim = claim_for("exoscale://abc", "node-1", Some(kind));
        assert_eq!(claim.spec.node_class_ref.kind, "ExampleNodeClass");
        assert_eq!(
            claim.status.unwrap().provider_id.as_deref(),
            Some("exoscale://abc")
        );
    }
}
