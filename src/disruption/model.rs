//! The cluster as the disruption logic sees it: plain data the controller builds from cluster
//! state once per loop. Nothing here talks to the API server.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::apis::duration::parse_duration;
use crate::apis::nodepool::NodePool;
use crate::scheduling::{
    DaemonSetPod, ExistingNode, InstanceType, LabelSelector, NodePoolTemplate, Pod,
    SchedulerOptions,
};

/// Provisioning nominates a node for pending pods for `2 × BATCH_MAX_DURATION`; a nominated
/// node is not disrupted meanwhile.
pub const NOMINATION_WINDOW: Duration = Duration::from_secs(20);

/// Who owns a pod, as far as disruption cares.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PodOwner {
    #[default]
    Workload,
    DaemonSet,
    /// A static (mirror) pod owned by the Node.
    Node,
}

/// A pod bound to a node.
#[derive(Clone, Debug, Default)]
pub struct NodePod {
    /// The pod as the scheduler needs it to place it elsewhere (shared with the cluster
    /// state's reading of it).
    pub pod: Arc<Pod>,
    pub owner: PodOwner,
    /// Phase Succeeded or Failed.
    pub terminal: bool,
    /// Has a deletion timestamp.
    pub terminating: bool,
    pub ready: bool,
    /// Value of `karpenter.sh/do-not-disrupt`: `"true"` or a duration counted from the start.
    pub do_not_disrupt: Option<String>,
    pub started_at: Option<DateTime<Utc>>,
    pub priority: Option<i32>,
    /// `controller.kubernetes.io/pod-deletion-cost`, when parseable.
    pub deletion_cost: Option<f64>,
    /// Tolerates `karpenter.sh/disrupted:NoSchedule`: it stays and is never evicted.
    pub tolerates_disrupted_taint: bool,
}

impl NodePod {
    pub fn is_active(&self) -> bool {
        !self.terminal && !self.terminating
    }

    /// Needs a new home if the node goes: active, and neither a DaemonSet nor a mirror pod.
    pub fn is_reschedulable(&self) -> bool {
        self.is_active() && self.owner == PodOwner::Workload && !self.tolerates_disrupted_taint
    }

    /// The do-not-disrupt annotation blocks disruption now: `"true"`, or a duration that has
    /// not yet elapsed since the pod started (a pod not started yet is protected, and so is one
    /// whose protection ends beyond the last representable instant).
    pub fn do_not_disrupt_active(&self, now: DateTime<Utc>) -> bool {
        let Some(value) = self.do_not_disrupt.as_deref() else {
            return false;
        };
        self.is_active() && do_not_disrupt_protects(value, self.started_at, now)
    }

    /// Subject to eviction (so to PDBs) when the node drains.
    pub fn is_evictable(&self, now: DateTime<Utc>) -> bool {
        self.is_active()
            && self.owner != PodOwner::Node
            && !self.tolerates_disrupted_taint
            && !self.do_not_disrupt_active(now)
    }

    /// Upstream `EvictionCost`: 1, plus deletion cost / 2^27, plus priority / 2^25, within ±10.
    pub fn eviction_cost(&self) -> f64 {
        let mut cost = 1.0;
        if let Some(c) = self.deletion_cost {
            cost += c / 2f64.powi(27);
        }
        if let Some(p) = self.priority {
            cost += f64::from(p) / 2f64.powi(25);
        }
        cost.clamp(-10.0, 10.0)
    }
}

/// When a `karpenter.sh/do-not-disrupt` duration counted from `start` ends; `None` when that is
/// beyond the last representable instant (the annotation's value comes from the pod's author,
/// so `9999999999h` must not panic: it protects for good).
/// Whether a pod's `karpenter.sh/do-not-disrupt` value protects it at `now`: `"true"`, or a
/// duration not yet elapsed since it started (`None`: not started yet, protected; a protection
/// ending beyond the last representable instant holds). Any other value protects nothing. The
/// one rule for disruption's decisions and the drain, as upstream's `IsDoNotDisruptActive`.
pub fn do_not_disrupt_protects(
    value: &str,
    started_at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> bool {
    if value == "true" {
        return true;
    }
    match (parse_duration(value), started_at) {
        (Ok(d), Some(start)) => do_not_disrupt_until(start, d).is_none_or(|end| end > now),
        (Ok(_), None) => true,
        (Err(_), _) => false,
    }
}

pub fn do_not_disrupt_until(start: DateTime<Utc>, grace: Duration) -> Option<DateTime<Utc>> {
    start.checked_add_signed(chrono::Duration::from_std(grace).ok()?)
}

/// A PodDisruptionBudget reduced to what blocks an eviction.
#[derive(Clone, Debug, Default)]
pub struct Pdb {
    pub namespace: String,
    pub name: String,
    pub selector: LabelSelector,
    /// `status.disruptionsAllowed`.
    pub disruptions_allowed: i32,
    /// `unhealthyPodEvictionPolicy: AlwaysAllow`: NotReady pods ignore this PDB.
    pub always_allow_unhealthy: bool,
    /// `maxUnavailable: 0`/`"0%"` or `minAvailable: "100%"`: no pod can ever be evicted.
    pub fully_blocking: bool,
}

impl Pdb {
    pub fn matches(&self, pod: &NodePod) -> bool {
        self.namespace == pod.pod.namespace && self.selector.matches(&pod.pod.labels)
    }

    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// A Node and/or its NodeClaim.
#[derive(Clone, Debug, Default)]
pub struct StateNode {
    /// Node name (NodeClaim name when no Node registered yet).
    pub name: String,
    pub provider_id: String,
    /// The NodeClaim's name; `None` for nodes Karpenter does not manage.
    pub nodeclaim: Option<String>,
    /// A Node object exists.
    pub has_node: bool,
    /// The Node carries `karpenter.sh/do-not-disrupt: "true"`.
    pub do_not_disrupt: bool,
    pub initialized: bool,
    pub ready: bool,
    /// Deleting, or marked for deletion by an in-flight command.
    pub marked_for_deletion: bool,
    /// NodeClaim condition `InstanceTerminating=True`.
    pub instance_terminating: bool,
    /// Provisioning nominated the node for pending pods until this instant.
    pub nominated_until: Option<DateTime<Utc>>,
    /// NodeClaim creation time.
    pub created_at: DateTime<Utc>,
    /// NodeClaim condition `Consolidatable=True`.
    pub consolidatable: bool,
    /// When the node's `consolidateAfter` clock started: the later of the NodeClaim's
    /// `lastPodEventTime` (its initialization when none) and the last pod event the cluster
    /// index saw on the node, which the next conditions pass stamps.
    pub last_pod_event: Option<DateTime<Utc>>,
    /// NodeClaim condition `Drifted=True` since this instant.
    pub drifted_since: Option<DateTime<Utc>>,
    pub termination_grace_period: Option<Duration>,
    /// `None` = `Never`.
    pub expire_after: Option<Duration>,
    pub pods: Vec<NodePod>,
    /// The node as the scheduler sees it (allocatable, taints, bound pods).
    pub scheduling: ExistingNode,
}

impl StateNode {
    pub fn node_pool(&self) -> Option<&str> {
        self.label(crate::apis::labels::NODEPOOL_LABEL)
    }
    /// A label (the Node's when registered, else the NodeClaim's), read from the scheduler's
    /// reading of the node rather than a copy of its own.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.scheduling.labels.get(key).map(String::as_str)
    }
    pub fn is_nominated(&self, now: DateTime<Utc>) -> bool {
        self.nominated_until.is_some_and(|until| until > now)
    }
}

/// A NodePool with what disruption and the scheduler need.
#[derive(Clone, Debug)]
pub struct PoolState {
    pub nodepool: NodePool,
    pub template: NodePoolTemplate,
    /// Instance types the NodePool may launch; a pool without any is not disrupted.
    pub instance_types: Vec<Arc<InstanceType>>,
}

impl PoolState {
    pub fn name(&self) -> &str {
        &self.template.name
    }
    pub fn is_static(&self) -> bool {
        self.nodepool.spec.replicas.is_some()
    }
    /// Whether a replacement may be launched from this NodePool: as provisioning, only from a
    /// Ready one, and a static NodePool launches only to keep its replica count.
    pub fn launches_replacements(&self) -> bool {
        !self.is_static() && self.nodepool.is_ready()
    }
}

/// Everything one disruption loop looks at.
#[derive(Clone, Debug, Default)]
pub struct ClusterView {
    pub now: DateTime<Utc>,
    pub pools: BTreeMap<String, PoolState>,
    pub nodes: Vec<StateNode>,
    /// Pods waiting for capacity: simulations must still place them.
    pub pending_pods: Vec<Pod>,
    pub daemonsets: Vec<DaemonSetPod>,
    pub pdbs: Vec<Pdb>,
    /// Provider IDs of nodes already in the orchestration queue.
    pub queued: HashSet<String>,
    pub scheduler_options: SchedulerOptions,
    /// Consolidation candidates whose replacement has been held back in consecutive passes,
    /// and since when (see `methods::hold_replacement`).
    pub held_replacements: BTreeMap<String, DateTime<Utc>>,
    /// Empty nodes emptiness found eligible in consecutive passes, and since when (see
    /// `validation::watched_long_enough`).
    pub empty_since: BTreeMap<String, DateTime<Utc>>,
}

impl ClusterView {
    pub fn node(&self, name: &str) -> Option<&StateNode> {
        self.nodes.iter().find(|n| n.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotated(value: &str, started_at: DateTime<Utc>) -> NodePod {
        NodePod {
            do_not_disrupt: Some(value.into()),
            started_at: Some(started_at),
            ..Default::default()
        }
    }

    #[test]
    fn a_do_not_disrupt_duration_beyond_representable_time_protects_for_good() {
        let now = DateTime::from_timestamp(1_800_000_000, 0).expect("valid instant");
        // Parses (3.6e13 s fits chrono's TimeDelta) but start + it is past year 262143.
        let pod = annotated("9999999999h", now);
        assert!(pod.do_not_disrupt_active(now));
        assert!(pod.do_not_disrupt_active(now + chrono::Duration::days(365 * 1000)));
        // Beyond TimeDelta itself, too.
        assert!(annotated("5124095576030431h", now).do_not_disrupt_active(now));
        // An ordinary duration still elapses.
        let pod = annotated("30m", now);
        assert!(pod.do_not_disrupt_active(now + chrono::Duration::minutes(29)));
        assert!(!pod.do_not_disrupt_active(now + chrono::Duration::minutes(30)));
    }
}
