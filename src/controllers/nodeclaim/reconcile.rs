//! The NodeClaim controller: finalizer, then upstream's sub-steps in order while alive —
//! expiration (`expiration`), launch (`launch`), registration (`registration`), initialization
//! (`initialization`), consistency (`consistency`), liveness (`liveness`) — sharing one
//! [`Pass`]; teardown when deleted (`finalize`). Waiting is always a requeue.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use kube::runtime::controller::Action;

use crate::apis::NodeClaim;
use crate::apis::duration::parse_duration;
use crate::apis::labels::{
    NODECLAIM_TERMINATION_TIMESTAMP_ANNOTATION, NODEPOOL_LABEL, TERMINATION_FINALIZER,
};
use crate::cloudprovider::CloudProvider;
use crate::controllers::{
    Context, Result, add_finalizer, ignore_not_found, patch_nodeclaim_status,
};
use crate::state::ClusterIndex;

use super::finalize::finalize;
use super::lifecycle::set_ready;
use super::pass::{Pass, Step};
use super::{consistency, expiration, initialization, launch, liveness, registration};

/// Resync of a NodeClaim that is waiting for nothing in particular.
const RESYNC: Duration = Duration::from_secs(60);

/// When a pass that found its copy older than our own last write looks again, should the
/// watch event that carries the write not trigger it first.
const STALE_COPY_RECHECK: Duration = Duration::from_secs(2);

/// NodeClaims of a NodeClass kind the provider serves; others belong to another provider.
pub fn is_managed(claim: &NodeClaim, cloud: &dyn CloudProvider) -> bool {
    cloud.serves(&claim.spec.node_class_ref)
}

pub(super) fn nodepool_of(claim: &NodeClaim) -> String {
    claim
        .labels()
        .get(NODEPOOL_LABEL)
        .cloned()
        .unwrap_or_default()
}

/// The termination deadline: deletion time + terminationGracePeriod. A grace period that
/// ends beyond the last representable instant has no practical deadline: `None`, as without
/// one (never a wrapped, past deadline that would force-delete every pod at once).
pub fn termination_deadline(claim: &NodeClaim) -> Option<Timestamp> {
    let deleted = claim.metadata.deletion_timestamp.as_ref()?.0;
    let tgp = parse_duration(claim.spec.termination_grace_period.as_deref()?).ok()?;
    let grace = SignedDuration::try_from(tgp).ok()?;
    deleted.checked_add(grace).ok()
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

pub(super) fn record_registration(ctx: &Context, claim: &NodeClaim, success: bool) {
    if let Some((pool, epoch)) = epoch(ctx, claim) {
        ctx.registration_health.record(&pool, &epoch, success);
    }
}

pub(super) async fn delete_claim(ctx: &Context, claim: &NodeClaim, reason: &str) -> Result<()> {
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
    // A copy one of our writes replaced: the pass goes on from that write's answer, kept
    // until the watch brings it; without it, it waits for the watch, whose event triggers the
    // next pass (the requeue only covers a lost event).
    let Some(claim) = ctx.superseded.current(&claim, std::time::Instant::now()) else {
        tracing::debug!(
            nodeclaim = %claim.name_any(),
            resource_version = claim.metadata.resource_version.as_deref().unwrap_or_default(),
            "copy replaced by our own write, whose answer is not kept: waiting for the watch"
        );
        return Ok(Action::requeue(STALE_COPY_RECHECK));
    };
    if claim.metadata.deletion_timestamp.is_some() {
        ctx.superseded
            .forget(claim.metadata.uid.as_deref().unwrap_or_default());
        return finalize(&claim, &ctx).await;
    }
    let api: Api<NodeClaim> = Api::all(ctx.client.clone());
    let read = claim.as_ref().clone();
    let mut pass = Pass {
        ctx: &ctx,
        name: claim.name_any(),
        status: claim.status.clone().unwrap_or_default(),
        claim: read,
        now: ctx.now(),
        requeue: RESYNC,
        arrival: None,
    };
    // Never launch without the finalizer: it guarantees the instance is deleted with the claim.
    // (add_finalizer returns the copy unchanged, at the same version, when it has it.)
    let with_finalizer = add_finalizer(&api, &pass.claim, TERMINATION_FINALIZER).await?;
    pass.wrote(with_finalizer);
    // Upstream's sub-reconcilers, in order; each may end the pass.
    if let Step::Done(action) = expiration::expire(&mut pass).await? {
        return Ok(action);
    }
    if let Step::Done(action) = launch::launch(&mut pass).await? {
        return Ok(action);
    }
    registration::register(&mut pass).await?;
    initialization::initialize(&mut pass).await?;
    consistency::check(&mut pass).await?;
    if let Step::Done(action) = liveness::check(&mut pass).await? {
        return Ok(action);
    }
    let generation = pass.generation();
    set_ready(&mut pass.status, generation, pass.now);
    if pass.claim.status.clone().unwrap_or_default() != pass.status {
        // (patch_nodeclaim_status records the version it replaced.) A Node that registers
        // while this write is in flight is synced beside it, not after it.
        let arrival = pass.arrival.take();
        let write = patch_nodeclaim_status(&ctx, &pass.claim, &pass.status);
        let beside = match arrival {
            Some(arrival) => {
                registration::sync_on_arrival(&ctx, &pass.with_status(), arrival, write).await
            }
            None => registration::WrittenBeside {
                written: write.await,
                synced: None,
            },
        };
        pass.claim = beside.written?;
        if let Some(node) = beside.synced {
            registration::registered(&mut pass, &node);
            set_ready(&mut pass.status, generation, pass.now);
            pass.claim = patch_nodeclaim_status(&ctx, &pass.claim, &pass.status).await?;
        }
    }
    Ok(Action::requeue(pass.requeue.max(Duration::from_secs(1))))
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
    fn a_grace_period_too_long_to_represent_has_no_deadline_rather_than_a_past_one() {
        let mut claim = nodeclaim("c", "p", Some("exoscale://i"));
        claim.metadata.deletion_timestamp = Some(ts(100));
        // Both pass the CRD pattern and parse_duration; as i64 seconds they wrap negative.
        for grace in [
            "18446744073709551615s",
            "5124095576030431h",
            "100000000000s",
        ] {
            claim.spec.termination_grace_period = Some(grace.into());
            let deadline = termination_deadline(&claim);
            assert!(
                deadline.is_none_or(|d| d >= ts(100).0),
                "{grace}: deadline {deadline:?} is before the deletion"
            );
        }
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
