//! The cluster's instances as one list answer, shared by the drift checks of a conditions pass:
//! checking 1 000 NodeClaims is one `list-instances`, not 1 000 `get-instance` through the
//! client's rate limit (where they queued ahead of launches and deletions).

use std::collections::HashMap;
use std::sync::Arc;

use crate::clock::Clock;
use crate::exoscale::models::Instance;

/// How old a list answer may be and still decide drift (the provider's drift interval is
/// minutes; a launch newer than the list falls back to a read of its own).
pub const MAX_AGE_SECONDS: i64 = 30;

/// One list answer by instance ID, and when it was taken.
#[derive(Default)]
pub struct ListedInstances {
    taken_at: Option<i64>,
    by_id: Arc<HashMap<String, Instance>>,
}

impl ListedInstances {
    /// The answer, if taken at most [`MAX_AGE_SECONDS`] before `clock`'s now.
    pub fn fresh(&self, clock: &dyn Clock) -> Option<Arc<HashMap<String, Instance>>> {
        let taken_at = self.taken_at?;
        (clock.now_unix() - taken_at <= MAX_AGE_SECONDS).then(|| self.by_id.clone())
    }

    /// Drops the answer (it no longer says what some instance carries).
    pub fn forget(&mut self) {
        self.taken_at = None;
    }

    /// Keeps `instances` as the answer taken now.
    pub fn store(
        &mut self,
        instances: Vec<Instance>,
        clock: &dyn Clock,
    ) -> Arc<HashMap<String, Instance>> {
        self.by_id = Arc::new(instances.into_iter().map(|i| (i.id.clone(), i)).collect());
        self.taken_at = Some(clock.now_unix());
        self.by_id.clone()
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

    #[test]
    fn an_answer_decides_for_thirty_seconds_then_asks_for_a_new_list() {
        let clock = FixedClock::at(1_000);
        let mut listed = ListedInstances::default();
        assert!(listed.fresh(&clock).is_none(), "nothing listed yet");
        listed.store(vec![instance("a"), instance("b")], &clock);
        clock.advance(std::time::Duration::from_secs(30));
        let answer = listed.fresh(&clock).expect("still fresh at 30 s");
        assert_eq!(answer.len(), 2);
        assert_eq!(answer["a"].state, InstanceState::Running);
        assert_eq!(answer["b"].template, IdRef::new("tpl"));
        clock.advance(std::time::Duration::from_secs(1));
        assert!(listed.fresh(&clock).is_none(), "stale at 31 s");
        listed.store(vec![instance("a")], &clock);
        assert!(listed.fresh(&clock).is_some());
        listed.forget();
        assert!(listed.fresh(&clock).is_none(), "forgotten");
    }
}
