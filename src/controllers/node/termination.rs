//! Node termination (karpenter-core §4.2): a deleted Node with our finalizer gets its NodeClaim
//! deleted, the `karpenter.sh/disrupted:NoSchedule` taint, a drain in upstream's order through
//! the eviction API — each pod paced by the [`EvictionQueue`]'s backoff while PDBs refuse it —
//! until the NodeClaim's termination deadline forces deletion; then it waits for the node's
//! VolumeAttachments to go (or the deadline), deletes the instance until the provider reports it
//! gone, and releases the finalizer.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

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
use crate::cloudprovider::NodeClassKind;
use crate::controllers::nodeclaim::reconcile::deadline_annotation;
use crate::controllers::{
    Context, Result, absent_ok, ignore_not_found, patch_object, patch_status, remove_finalizer,
};
use crate::operator::events::Severity;
use crate::operator::metrics::labels;
use crate::state::{Kind, node_provider_id};

use super::drain::{DrainPlan, PodAction, plan};
use super::eviction::{self, EvictionQueue, EvictionResponse, PodKey};
use super::throttle::EventThrottle;
use super::volumes::{self, Detachment};

/// Pods bound right after tainting are caught by waiting this long after draining starts.
pub const MIN_DRAIN_TIME: Duration = Duration::from_secs(5);
const DRAIN_REQUEUE: Duration = Duration::from_secs(1);
const VOLUME_REQUEUE: Duration = Duration::from_secs(1);
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

    // Each status patch returns the NodeClaim as written, so later conditions of this
    // reconcile build on it instead of on the (older) cached copy.
    let mut claim: Option<NodeClaim> = cached_claim.as_deref().cloned();

    // 5. Drain.
    let now = ctx.now();
    let pods: Vec<Arc<Pod>> = ctx.cluster.read().pods_on_node(&name);
    let drain = plan(&pods, now, deadline);
    if !drain.is_drained() {
        set_claim_condition(
            &ctx,
            &mut claim,
            conditions::DRAINED,
            ConditionStatus::Unknown,
            conditions::DRAINING_REASON,
            "Draining the node",
        )
        .await?;
        let reason = claim
            .as_ref()
            .and_then(|c| c.status.as_ref())
            .and_then(|s| s.conditions.get_condition(conditions::DISRUPTION_REASON))
            .map(|c| c.reason.clone())
            .unwrap_or_default();
        let requeue = drain_pass(&ctx, &state, &node, &pods, &drain, &reason).await?;
        return Ok(Action::requeue(requeue));
    }
    state.queue().forget_node(&name);
    if let Some(current) = &claim {
        let status = current.status.as_ref();
        let draining_since = status
            .and_then(|s| s.conditions.get_condition(conditions::DRAINED))
            .filter(|c| c.status == ConditionStatus::Unknown)
            .map(|c| c.last_transition_time.0);
        let drained = status.is_some_and(|s| s.conditions.is_true(conditions::DRAINED));
        match draining_since {
            None if !drained => {
                set_claim_condition(
                    &ctx,
                    &mut claim,
                    conditions::DRAINED,
                    ConditionStatus::Unknown,
                    conditions::DRAINING_REASON,
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
                    &mut claim,
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

    // 6. Volume detachment.
    let settled = claim
        .as_ref()
        .and_then(|c| c.status.as_ref())
        .and_then(|s| s.conditions.get_condition(conditions::VOLUMES_DETACHED))
        .is_some_and(|c| c.status != ConditionStatus::Unknown);
    if !settled {
        // Before the first list of VolumeAttachments, no attachment does not mean none.
        if !ctx.cluster.read().listed(Kind::VolumeAttachment) {
            return Ok(Action::requeue(VOLUME_REQUEUE));
        }
        let detachment = volume_detachment(&ctx, &name, &pods, now, deadline);
        match detachment {
            Detachment::Detached => {
                set_claim_condition(
                    &ctx,
                    &mut claim,
                    conditions::VOLUMES_DETACHED,
                    ConditionStatus::True,
                    conditions::VOLUMES_DETACHED,
                    "",
                )
                .await?;
            }
            Detachment::Awaiting(attachments) => {
                // Told once, when the wait begins, not on every requeue; without a NodeClaim
                // to hold the condition, at most every 10 s.
                let first_wait = match &claim {
                    Some(claim) => awaiting_detachment_begins(claim),
                    None => state.node_event_due(
                        &name,
                        conditions::AWAITING_VOLUME_DETACHMENT_REASON,
                        Instant::now(),
                    ),
                };
                set_claim_condition(
                    &ctx,
                    &mut claim,
                    conditions::VOLUMES_DETACHED,
                    ConditionStatus::Unknown,
                    conditions::AWAITING_VOLUME_DETACHMENT_REASON,
                    "Awaiting deletion of bound VolumeAttachments",
                )
                .await?;
                if first_wait {
                    ctx.event(
                        node.as_ref(),
                        Severity::Normal,
                        conditions::AWAITING_VOLUME_DETACHMENT_REASON,
                        format!(
                            "Awaiting deletion of bound VolumeAttachments ({})",
                            attachments.join(", ")
                        ),
                    )
                    .await;
                }
                return Ok(Action::requeue(VOLUME_REQUEUE));
            }
            Detachment::DeadlinePassed(attachments) => {
                tracing::info!(node = %name, attachments = %attachments.join(","), "termination grace period elapsed; not waiting for volume detachment");
                set_claim_condition(
                    &ctx,
                    &mut claim,
                    conditions::VOLUMES_DETACHED,
                    ConditionStatus::False,
                    conditions::TERMINATION_GRACE_PERIOD_ELAPSED_REASON,
                    "Termination grace period elapsed before all VolumeAttachments were deleted",
                )
                .await?;
            }
        }
    }

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

/// One pass over a node still being drained: force-deletes what the deadline forces, sends
/// the evictions whose backoff elapsed, and says when to look again.
async fn drain_pass(
    ctx: &Context,
    state: &Termination,
    node: &Node,
    pods: &[Arc<Pod>],
    drain: &DrainPlan,
    disruption_reason: &str,
) -> Result<Duration> {
    let name = node.name_any();
    let count_drained = || {
        ctx.metrics
            .pods_drained
            .get_or_create(&labels([("reason", disruption_reason)]))
            .inc();
    };
    let key_of = |(ns, pod, uid, _): &(String, String, Option<String>, PodAction)| {
        PodKey::new(ns, pod, uid.as_deref())
    };
    let due: Vec<PodKey> = {
        let mut queue = state.queue();
        let present: BTreeSet<PodKey> = drain.pods.iter().map(key_of).collect();
        queue.retain_node(&name, |k| present.contains(k));
        let started = Instant::now();
        drain
            .pods
            .iter()
            .filter(|p| queue.should_evict(&key_of(p), &name, &p.3, started))
            .map(key_of)
            .collect()
    };
    let by_key: BTreeMap<PodKey, &Arc<Pod>> = pods
        .iter()
        .map(|p| {
            let key = PodKey::new(
                p.metadata.namespace.as_deref().unwrap_or_default(),
                &p.name_any(),
                p.metadata.uid.as_deref(),
            );
            (key, p)
        })
        .collect();
    let mut sent = false;

    for forced in drain.force_deletions() {
        let (namespace, pod_name, uid, grace) = (
            forced.namespace,
            forced.name,
            forced.uid,
            forced.grace_period_seconds,
        );
        let key = PodKey::new(namespace, pod_name, uid);
        if !state
            .queue()
            .should_force_delete(&key, forced.already_deleting)
        {
            continue;
        }
        let api: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
        let params = DeleteParams {
            grace_period_seconds: Some(grace.max(0) as u32),
            preconditions: Some(Preconditions {
                uid: uid.map(str::to_string),
                resource_version: None,
            }),
            ..Default::default()
        };
        sent = true;
        if ignore_not_found(api.delete(pod_name, &params).await)?.is_some() {
            tracing::info!(node = %name, pod = %pod_name, grace, "deleting pod: termination deadline reached");
            state.queue().force_deleted(&key, &name);
            // A pod already deleting was counted (and told) when that deletion began.
            if forced.already_deleting {
                continue;
            }
            count_drained();
            if let Some(pod) = by_key.get(&key) {
                ctx.event(
                    pod.as_ref(),
                    Severity::Normal,
                    "Disrupted",
                    format!("Deleting the pod to accommodate the termination of node {name}: its termination grace period is up"),
                )
                .await;
            }
        }
    }

    for key in &due {
        sent = true;
        let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &key.namespace);
        let params = EvictParams {
            delete_options: Some(DeleteParams {
                preconditions: Some(Preconditions {
                    uid: (!key.uid.is_empty()).then(|| key.uid.clone()),
                    resource_version: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let (code, message) = match api.evict(&key.name, &params).await {
            Ok(_) => (200, String::new()),
            Err(kube::Error::Api(status)) => (status.code, status.message.clone()),
            Err(e) => {
                state
                    .queue()
                    .record(key, EvictionResponse::Failed, Instant::now());
                return Err(e.into());
            }
        };
        ctx.metrics
            .pods_eviction_requests
            .get_or_create(&labels([("code", &code.to_string())]))
            .inc();
        let response = EvictionResponse::classify(code, &message);
        state.queue().record(key, response, Instant::now());
        let pod = by_key.get(key);
        match (response, pod) {
            (EvictionResponse::Evicted, pod) => {
                count_drained();
                let Some(pod) = pod else { continue };
                ctx.event(
                    pod.as_ref(),
                    Severity::Normal,
                    "Evicted",
                    format!("Evicted pod: node {name} is terminating"),
                )
                .await;
            }
            (EvictionResponse::Blocked, Some(pod)) => {
                ctx.event(
                    pod.as_ref(),
                    Severity::Warning,
                    "FailedDraining",
                    format!("Failed to evict pod: {message}"),
                )
                .await;
            }
            (EvictionResponse::Failed, _) => {
                tracing::warn!(node = %name, pod = %key, code, %message, "eviction failed; retrying with backoff");
            }
            _ => {}
        }
    }

    let (blocked, next_due) = {
        let queue = state.queue();
        let blocked: Vec<String> = queue
            .blocked_on(&name)
            .iter()
            .map(ToString::to_string)
            .collect();
        (blocked, queue.next_due(&name, Instant::now()))
    };
    // Only passes that called the API report, and at most every 10 s: early in the backoff a
    // node is requeued several times a second.
    if sent && state.node_event_due(&name, "FailedDraining", Instant::now()) {
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
        ctx.event(node, Severity::Warning, "FailedDraining", message)
            .await;
    }
    Ok(next_due.map_or(DRAIN_REQUEUE, |d| {
        d.clamp(eviction::INITIAL_BACKOFF, DRAIN_REQUEUE)
    }))
}

/// Step 6: the node's VolumeAttachments (watched in cluster state), sparing those of pods the
/// drain leaves in place, and whether to keep waiting.
fn volume_detachment(
    ctx: &Context,
    node: &str,
    pods: &[Arc<Pod>],
    now: Timestamp,
    deadline: Option<Timestamp>,
) -> Detachment {
    let cluster = ctx.cluster.read();
    let attachments = cluster.volume_attachments_on(node);
    if attachments.is_empty() {
        return Detachment::Detached;
    }
    let spared: BTreeSet<String> = volumes::claims_of_undrained_pods(pods, now)
        .into_iter()
        .filter_map(|(namespace, claim)| {
            cluster
                .pvc(&namespace, &claim)?
                .spec
                .as_ref()?
                .volume_name
                .clone()
        })
        .collect();
    let blocking = volumes::blocking_attachments(&attachments, node, &spared);
    volumes::detachment(&blocking, now, deadline)
}

/// Whether the NodeClaim's `VolumesDetached` condition is not yet Unknown, i.e. setting it
/// now starts the wait for volume detachment.
fn awaiting_detachment_begins(claim: &NodeClaim) -> bool {
    claim
        .status
        .as_ref()
        .and_then(|s| s.conditions.get_condition(conditions::VOLUMES_DETACHED))
        .is_none_or(|c| c.status != ConditionStatus::Unknown)
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
        let api: Api<NodeClaim> = Api::all(ctx.client.clone());
        match absent_ok(patch_status(&api, current, &new).await)? {
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
    fn the_volume_wait_is_announced_only_when_it_begins() {
        use crate::state::testing::{nodeclaim, set_condition};
        let claim = nodeclaim("c", "pool", Some("exoscale://1"));
        assert!(awaiting_detachment_begins(&claim), "no condition yet");
        let waiting = set_condition(
            claim.clone(),
            conditions::VOLUMES_DETACHED,
            ConditionStatus::Unknown,
            0,
        );
        assert!(!awaiting_detachment_begins(&waiting), "already waiting");
        let settled = set_condition(
            claim,
            conditions::VOLUMES_DETACHED,
            ConditionStatus::True,
            0,
        );
        assert!(awaiting_detachment_begins(&settled));
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
