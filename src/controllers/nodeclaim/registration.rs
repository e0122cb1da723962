//! Registration: the Node with the NodeClaim's provider ID is found and synced (labels,
//! annotations, taints, finalizer, owner), its `unregistered` taint removed, and `Registered`
//! turns True. None yet is Unknown (liveness bounds the wait); two are a conflict.

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::Api;

use crate::apis::ConditionStatus;
use crate::apis::labels::{UNREGISTERED_TAINT_KEY, ZONE_LABEL, conditions};
use crate::controllers::Result;
use crate::controllers::field_patch::{Field, patch_fields};
use crate::operator::events::Severity;
use crate::operator::metrics::labels;

use super::lifecycle::{Registration, registration, unregistered_taint_missing};
use super::pass::{Pass, Step};
use super::reconcile::{nodepool_of, record_registration};

/// What registration writes to the Node.
const SYNCED_FIELDS: [Field; 5] = [
    Field::Keys(&["metadata", "labels"]),
    Field::Keys(&["metadata", "annotations"]),
    Field::Items(&["metadata", "finalizers"]),
    Field::Items(&["metadata", "ownerReferences"]),
    Field::Items(&["spec", "taints"]),
];

pub async fn register(pass: &mut Pass<'_>) -> Result<Step> {
    if pass.is_true(conditions::REGISTERED) {
        return Ok(Step::Continue);
    }
    let nodes = pass.nodes();
    match registration(&pass.with_status(), &nodes) {
        Registration::NodeNotFound => {
            pass.set(
                conditions::REGISTERED,
                ConditionStatus::Unknown,
                "NodeNotFound",
                "Node not registered with cluster",
            );
        }
        Registration::MultipleNodesFound(names) => {
            let message = format!("multiple nodes found for provider ID: {}", names.join(", "));
            pass.set(
                conditions::REGISTERED,
                ConditionStatus::False,
                "MultipleNodesFound",
                &message,
            );
        }
        Registration::Register(synced) => {
            let ctx = pass.ctx;
            let node = &nodes[0];
            if unregistered_taint_missing(node) {
                ctx.event(node.as_ref(), Severity::Warning, "UnregisteredTaintMissing", format!("Missing {UNREGISTERED_TAINT_KEY} taint which prevents registration related race conditions on Karpenter-managed nodes")).await;
            }
            // Conditional on the fields it writes, not on the Node's version: the kubelet's
            // status updates do not refuse it.
            let node_api: Api<Node> = Api::all(ctx.client.clone());
            patch_fields(&node_api, node, &synced, &SYNCED_FIELDS).await?;
            pass.status.node_name = Some(node.name_any());
            pass.set(
                conditions::REGISTERED,
                ConditionStatus::True,
                conditions::REGISTERED,
                "",
            );
            let zone = pass
                .claim
                .labels()
                .get(ZONE_LABEL)
                .cloned()
                .unwrap_or_default();
            ctx.metrics
                .nodes_created
                .get_or_create(&labels([
                    ("nodepool", &nodepool_of(&pass.claim)),
                    ("zone", &zone),
                ]))
                .inc();
            record_registration(ctx, &pass.claim, true);
        }
    }
    Ok(Step::Continue)
}
