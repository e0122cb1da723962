//! The controller killed with SIGKILL at each step of a launch and of a termination, on a real
//! control plane with the simulated cloud: the real binary runs as a child process, the sim
//! parks it at the named step (a held request, a blocked drain, a slow kubelet), the test
//! kills it there and starts a fresh one. Afterwards: no leaked VM, no duplicated VM, no
//! stuck finalizer.

#[path = "e2e/harness.rs"]
mod harness;
mod support;

use std::sync::Arc;
use std::time::Duration;

use harness::{
    World, bound_pod, eventually, eventually_within, free_port, gone, instances_of, joins, suffix,
    volume_attachment,
};
use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use karpenter_exoscale::apis::labels::{BOOTSTRAP_TOKEN_ANNOTATION, DISRUPTED_TAINT_KEY};
use karpenter_exoscale::apis::{ConditionStatus, ConditionsExt, NodeClaim};
use karpenter_exoscale::sim::kubelet::{Join, KubeletBehaviour};
use karpenter_exoscale::sim::{Fault, FaultAction, HoldGate};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;
use support::kube_proxy::{KubeProxy, list_of};
use tokio::process::Child;

/// Sends SIGKILL and reaps the process.
async fn sigkill(mut child: Child) {
    child.kill().await.expect("SIGKILL the controller");
}

/// A world with a Ready NodeClass and a controller process running.
async fn started(test: &str, policy: harness::KubeletPolicy) -> Option<(World, Child)> {
    World::started(test, policy, "first").await
}

fn hold(after_commit: bool) -> (HoldGate, FaultAction) {
    let gate = HoldGate::new();
    let action = FaultAction::Hold {
        after_commit,
        only_status: None,
        gate: gate.clone(),
    };
    (gate, action)
}

async fn parked(gate: &HoldGate, what: &str) {
    eventually(what, || async { (gate.held() >= 1).then_some(()) }).await;
}

/// Through GC's grace period (5 s) and interval (2 s), and more: five more collection passes.
async fn gc_passes(world: &World) {
    let lists = world.sim.call_count("list-instances");
    eventually_within("five more GC passes", Duration::from_secs(120), || async {
        (world.sim.call_count("list-instances") >= lists + 5).then_some(())
    })
    .await;
}

/// After a launch interrupted by a kill and resumed by a fresh controller: exactly one VM for
/// the NodeClaim, the one its Node runs on; then deleting the NodeClaim leaves nothing behind.
async fn launch_resumed_cleanly(world: &World, claim: &str) {
    let node = world.initialized_node(claim).await;
    gc_passes(world).await;
    assert_eq!(instances_of(world, claim), 1, "duplicated or lost VM");
    assert_eq!(world.live_instances().len(), 1, "a leaked VM");
    let provider_id = node.spec.as_ref().and_then(|s| s.provider_id.clone());
    assert_eq!(
        provider_id.unwrap_or_default(),
        format!("exoscale://{}", world.live_instances()[0].id)
    );
    terminated_cleanly(world, claim, &node.name_any()).await;
}

/// The NodeClaim and its Node are gone (no finalizer stuck) and so is every VM.
async fn terminated_cleanly(world: &World, claim: &str, node: &str) {
    world
        .nodeclaims()
        .delete(claim, &DeleteParams::default())
        .await
        .ok();
    gone(&world.nodeclaims(), claim, "NodeClaim").await;
    gone(&world.nodes(), node, "Node").await;
    eventually("no VM left", || async {
        world.live_instances().is_empty().then_some(())
    })
    .await;
    let claims = world
        .nodeclaims()
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(
        claims.items.is_empty(),
        "NodeClaims left: {:?}",
        claims.items
    );
}

// ---- launch ----------------------------------------------------------------------------------

/// Killed after the NodeClaim exists, while its create request has not been acted on.
#[tokio::test]
async fn killed_after_nodeclaim_create() {
    let Some((world, controller)) = started("crash-claim", joins()).await else {
        return;
    };
    let (gate, action) = hold(false);
    world.sim.inject(Fault::on("create-instance", action));
    let claim = format!("crash-claim-{}", suffix(&world));
    world.create_nodeclaim(&claim, json!({})).await;
    parked(&gate, "the create request parked before it acts").await;
    sigkill(controller).await;
    assert!(world.live_instances().is_empty());
    assert_eq!(
        token_secrets_of(&world, &claim).await,
        1,
        "the first launch's token exists, its name recorded nowhere"
    );
    let _restarted = world.spawn_controller("second");
    launch_resumed_cleanly(&world, &claim).await;
    // The second launch's token was recorded and deleted once its Node registered; the first
    // one's goes with the NodeClaim it is owned by (Kubernetes' garbage collector).
    eventually(
        "no bootstrap token Secret left for the NodeClaim",
        || async { (token_secrets_of(&world, &claim).await == 0).then_some(()) },
    )
    .await;
    world.finish().await;
}

/// How many bootstrap-token Secrets exist for `claim` (read as an admin: the controller itself
/// may not list Secrets).
async fn token_secrets_of(world: &World, claim: &str) -> usize {
    let secrets: Api<Secret> = Api::namespaced(world.client.clone(), "kube-system");
    secrets
        .list(&ListParams::default().fields("type=bootstrap.kubernetes.io/token"))
        .await
        .expect("list token Secrets")
        .items
        .iter()
        .filter(|s| {
            s.annotations()
                .get(BOOTSTRAP_TOKEN_ANNOTATION)
                .map(String::as_str)
                == Some(claim)
        })
        .count()
}

/// Killed after the create was committed, before its answer arrived.
#[tokio::test]
async fn killed_after_post() {
    let Some((world, controller)) = started("crash-post", joins()).await else {
        return;
    };
    let (gate, action) = hold(true);
    world.sim.inject(Fault::on("create-instance", action));
    let claim = format!("crash-post-{}", suffix(&world));
    world.create_nodeclaim(&claim, json!({})).await;
    parked(&gate, "the committed create's answer withheld").await;
    sigkill(controller).await;
    assert_eq!(world.live_instances().len(), 1, "the create was committed");
    let _restarted = world.spawn_controller("second");
    launch_resumed_cleanly(&world, &claim).await;
    // The held request is recorded only once answered: every create sent is held or recorded.
    let sent = world.sim.call_count("create-instance") as u32 + gate.held();
    assert_eq!(sent, 1, "created twice");
    world.finish().await;
}

/// Killed after the create was committed, before its answer arrived; then the NodeClaim is
/// deleted. It has no provider ID, yet its instance exists: the new controller finds it by its
/// NodeClaim label and deletes it before the finalizer goes. (Instance GC, which would collect
/// it too, is kept out of the way by an hour's grace.)
#[tokio::test]
async fn killed_after_post_then_deleted() {
    let Some(mut world) = World::start("crash-post-del", joins()).await else {
        return;
    };
    world
        .env
        .insert("INSTANCE_GC_GRACE_PERIOD".into(), "1h".into());
    world.create_nodeclass(json!({})).await;
    let controller = world.spawn_controller("first");
    world.ready_nodeclass().await;
    let (gate, action) = hold(true);
    world.sim.inject(Fault::on("create-instance", action));
    let claim = format!("crash-post-del-{}", suffix(&world));
    world.create_nodeclaim(&claim, json!({})).await;
    parked(&gate, "the committed create's answer withheld").await;
    sigkill(controller).await;
    assert_eq!(world.live_instances().len(), 1, "the create was committed");
    world
        .nodeclaims()
        .delete(&claim, &DeleteParams::default())
        .await
        .unwrap();
    let pending = world.nodeclaims().get(&claim).await.unwrap();
    assert!(pending.status.and_then(|s| s.provider_id).is_none());
    let _restarted = world.spawn_controller("second");
    gone(&world.nodeclaims(), &claim, "NodeClaim").await;
    assert!(
        world.live_instances().is_empty(),
        "the finalizer went while the instance lived"
    );
    world.finish().await;
}

/// Killed after the create answered, before the provider ID was written to the NodeClaim.
/// A launch without private networks writes the provider ID straight from the create's
/// answer; one with them reads the new instance first (to attach what it lacks), and that
/// read is held here.
#[tokio::test]
async fn killed_before_the_provider_id_write() {
    let Some(world) = World::start("crash-pid", joins()).await else {
        return;
    };
    world
        .create_nodeclass(json!({"privateNetworkSelectorTerms": [{"name": "karpenter-private"}]}))
        .await;
    let controller = world.spawn_controller("first");
    world.ready_nodeclass().await;
    let (gate, action) = hold(false);
    world.sim.inject(Fault::on("get-instance", action));
    let claim = format!("crash-pid-{}", suffix(&world));
    world.create_nodeclaim(&claim, json!({})).await;
    parked(&gate, "the launch parked after its create").await;
    sigkill(controller).await;
    let written = world.nodeclaims().get(&claim).await.unwrap();
    assert!(
        written.status.and_then(|s| s.provider_id).is_none(),
        "the provider ID was written before the kill"
    );
    assert_eq!(world.live_instances().len(), 1);
    let _restarted = world.spawn_controller("second");
    launch_resumed_cleanly(&world, &claim).await;
    assert_eq!(world.sim.call_count("create-instance"), 1, "created twice");
    world.finish().await;
}

/// Killed after the provider ID was written, before the Node registered (its kubelet joins
/// only 15 s after the instance runs).
#[tokio::test]
async fn killed_before_registration() {
    let slow: harness::KubeletPolicy = Arc::new(|_: &str| KubeletBehaviour {
        join: Join::After(Duration::from_secs(15)),
        ..KubeletBehaviour::default()
    });
    let Some((world, controller)) = started("crash-reg", slow).await else {
        return;
    };
    let claim = format!("crash-reg-{}", suffix(&world));
    world.create_nodeclaim(&claim, json!({})).await;
    eventually("the provider ID written", || async {
        let c = world.nodeclaims().get(&claim).await.ok()?;
        c.status.and_then(|s| s.provider_id)
    })
    .await;
    sigkill(controller).await;
    let registered = world
        .nodeclaims()
        .get(&claim)
        .await
        .unwrap()
        .status
        .is_some_and(|s| s.conditions.is_true("Registered"));
    assert!(!registered, "the Node registered before the kill");
    let _restarted = world.spawn_controller("second");
    launch_resumed_cleanly(&world, &claim).await;
    assert_eq!(world.sim.call_count("create-instance"), 1, "created twice");
    world.finish().await;
}

/// Killed after the launch, before the Node registered; the Node joins while no controller
/// runs, and the new one starts past the registration TTL (20 s) with its Node list held back.
/// The NodeClaim is not "unregistered" until the Nodes are listed: nothing is deleted, and
/// once they are, it registers.
#[tokio::test]
async fn restarted_past_the_registration_ttl_before_its_node_list() {
    let slow: harness::KubeletPolicy = Arc::new(|_: &str| KubeletBehaviour {
        join: Join::After(Duration::from_secs(5)),
        ..KubeletBehaviour::default()
    });
    let Some((world, controller)) = started("late-reg", slow).await else {
        return;
    };
    let claim = format!("late-reg-{}", suffix(&world));
    world.create_nodeclaim(&claim, json!({})).await;
    let provider_id = eventually("the provider ID written", || async {
        let c = world.nodeclaims().get(&claim).await.ok()?;
        c.status.and_then(|s| s.provider_id)
    })
    .await;
    let launched = std::time::Instant::now();
    sigkill(controller).await;
    let registered = |c: NodeClaim| c.status.is_some_and(|s| s.conditions.is_true("Registered"));
    let written = world.nodeclaims().get(&claim).await.unwrap();
    assert!(!registered(written), "the Node registered before the kill");
    eventually("the Node joined with no controller running", || async {
        let nodes = world.nodes().list(&ListParams::default()).await.ok()?;
        nodes
            .items
            .into_iter()
            .find(|n| n.spec.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(&provider_id))
    })
    .await;
    eventually_within(
        "past the registration TTL",
        Duration::from_secs(60),
        || async { (launched.elapsed() > Duration::from_secs(25)).then_some(()) },
    )
    .await;

    let plane = support::shared().expect("control plane");
    let proxy = KubeProxy::start(
        &plane.apiserver_url,
        &plane.ca_cert_pem,
        list_of("/api/v1/nodes"),
    )
    .await;
    let kubeconfig = proxy.kubeconfig(&plane.kubeconfig_file);
    let _restarted = world.spawn_controller_with("second", free_port(), &kubeconfig);
    let waiting = awaiting_cluster_state(&world, &claim).await;
    assert!(waiting.note.unwrap_or_default().contains("Node list"));
    assert!(proxy.held() >= 1, "the Node list was not held");
    let waiting = world.nodeclaims().get(&claim).await.unwrap();
    assert!(
        waiting.metadata.deletion_timestamp.is_none(),
        "deleted as unregistered before the Nodes were listed"
    );
    assert_eq!(world.sim.call_count("delete-instance"), 0);
    proxy.release();
    launch_resumed_cleanly(&world, &claim).await;
    assert_eq!(world.sim.call_count("create-instance"), 1, "created twice");
    world.finish().await;
}

/// The real binary electing a leader with its Kubernetes requests held to 1 a second
/// (`KUBE_CLIENT_QPS=1`): ten launches queue far more than ten seconds of requests, past the
/// renew deadline. The Lease's renewals stay outside that budget, so the replica keeps leading
/// through the burst (it exited with lost leadership when they queued with the rest).
#[tokio::test]
async fn a_burst_of_requests_behind_the_rate_limit_does_not_cost_the_lease() {
    let Some(mut world) = World::start("lease-load", joins()).await else {
        return;
    };
    for (key, value) in [
        ("DISABLE_LEADER_ELECTION", "false"),
        ("KUBE_CLIENT_QPS", "1"),
        ("KUBE_CLIENT_BURST", "1"),
    ] {
        world.env.insert(key.into(), value.into());
    }
    world.create_nodeclass(json!({})).await;
    let mut controller = world.spawn_controller("first");
    world.await_leader("first").await;
    world.ready_nodeclass().await;
    let claims: Vec<String> = (0..10)
        .map(|i| format!("lease-load-{}-{i}", suffix(&world)))
        .collect();
    for claim in &claims {
        world.create_nodeclaim(claim, json!({})).await;
    }
    eventually_within(
        "ten NodeClaims launched, 1 request a second",
        Duration::from_secs(400),
        || async {
            let list = world.nodeclaims().list(&ListParams::default()).await.ok()?;
            let launched = list
                .items
                .iter()
                .filter(|c| claims.contains(&c.name_any()))
                .filter(|c| {
                    c.status
                        .as_ref()
                        .is_some_and(|s| s.conditions.is_true("Launched"))
                })
                .count();
            (launched == claims.len()).then_some(())
        },
    )
    .await;
    assert!(
        controller
            .try_wait()
            .expect("the controller's status")
            .is_none(),
        "the controller exited (lost its Lease)"
    );
    assert_eq!(world.lease_holder().await.as_deref(), Some("first"));
    sigkill(controller).await;
    world.finish().await;
}

// ---- termination -----------------------------------------------------------------------------

/// A launched NodeClaim and its Node.
async fn running_node(world: &World, claim: &str) -> Node {
    world.create_nodeclaim(claim, json!({})).await;
    world.initialized_node(claim).await
}

/// Killed after the Node was tainted for termination, while a PodDisruptionBudget blocks the
/// drain; the new controller finishes once the budget goes.
#[tokio::test]
async fn killed_after_the_disrupted_taint() {
    let Some((world, controller)) = started("crash-taint", joins()).await else {
        return;
    };
    let claim = format!("crash-taint-{}", suffix(&world));
    let node = running_node(&world, &claim).await.name_any();
    bound_pod(&world, "guarded", &node, json!({"app": "guarded"})).await;
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(world.client.clone(), &world.namespace);
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "guard"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "guarded"}}}
    }))
    .unwrap();
    pdbs.create(&PostParams::default(), &pdb).await.unwrap();
    world
        .nodeclaims()
        .delete(&claim, &DeleteParams::default())
        .await
        .unwrap();
    eventually("the disrupted taint", || async {
        let n = world.nodes().get(&node).await.ok()?;
        n.spec?
            .taints?
            .iter()
            .any(|t| t.key == DISRUPTED_TAINT_KEY)
            .then_some(())
    })
    .await;
    sigkill(controller).await;
    assert_eq!(world.live_instances().len(), 1, "the drain was blocked");
    let _restarted = world.spawn_controller("second");
    pdbs.delete("guard", &DeleteParams::default())
        .await
        .unwrap();
    terminated_cleanly(&world, &claim, &node).await;
    world.finish().await;
}

/// A NodeClaim being deleted whose drain a PodDisruptionBudget blocks, its controller killed.
async fn blocked_drain(world: &World, claim: &str) -> (String, Api<PodDisruptionBudget>) {
    let node = running_node(world, claim).await.name_any();
    bound_pod(world, "guarded", &node, json!({"app": "guarded"})).await;
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(world.client.clone(), &world.namespace);
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "guard"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "guarded"}}}
    }))
    .unwrap();
    pdbs.create(&PostParams::default(), &pdb).await.unwrap();
    world
        .nodeclaims()
        .delete(claim, &DeleteParams::default())
        .await
        .unwrap();
    eventually("the drain started", || async {
        let c = world.nodeclaims().get(claim).await.ok()?;
        c.status?
            .conditions
            .get_condition("Drained")
            .filter(|d| d.status == ConditionStatus::Unknown)
            .map(|_| ())
    })
    .await;
    (node, pdbs)
}

/// Events with `reason` about the cluster-scoped object `name`.
async fn events_of(world: &World, name: &str, reason: &str) -> Vec<Event> {
    let events: Api<Event> = Api::namespaced(world.client.clone(), "default");
    let list = events.list(&ListParams::default()).await.unwrap();
    list.items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
        })
        .collect()
}

/// The `AwaitingClusterState` event on the object named `name`.
async fn awaiting_cluster_state(world: &World, name: &str) -> Event {
    eventually("an AwaitingClusterState event", || async {
        events_of(world, name, "AwaitingClusterState").await.pop()
    })
    .await
}

/// The world's controller killed during a blocked drain of `claim`'s node and restarted
/// behind a proxy that holds the LIST of `held`; waits until the new controller says it is
/// waiting (an `AwaitingClusterState` event about `waiting_on`, naming `what`). Returns the
/// proxy (to release), the new controller, the node and the PDBs.
async fn restarted_behind_a_held_list(
    world: &World,
    controller: Child,
    claim: &str,
    held: &'static str,
    what: &str,
) -> (KubeProxy, Child, String, Api<PodDisruptionBudget>) {
    let (node, pdbs) = blocked_drain(world, claim).await;
    sigkill(controller).await;
    let plane = support::shared().expect("control plane");
    let proxy = KubeProxy::start(&plane.apiserver_url, &plane.ca_cert_pem, list_of(held)).await;
    let kubeconfig = proxy.kubeconfig(&plane.kubeconfig_file);
    let restarted = world.spawn_controller_with("second", free_port(), &kubeconfig);
    let waiting_on = if held.ends_with("pods") { &node } else { claim };
    let waiting = awaiting_cluster_state(world, waiting_on).await;
    assert!(waiting.note.unwrap_or_default().contains(what));
    assert!(proxy.held() >= 1, "the {what} was not held");
    assert_eq!(world.live_instances().len(), 1, "deleted before the {what}");
    (proxy, restarted, node, pdbs)
}

/// Restarted during a blocked drain, the new controller's Pod list held back (its Nodes and
/// NodeClaims listed): a node whose pods are not known yet is not an empty one. Nothing is
/// marked drained or deleted until the Pods are listed; then the PDB holds the drain as before.
#[tokio::test]
async fn restarted_before_its_pod_list() {
    let Some((world, controller)) = started("late-pods", joins()).await else {
        return;
    };
    let claim = format!("late-pods-{}", suffix(&world));
    let (proxy, _restarted, node, pdbs) =
        restarted_behind_a_held_list(&world, controller, &claim, "/api/v1/pods", "Pod list").await;
    let drained = world.nodeclaims().get(&claim).await.unwrap().status;
    assert!(!drained.is_some_and(|s| s.conditions.is_true("Drained")));
    proxy.release();
    // The guarded pod is seen now: the new controller's eviction is refused too.
    eventually("the new controller's eviction refused", || async {
        events_of(&world, &node, "FailedDraining")
            .await
            .into_iter()
            .find(|e| e.reporting_instance.as_deref() == Some("second"))
    })
    .await;
    assert_eq!(world.live_instances().len(), 1, "the PDB was ignored");
    pdbs.delete("guard", &DeleteParams::default())
        .await
        .unwrap();
    terminated_cleanly(&world, &claim, &node).await;
    world.finish().await;
}

/// Restarted during a blocked drain, the new controller's Node list held back: the NodeClaim's
/// teardown finds no Node in its index, which does not mean its Node is gone. The instance
/// stays until the Nodes are listed and the Node is drained.
#[tokio::test]
async fn restarted_before_its_node_list() {
    let Some((world, controller)) = started("late-nodes", joins()).await else {
        return;
    };
    let claim = format!("late-nodes-{}", suffix(&world));
    let (proxy, _restarted, node, pdbs) =
        restarted_behind_a_held_list(&world, controller, &claim, "/api/v1/nodes", "Node list")
            .await;
    assert_eq!(world.sim.call_count("delete-instance"), 0);
    proxy.release();
    pdbs.delete("guard", &DeleteParams::default())
        .await
        .unwrap();
    terminated_cleanly(&world, &claim, &node).await;
    world.finish().await;
}

/// Killed after the drain, while termination waits for a VolumeAttachment to go.
#[tokio::test]
async fn killed_after_the_drain() {
    let Some((world, controller)) = started("crash-drain", joins()).await else {
        return;
    };
    let claim = format!("crash-drain-{}", suffix(&world));
    let node = running_node(&world, &claim).await.name_any();
    let va_name = format!("va-{}", suffix(&world));
    let attachments = volume_attachment(&world, &va_name, &node).await;
    world
        .nodeclaims()
        .delete(&claim, &DeleteParams::default())
        .await
        .unwrap();
    eventually("drained, waiting for volumes", || async {
        let c = world.nodeclaims().get_opt(&claim).await.ok()??;
        let status = c.status?;
        (status.conditions.is_true("Drained")
            && status.conditions.get_condition("VolumesDetached").is_some())
        .then_some(())
    })
    .await;
    sigkill(controller).await;
    assert_eq!(world.live_instances().len(), 1);
    let _restarted = world.spawn_controller("second");
    attachments
        .delete(&va_name, &DeleteParams::default())
        .await
        .unwrap();
    terminated_cleanly(&world, &claim, &node).await;
    world.finish().await;
}

/// Killed after the instance delete was committed, before its answer arrived.
#[tokio::test]
async fn killed_after_the_cloud_delete() {
    let Some((world, controller)) = started("crash-delete", joins()).await else {
        return;
    };
    let claim = format!("crash-delete-{}", suffix(&world));
    let node = running_node(&world, &claim).await.name_any();
    let (gate, action) = hold(true);
    world.sim.inject(Fault::on("delete-instance", action));
    world
        .nodeclaims()
        .delete(&claim, &DeleteParams::default())
        .await
        .unwrap();
    parked(&gate, "the committed delete's answer withheld").await;
    sigkill(controller).await;
    let _restarted = world.spawn_controller("second");
    terminated_cleanly(&world, &claim, &node).await;
    world.finish().await;
}

/// Killed after the instance is gone, before the finalizer came off: the read that tells the
/// controller the instance is gone (a 404) is held.
#[tokio::test]
async fn killed_before_finalizer_removal() {
    let Some((world, controller)) = started("crash-final", joins()).await else {
        return;
    };
    let claim = format!("crash-final-{}", suffix(&world));
    let node = running_node(&world, &claim).await.name_any();
    let gate = HoldGate::new();
    world.sim.inject(
        Fault::on(
            "get-instance",
            FaultAction::Hold {
                after_commit: true,
                only_status: Some(404),
                gate: gate.clone(),
            },
        )
        .always(),
    );
    world
        .nodeclaims()
        .delete(&claim, &DeleteParams::default())
        .await
        .unwrap();
    parked(&gate, "the 'instance gone' answer withheld").await;
    sigkill(controller).await;
    let stuck: NodeClaim = world.nodeclaims().get(&claim).await.unwrap();
    assert!(
        !stuck.finalizers().is_empty(),
        "the finalizer came off before the kill"
    );
    assert!(world.live_instances().is_empty(), "the instance is gone");
    gate.release();
    let _restarted = world.spawn_controller("second");
    terminated_cleanly(&world, &claim, &node).await;
    world.finish().await;
}

/// Fault: a NodeClaim is deleted between its launch and the status write that records its
/// instance (the write is refused, 409), and the instance list does not show the new VM (as
/// just after a create). Teardown deletes the instance this process launched, by the ID its
/// launch remembers, rather than conclude from the list that none exists, which would let the
/// finalizer go while the VM boots.
#[tokio::test]
async fn a_nodeclaim_deleted_before_its_instance_was_recorded_still_has_it_deleted() {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    let never_joins: harness::KubeletPolicy = Arc::new(|_: &str| KubeletBehaviour {
        join: Join::Never,
        ..KubeletBehaviour::default()
    });
    let Some(world) = World::start("e2e-unrecorded", never_joins).await else {
        return;
    };
    world.create_nodeclass(json!({})).await;
    let claim = format!("unrecorded-{}", suffix(&world));
    let deleted = Arc::new(AtomicBool::new(false));
    let client = harness::intercepted(world.client.clone(), {
        let (claim, deleted) = (claim.clone(), deleted.clone());
        move |inner: kube::Client, request: harness::Request| {
            let (claim, deleted) = (claim.clone(), deleted.clone());
            async move {
                let status_write = request.method() == http::Method::PATCH
                    && request.uri().path()
                        == format!("/apis/karpenter.sh/v1/nodeclaims/{claim}/status");
                if status_write && !deleted.swap(true, SeqCst) {
                    let claims: Api<NodeClaim> = Api::all(inner.clone());
                    claims.delete(&claim, &DeleteParams::default()).await?;
                }
                inner.send(request).await.map_err(Into::into)
            }
        }
    });
    world.sim.inject(
        Fault::on(
            "list-instances",
            FaultAction::Status {
                status: 200,
                body: r#"{"instances":[]}"#.into(),
            },
        )
        .always(),
    );
    world.start_replica_with("a", client).await;
    world.ready_nodeclass().await;
    world.create_nodeclaim(&claim, json!({})).await;
    gone(&world.nodeclaims(), &claim, "NodeClaim").await;
    assert!(
        deleted.load(SeqCst),
        "deleted while its status write was on its way"
    );
    assert_eq!(world.sim.call_count("create-instance"), 1, "launched once");
    eventually("the launched instance deleted", || async {
        (instances_of(&world, &claim) == 0).then_some(())
    })
    .await;
    world.finish().await;
}

/// A NodeClaim whose provider ID someone overwrote with one that names no Exoscale instance:
/// its teardown cannot delete anything, so the finalizer stays, and the NodeClaim says why
/// in a Warning event (not only the log). Once the ID is mended, teardown completes.
#[tokio::test]
async fn a_nodeclaim_with_a_mangled_provider_id_says_why_its_finalizer_stays() {
    let never_joins: harness::KubeletPolicy = Arc::new(|_: &str| KubeletBehaviour {
        join: Join::Never,
        ..KubeletBehaviour::default()
    });
    let Some(world) = World::start("e2e-mangled", never_joins).await else {
        return;
    };
    world.create_nodeclass(json!({})).await;
    world.start_replica("a").await;
    world.ready_nodeclass().await;
    let claim = format!("mangled-{}", suffix(&world));
    world.create_nodeclaim(&claim, json!({})).await;
    let claims = world.nodeclaims();
    let launched = eventually("the launch recorded", || async {
        let c = claims.get(&claim).await.ok()?;
        c.status
            .and_then(|s| s.provider_id)
            .filter(|p| !p.is_empty())
    })
    .await;
    let status = |pid: &str| kube::api::Patch::Merge(json!({"status": {"providerID": pid}}));
    let params = kube::api::PatchParams::default();
    claims
        .patch_status(&claim, &params, &status("exoscale://instance-123"))
        .await
        .expect("provider ID overwritten");
    claims
        .delete(&claim, &DeleteParams::default())
        .await
        .unwrap();
    let event = eventually("an InstanceTerminationFailed event", || async {
        events_of(&world, &claim, "InstanceTerminationFailed")
            .await
            .pop()
    })
    .await;
    let note = event.note.unwrap_or_default();
    assert!(note.contains("instance-123"), "{note}");
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let held = claims.get(&claim).await.expect("the NodeClaim stays");
    assert!(
        held.finalizers()
            .iter()
            .any(|f| f == "karpenter.sh/termination")
    );
    assert_eq!(
        world.live_instances().len(),
        1,
        "nothing deleted by a guess"
    );

    claims
        .patch_status(&claim, &params, &status(&launched))
        .await
        .expect("provider ID mended");
    gone(&claims, &claim, "NodeClaim").await;
    eventually("the instance deleted", || async {
        world.live_instances().is_empty().then_some(())
    })
    .await;
    world.finish().await;
}
