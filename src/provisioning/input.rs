//! Gathers the scheduler's input from cluster state: NodePools (with the instance types the cloud
//! offers them), existing Nodes and in-flight NodeClaims with their pods, DaemonSets, and the
//! pods to place. Pure over the state index so it is tested without a cluster.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod as K8sPod;
use kube::ResourceExt;

use crate::apis::labels::{DISRUPTED_TAINT_KEY, conditions};
use crate::apis::{ConditionsExt, NodeClaim, NodePool};
use crate::scheduling::{
    ExistingNode, InstanceType, Pod, Quantity, Resources, SchedulerInput, SchedulerOptions, convert,
};
use crate::state::pods::{is_reschedulable, is_terminal};
use crate::state::{ClusterIndex, nodeclaim_provider_id};

use super::template::{nodepool_template, taint};
use super::{eligibility, volumes};

/// A pod the batch tries to place, with the object it came from (for events).
#[derive(Debug, Clone)]
pub struct Pending {
    pub object: Arc<K8sPod>,
    pub pod: Pod,
}

/// What one provisioning round solves.
pub struct Prepared {
    pub input: SchedulerInput,
    pub pods: Vec<Pending>,
    /// Pods that cannot be simulated (bad quantities, unsupported selectors) or whose volumes
    /// no new node can satisfy (a missing claim…), with the reason.
    pub invalid: Vec<(Arc<K8sPod>, String)>,
    /// NodePools left out, with the reason (not ready, no instance types, bad template).
    pub skipped_pools: Vec<(String, String)>,
}

fn being_disrupted(node: &k8s_openapi::api::core::v1::Node) -> bool {
    node.metadata.deletion_timestamp.is_some()
        || node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == DISRUPTED_TAINT_KEY))
}

/// What a NodePool's nodes and in-flight NodeClaims hold, as scheduler resources (plus `nodes`).
pub fn usage_of(index: &ClusterIndex, pool: &str) -> Resources {
    let usage = index.nodepool_usage(pool);
    let mut r = Resources::new();
    for (name, q) in &usage.resources {
        if let Ok(q) = Quantity::parse(&q.0) {
            r.set(name, q);
        }
    }
    r.set("nodes", Quantity::from_units(usage.nodes as i128));
    r
}

/// A NodeClaim that has launched but whose Node has not registered yet: capacity on the way.
fn in_flight_node(claim: &NodeClaim) -> Option<ExistingNode> {
    if claim.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let status = claim.status.as_ref()?;
    let mut allocatable = Resources::new();
    for (name, q) in &status.allocatable {
        allocatable.set(name, Quantity::parse(&q.0).ok()?);
    }
    if allocatable.is_empty() {
        return None;
    }
    let labels = claim.labels().clone();
    Some(ExistingNode {
        name: claim.name_any(),
        hostname: claim.name_any(),
        labels,
        // Startup taints are gone by the time pods could schedule; only real taints block.
        taints: claim.spec.taints.iter().map(taint).collect(),
        allocatable,
        pods: Vec::new(),
        node_pool: claim
            .labels()
            .get(crate::apis::labels::NODEPOOL_LABEL)
            .cloned(),
        initialized: false,
    })
}

/// Builds the round's input. `pools` are the NodePools with the instance types the cloud offers
/// each; `options` carries the policies.
pub fn prepare(
    index: &ClusterIndex,
    pools: Vec<(Arc<NodePool>, Vec<Arc<InstanceType>>)>,
    options: SchedulerOptions,
) -> Prepared {
    let mut input = SchedulerInput {
        options,
        ..SchedulerInput::default()
    };
    let mut skipped_pools = Vec::new();
    for (pool, types) in pools {
        let name = pool.name_any();
        if pool.metadata.deletion_timestamp.is_some() {
            skipped_pools.push((name, "is being deleted".to_string()));
            continue;
        }
        let ready = pool.status.as_ref().map(|s| &s.conditions);
        if let Some(c) = ready.and_then(|c| c.get_condition(conditions::READY))
            && c.status == crate::apis::ConditionStatus::False
        {
            skipped_pools.push((name, format!("is not ready: {}", c.message)));
            continue;
        }
        match nodepool_template(&pool, usage_of(index, &name)) {
            Ok(template) => {
                input.node_pools.push(template);
                input.instance_types.insert(name, types);
            }
            Err(e) => skipped_pools.push((name, e.to_string())),
        }
    }

    // Existing capacity: registered Nodes not being disrupted, and NodeClaims still on the way.
    let claims_by_provider_id: HashMap<String, Arc<NodeClaim>> = index
        .nodeclaims()
        .into_iter()
        .filter_map(|c| nodeclaim_provider_id(&c).map(|p| (p.to_string(), c.clone())))
        .collect();
    let mut registered_claims = std::collections::HashSet::new();
    let mut disrupted_pods = Vec::new();
    for node in index.nodes() {
        let name = node.name_any();
        let provider_id = node.spec.as_ref().and_then(|s| s.provider_id.clone());
        let claim = provider_id
            .as_ref()
            .and_then(|p| claims_by_provider_id.get(p));
        if let Some(claim) = claim {
            registered_claims.insert(claim.name_any());
        }
        let pods: Vec<K8sPod> = index
            .pods_on_node(&name)
            .into_iter()
            .filter(|p| !is_terminal(p))
            .map(|p| (*p).clone())
            .collect();
        if being_disrupted(&node) {
            // Their pods need a new home: upstream simulates them as pending.
            disrupted_pods.extend(
                index
                    .pods_on_node(&name)
                    .into_iter()
                    .filter(|p| is_reschedulable(p)),
            );
            continue;
        }
        let startup: Vec<_> = claim
            .map(|c| c.spec.startup_taints.iter().map(taint).collect())
            .unwrap_or_default();
        match convert::existing_node_from_k8s(&node, &pods, &startup) {
            Ok(existing) => input.existing_nodes.push(existing),
            Err(e) => tracing::debug!(node = %name, error = %e, "node left out of the simulation"),
        }
    }
    for claim in index.nodeclaims() {
        if registered_claims.contains(&claim.name_any()) {
            continue;
        }
        if let Some(node) = in_flight_node(&claim) {
            input.existing_nodes.push(node);
        }
    }
    for ds in index.daemonsets() {
        if let Ok(d) = convert::daemonset_from_k8s(&ds) {
            input.daemonsets.push(d);
        }
    }

    let mut pods = Vec::new();
    let mut invalid = Vec::new();
    let candidates = index
        .pods()
        .into_iter()
        .filter(|p| eligibility::check(p).is_ok())
        .chain(disrupted_pods);
    for object in candidates {
        let pod = convert::pod_from_k8s(&object).map_err(|e| e.to_string());
        let volumes = volumes::volume_requirements(&object, index).map_err(|e| e.to_string());
        match (pod, volumes) {
            (Ok(mut pod), Ok(volume_requirements)) => {
                pod.volume_requirements = volume_requirements;
                pods.push(Pending { object, pod });
            }
            (Err(e), _) | (_, Err(e)) => invalid.push((object, e)),
        }
    }
    Prepared {
        input,
        pods,
        invalid,
        skipped_pools,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::fixtures;
    use crate::state::testing;

    fn pending(name: &str, cpu: &str) -> K8sPod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "uid": name},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
            "status": {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}
        }))
        .unwrap()
    }

    fn pool(name: &str) -> Arc<NodePool> {
        Arc::new(
            crate::apis::validation::parse(&serde_json::json!({
                "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name},
                "spec": {"template": {"spec": {"requirements": [],
                    "nodeClassRef": {"group": "karpenter.test.sh", "kind": "TestNodeClass", "name": "default"}}}}
            }))
            .unwrap(),
        )
    }

    #[test]
    fn only_provisionable_pods_are_placed() {
        let mut index = ClusterIndex::default();
        index.apply_pod(pending("a", "1"));
        index.apply_pod(testing::pod("default", "bound", Some("n1")));
        let types = fixtures::instance_types(10);
        let prepared = prepare(
            &index,
            vec![(pool("p"), types)],
            SchedulerOptions::default(),
        );
        let names: Vec<_> = prepared.pods.iter().map(|p| p.pod.name.clone()).collect();
        assert_eq!(names, ["a"]);
        assert_eq!(prepared.input.node_pools.len(), 1);
    }

    #[test]
    fn pods_with_unusable_claims_are_invalid_and_zonal_volumes_narrow_the_node() {
        let mut index = ClusterIndex::default();
        let with_claim = |name: &str, claim: &str| {
            let mut pod = pending(name, "1");
            pod.spec.as_mut().unwrap().volumes = Some(vec![
                serde_json::from_value(serde_json::json!(
                    {"name": "data", "persistentVolumeClaim": {"claimName": claim}}))
                .unwrap(),
            ]);
            pod
        };
        index.apply_pod(with_claim("orphan", "missing"));
        index.apply_pod(with_claim("db", "data"));
        index.apply_pvc(
            serde_json::from_value(serde_json::json!({"metadata": {"name": "data",
                "namespace": "default", "annotations": {"pv.kubernetes.io/bind-completed": "yes"}},
                "spec": {"volumeName": "pv-1"}}))
            .unwrap(),
        );
        index.apply_pv(
            serde_json::from_value(serde_json::json!({"metadata": {"name": "pv-1"},
                "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "topology.csi.exoscale.com/zone", "operator": "In", "values": ["ch-gva-2"]}]}]}}}}))
            .unwrap(),
        );
        let prepared = prepare(&index, vec![], SchedulerOptions::default());
        assert_eq!(prepared.invalid.len(), 1);
        assert_eq!(prepared.invalid[0].0.name_any(), "orphan");
        assert!(
            prepared.invalid[0].1.contains("\"missing\" not found"),
            "{}",
            prepared.invalid[0].1
        );
        let db = &prepared.pods[0].pod;
        let zone = db
            .volume_requirements
            .as_ref()
            .unwrap()
            .get("topology.kubernetes.io/zone");
        assert_eq!(zone.unwrap().values(), ["ch-gva-2"]);
    }

    #[test]
    fn pods_on_disrupted_nodes_need_new_capacity() {
        let mut index = ClusterIndex::default();
        index.apply_node(testing::node(
            "n1",
            Some("exoscale://1"),
            &[(DISRUPTED_TAINT_KEY, "NoSchedule")],
        ));
        index.apply_pod(testing::pod("default", "web", Some("n1")));
        let prepared = prepare(&index, vec![], SchedulerOptions::default());
        assert!(
            prepared.input.existing_nodes.is_empty(),
            "a disrupted node offers no capacity"
        );
        assert_eq!(prepared.pods.len(), 1);
    }

    #[test]
    fn launched_nodeclaims_without_nodes_count_as_capacity() {
        let mut index = ClusterIndex::default();
        let claim = testing::nodeclaim("p-abc", "p", Some("exoscale://x"));
        let mut claim = claim;
        claim
            .status
            .get_or_insert_with(Default::default)
            .allocatable = testing::resources(&[("cpu", "4"), ("memory", "8Gi"), ("pods", "110")]);
        index.apply_nodeclaim(claim);
        let prepared = prepare(&index, vec![], SchedulerOptions::default());
        assert_eq!(prepared.input.existing_nodes.len(), 1);
        assert_eq!(prepared.input.existing_nodes[0].name, "p-abc");
    }

    #[test]
    fn unready_nodepools_are_skipped_with_the_reason() {
        let mut p = (*pool("p")).clone();
        let now = k8s_openapi::jiff::Timestamp::from_second(1).unwrap();
        p.status
            .get_or_insert_with(Default::default)
            .conditions
            .set_condition(
                conditions::READY,
                crate::apis::ConditionStatus::False,
                "NodeClassNotReady",
                "NodeClass default is not ready",
                None,
                now,
            );
        let prepared = prepare(
            &ClusterIndex::default(),
            vec![(Arc::new(p), vec![])],
            SchedulerOptions::default(),
        );
        assert!(prepared.input.node_pools.is_empty());
        assert!(prepared.skipped_pools[0].1.contains("not ready"));
    }
}
