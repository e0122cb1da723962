//! Launches this provisioner started that the cloud has not answered yet (NodeClaims without a
//! providerID).
//!
//! Upstream's cluster state is unsynced while any NodeClaim lacks its providerID, so no round
//! runs until every launch has answered. Behind the Exoscale API's rate limit (10 requests a
//! second), a 1 000-node launch then holds every later pending pod back for 100 s. A NodeClaim
//! this process created is different: it knows which pods the NodeClaim was made for, and the
//! instance types it may become. Such a NodeClaim is modelled with only what is certain: its
//! pods already on it (they are not placed again, so nothing is launched twice), the smallest
//! allocatable among its instance types, the labels every outcome has, and the largest capacity
//! among them counted against its NodePool's limits. A NodeClaim anyone else created (a
//! replacement, a previous leader's) still holds provisioning back, as upstream.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::ResourceExt;

use crate::apis::NodeClaim;
use crate::apis::labels::NODEPOOL_LABEL;
use crate::scheduling::{ExistingNode, InstanceType, Resources, convert};
use crate::state::ClusterIndex;

use super::input::Prepared;
use super::template::{requirements, taint};

/// NodeClaims this provisioner created, by name, with the UIDs of the pods each was made for;
/// kept until the NodeClaim has its providerID or is gone.
#[derive(Default)]
pub struct InFlight(Mutex<HashMap<String, Vec<String>>>);

impl InFlight {
    fn claims(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<String>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a NodeClaim just created for these pods.
    pub fn created(&self, claim: &str, pod_uids: Vec<String>) {
        self.claims().insert(claim.to_string(), pod_uids);
    }

    /// Adds pods a later round placed on a NodeClaim still in flight (a no-op for any other
    /// capacity), so they stay with it until it launches.
    pub fn assigned(&self, claim: &str, pod_uids: impl IntoIterator<Item = String>) {
        if let Some(pods) = self.claims().get_mut(claim) {
            pods.extend(pod_uids);
        }
    }

    /// Whether every NodeClaim still waiting for its providerID is one of ours (otherwise its
    /// capacity and pods are unknown, and a round must wait, as upstream).
    pub fn accounts_for(&self, index: &ClusterIndex) -> bool {
        let claims = self.claims();
        index
            .unlaunched_nodeclaims()
            .all(|c| claims.contains_key(c.metadata.name.as_deref().unwrap_or_default()))
    }

    /// Forgets NodeClaims that launched or are gone, and returns the rest.
    pub fn unlaunched(&self, index: &ClusterIndex) -> HashMap<String, Vec<String>> {
        let mut claims = self.claims();
        claims.retain(|name, _| {
            index
                .nodeclaim(name)
                .is_some_and(|c| crate::state::nodeclaim_provider_id(&c).is_none())
        });
        claims.clone()
    }
}

/// Puts each unlaunched NodeClaim of `ours` into the round as the capacity it is sure to have,
/// with its pods on it; those pods leave the round. A deleting NodeClaim will host nothing: its
/// pods stay in the round.
pub fn reserve(prepared: &mut Prepared, index: &ClusterIndex, ours: &HashMap<String, Vec<String>>) {
    let mut reserved: HashMap<&str, &str> = HashMap::new();
    let mut claims = Vec::new();
    for (name, pods) in ours {
        let Some(claim) = index.nodeclaim(name) else {
            continue;
        };
        if claim.metadata.deletion_timestamp.is_some() {
            continue;
        }
        for uid in pods {
            reserved.insert(uid.as_str(), name.as_str());
        }
        claims.push(claim);
    }
    let mut on_claim: HashMap<&str, Vec<Arc<crate::scheduling::BoundPod>>> = HashMap::new();
    let mut kept = Vec::with_capacity(prepared.pods.len());
    for pending in std::mem::take(&mut prepared.pods) {
        let claim = pending
            .object
            .metadata
            .uid
            .as_deref()
            .and_then(|uid| reserved.get(uid));
        match (claim, convert::bound_pod_from_k8s(&pending.object)) {
            (Some(claim), Ok(bound)) => on_claim.entry(claim).or_default().push(bound),
            _ => kept.push(pending),
        }
    }
    prepared.pods = kept;
    for claim in claims {
        let name = claim.name_any();
        let pods = on_claim.remove(name.as_str()).unwrap_or_default();
        let Some(pool) = claim.labels().get(NODEPOOL_LABEL) else {
            continue;
        };
        let offered = prepared
            .input
            .instance_types
            .get(pool)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let possible = possible_types(&claim, offered);
        if let Some(template) = prepared
            .input
            .node_pools
            .iter_mut()
            .find(|t| &t.name == pool)
        {
            // Limits hold whichever type the launch picks; with none known, the largest offered.
            let counted = if possible.is_empty() {
                offered.to_vec()
            } else {
                possible.clone()
            };
            let mut largest = Resources::new();
            for it in &counted {
                largest.max_with(&it.capacity);
            }
            template.usage += &largest;
        }
        if let Some(node) = sure_capacity(&claim, &possible, pods) {
            prepared.input.existing_nodes.push(node);
        }
    }
}

/// The offered instance types the NodeClaim's requirements allow (empty when they cannot be read).
fn possible_types(claim: &NodeClaim, offered: &[Arc<InstanceType>]) -> Vec<Arc<InstanceType>> {
    let Ok(reqs) = requirements(&claim.name_any(), &claim.spec.requirements) else {
        return Vec::new();
    };
    if reqs.is_empty() {
        // Provisioning always names the instance types; a NodeClaim without requirements is
        // not one it made, and its outcome is anyone's guess.
        return Vec::new();
    }
    offered
        .iter()
        .filter(|it| it.requirements.intersects(&reqs).is_ok())
        .cloned()
        .collect()
}

/// What an unlaunched NodeClaim will at least be: the smallest allocatable among its possible
/// types, its labels plus those every possible type and its own requirements fix to one value,
/// its taints (startup taints are gone by the time pods run). None without a possible type.
fn sure_capacity(
    claim: &NodeClaim,
    possible: &[Arc<InstanceType>],
    pods: Vec<Arc<crate::scheduling::BoundPod>>,
) -> Option<ExistingNode> {
    let (first, rest) = possible.split_first()?;
    let mut allocatable = first.allocatable();
    for it in rest {
        allocatable.min_with(&it.allocatable());
    }
    let mut labels = claim.labels().clone();
    let mut fixed: Vec<(&str, &str)> = first
        .requirements
        .iter()
        .filter_map(|r| Some((r.key(), r.single_value()?)))
        .collect();
    fixed.retain(|(key, value)| {
        rest.iter().all(|it| {
            it.requirements
                .get(key)
                .and_then(|r| r.single_value())
                .is_some_and(|v| v == *value)
        })
    });
    let own = requirements(&claim.name_any(), &claim.spec.requirements).ok()?;
    for (key, value) in own
        .iter()
        .filter_map(|r| Some((r.key(), r.single_value()?)))
        .chain(fixed)
    {
        labels
            .entry(key.to_string())
            .or_insert_with(|| value.to_string());
    }
    let name = claim.name_any();
    Some(ExistingNode {
        hostname: name.clone(),
        name,
        node_pool: labels.get(NODEPOOL_LABEL).cloned(),
        labels: Arc::new(labels),
        taints: claim.spec.taints.iter().map(taint).collect(),
        allocatable,
        pods,
        initialized: false,
        settling: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::NodePool;
    use crate::provisioning::input::{PodsToPlace, prepare};
    use crate::scheduling::{Scheduler, SchedulerOptions, fixtures};
    use crate::state::{HeldPod, testing};

    fn pending(name: &str, cpu: &str) -> HeldPod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "uid": name},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
            "status": {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}
        }))
        .unwrap()
    }

    fn pool(limits: serde_json::Value) -> Arc<NodePool> {
        Arc::new(
            crate::apis::validation::parse(&serde_json::json!({
                "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "p"},
                "spec": {"limits": limits, "template": {"spec": {"requirements": [],
                    "nodeClassRef": {"group": "karpenter.test.sh", "kind": "TestNodeClass", "name": "default"}}}}
            }))
            .unwrap(),
        )
    }

    fn round(index: &ClusterIndex, in_flight: &InFlight, pool: &Arc<NodePool>) -> Prepared {
        let types = fixtures::instance_types(10);
        let mut prepared = prepare(
            index,
            vec![(pool.clone(), types)],
            SchedulerOptions::default(),
            PodsToPlace::Pending,
        );
        reserve(&mut prepared, index, &in_flight.unlaunched(index));
        prepared
    }

    fn names(prepared: &Prepared) -> Vec<String> {
        prepared.pods.iter().map(|p| p.pod.name.clone()).collect()
    }

    /// Pods a round put on existing capacity: the node's name and the pods' names.
    type Placed = (String, Vec<String>);

    /// Runs a round and creates its NodeClaims (named `p-<n>`, no providerID) as provisioning
    /// does; returns what the solve did with the round's pods.
    fn provision(
        index: &mut ClusterIndex,
        in_flight: &InFlight,
        pool: &Arc<NodePool>,
        next: &mut usize,
    ) -> (Vec<Vec<String>>, Vec<Placed>) {
        let prepared = round(index, in_flight, pool);
        let pods: Vec<_> = prepared.pods.iter().map(|p| p.pod.clone()).collect();
        let results = Scheduler::new(prepared.input.clone()).solve(&pods);
        let mut created = Vec::new();
        for claim in &results.new_node_claims {
            let mut object = crate::provisioning::template::build_nodeclaim(pool, claim);
            *next += 1;
            let name = format!("p-{next}");
            object.metadata.name = Some(name.clone());
            let uids: Vec<String> = claim
                .pods
                .iter()
                .filter_map(|&i| prepared.pods[i].object.metadata.uid.clone())
                .collect();
            index.apply_created_nodeclaim(object);
            in_flight.created(&name, uids.clone());
            created.push(uids);
        }
        let existing = results
            .existing_nodes
            .iter()
            .map(|a| {
                let uids = a.pods.iter();
                let uids = uids.filter_map(|&i| prepared.pods[i].object.metadata.uid.clone());
                in_flight.assigned(&a.node_name, uids);
                let pods = a.pods.iter().map(|&i| pods[i].name.clone()).collect();
                (a.node_name.clone(), pods)
            })
            .collect();
        (created, existing)
    }

    #[test]
    fn pods_of_a_launch_in_flight_are_not_launched_for_again() {
        let mut index = ClusterIndex::default();
        let pool = pool(serde_json::json!({}));
        index.apply_pod(pending("a", "1"));
        index.apply_pod(pending("b", "1"));
        let in_flight = InFlight::default();
        let mut next = 0;
        let (created, _) = provision(&mut index, &in_flight, &pool, &mut next);
        assert_eq!(created, [["a", "b"]]);
        assert!(in_flight.accounts_for(&index), "p-1 is ours");

        // Still no providerID: a and b stay on p-1, and c takes the room p-1 is sure to have
        // (its smallest possible type has 3 CPUs less 100m of overhead; a and b hold 2).
        index.apply_pod(pending("c", "500m"));
        let prepared = round(&index, &in_flight, &pool);
        assert_eq!(names(&prepared), ["c"]);
        let on_claim = prepared
            .input
            .existing_nodes
            .iter()
            .find(|n| n.name == "p-1")
            .expect("p-1 modelled");
        assert_eq!(on_claim.pods.len(), 2);
        assert_eq!(on_claim.allocatable.cpu().milli(), 2900);
        assert_eq!(
            on_claim
                .labels
                .get("kubernetes.io/arch")
                .map(String::as_str),
            Some("amd64"),
            "every possible type is amd64"
        );
        let (created, existing) = provision(&mut index, &in_flight, &pool, &mut next);
        assert!(created.is_empty(), "nothing launched twice: {created:?}");
        assert_eq!(existing, [("p-1".to_string(), vec!["c".to_string()])]);

        // c now stays with p-1 too; d needs more than the room left: a NodeClaim for d alone.
        index.apply_pod(pending("d", "1"));
        let prepared = round(&index, &in_flight, &pool);
        assert_eq!(names(&prepared), ["d"]);
        let (created, _) = provision(&mut index, &in_flight, &pool, &mut next);
        assert_eq!(created, [["d"]]);
    }

    #[test]
    fn a_launched_or_deleting_nodeclaim_is_capacity_no_longer_reserved() {
        let mut index = ClusterIndex::default();
        let pool = pool(serde_json::json!({}));
        index.apply_pod(pending("a", "1"));
        let in_flight = InFlight::default();
        let mut next = 0;
        provision(&mut index, &in_flight, &pool, &mut next);

        let mut deleting = (*index.nodeclaim("p-1").unwrap()).clone();
        deleting.metadata.deletion_timestamp = Some(testing::ts(5));
        index.apply_nodeclaim(deleting.clone());
        let prepared = round(&index, &in_flight, &pool);
        assert_eq!(
            names(&prepared),
            ["a"],
            "a deleting NodeClaim hosts nothing"
        );
        assert!(prepared.input.existing_nodes.is_empty());

        // Launched: the providerID ends the reservation (the launched capacity is read as any
        // other NodeClaim's), and the record is forgotten.
        deleting.metadata.deletion_timestamp = None;
        let launched = testing::with_capacity(deleting, &[("cpu", "3"), ("pods", "30")]);
        let mut launched = launched;
        launched.status.as_mut().unwrap().provider_id = Some("exoscale://x".into());
        index.apply_nodeclaim(launched);
        assert!(in_flight.unlaunched(&index).is_empty());
        let prepared = round(&index, &in_flight, &pool);
        assert_eq!(names(&prepared), ["a"]);
        assert_eq!(prepared.input.existing_nodes.len(), 1);
        assert!(prepared.input.existing_nodes[0].pods.is_empty());
    }

    #[test]
    fn a_nodeclaim_someone_else_created_is_not_accounted_for() {
        let mut index = ClusterIndex::default();
        let in_flight = InFlight::default();
        assert!(in_flight.accounts_for(&index));
        index.apply_nodeclaim(testing::nodeclaim("replacement", "p", None));
        assert!(!in_flight.accounts_for(&index), "capacity and pods unknown");
        in_flight.created("replacement", vec![]);
        assert!(in_flight.accounts_for(&index));
        index.apply_nodeclaim(testing::nodeclaim("launched", "p", Some("exoscale://1")));
        assert!(
            in_flight.accounts_for(&index),
            "a launched NodeClaim is known"
        );
    }

    #[test]
    fn limits_count_the_largest_type_a_launch_in_flight_may_become() {
        let mut index = ClusterIndex::default();
        // Room for one node of up to 10 CPUs.
        let pool = pool(serde_json::json!({"cpu": "10"}));
        index.apply_pod(pending("a", "1"));
        let in_flight = InFlight::default();
        let mut next = 0;
        provision(&mut index, &in_flight, &pool, &mut next);
        let prepared = round(&index, &in_flight, &pool);
        let usage = &prepared.input.node_pools[0].usage;
        assert_eq!(
            usage.cpu().milli(),
            10_000,
            "p-1 may become fake-it-9 (10 CPUs)"
        );
        index.apply_pod(pending("b", "2"));
        let (created, existing) = provision(&mut index, &in_flight, &pool, &mut next);
        assert!(created.is_empty(), "the limit is reached: {created:?}");
        assert!(
            existing.is_empty(),
            "b does not fit what p-1 is sure to have"
        );
    }
}
