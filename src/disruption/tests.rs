//! Decisions of the disruption methods on small clusters, through the real scheduler.

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, TimeZone, Utc};

use super::candidates::{DisruptionClass, candidates, sort_by_disruption_cost};
use super::command::{Decision, Method};
use super::fixtures::{instance_type, instance_types, node, nodepool, pod, pool, view};
use super::methods::{DisruptionEvent, Outcome, carry_first_seen, decide};
use super::model::{ClusterView, Pdb, StateNode};
use crate::scheduling::LabelSelector;

const UNDERUTILIZED: &str = "{consolidateAfter: 0s, consolidationPolicy: WhenEmptyOrUnderutilized, budgets: [{nodes: \"100%\"}]}";
/// As [`UNDERUTILIZED`], with a 30 s quiet period after pod events.
const AFTER_30S: &str = "{consolidateAfter: 30s, consolidationPolicy: WhenEmptyOrUnderutilized, budgets: [{nodes: \"100%\"}]}";

fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 3, 10, 12, 0, 0).unwrap()
}

fn hour_ago() -> DateTime<Utc> {
    now() - chrono::Duration::hours(1)
}

fn never_stop() -> bool {
    false
}

fn run(v: &ClusterView) -> Outcome {
    decide(v, &never_stop)
}

fn large() -> std::sync::Arc<crate::scheduling::InstanceType> {
    instance_type("large", 4)
}

fn cluster(disruption: &str, nodes: Vec<StateNode>) -> ClusterView {
    view(
        now(),
        vec![pool(nodepool("default", disruption), instance_types())],
        nodes,
    )
}

fn names(o: &Outcome) -> Vec<String> {
    o.command
        .as_ref()
        .map(|c| c.candidates.iter().map(|c| c.name.clone()).collect())
        .unwrap_or_default()
}

/// `n` drifted since `since`; a drifted node is not a consolidation candidate.
fn drifted(mut n: StateNode, since: DateTime<Utc>) -> StateNode {
    n.drifted_since = Some(since);
    n.consolidatable = false;
    n
}

#[test]
fn empty_node_is_removed_by_emptiness() {
    let v = cluster(
        UNDERUTILIZED,
        vec![
            node(
                "busy",
                "default",
                &large(),
                vec![pod("a", "3", "1Gi")],
                hour_ago(),
            ),
            node("idle", "default", &large(), vec![], hour_ago()),
        ],
    );
    let o = run(&v);
    let cmd = o.command.as_ref().expect("a command");
    assert_eq!(cmd.method, Method::Emptiness);
    assert_eq!(cmd.decision(), Decision::Delete);
    assert_eq!(names(&o), ["idle"]);
}

#[test]
fn a_node_whose_pods_left_within_consolidate_after_is_not_chosen_yet() {
    // `Consolidatable` is still True from the pass before the pods left; the pod event the
    // index saw since is what keeps the node out, until consolidateAfter has passed.
    let mut emptied = node("emptied", "default", &large(), vec![], hour_ago());
    emptied.last_pod_event = Some(now() - chrono::Duration::seconds(5));
    let mut underused = node(
        "underused",
        "default",
        &large(),
        vec![pod("a", "500m", "256Mi")],
        hour_ago(),
    );
    underused.last_pod_event = Some(now() - chrono::Duration::seconds(29));
    let idle = node("idle", "default", &large(), vec![], hour_ago());
    let mut v = cluster(AFTER_30S, vec![emptied, underused, idle]);
    let o = run(&v);
    assert_eq!(
        o.command.as_ref().map(|c| c.method),
        Some(Method::Emptiness)
    );
    assert_eq!(names(&o), ["idle"]);

    // Without the quiet node, nothing is left to consolidate: the underused node had a pod
    // event 29 s ago.
    v.nodes.retain(|n| n.name != "idle");
    v.nodes.retain(|n| n.name != "emptied");
    assert!(run(&v).command.is_none());

    // 30 s after their last pod events both are candidates again.
    let mut later = cluster(
        AFTER_30S,
        vec![
            node("emptied", "default", &large(), vec![], hour_ago()),
            node("idle", "default", &large(), vec![], hour_ago()),
        ],
    );
    later.nodes[0].last_pod_event = Some(now() - chrono::Duration::seconds(30));
    let o = run(&later);
    assert_eq!(names(&o), ["emptied", "idle"]);
}

#[test]
fn consolidation_does_not_move_running_pods_onto_a_node_that_is_settling() {
    // A scale-down is emptying "emptying" (its last pod left 5 s ago, consolidateAfter 30 s).
    // Deleting "full" would fit its pod there, refilling a node about to be empty; as
    // upstream, consolidation leaves settling nodes out as destinations of running pods.
    let full = node(
        "full",
        "default",
        &large(),
        vec![pod("a", "3", "1Gi")],
        hour_ago(),
    );
    let mut emptying = node("emptying", "default", &large(), vec![], hour_ago());
    emptying.last_pod_event = Some(now() - chrono::Duration::seconds(5));
    let v = cluster(AFTER_30S, vec![full.clone(), emptying.clone()]);
    let o = run(&v);
    assert!(o.command.is_none(), "got {:?}", names(&o));

    // Drift is not consolidation: a drifted node's pod may go to the settling node.
    let mut drifted = full.clone();
    drifted.drifted_since = Some(hour_ago());
    let o = run(&cluster(AFTER_30S, vec![drifted, emptying.clone()]));
    let cmd = o.command.as_ref().expect("a drift command");
    assert_eq!(cmd.method, Method::Drift);
    assert!(
        cmd.replacements.is_empty(),
        "the pod fits on the settling node"
    );

    // Once quiet, the emptied node is the one removed; the full node keeps its pod.
    let mut later = v.clone();
    later.now = now() + chrono::Duration::seconds(25);
    let o = run(&later);
    assert_eq!(
        o.command.as_ref().map(|c| c.method),
        Some(Method::Emptiness)
    );
    assert_eq!(names(&o), ["emptying"]);
}

/// "light" (one small pod on a large node) and "spread" (room for that pod), which received
/// pods 5 s ago (consolidateAfter 30 s), as every node does when kube-scheduler spreads the
/// pods of a node consolidation removed.
fn light_and_spread() -> (StateNode, StateNode) {
    let light = node(
        "light",
        "default",
        &large(),
        vec![pod("a", "500m", "256Mi")],
        hour_ago(),
    );
    let mut spread = node(
        "spread",
        "default",
        &large(),
        vec![pod("b", "3", "1Gi")],
        hour_ago(),
    );
    spread.last_pod_event = Some(now() - chrono::Duration::seconds(5));
    (light, spread)
}

#[test]
fn a_replacement_waits_while_the_pods_would_fit_on_nodes_that_are_settling() {
    // "light"'s pod would fit on "spread"; replacing "light" by a small node would launch a
    // node that is itself removed once "spread" settles.
    let (light, spread) = light_and_spread();
    let v = cluster(AFTER_30S, vec![light.clone(), spread.clone()]);
    let o = run(&v);
    assert!(o.command.is_none(), "got {:?}", o.command);
    assert_eq!(
        o.held_replacements.iter().collect::<Vec<_>>(),
        ["light"],
        "the hold is reported so the next pass knows since when"
    );
    assert!(o.events.iter().any(|e| matches!(e,
        DisruptionEvent::Unconsolidatable { node, message, .. }
            if node == "light" && message == super::methods::HELD_FOR_SETTLING)));

    // Held back 59 s so far: still within twice consolidateAfter.
    let mut held = v.clone();
    held.held_replacements
        .insert("light".into(), now() - chrono::Duration::seconds(59));
    assert!(run(&held).command.is_none());

    // A node that keeps settling (pods churning on it) holds the replacement back only so
    // long: after twice consolidateAfter "light" is replaced, as upstream would at once.
    held.held_replacements
        .insert("light".into(), now() - chrono::Duration::seconds(60));
    let o = run(&held);
    let cmd = o
        .command
        .as_ref()
        .expect("a replacement once the hold is over");
    assert_eq!(cmd.decision(), Decision::Replace);
    assert_eq!(names(&o), ["light"]);
    assert!(o.held_replacements.is_empty());

    // Once "spread" has settled, "light" is deleted with no new node.
    let mut settled = v.clone();
    settled.now = now() + chrono::Duration::seconds(25);
    let o = run(&settled);
    let cmd = o.command.as_ref().expect("a deletion once settled");
    assert_eq!(cmd.decision(), Decision::Delete, "got {:?}", names(&o));
    assert!(cmd.replacements.is_empty());

    // Pods that fit nowhere without a new node are replaced at once, settling or not.
    let mut full = node(
        "spread",
        "default",
        &large(),
        vec![pod("b", "3800m", "1Gi")],
        hour_ago(),
    );
    full.last_pod_event = spread.last_pod_event;
    let o = run(&cluster(AFTER_30S, vec![light, full]));
    let cmd = o.command.as_ref().expect("a replacement");
    assert_eq!(cmd.decision(), Decision::Replace);
    assert!(o.held_replacements.is_empty());
}

/// Whether an orchestration's actions delete NodeClaims now.
fn deletes_now(actions: &[super::orchestration::Action]) -> bool {
    actions
        .iter()
        .any(|a| matches!(a, super::orchestration::Action::DeleteNodeClaims { .. }))
}

/// One pass of the controller's loop over [`light_and_spread`], `secs` after [`now`], with the
/// holds the pass before left; "spread" had a pod event 5 s before (`settling`) or 40 s before.
/// Returns the pass's view and outcome and the holds it leaves.
fn light_and_spread_pass(
    secs: i64,
    settling: bool,
    held: &BTreeMap<String, DateTime<Utc>>,
) -> (ClusterView, Outcome, BTreeMap<String, DateTime<Utc>>) {
    let (light, spread) = light_and_spread();
    let mut v = cluster(AFTER_30S, vec![light, spread]);
    v.now = now() + chrono::Duration::seconds(secs);
    let quiet_for = if settling { 5 } else { 40 };
    v.nodes[1].last_pod_event = Some(v.now - chrono::Duration::seconds(quiet_for));
    v.held_replacements = held.clone();
    let o = run(&v);
    let carried = carry_first_seen(held, &o.held_replacements, v.now);
    (v, o, carried)
}

#[test]
fn a_hold_is_carried_from_pass_to_pass_and_ends_after_twice_consolidate_after() {
    // The controller's loop: each pass sees the holds the one before left. "spread" keeps
    // settling (a pod event 5 s before every pass: pods churning on it).
    let pass = |secs: i64, settling: bool, held: &BTreeMap<String, DateTime<Utc>>| {
        let (_, o, carried) = light_and_spread_pass(secs, settling, held);
        (o.command.as_ref().map(|c| c.decision()), carried)
    };
    let since = |held: &BTreeMap<String, DateTime<Utc>>| held.get("light").copied();

    let (decision, held) = pass(0, true, &BTreeMap::new());
    assert_eq!(decision, None);
    assert_eq!(since(&held), Some(now()));
    let (decision, held) = pass(30, true, &held);
    assert_eq!(decision, None);
    assert_eq!(since(&held), Some(now()), "the first pass's start is kept");
    let (decision, held) = pass(59, true, &held);
    assert_eq!(decision, None);
    let (decision, held) = pass(60, true, &held);
    assert_eq!(
        decision,
        Some(Decision::Replace),
        "60 s = 2 x consolidateAfter"
    );
    assert!(held.is_empty(), "a candidate not held is forgotten");

    // A pass that does not hold "light" (here "spread" is quiet: a deletion) ends the hold; a
    // later hold starts over.
    let (_, held) = pass(0, true, &BTreeMap::new());
    let (decision, held) = pass(25, false, &held);
    assert_eq!(decision, Some(Decision::Delete));
    assert!(held.is_empty());
    let (decision, held) = pass(70, true, &held);
    assert_eq!(decision, None);
    assert_eq!(since(&held), Some(now() + chrono::Duration::seconds(70)));
}

/// What passes watched counts across a command's validation, not across a wait for
/// replacements or a leadership gap.
#[test]
fn watched_nodes_are_forgotten_after_a_gap_between_passes() {
    use super::validation::passes_close_enough;
    let poll = std::time::Duration::from_secs(10);
    let at = |s: i64| now() + chrono::Duration::seconds(s);
    assert!(passes_close_enough(at(0), at(1), poll), "a standby recheck");
    assert!(
        passes_close_enough(at(0), at(16), poll),
        "across a validation"
    );
    assert!(passes_close_enough(at(0), at(35), poll));
    assert!(!passes_close_enough(at(0), at(36), poll));
    assert!(
        !passes_close_enough(at(0), at(300), poll),
        "replacements waited for"
    );
}

#[test]
fn a_deletion_held_for_the_validation_delay_starts_at_once_and_others_wait_for_it() {
    use super::orchestration::{Orchestration, Phase};
    use super::validation::watched_long_enough;
    // The controller's loop as above, then what it does with the pass's command.
    let pass = |secs: i64, settling: bool, held: &BTreeMap<String, DateTime<Utc>>| {
        let (v, o, carried) = light_and_spread_pass(secs, settling, held);
        let begun = o.command.map(|cmd| {
            let watched = watched_long_enough(&cmd, &v);
            let decision = cmd.decision();
            let (mut orchestration, mut actions) = Orchestration::begin(cmd, v.now, 0, watched);
            if watched {
                // Validated at once, against a view taken after deciding (here the same).
                assert_eq!(orchestration.phase, Phase::Validating { at: v.now });
                actions = orchestration.validate(&v);
            }
            (decision, watched, orchestration.phase, actions)
        });
        (begun, carried)
    };

    // Held at 0 s; "spread" has settled at 15 s: "light" is deleted at once, its hold having
    // been the re-check.
    let (begun, held) = pass(0, true, &BTreeMap::new());
    assert!(begun.is_none());
    let (begun, _) = pass(15, false, &held);
    let (decision, watched, phase, actions) = begun.expect("a deletion");
    assert_eq!(decision, Decision::Delete);
    assert!(watched);
    assert_eq!(phase, Phase::Done);
    assert!(deletes_now(&actions), "{actions:?}");

    // Held for 14 s only: the deletion waits for validation as any other.
    let (_, held) = pass(0, true, &BTreeMap::new());
    let (begun, _) = pass(14, false, &held);
    let (decision, watched, phase, actions) = begun.expect("a deletion");
    assert_eq!(decision, Decision::Delete);
    assert!(!watched);
    let at = now() + chrono::Duration::seconds(14 + 15);
    assert_eq!(phase, Phase::Validating { at });
    assert!(!deletes_now(&actions));

    // Never held: validation.
    let (begun, _) = pass(30, false, &BTreeMap::new());
    let (_, watched, phase, _) = begun.expect("a deletion");
    assert!(!watched);
    assert!(matches!(phase, Phase::Validating { .. }));

    // The replacement after a hold's limit is validated too.
    let (_, held) = pass(0, true, &BTreeMap::new());
    let (begun, _) = pass(60, true, &held);
    let (decision, watched, phase, _) = begun.expect("a replacement");
    assert_eq!(decision, Decision::Replace);
    assert!(!watched);
    assert!(matches!(phase, Phase::Validating { .. }));
}

#[test]
fn daemonset_and_mirror_pods_do_not_make_a_node_busy() {
    let mut ds = pod("ds", "100m", "64Mi");
    ds.owner = super::model::PodOwner::DaemonSet;
    let mut mirror = pod("static", "100m", "64Mi");
    mirror.owner = super::model::PodOwner::Node;
    let v = cluster(
        UNDERUTILIZED,
        vec![node("n", "default", &large(), vec![ds, mirror], hour_ago())],
    );
    assert_eq!(run(&v).command.map(|c| c.method), Some(Method::Emptiness));
}

#[test]
fn two_underused_nodes_become_one_cheaper_node() {
    let v = cluster(
        UNDERUTILIZED,
        vec![
            node(
                "a",
                "default",
                &large(),
                vec![pod("a1", "500m", "256Mi")],
                hour_ago(),
            ),
            node(
                "b",
                "default",
                &large(),
                vec![pod("b1", "500m", "256Mi")],
                hour_ago(),
            ),
        ],
    );
    let o = run(&v);
    let cmd = o.command.expect("a command");
    assert_eq!(cmd.method, Method::MultiNodeConsolidation);
    assert_eq!(cmd.decision(), Decision::Replace);
    assert_eq!(cmd.candidates.len(), 2);
    assert_eq!(cmd.replacements.len(), 1);
    let options: Vec<&str> = cmd.replacements[0]
        .instance_types
        .iter()
        .map(|it| it.name.as_str())
        .collect();
    assert_eq!(
        options,
        ["medium"],
        "only types strictly cheaper than the cheapest removed one"
    );
    assert!(cmd.estimated_savings() > 0.0);
}

#[test]
fn node_whose_pods_fit_elsewhere_is_deleted() {
    let v = cluster(
        UNDERUTILIZED,
        vec![
            node(
                "full",
                "default",
                &large(),
                vec![pod("f1", "1500m", "1Gi"), pod("f2", "1", "1Gi")],
                hour_ago(),
            ),
            node(
                "light",
                "default",
                &large(),
                vec![pod("l1", "500m", "256Mi")],
                hour_ago(),
            ),
        ],
    );
    let o = run(&v);
    // Each method reports the simulations it ran (the scheduling-duration histogram of the
    // disruption controller); emptiness needs none.
    assert!(o.metrics["emptiness"].simulations.is_empty());
    assert!(!o.metrics["single"].simulations.is_empty());
    let cmd = o.command.expect("a command");
    assert_eq!(cmd.method, Method::SingleNodeConsolidation);
    assert_eq!(cmd.decision(), Decision::Delete);
    assert_eq!(cmd.candidates[0].name, "light");
}

#[test]
fn single_node_is_replaced_only_by_a_strictly_cheaper_type() {
    // 1.5 CPU of pods on a large node: a medium (1.9 CPU allocatable) is cheaper.
    let v = cluster(
        UNDERUTILIZED,
        vec![node(
            "n",
            "default",
            &large(),
            vec![pod("p", "1500m", "1Gi")],
            hour_ago(),
        )],
    );
    let outcome = run(&v);
    let cmd = outcome.command.clone().expect("a command");
    assert_eq!(cmd.method, Method::SingleNodeConsolidation);
    assert_eq!(cmd.decision(), Decision::Replace);
    // Upstream's ConsolidationCandidate names the move and its savings.
    let candidate: Vec<_> = outcome
        .events
        .iter()
        .filter_map(|e| match e {
            DisruptionEvent::ConsolidationCandidate { node, message, .. } => Some((node, message)),
            _ => None,
        })
        .collect();
    assert_eq!(candidate.len(), 1, "{:?}", outcome.events);
    assert_eq!(candidate[0].0, "n");
    assert_eq!(
        candidate[0].1,
        &format!(
            "Consolidation candidate: Underutilized: replace: nodepools=[default]: [n] -> [1 replacement] (savings: ${:.2})",
            cmd.estimated_savings()
        )
    );
    assert!(cmd.estimated_savings() > 0.0);
    let options: Vec<&str> = cmd.replacements[0]
        .instance_types
        .iter()
        .map(|it| it.name.as_str())
        .collect();
    assert_eq!(options, ["medium"]);

    // The same pod on a medium node: nothing cheaper fits, so nothing happens.
    let medium = instance_type("medium", 2);
    let v = cluster(
        UNDERUTILIZED,
        vec![node(
            "n",
            "default",
            &medium,
            vec![pod("p", "1500m", "1Gi")],
            hour_ago(),
        )],
    );
    let o = run(&v);
    assert!(o.command.is_none());
    assert!(o.events.iter().any(|e| matches!(e,
        DisruptionEvent::Unconsolidatable { node, message, .. } if node == "n" && message == "Can't replace with a cheaper node")));
}

#[test]
fn no_replacement_is_launched_from_a_nodepool_that_is_not_ready() {
    // The cheaper-replacement case above, with its NodePool's NodeClass gone: provisioning
    // launches nothing from it, and neither does consolidation.
    let mut v = cluster(
        UNDERUTILIZED,
        vec![node(
            "n",
            "default",
            &large(),
            vec![pod("p", "1500m", "1Gi")],
            hour_ago(),
        )],
    );
    let pool = &mut v.pools.get_mut("default").unwrap().nodepool;
    let not_ready = crate::apis::ConditionStatus::False;
    pool.set_ready_condition(not_ready, "NodeClassNotFound", "NodeClass not found");
    let outcome = run(&v);
    assert!(outcome.command.is_none(), "{:?}", outcome.command);
    assert!(
        outcome.events.iter().any(|e| matches!(e,
            DisruptionEvent::Unconsolidatable { node, message, .. } if node == "n" && message == "not all pods would schedule, pod default/p: no nodepools found")),
        "{:?}",
        outcome.events
    );
}

#[test]
fn freshly_launched_replacement_is_not_consolidated_back() {
    // The replacement from the multi-node test: medium, not yet consolidatable.
    let medium = instance_type("medium", 2);
    let mut fresh = node(
        "new",
        "default",
        &medium,
        vec![pod("a1", "500m", "256Mi"), pod("b1", "500m", "256Mi")],
        now(),
    );
    fresh.consolidatable = false;
    let v = cluster(UNDERUTILIZED, vec![fresh.clone()]);
    assert!(run(&v).command.is_none());
    // Even once consolidatable, a medium holding 1 CPU cannot be replaced by anything cheaper.
    fresh.consolidatable = true;
    let v = cluster(UNDERUTILIZED, vec![fresh]);
    assert!(run(&v).command.is_none());
}

#[test]
fn when_empty_ignores_non_empty_nodes() {
    let policy =
        "{consolidateAfter: 0s, consolidationPolicy: WhenEmpty, budgets: [{nodes: \"100%\"}]}";
    let busy = || {
        vec![
            node(
                "a",
                "default",
                &large(),
                vec![pod("a1", "500m", "256Mi")],
                hour_ago(),
            ),
            node(
                "b",
                "default",
                &large(),
                vec![pod("b1", "500m", "256Mi")],
                hour_ago(),
            ),
        ]
    };
    let o = run(&cluster(policy, busy()));
    assert!(o.command.is_none());
    assert!(o.events.iter().any(|e| matches!(e,
        DisruptionEvent::Unconsolidatable { message, .. } if message.contains("non-empty consolidation disabled"))));
    let mut nodes = busy();
    nodes.push(node("idle", "default", &large(), vec![], hour_ago()));
    let o = run(&cluster(policy, nodes));
    assert_eq!(names(&o), ["idle"]);
}

#[test]
fn consolidate_after_never_disables_consolidation_and_emptiness() {
    let v = cluster(
        "{consolidateAfter: Never, budgets: [{nodes: \"100%\"}]}",
        vec![
            node("idle", "default", &large(), vec![], hour_ago()),
            node(
                "a",
                "default",
                &large(),
                vec![pod("a1", "500m", "256Mi")],
                hour_ago(),
            ),
        ],
    );
    assert!(run(&v).command.is_none());
}

#[test]
fn not_yet_consolidatable_nodes_wait() {
    let mut idle = node("idle", "default", &large(), vec![], hour_ago());
    idle.consolidatable = false;
    assert!(run(&cluster(UNDERUTILIZED, vec![idle])).command.is_none());
}

#[test]
fn node_do_not_disrupt_keeps_an_empty_node() {
    let mut idle = node("idle", "default", &large(), vec![], hour_ago());
    idle.do_not_disrupt = true;
    let o = run(&cluster(UNDERUTILIZED, vec![idle]));
    assert!(o.command.is_none());
    assert!(o.events.iter().any(|e| matches!(e,
        DisruptionEvent::Blocked { message, .. } if message.contains("karpenter.sh/do-not-disrupt"))));
}

#[test]
fn pod_do_not_disrupt_keeps_a_node_true_or_until_its_duration_elapses() {
    let with_annotation = |value: &str, started_min_ago: i64| {
        let mut p = pod("p", "500m", "256Mi");
        p.do_not_disrupt = Some(value.into());
        p.started_at = Some(now() - chrono::Duration::minutes(started_min_ago));
        cluster(
            UNDERUTILIZED,
            vec![node("n", "default", &large(), vec![p], hour_ago())],
        )
    };
    assert!(run(&with_annotation("true", 600)).command.is_none());
    assert!(run(&with_annotation("10m", 5)).command.is_none());
    assert!(run(&with_annotation("10m", 20)).command.is_some());
}

fn pdb(allowed: i32) -> Pdb {
    Pdb {
        namespace: "default".into(),
        name: "web".into(),
        selector: LabelSelector::from_labels([("app", "web")]),
        disruptions_allowed: allowed,
        ..Default::default()
    }
}

#[test]
fn blocking_pdb_keeps_a_node() {
    let mut p = pod("p", "500m", "256Mi");
    Arc::make_mut(&mut Arc::make_mut(&mut p.pod).labels).insert("app".into(), "web".into());
    let mut v = cluster(
        UNDERUTILIZED,
        vec![node("n", "default", &large(), vec![p], hour_ago())],
    );
    v.pdbs = vec![pdb(0)];
    let o = run(&v);
    assert!(o.command.is_none());
    assert!(o.events.iter().any(|e| matches!(e,
        DisruptionEvent::Blocked { message, .. } if message.contains("pdb prevents pod evictions"))));
    v.pdbs = vec![pdb(1)];
    assert!(run(&v).command.is_some());
    v.pdbs = vec![
        pdb(1),
        Pdb {
            name: "other".into(),
            ..pdb(1)
        },
    ];
    assert!(
        run(&v).command.is_none(),
        "a pod under two PDBs cannot be evicted"
    );
}

#[test]
fn scheduled_zero_budget_blocks_only_inside_the_window() {
    let policy = "{consolidateAfter: 0s, budgets: [{nodes: \"100%\"}, {nodes: \"0\", schedule: \"0 9 * * *\", duration: 8h}]}";
    let at = |h: u32| {
        let mut v = cluster(
            policy,
            vec![node("idle", "default", &large(), vec![], hour_ago())],
        );
        v.now = Utc.with_ymd_and_hms(2026, 3, 10, h, 0, 0).unwrap();
        v
    };
    let inside = run(&at(10));
    assert!(inside.command.is_none());
    assert!(inside.events.iter().any(|e| matches!(e, DisruptionEvent::NodePoolBlocked { node_pool, .. } if node_pool == "default")));
    assert!(run(&at(18)).command.is_some());
    assert!(run(&at(8)).command.is_some());
}

#[test]
fn a_budget_whose_schedule_upstream_refuses_blocks_and_says_why() {
    // Weekday 7 is Sunday to some cron dialects; upstream's parser refuses it.
    let policy = "{consolidateAfter: 0s, budgets: [{nodes: \"100%\"}, {nodes: \"0\", schedule: \"0 0 * * 7\", duration: 1h}]}";
    let v = cluster(
        policy,
        vec![node("idle", "default", &large(), vec![], hour_ago())],
    );
    let out = run(&v);
    assert!(out.command.is_none());
    let invalid = out.events.iter().find_map(|e| match e {
        DisruptionEvent::NodePoolBlocked {
            invalid_budgets, ..
        } => invalid_budgets.clone(),
        _ => None,
    });
    let invalid = invalid.expect("the blocked event names the unreadable budget");
    assert!(
        invalid.contains("0 0 * * 7") && invalid.contains("day of week"),
        "{invalid}"
    );
    // A valid window elsewhere in time leaves the node free to go, and no complaint.
    let policy = "{consolidateAfter: 0s, budgets: [{nodes: \"100%\"}, {nodes: \"0\", schedule: \"0 0 * * 6\", duration: 1h}]}";
    let v = cluster(
        policy,
        vec![node("idle", "default", &large(), vec![], hour_ago())],
    );
    assert!(run(&v).command.is_some());
}

#[test]
fn budget_percentage_limits_emptiness_and_counts_disrupting_nodes() {
    let policy = "{consolidateAfter: 0s, budgets: [{nodes: \"20%\"}]}";
    let mut nodes: Vec<StateNode> = (0..10)
        .map(|i| node(&format!("n{i}"), "default", &large(), vec![], hour_ago()))
        .collect();
    let o = run(&cluster(policy, nodes.clone()));
    assert_eq!(o.command.expect("a command").candidates.len(), 2);
    nodes[9].ready = false;
    let o = run(&cluster(policy, nodes.clone()));
    assert_eq!(
        o.command.expect("a command").candidates.len(),
        1,
        "a NotReady node consumes budget"
    );
    nodes[8].marked_for_deletion = true;
    let waiting = run(&cluster(policy, nodes)).command.expect("a command");
    assert!(
        waiting.candidates.is_empty(),
        "a deleting node consumes budget too"
    );
    let standby: Vec<&str> = waiting.standby.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        standby,
        ["n0", "n1"],
        "what the budget allows once nothing is disrupted waits for validation"
    );
}

#[test]
fn emptiness_waiting_on_a_spent_budget_lets_other_methods_go_first() {
    let spent = "{consolidateAfter: 0s, budgets: [{nodes: \"1\"}]}";
    let mut leaving = node("leaving", "default", &large(), vec![], hour_ago());
    leaving.marked_for_deletion = true;
    let empty = node("e1", "default", &large(), vec![], hour_ago());
    let waiting = run(&cluster(spent, vec![leaving.clone(), empty.clone()]))
        .command
        .expect("emptiness waits for the budget");
    assert_eq!(waiting.method, Method::Emptiness);
    assert!(waiting.candidates.is_empty());
    assert_eq!(waiting.standby.len(), 1);

    let drifted = drifted(
        node(
            "d1",
            "other",
            &large(),
            vec![pod("d1-p", "3", "1Gi")],
            hour_ago(),
        ),
        now() - chrono::Duration::minutes(5),
    );
    let v = view(
        now(),
        vec![
            pool(nodepool("default", spent), instance_types()),
            pool(nodepool("other", UNDERUTILIZED), instance_types()),
        ],
        vec![leaving, empty, drifted],
    );
    let cmd = run(&v).command.expect("a command");
    assert_eq!(cmd.method, Method::Drift, "the drift is decided now");
    assert_eq!(cmd.candidate_names(), ["d1"]);

    // A budget that allows nothing by itself has nothing to wait for.
    let zero = "{consolidateAfter: 0s, budgets: [{nodes: \"0\"}]}";
    let e = node("e1", "default", &large(), vec![], hour_ago());
    assert!(run(&cluster(zero, vec![e])).command.is_none());
}

#[test]
fn budget_reasons_only_limit_their_methods() {
    let policy =
        "{consolidateAfter: 0s, budgets: [{nodes: \"100%\"}, {nodes: \"0\", reasons: [Drifted]}]}";
    let o = run(&cluster(
        policy,
        vec![node("idle", "default", &large(), vec![], hour_ago())],
    ));
    assert_eq!(o.command.map(|c| c.method), Some(Method::Emptiness));
}

#[test]
fn drift_replaces_one_node_per_budget_unit() {
    let policy = "{consolidateAfter: 0s, budgets: [{nodes: \"1\"}]}";
    let drifted = |name: &str, minutes: i64| {
        let n = node(
            name,
            "default",
            &large(),
            vec![pod(&format!("{name}-p"), "3", "1Gi")],
            hour_ago(),
        );
        drifted(n, now() - chrono::Duration::minutes(minutes))
    };
    let mut nodes = vec![drifted("d1", 5), drifted("d2", 30), drifted("d3", 10)];
    let o = run(&cluster(policy, nodes.clone()));
    let cmd = o.command.expect("a drift command");
    assert_eq!(cmd.method, Method::Drift);
    assert_eq!(cmd.candidate_names(), ["d2"], "oldest drift first");
    assert_eq!(
        cmd.decision(),
        Decision::Replace,
        "3 CPU of pods need a new node"
    );
    assert_eq!(cmd.replacements.len(), 1);
    // While d2 is being replaced the budget is spent.
    nodes[1].marked_for_deletion = true;
    assert!(run(&cluster(policy, nodes)).command.is_none());
}

#[test]
fn static_pools_are_only_ever_disrupted_for_drift_one_for_one() {
    let policy = "{consolidateAfter: 0s, budgets: [{nodes: \"1\"}]}";
    let static_cluster = |replicas: i64, nodes: Vec<StateNode>| {
        let mut v = cluster(policy, nodes);
        for p in v.pools.values_mut() {
            p.nodepool.spec.replicas = Some(replicas);
        }
        v
    };
    // Empty and under-used static nodes stay: no emptiness, no consolidation.
    let idle = node("idle", "default", &large(), vec![], hour_ago());
    let light = node(
        "light",
        "default",
        &large(),
        vec![pod("p", "100m", "64Mi")],
        hour_ago(),
    );
    assert!(
        run(&static_cluster(2, vec![idle.clone(), light.clone()]))
            .command
            .is_none()
    );

    // A drifted static node is replaced by one template NodeClaim, pods or not.
    let mut drifted = light.clone();
    drifted.drifted_since = Some(now() - chrono::Duration::minutes(5));
    let o = run(&static_cluster(2, vec![idle.clone(), drifted.clone()]));
    let cmd = o.command.expect("a static drift command");
    assert_eq!(cmd.method, Method::StaticDrift);
    assert_eq!(cmd.candidate_names(), ["light"]);
    assert_eq!(cmd.replacements.len(), 1);
    assert!(cmd.replacements[0].pods.is_empty());
    assert!(!cmd.replacements[0].instance_types.is_empty());

    // Not while the pool is above its replicas (a scale-down goes first).
    assert!(
        run(&static_cluster(1, vec![idle.clone(), drifted.clone()]))
            .command
            .is_none()
    );
    // Not while the pool is not Ready: its replacement could not launch.
    let mut not_ready = static_cluster(2, vec![idle.clone(), drifted.clone()]);
    for p in not_ready.pools.values_mut() {
        let status = crate::apis::ConditionStatus::False;
        p.nodepool
            .set_ready_condition(status, "NodeClassNotReady", "gone");
    }
    assert!(run(&not_ready).command.is_none());
    // Not beyond the budget: the node being replaced spends it.
    let mut replacing = idle;
    replacing.drifted_since = Some(now() - chrono::Duration::minutes(9));
    replacing.marked_for_deletion = true;
    assert!(
        run(&static_cluster(2, vec![replacing, drifted]))
            .command
            .is_none()
    );
}

#[test]
fn drift_prefers_empty_nodes_and_may_take_pdb_blocked_nodes_with_a_grace_period() {
    let mut busy = drifted(
        node(
            "busy",
            "default",
            &large(),
            vec![pod("p", "3", "1Gi")],
            hour_ago(),
        ),
        now() - chrono::Duration::hours(2),
    );
    let idle = drifted(
        node("idle", "default", &large(), vec![], hour_ago()),
        now() - chrono::Duration::minutes(1),
    );
    let v = cluster(
        "{consolidateAfter: 0s, budgets: [{nodes: \"1\"}]}",
        vec![busy.clone(), idle],
    );
    assert_eq!(names(&run(&v)), ["idle"]);

    Arc::make_mut(&mut Arc::make_mut(&mut busy.pods[0].pod).labels)
        .insert("app".into(), "web".into());
    let mut v = cluster("{consolidateAfter: 0s}", vec![busy.clone()]);
    v.pdbs = vec![pdb(0)];
    assert!(run(&v).command.is_none());
    busy.termination_grace_period = Some(std::time::Duration::from_secs(3600));
    let mut v = cluster("{consolidateAfter: 0s}", vec![busy]);
    v.pdbs = vec![pdb(0)];
    assert_eq!(run(&v).command.map(|c| c.method), Some(Method::Drift));
}

#[test]
fn a_resting_pass_reports_what_blocks_each_node_as_a_deciding_pass_does() {
    // Three nodes, each kept for its own reason: a PDB, initialization, a do-not-disrupt
    // grace period; and a fourth with nothing to say.
    let mut guarded = pod("guarded", "500m", "256Mi");
    Arc::make_mut(&mut Arc::make_mut(&mut guarded.pod).labels).insert("app".into(), "web".into());
    let mut pinned = pod("pinned", "500m", "256Mi");
    pinned.do_not_disrupt = Some("10m".into());
    pinned.started_at = Some(now() - chrono::Duration::minutes(5));
    let mut fresh = node("fresh", "default", &large(), vec![], hour_ago());
    fresh.initialized = false;
    let mut v = cluster(
        UNDERUTILIZED,
        vec![
            node("guarded", "default", &large(), vec![guarded], hour_ago()),
            fresh,
            node("pinned", "default", &large(), vec![pinned], hour_ago()),
            node(
                "busy",
                "default",
                &large(),
                vec![pod("b", "3", "1Gi")],
                hour_ago(),
            ),
        ],
    );
    v.pdbs = vec![pdb(0)];
    let reported = |events: Vec<DisruptionEvent>| -> std::collections::BTreeSet<String> {
        events
            .into_iter()
            .filter_map(|e| match e {
                DisruptionEvent::Blocked { node, message, .. } => {
                    Some(format!("{node}: {message}"))
                }
                DisruptionEvent::DoNotDisrupt { name, message, .. } => {
                    Some(format!("{name}: {message}"))
                }
                _ => None,
            })
            .collect()
    };
    let resting = reported(super::methods::resting_events(&v));
    assert_eq!(resting, reported(run(&v).events));
    for expected in [
        "guarded: pdb prevents pod evictions",
        "fresh: node isn't initialized",
        "pinned: The karpenter.sh/do-not-disrupt grace period will elapse",
    ] {
        assert!(
            resting.iter().any(|r| r.starts_with(expected)),
            "{expected} in {resting:?}"
        );
    }
}

#[test]
fn candidate_filters_name_their_reason() {
    let base = || node("n", "default", &large(), vec![], hour_ago());
    let reason = |n: StateNode| {
        let v = cluster(UNDERUTILIZED, vec![n]);
        let (c, rejected) = candidates(&v, DisruptionClass::Graceful);
        assert!(c.is_empty());
        rejected[0].reason.clone()
    };
    let mut n = base();
    n.initialized = false;
    assert_eq!(reason(n), "node isn't initialized");
    let mut n = base();
    n.marked_for_deletion = true;
    assert_eq!(reason(n), "node is deleting or marked for deletion");
    let mut n = base();
    n.nominated_until = Some(now() + chrono::Duration::seconds(5));
    assert_eq!(reason(n), "node is nominated for a pending pod");
    let mut n = base();
    Arc::make_mut(&mut n.scheduling.labels)
        .insert(crate::apis::labels::NODEPOOL_LABEL.into(), "gone".into());
    assert_eq!(reason(n), "NodePool not found (NodePool=gone)");
    let mut n = base();
    n.has_node = false;
    assert_eq!(reason(n), "nodeclaim does not have an associated node");

    // Expired nomination, unmanaged and queued nodes.
    let mut n = base();
    n.nominated_until = Some(now() - chrono::Duration::seconds(1));
    let v = cluster(UNDERUTILIZED, vec![n]);
    assert_eq!(candidates(&v, DisruptionClass::Graceful).0.len(), 1);
    let mut n = base();
    n.nodeclaim = None;
    let v = cluster(UNDERUTILIZED, vec![n]);
    let (c, r) = candidates(&v, DisruptionClass::Graceful);
    assert!(
        c.is_empty() && r.is_empty(),
        "unmanaged nodes are silently skipped"
    );
    let mut v = cluster(UNDERUTILIZED, vec![base()]);
    v.queued.insert("exoscale://n".into());
    assert!(candidates(&v, DisruptionClass::Graceful).0.is_empty());
}

#[test]
fn candidates_are_ordered_by_disruption_cost() {
    let mut important = pod("important", "100m", "64Mi");
    important.priority = Some(1_000_000_000);
    let mut cheap = pod("cheap", "100m", "64Mi");
    cheap.deletion_cost = Some(-2_147_483_647.0);
    let mut old = node(
        "old",
        "default",
        &large(),
        vec![pod("o", "100m", "64Mi")],
        now() - chrono::Duration::hours(700),
    );
    old.expire_after = Some(std::time::Duration::from_secs(720 * 3600));
    let v = cluster(
        UNDERUTILIZED,
        vec![
            node(
                "important",
                "default",
                &large(),
                vec![important],
                hour_ago(),
            ),
            node(
                "plain",
                "default",
                &large(),
                vec![pod("p", "100m", "64Mi")],
                hour_ago(),
            ),
            node("cheap", "default", &large(), vec![cheap], hour_ago()),
            old,
        ],
    );
    let (mut c, _) = candidates(&v, DisruptionClass::Graceful);
    sort_by_disruption_cost(&mut c);
    let order: Vec<&str> = c.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(order, ["cheap", "old", "plain", "important"]);
    let expected = 10.0 * 719.0 / 720.0;
    assert!(
        (c[3].disruption_cost - expected).abs() < 1e-9,
        "eviction cost clamped to 10, times the lifetime remaining"
    );
}

mod validation_and_orchestration {
    use super::*;
    use crate::disruption::names;
    use crate::disruption::orchestration::{
        Action, EventTarget, Orchestration, Phase, ReplacementStatus,
    };
    use crate::disruption::validation::{ValidationError, validate};

    fn later(v: &ClusterView) -> ClusterView {
        let mut v = v.clone();
        v.now += chrono::Duration::seconds(15);
        v
    }

    fn two_underused() -> ClusterView {
        cluster(
            UNDERUTILIZED,
            vec![
                node(
                    "a",
                    "default",
                    &large(),
                    vec![pod("a1", "500m", "256Mi")],
                    hour_ago(),
                ),
                node(
                    "b",
                    "default",
                    &large(),
                    vec![pod("b1", "500m", "256Mi")],
                    hour_ago(),
                ),
            ],
        )
    }

    #[test]
    fn unchanged_cluster_passes_validation() {
        let v = two_underused();
        let cmd = run(&v).command.unwrap();
        let validated = validate(&cmd, &later(&v)).expect("still valid");
        assert_eq!(validated.candidate_names(), cmd.candidate_names());
    }

    #[test]
    fn nominated_candidate_is_rejected_as_churn() {
        let v = two_underused();
        let cmd = run(&v).command.unwrap();
        let mut fresh = later(&v);
        fresh.nodes[0].nominated_until = Some(fresh.now + chrono::Duration::seconds(10));
        assert!(matches!(validate(&cmd, &fresh), Err(ValidationError::Churn(n)) if n == "a"));
    }

    #[test]
    fn replacement_that_no_longer_fits_is_rejected() {
        let v = two_underused();
        let cmd = run(&v).command.unwrap();
        assert_eq!(cmd.replacements[0].instance_types[0].name, "medium");
        // A bigger pod landed on `a`: the replacement now needs more than a medium.
        let mut fresh = later(&v);
        let p = pod("a2", "2", "1Gi");
        fresh.nodes[0]
            .scheduling
            .pods
            .push(Arc::new(crate::scheduling::BoundPod {
                namespace: "default".into(),
                requests: p.pod.requests.clone(),
                ..Default::default()
            }));
        fresh.nodes[0].pods.push(p);
        let err = validate(&cmd, &fresh).unwrap_err();
        assert!(matches!(err, ValidationError::Scheduling(_)), "{err}");
        let (mut o, _) = Orchestration::new(cmd, v.now, 0);
        let actions = o.validate(&fresh);
        assert!(matches!(o.phase, Phase::Failed { .. }));
        assert!(actions.iter().any(|a| matches!(
            a,
            Action::Event {
                reason: "ConsolidationRejected",
                ..
            }
        )));
        assert!(actions.iter().any(|a| matches!(a, Action::Count { metric, .. } if *metric == crate::disruption::names::FAILED_VALIDATIONS_TOTAL)));
        assert!(
            !actions
                .iter()
                .any(|a| matches!(a, Action::DeleteNodeClaims { .. } | Action::Taint { .. }))
        );
    }

    #[test]
    fn delete_that_now_needs_a_new_node_is_rejected() {
        let v = cluster(
            UNDERUTILIZED,
            vec![
                node(
                    "full",
                    "default",
                    &large(),
                    vec![pod("f1", "1500m", "1Gi"), pod("f2", "1", "1Gi")],
                    hour_ago(),
                ),
                node(
                    "light",
                    "default",
                    &large(),
                    vec![pod("l1", "500m", "256Mi")],
                    hour_ago(),
                ),
            ],
        );
        let cmd = run(&v).command.unwrap();
        assert_eq!(cmd.decision(), Decision::Delete);
        let mut fresh = later(&v);
        // `full` filled up meanwhile: `light`'s pod has nowhere to go without a new node.
        fresh.nodes[0].scheduling.allocatable = crate::scheduling::Resources::from_literals(&[
            ("cpu", "2600m"),
            ("memory", "7Gi"),
            ("pods", "110"),
        ]);
        assert!(matches!(
            validate(&cmd, &fresh),
            Err(ValidationError::Scheduling(_))
        ));
    }

    #[test]
    fn emptiness_validation_keeps_the_nodes_still_empty() {
        let v = cluster(
            UNDERUTILIZED,
            vec![
                node("e1", "default", &large(), vec![], hour_ago()),
                node("e2", "default", &large(), vec![], hour_ago()),
            ],
        );
        let cmd = run(&v).command.unwrap();
        assert_eq!(cmd.candidates.len(), 2);
        let mut fresh = later(&v);
        fresh.nodes[0].pods.push(pod("arrived", "100m", "64Mi"));
        let kept = validate(&cmd, &fresh).unwrap();
        assert_eq!(kept.candidate_names(), ["e2"]);
        fresh.nodes[1].pods.push(pod("arrived2", "100m", "64Mi"));
        assert_eq!(validate(&cmd, &fresh).unwrap_err(), ValidationError::Empty);
    }

    #[test]
    fn emptiness_validation_fills_the_budget_freed_while_it_waited() {
        let policy = "{consolidateAfter: 0s, budgets: [{nodes: \"3\"}]}";
        let mut nodes: Vec<StateNode> = (1..=4)
            .map(|i| node(&format!("e{i}"), "default", &large(), vec![], hour_ago()))
            .collect();
        // The previous command's nodes, still being torn down, spend two of the three.
        for name in ["leaving1", "leaving2"] {
            let mut leaving = node(name, "default", &large(), vec![], hour_ago());
            leaving.marked_for_deletion = true;
            nodes.push(leaving);
        }
        let v = cluster(policy, nodes);
        let cmd = run(&v).command.unwrap();
        assert_eq!(cmd.candidate_names(), ["e1"], "one budget unit left");
        let standby: Vec<&str> = cmd.standby.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            standby,
            ["e2", "e3"],
            "up to the budget once nothing is disrupted"
        );

        let still_leaving = later(&v);
        assert_eq!(
            validate(&cmd, &still_leaving).unwrap().candidate_names(),
            ["e1"],
            "the budget is still spent: the standby waits"
        );

        let mut gone = later(&v);
        gone.nodes.retain(|n| !n.name.starts_with("leaving"));
        // A pod landed on e2 meanwhile: it is no longer empty, so e3 takes a freed unit.
        gone.nodes[1].pods.push(pod("arrived", "100m", "64Mi"));
        let validated = validate(&cmd, &gone).unwrap();
        assert_eq!(validated.candidate_names(), ["e1", "e3"]);
        assert!(validated.standby.is_empty());

        // The decided candidate is no longer empty: only the standby is kept.
        gone.nodes[0]
            .pods
            .push(pod("arrived-on-e1", "100m", "64Mi"));
        assert_eq!(validate(&cmd, &gone).unwrap().candidate_names(), ["e3"]);
    }

    #[test]
    fn a_command_of_standby_nodes_starts_only_once_the_budget_frees() {
        let policy = "{consolidateAfter: 0s, budgets: [{nodes: \"1\"}]}";
        let mut leaving = node("leaving", "default", &large(), vec![], hour_ago());
        leaving.marked_for_deletion = true;
        let v = cluster(
            policy,
            vec![leaving, node("e1", "default", &large(), vec![], hour_ago())],
        );
        let cmd = run(&v).command.unwrap();
        assert!(cmd.candidates.is_empty());

        // Still spent at validation: done, with nothing rejected or counted.
        let (mut o, _) = Orchestration::new(cmd.clone(), v.now, 0);
        assert!(o.validate(&later(&v)).is_empty());
        assert_eq!(o.phase, Phase::Done);

        // The leaving node is gone by then: e1 is tainted and deleted.
        let (mut o, _) = Orchestration::new(cmd, v.now, 0);
        let mut fresh = later(&v);
        fresh.nodes.retain(|n| n.name != "leaving");
        let actions = o.validate(&fresh);
        assert!(actions.iter().any(
            |a| matches!(a, Action::DeleteNodeClaims { nodeclaims } if nodeclaims.len() == 1)
        ));
        assert_eq!(o.command.candidate_names(), ["e1"]);
    }

    #[test]
    fn empty_nodes_watched_for_the_validation_delay_go_at_once_while_no_pod_is_pending() {
        use crate::disruption::methods::carry_first_seen;
        use crate::disruption::orchestration::STANDBY_RECHECK;
        use crate::disruption::validation::watched_long_enough;
        use std::collections::BTreeMap;
        type Since = BTreeMap<String, DateTime<Utc>>;
        // The controller's loop: each pass sees which nodes the passes before found empty.
        let policy = "{consolidateAfter: 0s, budgets: [{nodes: \"1\"}]}";
        let empty = |name: &str| node(name, "default", &large(), vec![], hour_ago());
        let pass = |secs: i64, nodes: Vec<StateNode>, since: &Since, pending: bool| {
            let mut v = cluster(policy, nodes);
            v.now = now() + chrono::Duration::seconds(secs);
            v.empty_since = since.clone();
            if pending {
                v.pending_pods
                    .push(crate::scheduling::fixtures::pod("waiting", "100m", "64Mi"));
            }
            let o = run(&v);
            let carried = carry_first_seen(since, &o.empty_nodes, v.now);
            let cmd = o.command.expect("an emptiness command");
            let watched = watched_long_enough(&cmd, &v);
            let (mut orchestration, mut actions) = Orchestration::begin(cmd, v.now, 0, watched);
            if watched && !orchestration.command.candidates.is_empty() {
                // Validated at once, against a view taken after deciding (here the same).
                assert_eq!(orchestration.phase, Phase::Validating { at: v.now });
                actions = orchestration.validate(&v);
            }
            (watched, orchestration, actions, carried)
        };

        // First seen at 0 s: e1 waits for validation; e2, over the budget, is remembered too.
        let (watched, o, actions, since) =
            pass(0, vec![empty("e1"), empty("e2")], &Since::new(), false);
        assert!(!watched);
        assert!(matches!(o.phase, Phase::Validating { .. }));
        assert!(!deletes_now(&actions));
        assert_eq!(since.keys().collect::<Vec<_>>(), ["e1", "e2"]);

        // 14 s later: not yet watched long enough.
        let (watched, ..) = pass(14, vec![empty("e1"), empty("e2")], &since, false);
        assert!(!watched);
        // 15 s later: deleted at once, the first seen time kept.
        let (watched, o, actions, carried) =
            pass(15, vec![empty("e1"), empty("e2")], &since, false);
        assert!(watched);
        assert_eq!(o.phase, Phase::Done);
        assert!(deletes_now(&actions), "{actions:?}");
        assert_eq!(carried.get("e2"), Some(&now()));
        // A pod bound to e1 while that pass decided (a decision can take minutes): the at-once
        // validation sees it in a view taken after the decision, and e1 is not deleted.
        let mut decided = cluster(policy, vec![empty("e1"), empty("e2")]);
        decided.now = now() + chrono::Duration::seconds(15);
        decided.empty_since = since.clone();
        let cmd = run(&decided).command.expect("an emptiness command");
        assert_eq!(cmd.candidate_names(), ["e1"]);
        let (mut o, _) = Orchestration::begin(cmd, decided.now, 0, true);
        let mut arrived = empty("e1");
        arrived.pods.push(pod("arrived", "100m", "64Mi"));
        let mut fresh = cluster(policy, vec![arrived, empty("e2")]);
        fresh.now = decided.now;
        let actions = o.validate(&fresh);
        assert!(!deletes_now(&actions), "{actions:?}");
        assert!(matches!(o.phase, Phase::Failed { .. }), "{:?}", o.phase);
        // A pod came and left between two passes (its event at 14 s): every pass saw e1 empty,
        // yet it was not empty throughout. Validation.
        let mut churned = empty("e1");
        churned.last_pod_event = Some(now() + chrono::Duration::seconds(14));
        let (watched, o, ..) = pass(16, vec![churned, empty("e2")], &since, false);
        assert!(!watched);
        assert!(matches!(o.phase, Phase::Validating { .. }));
        // A pod pending: validation, it may be about to be nominated to an empty node.
        let (watched, o, ..) = pass(15, vec![empty("e1"), empty("e2")], &since, true);
        assert!(!watched);
        assert!(matches!(o.phase, Phase::Validating { .. }));

        // e1 being torn down spends the budget: e2, watched, looks again in a second, not 15,
        // and goes once e1 is gone.
        let mut leaving = empty("e1");
        leaving.marked_for_deletion = true;
        let (watched, mut o, _, _) = pass(20, vec![leaving, empty("e2")], &since, false);
        assert!(watched);
        assert!(o.command.candidates.is_empty());
        let recheck = now()
            + chrono::Duration::seconds(20)
            + chrono::Duration::from_std(STANDBY_RECHECK).unwrap();
        assert_eq!(o.phase, Phase::Validating { at: recheck });
        let mut fresh = cluster(policy, vec![empty("e2")]);
        fresh.now = recheck;
        let mut with_pending = fresh.clone();
        with_pending
            .pending_pods
            .push(crate::scheduling::fixtures::pod("waiting", "100m", "64Mi"));
        let mut waits = o.clone();
        assert!(
            waits.validate(&with_pending).is_empty(),
            "a pod pending by then"
        );
        assert_eq!(waits.phase, Phase::Done);
        assert!(deletes_now(&o.validate(&fresh)));
        assert_eq!(o.command.candidate_names(), ["e2"]);

        // A pass that finds e2 busy forgets it: its next deletion waits for validation again.
        let mut busy = empty("e2");
        busy.pods.push(pod("arrived", "100m", "64Mi"));
        let (_, _, _, since) = pass(30, vec![empty("e1"), busy], &since, false);
        assert_eq!(since.keys().collect::<Vec<_>>(), ["e1"]);
        let (watched, ..) = pass(40, vec![empty("e2")], &since, false);
        assert!(!watched);
    }

    #[test]
    fn replacement_is_launched_and_initialized_before_candidates_are_deleted() {
        let v = two_underused();
        let cmd = run(&v).command.unwrap();
        let (mut o, actions) = Orchestration::new(cmd, v.now, 0);
        assert!(
            matches!(actions.as_slice(), [Action::RequeueAt(at)] if *at == v.now + chrono::Duration::seconds(15))
        );
        // Too early: wait on.
        let mut early = v.clone();
        early.now += chrono::Duration::seconds(5);
        assert!(matches!(
            o.validate(&early).as_slice(),
            [Action::RequeueAt(_)]
        ));
        let fresh = later(&v);
        let actions = o.validate(&fresh);
        let kinds: Vec<&str> = actions
            .iter()
            .filter_map(|a| match a {
                Action::Taint { .. } => Some("taint"),
                Action::SetDisruptionReason { .. } => Some("reason"),
                Action::LaunchReplacements { .. } => Some("launch"),
                Action::MarkForDeletion { .. } => Some("mark"),
                Action::DeleteNodeClaims { .. } => Some("delete"),
                _ => None,
            })
            .collect();
        assert_eq!(kinds, ["taint", "reason", "launch", "mark"]);
        // Upstream's events go on the replacements: launching, then waiting on readiness.
        let on_replacements = |actions: &[Action], wanted: &str| {
            actions.iter().any(|a| {
                matches!(a, Action::Event { target: EventTarget::Replacements, reason, message }
                    if *reason == wanted && !message.is_empty())
            })
        };
        assert!(on_replacements(&actions, names::EVENT_DISRUPTION_LAUNCHING));
        let t = fresh.now;
        let waiting = o.observe(
            &[ReplacementStatus::Pending],
            t + chrono::Duration::seconds(30),
        );
        assert!(on_replacements(
            &waiting,
            names::EVENT_DISRUPTION_WAITING_READINESS
        ));
        assert!(waiting.iter().any(|a| matches!(a, Action::RequeueAt(_))));
        assert!(
            !waiting
                .iter()
                .any(|a| matches!(a, Action::DeleteNodeClaims { .. }))
        );
        let done = o.observe(
            &[ReplacementStatus::Initialized],
            t + chrono::Duration::seconds(90),
        );
        assert!(
            matches!(&done[0], Action::DeleteNodeClaims { nodeclaims } if nodeclaims == &["nc-a", "nc-b"])
        );
        assert!(
            done.iter()
                .any(|a| matches!(a, Action::Count { metric, labels }
            if *metric == crate::disruption::names::NODECLAIMS_DISRUPTED_TOTAL
                && labels.contains(&("reason", "underutilized".to_string()))))
        );
        let moving: u64 = o
            .command
            .candidates
            .iter()
            .map(|c| c.reschedulable.len() as u64)
            .sum();
        let initiated: u64 = done
            .iter()
            .filter_map(|a| match a {
                Action::Add { metric, amount, .. }
                    if *metric == crate::disruption::names::PODS_DISRUPTION_INITIATED_TOTAL =>
                {
                    Some(*amount)
                }
                _ => None,
            })
            .sum();
        assert!(moving > 0, "the under-used nodes host pods");
        assert_eq!(initiated, moving, "every pod that must move is counted");
        assert_eq!(o.phase, Phase::Done);
    }

    #[test]
    fn failed_or_slow_replacement_restores_the_candidates() {
        let v = two_underused();
        let start = |v: &ClusterView| {
            let (mut o, _) = Orchestration::new(run(v).command.unwrap(), v.now, 0);
            o.validate(&later(v));
            o
        };
        let mut o = start(&v);
        let actions = o.observe(
            &[ReplacementStatus::Gone],
            v.now + chrono::Duration::seconds(60),
        );
        assert!(matches!(&actions[0], Action::Restore { nodes, .. } if nodes == &["a", "b"]));
        assert!(
            !actions
                .iter()
                .any(|a| matches!(a, Action::DeleteNodeClaims { .. }))
        );
        assert!(matches!(o.phase, Phase::Failed { .. }));

        let mut o = start(&v);
        let actions = o.observe(
            &[ReplacementStatus::Pending],
            v.now + chrono::Duration::minutes(11),
        );
        assert!(
            matches!(&actions[0], Action::Restore { .. }),
            "10 min timeout"
        );

        let mut o = start(&v);
        let actions = o.launch_failed("insufficient capacity");
        assert!(matches!(&actions[0], Action::Restore { .. }));
    }

    #[test]
    fn drift_starts_without_validation_and_deletes_only_empty_nodes_at_once() {
        let idle = drifted(
            node("idle", "default", &large(), vec![], hour_ago()),
            hour_ago(),
        );
        let v = cluster("{consolidateAfter: 0s}", vec![idle]);
        let cmd = run(&v).command.unwrap();
        assert_eq!(cmd.method, Method::Drift);
        let (o, actions) = Orchestration::new(cmd, v.now, 0);
        assert_eq!(o.phase, Phase::Done);
        assert!(
            actions
                .iter()
                .any(|a| matches!(a, Action::DeleteNodeClaims { .. }))
        );
    }
}

#[test]
fn pods_are_not_moved_onto_uninitialized_nodes() {
    // `light`'s pod would fit on `booting`, which is not initialized yet: nothing is deleted,
    // and no replacement is cheaper than a medium either.
    let medium = instance_type("medium", 2);
    let mut booting = node("booting", "default", &large(), vec![], now());
    booting.initialized = false;
    booting.scheduling.initialized = false;
    booting.consolidatable = false;
    let v = cluster(
        UNDERUTILIZED,
        vec![
            booting,
            node(
                "light",
                "default",
                &medium,
                vec![pod("l1", "1500m", "256Mi")],
                hour_ago(),
            ),
        ],
    );
    let o = run(&v);
    assert!(
        o.command.is_none(),
        "{:?}",
        o.command.map(|c| c.candidate_names().join(","))
    );
    assert!(o.events.iter().any(|e| matches!(e,
        DisruptionEvent::Unconsolidatable { node, message, .. } if node == "light" && message.contains("uninitialized"))));
}

#[test]
fn pods_of_deleting_nodes_need_room_too() {
    // `light`'s 1 CPU pod fits on `big`, unless the 3 CPU pod of the deleting node goes there first.
    let mut leaving = node(
        "leaving",
        "default",
        &large(),
        vec![pod("x", "3", "1Gi")],
        hour_ago(),
    );
    leaving.marked_for_deletion = true;
    let medium = instance_type("medium", 2);
    let nodes = |with_leaving: bool| {
        let mut n = vec![
            node("big", "default", &large(), vec![], now()),
            node(
                "light",
                "default",
                &medium,
                vec![pod("l1", "1", "256Mi")],
                hour_ago(),
            ),
        ];
        n[0].consolidatable = false;
        if with_leaving {
            n.push(leaving.clone());
        }
        n
    };
    let o = run(&cluster(UNDERUTILIZED, nodes(false)));
    assert_eq!(names(&o), ["light"]);
    let o = run(&cluster(UNDERUTILIZED, nodes(true)));
    assert!(o.command.is_none());
}

#[test]
fn topology_spread_pods_are_simulated_against_every_node() {
    // A zonal spread constraint forces the full (unpruned) simulation; the result is the same
    // delete as without it since the cluster has a single zone.
    let mut spread = pod("s", "500m", "256Mi");
    let spread_pod = Arc::make_mut(&mut spread.pod);
    Arc::make_mut(&mut spread_pod.labels).insert("app".into(), "s".into());
    spread_pod.topology_spread = vec![crate::scheduling::TopologySpreadConstraint::new(
        crate::scheduling::labels::ZONE,
        1,
        LabelSelector::from_labels([("app", "s")]),
    )];
    let v = cluster(
        UNDERUTILIZED,
        vec![
            node(
                "full",
                "default",
                &large(),
                vec![pod("f1", "1500m", "1Gi"), pod("f2", "1", "1Gi")],
                hour_ago(),
            ),
            node("light", "default", &large(), vec![spread], hour_ago()),
        ],
    );
    let cmd = run(&v).command.expect("a command");
    assert_eq!(
        (cmd.method, cmd.decision()),
        (Method::SingleNodeConsolidation, Decision::Delete)
    );
    assert_eq!(cmd.candidate_names(), ["light"]);
}

#[test]
fn multi_node_takes_the_longest_prefix_that_consolidates() {
    let nodes = (0..3)
        .map(|i| {
            node(
                &format!("n{i}"),
                "default",
                &large(),
                vec![pod(&format!("p{i}"), "500m", "256Mi")],
                hour_ago(),
            )
        })
        .collect();
    let cmd = run(&cluster(UNDERUTILIZED, nodes))
        .command
        .expect("a command");
    assert_eq!(cmd.method, Method::MultiNodeConsolidation);
    assert_eq!(cmd.candidates.len(), 3);
    assert_eq!(cmd.replacements[0].instance_types[0].name, "medium");
}

#[test]
fn multi_node_respects_the_budget() {
    let policy = "{consolidateAfter: 0s, budgets: [{nodes: \"2\"}]}";
    let nodes = (0..4)
        .map(|i| {
            node(
                &format!("n{i}"),
                "default",
                &large(),
                vec![pod(&format!("p{i}"), "300m", "256Mi")],
                hour_ago(),
            )
        })
        .collect();
    let cmd = run(&cluster(policy, nodes)).command.expect("a command");
    assert_eq!(cmd.method, Method::MultiNodeConsolidation);
    assert_eq!(cmd.candidates.len(), 2, "two budget units, two nodes");
}

#[test]
fn single_node_candidates_alternate_between_node_pools() {
    use super::methods::interleave_by_pool;
    let mut v = cluster(UNDERUTILIZED, vec![]);
    v.pools.insert(
        "other".into(),
        pool(nodepool("other", UNDERUTILIZED), instance_types()),
    );
    v.nodes = vec![
        node(
            "a1",
            "default",
            &large(),
            vec![pod("a1p", "100m", "64Mi")],
            hour_ago(),
        ),
        node(
            "a2",
            "default",
            &large(),
            vec![pod("a2p", "100m", "64Mi")],
            hour_ago(),
        ),
        node(
            "b1",
            "other",
            &large(),
            vec![pod("b1p", "100m", "64Mi")],
            hour_ago(),
        ),
    ];
    let (mut c, _) = candidates(&v, DisruptionClass::Graceful);
    sort_by_disruption_cost(&mut c);
    let order: Vec<String> = interleave_by_pool(c).into_iter().map(|c| c.name).collect();
    assert_eq!(order, ["a1", "b1", "a2"]);
}

#[test]
fn balanced_rejects_moves_that_disrupt_much_more_than_they_save() {
    let cluster_with = |policy: &str| {
        let busy_pods = (0..30)
            .map(|i| pod(&format!("b{i}"), "50m", "32Mi"))
            .collect();
        let mut nodes = vec![node("busy", "default", &large(), busy_pods, hour_ago())];
        for name in ["o1", "o2"] {
            let mut n = node(
                name,
                "default",
                &large(),
                vec![pod(&format!("{name}-p"), "1500m", "1Gi")],
                hour_ago(),
            );
            n.consolidatable = false;
            nodes.push(n);
        }
        cluster(
            &format!(
                "{{consolidateAfter: 0s, consolidationPolicy: {policy}, budgets: [{{nodes: \"100%\"}}]}}"
            ),
            nodes,
        )
    };
    // Deleting `busy` saves a third of the pool's cost but causes ~89 % of its disruption.
    let view = cluster_with("Balanced");
    assert!(run(&view).command.is_none());
    // Deleting it, as a move, is rejected with its score (karpenter_consolidation_moves_total
    // and karpenter_consolidation_score labels).
    let (all, _) = candidates(&view, DisruptionClass::Graceful);
    let totals = super::balanced::pool_totals(&view, &all);
    let busy = all
        .iter()
        .find(|c| c.name == "busy")
        .expect("busy is a candidate");
    let delete_busy = super::command::Command {
        method: Method::SingleNodeConsolidation,
        candidates: vec![busy.clone()],
        replacements: Vec::new(),
        standby: Vec::new(),
    };
    let scores = super::balanced::scores(&delete_busy, &totals);
    let moves = super::methods::moves_of(&delete_busy, &scores, false);
    assert_eq!(moves.len(), 1);
    assert_eq!(
        (
            moves[0].nodepool.as_str(),
            moves[0].decision,
            moves[0].policy
        ),
        ("default", "rejected", "Balanced")
    );
    assert!(moves[0].score.is_some_and(|s| s < 0.5), "{moves:?}");
    let cmd = run(&cluster_with("WhenEmptyOrUnderutilized"))
        .command
        .expect("a command");
    assert_eq!(
        (cmd.decision(), cmd.candidate_names()),
        (Decision::Delete, vec!["busy"])
    );
}

#[test]
fn an_approved_balanced_move_names_its_score_on_each_candidate() {
    let cluster_with = |policy: &str| {
        let nodes = ["n1", "n2", "n3"]
            .into_iter()
            .map(|name| {
                node(
                    name,
                    "default",
                    &large(),
                    vec![pod(&format!("{name}-p"), "100m", "64Mi")],
                    hour_ago(),
                )
            })
            .collect();
        cluster(
            &format!(
                "{{consolidateAfter: 0s, consolidationPolicy: {policy}, budgets: [{{nodes: \"100%\"}}]}}"
            ),
            nodes,
        )
    };
    let outcome = run(&cluster_with("Balanced"));
    let cmd = outcome
        .command
        .expect("a Balanced pool approves moving tiny pods");
    let approved: Vec<(String, String)> = outcome
        .events
        .iter()
        .filter_map(|e| match e {
            DisruptionEvent::ConsolidationApproved { node, message, .. } => {
                Some((node.clone(), message.clone()))
            }
            _ => None,
        })
        .collect();
    let names: Vec<&str> = approved.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, cmd.candidate_names());
    assert!(
        approved
            .iter()
            .all(|(_, m)| m.contains("threshold 0.50") && m.contains("k: 2")),
        "{approved:?}"
    );
    assert!(
        outcome
            .moves
            .iter()
            .any(|m| m.decision == "approved" && m.score.is_some_and(|s| s >= 0.5)),
        "{:?}",
        outcome.moves
    );
    // Other policies score nothing, so they say nothing (their moves are counted unscored).
    let plain = run(&cluster_with("WhenEmptyOrUnderutilized"));
    assert!(plain.command.is_some());
    assert!(
        plain
            .moves
            .iter()
            .all(|m| m.score.is_none() && m.policy == "WhenEmptyOrUnderutilized")
    );
    assert!(
        !plain
            .events
            .iter()
            .any(|e| matches!(e, DisruptionEvent::ConsolidationApproved { .. }))
    );
}

#[test]
fn duration_valued_do_not_disrupt_is_reported_as_upstream_does() {
    let annotated = |name: &str, value: &str, started_minutes_ago: Option<i64>| {
        let mut p = pod(name, "100m", "64Mi");
        p.do_not_disrupt = Some(value.into());
        p.started_at = started_minutes_ago.map(|m| now() - chrono::Duration::minutes(m));
        p
    };
    let pods = vec![
        annotated("protected", "true", Some(1)),
        annotated("typo", "5 minutes", Some(1)),
        annotated("young", "30m", Some(10)),
        annotated("old", "30m", Some(45)),
        annotated("pending", "30m", None),
    ];
    let v = cluster(
        UNDERUTILIZED,
        vec![node("n", "default", &large(), pods, hour_ago())],
    );
    let events: Vec<(String, &str, bool, String)> =
        crate::disruption::methods::do_not_disrupt_events(&v)
            .into_iter()
            .filter_map(|e| match e {
                DisruptionEvent::DoNotDisrupt {
                    name,
                    reason,
                    warning,
                    message,
                    ..
                } => Some((name, reason, warning, message)),
                _ => None,
            })
            .collect();
    let until =
        (now() + chrono::Duration::minutes(20)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    assert_eq!(events.len(), 3, "{events:?}");
    assert_eq!(events[0].0, "typo");
    assert_eq!(events[0].1, "InvalidDoNotDisruptAnnotation");
    assert!(events[0].2, "an unreadable value is a warning");
    assert!(events[0].3.contains("\"5 minutes\"") && events[0].3.ends_with("ignoring annotation"));
    assert_eq!(
        (events[1].0.as_str(), events[1].1, events[1].3.clone()),
        (
            "young",
            "DoNotDisruptUntil",
            format!("The karpenter.sh/do-not-disrupt grace period will elapse at {until}")
        )
    );
    assert_eq!(
        (events[2].0.as_str(), events[2].1),
        ("old", "DoNotDisruptGracePeriodElapsed")
    );
    // The decision loop publishes them.
    let outcome = run(&v);
    assert_eq!(
        outcome
            .events
            .iter()
            .filter(|e| matches!(e, DisruptionEvent::DoNotDisrupt { .. }))
            .count(),
        3
    );
}
