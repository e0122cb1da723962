//! New NodeClaims of a solve: opening one from a NodePool template, adding a pod to one (merging
//! requirements, narrowing instance types, minValues), and the type-compatibility cache.

use super::*;

impl Solve<'_> {
    pub(super) fn can_add_to_claim(&self, ci: usize, c: &Check) -> Option<ClaimUpdate> {
        let (pod, a, topo) = (c.pod, c.a, c.topo);
        let claim = &self.claims[ci];
        if a.tolerates_template[claim.template].is_err()
            || !pod.requests.fits_in(&claim.headroom)
            || !Topology::may_admit(c.prepared, &claim.domains)
        {
            return None;
        }
        if !pod.host_ports.is_empty()
            && (ports_conflict(&pod.host_ports, &claim.ports)
                || ports_conflict(
                    &pod.host_ports,
                    &self.s.templates[claim.template].daemon_ports,
                ))
        {
            return None;
        }
        self.topology.hostname_allows(topo, claim.host).ok()?;
        let wk = &self.s.options.well_known_labels;
        claim.reqs.compatible(&a.reqs, Some(wk)).ok()?;
        let t = &self.s.templates[claim.template];
        if a.reqs.is_empty() && a.node_reqs_extra.is_none() && c.prepared.is_empty() {
            let types = self.refit(claim, pod);
            if types.is_empty() {
                return None;
            }
            return Some(ClaimUpdate {
                reqs: None,
                types,
                min_values_relaxed: false,
            });
        }
        let (merged, changed) = self.merge(&claim.reqs, c).ok()?;
        let Some(merged) = merged else {
            let types = self.refit(claim, pod);
            return (!types.is_empty()).then_some(ClaimUpdate {
                reqs: None,
                types,
                min_values_relaxed: false,
            });
        };
        let compatible = self.compatible_set(claim.template, &merged, &changed);
        let types = filter_types(
            t,
            &claim.types,
            &claim.requests,
            &pod.requests,
            compatible.as_deref().map(Vec::as_slice),
        );
        if types.is_empty() {
            return None;
        }
        let (merged, types, relaxed) = self.check_min_values(t, merged, types).ok()?;
        Some(ClaimUpdate {
            reqs: Some(merged),
            types,
            min_values_relaxed: relaxed,
        })
    }

    /// The claim's instance types that still fit with the pod added (no requirement change).
    pub(super) fn refit(&self, claim: &Claim, pod: &Pod) -> Vec<u32> {
        if pod.requests.fits_in(&claim.floor) {
            return claim.types.clone();
        }
        let t = &self.s.templates[claim.template];
        filter_types(t, &claim.types, &claim.requests, &pod.requests, None)
    }

    /// Node requirements ∩ pod requirements ∩ volume requirements ∩ topology requirements,
    /// and the keys that may have narrowed.
    pub(super) fn merge(
        &self,
        base: &Requirements,
        c: &Check,
    ) -> Result<(Option<Requirements>, Vec<String>), MergeError> {
        let a = c.a;
        let mut views: Vec<&Requirements> = vec![base, &a.reqs];
        if let Some(v) = &a.node_reqs_extra {
            base.intersects(v).map_err(MergeError::Volume)?;
            views.push(v);
        }
        let topology =
            Topology::domain_requirements(c.prepared, &views).map_err(MergeError::Topology)?;
        // Most pods narrow nothing (or re-pick the claim's own zone): skip the clone then.
        let narrowing: Vec<&Requirement> = views[1..]
            .iter()
            .flat_map(|r| r.iter())
            .chain(topology.iter())
            .filter(|r| base.get(r.key()).is_none_or(|b| !r.admits_all_of(b)))
            .collect();
        if narrowing.is_empty() {
            return Ok((None, Vec::new()));
        }
        let mut changed: Vec<String> = narrowing.iter().map(|r| r.key().to_string()).collect();
        changed.sort_unstable();
        changed.dedup();
        let mut merged = base.clone();
        for r in narrowing {
            merged.add(r.clone());
        }
        if let Some(empty) = changed
            .iter()
            .filter_map(|k| merged.get(k))
            .find(|r| r.is_empty() && !base.get(r.key()).is_some_and(|b| b.is_empty()))
        {
            return Err(MergeError::Empty(empty.key().to_string()));
        }
        Ok((Some(merged), changed))
    }

    /// Bitset of the template's instance types whose requirements and offerings admit `merged`
    /// on the `changed` keys; `None` when nothing narrowed.
    pub(super) fn compatible_set(
        &self,
        ti: usize,
        merged: &Requirements,
        changed: &[String],
    ) -> Option<Rc<Vec<u64>>> {
        if changed.is_empty() {
            return None;
        }
        let mut key: Vec<Requirement> = changed
            .iter()
            .filter_map(|k| merged.get(k).cloned())
            .collect();
        for k in [crate::scheduling::labels::ZONE, CAPACITY_TYPE] {
            if !changed.iter().any(|c| c == k)
                && let Some(r) = merged.get(k)
            {
                key.push(r.clone());
            }
        }
        let key = (ti, key);
        if let Some(bits) = self.type_cache.borrow().get(&key) {
            return Some(Rc::clone(bits));
        }
        let t = &self.s.templates[ti];
        let narrowed: Vec<&Requirement> = changed.iter().filter_map(|k| merged.get(k)).collect();
        let offerings = OfferingFilter::new(merged);
        let mut bits = vec![0u64; t.types.len().div_ceil(64)];
        for (i, e) in t.types.iter().enumerate() {
            let ok = narrowed.iter().all(|r| {
                e.it.requirements
                    .get(r.key())
                    .is_none_or(|tr| r.intersects(tr))
            }) && offerings.any_available(&e.it);
            if ok {
                bits[i / 64] |= 1 << (i % 64);
            }
        }
        let bits = Rc::new(bits);
        self.type_cache.borrow_mut().insert(key, Rc::clone(&bits));
        Some(bits)
    }

    pub(super) fn check_min_values(
        &self,
        t: &Template,
        mut reqs: Requirements,
        types: Vec<u32>,
    ) -> Result<(Requirements, Vec<u32>, bool), String> {
        if !reqs.has_min_values() {
            return Ok((reqs, types, false));
        }
        let shortfalls = min_values_shortfalls(t, &reqs, &types);
        if shortfalls.is_empty() {
            return Ok((reqs, types, false));
        }
        match self.s.options.min_values_policy {
            MinValuesPolicy::Strict => Err(format!(
                "minValues requirement is not met for {}",
                shortfalls
                    .iter()
                    .map(|(k, want, have)| format!(
                        "key {k} (needs {want}, instance types offer {have})"
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            MinValuesPolicy::BestEffort => {
                for (k, _, have) in shortfalls {
                    if let Some(r) = reqs.get_mut(&k) {
                        r.set_min_values(Some(have));
                    }
                }
                Ok((reqs, types, true))
            }
        }
    }

    pub(super) fn new_claim(&self, ti: usize, pi: usize, c: &Check) -> Result<Claim, String> {
        let (a, topo) = (c.a, c.topo);
        let t = &self.s.templates[ti];
        let pod = &self.pods[pi];
        let remaining = &self.remaining[ti];
        if remaining.get(NODES).is_some_and(|n| *n < 1000) {
            return Err("node limits have been exhausted for nodepool".into());
        }
        a.tolerates_template[ti].clone()?;
        if ports_conflict(&pod.host_ports, &t.daemon_ports) {
            return Err("host port conflicts with a DaemonSet on this nodepool".into());
        }
        let wk = &self.s.options.well_known_labels;
        t.reqs
            .compatible(&a.reqs, Some(wk))
            .map_err(|e| e.to_string())?;
        let host = self.topology.next_host_id();
        self.topology
            .hostname_allows(topo, host)
            .map_err(|r| self.topology.explain(r).to_string())?;
        let mut base = t.reqs.clone();
        base.set(Requirement::in_values(
            HOSTNAME,
            [self.placeholder_name(host)],
        ));
        let (merged, changed) = self.merge(&base, c).map_err(|e| match e {
            MergeError::Topology(r) => self.topology.explain(r).to_string(),
            MergeError::Volume(i) => format!("incompatible volume requirements, {i}"),
            MergeError::Empty(k) => format!("requirement {k} cannot be satisfied"),
        })?;
        let merged = merged.unwrap_or(base);
        let all_within = remaining
            .iter()
            .all(|(k, v)| k == NODES || t.max_capacity.get(k).milli() <= *v);
        let within_limits: Vec<u32> = (0..t.types.len() as u32)
            .filter(|&i| {
                if all_within {
                    return true;
                }
                let cap = &t.types[i as usize].it.capacity;
                remaining
                    .iter()
                    .all(|(k, v)| k == NODES || cap.get(k).milli() <= *v)
            })
            .collect();
        if within_limits.is_empty() {
            return Err("all available instance types exceed limits for nodepool".into());
        }
        let zero = Resources::new();
        let compatible = self.compatible_set(ti, &merged, &changed);
        let types = filter_types(
            t,
            &within_limits,
            &zero,
            &pod.requests,
            compatible.as_deref().map(Vec::as_slice),
        );
        if types.is_empty() {
            // Larger types exist but the NodePool's limits rule them out: say so.
            if !all_within {
                let every: Vec<u32> = (0..t.types.len() as u32).collect();
                let compatible = compatible.as_deref().map(Vec::as_slice);
                if !filter_types(t, &every, &zero, &pod.requests, compatible).is_empty() {
                    let left: Vec<String> = remaining
                        .iter()
                        .filter(|(k, _)| k.as_str() != NODES)
                        .map(|(k, v)| format!("{k}: {}", Quantity::from_milli(*v)))
                        .collect();
                    return Err(format!(
                        "every instance type large enough for requests {} exceeds the nodepool's remaining limits {{{}}}",
                        pod.requests,
                        left.join(", ")
                    ));
                }
            }
            return Err(explain_no_type(
                t,
                &within_limits,
                &merged,
                &changed,
                &pod.requests,
            ));
        }
        let (merged, types, relaxed) = self.check_min_values(t, merged, types)?;
        let requests = pod.requests.clone();
        let room = headroom(t, &types, &requests);
        Ok(Claim {
            template: ti,
            domains: self.topology.domain_ids(&merged),
            headroom: room.0,
            floor: room.1,
            reqs: merged,
            host,
            types,
            requests,
            pods: vec![pi],
            min_values_relaxed: relaxed,
            ports: pod.host_ports.clone(),
        })
    }
}
