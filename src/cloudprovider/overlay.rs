//! NodeOverlay application (upstream's overlay decorator, pure): for each (NodePool, instance
//! type, offering) the highest-weight matching overlay sets or adjusts the price; capacity
//! overlays add extended resources. Equal weights are ordered by name, descending.
//! [`WithOverlays`] decorates a provider with the overlays the cluster watch holds, so that
//! provisioning, consolidation, drift and `simulate` all see the same prices and capacity.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use thiserror::Error;

use crate::apis::labels::{NODEPOOL_LABEL, WELL_KNOWN_LABELS};
use crate::apis::{NodeClaim, NodeClassReference, NodeOverlay, NodePool};
use crate::providers::pricing::{PricingError, apply_price_adjustment, parse_overlay_price};
use crate::scheduling::labels::{CAPACITY_TYPE, ZONE};
use crate::scheduling::{
    InstanceType, Quantity, Requirement, RequirementError, Requirements, WellKnownLabels,
};

use super::{
    CloudProvider, DriftReason, NodeClassKind, NodeClassState, Ownership, RepairPolicy,
    Result as ProviderResult, requirements_from_api,
};

#[derive(Debug, Error, Clone, PartialEq)]
pub enum OverlayError {
    #[error("NodeOverlay {name}: {source}")]
    Requirements {
        name: String,
        source: RequirementError,
    },
    #[error("NodeOverlay {name}: {source}")]
    Price { name: String, source: PricingError },
    #[error("NodeOverlay {name}: capacity {resource}={value:?} is not a quantity")]
    Capacity {
        name: String,
        resource: String,
        value: String,
    },
}

struct Compiled<'a> {
    overlay: &'a NodeOverlay,
    name: String,
    requirements: Requirements,
}

/// What applying overlays changed, for the `*-overlay-applied` annotations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Types whose price an overlay changed.
    pub priced: Vec<String>,
    /// Types an overlay added capacity to.
    pub capacity: Vec<String>,
}

fn well_known() -> WellKnownLabels {
    WellKnownLabels::with_provider_labels(WELL_KNOWN_LABELS.iter().copied())
}

fn compile(overlays: &[NodeOverlay]) -> Result<Vec<Compiled<'_>>, OverlayError> {
    let mut out = overlays
        .iter()
        .map(|o| {
            let name = o.metadata.name.clone().unwrap_or_default();
            let requirements = requirements_from_api(&o.spec.requirements).map_err(|source| {
                OverlayError::Requirements {
                    name: name.clone(),
                    source,
                }
            })?;
            Ok(Compiled {
                overlay: o,
                name,
                requirements,
            })
        })
        .collect::<Result<Vec<_>, OverlayError>>()?;
    // Highest weight first; equal weights by name descending (upstream order).
    out.sort_by(|a, b| {
        b.overlay
            .spec
            .weight
            .unwrap_or(0)
            .cmp(&a.overlay.spec.weight.unwrap_or(0))
            .then_with(|| b.name.cmp(&a.name))
    });
    Ok(out)
}

/// Checks everything [`apply`] will parse: requirements, price, adjustment, capacity. An
/// overlay that fails is left out of every computation (upstream: `ValidationSucceeded=False`).
pub fn validate(overlay: &NodeOverlay) -> Result<(), OverlayError> {
    let name = overlay.metadata.name.clone().unwrap_or_default();
    requirements_from_api(&overlay.spec.requirements).map_err(|source| {
        OverlayError::Requirements {
            name: name.clone(),
            source,
        }
    })?;
    let price_error = |source| OverlayError::Price {
        name: name.clone(),
        source,
    };
    if let Some(price) = &overlay.spec.price {
        parse_overlay_price(price).map_err(price_error)?;
    }
    if let Some(adjustment) = &overlay.spec.price_adjustment {
        apply_price_adjustment(1.0, adjustment).map_err(price_error)?;
    }
    for (resource, value) in overlay.spec.capacity.iter().flatten() {
        Quantity::parse(&value.0).map_err(|_| OverlayError::Capacity {
            name: name.clone(),
            resource: resource.clone(),
            value: value.0.clone(),
        })?;
    }
    Ok(())
}

/// Where [`WithOverlays`] reads the current NodeOverlays (the cluster watch in `run`).
pub type OverlaySource = Arc<dyn Fn() -> Vec<Arc<NodeOverlay>> + Send + Sync>;

/// A provider whose instance types carry the NodeOverlays of the moment; every other call goes
/// to the wrapped provider unchanged.
pub struct WithOverlays {
    inner: Arc<dyn CloudProvider>,
    overlays: OverlaySource,
}

impl WithOverlays {
    pub fn new(inner: Arc<dyn CloudProvider>, overlays: OverlaySource) -> Self {
        WithOverlays { inner, overlays }
    }
}

/// The valid overlays of `all`; each invalid one is left out (at debug level: this runs per
/// NodePool on every instance-type lookup, and the NodeOverlay status controller already
/// warns once when an overlay turns invalid).
fn valid_overlays(all: &[Arc<NodeOverlay>]) -> Vec<NodeOverlay> {
    all.iter()
        .filter(|o| match validate(o) {
            Ok(()) => true,
            Err(error) => {
                tracing::debug!(%error, "NodeOverlay ignored");
                false
            }
        })
        .map(|o| (**o).clone())
        .collect()
}

impl CloudProvider for WithOverlays {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn create<'a>(&'a self, nodeclaim: &'a NodeClaim) -> BoxFuture<'a, ProviderResult<NodeClaim>> {
        self.inner.create(nodeclaim)
    }
    fn delete<'a>(&'a self, nodeclaim: &'a NodeClaim) -> BoxFuture<'a, ProviderResult<()>> {
        self.inner.delete(nodeclaim)
    }
    fn get<'a>(&'a self, provider_id: &'a str) -> BoxFuture<'a, ProviderResult<NodeClaim>> {
        self.inner.get(provider_id)
    }
    fn list(&self) -> BoxFuture<'_, ProviderResult<Vec<NodeClaim>>> {
        self.inner.list()
    }
    fn instance_types<'a>(
        &'a self,
        nodepool: &'a NodePool,
    ) -> BoxFuture<'a, ProviderResult<Vec<Arc<InstanceType>>>> {
        Box::pin(async move {
            let types = self.inner.instance_types(nodepool).await?;
            let overlays = valid_overlays(&(self.overlays)());
            if overlays.is_empty() {
                return Ok(types);
            }
            let name = nodepool.metadata.name.as_deref().unwrap_or_default();
            match apply(name, &nodepool.template_labels(), &types, &overlays) {
                Ok((adjusted, _)) => Ok(adjusted),
                // Unreachable after validation; the unadjusted list is still right to use.
                Err(error) => {
                    tracing::warn!(nodepool = %name, %error, "NodeOverlays not applied");
                    Ok(types)
                }
            }
        })
    }
    fn is_drifted<'a>(
        &'a self,
        nodeclaim: &'a NodeClaim,
    ) -> BoxFuture<'a, ProviderResult<Option<DriftReason>>> {
        self.inner.is_drifted(nodeclaim)
    }
    fn repair_policies(&self) -> Vec<RepairPolicy> {
        self.inner.repair_policies()
    }
    fn supported_node_classes(&self) -> Vec<NodeClassKind> {
        self.inner.supported_node_classes()
    }
    fn nodeclass(&self, reference: &NodeClassReference) -> Option<NodeClassState> {
        self.inner.nodeclass(reference)
    }
    fn nodeclasses_synced(&self) -> bool {
        self.inner.nodeclasses_synced()
    }
    fn nodeclaim_created(&self, uid: &str) {
        self.inner.nodeclaim_created(uid)
    }
    fn ownership(&self, instance: &NodeClaim) -> Ownership {
        self.inner.ownership(instance)
    }
    fn adopt<'a>(&'a self, instance: &'a NodeClaim) -> BoxFuture<'a, ProviderResult<()>> {
        self.inner.adopt(instance)
    }
}

/// What an overlay's requirements are matched against, per offering of `it`: the type's labels,
/// the NodePool name and template labels, the offering's zone and capacity type.
fn offering_requirements(
    nodepool: &str,
    nodepool_labels: &BTreeMap<String, String>,
    it: &InstanceType,
) -> Vec<Requirements> {
    let mut base = it.requirements.clone();
    base.set(Requirement::in_values(NODEPOOL_LABEL, [nodepool]));
    for (k, v) in nodepool_labels {
        base.set(Requirement::in_values(k, [v.clone()]));
    }
    it.offerings
        .iter()
        .map(|offering| {
            let mut reqs = base.clone();
            reqs.set(Requirement::in_values(ZONE, [offering.zone.clone()]));
            reqs.set(Requirement::in_values(
                CAPACITY_TYPE,
                [offering.capacity_type.clone()],
            ));
            reqs
        })
        .collect()
}

/// Ties that [`apply`] settles only by name (upstream's `Conflict`): two overlays of the same
/// weight both pricing one offering, or both setting one capacity resource of a type (whether
/// or not a heavier overlay wins over both). Maps each losing overlay (the one the name order
/// puts second) to a message naming the overlay it tied with.
pub fn conflicts(
    nodepool: &str,
    nodepool_labels: &BTreeMap<String, String>,
    types: &[Arc<InstanceType>],
    overlays: &[NodeOverlay],
) -> Result<BTreeMap<String, String>, OverlayError> {
    let compiled = compile(overlays)?;
    let wk = well_known();
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    let weight = |c: &Compiled| c.overlay.spec.weight.unwrap_or(0);
    let mut tie = |first: &Compiled, second: &Compiled, what: String| {
        if weight(first) == weight(second) {
            out.entry(second.name.clone()).or_insert_with(|| {
                format!(
                    "conflicts with NodeOverlay {} (same weight {}) on {what}",
                    first.name,
                    weight(first)
                )
            });
        }
    };
    for it in types {
        let offering_reqs = offering_requirements(nodepool, nodepool_labels, it);
        for (offering, reqs) in it.offerings.iter().zip(&offering_reqs) {
            let pricing: Vec<&Compiled> = compiled
                .iter()
                .filter(|c| {
                    (c.overlay.spec.price.is_some() || c.overlay.spec.price_adjustment.is_some())
                        && reqs.compatible(&c.requirements, Some(&wk)).is_ok()
                })
                .collect();
            for pair in pricing.windows(2) {
                let what = format!(
                    "the price of {} {}/{} in NodePool {nodepool}",
                    it.name, offering.zone, offering.capacity_type
                );
                tie(pair[0], pair[1], what);
            }
        }
        let matching: Vec<&Compiled> = compiled
            .iter()
            .filter(|c| {
                offering_reqs
                    .iter()
                    .any(|r| r.compatible(&c.requirements, Some(&wk)).is_ok())
            })
            .collect();
        let resources: std::collections::BTreeSet<&String> = matching
            .iter()
            .filter_map(|c| c.overlay.spec.capacity.as_ref())
            .flat_map(|capacity| capacity.keys())
            .collect();
        for resource in resources {
            let setting: Vec<&&Compiled> = matching
                .iter()
                .filter(|c| {
                    c.overlay
                        .spec
                        .capacity
                        .as_ref()
                        .is_some_and(|cap| cap.contains_key(resource))
                })
                .collect();
            for pair in setting.windows(2) {
                let what = format!("capacity {resource} of {} in NodePool {nodepool}", it.name);
                tie(pair[0], pair[1], what);
            }
        }
    }
    Ok(out)
}

/// Applies `overlays` to the instance types of the NodePool `nodepool` (with its template
/// labels) and returns the adjusted types.
pub fn apply(
    nodepool: &str,
    nodepool_labels: &BTreeMap<String, String>,
    types: &[Arc<InstanceType>],
    overlays: &[NodeOverlay],
) -> Result<(Vec<Arc<InstanceType>>, Applied), OverlayError> {
    let compiled = compile(overlays)?;
    let wk = well_known();
    let mut applied = Applied::default();
    let mut out = Vec::with_capacity(types.len());
    for it in types {
        let mut changed = (**it).clone();
        let mut priced = false;
        let mut any_offering_reqs = Vec::new();
        let offering_reqs = offering_requirements(nodepool, nodepool_labels, it);
        for (offering, reqs) in changed.offerings.iter_mut().zip(offering_reqs) {
            let matches = |c: &&Compiled| reqs.compatible(&c.requirements, Some(&wk)).is_ok();
            let price_overlay = compiled
                .iter()
                .filter(|c| {
                    c.overlay.spec.price.is_some() || c.overlay.spec.price_adjustment.is_some()
                })
                .find(matches);
            if let Some(c) = price_overlay {
                let err = |source| OverlayError::Price {
                    name: c.name.clone(),
                    source,
                };
                offering.price = match (&c.overlay.spec.price, &c.overlay.spec.price_adjustment) {
                    (Some(p), _) => parse_overlay_price(p).map_err(err)?,
                    (None, Some(a)) => apply_price_adjustment(offering.price, a).map_err(err)?,
                    (None, None) => offering.price,
                };
                priced = true;
            }
            any_offering_reqs.push(reqs);
        }
        // Capacity: per resource, the first overlay matching any offering of the type.
        let mut added = false;
        let mut seen: Vec<String> = Vec::new();
        for c in &compiled {
            let Some(capacity) = &c.overlay.spec.capacity else {
                continue;
            };
            if !any_offering_reqs
                .iter()
                .any(|r| r.compatible(&c.requirements, Some(&wk)).is_ok())
            {
                continue;
            }
            for (resource, value) in capacity {
                if seen.contains(resource) {
                    continue;
                }
                let q = Quantity::parse(&value.0).map_err(|_| OverlayError::Capacity {
                    name: c.name.clone(),
                    resource: resource.clone(),
                    value: value.0.clone(),
                })?;
                changed.capacity.set(resource, q);
                seen.push(resource.clone());
                added = true;
            }
        }
        if priced {
            applied.priced.push(it.name.clone());
            changed.price_overlaid = true;
        }
        if added {
            applied.capacity.push(it.name.clone());
            changed.capacity_overlaid = true;
        }
        out.push(if priced || added {
            Arc::new(changed)
        } else {
            it.clone()
        });
    }
    Ok((out, applied))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::fixtures;

    fn overlay(name: &str, weight: Option<i32>, yaml_reqs: &str, extra: &str) -> NodeOverlay {
        let doc = format!(
            "apiVersion: karpenter.sh/v1alpha1\nkind: NodeOverlay\nmetadata:\n  name: {name}\nspec:\n  requirements: {yaml_reqs}\n{}{extra}",
            weight
                .map(|w| format!("  weight: {w}\n"))
                .unwrap_or_default()
        );
        serde_yaml_ng::from_str(&doc).unwrap()
    }

    fn price(types: &[Arc<InstanceType>], name: &str, zone: &str, ct: &str) -> f64 {
        let it = types.iter().find(|t| t.name == name).unwrap();
        it.offerings
            .iter()
            .find(|o| o.zone == zone && o.capacity_type == ct)
            .unwrap()
            .price
    }

    #[tokio::test]
    async fn the_decorator_applies_the_current_valid_overlays_and_ignores_invalid_ones() {
        use crate::cloudprovider::fake::FakeCloudProvider;
        use std::sync::Mutex;
        let types = fixtures::instance_types(2);
        let base = price(&types, "fake-it-1", "test-zone-1", "on-demand");
        let inner = Arc::new(FakeCloudProvider::with_instance_types(types));
        let current: Arc<Mutex<Vec<Arc<NodeOverlay>>>> = Arc::default();
        let source: OverlaySource = {
            let current = current.clone();
            Arc::new(move || current.lock().unwrap().clone())
        };
        let provider = WithOverlays::new(inner, source);
        let pool: NodePool = serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "default"},
            "spec": {"template": {"spec": {"nodeClassRef":
                {"group": "karpenter.exoscale.com", "kind": "ExoscaleNodeClass", "name": "x"},
                "requirements": []}}}
        }))
        .unwrap();
        let got = provider.instance_types(&pool).await.unwrap();
        assert_eq!(price(&got, "fake-it-1", "test-zone-1", "on-demand"), base);

        // A watch update: one valid overlay and one whose capacity is not a quantity.
        *current.lock().unwrap() = vec![
            Arc::new(overlay("pricey", None, "[]", "  price: \"7.5\"\n")),
            Arc::new(overlay(
                "broken",
                Some(100),
                "[]",
                "  price: \"0\"\n  capacity:\n    example.com/x: \"lots\"\n",
            )),
        ];
        assert!(matches!(
            validate(&current.lock().unwrap()[1]),
            Err(OverlayError::Capacity { .. })
        ));
        let got = provider.instance_types(&pool).await.unwrap();
        assert_eq!(price(&got, "fake-it-1", "test-zone-1", "on-demand"), 7.5);
        assert_eq!(price(&got, "fake-it-0", "test-zone-2", "spot"), 7.5);
    }

    #[test]
    fn highest_weight_wins_and_adjustments_apply_per_offering() {
        let types = fixtures::instance_types(3);
        let base = price(&types, "fake-it-1", "test-zone-1", "on-demand");
        let overlays = vec![
            overlay(
                "discount",
                Some(10),
                "[{key: karpenter.sh/capacity-type, operator: In, values: [on-demand]}]",
                "  priceAdjustment: \"-50%\"\n",
            ),
            overlay("fixed", Some(1), "[]", "  price: \"9\"\n"),
            overlay(
                "zone3",
                Some(20),
                "[{key: topology.kubernetes.io/zone, operator: In, values: [test-zone-3]}]",
                "  price: \"0.001\"\n",
            ),
        ];
        let (out, applied) = apply("default", &BTreeMap::new(), &types, &overlays).unwrap();
        assert!((price(&out, "fake-it-1", "test-zone-1", "on-demand") - base / 2.0).abs() < 1e-12);
        assert_eq!(price(&out, "fake-it-1", "test-zone-1", "spot"), 9.0);
        assert_eq!(price(&out, "fake-it-1", "test-zone-3", "on-demand"), 0.001);
        assert_eq!(applied.priced.len(), 3);
        assert!(applied.capacity.is_empty());
    }

    #[test]
    fn overlays_can_select_by_nodepool_and_template_labels_and_add_capacity() {
        let types = fixtures::instance_types(2);
        let overlays = vec![
            overlay(
                "gpu",
                None,
                "[{key: karpenter.sh/nodepool, operator: In, values: [gpu]}]",
                "  capacity:\n    example.com/fpga: \"2\"\n",
            ),
            overlay(
                "team",
                None,
                "[{key: team, operator: In, values: [a]}]",
                "  price: \"1\"\n",
            ),
        ];
        let (out, applied) = apply("default", &BTreeMap::new(), &types, &overlays).unwrap();
        assert_eq!(applied, Applied::default());
        assert!(
            Arc::ptr_eq(&out[0], &types[0]),
            "untouched types are shared"
        );
        let labels = BTreeMap::from([("team".to_string(), "a".to_string())]);
        let (out, applied) = apply("gpu", &labels, &types, &overlays).unwrap();
        assert_eq!(
            out[0].capacity.get("example.com/fpga"),
            Quantity::from_units(2)
        );
        assert_eq!(applied.capacity, vec!["fake-it-0", "fake-it-1"]);
        assert_eq!(applied.priced, vec!["fake-it-0", "fake-it-1"]);
    }

    #[test]
    fn equal_weights_are_ordered_by_name_descending() {
        let types = fixtures::instance_types(1);
        let overlays = vec![
            overlay("a", Some(5), "[]", "  price: \"1\"\n"),
            overlay("b", Some(5), "[]", "  price: \"2\"\n"),
        ];
        let (out, _) = apply("default", &BTreeMap::new(), &types, &overlays).unwrap();
        assert_eq!(price(&out, "fake-it-0", "test-zone-1", "on-demand"), 2.0);
    }
}
