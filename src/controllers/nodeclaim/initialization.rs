//! Initialization: once the registered Node is Ready, has shed its startup and ephemeral taints
//! and reports every requested resource, it is labelled initialized and `Initialized` turns
//! True; until then the condition says what is missing.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::Api;

use crate::apis::ConditionStatus;
use crate::apis::labels::conditions;
use crate::controllers::{Result, absent_ok, patch_object};

use super::lifecycle::{initialization, initialized_node};
use super::pass::{Pass, Step};

/// How soon an uninitialized Node is looked at again.
const RECHECK: Duration = Duration::from_secs(10);

pub async fn initialize(pass: &mut Pass<'_>) -> Result<Step> {
    if !pass.is_true(conditions::REGISTERED) || pass.is_true(conditions::INITIALIZED) {
        return Ok(Step::Continue);
    }
    let nodes = pass.nodes();
    let node = nodes.first().map(|n| n.as_ref());
    match initialization(&pass.claim, node) {
        Ok(()) => {
            if let Some(node) = node {
                let labelled = initialized_node(node);
                if labelled != *node {
                    let node_api: Api<Node> = Api::all(pass.ctx.client.clone());
                    absent_ok(
                        patch_object(
                            &node_api,
                            &node.name_any(),
                            serde_json::json!({"metadata": {"labels": labelled.metadata.labels}}),
                            None,
                        )
                        .await,
                    )?;
                }
            }
            pass.set(
                conditions::INITIALIZED,
                ConditionStatus::True,
                conditions::INITIALIZED,
                "",
            );
        }
        Err(why) => {
            pass.set(
                conditions::INITIALIZED,
                ConditionStatus::Unknown,
                why.reason,
                &why.message,
            );
            pass.requeue_within(RECHECK);
        }
    }
    Ok(Step::Continue)
}
