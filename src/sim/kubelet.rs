//! A simulated kubelet for tests: turns a running (simulated) Exoscale instance into a
//! registered Node, the way the SKS node agent, the kubelet and the Exoscale CCM would.
//!
//! The input is a plain [`RunningInstance`] so the simulated cloud can feed it from its
//! instance events. The instance's user data (the SKS node-agent TOML, plain, base64 or
//! gzip+base64) supplies the node labels, taints and reservations; the instance type
//! supplies capacity. [`KubeletBehaviour`] scripts the faults repair logic must handle.
//!
//! Pure parts ([`decode_user_data`], [`node_for`], [`node_status_for`]) are separate from
//! the API calls ([`register_node`], [`set_node_condition`], [`spawn`]).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Node, NodeAddress, NodeCondition, NodeSpec, NodeStatus, NodeSystemInfo, Taint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde::Deserialize;
use tokio::sync::broadcast;

use crate::exoscale::models::{Instance, InstanceType};
use crate::sim::InstanceEvent;

/// Kubernetes version the simulated kubelet reports.
pub const KUBELET_VERSION: &str = "v1.35.4";
/// Extended resource name for GPUs, as the NVIDIA device plugin advertises them.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// Pods per node: the kubelet's default `--max-pods`.
pub const MAX_PODS: u32 = 110;
/// The annotation a kubelet registers with when volumes are attached by the controller.
const ATTACH_DETACH_ANNOTATION: &str = "volumes.kubernetes.io/controller-managed-attach-detach";
/// Taint the node-lifecycle controller keeps on nodes that are not Ready.
pub const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";

const PROVIDER_ID_PREFIX: &str = "exoscale://";
const FIELD_MANAGER: &str = "simulated-kubelet";
const MIB: u64 = 1024 * 1024;
const GIB: u64 = 1024 * MIB;
/// The kubelet's default hard eviction threshold `memory.available<100Mi`.
const EVICTION_HARD_MEMORY_BYTES: u64 = 100 * MIB;
/// The kubelet's default hard eviction threshold `nodefs.available<10%`.
const EVICTION_HARD_NODEFS_PERCENT: u64 = 10;

/// Errors of the simulated kubelet.
#[derive(Debug, thiserror::Error)]
pub enum KubeletSimError {
    #[error(transparent)]
    UserData(#[from] crate::providers::userdata::DecodeError),
    #[error("user data is not a valid node-agent TOML document: {0}")]
    UserDataToml(#[source] toml::de::Error),
    #[error("user data has no settings.kubernetes.bootstrap-token: the node cannot join")]
    MissingBootstrapToken,
    /// What the API server's bootstrap-token authenticator would refuse.
    #[error("bootstrap token rejected: {0}")]
    BootstrapTokenRejected(String),
    #[error(
        "node taint {key:?} has entry {entry:?}; expected \"<value>:<NoSchedule|PreferNoSchedule|NoExecute>\""
    )]
    InvalidTaint { key: String, entry: String },
    #[error("{field} quantity {value:?} is not a valid Kubernetes quantity")]
    InvalidQuantity { field: String, value: String },
    #[error("{field} reservation {reserved} exceeds the node's capacity {capacity}")]
    ReservationExceedsCapacity {
        field: String,
        reserved: u64,
        capacity: u64,
    },
    #[error("max-pods = {0}: the node agent accepts 1..=65535")]
    MaxPods(u32),
    #[error("instance {0} has no user data: its node agent cannot configure a kubelet")]
    MissingUserData(String),
    #[error("Kubernetes API call failed: {0}")]
    Kube(#[from] kube::Error),
}

/// Size of the instance type a simulated instance runs as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceShape {
    /// `family.size`, e.g. `standard.medium`: the node's instance-type label.
    pub name: String,
    pub cpus: u32,
    pub memory_bytes: u64,
    pub gpus: u32,
    pub disk_gib: u64,
}

impl InstanceShape {
    /// The shape of an Exoscale instance type with a root disk of `disk_gib`.
    pub fn from_instance_type(instance_type: &InstanceType, disk_gib: u64) -> Self {
        Self {
            name: instance_type.name(),
            cpus: instance_type.cpus,
            memory_bytes: instance_type.memory,
            gpus: instance_type.gpus,
            disk_gib,
        }
    }
}

/// A simulated instance that reached the running state. `Debug` leaves out the user data: it
/// carries the bootstrap token.
#[derive(Clone, PartialEq, Eq)]
pub struct RunningInstance {
    /// Exoscale instance UUID (lowercase); becomes `exoscale://<id>` and the system UUID.
    pub id: String,
    /// Instance name; the node takes the same name.
    pub name: String,
    pub zone: String,
    pub shape: InstanceShape,
    /// The `user-data` field as sent to `create-instance`.
    pub user_data: String,
}

impl std::fmt::Debug for RunningInstance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningInstance")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("zone", &self.zone)
            .field("shape", &self.shape)
            .field(
                "user_data",
                &format_args!("<{} bytes>", self.user_data.len()),
            )
            .finish()
    }
}

impl RunningInstance {
    /// The running instance as the Exoscale API (or the simulated cloud) describes it.
    pub fn from_exoscale(
        instance: &Instance,
        shape: InstanceShape,
        zone: &str,
    ) -> Result<Self, KubeletSimError> {
        let user_data = instance
            .user_data
            .as_ref()
            .map(|ud| ud.0.clone())
            .ok_or_else(|| KubeletSimError::MissingUserData(instance.id.clone()))?;
        Ok(Self {
            id: instance.id.clone(),
            name: instance.name.clone(),
            zone: zone.to_string(),
            shape,
            user_data,
        })
    }

    pub fn provider_id(&self) -> String {
        format!("{PROVIDER_ID_PREFIX}{}", self.id)
    }
}

/// When the node registers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Join {
    /// The instance runs but its kubelet never registers a node.
    Never,
    /// The node registers (Ready) after this delay; `Duration::ZERO` means at once.
    After(Duration),
}

/// What goes wrong after the node turned Ready.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    None,
    /// Ready turns False after this delay.
    NotReadyAfter(Duration),
    /// DiskPressure turns True after this delay.
    DiskPressureAfter(Duration),
    /// The node comes up with a taint nobody asked for (a node agent or cluster policy adds
    /// it as it registers): `key=value:effect`.
    Tainted {
        key: String,
        value: String,
        effect: String,
    },
}

/// The script a simulated kubelet follows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubeletBehaviour {
    pub join: Join,
    pub fault: Fault,
}

impl Default for KubeletBehaviour {
    fn default() -> Self {
        Self {
            join: Join::After(Duration::ZERO),
            fault: Fault::None,
        }
    }
}

/// `kube-reserved` / `system-reserved` table of the node-agent TOML.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub struct Reservation {
    pub cpu: Option<String>,
    pub memory: Option<String>,
    pub ephemeral_storage: Option<String>,
}

/// The `settings.kubernetes` keys of the node-agent TOML that shape the Node.
/// Other keys (cluster CA, DNS, GC thresholds, feature gates...) are accepted and ignored.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub struct NodeAgentSettings {
    pub api_server: Option<String>,
    pub bootstrap_token: Option<BootstrapToken>,
    #[serde(default)]
    pub node_labels: BTreeMap<String, String>,
    #[serde(default)]
    pub node_taints: BTreeMap<String, Vec<String>>,
    pub kube_reserved: Option<Reservation>,
    pub system_reserved: Option<Reservation>,
    /// The agent's `max-pods` (1..=65535; the kubelet's 110 when absent).
    pub max_pods: Option<u32>,
}

impl NodeAgentSettings {
    pub fn has_bootstrap_token(&self) -> bool {
        self.bootstrap_token
            .as_ref()
            .is_some_and(|t| !t.0.is_empty())
    }
}

/// The `<id>.<secret>` bootstrap token; a credential, so Debug never shows it.
#[derive(Clone, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct BootstrapToken(pub String);

impl std::fmt::Debug for BootstrapToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BootstrapToken(<redacted>)")
    }
}

#[derive(Deserialize)]
struct UserDataDocument {
    settings: UserDataSettings,
}

#[derive(Deserialize)]
struct UserDataSettings {
    kubernetes: NodeAgentSettings,
}

/// Decodes user data the way the SKS node agent does: gzip+base64, base64 or plain TOML.
pub fn decode_user_data(user_data: &str) -> Result<NodeAgentSettings, KubeletSimError> {
    let text = crate::providers::userdata::decode_text(user_data)?;
    let document: UserDataDocument =
        toml::from_str(&text).map_err(KubeletSimError::UserDataToml)?;
    let settings = document.settings.kubernetes;
    if !settings.has_bootstrap_token() {
        return Err(KubeletSimError::MissingBootstrapToken);
    }
    Ok(settings)
}

/// Taints from the agent's `node-taints` map (`key -> ["value:Effect", ...]`).
pub fn taints_from(settings: &NodeAgentSettings) -> Result<Vec<Taint>, KubeletSimError> {
    let mut taints = Vec::new();
    for (key, entries) in &settings.node_taints {
        for entry in entries {
            let invalid = || KubeletSimError::InvalidTaint {
                key: key.clone(),
                entry: entry.clone(),
            };
            let (value, effect) = entry.rsplit_once(':').ok_or_else(invalid)?;
            if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
                return Err(invalid());
            }
            taints.push(Taint {
                key: key.clone(),
                value: (!value.is_empty()).then(|| value.to_string()),
                effect: effect.to_string(),
                time_added: None,
            });
        }
    }
    Ok(taints)
}

/// Labels the node carries: the user data's node labels, then the ones the kubelet and the
/// Exoscale CCM set themselves (those win, as they do on a real node).
pub fn labels_for(
    instance: &RunningInstance,
    settings: &NodeAgentSettings,
) -> BTreeMap<String, String> {
    let mut labels = settings.node_labels.clone();
    let own = [
        ("kubernetes.io/hostname", instance.name.as_str()),
        ("kubernetes.io/os", "linux"),
        ("kubernetes.io/arch", "amd64"),
        (
            "node.kubernetes.io/instance-type",
            instance.shape.name.as_str(),
        ),
        ("topology.kubernetes.io/zone", instance.zone.as_str()),
        ("topology.kubernetes.io/region", instance.zone.as_str()),
    ];
    for (key, value) in own {
        labels.insert(key.to_string(), value.to_string());
    }
    labels
}

/// The Node object the kubelet creates (metadata and spec; status comes separately).
pub fn node_for(
    instance: &RunningInstance,
    settings: &NodeAgentSettings,
) -> Result<Node, KubeletSimError> {
    Ok(Node {
        metadata: ObjectMeta {
            name: Some(instance.name.clone()),
            labels: Some(labels_for(instance, settings)),
            // As a kubelet with its default --enable-controller-attach-detach registers.
            annotations: Some([(ATTACH_DETACH_ANNOTATION.to_string(), "true".to_string())].into()),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            provider_id: Some(instance.provider_id()),
            taints: Some(taints_from(settings)?),
            ..NodeSpec::default()
        }),
        status: None,
    })
}

/// A Kubernetes quantity in thousandths of its base unit (millicores, millibytes), through the
/// program's one quantity parser; negative values are refused.
pub fn parse_quantity_milli(field: &str, value: &str) -> Result<u128, KubeletSimError> {
    crate::scheduling::Quantity::parse(value.trim())
        .ok()
        .and_then(|q| u128::try_from(q.milli()).ok())
        .ok_or_else(|| KubeletSimError::InvalidQuantity {
            field: field.to_string(),
            value: value.to_string(),
        })
}

/// Reservations the SKS node agent applies when the user data sets none
/// (its documented defaults).
fn default_kube_reserved() -> Reservation {
    Reservation {
        cpu: Some("200m".into()),
        memory: Some("300Mi".into()),
        ephemeral_storage: Some("1Gi".into()),
    }
}

fn default_system_reserved() -> Reservation {
    Reservation {
        cpu: Some("100m".into()),
        memory: Some("100Mi".into()),
        ephemeral_storage: Some("3Gi".into()),
    }
}

/// Sum of both reservations for one resource, in thousandths of the base unit. A key
/// the user data leaves out keeps the agent's default for that key.
fn reserved_milli(
    settings: &NodeAgentSettings,
    field: &str,
    pick: fn(&Reservation) -> Option<&String>,
) -> Result<u128, KubeletSimError> {
    let tables = [
        (
            "kube-reserved",
            &settings.kube_reserved,
            default_kube_reserved(),
        ),
        (
            "system-reserved",
            &settings.system_reserved,
            default_system_reserved(),
        ),
    ];
    let mut total = 0;
    for (table, given, default) in tables {
        let value = given.as_ref().and_then(pick).or_else(|| pick(&default));
        if let Some(value) = value {
            total += parse_quantity_milli(&format!("{table}.{field}"), value)?;
        }
    }
    Ok(total)
}

fn subtract(field: &str, capacity: u128, reserved: u128) -> Result<u128, KubeletSimError> {
    capacity
        .checked_sub(reserved)
        .ok_or_else(|| KubeletSimError::ReservationExceedsCapacity {
            field: field.to_string(),
            reserved: u64::try_from(reserved / 1000).unwrap_or(u64::MAX),
            capacity: u64::try_from(capacity / 1000).unwrap_or(u64::MAX),
        })
}

/// Resource maps of a node's status.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeResources {
    pub capacity: BTreeMap<String, Quantity>,
    pub allocatable: BTreeMap<String, Quantity>,
}

/// Capacity and allocatable of the node, as the kubelet computes them:
/// allocatable = capacity - kube-reserved - system-reserved - hard eviction threshold.
pub fn resources_for(
    instance: &RunningInstance,
    settings: &NodeAgentSettings,
) -> Result<NodeResources, KubeletSimError> {
    let shape = &instance.shape;
    let cpu_milli = u128::from(shape.cpus) * 1000;
    let memory_milli = u128::from(shape.memory_bytes) * 1000;
    let disk_milli = u128::from(shape.disk_gib * GIB) * 1000;

    let mut capacity = BTreeMap::new();
    capacity.insert("cpu".to_string(), Quantity(shape.cpus.to_string()));
    capacity.insert("memory".to_string(), bytes_quantity(memory_milli));
    capacity.insert("ephemeral-storage".to_string(), bytes_quantity(disk_milli));
    let max_pods = match settings.max_pods {
        None => MAX_PODS,
        Some(n @ 1..=65535) => n,
        Some(n) => return Err(KubeletSimError::MaxPods(n)),
    };
    capacity.insert("pods".to_string(), Quantity(max_pods.to_string()));
    if shape.gpus > 0 {
        capacity.insert(GPU_RESOURCE.to_string(), Quantity(shape.gpus.to_string()));
    }

    let cpu = subtract(
        "cpu",
        cpu_milli,
        reserved_milli(settings, "cpu", |r| r.cpu.as_ref())?,
    )?;
    let memory = subtract(
        "memory",
        memory_milli,
        reserved_milli(settings, "memory", |r| r.memory.as_ref())?
            + u128::from(EVICTION_HARD_MEMORY_BYTES) * 1000,
    )?;
    let disk = subtract(
        "ephemeral-storage",
        disk_milli,
        reserved_milli(settings, "ephemeral-storage", |r| {
            r.ephemeral_storage.as_ref()
        })? + disk_milli * u128::from(EVICTION_HARD_NODEFS_PERCENT) / 100,
    )?;

    let mut allocatable = capacity.clone();
    allocatable.insert("cpu".to_string(), Quantity(format!("{cpu}m")));
    allocatable.insert("memory".to_string(), bytes_quantity(memory));
    allocatable.insert("ephemeral-storage".to_string(), bytes_quantity(disk));
    Ok(NodeResources {
        capacity,
        allocatable,
    })
}

/// Whole bytes as a `Ki` quantity when it divides evenly, plain bytes otherwise.
fn bytes_quantity(milli_bytes: u128) -> Quantity {
    let bytes = milli_bytes / 1000;
    if bytes.is_multiple_of(1024) {
        Quantity(format!("{}Ki", bytes / 1024))
    } else {
        Quantity(bytes.to_string())
    }
}

fn condition(type_: &str, healthy_status: bool, status: bool, now: Timestamp) -> NodeCondition {
    let (reason, message) = match (type_, status == healthy_status) {
        ("Ready", true) => ("KubeletReady", "kubelet is posting ready status"),
        ("Ready", false) => ("KubeletNotReady", "container runtime network not ready"),
        ("DiskPressure", false) => ("KubeletHasDiskPressure", "kubelet has disk pressure"),
        (_, true) => ("KubeletHasSufficientResources", "kubelet has no pressure"),
        (_, false) => ("KubeletHasPressure", "kubelet reports pressure"),
    };
    NodeCondition {
        type_: type_.to_string(),
        status: if status { "True" } else { "False" }.to_string(),
        reason: Some(reason.to_string()),
        message: Some(message.to_string()),
        last_heartbeat_time: Some(Time(now)),
        last_transition_time: Some(Time(now)),
    }
}

/// The status the kubelet posts right after registering: Ready, no pressure.
pub fn node_status_for(
    instance: &RunningInstance,
    settings: &NodeAgentSettings,
    now: Timestamp,
) -> Result<NodeStatus, KubeletSimError> {
    let NodeResources {
        capacity,
        allocatable,
    } = resources_for(instance, settings)?;
    Ok(NodeStatus {
        capacity: Some(capacity),
        allocatable: Some(allocatable),
        conditions: Some(vec![
            condition("Ready", true, true, now),
            condition("MemoryPressure", false, false, now),
            condition("DiskPressure", false, false, now),
            condition("PIDPressure", false, false, now),
        ]),
        addresses: Some(vec![NodeAddress {
            type_: "Hostname".to_string(),
            address: instance.name.clone(),
        }]),
        node_info: Some(NodeSystemInfo {
            architecture: "amd64".to_string(),
            boot_id: instance.id.clone(),
            container_runtime_version: "containerd://2.1.0".to_string(),
            kernel_version: "6.12.0-simulated".to_string(),
            kube_proxy_version: String::new(),
            kubelet_version: KUBELET_VERSION.to_string(),
            machine_id: instance.id.replace('-', ""),
            operating_system: "linux".to_string(),
            os_image: "Exoscale SKS node (simulated)".to_string(),
            system_uuid: instance.id.clone(),
            ..NodeSystemInfo::default()
        }),
        ..NodeStatus::default()
    })
}

/// Registers the instance's Node (create, then status) and returns it.
/// Fails on undecodable user data before touching the API.
pub async fn register_node(
    client: &kube::Client,
    instance: &RunningInstance,
) -> Result<Node, KubeletSimError> {
    register_node_with_taints(client, instance, &[]).await
}

/// [`register_node`], with `extra` taints in the Node as created, beside the user data's (as
/// a kubelet's `--register-with-taints` set by a node agent, or an admission policy, adds
/// them): no scheduler ever sees the Node without them.
pub async fn register_node_with_taints(
    client: &kube::Client,
    instance: &RunningInstance,
    extra: &[Taint],
) -> Result<Node, KubeletSimError> {
    let settings = decode_user_data(&instance.user_data)?;
    authenticate(client, &settings).await?;
    let mut node = node_for(instance, &settings)?;
    if let Some(taints) = node.spec.as_mut().and_then(|s| s.taints.as_mut()) {
        taints.extend(extra.iter().cloned());
    }
    let status = node_status_for(instance, &settings, Timestamp::now())?;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes.create(&PostParams::default(), &node).await?;
    let patch = serde_json::json!({ "status": status });
    let registered = nodes
        .patch_status(
            &instance.name,
            &PatchParams {
                field_manager: Some(FIELD_MANAGER.to_string()),
                ..PatchParams::default()
            },
            &Patch::Merge(&patch),
        )
        .await?;
    Ok(registered)
}

/// Checks the user data's bootstrap token as kube-apiserver's bootstrap authenticator does: a
/// `bootstrap.kubernetes.io/token` Secret `bootstrap-token-<id>` in kube-system with the same
/// secret, usable for authentication and not expired. A node with a deleted or wrong token
/// cannot join a real cluster, so it does not join here either.
async fn authenticate(
    client: &kube::Client,
    settings: &NodeAgentSettings,
) -> Result<(), KubeletSimError> {
    use k8s_openapi::api::core::v1::Secret;
    let reject = |why: String| KubeletSimError::BootstrapTokenRejected(why);
    let token = settings
        .bootstrap_token
        .as_ref()
        .map(|t| t.0.as_str())
        .unwrap_or("");
    let (id, secret) = token
        .split_once('.')
        .ok_or_else(|| reject("not of the form <id>.<secret>".into()))?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "kube-system");
    let name = format!("bootstrap-token-{id}");
    let stored = secrets
        .get_opt(&name)
        .await?
        .ok_or_else(|| reject(format!("Secret kube-system/{name} does not exist")))?;
    let field = |key: &str| {
        stored
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .map(|v| String::from_utf8_lossy(&v.0).into_owned())
            .or_else(|| {
                stored
                    .string_data
                    .as_ref()
                    .and_then(|d| d.get(key).cloned())
            })
    };
    if stored.type_.as_deref() != Some("bootstrap.kubernetes.io/token") {
        return Err(reject(format!("{name} is not a bootstrap token Secret")));
    }
    if field("token-secret").as_deref() != Some(secret) {
        return Err(reject(format!("{name} holds another secret")));
    }
    if field("usage-bootstrap-authentication").as_deref() != Some("true") {
        return Err(reject(format!("{name} is not usable for authentication")));
    }
    if let Some(expiration) = field("expiration") {
        let expires: Timestamp = expiration
            .parse()
            .map_err(|_| reject(format!("{name} has an unreadable expiration")))?;
        if expires <= Timestamp::now() {
            return Err(reject(format!("{name} expired at {expiration}")));
        }
    }
    Ok(())
}

/// Sets one node condition (`Ready`, `DiskPressure`, ...) to True or False, keeping the rest.
pub async fn set_node_condition(
    client: &kube::Client,
    node_name: &str,
    condition_type: &str,
    status: bool,
) -> Result<Node, KubeletSimError> {
    set_node_condition_since(client, node_name, condition_type, status, Timestamp::now()).await
}

/// Like [`set_node_condition`], for a condition that has held since `since` (a kubelet that
/// went unhealthy while nobody was watching, e.g. during a controller outage).
pub async fn set_node_condition_since(
    client: &kube::Client,
    node_name: &str,
    condition_type: &str,
    status: bool,
    since: Timestamp,
) -> Result<Node, KubeletSimError> {
    let healthy_status = condition_type == "Ready";
    let mut update = condition(condition_type, healthy_status, status, Timestamp::now());
    update.last_transition_time = Some(Time(since));
    let patch = serde_json::json!({ "status": { "conditions": [update] } });
    let nodes: Api<Node> = Api::all(client.clone());
    // Strategic merge keys node conditions by type, so the other conditions stay.
    Ok(nodes
        .patch_status(
            node_name,
            &PatchParams {
                field_manager: Some(FIELD_MANAGER.to_string()),
                ..PatchParams::default()
            },
            &Patch::Strategic(&patch),
        )
        .await?)
}

/// Runs the behaviour script for one instance in the background.
pub fn spawn(
    client: kube::Client,
    instance: RunningInstance,
    behaviour: KubeletBehaviour,
) -> tokio::task::JoinHandle<Result<(), KubeletSimError>> {
    tokio::spawn(async move { run(&client, &instance, &behaviour).await })
}

async fn run(
    client: &kube::Client,
    instance: &RunningInstance,
    behaviour: &KubeletBehaviour,
) -> Result<(), KubeletSimError> {
    match behaviour.join {
        Join::Never => return Ok(()),
        Join::After(delay) => tokio::time::sleep(delay).await,
    }
    // A taint the node comes up with is in the Node as created: added after, it would leave a
    // moment in which kube-scheduler binds pods to the untainted Node (a test of pods that no
    // node can take then sees them Running on a slow machine).
    let extra = match &behaviour.fault {
        Fault::Tainted { key, value, effect } => vec![Taint {
            key: key.clone(),
            value: Some(value.clone()),
            effect: effect.clone(),
            time_added: None,
        }],
        _ => Vec::new(),
    };
    register_node_with_taints(client, instance, &extra).await?;
    match &behaviour.fault {
        Fault::None | Fault::Tainted { .. } => {}
        Fault::NotReadyAfter(delay) => {
            tokio::time::sleep(*delay).await;
            set_node_condition(client, &instance.name, "Ready", false).await?;
        }
        Fault::DiskPressureAfter(delay) => {
            tokio::time::sleep(*delay).await;
            set_node_condition(client, &instance.name, "DiskPressure", true).await?;
        }
    }
    Ok(())
}

/// Deletes the Node of a deleted instance, as the Exoscale CCM's node-lifecycle loop does.
/// A Node that is already gone is fine; a finalizer on it leaves it terminating.
pub async fn deregister_node(
    client: &kube::Client,
    node_name: &str,
) -> Result<(), KubeletSimError> {
    let nodes: Api<Node> = Api::all(client.clone());
    match nodes.delete(node_name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Looks up the shape of a running instance; `None` skips the instance.
pub type ShapeLookup = Box<dyn Fn(&Instance) -> Option<InstanceShape> + Send>;
/// Picks the script of a new instance's kubelet.
pub type BehaviourChoice = Box<dyn Fn(&RunningInstance) -> KubeletBehaviour + Send>;

/// What a [`follow`]er needs to know about the cloud's instances.
pub struct Follower {
    pub client: kube::Client,
    pub zone: String,
    /// The shape of a running instance (looked up from its instance type); `None` skips it.
    pub shape_of: ShapeLookup,
    /// The script for each new instance (e.g. by name prefix, for fault tests).
    pub behaviour_of: BehaviourChoice,
}

/// Runs a simulated kubelet for every instance the simulated cloud reports running, and
/// deregisters the Node of every deleted instance, until the event channel closes.
/// Returns the errors met (an instance without user data, a failed API call), in order.
pub fn follow(
    follower: Follower,
    mut events: broadcast::Receiver<InstanceEvent>,
) -> tokio::task::JoinHandle<Vec<KubeletSimError>> {
    tokio::spawn(async move {
        let mut errors = Vec::new();
        let mut kubelets = Vec::new();
        loop {
            let event = match events.recv().await {
                Ok(event) => event,
                // A lagging receiver skipped events; later ones are still worth following.
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => break,
            };
            match event {
                InstanceEvent::Running(instance) => {
                    let Some(shape) = (follower.shape_of)(&instance) else {
                        continue;
                    };
                    match RunningInstance::from_exoscale(&instance, shape, &follower.zone) {
                        Ok(running) => {
                            let behaviour = (follower.behaviour_of)(&running);
                            kubelets.push(spawn(follower.client.clone(), running, behaviour));
                        }
                        Err(e) => errors.push(e),
                    }
                }
                InstanceEvent::Deleted { name, .. } => {
                    if let Err(e) = deregister_node(&follower.client, &name).await {
                        errors.push(e);
                    }
                }
            }
        }
        for kubelet in kubelets {
            if let Ok(Err(e)) = kubelet.await {
                errors.push(e);
            }
        }
        errors
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD as BASE64;
    use std::io::Write;

    const USER_DATA_TOML: &str = r#"
[settings.kubernetes]
api-server = "https://example.sks-ch-gva-2.exo.io:443"
bootstrap-token = "abcdef.0123456789abcdef"
cloud-provider = "external"
cluster-certificate = "Q0E="
cluster-dns-ip = ["10.96.0.10"]

[settings.kubernetes.node-labels]
"karpenter.sh/nodepool" = "default"
"kubernetes.io/hostname" = "ignored-by-kubelet"

[settings.kubernetes.node-taints]
"karpenter.sh/unregistered" = ["true:NoExecute"]
"dedicated" = [":NoSchedule", "gpu:PreferNoSchedule"]

[settings.kubernetes.kube-reserved]
cpu = "250m"
memory = "0.5Gi"
"#;

    fn gzip_base64(text: &str) -> String {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(text.as_bytes()).unwrap();
        BASE64.encode(encoder.finish().unwrap())
    }

    fn instance(user_data: String) -> RunningInstance {
        RunningInstance {
            id: "3f1b2a9c-0d4e-4b7a-9c1e-5a6b7c8d9e0f".into(),
            name: "karpenter-default-abcde".into(),
            zone: "ch-gva-2".into(),
            shape: InstanceShape {
                name: "standard.medium".into(),
                cpus: 2,
                memory_bytes: 4 * GIB,
                gpus: 0,
                disk_gib: 50,
            },
            user_data,
        }
    }

    #[test]
    fn decodes_all_three_encodings_alike() {
        let plain = decode_user_data(USER_DATA_TOML).unwrap();
        let base64 = decode_user_data(&BASE64.encode(USER_DATA_TOML)).unwrap();
        let gzipped = decode_user_data(&gzip_base64(USER_DATA_TOML)).unwrap();
        assert_eq!(plain, base64);
        assert_eq!(plain, gzipped);
        assert_eq!(plain.node_labels["karpenter.sh/nodepool"], "default");
    }

    #[test]
    fn user_data_without_bootstrap_token_is_refused() {
        let err =
            decode_user_data("[settings.kubernetes]\napi-server = \"https://x\"\n").unwrap_err();
        assert!(
            matches!(err, KubeletSimError::MissingBootstrapToken),
            "{err}"
        );
    }

    #[test]
    fn broken_toml_names_the_problem() {
        let err = decode_user_data("[settings.kubernetes\n").unwrap_err();
        assert!(
            err.to_string().contains("not a valid node-agent TOML"),
            "{err}"
        );
    }

    #[test]
    fn taints_split_value_and_effect() {
        let settings = decode_user_data(USER_DATA_TOML).unwrap();
        let taints = taints_from(&settings).unwrap();
        let rendered: Vec<_> = taints
            .iter()
            .map(|t| {
                format!(
                    "{}={}:{}",
                    t.key,
                    t.value.as_deref().unwrap_or(""),
                    t.effect
                )
            })
            .collect();
        assert_eq!(
            rendered,
            [
                "dedicated=:NoSchedule",
                "dedicated=gpu:PreferNoSchedule",
                "karpenter.sh/unregistered=true:NoExecute"
            ]
        );
    }

    #[test]
    fn unknown_taint_effect_is_refused() {
        let mut settings = decode_user_data(USER_DATA_TOML).unwrap();
        settings
            .node_taints
            .insert("bad".into(), vec!["x:Sometimes".into()]);
        let err = taints_from(&settings).unwrap_err();
        assert!(err.to_string().contains("\"bad\""), "{err}");
    }

    #[test]
    fn node_carries_provider_id_and_kubelet_labels_win() {
        let instance = instance(gzip_base64(USER_DATA_TOML));
        let settings = decode_user_data(&instance.user_data).unwrap();
        let node = node_for(&instance, &settings).unwrap();
        assert_eq!(
            node.spec.unwrap().provider_id.unwrap(),
            "exoscale://3f1b2a9c-0d4e-4b7a-9c1e-5a6b7c8d9e0f"
        );
        let labels = node.metadata.labels.unwrap();
        assert_eq!(labels["kubernetes.io/hostname"], "karpenter-default-abcde");
        assert_eq!(
            labels["node.kubernetes.io/instance-type"],
            "standard.medium"
        );
        assert_eq!(labels["topology.kubernetes.io/zone"], "ch-gva-2");
        assert_eq!(labels["karpenter.sh/nodepool"], "default");
        // kube-controller-manager's TTL controller adds its annotation to this map; a Node
        // without one would have Karpenter's registration write the map whole.
        assert_eq!(
            node.metadata.annotations.unwrap()[ATTACH_DETACH_ANNOTATION],
            "true"
        );
    }

    #[test]
    fn allocatable_subtracts_reservations_and_eviction_thresholds() {
        let instance = instance(USER_DATA_TOML.to_string());
        let settings = decode_user_data(&instance.user_data).unwrap();
        let NodeResources {
            capacity,
            allocatable,
        } = resources_for(&instance, &settings).unwrap();
        assert_eq!(capacity["cpu"].0, "2");
        assert_eq!(capacity["memory"].0, "4194304Ki");
        assert_eq!(capacity["pods"].0, "110");
        assert!(!capacity.contains_key(GPU_RESOURCE));
        // 2000m - 250m (kube) - 100m (system default)
        assert_eq!(allocatable["cpu"].0, "1650m");
        // 4096Mi - 512Mi (kube) - 100Mi (system default) - 100Mi (eviction)
        assert_eq!(
            allocatable["memory"].0,
            format!("{}Ki", (4096 - 712) * 1024)
        );
        // 50Gi - 1Gi (kube default) - 3Gi (system default) - 5Gi (10%)
        assert_eq!(
            allocatable["ephemeral-storage"].0,
            format!("{}Ki", 41 * 1024 * 1024)
        );
    }

    #[test]
    fn gpus_appear_as_extended_resource() {
        let mut instance = instance(USER_DATA_TOML.to_string());
        instance.shape.gpus = 2;
        let settings = decode_user_data(&instance.user_data).unwrap();
        let NodeResources {
            capacity,
            allocatable,
        } = resources_for(&instance, &settings).unwrap();
        assert_eq!(capacity[GPU_RESOURCE].0, "2");
        assert_eq!(allocatable[GPU_RESOURCE].0, "2");
    }

    #[test]
    fn reservation_larger_than_the_node_is_an_error() {
        let mut instance = instance(USER_DATA_TOML.to_string());
        instance.shape.memory_bytes = 256 * MIB;
        let settings = decode_user_data(&instance.user_data).unwrap();
        let err = resources_for(&instance, &settings).unwrap_err();
        assert!(err.to_string().starts_with("memory reservation"), "{err}");
    }

    #[test]
    fn quantities_parse_with_suffixes_and_fractions() {
        assert_eq!(parse_quantity_milli("f", "250m").unwrap(), 250);
        assert_eq!(parse_quantity_milli("f", "2").unwrap(), 2000);
        assert_eq!(parse_quantity_milli("f", "1.5").unwrap(), 1500);
        assert_eq!(parse_quantity_milli("f", "1Ki").unwrap(), 1_024_000);
        assert_eq!(parse_quantity_milli("f", "1M").unwrap(), 1_000_000_000);
        for bad in ["", "abc", "1Xi", ".", "1..2"] {
            assert!(parse_quantity_milli("f", bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn an_exoscale_instance_becomes_a_running_instance() {
        let instance_type: InstanceType = serde_json::from_value(serde_json::json!({
            "id": "b6e9d1e8-89fc-4db3-aaa4-9b4c5b1d0844", "family": "gpu3", "size": "small",
            "cpus": 12, "gpus": 1, "memory": 60 * GIB,
        }))
        .unwrap();
        let instance: Instance = serde_json::from_value(serde_json::json!({
            "id": "3f1b2a9c-0d4e-4b7a-9c1e-5a6b7c8d9e0f", "name": "karpenter-gpu-x1",
            "state": "running", "instance-type": { "id": instance_type.id },
            "template": { "id": "t" }, "disk-size": 100, "user-data": "dXNlcg==",
        }))
        .unwrap();
        let shape = InstanceShape::from_instance_type(&instance_type, 100);
        assert_eq!(shape.name, "gpu3.small");
        assert_eq!(shape.gpus, 1);
        let running = RunningInstance::from_exoscale(&instance, shape, "de-fra-1").unwrap();
        assert_eq!(
            running.provider_id(),
            "exoscale://3f1b2a9c-0d4e-4b7a-9c1e-5a6b7c8d9e0f"
        );
        assert_eq!(running.user_data, "dXNlcg==");

        let mut without_user_data = instance.clone();
        without_user_data.user_data = None;
        let shape = InstanceShape::from_instance_type(&instance_type, 100);
        let err =
            RunningInstance::from_exoscale(&without_user_data, shape, "de-fra-1").unwrap_err();
        assert!(matches!(err, KubeletSimError::MissingUserData(_)), "{err}");
    }

    #[test]
    fn debug_output_hides_the_bootstrap_token() {
        let settings = decode_user_data(USER_DATA_TOML).unwrap();
        let shown = format!("{settings:?}");
        assert!(!shown.contains("0123456789abcdef"), "{shown}");
        assert!(shown.contains("<redacted>"));
    }

    #[test]
    fn status_is_ready_without_pressure() {
        let instance = instance(USER_DATA_TOML.to_string());
        let settings = decode_user_data(&instance.user_data).unwrap();
        let status = node_status_for(&instance, &settings, Timestamp::now()).unwrap();
        let conditions: BTreeMap<_, _> = status
            .conditions
            .unwrap()
            .into_iter()
            .map(|c| (c.type_, c.status))
            .collect();
        assert_eq!(conditions["Ready"], "True");
        assert_eq!(conditions["DiskPressure"], "False");
        assert_eq!(status.node_info.unwrap().system_uuid, instance.id);
    }
}
