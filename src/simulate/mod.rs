//! `karpenter-exoscale simulate`: which nodes would be launched for a set of manifests, using the
//! same scheduler, instance-type pipeline and NodeClaim builder as the controller, without a
//! cluster or credentials. The JSON output is a stable contract.

mod input;
pub mod manifests;
mod output;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use thiserror::Error;

use crate::apis::{ExoscaleNodeClass, ExoscaleNodeClassSpec, labels};
use crate::catalogue::{Catalogue, Currency};
use crate::cloudprovider::overlay;
use crate::providers::instance_types::{self, DiscoveredType};
use crate::providers::pricing::{PriceBook, PriceSource};
use crate::provisioning::template;
use crate::scheduling::convert;
use crate::scheduling::{
    Pod, Resources, Scheduler, SchedulerInput, SchedulerOptions, WellKnownLabels,
};

pub use manifests::{ManifestError, Manifests};
pub use output::{
    ExistingNodeReport, NodeClaimReport, Report, UnschedulableReport, printable, render_table,
};

#[derive(Debug, Error)]
pub enum SimulateError {
    #[error(transparent)]
    Manifests(#[from] ManifestError),
    #[error("unknown zone {zone:?}; the catalogue knows {known}")]
    UnknownZone { zone: String, known: String },
    #[error("unknown currency {0:?}: use EUR, CHF or USD")]
    UnknownCurrency(String),
    #[error("{0}")]
    Invalid(String),
}

#[derive(Debug, Clone)]
pub struct Options {
    pub paths: Vec<PathBuf>,
    pub zone: String,
    pub currency: String,
}

/// The built-in catalogue's types offered in `zone`, as the instance-type provider sees them.
/// Authorization is per account, so unauthorized (GPU) types are simulated too.
pub fn catalogue_types(catalogue: &Catalogue, zone: &str) -> Vec<DiscoveredType> {
    let mut types: Vec<DiscoveredType> = catalogue
        .instance_types_in_zone(zone)
        .map(|t| DiscoveredType {
            id: t.id.clone(),
            family: t.family.clone(),
            size: t.size.clone(),
            cpus: t.cpus,
            memory_bytes: t.memory,
            gpus: t.gpus,
        })
        .collect();
    types.sort_by_key(DiscoveredType::name);
    types
}

fn default_nodeclass(name: &str) -> ExoscaleNodeClass {
    let spec: ExoscaleNodeClassSpec =
        serde_json::from_value(serde_json::json!({"imageTemplateSelector": {}}))
            .expect("defaults deserialise");
    ExoscaleNodeClass::new(name, spec)
}

/// Runs the simulation over the manifests.
pub fn run(options: &Options) -> Result<Report, SimulateError> {
    let manifests = manifests::load(&options.paths)?;
    simulate(&manifests, &options.zone, &options.currency)
}

/// Runs the simulation over already loaded manifests.
pub fn simulate(m: &Manifests, zone: &str, currency: &str) -> Result<Report, SimulateError> {
    let catalogue = Catalogue::embedded();
    if !catalogue.zones().iter().any(|z| z == zone) {
        return Err(SimulateError::UnknownZone {
            zone: zone.to_string(),
            known: catalogue.zones().join(", "),
        });
    }
    let currency: Currency = currency
        .parse()
        .map_err(|_| SimulateError::UnknownCurrency(currency.to_string()))?;
    let prices = PriceBook::from_catalogue(catalogue, currency);
    let discovered = catalogue_types(catalogue, zone);
    let mut warnings = m.warnings.clone();

    let classes: HashMap<String, &ExoscaleNodeClass> = m
        .node_classes
        .iter()
        .map(|c| (c.metadata.name.clone().unwrap_or_default(), c))
        .collect();

    // Existing nodes, with the pods bound to them; their capacity counts against NodePool limits.
    let mut usage: HashMap<String, Resources> = HashMap::new();
    let mut existing_nodes = Vec::new();
    for node in &m.nodes {
        let name = node.metadata.name.clone().unwrap_or_default();
        let bound: Vec<_> = m
            .bound_pods
            .iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name.as_str()))
            .cloned()
            .collect();
        let existing = convert::existing_node_from_k8s(node, &bound, &[])
            .map_err(|e| SimulateError::Invalid(format!("Node {name}: {e}")))?;
        if let Some(pool) = &existing.node_pool {
            let capacity = node.status.as_ref().and_then(|s| s.capacity.as_ref());
            let entry = usage.entry(pool.clone()).or_default();
            for (resource, value) in capacity.into_iter().flatten() {
                if let Ok(q) = crate::scheduling::Quantity::parse(&value.0) {
                    entry.set(resource, entry.get(resource) + q);
                }
            }
            entry.set(
                "nodes",
                entry.get("nodes") + crate::scheduling::Quantity::from_units(1),
            );
        }
        existing_nodes.push(existing);
    }
    for pod in &m.bound_pods {
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        if !m
            .nodes
            .iter()
            .any(|n| n.metadata.name.as_deref() == Some(node.as_str()))
        {
            let name = pod.metadata.name.clone().unwrap_or_default();
            warnings.push(format!(
                "pod {name} is bound to node {node}, which is not in the manifests; ignored"
            ));
        }
    }

    let mut input = SchedulerInput {
        existing_nodes,
        options: SchedulerOptions {
            well_known_labels: WellKnownLabels::with_provider_labels(
                labels::WELL_KNOWN_LABELS.iter().copied(),
            ),
            ..SchedulerOptions::default()
        },
        ..SchedulerInput::default()
    };
    for ds in &m.daemon_sets {
        let name = ds.metadata.name.clone().unwrap_or_default();
        input.daemonsets.push(
            convert::daemonset_from_k8s(ds)
                .map_err(|e| SimulateError::Invalid(format!("DaemonSet {name}: {e}")))?,
        );
    }

    let mut estimated = std::collections::BTreeSet::new();
    for pool in &m.node_pools {
        let name = pool.metadata.name.clone().unwrap_or_default();
        let class_name = &pool.spec.template.spec.node_class_ref.name;
        let default_class;
        let class = match classes.get(class_name) {
            Some(c) => *c,
            None => {
                warnings.push(format!(
                    "NodePool {name} references ExoscaleNodeClass {class_name}, which is not in the manifests; simulating its defaults"
                ));
                default_class = default_nodeclass(class_name);
                &default_class
            }
        };
        let mut types = Vec::new();
        for t in &discovered {
            let price = prices.price(&t.name(), t.shape());
            if price.source == PriceSource::Estimated {
                estimated.insert(t.name());
            }
            let it = instance_types::build(t, class, zone, price.per_hour, true).map_err(|e| {
                SimulateError::Invalid(format!("ExoscaleNodeClass {class_name}: {e}"))
            })?;
            types.push(Arc::new(it));
        }
        let (types, _) = overlay::apply(&name, &pool.template_labels(), &types, &m.overlays)
            .map_err(|e| SimulateError::Invalid(e.to_string()))?;
        let template = template::nodepool_template(pool, usage.remove(&name).unwrap_or_default())
            .map_err(|e| SimulateError::Invalid(e.to_string()))?;
        input.node_pools.push(template);
        input.instance_types.insert(name, types);
    }

    let mut pods: Vec<Pod> = Vec::new();
    let mut pod_ids: Vec<String> = Vec::new();
    let mut unschedulable = Vec::new();
    for p in &m.pending_pods {
        let id = output::pod_id(p);
        match convert::pod_from_k8s(p) {
            Ok(pod) => {
                pods.push(pod);
                pod_ids.push(id);
            }
            Err(e) => unschedulable.push(UnschedulableReport {
                pod: id,
                reason: format!("invalid pod: {e}"),
                invalid: true,
            }),
        }
    }

    let scheduler = Scheduler::new(input);
    for skipped in scheduler.skipped_node_pools() {
        warnings.push(format!(
            "NodePool {} skipped: {}",
            skipped.name, skipped.reason
        ));
    }
    let results = scheduler.solve(&pods);
    let used_estimates: Vec<String> = results
        .new_node_claims
        .iter()
        .filter_map(|c| c.instance_types.first().map(|t| t.name.clone()))
        .filter(|n| estimated.contains(n))
        .collect();
    for name in used_estimates {
        warnings.push(format!(
            "{name} has no published list price; its price is an estimate"
        ));
    }
    let pools: BTreeMap<String, _> = m
        .node_pools
        .iter()
        .map(|p| (p.metadata.name.clone().unwrap_or_default(), p))
        .collect();
    Ok(output::report(
        zone,
        currency,
        &results,
        &pod_ids,
        &pools,
        unschedulable,
        warnings,
    ))
}

#[cfg(test)]
mod tests;
