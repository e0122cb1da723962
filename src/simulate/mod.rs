//! `karpenter-exoscale simulate`: which nodes would be launched for a set of manifests, using the
//! same scheduler, instance-type pipeline and NodeClaim builder as the controller, without a
//! cluster or credentials. The JSON output is a stable contract.

mod cloud;
mod input;
pub mod manifests;
mod output;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use thiserror::Error;

use kube::ResourceExt;

use crate::apis::{ExoscaleNodeClass, ExoscaleNodeClassSpec, NodeOverlay};
use crate::catalogue::{Catalogue, Currency};
use crate::cloudprovider::overlay::{self, WithOverlays};
use crate::operator::metrics::Metrics;
use crate::providers::instance_types::{self, DiscoveredType};
use crate::providers::pricing::{PriceBook, PriceSource};
use crate::provisioning::input::{self as cluster_input, PodsToPlace};
use crate::scheduling::{Scheduler, SchedulerOptions, convert};
use crate::state::{ClusterIndex, HeldPod};

use cloud::CatalogueCloud;
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

/// Runs the simulation over already loaded manifests: they are loaded into a cluster index and
/// go through the same adapter as a provisioning round (`provisioning::input::prepare`), with
/// instance types from the embedded catalogue and the manifests' NodeOverlays applied.
pub fn simulate(m: &Manifests, zone: &str, currency: &str) -> Result<Report, SimulateError> {
    let currency = zone_and_currency(zone, currency)?;
    let mut warnings = m.warnings.clone();
    let index = cluster_index(m, &mut warnings);
    let (cloud, estimated) = catalogue_cloud(
        &index,
        &m.node_classes,
        &m.overlays,
        zone,
        currency,
        None,
        &mut warnings,
    )?;
    let (pools, failed) = futures::executor::block_on(cluster_input::pools_with_types(
        &cloud,
        &Metrics::new(),
        index.nodepools(),
    ));
    for (pool, error) in failed {
        warnings.push(format!("NodePool {} skipped: {error}", pool.name_any()));
    }

    let pending: Vec<Arc<HeldPod>> = m
        .pending_pods
        .iter()
        .cloned()
        .map(|p| Arc::new(HeldPod::from(p)))
        .collect();
    let defaults = SchedulerOptions::default();
    let prepared = cluster_input::prepare(
        &index,
        pools,
        cluster_input::scheduler_options(
            defaults.preference_policy,
            defaults.min_values_policy,
            &defaults.default_topology_spread,
            defaults.ignore_dra_requests,
        ),
        PodsToPlace::These(pending),
    );
    if let Some(first) = prepared.left_out.first() {
        return Err(SimulateError::Invalid(first.clone()));
    }
    for (pool, why) in &prepared.skipped_pools {
        warnings.push(format!("NodePool {pool} skipped: {why}"));
    }
    let unschedulable = prepared
        .invalid
        .iter()
        .map(|(object, reason)| {
            // A pod the scheduler cannot read is invalid; one whose volumes rule out every new
            // node is a valid pod that cannot be placed.
            let invalid = convert::pod_from_k8s(object).is_err();
            UnschedulableReport {
                pod: output::pod_id(object),
                reason: if invalid {
                    format!("invalid pod: {reason}")
                } else {
                    reason.clone()
                },
                invalid,
            }
        })
        .collect();
    let pod_ids: Vec<String> = prepared
        .pods
        .iter()
        .map(|p| output::pod_id(&p.object))
        .collect();
    let pods: Vec<_> = prepared.pods.into_iter().map(|p| p.pod).collect();

    let scheduler = Scheduler::new(prepared.input);
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

/// Checks that the catalogue knows `zone` and parses `currency`.
pub fn zone_and_currency(zone: &str, currency: &str) -> Result<Currency, SimulateError> {
    let catalogue = Catalogue::embedded();
    if !catalogue.zones().iter().any(|z| z == zone) {
        return Err(SimulateError::UnknownZone {
            zone: zone.to_string(),
            known: catalogue.zones().join(", "),
        });
    }
    currency
        .parse()
        .map_err(|_| SimulateError::UnknownCurrency(currency.to_string()))
}

/// The cloud `simulate`, `explain` and `plan` ask: the embedded catalogue's types of `zone` at
/// list prices in `currency`, built for each ExoscaleNodeClass the NodePools of `index`
/// reference (one not among `node_classes` gets the defaults, with a warning), behind the
/// `WithOverlays` decorator with `overlays`. `discovered` replaces the catalogue's types (the
/// ones an Exoscale account is authorized for, read from the API). Also returns the types whose
/// price is estimated.
pub fn catalogue_cloud(
    index: &ClusterIndex,
    node_classes: &[ExoscaleNodeClass],
    overlays: &[NodeOverlay],
    zone: &str,
    currency: Currency,
    discovered: Option<Vec<DiscoveredType>>,
    warnings: &mut Vec<String>,
) -> Result<(WithOverlays, std::collections::BTreeSet<String>), SimulateError> {
    let prices = PriceBook::from_catalogue(Catalogue::embedded(), currency);
    let discovered = discovered.unwrap_or_else(|| catalogue_types(Catalogue::embedded(), zone));
    let classes: HashMap<String, &ExoscaleNodeClass> = node_classes
        .iter()
        .map(|c| (c.metadata.name.clone().unwrap_or_default(), c))
        .collect();
    // Each referenced ExoscaleNodeClass's instance types from the catalogue at list prices.
    let mut estimated = std::collections::BTreeSet::new();
    let mut types_by_class = HashMap::new();
    for pool in index.nodepools() {
        let name = pool.name_any();
        let class_name = pool.spec.template.spec.node_class_ref.name.clone();
        let default_class;
        let class = match classes.get(&class_name) {
            Some(c) => *c,
            None => {
                warnings.push(format!(
                    "NodePool {name} references ExoscaleNodeClass {class_name}, which is not known; simulating its defaults"
                ));
                default_class = default_nodeclass(&class_name);
                &default_class
            }
        };
        if types_by_class.contains_key(&class_name) {
            continue;
        }
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
        types_by_class.insert(class_name, types);
    }
    // The controller skips an invalid NodeOverlay (its status says why); simulate refuses it.
    for o in overlays {
        overlay::validate(o).map_err(|e| SimulateError::Invalid(e.to_string()))?;
    }
    let overlays: Vec<Arc<_>> = overlays.iter().cloned().map(Arc::new).collect();
    let cloud = WithOverlays::new(
        Arc::new(CatalogueCloud {
            types_by_class,
            node_classes: classes
                .iter()
                .map(|(name, c)| (name.clone(), (*c).clone()))
                .collect(),
        }),
        Arc::new(move || overlays.clone()),
    );
    Ok((cloud, estimated))
}

/// The manifests as the controller's cluster index would hold them. Pods bound to a Node the
/// manifests do not describe are left out with a warning.
fn cluster_index(m: &Manifests, warnings: &mut Vec<String>) -> ClusterIndex {
    let mut index = ClusterIndex::default();
    for node in &m.nodes {
        index.apply_node(node.clone());
    }
    for pod in &m.bound_pods {
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        if index.node(&node).is_none() {
            let name = pod.metadata.name.clone().unwrap_or_default();
            warnings.push(format!(
                "pod {name} is bound to node {node}, which is not in the manifests; ignored"
            ));
            continue;
        }
        index.apply_pod(pod.clone());
    }
    for ds in &m.daemon_sets {
        index.apply_daemonset(ds.clone());
    }
    for pool in &m.node_pools {
        index.apply_nodepool(with_ready_condition(pool.clone()));
    }
    index
}

/// A NodePool from a manifest has no status, and provisioning launches only from Ready ones.
/// The loader has refused invalid NodePools and the catalogue stands in for the NodeClass, so
/// it is taken as Ready, as the NodePool controller would mark it. A status the manifest
/// carries is kept.
fn with_ready_condition(mut pool: crate::apis::NodePool) -> crate::apis::NodePool {
    use crate::apis::ConditionsExt;
    use crate::apis::labels::conditions::READY;
    let status = pool.status.as_ref();
    if status.is_none_or(|s| s.conditions.get_condition(READY).is_none()) {
        pool.set_ready_condition(crate::apis::ConditionStatus::True, READY, "");
    }
    pool
}

#[cfg(test)]
mod tests;
