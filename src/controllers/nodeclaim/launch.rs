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
use crate::controllers::{Result, patch_object, patch_status};
use crate::operator::events::{Severity, truncate};
use crate::state::nodeclaim_provider_id;

use super::lifecycle::{Liveness, liveness, merge_launched, set_ready};
use super::pass::{Pass, Step};
use super::reconcile::{delete_claim, record_registration};

/// How soon a failed launch is tried again.
const RETRY_LAUNCH: Duration = Duration::from_secs(10);

pub async fn launch(pass: &mut Pass<'_>) -> Result<Step> {
    if pass.is_true(conditions::LAUNCHED) {
        return Ok(Step::Continue);
    }
    // A provider ID means an earlier pass created the instance (or adopted it after an
    // outcome-unknown create): never create a second one.
    if nodeclaim_provider_id(&pass.claim).is_none() {
        match pass.ctx.cloud.create(&pass.claim).await {
            Ok(launched) => {
                let merged = merge_launched(&pass.claim, &launched);
                let api: Api<NodeClaim> = Api::all(pass.ctx.client.clone());
                pass.claim = patch_object(
                    &api,
                    &pass.name,
                    serde_json::json!({"metadata": {
                        "labels": merged.metadata.labels,
                        "annotations": merged.metadata.annotations,
                    }}),
                    None,
                )
                .await?;
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
    let api: Api<NodeClaim> = Api::all(ctx.client.clone());
    patch_status(&api, &pass.claim, &pass.status).await?;
    Ok(Action::requeue(RETRY_LAUNCH))
}
