//! The disruption conditions controller: keeps `Consolidatable`, `Drifted` and `Empty` on every
//! NodeClaim (status subresource, optimistic lock) from the pure `disruption::conditions`, and
//! stamps `lastPodEventTime` with the instant the cluster index saw a pod arrive on or leave
//! the node (not the instant of the pass).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures::StreamExt;
use kube::ResourceExt;
use serde_json::json;

use crate::apis::labels::{NODEPOOL_LABEL, conditions};
use crate::apis::{NodeClaim, NodePool};
use crate::controllers::{Context, patch_nodeclaim_status};
use crate::disruption::conditions::{
    self as decide, ConditionDecision, DriftInputs, EMPTY, consolidatable, drifted,
};
use crate::operator::events::Severity;
use crate::scheduling::InstanceType;

use super::decisions::{apply_decision, timestamp};
use super::view::node_pod;

/// NodeClaim status writes of one pass in flight at once.
const STATUS_WRITES_IN_FLIGHT: usize = 8;

/// Instance types for instance-type drift are fetched at most this often per NodePool.
pub const INSTANCE_TYPE_REFRESH: Duration = Duration::from_secs(30 * 60);

/// State kept between passes.
/// The Go provider's event for a NodeClaim its provider found drifted.
pub const DRIFT_DETECTED: &str = "DriftDetected";

pub struct ConditionsController {
    ctx: Arc<Context>,
    provider_drift_interval: Duration,
    provider_drift: HashMap<String, (Instant, Option<String>)>,
    instance_types: HashMap<String, (Instant, Vec<Arc<InstanceType>>)>,
}

/// The conditions one NodeClaim should carry.
pub struct Desired {
    pub consolidatable: ConditionDecision,
    pub drifted: ConditionDecision,
    pub empty: ConditionDecision,
}

/// The NodeClaim's conditions with the desired ones applied (and `lastPodEventTime` when a pod
/// event newer than the stamped one happened); `None` when nothing changes.
pub fn updated_status(
    claim: &NodeClaim,
    desired: &Desired,
    pod_event: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Option<serde_json::Value> {
    let status = claim.status.clone().unwrap_or_default();
    let mut conds = status.conditions.clone();
    let mut changed = false;
    changed |= apply_decision(
        &mut conds,
        conditions::CONSOLIDATABLE,
        &desired.consolidatable,
        now,
    );
    changed |= apply_decision(&mut conds, conditions::DRIFTED, &desired.drifted, now);
    changed |= apply_decision(&mut conds, EMPTY, &desired.empty, now);
    if !changed && pod_event.is_none() {
        return None;
    }
    let mut out = json!({ "conditions": conds });
    if let Some(at) = pod_event {
        out["lastPodEventTime"] = json!(timestamp(at).to_string());
    }
    Some(out)
}

/// The index's last pod event on the claim's node when it is later than the one stamped
/// (stamps are whole seconds, as the API keeps them).
fn newer_pod_event(claim: &NodeClaim, seen: Option<DateTime<Utc>>) -> Option<DateTime<Utc>> {
    let stamped = claim
        .status
        .as_ref()
        .and_then(|s| s.last_pod_event_time.as_ref())
        .map(|t| t.0.as_second());
    seen.filter(|at| stamped.is_none_or(|s| at.timestamp() > s))
}

impl ConditionsController {
    pub fn new(ctx: Arc<Context>, provider_drift_interval: Duration) -> Self {
        ConditionsController {
            ctx,
            provider_drift_interval,
            provider_drift: HashMap::new(),
            instance_types: HashMap::new(),
        }
    }

    fn now(&self) -> DateTime<Utc> {
        DateTime::from_timestamp(self.ctx.clock.now_unix(), 0).unwrap_or_default()
    }

    /// One pass over every NodeClaim: the conditions are decided one NodeClaim at a time
    /// (the provider's drift answers are cached per NodeClaim), then the changed statuses are
    /// written [`STATUS_WRITES_IN_FLIGHT`] at a time, so a scale-down that empties 1 000 nodes
    /// is not 1 000 round trips in a row.
    pub async fn reconcile_all(&mut self) {
        let claims = self.ctx.cluster.read().nodeclaims();
        let live: BTreeSet<String> = claims.iter().map(|c| c.name_any()).collect();
        self.provider_drift.retain(|name, _| live.contains(name));
        let mut writes = Vec::new();
        for claim in claims {
            // Another Karpenter's claims get their disruption conditions from it.
            if claim.metadata.deletion_timestamp.is_some()
                || !self.ctx.cloud.serves(&claim.spec.node_class_ref)
            {
                continue;
            }
            match self.desired_status(&claim).await {
                Ok(Some(status)) => writes.push((claim, status)),
                Ok(None) => {}
                Err(error) => {
                    tracing::debug!(nodeclaim = %claim.name_any(), %error, "disruption conditions not decided")
                }
            }
        }
        let ctx = &self.ctx;
        futures::stream::iter(writes)
            .for_each_concurrent(STATUS_WRITES_IN_FLIGHT, |(claim, status)| {
                async move {
                    match patch_nodeclaim_status(ctx, claim.as_ref(), &status).await {
                        Ok(updated) => ctx
                            .cluster
                            .update(|index| index.apply_written_nodeclaim(&claim, updated)),
                        // A conflict means a newer NodeClaim: the next pass decides from it.
                        Err(error) => {
                            tracing::debug!(nodeclaim = %claim.name_any(), %error, "disruption conditions not updated")
                        }
                    }
                }
            })
            .await;
    }

    async fn types_of(&mut self, pool: &NodePool) -> Option<Vec<Arc<InstanceType>>> {
        let name = pool.name_any();
        if let Some((at, types)) = self.instance_types.get(&name)
            && at.elapsed() < INSTANCE_TYPE_REFRESH
        {
            return Some(types.clone());
        }
        match self.ctx.cloud.instance_types(pool).await {
            Ok(types) => {
                self.instance_types
                    .insert(name, (Instant::now(), types.clone()));
                Some(types)
            }
            Err(error) => {
                tracing::debug!(nodepool = %name, %error, "instance types for drift unavailable");
                None
            }
        }
    }

    /// The provider's drift reason for `claim`, asked at most once per interval; a newly found
    /// drift is told on the NodeClaim (`DriftDetected`, naming what differs), as the Go
    /// provider does.
    async fn provider_drift_of(&mut self, claim: &NodeClaim) -> Option<String> {
        let name = claim.name_any();
        let previous = self.provider_drift.get(&name).cloned();
        if let Some((at, reason)) = &previous
            && at.elapsed() < self.provider_drift_interval
        {
            return reason.clone();
        }
        let reason = match self.ctx.cloud.is_drifted(claim).await {
            Ok(Some(drift)) => {
                let known = previous.as_ref().and_then(|(_, r)| r.as_deref());
                if known != Some(drift.reason.as_str()) {
                    self.ctx
                        .event(claim, Severity::Normal, DRIFT_DETECTED, drift.message)
                        .await;
                }
                Some(drift.reason)
            }
            Ok(None) => None,
            Err(error) => {
                tracing::debug!(nodeclaim = %name, %error, "provider drift check failed");
                // Keep the last answer; ask again next interval.
                previous.and_then(|(_, r)| r)
            }
        };
        self.provider_drift
            .insert(name, (Instant::now(), reason.clone()));
        reason
    }

    /// The status `claim` should have, when it differs from what it has.
    async fn desired_status(
        &mut self,
        claim: &NodeClaim,
    ) -> crate::controllers::Result<Option<serde_json::Value>> {
        let Some(pool_name) = claim.labels().get(NODEPOOL_LABEL).cloned() else {
            return Ok(None);
        };
        let Some(pool) = self.ctx.cluster.read().nodepool(&pool_name) else {
            return Ok(None);
        };
        let now = self.now();
        let launched = claim.status.as_ref().is_some_and(|s| {
            crate::apis::ConditionsExt::is_true(&s.conditions, conditions::LAUNCHED)
        });
        let (types, provider) = if launched {
            (
                self.types_of(&pool).await,
                self.provider_drift_of(claim).await,
            )
        } else {
            (None, None)
        };
        let node_name = claim.status.as_ref().and_then(|s| s.node_name.clone());
        let (empty, pod_event) = match node_name {
            Some(node) if self.ctx.cluster.read().node(&node).is_some() => {
                let pods = self.ctx.cluster.read().pods_on_node(&node);
                let reschedulable = pods
                    .iter()
                    .filter_map(|p| node_pod(p))
                    .filter(|p| p.is_reschedulable())
                    .count();
                let last = self.ctx.cluster.read().last_pod_event(&node);
                (decide::empty(reschedulable), newer_pod_event(claim, last))
            }
            _ => (ConditionDecision::Remove, None),
        };
        // A pod event restarts the consolidateAfter clock at once.
        let mut seen = claim.clone();
        if let Some(at) = pod_event {
            seen.status
                .get_or_insert_with(Default::default)
                .last_pod_event_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                timestamp(at),
            ));
        }
        let consolidatable = consolidatable(&seen, &pool, now)
            .map_err(|e| crate::controllers::Error::Invalid(e.to_string()))?;
        let drifted = drifted(
            claim,
            &pool,
            &DriftInputs {
                now,
                instance_types: types.as_deref(),
                provider_drift: provider.as_deref(),
            },
        );
        let desired = Desired {
            consolidatable,
            drifted,
            empty,
        };
        Ok(updated_status(claim, &desired, pod_event, now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::testing;

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000 + s, 0).unwrap()
    }

    #[test]
    fn status_changes_only_when_a_condition_or_the_pods_change() {
        let claim = testing::registered(testing::nodeclaim("c", "p", Some("exoscale://c")));
        let desired = Desired {
            consolidatable: ConditionDecision::SetTrue {
                reason: conditions::CONSOLIDATABLE.into(),
                message: String::new(),
            },
            drifted: ConditionDecision::Remove,
            empty: ConditionDecision::Remove,
        };
        let status = updated_status(&claim, &desired, None, at(10)).expect("a new condition");
        let conds = status["conditions"].as_array().unwrap();
        assert!(
            conds
                .iter()
                .any(|c| c["type"] == "Consolidatable" && c["status"] == "True")
        );
        assert!(
            conds.iter().any(|c| c["type"] == "Launched"),
            "other conditions are kept"
        );
        assert!(status.get("lastPodEventTime").is_none());

        let mut settled = claim.clone();
        settled.status.as_mut().unwrap().conditions =
            serde_json::from_value(status["conditions"].clone()).unwrap();
        assert!(updated_status(&settled, &desired, None, at(20)).is_none());
        // The event is stamped with when it happened, not when the pass wrote it.
        let with_event = updated_status(&settled, &desired, Some(at(14)), at(20)).unwrap();
        assert_eq!(with_event["lastPodEventTime"], "2023-11-14T22:13:34Z");
    }

    #[test]
    fn only_a_pod_event_later_than_the_stamped_one_is_written() {
        let mut claim = testing::registered(testing::nodeclaim("c", "p", Some("exoscale://c")));
        assert_eq!(newer_pod_event(&claim, None), None);
        assert_eq!(
            newer_pod_event(&claim, Some(at(5))),
            Some(at(5)),
            "none stamped yet"
        );
        claim.status.as_mut().unwrap().last_pod_event_time = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(timestamp(at(5))),
        );
        assert_eq!(
            newer_pod_event(&claim, Some(at(5))),
            None,
            "already stamped"
        );
        assert_eq!(
            newer_pod_event(&claim, Some(at(4))),
            None,
            "older than the stamp"
        );
        assert_eq!(newer_pod_event(&claim, Some(at(6))), Some(at(6)));
    }
}
