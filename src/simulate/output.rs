//! The simulation report: a stable JSON shape (`-o json`) and a table for people.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde::{Deserialize, Serialize};

use crate::apis::NodePool;
use crate::catalogue::Currency;
use crate::provisioning::template::resource_list;
use crate::scheduling::{NewNodeClaim, Results};
use crate::state::HeldPod;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub zone: String,
    pub currency: String,
    pub node_claims: Vec<NodeClaimReport>,
    pub existing_nodes: Vec<ExistingNodeReport>,
    pub unschedulable: Vec<UnschedulableReport>,
    pub total_price_per_hour: f64,
    /// Not part of the stable contract's required keys; tells what was skipped or estimated.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeClaimReport {
    pub node_pool: String,
    /// The cheapest option: what a launch would pick.
    pub instance_type: String,
    pub instance_type_options: Vec<String>,
    pub zone: String,
    pub capacity_type: String,
    pub price_per_hour: f64,
    pub pods: Vec<String>,
    pub requests: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExistingNodeReport {
    pub name: String,
    pub pods: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UnschedulableReport {
    pub pod: String,
    pub reason: String,
    /// The pod has a value the API server would refuse (a negative request, `maxSkew: 0`, …);
    /// `simulate` exits non-zero unless `--allow-invalid-pods`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub invalid: bool,
}

impl Report {
    /// How many pods were refused as invalid rather than found no room.
    pub fn invalid_pods(&self) -> usize {
        self.unschedulable.iter().filter(|u| u.invalid).count()
    }
}

/// Prices rounded like the list prices (8 decimals) so the JSON carries no float noise.
fn round_price(p: f64) -> f64 {
    // `+ 0.0` turns the -0.0 of an empty sum into 0.0, so nothing prints `-0`.
    (p * 1e8).round() / 1e8 + 0.0
}

/// Text from manifests for a terminal: control characters (escape sequences, carriage
/// returns, newlines) are shown escaped, so an object name cannot rewrite what is printed.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(text);
    }
    std::borrow::Cow::Owned(
        text.chars()
            .map(|c| {
                if c.is_control() {
                    c.escape_default().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect(),
    )
}

/// `namespace/name`, with `default` for a missing namespace.
pub fn pod_id(pod: &HeldPod) -> String {
    let namespace = pod
        .metadata
        .namespace
        .as_deref()
        .filter(|n| !n.is_empty())
        .unwrap_or("default");
    format!(
        "{namespace}/{}",
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

fn claim_report(claim: &NewNodeClaim, pod_ids: &[String]) -> NodeClaimReport {
    // The launch picks the cheapest available offering the requirements allow.
    let cheapest = claim.instance_types.iter().find_map(|it| {
        it.offerings
            .iter()
            .filter(|o| o.available && o.compatible(&claim.requirements))
            .min_by(|a, b| a.price.total_cmp(&b.price))
            .map(|o| (it.name.clone(), o.clone()))
    });
    let (instance_type, zone, capacity_type, price) = match cheapest {
        Some((name, o)) => (name, o.zone, o.capacity_type, o.price),
        None => (String::new(), String::new(), String::new(), 0.0),
    };
    NodeClaimReport {
        node_pool: claim.node_pool.clone(),
        instance_type,
        instance_type_options: claim
            .instance_types
            .iter()
            .map(|t| t.name.clone())
            .collect(),
        zone,
        capacity_type,
        price_per_hour: round_price(price),
        pods: claim.pods.iter().map(|&i| pod_ids[i].clone()).collect(),
        requests: resource_list(&claim.requests)
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .collect(),
    }
}

pub(super) fn report(
    zone: &str,
    currency: Currency,
    results: &Results,
    pod_ids: &[String],
    _pools: &BTreeMap<String, &NodePool>,
    mut unschedulable: Vec<UnschedulableReport>,
    warnings: Vec<String>,
) -> Report {
    let node_claims: Vec<NodeClaimReport> = results
        .new_node_claims
        .iter()
        .map(|c| claim_report(c, pod_ids))
        .collect();
    let existing_nodes = results
        .existing_nodes
        .iter()
        .map(|n| ExistingNodeReport {
            name: n.node_name.clone(),
            pods: n.pods.iter().map(|&i| pod_ids[i].clone()).collect(),
        })
        .collect();
    unschedulable.extend(results.unschedulable.iter().map(|u| UnschedulableReport {
        pod: pod_ids[u.pod].clone(),
        reason: u.reason.clone(),
        invalid: false,
    }));
    let total = node_claims.iter().map(|c| c.price_per_hour).sum::<f64>();
    Report {
        zone: zone.to_string(),
        currency: currency.to_string(),
        node_claims,
        existing_nodes,
        unschedulable,
        total_price_per_hour: round_price(total),
        warnings,
    }
}

/// The report for people.
pub fn render_table(r: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "Zone {}, prices in {} per hour", r.zone, r.currency);
    if r.node_claims.is_empty() {
        let _ = writeln!(out, "\nNo new nodes needed.");
    } else {
        let _ = writeln!(out, "\nNew nodes ({}):", r.node_claims.len());
        let _ = writeln!(
            out,
            "  {:<14} {:<22} {:>9} {:>5} {:<28} PODS",
            "NODEPOOL", "INSTANCE TYPE", "PRICE/H", "OPTS", "REQUESTS"
        );
        for c in &r.node_claims {
            let requests: Vec<String> = c
                .requests
                .iter()
                .map(|(k, v)| printable(&format!("{k}={v}")).into_owned())
                .collect();
            let pods: Vec<_> = c.pods.iter().map(|p| printable(p)).collect();
            let _ = writeln!(
                out,
                "  {:<14} {:<22} {:>9.5} {:>5} {:<28} {}",
                printable(&c.node_pool),
                printable(&c.instance_type),
                c.price_per_hour,
                c.instance_type_options.len(),
                requests.join(","),
                pods.join(" ")
            );
        }
    }
    if !r.existing_nodes.is_empty() {
        let _ = writeln!(out, "\nPods placed on existing nodes:");
        for n in &r.existing_nodes {
            let pods: Vec<_> = n.pods.iter().map(|p| printable(p)).collect();
            let _ = writeln!(out, "  {:<30} {}", printable(&n.name), pods.join(" "));
        }
    }
    if !r.unschedulable.is_empty() {
        let _ = writeln!(out, "\nUnschedulable pods ({}):", r.unschedulable.len());
        for u in &r.unschedulable {
            let _ = writeln!(out, "  {}: {}", printable(&u.pod), printable(&u.reason));
        }
    }
    let _ = writeln!(
        out,
        "\nTotal: {:.5} {} per hour for new nodes",
        r.total_price_per_hour, r.currency
    );
    for w in &r.warnings {
        let _ = writeln!(out, "warning: {}", printable(w));
    }
    out
}
