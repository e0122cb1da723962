//! The readable (table) form of `explain pod` and `plan`.

use std::fmt::Write;

use super::{NodeExplanation, Plan, PlannedNode, PodExplanation, Verdict};

fn price(value: f64, currency: &str) -> String {
    format!("{value:.4} {currency}/h")
}

fn node_line(n: &PlannedNode, currency: &str) -> String {
    format!(
        "{} in nodepool {:?} at {} for {} pod(s) (compatible: {})",
        n.instance_type,
        n.nodepool,
        price(n.price_per_hour, currency),
        n.pods,
        n.instance_types.join(", ")
    )
}

pub fn render_pod(e: &PodExplanation) -> String {
    let mut out = String::new();
    let c = &e.currency;
    let _ = writeln!(out, "Pod {}", e.pod);
    match &e.verdict {
        Verdict::Bound {
            node,
            nodepool,
            instance_type,
            price_per_hour,
            consolidation_blocked_by,
            this_pod_blocks,
            landed_because,
        } => {
            let _ = writeln!(
                out,
                "  bound to node {node} (nodepool {}, type {}, {})",
                nodepool
                    .as_deref()
                    .unwrap_or("none: not managed by Karpenter"),
                instance_type.as_deref().unwrap_or("unknown"),
                price_per_hour.map_or("no list price".to_string(), |p| price(p, c)),
            );
            if landed_because.is_empty() {
                let _ = writeln!(
                    out,
                    "  it constrains no node: kube-scheduler chose this one by its scoring"
                );
            }
            for why in landed_because {
                let _ = writeln!(out, "  landed there: {why}");
            }
            match consolidation_blocked_by {
                None => {
                    let _ = writeln!(
                        out,
                        "  its node is a consolidation candidate: this pod may be moved"
                    );
                }
                Some(why) => {
                    let whose = if *this_pod_blocks {
                        "this pod keeps its node"
                    } else {
                        "its node is not disrupted"
                    };
                    let _ = writeln!(out, "  {whose}: {why}");
                }
            }
        }
        Verdict::ExistingNode { node } => {
            let _ = writeln!(
                out,
                "  pending; fits node {node} (existing or being launched)"
            );
        }
        Verdict::NewNode(n) => {
            let _ = writeln!(
                out,
                "  pending; a new node would be launched: {}",
                node_line(n, c)
            );
        }
        Verdict::Unschedulable { reason, nodepools } => {
            let _ = writeln!(out, "  pending; no node can be launched for it: {reason}");
            for p in nodepools {
                let _ = writeln!(out, "    nodepool {:?}: {}", p.nodepool, p.reason);
            }
        }
        Verdict::Invalid { reason } => {
            let _ = writeln!(out, "  cannot be simulated: {reason}");
        }
    }
    for w in &e.warnings {
        let _ = writeln!(out, "warning: {w}");
    }
    out
}

pub fn render_plan(p: &Plan) -> String {
    let mut out = String::new();
    let c = &p.currency;
    let _ = writeln!(out, "Provisioning");
    if p.launch.is_empty() {
        let _ = writeln!(out, "  nothing to launch");
    }
    for n in &p.launch {
        let _ = writeln!(out, "  launch {}", node_line(n, c));
    }
    if p.pods_nominated > 0 {
        let _ = writeln!(
            out,
            "  {} pod(s) fit existing or in-flight nodes",
            p.pods_nominated
        );
    }
    for u in &p.unschedulable {
        let _ = writeln!(out, "  cannot place {}: {}", u.pod, u.reason);
    }
    let _ = writeln!(out, "Disruption");
    match &p.disruption {
        None => {
            let _ = writeln!(out, "  nothing to do");
        }
        Some(d) => {
            let _ = writeln!(out, "  {} ({})", d.method, d.decision);
            for r in &d.remove {
                let _ = writeln!(
                    out,
                    "    remove {} ({}, {}) in nodepool {:?}",
                    r.node,
                    r.instance_type.as_deref().unwrap_or("unknown type"),
                    price(r.price_per_hour, c),
                    r.nodepool
                );
            }
            for n in &d.launch {
                let _ = writeln!(out, "    launch {}", node_line(n, c));
            }
            let _ = writeln!(
                out,
                "    saves {} ({:.2} {c} per 30-day month)",
                price(d.savings_per_hour, c),
                d.savings_per_month
            );
        }
    }
    let _ = writeln!(
        out,
        "Cost: {} node(s) at {} ({:.2} {c}/month) now, {} ({:.2} {c}/month) after",
        p.nodes,
        price(p.cost_per_hour, c),
        p.cost_per_month,
        price(p.cost_per_hour_after, c),
        p.cost_per_month_after
    );
    for w in &p.warnings {
        let _ = writeln!(out, "warning: {w}");
    }
    out
}

pub fn render_node(e: &NodeExplanation) -> String {
    let mut out = String::new();
    let c = &e.currency;
    let _ = writeln!(
        out,
        "Node {}{}",
        e.node,
        e.nodeclaim
            .as_ref()
            .map(|n| format!(" (nodeclaim {n})"))
            .unwrap_or_default()
    );
    let _ = writeln!(
        out,
        "  nodepool {}, type {}, {}",
        e.nodepool
            .as_deref()
            .unwrap_or("none: not managed by Karpenter"),
        e.instance_type.as_deref().unwrap_or("unknown"),
        e.price_per_hour
            .map_or("no list price".to_string(), |p| price(p, c))
    );
    let used: Vec<String> = e
        .utilisation
        .iter()
        .map(|(r, u)| format!("{r} {:.0} %", u * 100.0))
        .collect();
    let _ = writeln!(out, "  {} pod(s); requested: {}", e.pods, used.join(", "));
    let _ = writeln!(
        out,
        "  drift: {}",
        e.drifted.as_deref().unwrap_or("not drifted")
    );
    for m in &e.methods {
        let _ = writeln!(out, "  {}: {}", m.method, m.detail);
    }
    for w in &e.warnings {
        let _ = writeln!(out, "warning: {w}");
    }
    out
}
