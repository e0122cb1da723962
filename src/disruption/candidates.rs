//! Which nodes may be voluntarily disrupted at all, and what disrupting each would cost.

use std::sync::Arc;

use crate::apis::labels::{
    CAPACITY_TYPE_LABEL, DO_NOT_DISRUPT_ANNOTATION, INSTANCE_TYPE_LABEL, ZONE_LABEL,
};
use crate::apis::nodepool::ConsolidationPolicy;
use crate::scheduling::InstanceType;

use super::model::{ClusterView, StateNode};

/// Drift may pick nodes whose pods block eviction if the NodeClaim has a terminationGracePeriod
/// (the drain will end by then anyway); graceful methods never do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DisruptionClass {
    Graceful,
    Eventual,
}

/// A node that may be disrupted.
#[derive(Clone, Debug)]
pub struct Candidate {
    /// Index into `ClusterView::nodes`.
    pub index: usize,
    pub name: String,
    pub provider_id: String,
    pub nodeclaim: String,
    pub node_pool: String,
    /// `None` when the node's type is no longer offered (consolidation then skips it).
    pub instance_type: Option<Arc<InstanceType>>,
    pub zone: String,
    pub capacity_type: String,
    /// Price of the node's offering (zone + capacity type); 0 when unknown.
    pub price: f64,
    /// Indices into the node's pods of those that must move.
    pub reschedulable: Vec<usize>,
    /// Σ eviction cost of all pods × fraction of lifetime remaining: lower goes first.
    pub disruption_cost: f64,
    /// 1 + Σ max(0, eviction cost) over reschedulable pods.
    pub reschedule_disruption_cost: f64,
    /// Of the NodeClaim; decides the `termination_mode` metric label.
    pub termination_grace_period: Option<std::time::Duration>,
    pub consolidation_policy: ConsolidationPolicy,
}

impl Candidate {
    pub fn is_empty(&self) -> bool {
        self.reschedulable.is_empty()
    }
}

/// A node that is not a candidate, with the reason shown in `DisruptionBlocked` events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub node: String,
    pub nodeclaim: Option<String>,
    pub reason: String,
}

/// Every candidate of the view, in node order, and the managed nodes that are not, with why.
pub fn candidates(view: &ClusterView, class: DisruptionClass) -> (Vec<Candidate>, Vec<Rejection>) {
    let mut out = Vec::new();
    let mut rejected = Vec::new();
    for (index, node) in view.nodes.iter().enumerate() {
        match candidate(view, index, node, class) {
            Ok(c) => out.push(c),
            Err(Some(reason)) => rejected.push(Rejection {
                node: node.name.clone(),
                nodeclaim: node.nodeclaim.clone(),
                reason,
            }),
            Err(None) => {}
        }
    }
    (out, rejected)
}

/// `Err(None)`: not a candidate and not worth an event (unmanaged, or already queued).
fn candidate(
    view: &ClusterView,
    index: usize,
    node: &StateNode,
    class: DisruptionClass,
) -> Result<Candidate, Option<String>> {
    let Some(nodeclaim) = node.nodeclaim.clone() else {
        return Err(None);
    };
    if view.queued.contains(&node.provider_id) {
        return Err(None);
    }
    let now = view.now;
    if !node.has_node {
        return Err(Some("nodeclaim does not have an associated node".into()));
    }
    if !node.initialized {
        return Err(Some("node isn't initialized".into()));
    }
    if node.marked_for_deletion {
        return Err(Some("node is deleting or marked for deletion".into()));
    }
    if node.is_nominated(now) {
        return Err(Some("node is nominated for a pending pod".into()));
    }
    if node.do_not_disrupt {
        return Err(Some(format!(
            "disruption is blocked through the {DO_NOT_DISRUPT_ANNOTATION:?} annotation"
        )));
    }
    let Some(pool_name) = node.node_pool() else {
        return Err(Some(format!(
            "node doesn't have required label (label={})",
            crate::apis::labels::NODEPOOL_LABEL
        )));
    };
    let pool = view
        .pools
        .get(pool_name)
        .filter(|p| !p.instance_types.is_empty())
        .ok_or_else(|| Some(format!("NodePool not found (NodePool={pool_name})")))?;
    let pods_blocked = pods_block_eviction(view, node);
    let eventual = class == DisruptionClass::Eventual && node.termination_grace_period.is_some();
    if let Some(reason) = pods_blocked
        && !eventual
    {
        return Err(Some(reason));
    }

    let zone = node.label(ZONE_LABEL).unwrap_or_default().to_string();
    let capacity_type = node
        .label(CAPACITY_TYPE_LABEL)
        .unwrap_or_default()
        .to_string();
    let instance_type = node
        .label(INSTANCE_TYPE_LABEL)
        .and_then(|name| pool.instance_types.iter().find(|it| it.name == name))
        .cloned();
    let price = instance_type
        .as_ref()
        .and_then(|it| {
            it.offerings
                .iter()
                .find(|o| o.zone == zone && o.capacity_type == capacity_type)
        })
        .map_or(0.0, |o| o.price);
    let reschedulable: Vec<usize> = node
        .pods
        .iter()
        .enumerate()
        .filter(|(_, p)| p.is_reschedulable())
        .map(|(i, _)| i)
        .collect();
    let all_pods_cost: f64 = node.pods.iter().map(|p| p.eviction_cost()).sum();
    let reschedule_disruption_cost = 1.0
        + reschedulable
            .iter()
            .map(|&i| node.pods[i].eviction_cost().max(0.0))
            .sum::<f64>();
    Ok(Candidate {
        index,
        name: node.name.clone(),
        provider_id: node.provider_id.clone(),
        nodeclaim,
        node_pool: pool_name.to_string(),
        instance_type,
        zone,
        capacity_type,
        price,
        reschedulable,
        disruption_cost: all_pods_cost * lifetime_remaining(view, node),
        reschedule_disruption_cost,
        termination_grace_period: node.termination_grace_period,
        consolidation_policy: pool.nodepool.spec.disruption.consolidation_policy,
    })
}

/// Fraction of `expireAfter` still ahead of the node (1 when it never expires).
pub fn lifetime_remaining(view: &ClusterView, node: &StateNode) -> f64 {
    let Some(total) = node.expire_after.filter(|d| !d.is_zero()) else {
        return 1.0;
    };
    let age = (view.now - node.created_at).num_milliseconds() as f64 / 1000.0;
    let total = total.as_secs_f64();
    ((total - age) / total).clamp(0.0, 1.0)
}

/// A pod with an active do-not-disrupt annotation, or an evictable pod that its PDB (or more
/// than one PDB) would refuse to evict, blocks graceful disruption of its node.
fn pods_block_eviction(view: &ClusterView, node: &StateNode) -> Option<String> {
    let now = view.now;
    for p in &node.pods {
        if p.do_not_disrupt_active(now) {
            return Some(format!(
                "pod has \"{DO_NOT_DISRUPT_ANNOTATION}\" annotation (Pod={}/{})",
                p.pod.namespace, p.pod.name
            ));
        }
    }
    for p in node.pods.iter().filter(|p| p.is_evictable(now)) {
        let matching: Vec<_> = view.pdbs.iter().filter(|pdb| pdb.matches(p)).collect();
        if matching.len() > 1 {
            let keys: Vec<String> = matching.iter().map(|pdb| pdb.key()).collect();
            return Some(format!(
                "eviction does not support multiple PDBs (PodDisruptionBudget(s)=[{}])",
                keys.join(" ")
            ));
        }
        if let Some(pdb) = matching.first() {
            let unhealthy_ignored = pdb.always_allow_unhealthy && !p.ready;
            if pdb.disruptions_allowed <= 0 && !unhealthy_ignored {
                return Some(format!(
                    "pdb prevents pod evictions (PodDisruptionBudget=[{}])",
                    pdb.key()
                ));
            }
        }
    }
    None
}

/// Pods of a candidate the simulation moves: reschedulable, and not pinned for now by a
/// do-not-disrupt annotation or a PDB that never allows evictions.
pub fn currently_reschedulable<'a>(
    view: &'a ClusterView,
    candidate: &'a Candidate,
) -> impl Iterator<Item = &'a super::model::NodePod> + 'a {
    let node = &view.nodes[candidate.index];
    candidate
        .reschedulable
        .iter()
        .map(move |&i| &node.pods[i])
        .filter(move |p| {
            !p.do_not_disrupt_active(view.now)
                && !view
                    .pdbs
                    .iter()
                    .any(|pdb| pdb.fully_blocking && pdb.matches(p))
        })
}

/// Upstream's consolidation order: cheapest to disrupt first; ties by name for determinism.
pub fn sort_by_disruption_cost(candidates: &mut [Candidate]) {
    candidates.sort_by(|a, b| {
        a.disruption_cost
            .total_cmp(&b.disruption_cost)
            .then_with(|| a.name.cmp(&b.name))
    });
}
