//! Controller scenarios on a real control plane (etcd, kube-apiserver, kube-scheduler,
//! kube-controller-manager from `hack/control-plane.sh`) with the simulated Exoscale cloud:
//! teardown and drain, PDB-guarded drains until the deadline, the registration TTL, instance
//! garbage collection, NodeClass readiness, leader election, a restart mid-launch, the wait
//! for VolumeAttachments before an instance is deleted, node repair, and a registration while
//! more launches wait on the cloud than the CPU-sized reconcile slots.
//! TTLs are shortened through the same settings operators use.

#[path = "e2e/harness.rs"]
mod harness;
mod support;

use std::time::Instant;

use support::proxy::TcpProxy;

use std::sync::Arc;
use std::time::Duration;

use harness::{
    PREFIX, World, bound_pod, eventually, eventually_within, gone, instances_of, joins, suffix,
    volume_attachment,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use karpenter_exoscale::apis::labels::{
    INSTANCE_CLUSTER_ID_LABEL, INSTANCE_CLUSTER_UID_LABEL,
    NODECLAIM_TERMINATION_TIMESTAMP_ANNOTATION, NODEPOOL_LABEL, conditions,
};
use karpenter_exoscale::apis::{
    ConditionStatus, ConditionsExt, ExoscaleNodeClass, NodeClaim, NodePool,
};
use karpenter_exoscale::cloudprovider::CloudProvider;
use karpenter_exoscale::cloudprovider::exoscale::ExoscaleSettings;
use karpenter_exoscale::exoscale::{Clock, SystemClock};
use karpenter_exoscale::operator::run::build_cloud;
use karpenter_exoscale::operator::tasks::TaskError;
use karpenter_exoscale::sim::kubelet::{Join, KubeletBehaviour};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

#[tokio::test]
async fn deleting_a_nodeclaim_drains_and_deletes_the_vm_and_the_node() {
    let Some(world) = World::start("e2e-drain", joins()).await else {
        return;
    };
    world.create_nodeclass(json!({})).await;
    world.start_replica("a").await;
    world.ready_nodeclass().await;
    let claim = format!("drain-{}", suffix(&world));
    world.create_nodeclaim(&claim, json!({})).await;
    let node = world.initialized_node(&claim).await;
    let node_name = node.name_any();
    assert!(node_name.starts_with(PREFIX), "{node_name}");
    assert_eq!(
        node.labels()
            .get("karpenter.sh/registered")
            .map(String::as_str),
        Some("true")
    );
    assert!(
        node.finalizers()
            .iter()
            .any(|f| f == "karpenter.sh/termination")
    );
    assert!(
        !node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .into_iter()
            .flatten()
            .any(|t| t.key == "karpenter.sh/unregistered"),
        "the unregistered taint is removed at registration"
    );
    assert_eq!(instances_of(&world, &claim), 1);
    bound_pod(&world, "app", &node_name, json!({"app": "web"})).await;

    world
        .nodeclaims()
        .delete(&claim, &DeleteParams::default())
        .await
        .unwrap();
    gone(&world.pods(), "app", "pod").await;
    gone(&world.nodes(), &node_name, "Node").await;
    gone(&world.nodeclaims(), &claim, "NodeClaim").await;
    eventually("instance deleted", || async {
        (instances_of(&world, &claim) == 0).then_some(())
    })
    .await;
    // The launch and the termination show on /metrics: each Exoscale request by operation and
    // status, their latency, and the cloud provider calls behind them.
    let text = world.replica_metrics("a");
    let value = |series: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
    };
    for series in [
        r#"karpenter_exoscale_api_requests_total{operation="POST /instance",code="200"}"#,
        r#"karpenter_exoscale_api_requests_total{operation="DELETE /instance/{id}",code="200"}"#,
        // Termination ends when the instance is confirmed gone.
        r#"karpenter_exoscale_api_requests_total{operation="GET /instance/{id}",code="404"}"#,
        r#"karpenter_exoscale_api_request_duration_seconds_count{operation="POST /instance"}"#,
        r#"karpenter_cloudprovider_duration_seconds_count{method="Create",provider="exoscale"}"#,
        r#"karpenter_cloudprovider_duration_seconds_count{method="Delete",provider="exoscale"}"#,
    ] {
        assert!(value(series) >= 1.0, "{series} did not move");
    }
    world.finish().await;
}

#[tokio::test]
async fn a_pdb_blocks_the_drain_until_the_termination_deadline() {
    let Some(world) = World::start("e2e-pdb", joins()).await else {
        return;
    };
    world.create_nodeclass(json!({})).await;
    world.start_replica("a").await;
    world.ready_nodeclass().await;
    let claim = format!("pdb-{}", suffix(&world));
    world
        .create_nodeclaim(&claim, json!({"terminationGracePeriod": "30s"}))
        .await;
    let node_name = world.initialized_node(&claim).await.name_any();
    bound_pod(&world, "guarded", &node_name, json!({"app": "guarded"})).await;
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "guarded"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}
    }))
    .unwrap();
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(world.client.clone(), &world.namespace);
    pdbs.create(&PostParams::default(), &pdb).await.unwrap();
    // The disruption controller must have computed the budget before evictions are refused.
    eventually("PDB observed", || {
        let pdbs = pdbs.clone();
        async move {
            let status = pdbs.get("guarded").await.ok()?.status?;
            (status.observed_generation.is_some()
                && status.expected_pods == 1
                && status.current_healthy == 1)
                .then_some(())
        }
    })
    .await;

    world
        .nodeclaims()
        .delete(&claim, &DeleteParams::default())
        .await
        .unwrap();
    let events: Api<Event> = Api::namespaced(world.client.clone(), "default");
    let blocked = eventually("FailedDraining event naming the PDB", || {
        let events = events.clone();
        let node_name = node_name.clone();
        async move {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find(|e| {
                e.reason.as_deref() == Some("FailedDraining")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref())
                        == Some(node_name.as_str())
                    && e.note
                        .as_deref()
                        .is_some_and(|n| n.contains("PodDisruptionBudget"))
            })
        }
    })
    .await;
    assert!(blocked.note.unwrap().contains("guarded"));
    // Still blocked: the pod is there while the deadline lies ahead.
    let deadline: k8s_openapi::jiff::Timestamp = world
        .nodeclaims()
        .get(&claim)
        .await
        .unwrap()
        .annotations()
        .get(NODECLAIM_TERMINATION_TIMESTAMP_ANNOTATION)
        .expect("termination deadline annotation")
        .parse()
        .unwrap();
    let pod_seen_at = k8s_openapi::jiff::Timestamp::now();
    assert!(world.pods().get_opt("guarded").await.unwrap().is_some());
    assert!(
        pod_seen_at < deadline,
        "the PDB held the pod until at least {pod_seen_at}"
    );

    gone(&world.pods(), "guarded", "pod").await;
    let removed_at = k8s_openapi::jiff::Timestamp::now();
    assert!(
        removed_at >= deadline,
        "pod removed at {removed_at}, before the deadline {deadline}"
    );
    gone(&world.nodes(), &node_name, "Node").await;
    gone(&world.nodeclaims(), &claim, "NodeClaim").await;
    world.finish().await;
}

#[tokio::test]
async fn an_instance_that_never_joins_is_removed_after_the_registration_ttl() {
    let policy: harness::KubeletPolicy = Arc::new(|name: &str| KubeletBehaviour {
        join: if name.contains("lost") {
            Join::Never
        } else {
            Join::After(Duration::ZERO)
        },
        ..KubeletBehaviour::default()
    });
    let Some(world) = World::start("e2e-ttl", policy).await else {
        return;
    };
    world.create_nodeclass(json!({})).await;
    world.start_replica("a").await;
    world.ready_nodeclass().await;
    let claim = format!("lost-{}", suffix(&world));
    world.create_nodeclaim(&claim, json!({})).await;
    let claims = world.nodeclaims();
    let launched = eventually("NodeClaim launched", || {
        let claims = claims.clone();
        let claim = claim.clone();
        async move {
            let c = claims.get_opt(&claim).await.ok()??;
            c.status
                .as_ref()?
                .conditions
                .is_true("Launched")
                .then_some(c)
        }
    })
    .await;
    let registered = launched
        .status
        .unwrap()
        .conditions
        .get_condition("Registered")
        .cloned()
        .unwrap();
    assert_eq!(
        (registered.status, registered.reason.as_str()),
        (ConditionStatus::Unknown, "NodeNotFound")
    );
    assert_eq!(instances_of(&world, &claim), 1);
    gone(&claims, &claim, "NodeClaim").await;
    eventually("instance deleted", || async {
        (instances_of(&world, &claim) == 0).then_some(())
    })
    .await;
    world.finish().await;
}

/// The real binary with both clients' rate limits turned down to about one request at a time:
/// the waits show on its `/metrics`, in the two histograms the README documents.
#[tokio::test]
async fn rate_limit_waits_show_on_metrics() {
    let Some(mut world) = World::start("e2e-waits", joins()).await else {
        return;
    };
    for (key, value) in [
        ("KUBE_CLIENT_QPS", "5"),
        ("KUBE_CLIENT_BURST", "1"),
        ("EXOSCALE_API_QPS", "2"),
        ("EXOSCALE_API_BURST", "1"),
    ] {
        world.env.insert(key.into(), value.into());
    }
    world.create_nodeclass(json!({})).await;
    let port = harness::free_port();
    let _controller = world.spawn_controller_serving_metrics("waits", port);
    world.ready_nodeclass().await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}/metrics");
    eventually("both clients' rate-limit waits on /metrics", || async {
        let text = http.get(&url).send().await.ok()?.text().await.ok()?;
        let count = |family: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(family)?.trim().parse::<f64>().ok())
        };
        let kube = count("karpenter_exoscale_kube_client_rate_limit_wait_seconds_count ")?;
        let exoscale = count("karpenter_exoscale_api_rate_limit_wait_seconds_count ")?;
        (kube >= 1.0 && exoscale >= 1.0).then_some(())
    })
    .await;
    world.finish().await;
}

/// Fault: the cloud answers no launch for a while (parked at the sim, as a burst waiting on
/// the API rate limit would be) while more NodeClaims wait to launch than the CPU-sized
/// reconcile slots (100). A Node that registers meanwhile still gets its NodeClaim registered:
/// launches do not hold every slot of the NodeClaim lifecycle controller.
#[tokio::test]
async fn a_node_registers_while_more_launches_wait_on_the_cloud_than_cpu_sized_slots() {
    const WAITING: u32 = 120;
    let never: harness::KubeletPolicy = Arc::new(|_: &str| KubeletBehaviour {
        join: Join::Never,
        ..KubeletBehaviour::default()
    });
    let Some(mut world) = World::start("e2e-slots", never).await else {
        return;
    };
    // Parked requests stay parked; the NodeClaim that launched stays until it registers.
    world.exoscale_request_timeout = Duration::from_secs(600);
    world
        .env
        .insert("NODECLAIM_REGISTRATION_TTL".into(), "10m".into());
    world.env.insert("CPU_REQUESTS".into(), "1000".into());
    world.create_nodeclass(json!({})).await;
    world.start_replica("a").await;
    world.ready_nodeclass().await;
    let claims = world.nodeclaims();
    let probe = format!("probe-{}", suffix(&world));
    world.create_nodeclaim(&probe, json!({})).await;
    eventually("the probe NodeClaim launched", || async {
        let c = claims.get_opt(&probe).await.ok()??;
        c.status?.conditions.is_true("Launched").then_some(())
    })
    .await;

    let gate = karpenter_exoscale::sim::HoldGate::new();
    world.sim.inject(
        karpenter_exoscale::sim::Fault::on(
            "create-instance",
            karpenter_exoscale::sim::FaultAction::Hold {
                after_commit: false,
                only_status: None,
                gate: gate.clone(),
            },
        )
        .always(),
    );
    for i in 0..WAITING {
        world
            .create_nodeclaim(&format!("waiting-{i}-{}", suffix(&world)), json!({}))
            .await;
    }
    eventually("every launch parked at the cloud", || async {
        (gate.held() >= WAITING).then_some(())
    })
    .await;
    world.join_now(&probe).await;
    eventually("the probe NodeClaim registered", || async {
        let c = claims.get_opt(&probe).await.ok()??;
        c.status?.conditions.is_true("Registered").then_some(())
    })
    .await;
    assert_eq!(gate.held(), WAITING, "the launches are still parked");
    assert_eq!(
        world.sim.call_count("create-instance"),
        1,
        "only the probe's create was answered"
    );
    gate.release();
    world.finish().await;
}

/// Fault: someone edits a running instance's labels (the console, a script), so it drops out
/// of the label-filtered instance list, while its Node is NotReady. The list alone would call
/// the instance gone and its NodeClaim garbage; the instance's own read says it exists, so the
/// NodeClaim, and with it the VM, are kept.
#[tokio::test]
async fn gc_keeps_a_nodeclaim_whose_instance_left_the_list_but_exists() {
    use karpenter_exoscale::sim::kubelet::Fault as KubeletFault;
    let sick: harness::KubeletPolicy = Arc::new(|_: &str| KubeletBehaviour {
        fault: KubeletFault::NotReadyAfter(Duration::from_secs(3)),
        ..KubeletBehaviour::default()
    });
    let Some(world) = World::start("e2e-gc-labels", sick).await else {
        return;
    };
    world.create_nodeclass(json!({})).await;
    world.start_replica("a").await;
    world.ready_nodeclass().await;
    let claim = format!("relabelled-{}", suffix(&world));
    world.create_nodeclaim(&claim, json!({})).await;
    let node = world.initialized_node(&claim).await.name_any();
    eventually("the Node NotReady", || async {
        let n = world.nodes().get(&node).await.ok()?;
        let ready = n
            .status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "Ready")?;
        (ready.status == "False").then_some(())
    })
    .await;
    let instance = world.live_instances().into_iter().next().expect("its VM");
    let mut labels = instance.labels.clone();
    assert!(labels.remove(INSTANCE_CLUSTER_ID_LABEL).is_some());
    let op = world
        .exo
        .update_instance_labels(&instance.id, &labels)
        .await
        .unwrap();
    world.exo.wait_operation(&op).await.unwrap();
    let lists = world.sim.call_count("list-instances");
    eventually_within("five more GC passes", Duration::from_secs(120), || async {
        (world.sim.call_count("list-instances") >= lists + 5).then_some(())
    })
    .await;
    let kept = world.nodeclaims().get(&claim).await.unwrap();
    assert!(
        kept.metadata.deletion_timestamp.is_none(),
        "the NodeClaim of a running instance was collected"
    );
    assert_eq!(world.live_instances().len(), 1, "its VM was deleted");
    assert!(
        world.sim.call_count("get-instance") > 0,
        "GC confirmed by a read"
    );
    world.finish().await;
}

/// Fault: another cluster runs with OUR `EXOSCALE_SKS_CLUSTER_ID` (a mistyped setting, here or
/// there). Its instances carry our cluster-id label and its own kube-system UID. Garbage
/// collection deletes our orphan, and never another cluster's instance (other ID, or our ID
/// with another UID), nor one with our ID but no UID that no NodeClaim owns — those are
/// reported in `karpenter_exoscale_unowned_instances` and an `UnownedInstance` event.
/// Throughout, one NodeClaim never gets a provider ID (deleted, held by someone else's
/// finalizer), so cluster state is never "synced": collection runs all the same.
#[tokio::test]
async fn a_wrong_cluster_id_never_lets_gc_delete_another_clusters_instances() {
    let Some(world) = World::start("e2e-gc", joins()).await else {
        return;
    };
    world.create_nodeclass(json!({})).await;
    let claims: Api<NodeClaim> = Api::all(world.client.clone());
    let held = format!("held-{}", suffix(&world));
    let held_claim: NodeClaim = serde_json::from_value(json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
        "metadata": {"name": held, "finalizers": ["e2e.test/hold"]},
        "spec": {
            "requirements": [],
            "nodeClassRef": {"group": "karpenter.exoscale.com", "kind": "ExoscaleNodeClass", "name": "absent"}
        }
    }))
    .unwrap();
    claims
        .create(&PostParams::default(), &held_claim)
        .await
        .unwrap();
    claims
        .delete(&held, &DeleteParams::default())
        .await
        .unwrap();
    world.start_replica("a").await;
    world.ready_nodeclass().await;
    // Instances launched outside any controller, as four "clusters" would.
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let launcher = |cluster_id: String, cluster_uid: String| {
        build_cloud(
            ExoscaleSettings {
                zone: world.sim.zone().into(),
                cluster_id,
                cluster_uid,
                instance_prefix: PREFIX.into(),
                cluster_endpoint: "https://127.0.0.1:6443".into(),
                cluster_domain: "cluster.local".into(),
                bootstrap_token_ttl: std::time::Duration::from_secs(600),
            },
            world.exo.clone(),
            world.client.clone(),
            clock.clone(),
        )
    };
    let other_uid = || uuid::Uuid::new_v4().to_string();
    let ours = launcher(world.sim.cluster_id().into(), world.cluster_uid.clone())
        .await
        .unwrap();
    let other_id = launcher(uuid::Uuid::new_v4().to_string(), other_uid())
        .await
        .unwrap();
    let same_id = launcher(world.sim.cluster_id().into(), other_uid())
        .await
        .unwrap();
    let claim = |name: String| -> NodeClaim {
        serde_json::from_value(json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": name, "uid": uuid::Uuid::new_v4().to_string()},
            "spec": {
                "requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["standard.small"]}],
                "nodeClassRef": {"group": "karpenter.exoscale.com", "kind": "ExoscaleNodeClass", "name": world.nodeclass}
            }
        }))
        .unwrap()
    };
    // The providers read the NodeClass from their own store: retry until it is there.
    let launch =
        |provider: Arc<karpenter_exoscale::cloudprovider::exoscale::ExoscaleCloudProvider>,
         name: String| {
            let c = claim(name);
            async move {
                let launched = eventually("a launch", || {
                    let (p, c) = (provider.clone(), c.clone());
                    async move { p.create(&c).await.ok() }
                })
                .await;
                let pid = launched.status.unwrap().provider_id.unwrap();
                pid.trim_start_matches("exoscale://").to_string()
            }
        };
    let s = suffix(&world);
    let orphan = launch(ours.provider.clone(), format!("ghost-{s}")).await;
    // Launched as another cluster's (so no pass can take it for our orphan), then stripped.
    let legacy = launch(same_id.provider.clone(), format!("legacy-{s}")).await;
    let foreign_id = launch(other_id.provider.clone(), format!("foreign-{s}")).await;
    let foreign_uid = launch(same_id.provider.clone(), format!("twin-{s}")).await;
    // An instance of an older version: our cluster ID, no UID label, no NodeClaim.
    let mut labels = world
        .live_instances()
        .into_iter()
        .find(|i| i.id == legacy)
        .unwrap()
        .labels;
    assert!(labels.remove(INSTANCE_CLUSTER_UID_LABEL).is_some());
    let op = world
        .exo
        .update_instance_labels(&legacy, &labels)
        .await
        .unwrap();
    world.exo.wait_operation(&op).await.unwrap();
    let same_id_instance = world
        .live_instances()
        .into_iter()
        .find(|i| i.id == foreign_uid)
        .unwrap();
    assert_eq!(
        same_id_instance
            .labels
            .get(INSTANCE_CLUSTER_ID_LABEL)
            .map(String::as_str),
        Some(world.sim.cluster_id()),
        "the wrongly configured cluster labels its instances with our cluster ID"
    );

    eventually("our orphan deleted", || async {
        (!world.live_instances().iter().any(|i| i.id == orphan)).then_some(())
    })
    .await;
    // Several more collection passes later, every instance not proven ours is still there.
    let lists = world.sim.call_count("list-instances");
    eventually_within("three more GC passes", Duration::from_secs(60), || async {
        (world.sim.call_count("list-instances") >= lists + 3).then_some(())
    })
    .await;
    let live: Vec<String> = world.live_instances().into_iter().map(|i| i.id).collect();
    for (what, id) in [
        ("another cluster ID's", &foreign_id),
        ("another cluster UID's under our ID", &foreign_uid),
        ("an unproven legacy", &legacy),
    ] {
        assert!(live.contains(id), "{what} instance {id} was deleted");
    }
    let metrics = world.replica_metrics("a");
    for series in [
        "karpenter_exoscale_unowned_instances{reason=\"foreign_cluster\"} 1",
        "karpenter_exoscale_unowned_instances{reason=\"unproven\"} 1",
    ] {
        assert!(metrics.contains(series), "missing {series} in:\n{metrics}");
    }
    let events: Api<Event> = Api::all(world.client.clone());
    let reported = eventually("UnownedInstance events", || {
        let events = events.clone();
        let (legacy, foreign_uid) = (legacy.clone(), foreign_uid.clone());
        async move {
            let list = events.list(&ListParams::default()).await.ok()?;
            let notes: Vec<String> = list
                .items
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some("UnownedInstance"))
                .filter_map(|e| e.note)
                .collect();
            let has = |id: &str| notes.iter().any(|n| n.contains(id));
            (has(&legacy) && has(&foreign_uid)).then_some(notes)
        }
    })
    .await;
    assert!(
        reported
            .iter()
            .any(|n| n.contains("EXOSCALE_SKS_CLUSTER_ID")),
        "{reported:?}"
    );

    // GC runs as a periodic controller: its passes are timed, and a failed pass (the instance
    // list refused) is counted as a reconcile error of the collector, then the next one runs.
    let passes = |text: &str| -> u64 {
        text.lines()
            .find(|l| {
                l.starts_with("karpenter_exoscale_periodic_duration_seconds_count{")
                    && l.contains("controller=\"instance.garbagecollection\"")
            })
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or(0)
    };
    assert!(passes(&metrics) >= 3, "GC passes not timed:\n{metrics}");
    world.sim.inject(karpenter_exoscale::sim::Fault::status(
        "list-instances",
        400,
        "injected: listing refused",
    ));
    let before = passes(&world.replica_metrics("a"));
    eventually_within(
        "a failed GC pass counted",
        Duration::from_secs(60),
        || async {
            let text = world.replica_metrics("a");
            let failed = text.lines().any(|l| {
                l.starts_with("karpenter_exoscale_reconcile_errors_total{")
                    && l.contains("controller=\"instance.garbagecollection\"")
            });
            (failed && passes(&text) >= before + 2).then_some(())
        },
    )
    .await;
    assert!(
        claims
            .get(&held)
            .await
            .is_ok_and(|c| c.status.and_then(|s| s.provider_id).is_none()),
        "the held NodeClaim stayed launching throughout"
    );
    claims
        .patch(
            &held,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    drop((ours, other_id, same_id));
    world.finish().await;
}

#[tokio::test]
async fn a_nodeclass_with_an_unknown_security_group_reports_not_ready_naming_it() {
    let Some(world) = World::start("e2e-nc", joins()).await else {
        return;
    };
    world
        .create_nodeclass(json!({"securityGroupSelectorTerms": [{"name": "no-such-group"}]}))
        .await;
    world.start_replica("a").await;
    let classes: Api<ExoscaleNodeClass> = Api::all(world.client.clone());
    let name = world.nodeclass.clone();
    let ready = eventually("NodeClass Ready=False", || {
        let classes = classes.clone();
        let name = name.clone();
        async move {
            let nc = classes.get_opt(&name).await.ok()??;
            let c = nc.status?.conditions.get_condition("Ready").cloned()?;
            (c.status == ConditionStatus::False).then_some(c)
        }
    })
    .await;
    assert!(ready.message.contains("no-such-group"), "{}", ready.message);
    assert!(
        ready.message.contains("SecurityGroupsResolved"),
        "{}",
        ready.message
    );
    let nc = classes.get(&name).await.unwrap();
    assert!(
        nc.status
            .as_ref()
            .unwrap()
            .conditions
            .is_true("TemplateResolved")
    );
    assert!(
        nc.finalizers()
            .iter()
            .any(|f| f == "exoscale.com/nodeclass-finalizer")
    );
    world.finish().await;
}

/// Fault: the leader is partitioned from kube-apiserver (a TCP proxy between them is cut) but
/// still reaches Exoscale. It stops writing at its renew deadline — provably no later than the
/// renew deadline after the cut — and exits; the standby takes over and launches; through GC's
/// grace period and several more passes nothing is deleted, the successor's instance included.
#[tokio::test]
async fn a_leader_cut_off_from_the_api_server_stands_down_and_deletes_nothing() {
    let Some(world) = World::start("e2e-partition", joins()).await else {
        return;
    };
    let plane = support::shared().expect("control plane");
    let mut via = plane.config().await;
    let target: std::net::SocketAddr = via
        .cluster_url
        .authority()
        .expect("apiserver address")
        .as_str()
        .parse()
        .expect("a loopback socket address");
    let proxy = TcpProxy::start(target).await;
    via.cluster_url = format!("https://{}", proxy.addr()).parse().unwrap();
    via.default_retry = false;
    let partitioned = kube::Client::try_from(via).unwrap();

    world.create_nodeclass(json!({})).await;
    world.start_replica_with("replica-a", partitioned).await;
    world.await_leader("replica-a").await;
    world.ready_nodeclass().await;
    world.start_replica("replica-b").await;
    let fence = world.await_open_fence("replica-a").await;

    let cut = Instant::now();
    proxy.cut();
    // Writes end at the last successful renewal's start + the renew deadline (4 s in the
    // harness), which began before the cut.
    let deadline = fence
        .deadline()
        .expect("replica-a held the Lease at the cut");
    let renew_deadline = Duration::from_secs(4);
    assert!(
        deadline <= cut + renew_deadline,
        "writes allowed {:?} past the cut",
        deadline - cut
    );
    eventually("replica-a fenced", || async {
        (!fence.allows()).then_some(())
    })
    .await;
    eprintln!(
        "partitioned leader: writes fenced {:.2} s after the cut",
        deadline.saturating_duration_since(cut).as_secs_f64()
    );
    // It still reaches Exoscale, but its client refuses to send a write.
    let deletes = world.sim.call_count("delete-instance");
    let refused = world
        .exo
        .fenced(fence.clone())
        .delete_instance(&uuid::Uuid::new_v4().to_string())
        .await
        .expect_err("a fenced delete");
    assert!(
        matches!(refused, karpenter_exoscale::exoscale::Error::Fenced(_)),
        "{refused}"
    );
    assert_eq!(world.sim.call_count("delete-instance"), deletes);
    let outcome = world
        .replica_outcome("replica-a", Duration::from_secs(30))
        .await;
    assert!(
        matches!(
            outcome,
            Err(karpenter_exoscale::operator::RunError::LostLeadership)
        ),
        "{outcome:?}"
    );

    world.await_leader("replica-b").await;
    let claim = format!("successor-{}", suffix(&world));
    world.create_nodeclaim(&claim, json!({})).await;
    world.initialized_node(&claim).await;
    let launched: Vec<String> = world.live_instances().into_iter().map(|i| i.id).collect();
    assert_eq!(launched.len(), 1, "{launched:?}");
    // GC grace (5 s) + one interval (2 s), then more: five more collection passes of replica-b.
    let lists = world.sim.call_count("list-instances");
    eventually_within("five more GC passes", Duration::from_secs(90), || async {
        (world.sim.call_count("list-instances") >= lists + 5).then_some(())
    })
    .await;
    assert_eq!(
        world.sim.call_count("delete-instance"),
        deletes,
        "an instance was deleted"
    );
    let live: Vec<String> = world.live_instances().into_iter().map(|i| i.id).collect();
    assert_eq!(live, launched);
    world.finish().await;
}

/// Fault: the create's response is lost and the backend commits it seconds later, after the
/// first lookup. Exactly one VM exists for the NodeClaim through GC's grace period and more
/// passes, and its Node joins with the token from the first (and only) create.
#[tokio::test]
async fn a_lost_create_response_with_a_late_commit_gives_one_vm_that_joins() {
    let Some(world) = World::start("e2e-lostcreate", joins()).await else {
        return;
    };
    world.create_nodeclass(json!({})).await;
    world.start_replica("a").await;
    world.ready_nodeclass().await;
    world.sim.inject(karpenter_exoscale::sim::Fault::on(
        "create-instance",
        karpenter_exoscale::sim::FaultAction::LoseResponseCommitLater(Duration::from_secs(3)),
    ));
    let claim = format!("late-{}", suffix(&world));
    world.create_nodeclaim(&claim, json!({})).await;
    let node = world.initialized_node(&claim).await;
    assert_eq!(
        world.sim.call_count("create-instance"),
        1,
        "the create was re-sent"
    );
    assert!(world.sim.calls().iter().any(|c| c.response_lost));
    // GC grace (5 s) + interval (2 s), then more passes: still exactly one VM.
    let lists = world.sim.call_count("list-instances");
    eventually_within("five more GC passes", Duration::from_secs(90), || async {
        (world.sim.call_count("list-instances") >= lists + 5).then_some(())
    })
    .await;
    assert_eq!(instances_of(&world, &claim), 1);
    assert_eq!(world.live_instances().len(), 1);
    let provider_id = node.spec.and_then(|s| s.provider_id).unwrap_or_default();
    assert_eq!(
        provider_id,
        format!("exoscale://{}", world.live_instances()[0].id)
    );
    world.finish().await;
}

#[tokio::test]
async fn only_the_leader_acts_and_a_standby_takes_over_when_it_stops() {
    let Some(world) = World::start("e2e-leader", joins()).await else {
        return;
    };
    world.start_replica("replica-a").await;
    world.start_replica("replica-b").await;
    let first = eventually("a leader", || world.lease_holder()).await;
    world.create_nodeclass(json!({})).await;
    world.ready_nodeclass().await;
    // Every event about the NodeClass comes from the leader.
    let events: Api<Event> = Api::namespaced(world.client.clone(), "default");
    let reporters: Vec<String> = eventually("Ready event", || {
        let events = events.clone();
        let nodeclass = world.nodeclass.clone();
        async move {
            let list = events.list(&ListParams::default()).await.ok()?;
            let reporters: Vec<String> = list
                .items
                .into_iter()
                .filter(|e| {
                    e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(nodeclass.as_str())
                })
                .filter_map(|e| e.reporting_instance)
                .collect();
            (!reporters.is_empty()).then_some(reporters)
        }
    })
    .await;
    assert!(
        reporters.iter().all(|r| *r == first),
        "{reporters:?} vs leader {first}"
    );
    // `karpenter_exoscale_leader` tells operators which replica acts.
    let standby = if first == "replica-a" {
        "replica-b"
    } else {
        "replica-a"
    };
    let leader_value = |identity: &str| {
        let series = format!("karpenter_exoscale_leader{{identity=\"{identity}\"}} ");
        world
            .replica_metrics(identity)
            .lines()
            .find_map(|l| l.strip_prefix(series.as_str()).map(str::to_string))
    };
    assert_eq!(
        leader_value(&first).as_deref(),
        Some("1.0"),
        "the leader exports karpenter_exoscale_leader 1"
    );
    // The standby exports 0 rather than nothing, so a sum over replicas can read 0.
    assert_eq!(
        leader_value(standby).as_deref(),
        Some("0.0"),
        "the standby exports karpenter_exoscale_leader 0"
    );

    world.stop_replica(&first).await;
    let second = eventually("the standby leads", || async {
        world.lease_holder().await.filter(|h| *h != first)
    })
    .await;
    assert_ne!(second, first);
    eventually(
        "the new leader exports karpenter_exoscale_leader 1",
        || async { (leader_value(&second).as_deref() == Some("1.0")).then_some(()) },
    )
    .await;
    let claim = format!("leader-{}", suffix(&world));
    world.create_nodeclaim(&claim, json!({})).await;
    world.initialized_node(&claim).await;
    assert_eq!(instances_of(&world, &claim), 1);
    world.finish().await;
}

/// A leader controller named "injected" that waits for the returned trigger, then runs
/// `then` (a panic, or nothing: its work ends).
fn injected_controller(
    then: fn(),
) -> (
    tokio::sync::oneshot::Sender<()>,
    karpenter_exoscale::operator::ExtraController,
) {
    let (trigger, fired) = tokio::sync::oneshot::channel::<()>();
    let controller = karpenter_exoscale::operator::ExtraController {
        name: "injected",
        start: Box::new(move |_ctx, _shutdown| {
            Box::pin(async move {
                let _ = fired.await;
                then();
            })
        }),
    };
    (trigger, controller)
}

#[tokio::test]
async fn a_panicking_controller_stops_its_replica_naming_it_and_a_standby_takes_over() {
    let Some(world) = World::start("e2e-panic", joins()).await else {
        return;
    };
    // A controller that panics when the test says so, once its replica leads.
    let (trigger, faulty) = injected_controller(|| panic!("fault injected by the test"));
    world
        .start_replica_with_extra("replica-a", world.client.clone(), vec![faulty])
        .await;
    world.await_leader("replica-a").await;
    world.start_replica("replica-b").await;
    world.create_nodeclass(json!({})).await;
    world.ready_nodeclass().await;
    let fence = world.await_open_fence("replica-a").await;

    trigger.send(()).expect("the faulty controller is running");
    let ended = world
        .replica_outcome("replica-a", Duration::from_secs(30))
        .await;
    match ended {
        Err(karpenter_exoscale::operator::RunError::Controller(TaskError::Panicked(panicked))) => {
            assert_eq!(panicked.name, "injected");
            assert_eq!(panicked.message, "fault injected by the test");
        }
        other => panic!("the replica must stop naming the panicked controller: {other:?}"),
    }
    // Its other controllers stopped with it: nothing it holds can write any more.
    assert!(!fence.allows(), "a stopped replica's fence refuses writes");
    // It released the Lease, so the standby leads and acts.
    world.await_leader("replica-b").await;
    let claim = format!("panic-{}", suffix(&world));
    world.create_nodeclaim(&claim, json!({})).await;
    world.initialized_node(&claim).await;
    assert_eq!(instances_of(&world, &claim), 1);
    world.finish().await;
}

#[tokio::test]
async fn a_controller_that_ends_while_its_replica_leads_stops_the_replica() {
    let Some(world) = World::start("e2e-ended", joins()).await else {
        return;
    };
    // A controller whose work ends (as one whose watch stream closed would), once told to.
    let (trigger, ending) = injected_controller(|| {});
    world
        .start_replica_with_extra("replica-a", world.client.clone(), vec![ending])
        .await;
    world.await_leader("replica-a").await;
    let fence = world.await_open_fence("replica-a").await;
    trigger.send(()).expect("the controller is running");
    let ended = world
        .replica_outcome("replica-a", Duration::from_secs(30))
        .await;
    assert!(
        matches!(
            ended,
            Err(karpenter_exoscale::operator::RunError::Controller(
                TaskError::Ended("injected")
            ))
        ),
        "the replica must stop naming the controller that ended: {ended:?}"
    );
    assert!(!fence.allows(), "a stopped replica's fence refuses writes");
    world.finish().await;
}

#[tokio::test]
async fn a_controller_restarted_mid_launch_neither_leaks_nor_duplicates_a_vm() {
    let Some(world) = World::start("e2e-restart", joins()).await else {
        return;
    };
    world.create_nodeclass(json!({})).await;
    world.start_replica("first").await;
    world.ready_nodeclass().await;
    // Slow operations keep the launch in flight long enough to crash in the middle of it.
    world.sim.set_operation_delay(Duration::from_secs(3));
    let claim = format!("restart-{}", suffix(&world));
    let creates = world.sim.call_count("create-instance");
    world.create_nodeclaim(&claim, json!({})).await;
    eventually("create-instance sent", || async {
        (world.sim.call_count("create-instance") > creates).then_some(())
    })
    .await;
    world.kill_replica("first");
    world.start_replica("second").await;
    world.initialized_node(&claim).await;
    world.sim.set_operation_delay(Duration::ZERO);
    assert_eq!(
        instances_of(&world, &claim),
        1,
        "exactly one VM for the NodeClaim"
    );
    let provider_id = world
        .nodeclaims()
        .get(&claim)
        .await
        .unwrap()
        .status
        .unwrap()
        .provider_id
        .unwrap();
    let ids: Vec<String> = world
        .live_instances()
        .iter()
        .map(|i| format!("exoscale://{}", i.id))
        .collect();
    assert!(ids.contains(&provider_id), "{provider_id} not in {ids:?}");
    world.finish().await;
}

/// The NodeClaim's `VolumesDetached` condition as (status, reason), while the claim exists.
async fn volumes_detached(world: &World, claim: &str) -> Option<(ConditionStatus, String)> {
    let claim = world.nodeclaims().get_opt(claim).await.ok()??;
    let condition = claim
        .status?
        .conditions
        .get_condition(conditions::VOLUMES_DETACHED)?
        .clone();
    Some((condition.status, condition.reason))
}

#[tokio::test]
async fn termination_waits_for_volume_attachments_to_be_deleted() {
    let Some(world) = World::start("e2e-volumes", joins()).await else {
        return;
    };
    world.create_nodeclass(json!({})).await;
    world.start_replica("a").await;
    world.ready_nodeclass().await;
    let claim = format!("volumes-{}", suffix(&world));
    world.create_nodeclaim(&claim, json!({})).await;
    let node_name = world.initialized_node(&claim).await.name_any();
    let va_name = format!("{PREFIX}va-{}", suffix(&world));
    let attachments = volume_attachment(&world, &va_name, &node_name).await;

    world
        .nodeclaims()
        .delete(&claim, &DeleteParams::default())
        .await
        .unwrap();
    eventually("VolumesDetached Unknown, awaiting detachment", || async {
        let (status, reason) = volumes_detached(&world, &claim).await?;
        (status == ConditionStatus::Unknown
            && reason == conditions::AWAITING_VOLUME_DETACHMENT_REASON)
            .then_some(())
    })
    .await;
    let events: Api<Event> = Api::namespaced(world.client.clone(), "default");
    eventually(
        "AwaitingVolumeDetachment event naming the attachment",
        || {
            let events = events.clone();
            let (node_name, va_name) = (node_name.clone(), va_name.clone());
            async move {
                let list = events.list(&ListParams::default()).await.ok()?;
                list.items
                    .into_iter()
                    .any(|e| {
                        e.reason.as_deref() == Some("AwaitingVolumeDetachment")
                            && e.regarding.as_ref().and_then(|r| r.name.as_deref())
                                == Some(node_name.as_str())
                            && e.note.as_deref().is_some_and(|n| n.contains(&va_name))
                    })
                    .then_some(())
            }
        },
    )
    .await;
    // Drained, but held: the instance and the Node stay while the volume is attached.
    let held = world.nodeclaims().get(&claim).await.unwrap();
    assert!(held.status.unwrap().conditions.is_true(conditions::DRAINED));
    assert_eq!(instances_of(&world, &claim), 1, "instance kept");
    assert!(world.nodes().get_opt(&node_name).await.unwrap().is_some());
    assert_eq!(
        volumes_detached(&world, &claim).await.map(|c| c.0),
        Some(ConditionStatus::Unknown),
        "still waiting"
    );

    attachments
        .delete(&va_name, &DeleteParams::default())
        .await
        .unwrap();
    gone(&world.nodes(), &node_name, "Node").await;
    gone(&world.nodeclaims(), &claim, "NodeClaim").await;
    eventually("instance deleted", || async {
        (instances_of(&world, &claim) == 0).then_some(())
    })
    .await;
    world.finish().await;
}

#[tokio::test]
async fn the_termination_deadline_ends_the_wait_for_volume_detachment() {
    let Some(world) = World::start("e2e-volumes-deadline", joins()).await else {
        return;
    };
    world.create_nodeclass(json!({})).await;
    world.start_replica("a").await;
    world.ready_nodeclass().await;
    let claim = format!("volumes-tgp-{}", suffix(&world));
    world
        .create_nodeclaim(&claim, json!({"terminationGracePeriod": "10s"}))
        .await;
    let node_name = world.initialized_node(&claim).await.name_any();
    let va_name = format!("{PREFIX}va-tgp-{}", suffix(&world));
    let attachments = volume_attachment(&world, &va_name, &node_name).await;

    world
        .nodeclaims()
        .delete(&claim, &DeleteParams::default())
        .await
        .unwrap();
    // The attachment never goes; the deadline lets termination finish regardless.
    gone(&world.nodes(), &node_name, "Node").await;
    gone(&world.nodeclaims(), &claim, "NodeClaim").await;
    eventually("instance deleted", || async {
        (instances_of(&world, &claim) == 0).then_some(())
    })
    .await;
    assert!(
        attachments.get_opt(&va_name).await.unwrap().is_some(),
        "the attachment was still there when the node went"
    );
    attachments
        .delete(&va_name, &DeleteParams::default())
        .await
        .unwrap();
    world.finish().await;
}

/// Node repair (feature gate `NodeRepair`): a node whose Ready condition has been False for
/// longer than the provider's toleration (15 min) has its NodeClaim deleted at once, and
/// provisioning replaces it for the pod it ran. The 20 % rule is covered by unit tests in
/// `controllers::repair`.
#[tokio::test]
async fn an_unhealthy_node_is_repaired_and_replaced() {
    let Some(mut world) = World::start("e2e-repair", joins()).await else {
        return;
    };
    world
        .env
        .insert("FEATURE_GATES".into(), "NodeRepair=true".into());
    world.create_nodeclass(json!({})).await;
    world.start_replica("repair-a").await;
    world.ready_nodeclass().await;
    let pool = format!("repair-{}", suffix(&world));
    world
        .create_nodepool(
            &pool,
            json!({
                "template": {"spec": {
                    "requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["standard.small"]}],
                    "expireAfter": "Never"
                }},
                "disruption": {"consolidateAfter": "Never"}
            }),
        )
        .await;
    let deployments: Api<Deployment> = Api::namespaced(world.client.clone(), &world.namespace);
    let deployment: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "app"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "repaired"}},
            "template": {"metadata": {"labels": {"app": "repaired"}},
                "spec": {"nodeSelector": {NODEPOOL_LABEL: pool},
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                        "resources": {"requests": {"cpu": "200m", "memory": "64Mi"}}}]}}}
    }))
    .unwrap();
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .expect("create Deployment");
    let pods = world.pods();
    let bound_to = |pods: Api<Pod>| async move {
        let list = pods
            .list(&ListParams::default().labels("app=repaired"))
            .await
            .ok()?;
        let live: Vec<&Pod> = list
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        match live.as_slice() {
            [pod] => pod.spec.as_ref()?.node_name.clone(),
            _ => None,
        }
    };
    let sick = eventually("the pod is bound", || bound_to(pods.clone())).await;
    let sick_claim = world
        .nodeclaims()
        .list(&ListParams::default().labels(&format!("{NODEPOOL_LABEL}={pool}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|c| c.status.as_ref().and_then(|s| s.node_name.as_deref()) == Some(sick.as_str()))
        .expect("the NodeClaim of the pod's node")
        .name_any();

    // The kubelet reports Ready=False since 20 minutes ago: past the 15-minute toleration.
    let since = k8s_openapi::jiff::Timestamp::now()
        .checked_sub(k8s_openapi::jiff::SignedDuration::from_mins(20))
        .unwrap();
    karpenter_exoscale::sim::kubelet::set_node_condition_since(
        &world.client,
        &sick,
        "Ready",
        false,
        since,
    )
    .await
    .expect("report NotReady");

    // Repair runs every 30 s: the NodeClaim, its Node and its VM go, and the pod is rebound on
    // a new node of the pool.
    gone(&world.nodeclaims(), &sick_claim, "NodeClaim").await;
    gone(&world.nodes(), &sick, "Node").await;
    eventually("the sick node's instance deleted", || async {
        (instances_of(&world, &sick_claim) == 0).then_some(())
    })
    .await;
    let healthy = eventually("the pod is bound to a new node", || async {
        bound_to(pods.clone()).await.filter(|n| *n != sick)
    })
    .await;
    let node = world.nodes().get(&healthy).await.expect("the new node");
    assert_eq!(node.labels().get(NODEPOOL_LABEL), Some(&pool));
    let ready = node
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .expect("Ready condition");
    assert_eq!(ready.status, "True", "the replacement is healthy");

    deployments
        .delete("app", &DeleteParams::default())
        .await
        .expect("delete Deployment");
    let _ = Api::<NodePool>::all(world.client.clone())
        .delete(&pool, &DeleteParams::default())
        .await;
    world.finish().await;
}

/// Open watch requests per collection path: now, and the most at once.
type WatchCounts = Arc<std::sync::Mutex<std::collections::BTreeMap<String, (usize, usize)>>>;

/// A kube client transport that counts watch requests while their response streams are open.
struct CountWatches {
    inner: kube::Client,
    watches: WatchCounts,
}

/// Closes its watch in [`WatchCounts`] when the response body is dropped.
struct OpenWatch {
    path: String,
    watches: WatchCounts,
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        if let Some(entry) = self.watches.lock().unwrap().get_mut(&self.path) {
            entry.0 -= 1;
        }
    }
}

impl tower_service::Service<http::Request<kube::client::Body>> for CountWatches {
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
        let is_watch = request
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
        let open = is_watch.then(|| {
            let path = request.uri().path().to_string();
            let mut watches = self.watches.lock().unwrap();
            let entry = watches.entry(path.clone()).or_default();
            entry.0 += 1;
            entry.1 = entry.1.max(entry.0);
            OpenWatch {
                path,
                watches: self.watches.clone(),
            }
        });
        let inner = self.inner.clone();
        Box::pin(async move {
            let response = inner.send(request).await?;
            Ok(response.map(|body| harness::Steered::new(body).holding(open)))
        })
    }
}

/// One replica, leading, with every controller running: no kind has two watches open at once
/// (the cluster index, the Controllers and the provider share one per kind).
#[tokio::test]
async fn each_kind_is_watched_once() {
    let Some(world) = World::start("e2e-watch", joins()).await else {
        return;
    };
    world.create_nodeclass(json!({})).await;
    let watches: WatchCounts = Arc::default();
    let client = kube::Client::new(
        CountWatches {
            inner: world.client.clone(),
            watches: watches.clone(),
        },
        world.namespace.clone(),
    );
    world.start_replica_with("watch-a", client).await;
    // Ready is written by the NodeClass controller, which runs beside the core controllers
    // only once this replica leads: by then every Controller has started.
    world.ready_nodeclass().await;
    let expected = [
        "/api/v1/nodes",
        "/api/v1/pods",
        "/apis/karpenter.sh/v1/nodeclaims",
        "/apis/karpenter.sh/v1/nodepools",
        "/apis/karpenter.exoscale.com/v1/exoscalenodeclasses",
        "/apis/apps/v1/daemonsets",
        "/apis/policy/v1/poddisruptionbudgets",
        "/apis/storage.k8s.io/v1/volumeattachments",
    ];
    eventually("every kind watched", || async {
        let seen = watches.lock().unwrap().clone();
        expected
            .iter()
            .all(|path| seen.get(*path).is_some_and(|(_, most)| *most >= 1))
            .then_some(())
    })
    .await;
    // A NodePool and a pod make the NodePool, NodeClaim and Node controllers reconcile.
    let pool = format!("watch-{}", suffix(&world));
    world
        .create_nodepool(
            &pool,
            json!({"template": {"spec": {
                "requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["standard.small"]}]
            }}}),
        )
        .await;
    let pools: Api<NodePool> = Api::all(world.client.clone());
    eventually("the NodePool reconciled", || async {
        let p = pools.get(&pool).await.ok()?;
        p.status
            .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == "Ready"))
    })
    .await;
    let seen = watches.lock().unwrap().clone();
    for (path, (_, most)) in &seen {
        assert_eq!(*most, 1, "{path} had {most} watches open at once: {seen:?}");
    }
    let _ = pools.delete(&pool, &DeleteParams::default()).await;
    world.finish().await;
}
