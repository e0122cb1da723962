//! Builders of small clusters for the disruption tests and `benches/consolidation.rs`: one
//! zone, on-demand offerings priced like upstream's fake provider.

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::apis::ConditionsExt;
use crate::apis::labels::conditions::READY;
use crate::apis::labels::{
    CAPACITY_TYPE_LABEL, HOSTNAME_LABEL, INSTANCE_TYPE_LABEL, NODEPOOL_LABEL, ZONE_LABEL,
};
use crate::apis::nodepool::NodePool;
use crate::scheduling::fixtures as sched;
use crate::scheduling::quantity::{CPU, MEMORY, PODS};
use crate::scheduling::{BoundPod, ExistingNode, InstanceType, Offering, Quantity, Resources};

use super::model::{ClusterView, NodePod, PoolState, StateNode};

pub const ZONE: &str = "test-zone-1";
pub const ON_DEMAND: &str = "on-demand";

/// An on-demand-only instance type with `cpu` cores, 2 GiB per core and 110 pods.
pub fn instance_type(name: &str, cpu: i128) -> Arc<InstanceType> {
    let mut capacity = Resources::new();
    capacity.set(CPU, Quantity::from_units(cpu));
    capacity.set(MEMORY, Quantity::from_units(cpu * 2 * (1 << 30)));
    capacity.set(PODS, Quantity::from_units(110));
    let price = sched::price_from_resources(&capacity);
    let offerings = vec![Offering {
        zone: ZONE.into(),
        capacity_type: ON_DEMAND.into(),
        price,
        available: true,
    }];
    Arc::new(sched::instance_type(name, capacity, offerings))
}

/// small (1 CPU), medium (2), large (4), xlarge (8), 2xlarge (16).
pub fn instance_types() -> Vec<Arc<InstanceType>> {
    [
        ("small", 1),
        ("medium", 2),
        ("large", 4),
        ("xlarge", 8),
        ("2xlarge", 16),
    ]
    .into_iter()
    .map(|(n, c)| instance_type(n, c))
    .collect()
}

/// A NodePool from its `spec.disruption` YAML (flow style), e.g.
/// `{consolidateAfter: 0s, budgets: [{nodes: "1"}]}`.
pub fn nodepool(name: &str, disruption: &str) -> NodePool {
    let yaml = format!(
        r#"
apiVersion: karpenter.sh/v1
kind: NodePool
metadata: {{name: {name}}}
spec:
  disruption: {disruption}
  template:
    spec:
      nodeClassRef: {{group: karpenter.test.sh, kind: TestNodeClass, name: default}}
      requirements: []
"#
    );
    serde_yaml_ng::from_str(&yaml).expect("fixture NodePool parses")
}

/// A NodePool state, Ready unless the NodePool says otherwise.
pub fn pool(mut nodepool: NodePool, instance_types: Vec<Arc<InstanceType>>) -> PoolState {
    let name = nodepool.metadata.name.clone().unwrap_or_default();
    let status = nodepool.status.as_ref();
    if status.is_none_or(|s| s.conditions.get_condition(READY).is_none()) {
        nodepool.set_ready_condition(crate::apis::ConditionStatus::True, READY, "");
    }
    PoolState {
        nodepool,
        template: sched::node_pool(&name),
        instance_types,
    }
}

/// A running workload pod requesting `cpu` (e.g. "500m") and `memory`.
pub fn pod(name: &str, cpu: &str, memory: &str) -> NodePod {
    NodePod {
        pod: Arc::new(sched::pod(name, cpu, memory)),
        ready: true,
        ..Default::default()
    }
}

/// An initialized, ready, consolidatable node of `it` in `pool`, created at `created_at`.
pub fn node(
    name: &str,
    pool: &str,
    it: &InstanceType,
    pods: Vec<NodePod>,
    created_at: DateTime<Utc>,
) -> StateNode {
    let mut labels: BTreeMap<String, String> = BTreeMap::new();
    for r in it.requirements.iter() {
        if let Some(v) = r.single_value() {
            labels.insert(r.key().to_string(), v.to_string());
        }
    }
    labels.insert(NODEPOOL_LABEL.into(), pool.into());
    labels.insert(INSTANCE_TYPE_LABEL.into(), it.name.clone());
    labels.insert(ZONE_LABEL.into(), ZONE.into());
    labels.insert(CAPACITY_TYPE_LABEL.into(), ON_DEMAND.into());
    labels.insert(HOSTNAME_LABEL.into(), name.into());
    let bound = pods
        .iter()
        .map(|p| Arc::new(BoundPod::of(&p.pod, None)))
        .collect();
    StateNode {
        name: name.into(),
        provider_id: format!("exoscale://{name}"),
        nodeclaim: Some(format!("nc-{name}")),
        has_node: true,
        scheduling: ExistingNode {
            name: name.into(),
            hostname: name.into(),
            labels: Arc::new(labels),
            taints: Vec::new(),
            allocatable: it.allocatable(),
            pods: bound,
            node_pool: Some(pool.into()),
            initialized: true,
            settling: false,
        },
        initialized: true,
        ready: true,
        consolidatable: true,
        created_at,
        expire_after: Some(std::time::Duration::from_secs(720 * 3600)),
        pods,
        ..Default::default()
    }
}

/// A view at `now` with the given pools and nodes and no pending pods.
pub fn view(now: DateTime<Utc>, pools: Vec<PoolState>, nodes: Vec<StateNode>) -> ClusterView {
    let mut options = crate::scheduling::SchedulerOptions {
        well_known_labels: sched::well_known_labels(),
        ..Default::default()
    };
    options.max_instance_types = crate::scheduling::MAX_INSTANCE_TYPES;
    ClusterView {
        now,
        pools: pools
            .into_iter()
            .map(|p| (p.name().to_string(), p))
            .collect(),
        nodes,
        scheduler_options: options,
        ..Default::default()
    }
}

/// A cluster of `nodes` nodes of `it` in one pool, each with `pods_per_node` pods of
/// `cpu`/`memory`: the consolidation benchmark's shape.
pub fn uniform_cluster(
    now: DateTime<Utc>,
    nodes: usize,
    pods_per_node: usize,
    it: &Arc<InstanceType>,
    cpu: &str,
    memory: &str,
) -> ClusterView {
    let np = nodepool(
        "default",
        "{consolidateAfter: 0s, budgets: [{nodes: \"100%\"}]}",
    );
    let created = now - chrono::Duration::hours(1);
    let state_nodes = (0..nodes)
        .map(|n| {
            let pods = (0..pods_per_node)
                .map(|p| pod(&format!("n{n}-p{p}"), cpu, memory))
                .collect();
            node(&format!("node-{n}"), "default", it, pods, created)
        })
        .collect();
    view(now, vec![pool(np, instance_types())], state_nodes)
}
