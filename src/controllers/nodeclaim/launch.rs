//! Launch: the cloud creates the instance; its provider ID, image, capacity and labels are
//! recorded and `Launched` turns True. A failure either deletes the NodeClaim (no capacity, a
//! NodeClass not ready: provisioning tries again elsewhere) or leaves `Launched` Unknown with the
//! reason until the launch timeout.

use std::time::Duration;

use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;

use crate::apis::labels::conditions;
use crate::apis::{ConditionStatus, NodeClaim};
use crate::cloudprovider::CloudProviderError;
use crate::controllers::{Result, patch_nodeclaim_status, patch_object};
use crate::operator::events::{Severity, truncate};
use crate::state::nodeclaim_provider_id;

use super::lifecycle::{Liveness, liveness, merge_launched, set_ready};
use super::pass::{Pass, Step};
use super::reconcile::{delete_claim, record_registration};

/// How soon a failed launch is tried again.
const RETRY_LAUNCH: Duration = Duration::from_secs(10);

/// How long a launch's result is remembered (upstream's launch cache keeps it as long).
pub const RECENT_LAUNCH_TTL: Duration = Duration::from_secs(60);

/// What the cloud returned for the NodeClaims this process launched in the last
/// [`RECENT_LAUNCH_TTL`], by UID. The watch can deliver a NodeClaim again before our status
/// write (our own label patch does): a pass over that copy, which has no provider ID yet, reuses
/// the result instead of asking the cloud again (which would adopt the instance, one lookup
/// later). At 500 launches that was 173 instance lists.
#[derive(Default)]
pub struct RecentLaunches {
    entries: std::sync::Mutex<LaunchResults>,
}

/// Launch results by UID and by provider ID, and the order they came in, so that expiry and
/// lookups cost what they drop or find, not a scan of every launch of the last minute (each
/// Node event of a 1 000-node launch looked up its provider ID here).
#[derive(Default)]
struct LaunchResults {
    by_uid: std::collections::HashMap<String, (std::time::Instant, NodeClaim)>,
    uid_by_provider_id: std::collections::HashMap<String, String>,
    arrival: std::collections::VecDeque<(std::time::Instant, String)>,
}

fn expired(at: std::time::Instant, now: std::time::Instant) -> bool {
    now.saturating_duration_since(at) >= RECENT_LAUNCH_TTL
}

impl LaunchResults {
    /// Drops the results older than [`RECENT_LAUNCH_TTL`], oldest first. A result's time is
    /// taken before its create call, so arrivals can be slightly out of order: one kept
    /// behind a younger one is dropped a little late, and lookups check the time themselves.
    fn expire(&mut self, now: std::time::Instant) {
        while let Some((at, uid)) = self.arrival.front() {
            if !expired(*at, now) {
                break;
            }
            // The UID may have been launched again since: drop only the expired result.
            if self
                .by_uid
                .get(uid)
                .is_some_and(|(at, _)| expired(*at, now))
            {
                let (_, claim) = self.by_uid.remove(uid).expect("present");
                if let Some(provider_id) = nodeclaim_provider_id(&claim) {
                    self.uid_by_provider_id.remove(provider_id);
                }
            }
            self.arrival.pop_front();
        }
    }

    fn get(&self, uid: &str, now: std::time::Instant) -> Option<&NodeClaim> {
        let (at, claim) = self.by_uid.get(uid)?;
        (!expired(*at, now)).then_some(claim)
    }
}

impl RecentLaunches {
    fn get(&self, uid: &str, now: std::time::Instant) -> Option<NodeClaim> {
        self.unexpired(now).get(uid, now).cloned()
    }

    /// The provider ID this process's launch of the NodeClaim `uid` got, in the last
    /// [`RECENT_LAUNCH_TTL`]. Teardown asks when the NodeClaim records none: a NodeClaim
    /// deleted between its launch and the status write may never get it recorded, and an
    /// instance list taken just after the create may not show the VM yet.
    pub fn provider_id_of(&self, uid: &str, now: std::time::Instant) -> Option<String> {
        self.get(uid, now)
            .as_ref()
            .and_then(nodeclaim_provider_id)
            .map(str::to_string)
    }

    /// The name of the NodeClaim launched as `provider_id`. A Node can register before the
    /// watch brings the launch's status write, when the cluster index does not know the
    /// provider ID yet: its event would otherwise wake no NodeClaim.
    pub fn claim_launched_as(&self, provider_id: &str, now: std::time::Instant) -> Option<String> {
        let entries = self.unexpired(now);
        // The index holds only the provider ID of each UID's latest result: `insert` drops
        // the one it replaces, `expire` the one it drops.
        let uid = entries.uid_by_provider_id.get(provider_id)?;
        entries.get(uid, now).map(|launched| launched.name_any())
    }

    /// Keeps only what [`merge_launched`] takes from a launch: a whole NodeClaim (spec,
    /// conditions, owner) was ~1.3 MB after a 1 000-node launch.
    fn insert(&self, uid: &str, launched: &NodeClaim, now: std::time::Instant) {
        let mut entries = self.unexpired(now);
        let result = launch_result(launched);
        let replaced = entries.by_uid.get(uid).map(|(_, claim)| claim);
        if let Some(old) = replaced.and_then(nodeclaim_provider_id).map(str::to_string) {
            entries.uid_by_provider_id.remove(&old);
        }
        if let Some(provider_id) = nodeclaim_provider_id(&result) {
            entries
                .uid_by_provider_id
                .insert(provider_id.to_string(), uid.to_string());
        }
        entries.by_uid.insert(uid.to_string(), (now, result));
        entries.arrival.push_back((now, uid.to_string()));
    }

    /// The results, locked, once those older than [`RECENT_LAUNCH_TTL`] are dropped.
    fn unexpired(&self, now: std::time::Instant) -> std::sync::MutexGuard<'_, LaunchResults> {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.expire(now);
        entries
    }
}

/// The part of a launched NodeClaim that is merged into the NodeClaim being launched.
fn launch_result(launched: &NodeClaim) -> NodeClaim {
    let mut result = NodeClaim::new(&launched.name_any(), launched.spec.clone());
    // The spec's requirements list every instance type the claim allowed: not needed.
    result.spec.requirements = Vec::new();
    result.metadata.labels = launched.metadata.labels.clone();
    result.metadata.annotations = launched.metadata.annotations.clone();
    if let Some(status) = &launched.status {
        result.status = Some(crate::apis::NodeClaimStatus {
            provider_id: status.provider_id.clone(),
            image_id: status.image_id.clone(),
            capacity: status.capacity.clone(),
            allocatable: status.allocatable.clone(),
            ..Default::default()
        });
    }
    result
}

pub async fn launch(pass: &mut Pass<'_>) -> Result<Step> {
    if pass.is_true(conditions::LAUNCHED) {
        return Ok(Step::Continue);
    }
    // A provider ID means an earlier pass created the instance (or adopted it after an
    // outcome-unknown create): never create a second one.
    if nodeclaim_provider_id(&pass.claim).is_none() {
        let uid = pass.claim.metadata.uid.clone().unwrap_or_default();
        let now = std::time::Instant::now();
        let recent = pass.ctx.recent_launches.get(&uid, now);
        let result = match recent {
            Some(launched) => Ok(launched),
            None => pass
                .ctx
                .cloud
                .create(&pass.claim)
                .await
                .inspect(|launched| {
                    if !uid.is_empty() {
                        pass.ctx.recent_launches.insert(&uid, launched, now);
                    }
                }),
        };
        match result {
            Ok(launched) => {
                let merged = merge_launched(&pass.claim, &launched);
                let api: Api<NodeClaim> = Api::all(pass.ctx.client.clone());
                let written = patch_object(
                    &api,
                    &pass.name,
                    serde_json::json!({"metadata": {
                        "labels": merged.metadata.labels,
                        "annotations": merged.metadata.annotations,
                    }}),
                    None,
                )
                .await?;
                pass.wrote(written);
                let from = merged.status.unwrap_or_default();
                pass.status.provider_id = from.provider_id;
                pass.status.image_id = from.image_id;
                pass.status.capacity = from.capacity;
                pass.status.allocatable = from.allocatable;
            }
            Err(error) => return failed(pass, error).await.map(Step::Done),
        }
    }
    pass.set(
        conditions::LAUNCHED,
        ConditionStatus::True,
        conditions::LAUNCHED,
        "",
    );
    // karpenter_nodeclaims_created_total is counted where the NodeClaim is created
    // (provisioning, disruption replacements), as upstream; a launch is not a creation.
    Ok(Step::Continue)
}

async fn failed(pass: &mut Pass<'_>, error: CloudProviderError) -> Result<Action> {
    let ctx = pass.ctx;
    let claim: &NodeClaim = &pass.claim;
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
            let message = truncate(message, 300);
            pass.set(
                conditions::LAUNCHED,
                ConditionStatus::Unknown,
                reason,
                &message,
            );
        }
        other => {
            let message = truncate(&other.to_string(), 300);
            pass.set(
                conditions::LAUNCHED,
                ConditionStatus::Unknown,
                "LaunchFailed",
                &message,
            );
        }
    }
    tracing::warn!(nodeclaim = %pass.name, %error, "launch failed");
    if let Liveness::Expired(reason) = liveness(
        &pass.with_status(),
        pass.now,
        ctx.timings.launch_timeout,
        ctx.timings.registration_ttl,
    ) {
        record_registration(ctx, &pass.claim, false);
        delete_claim(ctx, &pass.claim, reason).await?;
        return Ok(Action::await_change());
    }
    let generation = pass.generation();
    set_ready(&mut pass.status, generation, pass.now);
    pass.claim = patch_nodeclaim_status(ctx, &pass.claim, &pass.status).await?;
    Ok(Action::requeue(RETRY_LAUNCH))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_launch_result_is_reused_by_uid_for_a_minute_then_forgotten() {
        let recent = RecentLaunches::default();
        let start = std::time::Instant::now();
        let launched = crate::state::testing::nodeclaim("a", "pool", Some("exoscale://i-1"));
        recent.insert("uid-a", &launched, start);
        let again = recent
            .get("uid-a", start + Duration::from_secs(59))
            .unwrap();
        assert_eq!(nodeclaim_provider_id(&again), Some("exoscale://i-1"));
        assert!(recent.get("uid-b", start).is_none());
        // A Node with that provider ID finds the claim before the watch brings its status.
        assert_eq!(
            recent.claim_launched_as("exoscale://i-1", start).as_deref(),
            Some("a")
        );
        assert_eq!(recent.claim_launched_as("exoscale://i-2", start), None);
        assert!(recent.get("uid-a", start + RECENT_LAUNCH_TTL).is_none());
        assert_eq!(
            recent.claim_launched_as("exoscale://i-1", start + RECENT_LAUNCH_TTL),
            None
        );
        let entries = recent.entries.lock().unwrap();
        assert!(
            entries.by_uid.is_empty()
                && entries.uid_by_provider_id.is_empty()
                && entries.arrival.is_empty(),
            "expired entries are dropped"
        );
    }

    #[test]
    fn launches_expire_by_their_own_time_even_when_recorded_out_of_order() {
        let recent = RecentLaunches::default();
        let start = std::time::Instant::now();
        let later = start + Duration::from_secs(5);
        let a = crate::state::testing::nodeclaim("a", "pool", Some("exoscale://i-1"));
        let b = crate::state::testing::nodeclaim("b", "pool", Some("exoscale://i-2"));
        // b's create call began first but finished second.
        recent.insert("uid-a", &a, later);
        recent.insert("uid-b", &b, start);
        let at_b_expiry = start + RECENT_LAUNCH_TTL;
        assert_eq!(
            recent.claim_launched_as("exoscale://i-2", at_b_expiry),
            None
        );
        assert!(recent.get("uid-b", at_b_expiry).is_none());
        assert_eq!(
            recent
                .claim_launched_as("exoscale://i-1", at_b_expiry)
                .as_deref(),
            Some("a")
        );
        recent.get("uid-a", later + RECENT_LAUNCH_TTL);
        let entries = recent.entries.lock().unwrap();
        assert!(entries.by_uid.is_empty() && entries.uid_by_provider_id.is_empty());
        assert!(entries.arrival.is_empty());
    }

    #[test]
    fn a_claim_launched_again_is_found_by_its_new_provider_id_only() {
        let recent = RecentLaunches::default();
        let start = std::time::Instant::now();
        let first = crate::state::testing::nodeclaim("a", "pool", Some("exoscale://i-1"));
        let second = crate::state::testing::nodeclaim("a", "pool", Some("exoscale://i-2"));
        recent.insert("uid-a", &first, start);
        let again = start + Duration::from_secs(30);
        recent.insert("uid-a", &second, again);
        assert_eq!(recent.claim_launched_as("exoscale://i-1", again), None);
        // The first arrival expires; the second result stays until its own time.
        let at_first_expiry = start + RECENT_LAUNCH_TTL;
        assert_eq!(
            recent
                .claim_launched_as("exoscale://i-2", at_first_expiry)
                .as_deref(),
            Some("a")
        );
        assert!(recent.get("uid-a", again + RECENT_LAUNCH_TTL).is_none());
        assert!(recent.entries.lock().unwrap().uid_by_provider_id.is_empty());
    }

    #[test]
    fn a_remembered_launch_merges_as_the_launch_itself_did() {
        use crate::apis::NodeClaimStatus;
        use crate::state::testing;
        let claim = testing::nodeclaim("a", "pool", None);
        let mut launched = testing::with_capacity(
            testing::nodeclaim("a", "pool", Some("exoscale://i-1")),
            &[("cpu", "4"), ("memory", "8Gi")],
        );
        launched.labels_mut().insert(
            "node.kubernetes.io/instance-type".into(),
            "standard.large".into(),
        );
        launched
            .annotations_mut()
            .insert("karpenter.exoscale.com/template".into(), "t-1".into());
        let status = launched.status.get_or_insert_with(NodeClaimStatus::default);
        status.image_id = Some("t-1".into());
        status.allocatable = status.capacity.clone();
        let launched =
            testing::set_condition(launched, conditions::LAUNCHED, ConditionStatus::True, 0);
        let recent = RecentLaunches::default();
        let start = std::time::Instant::now();
        recent.insert("uid-a", &launched, start);
        let remembered = recent.get("uid-a", start).unwrap();
        assert_eq!(
            serde_json::to_value(merge_launched(&claim, &remembered)).unwrap(),
            serde_json::to_value(merge_launched(&claim, &launched)).unwrap()
        );
        // Nothing but what the merge reads is kept.
        assert!(remembered.metadata.uid.is_none());
        assert!(remembered.status.unwrap().conditions.is_empty());
    }

    #[test]
    fn a_launch_prunes_expired_results() {
        let recent = RecentLaunches::default();
        let start = std::time::Instant::now();
        let launched = crate::state::testing::nodeclaim("a", "pool", Some("exoscale://i-1"));
        recent.insert("uid-a", &launched, start);
        recent.insert("uid-b", &launched, start + RECENT_LAUNCH_TTL);
        let entries = recent.entries.lock().unwrap();
        assert_eq!(entries.by_uid.keys().collect::<Vec<_>>(), ["uid-b"]);
        assert_eq!(entries.arrival.len(), 1);
    }
}
