//! Expiration (karpenter-core §4.3): a NodeClaim older than `expireAfter` is deleted at once,
//! regardless of disruption budgets; the drain then honours PDBs until the TGP deadline.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;

use crate::apis::NodeClaim;
use crate::apis::duration::parse_nillable_duration;
use crate::controllers::Result;
use crate::operator::metrics::labels;

use super::pass::{Pass, Step};
use super::reconcile::{delete_claim, nodepool_of};

/// What the expiration controller does with a NodeClaim.
#[derive(Debug, PartialEq, Eq)]
pub enum Expiration {
    /// `Never`, already deleting, or unparsable: nothing to do.
    Never,
    /// Check again at expiry.
    At(Duration),
    /// Delete now.
    Expired,
}

pub fn expiration(claim: &NodeClaim, now: Timestamp) -> Expiration {
    if claim.metadata.deletion_timestamp.is_some() {
        return Expiration::Never;
    }
    let Ok(Some(ttl)) = parse_nillable_duration(&claim.spec.expire_after) else {
        return Expiration::Never;
    };
    let Some(created) = claim.metadata.creation_timestamp.as_ref().map(|t| t.0) else {
        return Expiration::Never;
    };
    let age = now.duration_since(created).as_secs().max(0) as u64;
    if age >= ttl.as_secs() {
        Expiration::Expired
    } else {
        Expiration::At(Duration::from_secs(ttl.as_secs() - age))
    }
}

/// The expiration sub-step: deletes an expired NodeClaim, else comes back at expiry.
pub async fn expire(pass: &mut Pass<'_>) -> Result<Step> {
    match expiration(&pass.claim, pass.now) {
        Expiration::Expired => {
            let ctx = pass.ctx;
            let claim = &pass.claim;
            tracing::info!(nodeclaim = %pass.name, "NodeClaim expired");
            delete_claim(ctx, claim, "expired").await?;
            // As disruption counts: the pods that must move, not DaemonSet, mirror or
            // finished ones.
            let node = claim
                .status
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .unwrap_or("");
            let pods = ctx
                .cluster
                .read()
                .pods_on_node(node)
                .iter()
                .filter(|p| crate::state::pods::is_reschedulable(p))
                .count();
            ctx.metrics
                .pods_disruption_initiated
                .get_or_create(&labels([
                    ("reason", "expired"),
                    ("nodepool", &nodepool_of(claim)),
                ]))
                .inc_by(pods as u64);
            Ok(Step::Done(Action::await_change()))
        }
        Expiration::At(after) => {
            pass.requeue_within(after);
            Ok(Step::Continue)
        }
        Expiration::Never => Ok(Step::Continue),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::testing::{nodeclaim, ts};

    #[test]
    fn expires_after_the_configured_lifetime() {
        let mut claim = nodeclaim("c", "p", Some("exoscale://i"));
        claim.spec.expire_after = "1h".into();
        assert_eq!(
            expiration(&claim, ts(600).0),
            Expiration::At(Duration::from_secs(3000))
        );
        assert_eq!(expiration(&claim, ts(3600).0), Expiration::Expired);
        claim.spec.expire_after = "Never".into();
        assert_eq!(expiration(&claim, ts(1_000_000).0), Expiration::Never);
        claim.spec.expire_after = "1h".into();
        claim.metadata.deletion_timestamp = Some(ts(10));
        assert_eq!(expiration(&claim, ts(4000).0), Expiration::Never);
    }
}
