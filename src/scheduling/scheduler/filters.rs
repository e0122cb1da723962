//! Instance-type, offering and topology filters the solve applies per pod and NodeClaim.

use super::*;

/// The spread constraint's node filter (`nodeAffinityPolicy` / `nodeTaintsPolicy`).
pub(super) fn spread_filter(
    p: &Pod,
    c: &crate::scheduling::model::TopologySpreadConstraint,
) -> NodeFilter {
    use crate::scheduling::model::InclusionPolicy;
    let alternatives = match c.node_affinity_policy {
        InclusionPolicy::Ignore => Vec::new(),
        InclusionPolicy::Honor => {
            if p.required_node_affinity.is_empty() {
                if p.node_selector.is_empty() {
                    Vec::new()
                } else {
                    vec![p.node_selector.clone()]
                }
            } else {
                p.required_node_affinity
                    .iter()
                    .map(|t| p.node_selector.intersection(t))
                    .collect()
            }
        }
    };
    let tolerations: Option<Arc<Vec<Toleration>>> = match c.node_taints_policy {
        InclusionPolicy::Honor => Some(p.tolerations.clone()),
        InclusionPolicy::Ignore => None,
    };
    NodeFilter {
        alternatives,
        tolerations,
    }
}

/// Types (by index) that fit `claim_requests + pod_requests` and, when `reqs` is given,
/// match it on the `changed` keys and still have a compatible available offering.
pub(super) fn filter_types(
    t: &Template,
    candidates: &[u32],
    claim_requests: &Resources,
    pod_requests: &Resources,
    compatible: Option<&[u64]>,
) -> Vec<u32> {
    candidates
        .iter()
        .copied()
        .filter(|&i| {
            compatible.is_none_or(|bits| bits[i as usize / 64] & (1 << (i % 64)) != 0)
                && claim_requests.sum_fits_in(pod_requests, &t.types[i as usize].usable)
        })
        .collect()
}

/// Zone and capacity-type requirements resolved once for checking many offerings.
pub(super) struct OfferingFilter<'r> {
    zone: Option<&'r Requirement>,
    capacity_type: Option<&'r Requirement>,
}

impl<'r> OfferingFilter<'r> {
    pub(super) fn new(reqs: &'r Requirements) -> Self {
        Self {
            zone: reqs.get(crate::scheduling::labels::ZONE),
            capacity_type: reqs.get(CAPACITY_TYPE),
        }
    }

    pub(super) fn admits(&self, o: &crate::scheduling::model::Offering) -> bool {
        o.available
            && self.zone.is_none_or(|r| r.has(&o.zone))
            && self.capacity_type.is_none_or(|r| r.has(&o.capacity_type))
    }

    pub(super) fn any_available(&self, it: &InstanceType) -> bool {
        it.offerings.iter().any(|o| self.admits(o))
    }

    pub(super) fn cheapest(&self, it: &InstanceType) -> Option<f64> {
        it.offerings
            .iter()
            .filter(|o| self.admits(o))
            .map(|o| o.price)
            .min_by(f64::total_cmp)
    }
}

pub(super) fn type_matches(e: &TypeEntry, reqs: &Requirements, changed: &[String]) -> bool {
    changed
        .iter()
        .all(|k| match (reqs.get(k), e.it.requirements.get(k)) {
            (Some(r), Some(tr)) => r.intersects(tr),
            _ => true,
        })
}

/// Component-wise maximum usable capacity left over the given types.
pub(super) fn headroom(
    t: &Template,
    types: &[u32],
    requests: &Resources,
) -> (Resources, Resources) {
    if types.len() == t.types.len() {
        return (
            t.max_usable.saturating_minus(requests),
            t.min_usable.saturating_minus(requests),
        );
    }
    let (max, min) = usable_range(&t.types, types);
    (
        max.saturating_minus(requests),
        min.saturating_minus(requests),
    )
}

/// Per-resource maximum and minimum usable capacity over the given types.
pub(super) fn usable_range(entries: &[TypeEntry], types: &[u32]) -> (Resources, Resources) {
    let mut max = Resources::new();
    let mut min: Option<Resources> = None;
    for &i in types {
        let usable = &entries[i as usize].usable;
        max.max_with(usable);
        match &mut min {
            Some(m) => m.min_with(usable),
            None => min = Some(usable.clone()),
        }
    }
    (max, min.unwrap_or_default())
}
