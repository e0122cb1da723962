//! Cluster state: an in-memory view of Nodes, NodeClaims, NodePools, Pods, DaemonSets,
//! PodDisruptionBudgets and volumes (claims, volumes, storage classes, attachments) fed by
//! kube-rs watchers.
//! Controllers read it instead of listing from the API server; decisions are computed from it by
//! pure code.

pub mod held_pod;
mod index;
pub mod pod_events;
pub mod pod_times;
pub mod pods;
pub mod quantity;
#[cfg(test)]
pub mod testing;

use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttachment};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::{broadcast, watch};

pub use held_pod::HeldPod;
pub use index::{
    ClusterIndex, Kind, Launching, NamespacedName, NodePoolUsage, node_provider_id, node_ready,
    nodeclaim_provider_id,
};

use crate::apis::{NodeClaim, NodeOverlay, NodePool};

/// Shared, thread-safe cluster state. Every change bumps a revision that consumers can await.
pub struct Cluster {
    index: RwLock<ClusterIndex>,
    revision: watch::Sender<u64>,
    /// Provisioning's view of each pod's scheduling (for the pod metrics).
    pub pod_times: pod_times::PodTimeline,
    /// How many times [`Cluster::synced`] answered true: lets a sampler tell "unsynced at every
    /// sample" from "unsynced for the whole time", since overlapping launches leave the state
    /// unsynced at most instants yet synced whenever a round asks.
    synced_answers: AtomicU64,
}

impl Default for Cluster {
    fn default() -> Self {
        Cluster {
            index: RwLock::new(ClusterIndex::default()),
            revision: watch::channel(0).0,
            pod_times: Default::default(),
            synced_answers: AtomicU64::new(0),
        }
    }
}

impl Cluster {
    pub fn new() -> Arc<Self> {
        Arc::new(Cluster::default())
    }

    /// A cluster whose pod events are timed by `clock` (the operator's, or a test's).
    pub fn with_clock(clock: Arc<dyn crate::clock::Clock>) -> Arc<Self> {
        let cluster = Cluster::default();
        cluster.update(|index| index.set_clock(clock));
        Arc::new(cluster)
    }

    /// Read access to the index.
    pub fn read(&self) -> RwLockReadGuard<'_, ClusterIndex> {
        self.index.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies a change and notifies subscribers.
    pub fn update<T>(&self, change: impl FnOnce(&mut ClusterIndex) -> T) -> T {
        let out = {
            let mut guard: RwLockWriteGuard<'_, ClusterIndex> =
                self.index.write().unwrap_or_else(|p| p.into_inner());
            change(&mut guard)
        };
        self.revision.send_modify(|r| *r += 1);
        out
    }

    /// A receiver whose value changes on every update (provisioning triggers, tests).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.revision.subscribe()
    }

    pub fn synced(&self) -> bool {
        let synced = self.read().synced();
        if synced {
            self.synced_answers.fetch_add(1, Ordering::Relaxed);
        }
        synced
    }

    /// How many times [`Cluster::synced`] has answered true so far.
    pub fn synced_answers(&self) -> u64 {
        self.synced_answers.load(Ordering::Relaxed)
    }
}

/// A kind that can be watched and shared with Controllers.
pub trait Watched:
    Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static
{
}
impl<K> Watched for K where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static
{
}

/// How one kind is written into the index.
pub trait Indexed: Watched {
    const KIND: Kind;
    fn apply(self, index: &mut ClusterIndex);
    fn delete(&self, index: &mut ClusterIndex);
    /// Indexes the shared store's copy; kinds the store does not hold copy it.
    fn apply_shared(object: Arc<Self>, index: &mut ClusterIndex) {
        Self::apply((*object).clone(), index)
    }
}

/// Drops what no decision reads before an object is kept: managedFields (often half an
/// object), a Node's image list (up to 50 entries a node), system info, addresses and daemon
/// endpoints (about 1 KB a node), and most of a pod ([`pods::slim`]). As upstream's cache
/// strips managedFields.
pub(super) fn trim<K: Watched>(object: &mut K) {
    object.meta_mut().managed_fields = None;
    let any = object as &mut dyn std::any::Any;
    if let Some(node) = any.downcast_mut::<Node>()
        && let Some(status) = node.status.as_mut()
    {
        status.images = None;
        status.node_info = None;
        status.addresses = None;
        status.daemon_endpoints = None;
    } else if let Some(pod) = any.downcast_mut::<HeldPod>() {
        pods::slim(pod);
    }
}

macro_rules! indexed {
    ($ty:ty, $kind:expr, $apply:ident, shared $delete:ident) => {
        impl Indexed for $ty {
            const KIND: Kind = $kind;
            fn apply(self, index: &mut ClusterIndex) {
                index.$apply(self)
            }
            fn delete(&self, index: &mut ClusterIndex) {
                index.$delete(&self.name_any())
            }
            fn apply_shared(object: Arc<Self>, index: &mut ClusterIndex) {
                index.$apply(object)
            }
        }
    };
    ($ty:ty, $kind:expr, $apply:ident, cluster $delete:ident) => {
        impl Indexed for $ty {
            const KIND: Kind = $kind;
            fn apply(self, index: &mut ClusterIndex) {
                index.$apply(self)
            }
            fn delete(&self, index: &mut ClusterIndex) {
                index.$delete(&self.name_any())
            }
        }
    };
    ($ty:ty, $kind:expr, $apply:ident, namespaced $delete:ident) => {
        impl Indexed for $ty {
            const KIND: Kind = $kind;
            fn apply(self, index: &mut ClusterIndex) {
                index.$apply(self)
            }
            fn delete(&self, index: &mut ClusterIndex) {
                index.$delete(&self.namespace().unwrap_or_default(), &self.name_any())
            }
        }
    };
}

indexed!(Node, Kind::Node, apply_node, shared delete_node);
indexed!(NodeClaim, Kind::NodeClaim, apply_nodeclaim, shared delete_nodeclaim);
indexed!(NodePool, Kind::NodePool, apply_nodepool, shared delete_nodepool);
indexed!(HeldPod, Kind::Pod, apply_pod, namespaced delete_pod);
indexed!(DaemonSet, Kind::DaemonSet, apply_daemonset, namespaced delete_daemonset);
indexed!(PodDisruptionBudget, Kind::PodDisruptionBudget, apply_pdb, namespaced delete_pdb);
indexed!(PersistentVolumeClaim, Kind::PersistentVolumeClaim, apply_pvc, namespaced delete_pvc);
indexed!(PersistentVolume, Kind::PersistentVolume, apply_pv, cluster delete_pv);
indexed!(StorageClass, Kind::StorageClass, apply_storage_class, cluster delete_storage_class);
indexed!(VolumeAttachment, Kind::VolumeAttachment, apply_volume_attachment, cluster delete_volume_attachment);
indexed!(NodeOverlay, Kind::NodeOverlay, apply_overlay, cluster delete_overlay);

/// Applies one watcher event to the cluster.
fn apply_event<K: Indexed>(cluster: &Cluster, event: Event<K>) {
    cluster.update(|index| match event {
        Event::Init => index.begin_list(K::KIND),
        Event::InitApply(obj) | Event::Apply(obj) => obj.apply(index),
        Event::InitDone => index.finish_list(K::KIND),
        Event::Delete(obj) => obj.delete(index),
    })
}

/// Applies one watcher event to the shared store, then the cluster, then announces it to the
/// Controllers, the index keeping the store's copy of each object (at 1 000 nodes a second copy
/// of every Node and NodeClaim was ~15 MB). A listed object reaches the store only when the list
/// completes: the index holds its own copy until then and takes the store's at `InitDone`.
///
/// Announced last, so a Controller woken by a change reads an index that has it: a NodeClaim's
/// registration looks up its Node in the index, and a new Node finds its NodeClaim there. With
/// the announcement first, both lookups could run before either index update (the feed waiting
/// for the write lock behind a long read) and the Node waited for the next resync, 60 s.
fn apply_shared_event<K: Indexed>(cluster: &Cluster, shared: &mut SharedFeed<K>, event: Event<K>) {
    let announcements = index_shared_event(cluster, shared, event);
    shared.announce(announcements);
}

/// [`apply_shared_event`] without the announcement: what to announce once the index has it.
fn index_shared_event<K: Indexed>(
    cluster: &Cluster,
    shared: &mut SharedFeed<K>,
    event: Event<K>,
) -> Vec<Change<K>> {
    shared.writer.apply_watcher_event(&event);
    let store = shared.writer.as_reader();
    if let Event::InitDone = event {
        // One read of the listed state serves the index and the announcements.
        let listed = store.state();
        cluster.update(|index| {
            index.finish_list(K::KIND);
            for stored in &listed {
                K::apply_shared(stored.clone(), index);
            }
        });
        return listed_changes(&listed);
    }
    let announcements = shared.changes_of(&event);
    match event {
        Event::Apply(obj) => match store.get(&reflector::ObjectRef::from_obj(&obj)) {
            Some(stored) => cluster.update(|index| K::apply_shared(stored, index)),
            None => apply_event(cluster, Event::Apply(obj)),
        },
        other => apply_event(cluster, other),
    }
    announcements
}

/// The announcement of an object now in the store: its name, which subscribers look up.
fn applied<K: Watched>(obj: &K) -> Change<K> {
    Change::Applied(Box::new(reflector::ObjectRef::from_obj(obj)))
}

/// The announcements of a completed list: every object the store now holds.
fn listed_changes<K: Watched>(listed: &[Arc<K>]) -> Vec<Change<K>> {
    listed.iter().map(|obj| applied::<K>(obj)).collect()
}

/// Server-side watch timeout: a stream that goes silent (a black-holed connection) is given up
/// after this plus kube's 5-s idle margin, not five minutes, and its re-watch must open within
/// the client's watch-open timeout or the kind is marked unsynced. A healthy watch costs one
/// re-watch request per kind this often.
pub const WATCH_TIMEOUT_SECS: u32 = 30;

async fn feed_kind<K: Indexed>(
    api: Api<K>,
    cluster: Arc<Cluster>,
    mut shared: Option<SharedFeed<K>>,
) {
    watch_relisting(api, move |event| match event {
        Ok(event) => match shared.as_mut() {
            Some(shared) => apply_shared_event(&cluster, shared, event),
            None => apply_event(&cluster, event),
        },
        Err(error) => {
            // The view may have missed changes: no decision may rest on it until a fresh
            // list completes, which the restarted watch starts with.
            tracing::warn!(kind = ?K::KIND, %error, "cluster state watch failed; state is unsynced until re-listed");
            cluster.update(|index| index.mark_stale(K::KIND));
        }
    })
    .await
}

/// How many changed objects a slow Controller may fall behind by before it misses triggers
/// (its periodic requeue still reconciles every object).
const CHANGES_CAPACITY: usize = 4096;

/// One announced change. The ring's [`CHANGES_CAPACITY`] slots are allocated up front, and an
/// entry is kept until every subscriber has read it: one that is behind (or not yet polling)
/// holds up to the whole ring. So an applied object is announced by its name, read from the
/// store when received (a copy per entry was tens of megabytes at 1 000 Nodes). A name the
/// store no longer has was deleted since, and that deletion is announced later with the object.
#[derive(Clone)]
enum Change<K: Watched> {
    /// Boxed: the ring's slots are allocated up front, and a name inline made each ~130 bytes
    /// (~2 MB for the kinds shared).
    Applied(Box<reflector::ObjectRef<K>>),
    Deleted(Arc<K>),
}

/// The writing side of [`Shared`]: keeps the store and announces changes, from the same watch
/// events that feed the cluster index.
pub struct SharedFeed<K: Watched> {
    writer: Writer<K>,
    changes: broadcast::Sender<Change<K>>,
}

impl<K: Watched> SharedFeed<K> {
    /// Applies one watch event to the store and announces what changed.
    pub fn publish(&mut self, event: &Event<K>) {
        self.writer.apply_watcher_event(event);
        let changes = self.changes_of(event);
        self.announce(changes);
    }

    /// What an event applied to the store announces.
    fn changes_of(&self, event: &Event<K>) -> Vec<Change<K>> {
        match event {
            Event::Apply(obj) => vec![applied(obj)],
            Event::Delete(obj) => vec![Change::Deleted(Arc::new(obj.clone()))],
            // Listed objects reach the store only when the list completes: announce them then.
            Event::InitDone => listed_changes(&self.writer.as_reader().state()),
            Event::Init | Event::InitApply(_) => Vec::new(),
        }
    }

    fn announce(&self, changes: Vec<Change<K>>) {
        for change in changes {
            // No receiver is not an error: Controllers only run on the leader.
            let _ = self.changes.send(change);
        }
    }
}

/// One kind as the cluster watch sees it, for kube-rs Controllers: a reflector store and the
/// stream of changed objects, so a Controller needs no watch of its own.
pub struct Shared<K: Watched> {
    store: Store<K>,
    changes: broadcast::Sender<Change<K>>,
}

impl<K: Watched> Clone for Shared<K> {
    fn clone(&self) -> Self {
        Shared {
            store: self.store.clone(),
            changes: self.changes.clone(),
        }
    }
}

impl<K: Watched> Shared<K> {
    /// A store and its change stream, and the feed that writes both.
    pub fn new() -> (Self, SharedFeed<K>) {
        let (store, writer) = reflector::store();
        let changes = broadcast::channel(CHANGES_CAPACITY).0;
        (
            Shared {
                store,
                changes: changes.clone(),
            },
            SharedFeed { writer, changes },
        )
    }

    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// Every object in the store, then each object as it changes (applied or deleted): a
    /// Controller started after the list (on gaining leadership) still sees every object. The
    /// store's own copies are handed out: a copy per subscriber of each changed object (three
    /// for a Node) was megabytes in flight at 1 000 nodes.
    pub fn changes(&self) -> impl futures::Stream<Item = Arc<K>> + Send + 'static {
        self.marked_changes().map(|change| match change {
            Changed::Applied(obj) | Changed::Deleted(obj) => obj,
        })
    }

    /// [`Self::changes`], saying which objects were deleted (the status-condition metrics
    /// forget those).
    pub fn marked_changes(&self) -> impl futures::Stream<Item = Changed<K>> + Send + 'static {
        // Subscribed before the snapshot: a change in between is seen twice, never missed.
        let live = self.changes.subscribe();
        let snapshot = self.store.state();
        let store = self.store.clone();
        let live = futures::stream::unfold((live, store), |(mut rx, store)| async move {
            loop {
                match rx.recv().await {
                    Ok(Change::Applied(name)) => {
                        if let Some(obj) = store.get(&name) {
                            return Some((Changed::Applied(obj), (rx, store)));
                        }
                    }
                    Ok(Change::Deleted(obj)) => return Some((Changed::Deleted(obj), (rx, store))),
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        tracing::warn!(kind = %K::kind(&()), missed, "a controller fell behind the cluster watch; its resync catches up");
                    }
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        });
        futures::stream::iter(snapshot.into_iter().map(Changed::Applied)).chain(live)
    }
}

/// One object as [`Shared::marked_changes`] hands it out: as the store now holds it, or as
/// it was when deleted.
pub enum Changed<K> {
    Applied(Arc<K>),
    Deleted(Arc<K>),
}

impl<K> Changed<K> {
    /// The object, applied or deleted.
    pub fn object(&self) -> &Arc<K> {
        match self {
            Changed::Applied(object) | Changed::Deleted(object) => object,
        }
    }
}

/// The kinds kube-rs Controllers reconcile or watch, shared with the cluster index.
#[derive(Clone)]
pub struct SharedKinds {
    pub nodes: Shared<Node>,
    pub nodeclaims: Shared<NodeClaim>,
    pub nodepools: Shared<NodePool>,
}

/// The running watches: their tasks and what they share with Controllers.
pub struct Feeds {
    pub tasks: Vec<tokio::task::JoinHandle<()>>,
    pub shared: SharedKinds,
}

/// Watches `api` until aborted, handing each event, its object [`trim`]med, to `on_event`.
/// After any error the watch starts over from a fresh list (kube's watcher alone would retry
/// only the watch, and a consumer that turned unsynced on the error would never see the
/// `InitDone` that makes it current again), after a pause that a completed list resets.
pub async fn watch_relisting<K: Watched>(
    api: Api<K>,
    mut on_event: impl FnMut(Result<Event<K>, watcher::Error>),
) {
    let mut backoff = Backoff::default();
    loop {
        let stream = watcher::watcher(
            api.clone(),
            watcher::Config::default().timeout(WATCH_TIMEOUT_SECS),
        )
        .modify(trim::<K>);
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            let failed = event.is_err();
            if matches!(event, Ok(Event::InitDone)) {
                backoff.listed(tokio::time::Instant::now());
            }
            on_event(event);
            if failed {
                break;
            }
        }
        let pause = backoff.failed(tokio::time::Instant::now());
        tokio::time::sleep(pause).await;
    }
}

/// Exponential pause between watch restarts: 1 s doubling to 30 s. Reset only by a watch that
/// held for a full server-side timeout after its list: one refused right after every list (a
/// Role granting `list` but not `watch`, a proxy that buffers watches) would otherwise re-list
/// the whole kind every second.
#[derive(Default)]
struct Backoff {
    failures: u32,
    listed_at: Option<tokio::time::Instant>,
}

impl Backoff {
    /// The pause before the next restart, after a failure at `now`.
    fn failed(&mut self, now: tokio::time::Instant) -> std::time::Duration {
        let healthy = std::time::Duration::from_secs(WATCH_TIMEOUT_SECS.into());
        if self
            .listed_at
            .take()
            .is_some_and(|at| now.saturating_duration_since(at) >= healthy)
        {
            self.failures = 0;
        }
        let secs = (1u64 << self.failures.min(5)).min(30);
        self.failures = self.failures.saturating_add(1);
        std::time::Duration::from_secs(secs)
    }

    /// A list completed at `now`.
    fn listed(&mut self, now: tokio::time::Instant) {
        self.listed_at = Some(now);
    }
}

/// Starts the one watch of each kind, feeding `cluster` (NodeOverlays too when `overlays`,
/// which then must be listed before the state is synced) and, for Nodes, NodeClaims and
/// NodePools, the stores and change streams the Controllers use; the tasks run until aborted.
pub fn feed(client: kube::Client, cluster: Arc<Cluster>, overlays: bool) -> Feeds {
    fn spawn<K: Indexed>(
        api: Api<K>,
        cluster: &Arc<Cluster>,
        shared: Option<SharedFeed<K>>,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(feed_kind(api, cluster.clone(), shared))
    }
    let (nodes, nodes_feed) = Shared::<Node>::new();
    let (nodeclaims, nodeclaims_feed) = Shared::<NodeClaim>::new();
    let (nodepools, nodepools_feed) = Shared::<NodePool>::new();
    let (c, k) = (&client, &cluster);
    let mut tasks = vec![
        spawn(Api::<Node>::all(c.clone()), k, Some(nodes_feed)),
        spawn(Api::<NodeClaim>::all(c.clone()), k, Some(nodeclaims_feed)),
        spawn(Api::<NodePool>::all(c.clone()), k, Some(nodepools_feed)),
        spawn(Api::<HeldPod>::all(c.clone()), k, None),
        spawn(Api::<DaemonSet>::all(c.clone()), k, None),
        spawn(Api::<PodDisruptionBudget>::all(c.clone()), k, None),
        // Volumes: provisioning checks a pending pod's claims and follows their topology.
        spawn(Api::<PersistentVolumeClaim>::all(c.clone()), k, None),
        spawn(Api::<PersistentVolume>::all(c.clone()), k, None),
        spawn(Api::<StorageClass>::all(c.clone()), k, None),
        // Termination waits for a node's VolumeAttachments to go before deleting its instance.
        spawn(Api::<VolumeAttachment>::all(c.clone()), k, None),
    ];
    if overlays {
        cluster.update(|index| index.require(Kind::NodeOverlay));
        tasks.push(spawn(Api::<NodeOverlay>::all(c.clone()), k, None));
    }
    Feeds {
        tasks,
        shared: SharedKinds {
            nodes,
            nodeclaims,
            nodepools,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::testing::*;

    fn labelled(name: &str, version: &str) -> Node {
        let mut n = node(name, None, &[]);
        n.metadata.labels = Some([("v".to_string(), version.to_string())].into());
        n
    }

    fn version(n: &Node) -> String {
        n.labels().get("v").cloned().unwrap_or_default()
    }

    #[tokio::test]
    async fn the_change_stream_reads_the_store_and_carries_deletions_without_copies() {
        let (shared, mut feed) = Shared::<Node>::new();
        feed.publish(&Event::Init);
        feed.publish(&Event::InitApply(labelled("a", "1")));
        feed.publish(&Event::InitDone);
        let mut changes = Box::pin(shared.changes());
        // The listed object comes first, from the store.
        let first = changes.next().await.unwrap();
        assert_eq!(
            (first.name_any(), version(&first)),
            ("a".into(), "1".into())
        );
        // v2 is read while the store holds it.
        feed.publish(&Event::Apply(labelled("a", "2")));
        assert_eq!(version(&changes.next().await.unwrap()), "2");
        // v3 is replaced by v4 before anyone reads: both announcements read the store's v4.
        feed.publish(&Event::Apply(labelled("a", "3")));
        feed.publish(&Event::Apply(labelled("a", "4")));
        assert_eq!(version(&changes.next().await.unwrap()), "4");
        assert_eq!(version(&changes.next().await.unwrap()), "4");
        // An announcement read after the deletion finds nothing and is skipped; the deletion
        // is delivered with the object, which the store no longer has.
        feed.publish(&Event::Apply(labelled("a", "5")));
        feed.publish(&Event::Delete(labelled("a", "5")));
        assert_eq!(version(&changes.next().await.unwrap()), "5");
        assert!(shared.store().state().is_empty());
        use futures::FutureExt;
        assert!(
            changes.next().now_or_never().is_none(),
            "nothing else pending"
        );
    }

    #[test]
    fn a_watch_refused_after_every_list_backs_off_to_30_s_and_a_held_one_resets() {
        let t0 = tokio::time::Instant::now();
        let at = |secs| t0 + std::time::Duration::from_secs(secs);
        let mut backoff = Backoff::default();
        let mut pauses = Vec::new();
        let mut now = 0;
        for _ in 0..7 {
            // Each restart lists, and the watch is refused a second later.
            backoff.listed(at(now));
            let pause = backoff.failed(at(now + 1)).as_secs();
            pauses.push(pause);
            now += 1 + pause;
        }
        assert_eq!(pauses, [1, 2, 4, 8, 16, 30, 30]);
        // A watch that held for a full server-side timeout starts the pauses over.
        backoff.listed(at(now));
        let held = now + u64::from(WATCH_TIMEOUT_SECS);
        assert_eq!(backoff.failed(at(held)).as_secs(), 1);
        // A failure without a list in between keeps backing off.
        assert_eq!(backoff.failed(at(held + 1)).as_secs(), 2);
    }

    #[test]
    fn watched_objects_are_kept_without_managed_fields_or_unread_node_status() {
        use k8s_openapi::api::core::v1::{
            ContainerImage, NodeAddress, NodeDaemonEndpoints, NodeStatus, NodeSystemInfo,
        };
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
        let mut n = node("a", None, &[]);
        n.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default()]);
        n.status = Some(NodeStatus {
            images: Some(vec![ContainerImage::default()]),
            node_info: Some(NodeSystemInfo::default()),
            addresses: Some(vec![NodeAddress::default()]),
            daemon_endpoints: Some(NodeDaemonEndpoints::default()),
            conditions: Some(vec![Default::default()]),
            allocatable: Some(Default::default()),
            ..NodeStatus::default()
        });
        trim(&mut n);
        assert!(n.metadata.managed_fields.is_none());
        let status = n.status.unwrap();
        assert!(status.images.is_none() && status.node_info.is_none());
        assert!(status.addresses.is_none() && status.daemon_endpoints.is_none());
        // What decisions read stays.
        assert!(status.conditions.is_some() && status.allocatable.is_some());
        let mut p = HeldPod::default();
        p.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default()]);
        trim(&mut p);
        assert!(p.metadata.managed_fields.is_none());
    }

    #[tokio::test]
    async fn a_change_is_announced_only_once_the_index_has_it() {
        use futures::FutureExt;
        let cluster = Cluster::default();
        let (shared, mut feed) = Shared::<Node>::new();
        apply_shared_event(&cluster, &mut feed, Event::Init);
        apply_shared_event(&cluster, &mut feed, Event::InitDone);
        let mut changes = Box::pin(shared.changes());
        let announcements =
            index_shared_event(&cluster, &mut feed, Event::Apply(labelled("a", "1")));
        assert_eq!(version(&cluster.read().node("a").unwrap()), "1", "indexed");
        assert!(changes.next().now_or_never().is_none(), "not announced yet");
        feed.announce(announcements);
        let announced = changes.next().await.unwrap();
        assert_eq!(version(&announced), "1");
        // A deletion likewise: gone from the index before anyone hears of it.
        let announcements =
            index_shared_event(&cluster, &mut feed, Event::Delete(labelled("a", "1")));
        assert!(cluster.read().node("a").is_none());
        assert!(changes.next().now_or_never().is_none());
        feed.announce(announcements);
        assert_eq!(changes.next().await.unwrap().name_any(), "a");
    }

    #[test]
    fn the_index_keeps_the_shared_stores_copy_of_each_object() {
        let cluster = Cluster::default();
        let (shared, mut feed) = Shared::<Node>::new();
        let store = shared.store();
        let same = |name: &str| {
            let stored = store.get(&reflector::ObjectRef::new(name)).unwrap();
            let indexed = cluster.read().node(name).unwrap();
            Arc::ptr_eq(&stored, &indexed)
        };
        apply_shared_event(&cluster, &mut feed, Event::Init);
        apply_shared_event(&cluster, &mut feed, Event::InitApply(labelled("a", "1")));
        assert!(
            store.get(&reflector::ObjectRef::new("a")).is_none(),
            "listing"
        );
        assert_eq!(version(&cluster.read().node("a").unwrap()), "1");
        apply_shared_event(&cluster, &mut feed, Event::InitDone);
        assert!(same("a"), "taken from the store once the list completes");
        apply_shared_event(&cluster, &mut feed, Event::Apply(labelled("a", "2")));
        apply_shared_event(&cluster, &mut feed, Event::Apply(labelled("b", "1")));
        assert!(same("a") && same("b"));
        assert_eq!(version(&cluster.read().node("a").unwrap()), "2");
        apply_shared_event(&cluster, &mut feed, Event::Delete(labelled("a", "2")));
        assert!(cluster.read().node("a").is_none());
        assert!(cluster.read().listed(Kind::Node));
    }

    #[test]
    fn watcher_events_drive_the_index_and_bump_the_revision() {
        let cluster = Cluster::default();
        let rx = cluster.subscribe();
        apply_event(&cluster, Event::<Node>::Init);
        apply_event(
            &cluster,
            Event::InitApply(node("n1", Some("exoscale://1"), &[])),
        );
        apply_event(&cluster, Event::<Node>::InitDone);
        apply_event(
            &cluster,
            Event::Apply(node("n2", Some("exoscale://2"), &[])),
        );
        apply_event(
            &cluster,
            Event::Delete(node("n1", Some("exoscale://1"), &[])),
        );
        assert!(rx.has_changed().unwrap());
        assert_eq!(*rx.borrow(), 5);
        let names: Vec<String> = cluster
            .read()
            .nodes()
            .iter()
            .map(|n| n.name_any())
            .collect();
        assert_eq!(names, vec!["n2"]);
    }
}
