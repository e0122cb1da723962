//! The pure cluster index: synchronous `apply`/`delete` per kind and derived queries. No I/O;
//! unit-tested by applying objects and asserting what it derives.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttachment};
use kube::ResourceExt;

use crate::apis::labels::{CAPACITY_TYPE_LABEL, NODEPOOL_LABEL};
use crate::apis::{NodeClaim, NodeOverlay, NodePool, ResourceList};

use super::held_pod::HeldPod as Pod;
use super::pod_events::{PodEventMarks, counted_on};
use super::quantity;

/// Kinds the index holds; each must finish its initial list before the index is synced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Node,
    NodeClaim,
    NodePool,
    Pod,
    DaemonSet,
    PodDisruptionBudget,
    PersistentVolumeClaim,
    PersistentVolume,
    StorageClass,
    VolumeAttachment,
    /// Watched only with the NodeOverlay feature gate; then required like the others.
    NodeOverlay,
}

impl Kind {
    pub const ALL: [Kind; 10] = [
        Kind::Node,
        Kind::NodeClaim,
        Kind::NodePool,
        Kind::Pod,
        Kind::DaemonSet,
        Kind::PodDisruptionBudget,
        Kind::PersistentVolumeClaim,
        Kind::PersistentVolume,
        Kind::StorageClass,
        Kind::VolumeAttachment,
    ];
}

/// `namespace/name` of a namespaced object.
pub type NamespacedName = (String, String);

fn namespaced<K: ResourceExt>(obj: &K) -> NamespacedName {
    (obj.namespace().unwrap_or_default(), obj.name_any())
}

/// Resources and node count a NodePool has provisioned.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodePoolUsage {
    pub resources: ResourceList,
    pub nodes: i64,
}

#[derive(Default)]
pub struct ClusterIndex {
    nodes: BTreeMap<String, Arc<Node>>,
    nodeclaims: BTreeMap<String, Arc<NodeClaim>>,
    nodepools: BTreeMap<String, Arc<NodePool>>,
    pods: BTreeMap<NamespacedName, Arc<Pod>>,
    pods_by_node: BTreeMap<String, BTreeSet<NamespacedName>>,
    daemonsets: BTreeMap<NamespacedName, Arc<DaemonSet>>,
    pdbs: BTreeMap<NamespacedName, Arc<PodDisruptionBudget>>,
    pvcs: BTreeMap<NamespacedName, Arc<PersistentVolumeClaim>>,
    pvs: BTreeMap<String, Arc<PersistentVolume>>,
    storage_classes: BTreeMap<String, Arc<StorageClass>>,
    volume_attachments: BTreeMap<String, Arc<VolumeAttachment>>,
    overlays: BTreeMap<String, Arc<NodeOverlay>>,
    /// Optional kinds that were switched on: required for sync like [`Kind::ALL`].
    required: BTreeSet<Kind>,
    listed: BTreeSet<Kind>,
    /// Kinds whose watch failed since their last complete list.
    stale: BTreeSet<Kind>,
    /// Names seen during a re-list in progress, per kind.
    relisting: BTreeMap<Kind, BTreeSet<String>>,
    /// When pods last came to or left each node (after the first complete pod list).
    pod_events: PodEventMarks,
    /// The NodeClass kinds this process serves (group, kind); `None` serves every kind (tests
    /// that index objects of one provider only).
    managed: Option<Vec<(String, String)>>,
    /// How many of our NodeClaims got their providerID here (a held version without one
    /// replaced by one with it): a launch's progress even while its round adds NodeClaims.
    provider_ids_assigned: u64,
}

/// The state is unsynced only because `waiting` of our NodeClaims have no providerID yet;
/// `provider_ids_assigned` counts, over the process's life, those that got one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launching {
    pub waiting: usize,
    pub provider_ids_assigned: u64,
}

/// Whether the Node's `Ready` condition is True.
pub fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// The provider ID of a Node (an empty one is none: it names no instance).
pub fn node_provider_id(node: &Node) -> Option<&str> {
    node.spec
        .as_ref()?
        .provider_id
        .as_deref()
        .filter(|id| !id.is_empty())
}

/// The provider ID of a NodeClaim (an empty one is none: the claim is still launching, and
/// garbage collection protects its instance by the claim's name).
pub fn nodeclaim_provider_id(claim: &NodeClaim) -> Option<&str> {
    claim
        .status
        .as_ref()?
        .provider_id
        .as_deref()
        .filter(|id| !id.is_empty())
}

fn pod_node(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

fn key_string(kind: Kind, key: &NamespacedName) -> String {
    match kind {
        Kind::Node
        | Kind::NodeClaim
        | Kind::NodePool
        | Kind::PersistentVolume
        | Kind::StorageClass
        | Kind::VolumeAttachment
        | Kind::NodeOverlay => key.1.clone(),
        _ => format!("{}/{}", key.0, key.1),
    }
}

impl ClusterIndex {
    // ---- feeding ---------------------------------------------------------------------------

    /// Takes an owned object or the shared store's `Arc` (one copy for both).
    pub fn apply_node(&mut self, node: impl Into<Arc<Node>>) {
        let node = node.into();
        self.seen(Kind::Node, &namespaced(&*node));
        self.nodes.insert(node.name_any(), node);
    }
    /// A Node as the apiserver answered a write made from `read`: taken only while the index
    /// still holds `read`, as [`Self::apply_written_nodeclaim`] (a Node whose deletion the
    /// watch delivered meanwhile would otherwise come back, and no later event removes it).
    pub fn apply_written_node(&mut self, read: &Node, mut written: Node) {
        let Some(held) = self.nodes.get(&written.name_any()) else {
            return;
        };
        if held.metadata.resource_version != read.metadata.resource_version
            || held.metadata.resource_version == written.metadata.resource_version
        {
            return;
        }
        super::trim(&mut written);
        // Not counted as listed: during a re-list only the list says what still exists.
        self.nodes.insert(written.name_any(), Arc::new(written));
    }
    pub fn delete_node(&mut self, name: &str) {
        self.nodes.remove(name);
        self.pod_events.forget(name);
    }
    /// Takes an owned object or the shared store's `Arc` (one copy for both).
    pub fn apply_nodeclaim(&mut self, claim: impl Into<Arc<NodeClaim>>) {
        let claim = claim.into();
        self.seen(Kind::NodeClaim, &namespaced(&*claim));
        self.count_provider_id(&claim);
        self.nodeclaims.insert(claim.name_any(), claim);
    }
    /// Counts `next` in [`Self::provider_ids_assigned`] when it brings the providerID the held
    /// version lacked.
    fn count_provider_id(&mut self, next: &NodeClaim) {
        let held_without = self
            .nodeclaims
            .get(&next.name_any())
            .is_some_and(|held| nodeclaim_provider_id(held).is_none());
        if held_without && nodeclaim_provider_id(next).is_some() && self.manages_claim(next) {
            self.provider_ids_assigned += 1;
        }
    }
    /// A NodeClaim provisioning just created, so the next round counts its capacity before the
    /// watch brings it. Only while the index holds no NodeClaim of that name: on a busy machine
    /// the watch delivered the creation and the launch's first writes before the creating task
    /// ran again, and putting the created version back over them left the NodeClaim's passes
    /// waiting for a version that had already come (a Node unregistered for 60 s at 1 000 nodes,
    /// and provisioning paused meanwhile).
    pub fn apply_created_nodeclaim(&mut self, created: NodeClaim) {
        // Not counted as listed: a list begun before the create does not hold it, and the
        // watch brings it after the list.
        self.nodeclaims
            .entry(created.name_any())
            .or_insert_with(|| Arc::new(created));
    }
    /// A NodeClaim as the apiserver answered a write made from `read`, so the next pass does
    /// not decide from the version it just replaced. The answer is taken only while the index
    /// still holds `read`: once the watch delivered the written version (or a later one, or the
    /// deletion) the index keeps what it has. Taking it anyway kept a second copy of every
    /// written NodeClaim beside the store's (~6 MB at 1 000 nodes, with managed fields), could
    /// put back an older version over a newer one, and could bring back a deleted NodeClaim
    /// no later event would remove.
    pub fn apply_written_nodeclaim(&mut self, read: &NodeClaim, mut written: NodeClaim) {
        let name = written.name_any();
        let Some(held) = self.nodeclaims.get(&name) else {
            return;
        };
        if held.metadata.resource_version != read.metadata.resource_version
            || held.metadata.resource_version == written.metadata.resource_version
        {
            return;
        }
        super::trim(&mut written);
        self.count_provider_id(&written);
        // Not counted as listed: during a re-list only the list says what still exists (one
        // deleted while the watch was down and written just before would otherwise stay).
        self.nodeclaims.insert(name, Arc::new(written));
    }
    pub fn delete_nodeclaim(&mut self, name: &str) {
        self.nodeclaims.remove(name);
    }
    /// Takes an owned object or the shared store's `Arc` (one copy for both).
    pub fn apply_nodepool(&mut self, pool: impl Into<Arc<NodePool>>) {
        let pool = pool.into();
        self.seen(Kind::NodePool, &namespaced(&*pool));
        self.nodepools.insert(pool.name_any(), pool);
    }
    pub fn delete_nodepool(&mut self, name: &str) {
        self.nodepools.remove(name);
    }
    /// Takes a held pod, or a full one (tests, `simulate`) to compact first.
    pub fn apply_pod(&mut self, pod: impl Into<Pod>) {
        let pod: Pod = pod.into();
        let key = namespaced(&pod);
        self.seen(Kind::Pod, &key);
        self.record_pod_event(&key, Some(&pod));
        self.unbind(&key);
        if let Some(node) = pod_node(&pod) {
            self.pods_by_node
                .entry(node.to_string())
                .or_default()
                .insert(key.clone());
        }
        self.pods.insert(key, Arc::new(pod));
    }
    pub fn delete_pod(&mut self, namespace: &str, name: &str) {
        let key = (namespace.to_string(), name.to_string());
        self.record_pod_event(&key, None);
        self.unbind(&key);
        self.pods.remove(&key);
    }
    pub fn apply_daemonset(&mut self, ds: DaemonSet) {
        let key = namespaced(&ds);
        self.seen(Kind::DaemonSet, &key);
        self.daemonsets.insert(key, Arc::new(ds));
    }
    pub fn delete_daemonset(&mut self, namespace: &str, name: &str) {
        self.daemonsets
            .remove(&(namespace.to_string(), name.to_string()));
    }
    pub fn apply_pdb(&mut self, pdb: PodDisruptionBudget) {
        let key = namespaced(&pdb);
        self.seen(Kind::PodDisruptionBudget, &key);
        self.pdbs.insert(key, Arc::new(pdb));
    }
    pub fn delete_pdb(&mut self, namespace: &str, name: &str) {
        self.pdbs.remove(&(namespace.to_string(), name.to_string()));
    }
    pub fn apply_pvc(&mut self, pvc: PersistentVolumeClaim) {
        let key = namespaced(&pvc);
        self.seen(Kind::PersistentVolumeClaim, &key);
        self.pvcs.insert(key, Arc::new(pvc));
    }
    pub fn delete_pvc(&mut self, namespace: &str, name: &str) {
        self.pvcs.remove(&(namespace.to_string(), name.to_string()));
    }
    pub fn apply_pv(&mut self, pv: PersistentVolume) {
        self.seen(Kind::PersistentVolume, &namespaced(&pv));
        self.pvs.insert(pv.name_any(), Arc::new(pv));
    }
    pub fn delete_pv(&mut self, name: &str) {
        self.pvs.remove(name);
    }
    pub fn apply_storage_class(&mut self, class: StorageClass) {
        self.seen(Kind::StorageClass, &namespaced(&class));
        self.storage_classes
            .insert(class.name_any(), Arc::new(class));
    }
    pub fn delete_storage_class(&mut self, name: &str) {
        self.storage_classes.remove(name);
    }
    pub fn apply_volume_attachment(&mut self, attachment: VolumeAttachment) {
        self.seen(Kind::VolumeAttachment, &namespaced(&attachment));
        self.volume_attachments
            .insert(attachment.name_any(), Arc::new(attachment));
    }
    pub fn delete_volume_attachment(&mut self, name: &str) {
        self.volume_attachments.remove(name);
    }
    pub fn apply_overlay(&mut self, overlay: NodeOverlay) {
        self.seen(Kind::NodeOverlay, &namespaced(&overlay));
        self.overlays.insert(overlay.name_any(), Arc::new(overlay));
    }
    pub fn delete_overlay(&mut self, name: &str) {
        self.overlays.remove(name);
    }

    /// The NodeClass kinds (group, kind) this process serves. NodePools, NodeClaims and Nodes
    /// of other kinds belong to another Karpenter in the same cluster: they count as capacity,
    /// but nothing of ours writes to them, deletes them or waits for them.
    pub fn set_managed_kinds(&mut self, kinds: Vec<(String, String)>) {
        self.managed = Some(kinds);
    }

    fn manages(&self, group: &str, kind: &str) -> bool {
        self.managed
            .as_ref()
            .is_none_or(|m| m.iter().any(|(g, k)| g == group && k == kind))
    }

    /// Whether the NodeClaim's NodeClass is of a kind this process serves (upstream's
    /// `nodeclaimutils.IsManaged`).
    pub fn manages_claim(&self, claim: &NodeClaim) -> bool {
        let class = &claim.spec.node_class_ref;
        self.manages(&class.group, &class.kind)
    }

    /// Whether the NodePool's NodeClass is of a kind this process serves.
    pub fn manages_pool(&self, pool: &NodePool) -> bool {
        let class = &pool.spec.template.spec.node_class_ref;
        self.manages(&class.group, &class.kind)
    }

    /// Whether the Node is one of ours: its NodeClaim is, or (without a NodeClaim) it carries
    /// the `<group>/<kind>` label of a served NodeClass kind (upstream's `nodeutils.IsManaged`).
    pub fn manages_node(&self, node: &Node) -> bool {
        let Some(managed) = &self.managed else {
            return true;
        };
        if let Some(claim) = node_provider_id(node).and_then(|id| self.nodeclaim_by_provider_id(id))
        {
            return self.manages_claim(&claim);
        }
        let labels = node.labels();
        managed
            .iter()
            .any(|(group, kind)| labels.contains_key(&format!("{group}/{}", kind.to_lowercase())))
    }

    /// Makes an optional kind (one outside [`Kind::ALL`]) a condition of [`Self::synced`].
    pub fn require(&mut self, kind: Kind) {
        self.required.insert(kind);
    }

    /// Times pod events by the index's clock (operator: the system clock; tests: their own).
    pub fn set_clock(&mut self, clock: Arc<dyn crate::clock::Clock>) {
        self.pod_events.set_clock(clock);
    }

    /// Marks the nodes the pod at `key` comes to or leaves as it becomes `next` (`None`:
    /// deleted). The first pod list is what was there already, not an event.
    fn record_pod_event(&mut self, key: &NamespacedName, next: Option<&Pod>) {
        if !self.listed.contains(&Kind::Pod) {
            return;
        }
        let before = self.pods.get(key).and_then(|p| counted_on(p));
        let after = next.and_then(counted_on);
        self.pod_events.moved(before, after);
    }

    /// When a pod last came to or left `node` as this process saw it (bound, or stopped
    /// counting: terminating, finished or gone; DaemonSet pods never count). `None` when
    /// nothing changed since the first pod list.
    pub fn last_pod_event(&self, node: &str) -> Option<chrono::DateTime<chrono::Utc>> {
        self.pod_events.last(node)
    }

    fn unbind(&mut self, key: &NamespacedName) {
        if let Some(old) = self.pods.get(key)
            && let Some(node) = pod_node(old)
            && let Some(set) = self.pods_by_node.get_mut(node)
        {
            set.remove(key);
            if set.is_empty() {
                self.pods_by_node.remove(node);
            }
        }
    }

    fn seen(&mut self, kind: Kind, key: &NamespacedName) {
        if let Some(names) = self.relisting.get_mut(&kind) {
            names.insert(key_string(kind, key));
        }
    }

    /// A watch (re)started listing `kind`: objects not seen before [`Self::finish_list`] are gone.
    /// The watch of `kind` failed: changes may have been missed until the next complete list.
    pub fn mark_stale(&mut self, kind: Kind) {
        self.stale.insert(kind);
    }

    /// Kinds whose watch failed since their last complete list.
    pub fn stale_kinds(&self) -> impl Iterator<Item = Kind> + '_ {
        self.stale.iter().copied()
    }

    pub fn begin_list(&mut self, kind: Kind) {
        self.relisting.insert(kind, BTreeSet::new());
    }

    /// The list of `kind` is complete: drop what it did not contain and mark the kind listed.
    pub fn finish_list(&mut self, kind: Kind) {
        let seen = self.relisting.remove(&kind).unwrap_or_default();
        match kind {
            Kind::Node => {
                self.nodes.retain(|name, _| seen.contains(name));
                self.pod_events.retain(|name| seen.contains(name));
            }
            Kind::NodeClaim => self.nodeclaims.retain(|name, _| seen.contains(name)),
            Kind::NodePool => self.nodepools.retain(|name, _| seen.contains(name)),
            Kind::Pod => {
                let gone: Vec<NamespacedName> = self
                    .pods
                    .keys()
                    .filter(|k| !seen.contains(&key_string(kind, k)))
                    .cloned()
                    .collect();
                for key in gone {
                    self.delete_pod(&key.0, &key.1);
                }
            }
            Kind::DaemonSet => self
                .daemonsets
                .retain(|k, _| seen.contains(&key_string(kind, k))),
            Kind::PodDisruptionBudget => {
                self.pdbs.retain(|k, _| seen.contains(&key_string(kind, k)))
            }
            Kind::PersistentVolumeClaim => {
                self.pvcs.retain(|k, _| seen.contains(&key_string(kind, k)))
            }
            Kind::PersistentVolume => self.pvs.retain(|name, _| seen.contains(name)),
            Kind::StorageClass => self.storage_classes.retain(|name, _| seen.contains(name)),
            Kind::VolumeAttachment => self
                .volume_attachments
                .retain(|name, _| seen.contains(name)),
            Kind::NodeOverlay => self.overlays.retain(|name, _| seen.contains(name)),
        }
        self.listed.insert(kind);
        self.stale.remove(&kind);
    }

    // ---- queries ---------------------------------------------------------------------------

    /// Upstream `Synced()`: every kind listed once, and no NodeClaim waiting for its provider ID
    /// (an in-flight launch could otherwise be double-counted or missed by provisioning).
    /// A kind whose watch failed is unsynced until its next complete list.
    /// The same three tests as [`Self::unsynced_because`], so the logged cause cannot drift
    /// from it.
    pub fn synced(&self) -> bool {
        // Asked on every provisioning wake-up while a round waits: no allocation.
        self.every_kind_current() && self.launching() == 0
    }

    /// Every kind listed and no watch failed since: [`Self::synced`] but for launches.
    fn every_kind_current(&self) -> bool {
        self.unlisted().next().is_none() && self.stale.is_empty()
    }

    fn unlisted(&self) -> impl Iterator<Item = &Kind> {
        Kind::ALL
            .iter()
            .chain(&self.required)
            .filter(|k| !self.listed.contains(k))
    }

    /// Our NodeClaims without a providerID yet (another provider's launches are its own:
    /// waiting for them would stall every controller here while it launches).
    fn launching(&self) -> usize {
        self.nodeclaims
            .values()
            .filter(|c| nodeclaim_provider_id(c).is_none() && self.manages_claim(c))
            .count()
    }

    /// `Some` when the only reason [`Self::synced`] is false is our NodeClaims waiting for their
    /// providerID: every kind listed, no watch failed.
    pub fn only_launching(&self) -> Option<Launching> {
        let waiting = self.launching();
        (waiting > 0 && self.every_kind_current()).then_some(Launching {
            waiting,
            provider_ids_assigned: self.provider_ids_assigned,
        })
    }

    /// Why [`Self::synced`] is false, one clause per cause (empty when synced): which kinds
    /// were never listed or lost their watch, and how many NodeClaims wait for their
    /// providerID (a large launch queued behind the cloud API's rate limit is the usual one).
    pub fn unsynced_because(&self) -> Vec<String> {
        let mut why = Vec::new();
        let unlisted: Vec<String> = self.unlisted().map(|k| format!("{k:?}")).collect();
        if !unlisted.is_empty() {
            why.push(format!("not listed yet: {}", unlisted.join(", ")));
        }
        if !self.stale.is_empty() {
            let stale: Vec<String> = self.stale.iter().map(|k| format!("{k:?}")).collect();
            why.push(format!(
                "watch failed, waiting for a new list: {}",
                stale.join(", ")
            ));
        }
        let launching = self.launching();
        if launching > 0 {
            why.push(format!("{launching} NodeClaim(s) without a providerID yet"));
        }
        why
    }

    /// Whether the initial list of `kind` finished (its absence of objects means something).
    pub fn listed(&self, kind: Kind) -> bool {
        self.listed.contains(&kind)
    }

    /// Whether what the index holds of `kind` is complete: listed, and its watch has not failed
    /// since. Only then does the absence of an object (a pod on a node, a Node of a NodeClaim)
    /// prove it does not exist.
    pub fn current(&self, kind: Kind) -> bool {
        self.listed.contains(&kind) && !self.stale.contains(&kind)
    }

    /// Every one of `kinds` is [`Self::current`]. For work that reads only those kinds and must
    /// not wait for [`Self::synced`]'s "no launch in flight": garbage collection and token
    /// cleanup matter most while launches keep failing, which is when a NodeClaim is always
    /// waiting for its provider ID.
    pub fn current_all(&self, kinds: &[Kind]) -> bool {
        kinds.iter().all(|&kind| self.current(kind))
    }

    pub fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.nodes.get(name).cloned()
    }
    pub fn nodes(&self) -> Vec<Arc<Node>> {
        self.nodes.values().cloned().collect()
    }
    pub fn nodeclaim(&self, name: &str) -> Option<Arc<NodeClaim>> {
        self.nodeclaims.get(name).cloned()
    }
    pub fn nodeclaims(&self) -> Vec<Arc<NodeClaim>> {
        self.nodeclaims.values().cloned().collect()
    }
    pub fn nodepool(&self, name: &str) -> Option<Arc<NodePool>> {
        self.nodepools.get(name).cloned()
    }
    /// NodeOverlays, by name (empty unless the NodeOverlay gate watches them).
    pub fn overlays(&self) -> Vec<Arc<NodeOverlay>> {
        self.overlays.values().cloned().collect()
    }
    pub fn nodepools(&self) -> Vec<Arc<NodePool>> {
        self.nodepools.values().cloned().collect()
    }
    /// NodePools, without copying the list.
    pub fn nodepools_iter(&self) -> impl Iterator<Item = &NodePool> + Clone {
        self.nodepools.values().map(|p| p.as_ref())
    }
    pub fn pods(&self) -> Vec<Arc<Pod>> {
        self.pods.values().cloned().collect()
    }
    /// Every pod, without copying the list (for scans that keep little of it).
    pub fn pods_iter(&self) -> impl Iterator<Item = &Arc<Pod>> {
        self.pods.values()
    }
    /// One pod by `(namespace, name)`, without copying it.
    pub fn pod_by_key(&self, key: &NamespacedName) -> Option<&Arc<Pod>> {
        self.pods.get(key)
    }
    /// Pods bound to a node (any phase), without copying the list.
    pub fn pods_on_node_iter(&self, node: &str) -> impl Iterator<Item = &Arc<Pod>> {
        self.pods_by_node
            .get(node)
            .into_iter()
            .flatten()
            .filter_map(|key| self.pods.get(key))
    }
    pub fn daemonsets(&self) -> Vec<Arc<DaemonSet>> {
        self.daemonsets.values().cloned().collect()
    }
    pub fn pdbs(&self) -> Vec<Arc<PodDisruptionBudget>> {
        self.pdbs.values().cloned().collect()
    }
    /// PodDisruptionBudgets of one namespace.
    pub fn pdbs_in(&self, namespace: &str) -> Vec<Arc<PodDisruptionBudget>> {
        self.pdbs
            .range((namespace.to_string(), String::new())..)
            .take_while(|((ns, _), _)| ns == namespace)
            .map(|(_, v)| v.clone())
            .collect()
    }

    pub fn pvc(&self, namespace: &str, name: &str) -> Option<Arc<PersistentVolumeClaim>> {
        self.pvcs
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }
    pub fn pv(&self, name: &str) -> Option<Arc<PersistentVolume>> {
        self.pvs.get(name).cloned()
    }
    pub fn storage_class(&self, name: &str) -> Option<Arc<StorageClass>> {
        self.storage_classes.get(name).cloned()
    }
    pub fn storage_classes(&self) -> Vec<Arc<StorageClass>> {
        self.storage_classes.values().cloned().collect()
    }

    /// VolumeAttachments naming `node` (`spec.nodeName`). A node has few; a scan of every
    /// attachment in memory is cheap next to the API list it replaces.
    pub fn volume_attachments_on(&self, node: &str) -> Vec<Arc<VolumeAttachment>> {
        self.volume_attachments
            .values()
            .filter(|va| va.spec.node_name == node)
            .cloned()
            .collect()
    }

    /// Pods bound to a node (any phase).
    pub fn pods_on_node(&self, node: &str) -> Vec<Arc<Pod>> {
        self.pods_on_node_iter(node).cloned().collect()
    }

    /// Nodes reporting this provider ID (more than one is a registration conflict).
    pub fn nodes_by_provider_id(&self, provider_id: &str) -> Vec<Arc<Node>> {
        self.nodes
            .values()
            .filter(|n| node_provider_id(n) == Some(provider_id))
            .cloned()
            .collect()
    }

    pub fn nodeclaim_by_provider_id(&self, provider_id: &str) -> Option<Arc<NodeClaim>> {
        self.nodeclaims
            .values()
            .find(|c| nodeclaim_provider_id(c) == Some(provider_id))
            .cloned()
    }

    /// NodeClaims not yet registered and not being deleted: capacity on its way.
    pub fn in_flight_nodeclaims(&self) -> Vec<Arc<NodeClaim>> {
        use crate::apis::labels::conditions::REGISTERED;
        self.nodeclaims
            .values()
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .filter(|c| !c.condition_is_true(REGISTERED))
            .cloned()
            .collect()
    }

    /// NodeClaims of a NodePool (label `karpenter.sh/nodepool`).
    pub fn nodeclaims_of_nodepool(&self, nodepool: &str) -> Vec<Arc<NodeClaim>> {
        self.nodeclaims
            .values()
            .filter(|c| c.labels().get(NODEPOOL_LABEL).map(String::as_str) == Some(nodepool))
            .cloned()
            .collect()
    }

    /// NodeClaims referencing the NodeClass of `kind` named `name`.
    pub fn nodeclaims_of_nodeclass(&self, kind: &str, name: &str) -> Vec<Arc<NodeClaim>> {
        self.nodeclaims
            .values()
            .filter(|c| c.spec.node_class_ref.name == name && c.spec.node_class_ref.kind == kind)
            .cloned()
            .collect()
    }

    /// Capacity and count of a NodePool's NodeClaims not marked for deletion. A node's own
    /// capacity wins per resource once it reports a non-zero value (upstream's fallback rule).
    pub fn nodepool_usage(&self, nodepool: &str) -> NodePoolUsage {
        // One pass over the Nodes (the first by name per provider ID, as `nodes_by_provider_id`
        // would give) and one over the NodeClaims' IDs, instead of a scan per NodeClaim and per
        // Node: this runs for every NodePool on every provisioning round and disruption loop.
        let mut node_by_provider_id: BTreeMap<&str, &Node> = BTreeMap::new();
        for node in self.nodes.values() {
            if let Some(pid) = node_provider_id(node) {
                node_by_provider_id.entry(pid).or_insert(node);
            }
        }
        let claimed: BTreeSet<&str> = self
            .nodeclaims
            .values()
            .filter_map(|c| nodeclaim_provider_id(c))
            .collect();
        let mut total = BTreeMap::new();
        let mut nodes = 0;
        for claim in self.nodeclaims_of_nodepool(nodepool) {
            if claim.metadata.deletion_timestamp.is_some() {
                continue;
            }
            nodes += 1;
            let mut capacity = claim
                .status
                .as_ref()
                .map(|s| s.capacity.clone())
                .unwrap_or_default();
            let node_capacity = nodeclaim_provider_id(&claim)
                .and_then(|pid| node_by_provider_id.get(pid))
                .and_then(|n| n.status.as_ref()?.capacity.clone())
                .unwrap_or_default();
            for (name, q) in node_capacity {
                if quantity::parse_milli(&q.0).is_some_and(|m| m > 0) {
                    capacity.insert(name, q);
                }
            }
            quantity::add_into(&mut total, &capacity);
        }
        // A Node labelled with the NodePool but without a NodeClaim (its claim gone, or a node
        // described by manifests in `simulate`) still holds capacity, as upstream counts it.
        for node in self.nodes.values() {
            if node.labels().get(NODEPOOL_LABEL).map(String::as_str) != Some(nodepool)
                || node.metadata.deletion_timestamp.is_some()
                || node_provider_id(node).is_some_and(|pid| claimed.contains(pid))
            {
                continue;
            }
            nodes += 1;
            let capacity = node
                .status
                .as_ref()
                .and_then(|s| s.capacity.clone())
                .unwrap_or_default();
            quantity::add_into(&mut total, &capacity);
        }
        NodePoolUsage {
            resources: quantity::to_resource_list(&total),
            nodes,
        }
    }

    /// Capacity type label of a NodeClaim (for metric labels).
    pub fn capacity_type(claim: &NodeClaim) -> String {
        claim
            .labels()
            .get(CAPACITY_TYPE_LABEL)
            .cloned()
            .unwrap_or_default()
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::testing::*;

    #[test]
    fn provider_ids_are_counted_when_a_held_nodeclaim_gets_one() {
        let mut index = ClusterIndex::default();
        list_every_kind(&mut index);
        let assigned =
            |index: &ClusterIndex| index.only_launching().map(|l| l.provider_ids_assigned);
        index.apply_nodeclaim(nodeclaim("a", "p", None));
        index.apply_nodeclaim(nodeclaim("b", "p", None));
        assert_eq!(
            index.only_launching(),
            Some(Launching {
                waiting: 2,
                provider_ids_assigned: 0
            })
        );
        index.apply_nodeclaim(nodeclaim("a", "p", Some("exoscale://a")));
        assert_eq!(assigned(&index), Some(1));
        // A later version of a launched NodeClaim, or one first seen launched, is no launch.
        index.apply_nodeclaim(nodeclaim("a", "p", Some("exoscale://a")));
        index.apply_nodeclaim(nodeclaim("c", "p", Some("exoscale://c")));
        assert_eq!(assigned(&index), Some(1));
        // A NodeClaim deleted before its launch ended is none either.
        index.apply_nodeclaim(nodeclaim("d", "p", None));
        index.delete_nodeclaim("d");
        assert_eq!(assigned(&index), Some(1), "b still waits");
        index.apply_nodeclaim(nodeclaim("b", "p", Some("exoscale://b")));
        assert_eq!(index.only_launching(), None, "synced");
        assert_eq!(index.provider_ids_assigned, 2);
    }

    #[test]
    fn a_written_nodeclaim_is_taken_only_over_the_version_it_was_written_from() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
        let version = |rv: &str| {
            let mut claim = nodeclaim("c", "p", Some("exoscale://c"));
            claim.metadata.resource_version = Some(rv.into());
            claim
        };
        let answered = |rv: &str| {
            let mut claim = version(rv);
            claim.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default()]);
            claim
        };
        let held_rv = |index: &ClusterIndex| index.nodeclaim("c").unwrap().resource_version();

        // The watch has not delivered the write yet: the answer replaces what was read.
        let mut index = ClusterIndex::default();
        index.apply_nodeclaim(version("1"));
        index.apply_written_nodeclaim(&version("1"), answered("2"));
        assert_eq!(held_rv(&index).as_deref(), Some("2"));
        let held = index.nodeclaim("c").unwrap();
        assert!(held.metadata.managed_fields.is_none(), "kept as trimmed");

        // The watch delivered it first: the store's copy stays, the answer is dropped.
        let mut index = ClusterIndex::default();
        let stored = Arc::new(version("2"));
        index.apply_nodeclaim(stored.clone());
        index.apply_written_nodeclaim(&version("1"), answered("2"));
        assert!(Arc::ptr_eq(&index.nodeclaim("c").unwrap(), &stored));

        // A later version already arrived: the answer would put an older one back.
        let mut index = ClusterIndex::default();
        index.apply_nodeclaim(version("3"));
        index.apply_written_nodeclaim(&version("1"), answered("2"));
        assert_eq!(held_rv(&index).as_deref(), Some("3"));

        // The NodeClaim was deleted meanwhile: the answer does not bring it back.
        let mut index = ClusterIndex::default();
        index.apply_nodeclaim(version("1"));
        index.delete_nodeclaim("c");
        index.apply_written_nodeclaim(&version("1"), answered("2"));
        assert!(index.nodeclaim("c").is_none());
    }

    #[test]
    fn a_written_node_does_not_come_back_after_its_deletion() {
        let version = |rv: &str| {
            let mut n = node("n", Some("exoscale://n"), &[]);
            n.metadata.resource_version = Some(rv.into());
            n
        };
        let mut index = ClusterIndex::default();
        index.apply_node(version("1"));
        index.apply_written_node(&version("1"), version("2"));
        assert_eq!(
            index.node("n").unwrap().resource_version().as_deref(),
            Some("2")
        );
        // Deleted (the watch's event) before the taint write's answer was taken.
        index.delete_node("n");
        index.apply_written_node(&version("2"), version("3"));
        assert!(index.node("n").is_none(), "a ghost Node");
        // A later version already arrived: kept.
        index.apply_node(version("5"));
        index.apply_written_node(&version("4"), version("6"));
        assert_eq!(
            index.node("n").unwrap().resource_version().as_deref(),
            Some("5")
        );
    }

    #[test]
    fn a_write_answer_taken_during_a_relist_does_not_keep_what_the_list_lacks() {
        let version = |rv: &str| {
            let mut claim = nodeclaim("c", "p", Some("exoscale://c"));
            claim.metadata.resource_version = Some(rv.into());
            claim
        };
        let mut index = ClusterIndex::default();
        index.apply_nodeclaim(version("1"));
        // The watch failed; the NodeClaim was deleted meanwhile, after a status write whose
        // answer comes while the re-list runs.
        index.begin_list(Kind::NodeClaim);
        index.apply_written_nodeclaim(&version("1"), version("2"));
        index.finish_list(Kind::NodeClaim);
        assert!(
            index.nodeclaim("c").is_none(),
            "kept though the list lacks it"
        );
    }

    #[test]
    fn a_created_nodeclaim_does_not_replace_what_the_watch_brought_first() {
        let version = |rv: &str| {
            let mut claim = nodeclaim("c", "p", None);
            claim.metadata.resource_version = Some(rv.into());
            claim
        };
        let mut index = ClusterIndex::default();
        index.apply_created_nodeclaim(version("1"));
        assert_eq!(
            index.nodeclaim("c").unwrap().resource_version().as_deref(),
            Some("1"),
            "not watched yet: the created version counts"
        );
        let mut index = ClusterIndex::default();
        index.apply_nodeclaim(version("3"));
        index.apply_created_nodeclaim(version("1"));
        assert_eq!(
            index.nodeclaim("c").unwrap().resource_version().as_deref(),
            Some("3"),
            "the launch's write, already watched, stays"
        );
    }

    #[test]
    fn pod_events_are_timed_as_the_watch_delivers_them() {
        use crate::clock::FixedClock;
        let clock = FixedClock::at(1_000);
        let mut index = ClusterIndex::default();
        index.set_clock(Arc::new(clock.clone()));
        let at = |s: i64| chrono::DateTime::from_timestamp(s, 0);
        // What the first list finds was there already.
        index.begin_list(Kind::Pod);
        index.apply_pod(pod("default", "a", Some("n1")));
        index.apply_pod(pod("default", "b", Some("n1")));
        index.finish_list(Kind::Pod);
        assert_eq!(index.last_pod_event("n1"), None);

        // An arrival is an event on its node.
        clock.set(1_010);
        index.apply_pod(pod("default", "c", Some("n2")));
        assert_eq!(index.last_pod_event("n2"), at(1_010));
        assert_eq!(index.last_pod_event("n1"), None);
        // A status change that leaves the pod where it counts is not.
        clock.set(1_020);
        let mut running = pod("default", "c", Some("n2"));
        running.status.get_or_insert_with(Default::default).phase = Some("Running".into());
        index.apply_pod(running);
        assert_eq!(index.last_pod_event("n2"), at(1_010));

        // The start of termination is the event; the removal seconds later is not.
        clock.set(1_030);
        let mut terminating = pod("default", "a", Some("n1"));
        terminating.metadata.deletion_timestamp = Some(ts(1_030));
        index.apply_pod(terminating);
        assert_eq!(index.last_pod_event("n1"), at(1_030));
        clock.set(1_040);
        index.delete_pod("default", "a");
        assert_eq!(index.last_pod_event("n1"), at(1_030));
        // A pod deleted outright (or found gone by a re-list) is one.
        clock.set(1_050);
        index.begin_list(Kind::Pod);
        index.apply_pod(pod("default", "c", Some("n2")));
        index.finish_list(Kind::Pod);
        assert_eq!(index.last_pod_event("n1"), at(1_050), "b was not re-listed");
        assert_eq!(
            index.last_pod_event("n2"),
            at(1_010),
            "c was not re-listed as an event"
        );

        // Finishing counts; DaemonSet pods never do.
        clock.set(1_060);
        let mut done = pod("default", "c", Some("n2"));
        done.status.get_or_insert_with(Default::default).phase = Some("Succeeded".into());
        index.apply_pod(done);
        assert_eq!(index.last_pod_event("n2"), at(1_060));
        clock.set(1_070);
        index.apply_pod(owned_by_daemonset(pod("kube-system", "ds", Some("n2"))));
        index.delete_pod("kube-system", "ds");
        assert_eq!(index.last_pod_event("n2"), at(1_060));

        // A node that goes takes its mark with it.
        index.apply_node(node("n2", None, &[]));
        index.delete_node("n2");
        assert_eq!(index.last_pod_event("n2"), None);
    }

    #[test]
    fn pods_are_indexed_by_node_and_rebound() {
        let mut index = ClusterIndex::default();
        index.apply_pod(pod("default", "a", Some("n1")));
        index.apply_pod(pod("default", "b", Some("n1")));
        index.apply_pod(pod("default", "c", None));
        assert_eq!(index.pods_on_node("n1").len(), 2);
        index.apply_pod(pod("default", "a", Some("n2")));
        assert_eq!(index.pods_on_node("n1").len(), 1);
        assert_eq!(index.pods_on_node("n2").len(), 1);
        index.delete_pod("default", "b");
        assert!(index.pods_on_node("n1").is_empty());
        assert_eq!(index.pods().len(), 2);
    }

    #[test]
    fn synced_needs_every_list_and_every_provider_id() {
        let mut index = ClusterIndex::default();
        for kind in Kind::ALL {
            index.begin_list(kind);
        }
        index.apply_nodeclaim(nodeclaim("c1", "default", None));
        for kind in Kind::ALL
            .iter()
            .filter(|k| **k != Kind::PodDisruptionBudget)
        {
            index.finish_list(*kind);
        }
        assert!(!index.synced(), "PDB list not finished");
        assert_eq!(
            index.unsynced_because(),
            [
                "not listed yet: PodDisruptionBudget",
                "1 NodeClaim(s) without a providerID yet"
            ]
        );
        index.finish_list(Kind::PodDisruptionBudget);
        assert!(!index.synced(), "c1 has no provider ID yet");
        assert_eq!(
            index.unsynced_because(),
            ["1 NodeClaim(s) without a providerID yet"]
        );
        index.mark_stale(Kind::Pod);
        index.apply_nodeclaim(nodeclaim("c1", "default", Some("exoscale://1")));
        assert!(!index.synced(), "the pod watch failed");
        assert_eq!(
            index.unsynced_because(),
            ["watch failed, waiting for a new list: Pod"]
        );
        index.begin_list(Kind::Pod);
        index.finish_list(Kind::Pod);
        assert!(index.synced());
        assert!(index.unsynced_because().is_empty());
        // An empty providerID names no instance: the claim is still launching.
        index.apply_nodeclaim(nodeclaim("c2", "default", Some("")));
        assert!(!index.synced(), "c2's providerID is empty");
    }

    /// Another Karpenter's launch in flight is not ours to wait for; its nodes are told apart
    /// by their NodeClaim, or without one by the NodeClass label.
    #[test]
    fn another_providers_objects_are_not_ours() {
        let mut index = ClusterIndex::default();
        index.set_managed_kinds(crate::state::testing::served_kinds());
        list_every_kind(&mut index);
        let theirs = crate::state::testing::foreign(nodeclaim("k1", "kwok", None));
        index.apply_nodeclaim(theirs.clone());
        assert!(index.synced(), "{:?}", index.unsynced_because());
        index.apply_nodeclaim(nodeclaim("c1", "default", None));
        assert_eq!(
            index.unsynced_because(),
            ["1 NodeClaim(s) without a providerID yet"]
        );

        let mut with_claim = theirs;
        with_claim
            .status
            .get_or_insert_with(Default::default)
            .provider_id = Some("kwok://1".into());
        index.apply_nodeclaim(with_claim);
        index.apply_nodeclaim(nodeclaim("c1", "default", Some("exoscale://1")));
        assert!(index.manages_node(&node("ours", Some("exoscale://1"), &[])));
        assert!(!index.manages_node(&node("theirs", Some("kwok://1"), &[])));
        let mut labelled = node("labelled", Some("exoscale://9"), &[]);
        labelled.metadata.labels = Some(
            [(
                "karpenter.test.sh/testnodeclass".to_string(),
                "x".to_string(),
            )]
            .into(),
        );
        assert!(
            index.manages_node(&labelled),
            "our NodeClass label, no claim"
        );
        assert!(!index.manages_node(&node("bare", Some("kwok://2"), &[])));
    }

    #[test]
    fn a_required_optional_kind_holds_sync_until_listed_and_its_relist_drops_the_gone() {
        let overlay = |name: &str| -> NodeOverlay {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "karpenter.sh/v1alpha1", "kind": "NodeOverlay",
                "metadata": {"name": name}, "spec": {"requirements": [], "price": "1"}
            }))
            .unwrap()
        };
        let mut index = ClusterIndex::default();
        list_every_kind(&mut index);
        assert!(index.synced(), "overlays are not watched: not needed");
        index.require(Kind::NodeOverlay);
        assert!(!index.synced(), "overlays watched but not listed yet");
        index.begin_list(Kind::NodeOverlay);
        index.apply_overlay(overlay("a"));
        index.apply_overlay(overlay("b"));
        index.finish_list(Kind::NodeOverlay);
        assert!(index.synced());
        index.begin_list(Kind::NodeOverlay);
        index.apply_overlay(overlay("b"));
        index.finish_list(Kind::NodeOverlay);
        let names: Vec<String> = index.overlays().iter().map(|o| o.name_any()).collect();
        assert_eq!(names, vec!["b"]);
        index.mark_stale(Kind::NodeOverlay);
        assert!(
            !index.synced(),
            "a failed overlay watch unsyncs like any other"
        );
    }

    #[test]
    fn a_failed_watch_unsyncs_until_its_kind_is_listed_again() {
        let mut index = ClusterIndex::default();
        list_every_kind(&mut index);
        assert!(index.synced());
        index.mark_stale(Kind::Pod);
        assert!(!index.synced());
        assert_eq!(index.stale_kinds().collect::<Vec<_>>(), vec![Kind::Pod]);
        // Another kind's list does not cure it; a list of pods does.
        index.begin_list(Kind::Node);
        index.finish_list(Kind::Node);
        assert!(!index.synced());
        index.begin_list(Kind::Pod);
        assert!(!index.synced(), "a list in progress is not complete");
        index.finish_list(Kind::Pod);
        assert!(index.synced());
    }

    #[test]
    fn relist_drops_objects_that_vanished_while_disconnected() {
        let mut index = ClusterIndex::default();
        index.apply_node(node("n1", Some("exoscale://1"), &[]));
        index.apply_node(node("n2", Some("exoscale://2"), &[]));
        index.apply_pod(pod("ns", "p", Some("n2")));
        index.begin_list(Kind::Node);
        index.begin_list(Kind::Pod);
        index.apply_node(node("n1", Some("exoscale://1"), &[]));
        index.finish_list(Kind::Node);
        index.finish_list(Kind::Pod);
        assert!(index.node("n2").is_none());
        assert!(index.node("n1").is_some());
        assert!(index.pods_on_node("n2").is_empty());
    }

    #[test]
    fn nodepool_usage_sums_capacity_and_skips_deleting_claims() {
        let mut index = ClusterIndex::default();
        index.apply_nodeclaim(with_capacity(
            nodeclaim("c1", "pool", Some("exoscale://1")),
            &[("cpu", "2"), ("memory", "4Gi")],
        ));
        index.apply_nodeclaim(with_capacity(
            nodeclaim("c2", "pool", Some("exoscale://2")),
            &[("cpu", "4"), ("memory", "8Gi")],
        ));
        let mut deleting = with_capacity(
            nodeclaim("c3", "pool", Some("exoscale://3")),
            &[("cpu", "8")],
        );
        deleting.metadata.deletion_timestamp = Some(ts(0));
        index.apply_nodeclaim(deleting);
        index.apply_nodeclaim(with_capacity(
            nodeclaim("other", "other", Some("exoscale://4")),
            &[("cpu", "16")],
        ));
        // The registered node of c1 reports its real capacity, which wins.
        index.apply_node(with_node_capacity(
            node("n1", Some("exoscale://1"), &[]),
            &[("cpu", "2"), ("memory", "3Gi")],
        ));
        let usage = index.nodepool_usage("pool");
        assert_eq!(usage.nodes, 2);
        assert_eq!(usage.resources["cpu"].0, "6");
        assert_eq!(
            usage.resources["memory"].0,
            (11u64 * 1024 * 1024 * 1024).to_string()
        );
    }

    #[test]
    fn nodepool_usage_counts_labelled_nodes_without_a_nodeclaim_once() {
        let mut index = ClusterIndex::default();
        index.apply_nodeclaim(with_capacity(
            nodeclaim("c1", "pool", Some("exoscale://1")),
            &[("cpu", "2")],
        ));
        let labelled = |name: &str, pid: Option<&str>, cpu: &str| {
            let mut n = with_node_capacity(node(name, pid, &[]), &[("cpu", cpu)]);
            n.metadata.labels = Some([(NODEPOOL_LABEL.to_string(), "pool".to_string())].into());
            n
        };
        // c1's own node: counted through its NodeClaim, not a second time.
        index.apply_node(labelled("n1", Some("exoscale://1"), "2"));
        // No NodeClaim (deleted, or a node from `simulate`'s manifests): counted.
        index.apply_node(labelled("orphan", Some("exoscale://9"), "4"));
        index.apply_node(labelled("no-provider-id", None, "1"));
        let mut deleting = labelled("going", Some("exoscale://8"), "16");
        deleting.metadata.deletion_timestamp = Some(ts(0));
        index.apply_node(deleting);
        let usage = index.nodepool_usage("pool");
        assert_eq!(usage.nodes, 3);
        assert_eq!(usage.resources["cpu"].0, "7");
    }

    #[test]
    fn in_flight_claims_are_unregistered_and_not_deleting() {
        let mut index = ClusterIndex::default();
        index.apply_nodeclaim(nodeclaim("launching", "p", None));
        index.apply_nodeclaim(registered(nodeclaim("done", "p", Some("exoscale://1"))));
        let names: Vec<String> = index
            .in_flight_nodeclaims()
            .iter()
            .map(|c| c.name_any())
            .collect();
        assert_eq!(names, vec!["launching"]);
        assert_eq!(
            index
                .nodeclaim_by_provider_id("exoscale://1")
                .unwrap()
                .name_any(),
            "done"
        );
    }

    #[test]
    fn volume_attachments_are_found_by_node_and_dropped_on_delete_or_relist() {
        let mut index = ClusterIndex::default();
        index.apply_volume_attachment(volume_attachment("va-1", "n1", Some("pv-1")));
        index.apply_volume_attachment(volume_attachment("va-2", "n1", Some("pv-2")));
        index.apply_volume_attachment(volume_attachment("va-3", "n2", Some("pv-3")));
        let names = |index: &ClusterIndex, node: &str| -> Vec<String> {
            index
                .volume_attachments_on(node)
                .iter()
                .map(|va| va.name_any())
                .collect()
        };
        assert_eq!(names(&index, "n1"), vec!["va-1", "va-2"]);
        assert_eq!(names(&index, "n2"), vec!["va-3"]);
        assert!(names(&index, "n3").is_empty());
        index.delete_volume_attachment("va-1");
        assert_eq!(names(&index, "n1"), vec!["va-2"]);
        // Moved to another node (a re-apply under the same name replaces it).
        index.apply_volume_attachment(volume_attachment("va-2", "n2", Some("pv-2")));
        assert!(names(&index, "n1").is_empty());
        assert_eq!(names(&index, "n2"), vec!["va-2", "va-3"]);

        assert!(!index.listed(Kind::VolumeAttachment));
        index.begin_list(Kind::VolumeAttachment);
        index.apply_volume_attachment(volume_attachment("va-3", "n2", Some("pv-3")));
        index.finish_list(Kind::VolumeAttachment);
        assert!(index.listed(Kind::VolumeAttachment));
        assert_eq!(
            names(&index, "n2"),
            vec!["va-3"],
            "va-2 vanished while disconnected"
        );
    }

    #[test]
    fn pdbs_are_listed_per_namespace() {
        let mut index = ClusterIndex::default();
        index.apply_pdb(pdb("a", "x"));
        index.apply_pdb(pdb("b", "y"));
        index.apply_pdb(pdb("b", "z"));
        assert_eq!(index.pdbs_in("b").len(), 2);
        assert_eq!(index.pdbs_in("a").len(), 1);
        assert!(index.pdbs_in("c").is_empty());
    }
}
