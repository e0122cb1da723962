//! Controllers: each a thin shell that reads cluster state, calls pure decision code and
//! writes the result back. Reconcilers have the kube-rs shape
//! `async fn reconcile(obj: Arc<K>, ctx: Arc<Context>) -> Result<Action>` and never sleep:
//! waiting is a requeue.

pub mod bootstrap_token;
pub mod disruption;
pub mod field_patch;
pub mod garbage_collection;
pub mod lost_creates;
pub mod metrics;
pub mod node;
pub mod nodeclaim;
pub mod nodeoverlay;
pub mod nodepool;
pub mod periodic;
pub mod repair;
pub mod static_capacity;
pub mod superseded;

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use serde::Serialize;
use serde::de::DeserializeOwned;
use thiserror::Error;

use crate::clock::Clock;
use crate::operator::config::{FeatureGates, Timings};
use crate::operator::events::{EventSink, Recorded, Severity};
use crate::operator::leader::Leadership;
use crate::operator::metrics::{Metrics, labels};
use crate::state::Cluster;

/// A controller started beside the built-in ones, on the leader, with the same [`Context`]
/// (provisioning and disruption plug in here), in a task of its own.
pub struct ExtraController {
    /// Names its task when it stops the replica (a panic).
    pub name: &'static str,
    pub start: Box<dyn FnOnce(Arc<Context>, Shutdown) -> BoxFuture<'static, ()> + Send>,
}

/// Field manager of every write this process makes.
pub const FIELD_MANAGER: &str = "karpenter-exoscale";

/// Reconciles the NodeClaim lifecycle and Node termination controllers run at once, whatever
/// `CPU_REQUESTS` says: their passes mostly wait (on the Exoscale rate limit, on drains), and a
/// Node that registers must not queue behind hundreds of launches.
pub const LIFECYCLE_CONCURRENCY: u16 = 1000;

/// Reconcile failures, countable by kind.
#[derive(Debug, Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("cloud provider: {0}")]
    Cloud(#[from] crate::cloudprovider::CloudProviderError),
    #[error("cannot encode a patch: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("{0}")]
    Invalid(String),
}

impl Error {
    /// A 409 from the API server: the object changed since it was read.
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::Kube(kube::Error::Api(status)) if status.code == 409)
    }

    /// A stable label for `karpenter_exoscale_reconcile_errors_total{error}`.
    pub fn metric_label(&self) -> String {
        match self {
            Error::Kube(kube::Error::Api(status)) => format!("kube_{}", status.code),
            Error::Kube(_) => "kube".into(),
            Error::Cloud(e) => format!("cloud_{}", e.kind()),
            Error::Encode(_) => "encode".into(),
            Error::Invalid(_) => "invalid".into(),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything a reconciler needs. Built once by `operator::run`; tests build it with fakes.
pub struct Context {
    pub client: kube::Client,
    pub cluster: Arc<Cluster>,
    pub cloud: Arc<dyn crate::cloudprovider::CloudProvider>,
    pub events: Arc<dyn EventSink>,
    pub metrics: Arc<Metrics>,
    pub clock: Arc<dyn Clock>,
    pub timings: Timings,
    pub feature_gates: FeatureGates,
    pub leadership: Leadership,
    pub registration_health: nodepool::status::RegistrationHealth,
    /// NodeClaims already counted as unpriceable (`karpenter_nodepools_cost_tracker_errors_total`).
    pub cost: nodepool::cost::CostTracker,
    /// Stores and change streams of the cluster watch: Controllers open no watch of their own.
    pub shared: crate::state::SharedKinds,
    /// Reconciles each Controller runs at once (`CPU_REQUESTS`, see
    /// `operator::config::reconcile_concurrency`).
    pub reconcile_concurrency: u16,
    /// Launch results of the last minute, for passes over a NodeClaim copy older than them.
    pub recent_launches: nodeclaim::launch::RecentLaunches,
    /// Nodes that launch passes in flight wait for, woken by the Node watch.
    pub node_arrivals: nodeclaim::arrivals::NodeArrivals,
    /// Paces NodePool status writes that only change counts.
    pub nodepool_status_writes: nodepool::reconcile::StatusWrites,
    /// NodeClaim versions our own writes replaced, until the watch delivers a newer one.
    pub superseded: superseded::SupersededVersions,
    /// NodeClaim creates whose answer never came: creators wait for cluster state to hold them.
    pub lost_creates: lost_creates::LostCreates,
}

impl Context {
    pub fn now(&self) -> Timestamp {
        Timestamp::from_second(self.clock.now_unix()).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    /// Publishes an event about `obj`.
    pub async fn event<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        severity: Severity,
        reason: &str,
        message: impl Into<String>,
    ) {
        self.events
            .publish(Recorded {
                object: obj.object_ref(&()),
                severity,
                reason: reason.into(),
                message: message.into(),
            })
            .await;
    }
}

impl Context {
    /// A warning about the cluster's identity (instances we may not touch), regarding the
    /// `kube-system` Namespace whose UID is that identity.
    pub async fn identity_event(&self, reason: &str, message: String) {
        let object = k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Namespace".into()),
            name: Some("kube-system".into()),
            ..Default::default()
        };
        self.events
            .publish(Recorded {
                object,
                severity: Severity::Warning,
                reason: reason.into(),
                message,
            })
            .await;
    }
}

/// The error policy shared by all controllers: count, log, back off.
pub fn error_policy<K: Resource<DynamicType = ()>>(
    controller: &'static str,
) -> impl Fn(Arc<K>, &Error, Arc<Context>) -> Action {
    move |obj, error, ctx| {
        let label = error.metric_label();
        ctx.metrics
            .reconcile_errors
            .get_or_create(&labels([("controller", controller), ("error", &label)]))
            .inc();
        let name = obj.meta().name.clone().unwrap_or_default();
        if error.is_conflict() {
            // Optimistic locking at work (another writer, e.g. the kubelet, updated the object
            // first): expected, and retried at once with a fresh read.
            tracing::debug!(controller, %name, %error, "reconcile conflicted; retrying");
            return Action::requeue(Duration::from_secs(1));
        }
        tracing::warn!(controller, %name, %error, "reconcile failed");
        Action::requeue(Duration::from_secs(5))
    }
}

/// The one way status is written: a merge patch of `status`, computed from `from`, that the
/// API server applies only while the object is still at `from`'s resourceVersion. A status
/// computed from a stale copy is refused with 409 and recomputed from a fresh read (the error
/// policy requeues conflicts at once) instead of reverting a condition another controller set
/// in between (Drifted, Consolidatable, DisruptionReason, Drained...).
pub async fn patch_status<K, S>(api: &Api<K>, from: &K, status: &S) -> Result<K>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
    S: Serialize,
{
    let meta = from.meta();
    let name = meta.name.as_deref().unwrap_or_default();
    let Some(resource_version) = meta.resource_version.as_deref() else {
        return Err(Error::Invalid(format!(
            "refusing an unconditional status write of {name}: the object it was computed from has no resourceVersion"
        )));
    };
    let patch = serde_json::json!({
        "metadata": { "resourceVersion": resource_version },
        "status": status,
    });
    Ok(api
        .patch_status(
            name,
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Merge(&patch),
        )
        .await?)
}

/// [`patch_status`] for NodeClaims, which several controllers write (the NodeClaim lifecycle,
/// Node termination, disruption). A copy that one of our own writes replaced is refused here
/// with the 409 the API server would answer, without the request, and the caller's conflict
/// handling applies; a write that succeeds records the version it replaced
/// ([`superseded::SupersededVersions`]).
pub async fn patch_nodeclaim_status<S: Serialize>(
    ctx: &Context,
    from: &crate::apis::NodeClaim,
    status: &S,
) -> Result<crate::apis::NodeClaim> {
    let now = std::time::Instant::now();
    if let Some(conflict) = superseded_copy_conflict(&ctx.superseded, from, now) {
        return Err(conflict);
    }
    let api: Api<crate::apis::NodeClaim> = Api::all(ctx.client.clone());
    let written = patch_status(&api, from, status).await?;
    ctx.superseded.record_written(&from.metadata, &written, now);
    Ok(written)
}

/// The 409 the API server would answer a write from `from`, when one of our own writes
/// replaced that copy; None when it may be current.
fn superseded_copy_conflict(
    superseded: &superseded::SupersededVersions,
    from: &crate::apis::NodeClaim,
    now: std::time::Instant,
) -> Option<Error> {
    if !superseded.is_stale_copy(&from.metadata, now) {
        return None;
    }
    let read = from
        .metadata
        .resource_version
        .as_deref()
        .unwrap_or_default();
    let name = from.metadata.name.as_deref().unwrap_or_default();
    Some(Error::Kube(kube::Error::Api(
        kube::core::Status::failure(
            &format!("NodeClaim {name} at resourceVersion {read} was replaced by our own write"),
            "Conflict",
        )
        .with_code(409)
        .boxed(),
    )))
}

/// Merge-patches metadata/spec (labels, annotations, finalizers, taints...). `resource_version`
/// makes it conditional so a concurrent writer is never overwritten.
pub async fn patch_object<K>(
    api: &Api<K>,
    name: &str,
    mut patch: serde_json::Value,
    resource_version: Option<&str>,
) -> Result<K>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    if let Some(rv) = resource_version {
        patch["metadata"]["resourceVersion"] = serde_json::json!(rv);
    }
    Ok(api
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?)
}

/// The finalizer list with `finalizer` added (None when already present).
pub fn with_finalizer(finalizers: &[String], finalizer: &str) -> Option<Vec<String>> {
    if finalizers.iter().any(|f| f == finalizer) {
        return None;
    }
    let mut out = finalizers.to_vec();
    out.push(finalizer.into());
    Some(out)
}

/// The finalizer list with `finalizer` removed (None when absent).
pub fn without_finalizer(finalizers: &[String], finalizer: &str) -> Option<Vec<String>> {
    if !finalizers.iter().any(|f| f == finalizer) {
        return None;
    }
    Some(
        finalizers
            .iter()
            .filter(|f| *f != finalizer)
            .cloned()
            .collect(),
    )
}

/// Adds `finalizer` to `object` when missing, with a merge patch guarded by the resourceVersion
/// it was read at (a finalizer list changed meanwhile is refused with 409, never overwritten).
/// Returns the object as stored (unchanged, without a call, when the finalizer was present).
pub async fn add_finalizer<K>(api: &Api<K>, object: &K, finalizer: &str) -> Result<K>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let meta = object.meta();
    let finalizers = meta.finalizers.as_deref().unwrap_or_default();
    let Some(finalizers) = with_finalizer(finalizers, finalizer) else {
        return Ok(object.clone());
    };
    patch_object(
        api,
        meta.name.as_deref().unwrap_or_default(),
        serde_json::json!({"metadata": {"finalizers": finalizers}}),
        meta.resource_version.as_deref(),
    )
    .await
}

/// Removes `finalizer` from `object` when present, guarded like [`add_finalizer`]; an object
/// that is already gone is fine.
pub async fn remove_finalizer<K>(api: &Api<K>, object: &K, finalizer: &str) -> Result<()>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let meta = object.meta();
    let finalizers = meta.finalizers.as_deref().unwrap_or_default();
    let Some(finalizers) = without_finalizer(finalizers, finalizer) else {
        return Ok(());
    };
    absent_ok(
        patch_object(
            api,
            meta.name.as_deref().unwrap_or_default(),
            serde_json::json!({"metadata": {"finalizers": finalizers}}),
            meta.resource_version.as_deref(),
        )
        .await,
    )?;
    Ok(())
}

/// Treats 404 as success (the object is already gone).
pub fn ignore_not_found<T>(result: std::result::Result<T, kube::Error>) -> Result<Option<T>> {
    match result {
        Ok(v) => Ok(Some(v)),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Treats a 404 from one of our helpers as "already gone".
pub fn absent_ok<T>(result: Result<T>) -> Result<Option<T>> {
    match result {
        Ok(v) => Ok(Some(v)),
        Err(Error::Kube(kube::Error::Api(status))) if status.code == 404 => Ok(None),
        Err(e) => Err(e),
    }
}

/// A future that resolves when shutdown is requested.
pub type Shutdown = futures::future::Shared<futures::future::BoxFuture<'static, ()>>;

/// Builds a [`Shutdown`] from a watch channel that turns `true` on shutdown.
pub fn shutdown_signal(mut rx: tokio::sync::watch::Receiver<bool>) -> Shutdown {
    use futures::FutureExt;
    async move {
        let _ = rx.wait_for(|stop| *stop).await;
    }
    .boxed()
    .shared()
}

/// NodeClasses as they change, by reference (from the provider's watch).
pub type NodeClassChanges =
    futures::stream::BoxStream<'static, crate::apis::common::NodeClassReference>;

/// Spawns every controller of this module into `tasks`, each running until `shutdown`; call
/// only while leading. The provisioning controller (and disruption) run beside these with the
/// same [`Context`].
///
/// `nodeclass_changes` names each NodeClass as the provider's watch sees it change: the change
/// wakes the NodePools that use it (their `NodeClassReady`, hence whether provisioning may use
/// them), as upstream's NodePool readiness controller watches NodeClasses.
pub fn spawn(
    ctx: Arc<Context>,
    nodeclass_changes: Option<NodeClassChanges>,
    shutdown: Shutdown,
    tasks: &mut crate::operator::tasks::Tasks,
) {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::Node;
    use kube::runtime::Controller;
    use kube::runtime::reflector::ObjectRef;

    use crate::apis::{NodeClaim, NodePool};

    fn drain<T, E: std::fmt::Display>(
        name: &'static str,
    ) -> impl FnMut(std::result::Result<T, E>) -> std::future::Ready<()> {
        move |result| {
            if let Err(error) = result {
                tracing::debug!(controller = name, %error, "controller event");
            }
            std::future::ready(())
        }
    }

    let node_to_claim = {
        let ctx = ctx.clone();
        move |node: Arc<Node>| {
            let pid = crate::state::node_provider_id(&node)?;
            ctx.node_arrivals.announce(pid);
            let indexed = ctx.cluster.read().nodeclaim_by_provider_id(pid);
            let name = match indexed {
                Some(claim) => kube::ResourceExt::name_any(claim.as_ref()),
                None => ctx
                    .recent_launches
                    .claim_launched_as(pid, std::time::Instant::now())?,
            };
            tracing::debug!(
                target: "karpenter_exoscale::controllers::nodeclaim",
                node = %kube::ResourceExt::name_any(node.as_ref()),
                nodeclaim = %name,
                "a Node change wakes its NodeClaim"
            );
            Some(ObjectRef::new(&name))
        }
    };
    let shared = &ctx.shared;
    let concurrency =
        || kube::runtime::controller::Config::default().concurrency(ctx.reconcile_concurrency);
    // A launch holds its NodeClaim's slot while it waits on the Exoscale rate limit; with the
    // CPU-sized slots a burst of launches kept registrations (same controller) waiting
    // behind them. Upstream gives its lifecycle and termination controllers 1 000 slots too.
    let lifecycle_concurrency =
        || kube::runtime::controller::Config::default().concurrency(LIFECYCLE_CONCURRENCY);
    tasks.spawn(
        "nodeclaim",
        Controller::for_shared_stream(shared.nodeclaims.changes(), shared.nodeclaims.store())
            .with_config(lifecycle_concurrency())
            .watches_shared_stream(shared.nodes.changes(), node_to_claim)
            .graceful_shutdown_on(shutdown.clone())
            .run(
                nodeclaim::reconcile::reconcile,
                error_policy("nodeclaim"),
                ctx.clone(),
            )
            .for_each(drain("nodeclaim")),
    );

    let termination = Arc::new(node::termination::Termination::default());
    tasks.spawn(
        "node.termination",
        Controller::for_shared_stream(shared.nodes.changes(), shared.nodes.store())
            .with_config(lifecycle_concurrency())
            .graceful_shutdown_on(shutdown.clone())
            .run(
                move |node, ctx| node::termination::reconcile(node, ctx, termination.clone()),
                error_policy("node.termination"),
                ctx.clone(),
            )
            .for_each(drain("node.termination")),
    );

    let claim_to_pool = |claim: Arc<NodeClaim>| {
        kube::ResourceExt::labels(claim.as_ref())
            .get(crate::apis::labels::NODEPOOL_LABEL)
            .map(|pool| ObjectRef::<NodePool>::new(pool))
    };
    let mut nodepools =
        Controller::for_shared_stream(shared.nodepools.changes(), shared.nodepools.store())
            .with_config(concurrency())
            .watches_shared_stream(shared.nodeclaims.changes(), claim_to_pool);
    if let Some(changes) = nodeclass_changes {
        // Each changed NodeClass becomes the NodePools that use it, from the NodePool store.
        let pools = shared.nodepools.store();
        let users = changes.flat_map(move |class| {
            let using: Vec<Arc<NodePool>> = pools
                .state()
                .into_iter()
                .filter(|pool| pool.spec.template.spec.node_class_ref == class)
                .collect();
            futures::stream::iter(using)
        });
        nodepools = nodepools.watches_shared_stream(users, |pool: Arc<NodePool>| {
            Some(ObjectRef::from_obj(pool.as_ref()))
        });
    }
    tasks.spawn(
        "nodepool",
        nodepools
            .graceful_shutdown_on(shutdown.clone())
            .run(
                nodepool::reconcile::reconcile,
                error_policy("nodepool"),
                ctx.clone(),
            )
            .for_each(drain("nodepool")),
    );

    // Static NodePools: a second reconciler over the NodePool changes, woken by their NodeClaims.
    if ctx.feature_gates.static_capacity {
        tasks.spawn(
            "static.capacity",
            Controller::for_shared_stream(shared.nodepools.changes(), shared.nodepools.store())
                .with_config(concurrency())
                .watches_shared_stream(shared.nodeclaims.changes(), claim_to_pool)
                .graceful_shutdown_on(shutdown.clone())
                .run(
                    static_capacity::reconcile,
                    error_policy("static.capacity"),
                    ctx.clone(),
                )
                .for_each(drain("static.capacity")),
        );
    }

    // Repair is a second reconciler over the same Node changes (termination is the first).
    if ctx.feature_gates.node_repair {
        tasks.spawn(
            "node.repair",
            Controller::for_shared_stream(shared.nodes.changes(), shared.nodes.store())
                .with_config(concurrency())
                .graceful_shutdown_on(shutdown.clone())
                .run(repair::reconcile, error_policy("node.repair"), ctx.clone())
                .for_each(drain("node.repair")),
        );
    }

    let collector = Arc::new(garbage_collection::Collector::default());
    spawn_periodic(
        tasks,
        &ctx,
        &shutdown,
        "instance.garbagecollection",
        ctx.timings.instance_gc_interval,
        move |ctx| {
            let collector = collector.clone();
            async move { collector.collect(&ctx).await }
        },
    );
    spawn_periodic(
        tasks,
        &ctx,
        &shutdown,
        "bootstrap_token.cleanup",
        bootstrap_token::INTERVAL,
        |ctx| async move { bootstrap_token::cleanup_once(&ctx).await },
    );
    if ctx.feature_gates.node_overlay {
        spawn_periodic(
            tasks,
            &ctx,
            &shutdown,
            "nodeoverlay.status",
            nodeoverlay::INTERVAL,
            |ctx| async move { nodeoverlay::update_once(&ctx).await },
        );
    }
}

/// A [`periodic::every`] pass as a task of its own, named as its controller; it does not watch
/// `shutdown` itself, so the task ends there.
fn spawn_periodic<T, F, Fut>(
    tasks: &mut crate::operator::tasks::Tasks,
    ctx: &Arc<Context>,
    shutdown: &Shutdown,
    controller: &'static str,
    interval: Duration,
    work: F,
) where
    T: Send + 'static,
    F: FnMut(Arc<Context>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<T>> + Send + 'static,
{
    let passes = periodic::every(ctx.clone(), controller, interval, work);
    let stop = shutdown.clone();
    tasks.spawn(controller, async move {
        tokio::select! {
            _ = passes => {}
            _ = stop => {}
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finalizer_lists() {
        let list = vec!["a".to_string()];
        assert_eq!(
            with_finalizer(&list, "b"),
            Some(vec!["a".into(), "b".into()])
        );
        assert_eq!(with_finalizer(&list, "a"), None);
        assert_eq!(without_finalizer(&list, "a"), Some(vec![]));
        assert_eq!(without_finalizer(&list, "b"), None);
    }

    #[test]
    fn a_superseded_nodeclaim_copy_is_refused_as_a_conflict_without_a_request() {
        let memo = superseded::SupersededVersions::default();
        let now = std::time::Instant::now();
        let mut copy = crate::state::testing::nodeclaim("c", "pool", None);
        copy.metadata.uid = Some("uid-c".into());
        copy.metadata.resource_version = Some("10".into());
        assert!(superseded_copy_conflict(&memo, &copy, now).is_none());
        memo.record("uid-c", "10", "11", now);
        let refused = superseded_copy_conflict(&memo, &copy, now).expect("stale copy");
        // Every caller's conflict handling (requeue, re-read) applies as to the API's own 409.
        assert!(refused.is_conflict());
        assert!(refused.to_string().contains("resourceVersion 10"));
        copy.metadata.resource_version = Some("11".into());
        assert!(superseded_copy_conflict(&memo, &copy, now).is_none());
    }

    #[test]
    fn conflicts_are_told_apart_from_other_api_errors() {
        let api = |code: u16| {
            Error::Kube(kube::Error::Api(
                kube::core::Status::failure("x", "y")
                    .with_code(code)
                    .boxed(),
            ))
        };
        assert!(api(409).is_conflict());
        assert!(!api(404).is_conflict());
        assert!(!Error::Invalid("x".into()).is_conflict());
    }
}
