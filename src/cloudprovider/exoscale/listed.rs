//! The cluster's instances as one list answer, shared by the drift checks of a conditions pass:
//! checking 1 000 NodeClaims is one `list-instances`, not 1 000 `get-instance` through the
//! client's rate limit (where they queued ahead of launches and deletions).

use std::collections::HashMap;

use crate::clock::Clock;
use crate::exoscale::models::Instance;

/// How old a list answer may be and still decide drift (the provider's drift interval is
/// minutes).
pub const MAX_AGE_SECONDS: i64 = 30;

/// An answer at least this old that lacks an instance is taken again rather than the
/// instance read on its own: during a launch of hundreds of nodes the NodeClaims launched
/// since the last list are checked in the next conditions pass (every 5 s), and one list
/// answers them all where a read each was 172 of the 1 183 calls of a 1 000-node launch
/// (BENCHMARKS, seventeenth session), spent at the client's rate limit beside the launches'
/// own calls. Younger answers are not taken
/// again, so an instance no list shows (gone, or not yet listed) costs at most one extra list
/// per this many seconds.
pub const LIST_AGAIN_AFTER_SECONDS: i64 = 5;

/// What a drift check should do to find one instance.
#[derive(Debug, Clone, PartialEq)]
pub enum Lookup {
    /// The answer holds it.
    Found(Box<Instance>),
    /// No fresh answer, or one old enough to be taken again that lacks it.
    List,
    /// A fresh answer too young to be taken again lacks it: read it on its own.
    Read,
}

/// One list answer by instance ID, and when it was taken.
#[derive(Default)]
pub struct ListedInstances {
    taken_at: Option<i64>,
    by_id: HashMap<String, Instance>,
}

impl ListedInstances {
    /// Where to find instance `id`: in the answer, by listing, or by a read of its own.
    pub fn lookup(&self, id: &str, clock: &dyn Clock) -> Lookup {
        let Some(taken_at) = self.taken_at else {
            return Lookup::List;
        };
        let age = clock.now_unix() - taken_at;
        if age > MAX_AGE_SECONDS {
            return Lookup::List;
        }
        match self.by_id.get(id) {
            Some(instance) => Lookup::Found(Box::new(instance.clone())),
            None if age >= LIST_AGAIN_AFTER_SECONDS => Lookup::List,
            None => Lookup::Read,
        }
    }

    /// Drops the answer (it no longer says what some instance carries).
    pub fn forget(&mut self) {
        self.taken_at = None;
    }

    /// Keeps `instances` as the answer taken now.
    pub fn store(&mut self, instances: Vec<Instance>, clock: &dyn Clock) {
        self.by_id = instances.into_iter().map(|i| (i.id.clone(), i)).collect();
        self.taken_at = Some(clock.now_unix());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::FixedClock;
    use crate::exoscale::models::{IdRef, InstanceState};

    fn instance(id: &str) -> Instance {
        serde_json::from_value(serde_json::json!({
            "id": id, "state": "running",
            "instance-type": {"id": "t"}, "template": {"id": "tpl"},
        }))
        .unwrap()
    }

    fn found(lookup: Lookup) -> Instance {
        match lookup {
            Lookup::Found(instance) => *instance,
            other => panic!("expected the listed instance, got {other:?}"),
        }
    }

    #[test]
    fn an_answer_decides_for_thirty_seconds_then_asks_for_a_new_list() {
        let clock = FixedClock::at(1_000);
        let mut listed = ListedInstances::default();
        assert_eq!(
            listed.lookup("a", &clock),
            Lookup::List,
            "nothing listed yet"
        );
        listed.store(vec![instance("a"), instance("b")], &clock);
        clock.advance(std::time::Duration::from_secs(30));
        assert_eq!(
            found(listed.lookup("a", &clock)).state,
            InstanceState::Running
        );
        assert_eq!(
            found(listed.lookup("b", &clock)).template,
            IdRef::new("tpl")
        );
        clock.advance(std::time::Duration::from_secs(1));
        assert_eq!(listed.lookup("a", &clock), Lookup::List, "stale at 31 s");
        listed.store(vec![instance("a")], &clock);
        found(listed.lookup("a", &clock));
        listed.forget();
        assert_eq!(listed.lookup("a", &clock), Lookup::List, "forgotten");
    }

    /// An instance launched after the list: read on its own while the answer is younger than
    /// five seconds, listed again from then on.
    #[test]
    fn a_missing_instance_is_read_alone_then_listed_again() {
        let clock = FixedClock::at(1_000);
        let mut listed = ListedInstances::default();
        listed.store(vec![instance("a")], &clock);
        assert_eq!(listed.lookup("new", &clock), Lookup::Read);
        clock.advance(std::time::Duration::from_secs(4));
        assert_eq!(listed.lookup("new", &clock), Lookup::Read, "4 s old");
        clock.advance(std::time::Duration::from_secs(1));
        assert_eq!(listed.lookup("new", &clock), Lookup::List, "5 s old");
        found(listed.lookup("a", &clock));
        listed.store(vec![instance("a"), instance("new")], &clock);
        found(listed.lookup("new", &clock));
        assert_eq!(
            listed.lookup("gone", &clock),
            Lookup::Read,
            "the new answer lacks it too"
        );
    }
}
