//! NodeClaims this process created and has not yet tried to launch.
//!
//! Before creating a VM, a launch looks for one an earlier attempt made (its answer lost, or
//! the process died before recording the providerID), so a retry adopts it instead of making
//! a second VM. For a NodeClaim this process itself created and never launched, no earlier
//! attempt can exist: only the leader launches, and losing leadership ends the process, so no
//! other process ever launched it. Its first launch skips the lookup (one Exoscale call less
//! per node); every later attempt, and every NodeClaim another process created, looks.

use std::collections::HashSet;
use std::sync::Mutex;

/// More than any burst of NodeClaims: past it the ledger is emptied, which only brings the
/// lookups back (the safe direction).
pub const CAPACITY: usize = 50_000;

#[derive(Debug, Default)]
pub struct FirstLaunches {
    uids: Mutex<HashSet<String>>,
}

impl FirstLaunches {
    /// Records a NodeClaim (by UID) this process has just created.
    pub fn created(&self, uid: &str) {
        let mut uids = self.uids.lock().unwrap_or_else(|p| p.into_inner());
        if uids.len() >= CAPACITY {
            uids.clear();
        }
        uids.insert(uid.to_string());
    }

    /// True once per recorded NodeClaim: this is its first launch attempt, and no lookup for
    /// an earlier attempt's VM is needed. False for anything else.
    pub fn take(&self, uid: Option<&str>) -> bool {
        let Some(uid) = uid.filter(|u| !u.is_empty()) else {
            return false;
        };
        self.uids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(uid)
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

    #[test]
    fn a_full_ledger_forgets_everything_and_lookups_come_back() {
        let ledger = FirstLaunches::default();
        for i in 0..CAPACITY {
            ledger.created(&format!("uid-{i}"));
        }
        ledger.created("newest");
        assert!(!ledger.take(Some("uid-0")));
        assert!(ledger.take(Some("newest")));
    }
}
