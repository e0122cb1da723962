//! Step 5 of Node termination: drain in upstream's order through the eviction API, each pod
//! paced by the eviction queue's backoff while PDBs refuse it, force-deleting what the
//! termination deadline forces; then `Drained` once no pod is left for `MIN_DRAIN_TIME`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, EvictParams, Preconditions};
use kube::runtime::controller::Action;

use crate::apis::labels::{NODEPOOL_LABEL, conditions};
use crate::apis::{ConditionStatus, ConditionsExt};
use crate::controllers::{Result, ignore_not_found};
use crate::operator::events::Severity;
use crate::operator::metrics::labels;

use super::super::drain::{DrainPlan, PodAction, plan};
use super::super::eviction::{self, EvictionResponse, PodKey};
use super::{DRAIN_REQUEUE, MIN_DRAIN_TIME, Pass};

/// `Drained=Unknown` (reason `Draining`) on the NodeClaim.
async fn mark_draining(pass: &mut Pass<'_>) -> Result<()> {
    pass.set_claim_condition(
        conditions::DRAINED,
        ConditionStatus::Unknown,
        conditions::DRAINING_REASON,
        "Draining the node",
    )
    .await
}

/// Drains the node; `Some(action)` while there is still something to wait for.
pub(super) async fn drain(pass: &mut Pass<'_>) -> Result<Option<Action>> {
    let drain = plan(&pass.pods, pass.now, pass.deadline);
    if !drain.is_drained() {
        mark_draining(pass).await?;
        let reason = pass
            .claim
            .as_ref()
            .and_then(|c| c.status.as_ref())
            .and_then(|s| s.conditions.get_condition(conditions::DISRUPTION_REASON))
            .map(|c| c.reason.clone())
            .unwrap_or_default();
        let requeue = evict_and_delete(pass, &drain, &reason).await?;
        return Ok(Some(Action::requeue(requeue)));
    }
    pass.state.queue().forget_node(&pass.name);
    if let Some(current) = &pass.claim {
        let status = current.status.as_ref();
        let draining_since = status
            .and_then(|s| s.conditions.get_condition(conditions::DRAINED))
            .filter(|c| c.status == ConditionStatus::Unknown)
            .map(|c| c.last_transition_time.0);
        let drained = status.is_some_and(|s| s.conditions.is_true(conditions::DRAINED));
        match draining_since {
            None if !drained => {
                mark_draining(pass).await?;
                return Ok(Some(Action::requeue(MIN_DRAIN_TIME)));
            }
            Some(since) => {
                let waited = pass.now.duration_since(since).as_secs();
                if waited < MIN_DRAIN_TIME.as_secs() as i64 {
                    return Ok(Some(Action::requeue(Duration::from_secs(
                        (MIN_DRAIN_TIME.as_secs() as i64 - waited).max(1) as u64,
                    ))));
                }
                pass.set_claim_condition(
                    conditions::DRAINED,
                    ConditionStatus::True,
                    conditions::DRAINED,
                    "",
                )
                .await?;
                pass.ctx
                    .metrics
                    .nodes_drained
                    .get_or_create(&labels([(
                        "nodepool",
                        pass.node
                            .labels()
                            .get(NODEPOOL_LABEL)
                            .map(String::as_str)
                            .unwrap_or(""),
                    )]))
                    .inc();
            }
            None => {}
        }
    }
    Ok(None)
}

/// One pass over a node still being drained: force-deletes what the deadline forces, sends
/// the evictions whose backoff elapsed, and says when to look again.
async fn evict_and_delete(
    pass: &Pass<'_>,
    drain: &DrainPlan,
    disruption_reason: &str,
) -> Result<Duration> {
    let (ctx, state, node, pods) = (pass.ctx, pass.state, pass.node, &pass.pods);
    let name = pass.name.clone();
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
    let by_key: BTreeMap<PodKey, &Arc<crate::state::HeldPod>> = pods
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
            // Saturating: a grace beyond u32 (a huge terminationGracePeriod) is not cut short.
            grace_period_seconds: Some(u32::try_from(grace.max(0)).unwrap_or(u32::MAX)),
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
