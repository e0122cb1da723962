//! Consolidation decision time on clusters of 100 and 1 000 nodes with 10 pods each.
//!
//! Run with `cargo bench --bench consolidation`. Cases:
//! - `single-node scan, packed (no-op)`: every node is full, so single-node consolidation
//!   simulates every candidate and finds nothing; no other node can take a pod, which the
//!   simulation notices and leaves those nodes out of the scheduler.
//! - `single-node scan, fragmented (no-op)`: every node has room for small pods but not for
//!   each node's one big pod: every simulation includes every node and needs a new node that
//!   is not cheaper. The worst case of a full scan without topology constraints.
//! - `single-node scan, frag.+spread`: the same with a zonal topology spread on every pod, so
//!   each simulation solves on every node, as is: the loop's one whole-cluster scheduler with
//!   the candidate excluded (`Scheduler::solve_excluding`).
//! - `full loop (no-op)`: all four methods on the packed cluster (multi-node binary search
//!   over up to 100 candidates, then the single-node scan).
//! - `full loop (consolidates)`: an under-used cluster; the loop stops at the first command.
//!
//! `CONS_BENCH_SIZES=100` limits the sizes; `CONS_BENCH_MIN_SECS` sets the time per case.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{TimeZone, Utc};

use karpenter_exoscale::disruption::command::Method;
use karpenter_exoscale::disruption::fixtures::{instance_type, pod, uniform_cluster};
use karpenter_exoscale::disruption::methods::{decide, run_method};
use karpenter_exoscale::disruption::model::ClusterView;
use karpenter_exoscale::disruption::simulate::SimulationBase;
use karpenter_exoscale::scheduling::labels::ZONE;
use karpenter_exoscale::scheduling::{LabelSelector, TopologySpreadConstraint};

struct Case {
    name: &'static str,
    nodes: usize,
    per_run: Duration,
    iterations: u32,
    outcome: String,
}

fn measure(min: Duration, mut f: impl FnMut() -> String) -> (Duration, u32, String) {
    let mut outcome = f();
    let start = Instant::now();
    let mut iterations = 0u32;
    while iterations < 2 || start.elapsed() < min {
        outcome = f();
        iterations += 1;
    }
    (start.elapsed() / iterations, iterations, outcome)
}

/// 10 pods of 180m on medium nodes (1.9 CPU allocatable): nothing fits elsewhere and no
/// cheaper type holds them.
fn packed(nodes: usize) -> ClusterView {
    let now = Utc.with_ymd_and_hms(2026, 3, 10, 12, 0, 0).unwrap();
    uniform_cluster(now, nodes, 10, &instance_type("medium", 2), "180m", "128Mi")
}

/// Per medium node one 1200m pod and nine 50m pods: 250m free everywhere.
fn fragmented(nodes: usize) -> ClusterView {
    let mut view = packed(nodes);
    for n in &mut view.nodes {
        let name = n.name.clone();
        for (i, p) in n.pods.iter_mut().enumerate() {
            let cpu = if i == 0 { "1200m" } else { "50m" };
            *p = pod(&format!("{name}-{i}"), cpu, "128Mi");
            Arc::make_mut(&mut n.scheduling.pods[i]).requests = p.pod.requests.clone();
        }
    }
    view
}

/// As `fragmented`, with a zonal topology spread on every pod: the simulation must see
/// every node as it is (no pruning or folding).
fn fragmented_spread(nodes: usize) -> ClusterView {
    let mut view = fragmented(nodes);
    for n in &mut view.nodes {
        for (p, bound) in n.pods.iter_mut().zip(n.scheduling.pods.iter_mut()) {
            let pod = Arc::make_mut(&mut p.pod);
            Arc::make_mut(&mut pod.labels).insert("app".into(), "web".into());
            Arc::make_mut(bound).labels = pod.labels.clone();
            pod.topology_spread = vec![TopologySpreadConstraint::new(
                ZONE,
                1,
                LabelSelector::from_labels([("app", "web")]),
            )];
        }
    }
    view
}

/// 10 pods of 100m on large nodes (3.9 CPU allocatable): plenty to consolidate.
fn underused(nodes: usize) -> ClusterView {
    let now = Utc.with_ymd_and_hms(2026, 3, 10, 12, 0, 0).unwrap();
    uniform_cluster(now, nodes, 10, &instance_type("large", 4), "100m", "128Mi")
}

fn describe(command: Option<&karpenter_exoscale::disruption::command::Command>) -> String {
    match command {
        None => "no command".into(),
        Some(c) => format!(
            "{:?} {} of {} node(s), {} replacement(s)",
            c.method,
            c.decision().as_str(),
            c.candidates.len(),
            c.replacements.len()
        ),
    }
}

fn main() {
    let sizes: Vec<usize> = std::env::var("CONS_BENCH_SIZES")
        .ok()
        .map(|s| s.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![100, 1000]);
    let min = Duration::from_secs_f64(
        std::env::var("CONS_BENCH_MIN_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(3.0),
    );
    let never = || false;
    let mut cases = Vec::new();
    let scan = |view: &ClusterView| {
        let base = SimulationBase::new(view);
        let o = run_method(&base, Method::SingleNodeConsolidation, &never);
        let unconsolidatable = o.events.len();
        format!(
            "{}, {unconsolidatable} Unconsolidatable",
            describe(o.command.as_ref())
        )
    };
    for &n in &sizes {
        let view = packed(n);
        let (per_run, iterations, outcome) = measure(min, || scan(&view));
        cases.push(Case {
            name: "single-node scan, packed",
            nodes: n,
            per_run,
            iterations,
            outcome,
        });
        let fragmented_view = fragmented(n);
        let (per_run, iterations, outcome) = measure(min, || scan(&fragmented_view));
        cases.push(Case {
            name: "single-node scan, fragmented",
            nodes: n,
            per_run,
            iterations,
            outcome,
        });
        let spread_view = fragmented_spread(n);
        let (per_run, iterations, outcome) = measure(min, || scan(&spread_view));
        cases.push(Case {
            name: "single-node scan, frag.+spread",
            nodes: n,
            per_run,
            iterations,
            outcome,
        });

        let (per_run, iterations, outcome) =
            measure(min, || describe(decide(&view, &never).command.as_ref()));
        cases.push(Case {
            name: "full loop, packed",
            nodes: n,
            per_run,
            iterations,
            outcome,
        });

        let (per_run, iterations, outcome) = measure(min, || {
            describe(decide(&fragmented_view, &never).command.as_ref())
        });
        cases.push(Case {
            name: "full loop, fragmented",
            nodes: n,
            per_run,
            iterations,
            outcome,
        });

        let view = underused(n);
        let (per_run, iterations, outcome) =
            measure(min, || describe(decide(&view, &never).command.as_ref()));
        cases.push(Case {
            name: "full loop, under-used",
            nodes: n,
            per_run,
            iterations,
            outcome,
        });
    }
    println!(
        "{:<30} {:>6} {:>7} {:>12} {:>6}  outcome",
        "case", "nodes", "pods", "time/run", "runs"
    );
    for c in &cases {
        println!(
            "{:<30} {:>6} {:>7} {:>10.1}ms {:>6}  {}",
            c.name,
            c.nodes,
            c.nodes * 10,
            c.per_run.as_secs_f64() * 1000.0,
            c.iterations,
            c.outcome
        );
    }
}
