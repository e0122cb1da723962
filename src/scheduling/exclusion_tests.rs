//! `Scheduler::solve_excluding` must decide exactly as a scheduler built with the same nodes in
//! `SchedulerOptions::excluded_nodes`: checked over many random clusters with topology spread,
//! pod affinity and anti-affinity (on pending and on running pods).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::fixtures::{self, FAKE_ZONES, instance_types, node_pool, pod};
use super::labels::{CAPACITY_TYPE, HOSTNAME, NODE_POOL, ZONE};
use super::model::HostPort;
use super::*;

const APPS: [&str; 3] = ["web", "api", "db"];
/// A zone only some existing nodes are in (no instance type offers it): it leaves the
/// topology domains when those nodes are excluded.
const NODE_ONLY_ZONE: &str = "legacy-zone";

fn pick<'a, T>(rng: &mut StdRng, items: &'a [T]) -> &'a T {
    &items[rng.random_range(0..items.len())]
}

fn app_labels(app: &str) -> BTreeMap<String, String> {
    [("app".to_string(), app.to_string())].into_iter().collect()
}

fn selector(app: &str) -> LabelSelector {
    LabelSelector::from_labels([("app", app)])
}

fn topology_key(rng: &mut StdRng) -> &'static str {
    if rng.random_bool(0.5) { ZONE } else { HOSTNAME }
}

fn random_node(rng: &mut StdRng, i: usize) -> ExistingNode {
    let name = format!("node-{i:02}");
    let zone = if rng.random_ratio(1, 6) {
        NODE_ONLY_ZONE
    } else {
        *pick(rng, &FAKE_ZONES)
    };
    let labels: BTreeMap<String, String> = [
        (ZONE, zone),
        (NODE_POOL, "default"),
        (HOSTNAME, name.as_str()),
        (CAPACITY_TYPE, "on-demand"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let cpu = *pick(rng, &["1", "2", "4"]);
    let pods = (0..rng.random_range(0..5))
        .map(|_| {
            let app = *pick(rng, &APPS);
            let mut anti = Vec::new();
            if rng.random_ratio(1, 4) {
                let target = *pick(rng, &APPS);
                anti.push(PodAffinityTerm::new(selector(target), topology_key(rng)));
            }
            Arc::new(BoundPod {
                namespace: (*pick(rng, &["default", "default", "other"])).to_string(),
                labels: app_labels(app).into(),
                requests: Resources::from_literals(&[
                    ("cpu", *pick(rng, &["100m", "300m", "600m"])),
                    ("memory", "256Mi"),
                    ("pods", "1"),
                ]),
                required_anti_affinity: anti,
                host_ports: if rng.random_ratio(1, 8) {
                    vec![HostPort::tcp(8080)]
                } else {
                    Vec::new()
                },
                ..Default::default()
            })
        })
        .collect();
    ExistingNode {
        hostname: name.clone(),
        name,
        labels: Arc::new(labels),
        taints: if rng.random_ratio(1, 8) {
            vec![Taint::new("dedicated", "db", TaintEffect::NoSchedule)]
        } else {
            Vec::new()
        },
        allocatable: Resources::from_literals(&[("cpu", cpu), ("memory", "8Gi"), ("pods", "110")]),
        pods,
        node_pool: Some("default".into()),
        initialized: !rng.random_ratio(1, 8),
        settling: false,
    }
}

fn random_pod(rng: &mut StdRng, i: usize) -> Pod {
    let app = *pick(rng, &APPS);
    let cpu = *pick(rng, &["100m", "250m", "500m", "900m", "1500m"]);
    let mut p = pod(&format!("p{i}"), cpu, "256Mi");
    p.labels = app_labels(app).into();
    if rng.random_ratio(1, 6) {
        p.namespace = "other".into();
    }
    let target = *pick(rng, &APPS);
    match rng.random_range(0..8) {
        0 | 1 => {
            let mut c = TopologySpreadConstraint::new(
                topology_key(rng),
                rng.random_range(1..3),
                selector(app),
            );
            if rng.random_ratio(1, 3) {
                c.when_unsatisfiable = WhenUnsatisfiable::ScheduleAnyway;
            }
            if rng.random_ratio(1, 4) {
                c.min_domains = Some(rng.random_range(2..5));
            }
            if rng.random_ratio(1, 4) {
                c.node_taints_policy = InclusionPolicy::Honor;
            }
            p.topology_spread.push(c);
        }
        2 => p
            .pod_affinity
            .push(PodAffinityTerm::new(selector(target), topology_key(rng))),
        3 | 4 => p
            .pod_anti_affinity
            .push(PodAffinityTerm::new(selector(target), topology_key(rng))),
        5 => p.preferred_pod_anti_affinity.push(WeightedPodAffinityTerm {
            weight: 10,
            term: PodAffinityTerm::new(selector(target), topology_key(rng)),
        }),
        6 => p.preferred_pod_affinity.push(WeightedPodAffinityTerm {
            weight: 10,
            term: PodAffinityTerm::new(selector(target), topology_key(rng)),
        }),
        _ => {}
    }
    if rng.random_ratio(1, 6) {
        p.node_selector
            .add(Requirement::in_values(ZONE, [*pick(rng, &FAKE_ZONES)]));
    }
    if rng.random_ratio(1, 8) {
        Arc::make_mut(&mut p.tolerations).push(Toleration {
            key: "dedicated".into(),
            operator: TolerationOperator::Exists,
            ..Default::default()
        });
    }
    if rng.random_ratio(1, 10) {
        p.host_ports.push(HostPort::tcp(8080));
    }
    p
}

fn input(nodes: Vec<ExistingNode>, excluded: HashSet<String>) -> SchedulerInput {
    let pool = node_pool("default");
    SchedulerInput {
        instance_types: [(pool.name.clone(), instance_types(6))]
            .into_iter()
            .collect(),
        node_pools: vec![pool],
        existing_nodes: nodes,
        daemonsets: Vec::new(),
        options: SchedulerOptions {
            well_known_labels: fixtures::well_known_labels(),
            excluded_nodes: excluded,
            ..Default::default()
        },
    }
}

/// Everything in `Results`, in a comparable form.
fn summary(r: &Results) -> String {
    let mut out = String::new();
    for c in &r.new_node_claims {
        let types: Vec<&str> = c.instance_types.iter().map(|t| t.name.as_str()).collect();
        out += &format!(
            "claim {} [{}] {types:?} pods {:?} requests {} overhead {} relaxed {}\n",
            c.node_pool,
            c.node_claim_requirements(),
            c.pods,
            c.requests,
            c.daemon_overhead,
            c.min_values_relaxed
        );
    }
    for e in &r.existing_nodes {
        out += &format!("node {} pods {:?}\n", e.node_name, e.pods);
    }
    for u in &r.unschedulable {
        out += &format!(
            "unschedulable {} {} {:?}\n",
            u.pod, u.reason, u.per_node_pool
        );
    }
    out += &format!("ignored {:?}\n", r.ignored);
    out
}

/// How often the compared solves exercised each kind of outcome (the test must cover them).
#[derive(Default, Debug)]
struct Coverage {
    on_existing: usize,
    on_new: usize,
    topology_rejections: usize,
    with_exclusions: usize,
}

fn compare(seed: u64, coverage: &mut Coverage) {
    let mut rng = StdRng::seed_from_u64(seed);
    let nodes: Vec<ExistingNode> = (0..rng.random_range(4..16))
        .map(|i| random_node(&mut rng, i))
        .collect();
    let shared = Scheduler::new(input(nodes.clone(), HashSet::new()));
    // Several solves on one scheduler, so cached state from earlier exclusions is reused.
    for round in 0..4 {
        let pods: Vec<Pod> = (0..rng.random_range(1..9))
            .map(|i| random_pod(&mut rng, i))
            .collect();
        let mut excluded: HashSet<String> = HashSet::new();
        for _ in 0..rng.random_range(0..4) {
            excluded.insert(pick(&mut rng, &nodes).name.clone());
        }
        if rng.random_ratio(1, 10) {
            excluded.insert("no-such-node".into());
        }
        let fresh = Scheduler::new(input(nodes.clone(), excluded.clone())).solve(&pods);
        let reused = shared.solve_excluding(&pods, &excluded);
        assert_eq!(
            summary(&reused),
            summary(&fresh),
            "seed {seed}, round {round}, excluded {excluded:?}"
        );
        coverage.on_existing += fresh.existing_nodes.len();
        coverage.on_new += fresh.new_node_claims.len();
        coverage.topology_rejections += fresh
            .unschedulable
            .iter()
            .filter(|u| u.reason.contains("topology"))
            .count();
        coverage.with_exclusions += usize::from(!excluded.is_empty());
    }
}

#[test]
fn solve_excluding_matches_a_scheduler_built_without_the_nodes() {
    let mut coverage = Coverage::default();
    for seed in 0..300 {
        compare(seed, &mut coverage);
    }
    assert!(coverage.on_existing > 100, "{coverage:?}");
    assert!(coverage.on_new > 100, "{coverage:?}");
    assert!(coverage.topology_rejections > 10, "{coverage:?}");
    assert!(coverage.with_exclusions > 500, "{coverage:?}");
}

#[test]
fn excluded_nodes_capacity_and_domains_are_gone() {
    // Two nodes in a zone no instance type offers; an anti-affine pod must avoid the
    // zones of running "web" pods. Excluding the web node frees its zone's domain.
    let node = |name: &str, zone: &str, app: Option<&str>| ExistingNode {
        name: name.into(),
        hostname: name.into(),
        labels: [(ZONE, zone), (NODE_POOL, "default"), (HOSTNAME, name)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>()
            .into(),
        allocatable: Resources::from_literals(&[("cpu", "2"), ("memory", "8Gi"), ("pods", "110")]),
        pods: app
            .map(|a| {
                Arc::new(BoundPod {
                    namespace: "default".into(),
                    labels: app_labels(a).into(),
                    requests: Resources::from_literals(&[("cpu", "100m"), ("pods", "1")]),
                    ..Default::default()
                })
            })
            .into_iter()
            .collect(),
        node_pool: Some("default".into()),
        initialized: true,
        ..Default::default()
    };
    let nodes = vec![
        node("a-web", NODE_ONLY_ZONE, Some("web")),
        node("b-free", NODE_ONLY_ZONE, None),
    ];
    let scheduler = Scheduler::new(input(nodes, HashSet::new()));
    let mut p = pod("p", "500m", "256Mi");
    p.pod_anti_affinity
        .push(PodAffinityTerm::new(selector("web"), ZONE));
    p.node_selector
        .add(Requirement::in_values(ZONE, [NODE_ONLY_ZONE]));
    let pods = [p];

    let all = scheduler.solve(&pods);
    assert_eq!(all.unschedulable.len(), 1, "{}", summary(&all));
    assert!(all.unschedulable[0].reason.contains("anti-affinity"));

    let without_web = scheduler.solve_excluding(&pods, &HashSet::from(["a-web"]));
    assert_eq!(
        without_web.existing_nodes.len(),
        1,
        "{}",
        summary(&without_web)
    );
    assert_eq!(without_web.existing_nodes[0].node_name, "b-free");

    let without_both = scheduler.solve_excluding(&pods, &HashSet::from(["a-web", "b-free"]));
    assert_eq!(without_both.unschedulable.len(), 1);
    assert!(without_both.existing_nodes.is_empty());

    // The scheduler is unchanged by the excluding solves.
    assert_eq!(summary(&scheduler.solve(&pods)), summary(&all));
}
