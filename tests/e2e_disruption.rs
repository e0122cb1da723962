//! Disruption scenarios on the real control plane with the simulated Exoscale cloud: the
//! provisioner launches nodes for Deployments, kube-scheduler binds the pods, and the
//! disruption controller removes empty nodes, consolidates (one node, or two into one cheaper
//! node), replaces drifted nodes within the budget, honours scheduled budgets and leaves protected
//! nodes alone. NodePools use short `consolidateAfter` values.

#[path = "e2e/harness.rs"]
mod harness;
mod support;

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use harness::{PREFIX, World, eventually, eventually_within, eventually_within_showing};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use karpenter_exoscale::apis::labels::{INSTANCE_TYPE_LABEL, NODEPOOL_LABEL};
use karpenter_exoscale::apis::{ConditionsExt, NodeClaim, NodeOverlay, NodePool};
use karpenter_exoscale::cloudprovider::exoscale::ExoscaleSettings;
use karpenter_exoscale::controllers::disruption;
use karpenter_exoscale::exoscale::{Clock, SystemClock};
use karpenter_exoscale::fence::Fence;
use karpenter_exoscale::operator::config::{Config, RunArgs};
use karpenter_exoscale::operator::fenced_client::fenced;
use karpenter_exoscale::operator::leader::LeaseTimings;
use karpenter_exoscale::operator::metrics::Metrics;
use karpenter_exoscale::operator::run::{
    ExoscaleCloud, ExtraController, Runtime, build_cloud, serve,
};
use karpenter_exoscale::operator::timed_client::{RequestTimeouts, timed};
use karpenter_exoscale::provisioning::controller::{Nominations, Settings as ProvisioningSettings};
use karpenter_exoscale::sim::kubelet::KubeletBehaviour;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Disruption steps take the 15 s validation delay, launches and drains: allow more.
const LONG: Duration = Duration::from_secs(240);

fn joins() -> harness::KubeletPolicy {
    Arc::new(|_: &str| KubeletBehaviour::default())
}

/// A replica running the core controllers plus provisioning and disruption.
struct Operator {
    stop: watch::Sender<bool>,
    task: JoinHandle<Result<(), karpenter_exoscale::operator::RunError>>,
    _cloud: ExoscaleCloud,
    /// The registry the replica serves on `/metrics`.
    metrics: Arc<Metrics>,
}

impl Operator {
    async fn start(world: &World) -> Operator {
        Operator::start_with(world, &[]).await
    }

    /// A replica with extra environment (feature gates).
    async fn start_with(world: &World, extra_env: &[(&str, &str)]) -> Operator {
        Operator::start_using(world, extra_env, world.client.clone()).await
    }

    /// A replica whose controllers talk to the API server through `client` (a test's faults).
    async fn start_using(
        world: &World,
        extra_env: &[(&str, &str)],
        client: kube::Client,
    ) -> Operator {
        let mut env = world.env.clone();
        env.insert("POD_NAME".into(), "disruption".into());
        for (key, value) in extra_env {
            env.insert((*key).into(), (*value).into());
        }
        let mut config =
            Config::resolve(&RunArgs::default(), &env).expect("valid test configuration");
        config.metrics_port = 0;
        config.health_probe_port = 0;
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let fence = Fence::closed();
        let cloud = build_cloud(
            ExoscaleSettings {
                zone: world.sim.zone().into(),
                cluster_id: world.sim.cluster_id().into(),
                cluster_uid: world.cluster_uid.clone(),
                instance_prefix: PREFIX.into(),
                cluster_endpoint: "https://127.0.0.1:6443".into(),
                cluster_domain: "cluster.local".into(),
                bootstrap_token_ttl: std::time::Duration::from_secs(600),
            },
            world.exo.fenced(fence.clone()),
            fenced(world.client.clone(), fence.clone()),
            clock.clone(),
        )
        .await
        .expect("cloud provider against the sim");
        let provisioning = ProvisioningSettings {
            batch_idle: Duration::from_secs(1),
            batch_max: Duration::from_secs(3),
            preference_policy: karpenter_exoscale::scheduling::PreferencePolicy::Respect,
            min_values_policy: karpenter_exoscale::scheduling::MinValuesPolicy::Strict,
            default_topology_spread: Vec::new(),
            ignore_dra_requests: true,
            requeue_after: karpenter_exoscale::provisioning::controller::REQUEUE_AFTER,
        };
        let settings = disruption::Settings {
            poll_interval: Duration::from_secs(2),
            conditions_interval: Duration::from_secs(1),
            ..disruption::Settings::default()
        };
        let nominations = Arc::new(Nominations::default());
        let controllers: Vec<ExtraController> = vec![
            karpenter_exoscale::provisioning::plugin(provisioning, nominations.clone()),
            disruption::plugin(settings, nominations),
        ];
        let (stop, rx) = watch::channel(false);
        let metrics = Arc::new(Metrics::new());
        let runtime = Runtime {
            config,
            lease_client: client.clone(),
            // As in `run`: no request waits forever for an answer.
            client: timed(client, RequestTimeouts::default()),
            cloud: cloud.provider.clone(),
            nodeclasses: Some(cloud.nodeclass_wiring()),
            clock,
            bind_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            extra_controllers: controllers,
            // Short enough that a killed leader is replaced quickly, with 3 s of slack so a
            // busy machine delaying one renewal does not hand the Lease over.
            lease: LeaseTimings {
                duration: Duration::from_secs(6),
                renew_deadline: Duration::from_secs(4),
                retry_period: Duration::from_secs(1),
            },
            metrics: metrics.clone(),
            fence,
        };
        let task = tokio::spawn(serve(runtime, rx));
        Operator {
            stop,
            task,
            _cloud: cloud,
            metrics,
        }
    }

    async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(30), self.task).await;
    }
}

fn suffix(world: &World) -> String {
    world.namespace[world.namespace.len() - 6..].to_string()
}

/// A NodePool of `standard.small` on-demand nodes with the given disruption block and labels.
async fn nodepool(
    world: &World,
    disruption: serde_json::Value,
    labels: serde_json::Value,
) -> String {
    nodepool_of(world, &["standard.small"], disruption, labels).await
}

/// A NodePool of on-demand nodes of `types` with the given disruption block and labels.
async fn nodepool_of(
    world: &World,
    types: &[&str],
    disruption: serde_json::Value,
    labels: serde_json::Value,
) -> String {
    let name = format!("dis-{}", suffix(world));
    world
        .create_nodepool(
            &name,
            json!({
                "disruption": disruption,
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "requirements": [
                            {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": types},
                            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}
                        ],
                        "expireAfter": "Never"
                    }
                }
            }),
        )
        .await;
    name
}

async fn delete_nodepool(world: &World, name: &str) {
    let _ = Api::<NodePool>::all(world.client.clone())
        .delete(name, &DeleteParams::default())
        .await;
}

/// A Deployment of `replicas` pause pods requesting `cpu`, restricted to the NodePool.
async fn deployment(
    world: &World,
    name: &str,
    pool: &str,
    replicas: i32,
    cpu: &str,
    extra_pod: serde_json::Value,
) {
    let mut template = json!({
        "metadata": {"labels": {"app": name}},
        "spec": {
            "nodeSelector": {NODEPOOL_LABEL: pool},
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}]
        }
    });
    if let (Some(meta), Some(extra)) = (
        template["metadata"].as_object_mut(),
        extra_pod.get("metadata").and_then(|m| m.as_object()),
    ) {
        meta.extend(extra.clone());
    }
    let d: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}, "template": template}
    }))
    .expect("Deployment");
    deployments(world)
        .create(&PostParams::default(), &d)
        .await
        .expect("create Deployment");
}

fn deployments(world: &World) -> Api<Deployment> {
    Api::namespaced(world.client.clone(), &world.namespace)
}

async fn scale(world: &World, name: &str, replicas: i32) {
    deployments(world)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"replicas": replicas}})),
        )
        .await
        .expect("scale Deployment");
}

/// Names of the live (not deleting) NodeClaims of the pool once every one is initialized.
async fn initialized_claims(world: &World, pool: &str, count: usize) -> BTreeSet<String> {
    eventually_within(
        &format!("{count} initialized NodeClaims in {pool}"),
        LONG,
        || async {
            let claims = world.claims_of_pool(pool).await;
            let live: Vec<&NodeClaim> = claims
                .iter()
                .filter(|c| c.metadata.deletion_timestamp.is_none())
                .collect();
            let all_initialized = live.iter().all(|c| {
                c.status
                    .as_ref()
                    .is_some_and(|s| s.conditions.is_true("Initialized"))
            });
            (live.len() == count && all_initialized)
                .then(|| live.iter().map(|c| c.name_any()).collect())
        },
    )
    .await
}

/// Pods of the namespace with `app` label `app`, once all `count` are bound: node names.
async fn bound_pods(world: &World, app: &str, count: usize) -> Vec<String> {
    eventually_within(&format!("{count} pods of {app} bound"), LONG, || async {
        let pods = world
            .pods()
            .list(&ListParams::default().labels(&format!("app={app}")))
            .await
            .ok()?;
        let live: Vec<&Pod> = pods
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        let nodes: Vec<String> = live
            .iter()
            .filter_map(|p| p.spec.as_ref()?.node_name.clone())
            .collect();
        (live.len() == count && nodes.len() == count).then_some(nodes)
    })
    .await
}

fn node_of(claim: &NodeClaim) -> Option<String> {
    claim.status.as_ref()?.node_name.clone()
}

async fn cleanup(world: World, operator: Operator, pool: &str) {
    for d in deployments(&world)
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
    {
        let _ = deployments(&world)
            .delete(&d.name_any(), &DeleteParams::default())
            .await;
    }
    operator.stop().await;
    delete_nodepool(&world, pool).await;
    world.finish().await;
}

/// A Running pod of a DaemonSet `name` (created here, selecting no node) on `node`, with
/// the node affinity the DaemonSet controller gives each of its pods.
async fn daemonset_pod(world: &World, name: &str, node: &str) {
    let daemonsets: Api<k8s_openapi::api::apps::v1::DaemonSet> =
        Api::namespaced(world.client.clone(), &world.namespace);
    let labels = json!({"app": name});
    let ds: k8s_openapi::api::apps::v1::DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"nodeSelector": {"example.com/no-node": "true"},
                "containers": [{"name": "agent", "image": "registry.k8s.io/pause:3.10"}]}}}
    }))
    .unwrap();
    let ds = daemonsets
        .create(&PostParams::default(), &ds)
        .await
        .expect("create DaemonSet");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": format!("{name}-{node}"), "labels": labels, "ownerReferences": [{
            "apiVersion": "apps/v1", "kind": "DaemonSet", "name": name,
            "uid": ds.uid().unwrap(), "controller": true}]},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}},
            "containers": [{"name": "agent", "image": "registry.k8s.io/pause:3.10"}]
        }
    }))
    .unwrap();
    let pod = world
        .pods()
        .create(&PostParams::default(), &pod)
        .await
        .expect("create DaemonSet pod");
    harness::report_running(world, &pod.name_any()).await;
}

#[tokio::test]
async fn an_empty_node_is_removed_after_consolidate_after() {
    let Some(world) = World::start("dis-empty", joins()).await else {
        return;
    };
    world.create_nodeclass(json!({})).await;
    let operator = Operator::start(&world).await;
    world.ready_nodeclass().await;
    let pool = nodepool(
        &world,
        json!({"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "5s"}),
        json!({}),
    )
    .await;
    deployment(&world, "web", &pool, 1, "200m", json!({})).await;
    let claims = initialized_claims(&world, &pool, 1).await;
    bound_pods(&world, "web", 1).await;
    let claim = claims.into_iter().next().unwrap();
    // As on every real node, a DaemonSet pod runs there too, pinned by the DaemonSet
    // controller's `matchFields` (this control plane runs no DaemonSet controller).
    let node = world.initialized_node(&claim).await.name_any();
    daemonset_pod(&world, "agent", &node).await;

    scale(&world, "web", 0).await;
    let nodeclaims = world.nodeclaims();
    eventually_within("the empty NodeClaim is deleted", LONG, || {
        let nodeclaims = nodeclaims.clone();
        let claim = claim.clone();
        async move { matches!(nodeclaims.get_opt(&claim).await, Ok(None)).then_some(()) }
    })
    .await;
    assert!(
        world.claims_of_pool(&pool).await.is_empty(),
        "no replacement for an empty node"
    );
    cleanup(world, operator, &pool).await;
}

/// A NodePool consolidating after 5 s (with `more` disruption settings) and one node running
/// one pod of Deployment `web`; returns the pool's and the node's NodeClaim's names.
async fn one_web_node(world: &World, more: serde_json::Value) -> (String, String) {
    let mut disruption =
        json!({"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "5s"});
    if let (Some(all), Some(more)) = (disruption.as_object_mut(), more.as_object()) {
        all.extend(more.clone());
    }
    let pool = nodepool(world, disruption, json!({})).await;
    deployment(world, "web", &pool, 1, "200m", json!({})).await;
    let claim = initialized_claims(world, &pool, 1)
        .await
        .into_iter()
        .next()
        .unwrap();
    bound_pods(world, "web", 1).await;
    (pool, claim)
}

/// The API server refuses to taint an empty candidate: nothing is deleted (the command stops
/// and its taints come off), pass after pass. Then it refuses the NodeClaim's delete once: the
/// disruption is released, not held until a restart, and a later pass removes the node.
#[tokio::test]
async fn a_refused_taint_stops_the_command_and_a_refused_delete_is_retried() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
    let Some(world) = World::start("dis-refused", joins()).await else {
        return;
    };
    world.create_nodeclass(json!({})).await;
    let refuse_taints = Arc::new(AtomicBool::new(true));
    let refuse_deletes = Arc::new(AtomicUsize::new(0));
    let taints_refused = Arc::new(AtomicUsize::new(0));
    let deletes_refused = Arc::new(AtomicUsize::new(0));
    let client = harness::intercepted(world.client.clone(), {
        let (refuse_taints, refuse_deletes) = (refuse_taints.clone(), refuse_deletes.clone());
        let (taints_refused, deletes_refused) = (taints_refused.clone(), deletes_refused.clone());
        move |inner: kube::Client, request: harness::Request| {
            let (refuse_taints, refuse_deletes) = (refuse_taints.clone(), refuse_deletes.clone());
            let (taints_refused, deletes_refused) =
                (taints_refused.clone(), deletes_refused.clone());
            async move {
                let path = request.uri().path().to_string();
                if request.method() == http::Method::DELETE
                    && path.starts_with("/apis/karpenter.sh/v1/nodeclaims/")
                    && refuse_deletes
                        .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
                        .is_ok()
                {
                    deletes_refused.fetch_add(1, SeqCst);
                    return harness::refused(500);
                }
                if request.method() == http::Method::PATCH
                    && path.starts_with("/api/v1/nodes/")
                    && refuse_taints.load(SeqCst)
                {
                    let (parts, body) = request.into_parts();
                    let bytes = body.collect_bytes().await?;
                    if String::from_utf8_lossy(&bytes).contains("karpenter.sh/disrupted") {
                        taints_refused.fetch_add(1, SeqCst);
                        return harness::refused(500);
                    }
                    let request = http::Request::from_parts(parts, kube::client::Body::from(bytes));
                    return inner.send(request).await.map_err(Into::into);
                }
                inner.send(request).await.map_err(Into::into)
            }
        }
    });
    let operator = Operator::start_using(&world, &[], client).await;
    world.ready_nodeclass().await;
    let (pool, claim) = one_web_node(&world, json!({})).await;
    scale(&world, "web", 0).await;

    eventually_within("three commands' taints refused", LONG, || async {
        (taints_refused.load(SeqCst) >= 3).then_some(())
    })
    .await;
    let kept = world.nodeclaims().get(&claim).await.unwrap();
    assert!(
        kept.metadata.deletion_timestamp.is_none(),
        "deleted although its node could not be tainted"
    );

    refuse_deletes.store(1, SeqCst);
    refuse_taints.store(false, SeqCst);
    let nodeclaims = world.nodeclaims();
    eventually_within("the empty NodeClaim is deleted after all", LONG, || {
        let nodeclaims = nodeclaims.clone();
        let claim = claim.clone();
        async move { matches!(nodeclaims.get_opt(&claim).await, Ok(None)).then_some(()) }
    })
    .await;
    assert_eq!(
        deletes_refused.load(SeqCst),
        1,
        "the refused delete was sent"
    );
    cleanup(world, operator, &pool).await;
}

/// One command takes two empty nodes. The first is tainted; while the second's taint is on its
/// way, the first Node is deleted (a finalizer keeps it terminating); then the second's taint
/// is refused, so the command rolls back. The rollback leaves the first Node's taint alone: it
/// is draining, and without the taint kube-scheduler could bind pods to it.
#[tokio::test]
async fn a_rollback_leaves_the_taint_on_a_node_being_deleted() {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let Some(world) = World::start("dis-rollback", joins()).await else {
        return;
    };
    world.create_nodeclass(json!({})).await;
    // The first node tainted, once one is; the second's taint is held, then refused.
    let first: Arc<Mutex<Option<String>>> = Arc::default();
    let second_held = Arc::new(AtomicUsize::new(0));
    let refusals = Arc::new(AtomicUsize::new(0));
    let release = watch::channel(false).0;
    // Taint rewrites of the first node that leave the disrupted taint out.
    let first_untainted = Arc::new(AtomicUsize::new(0));
    let client = harness::intercepted(world.client.clone(), {
        let (first, second_held, refusals) = (first.clone(), second_held.clone(), refusals.clone());
        let (release, first_untainted) = (release.clone(), first_untainted.clone());
        move |inner: kube::Client, request: harness::Request| {
            let (first, second_held, refusals) =
                (first.clone(), second_held.clone(), refusals.clone());
            let (mut released, first_untainted) = (release.subscribe(), first_untainted.clone());
            async move {
                let path = request.uri().path().to_string();
                let Some(node) = path.strip_prefix("/api/v1/nodes/").map(str::to_string) else {
                    return inner.send(request).await.map_err(Into::into);
                };
                if request.method() != http::Method::PATCH {
                    return inner.send(request).await.map_err(Into::into);
                }
                let (parts, body) = request.into_parts();
                let bytes = body.collect_bytes().await?;
                let text = String::from_utf8_lossy(&bytes).to_string();
                let request = http::Request::from_parts(parts, kube::client::Body::from(bytes));
                let taints = text.contains("\"taints\"");
                let disrupted = text.contains("karpenter.sh/disrupted");
                let is_first = {
                    let mut first = first.lock().unwrap();
                    if first.is_none() && taints && disrupted {
                        *first = Some(node.clone());
                    }
                    first.as_deref() == Some(node.as_str())
                };
                if is_first && taints && !disrupted {
                    first_untainted.fetch_add(1, SeqCst);
                }
                if !is_first && taints && disrupted && second_held.fetch_add(1, SeqCst) == 0 {
                    let _ = released.wait_for(|r| *r).await;
                    refusals.fetch_add(1, SeqCst);
                    return harness::refused(500);
                }
                inner.send(request).await.map_err(Into::into)
            }
        }
    });
    let operator = Operator::start_using(&world, &[], client).await;
    world.ready_nodeclass().await;
    let pool = nodepool(
        &world,
        json!({"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "5s",
               "budgets": [{"nodes": "0"}]}),
        json!({}),
    )
    .await;
    deployment(&world, "web", &pool, 2, "1200m", json!({})).await;
    let claims = initialized_claims(&world, &pool, 2).await;
    bound_pods(&world, "web", 2).await;
    scale(&world, "web", 0).await;
    consolidatable(&world, &claims).await;
    set_budgets(&world, &pool, json!([{"nodes": "2"}])).await;

    eventually_within("the second node's taint held", LONG, || async {
        (second_held.load(SeqCst) >= 1).then_some(())
    })
    .await;
    let tainted = first
        .lock()
        .unwrap()
        .clone()
        .expect("the first node was tainted");
    world
        .nodes()
        .patch(
            &tainted,
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"finalizers": ["example.com/hold"]}})),
        )
        .await
        .unwrap();
    world
        .nodes()
        .delete(&tainted, &DeleteParams::default())
        .await
        .unwrap();
    eventually_within("the first node terminating", LONG, || async {
        let node = world.nodes().get(&tainted).await.ok()?;
        node.metadata.deletion_timestamp.is_some().then_some(())
    })
    .await;
    release.send_replace(true);

    // The refusal ends the command; later passes may disrupt the second node on their own.
    eventually_within("the second node's taint refused", LONG, || async {
        (refusals.load(SeqCst) >= 1).then_some(())
    })
    .await;
    let settled = std::time::Instant::now();
    eventually_within("10 s after the rollback", LONG, || async {
        (settled.elapsed() >= Duration::from_secs(10)).then_some(())
    })
    .await;
    assert_eq!(
        first_untainted.load(SeqCst),
        0,
        "the rollback took the disrupted taint off a node being deleted"
    );

    if let Ok(node) = world.nodes().get(&tainted).await {
        let kept: Vec<String> = node
            .finalizers()
            .iter()
            .filter(|f| *f != "example.com/hold")
            .cloned()
            .collect();
        let _ = world
            .nodes()
            .patch(
                &tainted,
                &PatchParams::default(),
                &Patch::Merge(&json!({"metadata": {"finalizers": kept}})),
            )
            .await;
    }
    cleanup(world, operator, &pool).await;
}

#[tokio::test]
async fn a_node_whose_pods_fit_elsewhere_is_consolidated_and_its_pods_rescheduled() {
    let Some(world) = World::start("dis-consolidate", joins()).await else {
        return;
    };
    world.create_nodeclass(json!({})).await;
    let operator = Operator::start(&world).await;
    world.ready_nodeclass().await;
    let pool = nodepool(
        &world,
        json!({"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "5s"}),
        json!({}),
    )
    .await;
    // A filler and a small pod share the first node; the second small pod needs a second node.
    deployment(&world, "filler", &pool, 1, "1200m", json!({})).await;
    deployment(&world, "first", &pool, 1, "200m", json!({})).await;
    initialized_claims(&world, &pool, 1).await;
    bound_pods(&world, "filler", 1).await;
    bound_pods(&world, "first", 1).await;
    deployment(&world, "second", &pool, 1, "400m", json!({})).await;
    initialized_claims(&world, &pool, 2).await;
    let first = bound_pods(&world, "first", 1).await;
    let second = bound_pods(&world, "second", 1).await;
    assert_ne!(
        first, second,
        "the second pod did not fit beside the filler"
    );

    // Without the filler both small pods fit on one node: one node goes, its pod moves.
    deployments(&world)
        .delete("filler", &DeleteParams::default())
        .await
        .unwrap();
    let survivor = initialized_claims(&world, &pool, 1)
        .await
        .into_iter()
        .next()
        .unwrap();
    let claim = world.nodeclaims().get(&survivor).await.unwrap();
    let node = node_of(&claim).expect("the surviving NodeClaim has a node");
    eventually_within("both pods run on the surviving node", LONG, || async {
        let a = bound_pods(&world, "first", 1).await;
        let b = bound_pods(&world, "second", 1).await;
        (a == [node.clone()] && b == [node.clone()]).then_some(())
    })
    .await;
    eventually("only the surviving NodeClaim remains", || async {
        (world.claims_of_pool(&pool).await.len() == 1).then_some(())
    })
    .await;
    // The consolidation's simulations are timed beside provisioning's rounds.
    let exposed = operator.metrics.render();
    let simulations = exposed
        .lines()
        .find_map(|l| {
            l.strip_prefix(
                "karpenter_scheduler_scheduling_duration_seconds_count{controller=\"disruption\"} ",
            )
        })
        .and_then(|v| v.parse::<f64>().ok());
    assert!(
        simulations.is_some_and(|n| n >= 1.0),
        "disruption's simulations on /metrics: {simulations:?}"
    );
    cleanup(world, operator, &pool).await;
}

#[tokio::test]
async fn a_nodepool_label_change_drifts_and_replaces_nodes_one_budget_at_a_time() {
    let Some(world) = World::start("dis-drift", joins()).await else {
        return;
    };
    world.create_nodeclass(json!({})).await;
    let operator = Operator::start(&world).await;
    world.ready_nodeclass().await;
    let pool = nodepool(
        &world,
        json!({"consolidationPolicy": "WhenEmpty", "consolidateAfter": "Never", "budgets": [{"nodes": "1"}]}),
        json!({"team": "blue"}),
    )
    .await;
    // Two nodes: two of these pods never fit on one.
    deployment(&world, "web", &pool, 2, "1200m", json!({})).await;
    let old = initialized_claims(&world, &pool, 2).await;
    bound_pods(&world, "web", 2).await;

    Api::<NodePool>::all(world.client.clone())
        .patch(
            &pool,
            &PatchParams::default(),
            &Patch::Merge(
                &json!({"spec": {"template": {"metadata": {"labels": {"team": "green"}}}}}),
            ),
        )
        .await
        .unwrap();
    // While old nodes are replaced, never more than one of them is being disrupted at once. A
    // NodeClaim whose instance is already terminating no longer counts against the budget.
    eventually_within(
        "every old NodeClaim replaced",
        Duration::from_secs(420),
        || async {
            let claims = world.claims_of_pool(&pool).await;
            let disrupting = claims
                .iter()
                .filter(|c| old.contains(&c.name_any()))
                .filter(|c| {
                    !c.status
                        .as_ref()
                        .is_some_and(|s| s.conditions.is_true("InstanceTerminating"))
                })
                .filter(|c| {
                    c.metadata.deletion_timestamp.is_some()
                        || c.status
                            .as_ref()
                            .is_some_and(|s| s.conditions.is_true("DisruptionReason"))
                })
                .count();
            assert!(
                disrupting <= 1,
                "the budget allows one node at a time, {disrupting} disrupting"
            );
            let remaining_old = claims
                .iter()
                .filter(|c| old.contains(&c.name_any()))
                .count();
            let new_ready = claims
                .iter()
                .filter(|c| !old.contains(&c.name_any()))
                .filter(|c| {
                    c.status
                        .as_ref()
                        .is_some_and(|s| s.conditions.is_true("Initialized"))
                })
                .count();
            (remaining_old == 0 && new_ready == 2).then_some(())
        },
    )
    .await;
    for claim in world.claims_of_pool(&pool).await {
        assert_eq!(
            claim.labels().get("team").map(String::as_str),
            Some("green"),
            "{}",
            claim.name_any()
        );
    }
    cleanup(world, operator, &pool).await;
}

#[tokio::test]
async fn do_not_disrupt_and_a_blocking_pdb_keep_their_nodes() {
    let Some(world) = World::start("dis-protect", joins()).await else {
        return;
    };
    world.create_nodeclass(json!({})).await;
    let operator = Operator::start(&world).await;
    world.ready_nodeclass().await;
    let pool = nodepool(
        &world,
        json!({"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "2s"}),
        json!({}),
    )
    .await;
    // Nodes start with a startup taint the test removes: the second node is seen, and blocked,
    // as not initialized before its PDB holds it (below).
    Api::<NodePool>::all(world.client.clone())
        .patch(
            &pool,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"template": {"spec": {"startupTaints": [
                {"key": WARMING_TAINT, "effect": "NoSchedule"}
            ]}}}})),
        )
        .await
        .expect("patch startupTaints");
    // The first node holds a filler and the do-not-disrupt pod; the PDB-guarded pod does not
    // fit beside them and gets a second node. Once the filler goes, both small pods would fit on
    // one node: only the protections keep both nodes.
    deployment(&world, "filler", &pool, 1, "1200m", json!({})).await;
    deployment(
        &world,
        "pinned",
        &pool,
        1,
        "200m",
        json!({"metadata": {"annotations": {"karpenter.sh/do-not-disrupt": "true"}}}),
    )
    .await;
    let first = registered_nodes(&world, &pool, 1).await;
    // The user data wrote the value-less taint as `true` (the node agent refuses empty values);
    // registration put the NodeClaim's back, once.
    let held: Vec<_> = world
        .nodes()
        .get(&first[0])
        .await
        .expect("the first Node")
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.key == WARMING_TAINT)
        .collect();
    assert_eq!(held.len(), 1, "{held:?}");
    assert!(
        held[0].value.as_deref().unwrap_or("").is_empty(),
        "{held:?}"
    );
    remove_warming_taint(&world, &first[0]).await;
    initialized_claims(&world, &pool, 1).await;
    bound_pods(&world, "filler", 1).await;
    bound_pods(&world, "pinned", 1).await;
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "guarded"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "guarded"}}}
    }))
    .unwrap();
    Api::<PodDisruptionBudget>::namespaced(world.client.clone(), &world.namespace)
        .create(&PostParams::default(), &pdb)
        .await
        .unwrap();
    deployment(&world, "guarded", &pool, 1, "400m", json!({})).await;
    let second: Vec<String> = registered_nodes(&world, &pool, 2)
        .await
        .into_iter()
        .filter(|n| *n != first[0])
        .collect();
    // The first `DisruptionBlocked` of the second node names something other than its PDB; a
    // node's events share one dedupe key for 2 minutes, so the PDB is named only by a pass
    // after that, when nothing changes any more and no decision is made.
    let first_word = eventually_within_showing(
        "a DisruptionBlocked event on the second node before it is initialized",
        LONG,
        || async {
            all_events(&world)
                .await?
                .iter()
                .filter(|e| e.reason.as_deref() == Some("DisruptionBlocked"))
                .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_ref()) == Some(&second[0]))
                .find_map(|e| e.note.clone())
                .ok_or_else(|| format!("none yet on {}", second[0]))
        },
    )
    .await;
    assert!(
        !first_word.contains("pdb prevents pod evictions"),
        "{first_word}"
    );
    remove_warming_taint(&world, &second[0]).await;
    let claims = initialized_claims(&world, &pool, 2).await;
    bound_pods(&world, "guarded", 1).await;
    deployments(&world)
        .delete("filler", &DeleteParams::default())
        .await
        .unwrap();
    // One node is blocked by the annotated pod, the other by the PDB. A timeout shows every
    // event about the two nodes and their NodeClaims.
    let notes = eventually_within_showing(
        "DisruptionBlocked events naming both protections",
        LONG,
        || async {
            let list = all_events(&world).await?;
            let about_ours: Vec<&k8s_openapi::api::events::v1::Event> = list
                .iter()
                .filter(|e| {
                    e.regarding
                        .as_ref()
                        .and_then(|r| r.name.as_ref())
                        .is_some_and(|n| {
                            claims.contains(n)
                                || claims.iter().any(|c| n == &format!("{PREFIX}{c}"))
                        })
                })
                .collect();
            let notes: Vec<String> = about_ours
                .iter()
                .filter(|e| e.reason.as_deref() == Some("DisruptionBlocked"))
                .filter_map(|e| e.note.clone())
                .collect();
            let ours = |n: &String| n.contains(&format!("{}/", world.namespace));
            let pinned = notes.iter().any(|n| {
                ours(n) && n.contains("karpenter.sh/do-not-disrupt") && n.contains("/pinned-")
            });
            let guarded = notes.iter().any(|n| {
                ours(n) && n.contains("pdb prevents pod evictions") && n.contains("/guarded")
            });
            if pinned && guarded {
                return Ok(notes);
            }
            let seen: Vec<String> = about_ours
                .iter()
                .map(|e| {
                    format!(
                        "{} {}: {}",
                        e.regarding
                            .as_ref()
                            .and_then(|r| r.name.as_deref())
                            .unwrap_or("?"),
                        e.reason.as_deref().unwrap_or("?"),
                        e.note.as_deref().unwrap_or("")
                    )
                })
                .collect();
            Err(format!(
                "pinned {pinned}, guarded {guarded}; events: {seen:?}"
            ))
        },
    )
    .await;
    assert!(!notes.is_empty());
    let now: BTreeSet<String> = world
        .claims_of_pool(&pool)
        .await
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .map(|c| c.name_any())
        .collect();
    assert_eq!(now, claims, "protected nodes stay");

    // `explain node` and `explain pod` name the same protections, read-only.
    let pinned_node = bound_pods(&world, "pinned", 1).await;
    let guarded_node = bound_pods(&world, "guarded", 1).await;
    let live = karpenter_exoscale::explain::live::read(&world.client)
        .await
        .expect("the cluster reads");
    let env = karpenter_exoscale::explain::Env::new(world.sim.zone(), "EUR");
    for (node, protection) in [
        (&pinned_node[0], "karpenter.sh/do-not-disrupt"),
        (&guarded_node[0], "pdb prevents pod evictions"),
    ] {
        let e = karpenter_exoscale::explain::explain_node(&live, &env, node)
            .await
            .expect("explain node");
        eprintln!("{}", karpenter_exoscale::explain::render_node(&e));
        let consolidation = e
            .methods
            .iter()
            .find(|m| m.method == "SingleNodeConsolidation")
            .unwrap();
        assert!(!consolidation.eligible);
        assert!(
            consolidation.detail.contains(protection),
            "{node}: {consolidation:?}"
        );
        assert!(e.price_per_hour.is_some_and(|p| p > 0.0), "{e:?}");
        assert!(e.utilisation["cpu"] > 0.0, "{e:?}");
    }
    let guarded_pod = world
        .pods()
        .list(&ListParams::default().labels("app=guarded"))
        .await
        .unwrap()
        .items
        .remove(0);
    let e = karpenter_exoscale::explain::explain_pod(
        &live,
        &env,
        &world.namespace,
        &guarded_pod.name_any(),
    )
    .await
    .expect("explain pod");
    match &e.verdict {
        karpenter_exoscale::explain::Verdict::Bound {
            consolidation_blocked_by: Some(why),
            this_pod_blocks: true,
            landed_because,
            ..
        } => {
            assert!(why.contains("pdb prevents pod evictions"), "{why}");
            assert!(
                landed_because
                    .iter()
                    .any(|l| l.starts_with(&format!("nodeSelector {NODEPOOL_LABEL}={pool}"))),
                "{landed_because:?}"
            );
        }
        other => panic!("the guarded pod's node is blocked by its PDB: {other:?}"),
    }

    // Without the PDB the guarded node is consolidated onto the pinned one, which stays.
    Api::<PodDisruptionBudget>::namespaced(world.client.clone(), &world.namespace)
        .delete("guarded", &DeleteParams::default())
        .await
        .unwrap();
    let survivor = initialized_claims(&world, &pool, 1)
        .await
        .into_iter()
        .next()
        .unwrap();
    let survivor = world.nodeclaims().get(&survivor).await.unwrap();
    assert_eq!(
        node_of(&survivor),
        Some(pinned_node[0].clone()),
        "the do-not-disrupt node stays"
    );
    eventually_within("the guarded pod moves to the pinned node", LONG, || async {
        (bound_pods(&world, "guarded", 1).await == pinned_node).then_some(())
    })
    .await;
    cleanup(world, operator, &pool).await;
}

/// Every event in the cluster, or what listing them failed with.
async fn all_events(world: &World) -> Result<Vec<k8s_openapi::api::events::v1::Event>, String> {
    Api::<k8s_openapi::api::events::v1::Event>::all(world.client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(|e| format!("listing events: {e}"))
}

/// A startup taint of the protections test, removed by the test itself.
const WARMING_TAINT: &str = "e2e.karpenter.sh/warming";

/// Names of the pool's Nodes once `count` NodeClaims have one, in the order of their NodeClaims'
/// creation.
async fn registered_nodes(world: &World, pool: &str, count: usize) -> Vec<String> {
    eventually_within(&format!("{count} Nodes in {pool}"), LONG, || async {
        let mut claims = world.claims_of_pool(pool).await;
        claims.sort_by_key(|c| c.metadata.creation_timestamp.clone());
        let nodes: Vec<String> = claims.iter().filter_map(node_of).collect();
        (claims.len() == count && nodes.len() == count).then_some(nodes)
    })
    .await
}

/// Removes [`WARMING_TAINT`] from a Node, as a CNI removes its startup taint once ready.
async fn remove_warming_taint(world: &World, node: &str) {
    eventually_within(
        &format!("{WARMING_TAINT} removed from {node}"),
        LONG,
        || async {
            let current = world.nodes().get(node).await.ok()?;
            let taints = current.spec.as_ref()?.taints.clone().unwrap_or_default();
            if !taints.iter().any(|t| t.key == WARMING_TAINT) {
                return Some(());
            }
            let kept: Vec<_> = taints
                .into_iter()
                .filter(|t| t.key != WARMING_TAINT)
                .collect();
            // The resourceVersion makes this a replace of what was read, not of a newer list.
            let patch = json!({
                "metadata": {"resourceVersion": current.resource_version()},
                "spec": {"taints": kept}
            });
            let _ = world
                .nodes()
                .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
                .await;
            None
        },
    )
    .await
}

/// Sets the NodePool's budgets (the list is replaced).
async fn set_budgets(world: &World, pool: &str, budgets: serde_json::Value) {
    Api::<NodePool>::all(world.client.clone())
        .patch(
            pool,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"disruption": {"budgets": budgets}}})),
        )
        .await
        .expect("patch budgets");
}

async fn consolidatable(world: &World, claims: &BTreeSet<String>) {
    eventually_within("the NodeClaims are Consolidatable", LONG, || async {
        let all = world
            .nodeclaims()
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        let ready = claims.iter().all(|name| {
            all.iter().any(|c| {
                c.name_any() == *name
                    && c.status
                        .as_ref()
                        .is_some_and(|s| s.conditions.is_true("Consolidatable"))
            })
        });
        ready.then_some(())
    })
    .await;
}

/// On-demand price of an instance type (any currency will do for comparisons).
fn price_of(instance_type: &str) -> f64 {
    karpenter_exoscale::catalogue::Catalogue::embedded()
        .price_by_name(instance_type, karpenter_exoscale::catalogue::Currency::Eur)
        .unwrap_or_else(|| panic!("{instance_type} has a price"))
}

fn type_of(claim: &NodeClaim) -> String {
    claim
        .labels()
        .get(INSTANCE_TYPE_LABEL)
        .cloned()
        .unwrap_or_else(|| panic!("{} has an instance type", claim.name_any()))
}

/// A consolidation's replacement NodeClaim is created but the answer lost, and the NodeClaim
/// watch is late to bring it. Later passes do not decide again (a second replacement) until
/// cluster state holds every NodeClaim the API server lists; once it does, the pod ends on one
/// cheaper node.
#[tokio::test]
async fn a_replacement_whose_create_answer_is_lost_is_not_launched_twice() {
    use std::sync::atomic::Ordering::SeqCst;
    let Some(world) = World::start("dis-lost", joins()).await else {
        return;
    };
    world.create_nodeclass(json!({})).await;
    let transport = harness::LostAnswer::new(world.client.clone());
    transport.armed.store(false, SeqCst);
    let client = kube::Client::new(transport.clone(), world.namespace.clone());
    let operator = Operator::start_using(&world, &[], client).await;
    world.ready_nodeclass().await;
    let pool = nodepool_of(
        &world,
        &["standard.tiny", "standard.small"],
        json!({"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "5s",
               "budgets": [{"nodes": "0"}]}),
        json!({}),
    )
    .await;
    // A filler makes the first node a small one; without it, the small pod fits a tiny node.
    deployment(&world, "filler", &pool, 1, "1200m", json!({})).await;
    deployment(&world, "small", &pool, 1, "300m", json!({})).await;
    let old = initialized_claims(&world, &pool, 1).await;
    bound_pods(&world, "filler", 1).await;
    bound_pods(&world, "small", 1).await;
    deployments(&world)
        .delete("filler", &DeleteParams::default())
        .await
        .unwrap();
    consolidatable(&world, &old).await;

    let before = transport.creates.load(SeqCst);
    transport.claims_late.send_replace(true);
    transport.armed.store(true, SeqCst);
    set_budgets(&world, &pool, json!([{"nodes": "1"}])).await;
    eventually_within(
        "the replacement's create committed, its answer lost",
        LONG,
        || async { (!transport.armed.load(SeqCst)).then_some(()) },
    )
    .await;
    // Past several passes (every 2 s) and the failed command's cleanup.
    let lost = std::time::Instant::now();
    eventually_within("20 s after the lost answer", LONG, || async {
        (lost.elapsed() >= Duration::from_secs(20)).then_some(())
    })
    .await;
    assert_eq!(
        transport.creates.load(SeqCst) - before,
        1,
        "a second replacement was created"
    );

    transport.claims_late.send_replace(false);
    let last = eventually_within("the small pod on one tiny node", LONG, || async {
        let claims = world.claims_of_pool(&pool).await;
        let live: Vec<_> = claims
            .iter()
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .collect();
        let pods = world
            .pods()
            .list(&ListParams::default().labels("app=small"))
            .await
            .ok()?;
        let on = pods.items.first()?.spec.as_ref()?.node_name.clone()?;
        // Later decisions are free to differ (emptiness may take the late replacement first).
        (live.len() == 1
            && type_of(live[0]) == "standard.tiny"
            && node_of(live[0]).as_deref() == Some(on.as_str()))
        .then(|| live[0].clone())
    })
    .await;
    assert!(!old.contains(&last.name_any()));
    cleanup(world, operator, &pool).await;
}

#[tokio::test]
async fn two_under_used_nodes_become_one_cheaper_node() {
    let Some(world) = World::start("dis-multi", joins()).await else {
        return;
    };
    world.create_nodeclass(json!({})).await;
    let operator = Operator::start(&world).await;
    world.ready_nodeclass().await;
    // A zero budget holds disruption while the two nodes are built, so that both are candidates
    // at the same time once it opens.
    let pool = nodepool_of(
        &world,
        &["standard.tiny", "standard.small"],
        json!({"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "5s",
               "budgets": [{"nodes": "0"}]}),
        json!({}),
    )
    .await;
    // standard.small allocates 1700m (300m reserved): a filler and a small pod leave 200m, so
    // the second pair needs a second node and each node ends up with one small pod.
    deployment(&world, "filler-a", &pool, 1, "1200m", json!({})).await;
    deployment(&world, "small-a", &pool, 1, "300m", json!({})).await;
    initialized_claims(&world, &pool, 1).await;
    bound_pods(&world, "filler-a", 1).await;
    let node_a = bound_pods(&world, "small-a", 1).await;
    deployment(&world, "filler-b", &pool, 1, "1200m", json!({})).await;
    deployment(&world, "small-b", &pool, 1, "300m", json!({})).await;
    let old = initialized_claims(&world, &pool, 2).await;
    bound_pods(&world, "filler-b", 1).await;
    let node_b = bound_pods(&world, "small-b", 1).await;
    assert_ne!(node_a, node_b, "one small pod per node");
    let old_claims: Vec<NodeClaim> = world.claims_of_pool(&pool).await;
    let old_price: f64 = old_claims.iter().map(|c| price_of(&type_of(c))).sum();

    // Without the fillers both nodes are under-used: the two small pods fit one tiny node.
    for filler in ["filler-a", "filler-b"] {
        deployments(&world)
            .delete(filler, &DeleteParams::default())
            .await
            .unwrap();
    }
    consolidatable(&world, &old).await;

    // `plan`, read-only, on the cluster as it is but with the budget about to open: it must
    // name the move the controller then makes (both nodes for one cheaper node) and its saving.
    let mut live = karpenter_exoscale::explain::live::read(&world.client)
        .await
        .expect("the cluster reads");
    let mut opened = serde_json::to_value(
        Api::<NodePool>::all(world.client.clone())
            .get(&pool)
            .await
            .unwrap(),
    )
    .unwrap();
    opened["spec"]["disruption"]["budgets"] = json!([{"nodes": "2"}]);
    live.index
        .apply_nodepool(serde_json::from_value::<NodePool>(opened).unwrap());
    let plan = karpenter_exoscale::explain::plan(
        &live,
        &karpenter_exoscale::explain::Env::new(world.sim.zone(), "EUR"),
    )
    .await
    .expect("plan");
    eprintln!("{}", karpenter_exoscale::explain::render_plan(&plan));
    let planned = plan.disruption.clone().expect("plan proposes a disruption");
    assert_eq!(planned.method, "MultiNodeConsolidation");
    assert_eq!(planned.decision, "replace");
    let removed: BTreeSet<String> = planned.remove.iter().map(|r| r.node.clone()).collect();
    assert_eq!(
        removed,
        BTreeSet::from([node_a[0].clone(), node_b[0].clone()])
    );
    assert_eq!(planned.launch.len(), 1, "{planned:?}");

    set_budgets(&world, &pool, json!([{"nodes": "2"}])).await;

    // Both old NodeClaims go at once for one new NodeClaim: the small pods never move to the
    // other old node (single-node consolidation would have moved one of them there first).
    let (node_a, node_b) = (node_a[0].clone(), node_b[0].clone());
    let new_claims: std::sync::Mutex<BTreeSet<String>> = Default::default();
    let survivor = eventually_within("the two NodeClaims replaced by one", LONG, || {
        let (world, pool) = (&world, &pool);
        let (old, node_a, node_b) = (&old, &node_a, &node_b);
        let new_claims = &new_claims;
        async move {
            let claims = world.claims_of_pool(pool).await;
            new_claims.lock().unwrap().extend(
                claims
                    .iter()
                    .map(|c| c.name_any())
                    .filter(|n| !old.contains(n)),
            );
            let pods = world.pods().list(&ListParams::default()).await;
            for pod in pods.map(|l| l.items).unwrap_or_default() {
                let app = pod.labels().get("app").cloned().unwrap_or_default();
                let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
                let wrong = match app.as_str() {
                    "small-a" => Some(node_b),
                    "small-b" => Some(node_a),
                    _ => None,
                };
                assert!(
                    wrong.is_none() || node.as_ref() != wrong,
                    "{} moved to the other old node {node:?}",
                    pod.name_any()
                );
            }
            let live: Vec<&NodeClaim> = claims
                .iter()
                .filter(|c| c.metadata.deletion_timestamp.is_none())
                .collect();
            let done = claims.len() == 1
                && live.len() == 1
                && !old.contains(&live[0].name_any())
                && live[0]
                    .status
                    .as_ref()
                    .is_some_and(|s| s.conditions.is_true("Initialized"));
            done.then(|| live[0].clone())
        }
    })
    .await;
    let new_claims = new_claims.into_inner().unwrap();
    assert_eq!(
        new_claims.len(),
        1,
        "exactly one replacement NodeClaim: {new_claims:?}"
    );
    let new_type = type_of(&survivor);
    let new_price = price_of(&new_type);
    assert!(
        new_price < old_price,
        "{new_type} at {new_price} is not cheaper than the two old nodes at {old_price}"
    );
    // The controller did what `plan` said, at the saving it said.
    assert_eq!(planned.launch[0].instance_type, new_type);
    assert!(
        (planned.savings_per_hour - (old_price - new_price)).abs() < 1e-6,
        "plan saves {} per hour, the move {}",
        planned.savings_per_hour,
        old_price - new_price
    );
    let node = node_of(&survivor).expect("the replacement has a node");
    eventually_within("both small pods run on the new node", LONG, || async {
        let a = bound_pods(&world, "small-a", 1).await;
        let b = bound_pods(&world, "small-b", 1).await;
        (a == [node.clone()] && b == [node.clone()]).then_some(())
    })
    .await;
    cleanup(world, operator, &pool).await;
}

#[tokio::test]
async fn consolidation_honours_a_nodeoverlay_price() {
    let Some(world) = World::start("dis-overlay", joins()).await else {
        return;
    };
    world.create_nodeclass(json!({})).await;
    let operator = Operator::start_with(&world, &[("FEATURE_GATES", "NodeOverlay=true")]).await;
    world.ready_nodeclass().await;
    let pool = nodepool_of(
        &world,
        &["standard.tiny", "standard.small"],
        json!({"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "5s"}),
        json!({}),
    )
    .await;
    assert!(price_of("standard.tiny") < price_of("standard.small"));
    deployment(&world, "app", &pool, 1, "300m", json!({})).await;
    let old = initialized_claims(&world, &pool, 1).await;
    let old_claim = world
        .nodeclaims()
        .get(old.iter().next().unwrap())
        .await
        .unwrap();
    assert_eq!(
        type_of(&old_claim),
        "standard.tiny",
        "list prices pick tiny"
    );
    consolidatable(&world, &old).await;

    // An overlay (scoped to this test's NodePool) makes tiny cost 10/h: at overlay prices the
    // node is worth replacing with a small one, which list prices would never do.
    let overlay: NodeOverlay = serde_json::from_value(json!({
        "apiVersion": "karpenter.sh/v1alpha1", "kind": "NodeOverlay",
        "metadata": {"name": pool},
        "spec": {
            "requirements": [
                {"key": NODEPOOL_LABEL, "operator": "In", "values": [pool]},
                {"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": ["standard.tiny"]}
            ],
            "price": "10"
        }
    }))
    .expect("NodeOverlay");
    let overlays: Api<NodeOverlay> = Api::all(world.client.clone());
    overlays
        .create(&PostParams::default(), &overlay)
        .await
        .expect("create NodeOverlay");

    let replacement = eventually_within("the tiny node replaced by a small one", LONG, || async {
        let claims = world.claims_of_pool(&pool).await;
        let done = claims.len() == 1
            && !old.contains(&claims[0].name_any())
            && claims[0]
                .status
                .as_ref()
                .is_some_and(|s| s.conditions.is_true("Initialized"));
        done.then(|| claims[0].clone())
    })
    .await;
    assert_eq!(type_of(&replacement), "standard.small");
    // As upstream: the replacement NodeClaim is told it is launching for a disruption (the
    // `DisruptionWaitingReadiness` that follows while it starts is unit-tested: whether one
    // is written depends on how fast the simulated node starts).
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(world.client.clone());
    let replacement_name = replacement.name_any();
    let reasons = eventually("disruption events on the replacement NodeClaim", || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        let reasons: BTreeSet<String> = list
            .items
            .iter()
            .filter(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref())
                    == Some(replacement_name.as_str())
            })
            .filter_map(|e| Some(format!("{}: {}", e.reason.as_deref()?, e.note.as_deref()?)))
            .collect();
        reasons
            .iter()
            .any(|r| r.starts_with("DisruptionLaunching"))
            .then_some(reasons)
    })
    .await;
    assert!(
        reasons.contains("DisruptionLaunching: Launching NodeClaim: Underutilized"),
        "{reasons:?}"
    );
    // The move was counted (karpenter_consolidation_moves_total; a non-Balanced pool has no
    // score).
    let moves = format!(
        "karpenter_consolidation_moves_total{{decision=\"approved\",nodepool=\"{pool}\",policy=\"WhenEmptyOrUnderutilized\"}}"
    );
    let exposed = operator.metrics.render();
    assert!(exposed.contains(&moves), "{moves} not in /metrics");
    let node = node_of(&replacement).expect("the replacement has a node");
    eventually_within("the pod runs on the replacement", LONG, || async {
        (bound_pods(&world, "app", 1).await == [node.clone()]).then_some(())
    })
    .await;
    let condition = |o: &NodeOverlay, type_: &str| {
        o.status
            .as_ref()
            .and_then(|s| s.conditions.get_condition(type_))
            .map(|c| {
                (
                    format!("{:?}", c.status),
                    c.reason.clone(),
                    c.message.clone(),
                )
            })
    };
    eventually(
        "the NodeOverlay reports ValidationSucceeded and Ready",
        || async {
            let o = overlays.get(&pool).await.ok()?;
            let ok = ["ValidationSucceeded", "Ready"]
                .iter()
                .all(|t| condition(&o, t).is_some_and(|(status, _, _)| status == "True"));
            ok.then_some(())
        },
    )
    .await;
    // A second overlay of the same weight pricing the same offerings: a tie only the name
    // order settles. The loser (the first overlay: names sort descending) says so.
    let twin_name = format!("{pool}-twin");
    let mut twin = overlay.clone();
    twin.metadata.name = Some(twin_name.clone());
    overlays
        .create(&PostParams::default(), &twin)
        .await
        .expect("create the twin NodeOverlay");
    let (_, reason, message) = eventually("the tie reported as a Conflict", || async {
        let o = overlays.get(&pool).await.ok()?;
        condition(&o, "ValidationSucceeded").filter(|(status, _, _)| status == "False")
    })
    .await;
    assert_eq!(reason, "Conflict");
    assert!(message.contains(&twin_name), "{message}");
    for name in [pool.clone(), twin_name] {
        let _ = overlays.delete(&name, &DeleteParams::default()).await;
    }
    cleanup(world, operator, &pool).await;
}

/// A 5-field UTC cron for `minutes_from_now` minutes from now (negative: in the past), daily.
fn daily_cron_at(minutes_from_now: i64) -> String {
    use chrono::Timelike;
    let at = chrono::Utc::now() + chrono::Duration::minutes(minutes_from_now);
    format!("{} {} * * *", at.minute(), at.hour())
}

/// The first `DisruptionBlocked` event on NodePool `pool` whose note contains `needle`.
async fn pool_blocked_event(
    world: &World,
    pool: &str,
    needle: &str,
) -> k8s_openapi::api::events::v1::Event {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(world.client.clone());
    eventually_within(
        &format!("DisruptionBlocked on {pool} naming {needle:?}"),
        LONG,
        || async {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find(|e| {
                e.reason.as_deref() == Some("DisruptionBlocked")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(pool)
                    && e.note.as_deref().is_some_and(|n| n.contains(needle))
            })
        },
    )
    .await
}

/// NodeClaim `claim` is not being deleted after each of `passes` decision loops (2 s apart).
async fn stays_through_passes(world: &World, claim: &str, passes: usize, why: &str) {
    for _ in 0..passes {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let c = world.nodeclaims().get(claim).await.expect("NodeClaim kept");
        assert!(c.metadata.deletion_timestamp.is_none(), "{why}");
    }
}

#[tokio::test]
async fn a_scheduled_zero_budget_blocks_disruption_only_inside_its_window() {
    let Some(world) = World::start("dis-window", joins()).await else {
        return;
    };
    world.create_nodeclass(json!({})).await;
    let operator = Operator::start(&world).await;
    world.ready_nodeclass().await;
    // The window opened a minute ago and lasts two hours.
    let pool = nodepool(
        &world,
        json!({"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "2s",
               "budgets": [{"nodes": "0", "schedule": daily_cron_at(-1), "duration": "2h"}]}),
        json!({}),
    )
    .await;
    deployment(&world, "web", &pool, 1, "200m", json!({})).await;
    let claims = initialized_claims(&world, &pool, 1).await;
    bound_pods(&world, "web", 1).await;
    let claim = claims.iter().next().unwrap().clone();
    scale(&world, "web", 0).await;
    consolidatable(&world, &claims).await;

    // The empty node would go, but the budget reports the NodePool blocked instead.
    let blocked = pool_blocked_event(&world, &pool, "Empty").await;
    assert!(
        blocked.note.unwrap().contains("blocking budget"),
        "the event names the budget"
    );
    // Several decision loops (2 s apart) later, the node is still there.
    stays_through_passes(
        &world,
        &claim,
        5,
        "the empty node was disrupted inside the zero-budget window",
    )
    .await;

    // A schedule upstream's parser refuses (weekday 7) allows nothing, and the NodePool's
    // event says so, as a Warning naming the schedule.
    set_budgets(
        &world,
        &pool,
        json!([{"nodes": "0", "schedule": "0 0 * * 7", "duration": "1h"}]),
    )
    .await;
    let unreadable = pool_blocked_event(&world, &pool, "0 0 * * 7").await;
    assert_eq!(unreadable.type_.as_deref(), Some("Warning"));
    assert!(
        unreadable.note.unwrap().contains("day of week"),
        "the event says what is wrong"
    );
    // Later decision loops (2 s apart) still let nothing go.
    stays_through_passes(
        &world,
        &claim,
        3,
        "an unreadable budget let the empty node go",
    )
    .await;

    // The same budget scheduled twelve hours away is inactive: the empty node goes.
    set_budgets(
        &world,
        &pool,
        json!([{"nodes": "0", "schedule": daily_cron_at(12 * 60), "duration": "1h"}]),
    )
    .await;
    let nodeclaims = world.nodeclaims();
    eventually_within("the empty NodeClaim is deleted", LONG, || {
        let nodeclaims = nodeclaims.clone();
        let claim = claim.clone();
        async move { matches!(nodeclaims.get_opt(&claim).await, Ok(None)).then_some(()) }
    })
    .await;
    assert!(
        world.claims_of_pool(&pool).await.is_empty(),
        "no replacement for an empty node"
    );
    cleanup(world, operator, &pool).await;
}

/// A response body that fails once `cut` turns true: a watch the network dropped.
/// The replica's transport: Pod watches that a test can cut (and Pod reads refused from then
/// on, so the state stays unsynced) or silence (the open watch ends as at the server's
/// timeout, and Pod reads from then on are never answered), and NodeClaim status writes it can
/// hold.
#[derive(Clone)]
struct Partition {
    inner: kube::Client,
    pods_cut: watch::Sender<bool>,
    pods_silent: watch::Sender<bool>,
    hold_status: watch::Sender<bool>,
    status_held: Arc<std::sync::atomic::AtomicUsize>,
    pod_reads_refused: Arc<std::sync::atomic::AtomicUsize>,
    /// Unanswered Pod reads the replica gave up on (dropped).
    pod_reads_given_up: Arc<std::sync::atomic::AtomicUsize>,
}

impl Partition {
    fn new(inner: kube::Client) -> Partition {
        Partition {
            inner,
            pods_cut: watch::channel(false).0,
            pods_silent: watch::channel(false).0,
            hold_status: watch::channel(false).0,
            status_held: Default::default(),
            pod_reads_refused: Default::default(),
            pod_reads_given_up: Default::default(),
        }
    }
}

/// Counts a request given up on when the future holding it is dropped.
struct GivenUp(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for GivenUp {
    fn drop(&mut self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl tower_service::Service<http::Request<kube::client::Body>> for Partition {
    type Response = http::Response<harness::Steered>;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<kube::client::Body>) -> Self::Future {
        use std::sync::atomic::Ordering::SeqCst;
        let this = self.clone();
        Box::pin(async move {
            let path = request.uri().path().to_string();
            let pod_read = request.method() == http::Method::GET && path == "/api/v1/pods";
            if pod_read && *this.pods_cut.borrow() {
                this.pod_reads_refused.fetch_add(1, SeqCst);
                return Err("connection refused (the test's partition)".into());
            }
            if pod_read && *this.pods_silent.borrow() {
                let _given_up = GivenUp(this.pod_reads_given_up.clone());
                return futures::future::pending().await;
            }
            let status_write = request.method() == http::Method::PATCH
                && path.starts_with("/apis/karpenter.sh/v1/nodeclaims/")
                && path.ends_with("/status");
            if status_write && *this.hold_status.borrow() {
                this.status_held.fetch_add(1, SeqCst);
                let mut held = this.hold_status.subscribe();
                let _ = held.wait_for(|hold| !*hold).await;
            }
            let response = this.inner.send(request).await?;
            let mut cut = this.pods_cut.subscribe();
            let mut silent = this.pods_silent.subscribe();
            Ok(response.map(|inner| {
                let body = harness::Steered::new(inner);
                if !pod_read {
                    return body;
                }
                body.ended_by(async move {
                    tokio::select! {
                        _ = cut.wait_for(|cut| *cut) => harness::StreamEnd::Failed,
                        _ = silent.wait_for(|silent| *silent) => harness::StreamEnd::Clean,
                    }
                })
            }))
        })
    }
}

/// A replica behind a [`Partition`] and one empty, Consolidatable node whose NodePool's budget
/// is 0: the partition, the replica, the pool, the node's NodeClaim and the node.
async fn empty_node_behind_a_closed_budget(
    world: &World,
) -> (Partition, Operator, String, String, String) {
    world.create_nodeclass(json!({})).await;
    let partition = Partition::new(world.client.clone());
    let client = kube::Client::new(partition.clone(), world.namespace.clone());
    let operator = Operator::start_using(world, &[], client).await;
    world.ready_nodeclass().await;
    let (pool, claim) = one_web_node(world, json!({"budgets": [{"nodes": "0"}]})).await;
    let node = world.initialized_node(&claim).await.name_any();
    scale(world, "web", 0).await;
    eventually_within("the empty node Consolidatable", LONG, || async {
        let c = world.nodeclaims().get(&claim).await.ok()?;
        c.status?.conditions.is_true("Consolidatable").then_some(())
    })
    .await;
    (partition, operator, pool, claim, node)
}

/// An empty node waits for its budget (0), watched pass after pass. Then, while one pass is
/// under way (its NodeClaim status writes held), the Pod watch fails and Pods cannot be listed
/// again, a pod is bound to the node, and the budget opens. That pass's decision rests on a
/// Pod list that stopped syncing: it is not acted on, and no later pass decides until Pods
/// are listed again. The node stays, untainted.
#[tokio::test]
async fn a_decision_made_while_the_pod_watch_failed_is_not_acted_on() {
    use std::sync::atomic::Ordering::SeqCst;
    let Some(world) = World::start("dis-stale", joins()).await else {
        return;
    };
    let (partition, operator, pool, claim, node) = empty_node_behind_a_closed_budget(&world).await;
    // Watched empty (and its last pod event old) for longer than the validation delay.
    let quiet = std::time::Instant::now();
    eventually_within(
        "20 s of an empty node behind a closed budget",
        LONG,
        || async { (quiet.elapsed() >= Duration::from_secs(20)).then_some(()) },
    )
    .await;

    // One pass is held at a status write: the NodePool's template changes (drift to write)
    // and its budget opens.
    partition.hold_status.send_replace(true);
    Api::<NodePool>::all(world.client.clone())
        .patch(
            &pool,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {
                "template": {"metadata": {"labels": {"team": "green"}}},
                "disruption": {"budgets": [{"nodes": "1"}]}}})),
        )
        .await
        .unwrap();
    eventually_within("a NodeClaim status write held", LONG, || async {
        (partition.status_held.load(SeqCst) >= 1).then_some(())
    })
    .await;
    // Meanwhile the Pod watch fails (and Pods cannot be listed again), and a pod is bound to
    // the node.
    partition.pods_cut.send_replace(true);
    eventually(
        "the replica's Pod watch failed and its re-list refused",
        || async { (partition.pod_reads_refused.load(SeqCst) >= 1).then_some(()) },
    )
    .await;
    harness::bound_pod(&world, "arrived", &node, json!({"app": "arrived"})).await;
    partition.hold_status.send_replace(false);

    let released = std::time::Instant::now();
    eventually_within("40 s after the pass resumed", LONG, || async {
        (released.elapsed() >= Duration::from_secs(40)).then_some(())
    })
    .await;
    let kept = world.nodeclaims().get(&claim).await.unwrap();
    assert!(
        kept.metadata.deletion_timestamp.is_none(),
        "the node was disrupted from a Pod list that stopped syncing"
    );
    let tainted = world
        .nodes()
        .get(&node)
        .await
        .unwrap()
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .iter()
        .any(|t| t.key == "karpenter.sh/disrupted");
    assert!(!tainted, "the node was tainted from a stale Pod list");

    partition.pods_cut.send_replace(false);
    world
        .pods()
        .delete("arrived", &DeleteParams::default())
        .await
        .unwrap();
    cleanup(world, operator, &pool).await;
}

/// An empty node waits for its budget (0). Then the API server stops answering the replica's
/// Pod requests: the open watch ends (as kube's idle timeout ends a silent one) and the
/// re-watch is never answered. The replica gives that re-watch up, so the Pod kind is unsynced
/// (`karpenter_cluster_state_synced 0`) rather than quietly frozen; a pod bound to the node
/// meanwhile and an opened budget do not get the node disrupted.
#[tokio::test]
async fn a_pod_watch_that_stops_answering_stops_decisions() {
    use std::sync::atomic::Ordering::SeqCst;
    let Some(world) = World::start("dis-silent", joins()).await else {
        return;
    };
    let (partition, operator, pool, claim, node) = empty_node_behind_a_closed_budget(&world).await;

    partition.pods_silent.send_replace(true);
    eventually_within("an unanswered Pod re-watch given up", LONG, || async {
        (partition.pod_reads_given_up.load(SeqCst) >= 1).then_some(())
    })
    .await;
    eventually_within("cluster state reported unsynced", LONG, || async {
        operator
            .metrics
            .render()
            .contains("karpenter_cluster_state_synced 0.0")
            .then_some(())
    })
    .await;
    harness::bound_pod(&world, "arrived", &node, json!({"app": "arrived"})).await;
    Api::<NodePool>::all(world.client.clone())
        .patch(
            &pool,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"disruption": {"budgets": [{"nodes": "1"}]}}})),
        )
        .await
        .unwrap();
    let opened = std::time::Instant::now();
    eventually_within("40 s after the budget opened", LONG, || async {
        (opened.elapsed() >= Duration::from_secs(40)).then_some(())
    })
    .await;
    let kept = world.nodeclaims().get(&claim).await.unwrap();
    assert!(
        kept.metadata.deletion_timestamp.is_none(),
        "the node was disrupted while its Pod watch was not answered"
    );

    partition.pods_silent.send_replace(false);
    eventually_within("cluster state synced again", LONG, || async {
        operator
            .metrics
            .render()
            .contains("karpenter_cluster_state_synced 1.0")
            .then_some(())
    })
    .await;
    world
        .pods()
        .delete("arrived", &DeleteParams::default())
        .await
        .unwrap();
    cleanup(world, operator, &pool).await;
}
