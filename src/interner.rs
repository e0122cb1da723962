//! One shared copy of each distinct value, for values that many objects repeat.

use std::borrow::Borrow;
use std::collections::HashSet;
use std::hash::Hash;
use std::sync::Arc;

/// Hands out one shared copy of each distinct value: the condition types, statuses and
/// reasons, resource names and per-object label sets that thousands of metric series repeat,
/// the label sets that the pods of one workload repeat. Each owning its own copy was most of
/// the metrics' memory at 1 000 nodes (a family, what was last published and each refresh's
/// samples each held one).
#[derive(Debug)]
pub struct Interner<T: ?Sized> {
    values: HashSet<Arc<T>>,
    schedule: PruneSchedule,
}

impl<T: ?Sized> Default for Interner<T> {
    fn default() -> Self {
        Interner {
            values: HashSet::new(),
            schedule: PruneSchedule::default(),
        }
    }
}

/// A table is never pruned while smaller than this.
const MIN_PRUNE_AT: usize = 1024;

/// When a table that nothing prunes between rounds forgets the values no one holds: once it
/// has doubled since it was last pruned (so it stays within twice what is held, and at least
/// [`MIN_PRUNE_AT`]), and at least once every twice as many calls as it then held (a table
/// full at [`Interner::MAX_VALUES`] cannot double, and its values die). One pass over the
/// table, at most once per that many calls.
#[derive(Debug, Default)]
struct PruneSchedule {
    prune_at: usize,
    calls_since_prune: usize,
}

impl PruneSchedule {
    /// Counts one call on a table of `len` values; true when it is to be pruned now.
    fn call_is_due(&mut self, len: usize) -> bool {
        self.calls_since_prune += 1;
        let limit = self.prune_at.max(MIN_PRUNE_AT);
        len >= limit || self.calls_since_prune > limit
    }

    /// The table was pruned down to `len` values.
    fn pruned(&mut self, len: usize) {
        self.prune_at = 2 * len;
        self.calls_since_prune = 0;
    }
}

impl<T: ?Sized + Hash + Eq> Interner<T> {
    /// Beyond this many distinct values, new ones are handed out unshared: values come from
    /// objects (a Node condition's reason, a label), so the table must stay bounded.
    pub const MAX_VALUES: usize = 1 << 16;

    /// The shared copy of `value`, made on first sight.
    pub fn intern<Q: Borrow<T> + Into<Arc<T>>>(&mut self, value: Q) -> Arc<T> {
        if let Some(shared) = self.values.get(value.borrow()) {
            return shared.clone();
        }
        let shared: Arc<T> = value.into();
        if self.values.len() < Self::MAX_VALUES {
            self.values.insert(shared.clone());
        }
        shared
    }

    /// As [`Interner::intern`], for a table that nothing prunes between rounds: the values
    /// no one holds any more are forgotten on a [`PruneSchedule`].
    pub fn intern_pruning<Q: Borrow<T> + Into<Arc<T>>>(&mut self, value: Q) -> Arc<T> {
        if self.schedule.call_is_due(self.values.len()) {
            self.prune();
            self.schedule.pruned(self.values.len());
        }
        self.intern(value)
    }

    /// Forgets the values no one holds any more.
    pub fn prune(&mut self) {
        self.values.retain(|shared| Arc::strong_count(shared) > 1);
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

/// One shared copy of each distinct list, for element types that cannot be hashed (the API's
/// own types): lists are told apart by their JSON. A workload's pods repeat their containers
/// and tolerations verbatim.
#[derive(Debug)]
pub struct ListInterner<T> {
    by_json: std::collections::HashMap<Box<str>, Arc<[T]>>,
    schedule: PruneSchedule,
}

impl<T> Default for ListInterner<T> {
    fn default() -> Self {
        ListInterner {
            by_json: Default::default(),
            schedule: PruneSchedule::default(),
        }
    }
}

impl<T: serde::Serialize> ListInterner<T> {
    /// The shared copy of `list`; lists no one else holds are forgotten on a
    /// [`PruneSchedule`], and beyond [`Interner::MAX_VALUES`] lists new ones are not shared.
    pub fn intern(&mut self, list: Arc<[T]>) -> Arc<[T]> {
        if self.schedule.call_is_due(self.by_json.len()) {
            self.by_json
                .retain(|_, shared| Arc::strong_count(shared) > 1);
            self.schedule.pruned(self.by_json.len());
        }
        let Ok(json) = serde_json::to_string(&*list) else {
            return list;
        };
        if let Some(shared) = self.by_json.get(json.as_str()) {
            return shared.clone();
        }
        if self.by_json.len() < Interner::<()>::MAX_VALUES {
            self.by_json.insert(json.into(), list.clone());
        }
        list
    }

    pub fn len(&self) -> usize {
        self.by_json.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_json.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_interner_shares_lists_with_the_same_json_and_forgets_unheld_ones() {
        #[derive(serde::Serialize)]
        struct Port(f64);
        let mut lists = ListInterner::<Port>::default();
        let a = lists.intern(vec![Port(1.0), Port(2.0)].into());
        let b = lists.intern(vec![Port(1.0), Port(2.0)].into());
        assert!(Arc::ptr_eq(&a, &b), "equal lists share one copy");
        let c = lists.intern(vec![Port(2.0), Port(1.0)].into());
        assert!(!Arc::ptr_eq(&a, &c), "order matters");
        drop(c);
        let held: Vec<_> = (0..MIN_PRUNE_AT * 3)
            .map(|i| lists.intern(vec![Port(i as f64 + 0.5)].into()))
            .collect();
        drop(held);
        // At most twice what was held at the last prune (3 074 then): unheld lists go.
        for i in 0..MIN_PRUNE_AT * 8 {
            lists.intern(vec![Port(-(i as f64))].into());
            assert!(lists.len() <= 4 * MIN_PRUNE_AT, "{}", lists.len());
        }
        assert!(lists.len() < 2 * MIN_PRUNE_AT, "{}", lists.len());
        assert!(Arc::ptr_eq(
            &lists.intern(vec![Port(1.0), Port(2.0)].into()),
            &a
        ));
    }

    #[test]
    fn a_full_list_interner_still_sheds_dead_lists() {
        let mut lists = ListInterner::<u32>::default();
        let max = Interner::<()>::MAX_VALUES;
        let mut held: Vec<Arc<[u32]>> = (0..max as u32)
            .map(|i| lists.intern(vec![i].into()))
            .collect();
        assert_eq!(lists.len(), max, "full");
        // One call more while every list is held: that prune keeps them all, so the table
        // could only be pruned again by doubling, which a full table never does.
        lists.intern(vec![u32::MAX].into());
        held.truncate(10);
        // No new list can be kept, so the table never doubles; it is pruned all the same.
        for i in 0..2 * max as u32 + 2 {
            lists.intern(vec![i, i].into());
        }
        assert!(lists.len() < max / 2, "{}", lists.len());
        assert!(Arc::ptr_eq(&lists.intern(vec![3].into()), &held[3]));
    }

    #[test]
    fn an_interner_shares_equal_values_and_forgets_unheld_ones() {
        let mut strings = Interner::<str>::default();
        let ready = strings.intern("Ready");
        let again = strings.intern(String::from("Ready").as_str());
        assert!(Arc::ptr_eq(&ready, &again), "equal values share one copy");
        let drifted = strings.intern("Drifted");
        assert!(!Arc::ptr_eq(&ready, &drifted));
        drop(drifted);
        strings.prune();
        assert_eq!(strings.len(), 1, "only the value still held is kept");
        assert!(Arc::ptr_eq(&strings.intern("Ready"), &ready));

        let mut label_sets = Interner::<Vec<(String, String)>>::default();
        let a = label_sets.intern(vec![("node_name".to_string(), "n1".to_string())]);
        let b = label_sets.intern(vec![("node_name".to_string(), "n1".to_string())]);
        assert!(Arc::ptr_eq(&a, &b));
    }

    #[test]
    fn an_unpruned_interner_forgets_unheld_values_as_it_grows() {
        let mut strings = Interner::<str>::default();
        let held: Vec<Arc<str>> = (0..MIN_PRUNE_AT / 2)
            .map(|i| strings.intern_pruning(format!("held-{i}").as_str()))
            .collect();
        for i in 0..MIN_PRUNE_AT * 10 {
            strings.intern_pruning(format!("dropped-{i}").as_str());
            assert!(strings.len() <= MIN_PRUNE_AT + 1, "{}", strings.len());
        }
        let again = strings.intern_pruning("held-7");
        assert!(Arc::ptr_eq(&again, &held[7]), "held values stay shared");
        assert!(strings.len() < MIN_PRUNE_AT);
    }

    #[test]
    fn a_full_unpruned_interner_still_sheds_dead_values() {
        let mut strings = Interner::<str>::default();
        let mut held: Vec<Arc<str>> = (0..Interner::<str>::MAX_VALUES)
            .map(|i| strings.intern_pruning(format!("v{i}").as_str()))
            .collect();
        assert_eq!(strings.len(), Interner::<str>::MAX_VALUES, "full");
        // As above: a prune that keeps everything leaves only the call count to prune again.
        strings.intern_pruning("one more");
        held.truncate(10);
        // No new value can be kept, so the table never doubles; it is pruned all the same.
        for i in 0..2 * Interner::<str>::MAX_VALUES + 2 {
            strings.intern_pruning(format!("new{i}").as_str());
        }
        assert!(
            strings.len() < Interner::<str>::MAX_VALUES / 2,
            "{}",
            strings.len()
        );
        assert!(Arc::ptr_eq(&strings.intern_pruning("v3"), &held[3]));
    }

    #[test]
    fn an_interner_stops_sharing_at_its_bound() {
        let mut strings = Interner::<str>::default();
        let held: Vec<Arc<str>> = (0..Interner::<str>::MAX_VALUES)
            .map(|i| strings.intern(i.to_string().as_str()))
            .collect();
        let first = strings.intern("one more");
        let second = strings.intern("one more");
        assert_eq!(strings.len(), Interner::<str>::MAX_VALUES);
        assert!(
            !Arc::ptr_eq(&first, &second),
            "past the bound, values are not kept"
        );
        assert_eq!(&*first, "one more");
        assert!(Arc::ptr_eq(&strings.intern("7"), &held[7]));
    }
}
