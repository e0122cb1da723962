//! `operator_<kind>_status_condition_transitions_total` and `_transition_seconds`, counted from
//! every version of a NodeClaim, NodePool or Node the cluster watch delivers, as operatorpkg
//! counts them on each reconcile. Counted on periodic looks (5–30 s apart) they missed most
//! transitions at 1 000 nodes: a condition set Unknown at launch and True at registration a
//! second later was one look's True, so `_transition_seconds` had 456 observations where
//! upstream's had 4 000.
//!
//! As operatorpkg: a condition an object did not have reads as Unknown, only a change of status
//! counts (not of reason), and a controller that falls behind sees the latest version only.
//! Unlike operatorpkg, an object seen for the first time (a restart, a new leader's first list)
//! counts only the conditions that changed after this process began watching; operatorpkg
//! counts every condition of every object again.
//!
//! The leader also records operatorpkg's events: `<type>` ("Status condition transitioned, Type:
//! …, Status: A -> B, Reason: …[, Message: …]") for a change of a condition the last version
//! had, and `Finalized` ("Finalized <finalizer>") for a finalizer the last version had and this
//! one has not, or that a deleted object last had. Unlike operatorpkg, whose `Finalized` events
//! for a deleted object name an empty object (it no longer has the object when it records
//! them), ours name the object that was deleted.

use std::collections::HashMap;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use k8s_openapi::jiff::Timestamp;

use super::conditions::{
    ConditionState, Key, ObjectConditions, StatusConditionMetrics, compact, label, of_node,
    of_nodeclaim, of_nodepool, seconds,
};
use crate::apis::{NodeClaim, NodePool};
use crate::clock::Clock;
use crate::interner::Interner;
use crate::operator::events::{EventSink, Recorded, Severity, reference_of};
use crate::operator::leader::Leadership;
use crate::operator::metrics::Labels;
use crate::state::{Changed, SharedKinds};

/// One status change of one condition.
#[derive(Debug, PartialEq)]
pub struct Transition {
    /// Index into [`super::conditions::KINDS`].
    pub kind: usize,
    /// The counter's labels: type, new status, reason and the object's extra labels.
    pub counted: Labels,
    /// The histogram's labels (type, old `status`, `to_status`, extra labels) and the seconds
    /// the old status lasted; only when the old status was stated with its time.
    pub lasted: Option<(Labels, f64)>,
    /// What the event tells; only when the last version had the condition, as operatorpkg.
    pub announced: Option<Announced>,
}

/// A condition's change as its event tells it.
#[derive(Clone, Debug, PartialEq)]
pub struct Announced {
    pub type_: Arc<str>,
    pub from: Arc<str>,
    pub to: Arc<str>,
    pub reason: Arc<str>,
}

/// What one delivered version changed.
#[derive(Debug, Default, PartialEq)]
pub struct Observed {
    pub transitions: Vec<Transition>,
    /// Finalizers the last version had and this one has not.
    pub finalized: Vec<Arc<str>>,
}

/// An object's conditions and finalizers as last delivered.
#[derive(Debug)]
struct Seen {
    conditions: Vec<ConditionState>,
    finalizers: Vec<Arc<str>>,
}

/// The conditions and finalizers of each object as last delivered.
#[derive(Debug)]
pub struct TransitionWatch {
    watching_since: Timestamp,
    last: HashMap<Key, Seen>,
}

const UNKNOWN: &str = "Unknown";

impl TransitionWatch {
    pub fn new(watching_since: Timestamp) -> Self {
        TransitionWatch {
            watching_since,
            last: HashMap::new(),
        }
    }

    /// The transitions and removed finalizers between the object's last delivered version and
    /// this one (with `finalizers`, its finalizers).
    pub fn applied(&mut self, object: ObjectConditions, finalizers: Vec<Arc<str>>) -> Observed {
        let key = (object.kind, object.namespace, object.name);
        let previous = self.last.get(&key);
        let mut out = Vec::new();
        for c in &object.conditions {
            let before = previous.and_then(|p| p.conditions.iter().find(|b| b.type_ == c.type_));
            let before_status = before.map_or(UNKNOWN, |b| &*b.status);
            if before_status == &*c.status {
                continue;
            }
            // A first sight of the object: what changed before the watch began is no
            // transition this process saw.
            if previous.is_none() && c.last_transition.is_none_or(|t| t <= self.watching_since) {
                continue;
            }
            let mut counted = vec![
                label("type", &c.type_),
                label("status", &c.status),
                label("reason", &c.reason),
            ];
            counted.extend(object.extra.iter().cloned());
            let lasted = before.and_then(|b| {
                let (from, to) = (b.last_transition?, c.last_transition?);
                let mut l = vec![
                    label("type", &b.type_),
                    label("status", &b.status),
                    label("to_status", &c.status),
                ];
                l.extend(object.extra.iter().cloned());
                Some((compact(l), seconds(from, to)))
            });
            let announced = before.map(|b| Announced {
                type_: c.type_.clone(),
                from: b.status.clone(),
                to: c.status.clone(),
                reason: c.reason.clone(),
            });
            out.push(Transition {
                kind: key.0,
                counted: compact(counted),
                lasted,
                announced,
            });
        }
        let finalized = previous
            .map(|p| {
                p.finalizers
                    .iter()
                    .filter(|f| !finalizers.contains(f))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        self.last.insert(
            key,
            Seen {
                conditions: object.conditions,
                finalizers,
            },
        );
        Observed {
            transitions: out,
            finalized,
        }
    }

    /// The object was deleted: a later object of that name starts afresh. Returns the
    /// finalizers it last had, each now done.
    pub fn deleted(&mut self, kind: usize, namespace: &str, name: &str) -> Vec<Arc<str>> {
        self.last
            .remove(&(kind, namespace.to_string(), name.to_string()))
            .map(|seen| seen.finalizers)
            .unwrap_or_default()
    }

    /// Objects remembered (bounded by what the watch holds).
    pub fn len(&self) -> usize {
        self.last.len()
    }

    pub fn is_empty(&self) -> bool {
        self.last.is_empty()
    }
}

/// A change of any of the three kinds.
enum AnyChange {
    NodeClaim(Changed<NodeClaim>),
    NodePool(Changed<NodePool>),
    Node(Changed<Node>),
}

fn merged(kinds: &SharedKinds) -> impl Stream<Item = AnyChange> + Send + 'static {
    let claims = kinds.nodeclaims.marked_changes().map(AnyChange::NodeClaim);
    let pools = kinds.nodepools.marked_changes().map(AnyChange::NodePool);
    let nodes = kinds.nodes.marked_changes().map(AnyChange::Node);
    futures::stream::select(futures::stream::select(claims, pools), nodes)
}

impl AnyChange {
    fn deleted(&self) -> bool {
        match self {
            AnyChange::NodeClaim(c) => matches!(c, Changed::Deleted(_)),
            AnyChange::NodePool(p) => matches!(p, Changed::Deleted(_)),
            AnyChange::Node(n) => matches!(n, Changed::Deleted(_)),
        }
    }

    /// The object's kind index, name and conditions.
    fn conditions(&self, values: &mut Interner<str>) -> ObjectConditions {
        match self {
            AnyChange::NodeClaim(c) => of_nodeclaim(c.object(), values),
            AnyChange::NodePool(p) => of_nodepool(p.object(), values),
            AnyChange::Node(n) => of_node(n.object(), values),
        }
    }

    fn finalizers(&self, values: &mut Interner<str>) -> Vec<Arc<str>> {
        let meta = match self {
            AnyChange::NodeClaim(c) => &c.object().metadata,
            AnyChange::NodePool(p) => &p.object().metadata,
            AnyChange::Node(n) => &n.object().metadata,
        };
        meta.finalizers
            .iter()
            .flatten()
            .map(|f| values.intern(f.as_str()))
            .collect()
    }

    fn regarding(&self) -> ObjectReference {
        match self {
            AnyChange::NodeClaim(c) => reference_of(&**c.object()),
            AnyChange::NodePool(p) => reference_of(&**p.object()),
            AnyChange::Node(n) => reference_of(&**n.object()),
        }
    }

    /// The message of the object's condition of this type; empty when it states none.
    fn message(&self, type_: &str) -> String {
        let ours = |conditions: &[crate::apis::Condition]| {
            conditions
                .iter()
                .find(|c| c.type_ == type_)
                .map(|c| c.message.clone())
        };
        let found = match self {
            AnyChange::NodeClaim(c) => c.object().status.as_ref().and_then(|s| ours(&s.conditions)),
            AnyChange::NodePool(p) => p.object().status.as_ref().and_then(|s| ours(&s.conditions)),
            AnyChange::Node(n) => n
                .object()
                .status
                .iter()
                .flat_map(|s| s.conditions.iter().flatten())
                .find(|c| c.type_ == type_)
                .and_then(|c| c.message.clone()),
        };
        found.unwrap_or_default()
    }
}

/// operatorpkg's event for a condition's change.
pub fn transition_event(regarding: ObjectReference, a: &Announced, message: &str) -> Recorded {
    let message = if message.is_empty() {
        String::new()
    } else {
        format!(", Message: {message}")
    };
    Recorded {
        object: regarding,
        severity: Severity::Normal,
        reason: a.type_.to_string(),
        message: format!(
            "Status condition transitioned, Type: {}, Status: {} -> {}, Reason: {}{message}",
            a.type_, a.from, a.to, a.reason
        ),
    }
}

/// operatorpkg's event for a finalizer removed (or whose object is gone).
pub fn finalized_event(regarding: ObjectReference, finalizer: &str) -> Recorded {
    Recorded {
        object: regarding,
        severity: Severity::Normal,
        reason: "Finalized".into(),
        message: format!("Finalized {finalizer}"),
    }
}

/// Counts transitions from the cluster watch until dropped, and records their events. Every
/// replica follows the watch, so a new leader compares with what it saw; only the leader
/// counts and records, as only upstream's leader runs its status controllers.
pub async fn count(
    kinds: SharedKinds,
    families: StatusConditionMetrics,
    events: Arc<dyn EventSink>,
    leadership: Leadership,
    clock: Arc<dyn Clock>,
) {
    let since = Timestamp::from_second(clock.now_unix()).unwrap_or(Timestamp::UNIX_EPOCH);
    let mut watch = TransitionWatch::new(since);
    let mut values = Interner::default();
    let mut changes = std::pin::pin!(merged(&kinds));
    while let Some(change) = changes.next().await {
        let object = change.conditions(&mut values);
        let observed = if change.deleted() {
            Observed {
                transitions: Vec::new(),
                finalized: watch.deleted(object.kind, &object.namespace, &object.name),
            }
        } else {
            watch.applied(object, change.finalizers(&mut values))
        };
        if observed == Observed::default() || !leadership.is_leader() {
            continue;
        }
        for t in &observed.transitions {
            let f = &families.kinds[t.kind];
            f.transitions.get_or_create(&t.counted).inc();
            if let Some((labels, seconds)) = &t.lasted {
                f.transition_seconds.get_or_create(labels).observe(*seconds);
            }
        }
        let announced = observed
            .transitions
            .iter()
            .filter_map(|t| t.announced.as_ref());
        for a in announced {
            let event = transition_event(change.regarding(), a, &change.message(&a.type_));
            events.publish(event).await;
        }
        for finalizer in &observed.finalized {
            events
                .publish(finalized_event(change.regarding(), finalizer))
                .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::metrics::conditions::tests::{at, object};

    /// The transitions of a version without finalizers.
    fn changes(watch: &mut TransitionWatch, object: ObjectConditions) -> Vec<Transition> {
        watch.applied(object, Vec::new()).transitions
    }

    #[test]
    fn a_first_sight_counts_only_what_changed_while_watching() {
        let mut watch = TransitionWatch::new(at(10));
        assert!(
            changes(&mut watch, object("True", 0, None)).is_empty(),
            "True before the watch began: a restart recounts nothing"
        );
        let mut born = object("True", 25, None);
        born.name = "born".into();
        let seen = changes(&mut watch, born.clone());
        assert_eq!(seen.len(), 1, "set after the watch began: counted");
        assert!(seen[0].counted.contains(&label("status", "True")));
        assert!(
            seen[0]
                .counted
                .contains(&label("karpenter_sh_nodepool", "default"))
        );
        assert_eq!(seen[0].lasted, None, "no earlier status to time");
        assert!(
            changes(&mut watch, born).is_empty(),
            "the same version again counts nothing"
        );
    }

    #[test]
    fn every_delivered_status_change_counts_and_is_timed() {
        let mut watch = TransitionWatch::new(at(0));
        let unknown = object("Unknown", 5, None);
        assert!(
            changes(&mut watch, unknown).is_empty(),
            "a new Unknown condition is no change: absent reads as Unknown, as operatorpkg"
        );
        let ready = changes(&mut watch, object("True", 8, None));
        assert_eq!(ready.len(), 1);
        let (labels, lasted) = ready[0].lasted.clone().unwrap();
        assert_eq!(lasted, 3.0, "Unknown lasted from 5 s to 8 s");
        for pair in [
            ("type", "Ready"),
            ("status", "Unknown"),
            ("to_status", "True"),
        ] {
            assert!(labels.contains(&label(pair.0, pair.1)), "{labels:?}");
        }
        let mut reason_only = object("True", 8, None);
        reason_only.conditions[0].reason = "Other".into();
        assert!(
            changes(&mut watch, reason_only).is_empty(),
            "a reason change is no transition"
        );
        let back = changes(&mut watch, object("False", 20, None));
        assert_eq!(back[0].lasted.as_ref().unwrap().1, 12.0);
        assert_eq!(watch.len(), 1);
    }

    /// The task as the operator runs it, fed through the shared watch: a follower remembers
    /// what it sees, and once leading counts each version delivered after that and records
    /// operatorpkg's events for it.
    #[tokio::test]
    async fn counts_and_records_each_delivered_version_once_leading() {
        use crate::apis::ConditionStatus;
        use crate::operator::events::MemoryEvents;
        use crate::operator::metrics::Metrics;
        use crate::state::{Shared, testing};
        use kube::runtime::watcher::Event;
        let (nodeclaims, mut claims) = Shared::new();
        let (nodepools, _pools) = Shared::new();
        let (nodes, _nodes) = Shared::new();
        let kinds = SharedKinds {
            nodes,
            nodeclaims,
            nodepools,
        };
        let metrics = Metrics::new();
        let families = StatusConditionMetrics::register(&metrics);
        let events = Arc::new(MemoryEvents::default());
        let (lead, leading) = tokio::sync::watch::channel(false);
        let clock = Arc::new(crate::clock::FixedClock::at(100));
        let counting = count(
            kinds,
            families,
            events.clone(),
            Leadership::from_channel(leading),
            clock,
        );
        let mut counting = std::pin::pin!(counting);
        let mut deliver = |claim: &NodeClaim| {
            claims.publish(&Event::Apply(claim.clone()));
        };
        let mut claim = testing::nodeclaim("c", "pool", None);
        claim.metadata.finalizers = Some(vec![
            "karpenter.sh/termination".into(),
            "example.com/other".into(),
        ]);
        let unknown = testing::set_condition(claim, "Launched", ConditionStatus::Unknown, 140);
        deliver(&unknown);
        assert!(futures::poll!(counting.as_mut()).is_pending());
        let launched = testing::set_condition(unknown, "Launched", ConditionStatus::True, 150);
        deliver(&launched);
        assert!(futures::poll!(counting.as_mut()).is_pending());
        let text = metrics.render();
        assert!(
            !text.contains("operator_nodeclaim_status_condition_transitions_total{"),
            "a follower counts nothing: {text}"
        );
        assert!(events.all().is_empty(), "a follower records nothing");

        lead.send(true).unwrap();
        let unknown = testing::set_condition(launched, "Registered", ConditionStatus::Unknown, 160);
        deliver(&unknown);
        assert!(futures::poll!(counting.as_mut()).is_pending());
        assert!(
            events.all().is_empty(),
            "a condition the last version lacked is counted, not announced (operatorpkg)"
        );
        let mut registered =
            testing::set_condition(unknown, "Registered", ConditionStatus::True, 161);
        let conditions = &mut registered.status.as_mut().unwrap().conditions;
        for c in conditions.iter_mut().filter(|c| c.type_ == "Registered") {
            c.message = "node joined".into();
        }
        deliver(&registered);
        assert!(futures::poll!(counting.as_mut()).is_pending());
        let text = metrics.render();
        assert!(
            text.contains("operator_nodeclaim_status_condition_transitions_total{type=\"Registered\",status=\"True\",reason=\"Registered\",karpenter_sh_nodepool=\"pool\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("operator_nodeclaim_status_condition_transition_seconds_count{type=\"Registered\",status=\"Unknown\",to_status=\"True\",karpenter_sh_nodepool=\"pool\"} 1\n"),
            "{text}"
        );
        assert!(
            !text.contains("type=\"Launched\""),
            "Launched changed while following, and is unchanged since: {text}"
        );
        let recorded = events.all();
        assert_eq!(recorded.len(), 1, "{recorded:?}");
        assert_eq!(recorded[0].reason, "Registered");
        assert_eq!(recorded[0].severity, Severity::Normal);
        assert_eq!(
            recorded[0].message,
            "Status condition transitioned, Type: Registered, Status: Unknown -> True, Reason: Registered, Message: node joined"
        );
        assert_eq!(recorded[0].object.kind.as_deref(), Some("NodeClaim"));
        assert_eq!(recorded[0].object.name.as_deref(), Some("c"));
        assert_eq!(recorded[0].object.uid.as_deref(), Some("uid-c"));

        // One finalizer removed, then the object deleted with the other.
        let mut finalizing = registered;
        finalizing.metadata.finalizers = Some(vec!["karpenter.sh/termination".into()]);
        deliver(&finalizing);
        assert!(futures::poll!(counting.as_mut()).is_pending());
        claims.publish(&Event::Delete(finalizing.clone()));
        assert!(futures::poll!(counting.as_mut()).is_pending());
        let finalized: Vec<(String, String, Option<String>)> = events
            .all()
            .into_iter()
            .skip(1)
            .map(|e| (e.reason, e.message, e.object.name))
            .collect();
        assert_eq!(
            finalized,
            [
                (
                    "Finalized".into(),
                    "Finalized example.com/other".into(),
                    Some("c".into())
                ),
                (
                    "Finalized".into(),
                    "Finalized karpenter.sh/termination".into(),
                    Some("c".into())
                ),
            ]
        );
    }

    #[test]
    fn a_change_is_announced_only_from_a_condition_the_last_version_had() {
        let mut watch = TransitionWatch::new(at(0));
        let mut unknown = object("Unknown", 5, None);
        unknown.conditions.clear();
        assert_eq!(watch.applied(unknown, Vec::new()), Observed::default());
        let first = changes(&mut watch, object("True", 8, None));
        assert_eq!(first.len(), 1, "counted: absent reads as Unknown");
        assert_eq!(
            first[0].announced, None,
            "not announced: the last version lacked it"
        );
        let back = changes(&mut watch, object("False", 9, None));
        assert_eq!(
            back[0].announced,
            Some(Announced {
                type_: "Ready".into(),
                from: "True".into(),
                to: "False".into(),
                reason: back[0].announced.as_ref().unwrap().reason.clone(),
            })
        );
    }

    #[test]
    fn a_finalizer_is_done_once_gone_from_a_seen_object() {
        let mut watch = TransitionWatch::new(at(0));
        let both: Vec<Arc<str>> = vec!["a".into(), "b".into()];
        let first = watch.applied(object("True", 5, None), both.clone());
        assert!(
            first.finalized.is_empty(),
            "a first sight finalizes nothing"
        );
        let again = watch.applied(object("True", 5, None), both);
        assert!(again.finalized.is_empty());
        let one = watch.applied(object("True", 5, None), vec!["b".into()]);
        assert_eq!(one.finalized, vec![Arc::<str>::from("a")]);
        assert_eq!(watch.deleted(0, "", "claim"), vec![Arc::<str>::from("b")]);
        assert!(
            watch.deleted(0, "", "claim").is_empty(),
            "an object never seen (or already gone) finalizes nothing"
        );
    }

    #[test]
    fn a_deleted_object_is_forgotten() {
        let mut watch = TransitionWatch::new(at(0));
        changes(&mut watch, object("True", 5, None));
        watch.deleted(0, "", "claim");
        assert!(watch.is_empty());
        let again = changes(&mut watch, object("True", 30, None));
        assert_eq!(again.len(), 1, "a new object of that name is a first sight");
        assert_eq!(again[0].lasted, None);
    }
}
