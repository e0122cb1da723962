//! Step 6 of Node termination: wait for the node's VolumeAttachments to go (sparing those of
//! pods the drain leaves in place) or for the termination deadline, saying so once.

use std::collections::BTreeSet;
use std::time::Instant;

use kube::runtime::controller::Action;

use crate::apis::labels::conditions;
use crate::apis::{ConditionStatus, ConditionsExt, NodeClaim};
use crate::controllers::Result;
use crate::operator::events::Severity;
use crate::state::Kind;

use super::super::volumes::{self, Detachment};
use super::{Pass, VOLUME_REQUEUE};

/// Waits for volume detachment; `Some(action)` while waiting.
pub(super) async fn detach_volumes(pass: &mut Pass<'_>) -> Result<Option<Action>> {
    let settled = pass
        .claim
        .as_ref()
        .and_then(|c| c.status.as_ref())
        .and_then(|s| s.conditions.get_condition(conditions::VOLUMES_DETACHED))
        .is_some_and(|c| c.status != ConditionStatus::Unknown);
    if !settled {
        // Before the first list of VolumeAttachments, no attachment does not mean none.
        if !pass.ctx.cluster.read().listed(Kind::VolumeAttachment) {
            return Ok(Some(Action::requeue(VOLUME_REQUEUE)));
        }
        let detachment = volume_detachment(pass);
        match detachment {
            Detachment::Detached => {
                pass.set_claim_condition(
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
                let first_wait = match &pass.claim {
                    Some(claim) => awaiting_detachment_begins(claim),
                    None => pass.state.node_event_due(
                        &pass.name,
                        conditions::AWAITING_VOLUME_DETACHMENT_REASON,
                        Instant::now(),
                    ),
                };
                pass.set_claim_condition(
                    conditions::VOLUMES_DETACHED,
                    ConditionStatus::Unknown,
                    conditions::AWAITING_VOLUME_DETACHMENT_REASON,
                    "Awaiting deletion of bound VolumeAttachments",
                )
                .await?;
                if first_wait {
                    pass.ctx
                        .event(
                            pass.node,
                            Severity::Normal,
                            conditions::AWAITING_VOLUME_DETACHMENT_REASON,
                            format!(
                                "Awaiting deletion of bound VolumeAttachments ({})",
                                attachments.join(", ")
                            ),
                        )
                        .await;
                }
                return Ok(Some(Action::requeue(VOLUME_REQUEUE)));
            }
            Detachment::DeadlinePassed(attachments) => {
                tracing::info!(node = %pass.name, attachments = %attachments.join(","), "termination grace period elapsed; not waiting for volume detachment");
                pass.set_claim_condition(
                    conditions::VOLUMES_DETACHED,
                    ConditionStatus::False,
                    conditions::TERMINATION_GRACE_PERIOD_ELAPSED_REASON,
                    "Termination grace period elapsed before all VolumeAttachments were deleted",
                )
                .await?;
            }
        }
    }
    Ok(None)
}

/// The node's VolumeAttachments (watched in cluster state), sparing those of pods the
/// drain leaves in place, and whether to keep waiting.
fn volume_detachment(pass: &Pass<'_>) -> Detachment {
    let (node, pods, now, deadline) = (pass.name.as_str(), &pass.pods, pass.now, pass.deadline);
    let cluster = pass.ctx.cluster.read();
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
