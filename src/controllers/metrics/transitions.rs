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

use std::collections::HashMap;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;

use super::conditions::{
    ConditionState, Key, ObjectConditions, StatusConditionMetrics, compact, label, of_node,
    of_nodeclaim, of_nodepool, seconds,
};
use crate::apis::{NodeClaim, NodePool};
use crate::clock::Clock;
use crate::interner::Interner;
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
}

/// The conditions of each object as last delivered.
#[derive(Debug)]
pub struct TransitionWatch {
    watching_since: Timestamp,
    last: HashMap<Key, Vec<ConditionState>>,
}

const UNKNOWN: &str = "Unknown";

impl TransitionWatch {
    pub fn new(watching_since: Timestamp) -> Self {
        TransitionWatch {
            watching_since,
            last: HashMap::new(),
        }
    }

    /// The transitions between the object's last delivered version and this one.
    pub fn applied(&mut self, object: ObjectConditions) -> Vec<Transition> {
        let key = (object.kind, object.namespace, object.name);
        let previous = self.last.get(&key);
        let mut out = Vec::new();
        for c in &object.conditions {
            let before = previous
                .as_ref()
                .and_then(|p| p.iter().find(|b| b.type_ == c.type_));
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
            out.push(Transition {
                kind: key.0,
                counted: compact(counted),
                lasted,
            });
        }
        self.last.insert(key, object.conditions);
        out
    }

    /// The object was deleted: a later object of that name starts afresh.
    pub fn deleted(&mut self, kind: usize, namespace: &str, name: &str) {
        self.last
            .remove(&(kind, namespace.to_string(), name.to_string()));
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

/// What one change means for the watch: an object's conditions, or a deletion.
fn read(
    change: AnyChange,
    values: &mut Interner<str>,
) -> Result<ObjectConditions, (usize, String)> {
    use kube::ResourceExt;
    fn named<K: ResourceExt>(
        kind: usize,
        object: &Arc<K>,
    ) -> Result<ObjectConditions, (usize, String)> {
        Err((kind, object.name_any()))
    }
    match change {
        AnyChange::NodeClaim(Changed::Applied(c)) => Ok(of_nodeclaim(&c, values)),
        AnyChange::NodePool(Changed::Applied(p)) => Ok(of_nodepool(&p, values)),
        AnyChange::Node(Changed::Applied(n)) => Ok(of_node(&n, values)),
        AnyChange::NodeClaim(Changed::Deleted(c)) => named(0, &c),
        AnyChange::NodePool(Changed::Deleted(p)) => named(1, &p),
        AnyChange::Node(Changed::Deleted(n)) => named(2, &n),
    }
}

/// Counts transitions from the cluster watch until dropped. Every replica follows the watch,
/// so a new leader compares with what it saw; only the leader counts, as only upstream's
/// leader runs its status controllers.
pub async fn count(
    kinds: SharedKinds,
    families: StatusConditionMetrics,
    leadership: Leadership,
    clock: Arc<dyn Clock>,
) {
    let since = Timestamp::from_second(clock.now_unix()).unwrap_or(Timestamp::UNIX_EPOCH);
    let mut watch = TransitionWatch::new(since);
    let mut values = Interner::default();
    let mut changes = std::pin::pin!(merged(&kinds));
    while let Some(change) = changes.next().await {
        let object = match read(change, &mut values) {
            Ok(object) => object,
            Err((kind, name)) => {
                watch.deleted(kind, "", &name);
                continue;
            }
        };
        let transitions = watch.applied(object);
        if transitions.is_empty() || !leadership.is_leader() {
            continue;
        }
        for t in transitions {
            let f = &families.kinds[t.kind];
            f.transitions.get_or_create(&t.counted).inc();
            if let Some((labels, seconds)) = &t.lasted {
                f.transition_seconds.get_or_create(labels).observe(*seconds);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::metrics::conditions::tests::{at, object};

    #[test]
    fn a_first_sight_counts_only_what_changed_while_watching() {
        let mut watch = TransitionWatch::new(at(10));
        assert!(
            watch.applied(object("True", 0, None)).is_empty(),
            "True before the watch began: a restart recounts nothing"
        );
        let mut born = object("True", 25, None);
        born.name = "born".into();
        let seen = watch.applied(born.clone());
        assert_eq!(seen.len(), 1, "set after the watch began: counted");
        assert!(seen[0].counted.contains(&label("status", "True")));
        assert!(
            seen[0]
                .counted
                .contains(&label("karpenter_sh_nodepool", "default"))
        );
        assert_eq!(seen[0].lasted, None, "no earlier status to time");
        assert!(
            watch.applied(born).is_empty(),
            "the same version again counts nothing"
        );
    }

    #[test]
    fn every_delivered_status_change_counts_and_is_timed() {
        let mut watch = TransitionWatch::new(at(0));
        let unknown = object("Unknown", 5, None);
        assert!(
            watch.applied(unknown).is_empty(),
            "a new Unknown condition is no change: absent reads as Unknown, as operatorpkg"
        );
        let ready = watch.applied(object("True", 8, None));
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
            watch.applied(reason_only).is_empty(),
            "a reason change is no transition"
        );
        let back = watch.applied(object("False", 20, None));
        assert_eq!(back[0].lasted.as_ref().unwrap().1, 12.0);
        assert_eq!(watch.len(), 1);
    }

    /// The task as the operator runs it, fed through the shared watch: a follower remembers
    /// what it sees, and once leading counts each version delivered after that.
    #[tokio::test]
    async fn counts_each_delivered_version_once_leading() {
        use crate::apis::ConditionStatus;
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
        let (lead, leading) = tokio::sync::watch::channel(false);
        let clock = Arc::new(crate::clock::FixedClock::at(100));
        let counting = count(kinds, families, Leadership::from_channel(leading), clock);
        let mut counting = std::pin::pin!(counting);
        let mut deliver = |claim: &NodeClaim| {
            claims.publish(&Event::Apply(claim.clone()));
        };
        let claim = testing::nodeclaim("c", "pool", None);
        let launched = testing::set_condition(claim, "Launched", ConditionStatus::True, 150);
        deliver(&launched);
        assert!(futures::poll!(counting.as_mut()).is_pending());
        let text = metrics.render();
        assert!(
            !text.contains("operator_nodeclaim_status_condition_transitions_total{"),
            "a follower counts nothing: {text}"
        );

        lead.send(true).unwrap();
        let unknown = testing::set_condition(launched, "Registered", ConditionStatus::Unknown, 160);
        deliver(&unknown);
        assert!(futures::poll!(counting.as_mut()).is_pending());
        let registered = testing::set_condition(unknown, "Registered", ConditionStatus::True, 161);
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
    }

    #[test]
    fn a_deleted_object_is_forgotten() {
        let mut watch = TransitionWatch::new(at(0));
        watch.applied(object("True", 5, None));
        watch.deleted(0, "", "claim");
        assert!(watch.is_empty());
        let again = watch.applied(object("True", 30, None));
        assert_eq!(again.len(), 1, "a new object of that name is a first sight");
        assert_eq!(again[0].lasted, None);
    }
}
