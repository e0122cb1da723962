//! The part of a kubelet that runs pods and keeps its node alive, for the Nodes of the
//! simulated cloud (provider ID `exoscale://`): a pod bound to one is reported Running and
//! Ready with running container statuses; a pod being deleted there is confirmed gone (the
//! kubelet's final delete, without which evicted pods stay Terminating); and each such Node's
//! Lease in `kube-node-lease` is renewed, so kube-controller-manager's node-lifecycle
//! controller sees the nodes alive. Used by the sandbox and the walk-through test; the e2e
//! worlds keep their narrower kubelet so their pods stay where the tests put them.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

/// What the simulated kubelet does with a pod it sees.
#[derive(Debug, PartialEq)]
pub enum PodAction {
    /// Not on a simulated node, finished, or already running: nothing.
    Nothing,
    /// Being deleted on a simulated node: confirm the deletion.
    ConfirmDeletion,
    /// Bound to a simulated node and not running yet: this status (a merge patch).
    Start(Value),
}

/// Pods handled at once; each is one or two API calls.
const CONCURRENCY: usize = 16;
/// How often Node Leases are renewed (the kubelet's default, a quarter of their 40 s).
pub const LEASE_RENEWAL: Duration = Duration::from_secs(10);
const LEASE_DURATION_SECONDS: i32 = 40;
/// A pod can be seen bound before its Node reaches the Node cache; it is looked at again.
const NODE_CACHE_RETRIES: u32 = 40;

/// True for a Node the simulated cloud runs.
pub fn is_simulated(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .is_some_and(|id| id.starts_with("exoscale://"))
}

/// Decides what the kubelet of a simulated node does with `pod` at `now`. `on_simulated_node`
/// says whether the pod's `spec.nodeName` is a simulated Node.
pub fn pod_action(pod: &Pod, on_simulated_node: bool, now: Timestamp) -> PodAction {
    let bound = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_ref())
        .is_some();
    if !bound || !on_simulated_node {
        return PodAction::Nothing;
    }
    if pod.metadata.deletion_timestamp.is_some() {
        // A grace period of 0 is the confirmation itself (ours, on its way out): confirming
        // again would be a second DELETE per pod, answered 404.
        if pod.metadata.deletion_grace_period_seconds == Some(0) {
            return PodAction::Nothing;
        }
        return PodAction::ConfirmDeletion;
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Running" | "Succeeded" | "Failed")) {
        return PodAction::Nothing;
    }
    PodAction::Start(running_status(pod, now))
}

/// The status a kubelet reports once every container of `pod` runs and is ready.
pub fn running_status(pod: &Pod, now: Timestamp) -> Value {
    let now = now.to_string();
    let condition = |kind: &str| json!({"type": kind, "status": "True", "lastTransitionTime": now});
    let containers: Vec<Value> = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|c| {
            json!({
                "name": c.name,
                "image": c.image.clone().unwrap_or_default(),
                "imageID": "",
                "containerID": format!("sim://{}/{}", pod.uid().unwrap_or_default(), c.name),
                "ready": true,
                "started": true,
                "restartCount": 0,
                "state": {"running": {"startedAt": now}},
            })
        })
        .collect();
    json!({"status": {
        "phase": "Running",
        "startTime": now,
        "conditions": [
            condition("PodReadyToStartContainers"),
            condition("Initialized"),
            condition("ContainersReady"),
            condition("Ready"),
            condition("PodScheduled"),
        ],
        "containerStatuses": containers,
    }})
}

/// The Lease a kubelet holds for its Node, renewed at `now` (server-side apply body).
pub fn node_lease(node: &Node, now: Timestamp) -> Value {
    let name = node.name_any();
    json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": name,
            "namespace": "kube-node-lease",
            // The garbage collector removes the Lease with its Node, as for a real kubelet.
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "Node", "name": name,
                "uid": node.uid().unwrap_or_default(),
            }],
        },
        "spec": {
            "holderIdentity": name,
            "leaseDurationSeconds": LEASE_DURATION_SECONDS,
            "renewTime": format!("{}", now.strftime("%Y-%m-%dT%H:%M:%S%.6fZ")),
        },
    })
}

/// Runs the pods of every simulated Node and renews their Leases, until the task is aborted.
pub fn run(client: Client) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let (nodes, writer) = reflector::store();
        let node_stream = reflector::reflector(
            writer,
            watcher(Api::<Node>::all(client.clone()), watcher::Config::default()),
        )
        .default_backoff()
        .touched_objects()
        .for_each(|_| async {});
        tokio::join!(
            node_stream,
            run_pods(client.clone(), nodes.clone()),
            renew_leases(client, nodes)
        );
    })
}

async fn run_pods(client: Client, nodes: Store<Node>) {
    let pods = watcher(Api::<Pod>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .applied_objects();
    pods.for_each_concurrent(CONCURRENCY, |pod| {
        let client = client.clone();
        let nodes = nodes.clone();
        async move {
            let Ok(pod) = pod else { return };
            handle_pod(&client, &nodes, &pod).await;
        }
    })
    .await;
}

async fn handle_pod(client: &Client, nodes: &Store<Node>, pod: &Pod) {
    let Some(node_name) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
        return;
    };
    let mut on_simulated_node = false;
    for _ in 0..NODE_CACHE_RETRIES {
        if let Some(node) = nodes.get(&reflector::ObjectRef::new(&node_name)) {
            on_simulated_node = is_simulated(&node);
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
    let name = pod.name_any();
    let outcome = match pod_action(pod, on_simulated_node, Timestamp::now()) {
        PodAction::Nothing => return,
        PodAction::ConfirmDeletion => {
            let params = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: pod.uid(),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            api.delete(&name, &params).await.map(|_| ())
        }
        PodAction::Start(status) => api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .map(|_| ()),
    };
    match outcome {
        Ok(()) => {}
        // Gone or changed meanwhile: the watch brings the next state.
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
        Err(error) => {
            tracing::warn!(pod = %name, %error, "simulated kubelet could not update a pod")
        }
    }
}

async fn renew_leases(client: Client, nodes: Store<Node>) {
    let leases: Api<Lease> = Api::namespaced(client, "kube-node-lease");
    let params = PatchParams::apply("sim-kubelet").force();
    loop {
        let now = Timestamp::now();
        let simulated: Vec<_> = nodes
            .state()
            .into_iter()
            .filter(|n| is_simulated(n) && n.metadata.deletion_timestamp.is_none())
            .collect();
        futures::stream::iter(simulated)
            .for_each_concurrent(CONCURRENCY, |node| {
                let leases = leases.clone();
                let params = params.clone();
                async move {
                    let lease = node_lease(&node, now);
                    if let Err(error) = leases
                        .patch(&node.name_any(), &params, &Patch::Apply(&lease))
                        .await
                    {
                        tracing::warn!(node = %node.name_any(), %error, "simulated kubelet could not renew its Lease");
                    }
                }
            })
            .await;
        tokio::time::sleep(LEASE_RENEWAL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(value: Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    fn at() -> Timestamp {
        Timestamp::from_second(1_780_000_000).unwrap()
    }

    #[test]
    fn a_bound_pod_on_a_simulated_node_starts_with_every_container_ready() {
        let p = pod(json!({
            "metadata": {"name": "web-1", "namespace": "default", "uid": "u1"},
            "spec": {"nodeName": "n1", "containers": [
                {"name": "web", "image": "nginx:1.27"}, {"name": "sidecar", "image": "envoy"}]},
            "status": {"phase": "Pending"}
        }));
        let PodAction::Start(status) = pod_action(&p, true, at()) else {
            panic!("expected the pod to start");
        };
        let patched: Pod = {
            let mut merged = serde_json::to_value(&p).unwrap();
            merged["status"] = status["status"].clone();
            serde_json::from_value(merged).unwrap()
        };
        let st = patched.status.unwrap();
        assert_eq!(st.phase.as_deref(), Some("Running"));
        let ready = st.conditions.unwrap();
        assert!(
            ready
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        );
        let containers = st.container_statuses.unwrap();
        assert_eq!(containers.len(), 2);
        assert!(
            containers
                .iter()
                .all(|c| c.ready && c.state.as_ref().unwrap().running.is_some())
        );
        assert_eq!(containers[0].container_id.as_deref(), Some("sim://u1/web"));
    }

    #[test]
    fn only_pods_on_simulated_nodes_are_touched_and_deletions_are_confirmed() {
        let pending = pod(json!({"metadata": {"name": "p"}, "spec": {"containers": []}}));
        assert_eq!(pod_action(&pending, true, at()), PodAction::Nothing);
        let elsewhere =
            pod(json!({"metadata": {"name": "p"}, "spec": {"nodeName": "real", "containers": []}}));
        assert_eq!(pod_action(&elsewhere, false, at()), PodAction::Nothing);
        let running = pod(
            json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n", "containers": []},
            "status": {"phase": "Running"}}),
        );
        assert_eq!(pod_action(&running, true, at()), PodAction::Nothing);
        let evicted = pod(
            json!({"metadata": {"name": "p", "deletionTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"nodeName": "n", "containers": []}, "status": {"phase": "Running"}}),
        );
        assert_eq!(pod_action(&evicted, true, at()), PodAction::ConfirmDeletion);
        assert_eq!(pod_action(&evicted, false, at()), PodAction::Nothing);
        // Seen again after the confirmation (grace period 0): nothing more to send.
        let confirmed = pod(
            json!({"metadata": {"name": "p", "deletionTimestamp": "2026-01-01T00:00:00Z",
            "deletionGracePeriodSeconds": 0},
            "spec": {"nodeName": "n", "containers": []}, "status": {"phase": "Running"}}),
        );
        assert_eq!(pod_action(&confirmed, true, at()), PodAction::Nothing);
    }

    #[test]
    fn the_node_lease_is_owned_by_its_node_and_parses_as_a_lease() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n1", "uid": "node-uid"},
            "spec": {"providerID": "exoscale://abc"}
        }))
        .unwrap();
        assert!(is_simulated(&node));
        let lease: Lease = serde_json::from_value(node_lease(&node, at())).unwrap();
        let spec = lease.spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("n1"));
        assert_eq!(spec.renew_time.unwrap().0, at());
        assert_eq!(lease.metadata.owner_references.unwrap()[0].uid, "node-uid");
    }
}
