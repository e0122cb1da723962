//! Upstream Karpenter on the same control plane: its own KWOK cloud provider and kwok, built by
//! `hack/upstream-kwok.sh`. Upstream is given our instance types (names, list prices, zone) with
//! capacities chosen so that its allocatable equals ours, so both pack pods the same way.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use karpenter_exoscale::catalogue::{Catalogue, Currency};
use karpenter_exoscale::providers::instance_types::build;
use karpenter_exoscale::providers::pricing::PriceBook;
use karpenter_exoscale::simulate::catalogue_types;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

use super::support::control_plane::{ControlPlane, Options, free_ports, publish_cluster_ca};

/// The families both controllers may choose from.
pub const FAMILIES: [&str; 3] = ["standard", "cpu", "memory"];

pub struct Upstream {
    _plane: ControlPlane,
    pub client: kube::Client,
    pub controller: tokio::process::Child,
    pub metrics_url: String,
    _kwok: tokio::process::Child,
    _dir: tempfile::TempDir,
}

/// Upstream's KWOK provider subtracts a fixed overhead (100m CPU, 10Mi) from the capacity it is
/// given; adding it back makes its allocatable ours.
const KWOK_OVERHEAD_CPU_MILLI: i128 = 100;
const KWOK_OVERHEAD_MEMORY: i128 = 10 * 1024 * 1024;

/// CPU (millicores) and memory (bytes) pods may use on a node of type `name`, as our scheduler
/// computes it.
pub fn allocatable(zone: &str, name: &str) -> (i128, i128) {
    let catalogue = Catalogue::embedded();
    let class = nodeclass();
    let t = catalogue_types(catalogue, zone)
        .into_iter()
        .find(|t| t.name() == name)
        .unwrap_or_else(|| panic!("no instance type {name} in {zone}"));
    let a = build(&t, &class, zone, 0.0, true)
        .expect("instance type")
        .allocatable();
    (a.cpu().milli(), a.memory().milli() / 1000)
}

fn nodeclass() -> karpenter_exoscale::apis::ExoscaleNodeClass {
    serde_json::from_value(json!({
        "apiVersion": "karpenter.exoscale.com/v1", "kind": "ExoscaleNodeClass",
        "metadata": {"name": "scale"}, "spec": {"imageTemplateSelector": {}, "diskSize": 50}
    }))
    .expect("NodeClass")
}

/// Our instance types of `zone`, in upstream's KWOK instance-types file format.
pub fn kwok_instance_types(zone: &str) -> Value {
    let catalogue = Catalogue::embedded();
    let prices = PriceBook::from_catalogue(catalogue, Currency::Eur);
    let class = nodeclass();
    let types: Vec<Value> = catalogue_types(catalogue, zone)
        .iter()
        .filter(|t| FAMILIES.contains(&t.family.as_str()) && t.gpus == 0)
        .map(|t| {
            let price = prices.price(&t.name(), t.shape()).per_hour;
            let built = build(t, &class, zone, price, true).expect("instance type");
            let allocatable = built.allocatable();
            json!({
                "name": t.name(),
                "architecture": "amd64",
                "operatingSystems": ["linux"],
                "resources": {
                    "cpu": format!("{}m", allocatable.cpu().milli() + KWOK_OVERHEAD_CPU_MILLI),
                    "memory": format!("{}", allocatable.memory().milli() / 1000 + KWOK_OVERHEAD_MEMORY),
                    "pods": format!("{}", allocatable.pods().milli() / 1000),
                    "ephemeral-storage": "50Gi",
                },
                "offerings": [{
                    "Price": price,
                    "Available": true,
                    "Requirements": [
                        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
                        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [zone]},
                    ],
                }],
            })
        })
        .collect();
    Value::Array(types)
}

impl Upstream {
    pub async fn start(
        bin_dir: &Path,
        kwok_dir: &Path,
        zone: &str,
        controller_log: &Path,
        audit_log: &Path,
    ) -> Result<Upstream, String> {
        let options = Options {
            crd_dir: Some(kwok_dir.join("crds")),
            audit_log: Some(audit_log.to_path_buf()),
            ..Options::sandbox()
        };
        let plane = ControlPlane::start(bin_dir, &options).await?;
        let config = plane.config().await;
        let client = kube::Client::try_from(config.clone()).map_err(|e| format!("client: {e}"))?;
        publish_cluster_ca(&client, &config).await;
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let types_file = dir.path().join("instance-types.json");
        std::fs::write(&types_file, kwok_instance_types(zone).to_string())
            .map_err(|e| e.to_string())?;

        let [kwok_port, metrics_port, health_port] = free_ports()?;
        let log = |name: &str| -> Result<(Stdio, Stdio), String> {
            let path: PathBuf = if name == "controller" {
                controller_log.to_path_buf()
            } else {
                controller_log.with_extension(format!("{name}.log"))
            };
            let file = std::fs::File::create(&path)
                .map_err(|e| format!("creating {}: {e}", path.display()))?;
            let copy = file.try_clone().map_err(|e| e.to_string())?;
            Ok((Stdio::from(file), Stdio::from(copy)))
        };
        let (out, err) = log("kwok")?;
        let kwok = tokio::process::Command::new(kwok_dir.join("kwok"))
            .arg(format!("--kubeconfig={}", plane.kubeconfig_file.display()))
            .arg(format!("--config={}", kwok_dir.join("kwok.yaml").display()))
            .arg(format!("--server-address=127.0.0.1:{kwok_port}"))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("starting kwok: {e}"))?;
        let (out, err) = log("controller")?;
        let controller = tokio::process::Command::new(kwok_dir.join("karpenter-kwok"))
            .env("KUBECONFIG", &plane.kubeconfig_file)
            .env("INSTANCE_TYPES_FILE_PATH", &types_file)
            .env("DISABLE_LEADER_ELECTION", "true")
            .env("METRICS_PORT", metrics_port.to_string())
            .env("HEALTH_PROBE_PORT", health_port.to_string())
            .env("SYSTEM_NAMESPACE", "kube-system")
            .env("LOG_LEVEL", "info")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("starting karpenter-kwok: {e}"))?;
        Ok(Upstream {
            _plane: plane,
            client,
            controller,
            metrics_url: format!("http://127.0.0.1:{metrics_port}/metrics"),
            _kwok: kwok,
            _dir: dir,
        })
    }

    /// The KWOKNodeClass and a NodePool like ours (same families, disruption, limits).
    pub async fn nodepool(&self, requirements: Value, disruption: Value) -> Result<(), String> {
        let create = |gvk: GroupVersionKind, plural: &'static str, object: Value| {
            let api: Api<DynamicObject> = Api::all_with(
                self.client.clone(),
                &ApiResource::from_gvk_with_plural(&gvk, plural),
            );
            async move {
                let object: DynamicObject =
                    serde_json::from_value(object).map_err(|e| e.to_string())?;
                api.create(&PostParams::default(), &object)
                    .await
                    .map(|_| ())
                    .map_err(|e| format!("creating {plural}: {e}"))
            }
        };
        create(
            GroupVersionKind::gvk("karpenter.kwok.sh", "v1alpha1", "KWOKNodeClass"),
            "kwoknodeclasses",
            json!({"apiVersion": "karpenter.kwok.sh/v1alpha1", "kind": "KWOKNodeClass",
                "metadata": {"name": "scale"}, "spec": {}}),
        )
        .await?;
        create(
            GroupVersionKind::gvk("karpenter.sh", "v1", "NodePool"),
            "nodepools",
            json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "scale"},
                "spec": {"template": {"spec": {
                    "nodeClassRef": {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "scale"},
                    "requirements": requirements}},
                    "disruption": disruption,
                    "limits": {"cpu": "100000"}}}),
        )
        .await
    }
}
