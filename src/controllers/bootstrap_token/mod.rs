//! Bootstrap-token cleanup (exoscale-provider §3.2, defect 11 fixed): the cloud provider creates
//! one token Secret per NodeClaim at launch; this controller deletes it once the NodeClaim's
//! Node registered, the NodeClaim is gone, or the token expired. Runs on the leader only, on a
//! timer, reading NodeClaims from cluster state.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;

use crate::apis::ConditionsExt;
use crate::apis::labels::conditions;
use crate::providers::bootstrap_token::{self, NodeClaimState};
use crate::state::ClusterIndex;

use super::Context;

/// How often tokens are checked.
pub const INTERVAL: Duration = Duration::from_secs(30);

/// The state of every NodeClaim as the token decision needs it.
pub fn nodeclaim_states(index: &ClusterIndex) -> BTreeMap<String, NodeClaimState> {
    index
        .nodeclaims()
        .iter()
        .map(|c| {
            let registered = c
                .status
                .as_ref()
                .is_some_and(|s| s.conditions.is_true(conditions::REGISTERED));
            let state = if registered {
                NodeClaimState::Registered
            } else {
                NodeClaimState::Launching
            };
            (c.name_any(), state)
        })
        .collect()
}

/// One cleanup pass; returns how many tokens were deleted.
pub async fn cleanup_once(ctx: &Context) -> Result<usize, bootstrap_token::TokenError> {
    if !ctx.cluster.synced() {
        // Without a complete NodeClaim list every token would look orphaned.
        return Ok(0);
    }
    let secrets = bootstrap_token::list_tokens(&ctx.client).await?;
    let states = nodeclaim_states(&ctx.cluster.read());
    let now = chrono::DateTime::from_timestamp(ctx.clock.now_unix(), 0).unwrap_or_default();
    let doomed = bootstrap_token::tokens_to_delete(&secrets, &states, now);
    for (name, reason) in &doomed {
        tracing::info!(secret = %name, ?reason, "deleting bootstrap token");
        bootstrap_token::delete_token(&ctx.client, name).await?;
    }
    Ok(doomed.len())
}

/// Runs cleanup passes until the task is dropped.
pub async fn run(ctx: Arc<Context>) {
    loop {
        if let Err(error) = cleanup_once(&ctx).await {
            tracing::warn!(%error, "bootstrap token cleanup failed");
        }
        tokio::time::sleep(INTERVAL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::testing::{nodeclaim, registered};

    #[test]
    fn registered_claims_release_their_tokens() {
        let mut index = ClusterIndex::default();
        index.apply_nodeclaim(nodeclaim("launching", "p", None));
        index.apply_nodeclaim(registered(nodeclaim("joined", "p", Some("exoscale://1"))));
        let states = nodeclaim_states(&index);
        assert_eq!(states["launching"], NodeClaimState::Launching);
        assert_eq!(states["joined"], NodeClaimState::Registered);
        assert_eq!(states.len(), 2);
    }
}
