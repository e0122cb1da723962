//! NodeOverlay application (upstream's overlay decorator, pure): for each (NodePool, instance
//! type, offering) the highest-weight matching overlay sets or adjusts the price; capacity
//! overlays add extended resources. Equal weights are ordered by name, descending.

use std::collections::BTreeMap;
use std::sync::Arc;

use thiserror::Error;

use crate::apis::NodeOverlay;
use crate::apis::labels::{NODEPOOL_LABEL, WELL_KNOWN_LABELS};
use crate::providers::pricing::{PricingError, apply_price_adjustment, parse_overlay_price};
use crate::scheduling::labels::{CAPACITY_TYPE, ZONE};
use crate::scheduling::{
    InstanceType, Quantity, Requirement, RequirementError, Requirements, WellKnownLabels,
};

use super::requirements_from_api;

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
        let mut base = it.requirements.clone();
        base.set(Requirement::in_values(NODEPOOL_LABEL, [nodepool]));
        for (k, v) in nodepool_labels {
            base.set(Requirement::in_values(k, [v.clone()]));
        }
        let mut changed = (**it).clone();
        let mut priced = false;
        let mut any_offering_reqs = Vec::new();
        for offering in changed.offerings.iter_mut() {
            let mut reqs = base.clone();
            reqs.set(Requirement::in_values(ZONE, [offering.zone.clone()]));
            reqs.set(Requirement::in_values(
                CAPACITY_TYPE,
                [offering.capacity_type.clone()],
            ));
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
        }
        if added {
            applied.capacity.push(it.name.clone());
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
