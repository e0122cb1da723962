//! Instance types: discovered from the API (authorized and offered in the zone), refreshed
//! periodically, and turned into the scheduler's [`InstanceType`] for a NodeClass: labels,
//! capacity (pods from `kubelet.maxPods`, ephemeral storage from the disk, GPUs), honest
//! overhead (kube + system reserved + hard eviction thresholds), priced on-demand offerings,
//! and offerings that just failed for lack of capacity marked unavailable for a while.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use thiserror::Error;

use crate::apis::ResourceList;
use crate::apis::labels::{
    ARCH_AMD64, CAPACITY_TYPE_ON_DEMAND, GPU_RESOURCE, INSTANCE_CPU_LABEL, INSTANCE_FAMILY_LABEL,
    INSTANCE_GPU_COUNT_LABEL, INSTANCE_GPU_MODEL_LABEL, INSTANCE_MEMORY_LABEL, INSTANCE_SIZE_LABEL,
    LEGACY_ACCELERATOR_LABEL, LEGACY_GPU_COUNT_LABEL, LEGACY_INSTANCE_FAMILY_LABEL,
    LEGACY_INSTANCE_SIZE_LABEL,
};
use crate::apis::nodeclass::{ExoscaleNodeClass, KubeletConfiguration};
use crate::clock::Clock;
use crate::exoscale;
use crate::scheduling::labels::{ARCH, CAPACITY_TYPE, INSTANCE_TYPE, OS, REGION, ZONE};
use crate::scheduling::quantity::{CPU, EPHEMERAL_STORAGE, MEMORY, PODS};
use crate::scheduling::{InstanceType, Offering, Quantity, Requirement, Resources};

use super::pricing::{PriceBook, PriceSource, Shape};

/// How often the discovered list is refreshed (new types, changed authorisations).
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(60 * 60);
/// How long an offering stays unavailable after an insufficient-capacity failure.
pub const UNAVAILABLE_TTL: Duration = Duration::from_secs(3 * 60);
const GIB: i128 = 1 << 30;
const MIB: u64 = 1 << 20;
/// Kubelet's default hard eviction thresholds for the resources allocatable depends on.
const DEFAULT_EVICTION_MEMORY: &str = "100Mi";
const DEFAULT_EVICTION_NODEFS: &str = "10%";

#[derive(Debug, Error, Clone, PartialEq)]
pub enum InstanceTypeError {
    #[error("cannot list instance types: {0}")]
    Api(Box<exoscale::Error>),
    #[error("instance types have not been discovered yet")]
    NotDiscovered,
    #[error("invalid {field} {value:?} in ExoscaleNodeClass: {problem}")]
    BadQuantity {
        field: String,
        value: String,
        problem: String,
    },
}

/// An instance type as the API reports it (no NodeClass applied).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoveredType {
    pub id: String,
    pub family: String,
    pub size: String,
    pub cpus: u32,
    pub memory_bytes: u64,
    pub gpus: u32,
}

impl DiscoveredType {
    pub fn name(&self) -> String {
        format!("{}.{}", self.family, self.size)
    }

    pub fn shape(&self) -> Shape {
        Shape {
            cpus: self.cpus,
            memory_bytes: self.memory_bytes,
            gpus: self.gpus,
        }
    }
}

/// The GPU model label value of a family (label-safe, lowercase).
pub fn gpu_model(family: &str) -> Option<&'static str> {
    Some(match family {
        "gpu" => "p100",
        "gpu2" => "v100",
        "gpu3" => "a40",
        "gpua30" => "a30",
        "gpua5000" => "rtx-a5000",
        "gpu3080ti" => "rtx-3080ti",
        "gpurtx6000pro" => "rtx-pro-6000",
        "gpub300" => "b300",
        _ => return None,
    })
}

/// Keeps the types usable here: authorized and offered in `zone`.
pub fn usable_in_zone(
    types: Vec<exoscale::models::InstanceType>,
    zone: &str,
) -> Vec<DiscoveredType> {
    let mut out: Vec<DiscoveredType> = types
        .into_iter()
        .filter(|t| t.authorized && t.zones.iter().any(|z| z == zone))
        .map(|t| DiscoveredType {
            id: t.id,
            family: t.family,
            size: t.size,
            cpus: t.cpus,
            memory_bytes: t.memory,
            gpus: t.gpus,
        })
        .collect();
    out.sort_by_key(|t| t.name());
    out
}

/// The usable types of `zone` from the embedded catalogue (offline use: `simulate`, tests).
pub fn discovered_from_catalogue(
    catalogue: &crate::catalogue::Catalogue,
    zone: &str,
) -> Vec<DiscoveredType> {
    let types = catalogue
        .instance_types()
        .iter()
        .map(|t| exoscale::models::InstanceType {
            id: t.id.clone(),
            family: t.family.clone(),
            size: t.size.clone(),
            cpus: t.cpus,
            gpus: t.gpus,
            memory: t.memory,
            authorized: t.authorized,
            zones: t.zones.clone(),
        })
        .collect();
    usable_in_zone(types, zone)
}

#[derive(Default)]
struct Snapshot {
    types: Vec<DiscoveredType>,
    refreshed: bool,
}

/// The instance types of one zone, refreshed from the API.
pub struct InstanceTypeCatalog {
    client: exoscale::Client,
    zone: String,
    snapshot: RwLock<Snapshot>,
}

impl InstanceTypeCatalog {
    pub fn new(client: exoscale::Client, zone: impl Into<String>) -> Self {
        InstanceTypeCatalog {
            client,
            zone: zone.into(),
            snapshot: RwLock::new(Snapshot::default()),
        }
    }

    pub fn zone(&self) -> &str {
        &self.zone
    }

    /// `GET /instance-type` and replace the list; on failure the previous list stays.
    pub async fn refresh(&self) -> Result<usize, InstanceTypeError> {
        let all = self
            .client
            .list_instance_types()
            .await
            .map_err(|e| InstanceTypeError::Api(Box::new(e)))?;
        let types = usable_in_zone(all, &self.zone);
        let n = types.len();
        *self.snapshot.write().expect("lock") = Snapshot {
            types,
            refreshed: true,
        };
        Ok(n)
    }

    /// Refreshes every `interval` until the returned task is aborted; failures are logged and
    /// the last good list is kept.
    pub fn spawn_refresh(self: Arc<Self>, interval: Duration) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                match self.refresh().await {
                    Ok(n) => {
                        tracing::debug!(zone = %self.zone, types = n, "instance types refreshed")
                    }
                    Err(e) => {
                        tracing::warn!(zone = %self.zone, error = %e, "instance type refresh failed; keeping the previous list")
                    }
                }
            }
        })
    }

    /// Replaces the list without an API call (offline use, tests).
    pub fn seed(&self, types: Vec<DiscoveredType>) {
        *self.snapshot.write().expect("lock") = Snapshot {
            types,
            refreshed: true,
        };
    }

    /// Every usable type, sorted by name.
    pub fn types(&self) -> Result<Vec<DiscoveredType>, InstanceTypeError> {
        let s = self.snapshot.read().expect("lock");
        if !s.refreshed {
            return Err(InstanceTypeError::NotDiscovered);
        }
        Ok(s.types.clone())
    }

    pub fn by_name(&self, name: &str) -> Option<DiscoveredType> {
        let s = self.snapshot.read().expect("lock");
        s.types.iter().find(|t| t.name() == name).cloned()
    }

    pub fn by_id(&self, id: &str) -> Option<DiscoveredType> {
        let s = self.snapshot.read().expect("lock");
        s.types.iter().find(|t| t.id == id).cloned()
    }
}

/// Offerings that recently failed for lack of capacity, with an injected clock.
pub struct UnavailableOfferings {
    clock: Arc<dyn Clock>,
    ttl: Duration,
    until: Mutex<HashMap<(String, String), i64>>,
}

impl UnavailableOfferings {
    pub fn new(clock: Arc<dyn Clock>, ttl: Duration) -> Self {
        UnavailableOfferings {
            clock,
            ttl,
            until: Mutex::new(HashMap::new()),
        }
    }

    pub fn mark(&self, instance_type: &str, zone: &str) {
        let until = self.clock.now_unix() + self.ttl.as_secs() as i64;
        self.until
            .lock()
            .expect("lock")
            .insert((instance_type.to_string(), zone.to_string()), until);
    }

    pub fn is_unavailable(&self, instance_type: &str, zone: &str) -> bool {
        let now = self.clock.now_unix();
        let mut map = self.until.lock().expect("lock");
        map.retain(|_, until| *until > now);
        map.contains_key(&(instance_type.to_string(), zone.to_string()))
    }
}

fn quantity(field: &str, value: &str) -> Result<Quantity, InstanceTypeError> {
    Quantity::parse(value).map_err(|e| InstanceTypeError::BadQuantity {
        field: field.to_string(),
        value: value.to_string(),
        problem: e.problem.to_string(),
    })
}

/// A threshold as an absolute quantity or a percentage of `capacity`.
fn threshold(field: &str, value: &str, capacity: Quantity) -> Result<Quantity, InstanceTypeError> {
    match value.trim().strip_suffix('%') {
        Some(p) => {
            let pct: f64 = p
                .trim()
                .parse()
                .ok()
                .filter(|p: &f64| (0.0..=100.0).contains(p))
                .ok_or_else(|| InstanceTypeError::BadQuantity {
                    field: field.to_string(),
                    value: value.to_string(),
                    problem: "percentage must be between 0% and 100%".into(),
                })?;
            Ok(Quantity::from_milli(
                (capacity.milli() as f64 * pct / 100.0).ceil() as i128,
            ))
        }
        None => quantity(field, value),
    }
}

/// Capacity of a type under a NodeClass.
pub fn capacity(t: &DiscoveredType, disk_size_gb: i64, max_pods: i32) -> Resources {
    let mut r = Resources::new();
    r.set(CPU, Quantity::from_units(t.cpus as i128));
    r.set(MEMORY, Quantity::from_units(t.memory_bytes as i128));
    r.set(PODS, Quantity::from_units(max_pods as i128));
    r.set(
        EPHEMERAL_STORAGE,
        Quantity::from_units(disk_size_gb as i128 * GIB),
    );
    if t.gpus > 0 {
        r.set(GPU_RESOURCE, Quantity::from_units(t.gpus as i128));
    }
    r
}

/// kube-reserved + system-reserved + the kubelet's default hard eviction thresholds
/// (memory.available 100Mi, nodefs.available 10%: the node agent does not change them).
pub fn overhead(
    kubelet: &KubeletConfiguration,
    capacity: &Resources,
) -> Result<Resources, InstanceTypeError> {
    let mut r = Resources::new();
    let mut add = |name: &str, q: Quantity| {
        let current = r.get(name);
        r.set(name, current + q);
    };
    for (prefix, cpu, memory, storage) in [
        (
            "kubelet.kubeReserved",
            &kubelet.kube_reserved.cpu,
            &kubelet.kube_reserved.memory,
            &kubelet.kube_reserved.ephemeral_storage,
        ),
        (
            "kubelet.systemReserved",
            &kubelet.system_reserved.cpu,
            &kubelet.system_reserved.memory,
            &kubelet.system_reserved.ephemeral_storage,
        ),
    ] {
        if !cpu.trim().is_empty() {
            add(CPU, quantity(&format!("{prefix}.cpu"), cpu)?);
        }
        if !memory.trim().is_empty() {
            add(MEMORY, quantity(&format!("{prefix}.memory"), memory)?);
        }
        if !storage.trim().is_empty() {
            add(
                EPHEMERAL_STORAGE,
                quantity(&format!("{prefix}.ephemeralStorage"), storage)?,
            );
        }
    }
    // The SKS node agent has no eviction-threshold setting: the kubelet runs with its defaults.
    add(
        MEMORY,
        threshold(
            "kubelet eviction-hard memory.available",
            DEFAULT_EVICTION_MEMORY,
            capacity.memory(),
        )?,
    );
    add(
        EPHEMERAL_STORAGE,
        threshold(
            "kubelet eviction-hard nodefs.available",
            DEFAULT_EVICTION_NODEFS,
            capacity.get(EPHEMERAL_STORAGE),
        )?,
    );
    Ok(r)
}

/// Checks every kubelet reservation and eviction threshold parses as [`overhead`] reads it;
/// the error names the field (`kubelet.kubeReserved.cpu`, ...). The NodeClass controller
/// reports it as validation.
pub fn validate_kubelet(kubelet: &KubeletConfiguration) -> Result<(), InstanceTypeError> {
    let mut capacity = Resources::new();
    capacity.set(MEMORY, Quantity::from_units(GIB));
    capacity.set(EPHEMERAL_STORAGE, Quantity::from_units(GIB));
    overhead(kubelet, &capacity).map(|_| ())
}

/// The node labels of a type in a zone (also what a launched NodeClaim carries).
pub fn labels(t: &DiscoveredType, zone: &str) -> BTreeMap<String, String> {
    let mut l = BTreeMap::from([
        (INSTANCE_TYPE.to_string(), t.name()),
        (INSTANCE_FAMILY_LABEL.to_string(), t.family.clone()),
        (INSTANCE_SIZE_LABEL.to_string(), t.size.clone()),
        (LEGACY_INSTANCE_FAMILY_LABEL.to_string(), t.family.clone()),
        (LEGACY_INSTANCE_SIZE_LABEL.to_string(), t.size.clone()),
        (INSTANCE_CPU_LABEL.to_string(), t.cpus.to_string()),
        (
            INSTANCE_MEMORY_LABEL.to_string(),
            (t.memory_bytes / MIB).to_string(),
        ),
        (ARCH.to_string(), ARCH_AMD64.to_string()),
        (OS.to_string(), "linux".to_string()),
        (
            CAPACITY_TYPE.to_string(),
            CAPACITY_TYPE_ON_DEMAND.to_string(),
        ),
        (ZONE.to_string(), zone.to_string()),
        // The Exoscale CCM labels nodes with the zone as region too; match it.
        (REGION.to_string(), zone.to_string()),
    ]);
    if t.gpus > 0 {
        let model = gpu_model(&t.family)
            .unwrap_or(t.family.as_str())
            .to_string();
        l.insert(INSTANCE_GPU_COUNT_LABEL.to_string(), t.gpus.to_string());
        l.insert(INSTANCE_GPU_MODEL_LABEL.to_string(), model);
        l.insert(LEGACY_GPU_COUNT_LABEL.to_string(), t.gpus.to_string());
        l.insert(LEGACY_ACCELERATOR_LABEL.to_string(), "nvidia".to_string());
    }
    l
}

/// Builds the scheduler's instance type for `t` under `nodeclass`.
pub fn build(
    t: &DiscoveredType,
    nodeclass: &ExoscaleNodeClass,
    zone: &str,
    price: f64,
    available: bool,
) -> Result<InstanceType, InstanceTypeError> {
    let kubelet = nodeclass.kubelet();
    let capacity = capacity(t, nodeclass.spec.disk_size, nodeclass.max_pods());
    let overhead = overhead(&kubelet, &capacity)?;
    let offerings = vec![Offering {
        zone: zone.to_string(),
        capacity_type: CAPACITY_TYPE_ON_DEMAND.to_string(),
        price,
        available,
    }];
    let mut extra: Vec<Requirement> = labels(t, zone)
        .into_iter()
        .filter(|(k, _)| k != ZONE && k != CAPACITY_TYPE && k != INSTANCE_TYPE)
        .map(|(k, v)| Requirement::in_values(&k, [v]))
        .collect();
    if t.gpus == 0 {
        for key in [
            INSTANCE_GPU_COUNT_LABEL,
            INSTANCE_GPU_MODEL_LABEL,
            LEGACY_GPU_COUNT_LABEL,
            LEGACY_ACCELERATOR_LABEL,
        ] {
            extra.push(Requirement::does_not_exist(key));
        }
    }
    let mut requirements = InstanceType::standard_requirements(&t.name(), &offerings, extra);
    // Unavailable offerings drop out of the zone/capacity-type requirement; keep the type's
    // identity requirements defined so the scheduler still sees the labels.
    if !available {
        requirements.set(Requirement::in_values(ZONE, [zone]));
        requirements.set(Requirement::in_values(
            CAPACITY_TYPE,
            [CAPACITY_TYPE_ON_DEMAND],
        ));
    }
    Ok(InstanceType {
        name: t.name(),
        requirements,
        offerings,
        capacity,
        overhead,
        price_overlaid: false,
        capacity_overlaid: false,
    })
}

/// A type whose price is not in the list nor overridden.
#[derive(Clone, Debug, PartialEq)]
pub struct UnpricedType {
    pub name: String,
    pub estimated_price: f64,
}

/// Instance types for NodeClasses: discovery + pricing + capacity failures.
pub struct InstanceTypeProvider {
    catalog: Arc<InstanceTypeCatalog>,
    prices: RwLock<PriceBook>,
    unavailable: UnavailableOfferings,
}

impl InstanceTypeProvider {
    pub fn new(
        catalog: Arc<InstanceTypeCatalog>,
        prices: PriceBook,
        clock: Arc<dyn Clock>,
    ) -> Self {
        InstanceTypeProvider {
            catalog,
            prices: RwLock::new(prices),
            unavailable: UnavailableOfferings::new(clock, UNAVAILABLE_TTL),
        }
    }

    pub fn catalog(&self) -> &Arc<InstanceTypeCatalog> {
        &self.catalog
    }

    /// Replaces the price book (e.g. after the override ConfigMap changed).
    pub fn set_prices(&self, prices: PriceBook) {
        *self.prices.write().expect("lock") = prices;
    }

    pub fn mark_unavailable(&self, instance_type: &str, zone: &str) {
        self.unavailable.mark(instance_type, zone);
    }

    pub fn is_unavailable(&self, instance_type: &str, zone: &str) -> bool {
        self.unavailable.is_unavailable(instance_type, zone)
    }

    /// The price per hour of a discovered type.
    pub fn price(&self, t: &DiscoveredType) -> f64 {
        self.prices
            .read()
            .expect("lock")
            .price(&t.name(), t.shape())
            .per_hour
    }

    /// Every usable type under `nodeclass`, sorted by name.
    pub fn list(
        &self,
        nodeclass: &ExoscaleNodeClass,
    ) -> Result<Vec<InstanceType>, InstanceTypeError> {
        let zone = self.catalog.zone().to_string();
        self.catalog
            .types()?
            .iter()
            .map(|t| {
                let available = !self.is_unavailable(&t.name(), &zone);
                build(t, nodeclass, &zone, self.price(t), available)
            })
            .collect()
    }

    /// Discovered types priced by estimate only: to report (log, doctor, events).
    pub fn unpriced(&self) -> Result<Vec<UnpricedType>, InstanceTypeError> {
        let prices = self.prices.read().expect("lock");
        Ok(self
            .catalog
            .types()?
            .iter()
            .filter_map(|t| {
                let p = prices.price(&t.name(), t.shape());
                (p.source == PriceSource::Estimated).then(|| UnpricedType {
                    name: t.name(),
                    estimated_price: p.per_hour,
                })
            })
            .collect())
    }
}

/// A k8s quantity string: binary suffixes for exact multiples (memory, storage), else units.
fn k8s_quantity(name: &str, q: Quantity) -> K8sQuantity {
    let milli = q.milli();
    if milli % 1000 != 0 {
        return K8sQuantity(format!("{milli}m"));
    }
    let units = milli / 1000;
    if name == MEMORY || name == EPHEMERAL_STORAGE {
        for (suffix, factor) in [("Gi", GIB), ("Mi", 1 << 20), ("Ki", 1 << 10)] {
            if units != 0 && units % factor == 0 {
                return K8sQuantity(format!("{}{suffix}", units / factor));
            }
        }
    }
    K8sQuantity(units.to_string())
}

/// Scheduler resources as a CRD resource list.
pub fn to_resource_list(r: &Resources) -> ResourceList {
    r.iter()
        .map(|(name, q)| (name.to_string(), k8s_quantity(name, q)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodeclass(yaml: &str) -> ExoscaleNodeClass {
        let spec = serde_yaml_ng::from_str(yaml).unwrap();
        ExoscaleNodeClass::new("default", spec)
    }

    fn standard_large() -> DiscoveredType {
        DiscoveredType {
            id: "id".into(),
            family: "standard".into(),
            size: "large".into(),
            cpus: 4,
            memory_bytes: 8 << 30,
            gpus: 0,
        }
    }

    #[test]
    fn allocatable_subtracts_reservations_and_eviction_thresholds() {
        let nc = nodeclass("templateID: 11111111-2222-3333-4444-555555555555\ndiskSize: 100\n");
        let it = build(&standard_large(), &nc, "ch-gva-2", 0.09, true).unwrap();
        let a = it.allocatable();
        assert_eq!(a.cpu(), Quantity::parse("3700m").unwrap());
        // 8Gi - 300Mi - 100Mi - 100Mi eviction
        assert_eq!(a.memory(), Quantity::parse("7692Mi").unwrap());
        assert_eq!(a.pods(), Quantity::from_units(110));
        // 100Gi - 1Gi - 3Gi - 10% of 100Gi
        assert_eq!(a.get(EPHEMERAL_STORAGE), Quantity::parse("86Gi").unwrap());
    }

    #[test]
    fn kubelet_settings_change_pods_and_overhead() {
        let nc = nodeclass(
            "templateID: 11111111-2222-3333-4444-555555555555\nkubelet:\n  maxPods: 30\n  kubeReserved:\n    cpu: 1\n    memory: 1Gi\n    ephemeralStorage: 0\n  systemReserved:\n    cpu: ''\n    memory: ''\n    ephemeralStorage: ''\n",
        );
        let it = build(&standard_large(), &nc, "z", 1.0, true).unwrap();
        let a = it.allocatable();
        assert_eq!(a.pods(), Quantity::from_units(30));
        assert_eq!(a.cpu(), Quantity::from_units(3));
        // 8Gi - 1Gi kube-reserved - the kubelet's 100Mi eviction threshold
        assert_eq!(a.memory(), Quantity::parse("7068Mi").unwrap());
        // 50Gi - 10% (the kubelet's nodefs.available threshold)
        assert_eq!(a.get(EPHEMERAL_STORAGE), Quantity::parse("45Gi").unwrap());
    }

    #[test]
    fn bad_reservations_name_the_field() {
        let mut nc = nodeclass("templateID: 11111111-2222-3333-4444-555555555555\n");
        let mut k = KubeletConfiguration::default();
        k.kube_reserved.memory = "1 gigabyte".into();
        nc.spec.kubelet = Some(k);
        let e = build(&standard_large(), &nc, "z", 1.0, true)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("kubelet.kubeReserved.memory") && e.contains("1 gigabyte"),
            "{e}"
        );
    }

    #[test]
    fn requirements_define_every_label_including_gpu_absence() {
        let nc = nodeclass("templateID: 11111111-2222-3333-4444-555555555555\n");
        let it = build(&standard_large(), &nc, "ch-gva-2", 0.09, true).unwrap();
        let r = &it.requirements;
        for (key, value) in [
            (INSTANCE_TYPE, "standard.large"),
            (INSTANCE_FAMILY_LABEL, "standard"),
            (LEGACY_INSTANCE_FAMILY_LABEL, "standard"),
            (INSTANCE_SIZE_LABEL, "large"),
            (INSTANCE_CPU_LABEL, "4"),
            (INSTANCE_MEMORY_LABEL, "8192"),
            (ARCH, "amd64"),
            (OS, "linux"),
            (CAPACITY_TYPE, "on-demand"),
            (ZONE, "ch-gva-2"),
            (REGION, "ch-gva-2"),
        ] {
            assert!(
                r.get(key).is_some_and(|q| q.has(value)),
                "{key}={value}: {r}"
            );
        }
        assert!(r.get(INSTANCE_GPU_COUNT_LABEL).is_some_and(|q| !q.has("1")));
        let cpu_gt_3 =
            Requirement::new(INSTANCE_CPU_LABEL, crate::scheduling::Operator::Gt, ["3"]).unwrap();
        assert!(r.get(INSTANCE_CPU_LABEL).unwrap().intersects(&cpu_gt_3));
    }

    #[test]
    fn gpu_types_carry_gpu_capacity_and_labels() {
        let t = DiscoveredType {
            id: "g".into(),
            family: "gpua30".into(),
            size: "small".into(),
            cpus: 12,
            memory_bytes: 56 << 30,
            gpus: 1,
        };
        let nc = nodeclass("templateID: 11111111-2222-3333-4444-555555555555\n");
        let it = build(&t, &nc, "ch-gva-2", 2.0, true).unwrap();
        assert_eq!(it.capacity.get(GPU_RESOURCE), Quantity::from_units(1));
        assert_eq!(it.allocatable().get(GPU_RESOURCE), Quantity::from_units(1));
        let r = &it.requirements;
        assert!(r.get(INSTANCE_GPU_MODEL_LABEL).unwrap().has("a30"));
        assert!(r.get(LEGACY_ACCELERATOR_LABEL).unwrap().has("nvidia"));
        assert!(r.get(LEGACY_GPU_COUNT_LABEL).unwrap().has("1"));
    }

    #[test]
    fn capacity_of_standard_and_gpu_types() {
        let c = capacity(&standard_large(), 100, 110);
        assert_eq!(c.cpu(), Quantity::from_units(4));
        assert_eq!(c.memory(), Quantity::parse("8Gi").unwrap());
        assert_eq!(c.pods(), Quantity::from_units(110));
        assert_eq!(c.get(EPHEMERAL_STORAGE), Quantity::parse("100Gi").unwrap());
        assert!(!c.contains(GPU_RESOURCE));
        let gpu = DiscoveredType {
            id: "g".into(),
            family: "gpu2".into(),
            size: "medium".into(),
            cpus: 8,
            memory_bytes: 16 << 30,
            gpus: 2,
        };
        let c = capacity(&gpu, 50, 110);
        assert_eq!(c.cpu(), Quantity::from_units(8));
        assert_eq!(c.memory(), Quantity::parse("16Gi").unwrap());
        assert_eq!(c.get(GPU_RESOURCE), Quantity::from_units(2));
    }

    #[test]
    fn overhead_for_full_partial_and_empty_reservations() {
        let cap = capacity(&standard_large(), 100, 110);
        let evict_mem = Quantity::parse("100Mi").unwrap();
        let evict_fs = Quantity::parse("10Gi").unwrap();
        // Defaults: 200m/300Mi/1Gi + 100m/100Mi/3Gi.
        let o = overhead(&KubeletConfiguration::default(), &cap).unwrap();
        assert_eq!(o.cpu(), Quantity::parse("300m").unwrap());
        assert_eq!(o.memory(), Quantity::parse("400Mi").unwrap() + evict_mem);
        assert_eq!(
            o.get(EPHEMERAL_STORAGE),
            Quantity::parse("4Gi").unwrap() + evict_fs
        );
        // Only kube-reserved cpu set, system-reserved partially.
        let mut k = KubeletConfiguration::default();
        k.kube_reserved.cpu = "500m".into();
        k.kube_reserved.memory = String::new();
        k.kube_reserved.ephemeral_storage = String::new();
        k.system_reserved.cpu = String::new();
        k.system_reserved.memory = "200Mi".into();
        k.system_reserved.ephemeral_storage = "2Gi".into();
        let o = overhead(&k, &cap).unwrap();
        assert_eq!(o.cpu(), Quantity::parse("500m").unwrap());
        assert_eq!(o.memory(), Quantity::parse("200Mi").unwrap() + evict_mem);
        assert_eq!(
            o.get(EPHEMERAL_STORAGE),
            Quantity::parse("2Gi").unwrap() + evict_fs
        );
        // Nothing reserved: only the eviction thresholds remain.
        for r in [
            &mut k.kube_reserved.cpu,
            &mut k.system_reserved.memory,
            &mut k.system_reserved.ephemeral_storage,
        ] {
            r.clear();
        }
        let o = overhead(&k, &cap).unwrap();
        assert!(o.cpu().is_zero());
        assert_eq!(o.memory(), evict_mem);
    }

    #[test]
    fn kubelet_validation_names_the_bad_field() {
        assert!(validate_kubelet(&KubeletConfiguration::default()).is_ok());
        for (set, field) in [
            (0, "kubelet.kubeReserved.cpu"),
            (1, "kubelet.systemReserved.memory"),
            (2, "kubelet.systemReserved.ephemeralStorage"),
        ] {
            let mut k = KubeletConfiguration::default();
            match set {
                0 => k.kube_reserved.cpu = "500 millicores".into(),
                1 => k.system_reserved.memory = "1 gigabyte".into(),
                _ => k.system_reserved.ephemeral_storage = "lots".into(),
            }
            let e = validate_kubelet(&k).unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
        for ok in ["2", "1500m"] {
            let mut k = KubeletConfiguration::default();
            k.kube_reserved.cpu = ok.into();
            assert!(validate_kubelet(&k).is_ok(), "{ok}");
        }
    }

    #[test]
    fn offline_catalogue_matches_api_discovery_rules() {
        let types = discovered_from_catalogue(crate::catalogue::Catalogue::embedded(), "ch-gva-2");
        assert!(types.iter().any(|t| t.name() == "standard.medium"));
        assert!(
            types.iter().all(|t| t.gpus == 0),
            "GPU types are not authorized by default"
        );
    }

    #[test]
    fn unavailable_offerings_expire_with_the_clock() {
        let clock = exoscale::FixedClock::at(1000);
        let u = UnavailableOfferings::new(Arc::new(clock.clone()), Duration::from_secs(180));
        u.mark("gpua30.small", "ch-gva-2");
        assert!(u.is_unavailable("gpua30.small", "ch-gva-2"));
        assert!(!u.is_unavailable("gpua30.small", "de-fra-1"));
        clock.set(1000 + 180);
        assert!(!u.is_unavailable("gpua30.small", "ch-gva-2"));
    }

    #[test]
    fn zone_filter_keeps_authorized_types_offered_here() {
        let mk = |family: &str, authorized: bool, zones: &[&str]| exoscale::models::InstanceType {
            id: family.into(),
            family: family.into(),
            size: "small".into(),
            cpus: 1,
            gpus: 0,
            memory: 1 << 30,
            authorized,
            zones: zones.iter().map(|z| z.to_string()).collect(),
        };
        let kept = usable_in_zone(
            vec![
                mk("b", true, &["ch-gva-2"]),
                mk("a", true, &["ch-gva-2", "de-fra-1"]),
                mk("c", false, &["ch-gva-2"]),
                mk("d", true, &["de-fra-1"]),
            ],
            "ch-gva-2",
        );
        let names: Vec<_> = kept.iter().map(|t| t.name()).collect();
        assert_eq!(names, vec!["a.small", "b.small"]);
    }

    #[test]
    fn resource_lists_use_readable_quantities() {
        let r = Resources::from_literals(&[
            ("cpu", "3700m"),
            ("memory", "7692Mi"),
            ("ephemeral-storage", "86Gi"),
            ("pods", "110"),
            ("nvidia.com/gpu", "1"),
        ]);
        let l = to_resource_list(&r);
        assert_eq!(l["cpu"].0, "3700m");
        assert_eq!(l["memory"].0, "7692Mi");
        assert_eq!(l["ephemeral-storage"].0, "86Gi");
        assert_eq!(l["pods"].0, "110");
        assert_eq!(l["nvidia.com/gpu"].0, "1");
    }
}
