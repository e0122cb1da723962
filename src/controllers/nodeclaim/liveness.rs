//! Liveness: a NodeClaim that has not launched within the launch timeout, or whose Node has not
//! registered within the registration TTL, is deleted (and counted against its NodePool's
//! registration health); otherwise the pass comes back at the next deadline.

use std::time::Duration;

use kube::runtime::controller::Action;

use crate::controllers::Result;
use crate::controllers::node::termination::AWAITING_CLUSTER_STATE;
use crate::operator::events::Severity;
use crate::state::Kind;

use super::lifecycle::{Liveness, REGISTRATION_TIMEOUT, liveness};
use super::pass::{Pass, Step};
use super::reconcile::{delete_claim, record_registration};

/// How often a registration timeout looks again for a complete Node list.
const NODE_LIST_POLL: Duration = Duration::from_secs(1);

pub async fn check(pass: &mut Pass<'_>) -> Result<Step> {
    let ctx = pass.ctx;
    match liveness(
        &pass.with_status(),
        pass.now,
        ctx.timings.launch_timeout,
        ctx.timings.registration_ttl,
    ) {
        Liveness::Expired(reason) => {
            // "Not registered" is read from the Node list: before it is complete, or while its
            // watch is down, a Node that joined while no controller ran (a restart after an
            // outage longer than the TTL) looks absent, and every such NodeClaim, its Node
            // and its VM would go.
            if reason == REGISTRATION_TIMEOUT && !ctx.cluster.read().current(Kind::Node) {
                ctx.event(
                    &pass.claim,
                    Severity::Normal,
                    AWAITING_CLUSTER_STATE,
                    "The registration timeout waits for the Node list before it deletes the NodeClaim",
                )
                .await;
                pass.requeue_within(NODE_LIST_POLL);
                return Ok(Step::Continue);
            }
            tracing::info!(nodeclaim = %pass.name, reason, "NodeClaim did not register in time");
            record_registration(ctx, &pass.claim, false);
            delete_claim(ctx, &pass.claim, reason).await?;
            Ok(Step::Done(Action::await_change()))
        }
        Liveness::RecheckAfter(after) => {
            pass.requeue_within(after);
            Ok(Step::Continue)
        }
        Liveness::Alive => Ok(Step::Continue),
    }
}
