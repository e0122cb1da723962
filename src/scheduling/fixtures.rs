//! Synthetic instance types and pods with the shape of upstream Karpenter's scheduling benchmark
//! (`pkg/cloudprovider/fake` and `scheduling_benchmark_test.go`), for tests, the fake cloud
//! provider and `benches/scheduling.rs`.

use std::collections::BTreeMap;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::WellKnownLabels;
use super::labels::{ARCH, CAPACITY_TYPE_ON_DEMAND, CAPACITY_TYPE_SPOT, HOSTNAME, OS, ZONE};
use super::model::{
    InstanceType, LabelSelector, NodePoolTemplate, Offering, Pod, PodAffinityTerm, PodShape,
    TopologySpreadConstraint, WeightedPodAffinityTerm, WeightedRequirements,
};
use super::quantity::{CPU, MEMORY, PODS, Quantity, Resources};
use super::requirements::{Requirement, Requirements};
use super::scheduler::{SchedulerInput, SchedulerOptions};

/// Provider labels the fake instance types define (upstream adds them to the well-known set).
pub const LABEL_INSTANCE_SIZE: &str = "size";
pub const LABEL_EXOTIC: &str = "special";
pub const LABEL_INTEGER: &str = "integer";
pub const FAKE_ZONES: [&str; 3] = ["test-zone-1", "test-zone-2", "test-zone-3"];

/// The well-known labels plus the fake provider's.
pub fn well_known_labels() -> WellKnownLabels {
    WellKnownLabels::with_provider_labels([LABEL_INSTANCE_SIZE, LABEL_EXOTIC, LABEL_INTEGER])
}

/// Upstream `fake.PriceFromResources`: 0.1 per CPU plus 0.1 per GB of memory.
pub fn price_from_resources(r: &Resources) -> f64 {
    r.cpu().milli() as f64 / 1000.0 * 0.1 + r.memory().milli() as f64 / 1000.0 / 1e9 * 0.1
}

/// Upstream's default offerings: spot in zones 1-2, on-demand in zones 1-3, all at one price.
pub fn default_offerings(price: f64) -> Vec<Offering> {
    let mk = |ct: &str, zone: &str| Offering {
        zone: zone.to_string(),
        capacity_type: ct.to_string(),
        price,
        available: true,
    };
    vec![
        mk(CAPACITY_TYPE_SPOT, FAKE_ZONES[0]),
        mk(CAPACITY_TYPE_SPOT, FAKE_ZONES[1]),
        mk(CAPACITY_TYPE_ON_DEMAND, FAKE_ZONES[0]),
        mk(CAPACITY_TYPE_ON_DEMAND, FAKE_ZONES[1]),
        mk(CAPACITY_TYPE_ON_DEMAND, FAKE_ZONES[2]),
    ]
}

/// Upstream `fake.NewInstanceType` with the given capacity and offerings.
pub fn instance_type(name: &str, capacity: Resources, offerings: Vec<Offering>) -> InstanceType {
    let cores = capacity.cpu().units_ceil();
    let large = capacity.cpu() > Quantity::from_units(4)
        && capacity.memory() > Quantity::parse("8Gi").expect("literal");
    let mut extra = vec![
        Requirement::in_values(ARCH, ["amd64"]),
        Requirement::in_values(OS, ["darwin", "linux", "windows"]),
        Requirement::in_values(LABEL_INSTANCE_SIZE, [if large { "large" } else { "small" }]),
        Requirement::in_values(LABEL_INTEGER, [cores.to_string()]),
    ];
    extra.push(if large {
        Requirement::in_values(LABEL_EXOTIC, ["optional"])
    } else {
        Requirement::does_not_exist(LABEL_EXOTIC)
    });
    InstanceType {
        name: name.to_string(),
        requirements: InstanceType::standard_requirements(name, &offerings, extra),
        offerings,
        capacity,
        overhead: Resources::from_literals(&[(CPU, "100m"), (MEMORY, "10Mi")]),
        price_overlaid: false,
        capacity_overlaid: false,
    }
}

/// Upstream `fake.InstanceTypes(n)`: `fake-it-{i}` with i+1 CPU, 2(i+1) Gi memory, 10(i+1) pods.
pub fn instance_types(total: usize) -> Vec<Arc<InstanceType>> {
    (0..total)
        .map(|i| {
            let n = i as i128 + 1;
            let mut capacity = Resources::new();
            capacity.set(CPU, Quantity::from_units(n));
            capacity.set(MEMORY, Quantity::from_units(n * 2 * (1 << 30)));
            capacity.set(PODS, Quantity::from_units(n * 10));
            let price = price_from_resources(&capacity);
            Arc::new(instance_type(
                &format!("fake-it-{i}"),
                capacity,
                default_offerings(price),
            ))
        })
        .collect()
}

/// A NodePool with no requirements and the benchmark's huge limits.
pub fn node_pool(name: &str) -> NodePoolTemplate {
    NodePoolTemplate {
        name: name.to_string(),
        limits: [
            (CPU.to_string(), Quantity::from_units(10_000_000)),
            (
                MEMORY.to_string(),
                Quantity::parse("10000000Gi").expect("literal"),
            ),
        ]
        .into_iter()
        .collect(),
        node_class_ref: "default".to_string(),
        ..Default::default()
    }
}

/// The upstream benchmark's scheduler input: one NodePool over `types`.
pub fn benchmark_input(types: Vec<Arc<InstanceType>>, options: SchedulerOptions) -> SchedulerInput {
    let pool = node_pool("default");
    SchedulerInput {
        instance_types: [(pool.name.clone(), types)].into_iter().collect(),
        node_pools: vec![pool],
        existing_nodes: Vec::new(),
        daemonsets: Vec::new(),
        options: SchedulerOptions {
            well_known_labels: well_known_labels(),
            ..options
        },
    }
}

/// A plain pod with CPU/memory requests (`pods: 1` added).
pub fn pod(name: &str, cpu: &str, memory: &str) -> Pod {
    let mut requests = Resources::from_literals(&[(CPU, cpu), (MEMORY, memory)]);
    requests.set(PODS, Quantity::from_units(1));
    Pod {
        uid: format!("uid-{name}"),
        name: name.to_string(),
        shape: Arc::new(PodShape {
            namespace: "default".to_string(),
            requests,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn labels(k: &str, v: &str) -> BTreeMap<String, String> {
    [(k.to_string(), v.to_string())].into_iter().collect()
}

/// Deterministic generator of the benchmark's pod mixes.
pub struct PodGenerator {
    rng: StdRng,
    next: usize,
}

const LABEL_VALUES: [&str; 7] = ["a", "b", "c", "d", "e", "f", "g"];
const CPUS: [&str; 5] = ["100m", "250m", "500m", "1000m", "1500m"];
const MEMORIES: [&str; 6] = ["100Mi", "256Mi", "512Mi", "1024Mi", "2048Mi", "4096Mi"];

impl PodGenerator {
    pub fn new(seed: u64) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed),
            next: 0,
        }
    }

    fn value(&mut self) -> &'static str {
        LABEL_VALUES[self.rng.random_range(0..LABEL_VALUES.len())]
    }

    fn base(&mut self) -> Pod {
        let cpu = CPUS[self.rng.random_range(0..CPUS.len())];
        let mem = MEMORIES[self.rng.random_range(0..MEMORIES.len())];
        self.next += 1;
        let mut p = pod(&format!("pod-{}", self.next), cpu, mem);
        p.created_at = self.next as i64;
        p
    }

    pub fn generic(&mut self) -> Pod {
        let mut p = self.base();
        p.labels = labels("my-label", self.value()).into();
        p
    }

    /// `maxSkew: 1`, `DoNotSchedule`, selector on a random `my-label` value.
    pub fn spread(&mut self, key: &str) -> Pod {
        let mut p = self.generic();
        let selector = LabelSelector::from_labels([("my-label", self.value())]);
        p.topology_spread = vec![TopologySpreadConstraint::new(key, 1, selector)];
        p
    }

    /// Required self-affinity on a random `my-affininity` value (upstream's spelling).
    pub fn self_affinity(&mut self, key: &str) -> Pod {
        let mut p = self.base();
        let v = self.value();
        p.labels = labels("my-affininity", v).into();
        p.pod_affinity = vec![PodAffinityTerm::new(
            LabelSelector::from_labels([("my-affininity", v)]),
            key,
        )];
        p
    }

    /// Required anti-affinity against every other `app=nginx` pod.
    pub fn anti_affinity(&mut self, key: &str) -> Pod {
        let mut p = self.base();
        p.labels = labels("app", "nginx").into();
        p.pod_anti_affinity = vec![PodAffinityTerm::new(
            LabelSelector::from_labels([("app", "nginx")]),
            key,
        )];
        p
    }

    /// Upstream `makeDiversePods`: five equal shares, the remainder generic.
    pub fn diverse(&mut self, count: usize) -> Vec<Pod> {
        let share = count / 5;
        let mut pods = Vec::with_capacity(count);
        pods.extend((0..share).map(|_| self.generic()));
        pods.extend((0..share).map(|_| self.spread(ZONE)));
        pods.extend((0..share).map(|_| self.spread(HOSTNAME)));
        pods.extend((0..share).map(|_| self.self_affinity(ZONE)));
        pods.extend((0..share).map(|_| self.anti_affinity(HOSTNAME)));
        while pods.len() < count {
            pods.push(self.generic());
        }
        pods
    }

    /// Upstream `makePreferencePods`: identical pods preferring zone 1 (satisfiable), zonal
    /// anti-affinity (weight 10, unsatisfiable beyond three pods) and hostname anti-affinity (weight 1).
    pub fn preference(&mut self, count: usize) -> Vec<Pod> {
        let template = self.base();
        let nginx = || LabelSelector::from_labels([("app", "nginx")]);
        (0..count)
            .map(|i| {
                let mut p = template.clone();
                p.name = format!("pref-{i}");
                p.uid = format!("uid-pref-{i}");
                p.created_at = i as i64;
                p.labels = labels("app", "nginx").into();
                p.preferred_node_affinity = vec![WeightedRequirements {
                    weight: 1,
                    requirements: Requirements::from_requirements([Requirement::in_values(
                        ZONE,
                        [FAKE_ZONES[0]],
                    )]),
                }];
                p.preferred_pod_anti_affinity = vec![
                    WeightedPodAffinityTerm {
                        weight: 10,
                        term: PodAffinityTerm::new(nginx(), ZONE),
                    },
                    WeightedPodAffinityTerm {
                        weight: 1,
                        term: PodAffinityTerm::new(nginx(), HOSTNAME),
                    },
                ];
                p
            })
            .collect()
    }
}
