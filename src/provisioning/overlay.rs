//! NodeOverlays: price and capacity adjustments applied to the instance types a NodePool sees.
//! The highest weight wins (ties: name descending, as upstream); each offering takes the price of
//! the first matching overlay that sets one, and each extended resource the first that adds it.

use std::collections::BTreeMap;

use crate::apis::NodeOverlay;
use crate::providers::pricing::{apply_price_adjustment, parse_overlay_price};
use crate::scheduling::quantity::Quantity;
use crate::scheduling::requirements::{Requirement, Requirements};
use crate::scheduling::{InstanceType, Offering};

use super::template::requirements;

/// What applying overlays changed, for annotations (`karpenter.sh/price-overlay-applied`) and
/// for reporting.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct OverlayOutcome {
    pub price_overlaid: Vec<String>,
    pub capacity_overlaid: Vec<String>,
    /// Overlays that could not be used, with the reason.
    pub invalid: Vec<String>,
}

struct Prepared<'a> {
    name: String,
    overlay: &'a NodeOverlay,
    requirements: Requirements,
}

/// Applies `overlays` to the instance types of the NodePool whose template labels are `pool_labels`.
pub fn apply(
    overlays: &[NodeOverlay],
    pool_labels: &BTreeMap<String, String>,
    types: &mut [InstanceType],
) -> OverlayOutcome {
    let mut outcome = OverlayOutcome::default();
    let mut prepared: Vec<Prepared> = Vec::new();
    for overlay in overlays {
        let name = overlay.metadata.name.clone().unwrap_or_default();
        match requirements(&name, &overlay.spec.requirements) {
            Ok(requirements) => prepared.push(Prepared {
                name,
                overlay,
                requirements,
            }),
            Err(e) => outcome.invalid.push(format!("NodeOverlay {name}: {e}")),
        }
    }
    prepared.sort_by(|a, b| {
        let weight = |p: &Prepared| p.overlay.spec.weight.unwrap_or(0);
        weight(b).cmp(&weight(a)).then_with(|| b.name.cmp(&a.name))
    });
    let pool_requirements = Requirements::from_labels(pool_labels);
    for it in types.iter_mut() {
        let mut type_requirements = it.requirements.clone();
        type_requirements.add_all(&pool_requirements);
        let mut price_applied = false;
        for offering in &mut it.offerings {
            let mut offering_requirements = type_requirements.clone();
            offering_requirements.set(Requirement::in_values(
                crate::scheduling::labels::ZONE,
                [offering.zone.clone()],
            ));
            offering_requirements.set(Requirement::in_values(
                crate::scheduling::labels::CAPACITY_TYPE,
                [offering.capacity_type.clone()],
            ));
            let overlay = prepared.iter().find(|p| {
                (p.overlay.spec.price.is_some() || p.overlay.spec.price_adjustment.is_some())
                    && offering_requirements
                        .compatible(&p.requirements, None)
                        .is_ok()
            });
            if let Some(p) = overlay {
                match adjusted_price(offering, p.overlay) {
                    Ok(price) => {
                        offering.price = price;
                        price_applied = true;
                    }
                    Err(e) => outcome.invalid.push(format!("NodeOverlay {}: {e}", p.name)),
                }
            }
        }
        if price_applied {
            outcome.price_overlaid.push(it.name.clone());
        }
        let mut seen = std::collections::BTreeSet::new();
        for p in &prepared {
            let Some(capacity) = &p.overlay.spec.capacity else {
                continue;
            };
            if type_requirements.compatible(&p.requirements, None).is_err() {
                continue;
            }
            for (resource, value) in capacity {
                if !seen.insert(resource.clone()) {
                    continue;
                }
                match Quantity::parse(&value.0) {
                    Ok(q) => {
                        it.capacity.set(resource, q);
                        if !outcome.capacity_overlaid.contains(&it.name) {
                            outcome.capacity_overlaid.push(it.name.clone());
                        }
                    }
                    Err(e) => outcome
                        .invalid
                        .push(format!("NodeOverlay {}: capacity {resource}: {e}", p.name)),
                }
            }
        }
    }
    outcome
}

fn adjusted_price(offering: &Offering, overlay: &NodeOverlay) -> Result<f64, String> {
    if let Some(price) = &overlay.spec.price {
        return parse_overlay_price(price).map_err(|e| e.to_string());
    }
    let adjustment = overlay.spec.price_adjustment.as_deref().unwrap_or("+0");
    apply_price_adjustment(offering.price, adjustment).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::validation;
    use crate::scheduling::fixtures;

    fn overlay(yaml: &str) -> NodeOverlay {
        validation::parse(&serde_yaml_ng::from_str(yaml).unwrap()).unwrap()
    }

    fn types() -> Vec<InstanceType> {
        fixtures::instance_types(4)
            .into_iter()
            .map(|t| (*t).clone())
            .collect()
    }

    #[test]
    fn heavier_overlay_sets_the_price_of_matching_types_only() {
        let mut its = types();
        let target = its[0].name.clone();
        let original_other = its[1].offerings[0].price;
        let cheap = overlay(&format!(
            "apiVersion: karpenter.sh/v1alpha1\nkind: NodeOverlay\nmetadata: {{name: a}}\nspec:\n  weight: 10\n  price: '0.01'\n  requirements: [{{key: node.kubernetes.io/instance-type, operator: In, values: [{target}]}}]\n"
        ));
        let discount = overlay(
            "apiVersion: karpenter.sh/v1alpha1\nkind: NodeOverlay\nmetadata: {name: b}\nspec:\n  weight: 1\n  priceAdjustment: '-50%'\n  requirements: [{key: node.kubernetes.io/instance-type, operator: Exists}]\n",
        );
        let outcome = apply(&[discount, cheap], &BTreeMap::new(), &mut its);
        assert!(
            its[0].offerings.iter().all(|o| o.price == 0.01),
            "weight 10 wins"
        );
        assert!((its[1].offerings[0].price - original_other / 2.0).abs() < 1e-12);
        assert_eq!(outcome.price_overlaid.len(), 4);
        assert!(outcome.invalid.is_empty());
    }

    #[test]
    fn overlay_on_an_undefined_label_matches_nothing() {
        let mut its = types();
        let before: Vec<f64> = its.iter().map(|t| t.offerings[0].price).collect();
        let o = overlay(
            "apiVersion: karpenter.sh/v1alpha1\nkind: NodeOverlay\nmetadata: {name: a}\nspec:\n  price: '9'\n  requirements: [{key: example.com/team, operator: In, values: [x]}]\n",
        );
        apply(std::slice::from_ref(&o), &BTreeMap::new(), &mut its);
        assert_eq!(
            before,
            its.iter().map(|t| t.offerings[0].price).collect::<Vec<_>>()
        );
        // ...but a NodePool label defines it.
        let labels = BTreeMap::from([("example.com/team".to_string(), "x".to_string())]);
        apply(&[o], &labels, &mut its);
        assert!(its.iter().all(|t| t.offerings[0].price == 9.0));
    }

    #[test]
    fn capacity_overlay_adds_extended_resources() {
        let mut its = types();
        let o = overlay(
            "apiVersion: karpenter.sh/v1alpha1\nkind: NodeOverlay\nmetadata: {name: fpga}\nspec:\n  capacity: {example.com/fpga: '2'}\n  requirements: [{key: node.kubernetes.io/instance-type, operator: Exists}]\n",
        );
        let outcome = apply(&[o], &BTreeMap::new(), &mut its);
        assert_eq!(
            its[0].capacity.get("example.com/fpga"),
            Quantity::from_units(2)
        );
        assert_eq!(outcome.capacity_overlaid.len(), its.len());
    }
}
