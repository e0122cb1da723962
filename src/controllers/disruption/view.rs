//! Builds the disruption logic's [`ClusterView`] from the cluster state index: pure over the
//! index so it is tested without an API server.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

use crate::apis::duration::{parse_duration, parse_nillable_duration};
use crate::apis::labels::{DISRUPTED_TAINT_KEY, DO_NOT_DISRUPT_ANNOTATION, conditions};
use crate::apis::{ConditionsExt, NodeClaim, NodePool};
use crate::disruption::conditions as decide;
use crate::disruption::model::{
    ClusterView, NOMINATION_WINDOW, NodePod, Pdb, PodOwner, PoolState, StateNode,
};
use crate::provisioning::input::{self, RegisteredNode};
use crate::provisioning::volumes::volume_requirements;
use crate::scheduling::{
    ExistingNode, InstanceType, SchedulerOptions, Taint, TaintEffect, convert,
};
use crate::state::pods::{is_daemonset_pod, is_mirror, is_terminal};
use crate::state::{ClusterIndex, HeldPod, nodeclaim_provider_id};

const DELETION_COST_ANNOTATION: &str = "controller.kubernetes.io/pod-deletion-cost";

/// What the view needs besides the index.
pub struct ViewInputs<'a> {
    pub now: DateTime<Utc>,
    /// NodePools with the instance types the cloud offers each.
    pub pools: Vec<(Arc<NodePool>, Vec<Arc<InstanceType>>)>,
    /// Whether provisioning recently nominated a node (by Node name) for pending pods.
    pub nominated: &'a dyn Fn(&str) -> bool,
    /// Provider IDs an in-flight command already holds: marked for deletion and queued.
    pub queued: HashSet<String>,
    pub options: SchedulerOptions,
}

pub fn to_chrono(t: &Time) -> DateTime<Utc> {
    DateTime::from_timestamp(t.0.as_second(), t.0.subsec_nanosecond().max(0) as u32)
        .unwrap_or_default()
}

/// The cluster as one disruption loop sees it: NodePools, capacity, DaemonSets and pending pods
/// come from the same adapter provisioning uses (`provisioning::input`); this adds what only
/// disruption needs (conditions, pods with their owners and PDB-relevant fields, nominations).
pub fn build_view(index: &ClusterIndex, mut inputs: ViewInputs<'_>) -> ClusterView {
    let now = inputs.now;
    let (usable, skipped) = input::node_pools(index, std::mem::take(&mut inputs.pools));
    for (nodepool, reason) in skipped {
        tracing::debug!(%nodepool, %reason, "NodePool left out of disruption");
    }
    let pools = usable
        .into_iter()
        .map(|pool| {
            let state = PoolState {
                nodepool: (*pool.nodepool).clone(),
                template: pool.template,
                instance_types: pool.instance_types,
            };
            (pool.nodepool.name_any(), state)
        })
        .collect::<BTreeMap<_, _>>();

    let (registered, unregistered) = input::registered_nodes(index);
    let mut nodes: Vec<StateNode> = registered
        .iter()
        .map(|node| {
            let pods = index.pods_on_node(&node.node.name_any());
            registered_node(node, &pods, &inputs, index)
        })
        .collect();
    nodes.extend(
        unregistered
            .iter()
            .map(|claim| unregistered_claim(claim, &inputs)),
    );
    // Another Karpenter's nodes are capacity to simulate with, never candidates: without a
    // NodeClaim of ours a state node is not disrupted, and no event is written about it (as
    // upstream's state has no NodeClaim for an unmanaged node).
    for node in &mut nodes {
        let foreign = node
            .nodeclaim
            .as_deref()
            .and_then(|name| index.nodeclaim(name))
            .is_some_and(|claim| !index.manages_claim(&claim));
        if foreign {
            node.nodeclaim = None;
        }
    }
    // `Consolidatable` is written every few seconds; a node that became quiet since counts
    // now, as the next pass will write. Without this, a node emptied 30 s ago was not yet a
    // candidate for Emptiness but already a place consolidation could move other pods to.
    for node in &mut nodes {
        let pool = node.node_pool().and_then(|p| pools.get(p));
        if let Some(pool) = pool
            && node.nodeclaim.is_some()
            && decide::consolidatable_now(
                &pool.nodepool,
                node.initialized,
                node.last_pod_event,
                now,
            )
        {
            node.consolidatable = true;
        }
    }

    // Provisioning ignores pods whose claims no node can satisfy; so does the view.
    let (pending, _invalid) = input::pods_to_place(index, input::provisionable_pods(index));
    let (daemonsets, _unreadable) = input::daemonsets(index);
    let pdbs = index.pdbs().iter().filter_map(|p| pdb(p)).collect();
    ClusterView {
        now,
        pools,
        nodes,
        pending_pods: pending.into_iter().map(|p| p.pod).collect(),
        daemonsets,
        pdbs,
        queued: inputs.queued,
        scheduler_options: inputs.options,
        // The controller's memory of earlier passes, not the cluster's: it fills this in.
        held_replacements: Default::default(),
        empty_since: Default::default(),
    }
}

fn condition_true(claim: Option<&NodeClaim>, type_: &str) -> bool {
    claim.is_some_and(|c| c.condition_is_true(type_))
}

/// Fills the NodeClaim-derived fields of a state node.
fn claim_fields(node: &mut StateNode, claim: &NodeClaim, inputs: &ViewInputs<'_>) {
    node.nodeclaim = Some(claim.name_any());
    node.created_at = claim
        .metadata
        .creation_timestamp
        .as_ref()
        .map(to_chrono)
        .unwrap_or(inputs.now);
    let status = claim.status.clone().unwrap_or_default();
    node.initialized = status.conditions.is_true(conditions::INITIALIZED);
    node.instance_terminating = status.conditions.is_true(conditions::INSTANCE_TERMINATING);
    node.consolidatable = status.conditions.is_true(conditions::CONSOLIDATABLE);
    // consolidateAfter counts from the last pod event, or from initialization when none.
    let initialized_at = status
        .conditions
        .get_condition(conditions::INITIALIZED)
        .filter(|c| c.status == crate::apis::ConditionStatus::True)
        .map(|c| to_chrono(&c.last_transition_time));
    let stamped = status
        .last_pod_event_time
        .as_ref()
        .map(to_chrono)
        .or(initialized_at);
    node.last_pod_event = node.last_pod_event.max(stamped);
    node.drifted_since = status
        .conditions
        .get_condition(conditions::DRIFTED)
        .filter(|c| c.status == crate::apis::ConditionStatus::True)
        .map(|c| {
            DateTime::from_timestamp(c.last_transition_time.0.as_second(), 0).unwrap_or_default()
        });
    node.termination_grace_period = claim
        .spec
        .termination_grace_period
        .as_deref()
        .and_then(|d| parse_duration(d).ok());
    node.expire_after = parse_nillable_duration(&claim.spec.expire_after)
        .ok()
        .flatten();
    node.marked_for_deletion |= claim.metadata.deletion_timestamp.is_some();
}

fn registered_node(
    registered: &RegisteredNode,
    pods: &[Arc<HeldPod>],
    inputs: &ViewInputs<'_>,
    volumes: &ClusterIndex,
) -> StateNode {
    let node = registered.node.as_ref();
    let claim = registered.claim.as_deref();
    let provider_id = registered.provider_id.clone();
    let name = node.name_any();
    let mut convertible = true;
    let node_pods: Vec<NodePod> = pods
        .iter()
        .filter_map(|p| {
            let converted = node_pod(p).map(|mut np| {
                // Moving a pod must keep it where its volumes can attach; a claim problem
                // (already bound here) constrains nothing more than the node it is on. Only a
                // pod with such a constraint gets a copy of its own.
                if let Some(reqs) = volume_requirements(p, volumes).ok().flatten() {
                    Arc::make_mut(&mut np.pod).volume_requirements = Some(reqs);
                }
                np
            });
            convertible &= converted.is_some();
            converted
        })
        .collect();
    let scheduling = match input::existing_node(registered, pods) {
        Ok(existing) => existing,
        Err(error) => {
            tracing::debug!(node = %name, %error, "node cannot be simulated");
            convertible = false;
            // Its labels still place it in its NodePool (budgets count it).
            ExistingNode {
                name: name.clone(),
                hostname: name.clone(),
                labels: Arc::new(node.labels().clone()),
                ..Default::default()
            }
        }
    };
    let ready = crate::state::node_ready(node);
    let mut state = StateNode {
        name: name.clone(),
        provider_id: provider_id.clone(),
        has_node: true,
        do_not_disrupt: node
            .annotations()
            .get(DO_NOT_DISRUPT_ANNOTATION)
            .is_some_and(|v| v == "true"),
        ready,
        marked_for_deletion: node.metadata.deletion_timestamp.is_some()
            || inputs.queued.contains(&provider_id),
        nominated_until: (inputs.nominated)(&name).then(|| {
            inputs.now + chrono::Duration::from_std(NOMINATION_WINDOW).unwrap_or_default()
        }),
        created_at: inputs.now,
        last_pod_event: volumes.last_pod_event(&name),
        pods: node_pods,
        scheduling,
        ..Default::default()
    };
    if let Some(claim) = claim {
        claim_fields(&mut state, claim, inputs);
    }
    if !convertible {
        // A pod the simulation cannot read could not be placed elsewhere: leave the node alone
        // (it still offers its capacity).
        tracing::debug!(node = %name, "a pod cannot be simulated; node is not a candidate");
        state.nodeclaim = None;
    }
    state
}

/// A NodeClaim whose Node has not registered: capacity on the way, never a candidate.
fn unregistered_claim(claim: &NodeClaim, inputs: &ViewInputs<'_>) -> StateNode {
    let provider_id = nodeclaim_provider_id(claim).unwrap_or_default().to_string();
    let mut state = StateNode {
        name: claim.name_any(),
        marked_for_deletion: inputs.queued.contains(&provider_id),
        provider_id,
        ready: condition_true(Some(claim), conditions::READY),
        scheduling: input::claim_capacity(claim),
        ..Default::default()
    };
    claim_fields(&mut state, claim, inputs);
    state
}

fn owner(pod: &HeldPod) -> PodOwner {
    if is_daemonset_pod(pod) {
        PodOwner::DaemonSet
    } else if is_mirror(pod) {
        PodOwner::Node
    } else {
        PodOwner::Workload
    }
}

/// A bound pod as disruption sees it; `None` when the simulation cannot read it.
pub fn node_pod(object: &HeldPod) -> Option<NodePod> {
    let pod = match convert::converted(object) {
        Ok(converted) => converted.pod.clone(),
        Err(error) => {
            tracing::debug!(pod = %object.name_any(), %error, "pod cannot be simulated");
            return None;
        }
    };
    let status = object.status.as_ref();
    let disrupted = Taint::new(DISRUPTED_TAINT_KEY, "", TaintEffect::NoSchedule);
    Some(NodePod {
        tolerates_disrupted_taint: pod.tolerations.iter().any(|t| t.tolerates(&disrupted)),
        pod,
        owner: owner(object),
        terminal: is_terminal(object),
        terminating: object.metadata.deletion_timestamp.is_some(),
        ready: status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
        do_not_disrupt: object.annotations().get(DO_NOT_DISRUPT_ANNOTATION).cloned(),
        started_at: status.and_then(|s| s.start_time.as_ref()).map(to_chrono),
        priority: object.spec.as_ref().and_then(|s| s.priority),
        deletion_cost: object
            .annotations()
            .get(DELETION_COST_ANNOTATION)
            .and_then(|v| v.parse().ok()),
    })
}

fn is_zero(v: &IntOrString) -> bool {
    match v {
        IntOrString::Int(i) => *i == 0,
        IntOrString::String(s) => s.trim_end_matches('%').trim() == "0",
    }
}

fn is_full(v: &IntOrString) -> bool {
    matches!(v, IntOrString::String(s) if s.trim() == "100%")
}

/// A PodDisruptionBudget reduced to what blocks an eviction.
pub fn pdb(object: &PodDisruptionBudget) -> Option<Pdb> {
    let spec = object.spec.as_ref()?;
    let name = object.name_any();
    // In policy/v1 a PDB without a selector selects no pod (an empty one selects every pod
    // of its namespace): read as "every pod", it would block each node of the namespace.
    let selector = spec.selector.as_ref()?;
    let selector = match convert::label_selector(&name, Some(selector)) {
        Ok(s) => s,
        Err(error) => {
            tracing::debug!(pdb = %name, %error, "PDB selector not understood");
            return None;
        }
    };
    Some(Pdb {
        namespace: object.namespace().unwrap_or_default(),
        name,
        selector,
        disruptions_allowed: object.status.as_ref().map_or(0, |s| s.disruptions_allowed),
        always_allow_unhealthy: spec.unhealthy_pod_eviction_policy.as_deref()
            == Some("AlwaysAllow"),
        fully_blocking: spec.max_unavailable.as_ref().is_some_and(is_zero)
            || spec.min_available.as_ref().is_some_and(is_full),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::ConditionStatus;
    use crate::apis::labels::{INSTANCE_TYPE_LABEL, NODEPOOL_LABEL};
    use crate::disruption::fixtures;
    use crate::state::testing;
    use k8s_openapi::api::core::v1::{Node, NodeCondition};

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000 + s, 0).unwrap()
    }

    fn ready_node(name: &str, pid: &str) -> Node {
        let mut node = testing::with_node_capacity(
            testing::node(name, Some(pid), &[]),
            &[("cpu", "4"), ("memory", "8Gi"), ("pods", "110")],
        );
        node.metadata.labels = Some(BTreeMap::from([
            (NODEPOOL_LABEL.to_string(), "default".to_string()),
            (INSTANCE_TYPE_LABEL.to_string(), "c-4".to_string()),
            ("karpenter.sh/initialized".to_string(), "true".to_string()),
        ]));
        node.status.as_mut().unwrap().conditions = Some(vec![NodeCondition {
            type_: "Ready".into(),
            status: "True".into(),
            ..Default::default()
        }]);
        node
    }

    fn claim(name: &str, pid: &str) -> NodeClaim {
        let c = testing::registered(testing::nodeclaim(name, "default", Some(pid)));
        let c = testing::set_condition(c, conditions::INITIALIZED, ConditionStatus::True, 0);
        let c = testing::set_condition(c, conditions::CONSOLIDATABLE, ConditionStatus::True, 5);
        testing::set_condition(c, conditions::DRIFTED, ConditionStatus::True, 7)
    }

    fn index() -> ClusterIndex {
        let mut index = ClusterIndex::default();
        index.apply_nodepool(fixtures::nodepool("default", "{consolidateAfter: 0s}"));
        index.apply_node(ready_node("n1", "exoscale://1"));
        index.apply_nodeclaim(claim("default-a", "exoscale://1"));
        let mut unregistered = testing::with_capacity(
            testing::nodeclaim("default-b", "default", Some("exoscale://2")),
            &[("cpu", "2")],
        );
        unregistered.spec.termination_grace_period = Some("1h".into());
        index.apply_nodeclaim(unregistered);
        let mut web = testing::pod("apps", "web", Some("n1"));
        web.metadata.annotations = Some(BTreeMap::from([(
            DO_NOT_DISRUPT_ANNOTATION.to_string(),
            "true".to_string(),
        )]));
        index.apply_pod(web);
        let agent = testing::owned_by_daemonset(testing::pod("kube-system", "agent", Some("n1")));
        index.apply_pod(agent);
        let pending: HeldPod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "waiting", "namespace": "apps", "uid": "waiting"},
            "spec": {"containers": [{"name": "c"}]},
            "status": {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}
        }))
        .unwrap();
        index.apply_pod(pending);
        let mut pdb = testing::pdb("apps", "guard");
        pdb.spec = Some(
            serde_json::from_value(serde_json::json!({
                "maxUnavailable": 0, "selector": {"matchLabels": {"app": "web"}}
            }))
            .unwrap(),
        );
        index.apply_pdb(pdb);
        index
    }

    #[test]
    fn a_pdb_without_a_selector_selects_no_pod_and_an_empty_one_every_pod() {
        let with = |spec: serde_json::Value| {
            let mut p = testing::pdb("apps", "guard");
            p.spec = Some(serde_json::from_value(spec).unwrap());
            pdb(&p)
        };
        assert!(with(serde_json::json!({"maxUnavailable": 0})).is_none());
        let every = with(serde_json::json!({"maxUnavailable": 0, "selector": {}})).unwrap();
        let pod = testing::pod("apps", "web", Some("n1"));
        assert!(
            every
                .selector
                .matches(&pod.metadata.labels.unwrap_or_default())
        );
    }

    fn inputs<'a>(nominated: &'a dyn Fn(&str) -> bool, queued: &[&str]) -> ViewInputs<'a> {
        let pool = Arc::new(fixtures::nodepool("default", "{consolidateAfter: 0s}"));
        ViewInputs {
            now: at(100),
            pools: vec![(pool, fixtures::instance_types())],
            nominated,
            queued: queued.iter().map(|s| s.to_string()).collect(),
            options: SchedulerOptions::default(),
        }
    }

    #[test]
    fn nodes_pair_with_their_nodeclaims_and_carry_pods_and_conditions() {
        let view = build_view(&index(), inputs(&|_| false, &[]));
        assert_eq!(view.pools.len(), 1);
        assert_eq!(
            view.pools["default"].instance_types.len(),
            fixtures::instance_types().len()
        );
        let n1 = view.node("n1").expect("registered node");
        assert_eq!(n1.nodeclaim.as_deref(), Some("default-a"));
        assert!(n1.has_node && n1.initialized && n1.ready && n1.consolidatable);
        assert_eq!(n1.drifted_since, Some(at(7)));
        assert_eq!(n1.created_at, at(0));
        assert!(!n1.marked_for_deletion && !n1.is_nominated(view.now));
        assert_eq!(n1.pods.len(), 2);
        let web = n1.pods.iter().find(|p| p.pod.name == "web").unwrap();
        assert_eq!(web.owner, PodOwner::Workload);
        assert!(web.do_not_disrupt_active(view.now));
        let agent = n1.pods.iter().find(|p| p.pod.name == "agent").unwrap();
        assert_eq!(agent.owner, PodOwner::DaemonSet);
        assert_eq!(n1.scheduling.pods.len(), 2, "bound pods occupy the node");

        let b = view.node("default-b").expect("unregistered claim");
        assert!(!b.has_node && !b.initialized);
        assert_eq!(
            b.termination_grace_period,
            Some(std::time::Duration::from_secs(3600))
        );
        assert!(!b.scheduling.allocatable.is_empty());

        assert_eq!(view.pending_pods.len(), 1);
        assert_eq!(view.pending_pods[0].name, "waiting");
        assert_eq!(view.pdbs.len(), 1);
        assert!(view.pdbs[0].fully_blocking);
        assert_eq!(view.now, at(100));
    }

    /// [`index`] timing pod events at `at(seconds)`, its pod "web" on n1 listed (not an event).
    fn index_timing_pod_events_at(seconds: i64) -> ClusterIndex {
        let mut index = index();
        let clock = crate::clock::FixedClock::at(1_700_000_000 + seconds);
        index.set_clock(Arc::new(clock));
        index.begin_list(crate::state::Kind::Pod);
        index.apply_pod(testing::pod("apps", "web", Some("n1")));
        index.finish_list(crate::state::Kind::Pod);
        index
    }

    #[test]
    fn a_node_s_last_pod_event_is_the_later_of_the_stamp_and_what_the_index_saw() {
        let mut index = index_timing_pod_events_at(40);
        let mut stamped = claim("default-a", "exoscale://1");
        stamped.status.as_mut().unwrap().last_pod_event_time = Some(testing::ts(30));
        index.apply_nodeclaim(stamped);
        let seen = |index: &ClusterIndex| {
            build_view(index, inputs(&|_| false, &[]))
                .node("n1")
                .unwrap()
                .last_pod_event
        };
        assert_eq!(seen(&index), Some(at(30)), "only the stamp");
        // A pod leaves after the stamp: the view has it before any pass writes it.
        index.delete_pod("apps", "web");
        assert_eq!(seen(&index), Some(at(40)));
        // A later stamp wins over an older sighting.
        let mut restamped = claim("default-a", "exoscale://1");
        restamped.status.as_mut().unwrap().last_pod_event_time = Some(testing::ts(50));
        index.apply_nodeclaim(restamped);
        assert_eq!(seen(&index), Some(at(50)));
    }

    #[test]
    fn a_node_is_consolidatable_as_soon_as_it_is_quiet_not_when_the_condition_is_written() {
        let mut index = index_timing_pod_events_at(80);
        // Initialized at 0, never Consolidatable yet (the pass has not run).
        let c = testing::registered(testing::nodeclaim(
            "default-a",
            "default",
            Some("exoscale://1"),
        ));
        index.apply_nodeclaim(testing::set_condition(
            c,
            conditions::INITIALIZED,
            ConditionStatus::True,
            0,
        ));
        let after_30s = |index: &ClusterIndex| {
            let pool = Arc::new(fixtures::nodepool("default", "{consolidateAfter: 30s}"));
            let view = build_view(
                index,
                ViewInputs {
                    pools: vec![(pool, fixtures::instance_types())],
                    ..inputs(&|_| false, &[])
                },
            );
            view.node("n1").unwrap().consolidatable
        };
        assert!(
            after_30s(&index),
            "quiet since initialization at 0, now 100"
        );
        // A pod left at 80: not quiet until 110.
        index.delete_pod("apps", "web");
        assert!(!after_30s(&index));
    }

    #[test]
    fn nominated_and_queued_nodes_are_marked() {
        let view = build_view(&index(), inputs(&|n| n == "n1", &["exoscale://1"]));
        let n1 = view.node("n1").unwrap();
        assert!(n1.is_nominated(view.now));
        assert!(n1.marked_for_deletion);
        assert!(view.queued.contains("exoscale://1"));
    }

    #[test]
    fn nodepools_without_instance_types_stay_out_and_deleting_claims_are_marked() {
        let mut index = index();
        let mut deleting = claim("default-a", "exoscale://1");
        deleting.metadata.deletion_timestamp = Some(testing::ts(50));
        index.apply_nodeclaim(deleting);
        let view = build_view(
            &index,
            ViewInputs {
                pools: Vec::new(),
                ..inputs(&|_| false, &[])
            },
        );
        assert!(view.pools.is_empty());
        assert!(view.node("n1").unwrap().marked_for_deletion);
    }

    #[test]
    fn a_scheduled_zero_budget_blocks_an_empty_node_only_inside_its_window() {
        use crate::disruption::command::Method;
        use crate::disruption::methods::{DisruptionEvent, decide};
        let disruption = "{consolidateAfter: 0s, budgets: [{nodes: \"0\", schedule: \"0 9 * * *\", duration: 8h}]}";
        let mut index = ClusterIndex::default();
        index.apply_nodepool(fixtures::nodepool("default", disruption));
        index.apply_node(ready_node("n1", "exoscale://1"));
        index.apply_nodeclaim(claim("default-a", "exoscale://1"));
        let view_at = |now: DateTime<Utc>| {
            let pool = Arc::new(fixtures::nodepool("default", disruption));
            build_view(
                &index,
                ViewInputs {
                    now,
                    pools: vec![(pool, fixtures::instance_types())],
                    nominated: &|_| false,
                    queued: HashSet::new(),
                    options: SchedulerOptions::default(),
                },
            )
        };
        let day = DateTime::parse_from_rfc3339("2026-11-20T00:00:00Z")
            .unwrap()
            .to_utc();
        let inside = decide(&view_at(day + chrono::Duration::hours(10)), &|| false);
        assert!(inside.command.is_none(), "the window allows nothing");
        assert!(inside.events.iter().any(|e| matches!(e,
            DisruptionEvent::NodePoolBlocked { node_pool, .. } if node_pool == "default")));
        let outside = decide(&view_at(day + chrono::Duration::hours(20)), &|| false);
        let command = outside
            .command
            .expect("outside the window the empty node goes");
        assert_eq!(command.method, Method::Emptiness);
        assert_eq!(command.candidate_names(), ["n1"]);
    }
}
