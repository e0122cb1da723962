//! `karpenter_nodepools_cost_total{nodepool}` (upstream's cost tracker): the hourly price of a
//! NodePool's launched NodeClaims, each priced at the offering of its instance type, zone and
//! capacity type as the cloud provider offers it now (NodeOverlays included). A NodeClaim that
//! cannot be priced is counted once in `karpenter_nodepools_cost_tracker_errors_total`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use kube::ResourceExt;

use crate::apis::NodeClaim;
use crate::apis::labels::{CAPACITY_TYPE_LABEL, INSTANCE_TYPE_LABEL, ZONE_LABEL};
use crate::scheduling::InstanceType;

/// What one NodePool costs per hour, and the NodeClaims that could not be priced.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PoolCost {
    pub per_hour: f64,
    pub unpriced: Vec<String>,
}

/// Prices every launched NodeClaim (one with instance type, zone and capacity type labels);
/// NodeClaims not launched yet cost nothing and are no error.
pub fn pool_cost(claims: &[Arc<NodeClaim>], types: &[Arc<InstanceType>]) -> PoolCost {
    let by_name: HashMap<&str, &InstanceType> = types
        .iter()
        .map(|t| (t.name.as_str(), t.as_ref()))
        .collect();
    let mut cost = PoolCost::default();
    for claim in claims {
        let labels = claim.labels();
        let (Some(type_name), Some(zone), Some(capacity_type)) = (
            labels.get(INSTANCE_TYPE_LABEL),
            labels.get(ZONE_LABEL),
            labels.get(CAPACITY_TYPE_LABEL),
        ) else {
            continue;
        };
        let price = by_name.get(type_name.as_str()).and_then(|t| {
            t.offerings
                .iter()
                .find(|o| &o.zone == zone && &o.capacity_type == capacity_type)
                .map(|o| o.price)
        });
        match price {
            Some(p) => cost.per_hour += p,
            None => cost.unpriced.push(claim.name_any()),
        }
    }
    cost
}

/// Remembers which NodeClaims were already counted as errors, so a NodeClaim that stays
/// unpriceable is one error, not one per reconcile.
#[derive(Default)]
pub struct CostTracker {
    reported: Mutex<HashMap<String, HashSet<String>>>,
}

impl CostTracker {
    /// How many of `unpriced` are new errors for `pool`; forgets NodeClaims that are priced or gone.
    pub fn new_errors(&self, pool: &str, unpriced: &[String]) -> usize {
        let mut reported = self.reported.lock().unwrap_or_else(|p| p.into_inner());
        let seen = reported.entry(pool.to_string()).or_default();
        let now: HashSet<String> = unpriced.iter().cloned().collect();
        let new = now.difference(seen).count();
        *seen = now;
        new
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::fixtures;

    fn claim(name: &str, labels: &[(&str, &str)]) -> Arc<NodeClaim> {
        let labels: serde_json::Map<String, serde_json::Value> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), serde_json::Value::String(v.to_string())))
            .collect();
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
                "metadata": {"name": name, "labels": labels},
                "spec": {"nodeClassRef": {"group": "g", "kind": "K", "name": "n"}, "requirements": []}
            }))
            .unwrap(),
        )
    }

    #[test]
    fn launched_claims_are_priced_at_their_offering_and_the_rest_reported_once() {
        let types = fixtures::instance_types(3);
        let t = &types[1];
        let offering = &t.offerings[0];
        let launched = |name| {
            claim(
                name,
                &[
                    (INSTANCE_TYPE_LABEL, &t.name),
                    (ZONE_LABEL, &offering.zone),
                    (CAPACITY_TYPE_LABEL, &offering.capacity_type),
                ],
            )
        };
        let unknown = claim(
            "unknown",
            &[
                (INSTANCE_TYPE_LABEL, "no-such-type"),
                (ZONE_LABEL, &offering.zone),
                (CAPACITY_TYPE_LABEL, &offering.capacity_type),
            ],
        );
        let pending = claim("pending", &[]);
        let cost = pool_cost(&[launched("a"), launched("b"), unknown, pending], &types);
        assert!(
            (cost.per_hour - 2.0 * offering.price).abs() < 1e-9,
            "{cost:?}"
        );
        assert!(offering.price > 0.0);
        assert_eq!(cost.unpriced, ["unknown"]);

        let tracker = CostTracker::default();
        assert_eq!(tracker.new_errors("p", &cost.unpriced), 1);
        assert_eq!(tracker.new_errors("p", &cost.unpriced), 0, "counted once");
        assert_eq!(tracker.new_errors("p", &[]), 0);
        assert_eq!(tracker.new_errors("p", &cost.unpriced), 1, "a new episode");
    }
}
