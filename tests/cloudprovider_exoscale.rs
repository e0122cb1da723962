//! The Exoscale cloud provider end to end against the simulated cloud on loopback (real HTTP,
//! real signatures): catalogue, prices, templates, create/get/list/delete, adoption, capacity
//! errors, private-network rollback, drift and bootstrap-token lifecycle.

use std::sync::Arc;
use std::time::Duration;

use karpenter_exoscale::apis::labels::{self, conditions};
use karpenter_exoscale::apis::nodeclass::{ImageTemplateSelector, SelectorTerm};
use karpenter_exoscale::apis::{
    ConditionStatus, ConditionsExt, ExoscaleNodeClass, ExoscaleNodeClassSpec,
    ExoscaleNodeClassStatus, NodeClaim, NodeClaimSpec, NodeClassReference, NodePool,
    NodeSelectorRequirementWithMinValues, Operator,
};
use karpenter_exoscale::catalogue::{Catalogue, Currency};
use karpenter_exoscale::cloudprovider::exoscale::{
    Dependencies, ExoscaleCloudProvider, ExoscaleSettings, InMemoryNodeBootstrap, NodeBootstrap,
    StaticNodeClasses, recorded_tokens,
};
use karpenter_exoscale::cloudprovider::{CloudProvider, CloudProviderError};
use karpenter_exoscale::exoscale::models::SksTemplateVariant;
use karpenter_exoscale::exoscale::{self, FixedClock};
use karpenter_exoscale::providers::instance::parse_provider_id;
use karpenter_exoscale::providers::pricing::PriceBook;
use karpenter_exoscale::providers::template::FixedVersion;
use karpenter_exoscale::providers::userdata;
use karpenter_exoscale::scheduling::{InstanceType, Quantity};
use karpenter_exoscale::sim::{ExoscaleSim, Fault, FaultAction};

#[path = "support/openapi.rs"]
mod openapi;

const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
const PREFIX: &str = "karpenter-";
/// The `kube-system` Namespace UID these tests' provider stands for.
const CLUSTER_UID: &str = "0d9f3a52-5c1e-4a4e-9b7e-3f1b2c3d4e5f";

struct World {
    sim: ExoscaleSim,
    provider: ExoscaleCloudProvider,
    nodeclasses: Arc<StaticNodeClasses>,
    bootstrap: Arc<InMemoryNodeBootstrap>,
    client: exoscale::Client,
    clock: FixedClock,
}

impl Drop for World {
    /// The test's traffic, checked against the OpenAPI document once the test body is done.
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        let problems = openapi::all_problems(&self.sim.exchanges());
        assert!(
            problems.is_empty(),
            "traffic the Exoscale API would not accept or send:\n{}",
            problems.join("\n")
        );
    }
}

impl World {
    /// Launches a NodeClaim allowed `types`, which must succeed.
    async fn launch(&self, name: &str, types: &[&str]) -> NodeClaim {
        self.provider.create(&claim(name, types)).await.unwrap()
    }

    /// The only instance, made by the only create call, and the one `nc` records.
    fn the_one_instance_of(&self, nc: &NodeClaim) -> exoscale::models::Instance {
        assert_eq!(self.sim.call_count("create-instance"), 1);
        let mut instances = self.sim.instances();
        assert_eq!(instances.len(), 1);
        let instance = instances.remove(0).instance;
        assert_eq!(instance.id, parse_provider_id(&provider_id(nc)).unwrap());
        instance
    }

    /// Launches a NodeClaim allowed `types`, which must fail: the error.
    async fn launch_refused(&self, name: &str, types: &[&str]) -> CloudProviderError {
        self.provider.create(&claim(name, types)).await.unwrap_err()
    }

    /// The NodeClass selects the private network `karpenter-private`.
    async fn use_private_network(&self) {
        let mut s = spec();
        s.private_network_selector_terms = vec![SelectorTerm {
            id: None,
            name: Some("karpenter-private".into()),
        }];
        self.put_nodeclass(s).await;
    }
}

async fn world() -> World {
    world_with_lookup_wait(Duration::from_secs(60)).await
}

/// A world whose client looks an outcome-unknown create up for `wait`.
async fn world_with_lookup_wait(wait: Duration) -> World {
    let sim = ExoscaleSim::start().await.unwrap();
    // Every exchange of every test here is checked against the API's OpenAPI document.
    sim.record_exchanges();
    let mut config = sim.client_config();
    config.create_lookup_wait = wait;
    let client = exoscale::Client::new(config).unwrap();
    let nodeclasses = Arc::new(StaticNodeClasses::default());
    let bootstrap = Arc::new(InMemoryNodeBootstrap::new(CA));
    let clock = FixedClock::at(1_800_000_000);
    let provider = provider_over(&sim, &client, &nodeclasses, &bootstrap, &clock);
    provider.refresh_instance_types().await.unwrap();
    let w = World {
        sim,
        provider,
        nodeclasses,
        bootstrap,
        client,
        clock,
    };
    w.put_nodeclass(spec()).await;
    w
}

/// A provider over `sim` (another replica when called twice: it shares nothing in memory).
fn provider_over(
    sim: &ExoscaleSim,
    client: &exoscale::Client,
    nodeclasses: &Arc<StaticNodeClasses>,
    bootstrap: &Arc<InMemoryNodeBootstrap>,
    clock: &FixedClock,
) -> ExoscaleCloudProvider {
    ExoscaleCloudProvider::new(
        ExoscaleSettings {
            zone: sim.zone().to_string(),
            cluster_id: sim.cluster_id().to_string(),
            cluster_uid: CLUSTER_UID.into(),
            instance_prefix: PREFIX.into(),
            cluster_endpoint: "https://cluster.example:6443".into(),
            cluster_domain: "cluster.local".into(),
            bootstrap_token_ttl: std::time::Duration::from_secs(600),
        },
        Dependencies {
            client: client.clone(),
            nodeclasses: nodeclasses.clone(),
            bootstrap: bootstrap.clone(),
            versions: Arc::new(FixedVersion(format!("v{}+sks", sim.kubernetes_version()))),
            clock: Arc::new(clock.clone()),
            prices: PriceBook::new(Currency::Eur),
        },
    )
}

fn spec() -> ExoscaleNodeClassSpec {
    let mut spec: ExoscaleNodeClassSpec =
        serde_yaml_ng::from_str("imageTemplateSelector: {}\n").unwrap();
    spec.security_group_selector_terms = vec![SelectorTerm {
        id: None,
        name: Some("karpenter-nodes".into()),
    }];
    spec
}

impl World {
    /// Stores a NodeClass named `default` with its status resolved the way the NodeClass
    /// controller will resolve it.
    async fn put_nodeclass(&self, spec: ExoscaleNodeClassSpec) -> ExoscaleNodeClass {
        let mut nc = ExoscaleNodeClass::new("default", spec);
        let template = self
            .provider
            .templates()
            .resolve_and_verify(&nc)
            .await
            .unwrap();
        let r = self.provider.nodeclass_resolver();
        let mut status = ExoscaleNodeClassStatus {
            security_groups: r.resolve_security_groups(&nc.spec).await.unwrap(),
            anti_affinity_groups: r.resolve_anti_affinity_groups(&nc.spec).await.unwrap(),
            private_networks: r.resolve_private_networks(&nc.spec).await.unwrap(),
            template_id: Some(template.id),
            ..Default::default()
        };
        status.conditions.set_condition(
            conditions::READY,
            ConditionStatus::True,
            "Ready",
            "",
            None,
            k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap(),
        );
        nc.status = Some(status);
        self.nodeclasses.insert(nc.clone());
        nc
    }

    fn edit_status(&self, f: impl FnOnce(&mut ExoscaleNodeClassStatus)) {
        let mut nc = self.nodeclasses_get();
        f(nc.status.as_mut().unwrap());
        self.nodeclasses.insert(nc);
    }

    fn nodeclasses_get(&self) -> ExoscaleNodeClass {
        use karpenter_exoscale::cloudprovider::exoscale::NodeClassSource;
        self.nodeclasses.get("default").unwrap()
    }

    async fn types(&self) -> Vec<Arc<InstanceType>> {
        self.provider.instance_types(&nodepool()).await.unwrap()
    }
}

fn nodepool() -> NodePool {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool",
        "metadata": {"name": "default"},
        "spec": {"template": {"spec": {
            "requirements": [],
            "nodeClassRef": {"group": "karpenter.exoscale.com", "kind": "ExoscaleNodeClass", "name": "default"}
        }}}
    }))
    .unwrap()
}

fn claim(name: &str, types: &[&str]) -> NodeClaim {
    let mut nc = NodeClaim::new(
        name,
        NodeClaimSpec {
            taints: vec![],
            startup_taints: vec![],
            requirements: vec![NodeSelectorRequirementWithMinValues {
                key: "node.kubernetes.io/instance-type".into(),
                operator: Operator::In,
                values: types.iter().map(|t| t.to_string()).collect(),
                min_values: None,
            }],
            resources: Default::default(),
            node_class_ref: NodeClassReference {
                group: "karpenter.exoscale.com".into(),
                kind: "ExoscaleNodeClass".into(),
                name: "default".into(),
            },
            termination_grace_period: None,
            expire_after: "720h".into(),
        },
    );
    nc.metadata.labels = Some([(labels::NODEPOOL_LABEL.to_string(), "default".to_string())].into());
    // As the API server gives every NodeClaim (a stand-in from the instance list has none).
    nc.metadata.uid = Some(format!("uid-{name}"));
    nc
}

fn provider_id(nc: &NodeClaim) -> String {
    nc.status.as_ref().unwrap().provider_id.clone().unwrap()
}

fn q(s: &str) -> Quantity {
    Quantity::parse(s).unwrap()
}

/// Waits for a condition with a generous bound (the sim completes operations in ~50 ms).
async fn eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..500 {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}

// ---- catalogue, allocatable, prices ----

#[tokio::test]
async fn catalogue_and_allocatable_for_several_families() {
    let w = world().await;
    assert!(w.sim.set_authorized("gpua30.small", true));
    w.provider.refresh_instance_types().await.unwrap();
    let types = w.types().await;
    let by = |n: &str| {
        types
            .iter()
            .find(|t| t.name == n)
            .unwrap_or_else(|| panic!("{n} missing"))
            .clone()
    };
    // (name, cpus, memory, gpus): allocatable = capacity - (300m cpu, 300Mi+100Mi mem + 100Mi eviction)
    for (name, cpu, mem) in [
        ("standard.medium", "2", "4Gi"),
        ("cpu.huge", "16", "32Gi"),
        ("memory.huge", "4", "32Gi"),
        ("storage.huge", "8", "32Gi"),
        ("gpua30.small", "12", "56Gi"),
    ] {
        let it = by(name);
        assert_eq!(it.capacity.cpu(), q(cpu), "{name}");
        assert_eq!(it.capacity.memory(), q(mem), "{name}");
        let a = it.allocatable();
        assert_eq!(a.cpu(), q(cpu) - q("300m"), "{name}");
        assert_eq!(a.memory(), q(mem) - q("500Mi"), "{name}");
        assert_eq!(a.pods(), Quantity::from_units(110), "{name}");
        // 50Gi disk - 1Gi - 3Gi - 10%
        assert_eq!(
            a.get("ephemeral-storage"),
            q("50Gi") - q("4Gi") - q("5Gi"),
            "{name}"
        );
        let r = &it.requirements;
        assert!(
            r.get("topology.kubernetes.io/zone")
                .unwrap()
                .has("ch-gva-2")
        );
        assert!(
            r.get("topology.kubernetes.io/region")
                .unwrap()
                .has("ch-gva-2")
        );
        assert!(
            r.get("karpenter.sh/capacity-type")
                .unwrap()
                .has("on-demand")
        );
        assert!(
            r.get("karpenter.exoscale.com/instance-cpu")
                .unwrap()
                .has(cpu)
        );
    }
    let gpu = by("gpua30.small");
    assert_eq!(
        gpu.allocatable().get("nvidia.com/gpu"),
        Quantity::from_units(1)
    );
    assert!(
        gpu.requirements
            .get("karpenter.exoscale.com/instance-gpu-model")
            .unwrap()
            .has("a30")
    );
    // Not authorized here (gpu3 is de-fra-1 only; gpua30.medium stays unauthorized).
    assert!(
        types
            .iter()
            .all(|t| t.name != "gpu3.small" && t.name != "gpua30.medium")
    );
}

#[tokio::test]
async fn instance_types_are_refreshed_not_only_at_start() {
    let w = world().await;
    let before = w.types().await.len();
    assert!(w.types().await.iter().all(|t| t.name != "gpua30.large"));
    w.sim.set_authorized("gpua30.large", true);
    w.sim.set_authorized("standard.micro", false);
    w.provider.refresh_instance_types().await.unwrap();
    let after = w.types().await;
    assert_eq!(after.len(), before);
    assert!(after.iter().any(|t| t.name == "gpua30.large"));
    assert!(after.iter().all(|t| t.name != "standard.micro"));
}

#[tokio::test]
async fn the_periodic_refresh_picks_up_new_authorisations() {
    let w = world().await;
    let refresh = w
        .provider
        .spawn_instance_type_refresh(Duration::from_millis(20));
    w.sim.set_authorized("gpua30.medium", true);
    eventually("gpua30.medium to appear", || async {
        w.types().await.iter().any(|t| t.name == "gpua30.medium")
    })
    .await;
    refresh.abort();
}

#[tokio::test]
async fn every_type_is_priced_and_unpriced_ones_are_reported() {
    let w = world().await;
    for t in Catalogue::embedded().instance_types() {
        w.sim.set_authorized(&t.name(), true);
    }
    w.provider.refresh_instance_types().await.unwrap();
    let catalogue = Catalogue::embedded();
    let types = w.types().await;
    assert!(types.len() > 20);
    for it in &types {
        let price = it.offerings[0].price;
        assert!(price.is_finite() && price > 0.0, "{}: {price}", it.name);
        let (family, size) = it.name.split_once('.').unwrap();
        if let Some(list) = catalogue.price(family, size, Currency::Eur) {
            assert_eq!(price, list, "{}", it.name);
        }
    }
    let extra_large = types
        .iter()
        .find(|t| t.name == "standard.extra-large")
        .unwrap();
    assert_eq!(extra_large.offerings[0].price, 0.18667);
    let unpriced: Vec<String> = w
        .provider
        .instance_type_provider()
        .unpriced()
        .unwrap()
        .into_iter()
        .map(|u| u.name)
        .collect();
    assert!(
        unpriced.contains(&"gpua30.small".to_string()),
        "{unpriced:?}"
    );
    assert!(!unpriced.contains(&"standard.medium".to_string()));
}

// ---- templates ----

#[tokio::test]
async fn templates_resolve_by_id_explicit_version_and_detected_version() {
    let w = world().await;
    let version = w.sim.kubernetes_version().to_string();
    let t = w.provider.templates();
    let auto = ExoscaleNodeClass::new("a", spec());
    let resolved = t.resolve(&auto).await.unwrap();
    assert_eq!(
        Some(resolved.id.clone()),
        w.sim
            .sks_template_id(&version, SksTemplateVariant::Standard)
    );
    assert_eq!(
        resolved.kubernetes_version.as_deref(),
        Some(version.as_str())
    );

    w.sim.add_kubernetes_version("1.33.9");
    let mut s = spec();
    s.image_template_selector = Some(ImageTemplateSelector {
        version: Some("1.33.9".into()),
        variant: karpenter_exoscale::apis::nodeclass::TemplateVariant::Nvidia,
    });
    let nvidia = t.resolve(&ExoscaleNodeClass::new("n", s)).await.unwrap();
    assert_eq!(
        Some(nvidia.id),
        w.sim.sks_template_id("1.33.9", SksTemplateVariant::Nvidia)
    );

    let by_id: ExoscaleNodeClassSpec =
        serde_yaml_ng::from_str("templateID: 188e6dc9-7b29-4db4-a8af-fc6368660738\n").unwrap();
    let calls = w.sim.call_count("get-active-nodepool-template");
    assert_eq!(
        t.resolve(&ExoscaleNodeClass::new("i", by_id.clone()))
            .await
            .unwrap()
            .id,
        "188e6dc9-7b29-4db4-a8af-fc6368660738"
    );
    assert_eq!(
        w.sim.call_count("get-active-nodepool-template"),
        calls,
        "templateID needs no lookup"
    );
    assert!(
        t.resolve_and_verify(&ExoscaleNodeClass::new("i", by_id))
            .await
            .is_ok()
    );

    let mut missing = spec();
    missing.image_template_selector = Some(ImageTemplateSelector {
        version: Some("1.20.0".into()),
        variant: Default::default(),
    });
    let e = t
        .resolve(&ExoscaleNodeClass::new("m", missing))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("version=1.20.0") && e.contains("variant=standard"),
        "{e}"
    );
}

#[tokio::test]
async fn template_lookups_are_cached_with_a_ttl() {
    let w = world().await;
    let t = w.provider.templates();
    let nc = ExoscaleNodeClass::new("a", spec());
    t.resolve(&nc).await.unwrap();
    let calls = w.sim.call_count("get-active-nodepool-template");
    t.resolve(&nc).await.unwrap();
    assert_eq!(w.sim.call_count("get-active-nodepool-template"), calls);
    w.clock.set(1_800_000_000 + 3600);
    t.resolve(&nc).await.unwrap();
    assert_eq!(w.sim.call_count("get-active-nodepool-template"), calls + 1);
}

// ---- create / get / list / delete ----

#[tokio::test]
async fn create_picks_the_cheapest_type_and_returns_a_complete_nodeclaim() {
    let w = world().await;
    let out = w
        .launch(
            "default-abc12",
            &["standard.large", "standard.medium", "cpu.huge"],
        )
        .await;
    let l = out.metadata.labels.as_ref().unwrap();
    assert_eq!(l["node.kubernetes.io/instance-type"], "standard.medium");
    assert_eq!(l["karpenter.exoscale.com/instance-family"], "standard");
    assert_eq!(l["karpenter.exoscale.com/instance-size"], "medium");
    assert_eq!(l["exoscale.com/instance-family"], "standard");
    assert_eq!(l["topology.kubernetes.io/zone"], "ch-gva-2");
    assert_eq!(l["karpenter.sh/capacity-type"], "on-demand");
    assert_eq!(l["karpenter.sh/nodepool"], "default");
    let status = out.status.as_ref().unwrap();
    let id = parse_provider_id(status.provider_id.as_deref().unwrap())
        .unwrap()
        .to_string();
    assert_eq!(status.capacity["cpu"].0, "2");
    assert_eq!(status.capacity["memory"].0, "4Gi");
    assert_eq!(status.allocatable["cpu"].0, "1700m");
    assert_eq!(status.allocatable["memory"].0, "3596Mi");
    assert_eq!(status.allocatable["pods"].0, "110");
    assert!(
        out.metadata
            .annotations
            .as_ref()
            .unwrap()
            .contains_key(labels::NODECLASS_HASH_ANNOTATION)
    );

    let sim_instance = w.sim.instance(&id).unwrap();
    let i = &sim_instance.instance;
    assert_eq!(status.image_id.as_deref(), Some(i.template.id.as_str()));
    assert_eq!(i.name, "karpenter-default-abc12");
    assert_eq!(i.labels["exoscale.com/managed-by"], "karpenter");
    assert_eq!(i.labels["exoscale.com/cluster-id"], w.sim.cluster_id());
    assert_eq!(i.labels["exoscale.com/node-claim"], "default-abc12");
    assert_eq!(i.labels["exoscale.com/nodepool-name"], "default");
    let sg = w
        .sim
        .security_groups()
        .into_iter()
        .find(|(_, n)| n == "karpenter-nodes")
        .unwrap()
        .0;
    assert_eq!(
        i.security_groups
            .iter()
            .map(|s| s.id.clone())
            .collect::<Vec<_>>(),
        vec![sg]
    );
    // The user data the sim stored decodes to the TOML with this NodeClaim's token.
    let toml: toml::Table = sim_instance.user_data.as_deref().unwrap().parse().unwrap();
    let k = &toml["settings"]["kubernetes"];
    let token = &w.bootstrap.tokens()["default-abc12"];
    assert_eq!(k["bootstrap-token"].as_str(), Some(token.token().as_str()));
    assert_eq!(
        k["api-server"].as_str(),
        Some("https://cluster.example:6443")
    );
    assert_eq!(
        k["node-labels"]["node.kubernetes.io/instance-type"].as_str(),
        Some("standard.medium")
    );
    assert_eq!(
        userdata::decode(i.user_data.as_deref().unwrap())
            .unwrap()
            .parse::<toml::Table>()
            .unwrap(),
        toml
    );
}

#[tokio::test]
async fn create_respects_requests_zone_and_custom_requirements() {
    let w = world().await;
    let mut c = claim(
        "big",
        &["standard.medium", "standard.large", "standard.huge"],
    );
    c.spec.resources.requests.insert(
        "cpu".into(),
        k8s_openapi::apimachinery::pkg::api::resource::Quantity("3".into()),
    );
    c.spec
        .requirements
        .push(NodeSelectorRequirementWithMinValues {
            key: "karpenter.exoscale.com/instance-cpu".into(),
            operator: Operator::Gt,
            values: vec!["3".into()],
            min_values: None,
        });
    let out = w.provider.create(&c).await.unwrap();
    assert_eq!(
        out.metadata.labels.as_ref().unwrap()["node.kubernetes.io/instance-type"],
        "standard.large"
    );

    let mut other_zone = claim("elsewhere", &["standard.medium"]);
    other_zone
        .spec
        .requirements
        .push(NodeSelectorRequirementWithMinValues {
            key: "topology.kubernetes.io/zone".into(),
            operator: Operator::In,
            values: vec!["de-fra-1".into()],
            min_values: None,
        });
    assert!(
        w.provider
            .create(&other_zone)
            .await
            .unwrap_err()
            .is_insufficient_capacity()
    );
}

#[tokio::test]
async fn get_and_list_map_instances_back_with_one_list_call() {
    let w = world().await;
    let a = w.launch("a", &["standard.medium"]).await;
    let b = w.launch("b", &["cpu.huge"]).await;
    let got = w.provider.get(&provider_id(&a)).await.unwrap();
    assert_eq!(got.metadata.name.as_deref(), Some("a"));
    assert_eq!(
        got.metadata.labels.as_ref().unwrap()["node.kubernetes.io/instance-type"],
        "standard.medium"
    );
    assert_eq!(
        got.status.as_ref().unwrap().image_id,
        a.status.as_ref().unwrap().image_id
    );

    let (lists, gets) = (
        w.sim.call_count("list-instances"),
        w.sim.call_count("get-instance"),
    );
    let listed = w.provider.list().await.unwrap();
    assert_eq!(w.sim.call_count("list-instances"), lists + 1);
    assert_eq!(
        w.sim.call_count("get-instance"),
        gets,
        "list must not fetch instances one by one"
    );
    let mut names: Vec<_> = listed
        .iter()
        .map(|n| n.metadata.name.clone().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, vec!["a", "b"]);
    let b_listed = listed
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some("b"))
        .unwrap();
    assert_eq!(
        b_listed.metadata.labels.as_ref().unwrap()["node.kubernetes.io/instance-type"],
        "cpu.huge"
    );
    assert_eq!(provider_id(b_listed), provider_id(&b));

    let unknown = "exoscale://00000000-0000-4000-8000-000000000000";
    assert!(w.provider.get(unknown).await.unwrap_err().is_not_found());
    assert!(
        !w.provider
            .get("aws:///i-1")
            .await
            .unwrap_err()
            .is_not_found()
    );
}

#[tokio::test]
async fn list_ignores_other_clusters_and_unmanaged_instances() {
    let w = world().await;
    w.launch("mine", &["standard.medium"]).await;
    let tpl = w
        .sim
        .sks_template_id(w.sim.kubernetes_version(), SksTemplateVariant::Standard)
        .unwrap();
    let type_id = Catalogue::embedded()
        .instance_type("standard.small")
        .unwrap()
        .id
        .clone();
    for labels in [
        vec![
            ("exoscale.com/managed-by", "karpenter"),
            ("exoscale.com/cluster-id", "another-cluster"),
        ],
        vec![("app", "db")],
    ] {
        let mut req = exoscale::models::CreateInstanceRequest::new(&type_id, &tpl, 20);
        req.labels = labels
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        w.client.create_instance(&req).await.unwrap();
    }
    let listed = w.provider.list().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].metadata.name.as_deref(), Some("mine"));
}

/// The launched NodeClaim records its token Secret by name; a replica that did not launch it
/// (no memory of the token) deletes that token with the instance — Secrets are never listed.
#[tokio::test]
async fn tokens_are_recorded_on_the_nodeclaim_and_deleted_by_another_replica() {
    let w = world().await;
    let nc = w.launch("rec", &["standard.medium"]).await;
    let token = w.bootstrap.tokens()["rec"].clone();
    assert_eq!(
        recorded_tokens(&nc),
        std::collections::BTreeSet::from([token.secret_name()])
    );
    let successor = provider_over(&w.sim, &w.client, &w.nodeclasses, &w.bootstrap, &w.clock);
    successor.refresh_instance_types().await.unwrap();
    successor.delete(&nc).await.unwrap();
    eventually("instance removal", || async {
        w.sim.instances().is_empty()
    })
    .await;
    assert!(successor.delete(&nc).await.unwrap_err().is_not_found());
    assert!(
        w.bootstrap.tokens().is_empty(),
        "the recorded token goes with the instance"
    );
}

/// Garbage collection deletes the twin of a lost create through a stand-in built from the
/// instance list, which carries the live NodeClaim's name but no UID: the live claim's token,
/// which its own instance still needs to join, stays.
#[tokio::test]
async fn deleting_a_twin_keeps_the_live_claims_token() {
    let w = world().await;
    let nc = w.launch("twin", &["standard.medium"]).await;
    let real = parse_provider_id(&provider_id(&nc)).unwrap().to_string();
    let original = w.client.get_instance(&real).await.unwrap();
    let mut req = exoscale::models::CreateInstanceRequest::new(
        &original.instance_type.id,
        &original.template.id,
        50,
    );
    req.name = Some(original.name.clone());
    req.labels = original.labels.clone();
    let twin = w.client.create_instance(&req).await.unwrap();
    let twin = twin.reference_id().unwrap().to_string();
    let stand_in = w
        .provider
        .list()
        .await
        .unwrap()
        .into_iter()
        .find(|c| provider_id(c).ends_with(&twin))
        .expect("the twin is listed");
    assert_eq!(stand_in.metadata.name.as_deref(), Some("twin"));
    w.provider.delete(&stand_in).await.unwrap();
    eventually("twin removal", || async { w.sim.instance(&twin).is_none() }).await;
    assert!(
        w.provider
            .delete(&stand_in)
            .await
            .unwrap_err()
            .is_not_found()
    );
    assert!(
        w.bootstrap.tokens().contains_key("twin"),
        "the live claim's token went with its twin"
    );
    assert!(w.sim.instance(&real).is_some());
}

/// A NodeClaim whose recorded provider ID names an instance carrying another cluster's
/// identity (NodeClaims restored from another cluster's backup into this one) does not get
/// that instance deleted: the delete is refused, naming why, and the instance stays. An
/// instance without any identity (launched before identities existed) is still deleted.
#[tokio::test]
async fn delete_refuses_an_instance_of_another_cluster() {
    let w = world().await;
    let nc = w.launch("restored", &["standard.medium"]).await;
    let id = parse_provider_id(&provider_id(&nc)).unwrap().to_string();
    let mut labels = w.sim.instance(&id).unwrap().instance.labels.clone();
    labels.insert(
        labels::INSTANCE_CLUSTER_UID_LABEL.into(),
        "another-clusters-uid".into(),
    );
    let op = w.client.update_instance_labels(&id, &labels).await.unwrap();
    w.client.wait_operation(&op).await.unwrap();

    let err = w.provider.delete(&nc).await.unwrap_err();
    assert!(
        err.to_string().contains("another cluster's identity"),
        "{err}"
    );
    assert_eq!(w.sim.call_count("delete-instance"), 0);
    assert!(w.sim.instance(&id).is_some());

    // Without any identity, the NodeClaim that records it owns it.
    labels.remove(labels::INSTANCE_CLUSTER_UID_LABEL);
    let op = w.client.update_instance_labels(&id, &labels).await.unwrap();
    w.client.wait_operation(&op).await.unwrap();
    w.provider.delete(&nc).await.unwrap();
    assert_eq!(w.sim.call_count("delete-instance"), 1);
}

#[tokio::test]
async fn delete_is_idempotent_and_reports_not_found_once_gone() {
    let w = world().await;
    let nc = w.launch("d", &["standard.medium"]).await;
    let id = parse_provider_id(&provider_id(&nc)).unwrap().to_string();
    assert!(w.bootstrap.tokens().contains_key("d"));
    w.provider.delete(&nc).await.unwrap();
    eventually("instance removal", || async {
        w.sim.instance(&id).is_none()
    })
    .await;
    let err = w.provider.delete(&nc).await.unwrap_err();
    assert!(
        matches!(err, CloudProviderError::NodeClaimNotFound(_)),
        "{err}"
    );
    assert!(
        !w.bootstrap.tokens().contains_key("d"),
        "the token goes with the NodeClaim"
    );
    assert!(
        w.provider
            .get(&provider_id(&nc))
            .await
            .unwrap_err()
            .is_not_found()
    );
}

/// A node's teardown checks twice that its instance is gone (the Node's finalizer, then the
/// NodeClaim's). Once this process has seen the instance destroyed to the end, the second check
/// makes no call. An instance removed behind its back is read at every check: a 404 alone does
/// not say the instance ever existed where it is looked for.
#[tokio::test]
async fn an_instance_seen_destroyed_to_the_end_is_not_read_again() {
    let w = world().await;
    let nc = w.launch("twice", &["standard.medium"]).await;
    let id = parse_provider_id(&provider_id(&nc)).unwrap().to_string();
    w.provider.delete(&nc).await.unwrap();
    eventually("instance removal", || async {
        w.sim.instance(&id).is_none()
    })
    .await;
    let before = w.sim.calls().len();
    for _check in ["Node's", "NodeClaim's"] {
        assert!(w.provider.delete(&nc).await.unwrap_err().is_not_found());
    }
    assert_eq!(
        operations(&w.sim, before),
        ["get-instance"],
        "the Node's check reads, the NodeClaim's does not"
    );

    let elsewhere = w.launch("elsewhere", &["standard.medium"]).await;
    let id = parse_provider_id(&provider_id(&elsewhere))
        .unwrap()
        .to_string();
    w.client.delete_instance(&id).await.unwrap();
    eventually("instance removal", || async {
        w.sim.instance(&id).is_none()
    })
    .await;
    let before = w.sim.calls().len();
    for _check in ["Node's", "NodeClaim's"] {
        assert!(
            w.provider
                .delete(&elsewhere)
                .await
                .unwrap_err()
                .is_not_found()
        );
    }
    assert_eq!(
        operations(&w.sim, before),
        ["get-instance", "get-instance"],
        "never seen destroying: every check reads"
    );
}

#[tokio::test]
async fn a_repeated_delete_while_terminating_sends_no_second_delete() {
    let w = world().await;
    let nc = w.launch("slow", &["standard.medium"]).await;
    // Termination that takes an hour: the instance stays `destroying` for this whole test.
    w.sim.set_operation_delay(Duration::from_secs(3600));
    let before = w.sim.calls().len();
    w.provider.delete(&nc).await.unwrap();
    assert_eq!(
        operations(&w.sim, before),
        ["get-instance", "delete-instance"],
        "one read decides, then the delete"
    );
    // Each poll of a terminating instance is one read (900 deletions poll thousands of times
    // through the client's rate limit).
    let before = w.sim.calls().len();
    w.provider.delete(&nc).await.unwrap();
    w.provider.delete(&nc).await.unwrap();
    assert_eq!(operations(&w.sim, before), ["get-instance", "get-instance"]);
    assert_eq!(w.sim.call_count("delete-instance"), 1);
    let listed = w.provider.list().await.unwrap();
    assert_eq!(
        listed.len(),
        1,
        "a terminating instance still exists for garbage collection"
    );
}

#[tokio::test]
async fn delete_finds_an_instance_whose_provider_id_was_never_recorded() {
    let w = world().await;
    w.launch("lost", &["standard.medium"]).await;
    let unrecorded = claim("lost", &["standard.medium"]);
    w.provider.delete(&unrecorded).await.unwrap();
    eventually("instance removal", || async {
        w.sim.instances().is_empty()
    })
    .await;
    assert!(
        w.provider
            .delete(&unrecorded)
            .await
            .unwrap_err()
            .is_not_found()
    );
}

// ---- idempotency ----

fn operations(sim: &ExoscaleSim, from: usize) -> Vec<String> {
    sim.calls()[from..]
        .iter()
        .map(|c| c.operation.clone())
        .collect()
}

/// The first launch of a NodeClaim this process created is one create (its answer describes
/// the launch); anything else (a retry, a NodeClaim another process made, one without a UID)
/// looks for an earlier attempt's instance first.
#[tokio::test]
async fn a_nodeclaim_created_here_launches_in_one_call_and_anything_else_looks_first() {
    let w = world().await;
    let mut fresh = claim("fresh", &["standard.medium"]);
    fresh.metadata.uid = Some("uid-fresh".into());
    w.provider.nodeclaim_created("uid-fresh");
    let before = w.sim.calls().len();
    let launched = w.provider.create(&fresh).await.unwrap();
    assert_eq!(operations(&w.sim, before), ["create-instance"]);
    // The NodeClaim it returns names the instance the sim made, with its type and template.
    let made = &w.sim.instances()[0].instance;
    assert!(provider_id(&launched).ends_with(&made.id));
    assert_eq!(
        launched.status.as_ref().unwrap().image_id.as_deref(),
        Some(made.template.id.as_str())
    );
    assert_eq!(
        launched.metadata.labels.as_ref().unwrap()["node.kubernetes.io/instance-type"],
        "standard.medium"
    );

    let mut other = claim("made-elsewhere", &["standard.medium"]);
    other.metadata.uid = Some("uid-elsewhere".into());
    let before = w.sim.calls().len();
    w.provider.create(&other).await.unwrap();
    assert_eq!(
        operations(&w.sim, before),
        ["list-instances", "create-instance"]
    );

    // A second attempt of the fresh NodeClaim (its status write failed, say) adopts.
    let before = w.sim.calls().len();
    let again = w.provider.create(&fresh).await.unwrap();
    assert_eq!(operations(&w.sim, before)[0], "list-instances");
    assert_eq!(w.sim.call_count("create-instance"), 2);
    assert_eq!(w.sim.instances().len(), 2);
    assert!(provider_id(&again).ends_with(&w.sim.instances()[0].instance.id));
}

/// Race seen at 5 000 pods: the watch delivered the NodeClaim and its launch ran before the
/// provisioner's create returned and reported it. A second launch (its status not yet in the
/// store) must adopt the first one's VM, not skip the lookup and make another.
#[tokio::test]
async fn a_creation_reported_after_the_launch_began_never_duplicates_the_vm() {
    let w = world().await;
    let mut claim = claim("early-launch", &["standard.medium"]);
    claim.metadata.uid = Some("uid-early".into());
    let first = w.provider.create(&claim).await.unwrap();
    w.provider.nodeclaim_created("uid-early");
    let second = w.provider.create(&claim).await.unwrap();
    assert_eq!(provider_id(&second), provider_id(&first));
    assert_eq!(w.sim.call_count("create-instance"), 1);
    assert_eq!(w.sim.instances().len(), 1);
}

/// Fault: the first launch's create answer is lost. The skipped lookup cannot duplicate: the
/// outcome-unknown create is looked up and its instance adopted, and the retry looks again.
#[tokio::test]
async fn a_first_launch_whose_answer_is_lost_adopts_instead_of_duplicating() {
    let w = world().await;
    w.sim
        .inject(Fault::on("create-instance", FaultAction::LoseResponse));
    let mut fresh = claim("fresh-lost", &["standard.medium"]);
    fresh.metadata.uid = Some("uid-fresh-lost".into());
    w.provider.nodeclaim_created("uid-fresh-lost");
    let nc = w.provider.create(&fresh).await.unwrap();
    let again = w.provider.create(&fresh).await.unwrap();
    assert_eq!(provider_id(&again), provider_id(&nc));
    assert_eq!(w.sim.instances().len(), 1);
    assert_eq!(w.sim.call_count("create-instance"), 1);
}

#[tokio::test]
async fn a_lost_create_response_adopts_the_instance_instead_of_duplicating_it() {
    let w = world().await;
    w.sim
        .inject(Fault::on("create-instance", FaultAction::LoseResponse));
    let nc = w.launch("lost-answer", &["standard.medium"]).await;
    assert_eq!(w.sim.instances().len(), 1);
    assert_eq!(
        w.sim.instances()[0].instance.id,
        parse_provider_id(&provider_id(&nc)).unwrap()
    );
    // A retried create (e.g. after a crash before the providerID was written) adopts too.
    let again = w.launch("lost-answer", &["standard.medium"]).await;
    assert_eq!(provider_id(&again), provider_id(&nc));
    assert_eq!(w.sim.instances().len(), 1);
    assert_eq!(w.sim.call_count("create-instance"), 1);
}

/// Fault: the create's response is lost and the backend commits after the lookup wait. The
/// launch fails without a second POST and keeps its bootstrap token, which the instance
/// carries; the next launch adopts that instance, whose user data still holds a live token.
#[tokio::test]
async fn an_outcome_unknown_launch_keeps_the_token_its_instance_needs() {
    let w = world_with_lookup_wait(Duration::from_millis(500)).await;
    w.sim.inject(Fault::on(
        "create-instance",
        FaultAction::LoseResponseCommitLater(Duration::from_secs(2)),
    ));
    let err = w.launch_refused("unknown", &["standard.medium"]).await;
    assert!(err.to_string().contains("outcome unknown"), "{err}");
    let token = w
        .bootstrap
        .tokens()
        .get("unknown")
        .cloned()
        .expect("the token of a possibly created instance is kept");
    eventually("the late instance", || async {
        !w.sim.instances().is_empty()
    })
    .await;
    let nc = w.launch("unknown", &["standard.medium"]).await;
    let instance = w.the_one_instance_of(&nc);
    let user_data =
        userdata::decode(&instance.user_data.as_ref().unwrap().0).expect("user data decodes");
    assert!(
        user_data.contains(&token.token()),
        "the adopted instance joins with the kept token"
    );
    assert_eq!(w.bootstrap.tokens().get("unknown"), Some(&token));
}

/// A create the API refused left no instance: its token is deleted at once.
#[tokio::test]
async fn a_refused_launch_deletes_its_token() {
    let w = world().await;
    w.sim
        .inject(Fault::status("create-instance", 400, "Invalid template"));
    let err = w.launch_refused("refused", &["standard.medium"]).await;
    assert!(err.to_string().contains("Invalid template"), "{err}");
    assert!(w.sim.instances().is_empty());
    assert!(!w.bootstrap.tokens().contains_key("refused"));
}

// ---- answers that name the wrong thing ----

/// An instance that is none of ours: launched, then stripped of every label (another team's
/// VM in the same organization, as far as the provider can tell).
async fn stranger(w: &World, name: &str) -> String {
    let nc = w.launch(name, &["standard.medium"]).await;
    let id = parse_provider_id(&provider_id(&nc)).unwrap().to_string();
    let op = w
        .client
        .update_instance_labels(&id, &Default::default())
        .await
        .unwrap();
    w.client.wait_operation(&op).await.unwrap();
    id
}

/// A create answer whose operation is about `reference`, with this link and command.
fn create_answer(reference: &str, link: &str, command: &str, state: &str) -> FaultAction {
    FaultAction::Status {
        status: 200,
        body: serde_json::json!({
            "id": "6f3c1c0e-8d2a-4b7e-9a51-0c2d3e4f5a6b",
            "state": state,
            "reason": if state == "failure" { Some("unavailable") } else { None },
            "message": if state == "failure" { Some("insufficient capacity") } else { None },
            "reference": {"id": reference, "link": link, "command": command}
        })
        .to_string(),
    }
}

/// Fault: a create answer names another kind of resource (here the UUID of a VM that is not
/// ours, under a security group's link). It is not recorded as the NodeClaim's instance: the
/// launch looks its instance up instead, and the stranger is never touched.
#[tokio::test]
async fn a_create_answer_naming_another_resource_is_looked_up_not_trusted() {
    let w = world_with_lookup_wait(Duration::from_millis(500)).await;
    let id = stranger(&w, "stranger").await;
    w.sim.inject(Fault::on(
        "create-instance",
        create_answer(
            &id,
            &format!("/v2/security-group/{id}"),
            "get-security-group",
            "pending",
        ),
    ));
    let err = w.launch_refused("victim", &["standard.medium"]).await;
    assert!(err.to_string().contains("outcome unknown"), "{err}");
    assert!(w.sim.instance(&id).is_some());
}

/// Fault: a NodeClaim's provider ID names a VM that was not launched for it (a create answer
/// that named the wrong instance, an ID edited by hand). Deleting the NodeClaim does not
/// delete that VM; the error names why.
#[tokio::test]
async fn deleting_a_nodeclaim_never_deletes_an_instance_launched_for_another() {
    let w = world().await;
    let id = stranger(&w, "stranger").await;
    let mut victim = w.launch("victim", &["standard.medium"]).await;
    let own = parse_provider_id(&provider_id(&victim))
        .unwrap()
        .to_string();
    victim.status.as_mut().unwrap().provider_id = Some(format!("exoscale://{id}"));
    let err = w.provider.delete(&victim).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("was not launched for NodeClaim victim"),
        "{err}"
    );
    // Another of ours, labelled for another NodeClaim, is refused the same way.
    victim.status.as_mut().unwrap().provider_id = Some(format!("exoscale://{own}"));
    victim.metadata.name = Some("someone-else".into());
    assert!(w.provider.delete(&victim).await.is_err());
    assert_eq!(w.sim.call_count("delete-instance"), 0);
    assert!(w.sim.instance(&id).is_some() && w.sim.instance(&own).is_some());
}

/// Fault: a create answer whose operation has already failed for capacity. No instance is
/// recorded, and the failure is a capacity one (the offering is then marked unavailable).
#[tokio::test]
async fn a_create_answer_whose_operation_failed_is_no_launch() {
    let w = world().await;
    let id = "0b1c2d3e-4f50-4a6b-8c7d-9e0f1a2b3c4d";
    w.sim.inject(Fault::on(
        "create-instance",
        create_answer(id, &format!("/v2/instance/{id}"), "get-instance", "failure"),
    ));
    let err = w.launch_refused("failed", &["standard.medium"]).await;
    assert!(err.is_insufficient_capacity(), "{err}");
}

/// Fault: with private networks, the create answer names a VM that is not ours (a valid
/// instance link). Nothing is attached to it and it is not rolled back (deleted).
#[tokio::test]
async fn a_create_answer_naming_a_stranger_attaches_and_deletes_nothing() {
    let w = world().await;
    let id = stranger(&w, "stranger").await;
    w.use_private_network().await;
    w.sim.inject(Fault::on(
        "create-instance",
        create_answer(
            &id,
            &format!("/v2/instance/{id}"),
            "get-instance",
            "success",
        ),
    ));
    let err = w.launch_refused("victim", &["standard.medium"]).await;
    assert!(
        err.to_string()
            .contains("does not carry NodeClaim victim's labels"),
        "{err}"
    );
    assert_eq!(w.sim.call_count("attach-instance-to-private-network"), 0);
    assert_eq!(w.sim.call_count("delete-instance"), 0);
    assert!(
        w.sim
            .instance(&id)
            .unwrap()
            .instance
            .private_networks
            .is_empty()
    );
}

/// Fault: a 404 that is not the API's own error document (a proxy's HTML page) while a
/// NodeClaim's instance is read for its deletion. It is not taken as "the instance is gone"
/// (the NodeClaim would lose its finalizer while its VM runs): the pass fails, and the next
/// one deletes the instance.
#[tokio::test]
async fn a_404_page_from_a_proxy_is_not_proof_an_instance_is_gone() {
    let w = world().await;
    let nc = w.launch("d404", &["standard.medium"]).await;
    w.sim.inject(Fault::on(
        "get-instance",
        FaultAction::Status {
            status: 404,
            body: "<html><body><h1>404 Not Found</h1></body></html>".into(),
        },
    ));
    let err = w.provider.delete(&nc).await.unwrap_err();
    assert!(!err.is_not_found(), "{err}");
    assert_eq!(w.sim.call_count("delete-instance"), 0);
    w.provider.delete(&nc).await.unwrap();
    assert_eq!(w.sim.call_count("delete-instance"), 1);
}

// ---- capacity errors ----

#[tokio::test]
async fn quota_exhaustion_is_insufficient_capacity_and_marks_the_offering() {
    let w = world().await;
    w.sim.set_instance_quota(Some(0));
    let err = w
        .launch_refused("q", &["standard.medium", "standard.large"])
        .await;
    match &err {
        CloudProviderError::InsufficientCapacity { offerings, .. } => {
            assert_eq!(
                offerings,
                &vec![("standard.medium".to_string(), "ch-gva-2".to_string())]
            );
        }
        other => panic!("expected insufficient capacity, got {other}"),
    }
    assert!(
        w.bootstrap.tokens().is_empty(),
        "the token of a failed launch is deleted"
    );
    let types = w.types().await;
    let medium = types.iter().find(|t| t.name == "standard.medium").unwrap();
    assert!(
        !medium.offerings[0].available,
        "the core must see the offering as unavailable"
    );
    // The next attempt falls back to the next cheapest type.
    w.sim.set_instance_quota(None);
    let out = w.launch("q", &["standard.medium", "standard.large"]).await;
    assert_eq!(
        out.metadata.labels.as_ref().unwrap()["node.kubernetes.io/instance-type"],
        "standard.large"
    );
    // The mark expires.
    w.clock.set(1_800_000_000 + 600);
    assert!(
        w.types()
            .await
            .iter()
            .find(|t| t.name == "standard.medium")
            .unwrap()
            .offerings[0]
            .available
    );
}

#[tokio::test]
async fn a_full_anti_affinity_group_is_insufficient_capacity() {
    let w = world().await;
    let mut s = spec();
    s.anti_affinity_group_selector_terms = vec![SelectorTerm {
        id: None,
        name: Some("karpenter-spread".into()),
    }];
    w.put_nodeclass(s).await;
    for i in 0..8 {
        w.launch(&format!("spread-{i}"), &["standard.medium"]).await;
    }
    let err = w.launch_refused("spread-8", &["standard.medium"]).await;
    assert!(err.is_insufficient_capacity(), "{err}");
    assert_eq!(w.sim.instances().len(), 8);
}

/// Fault: the create is carried out, yet answered 503 naming capacity (a gateway that gave up
/// on the backend). A server error is no proof of refusal: the instance is found and adopted,
/// not left to boot unclaimed while the NodeClaim is deleted as capacity-starved.
#[tokio::test]
async fn a_capacity_server_error_whose_create_went_through_adopts_the_instance() {
    let w = world().await;
    w.sim.inject(Fault::on(
        "create-instance",
        FaultAction::CommitThenStatus {
            status: 503,
            body: serde_json::json!({ "message": "insufficient capacity" }).to_string(),
        },
    ));
    let nc = w.launch("crowded", &["standard.medium"]).await;
    w.the_one_instance_of(&nc);
    assert!(w.bootstrap.tokens().contains_key("crowded"));
}

/// A 503 naming capacity with nothing found is a capacity failure: the offering is marked and
/// the token goes (the NodeClaim is deleted for it, so nothing will adopt a late instance).
/// The NodeClaim's teardown then deletes an instance the server committed after the answer.
#[tokio::test]
async fn a_capacity_server_error_with_nothing_found_is_capacity() {
    let w = world().await;
    w.sim.inject(Fault::status(
        "create-instance",
        503,
        "insufficient capacity",
    ));
    let claim = claim("crowded", &["standard.medium"]);
    let err = w.provider.create(&claim).await.unwrap_err();
    assert!(err.is_insufficient_capacity(), "{err}");
    assert_eq!(w.sim.call_count("create-instance"), 1);
    assert!(w.sim.instances().is_empty());
    assert!(!w.bootstrap.tokens().contains_key("crowded"));
    let types = w.types().await;
    let medium = types.iter().find(|t| t.name == "standard.medium").unwrap();
    assert!(!medium.offerings[0].available);
    // The create lands after all (another launch of the same NodeClaim name stands in for the
    // late commit); the capacity-starved NodeClaim's teardown finds it by label and deletes it.
    let late = w.launch("crowded", &["standard.large"]).await;
    let id = parse_provider_id(&provider_id(&late)).unwrap().to_string();
    assert!(w.provider.delete(&claim).await.is_ok());
    eventually("the late instance is deleted", || async {
        w.sim.instance(&id).is_none()
    })
    .await;
}

#[tokio::test]
async fn a_type_withdrawn_since_discovery_is_insufficient_capacity() {
    let w = world().await;
    w.sim.set_authorized("standard.medium", false);
    let err = w.launch_refused("w", &["standard.medium"]).await;
    assert!(err.is_insufficient_capacity(), "{err}");
    let err = w.launch_refused("w", &["no.such-type"]).await;
    assert!(err.is_insufficient_capacity(), "{err}");
}

#[tokio::test]
async fn other_api_failures_are_create_errors_with_a_reason() {
    let w = world().await;
    w.sim
        .inject(Fault::status("create-instance", 400, "Invalid request: disk").always());
    let err = w.launch_refused("e", &["standard.medium"]).await;
    match err {
        CloudProviderError::Create { reason, message } => {
            assert_eq!(reason, "InstanceCreationFailed");
            assert!(message.contains("Invalid request"), "{message}");
        }
        other => panic!("{other}"),
    }
    assert!(w.sim.instances().is_empty());
}

// ---- NodeClass readiness ----

#[tokio::test]
async fn nodeclass_readiness_gates_create() {
    let w = world().await;
    w.edit_status(|s| {
        s.conditions.set_condition(
            conditions::READY,
            ConditionStatus::False,
            "SecurityGroupResolutionFailed",
            "security group with name x not found",
            None,
            k8s_openapi::jiff::Timestamp::from_second(1_800_000_100).unwrap(),
        );
    });
    let err = w.launch_refused("n", &["standard.medium"]).await;
    assert!(err.is_nodeclass_not_ready(), "{err}");
    assert!(
        err.to_string()
            .contains("security group with name x not found")
    );
    w.edit_status(|s| s.conditions.clear());
    let err = w.launch_refused("n", &["standard.medium"]).await;
    assert!(
        matches!(err, CloudProviderError::Create { .. }),
        "unresolved: retry later: {err}"
    );
    w.nodeclasses.remove("default");
    let err = w.launch_refused("n", &["standard.medium"]).await;
    assert!(err.to_string().contains("not found"), "{err}");
    assert!(w.sim.instances().is_empty());
}

/// A NodeClass edited since its status was resolved (Ready for generation 1, spec at 2) is
/// not used until it is resolved again: a launch would take the old security groups.
#[tokio::test]
async fn a_nodeclass_edited_since_its_resolution_is_not_used_until_resolved_again() {
    let w = world().await;
    let mut nc = w.nodeclasses_get();
    nc.metadata.generation = Some(2);
    nc.status.as_mut().unwrap().conditions.set_condition(
        conditions::READY,
        ConditionStatus::True,
        "Ready",
        "",
        Some(1),
        k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap(),
    );
    w.nodeclasses.insert(nc.clone());
    let err = w.launch_refused("stale", &["standard.medium"]).await;
    assert!(err.is_nodeclass_not_ready(), "{err}");
    assert!(err.to_string().contains("generation 2"), "{err}");
    assert!(w.sim.instances().is_empty());
    // Resolved for generation 2: used.
    nc.status.as_mut().unwrap().conditions.set_condition(
        conditions::READY,
        ConditionStatus::True,
        "Ready",
        "",
        Some(2),
        k8s_openapi::jiff::Timestamp::from_second(1_800_000_001).unwrap(),
    );
    w.nodeclasses.insert(nc);
    w.launch("stale", &["standard.medium"]).await;
}

// ---- private networks ----

#[tokio::test]
async fn private_networks_are_attached_after_create() {
    let w = world().await;
    w.use_private_network().await;
    let nc = w.launch("pn", &["standard.medium"]).await;
    let id = parse_provider_id(&provider_id(&nc)).unwrap().to_string();
    let pn = w.sim.private_networks()[0].0.clone();
    let attached: Vec<_> = w
        .sim
        .instance(&id)
        .unwrap()
        .instance
        .private_networks
        .iter()
        .map(|p| p.id.clone())
        .collect();
    assert_eq!(attached, vec![pn]);
}

#[tokio::test]
async fn a_failed_private_network_attach_rolls_the_instance_back() {
    let w = world().await;
    w.use_private_network().await;
    w.sim.inject(Fault::status(
        "attach-instance-to-private-network",
        400,
        "Invalid attachment",
    ));
    let err = w.launch_refused("rb", &["standard.medium"]).await;
    match &err {
        CloudProviderError::Create { reason, message } => {
            assert_eq!(reason, "PrivateNetworkAttachFailed");
            assert!(message.contains("instance deleted"), "{message}");
        }
        other => panic!("{other}"),
    }
    assert_eq!(w.sim.call_count("delete-instance"), 1);
    eventually("rollback", || async { w.sim.instances().is_empty() }).await;
    assert!(w.bootstrap.tokens().is_empty());
}

#[tokio::test]
async fn a_failed_attach_operation_rolls_back_too() {
    let w = world().await;
    w.use_private_network().await;
    w.sim.inject(Fault::on(
        "attach-instance-to-private-network",
        FaultAction::FailOperation {
            reason: "conflict".into(),
            message: "network busy".into(),
        },
    ));
    let err = w.launch_refused("rb-op", &["standard.medium"]).await;
    assert!(err.to_string().contains("network busy"), "{err}");
    eventually("rollback", || async { w.sim.instances().is_empty() }).await;
}

// ---- drift ----

#[tokio::test]
async fn drift_fires_for_each_reason_against_the_desired_state() {
    let w = world().await;
    let mut s = spec();
    s.anti_affinity_group_selector_terms = vec![SelectorTerm {
        id: None,
        name: Some("karpenter-spread".into()),
    }];
    s.private_network_selector_terms = vec![SelectorTerm {
        id: None,
        name: Some("karpenter-private".into()),
    }];
    let original = w.put_nodeclass(s.clone()).await;
    let nc = w.launch("drift", &["standard.medium"]).await;
    assert_eq!(w.provider.is_drifted(&nc).await.unwrap(), None);

    let restore = |w: &World| w.nodeclasses.insert(original.clone());
    let new_sg = w.sim.add_security_group("extra");
    for (reason, change) in [
        (
            "ImageID",
            Box::new(|st: &mut ExoscaleNodeClassStatus| {
                st.template_id = Some("188e6dc9-7b29-4db4-a8af-fc6368660738".into())
            }) as Box<dyn Fn(&mut ExoscaleNodeClassStatus)>,
        ),
        (
            "SecurityGroups",
            Box::new(move |st: &mut ExoscaleNodeClassStatus| {
                st.security_groups.push(new_sg.clone())
            }),
        ),
        (
            "AntiAffinityGroups",
            Box::new(|st: &mut ExoscaleNodeClassStatus| st.anti_affinity_groups.clear()),
        ),
        (
            "PrivateNetworks",
            Box::new(|st: &mut ExoscaleNodeClassStatus| st.private_networks.clear()),
        ),
    ] {
        w.edit_status(|st| change(st));
        let drift = w.provider.is_drifted(&nc).await.unwrap().expect("drifted");
        assert_eq!(drift.reason, reason);
        // The DriftDetected message names both sides.
        assert!(
            drift.message.contains("NodeClass wants")
                && (drift.message.contains("instance has")
                    || drift.message.contains("instance runs")),
            "{}",
            drift.message
        );
        restore(&w);
        assert_eq!(w.provider.is_drifted(&nc).await.unwrap(), None);
    }

    // A new SKS template for the control plane's version (NodeClass status re-resolved).
    w.sim.add_kubernetes_version("1.35.0");
    let mut newer = s.clone();
    newer.image_template_selector = Some(ImageTemplateSelector {
        version: Some("1.35.0".into()),
        variant: Default::default(),
    });
    let mut newer_nc = w.put_nodeclass(newer).await;
    assert_eq!(
        w.provider
            .is_drifted(&nc)
            .await
            .unwrap()
            .map(|d| d.reason)
            .as_deref(),
        Some("ImageID")
    );

    // Kubelet / disk changes drift through the NodeClass hash.
    restore(&w);
    newer_nc.spec = s.clone();
    newer_nc.spec.disk_size = 80;
    newer_nc.status = original.status.clone();
    w.nodeclasses.insert(newer_nc);
    assert_eq!(
        w.provider
            .is_drifted(&nc)
            .await
            .unwrap()
            .map(|d| d.reason)
            .as_deref(),
        Some("NodeClassDrift")
    );

    // An unresolved NodeClass never drifts nodes.
    restore(&w);
    w.edit_status(|st| {
        st.template_id = Some("188e6dc9-7b29-4db4-a8af-fc6368660738".into());
        st.conditions.clear();
    });
    assert_eq!(w.provider.is_drifted(&nc).await.unwrap(), None);
}

#[tokio::test]
async fn drift_checks_restore_missing_instance_labels_once() {
    let w = world().await;
    let nc = w.launch("labels", &["standard.medium"]).await;
    let id = parse_provider_id(&provider_id(&nc)).unwrap().to_string();
    let mut labels = w.sim.instance(&id).unwrap().instance.labels.clone();
    labels.remove("exoscale.com/nodepool-name");
    labels.insert("team".into(), "a".into());
    let op = w.client.update_instance_labels(&id, &labels).await.unwrap();
    w.client.wait_operation(&op).await.unwrap();
    let updates = w.sim.call_count("update-instance");
    assert_eq!(w.provider.is_drifted(&nc).await.unwrap(), None);
    assert_eq!(w.sim.call_count("update-instance"), updates + 1);
    let healed = w.sim.instance(&id).unwrap().instance.labels;
    assert_eq!(healed["exoscale.com/nodepool-name"], "default");
    assert_eq!(healed["team"], "a", "extra labels are kept");
    w.provider.is_drifted(&nc).await.unwrap();
    assert_eq!(
        w.sim.call_count("update-instance"),
        updates + 1,
        "no update when nothing is missing"
    );
}

/// Healing writes a whole label map. The copy that shows a label missing may be the shared
/// list (up to 30 s old); a label someone put on the instance after that list is kept, because
/// the map written comes from a fresh read.
#[tokio::test]
async fn label_healing_keeps_a_label_added_after_the_shared_list() {
    let w = world().await;
    let nc = w.launch("heal-old", &["standard.medium"]).await;
    let other = w.launch("heal-other", &["standard.medium"]).await;
    let id = parse_provider_id(&provider_id(&nc)).unwrap().to_string();
    let mut labels = w.sim.instance(&id).unwrap().instance.labels.clone();
    labels.remove("exoscale.com/nodepool-name");
    let op = w.client.update_instance_labels(&id, &labels).await.unwrap();
    w.client.wait_operation(&op).await.unwrap();
    // Another NodeClaim's check lists the instances: the list holds the label-less copy.
    let lists = w.sim.call_count("list-instances");
    w.provider.is_drifted(&other).await.unwrap();
    assert_eq!(w.sim.call_count("list-instances"), lists + 1);
    // Then someone labels the instance.
    labels.insert("team".into(), "late".into());
    let op = w.client.update_instance_labels(&id, &labels).await.unwrap();
    w.client.wait_operation(&op).await.unwrap();

    assert_eq!(w.provider.is_drifted(&nc).await.unwrap(), None);
    assert_eq!(
        w.sim.call_count("list-instances"),
        lists + 1,
        "the list was used"
    );
    let healed = w.sim.instance(&id).unwrap().instance.labels;
    assert_eq!(healed["exoscale.com/nodepool-name"], "default");
    assert_eq!(
        healed.get("team").map(String::as_str),
        Some("late"),
        "the later label was lost"
    );
}

/// The drift checks of a conditions pass share one list of the cluster's instances (fresh
/// for 30 s) instead of a read per NodeClaim. An instance newer than a list younger than 5 s,
/// or one whose NodeClass names anti-affinity groups (which a list answer lacks), is read on
/// its own; a list 5 s old that lacks the instance is taken again.
#[tokio::test]
async fn drift_checks_share_one_instance_list() {
    let w = world().await;
    let mut claims = Vec::new();
    for name in ["d1", "d2", "d3"] {
        claims.push(w.launch(name, &["standard.medium"]).await);
    }
    let (lists, gets) = (
        w.sim.call_count("list-instances"),
        w.sim.call_count("get-instance"),
    );
    for nc in &claims {
        assert_eq!(w.provider.is_drifted(nc).await.unwrap(), None);
    }
    assert_eq!(w.sim.call_count("list-instances"), lists + 1);
    assert_eq!(
        w.sim.call_count("get-instance"),
        gets,
        "no read per NodeClaim"
    );

    // Launched after the list: read on its own, and still judged.
    let newer = w.launch("d4", &["standard.medium"]).await;
    // (A create of a NodeClaim made elsewhere looks for an earlier instance: one list.)
    let lists = w.sim.call_count("list-instances");
    assert_eq!(w.provider.is_drifted(&newer).await.unwrap(), None);
    assert_eq!(
        w.sim.call_count("list-instances"),
        lists,
        "the list is still fresh"
    );
    assert_eq!(w.sim.call_count("get-instance"), gets + 1);

    // Five seconds on, the next NodeClaim launched after the list is found by listing again
    // (one list answers every check of the pass), not by a read of its own.
    let later = w.launch("d5", &["standard.medium"]).await;
    w.clock.advance(Duration::from_secs(5));
    let lists = w.sim.call_count("list-instances");
    assert_eq!(w.provider.is_drifted(&later).await.unwrap(), None);
    assert_eq!(w.provider.is_drifted(&newer).await.unwrap(), None);
    assert_eq!(w.sim.call_count("list-instances"), lists + 1);
    assert_eq!(w.sim.call_count("get-instance"), gets + 1, "no read of d5");

    // The listed answer still finds drift (a security group the instance lacks).
    let extra = w.sim.add_security_group("extra");
    w.edit_status(|st| st.security_groups.push(extra.clone()));
    let drift = w.provider.is_drifted(&claims[0]).await.unwrap();
    assert_eq!(drift.map(|d| d.reason).as_deref(), Some("SecurityGroups"));
    assert_eq!(w.sim.call_count("get-instance"), gets + 1);

    // Thirty-one seconds on, the next check lists again.
    let lists = w.sim.call_count("list-instances");
    w.clock.advance(Duration::from_secs(31));
    w.provider.is_drifted(&claims[1]).await.unwrap();
    assert_eq!(w.sim.call_count("list-instances"), lists + 1);

    // A NodeClass with anti-affinity groups: every check reads its instance.
    let mut grouped = spec();
    grouped.anti_affinity_group_selector_terms = vec![SelectorTerm {
        id: None,
        name: Some("karpenter-spread".into()),
    }];
    w.put_nodeclass(grouped).await;
    let gets = w.sim.call_count("get-instance");
    w.provider.is_drifted(&claims[2]).await.unwrap();
    assert_eq!(w.sim.call_count("get-instance"), gets + 1);
}

#[tokio::test]
async fn drift_of_a_vanished_instance_is_not_found() {
    let w = world().await;
    let nc = w.launch("gone", &["standard.medium"]).await;
    w.provider.delete(&nc).await.unwrap();
    eventually("instance removal", || async {
        w.sim.instances().is_empty()
    })
    .await;
    assert!(w.provider.is_drifted(&nc).await.unwrap_err().is_not_found());
}

// ---- bootstrap tokens ----

/// Marks `claim` registered, as the registration controller does.
fn registered(mut claim: NodeClaim) -> NodeClaim {
    let status = claim.status.get_or_insert_with(Default::default);
    status.conditions.push(karpenter_exoscale::apis::Condition {
        type_: conditions::REGISTERED.into(),
        status: ConditionStatus::True,
        reason: "Registered".into(),
        message: String::new(),
        last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ),
        observed_generation: None,
    });
    claim
}

/// `claim` without the record of its bootstrap tokens.
fn without_token_record(mut claim: NodeClaim) -> NodeClaim {
    claim
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .remove(labels::NODECLAIM_TOKENS_ANNOTATION);
    claim
}

/// Deletes `claim`'s instance until the provider reports it gone, which is when its tokens go.
async fn remove(w: &World, claim: &NodeClaim) {
    w.provider.delete(claim).await.unwrap();
    let id = parse_provider_id(&provider_id(claim)).unwrap().to_string();
    eventually("instance removal", || async {
        w.sim.instance(&id).is_none()
    })
    .await;
    assert!(w.provider.delete(claim).await.unwrap_err().is_not_found());
}

/// Once its Node registered, the bootstrap-token controller deletes a NodeClaim's recorded
/// tokens and drops the record; removing the NodeClaim later deletes none of them again.
#[tokio::test]
async fn a_released_token_is_not_deleted_again_with_its_nodeclaim() {
    let w = world().await;
    let nc = w.launch("released", &["standard.medium"]).await;
    let recorded: Vec<String> = recorded_tokens(&nc).into_iter().collect();
    assert_eq!(recorded.len(), 1);
    // The bootstrap-token controller's work: delete the recorded tokens, then the record.
    NodeBootstrap::delete_tokens(&*w.bootstrap, &recorded)
        .await
        .unwrap();
    let released = without_token_record(registered(nc));
    remove(&w, &released).await;
    assert_eq!(
        w.bootstrap.delete_requests(),
        recorded,
        "each token is deleted once"
    );

    // A NodeClaim that never registered, whose record was never written (its launch result
    // was lost), still has the token this process issued for it deleted.
    let lost = w.launch("lost", &["standard.medium"]).await;
    let token = w.bootstrap.tokens()["lost"].secret_name();
    remove(&w, &without_token_record(lost)).await;
    assert!(!w.bootstrap.tokens().contains_key("lost"));
    assert_eq!(w.bootstrap.delete_requests().last(), Some(&token));
}

#[tokio::test]
async fn token_lifecycle_follows_the_nodeclaim() {
    let w = world().await;
    w.bootstrap.fail_next_creates(1);
    let err = w.launch_refused("t", &["standard.medium"]).await;
    match &err {
        CloudProviderError::Create { reason, .. } => {
            assert_eq!(reason, "BootstrapTokenCreationFailed")
        }
        other => panic!("{other}"),
    }
    assert!(w.sim.instances().is_empty(), "no instance without a token");
    let nc = w.launch("t", &["standard.medium"]).await;
    let tokens = w.bootstrap.tokens();
    assert_eq!(tokens.len(), 1);
    // Adoption does not mint a second token.
    w.launch("t", &["standard.medium"]).await;
    assert_eq!(w.bootstrap.tokens(), tokens);
    w.provider.delete(&nc).await.unwrap();
    eventually("instance removal", || async {
        w.sim.instances().is_empty()
    })
    .await;
    assert!(w.provider.delete(&nc).await.unwrap_err().is_not_found());
    assert!(w.bootstrap.tokens().is_empty());
}

#[tokio::test]
async fn a_token_whose_create_was_not_answered_is_deleted_or_kept_on_record() {
    let w = world().await;
    // Stored, answer lost: the launch fails and the stored token is deleted at once.
    w.bootstrap.lose_next_create_answers(1);
    w.launch_refused("t", &["standard.medium"]).await;
    assert!(w.sim.instances().is_empty(), "no instance without a token");
    assert!(
        w.bootstrap.tokens().is_empty(),
        "the unanswered token was deleted"
    );
    assert_eq!(w.bootstrap.delete_requests().len(), 1);

    // Stored, answer lost, and the delete fails too: the name is recorded by the NodeClaim's
    // next launch, so its registration or teardown deletes it.
    w.bootstrap.lose_next_create_answers(1);
    w.bootstrap.fail_next_deletes(1);
    w.launch_refused("u", &["standard.medium"]).await;
    let unanswered = w.bootstrap.tokens()["u"].secret_name();
    assert_eq!(w.bootstrap.delete_requests().last(), Some(&unanswered));
    let nc = w.launch("u", &["standard.medium"]).await;
    let recorded = karpenter_exoscale::cloudprovider::exoscale::recorded_tokens(&nc);
    assert!(recorded.contains(&unanswered), "{recorded:?}");
    assert_eq!(recorded.len(), 2, "{recorded:?}");

    // A refusal stored nothing: nothing to delete.
    let deletes = w.bootstrap.delete_requests().len();
    w.bootstrap.fail_next_creates(1);
    w.launch_refused("v", &["standard.medium"]).await;
    assert_eq!(w.bootstrap.delete_requests().len(), deletes);
}

/// A provider reading NodeClasses from the watched reflector store, as in production: once
/// the watch fails, the store's last copy is not trusted (it may be old for good) until a new
/// list completes. Meanwhile nothing is launched and no drift is judged from it.
#[tokio::test]
async fn nodeclasses_whose_watch_failed_launch_nothing_and_judge_no_drift() {
    use karpenter_exoscale::cloudprovider::exoscale::WatchedNodeClasses;
    use kube::runtime::watcher::Event;
    let w = world().await;
    let nodeclass = w.nodeclasses_get();
    let (store, mut writer) = kube::runtime::reflector::store::<ExoscaleNodeClass>();
    let watched = Arc::new(WatchedNodeClasses::new(store));
    let listed = |writer: &mut kube::runtime::reflector::store::Writer<ExoscaleNodeClass>| {
        for event in [
            Event::Init,
            Event::InitApply(nodeclass.clone()),
            Event::InitDone,
        ] {
            writer.apply_watcher_event(&event);
            watched.follow::<kube::runtime::watcher::Error>(Ok(&event));
        }
    };
    listed(&mut writer);
    let provider = ExoscaleCloudProvider::new(
        w.provider.settings().clone(),
        Dependencies {
            client: w.client.clone(),
            nodeclasses: watched.clone(),
            bootstrap: w.bootstrap.clone(),
            versions: Arc::new(FixedVersion(format!("v{}+sks", w.sim.kubernetes_version()))),
            clock: Arc::new(w.clock.clone()),
            prices: PriceBook::new(Currency::Eur),
        },
    );
    provider.refresh_instance_types().await.unwrap();
    let launched = provider
        .create(&claim("watched", &["standard.medium"]))
        .await
        .unwrap();
    assert_eq!(provider.is_drifted(&launched).await.unwrap(), None);

    watched.follow(Err("the watch failed"));
    let creates = w.sim.call_count("create-instance");
    let refused = provider
        .create(&claim("stale", &["standard.medium"]))
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("not current"), "{refused}");
    assert_eq!(w.sim.call_count("create-instance"), creates, "launched");
    let drift = provider.is_drifted(&launched).await;
    assert!(
        drift.is_err(),
        "drift judged from a stale NodeClass: {drift:?}"
    );

    listed(&mut writer);
    provider
        .create(&claim("relisted", &["standard.medium"]))
        .await
        .expect("a launch once the NodeClasses are listed again");
}
