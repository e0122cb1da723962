//! The one adapter from cluster state to the scheduler's input. Provisioning, every disruption
//! method (through `controllers::disruption::view`) and `simulate` (which loads its manifests
//! into a [`ClusterIndex`]) build their NodePool templates, existing capacity, DaemonSets and pods
//! to place here, so all three see the cluster the same way. Pure over the state index so it is
//! tested without a cluster.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

use crate::apis::labels::{DISRUPTED_TAINT_KEY, NODEPOOL_LABEL};
use crate::apis::{NodeClaim, NodePool};
use crate::cloudprovider::{CloudProvider, CloudProviderError};
use crate::operator::metrics::Metrics;
use crate::scheduling::{
    DaemonSetPod, ExistingNode, InstanceType, MinValuesPolicy, NO_NODEPOOLS, NodePoolTemplate, Pod,
    PreferencePolicy, Quantity, Resources, SchedulerInput, SchedulerOptions,
    TopologySpreadConstraint, WellKnownLabels, convert,
};
use crate::state::pods::{is_reschedulable, is_terminal};
use crate::state::{ClusterIndex, HeldPod, nodeclaim_provider_id};

use super::template::{nodepool_template, taint};
use super::{eligibility, volumes};

/// A pod the batch tries to place, with the object it came from (for events).
#[derive(Debug, Clone)]
pub struct Pending {
    pub object: Arc<HeldPod>,
    pub pod: Pod,
}

/// What one provisioning round solves.
pub struct Prepared {
    pub input: SchedulerInput,
    pub pods: Vec<Pending>,
    /// Pods that cannot be simulated (bad quantities, unsupported selectors) or whose volumes
    /// no new node can satisfy (a missing claim…), with the reason.
    pub invalid: Vec<(Arc<HeldPod>, String)>,
    /// NodePools left out, with the reason (not ready, no instance types, bad template).
    pub skipped_pools: Vec<(String, String)>,
    /// Nodes and DaemonSets the scheduler cannot read (`Node n1: …`), left out of the input.
    pub left_out: Vec<String>,
}

/// Which pods a round places.
pub enum PodsToPlace<'a> {
    /// Provisionable pods (kube-scheduler gave up on them) and the pods of nodes being disrupted.
    Pending,
    /// [`PodsToPlace::Pending`], the provisionable ones as this view admits them (the
    /// provisioner's, which remembers earlier marks).
    Admitted(eligibility::Provisionable<'a>),
    /// Exactly these, in this order (`simulate`: its manifests' unbound pods).
    These(Vec<Arc<HeldPod>>),
}

/// A NodePool the scheduler may use, with its template and the instance types offered to it.
pub struct PoolInput {
    pub nodepool: Arc<NodePool>,
    pub template: NodePoolTemplate,
    pub instance_types: Vec<Arc<InstanceType>>,
    /// `Some(why)` when the NodePool's Ready condition is not True: nothing launches from it
    /// (no provisioning, no consolidation replacement); disruption still sees its nodes.
    pub not_ready: Option<String>,
}

/// A registered Node with the NodeClaim it belongs to (matched by provider ID), if any.
pub struct RegisteredNode {
    pub node: Arc<Node>,
    pub claim: Option<Arc<NodeClaim>>,
    pub provider_id: String,
}

/// The policies both provisioning and disruption schedule with.
pub fn scheduler_options(
    preference_policy: PreferencePolicy,
    min_values_policy: MinValuesPolicy,
    default_topology_spread: &[TopologySpreadConstraint],
    ignore_dra_requests: bool,
) -> SchedulerOptions {
    SchedulerOptions {
        preference_policy,
        min_values_policy,
        default_topology_spread: default_topology_spread.to_vec(),
        ignore_dra_requests,
        well_known_labels: WellKnownLabels::with_provider_labels(
            crate::apis::labels::WELL_KNOWN_LABELS.iter().copied(),
        ),
        ..SchedulerOptions::default()
    }
}

/// Every NodePool of ours with the instance types the cloud offers it; the lookups are timed in
/// `karpenter_cloudprovider_duration_seconds`. NodePools whose lookup failed come back apart.
/// Another Karpenter's pools (a NodeClass kind we do not serve) are left out silently: they are
/// not ours to launch for, consolidate into, or report on.
pub async fn pools_with_types(
    cloud: &dyn CloudProvider,
    metrics: &Metrics,
    pools: Vec<Arc<NodePool>>,
) -> (
    Vec<(Arc<NodePool>, Vec<Arc<InstanceType>>)>,
    Vec<(Arc<NodePool>, CloudProviderError)>,
) {
    let mut found = Vec::new();
    let mut failed = Vec::new();
    for pool in pools {
        if !cloud.serves(&pool.spec.template.spec.node_class_ref) {
            continue;
        }
        let started = Instant::now();
        let types = cloud.instance_types(&pool).await;
        metrics.observe_cloud_call(
            "GetInstanceTypes",
            started.elapsed(),
            types.as_ref().err().map(|e| e.kind()),
        );
        match types {
            Ok(types) => found.push((with_nodeclass_additions(cloud, pool), types)),
            Err(error) => failed.push((pool, error)),
        }
    }
    (found, failed)
}

/// The NodeClaim to create for a scheduler result: built from the NodePool as its nodes will be
/// (with the NodeClass's labels and taints, as the scheduler saw it).
pub fn nodeclaim_to_create(
    cloud: &dyn CloudProvider,
    pool: Arc<NodePool>,
    claim: &crate::scheduling::NewNodeClaim,
) -> NodeClaim {
    super::template::build_nodeclaim(&with_nodeclass_additions(cloud, pool), claim)
}

/// The NodePool as its nodes will be: the NodeClass's `nodeLabels` and `nodeTaints` added to the
/// template (a template label of the same key wins; a taint already there is not repeated), so
/// the scheduler matches selectors and tolerations against them and the NodeClaims carry them.
/// Annotations (the NodePool hash) are untouched: this is not a change of the NodePool.
pub fn with_nodeclass_additions(cloud: &dyn CloudProvider, pool: Arc<NodePool>) -> Arc<NodePool> {
    let Some(class) = cloud.nodeclass(&pool.spec.template.spec.node_class_ref) else {
        return pool;
    };
    if class.node_labels.is_empty() && class.node_taints.is_empty() {
        return pool;
    }
    let mut merged = (*pool).clone();
    let template = &mut merged.spec.template;
    let labels = &mut template
        .metadata
        .get_or_insert_with(Default::default)
        .labels;
    for (key, value) in class.node_labels {
        labels.entry(key).or_insert(value);
    }
    for taint in class.node_taints {
        let taints = &mut template.spec.taints;
        if !taints
            .iter()
            .any(|t| t.key == taint.key && t.effect == taint.effect)
        {
            taints.push(taint);
        }
    }
    Arc::new(merged)
}

/// Deleted, or tainted by our disruption. Another Karpenter's disrupted taint says nothing of
/// when it will delete the node (it may still be validating, or give up): its pods stay put
/// until the Node is deleted, as upstream counts unmanaged nodes.
fn being_disrupted(index: &ClusterIndex, node: &Node) -> bool {
    node.metadata.deletion_timestamp.is_some()
        || (node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == DISRUPTED_TAINT_KEY))
            && index.manages_node(node))
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

/// NodePools with their templates (limits against current usage); deleting NodePools and
/// unreadable templates are left out with the reason.
pub fn node_pools(
    index: &ClusterIndex,
    pools: Vec<(Arc<NodePool>, Vec<Arc<InstanceType>>)>,
) -> (Vec<PoolInput>, Vec<(String, String)>) {
    let mut out = Vec::new();
    let mut skipped = Vec::new();
    for (pool, instance_types) in pools {
        let name = pool.name_any();
        if pool.metadata.deletion_timestamp.is_some() {
            skipped.push((name, "is being deleted".to_string()));
            continue;
        }
        let not_ready = pool.not_ready_reason();
        match nodepool_template(&pool, usage_of(index, &name)) {
            Ok(template) => out.push(PoolInput {
                nodepool: pool,
                template,
                instance_types,
                not_ready,
            }),
            Err(e) => skipped.push((name, e.to_string())),
        }
    }
    (out, skipped)
}

/// Registered Nodes paired with their NodeClaims, and the NodeClaims no Node has registered
/// for yet.
pub fn registered_nodes(index: &ClusterIndex) -> (Vec<RegisteredNode>, Vec<Arc<NodeClaim>>) {
    let claims_by_provider_id: HashMap<String, Arc<NodeClaim>> = index
        .nodeclaims()
        .into_iter()
        .filter_map(|c| nodeclaim_provider_id(&c).map(|p| (p.to_string(), c.clone())))
        .collect();
    let mut registered = HashSet::new();
    let mut nodes = Vec::new();
    for node in index.nodes() {
        let provider_id = node
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.clone())
            .unwrap_or_default();
        let claim = claims_by_provider_id.get(&provider_id).cloned();
        if let Some(c) = &claim {
            registered.insert(c.name_any());
        }
        nodes.push(RegisteredNode {
            node,
            claim,
            provider_id,
        });
    }
    let unregistered = index
        .nodeclaims()
        .into_iter()
        .filter(|c| !registered.contains(&c.name_any()))
        .collect();
    (nodes, unregistered)
}

/// A registered Node as the scheduler sees it: its NodeClaim's startup taints are ignored (gone
/// by the time pods could schedule) and finished pods hold nothing.
pub fn existing_node(node: &RegisteredNode, pods: &[Arc<HeldPod>]) -> Result<ExistingNode, String> {
    let startup: Vec<_> = node
        .claim
        .as_ref()
        .map(|c| c.spec.startup_taints.iter().map(taint).collect())
        .unwrap_or_default();
    let active = pods.iter().filter(|p| !is_terminal(p)).map(|p| &**p);
    let mut existing =
        convert::existing_node_from_k8s(&node.node, active, &startup).map_err(|e| e.to_string())?;
    // A kubelet creates its Node, then reports its status: in between the Node offers no room,
    // and its NodeClaim, matched to it, no longer counts as capacity on the way. Until the node
    // is initialized, what it does not report (or reports as zero) is its NodeClaim's, as
    // upstream's state node falls back; else a round in that moment launches a NodeClaim more.
    if let Some(claim) = &node.claim
        && !existing.initialized
    {
        let from_claim = claim.status.as_ref().map(|s| &s.allocatable);
        for (resource, q) in from_claim.into_iter().flatten() {
            if let Ok(q) = Quantity::parse(&q.0)
                && existing.allocatable.get(resource).is_zero()
            {
                existing.allocatable.set(resource, q);
            }
        }
    }
    Ok(existing)
}

/// A NodeClaim whose Node has not registered: the capacity it will bring (empty allocatable
/// while the cloud has not answered yet). Startup taints are ignored, real taints block.
pub fn claim_capacity(claim: &NodeClaim) -> ExistingNode {
    let mut allocatable = Resources::new();
    for (resource, q) in claim
        .status
        .as_ref()
        .map(|s| &s.allocatable)
        .into_iter()
        .flatten()
    {
        if let Ok(q) = Quantity::parse(&q.0) {
            allocatable.set(resource, q);
        }
    }
    ExistingNode {
        name: claim.name_any(),
        hostname: claim.name_any(),
        labels: Arc::new(claim.labels().clone()),
        taints: claim.spec.taints.iter().map(taint).collect(),
        allocatable,
        pods: Vec::new(),
        node_pool: claim.labels().get(NODEPOOL_LABEL).cloned(),
        initialized: false,
        settling: false,
    }
}

/// The DaemonSets whose pods every new node will run; unreadable ones come back as messages.
pub fn daemonsets(index: &ClusterIndex) -> (Vec<DaemonSetPod>, Vec<String>) {
    let mut out = Vec::new();
    let mut left_out = Vec::new();
    for ds in index.daemonsets() {
        match convert::daemonset_from_k8s(&ds) {
            Ok(d) => out.push(d),
            Err(e) => left_out.push(format!("DaemonSet {}: {e}", ds.name_any())),
        }
    }
    (out, left_out)
}

/// Pods kube-scheduler gave up on, and their untried siblings, that provisioning should find
/// capacity for (see [`eligibility::Provisionable`]).
pub fn provisionable_pods(index: &ClusterIndex) -> Vec<Arc<HeldPod>> {
    admitted_pods(index, &eligibility::Provisionable::of(index))
}

/// The pods of `index` that `provisionable` admits.
fn admitted_pods(
    index: &ClusterIndex,
    provisionable: &eligibility::Provisionable,
) -> Vec<Arc<HeldPod>> {
    index
        .pods_iter()
        .filter(|p| provisionable.admits(p))
        .cloned()
        .collect()
}

/// Converts pods for the scheduler, with the volume topology their claims require; pods the
/// scheduler cannot read, or whose claims no node can satisfy, come back apart with the reason.
pub fn pods_to_place(
    index: &ClusterIndex,
    objects: impl IntoIterator<Item = Arc<HeldPod>>,
) -> (Vec<Pending>, Vec<(Arc<HeldPod>, String)>) {
    let mut pods = Vec::new();
    let mut invalid = Vec::new();
    for object in objects {
        // The held pod's own reading, read once per version of it; a round edits its copy.
        let pod = convert::converted(&object)
            .map(|reading| Pod::clone(&reading.pod))
            .map_err(|e| e.to_string());
        let volumes = volumes::volume_requirements(&object, index).map_err(|e| e.to_string());
        match (pod, volumes) {
            (Ok(mut pod), Ok(volume_requirements)) => {
                // Only when there are some: a write gives the pod a shape of its own.
                if volume_requirements.is_some() {
                    pod.volume_requirements = volume_requirements;
                }
                pods.push(Pending { object, pod });
            }
            (Err(e), _) | (_, Err(e)) => invalid.push((object, e)),
        }
    }
    (pods, invalid)
}

/// The scheduler sees only the NodePools provisioning can use. When it found none, its reason
/// names those left out and why, so a pod whose only NodePool is not Ready (or is static) is
/// told which and why rather than only upstream's "no nodepools found".
pub fn name_left_out_pools(reason: &str, skipped_pools: &[(String, String)]) -> String {
    const SHOWN: usize = 5;
    if reason != NO_NODEPOOLS || skipped_pools.is_empty() {
        return reason.to_string();
    }
    let mut parts: Vec<String> = skipped_pools
        .iter()
        .take(SHOWN)
        .map(|(pool, why)| format!("nodepool {pool:?} {why}"))
        .collect();
    if skipped_pools.len() > SHOWN {
        parts.push(format!("and {} more", skipped_pools.len() - SHOWN));
    }
    format!("{reason}: {}", parts.join("; "))
}

/// Builds a provisioning round's input. `pools` are the NodePools with the instance types the
/// cloud offers each; `options` carries the policies.
pub fn prepare(
    index: &ClusterIndex,
    pools: Vec<(Arc<NodePool>, Vec<Arc<InstanceType>>)>,
    options: SchedulerOptions,
    to_place: PodsToPlace<'_>,
) -> Prepared {
    let mut input = SchedulerInput {
        options,
        ..SchedulerInput::default()
    };
    let (usable, mut skipped_pools) = node_pools(index, pools);
    for pool in usable {
        let name = pool.nodepool.name_any();
        if let Some(why) = pool.not_ready {
            skipped_pools.push((name, why));
            continue;
        }
        if let Some(replicas) = pool.nodepool.spec.replicas {
            // Upstream: static NodePools are left out of the provisioning scheduler.
            skipped_pools.push((
                name,
                format!("is static (replicas: {replicas}): it keeps its own node count and launches nothing for pods"),
            ));
            continue;
        }
        input.node_pools.push(pool.template);
        input.instance_types.insert(name, pool.instance_types);
    }

    // Existing capacity: registered Nodes not being disrupted, and NodeClaims still on the way.
    let mut left_out = Vec::new();
    let mut disrupted_pods = Vec::new();
    let (nodes, unregistered) = registered_nodes(index);
    for node in &nodes {
        let name = node.node.name_any();
        let pods = index.pods_on_node(&name);
        if being_disrupted(index, &node.node) {
            // Their pods need a new home: upstream simulates them as pending.
            disrupted_pods.extend(pods.into_iter().filter(|p| is_reschedulable(p)));
            continue;
        }
        match existing_node(node, &pods) {
            Ok(existing) => input.existing_nodes.push(existing),
            Err(e) => left_out.push(format!("Node {name}: {e}")),
        }
    }
    for claim in unregistered {
        let capacity = claim_capacity(&claim);
        if claim.metadata.deletion_timestamp.is_none() && !capacity.allocatable.is_empty() {
            input.existing_nodes.push(capacity);
        }
    }
    let (daemonsets, unreadable) = daemonsets(index);
    input.daemonsets = daemonsets;
    left_out.extend(unreadable);

    let objects = match to_place {
        PodsToPlace::Pending => {
            let mut objects = provisionable_pods(index);
            objects.extend(disrupted_pods);
            objects
        }
        PodsToPlace::Admitted(provisionable) => {
            let mut objects = admitted_pods(index, &provisionable);
            objects.extend(disrupted_pods);
            objects
        }
        PodsToPlace::These(objects) => objects,
    };
    let (pods, invalid) = pods_to_place(index, objects);
    Prepared {
        input,
        pods,
        invalid,
        skipped_pools,
        left_out,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::labels::conditions;
    use crate::scheduling::fixtures;
    use crate::state::testing;

    fn pending(name: &str, cpu: &str) -> HeldPod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "uid": name},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
            "status": {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}
        }))
        .unwrap()
    }

    /// A Ready NodePool, as the NodePool controller leaves a valid one.
    fn pool(name: &str) -> Arc<NodePool> {
        let mut pool = statusless_pool(name);
        pool.set_ready_condition(crate::apis::ConditionStatus::True, conditions::READY, "");
        Arc::new(pool)
    }

    fn statusless_pool(name: &str) -> NodePool {
        crate::apis::validation::parse(&serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name},
            "spec": {"template": {"spec": {"requirements": [],
                "nodeClassRef": {"group": "karpenter.test.sh", "kind": "TestNodeClass", "name": "default"}}}}
        }))
        .unwrap()
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
            PodsToPlace::Pending,
        );
        let names: Vec<_> = prepared.pods.iter().map(|p| p.pod.name.clone()).collect();
        assert_eq!(names, ["a"]);
        assert_eq!(prepared.input.node_pools.len(), 1);
    }

    /// Solves the pending pods of `index` with `IGNORE_DRA_REQUESTS` as given.
    fn solve_pending(
        index: &ClusterIndex,
        ignore_dra_requests: bool,
    ) -> (Vec<Pod>, crate::scheduling::Results) {
        let options = SchedulerOptions {
            ignore_dra_requests,
            ..SchedulerOptions::default()
        };
        let pools = vec![(pool("p"), fixtures::instance_types(10))];
        let prepared = prepare(index, pools, options, PodsToPlace::Pending);
        assert!(prepared.left_out.is_empty() && prepared.invalid.is_empty());
        let pods: Vec<Pod> = prepared.pods.iter().map(|p| p.pod.clone()).collect();
        let results = crate::scheduling::Scheduler::new(prepared.input).solve(&pods);
        (pods, results)
    }

    /// Upstream refuses pods that claim DRA devices while `IGNORE_DRA_REQUESTS` is true, the
    /// claim in the pod's `resourceClaims` or in a container's `resources.claims` alike: no
    /// NodeClaim, and the reason their FailedScheduling event gives. False: placed as usual.
    #[test]
    fn pods_claiming_dra_devices_get_no_nodeclaim_while_dra_requests_are_ignored() {
        let mut index = ClusterIndex::default();
        index.apply_pod(pending("plain", "1"));
        let mut pod_claim = pending("pod-claim", "1");
        pod_claim.spec.as_mut().unwrap().resource_claims = Some(
            serde_json::from_value(serde_json::json!(
                [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]))
            .unwrap(),
        );
        index.apply_pod(pod_claim);
        index.apply_pod(
            serde_json::from_value::<HeldPod>(serde_json::json!({
                "metadata": {"name": "container-claim", "namespace": "default", "uid": "cc"},
                "spec": {"containers": [{"name": "c", "resources": {
                    "requests": {"cpu": "1"}, "claims": [{"name": "gpu"}]}}]},
                "status": {"phase": "Pending", "conditions": [
                    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}
            }))
            .unwrap(),
        );

        let (pods, results) = solve_pending(&index, true);
        let placed: Vec<&str> = results.new_node_claims[0]
            .pods
            .iter()
            .map(|&i| pods[i].name.as_str())
            .collect();
        assert_eq!(placed, ["plain"], "{results:?}");
        let mut refused: Vec<(&str, &str)> = results
            .unschedulable
            .iter()
            .map(|u| (pods[u.pod].name.as_str(), u.reason.as_str()))
            .collect();
        refused.sort_unstable();
        // Upstream's wording, which the pod's FailedScheduling event carries.
        let upstream = "pod has Dynamic Resource Allocation requirements that are not yet supported by Karpenter";
        assert_eq!(
            refused,
            [("container-claim", upstream), ("pod-claim", upstream)]
        );

        let (_, results) = solve_pending(&index, false);
        assert!(results.unschedulable.is_empty(), "{results:?}");
        assert_eq!(results.scheduled_pod_count(), 3);
    }

    /// A DaemonSet whose pods claim DRA devices would not run on the node while
    /// `IGNORE_DRA_REQUESTS` is true: upstream leaves it out of the node's overhead.
    #[test]
    fn daemonsets_claiming_dra_devices_add_no_overhead_while_dra_requests_are_ignored() {
        let mut index = ClusterIndex::default();
        index.apply_pod(pending("web", "1"));
        index.apply_daemonset(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "gpu-agent", "namespace": "kube-system"},
                "spec": {"selector": {}, "template": {"spec": {
                    "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                    "containers": [{"name": "agent", "resources": {
                        "requests": {"cpu": "500m"}, "claims": [{"name": "gpu"}]}}]}}}
            }))
            .unwrap(),
        );
        let overhead = |ignore_dra_requests| {
            let (_, results) = solve_pending(&index, ignore_dra_requests);
            results.new_node_claims[0].daemon_overhead.cpu()
        };
        assert!(overhead(true).is_zero());
        assert_eq!(overhead(false), Quantity::parse("500m").unwrap());
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
        let prepared = prepare(
            &index,
            vec![],
            SchedulerOptions::default(),
            PodsToPlace::Pending,
        );
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
        let prepared = prepare(
            &index,
            vec![],
            SchedulerOptions::default(),
            PodsToPlace::Pending,
        );
        assert!(
            prepared.input.existing_nodes.is_empty(),
            "a disrupted node offers no capacity"
        );
        assert_eq!(prepared.pods.len(), 1);
    }

    /// Another Karpenter's disrupted taint is its own business until it deletes the Node: the
    /// pods stay where they are, and we launch nothing for them.
    #[test]
    fn pods_on_another_providers_disrupted_node_stay_put() {
        let mut index = testing::managed_index();
        index.apply_nodeclaim(testing::foreign(testing::nodeclaim(
            "c1",
            "kwok",
            Some("kwok://1"),
        )));
        index.apply_node(testing::node(
            "n1",
            Some("kwok://1"),
            &[(DISRUPTED_TAINT_KEY, "NoSchedule")],
        ));
        index.apply_pod(testing::pod("default", "web", Some("n1")));
        let prepared = prepare(
            &index,
            vec![],
            SchedulerOptions::default(),
            PodsToPlace::Pending,
        );
        assert!(prepared.pods.is_empty(), "{:?}", prepared.pods.len());
        assert_eq!(prepared.input.existing_nodes.len(), 1);
    }

    /// The kubelet created the Node but has not reported its status yet: the node's room is
    /// its NodeClaim's, so pods pending for it get no NodeClaim more.
    #[test]
    fn a_node_without_status_yet_offers_its_nodeclaims_room() {
        let mut index = ClusterIndex::default();
        let mut claim = testing::nodeclaim("p-1", "p", Some("exoscale://1"));
        claim
            .status
            .get_or_insert_with(Default::default)
            .allocatable = testing::resources(&[("cpu", "4"), ("memory", "8Gi"), ("pods", "110")]);
        index.apply_nodeclaim(claim);
        let mut node = testing::node("n1", Some("exoscale://1"), &[]);
        node.status = None;
        index.apply_node(node.clone());
        let prepared = prepare(
            &index,
            vec![],
            SchedulerOptions::default(),
            PodsToPlace::Pending,
        );
        assert_eq!(prepared.input.existing_nodes.len(), 1);
        let room = &prepared.input.existing_nodes[0].allocatable;
        assert_eq!(room.cpu(), Quantity::parse("4").unwrap());
        assert_eq!(room.pods(), Quantity::parse("110").unwrap());

        // A node reporting zero is not trusted either until initialized; once initialized,
        // what the Node reports is the truth.
        node.status = Some(k8s_openapi::api::core::v1::NodeStatus {
            allocatable: Some(testing::resources(&[("cpu", "0"), ("pods", "110")])),
            ..Default::default()
        });
        index.apply_node(node.clone());
        let prepared = prepare(
            &index,
            vec![],
            SchedulerOptions::default(),
            PodsToPlace::Pending,
        );
        assert_eq!(
            prepared.input.existing_nodes[0].allocatable.cpu(),
            Quantity::parse("4").unwrap()
        );
        node.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert("karpenter.sh/initialized".into(), "true".into());
        index.apply_node(node);
        let prepared = prepare(
            &index,
            vec![],
            SchedulerOptions::default(),
            PodsToPlace::Pending,
        );
        assert!(prepared.input.existing_nodes[0].allocatable.cpu().is_zero());
    }

    /// Every real node runs DaemonSet pods, each pinned by the DaemonSet controller with
    /// `matchFields: metadata.name`: the node still offers its room. A pending pod pinned the
    /// same way fits only its node, and one pinned to a name no node has gets no NodeClaim.
    #[test]
    fn nodes_running_daemonset_pods_are_capacity_and_pinned_pods_fit_only_their_node() {
        let mut index = ClusterIndex::default();
        let mut node = testing::node("n1", Some("exoscale://1"), &[]);
        node.metadata.labels = Some(std::collections::BTreeMap::from([
            ("kubernetes.io/hostname".to_string(), "n1".to_string()),
            ("karpenter.sh/nodepool".to_string(), "p".to_string()),
            ("karpenter.sh/initialized".to_string(), "true".to_string()),
        ]));
        node.status = Some(k8s_openapi::api::core::v1::NodeStatus {
            allocatable: Some(testing::resources(&[("cpu", "4"), ("pods", "110")])),
            ..Default::default()
        });
        index.apply_node(node);
        index.apply_pod(testing::owned_by_daemonset(testing::pod(
            "kube-system",
            "kube-proxy-x",
            Some("n1"),
        )));
        let pinned = |name: &str, node: &str| {
            let mut pod = pending(name, "1");
            pod.spec.as_mut().unwrap().affinity = Some(
                serde_json::from_value(serde_json::json!({"nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                    ]}
                }}))
                .unwrap(),
            );
            pod
        };
        index.apply_pod(pinned("to-n1", "n1"));
        index.apply_pod(pinned("to-gone", "gone"));
        let prepared = prepare(
            &index,
            vec![(pool("p"), fixtures::instance_types(10))],
            SchedulerOptions::default(),
            PodsToPlace::Pending,
        );
        assert!(prepared.left_out.is_empty(), "{:?}", prepared.left_out);
        assert!(prepared.invalid.is_empty());
        assert_eq!(prepared.input.existing_nodes.len(), 1);
        assert_eq!(prepared.input.existing_nodes[0].pods.len(), 1);
        let pods: Vec<Pod> = prepared.pods.iter().map(|p| p.pod.clone()).collect();
        let results = crate::scheduling::Scheduler::new(prepared.input).solve(&pods);
        assert!(results.new_node_claims.is_empty(), "{results:?}");
        assert_eq!(results.existing_nodes.len(), 1);
        assert_eq!(results.existing_nodes[0].pods.len(), 1);
        assert_eq!(results.unschedulable.len(), 1);
        assert_eq!(pods[results.unschedulable[0].pod].name, "to-gone");
    }

    /// A round places a marked pod's untried siblings with it, on existing room first: only
    /// what does not fit there gets a NodeClaim. Untried pods of a workload with no marked pod
    /// wait for kube-scheduler.
    #[test]
    fn untried_siblings_of_a_marked_pod_fill_existing_room_first_then_get_nodeclaims() {
        let mut index = ClusterIndex::default();
        let mut node = testing::node("n1", Some("exoscale://1"), &[]);
        node.metadata.labels = Some(std::collections::BTreeMap::from([
            ("kubernetes.io/hostname".to_string(), "n1".to_string()),
            ("karpenter.sh/nodepool".to_string(), "p".to_string()),
            ("karpenter.sh/initialized".to_string(), "true".to_string()),
        ]));
        node.status = Some(k8s_openapi::api::core::v1::NodeStatus {
            allocatable: Some(testing::resources(&[("cpu", "2"), ("pods", "110")])),
            ..Default::default()
        });
        index.apply_node(node);
        let replica = |name: &str, controller: &str, marked: bool| {
            let mut pod = pending(name, "1");
            pod.metadata.owner_references = Some(vec![
                serde_json::from_value(serde_json::json!({"apiVersion": "apps/v1",
                    "kind": "ReplicaSet", "name": controller, "uid": controller,
                    "controller": true}))
                .unwrap(),
            ]);
            if !marked {
                pod.status.as_mut().unwrap().conditions = None;
            }
            pod
        };
        index.apply_pod(replica("m1", "web", true));
        for name in ["u1", "u2", "u3"] {
            index.apply_pod(replica(name, "web", false));
        }
        index.apply_pod(replica("untried-elsewhere", "api", false));
        let prepared = prepare(
            &index,
            vec![(pool("p"), fixtures::instance_types(10))],
            SchedulerOptions::default(),
            PodsToPlace::Pending,
        );
        let mut names: Vec<_> = prepared.pods.iter().map(|p| p.pod.name.clone()).collect();
        names.sort();
        assert_eq!(names, ["m1", "u1", "u2", "u3"]);
        let pods: Vec<Pod> = prepared.pods.iter().map(|p| p.pod.clone()).collect();
        let results = crate::scheduling::Scheduler::new(prepared.input).solve(&pods);
        assert!(results.unschedulable.is_empty(), "{results:?}");
        let on_existing: usize = results.existing_nodes.iter().map(|n| n.pods.len()).sum();
        let on_new: usize = results.new_node_claims.iter().map(|c| c.pods.len()).sum();
        assert_eq!((on_existing, on_new), (2, 2), "{results:?}");
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
        let prepared = prepare(
            &index,
            vec![],
            SchedulerOptions::default(),
            PodsToPlace::Pending,
        );
        assert_eq!(prepared.input.existing_nodes.len(), 1);
        assert_eq!(prepared.input.existing_nodes[0].name, "p-abc");
    }

    #[test]
    fn static_nodepools_launch_nothing_for_pods() {
        let mut index = ClusterIndex::default();
        index.apply_pod(pending("a", "1"));
        let mut fixed = (*pool("fixed")).clone();
        fixed.spec.replicas = Some(3);
        let prepared = prepare(
            &index,
            vec![
                (Arc::new(fixed), fixtures::instance_types(10)),
                (pool("dynamic"), fixtures::instance_types(10)),
            ],
            SchedulerOptions::default(),
            PodsToPlace::Pending,
        );
        let pools: Vec<_> = prepared
            .input
            .node_pools
            .iter()
            .map(|p| p.name.clone())
            .collect();
        assert_eq!(pools, ["dynamic"]);
        assert_eq!(prepared.skipped_pools.len(), 1);
        assert_eq!(prepared.skipped_pools[0].0, "fixed");
        assert!(prepared.skipped_pools[0].1.contains("static (replicas: 3)"));
    }

    #[test]
    fn a_nodepool_launches_nothing_before_its_status_says_ready() {
        let mut index = ClusterIndex::default();
        index.apply_pod(pending("a", "1"));
        let mut unknown = statusless_pool("unknown");
        let status = crate::apis::ConditionStatus::Unknown;
        unknown.set_ready_condition(status, "AwaitingReconciliation", "");
        let prepared = prepare(
            &index,
            vec![
                (
                    Arc::new(statusless_pool("new")),
                    fixtures::instance_types(10),
                ),
                (Arc::new(unknown), fixtures::instance_types(10)),
                (pool("ready"), fixtures::instance_types(10)),
            ],
            SchedulerOptions::default(),
            PodsToPlace::Pending,
        );
        let pools: Vec<_> = prepared
            .input
            .node_pools
            .iter()
            .map(|p| p.name.as_str())
            .collect();
        assert_eq!(pools, ["ready"]);
        assert_eq!(
            prepared.skipped_pools,
            [
                (
                    "new".to_string(),
                    "is not ready: its status has no Ready condition yet".to_string()
                ),
                (
                    "unknown".to_string(),
                    "is not ready (AwaitingReconciliation)".to_string()
                ),
            ]
        );
    }

    #[test]
    fn unready_nodepools_are_skipped_with_the_reason() {
        let mut p = (*pool("p")).clone();
        let status = crate::apis::ConditionStatus::False;
        p.set_ready_condition(
            status,
            "NodeClassNotReady",
            "NodeClass default is not ready",
        );
        let mut index = ClusterIndex::default();
        index.apply_pod(pending("a", "1"));
        let prepared = prepare(
            &index,
            vec![(Arc::new(p), vec![])],
            SchedulerOptions::default(),
            PodsToPlace::Pending,
        );
        assert!(prepared.input.node_pools.is_empty());
        assert!(prepared.skipped_pools[0].1.contains("not ready"));
        // The pod is told which NodePool and why, not only "no nodepools found".
        let pods: Vec<Pod> = prepared.pods.iter().map(|p| p.pod.clone()).collect();
        let results = crate::scheduling::Scheduler::new(prepared.input).solve(&pods);
        let reason = name_left_out_pools(&results.unschedulable[0].reason, &prepared.skipped_pools);
        assert_eq!(
            reason,
            "no nodepools found: nodepool \"p\" is not ready: NodeClass default is not ready"
        );
        let many: Vec<(String, String)> = (0..7)
            .map(|i| (format!("p{i}"), "is being deleted".to_string()))
            .collect();
        assert!(name_left_out_pools(NO_NODEPOOLS, &many).ends_with("; and 2 more"));
        assert_eq!(name_left_out_pools("other", &many), "other");
    }
}
