//! Why a pod fits no NodePool: the reason the scheduler reports per NodePool.

use super::*;

/// `(key, minValues, distinct values offered)` for every unmet `minValues`.
pub(super) fn min_values_shortfalls(
    t: &Template,
    reqs: &Requirements,
    types: &[u32],
) -> Vec<(String, usize, usize)> {
    reqs.iter()
        .filter_map(|r| {
            let want = r.min_values()?;
            let mut values: HashSet<&str> = HashSet::new();
            for &i in types {
                if let Some(tr) = t.types[i as usize].it.requirements.get(r.key()) {
                    values.extend(tr.values().iter().map(String::as_str).filter(|v| r.has(v)));
                }
            }
            (values.len() < want).then(|| (r.key().to_string(), want, values.len()))
        })
        .collect()
}

/// Why no instance type of the NodePool can take the pod, naming the criteria that failed.
pub(super) fn explain_no_type(
    t: &Template,
    candidates: &[u32],
    reqs: &Requirements,
    changed: &[String],
    requests: &Resources,
) -> String {
    let matching: Vec<&TypeEntry> = candidates
        .iter()
        .map(|&i| &t.types[i as usize])
        .filter(|e| type_matches(e, reqs, changed))
        .collect();
    let mut shown = reqs.clone();
    shown.remove(HOSTNAME);
    if matching.is_empty() {
        return format!("no instance type satisfied the requirements [{shown}]");
    }
    let with_offering: Vec<&&TypeEntry> = matching
        .iter()
        .filter(|e| e.it.has_available_offering(reqs))
        .collect();
    if with_offering.is_empty() {
        return format!(
            "no instance type matching the requirements has an available offering [{shown}]"
        );
    }
    let largest = with_offering
        .iter()
        .max_by(|a, b| {
            a.usable
                .cpu()
                .cmp(&b.usable.cpu())
                .then(a.usable.memory().cmp(&b.usable.memory()))
        })
        .expect("non-empty");
    let mut msg = format!(
        "no instance type has enough resources for requests {requests}: {} exceed(s) what the largest allowed type {:?} offers {}",
        requests.exceeding(&largest.usable).join(", "),
        largest.it.name,
        largest.usable
    );
    if requests.cpu() >= Quantity::from_units(1_000_000) {
        msg.push_str(" (CPU request >= 1 Million, m vs M typo?)");
    }
    msg
}
