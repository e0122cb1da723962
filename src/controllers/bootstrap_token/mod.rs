//! Bootstrap-token cleanup (exoscale-provider §3.2, defect 11 fixed): the cloud provider creates
//! one token Secret per launch and records its name on the NodeClaim; this controller deletes
//! the recorded tokens once the NodeClaim's Node registered, then drops the record. Tokens of a
//! NodeClaim deleted before that go with its instance (the provider's delete). Secrets are
//! never listed or read — the controller may only create and delete them — so a token whose
//! name was never recorded (a crash between creating it and recording it) expires after the
//! registration TTL plus a margin, and its Secret, owned by the NodeClaim, goes with the
//! NodeClaim (Kubernetes' garbage collector). Runs on the leader only, on a timer, reading
//! NodeClaims from cluster state.

use std::collections::BTreeSet;
use std::time::Duration;

use kube::ResourceExt;
use kube::api::Api;

use crate::apis::NodeClaim;
use crate::apis::labels::{NODECLAIM_TOKENS_ANNOTATION, conditions};
use crate::providers::bootstrap_token;
use crate::state::{ClusterIndex, Kind};

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
    // Only NodeClaims are read: a launch in flight (a NodeClaim without provider ID) must not
    // keep registered nodes' tokens alive.
    if !ctx.cluster.read().current(Kind::NodeClaim) || !ctx.leadership.is_leader() {
        return Ok(0);
    }
    let plan = release_plan(&ctx.cluster.read());
    let api: Api<NodeClaim> = Api::all(ctx.client.clone());
    let client = &ctx.client;
    let released = release(plan, |name| async move {
        bootstrap_token::delete_token(client, &name)
            .await
            .map_err(|e| e.to_string())
    })
    .await;
    let mut deleted = 0;
    for (claim, count) in released {
        deleted += count;
        let forget =
            serde_json::json!({"metadata": {"annotations": {NODECLAIM_TOKENS_ANNOTATION: null}}});
        absent_ok(patch_object(&api, &claim, forget, None).await)?;
    }
    Ok(deleted)
}

/// Deletes the planned tokens, NodeClaim by NodeClaim. A token that cannot be deleted (a name
/// someone else wrote on the NodeClaim that the admission policy refuses, an API error) keeps
/// its NodeClaim's record for the next pass and stops nothing else: claims are visited in name
/// order, so one failing first every pass would otherwise keep every token after it alive.
/// Returns the NodeClaims whose tokens are all gone, with how many were deleted.
pub async fn release<F, Fut>(
    plan: Vec<(String, BTreeSet<String>)>,
    delete: F,
) -> Vec<(String, usize)>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let mut released = Vec::new();
    for (claim, names) in plan {
        let mut failed = false;
        for name in &names {
            tracing::info!(secret = %name, nodeclaim = %claim, "deleting bootstrap token: its node registered");
            if let Err(error) = delete(name.clone()).await {
                tracing::warn!(secret = %name, nodeclaim = %claim, %error, "cannot delete bootstrap token; kept on record for the next pass");
                failed = true;
            }
        }
        if !failed {
            released.push((claim, names.len()));
        }
    }
    released
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

    /// One token the API refuses to delete keeps its own NodeClaim's record, and every other
    /// NodeClaim's tokens still go.
    #[tokio::test]
    async fn a_token_that_cannot_be_deleted_stops_no_other() {
        let plan = vec![
            (
                "a".to_string(),
                BTreeSet::from(["bootstrap-token-refused".to_string()]),
            ),
            (
                "b".to_string(),
                BTreeSet::from(["bootstrap-token-bbbbbb".to_string()]),
            ),
        ];
        let deleted = std::sync::Mutex::new(Vec::new());
        let released = release(plan, |name| {
            let deleted = &deleted;
            async move {
                if name.ends_with("refused") {
                    return Err("403 Forbidden".to_string());
                }
                deleted.lock().unwrap().push(name);
                Ok(())
            }
        })
        .await;
        assert_eq!(released, vec![("b".to_string(), 1)]);
        assert_eq!(*deleted.lock().unwrap(), ["bootstrap-token-bbbbbb"]);
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
