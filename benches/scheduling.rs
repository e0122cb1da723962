//! Scheduling benchmark with the shape of upstream Karpenter's `BenchmarkScheduling*`:
//! 400 synthetic instance types, the five-way "diverse pods" mix and the 4 000 "preference pods".
//!
//! Run with `cargo bench --bench scheduling`. Reports pods/sec, NodeClaims created and the peak
//! heap allocated during one solve (measured by a counting global allocator).
//! `SCHED_BENCH_SIZES=1,100` limits the sizes; `SCHED_BENCH_MIN_SECS` sets the time per case;
//! `SCHED_BENCH_ONLY=diverse|respect|ignore|exoscale` runs one group; `SCHED_BENCH_TSV=1` prints
//! `case pods nodes first_solve_seconds mean_solve_seconds` lines for scripts
//! (`hack/bench-compare.sh`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use karpenter_exoscale::scheduling::fixtures::{PodGenerator, benchmark_input, instance_types};
use std::sync::Arc;

use karpenter_exoscale::apis::ExoscaleNodeClass;
use karpenter_exoscale::catalogue::{Catalogue, Currency};
use karpenter_exoscale::providers::instance_types::build;
use karpenter_exoscale::providers::pricing::PriceBook;
use karpenter_exoscale::scheduling::{
    InstanceType, Pod, PreferencePolicy, Scheduler, SchedulerOptions,
};
use karpenter_exoscale::simulate::catalogue_types;

struct CountingAllocator;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: delegates every call to the system allocator and only adds atomic bookkeeping.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = CURRENT.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) };
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

struct Measurement {
    name: String,
    pods: usize,
    nodes: usize,
    min_nodes: usize,
    /// The first solve on a fresh scheduler (nothing cached yet).
    cold: Duration,
    per_solve: Duration,
    iterations: u32,
    peak_bytes: usize,
}

fn measure(name: &str, pods: &[Pod], policy: PreferencePolicy, min_time: Duration) -> Measurement {
    measure_on(name, instance_types(400), pods, policy, min_time)
}

fn measure_on(
    name: &str,
    types: Vec<Arc<InstanceType>>,
    pods: &[Pod],
    policy: PreferencePolicy,
    min_time: Duration,
) -> Measurement {
    let options = SchedulerOptions {
        preference_policy: policy,
        ..Default::default()
    };
    let min_nodes = node_lower_bound(&types, pods);
    let scheduler = Scheduler::new(benchmark_input(types, options));
    // One solve to check the outcome and measure memory.
    let base = CURRENT.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let cold_start = Instant::now();
    let results = scheduler.solve(pods);
    let cold = cold_start.elapsed();
    let peak_bytes = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    assert!(
        results.unschedulable.is_empty(),
        "{name}: {} pods unschedulable, first: {}",
        results.unschedulable.len(),
        results.unschedulable[0].reason
    );
    assert_eq!(results.scheduled_pod_count(), pods.len());
    let nodes = results.new_node_claims.len();
    drop(results);
    let start = Instant::now();
    let mut iterations = 0u32;
    while iterations == 0 || start.elapsed() < min_time {
        std::hint::black_box(scheduler.solve(std::hint::black_box(pods)));
        iterations += 1;
    }
    Measurement {
        name: name.to_string(),
        pods: pods.len(),
        nodes,
        min_nodes,
        cold,
        per_solve: start.elapsed() / iterations,
        iterations,
        peak_bytes,
    }
}

/// No solution can use fewer nodes: the summed requests over the largest type's allocatable
/// (per resource), and one node per hostname anti-affine pod.
fn node_lower_bound(types: &[Arc<InstanceType>], pods: &[Pod]) -> usize {
    let largest = types
        .iter()
        .map(|it| it.allocatable())
        .max_by_key(|a| a.cpu())
        .expect("types");
    let mut total = karpenter_exoscale::scheduling::Resources::new();
    for p in pods {
        total += &p.requests;
    }
    let by_resource = total
        .iter()
        .map(|(k, v)| {
            let cap = largest.get(k).milli().max(1);
            ((v.milli() + cap - 1) / cap) as usize
        })
        .max()
        .unwrap_or(0);
    let anti = pods
        .iter()
        .filter(|p| {
            p.pod_anti_affinity
                .iter()
                .any(|t| t.topology_key == "kubernetes.io/hostname")
        })
        .count();
    by_resource.max(anti)
}

/// Every type of the embedded catalogue in ch-gva-2, built as the instance-type provider does.
fn exoscale_types() -> Vec<Arc<InstanceType>> {
    let catalogue = Catalogue::embedded();
    let prices = PriceBook::from_catalogue(catalogue, Currency::Eur);
    let nodeclass: ExoscaleNodeClass = serde_json::from_value(serde_json::json!({
        "apiVersion": "karpenter.exoscale.com/v1", "kind": "ExoscaleNodeClass",
        "metadata": {"name": "bench"}, "spec": {"imageTemplateSelector": {}}
    }))
    .expect("nodeclass");
    catalogue_types(catalogue, "ch-gva-2")
        .iter()
        .map(|t| {
            let price = prices.price(&t.name(), t.shape()).per_hour;
            Arc::new(build(t, &nodeclass, "ch-gva-2", price, true).expect("instance type"))
        })
        .collect()
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this once with tiny sizes.
    let args: Vec<String> = std::env::args().collect();
    let quick = !args.iter().any(|a| a == "--bench");
    let sizes: Vec<usize> = match std::env::var("SCHED_BENCH_SIZES") {
        Ok(s) => s.split(',').filter_map(|x| x.trim().parse().ok()).collect(),
        Err(_) if quick => vec![1, 100],
        Err(_) => vec![1, 100, 1_000, 5_000, 20_000],
    };
    let min_time = Duration::from_secs_f64(
        std::env::var("SCHED_BENCH_MIN_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(if quick { 0.0 } else { 2.0 }),
    );
    let only = std::env::var("SCHED_BENCH_ONLY").ok();
    let run = |group: &str| only.as_deref().is_none_or(|o| o == group);
    let mut rows = Vec::new();
    if run("diverse") {
        for &n in &sizes {
            let pods = PodGenerator::new(42).diverse(n);
            rows.push(measure(
                &format!("diverse/{n}"),
                &pods,
                PreferencePolicy::Respect,
                min_time,
            ));
        }
    }
    let preference_count = if quick { 100 } else { 4_000 };
    let pods = PodGenerator::new(42).preference(preference_count);
    if run("respect") {
        rows.push(measure(
            &format!("preferences-respect/{preference_count}"),
            &pods,
            PreferencePolicy::Respect,
            min_time,
        ));
    }
    if run("ignore") {
        rows.push(measure(
            &format!("preferences-ignore/{preference_count}"),
            &pods,
            PreferencePolicy::Ignore,
            min_time,
        ));
    }
    // The real Exoscale catalogue (ch-gva-2, list prices, default NodeClass) with the same mix.
    if run("exoscale") {
        for &n in &sizes {
            let pods = PodGenerator::new(7).diverse(n);
            rows.push(measure_on(
                &format!("exoscale-diverse/{n}"),
                exoscale_types(),
                &pods,
                PreferencePolicy::Respect,
                min_time,
            ));
        }
    }
    if std::env::var("SCHED_BENCH_TSV").is_ok() {
        for m in rows {
            println!(
                "{}\t{}\t{}\t{:.9}\t{:.9}",
                m.name,
                m.pods,
                m.nodes,
                m.cold.as_secs_f64(),
                m.per_solve.as_secs_f64()
            );
        }
        return;
    }

    println!(
        "{:<28} {:>7} {:>7} {:>9} {:>12} {:>12} {:>12} {:>6} {:>12}",
        "case",
        "pods",
        "nodes",
        "min nodes",
        "first solve",
        "per solve",
        "pods/sec",
        "iters",
        "peak heap"
    );
    for m in rows {
        println!(
            "{:<28} {:>7} {:>7} {:>9} {:>12} {:>12} {:>12.0} {:>6} {:>9.1} MiB",
            m.name,
            m.pods,
            m.nodes,
            m.min_nodes,
            format!("{:.3?}", m.cold),
            format!("{:.3?}", m.per_solve),
            m.pods as f64 / m.per_solve.as_secs_f64(),
            m.iterations,
            m.peak_bytes as f64 / (1024.0 * 1024.0),
        );
    }
}
