//! NodeClaims this process created and has not yet tried to launch.
//!
//! Before creating a VM, a launch looks for one an earlier attempt made (its answer lost, or
//! the process died before recording the providerID), so a retry adopts it instead of making
//! a second VM. For a NodeClaim this process itself created and never tried to launch, no
//! earlier attempt can exist: only the leader launches, and losing leadership ends the process,
//! so no other process ever launched it. Its first launch skips the lookup (one Exoscale call
//! less per node); every later attempt, and every NodeClaim another process created, looks.
//!
//! The NodeClaim controller may start a launch before the provisioner hears back from its
//! create (the watch can deliver the NodeClaim first). That launch looked up, and so must every
//! later one: every attempt is remembered, and a creation reported after an attempt is ignored.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Entries are pruned past this many, oldest first by [`RETENTION`].
pub const CAPACITY: usize = 10_000;
/// How long an entry is kept once the ledger is full. An attempt must be remembered for as
/// long as the create that made its NodeClaim may still be answered (the Kubernetes client
/// gives up far sooner); a creation that was never launched in this time (its NodeClaim
/// deleted first) is forgotten, which only brings a lookup back.
pub const RETENTION: Duration = Duration::from_secs(3600);

#[derive(Debug, Default)]
struct Ledger {
    created: HashMap<String, Instant>,
    attempted: HashMap<String, Instant>,
    /// Set when the ledger was full of entries younger than [`RETENTION`]: from then on every
    /// launch looks (safe, one call more).
    saturated: bool,
}

#[derive(Debug, Default)]
pub struct FirstLaunches {
    ledger: Mutex<Ledger>,
}

impl FirstLaunches {
    /// Records a NodeClaim (by UID) this process has just created, unless a launch of it has
    /// already begun.
    pub fn created(&self, uid: &str) {
        self.created_at(uid, Instant::now());
    }

    /// True once for a NodeClaim reported by [`Self::created`] before any launch of it began:
    /// this is its first attempt and no lookup for an earlier attempt's VM is needed. Records
    /// the attempt; false for everything else.
    pub fn take(&self, uid: Option<&str>) -> bool {
        self.take_at(uid, Instant::now())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn created_at(&self, uid: &str, now: Instant) {
        let mut ledger = self.lock();
        if ledger.saturated || ledger.attempted.contains_key(uid) {
            return;
        }
        ledger.prune(now);
        if !ledger.saturated {
            ledger.created.insert(uid.to_string(), now);
        }
    }

    fn take_at(&self, uid: Option<&str>, now: Instant) -> bool {
        let Some(uid) = uid.filter(|u| !u.is_empty()) else {
            return false;
        };
        let mut ledger = self.lock();
        let fresh = ledger.created.remove(uid).is_some() && !ledger.saturated;
        ledger.prune(now);
        if !ledger.saturated {
            ledger.attempted.insert(uid.to_string(), now);
        }
        fresh
    }
}

impl Ledger {
    fn prune(&mut self, now: Instant) {
        if self.created.len() + self.attempted.len() < CAPACITY {
            return;
        }
        let young = |at: &mut Instant| now.saturating_duration_since(*at) < RETENTION;
        self.created.retain(|_, at| young(at));
        self.attempted.retain(|_, at| young(at));
        if self.created.len() + self.attempted.len() >= CAPACITY {
            // An attempt may not be forgotten early: stop trusting the ledger instead.
            self.saturated = true;
            self.created.clear();
            self.attempted.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_first_attempt_of_a_nodeclaim_created_here_skips_the_lookup() {
        let ledger = FirstLaunches::default();
        ledger.created("uid-a");
        assert!(!ledger.take(Some("uid-b")), "created by another process");
        assert!(!ledger.take(None), "no UID: cannot be proven");
        assert!(ledger.take(Some("uid-a")), "first attempt");
        assert!(!ledger.take(Some("uid-a")), "a retry looks again");
    }

    /// The watch delivered the NodeClaim and a launch began (and looked up) before the
    /// provisioner's create returned: that late report must not make a retry skip the lookup.
    #[test]
    fn a_creation_reported_after_a_launch_began_never_skips_a_lookup() {
        let ledger = FirstLaunches::default();
        assert!(!ledger.take(Some("uid-a")), "the early launch looks");
        ledger.created("uid-a");
        assert!(!ledger.take(Some("uid-a")), "the retry looks too");
    }

    #[test]
    fn a_full_ledger_forgets_only_old_entries_and_otherwise_stops_trusting_itself() {
        let start = Instant::now();
        let ledger = FirstLaunches::default();
        for i in 0..CAPACITY {
            ledger.take_at(Some(&format!("old-{i}")), start);
        }
        // Past the retention the old attempts go, and new creations are trusted.
        let later = start + RETENTION + Duration::from_secs(1);
        ledger.created_at("new", later);
        assert!(ledger.take_at(Some("new"), later));
        assert!(ledger.lock().attempted.len() < CAPACITY);

        // Full of young entries: nothing may be forgotten early, so nothing is trusted.
        let ledger = FirstLaunches::default();
        for i in 0..CAPACITY {
            ledger.take_at(Some(&format!("young-{i}")), start);
        }
        ledger.created_at("new", start);
        assert!(!ledger.take_at(Some("new"), start));
        assert!(!ledger.take_at(Some("young-1"), start));
    }
}
