//! Behaviour tests for the solver (reference behaviours 3-17 and the extra cases).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::fixtures::{self, FAKE_ZONES, PodGenerator, instance_types, node_pool, pod};
use super::labels::{CAPACITY_TYPE, HOSTNAME, INSTANCE_TYPE, NODE_POOL, ZONE};
use super::*;

fn input(pools: Vec<NodePoolTemplate>, types: Vec<Arc<InstanceType>>) -> SchedulerInput {
    SchedulerInput {
        instance_types: pools
            .iter()
            .map(|p| (p.name.clone(), types.clone()))
            .collect(),
        node_pools: pools,
        options: SchedulerOptions {
            well_known_labels: fixtures::well_known_labels(),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn solve(input: SchedulerInput, pods: &[Pod]) -> Results {
    Scheduler::new(input).solve(pods)
}

fn zone_of(c: &NewNodeClaim) -> Option<&str> {
    c.requirements.get(ZONE).and_then(Requirement::single_value)
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn existing_node(name: &str, zone: &str, cpu: &str, pool: &str) -> ExistingNode {
    ExistingNode {
        name: name.into(),
        hostname: name.into(),
        labels: labels(&[(ZONE, zone), (NODE_POOL, pool), (HOSTNAME, name)]).into(),
        allocatable: Resources::from_literals(&[("cpu", cpu), ("memory", "8Gi"), ("pods", "110")]),
        node_pool: Some(pool.into()),
        initialized: true,
        ..Default::default()
    }
}

#[test]
fn three_one_cpu_pods_pack_onto_one_node_of_the_cheapest_fitting_type() {
    let pods: Vec<Pod> = (0..3).map(|i| pod(&format!("p{i}"), "1", "1Gi")).collect();
    let r = solve(
        input(vec![node_pool("default")], instance_types(400)),
        &pods,
    );
    assert!(r.unschedulable.is_empty());
    assert_eq!(r.new_node_claims.len(), 1);
    let claim = &r.new_node_claims[0];
    assert_eq!(claim.pods.len(), 3);
    // 4 CPU has 3.9 allocatable after the 100m kube-reserved: the smallest that fits 3 CPU.
    assert_eq!(claim.instance_types[0].name, "fake-it-3");
    assert_eq!(claim.requests.cpu(), Quantity::from_units(3));
}

#[test]
fn instance_types_are_cheapest_first_capped_at_600_and_all_fit_requests_plus_daemons() {
    // Behaviour 7 and 8: largest CPU first, cheapest first, ≤600, daemon overhead once.
    let mut inp = input(vec![node_pool("default")], instance_types(700));
    inp.daemonsets = vec![DaemonSetPod {
        name: "logging".into(),
        requests: Resources::from_literals(&[("cpu", "500m"), ("memory", "128Mi")]),
        ..Default::default()
    }];
    let pods = vec![pod("small", "100m", "128Mi"), pod("big", "1500m", "1Gi")];
    let r = solve(inp, &pods);
    let claim = &r.new_node_claims[0];
    assert_eq!(claim.pods, vec![1, 0], "largest CPU request placed first");
    assert_eq!(claim.instance_types.len(), MAX_INSTANCE_TYPES);
    let prices: Vec<f64> = claim
        .instance_types
        .iter()
        .map(|it| {
            it.offerings
                .iter()
                .map(|o| o.price)
                .fold(f64::MAX, f64::min)
        })
        .collect();
    assert!(prices.windows(2).all(|w| w[0] <= w[1]));
    assert_eq!(
        claim.daemon_overhead.cpu(),
        Quantity::parse("500m").unwrap()
    );
    assert_eq!(claim.requests.cpu(), Quantity::parse("2100m").unwrap());
    for it in &claim.instance_types {
        assert!(
            claim.requests.fits_in(&it.allocatable()),
            "{} too small",
            it.name
        );
    }
    let reqs = claim.node_claim_requirements();
    assert_eq!(
        reqs.get(INSTANCE_TYPE).unwrap().values().len(),
        MAX_INSTANCE_TYPES
    );
}

#[test]
fn daemonset_overhead_counts_only_daemons_that_tolerate_and_match_the_pool() {
    let mut pool = node_pool("gpu");
    pool.taints = vec![Taint::new("gpu", "true", TaintEffect::NoSchedule)];
    let mut inp = input(vec![pool], instance_types(20));
    inp.daemonsets = vec![
        DaemonSetPod {
            name: "tolerating".into(),
            requests: Resources::from_literals(&[("cpu", "200m")]),
            tolerations: vec![Toleration::exists("gpu", None)],
            ..Default::default()
        },
        DaemonSetPod {
            name: "intolerant".into(),
            requests: Resources::from_literals(&[("cpu", "300m")]),
            ..Default::default()
        },
        DaemonSetPod {
            name: "other-pool".into(),
            requests: Resources::from_literals(&[("cpu", "400m")]),
            tolerations: vec![Toleration::exists("", None)],
            node_selector: Requirements::from_requirements([Requirement::in_values(
                NODE_POOL,
                ["cpu"],
            )]),
            ..Default::default()
        },
    ];
    let mut p = pod("p", "1", "1Gi");
    p.tolerations = vec![Toleration::exists("gpu", None)].into();
    let q = {
        let mut q = pod("q", "1", "1Gi");
        q.tolerations = p.tolerations.clone();
        q
    };
    let r = solve(inp, &[p, q]);
    assert_eq!(r.new_node_claims.len(), 1);
    let claim = &r.new_node_claims[0];
    assert_eq!(
        claim.daemon_overhead.cpu(),
        Quantity::parse("200m").unwrap()
    );
    assert_eq!(claim.requests.cpu(), Quantity::parse("2200m").unwrap());
}

#[test]
fn hostname_anti_affine_pods_get_one_node_each() {
    let mut generator = PodGenerator::new(7);
    let pods: Vec<Pod> = (0..8).map(|_| generator.anti_affinity(HOSTNAME)).collect();
    let r = solve(input(vec![node_pool("default")], instance_types(50)), &pods);
    assert!(r.unschedulable.is_empty());
    assert_eq!(r.new_node_claims.len(), 8);
    assert!(r.new_node_claims.iter().all(|c| c.pods.len() == 1));
}

#[test]
fn zonal_spread_over_offered_zones_stays_within_max_skew() {
    let selector = LabelSelector::from_labels([("app", "web")]);
    let pods: Vec<Pod> = (0..10)
        .map(|i| {
            let mut p = pod(&format!("web-{i}"), "1", "1Gi");
            p.labels = labels(&[("app", "web")]).into();
            p.topology_spread = vec![TopologySpreadConstraint::new(ZONE, 1, selector.clone())];
            p
        })
        .collect();
    let r = solve(input(vec![node_pool("default")], instance_types(50)), &pods);
    assert!(r.unschedulable.is_empty());
    let mut per_zone: BTreeMap<&str, usize> = BTreeMap::new();
    for c in &r.new_node_claims {
        let zone = zone_of(c).expect("claim pinned to one zone");
        *per_zone.entry(zone).or_default() += c.pods.len();
    }
    assert_eq!(per_zone.len(), 3, "{per_zone:?}");
    let (min, max) = (
        per_zone.values().min().unwrap(),
        per_zone.values().max().unwrap(),
    );
    assert!(max - min <= 1, "{per_zone:?}");
}

#[test]
fn zonal_self_affinity_keeps_pods_in_one_zone() {
    let mut generator = PodGenerator::new(1);
    let mut pods: Vec<Pod> = (0..20).map(|_| generator.self_affinity(ZONE)).collect();
    for p in &mut pods {
        p.labels = labels(&[("my-affininity", "x")]).into();
        p.pod_affinity[0].selector = LabelSelector::from_labels([("my-affininity", "x")]);
    }
    let r = solve(input(vec![node_pool("default")], instance_types(10)), &pods);
    assert!(r.unschedulable.is_empty());
    let zones: std::collections::BTreeSet<_> = r.new_node_claims.iter().map(zone_of).collect();
    assert_eq!(zones.len(), 1, "{zones:?}");
    assert!(zones.iter().all(Option::is_some));
}

#[test]
fn pod_larger_than_any_type_is_unschedulable_naming_the_largest_type() {
    let r = solve(
        input(vec![node_pool("default")], instance_types(10)),
        &[pod("huge", "64", "1Gi")],
    );
    assert!(r.new_node_claims.is_empty());
    assert_eq!(r.unschedulable.len(), 1);
    let reason = &r.unschedulable[0].reason;
    assert!(
        reason.contains("no instance type has enough resources"),
        "{reason}"
    );
    assert!(reason.contains("fake-it-9"), "{reason}");
    assert!(reason.contains("cpu"), "{reason}");
    assert_eq!(r.unschedulable[0].per_node_pool[0].0, "default");
}

#[test]
fn cpu_limit_below_the_request_leaves_the_pod_pending_with_a_reason() {
    // Behaviour 3.
    let mut pool = node_pool("small");
    pool.limits = [("cpu".to_string(), Quantity::from_units(2))]
        .into_iter()
        .collect();
    let r = solve(
        input(vec![pool], instance_types(10)),
        &[pod("p", "3", "1Gi")],
    );
    assert!(r.new_node_claims.is_empty());
    let reason = &r.unschedulable[0].reason;
    // Larger types exist; the limit is what rules them out, and the reason says so.
    assert!(
        reason.contains("exceeds the nodepool's remaining limits {cpu: 2}"),
        "{reason}"
    );
}

#[test]
fn limits_stop_growth_across_new_node_claims() {
    let mut pool = node_pool("limited");
    // Each anti-affine pod needs its own node; the limit allows only 8 CPU worth of nodes.
    pool.limits = [("cpu".to_string(), Quantity::from_units(8))]
        .into_iter()
        .collect();
    let mut generator = PodGenerator::new(3);
    let pods: Vec<Pod> = (0..6)
        .map(|_| {
            let mut p = generator.anti_affinity(HOSTNAME);
            p.requests = pod("x", "1500m", "1Gi").requests.clone();
            p
        })
        .collect();
    let r = solve(input(vec![pool], instance_types(4)), &pods);
    assert!(!r.new_node_claims.is_empty());
    assert!(!r.unschedulable.is_empty(), "limit must stop growth");
    let max_capacity: Quantity = r
        .new_node_claims
        .iter()
        .map(|c| {
            c.instance_types
                .iter()
                .map(|it| it.capacity.cpu())
                .max()
                .unwrap()
        })
        .fold(Quantity::ZERO, |a, b| a + b);
    assert!(max_capacity <= Quantity::from_units(8), "{max_capacity}");
}

#[test]
fn node_limit_exhausted_by_existing_node() {
    // Behaviour 4.
    let mut pool = node_pool("one");
    pool.limits = [("nodes".to_string(), Quantity::from_units(1))]
        .into_iter()
        .collect();
    pool.usage = Resources::from_literals(&[("nodes", "1"), ("cpu", "2")]);
    let mut inp = input(vec![pool], instance_types(10));
    inp.existing_nodes = vec![existing_node("n1", FAKE_ZONES[0], "1", "one")];
    let r = solve(inp, &[pod("p", "2", "1Gi")]);
    assert!(r.new_node_claims.is_empty());
    assert!(
        r.unschedulable[0]
            .reason
            .contains("node limits have been exhausted for nodepool"),
        "{}",
        r.unschedulable[0].reason
    );
}

#[test]
fn heavier_node_pool_wins_even_if_more_expensive() {
    // Behaviour 5.
    let mut light = node_pool("light");
    light.weight = 10;
    let mut heavy = node_pool("heavy");
    heavy.weight = 50;
    let cheap = instance_types(10);
    let pricey: Vec<Arc<InstanceType>> = instance_types(10)
        .into_iter()
        .map(|it| {
            let mut it = (*it).clone();
            it.offerings.iter_mut().for_each(|o| o.price *= 10.0);
            Arc::new(it)
        })
        .collect();
    let mut inp = input(vec![light, heavy], cheap);
    inp.instance_types.insert("heavy".into(), pricey);
    let r = solve(inp, &[pod("p", "1", "1Gi")]);
    assert_eq!(r.new_node_claims[0].node_pool, "heavy");
}

#[test]
fn pod_that_fits_an_existing_node_creates_nothing() {
    // Behaviour 6, also for an in-flight NodeClaim (modelled as an uninitialized node).
    for initialized in [true, false] {
        let mut inp = input(vec![node_pool("default")], instance_types(10));
        let mut node = existing_node("n1", FAKE_ZONES[0], "4", "default");
        node.initialized = initialized;
        inp.existing_nodes = vec![node];
        let r = solve(inp, &[pod("p", "1", "1Gi")]);
        assert!(r.new_node_claims.is_empty());
        assert_eq!(r.existing_nodes.len(), 1);
        assert_eq!(r.existing_nodes[0].node_name, "n1");
        assert_eq!(r.existing_nodes[0].pods, vec![0]);
    }
}

#[test]
fn bound_pods_and_daemons_use_up_existing_node_capacity() {
    let mut inp = input(vec![node_pool("default")], instance_types(10));
    let mut node = existing_node("n1", FAKE_ZONES[0], "4", "default");
    node.pods = vec![Arc::new(BoundPod {
        namespace: "default".into(),
        requests: Resources::from_literals(&[("cpu", "2")]),
        ..Default::default()
    })];
    inp.existing_nodes = vec![node];
    inp.daemonsets = vec![DaemonSetPod {
        name: "agent".into(),
        requests: Resources::from_literals(&[("cpu", "1")]),
        ..Default::default()
    }];
    let r = solve(inp, &[pod("p", "1500m", "1Gi")]);
    assert!(r.existing_nodes.is_empty(), "only 1 CPU left on n1");
    assert_eq!(r.new_node_claims.len(), 1);
}

#[test]
fn excluded_nodes_are_ignored_for_consolidation() {
    let mut inp = input(vec![node_pool("default")], instance_types(10));
    inp.existing_nodes = vec![existing_node("candidate", FAKE_ZONES[0], "4", "default")];
    inp.options.excluded_nodes.insert("candidate".into());
    let r = solve(inp, &[pod("p", "1", "1Gi")]);
    assert!(r.existing_nodes.is_empty());
    assert_eq!(r.new_node_claims.len(), 1);
}

#[test]
fn undefined_custom_label_is_unschedulable_with_a_typo_hint() {
    // Behaviour 9.
    let mut pool = node_pool("default");
    pool.labels = labels(&[("team", "a")]);
    let mut p = pod("p", "1", "1Gi");
    p.node_selector = Requirements::from_labels(&labels(&[("teem", "a")]));
    let mut zonal = pod("z", "1", "1Gi");
    zonal.node_selector = Requirements::from_labels(&labels(&[(ZONE, FAKE_ZONES[1])]));
    let r = solve(input(vec![pool], instance_types(10)), &[p, zonal]);
    assert_eq!(r.unschedulable.len(), 1);
    assert_eq!(r.unschedulable[0].pod, 0);
    let reason = &r.unschedulable[0].reason;
    assert!(
        reason.contains("label \"teem\" does not have known values (typo of \"team\"?)"),
        "{reason}"
    );
    assert_eq!(r.new_node_claims.len(), 1);
    assert_eq!(zone_of(&r.new_node_claims[0]), Some(FAKE_ZONES[1]));
}

#[test]
fn required_node_affinity_terms_are_relaxed_in_order_but_the_last_never() {
    // Behaviour 10.
    let term = |zone: &str| Requirements::from_requirements([Requirement::in_values(ZONE, [zone])]);
    let mut two = pod("two", "1", "1Gi");
    two.required_node_affinity = vec![term("nowhere"), term(FAKE_ZONES[2])];
    let mut one = pod("one", "1", "1Gi");
    one.required_node_affinity = vec![term("nowhere")];
    let r = solve(
        input(vec![node_pool("default")], instance_types(10)),
        &[two, one],
    );
    assert_eq!(r.new_node_claims.len(), 1);
    assert_eq!(zone_of(&r.new_node_claims[0]), Some(FAKE_ZONES[2]));
    assert_eq!(r.unschedulable.len(), 1);
    assert_eq!(r.unschedulable[0].pod, 1);
}

#[test]
fn preferences_are_respected_relaxed_or_ignored_by_policy() {
    // Behaviour 11.
    let prefer = |zone: &str| {
        let mut p = pod(zone, "1", "1Gi");
        p.preferred_node_affinity = vec![WeightedRequirements {
            weight: 1,
            requirements: Requirements::from_requirements([Requirement::in_values(ZONE, [zone])]),
        }];
        p
    };
    let pods = [prefer(FAKE_ZONES[1])];
    let r = solve(input(vec![node_pool("default")], instance_types(10)), &pods);
    assert_eq!(zone_of(&r.new_node_claims[0]), Some(FAKE_ZONES[1]));

    let unsatisfiable = [prefer("test-zone-9")];
    let r = solve(
        input(vec![node_pool("default")], instance_types(10)),
        &unsatisfiable,
    );
    assert!(r.unschedulable.is_empty());
    assert_eq!(r.new_node_claims.len(), 1);
    assert_eq!(zone_of(&r.new_node_claims[0]), None);

    let mut inp = input(vec![node_pool("default")], instance_types(10));
    inp.options.preference_policy = PreferencePolicy::Ignore;
    let r = solve(inp, &pods);
    assert_eq!(zone_of(&r.new_node_claims[0]), None, "preference ignored");
}

fn spread_pod(name: &str, when: WhenUnsatisfiable) -> Pod {
    let mut p = pod(name, "1", "1Gi");
    p.labels = labels(&[("app", "web")]).into();
    p.node_selector = Requirements::from_labels(&labels(&[(ZONE, FAKE_ZONES[0])]));
    let mut c =
        TopologySpreadConstraint::new(ZONE, 1, LabelSelector::from_labels([("app", "web")]));
    c.min_domains = Some(3);
    c.when_unsatisfiable = when;
    p.topology_spread = vec![c];
    p
}

fn crowded_zone_input(policy: PreferencePolicy) -> SchedulerInput {
    let mut inp = input(vec![node_pool("default")], instance_types(10));
    let mut node = existing_node("full", FAKE_ZONES[0], "100m", "default");
    let web = BoundPod {
        namespace: "default".into(),
        labels: labels(&[("app", "web")]).into(),
        ..Default::default()
    };
    node.pods = vec![Arc::new(web.clone()), Arc::new(web)];
    inp.existing_nodes = vec![node];
    inp.options.preference_policy = policy;
    inp
}

#[test]
fn schedule_anyway_spread_is_relaxed_but_do_not_schedule_is_not() {
    // Behaviour 14: zone 1 already has 2 matching pods and minDomains 3 makes the minimum 0.
    let r = solve(
        crowded_zone_input(PreferencePolicy::Respect),
        &[spread_pod("strict", WhenUnsatisfiable::DoNotSchedule)],
    );
    assert!(r.new_node_claims.is_empty());
    let reason = &r.unschedulable[0].reason;
    assert!(
        reason.contains("unsatisfiable topology constraint for topology spread"),
        "{reason}"
    );
    let r = solve(
        crowded_zone_input(PreferencePolicy::Respect),
        &[spread_pod("soft", WhenUnsatisfiable::ScheduleAnyway)],
    );
    assert!(r.unschedulable.is_empty());
    assert_eq!(r.new_node_claims.len(), 1);
}

fn family_types() -> Vec<Arc<InstanceType>> {
    // Families a, b, c; only a and b have a 16-CPU size.
    let mut out = Vec::new();
    for (family, sizes) in [("a", vec![2, 16]), ("b", vec![2, 16]), ("c", vec![2])] {
        for cpu in sizes {
            let capacity = Resources::from_literals(&[
                ("cpu", &cpu.to_string()),
                ("memory", "64Gi"),
                ("pods", "110"),
            ]);
            let price = fixtures::price_from_resources(&capacity);
            let mut it = fixtures::instance_type(
                &format!("{family}.{cpu}"),
                capacity,
                fixtures::default_offerings(price),
            );
            it.requirements
                .set(Requirement::in_values("family", [family]));
            out.push(Arc::new(it));
        }
    }
    out
}

#[test]
fn min_values_strict_blocks_and_best_effort_relaxes() {
    // Behaviour 15.
    let mut pool = node_pool("families");
    pool.requirements = Requirements::from_requirements([Requirement::new(
        "family",
        Operator::In,
        ["a", "b", "c"],
    )
    .unwrap()
    .with_min_values(Some(3))]);
    let small = [pod("small", "1", "1Gi")];
    let r = solve(input(vec![pool.clone()], family_types()), &small);
    assert!(r.unschedulable.is_empty());
    let families: std::collections::BTreeSet<&str> = r.new_node_claims[0]
        .instance_types
        .iter()
        .map(|it| it.name.split('.').next().unwrap())
        .collect();
    assert_eq!(families.len(), 3);

    let big = [pod("big", "8", "1Gi")];
    let r = solve(input(vec![pool.clone()], family_types()), &big);
    assert!(r.new_node_claims.is_empty());
    assert!(
        r.unschedulable[0].reason.contains("minValues"),
        "{}",
        r.unschedulable[0].reason
    );

    let mut inp = input(vec![pool], family_types());
    inp.options.min_values_policy = MinValuesPolicy::BestEffort;
    let r = solve(inp, &big);
    assert_eq!(r.new_node_claims.len(), 1);
    let claim = &r.new_node_claims[0];
    assert!(claim.min_values_relaxed);
    assert_eq!(
        claim.requirements.get("family").unwrap().min_values(),
        Some(2)
    );
}

#[test]
fn pods_refusing_karpenter_nodes_are_ignored_without_error() {
    // Behaviour 16.
    let mut p = pod("p", "1", "1Gi");
    p.node_selector = Requirements::from_requirements([Requirement::does_not_exist(NODE_POOL)]);
    let r = solve(input(vec![node_pool("default")], instance_types(10)), &[p]);
    assert_eq!(r.ignored, vec![0]);
    assert!(r.unschedulable.is_empty());
    assert!(r.new_node_claims.is_empty());
}

#[test]
fn volume_zone_constrains_the_node_claim_zone() {
    // Behaviour 17 (engine part): a bound PV's zone narrows the NodeClaim.
    let mut p = pod("p", "1", "1Gi");
    p.volume_requirements = Some(Requirements::from_requirements([Requirement::in_values(
        ZONE,
        [FAKE_ZONES[2]],
    )]));
    let r = solve(input(vec![node_pool("default")], instance_types(10)), &[p]);
    let claim = &r.new_node_claims[0];
    assert_eq!(zone_of(claim), Some(FAKE_ZONES[2]));
    // Zone 3 only has on-demand offerings.
    assert_eq!(
        claim.requirements.get(CAPACITY_TYPE).unwrap().values(),
        ["on-demand"]
    );
}

#[test]
fn untolerated_taint_is_named_and_prefer_no_schedule_is_relaxed() {
    let mut hard = node_pool("hard");
    hard.taints = vec![Taint::new("dedicated", "db", TaintEffect::NoSchedule)];
    let r = solve(
        input(vec![hard], instance_types(10)),
        &[pod("p", "1", "1Gi")],
    );
    assert!(
        r.unschedulable[0]
            .reason
            .contains("did not tolerate taint dedicated=db:NoSchedule"),
        "{}",
        r.unschedulable[0].reason
    );
    let mut soft = node_pool("soft");
    soft.taints = vec![Taint::new("spot", "", TaintEffect::PreferNoSchedule)];
    soft.startup_taints = vec![Taint::new("init", "", TaintEffect::NoSchedule)];
    let r = solve(
        input(vec![soft], instance_types(10)),
        &[pod("p", "1", "1Gi")],
    );
    assert!(r.unschedulable.is_empty());
    assert_eq!(r.new_node_claims.len(), 1);
}

#[test]
fn running_pods_anti_affinity_keeps_matching_pods_off_their_node() {
    let mut inp = input(vec![node_pool("default")], instance_types(10));
    let mut node = existing_node("n1", FAKE_ZONES[0], "8", "default");
    node.pods = vec![Arc::new(BoundPod {
        namespace: "default".into(),
        labels: labels(&[("app", "db")]).into(),
        required_anti_affinity: vec![PodAffinityTerm::new(
            LabelSelector::from_labels([("app", "web")]),
            HOSTNAME,
        )],
        ..Default::default()
    })];
    inp.existing_nodes = vec![node];
    let mut web = pod("web", "1", "1Gi");
    web.labels = labels(&[("app", "web")]).into();
    let other = pod("other", "1", "1Gi");
    let r = solve(inp, &[web, other]);
    assert_eq!(r.existing_nodes.len(), 1);
    assert_eq!(r.existing_nodes[0].pods, vec![1]);
    assert_eq!(r.new_node_claims.len(), 1);
    assert_eq!(r.new_node_claims[0].pods, vec![0]);
}

#[test]
fn no_node_pools_gives_a_clear_error() {
    let r = solve(SchedulerInput::default(), &[pod("p", "1", "1Gi")]);
    assert_eq!(r.unschedulable[0].reason, "no nodepools found");
}

#[test]
fn benchmark_mix_schedules_every_pod() {
    let pods = PodGenerator::new(42).diverse(500);
    let r = Scheduler::new(fixtures::benchmark_input(
        instance_types(400),
        SchedulerOptions::default(),
    ))
    .solve(&pods);
    assert!(r.unschedulable.is_empty(), "{:?}", r.unschedulable.first());
    assert_eq!(r.scheduled_pod_count(), 500);
    // 100 hostname anti-affine pods need at least 100 nodes.
    assert!(r.new_node_claims.len() >= 100);
    for c in &r.new_node_claims {
        for it in &c.instance_types {
            assert!(c.requests.fits_in(&it.allocatable()));
        }
    }
}

#[test]
fn hostname_spread_and_capacity_type_spread() {
    let selector = LabelSelector::from_labels([("app", "api")]);
    let pods: Vec<Pod> = (0..6)
        .map(|i| {
            let mut p = pod(&format!("api-{i}"), "100m", "128Mi");
            p.labels = labels(&[("app", "api")]).into();
            p.topology_spread = vec![
                TopologySpreadConstraint::new(HOSTNAME, 2, selector.clone()),
                TopologySpreadConstraint::new(CAPACITY_TYPE, 1, selector.clone()),
            ];
            p
        })
        .collect();
    let r = solve(input(vec![node_pool("default")], instance_types(10)), &pods);
    assert!(r.unschedulable.is_empty());
    // At most 2 per node: at least 3 nodes.
    assert!(r.new_node_claims.iter().all(|c| c.pods.len() <= 2));
    assert!(r.new_node_claims.len() >= 3);
    let mut per_capacity_type: BTreeMap<&str, usize> = BTreeMap::new();
    for c in &r.new_node_claims {
        let ct = c
            .requirements
            .get(CAPACITY_TYPE)
            .and_then(Requirement::single_value);
        *per_capacity_type.entry(ct.expect("pinned")).or_default() += c.pods.len();
    }
    let counts: Vec<usize> = per_capacity_type.values().copied().collect();
    assert_eq!(counts.len(), 2, "{per_capacity_type:?}");
    assert!(counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1);
}

#[test]
fn spread_counts_pods_already_running() {
    // Zone 1 already runs two matching pods: two new pods go to zones 2 and 3.
    let mut inp = input(vec![node_pool("default")], instance_types(10));
    let mut node = existing_node("busy", FAKE_ZONES[0], "100m", "default");
    let web = BoundPod {
        namespace: "default".into(),
        labels: labels(&[("app", "web")]).into(),
        ..Default::default()
    };
    node.pods = vec![Arc::new(web.clone()), Arc::new(web)];
    inp.existing_nodes = vec![node];
    let pods: Vec<Pod> = (0..2)
        .map(|i| {
            let mut p = pod(&format!("web-{i}"), "1", "1Gi");
            p.labels = labels(&[("app", "web")]).into();
            p.topology_spread = vec![TopologySpreadConstraint::new(
                ZONE,
                1,
                LabelSelector::from_labels([("app", "web")]),
            )];
            p
        })
        .collect();
    let r = solve(inp, &pods);
    let zones: std::collections::BTreeSet<_> = r.new_node_claims.iter().map(zone_of).collect();
    assert_eq!(
        zones,
        [Some(FAKE_ZONES[1]), Some(FAKE_ZONES[2])]
            .into_iter()
            .collect()
    );
}

#[test]
fn solve_is_repeatable_on_one_scheduler() {
    let pods = PodGenerator::new(9).diverse(200);
    let s = Scheduler::new(fixtures::benchmark_input(
        instance_types(100),
        SchedulerOptions::default(),
    ));
    let (a, b) = (s.solve(&pods), s.solve(&pods));
    assert_eq!(a.new_node_claims.len(), b.new_node_claims.len());
    let pods_of = |r: &Results| {
        r.new_node_claims
            .iter()
            .map(|c| c.pods.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(pods_of(&a), pods_of(&b));
}

#[test]
fn host_port_conflicts_split_pods_across_nodes() {
    let exporter = DaemonSetPod {
        name: "exporter".into(),
        host_ports: vec![model::HostPort::tcp(9100)],
        ..Default::default()
    };
    let web = |name: &str, port: i32| {
        let mut p = pod(name, "100m", "128Mi");
        p.host_ports = vec![model::HostPort::tcp(port)];
        p
    };
    let pods = [web("a", 80), web("b", 80), web("c", 9100)];
    let mut inp = input(vec![node_pool("default")], instance_types(10));
    inp.existing_nodes = vec![existing_node("n1", FAKE_ZONES[0], "8", "default")];
    inp.daemonsets = vec![exporter.clone()];
    let r = solve(inp, &pods);
    // a and c on the existing node (the exporter is not running there), b on a new NodeClaim.
    assert_eq!(r.existing_nodes[0].pods, vec![0, 2]);
    assert_eq!(r.new_node_claims.len(), 1);
    assert_eq!(r.new_node_claims[0].pods, vec![1]);
    assert!(r.unschedulable.is_empty());

    // Without the node, c cannot go anywhere: the exporter binds 9100 on every new node.
    let mut inp = input(vec![node_pool("default")], instance_types(10));
    inp.daemonsets = vec![exporter];
    let r = solve(inp, &pods);
    assert_eq!(r.new_node_claims.len(), 2);
    assert_eq!(r.unschedulable.len(), 1);
    assert_eq!(r.unschedulable[0].pod, 2);
    assert!(
        r.unschedulable[0].reason.contains("host port"),
        "{}",
        r.unschedulable[0].reason
    );
}

#[test]
fn daemons_selecting_initialized_nodes_count_on_new_nodes() {
    let mut inp = input(vec![node_pool("default")], instance_types(10));
    inp.daemonsets = vec![DaemonSetPod {
        name: "after-init".into(),
        requests: Resources::from_literals(&[("cpu", "300m")]),
        node_selector: Requirements::from_labels(&labels(&[("karpenter.sh/initialized", "true")])),
        ..Default::default()
    }];
    let r = solve(inp, &[pod("p", "1", "1Gi")]);
    assert_eq!(
        r.new_node_claims[0].daemon_overhead.cpu(),
        Quantity::parse("300m").unwrap()
    );
    assert!(
        r.new_node_claims[0]
            .requirements
            .get("karpenter.sh/initialized")
            .is_none()
    );
}

#[test]
fn node_claim_labels_take_one_value_per_custom_requirement() {
    let mut pool = node_pool("default");
    pool.labels = labels(&[("team", "a")]);
    pool.requirements = Requirements::from_requirements([
        Requirement::new("tier", Operator::In, ["gold", "silver"]).unwrap(),
        Requirement::new("generation", Operator::Gt, ["3"]).unwrap(),
    ]);
    let r = solve(
        input(vec![pool], instance_types(10)),
        &[pod("p", "1", "1Gi")],
    );
    let claim = &r.new_node_claims[0];
    let l = claim.labels(&fixtures::well_known_labels());
    assert_eq!(l.get("team").map(String::as_str), Some("a"));
    assert_eq!(l.get("tier").map(String::as_str), Some("gold"));
    assert_eq!(l.get("generation").map(String::as_str), Some("4"));
    assert_eq!(l.get(NODE_POOL).map(String::as_str), Some("default"));
    assert!(!l.contains_key(ZONE));
    assert!(!l.contains_key(HOSTNAME));
}

#[test]
fn default_spread_applies_only_to_labelled_pods_that_declare_none() {
    let web = |i: usize| {
        let mut p = pod(&format!("web-{i}"), "1", "1Gi");
        p.labels = labels(&[("app", "web")]).into();
        p
    };
    let pods: Vec<Pod> = (0..6).map(web).collect();
    let zones = |r: &Results| -> BTreeMap<String, usize> {
        let mut per_zone = BTreeMap::new();
        for c in &r.new_node_claims {
            *per_zone
                .entry(zone_of(c).unwrap_or("any").to_string())
                .or_default() += c.pods.len();
        }
        per_zone
    };
    let mut spread = input(vec![node_pool("default")], instance_types(50));
    spread.options.default_topology_spread = vec![TopologySpreadConstraint::new(
        ZONE,
        1,
        LabelSelector::default(),
    )];
    let r = solve(spread.clone(), &pods);
    assert!(r.unschedulable.is_empty());
    assert_eq!(
        zones(&r).values().copied().collect::<Vec<_>>(),
        [2, 2, 2],
        "{:?}",
        zones(&r)
    );
    // Without the default, nothing spreads them.
    let plain = solve(input(vec![node_pool("default")], instance_types(50)), &pods);
    assert!(zones(&plain).len() < 3, "{:?}", zones(&plain));
    // A pod with its own constraints keeps them; an unlabelled pod gets none.
    let mut own = web(9);
    own.topology_spread = vec![TopologySpreadConstraint::new(
        "kubernetes.io/hostname",
        1,
        LabelSelector::from_labels([("app", "web")]),
    )];
    let mut bare = pod("bare", "1", "1Gi");
    bare.labels = Default::default();
    let r = solve(spread, &[own, bare]);
    assert!(r.unschedulable.is_empty());
    assert_eq!(
        r.new_node_claims.len(),
        1,
        "both fit one node: no zone spread applied"
    );
}
