//! Provisioning end to end on the real control plane with the simulated Exoscale cloud: pending
//! pods → one batch → NodeClaims → simulated instances → Nodes registered and Ready →
//! kube-scheduler binds the pods (and prints the latencies the issue asks to measure); an expired
//! node is replaced; a type out of capacity falls back to the next one.

#[path = "e2e/harness.rs"]
mod harness;
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use harness::{LostAnswer, World, eventually};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::events::v1::Event;
use karpenter_exoscale::apis::labels::{
    BOOTSTRAP_TOKEN_ANNOTATION, INSTANCE_TYPE_LABEL, NODECLAIM_TOKENS_ANNOTATION, NODEPOOL_LABEL,
};
use karpenter_exoscale::apis::{ConditionStatus, ConditionsExt, NodePool};
use karpenter_exoscale::sim::kubelet::KubeletBehaviour;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

async fn create_nodepool(world: &World, name: &str) -> NodePool {
    create_nodepool_expiring(world, name, "720h").await
}

async fn create_nodepool_expiring(world: &World, name: &str, expire_after: &str) -> NodePool {
    world
        .create_nodepool(
            name,
            json!({
                "template": {"spec": {
                    "requirements": [{"key": "karpenter.exoscale.com/instance-family", "operator": "In", "values": ["standard"]}],
                    "expireAfter": expire_after
                }},
                "disruption": {"consolidateAfter": "Never"},
                "limits": {"cpu": "64"}
            }),
        )
        .await
}

/// Creates Deployment `name` of `replicas` pods labelled `app=<app>`, each requesting `cpu` and
/// `memory`; returns the namespace's Deployment API for clean-up.
async fn create_deployment(
    world: &World,
    name: &str,
    app: &str,
    replicas: i32,
    cpu: &str,
    memory: &str,
) -> Api<Deployment> {
    let deployments: Api<Deployment> = Api::namespaced(world.client.clone(), &world.namespace);
    let deployment: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": app}},
            "template": {
                "metadata": {"labels": {"app": app}},
                "spec": {"containers": [{"name": "c", "image": "registry.example.com/app:1",
                    "resources": {"requests": {"cpu": cpu, "memory": memory}}}]}
            }
        }
    }))
    .unwrap();
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .expect("create Deployment");
    deployments
}

#[tokio::test]
async fn pending_pods_get_nodes_and_are_bound_by_the_scheduler() {
    let Some(world) =
        World::start("e2e-prov", Arc::new(|_: &str| KubeletBehaviour::default())).await
    else {
        return;
    };
    world.create_nodeclass(json!({})).await;
    world.start_replica("prov-a").await;
    world.ready_nodeclass().await;
    let pool_name = format!("prov-{}", &world.namespace[world.namespace.len() - 6..]);
    create_nodepool(&world, &pool_name).await;

    let created = Instant::now();
    let deployments = create_deployment(&world, "web", "web", 5, "1", "1Gi").await;

    // Pod creation → NodeClaim creation → the instance create call reaching the cloud.
    let claims = world.nodeclaims();
    let selector = ListParams::default().labels(&format!("{NODEPOOL_LABEL}={pool_name}"));
    let first_claim = loop {
        let list = claims.list(&selector).await.expect("list NodeClaims");
        if !list.items.is_empty() {
            break created.elapsed();
        }
        assert!(
            created.elapsed() < Duration::from_secs(120),
            "no NodeClaim within 120 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let first_create_call = loop {
        if world.sim.call_count("create-instance") > 0 {
            break created.elapsed();
        }
        assert!(
            created.elapsed() < Duration::from_secs(120),
            "no instance created within 120 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    eprintln!(
        "latency: pods created → first NodeClaim {:?}, → first instance create call {:?}",
        first_claim, first_create_call
    );

    // kube-scheduler binds every pod to a node we launched.
    let pods = world.pods();
    let bound_nodes = eventually("all 5 pods bound to Karpenter nodes", || {
        let pods = pods.clone();
        async move {
            let list = pods
                .list(&ListParams::default().labels("app=web"))
                .await
                .ok()?;
            let nodes: Vec<String> = list
                .items
                .iter()
                .filter_map(|p| p.spec.as_ref()?.node_name.clone())
                .collect();
            (list.items.len() == 5 && nodes.len() == 5).then_some(nodes)
        }
    })
    .await;
    eprintln!(
        "latency: pods created → all 5 bound {:?}",
        created.elapsed()
    );
    for node in &bound_nodes {
        let n = world.nodes().get(node).await.expect("bound node exists");
        assert_eq!(
            n.labels().get(NODEPOOL_LABEL),
            Some(&pool_name),
            "pods landed on a node of our NodePool"
        );
        let provider_id = n
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.clone())
            .unwrap_or_default();
        assert!(provider_id.starts_with("exoscale://"), "{provider_id}");
    }

    // As their kubelets would (the simulated ones here do not run pods): Running and Ready,
    // which times each pod's start-up, once a metrics refresh has seen them bound and still
    // Pending on our nodes (the pod state gauge comes from the same look).
    eventually("the bound pods seen Pending", || {
        let pending_on_ours: f64 = world
            .replica_metrics("prov-a")
            .lines()
            .filter(|l| {
                l.starts_with("karpenter_pods_state{")
                    && l.contains("phase=\"Pending\"")
                    && bound_nodes
                        .iter()
                        .any(|n| l.contains(&format!("node=\"{n}\"")))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        async move { (pending_on_ours == 5.0).then_some(()) }
    })
    .await;
    let ready_at = k8s_openapi::jiff::Timestamp::now().to_string();
    let running = json!({"status": {"phase": "Running", "conditions": [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": ready_at},
        {"type": "Ready", "status": "True", "lastTransitionTime": ready_at},
    ]}});
    for pod in pods
        .list(&ListParams::default().labels("app=web"))
        .await
        .unwrap()
    {
        pods.patch_status(
            &pod.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&running),
        )
        .await
        .expect("pod status");
    }

    // The state gauges describe the new nodes and the bound pods (refreshed every few seconds).
    let exported = eventually("node and pod state metrics exported", || {
        let text = world.replica_metrics("prov-a");
        let complete = text.contains("karpenter_cluster_state_synced 1")
            && bound_nodes.iter().all(|node| {
                text.lines().any(|l| {
                    l.starts_with("karpenter_nodes_allocatable{")
                        && l.contains(&format!("node_name=\"{node}\""))
                        && l.contains("resource_type=\"cpu\"")
                }) && text.lines().any(|l| {
                    l.starts_with("karpenter_nodes_total_pod_requests{")
                        && l.contains(&format!("node_name=\"{node}\""))
                        && l.contains(&format!("nodepool=\"{pool_name}\""))
                })
            })
            // Aggregated (the default POD_METRICS): the series of a node count its pods.
            && text
                .lines()
                .filter(|l| {
                    l.starts_with("karpenter_pods_state{")
                        && !l.contains("name=")
                        && l.contains("scheduled=\"true\"")
                        && l.contains("managed=\"true\"")
                })
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>()
                == 5.0;
        async move { complete.then_some(text) }
    })
    .await;
    assert!(
        exported
            .lines()
            .any(|l| l.starts_with("karpenter_cluster_state_node_count ") && !l.ends_with(" 0.0")),
        "node count exported"
    );

    // One batch: the five one-CPU pods needed no more than two instances (FFD packing), and no
    // instance was launched twice.
    let ours = claims.list(&selector).await.unwrap().items;
    assert!(
        !ours.is_empty() && ours.len() <= 2,
        "{} NodeClaims for 5 one-CPU pods",
        ours.len()
    );
    assert_eq!(
        world.live_instances().len(),
        ours.len(),
        "exactly one instance per NodeClaim"
    );
    for claim in &ours {
        assert_eq!(claim.finalizers(), ["karpenter.sh/termination"]);
        assert_eq!(claim.owner_references()[0].name, pool_name);
    }

    // Each node joined with its bootstrap token (the simulated kubelet authenticates it), after
    // which the token Secret recorded on its NodeClaim is deleted and the record dropped.
    let names: Vec<String> = ours.iter().map(|c| c.name_any()).collect();
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(world.client.clone(), "kube-system");
    eventually("bootstrap tokens of registered nodes deleted", || {
        let (secrets, claims, names) = (secrets.clone(), claims.clone(), names.clone());
        async move {
            let left = secrets
                .list(&ListParams::default().fields("type=bootstrap.kubernetes.io/token"))
                .await
                .ok()?
                .items
                .into_iter()
                .filter(|s| {
                    s.annotations()
                        .get(BOOTSTRAP_TOKEN_ANNOTATION)
                        .is_some_and(|c| names.contains(c))
                })
                .count();
            let mut recorded = 0;
            for name in &names {
                let claim = claims.get(name).await.ok()?;
                recorded += usize::from(
                    claim
                        .annotations()
                        .contains_key(NODECLAIM_TOKENS_ANNOTATION),
                );
            }
            (left == 0 && recorded == 0).then_some(())
        }
    })
    .await;

    // The provisioning pod and scheduler metrics moved in this run (the README lists them).
    let counted = |exposed: &str, family: &str| -> Option<f64> {
        exposed
            .lines()
            .find(|l| l.starts_with(family))?
            .rsplit(' ')
            .next()?
            .parse()
            .ok()
    };
    let launches = names.len() as f64;
    eventually("the pods' provisioning metrics are on /metrics", || {
        let exposed = world.replica_metrics("prov-a");
        // The sum over the series of `family` whose labels contain every fragment.
        let summed = |family: &str, fragments: &[&str]| {
            exposed
                .lines()
                .filter(|l| l.starts_with(family) && fragments.iter().all(|f| l.contains(f)))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>()
        };
        // Transitions are counted from each version the watch delivers: every launch since the
        // replica started is one, and Registered, set Unknown at launch, went True once the
        // Node registered (periodic looks mostly saw only the True).
        let pool_label = format!("karpenter_sh_nodepool=\"{pool_name}\"");
        let launched = summed(
            "operator_nodeclaim_status_condition_transitions_total{",
            &["type=\"Launched\",status=\"True\"", &pool_label],
        );
        let registered_timed = summed(
            "operator_nodeclaim_status_condition_transition_seconds_count{",
            &["type=\"Registered\",status=\"Unknown\",to_status=\"True\""],
        );
        async move {
            let decided = counted(&exposed, "karpenter_pods_scheduling_decision_duration_seconds_count")?;
            // Timed from when provisioning first saw each pod: the pod that opened the batch
            // window waited at least its 1-s idle time (the sum was 0 when the ack and the
            // decision both read the round's start).
            let decision_seconds = counted(&exposed, "karpenter_pods_scheduling_decision_duration_seconds_sum")?;
            let bound = counted(&exposed, "karpenter_pods_provisioning_bound_duration_seconds_count")?;
            // A summary as upstream's: quantiles over the last 10 minutes, sum and count.
            let started = counted(&exposed, "karpenter_pods_startup_duration_seconds_count")?;
            let p99 = counted(&exposed, "karpenter_pods_startup_duration_seconds{quantile=\"0.99\"}")?;
            let summary = exposed.contains("# TYPE karpenter_pods_startup_duration_seconds summary\n");
            let zone = counted(
                &exposed,
                "karpenter_scheduler_pending_pods_by_effective_zone_count{controller=\"provisioner\",zone=\"flexible\"}",
            )?;
            // operatorpkg's status-condition series for the launched NodeClaims and their Nodes.
            let ready_claim = exposed.lines().any(|l| {
                l.starts_with("operator_nodeclaim_status_condition_count{")
                    && l.contains("type=\"Ready\",status=\"True\"")
            });
            let node_seen = exposed
                .lines()
                .any(|l| l.starts_with("operator_node_status_condition_current_status_seconds{"));
            (decided >= 5.0
                && decision_seconds >= 1.0
                && launched >= launches
                && registered_timed >= 1.0
                && bound >= 5.0
                && started >= 5.0
                && p99 > 0.0
                && summary
                && zone >= 1.0
                && ready_claim
                && node_seen)
                .then_some(())
        }
    })
    .await;
    let exposed = world.replica_metrics("prov-a");
    assert!(
        !exposed.contains("karpenter_scheduler_queue_depth{"),
        "no round in progress any more: its queue gauge is gone"
    );
    assert!(
        !exposed
            .lines()
            .any(|l| l.starts_with("karpenter_pods_unbound_time_seconds")),
        "bound pods leave no unbound-time series"
    );

    deployments
        .delete("web", &DeleteParams::default())
        .await
        .expect("delete Deployment");
    let _ = Api::<NodePool>::all(world.client.clone())
        .delete(&pool_name, &DeleteParams::default())
        .await;
    world.finish().await;
}

/// `expireAfter` replaces a node regardless of budgets: its NodeClaim is deleted, the node drained,
/// and provisioning launches a new node on which kube-scheduler binds the pod again.
#[tokio::test]
async fn an_expired_node_is_replaced() {
    let Some(world) = World::start(
        "e2e-expire",
        Arc::new(|_: &str| KubeletBehaviour::default()),
    )
    .await
    else {
        return;
    };
    world.create_nodeclass(json!({})).await;
    world.start_replica("expire-a").await;
    world.ready_nodeclass().await;
    let pool_name = format!("exp-{}", &world.namespace[world.namespace.len() - 6..]);
    create_nodepool_expiring(&world, &pool_name, "40s").await;

    let deployments = create_deployment(&world, "app", "expiring", 1, "500m", "512Mi").await;

    let pods = world.pods();
    let first_node = eventually("the pod is bound", || {
        let pods = pods.clone();
        async move {
            let list = pods
                .list(&ListParams::default().labels("app=expiring"))
                .await
                .ok()?;
            list.items.first()?.spec.as_ref()?.node_name.clone()
        }
    })
    .await;
    let first_claim = world
        .nodeclaims()
        .list(&ListParams::default().labels(&format!("{NODEPOOL_LABEL}={pool_name}")))
        .await
        .expect("list NodeClaims")
        .items
        .into_iter()
        .find(|c| c.status.as_ref().and_then(|s| s.node_name.as_deref()) == Some(&*first_node))
        .expect("the first node's NodeClaim");

    // After expiry the first node goes away and the pod runs on a new one.
    let nodes = world.nodes();
    harness::eventually_within(
        "the expired node is replaced",
        Duration::from_secs(240),
        || {
            let pods = pods.clone();
            let nodes = nodes.clone();
            let first_node = first_node.clone();
            async move {
                let gone = nodes.get_opt(&first_node).await.ok()?.is_none();
                let list = pods
                    .list(&ListParams::default().labels("app=expiring"))
                    .await
                    .ok()?;
                let rebound = list.items.iter().any(|p| {
                    p.metadata.deletion_timestamp.is_none()
                        && p.spec
                            .as_ref()
                            .and_then(|s| s.node_name.as_deref())
                            .is_some_and(|n| n != first_node)
                });
                (gone && rebound).then_some(())
            }
        },
    )
    .await;
    let expired = world
        .sim
        .instances()
        .iter()
        .filter(|i| i.instance.name.ends_with(&first_node))
        .count();
    assert_eq!(expired, 0, "the expired node's instance was deleted");

    // operatorpkg's events, as upstream records them: the NodeClaim's conditions going from
    // Unknown at launch to True, and the termination finalizer done on the NodeClaim and its
    // Node once each was deleted.
    let events: Api<Event> = Api::namespaced(world.client.clone(), "default");
    let claim_uid = first_claim.uid();
    let claim_name = first_claim.name_any();
    eventually("status-condition and Finalized events", || {
        let events = events.clone();
        let (claim_uid, claim_name, first_node) =
            (claim_uid.clone(), claim_name.clone(), first_node.clone());
        async move {
            let list = events.list(&ListParams::default()).await.ok()?;
            let about = |kind: &str, name: &str| {
                list.items
                    .iter()
                    .filter(|e| {
                        e.regarding.as_ref().is_some_and(|r| {
                            r.kind.as_deref() == Some(kind) && r.name.as_deref() == Some(name)
                        })
                    })
                    .filter(|e| e.type_.as_deref() == Some("Normal"))
                    .map(|e| (e.reason.clone().unwrap_or_default(), e.note.clone().unwrap_or_default(), e.regarding.as_ref().and_then(|r| r.uid.clone())))
                    .collect::<Vec<_>>()
            };
            let claim = about("NodeClaim", &claim_name);
            let transitioned = claim.iter().any(|(reason, note, uid)| {
                ["Launched", "Registered", "Initialized", "Ready"].contains(&reason.as_str())
                    && note.starts_with(&format!("Status condition transitioned, Type: {reason}, Status: Unknown -> True, Reason: "))
                    && *uid == claim_uid
            });
            let finalized = |events: &[(String, String, Option<String>)]| {
                events.iter().any(|(reason, note, _)| {
                    reason == "Finalized" && note == "Finalized karpenter.sh/termination"
                })
            };
            (transitioned && finalized(&claim) && finalized(&about("Node", &first_node)))
                .then_some(())
        }
    })
    .await;

    deployments
        .delete("app", &DeleteParams::default())
        .await
        .expect("delete Deployment");
    let _ = Api::<NodePool>::all(world.client.clone())
        .delete(&pool_name, &DeleteParams::default())
        .await;
    world.finish().await;
}

/// Volume checks: a pod whose claim does not exist, or whose unbound claim's StorageClass binds
/// Immediately, gets a `FailedScheduling` event naming the problem and no capacity; a pod whose
/// claim waits for its first consumer gets a node (and only its requests are provisioned for).
#[tokio::test]
async fn pods_with_unusable_claims_get_no_node_and_an_event_naming_the_claim() {
    use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
    use k8s_openapi::api::events::v1::Event;
    use k8s_openapi::api::storage::v1::StorageClass;

    let Some(world) = World::start(
        "e2e-volumes",
        Arc::new(|_: &str| KubeletBehaviour::default()),
    )
    .await
    else {
        return;
    };
    world.create_nodeclass(json!({})).await;
    world.start_replica("vol-a").await;
    world.ready_nodeclass().await;
    let suffix = &world.namespace[world.namespace.len() - 6..];
    let pool_name = format!("vol-{suffix}");
    create_nodepool(&world, &pool_name).await;

    let classes: Api<StorageClass> = Api::all(world.client.clone());
    for (name, mode) in [
        (format!("wffc-{suffix}"), "WaitForFirstConsumer"),
        (format!("now-{suffix}"), "Immediate"),
    ] {
        let class: StorageClass = serde_json::from_value(json!({
            "metadata": {"name": name}, "provisioner": "csi.example.com",
            "volumeBindingMode": mode
        }))
        .unwrap();
        classes
            .create(&PostParams::default(), &class)
            .await
            .expect("create StorageClass");
    }
    let claims: Api<PersistentVolumeClaim> =
        Api::namespaced(world.client.clone(), &world.namespace);
    for (claim, class) in [
        ("later", format!("wffc-{suffix}")),
        ("now", format!("now-{suffix}")),
    ] {
        let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": claim},
            "spec": {"storageClassName": class, "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}}}
        }))
        .unwrap();
        claims
            .create(&PostParams::default(), &pvc)
            .await
            .expect("create PVC");
    }
    let pods: Api<Pod> = Api::namespaced(world.client.clone(), &world.namespace);
    for (pod, claim) in [("orphan", "missing"), ("immediate", "now"), ("db", "later")] {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": pod},
            "spec": {
                "containers": [{"name": "c", "image": "registry.example.com/db:1",
                    "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]
            }
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod)
            .await
            .expect("create pod");
    }

    let events: Api<Event> = Api::namespaced(world.client.clone(), &world.namespace);
    let ours = |pod: &'static str, needle: &'static str| {
        let events = events.clone();
        async move {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find(|e| {
                e.reason.as_deref() == Some("FailedScheduling")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(pod)
                    && e.note.as_deref().is_some_and(|n| {
                        n.starts_with("Failed to schedule pod,") && n.contains(needle)
                    })
            })
        }
    };
    eventually("FailedScheduling naming the missing claim", || {
        ours("orphan", "persistentvolumeclaim \"missing\" not found")
    })
    .await;
    eventually("FailedScheduling naming the Immediate class", || {
        ours("immediate", "binds Immediately")
    })
    .await;

    // Only the pod whose claim can follow it got capacity: one NodeClaim sized for one pod.
    let selector = ListParams::default().labels(&format!("{NODEPOOL_LABEL}={pool_name}"));
    let nodeclaims = world.nodeclaims();
    let claim = eventually("a NodeClaim for the pod with a usable claim", || {
        let nodeclaims = nodeclaims.clone();
        let selector = selector.clone();
        async move {
            let list = nodeclaims.list(&selector).await.ok()?;
            list.items.into_iter().next()
        }
    })
    .await;
    let requests = &claim.spec.resources.requests;
    assert_eq!(
        requests.get("cpu").map(|q| q.0.as_str()),
        Some("1"),
        "{requests:?}"
    );
    assert_eq!(
        nodeclaims.list(&selector).await.unwrap().items.len(),
        1,
        "the pods with unusable claims got no capacity"
    );

    for name in ["orphan", "immediate", "db"] {
        let _ = pods.delete(name, &DeleteParams::default()).await;
    }
    for name in [format!("wffc-{suffix}"), format!("now-{suffix}")] {
        let _ = classes.delete(&name, &DeleteParams::default()).await;
    }
    let _ = Api::<NodePool>::all(world.client.clone())
        .delete(&pool_name, &DeleteParams::default())
        .await;
    world.finish().await;
}

/// The cheapest fitting type is out of capacity: its launch fails with an insufficient-capacity
/// error, the NodeClaim is deleted (InsufficientCapacityError event), the offering is marked
/// unavailable, and the next batch launches another type on which the pod is bound.
#[tokio::test]
async fn an_instance_type_out_of_capacity_falls_back_to_the_next_type() {
    let Some(world) =
        World::start("e2e-ice", Arc::new(|_: &str| KubeletBehaviour::default())).await
    else {
        return;
    };
    // 256Mi does not fit standard.micro (512 MiB minus 500 MiB overhead): tiny is the cheapest.
    assert!(world.sim.set_capacity_exhausted("standard.tiny", true));
    world.create_nodeclass(json!({})).await;
    world.start_replica("ice-a").await;
    world.ready_nodeclass().await;
    let pool_name = format!("ice-{}", &world.namespace[world.namespace.len() - 6..]);
    create_nodepool(&world, &pool_name).await;

    let deployments = create_deployment(&world, "app", "ice", 1, "300m", "256Mi").await;

    // The failed launch is reported on its NodeClaim, naming the exhausted type.
    let events: Api<Event> = Api::namespaced(world.client.clone(), "default");
    let failed = eventually(
        "an InsufficientCapacityError event for standard.tiny",
        || {
            let events = events.clone();
            async move {
                let list = events.list(&ListParams::default()).await.ok()?;
                list.items.into_iter().find(|e| {
                    e.reason.as_deref() == Some("InsufficientCapacityError")
                        && e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("NodeClaim")
                        && e.note
                            .as_deref()
                            .is_some_and(|n| n.contains("standard.tiny"))
                })
            }
        },
    )
    .await;
    let failed_claim = failed
        .regarding
        .and_then(|r| r.name)
        .expect("the event names its NodeClaim");

    // The pod ends up on a node of another type of the pool.
    let pods = world.pods();
    let node_name = eventually("the pod is bound", || {
        let pods = pods.clone();
        async move {
            let list = pods
                .list(&ListParams::default().labels("app=ice"))
                .await
                .ok()?;
            list.items.first()?.spec.as_ref()?.node_name.clone()
        }
    })
    .await;
    let node = world.nodes().get(&node_name).await.expect("bound node");
    let node_type = node
        .labels()
        .get(INSTANCE_TYPE_LABEL)
        .cloned()
        .expect("instance-type label");
    assert_ne!(node_type, "standard.tiny");
    assert!(node_type.starts_with("standard."), "{node_type}");
    assert_eq!(node.labels().get(NODEPOOL_LABEL), Some(&pool_name));

    // The failed NodeClaim is gone, and no VM of the exhausted type was left behind.
    let claims = world.nodeclaims();
    eventually("the failed NodeClaim is deleted", || {
        let claims = claims.clone();
        let failed_claim = failed_claim.clone();
        async move { matches!(claims.get_opt(&failed_claim).await, Ok(None)).then_some(()) }
    })
    .await;
    let live = claims
        .list(&ListParams::default().labels(&format!("{NODEPOOL_LABEL}={pool_name}")))
        .await
        .unwrap()
        .items;
    assert_eq!(live.len(), 1, "one NodeClaim serves the pod");
    assert_eq!(
        live[0].labels().get(INSTANCE_TYPE_LABEL),
        Some(&node_type),
        "the NodeClaim launched the fallback type"
    );
    // The next solve left the unavailable offering out of the NodeClaim's choices.
    let choices: Vec<&String> = live[0]
        .spec
        .requirements
        .iter()
        .filter(|r| r.key == INSTANCE_TYPE_LABEL)
        .flat_map(|r| &r.values)
        .collect();
    assert!(
        !choices.is_empty(),
        "the NodeClaim lists its instance types"
    );
    assert!(
        !choices.iter().any(|t| *t == "standard.tiny"),
        "{choices:?}"
    );
    let tiny = world
        .exo
        .list_instance_types()
        .await
        .unwrap()
        .into_iter()
        .find(|t| t.name() == "standard.tiny")
        .unwrap();
    assert!(
        world
            .live_instances()
            .iter()
            .all(|i| i.instance_type.id != tiny.id),
        "no instance of the exhausted type exists"
    );
    assert!(world.sim.call_count("create-instance") >= 2);

    deployments
        .delete("app", &DeleteParams::default())
        .await
        .expect("delete Deployment");
    let _ = Api::<NodePool>::all(world.client.clone())
        .delete(&pool_name, &DeleteParams::default())
        .await;
    world.finish().await;
}

/// The first instance never joins: after the registration TTL its NodeClaim is deleted (and its
/// VM with it), and the next batch launches a replacement on which the pod is bound.
#[tokio::test]
async fn an_instance_that_never_joins_is_replaced_after_the_registration_ttl() {
    use karpenter_exoscale::sim::kubelet::Join;
    use std::sync::Mutex;

    let first_instance: Arc<Mutex<Option<String>>> = Arc::default();
    let policy: harness::KubeletPolicy = {
        let first_instance = first_instance.clone();
        Arc::new(move |name: &str| {
            let mut first = first_instance.lock().unwrap();
            let never = first.get_or_insert_with(|| name.to_string()) == name;
            KubeletBehaviour {
                join: if never {
                    Join::Never
                } else {
                    Join::After(Duration::ZERO)
                },
                ..KubeletBehaviour::default()
            }
        })
    };
    let Some(world) = World::start("e2e-rejoin", policy).await else {
        return;
    };
    world.create_nodeclass(json!({})).await;
    world.start_replica("rejoin-a").await;
    world.ready_nodeclass().await;
    let pool_name = format!("rejoin-{}", &world.namespace[world.namespace.len() - 6..]);
    create_nodepool(&world, &pool_name).await;
    let deployments = create_deployment(&world, "app", "app", 1, "1", "1Gi").await;

    let nodeclaims = world.nodeclaims();
    let selector = ListParams::default().labels(&format!("{NODEPOOL_LABEL}={pool_name}"));
    let lost = eventually("the first NodeClaim", || {
        let (nodeclaims, selector) = (nodeclaims.clone(), selector.clone());
        async move {
            let list = nodeclaims.list(&selector).await.ok()?;
            list.items.first().map(|c| c.name_any())
        }
    })
    .await;
    // Past the 20 s registration TTL the NodeClaim and its VM go…
    eventually("the unregistered NodeClaim deleted", || {
        let (nodeclaims, lost) = (nodeclaims.clone(), lost.clone());
        async move { matches!(nodeclaims.get_opt(&lost).await, Ok(None)).then_some(()) }
    })
    .await;
    let lost_instance = first_instance
        .lock()
        .unwrap()
        .clone()
        .expect("an instance started");
    eventually("the VM that never joined deleted", || {
        let gone = !world
            .live_instances()
            .iter()
            .any(|i| i.name == lost_instance);
        async move { gone.then_some(()) }
    })
    .await;
    // …and the pod gets a node from a replacement NodeClaim.
    let pods = world.pods();
    let node = eventually("the pod bound on a replacement node", || {
        let pods = pods.clone();
        async move {
            let list = pods
                .list(&ListParams::default().labels("app=app"))
                .await
                .ok()?;
            list.items.first()?.spec.as_ref()?.node_name.clone()
        }
    })
    .await;
    assert_ne!(node, lost_instance, "bound on the replacement");
    let claims = nodeclaims.list(&selector).await.unwrap().items;
    assert!(
        claims.iter().all(|c| c.name_any() != lost),
        "the lost NodeClaim is not back"
    );

    deployments
        .delete("app", &DeleteParams::default())
        .await
        .expect("delete Deployment");
    let _ = Api::<NodePool>::all(world.client.clone())
        .delete(&pool_name, &DeleteParams::default())
        .await;
    world.finish().await;
}

/// Upstream's runaway case: every node comes up with a taint the pods do not tolerate and
/// their NodePool never asked for. Over 5 minutes of default batching, upstream's chaos suite
/// allows 35 NodeClaims; the per-pod launch backoff (1, 2, 4 … min after a launched node
/// registered and could not take the pod) keeps us far below, and each pod is told why.
#[tokio::test]
async fn nodes_the_pods_cannot_use_do_not_cause_a_runaway_scale_up() {
    let tainted: harness::KubeletPolicy = Arc::new(|_: &str| KubeletBehaviour {
        fault: karpenter_exoscale::sim::kubelet::Fault::Tainted {
            key: "example.com/broken".into(),
            value: "true".into(),
            effect: "NoSchedule".into(),
        },
        ..KubeletBehaviour::default()
    });
    let Some(world) = World::start("e2e-runaway", tainted).await else {
        return;
    };
    world.create_nodeclass(json!({})).await;
    world.start_replica("runaway").await;
    world.ready_nodeclass().await;
    let pool_name = format!("runaway-{}", &world.namespace[world.namespace.len() - 6..]);
    world
        .create_nodepool(
            &pool_name,
            json!({
                "template": {"spec": {
                    "requirements": [{"key": "karpenter.exoscale.com/instance-family", "operator": "In", "values": ["standard"]}]
                }},
                "disruption": {"consolidateAfter": "0s"},
                "limits": {"cpu": "1000"}
            }),
        )
        .await;
    let deployments = create_deployment(&world, "stuck", "stuck", 3, "500m", "512Mi").await;

    let window = Duration::from_secs(300);
    let started = Instant::now();
    tokio::time::sleep(window).await;
    let launched = world.sim.call_count("create-instance");
    eprintln!(
        "runaway: {launched} NodeClaims launched in {:.0} s for pods no node can take",
        started.elapsed().as_secs_f64()
    );
    assert!(launched >= 1, "nothing was launched at all");
    assert!(
        launched < 35,
        "{launched} NodeClaims in 5 minutes: upstream's chaos suite allows 35"
    );
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(world.client.clone(), &world.namespace);
    let told = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("FailedScheduling"))
        .filter_map(|e| e.note)
        .find(|n| n.contains("example.com/broken=true:NoSchedule"));
    assert!(
        told.is_some(),
        "no pod was told which taint keeps it pending"
    );
    deployments
        .delete("stuck", &DeleteParams::default())
        .await
        .unwrap();
    world.finish().await;
}

/// 1 000 pending pods: the round's NodeClaims are created while not one of its events has been
/// written (event writes are held); once they go through, the pods' Nominated events appear
/// (as many as upstream's nomination budget lets through).
#[tokio::test]
async fn a_thousand_pending_pods_get_their_nodeclaims_before_any_event_is_written() {
    use futures::StreamExt;
    use karpenter_exoscale::sim::kubelet::Join;

    let policy: harness::KubeletPolicy = Arc::new(|_: &str| KubeletBehaviour {
        join: Join::Never,
        ..KubeletBehaviour::default()
    });
    let Some(world) = World::start("e2e-events", policy).await else {
        return;
    };
    world.create_nodeclass(json!({})).await;
    // Every events.k8s.io write is held until `open` turns true: an API server slow to take
    // events.
    let (open, open_rx) = tokio::sync::watch::channel(false);
    let held = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let gated = harness::intercepted(world.client.clone(), {
        let held = held.clone();
        move |inner: kube::Client, request: harness::Request| {
            let event_write = request.method() != http::Method::GET
                && request.uri().path().starts_with("/apis/events.k8s.io/");
            let (mut open, held) = (open_rx.clone(), held.clone());
            async move {
                if event_write {
                    held.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let _ = open.wait_for(|open| *open).await;
                }
                inner.send(request).await.map_err(Into::into)
            }
        }
    });
    world.start_replica_with("events-a", gated).await;
    world.ready_nodeclass().await;
    let pool_name = format!("events-{}", &world.namespace[world.namespace.len() - 6..]);
    create_nodepool(&world, &pool_name).await;

    let pods = world.pods();
    futures::stream::iter(0..1000)
        .map(|i| {
            let (pods, pool_name) = (pods.clone(), pool_name.clone());
            async move {
                let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
                    "metadata": {"name": format!("p-{i}"), "labels": {"app": "many"}},
                    // Only this test's NodePool may take them: the control plane is shared.
                    "spec": {"nodeSelector": {NODEPOOL_LABEL: pool_name},
                        "containers": [{"name": "c", "image": "registry.example.com/app:1",
                        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}}}]}
                }))
                .unwrap();
                pods.create(&PostParams::default(), &pod)
                    .await
                    .expect("create pod");
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<()>>()
        .await;

    let claims = world.nodeclaims();
    let selector = ListParams::default().labels(&format!("{NODEPOOL_LABEL}={pool_name}"));
    let created = eventually(
        "NodeClaims for the 1 000 pods while events are held",
        || {
            let (claims, selector) = (claims.clone(), selector.clone());
            async move {
                let list = claims.list(&selector).await.ok()?;
                (!list.items.is_empty()).then_some(list.items.len())
            }
        },
    )
    .await;
    let events: Api<Event> = Api::namespaced(world.client.clone(), &world.namespace);
    let written = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reporting_controller.as_deref() == Some("karpenter"))
        .count();
    assert_eq!(written, 0, "no event of the round was written yet");
    eprintln!(
        "{created} NodeClaims created with {} event writes held",
        held.load(std::sync::atomic::Ordering::SeqCst)
    );

    open.send(true).unwrap();
    eventually("the pods' Nominated events once writes go through", || {
        let events = events.clone();
        async move {
            let nominated = events
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .into_iter()
                .filter(|e| {
                    e.reason.as_deref() == Some("Nominated")
                        && e.note
                            .as_deref()
                            .is_some_and(|n| n.starts_with("Pod should schedule on: nodeclaim/"))
                })
                .count();
            // Nominations share upstream's budget (bursts of ten, then five per second).
            (nominated >= 10).then_some(())
        }
    })
    .await;
    assert!(held.load(std::sync::atomic::Ordering::SeqCst) > 0);

    // A thousand pending pods left behind would weigh on every other test's provisioning.
    let _ = pods
        .delete_collection(
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            },
            &ListParams::default().labels("app=many"),
        )
        .await;
    let _ = Api::<NodePool>::all(world.client.clone())
        .delete(&pool_name, &DeleteParams::default())
        .await;
    world.finish().await;
}

/// A world whose replicas run with the `StaticCapacity` gate.
async fn static_world(test: &str) -> Option<World> {
    let mut world = World::start(test, Arc::new(|_: &str| KubeletBehaviour::default())).await?;
    world
        .env
        .insert("FEATURE_GATES".into(), "StaticCapacity=true".into());
    Some(world)
}

/// A static NodePool of `replicas` `standard.small` nodes (at most 5).
async fn create_static_pool(world: &World, name: &str, replicas: i64) {
    world
        .create_nodepool(
            name,
            json!({
                "replicas": replicas,
                "template": {"spec": {
                    "requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["standard.small"]}],
                    "expireAfter": "Never"
                }},
                "limits": {"nodes": "5"}
            }),
        )
        .await;
}

/// Static NodePools (gate `StaticCapacity`) and the NodeClass's `nodeLabels`/`nodeTaints`: a pool
/// with `replicas: 3` gets three nodes with no pod asking for them, each labelled and tainted
/// as its NodeClass says; a deleted node is replaced; `status.nodes` reports the count; scaling
/// to 1 removes two nodes within the default budget (10 %: one at a time).
#[tokio::test]
async fn a_static_nodepool_keeps_its_replicas_through_a_node_deletion_and_a_scale_down() {
    let Some(world) = static_world("e2e-static").await else {
        return;
    };
    world
        .create_nodeclass(json!({
            "nodeLabels": {"example.com/team": "static"},
            "nodeTaints": [{"key": "example.com/dedicated", "value": "static", "effect": "NoSchedule"}]
        }))
        .await;
    world.start_replica("static-a").await;
    world.ready_nodeclass().await;
    let pool_name = format!("static-{}", &world.namespace[world.namespace.len() - 6..]);
    create_static_pool(&world, &pool_name, 3).await;
    let pools = Api::<NodePool>::all(world.client.clone());

    let nodes = world.nodes();
    let selector = format!("{NODEPOOL_LABEL}={pool_name}");
    let pool_nodes = |want: usize| {
        let nodes = nodes.clone();
        let selector = selector.clone();
        move || {
            let nodes = nodes.clone();
            let selector = selector.clone();
            async move {
                let list = nodes
                    .list(&ListParams::default().labels(&selector))
                    .await
                    .ok()?;
                let live: Vec<_> = list
                    .items
                    .into_iter()
                    .filter(|n| n.metadata.deletion_timestamp.is_none())
                    .collect();
                (live.len() == want).then_some(live)
            }
        }
    };
    let first = harness::eventually_within(
        "three static nodes without any pod",
        Duration::from_secs(180),
        pool_nodes(3),
    )
    .await;
    for node in &first {
        assert_eq!(
            node.labels().get("example.com/team").map(String::as_str),
            Some("static"),
            "the NodeClass label is on {}",
            node.name_any()
        );
        let taints = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        assert!(
            taints
                .iter()
                .any(|t| t.key == "example.com/dedicated" && t.value.as_deref() == Some("static")),
            "the NodeClass taint is on {}: {taints:?}",
            node.name_any()
        );
    }
    // The NodePool's cost: three launched standard.small NodeClaims at the sim's list price.
    let cost_line = format!("karpenter_nodepools_cost_total{{nodepool=\"{pool_name}\"}} ");
    let cost: f64 = eventually(
        "karpenter_nodepools_cost_total prices the three nodes",
        || {
            let exposed = world.replica_metrics("static-a");
            let cost_line = cost_line.clone();
            async move {
                let value: f64 = exposed
                    .lines()
                    .find_map(|l| l.strip_prefix(&cost_line))?
                    .trim()
                    .parse()
                    .ok()?;
                (value > 0.0).then_some(value)
            }
        },
    )
    .await;
    let per_node = cost / 3.0;
    assert!(
        per_node > 0.0 && per_node < 1.0,
        "standard.small per hour: {per_node}"
    );
    let claims = world.nodeclaims();
    let claim_selector = selector.clone();
    eventually("status.nodes says 3", || {
        let pools = pools.clone();
        let name = pool_name.clone();
        async move { (pools.get(&name).await.ok()?.status?.nodes == 3).then_some(()) }
    })
    .await;

    // A deleted node comes back.
    let victim = first[0].name_any();
    nodes
        .delete(&victim, &DeleteParams::default())
        .await
        .expect("delete Node");
    let after =
        harness::eventually_within("the deleted node is replaced", Duration::from_secs(180), {
            let check = pool_nodes(3);
            let victim = victim.clone();
            move || {
                let check = check();
                let victim = victim.clone();
                async move {
                    let live = check.await?;
                    live.iter().all(|n| n.name_any() != victim).then_some(live)
                }
            }
        })
        .await;
    assert_eq!(after.len(), 3);

    // Scale to 1: two nodes go, one at a time, and no new one is made.
    pools
        .patch(
            &pool_name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"replicas": 1}})),
        )
        .await
        .expect("scale the NodePool");
    harness::eventually_within(
        "the pool is down to one node",
        Duration::from_secs(240),
        pool_nodes(1),
    )
    .await;
    let remaining = claims
        .list(&ListParams::default().labels(&claim_selector))
        .await
        .expect("list NodeClaims");
    let live = remaining
        .items
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .count();
    assert_eq!(live, 1, "one NodeClaim is left");

    let _ = pools.delete(&pool_name, &DeleteParams::default()).await;
    world.finish().await;
}

/// A Node that registers while its NodeClaim's launch pass still waits for its status write is
/// synced beside that write, not after it: kube-runtime runs one pass per NodeClaim at a time,
/// and at 1 000 nodes that write took seconds. Here the write is held until a Node write goes
/// through, so a registration that waited for it would never come.
#[tokio::test]
async fn a_node_is_synced_while_the_launch_status_write_is_in_flight() {
    use karpenter_exoscale::apis::ConditionsExt;
    use karpenter_exoscale::sim::kubelet::Join;
    use std::sync::atomic::Ordering::SeqCst;

    let policy: harness::KubeletPolicy = Arc::new(|_: &str| KubeletBehaviour {
        join: Join::Never,
        ..KubeletBehaviour::default()
    });
    let Some(mut world) = World::start("e2e-early-sync", policy).await else {
        return;
    };
    world
        .env
        .insert("NODECLAIM_REGISTRATION_TTL".into(), "10m".into());
    world.create_nodeclass(json!({})).await;
    // The replica's NodeClaim status writes are held until one of its Node writes has gone
    // through: an API server slow to answer the launch's status write. `holding` counts the
    // writes held right now.
    let node_written = Arc::new(tokio::sync::watch::channel(false).0);
    let holding = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let node_written_while_held = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let gated = harness::intercepted(world.client.clone(), {
        let (holding, node_written_while_held) = (holding.clone(), node_written_while_held.clone());
        move |inner: kube::Client, request: harness::Request| {
            let path = request.uri().path();
            let patch = request.method() == http::Method::PATCH;
            let status_write = patch
                && path.starts_with("/apis/karpenter.sh/v1/nodeclaims/")
                && path.ends_with("/status");
            let node_write = patch && path.starts_with("/api/v1/nodes/");
            let (node_written, holding, node_written_while_held) = (
                node_written.clone(),
                holding.clone(),
                node_written_while_held.clone(),
            );
            async move {
                if status_write {
                    holding.fetch_add(1, SeqCst);
                    let _ = node_written.subscribe().wait_for(|written| *written).await;
                    holding.fetch_sub(1, SeqCst);
                }
                let response = inner.send(request).await?;
                if node_write && response.status().is_success() {
                    if holding.load(SeqCst) > 0 {
                        node_written_while_held.store(true, SeqCst);
                    }
                    node_written.send_replace(true);
                }
                Ok(response)
            }
        }
    });
    world.start_replica_with("early-a", gated).await;
    world.ready_nodeclass().await;
    let name = format!("early-{}", harness::suffix(&world));
    world.create_nodeclaim(&name, json!({})).await;
    eventually("the launch's status write held", || async {
        (holding.load(SeqCst) >= 1).then_some(())
    })
    .await;
    let claims = world.nodeclaims();
    let unwritten = claims.get(&name).await.unwrap();
    assert!(
        unwritten.status.and_then(|s| s.provider_id).is_none(),
        "the launch's status write has not gone through"
    );

    world.join_now(&name).await;
    let node_name = eventually("the NodeClaim registered", || async {
        let status = claims.get_opt(&name).await.ok()??.status?;
        status
            .conditions
            .is_true("Registered")
            .then_some(status.node_name?)
    })
    .await;
    assert!(
        node_written_while_held.load(SeqCst),
        "the Node was synced while the launch's status write was held"
    );
    let node = world.nodes().get(&node_name).await.unwrap();
    assert_eq!(
        node.labels()
            .get("karpenter.sh/registered")
            .map(String::as_str),
        Some("true")
    );
    assert!(
        node.owner_references()
            .iter()
            .any(|o| o.kind == "NodeClaim" && o.name == name),
        "the Node is owned by its NodeClaim"
    );
    world.finish().await;
}

/// A pod bound to the Node launched for a pending pod takes the room planned for it: the pending
/// pod gets another NodeClaim at once, not at its requeue (set to an hour here, so without the
/// trigger on the binding nothing would launch; upstream waits for its 10 s requeue). kube-
/// scheduler binds most pods of a big launch this way, without ever marking them unschedulable.
#[tokio::test]
async fn a_pod_whose_planned_room_another_takes_gets_a_node_without_waiting_for_its_requeue() {
    const WARMING_TAINT: &str = "e2e.karpenter.sh/warming";
    let Some(world) = World::start("e2e-displaced", harness::joins()).await else {
        return;
    };
    world.create_nodeclass(json!({})).await;
    world
        .start_replica_with_controllers("displaced", world.client.clone(), |config| {
            let nominations =
                Arc::new(karpenter_exoscale::provisioning::controller::Nominations::default());
            let provisioning = karpenter_exoscale::provisioning::controller::Settings {
                requeue_after: Duration::from_secs(3600),
                ..karpenter_exoscale::provisioning::settings(&*config)
            };
            vec![
                karpenter_exoscale::provisioning::plugin(provisioning, nominations.clone()),
                karpenter_exoscale::controllers::disruption::plugin(
                    karpenter_exoscale::operator::run::disruption_settings(config),
                    nominations,
                ),
            ]
        })
        .await;
    world.ready_nodeclass().await;
    let pool_name = format!("displaced-{}", harness::suffix(&world));
    // One standard.small (2 vCPU) takes one of the 1200m pods below, not two. The startup taint
    // keeps kube-scheduler off the Node until the test has bound its own pod there.
    world
        .create_nodepool(
            &pool_name,
            json!({
                "template": {"spec": {
                    "requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["standard.small"]}],
                    "startupTaints": [{"key": WARMING_TAINT, "effect": "NoSchedule"}],
                    "expireAfter": "Never"
                }},
                "disruption": {"consolidateAfter": "Never"},
                "limits": {"cpu": "64"}
            }),
        )
        .await;
    let deployments = create_deployment(&world, "planned", "planned", 1, "1200m", "256Mi").await;

    let node = eventually("the planned pod's NodeClaim registered", || async {
        let claims = world.claims_of_pool(&pool_name).await;
        let [claim] = claims.as_slice() else {
            return None;
        };
        claim.status.as_ref()?.node_name.clone()
    })
    .await;

    // Another pod lands on that Node first, as kube-scheduler binds a pod it never marked.
    let stranger: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "stranger"},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "tolerations": [{"key": WARMING_TAINT, "operator": "Exists"}],
            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": {"cpu": "1200m", "memory": "256Mi"}}}]
        }
    }))
    .unwrap();
    world
        .pods()
        .create(&PostParams::default(), &stranger)
        .await
        .expect("create the stranger pod");
    let planned_pending = world
        .pods()
        .list(&ListParams::default().labels("app=planned"))
        .await
        .unwrap()
        .items
        .iter()
        .all(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none());
    assert!(planned_pending, "the planned pod must still be pending");

    let second = eventually("a second NodeClaim for the displaced pod", || async {
        let claims = world.claims_of_pool(&pool_name).await;
        (claims.len() == 2).then_some(claims)
    })
    .await;
    let launched = world.sim.call_count("create-instance");
    assert_eq!(launched, 2, "one instance per pod");
    assert_eq!(second.len(), 2);

    deployments
        .delete("planned", &DeleteParams::default())
        .await
        .unwrap();
    let _ = world
        .pods()
        .delete("stranger", &DeleteParams::default())
        .await;
    world.finish().await;
}

/// A NodePool applied before its NodeClass exists is woken when the NodeClass becomes Ready and
/// provisions at once, as upstream's NodePool readiness controller watches NodeClasses. The
/// NodePool's resync is set to an hour here: before, only that resync (30 s) noticed, so pods
/// applied with a new NodePool and NodeClass waited up to 30 s for their first NodeClaim.
#[tokio::test]
async fn a_nodepool_applied_before_its_nodeclass_provisions_once_the_nodeclass_is_ready() {
    let Some(world) = World::start("e2e-pool-first", harness::joins()).await else {
        return;
    };
    world
        .start_replica_with_controllers("pool-first", world.client.clone(), |config| {
            config.timings.nodepool_resync = Duration::from_secs(3600);
            karpenter_exoscale::operator::run::core_controllers(config)
        })
        .await;
    let pool_name = format!("pool-first-{}", harness::suffix(&world));
    create_nodepool(&world, &pool_name).await;
    let pools = Api::<NodePool>::all(world.client.clone());
    eventually("the NodePool reporting its NodeClass missing", || async {
        let status = pools.get(&pool_name).await.ok()?.status?;
        let ready = status.conditions.get_condition("NodeClassReady")?;
        (ready.status == ConditionStatus::False && ready.reason == "NodeClassNotFound")
            .then_some(())
    })
    .await;
    let deployments = create_deployment(&world, "early", "early", 2, "250m", "256Mi").await;

    world.create_nodeclass(json!({})).await;
    world.ready_nodeclass().await;
    eventually("the NodePool Ready once its NodeClass is", || async {
        let status = pools.get(&pool_name).await.ok()?.status?;
        status.conditions.is_true("Ready").then_some(())
    })
    .await;
    eventually("a NodeClaim for the pods", || async {
        let claims = world.claims_of_pool(&pool_name).await;
        (!claims.is_empty()).then_some(())
    })
    .await;

    deployments
        .delete("early", &DeleteParams::default())
        .await
        .unwrap();
    world.finish().await;
}

/// A NodeClaim create is committed but its answer lost, and the NodeClaim watch is late to
/// bring it: the next rounds do not launch the pod a second NodeClaim (a name-generated
/// NodeClaim cannot be looked up; provisioning waits until cluster state holds every NodeClaim
/// the API server lists). Once the watch brings it, that one NodeClaim serves the pod.
#[tokio::test]
async fn a_nodeclaim_create_whose_answer_is_lost_is_not_repeated() {
    use std::sync::atomic::Ordering::SeqCst;
    let Some(world) =
        World::start("e2e-lost", Arc::new(|_: &str| KubeletBehaviour::default())).await
    else {
        return;
    };
    world.create_nodeclass(json!({})).await;
    let transport = LostAnswer::new(world.client.clone());
    let client = kube::Client::new(transport.clone(), world.namespace.clone());
    world.start_replica_with("lost-a", client).await;
    world.ready_nodeclass().await;
    let pool_name = format!("lost-{}", &world.namespace[world.namespace.len() - 6..]);
    create_nodepool(&world, &pool_name).await;

    transport.claims_late.send_replace(true);
    let deployments = create_deployment(&world, "web", "web", 1, "1", "1Gi").await;
    let claims = world.nodeclaims();
    let selector = ListParams::default().labels(&format!("{NODEPOOL_LABEL}={pool_name}"));
    eventually("the first create committed, its answer lost", || async {
        (transport.creates.load(SeqCst) >= 1).then_some(())
    })
    .await;
    // Past the batch windows and a requeue (10 s) of the still pending pod.
    let lost = Instant::now();
    harness::eventually_within(
        "15 s after the lost answer",
        Duration::from_secs(60),
        || async { (lost.elapsed() >= Duration::from_secs(15)).then_some(()) },
    )
    .await;
    assert_eq!(transport.creates.load(SeqCst), 1, "the create was repeated");
    assert_eq!(claims.list(&selector).await.unwrap().items.len(), 1);

    transport.claims_late.send_replace(false);
    eventually("the pod bound", || all_bound(&world, "web")).await;
    assert_eq!(
        claims.list(&selector).await.unwrap().items.len(),
        1,
        "a second NodeClaim"
    );
    assert_eq!(transport.creates.load(SeqCst), 1);
    deployments
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    let _ = Api::<NodePool>::all(world.client.clone())
        .delete(&pool_name, &DeleteParams::default())
        .await;
    world.finish().await;
}

/// The first NodeClaim create is never answered (nor delivered): the API server stopped
/// answering that connection. The replica gives the write up at its Lease's renew deadline (an
/// outcome unknown), makes sure no NodeClaim it cannot see exists, and creates again: the pod
/// gets its node, from one NodeClaim. Without a deadline the round waited forever.
#[tokio::test]
async fn a_nodeclaim_create_never_answered_is_given_up_and_made_again() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let Some(world) = World::start(
        "e2e-unanswered",
        Arc::new(|_: &str| KubeletBehaviour::default()),
    )
    .await
    else {
        return;
    };
    world.create_nodeclass(json!({})).await;
    let creates = Arc::new(AtomicUsize::new(0));
    let client = harness::intercepted(world.client.clone(), {
        let creates = creates.clone();
        move |inner: kube::Client, request: harness::Request| {
            let creates = creates.clone();
            async move {
                let create = request.method() == http::Method::POST
                    && request.uri().path() == "/apis/karpenter.sh/v1/nodeclaims";
                if create && creates.fetch_add(1, SeqCst) == 0 {
                    return futures::future::pending().await;
                }
                inner.send(request).await.map_err(Into::into)
            }
        }
    });
    world.start_replica_with("unanswered-a", client).await;
    world.ready_nodeclass().await;
    let pool_name = format!(
        "unanswered-{}",
        &world.namespace[world.namespace.len() - 6..]
    );
    create_nodepool(&world, &pool_name).await;
    let deployments = create_deployment(&world, "web", "web", 1, "1", "1Gi").await;
    // Created again only once the API server can no longer be committing the first (65 s).
    let limit =
        harness::WAIT + karpenter_exoscale::controllers::lost_creates::SERVER_MAY_COMMIT_FOR;
    harness::eventually_within("the pod bound", limit, || all_bound(&world, "web")).await;
    let selector = ListParams::default().labels(&format!("{NODEPOOL_LABEL}={pool_name}"));
    assert_eq!(
        world
            .nodeclaims()
            .list(&selector)
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    assert_eq!(creates.load(SeqCst), 2, "one create given up, one answered");
    deployments
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    let _ = Api::<NodePool>::all(world.client.clone())
        .delete(&pool_name, &DeleteParams::default())
        .await;
    world.finish().await;
}

/// The first NodeClaim create is held on its way to the API server until well after the
/// replica gave it up (a slow etcd: the server keeps working on a request for up to its 60-s
/// request timeout), then committed. A list right after the give-up shows nothing missing, yet
/// the create is still to come: the replica must not create again before the server's request
/// timeout has passed. The pod gets its node from the late NodeClaim; one create in all.
#[tokio::test]
async fn a_nodeclaim_create_committed_after_it_was_given_up_is_not_made_twice() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
    let Some(world) = World::start(
        "e2e-late-commit",
        Arc::new(|_: &str| KubeletBehaviour::default()),
    )
    .await
    else {
        return;
    };
    world.create_nodeclass(json!({})).await;
    let creates = Arc::new(AtomicUsize::new(0));
    let delivered = Arc::new(AtomicBool::new(false));
    /// Tells the held create's task that the replica stopped waiting for its answer.
    struct GivenUp(Option<tokio::sync::oneshot::Sender<()>>);
    impl Drop for GivenUp {
        fn drop(&mut self) {
            if let Some(tell) = self.0.take() {
                let _ = tell.send(());
            }
        }
    }
    let client = harness::intercepted(world.client.clone(), {
        let (creates, delivered) = (creates.clone(), delivered.clone());
        move |inner: kube::Client, request: harness::Request| {
            let (creates, delivered) = (creates.clone(), delivered.clone());
            async move {
                let create = request.method() == http::Method::POST
                    && request.uri().path() == "/apis/karpenter.sh/v1/nodeclaims";
                if create && creates.fetch_add(1, SeqCst) == 0 {
                    let (tell, given_up) = tokio::sync::oneshot::channel();
                    let _waiting = GivenUp(Some(tell));
                    tokio::spawn(async move {
                        let _ = given_up.await;
                        // Committed 30 s after the give-up, or as soon as the replica creates
                        // again (which it must not).
                        let since = Instant::now();
                        while creates.load(SeqCst) < 2 && since.elapsed() < Duration::from_secs(30)
                        {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        let answer = inner.send(request).await;
                        assert!(
                            answer.is_ok_and(|a| a.status().is_success()),
                            "late create committed"
                        );
                        delivered.store(true, SeqCst);
                    });
                    return futures::future::pending().await;
                }
                inner.send(request).await.map_err(Into::into)
            }
        }
    });
    world.start_replica_with("late-commit-a", client).await;
    world.ready_nodeclass().await;
    let pool_name = format!(
        "late-commit-{}",
        &world.namespace[world.namespace.len() - 6..]
    );
    create_nodepool(&world, &pool_name).await;
    let deployments = create_deployment(&world, "web", "web", 1, "1", "1Gi").await;
    eventually("the held create delivered after the give-up", || async {
        delivered.load(SeqCst).then_some(())
    })
    .await;
    eventually("the pod bound", || all_bound(&world, "web")).await;
    assert_eq!(
        creates.load(SeqCst),
        1,
        "the replica created again before the late create could no longer come"
    );
    let selector = ListParams::default().labels(&format!("{NODEPOOL_LABEL}={pool_name}"));
    assert_eq!(
        world
            .nodeclaims()
            .list(&selector)
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    deployments
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    let _ = Api::<NodePool>::all(world.client.clone())
        .delete(&pool_name, &DeleteParams::default())
        .await;
    world.finish().await;
}

/// A static NodePool's NodeClaim create is committed but its answer lost, and the NodeClaim
/// watch is late to bring it: the static capacity controller does not make the missing replica
/// again (it waits until cluster state holds every NodeClaim the API server lists). Once the
/// watch brings it, that one NodeClaim is the pool's one replica.
#[tokio::test]
async fn a_static_nodeclaim_create_whose_answer_is_lost_is_not_repeated() {
    use std::sync::atomic::Ordering::SeqCst;
    let Some(world) = static_world("e2e-lost-static").await else {
        return;
    };
    world.create_nodeclass(json!({})).await;
    let transport = LostAnswer::new(world.client.clone());
    let client = kube::Client::new(transport.clone(), world.namespace.clone());
    world.start_replica_with("lost-static-a", client).await;
    world.ready_nodeclass().await;
    let pool_name = format!(
        "lost-static-{}",
        &world.namespace[world.namespace.len() - 6..]
    );
    transport.claims_late.send_replace(true);
    create_static_pool(&world, &pool_name, 1).await;
    let claims = world.nodeclaims();
    let selector = ListParams::default().labels(&format!("{NODEPOOL_LABEL}={pool_name}"));
    eventually("the first create committed, its answer lost", || async {
        (transport.creates.load(SeqCst) >= 1).then_some(())
    })
    .await;
    // Past several of the controller's retries (backoff after the failed create, rechecks).
    let lost = Instant::now();
    harness::eventually_within(
        "20 s after the lost answer",
        Duration::from_secs(60),
        || async { (lost.elapsed() >= Duration::from_secs(20)).then_some(()) },
    )
    .await;
    assert_eq!(transport.creates.load(SeqCst), 1, "the create was repeated");
    assert_eq!(claims.list(&selector).await.unwrap().items.len(), 1);

    transport.claims_late.send_replace(false);
    eventually("the replica's node", || async {
        let nodes = world
            .nodes()
            .list(&ListParams::default().labels(&format!("{NODEPOOL_LABEL}={pool_name}")))
            .await
            .ok()?;
        (nodes.items.len() == 1).then_some(())
    })
    .await;
    assert_eq!(
        claims.list(&selector).await.unwrap().items.len(),
        1,
        "a second NodeClaim"
    );
    assert_eq!(transport.creates.load(SeqCst), 1);
    let _ = Api::<NodePool>::all(world.client.clone())
        .delete(&pool_name, &DeleteParams::default())
        .await;
    world.finish().await;
}

/// The ExoscaleNodeClass list succeeds but the watch after it is refused once (429, as an API
/// server whose storage is re-initializing answers). The NodeClasses are unsynced on the error
/// and current again after a fresh list: the pod gets its node. (kube's watcher alone retried
/// only the watch, no new list completed, and nothing was ever launched.)
#[tokio::test]
async fn a_nodeclass_watch_refused_after_its_list_recovers() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let Some(world) = World::start(
        "e2e-nc-watch",
        Arc::new(|_: &str| KubeletBehaviour::default()),
    )
    .await
    else {
        return;
    };
    world.create_nodeclass(json!({})).await;
    let refusals = Arc::new(AtomicUsize::new(0));
    let client = harness::intercepted(world.client.clone(), {
        let refusals = refusals.clone();
        move |inner: kube::Client, request: harness::Request| {
            let refusals = refusals.clone();
            async move {
                let watch = request.uri().path()
                    == "/apis/karpenter.exoscale.com/v1/exoscalenodeclasses"
                    && request
                        .uri()
                        .query()
                        .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true"));
                if watch && refusals.fetch_add(1, SeqCst) == 0 {
                    return harness::refused(429);
                }
                inner.send(request).await.map_err(Into::into)
            }
        }
    });
    world.start_replica_with("nc-watch-a", client).await;
    world.ready_nodeclass().await;
    let pool_name = format!("nc-watch-{}", &world.namespace[world.namespace.len() - 6..]);
    create_nodepool(&world, &pool_name).await;
    let deployments = create_deployment(&world, "web", "web", 1, "1", "1Gi").await;
    eventually("the pod bound", || all_bound(&world, "web")).await;
    assert!(
        refusals.load(SeqCst) >= 2,
        "the watch was refused, then opened"
    );
    deployments
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    let _ = Api::<NodePool>::all(world.client.clone())
        .delete(&pool_name, &DeleteParams::default())
        .await;
    world.finish().await;
}

/// `Some` once pods labelled `app=<app>` exist and every one is bound to a node.
async fn all_bound(world: &World, app: &str) -> Option<()> {
    let pods = world
        .pods()
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .ok()?;
    (!pods.items.is_empty()
        && pods
            .items
            .iter()
            .all(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some())))
    .then_some(())
}
