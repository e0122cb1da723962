//! Liveness: a NodeClaim that has not launched within the launch timeout, or whose Node has not
//! registered within the registration TTL, is deleted (and counted against its NodePool's
//! registration health); otherwise the pass comes back at the next deadline.

use kube::runtime::controller::Action;

use crate::controllers::Result;

use super::lifecycle::{Liveness, liveness};
use super::pass::{Pass, Step};
use super::reconcile::{delete_claim, record_registration};

pub async fn check(pass: &mut Pass<'_>) -> Result<Step> {
    let ctx = pass.ctx;
    match liveness(
        &pass.with_status(),
        pass.now,
        ctx.timings.launch_timeout,
        ctx.timings.registration_ttl,
    ) {
        Liveness::Expired(reason) => {
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
