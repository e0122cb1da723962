//! Bootstrap-token cleanup (exoscale-provider §3.2, defect 11 fixed): the cloud provider creates
//! one token Secret per launch and records its name on the NodeClaim; this controller deletes
//! the recorded tokens once the NodeClaim's Node registered, then drops the record. Tokens of a
//! NodeClaim deleted before that go with its instance (the provider's delete). Secrets are
//! never listed or read — the controller may only create and delete them — so a token whose
//! name was never recorded (a crash between creating it and recording it) is left to expire:
//! its lifetime is the registration TTL plus a margin. Runs on the leader only, on a timer,
//! reading NodeClaims from cluster state.

use std::collections::BTreeSet;
use std::time::Duration;

use kube::ResourceExt;
use kube::api::Api;

use crate::apis::NodeClaim;
use crate::apis::labels::{NODECLAIM_TOKENS_ANNOTATION, conditions};
use crate::providers::bootstrap_token;
use crate::state::ClusterIndex;

use super::{Context, absent_ok, patch_object};

/// How often tokens are checked.
pub const INTERVAL: Duration = Duration::from_secs(30);

/// The tokens to delete now: those recorded on NodeClaims whose Node registered (the kubelet
/// has its own credentials), by NodeClaim.
pub fn release_plan(index: &ClusterIndex) -> Vec<(String, BTreeSet<String>)> {
    index
        .nodeclaims()
        .iter()
        .filter(|c| c.condition_is_true(conditions::REGISTERED))
        .filter_map(|c| {
            let names = bootstrap_token::recorded(
                c.annotations()
                    .get(NODECLAIM_TOKENS_ANNOTATION)
                    .map(String::as_str),
            );
            (!names.is_empty()).then(|| (c.name_any(), names))
        })
        .collect()
}

/// One cleanup pass; returns how many tokens were deleted.
pub async fn cleanup_once(ctx: &Context) -> Result<usize, super::Error> {
    if !ctx.cluster.synced() || !ctx.leadership.is_leader() {
        return Ok(0);
    }
    let plan = release_plan(&ctx.cluster.read());
    let api: Api<NodeClaim> = Api::all(ctx.client.clone());
    let mut deleted = 0;
    for (claim, names) in plan {
        for name in &names {
            tracing::info!(secret = %name, nodeclaim = %claim, "deleting bootstrap token: its node registered");
            bootstrap_token::delete_token(&ctx.client, name)
                .await
                .map_err(|e| super::Error::Invalid(e.to_string()))?;
            deleted += 1;
        }
        let forget =
            serde_json::json!({"metadata": {"annotations": {NODECLAIM_TOKENS_ANNOTATION: null}}});
        absent_ok(patch_object(&api, &claim, forget, None).await)?;
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::testing::{nodeclaim, registered};

    fn with_tokens(mut claim: NodeClaim, value: &str) -> NodeClaim {
        claim
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(NODECLAIM_TOKENS_ANNOTATION.into(), value.into());
        claim
    }

    #[test]
    fn only_tokens_recorded_on_registered_claims_are_released() {
        let mut index = ClusterIndex::default();
        index.apply_nodeclaim(with_tokens(
            nodeclaim("launching", "p", None),
            "bootstrap-token-aaaaaa",
        ));
        index.apply_nodeclaim(with_tokens(
            registered(nodeclaim("joined", "p", Some("exoscale://1"))),
            "bootstrap-token-bbbbbb,bootstrap-token-cccccc, not-a-token",
        ));
        index.apply_nodeclaim(registered(nodeclaim("none", "p", Some("exoscale://2"))));
        let plan = release_plan(&index);
        assert_eq!(
            plan,
            vec![(
                "joined".to_string(),
                BTreeSet::from([
                    "bootstrap-token-bbbbbb".to_string(),
                    "bootstrap-token-cccccc".to_string()
                ])
            )]
        );
    }
}
