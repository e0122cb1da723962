//! The zone a pending pod is bound to (upstream's "effective zone" of
//! `karpenter_scheduler_pending_pods_by_effective_zone_count`): the intersection of its own zone
//! constraints (nodeSelector, and node affinity when it has a single required term) and its
//! volumes' zones — a zone name when exactly one zone remains, `flexible` when several or no
//! constraint, `none` when nothing is left. Topology-spread domains are not intersected here.

use crate::scheduling::labels::ZONE;
use crate::scheduling::{Operator, Pod, Requirement};

pub const FLEXIBLE: &str = "flexible";
pub const NONE: &str = "none";

fn zone_requirements(pod: &Pod) -> Vec<&Requirement> {
    let mut out: Vec<&Requirement> = pod.node_selector.get(ZONE).into_iter().collect();
    if let [only] = pod.required_node_affinity.as_slice() {
        out.extend(only.get(ZONE));
    }
    out.extend(pod.volume_requirements.as_ref().and_then(|r| r.get(ZONE)));
    out
}

pub fn effective_zone(pod: &Pod) -> String {
    let constraints = zone_requirements(pod);
    let Some(candidates) = constraints
        .iter()
        .find(|r| r.operator() == Operator::In)
        .map(|r| r.values())
    else {
        return FLEXIBLE.into();
    };
    let mut left = candidates
        .iter()
        .filter(|zone| constraints.iter().all(|r| r.has(zone)));
    match (left.next(), left.next()) {
        (Some(zone), None) => zone.clone(),
        (Some(_), Some(_)) => FLEXIBLE.into(),
        (None, _) => NONE.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::Requirements;

    fn pod_with(selector: Option<Requirement>, volume: Option<Requirement>) -> Pod {
        let mut pod = crate::scheduling::fixtures::pod("p", "1", "1Gi");
        let one = |r: Requirement| {
            let mut reqs = Requirements::new();
            reqs.add(r);
            reqs
        };
        if let Some(r) = selector {
            pod.node_selector = one(r);
        }
        pod.volume_requirements = volume.map(one);
        pod
    }

    #[test]
    fn zones_are_intersected_across_the_pod_and_its_volumes() {
        let zones = |values: &[&str]| Requirement::in_values(ZONE, values.iter().copied());
        assert_eq!(effective_zone(&pod_with(None, None)), "flexible");
        assert_eq!(effective_zone(&pod_with(Some(zones(&["a"])), None)), "a");
        assert_eq!(
            effective_zone(&pod_with(Some(zones(&["a", "b"])), None)),
            "flexible"
        );
        assert_eq!(effective_zone(&pod_with(None, Some(zones(&["b"])))), "b");
        assert_eq!(
            effective_zone(&pod_with(
                Some(zones(&["a", "b"])),
                Some(zones(&["b", "c"]))
            )),
            "b"
        );
        assert_eq!(
            effective_zone(&pod_with(Some(zones(&["a"])), Some(zones(&["c"])))),
            "none"
        );
    }
}
