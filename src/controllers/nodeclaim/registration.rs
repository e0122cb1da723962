//! Registration: the Node with the NodeClaim's provider ID is found and synced (labels,
//! annotations, taints, finalizer, owner), its `unregistered` taint removed, and `Registered`
//! turns True. None yet is Unknown (liveness bounds the wait); two are a conflict.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::Api;

use crate::apis::labels::{UNREGISTERED_TAINT_KEY, ZONE_LABEL, conditions};
use crate::apis::{ConditionStatus, NodeClaim};
use crate::controllers::field_patch::{Field, patch_fields};
use crate::controllers::{Context, Result};
use crate::operator::events::Severity;
use crate::operator::metrics::labels;

use super::arrivals::Arrival;
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
    // Expected before the lookup: a Node the lookup misses is announced to the guard, and the
    // pass syncs it beside its status write (`sync_on_arrival`).
    let arrival = pass
        .status
        .provider_id
        .as_deref()
        .filter(|id| !id.is_empty())
        .map(|id| pass.ctx.node_arrivals.expect(id));
    let nodes = pass.nodes();
    match registration(&pass.with_status(), &nodes) {
        Registration::NodeNotFound => {
            pass.arrival = arrival;
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
            let node = &nodes[0];
            sync_node(pass.ctx, node, &synced).await?;
            registered(pass, node);
        }
    }
    Ok(Step::Continue)
}

/// Records a synced Node on the status being built: its name, `Registered` True, and the
/// node counted as created.
pub fn registered(pass: &mut Pass<'_>, node: &Node) {
    let ctx = pass.ctx;
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

/// Writes the Node as registration syncs it, warning first when it came up without the
/// `unregistered` taint.
async fn sync_node(ctx: &Context, node: &Node, synced: &Node) -> Result<()> {
    if unregistered_taint_missing(node) {
        ctx.event(node, Severity::Warning, "UnregisteredTaintMissing", format!("Missing {UNREGISTERED_TAINT_KEY} taint which prevents registration related race conditions on Karpenter-managed nodes")).await;
    }
    // Conditional on the fields it writes, not on the Node's version: the kubelet's status
    // updates do not refuse it.
    let node_api: Api<Node> = Api::all(ctx.client.clone());
    patch_fields(&node_api, node, synced, &SYNCED_FIELDS).await?;
    Ok(())
}

/// What [`sync_on_arrival`] did: the status write's answer, and the Node it synced meanwhile.
pub struct WrittenBeside {
    pub written: Result<NodeClaim>,
    pub synced: Option<Arc<Node>>,
}

/// Runs the pass's status `write`; should the Node registration did not find arrive meanwhile,
/// syncs it beside the write instead of after it, and returns it so that the pass records the
/// registration itself: a next pass could still read the Node as it was before the sync (the
/// watch lags under load), and its write from that copy would be refused. A failed sync is left
/// to the next pass.
pub async fn sync_on_arrival(
    ctx: &Context,
    launched: &NodeClaim,
    arrival: Arrival,
    write: impl Future<Output = Result<NodeClaim>>,
) -> WrittenBeside {
    let mut write = std::pin::pin!(write);
    tokio::select! {
        biased;
        written = &mut write => WrittenBeside { written, synced: None },
        () = arrival.announced() => {
            let sync = async {
                let nodes = ctx.cluster.read().nodes_by_provider_id(arrival.provider_id());
                let Registration::Register(synced) = registration(launched, &nodes) else {
                    return None;
                };
                match sync_node(ctx, &nodes[0], &synced).await {
                    Ok(()) => Some(nodes[0].clone()),
                    Err(error) => {
                        tracing::debug!(nodeclaim = %launched.name_any(), %error, "syncing the Node beside the launch's status write failed; the next pass syncs it");
                        None
                    }
                }
            };
            let (written, synced) = futures::join!(write, sync);
            WrittenBeside { written, synced }
        }
    }
}
