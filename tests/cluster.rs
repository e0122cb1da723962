//! Proves the control-plane harness against a real kube-apiserver: our CRDs' server-side
//! validation, status subresource, finalizers, PDB-guarded eviction, owner-reference garbage
//! collection, and the simulated kubelet's Node.
//!
//! Needs the binaries of `hack/control-plane.sh`; see docs/control-plane.md.

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use karpenter_exoscale::sim::kubelet::{
    self as kubelet_sim, Fault, InstanceShape, Join, KubeletBehaviour, RunningInstance,
};
use kube::Client;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, EvictParams, GroupVersionKind, ObjectMeta,
    Patch, PatchParams, PostParams, ValidationDirective,
};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(90);
const FIELD_MANAGER: &str = "cluster-tests";

/// Polls `check` until it yields a value, panicking with `what` after [`WAIT`].
async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let started = Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(started.elapsed() < WAIT, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn random_suffix() -> String {
    format!("{:06x}", rand::random::<u32>() & 0xff_ffff)
}

// ---------------------------------------------------------------------------------------
// Our custom resources, addressed dynamically so the tests depend only on the manifests.

fn resource(group: &str, version: &str, kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind))
}

fn node_class_resource() -> ApiResource {
    resource("karpenter.exoscale.com", "v1", "ExoscaleNodeClass")
}
fn node_pool_resource() -> ApiResource {
    resource("karpenter.sh", "v1", "NodePool")
}
fn node_claim_resource() -> ApiResource {
    resource("karpenter.sh", "v1", "NodeClaim")
}
fn node_overlay_resource() -> ApiResource {
    resource("karpenter.sh", "v1alpha1", "NodeOverlay")
}

fn cluster_api(client: &Client, resource: &ApiResource) -> Api<DynamicObject> {
    Api::all_with(client.clone(), resource)
}

fn object(resource: &ApiResource, name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": resource.api_version,
        "kind": resource.kind,
        "metadata": { "name": name },
        "spec": spec,
    }))
    .expect("a well-formed object")
}

/// Create (POST) with strict field validation, so unknown fields are errors (422), as
/// `kubectl create` does. kube's `PostParams` has no field-validation setting.
async fn create_strict(
    client: &Client,
    resource: &ApiResource,
    name: &str,
    spec: Value,
) -> Result<DynamicObject, kube::Error> {
    let url = format!(
        "/apis/{}/{}/{}?fieldValidation=Strict",
        resource.group, resource.version, resource.plural
    );
    let body = serde_json::to_vec(&object(resource, name, spec)).expect("serializable object");
    let request = http::Request::post(url)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body)
        .expect("a valid request");
    client.request::<DynamicObject>(request).await
}

/// Server-side apply with strict field validation, so unknown fields are errors.
async fn apply_strict(
    client: &Client,
    resource: &ApiResource,
    name: &str,
    spec: Value,
) -> Result<DynamicObject, kube::Error> {
    let params = PatchParams::apply(FIELD_MANAGER).validation(ValidationDirective::Strict);
    cluster_api(client, resource)
        .patch(name, &params, &Patch::Apply(object(resource, name, spec)))
        .await
}

fn valid_node_class_spec() -> Value {
    json!({
        "imageTemplateSelector": { "version": "1.35.4", "variant": "standard" },
        "diskSize": 50,
        "securityGroupSelectorTerms": [{ "name": "karpenter-nodes" }],
        "kubelet": { "imageGCHighThresholdPercent": 85, "imageGCLowThresholdPercent": 80 },
    })
}

fn valid_node_claim_spec() -> Value {
    json!({
        "nodeClassRef": {
            "group": "karpenter.exoscale.com", "kind": "ExoscaleNodeClass", "name": "default"
        },
        "requirements": [
            { "key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["standard.medium"] }
        ],
        "expireAfter": "720h",
    })
}

fn valid_node_pool_spec() -> Value {
    json!({
        "weight": 10,
        "disruption": { "consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "30s" },
        "template": { "spec": valid_node_claim_spec() },
    })
}

fn valid_node_overlay_spec() -> Value {
    json!({
        "requirements": [
            { "key": "karpenter.exoscale.com/instance-family", "operator": "In", "values": ["gpu3"] }
        ],
        "priceAdjustment": "-10%",
        "weight": 5,
    })
}

/// `spec` with `pointer` (a JSON pointer into it) replaced by `value`.
fn with(mut spec: Value, pointer: &str, value: Value) -> Value {
    let (parent, key) = pointer.rsplit_once('/').expect("a pointer with a parent");
    let parent = spec
        .pointer_mut(parent)
        .unwrap_or_else(|| panic!("{parent} not in the example"));
    parent
        .as_object_mut()
        .expect("an object parent")
        .insert(key.to_string(), value);
    spec
}

#[tokio::test]
async fn our_crds_install_and_accept_the_examples() {
    let Some(plane) = support::shared() else {
        return;
    };
    let client = plane.client().await;
    let installed =
        support::crds::load_dir(&support::crds::project_crd_dir()).expect("CRD manifests load");
    assert_eq!(installed.len(), 4, "one CRD per kind");

    let suffix = random_suffix();
    let examples = [
        (node_class_resource(), valid_node_class_spec()),
        (node_pool_resource(), valid_node_pool_spec()),
        (node_claim_resource(), valid_node_claim_spec()),
        (node_overlay_resource(), valid_node_overlay_spec()),
    ];
    for (resource, spec) in examples {
        let name = format!("example-{suffix}");
        let created = apply_strict(&client, &resource, &name, spec)
            .await
            .unwrap_or_else(|e| panic!("valid {} refused: {e}", resource.kind));
        assert_eq!(created.metadata.name.as_deref(), Some(name.as_str()));
        assert!(created.metadata.uid.is_some(), "{} stored", resource.kind);
    }
}

#[tokio::test]
async fn the_apiserver_rejects_each_invalid_object() {
    let Some(plane) = support::shared() else {
        return;
    };
    let client = plane.client().await;
    let class = node_class_resource();
    let pool = node_pool_resource();
    let class_spec = valid_node_class_spec;
    let pool_spec = valid_node_pool_spec;
    let cases: Vec<(&str, ApiResource, Value, &str)> = vec![
        (
            "unknown field",
            class.clone(),
            with(class_spec(), "/flavour", json!("large")),
            "unknown field",
        ),
        (
            "unknown nested field",
            pool.clone(),
            with(pool_spec(), "/disruption/sometimes", json!(true)),
            "unknown field",
        ),
        (
            "wrong enum: consolidationPolicy",
            pool.clone(),
            with(
                pool_spec(),
                "/disruption/consolidationPolicy",
                json!("Sometimes"),
            ),
            "Unsupported value",
        ),
        (
            "wrong enum: template variant",
            class.clone(),
            with(class_spec(), "/imageTemplateSelector/variant", json!("arm")),
            "Unsupported value",
        ),
        (
            "templateID and imageTemplateSelector both set",
            class.clone(),
            with(
                class_spec(),
                "/templateID",
                json!("3f1b2a9c-0d4e-4b7a-9c1e-5a6b7c8d9e0f"),
            ),
            "templateID",
        ),
        (
            "selector term with both id and name",
            class.clone(),
            with(
                class_spec(),
                "/securityGroupSelectorTerms",
                json!([{ "id": "3f1b2a9c-0d4e-4b7a-9c1e-5a6b7c8d9e0f", "name": "nodes" }]),
            ),
            "id or name",
        ),
        (
            "image GC low >= high",
            class.clone(),
            with(
                class_spec(),
                "/kubelet",
                json!({ "imageGCHighThresholdPercent": 70, "imageGCLowThresholdPercent": 70 }),
            ),
            "imageGCLowThresholdPercent",
        ),
        (
            "diskSize below 10",
            class.clone(),
            with(class_spec(), "/diskSize", json!(9)),
            "diskSize",
        ),
        (
            "diskSize above 8000",
            class.clone(),
            with(class_spec(), "/diskSize", json!(8001)),
            "diskSize",
        ),
        (
            "invalid duration: consolidateAfter",
            pool.clone(),
            with(
                pool_spec(),
                "/disruption/consolidateAfter",
                json!("5 minutes"),
            ),
            "consolidateAfter",
        ),
        (
            "invalid duration: expireAfter",
            pool.clone(),
            with(pool_spec(), "/template/spec/expireAfter", json!("1d")),
            "expireAfter",
        ),
        (
            "negative NodePool weight",
            pool.clone(),
            with(pool_spec(), "/weight", json!(-1)),
            "weight",
        ),
    ];

    let mut wrongly_accepted = Vec::new();
    for (index, (case, resource, spec, expected_in_message)) in cases.into_iter().enumerate() {
        let name = format!("invalid-{index}-{}", random_suffix());
        match create_strict(&client, &resource, &name, spec).await {
            Ok(_) => wrongly_accepted.push(format!("{case}: accepted")),
            Err(kube::Error::Api(status)) => {
                assert!(
                    status.code == 422 || status.code == 400,
                    "{case}: expected a validation error, got {} {}",
                    status.code,
                    status.message
                );
                assert!(
                    status.message.contains(expected_in_message),
                    "{case}: message {:?} does not mention {expected_in_message:?}",
                    status.message
                );
            }
            Err(other) => panic!("{case}: unexpected error {other}"),
        }
    }
    assert!(wrongly_accepted.is_empty(), "{wrongly_accepted:#?}");
}

#[tokio::test]
async fn node_claim_status_is_written_through_the_status_subresource() {
    let Some(plane) = support::shared() else {
        return;
    };
    let client = plane.client().await;
    let resource = node_claim_resource();
    let api = cluster_api(&client, &resource);
    let name = format!("status-{}", random_suffix());
    let created = apply_strict(&client, &resource, &name, valid_node_claim_spec())
        .await
        .expect("valid NodeClaim");
    let generation = created.metadata.generation;

    // A status sent to the main resource is dropped: status has its own endpoint.
    let ignored = json!({ "status": { "providerID": "exoscale://ignored" } });
    let after_main = api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&ignored))
        .await
        .expect("merge patch on the main resource");
    assert!(after_main.data.pointer("/status/providerID").is_none());

    let status = json!({ "status": {
        "providerID": "exoscale://3f1b2a9c-0d4e-4b7a-9c1e-5a6b7c8d9e0f",
        "conditions": [{
            "type": "Launched", "status": "True", "reason": "Launched", "message": "",
            "lastTransitionTime": "2026-11-22T00:00:00Z",
        }],
    }});
    let updated = api
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("status patch");
    assert_eq!(
        updated.data.pointer("/status/providerID"),
        Some(&json!("exoscale://3f1b2a9c-0d4e-4b7a-9c1e-5a6b7c8d9e0f"))
    );
    assert_eq!(
        updated.metadata.generation, generation,
        "status does not bump generation"
    );
    let reread = api.get(&name).await.expect("NodeClaim readable");
    assert_eq!(
        reread.data.pointer("/status/conditions/0/type"),
        Some(&json!("Launched"))
    );
}

#[tokio::test]
async fn a_finalizer_blocks_deletion_until_removed() {
    let Some(plane) = support::shared() else {
        return;
    };
    let client = plane.client().await;
    let resource = node_claim_resource();
    let api = cluster_api(&client, &resource);
    let name = format!("finalized-{}", random_suffix());
    let mut claim = object(&resource, &name, valid_node_claim_spec());
    claim.metadata.finalizers = Some(vec!["karpenter.sh/termination".to_string()]);
    api.create(&PostParams::default(), &claim)
        .await
        .expect("NodeClaim with finalizer");

    api.delete(&name, &DeleteParams::default())
        .await
        .expect("delete accepted");
    let pending = api.get(&name).await.expect("still there while finalized");
    assert!(pending.metadata.deletion_timestamp.is_some());
    assert_eq!(
        pending.metadata.finalizers.as_deref(),
        Some(&["karpenter.sh/termination".to_string()][..])
    );

    let release = json!({ "metadata": { "finalizers": null } });
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&release))
        .await
        .expect("finalizer removed");
    eventually("the NodeClaim to disappear", || {
        let api = api.clone();
        let name = name.clone();
        async move {
            api.get_opt(&name)
                .await
                .expect("get")
                .is_none()
                .then_some(())
        }
    })
    .await;
}

#[tokio::test]
async fn garbage_collection_removes_a_dependent_of_a_deleted_owner() {
    let Some(plane) = support::shared() else {
        return;
    };
    let client = plane.client().await;
    let namespace = plane.namespace(&client, "gc").await;
    let resource = node_claim_resource();
    let claims = cluster_api(&client, &resource);
    let owner_name = format!("owner-{}", random_suffix());
    let owner = apply_strict(&client, &resource, &owner_name, valid_node_claim_spec())
        .await
        .expect("owner NodeClaim");

    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let dependent = ConfigMap {
        metadata: ObjectMeta {
            name: Some("dependent".into()),
            owner_references: Some(vec![OwnerReference {
                api_version: resource.api_version.clone(),
                kind: resource.kind.clone(),
                name: owner_name.clone(),
                uid: owner.metadata.uid.clone().expect("owner uid"),
                ..OwnerReference::default()
            }]),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    config_maps
        .create(&PostParams::default(), &dependent)
        .await
        .expect("dependent ConfigMap");

    claims
        .delete(&owner_name, &DeleteParams::background())
        .await
        .expect("owner deleted");
    eventually("the garbage collector to delete the dependent", || {
        let config_maps = config_maps.clone();
        async move {
            config_maps
                .get_opt("dependent")
                .await
                .expect("get")
                .is_none()
                .then_some(())
        }
    })
    .await;
}

// ---------------------------------------------------------------------------------------
// The simulated kubelet.

const USER_DATA: &str = r#"
[settings.kubernetes]
api-server = "https://cluster.sks-ch-gva-2.exo.io:443"
bootstrap-token = "abcdef.0123456789abcdef"
cloud-provider = "external"
cluster-certificate = "Q0E="

[settings.kubernetes.node-labels]
"karpenter.sh/nodepool" = "default"
"example.com/team" = "platform"

[settings.kubernetes.node-taints]
"example.com/dedicated" = ["batch:NoSchedule"]
"#;

/// The bootstrap token of [`USER_DATA`] as the controller would publish it: the simulated
/// kubelet authenticates with it as kube-apiserver would. Idempotent (tests run concurrently).
async fn publish_test_token(client: &Client) {
    use karpenter_exoscale::providers::bootstrap_token::{
        BootstrapToken, TokenOwner, build_secret,
    };
    let token = BootstrapToken::from_parts("abcdef", "0123456789abcdef").expect("token");
    let secret = build_secret(
        &token,
        TokenOwner::named("cluster-tests"),
        chrono::Utc::now(),
        karpenter_exoscale::providers::bootstrap_token::TOKEN_TTL,
    );
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), "kube-system");
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("publishing the test bootstrap token: {e}"),
    }
}

fn gzip_base64(text: &str) -> String {
    use base64::Engine;
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(text.as_bytes()).expect("gzip");
    base64::engine::general_purpose::STANDARD.encode(encoder.finish().expect("gzip"))
}

fn simulated_instance(name_prefix: &str, user_data: &str) -> RunningInstance {
    let id = uuid::Uuid::new_v4().to_string();
    RunningInstance {
        name: format!("{name_prefix}-{}", &id[..8]),
        id,
        zone: "ch-gva-2".into(),
        shape: InstanceShape {
            name: "standard.large".into(),
            cpus: 4,
            memory_bytes: 8 * 1024 * 1024 * 1024,
            gpus: 0,
            disk_gib: 50,
        },
        user_data: gzip_base64(user_data),
    }
}

fn condition_status(node: &Node, type_: &str) -> Option<String> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.status.clone())
}

async fn node_with_condition(nodes: &Api<Node>, name: &str, type_: &str, status: &str) -> Node {
    eventually(&format!("node {name} {type_}={status}"), || {
        let nodes = nodes.clone();
        let name = name.to_string();
        async move {
            let node = nodes.get_opt(&name).await.expect("get node")?;
            (condition_status(&node, type_).as_deref() == Some(status)).then_some(node)
        }
    })
    .await
}

#[tokio::test]
async fn the_simulated_kubelet_registers_a_ready_node() {
    let Some(plane) = support::shared() else {
        return;
    };
    let client = plane.client().await;
    publish_test_token(&client).await;
    let nodes: Api<Node> = Api::all(client.clone());
    let instance = simulated_instance("kubelet-ready", USER_DATA);

    kubelet_sim::spawn(
        client.clone(),
        instance.clone(),
        KubeletBehaviour::default(),
    )
    .await
    .expect("kubelet task")
    .expect("node registered");
    let node = node_with_condition(&nodes, &instance.name, "Ready", "True").await;

    let spec = node.spec.clone().expect("spec");
    assert_eq!(
        spec.provider_id,
        Some(format!("exoscale://{}", instance.id))
    );
    let taints: Vec<_> = spec
        .taints
        .unwrap_or_default()
        .into_iter()
        .map(|t| (t.key, t.value, t.effect))
        .collect();
    assert_eq!(
        taints,
        [(
            "example.com/dedicated".to_string(),
            Some("batch".to_string()),
            "NoSchedule".to_string()
        )]
    );
    let labels = node.metadata.labels.clone().expect("labels");
    assert_eq!(labels["karpenter.sh/nodepool"], "default");
    assert_eq!(labels["example.com/team"], "platform");
    assert_eq!(labels["node.kubernetes.io/instance-type"], "standard.large");
    let status = node.status.expect("status");
    assert_eq!(status.capacity.expect("capacity")["cpu"].0, "4");
    assert_eq!(status.allocatable.expect("allocatable")["cpu"].0, "3700m");
}

#[tokio::test]
async fn the_simulated_kubelet_follows_its_script() {
    let Some(plane) = support::shared() else {
        return;
    };
    let client = plane.client().await;
    publish_test_token(&client).await;
    let nodes: Api<Node> = Api::all(client.clone());

    let never = simulated_instance("kubelet-never", USER_DATA);
    let behaviour = KubeletBehaviour {
        join: Join::Never,
        fault: Fault::None,
    };
    kubelet_sim::spawn(client.clone(), never.clone(), behaviour)
        .await
        .expect("kubelet task")
        .expect("script ran");
    assert!(nodes.get_opt(&never.name).await.expect("get").is_none());

    let late = simulated_instance("kubelet-late", USER_DATA);
    let behaviour = KubeletBehaviour {
        join: Join::After(Duration::from_millis(300)),
        fault: Fault::NotReadyAfter(Duration::ZERO),
    };
    kubelet_sim::spawn(client.clone(), late.clone(), behaviour)
        .await
        .expect("kubelet task")
        .expect("script ran");
    node_with_condition(&nodes, &late.name, "Ready", "False").await;

    let pressured = simulated_instance("kubelet-disk", USER_DATA);
    let behaviour = KubeletBehaviour {
        join: Join::After(Duration::ZERO),
        fault: Fault::DiskPressureAfter(Duration::ZERO),
    };
    kubelet_sim::spawn(client.clone(), pressured.clone(), behaviour)
        .await
        .expect("kubelet task")
        .expect("script ran");
    let node = node_with_condition(&nodes, &pressured.name, "DiskPressure", "True").await;
    assert_eq!(condition_status(&node, "Ready").as_deref(), Some("True"));
}

#[tokio::test]
async fn the_simulated_kubelet_follows_the_clouds_instance_events() {
    let Some(plane) = support::shared() else {
        return;
    };
    let client = plane.client().await;
    publish_test_token(&client).await;
    let nodes: Api<Node> = Api::all(client.clone());
    let (events, receiver) = tokio::sync::broadcast::channel(16);
    let follower = kubelet_sim::Follower {
        client: client.clone(),
        zone: "at-vie-1".into(),
        shape_of: Box::new(|_| {
            Some(InstanceShape {
                name: "standard.small".into(),
                cpus: 2,
                memory_bytes: 2 * 1024 * 1024 * 1024,
                gpus: 0,
                disk_gib: 20,
            })
        }),
        behaviour_of: Box::new(|_| KubeletBehaviour::default()),
    };
    let following = kubelet_sim::follow(follower, receiver);

    let id = uuid::Uuid::new_v4().to_string();
    let name = format!("followed-{}", &id[..8]);
    let instance: karpenter_exoscale::exoscale::models::Instance = serde_json::from_value(json!({
        "id": id, "name": name, "state": "running",
        "instance-type": { "id": "standard-small" }, "template": { "id": "sks" },
        "user-data": gzip_base64(USER_DATA),
    }))
    .expect("an instance");
    events
        .send(karpenter_exoscale::sim::InstanceEvent::Running(Box::new(
            instance,
        )))
        .expect("the follower listens");
    let node = node_with_condition(&nodes, &name, "Ready", "True").await;
    assert_eq!(
        node.metadata.labels.expect("labels")["topology.kubernetes.io/zone"],
        "at-vie-1"
    );

    events
        .send(karpenter_exoscale::sim::InstanceEvent::Deleted {
            id: id.clone(),
            name: name.clone(),
        })
        .expect("the follower listens");
    eventually("the node of the deleted instance to go", || {
        let nodes = nodes.clone();
        let name = name.clone();
        async move {
            nodes
                .get_opt(&name)
                .await
                .expect("get")
                .is_none()
                .then_some(())
        }
    })
    .await;
    drop(events);
    let errors = following.await.expect("follower task");
    assert!(errors.is_empty(), "{errors:?}");
}

// ---------------------------------------------------------------------------------------
// Eviction against a PodDisruptionBudget, with pods placed by the real scheduler.

fn labelled_pod(name: &str, app: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "labels": { "app": app } },
        "spec": {
            "containers": [{
                "name": "app", "image": "registry.invalid/app:1",
                "resources": { "requests": { "cpu": "100m", "memory": "64Mi" } },
            }],
            "tolerations": [{ "key": "example.com/dedicated", "operator": "Exists" }],
        },
    }))
    .expect("a well-formed pod")
}

/// Acts as the kubelet for a scheduled pod: it is running and Ready.
async fn mark_running_and_ready(pods: &Api<Pod>, name: &str) {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let status = json!({ "status": {
        "phase": "Running",
        "conditions": [
            { "type": "PodScheduled", "status": "True", "lastTransitionTime": now },
            { "type": "Ready", "status": "True", "lastTransitionTime": now },
        ],
    }});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("pod status");
}

fn pdb(name: &str, app: &str, min_available: i32) -> PodDisruptionBudget {
    serde_json::from_value(json!({
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": { "name": name },
        "spec": { "minAvailable": min_available, "selector": { "matchLabels": { "app": app } } },
    }))
    .expect("a well-formed PDB")
}

/// Waits until kube-controller-manager computed the PDB's status for its current spec.
async fn computed_pdb(
    pdbs: &Api<PodDisruptionBudget>,
    name: &str,
    healthy: i32,
) -> PodDisruptionBudget {
    eventually(&format!("PDB {name} status"), || {
        let pdbs = pdbs.clone();
        let name = name.to_string();
        async move {
            let pdb = pdbs.get(&name).await.expect("get PDB");
            let status = pdb.status.as_ref()?;
            let current = status.observed_generation == pdb.metadata.generation
                && status.current_healthy == healthy;
            current.then_some(pdb)
        }
    })
    .await
}

#[tokio::test]
async fn eviction_is_refused_while_a_pdb_allows_no_disruption() {
    let Some(plane) = support::shared() else {
        return;
    };
    // The PDB's refusal is a 429, which kube's default client would retry for minutes.
    let client = plane.client_without_retries().await;
    publish_test_token(&client).await;
    let namespace = plane.namespace(&client, "eviction").await;
    // A node for the scheduler to place the pods on.
    let instance = simulated_instance("eviction", USER_DATA);
    kubelet_sim::register_node(&client, &instance)
        .await
        .expect("node registered");

    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let names = ["web-0", "web-1"];
    for name in names {
        pods.create(&PostParams::default(), &labelled_pod(name, "web"))
            .await
            .expect("pod created");
    }
    for name in names {
        eventually(&format!("the scheduler to bind {name}"), || {
            let pods = pods.clone();
            async move {
                let pod = pods.get(name).await.expect("get pod");
                pod.spec.and_then(|s| s.node_name).map(|_| ())
            }
        })
        .await;
        mark_running_and_ready(&pods, name).await;
    }

    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &namespace);
    pdbs.create(&PostParams::default(), &pdb("web", "web", 2))
        .await
        .expect("PDB created");
    let computed = computed_pdb(&pdbs, "web", 2).await;
    assert_eq!(computed.status.expect("status").disruptions_allowed, 0);

    let refused = pods
        .evict("web-0", &EvictParams::default())
        .await
        .expect_err("eviction must be refused");
    match refused {
        kube::Error::Api(status) => {
            assert_eq!(status.code, 429, "{}", status.message);
            assert!(
                status.message.contains("disruption budget"),
                "{}",
                status.message
            );
        }
        other => panic!("unexpected error {other}"),
    }
    assert!(pods.get_opt("web-0").await.expect("get").is_some());

    // Control: once the budget allows one disruption, the same eviction goes through.
    let relax = json!({ "spec": { "minAvailable": 1 } });
    pdbs.patch("web", &PatchParams::default(), &Patch::Merge(&relax))
        .await
        .expect("PDB relaxed");
    let relaxed = computed_pdb(&pdbs, "web", 2).await;
    assert_eq!(relaxed.status.expect("status").disruptions_allowed, 1);
    pods.evict("web-0", &EvictParams::default())
        .await
        .expect("eviction allowed now");
    let evicted = pods.get_opt("web-0").await.expect("get");
    assert!(
        evicted.is_none_or(|p| p.metadata.deletion_timestamp.is_some()),
        "evicted pod is being deleted"
    );
}

// ---------------------------------------------------------------------------------------
// The harness itself.

#[tokio::test]
async fn dropping_a_control_plane_kills_its_processes_and_removes_its_directory() {
    let bin_dir = match support::control_plane::find_bin_dir() {
        Ok(dir) => dir,
        // `shared()` decides between failing (CI) and skipping.
        Err(_) => {
            let _ = support::shared();
            return;
        }
    };
    let options = support::control_plane::Options {
        scheduler: true,
        controllers: Some(vec!["garbage-collector-controller".into()]),
        crd_dir: None,
        audit_log: None,
    };
    let plane = support::control_plane::ControlPlane::start(&bin_dir, &options)
        .await
        .expect("a private control plane starts");
    let client = plane.client().await;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client);
    assert!(namespaces.get_opt("default").await.expect("get").is_some());
    let dir = plane.dir_path();
    let pids = plane.pids();
    assert_eq!(
        pids.len(),
        4,
        "etcd, apiserver, controller-manager, scheduler"
    );
    assert!(dir.join("kube-apiserver.log").is_file());

    drop(plane);
    assert!(!dir.exists(), "{} removed", dir.display());
    for pid in pids {
        // Killed and reaped: the id is gone (unless already reused by an unrelated process).
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let command = String::from_utf8_lossy(&cmdline);
        assert!(
            !command.contains(&bin_dir.display().to_string()),
            "process {pid} still runs: {command}"
        );
    }
}

/// Two replicas starting at the same instant compete for one Lease: exactly one leads, and it
/// is the one the Lease names. Repeated over fresh Leases because the race is in the start.
#[tokio::test]
async fn replicas_electing_at_the_same_time_never_both_lead() {
    use k8s_openapi::api::coordination::v1::Lease;
    use karpenter_exoscale::fence::Fence;
    use karpenter_exoscale::operator::leader::{LeaseTimings, elect};

    let Some(plane) = support::shared() else {
        return;
    };
    let client = plane.client().await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    for round in 0..8 {
        let name = format!("election-{}-{round}", random_suffix());
        let timings = LeaseTimings {
            duration: Duration::from_secs(30),
            renew_deadline: Duration::from_secs(20),
            retry_period: Duration::from_secs(1),
        };
        let (a, b) = tokio::join!(
            elect(
                client.clone(),
                "default",
                &name,
                "replica-a",
                timings,
                Fence::closed()
            ),
            elect(
                client.clone(),
                "default",
                &name,
                "replica-b",
                timings,
                Fence::closed()
            ),
        );
        let (a, b) = (a.expect("election a"), b.expect("election b"));
        let holder = eventually("a Lease holder", || {
            let leases = leases.clone();
            let name = name.clone();
            async move {
                let lease = leases.get_opt(&name).await.ok()??;
                lease.spec?.holder_identity
            }
        })
        .await;
        let leader = eventually("a replica that leads", || async {
            match (a.leadership.is_leader(), b.leadership.is_leader()) {
                (true, true) => panic!("round {round}: both replicas lead (Lease holder {holder})"),
                (true, false) => Some("replica-a"),
                (false, true) => Some("replica-b"),
                (false, false) => None,
            }
        })
        .await;
        // Several renewals later, still one leader, and the one the Lease names.
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert!(
                !(a.leadership.is_leader() && b.leadership.is_leader()),
                "round {round}: both replicas lead"
            );
        }
        let holder = leases
            .get(&name)
            .await
            .unwrap()
            .spec
            .and_then(|s| s.holder_identity);
        assert_eq!(holder.as_deref(), Some(leader), "round {round}");
        a.release().await;
        b.release().await;
    }
}

/// Fault: two controllers write conditions of the same NodeClaim concurrently, each from copies
/// that go stale between its writes. Through `controllers::patch_status` a write computed from
/// a stale copy is refused (409) and redone from a fresh read, so no condition is lost: at the
/// end each writer's condition holds its last value. A blind whole-status write from the stale
/// copy would have dropped the other writer's condition.
#[tokio::test]
async fn concurrent_condition_writers_lose_no_condition() {
    use karpenter_exoscale::apis::{ConditionStatus, ConditionsExt, NodeClaim};
    use karpenter_exoscale::controllers::patch_status;

    let Some(plane) = support::shared() else {
        return;
    };
    let client = plane.client().await;
    let api: Api<NodeClaim> = Api::all(client.clone());
    let name = format!("conditions-{}", random_suffix());
    let claim: NodeClaim = serde_json::from_value(json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
        "metadata": {"name": name},
        "spec": {
            "requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["standard.small"]}],
            "nodeClassRef": {"group": "karpenter.exoscale.com", "kind": "ExoscaleNodeClass", "name": "default"}
        }
    }))
    .unwrap();
    let created = api.create(&PostParams::default(), &claim).await.unwrap();

    // A stale copy cannot revert a condition written after it was read.
    let stale = created.clone();
    let mut fresh_status = created.status.clone().unwrap_or_default();
    fresh_status.conditions.set_condition(
        "Drifted",
        ConditionStatus::True,
        "NodePoolDrifted",
        "",
        None,
        k8s_openapi::jiff::Timestamp::now(),
    );
    patch_status(&api, &created, &fresh_status).await.unwrap();
    let stale_write = patch_status(&api, &stale, &stale.status.clone().unwrap_or_default()).await;
    assert!(
        matches!(&stale_write, Err(e) if e.is_conflict()),
        "a stale status write was accepted: {stale_write:?}"
    );

    const ROUNDS: u32 = 25;
    let writer = |condition: &'static str| {
        let api = api.clone();
        let name = name.clone();
        async move {
            let mut conflicts = 0;
            for round in 1..=ROUNDS {
                loop {
                    let current = api.get(&name).await.unwrap();
                    let mut status = current.status.clone().unwrap_or_default();
                    status.conditions.set_condition(
                        condition,
                        ConditionStatus::True,
                        &format!("Round{round}"),
                        "",
                        None,
                        k8s_openapi::jiff::Timestamp::now(),
                    );
                    // Yield so the other writer interleaves between our read and write.
                    tokio::task::yield_now().await;
                    match patch_status(&api, &current, &status).await {
                        Ok(_) => break,
                        Err(e) if e.is_conflict() => conflicts += 1,
                        Err(e) => panic!("{condition}: {e}"),
                    }
                }
            }
            conflicts
        }
    };
    let (a, b) = tokio::join!(
        tokio::spawn(writer("ConsolidatableTest")),
        tokio::spawn(writer("DrainedTest"))
    );
    let conflicts = a.unwrap() + b.unwrap();
    let last = api.get(&name).await.unwrap();
    let conditions = last.status.unwrap_or_default().conditions;
    for condition in ["ConsolidatableTest", "DrainedTest"] {
        let c = conditions
            .get_condition(condition)
            .unwrap_or_else(|| panic!("{condition} was lost: {conditions:?}"));
        assert_eq!(c.reason, format!("Round{ROUNDS}"), "{condition}");
    }
    assert!(
        conditions.is_true("Drifted"),
        "the first writer's condition was lost: {conditions:?}"
    );
    eprintln!("{conflicts} stale writes refused and redone");
    let _ = api.delete(&name, &DeleteParams::default()).await;
}

/// Fault: other writers change the object between our read and our write. A write tested field
/// by field (`field_patch`, as registration writes a Node) is refused, as a conflict, only by a
/// change to what it writes; an object recreated under its name refuses it too; and an object
/// the patch would make invalid is a plain error, not a conflict to retry.
#[tokio::test]
async fn a_field_tested_write_is_refused_only_by_a_change_to_what_it_writes() {
    use karpenter_exoscale::controllers::field_patch::{Field, patch_fields};
    const FIELDS: [Field; 2] = [
        Field::Keys(&["metadata", "labels"]),
        Field::Items(&["metadata", "finalizers"]),
    ];
    let Some(plane) = support::shared() else {
        return;
    };
    let client = plane.client().await;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let name = format!("field-patch-{}", random_suffix());
    let finalizers = |m: &ConfigMap| m.metadata.finalizers.clone().unwrap_or_default();
    let read: ConfigMap = serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "labels": {"a": "1"},
            "finalizers": ["example.com/first", "example.com/second"],
        },
        "data": {"k": "v"},
    }))
    .unwrap();
    let read = maps.create(&PostParams::default(), &read).await.unwrap();
    let mut desired = read.clone();
    let labels = desired.metadata.labels.get_or_insert_default();
    labels.insert("b".into(), "2".into());
    desired.metadata.finalizers =
        Some(vec!["example.com/second".into(), "example.com/ours".into()]);

    // Another writer changes a field we do not write (as a kubelet's status update does) and
    // adds a label of its own.
    let theirs = json!({"data": {"k": "changed"}, "metadata": {"labels": {"c": "3"}}});
    maps.patch(&name, &PatchParams::default(), &Patch::Merge(&theirs))
        .await
        .unwrap();
    let written = patch_fields(&maps, &read, &desired, &FIELDS)
        .await
        .expect("not refused by changes to other fields and keys")
        .expect("a write");
    let labels = written.metadata.labels.clone().unwrap();
    assert_eq!(
        labels.into_iter().collect::<Vec<_>>(),
        [("a", "1"), ("b", "2"), ("c", "3")].map(|(k, v)| (k.to_string(), v.to_string()))
    );
    assert_eq!(
        finalizers(&written),
        ["example.com/second", "example.com/ours"]
    );
    assert_eq!(written.data.as_ref().unwrap()["k"], "changed");

    // Another writer puts a finalizer before the one we remove: refused, nothing written.
    let read = written;
    let mut desired = read.clone();
    desired.metadata.finalizers = Some(vec!["example.com/ours".into()]);
    let moved = json!({"metadata": {"finalizers": ["example.com/theirs", "example.com/second", "example.com/ours"]}});
    maps.patch(&name, &PatchParams::default(), &Patch::Merge(&moved))
        .await
        .unwrap();
    let refused = patch_fields(&maps, &read, &desired, &FIELDS)
        .await
        .expect_err("the item is no longer where it was read");
    assert!(refused.is_conflict(), "{refused}");
    let now = maps.get(&name).await.unwrap();
    assert_eq!(
        finalizers(&now),
        [
            "example.com/theirs",
            "example.com/second",
            "example.com/ours"
        ]
    );

    // A patch that would make the object invalid is the API server's validation error.
    let mut invalid = now.clone();
    invalid.metadata.finalizers = Some(vec!["not a finalizer!".into()]);
    let error = patch_fields(&maps, &now, &invalid, &FIELDS)
        .await
        .expect_err("an invalid finalizer");
    assert!(
        matches!(&error, karpenter_exoscale::controllers::Error::Kube(kube::Error::Api(s)) if s.code == 422),
        "{error}"
    );

    // The object is deleted and recreated under its name: a write from the old copy is refused.
    let cleared = json!({"metadata": {"finalizers": null}});
    maps.patch(&name, &PatchParams::default(), &Patch::Merge(&cleared))
        .await
        .unwrap();
    maps.delete(&name, &DeleteParams::default()).await.unwrap();
    let mut again = ConfigMap::default();
    again.metadata.name = Some(name.clone());
    maps.create(&PostParams::default(), &again).await.unwrap();
    let mut desired = now.clone();
    desired
        .metadata
        .labels
        .get_or_insert_default()
        .insert("d".into(), "4".into());
    let refused = patch_fields(&maps, &now, &desired, &FIELDS)
        .await
        .expect_err("another object under the same name");
    assert!(refused.is_conflict(), "{refused}");
    assert_eq!(maps.get(&name).await.unwrap().metadata.labels, None);
    maps.delete(&name, &DeleteParams::default()).await.unwrap();
}
