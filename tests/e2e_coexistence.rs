//! Two Karpenters in one cluster: ours (the real binary, against the simulated Exoscale cloud)
//! and another provider's, here KWOK's. Its NodePools and NodeClaims name a `KWOKNodeClass`,
//! and its Nodes carry `kwok://` provider IDs. No KWOK controller runs; the test writes what one
//! would have written, including its statuses. Upstream's controllers skip such objects
//! (`nodepoolutils.IsManaged`, `nodeclaimutils.IsManaged`, `nodeutils.IsManaged`); ours must
//! too. They must not rewrite the other NodePool's status or hash, collect its NodeClaims (its
//! instances are never in our instance list), undo its disruption taints, write disruption
//! conditions on its NodeClaims, finish its Nodes' terminations, or wait for its launches.
//!
//! "Nothing happened" cannot be waited for. Each test waits for positive signs that every
//! controller concerned has run since the foreign objects existed (our own NodeClaim launched
//! and registered, our NodePool's status counted it, the disruption conditions controller
//! marked it, more garbage-collection passes, our own Node's termination finished). Then it
//! compares each foreign object with what the test last wrote (its resourceVersion and the
//! fields a controller of ours would touch). The harness's simulated kubelets only touch the
//! Nodes of the sim's instances, and the control plane runs no node lifecycle controller, so
//! nothing else writes to the foreign objects.
//!
//! A test records every violation it finds, removes what it created, and only then fails, so
//! one run names every broken controller and leaves the shared control plane clean.

#[path = "e2e/harness.rs"]
mod harness;
mod support;

use std::future::Future;
use std::time::Duration;

use harness::{World, joins, suffix};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use karpenter_exoscale::apis::labels::{
    CAPACITY_TYPE_LABEL, DISRUPTED_TAINT_KEY, HOSTNAME_LABEL, INSTANCE_TYPE_LABEL,
    NODE_EXCLUDE_FROM_LB_LABEL, NODE_INITIALIZED_LABEL, NODE_REGISTERED_LABEL,
    NODEPOOL_HASH_ANNOTATION, NODEPOOL_HASH_VERSION_ANNOTATION, NODEPOOL_LABEL,
    TERMINATION_FINALIZER,
};
use karpenter_exoscale::apis::{Condition, ConditionsExt, NodeClaim, NodePool};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::process::Child;

const KWOK_GROUP: &str = "karpenter.kwok.sh";
const KWOK_KIND: &str = "KWOKNodeClass";
const KWOK_CLASS_LABEL: &str = "karpenter.kwok.sh/kwoknodeclass";
const KWOK_INSTANCE_TYPE: &str = "c-2x-amd64-linux";
/// The disruption conditions controller's conditions.
const DISRUPTION_CONDITIONS: [&str; 3] = ["Consolidatable", "Drifted", "Empty"];
/// How long one signal may take (a launch, a status write, a few passes).
const SIGNAL: Duration = Duration::from_secs(120);

/// Now, in whole seconds (as the API server keeps times).
fn now() -> String {
    Timestamp::from_second(Timestamp::now().as_second())
        .expect("now is a valid timestamp")
        .to_string()
}

fn condition(type_: &str, status: &str, reason: &str, at: &str) -> serde_json::Value {
    json!({"type": type_, "status": status, "reason": reason, "message": "", "lastTransitionTime": at})
}

/// `type=status(reason)` of each condition, for messages and comparisons.
fn summary(conditions: &[Condition]) -> Vec<String> {
    let mut out: Vec<String> = conditions
        .iter()
        .map(|c| format!("{}={:?}({})", c.type_, c.status, c.reason))
        .collect();
    out.sort();
    out
}

/// Polls `check` until it yields a value; after `limit`, the missing signal and the last thing
/// the check saw. Unlike the harness's panicking waits, the test cleans up first.
async fn signal<T, F, Fut>(what: &str, limit: Duration, check: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    harness::within_showing(limit, check).await.map_err(|seen| {
        format!(
            "no sign within {} s that {what}; last seen: {seen}",
            limit.as_secs()
        )
    })
}

/// Five more instance garbage-collection passes (GC lists the cloud's instances every 2 s,
/// once our cluster state is synced), as `gc_passes` in e2e_faults.rs.
async fn gc_passes(world: &World) -> Result<(), String> {
    let lists = world.sim.call_count("list-instances");
    signal("five more GC passes ran", SIGNAL, || async {
        let now = world.sim.call_count("list-instances");
        if now >= lists + 5 {
            Ok(())
        } else {
            Err(format!("{} instance lists since", now - lists))
        }
    })
    .await
}

/// What a test created in the cluster, removed at its end whatever happened.
#[derive(Default)]
struct Created {
    pools: Vec<String>,
    claims: Vec<String>,
    nodes: Vec<String>,
}

impl Created {
    /// Kills our controller first, so nothing of ours acts during the clean-up.
    async fn remove(self, world: &World, mut controller: Child) {
        let _ = controller.kill().await;
        let release = json!({"metadata": {"finalizers": null}});
        let nodes = world.nodes();
        for name in &self.nodes {
            let _ = nodes
                .patch(name, &PatchParams::default(), &Patch::Merge(&release))
                .await;
            let _ = nodes.delete(name, &DeleteParams::default()).await;
        }
        let claims = world.nodeclaims();
        for name in &self.claims {
            let _ = claims
                .patch(name, &PatchParams::default(), &Patch::Merge(&release))
                .await;
            let _ = claims.delete(name, &DeleteParams::default()).await;
        }
        let pools: Api<NodePool> = Api::all(world.client.clone());
        for name in &self.pools {
            let _ = pools
                .patch(name, &PatchParams::default(), &Patch::Merge(&release))
                .await;
            let _ = pools.delete(name, &DeleteParams::default()).await;
        }
    }
}

// ---- the other Karpenter's objects -----------------------------------------------------------

/// The status the other Karpenter wrote on its NodePool.
fn foreign_pool_status() -> serde_json::Value {
    let at = now();
    json!({
        "nodes": 3,
        "resources": {"cpu": "6", "memory": "12Gi", "nodes": "3", "pods": "330"},
        "conditions": [
            condition("ValidationSucceeded", "True", "ValidationSucceeded", &at),
            condition("NodeClassReady", "True", "NodeClassReady", &at),
            condition("NodeRegistrationHealthy", "True", "NodeRegistrationHealthy", &at),
            condition("Ready", "True", "Ready", &at),
        ]
    })
}

/// A KWOK NodePool with the status its controller wrote (consolidating at once: our conditions
/// controller, were it to look, would call its nodes Consolidatable straight away).
async fn foreign_pool(world: &World, name: &str, created: &mut Created) -> NodePool {
    created.pools.push(name.into());
    world
        .create_nodepool(
            name,
            json!({
                "disruption": {"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "0s"},
                "template": {"spec": {
                    "nodeClassRef": {"group": KWOK_GROUP, "kind": KWOK_KIND, "name": "default"},
                    "requirements": [
                        {"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": [KWOK_INSTANCE_TYPE]},
                        {"key": CAPACITY_TYPE_LABEL, "operator": "In", "values": ["on-demand"]}
                    ],
                    "expireAfter": "Never"
                }}
            }),
        )
        .await;
    Api::<NodePool>::all(world.client.clone())
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": foreign_pool_status()})),
        )
        .await
        .expect("the foreign NodePool's status")
}

/// A KWOK NodeClaim of `pool`; with a provider ID it is launched, registered and initialized on
/// Node `name` (plus `extra` conditions), without one its launch is in flight.
async fn foreign_claim(
    world: &World,
    name: &str,
    pool: &str,
    provider_id: Option<&str>,
    extra: &[serde_json::Value],
    created: &mut Created,
) -> NodeClaim {
    created.claims.push(name.into());
    let claim: NodeClaim = serde_json::from_value(json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
        "metadata": {
            "name": name,
            "labels": {
                NODEPOOL_LABEL: pool,
                KWOK_CLASS_LABEL: "default",
                INSTANCE_TYPE_LABEL: KWOK_INSTANCE_TYPE,
                CAPACITY_TYPE_LABEL: "on-demand",
            },
            "finalizers": [TERMINATION_FINALIZER],
        },
        "spec": {
            "nodeClassRef": {"group": KWOK_GROUP, "kind": KWOK_KIND, "name": "default"},
            "requirements": [
                {"key": NODEPOOL_LABEL, "operator": "In", "values": [pool]},
                {"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": [KWOK_INSTANCE_TYPE]},
                {"key": CAPACITY_TYPE_LABEL, "operator": "In", "values": ["on-demand"]}
            ],
            "expireAfter": "Never"
        }
    }))
    .expect("a KWOK NodeClaim");
    let claims = world.nodeclaims();
    let created_claim = claims
        .create(&PostParams::default(), &claim)
        .await
        .expect("create the foreign NodeClaim");
    let Some(provider_id) = provider_id else {
        return created_claim;
    };
    let at = now();
    let mut conditions = vec![
        condition("Launched", "True", "Launched", &at),
        condition("Registered", "True", "Registered", &at),
        condition("Initialized", "True", "Initialized", &at),
        condition("Ready", "True", "Ready", &at),
    ];
    conditions.extend(extra.iter().cloned());
    let resources = json!({"cpu": "2", "memory": "4Gi", "pods": "110"});
    let status = json!({"status": {
        "providerID": provider_id,
        "nodeName": name,
        "capacity": resources,
        "allocatable": resources,
        "conditions": conditions,
    }});
    claims
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("the foreign NodeClaim's status")
}

/// The Node of a KWOK NodeClaim (same name), Ready or not, with `taints`.
async fn foreign_node(
    world: &World,
    name: &str,
    pool: &str,
    ready: bool,
    taints: serde_json::Value,
    created: &mut Created,
) -> Node {
    created.nodes.push(name.into());
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                NODEPOOL_LABEL: pool,
                KWOK_CLASS_LABEL: "default",
                NODE_REGISTERED_LABEL: "true",
                NODE_INITIALIZED_LABEL: "true",
                INSTANCE_TYPE_LABEL: KWOK_INSTANCE_TYPE,
                CAPACITY_TYPE_LABEL: "on-demand",
                HOSTNAME_LABEL: name,
            },
            "finalizers": [TERMINATION_FINALIZER],
        },
        "spec": {"providerID": format!("kwok://{name}"), "taints": taints}
    }))
    .expect("a KWOK Node");
    let nodes = world.nodes();
    nodes
        .create(&PostParams::default(), &node)
        .await
        .expect("create the foreign Node");
    let at = now();
    let (status, reason) = if ready {
        ("True", "KubeletReady")
    } else {
        ("False", "KubeletNotReady")
    };
    let resources = json!({"cpu": "2", "memory": "4Gi", "pods": "110"});
    let patch = json!({"status": {
        "capacity": resources,
        "allocatable": resources,
        "conditions": [{
            "type": "Ready", "status": status, "reason": reason, "message": "",
            "lastHeartbeatTime": at, "lastTransitionTime": at,
        }],
    }});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("the foreign Node's status")
}

// ---- checks --------------------------------------------------------------------------------

fn claim_conditions(claim: &NodeClaim) -> Vec<Condition> {
    claim
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default()
}

fn taint_keys(node: &Node) -> Vec<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .map(|t| format!("{}:{}", t.key, t.effect))
        .collect()
}

/// Compares a foreign NodeClaim with `written` (the test's last write); `what` names it in
/// the violations pushed to `found`.
async fn check_claim(world: &World, what: &str, written: &NodeClaim, found: &mut Vec<String>) {
    let name = written.name_any();
    let Some(now) = world
        .nodeclaims()
        .get_opt(&name)
        .await
        .expect("read NodeClaim")
    else {
        found.push(format!("{what} NodeClaim {name}: deleted"));
        return;
    };
    if now.metadata.deletion_timestamp.is_some() {
        found.push(format!(
            "{what} NodeClaim {name}: deleted by us (deletionTimestamp set)"
        ));
    }
    let written_conditions = summary(&claim_conditions(written));
    let conditions = summary(&claim_conditions(&now));
    for type_ in DISRUPTION_CONDITIONS {
        if let Some(c) = claim_conditions(&now).get_condition(type_) {
            found.push(format!(
                "{what} NodeClaim {name}: our disruption conditions controller wrote {type_}={:?}",
                c.status
            ));
        }
    }
    if conditions != written_conditions {
        found.push(format!(
            "{what} NodeClaim {name}: conditions {conditions:?}, written {written_conditions:?}"
        ));
    }
    if now.resource_version() != written.resource_version() {
        found.push(format!(
            "{what} NodeClaim {name}: written to (resourceVersion {:?} -> {:?})",
            written.resource_version(),
            now.resource_version()
        ));
    }
}

/// Compares a foreign Node with `written` (the test's last write).
async fn check_node(world: &World, what: &str, written: &Node, found: &mut Vec<String>) {
    let name = written.name_any();
    let Some(now) = world.nodes().get_opt(&name).await.expect("read Node") else {
        found.push(format!(
            "{what} Node {name}: gone (its finalizer was removed)"
        ));
        return;
    };
    if written.metadata.deletion_timestamp.is_none() && now.metadata.deletion_timestamp.is_some() {
        found.push(format!("{what} Node {name}: deleted by us"));
    }
    if now.finalizers() != written.finalizers() {
        found.push(format!(
            "{what} Node {name}: finalizers {:?}, written {:?}",
            now.finalizers(),
            written.finalizers()
        ));
    }
    if taint_keys(&now) != taint_keys(written) {
        found.push(format!(
            "{what} Node {name}: taints {:?}, written {:?}",
            taint_keys(&now),
            taint_keys(written)
        ));
    }
    if now.labels().contains_key(NODE_EXCLUDE_FROM_LB_LABEL) {
        found.push(format!(
            "{what} Node {name}: labelled {NODE_EXCLUDE_FROM_LB_LABEL} by our termination"
        ));
    }
    if now.resource_version() != written.resource_version() {
        found.push(format!(
            "{what} Node {name}: written to (resourceVersion {:?} -> {:?})",
            written.resource_version(),
            now.resource_version()
        ));
    }
}

/// Compares the foreign NodePool with `written` (the test's status write).
async fn check_pool(world: &World, written: &NodePool, found: &mut Vec<String>) {
    let name = written.name_any();
    let pools: Api<NodePool> = Api::all(world.client.clone());
    let Some(now) = pools.get_opt(&name).await.expect("read NodePool") else {
        found.push(format!("(a) NodePool {name}: deleted"));
        return;
    };
    for key in [NODEPOOL_HASH_ANNOTATION, NODEPOOL_HASH_VERSION_ANNOTATION] {
        if let Some(value) = now.annotations().get(key) {
            found.push(format!(
                "(a) NodePool {name}: our NodePool controller wrote {key}={value}"
            ));
        }
    }
    let status = |p: &NodePool| {
        p.status
            .as_ref()
            .map(|s| (summary(&s.conditions), s.nodes))
            .unwrap_or_default()
    };
    let ((conditions, nodes), (written_conditions, written_nodes)) =
        (status(&now), status(written));
    if (&conditions, nodes) != (&written_conditions, written_nodes) {
        found.push(format!(
            "(a) NodePool {name}: our NodePool controller rewrote its status: conditions \
             {conditions:?}, nodes {nodes}; written {written_conditions:?}, nodes {written_nodes}"
        ));
    }
    if now.resource_version() != written.resource_version() {
        found.push(format!(
            "(a) NodePool {name}: written to (resourceVersion {:?} -> {:?})",
            written.resource_version(),
            now.resource_version()
        ));
    }
}

// ---- our side ------------------------------------------------------------------------------

/// Our NodePool: `standard.small` on-demand nodes, consolidated only when empty, 5 s after
/// their last pod event (so the disruption conditions controller marks a busy node
/// Consolidatable and nothing disrupts it).
async fn our_pool(world: &World, name: &str, created: &mut Created) {
    created.pools.push(name.into());
    world
        .create_nodepool(
            name,
            json!({
                "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "5s"},
                "template": {"spec": {
                    "requirements": [
                        {"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": ["standard.small"]},
                        {"key": CAPACITY_TYPE_LABEL, "operator": "In", "values": ["on-demand"]}
                    ],
                    "expireAfter": "Never"
                }}
            }),
        )
        .await;
}

/// A pending pod only our NodePool `pool` can serve.
async fn pending_pod(world: &World, name: &str, pool: &str) {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {NODEPOOL_LABEL: pool},
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]
        }
    }))
    .expect("a pod");
    world
        .pods()
        .create(&PostParams::default(), &pod)
        .await
        .expect("create the pending pod");
}

/// Our NodeClaim of `pool` once `ready` says it is far enough along; returns it.
async fn our_claim(
    world: &World,
    pool: &str,
    what: &str,
    ready: impl Fn(&NodeClaim) -> bool,
) -> Result<NodeClaim, String> {
    signal(what, SIGNAL, || async {
        let claims = world.claims_of_pool(pool).await;
        match claims.iter().find(|c| ready(c)) {
            Some(c) => Ok(c.clone()),
            None => Err(format!(
                "{:?}",
                claims
                    .iter()
                    .map(|c| (c.name_any(), summary(&claim_conditions(c))))
                    .collect::<Vec<_>>()
            )),
        }
    })
    .await
}

/// Launched, registered (its Node exists) and initialized.
async fn our_node(world: &World, pool: &str) -> Result<(NodeClaim, Node), String> {
    let claim = our_claim(
        world,
        pool,
        "our NodeClaim launched, registered and initialized",
        |c| {
            c.status.as_ref().is_some_and(|s| {
                s.provider_id.is_some()
                    && s.node_name.is_some()
                    && s.conditions.is_true("Registered")
                    && s.conditions.is_true("Initialized")
            })
        },
    )
    .await?;
    let node_name = claim
        .status
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    let node = world
        .nodes()
        .get_opt(&node_name)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("our NodeClaim's Node {node_name} does not exist"))?;
    Ok((claim, node))
}

/// Ends a test: removes what it created, finishes the world, then fails with every violation
/// (or the missing signal) found.
async fn conclude(
    world: World,
    controller: Child,
    created: Created,
    outcome: Result<Vec<String>, String>,
) {
    let log = std::env::temp_dir().join(format!("{}-ours.log", world.namespace));
    created.remove(&world, controller).await;
    world.finish().await;
    match outcome {
        Ok(found) => assert!(
            found.is_empty(),
            "our controller touched the other Karpenter's objects (log: {}):\n  {}",
            log.display(),
            found.join("\n  ")
        ),
        Err(missing) => panic!("{missing} (log: {})", log.display()),
    }
}

// ---- tests ---------------------------------------------------------------------------------

/// (a) a foreign NodePool with its own status; (b) a registered foreign NodeClaim whose Node is
/// NotReady; (c) a foreign Node being disrupted (taint, `DisruptionReason`); (e) a foreign Node
/// being deleted, finalizer kept. Our controllers run a while with a NodePool and a node of
/// their own, and leave all of them as the other Karpenter wrote them.
#[tokio::test]
async fn another_karpenters_objects_are_left_alone() {
    let Some((world, controller)) = World::started("coexist", joins(), "ours").await else {
        return;
    };
    let sfx = suffix(&world);
    let mut created = Created::default();

    let kwok_pool = format!("kwok-{sfx}");
    let pool = foreign_pool(&world, &kwok_pool, &mut created).await;
    // (b) Registered, its Node NotReady; kwok:// is never in our instance list.
    let b = format!("kwok-{sfx}-notready");
    let claim_b = foreign_claim(
        &world,
        &b,
        &kwok_pool,
        Some(&format!("kwok://{b}")),
        &[],
        &mut created,
    )
    .await;
    let node_b = foreign_node(&world, &b, &kwok_pool, false, json!([]), &mut created).await;
    // (c) Mid-disruption at the other Karpenter.
    let c = format!("kwok-{sfx}-disrupted");
    let disruption = condition("DisruptionReason", "True", "Underutilized", &now());
    let claim_c = foreign_claim(
        &world,
        &c,
        &kwok_pool,
        Some(&format!("kwok://{c}")),
        &[disruption],
        &mut created,
    )
    .await;
    let node_c = foreign_node(
        &world,
        &c,
        &kwok_pool,
        true,
        json!([{"key": DISRUPTED_TAINT_KEY, "effect": "NoSchedule"}]),
        &mut created,
    )
    .await;
    // (e) Being deleted; the other Karpenter's termination holds its finalizer.
    let e = format!("kwok-{sfx}-terminating");
    let claim_e = foreign_claim(
        &world,
        &e,
        &kwok_pool,
        Some(&format!("kwok://{e}")),
        &[],
        &mut created,
    )
    .await;
    foreign_node(&world, &e, &kwok_pool, true, json!([]), &mut created).await;
    let node_e = world
        .nodes()
        .delete(&e, &DeleteParams::default())
        .await
        .expect("delete the foreign Node")
        .left()
        .expect("a Node with a finalizer stays while it is deleted");

    let ours = format!("ours-{sfx}");
    our_pool(&world, &ours, &mut created).await;
    pending_pod(&world, "app", &ours).await;

    let outcome = async {
        // Provisioning, launch, registration and initialization.
        let (claim, node) = our_node(&world, &ours).await?;
        // The NodePool controller: our pool's status counts our node.
        let pools: Api<NodePool> = Api::all(world.client.clone());
        signal(
            "our NodePool controller counted our node",
            SIGNAL,
            || async {
                let p = pools.get(&ours).await.map_err(|e| e.to_string())?;
                let s = p.status.unwrap_or_default();
                if s.nodes == 1 && s.conditions.is_true("Ready") {
                    Ok(())
                } else {
                    Err(format!("nodes {}, {:?}", s.nodes, summary(&s.conditions)))
                }
            },
        )
        .await?;
        // The disruption conditions controller (and, in the same loop, the disruption
        // controller's pass that restores stale taints) ran over every NodeClaim.
        let claims = world.nodeclaims();
        let name = claim.name_any();
        signal(
            "our disruption conditions controller marked our NodeClaim Consolidatable",
            SIGNAL,
            || async {
                let c = claims.get(&name).await.map_err(|e| e.to_string())?;
                if claim_conditions(&c).is_true("Consolidatable") {
                    Ok(())
                } else {
                    Err(format!("{:?}", summary(&claim_conditions(&c))))
                }
            },
        )
        .await?;
        // Instance GC (claims whose instance is gone), five more passes.
        gc_passes(&world).await?;
        // Termination: our own Node, deleted after the foreign one, drained and released.
        world
            .pods()
            .delete("app", &DeleteParams::default().grace_period(0))
            .await
            .map_err(|e| e.to_string())?;
        claims
            .delete(&name, &DeleteParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let node_name = node.name_any();
        signal(
            "our termination controller finished our own Node",
            SIGNAL,
            || async {
                let node = world
                    .nodes()
                    .get_opt(&node_name)
                    .await
                    .map_err(|e| e.to_string())?;
                let claim = claims.get_opt(&name).await.map_err(|e| e.to_string())?;
                match (node, claim) {
                    (None, None) => Ok(()),
                    (node, claim) => Err(format!(
                        "Node present: {}, NodeClaim present: {}",
                        node.is_some(),
                        claim.is_some()
                    )),
                }
            },
        )
        .await?;

        let mut found = Vec::new();
        check_pool(&world, &pool, &mut found).await;
        check_claim(&world, "(b) NotReady", &claim_b, &mut found).await;
        check_node(&world, "(b) NotReady", &node_b, &mut found).await;
        check_claim(&world, "(c) disrupted", &claim_c, &mut found).await;
        let still = world
            .nodeclaims()
            .get_opt(&c)
            .await
            .expect("read NodeClaim");
        if !still.is_some_and(|s| claim_conditions(&s).is_true("DisruptionReason")) {
            found.push(format!(
                "(c) disrupted NodeClaim {c}: DisruptionReason removed by our disruption controller"
            ));
        }
        check_node(&world, "(c) disrupted", &node_c, &mut found).await;
        check_claim(&world, "(e) terminating", &claim_e, &mut found).await;
        check_node(&world, "(e) terminating", &node_e, &mut found).await;
        Ok(found)
    }
    .await;
    conclude(world, controller, created, outcome).await;
}

/// (d) A foreign NodeClaim without a provider ID (a launch in flight at the other provider)
/// does not hold our controllers back: a pod only our NodePool can serve gets a NodeClaim of
/// ours launched and registered, and instance GC keeps running; the foreign NodeClaim stays as
/// the other Karpenter wrote it.
#[tokio::test]
async fn another_karpenters_launch_in_flight_does_not_hold_ours_back() {
    let Some((world, controller)) = World::started("coexist-launch", joins(), "ours").await else {
        return;
    };
    let sfx = suffix(&world);
    let mut created = Created::default();

    let kwok_pool = format!("kwok-{sfx}");
    foreign_pool(&world, &kwok_pool, &mut created).await;
    let d = format!("kwok-{sfx}-launching");
    let claim_d = foreign_claim(&world, &d, &kwok_pool, None, &[], &mut created).await;

    let ours = format!("ours-{sfx}");
    our_pool(&world, &ours, &mut created).await;
    pending_pod(&world, "app", &ours).await;

    let outcome = async {
        our_node(&world, &ours).await?;
        gc_passes(&world).await?;
        let mut found = Vec::new();
        check_claim(&world, "(d) launching", &claim_d, &mut found).await;
        Ok(found)
    }
    .await;
    conclude(world, controller, created, outcome).await;
}
