//! Object versions this process has itself replaced by a write. A reconcile triggered by another object (a Node event for its NodeClaim) can run
//! on a cached copy older than our own last write: every status it writes from that copy is
//! refused with 409, one wasted request each. In a 1 000-node launch that was 1 162 of the
//! controller's NodeClaim status patches. A pass that finds its copy superseded waits for the
//! watch instead; the write it would have made is computed from the newer copy.
//!
//! Waiting for the watch cost a Node's registration the watch's round trip of the launch's last
//! write: on a loaded control plane at 1 000 nodes, up to 4 s. So the answer to our last write
//! of each object is kept too, until the watch brings that version (or a later one): a pass
//! on a superseded copy decides from it, the very object the API server stored at that version.
//! Every write from it still carries its resourceVersion, so should another writer have changed
//! the object since, the API server refuses the write as before.
//!
//! Versions are compared only for equality (resourceVersions are opaque): a copy is stale when
//! its resourceVersion is one we wrote over. An object's versions never repeat, so that verdict
//! holds for as long as it is kept; records go a minute after the object's last write by us,
//! which bounds the memory and lets a pass run again should the watch never catch up (its write
//! is then refused by the API server, as before).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::apis::NodeClaim;

/// How long a record is kept after our last write to its object (a deleted object's record, or
/// one whose newer version the watch never delivers): after that a pass runs on whatever the
/// cache holds, as it did before, and a stale write is refused by the API server.
pub const RECORD_TTL: Duration = Duration::from_secs(60);

/// Superseded versions kept per object, the newest: a cache lags by a write or two, and an
/// object written every few seconds for hours must not grow its record.
const MAX_VERSIONS: usize = 8;

/// Records of at most this many objects; more are not recorded (passes then run as before).
const MAX_OBJECTS: usize = 20_000;

#[derive(Default)]
pub struct SupersededVersions {
    records: Mutex<Records>,
}

#[derive(Default)]
struct Records {
    by_uid: HashMap<String, Record>,
    /// When expired records were last dropped.
    swept: Option<Instant>,
}

struct Record {
    at: Instant,
    /// resourceVersions our writes replaced, oldest first.
    versions: Vec<String>,
    /// The API server's answer to our last write, until a pass sees a copy that is not stale.
    written: Option<Arc<NodeClaim>>,
}

impl SupersededVersions {
    /// After a pass over the copy at `read` wrote the object (its last write returned
    /// `written`): `read` and every version the pass wrote before its last are now stale.
    pub fn record(&self, uid: &str, read: &str, written: &str, now: Instant) {
        self.record_answer(uid, read, written, None, now);
    }

    /// [`Self::record`], keeping `answer` (the object at `written`) for [`Self::current`]
    /// unless a later write of ours was recorded first: two controllers' writes of one object
    /// can finish in one order and be recorded in the other, and then the later answer stays.
    fn record_answer(
        &self,
        uid: &str,
        read: &str,
        written: &str,
        answer: Option<&NodeClaim>,
        now: Instant,
    ) {
        if uid.is_empty() || read.is_empty() || written.is_empty() || read == written {
            return;
        }
        let mut records = self.lock();
        let due = records
            .swept
            .is_none_or(|at| now.saturating_duration_since(at) >= RECORD_TTL);
        if due || records.by_uid.len() >= MAX_OBJECTS {
            records
                .by_uid
                .retain(|_, r| now.saturating_duration_since(r.at) < RECORD_TTL);
            records.swept = Some(now);
        }
        if records.by_uid.len() >= MAX_OBJECTS {
            return;
        }
        let record = records.by_uid.entry(uid.to_string()).or_insert(Record {
            at: now,
            versions: Vec::new(),
            written: None,
        });
        record.at = now;
        // A later write of ours, recorded first, read the version this one wrote.
        let outdated = record.versions.iter().any(|v| v == written);
        for version in [read, written] {
            if !record.versions.iter().any(|v| v == version) {
                record.versions.push(version.to_string());
            }
        }
        if !outdated {
            // The last version written is current, not superseded, until a later write.
            record.versions.retain(|v| v != written);
            record.written = answer.map(|answer| {
                let mut kept = answer.clone();
                // The answer carries managed fields; nothing a pass reads is in them.
                kept.metadata.managed_fields = None;
                Arc::new(kept)
            });
        }
        let excess = record.versions.len().saturating_sub(MAX_VERSIONS);
        record.versions.drain(..excess);
    }

    /// True when the copy at `version` is one our own writes replaced.
    pub fn is_stale(&self, uid: &str, version: &str, now: Instant) -> bool {
        let records = self.lock();
        records.by_uid.get(uid).is_some_and(|record| {
            now.saturating_duration_since(record.at) < RECORD_TTL
                && record.versions.iter().any(|v| v == version)
        })
    }

    /// [`Self::is_stale`] of the copy with this metadata.
    pub fn is_stale_copy(&self, copy: &ObjectMeta, now: Instant) -> bool {
        let (uid, version) = identity(copy);
        self.is_stale(uid, version, now)
    }

    /// [`Self::record`] of a write from the copy `read` that returned `written`, keeping that
    /// answer for passes on a superseded copy ([`Self::current`]).
    pub fn record_written(&self, read: &ObjectMeta, written: &NodeClaim, now: Instant) {
        let (uid, read_version) = identity(read);
        let written_version = identity(&written.metadata).1;
        self.record_answer(uid, read_version, written_version, Some(written), now);
    }

    /// The copy a pass decides from, given the cache's `copy`: the copy itself unless one of
    /// our writes replaced it; then the answer to our last write, or None (wait for the watch)
    /// when it is not kept. A copy that is not stale ends the keeping of the answer: the
    /// watch has caught up with it.
    pub fn current(&self, copy: &Arc<NodeClaim>, now: Instant) -> Option<Arc<NodeClaim>> {
        let (uid, version) = identity(&copy.metadata);
        let mut records = self.lock();
        let Some(record) = records.by_uid.get_mut(uid) else {
            return Some(copy.clone());
        };
        if now.saturating_duration_since(record.at) >= RECORD_TTL {
            return Some(copy.clone());
        }
        if record.versions.iter().any(|v| v == version) {
            return record.written.clone();
        }
        record.written = None;
        Some(copy.clone())
    }

    /// Forgets an object (deleted).
    pub fn forget(&self, uid: &str) {
        self.lock().by_uid.remove(uid);
    }

    pub fn len(&self) -> usize {
        self.lock().by_uid.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Records> {
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// An object's uid and resourceVersion ("" when absent: never recorded, never stale).
fn identity(meta: &ObjectMeta) -> (&str, &str) {
    (
        meta.uid.as_deref().unwrap_or_default(),
        meta.resource_version.as_deref().unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_older_than_our_write_is_stale() {
        let memo = SupersededVersions::default();
        let t = Instant::now();
        // A pass read version 10, added the finalizer (11), then wrote status (12).
        memo.record("u", "10", "11", t);
        memo.record("u", "11", "12", t);
        assert!(!memo.is_stale("u", "12", t), "our last write is current");
        assert!(memo.is_stale("u", "10", t), "the copy the pass read");
        assert!(
            memo.is_stale("u", "11", t),
            "the version between its writes"
        );
        // Another cache (the cluster index, the Controller's store) can still hold an old copy
        // after one has caught up: looking at the current version ends nothing.
        assert!(memo.is_stale("u", "10", t));
    }

    #[test]
    fn another_writer_s_version_is_not_stale() {
        let memo = SupersededVersions::default();
        let t = Instant::now();
        memo.record("u", "10", "12", t);
        assert!(
            !memo.is_stale("u", "15", t),
            "written after ours by someone else"
        );
        assert!(memo.is_stale("u", "10", t));
        // Their write replaced ours; our next pass reads 15 and writes 16.
        memo.record("u", "15", "16", t);
        // Our 12, which their 15 replaced, is not known to be old: versions are not ordered
        // here. A write from a copy at 12 is refused by the API server instead.
        assert!(!memo.is_stale("u", "12", t));
        assert!(memo.is_stale("u", "15", t));
        assert!(!memo.is_stale("u", "16", t));
    }

    #[test]
    fn objects_are_apart_and_records_expire() {
        let memo = SupersededVersions::default();
        let t = Instant::now();
        memo.record("a", "1", "2", t);
        memo.record("b", "7", "8", t);
        assert!(!memo.is_stale("c", "1", t), "no record: never stale");
        assert!(memo.is_stale("b", "7", t));
        assert!(
            !memo.is_stale("a", "1", t + RECORD_TTL),
            "a record the watch never ended stops holding passes back"
        );
        memo.forget("b");
        assert!(!memo.is_stale("b", "7", t));
        assert_eq!(memo.len(), 1, "a's record waits for the next sweep");
    }

    #[test]
    fn records_the_watch_never_ends_are_dropped_by_later_writes() {
        let memo = SupersededVersions::default();
        let t = Instant::now();
        // A NodeClaim deleted right after our write: no pass looks at it again.
        memo.record("gone", "1", "2", t);
        memo.record("other", "5", "6", t + Duration::from_secs(1));
        assert_eq!(memo.len(), 2);
        memo.record("third", "8", "9", t + RECORD_TTL);
        assert_eq!(
            memo.len(),
            2,
            "the deleted object's record expired and went"
        );
        assert!(memo.is_stale("other", "5", t + RECORD_TTL));
    }

    #[test]
    fn an_object_written_for_hours_keeps_only_its_newest_superseded_versions() {
        let memo = SupersededVersions::default();
        let t = Instant::now();
        for v in 1..=100u32 {
            memo.record("u", &v.to_string(), &(v + 1).to_string(), t);
        }
        assert!(memo.is_stale("u", "100", t));
        assert!(memo.is_stale("u", &(100 - MAX_VERSIONS as u32 + 1).to_string(), t));
        assert!(!memo.is_stale("u", &(100 - MAX_VERSIONS as u32).to_string(), t));
        assert!(!memo.is_stale("u", "101", t), "the current version");
    }

    fn claim(uid: &str, version: &str) -> Arc<NodeClaim> {
        let mut claim = crate::state::testing::nodeclaim("c", "pool", None);
        claim.metadata.uid = Some(uid.into());
        claim.metadata.resource_version = Some(version.into());
        Arc::new(claim)
    }

    #[test]
    fn writes_recorded_out_of_order_keep_the_later_answer() {
        let memo = SupersededVersions::default();
        let t = Instant::now();
        // Termination wrote 10 → 11, then the lifecycle 11 → 12; the second was recorded first.
        let later = claim("u", "12");
        memo.record_written(&claim("u", "11").metadata, &later, t);
        memo.record_written(&claim("u", "10").metadata, &claim("u", "11"), t);
        for stale in ["10", "11"] {
            let current = memo
                .current(&claim("u", stale), t)
                .expect("an answer is kept");
            assert_eq!(
                current.metadata.resource_version.as_deref(),
                Some("12"),
                "a copy at {stale}"
            );
        }
        let echoed = claim("u", "12");
        assert!(Arc::ptr_eq(&memo.current(&echoed, t).unwrap(), &echoed));
    }

    #[test]
    fn a_pass_on_a_superseded_copy_decides_from_our_last_written_answer() {
        let memo = SupersededVersions::default();
        let t = Instant::now();
        let read = claim("u", "10");
        let mut answer = (*claim("u", "11")).clone();
        answer.metadata.managed_fields = Some(vec![Default::default()]);
        answer.status.get_or_insert_default().provider_id = Some("exoscale://x".into());
        memo.record_written(&read.metadata, &answer, t);
        // A Node event runs a pass before the watch brings version 11.
        let current = memo.current(&read, t).expect("our answer is kept");
        assert_eq!(current.metadata.resource_version.as_deref(), Some("11"));
        assert_eq!(
            current
                .status
                .as_ref()
                .and_then(|s| s.provider_id.as_deref()),
            Some("exoscale://x"),
            "what the write set is there"
        );
        assert!(current.metadata.managed_fields.is_none(), "kept trimmed");
        // The watch brings 11: that copy is used, and the kept answer goes.
        let echoed = claim("u", "11");
        assert!(Arc::ptr_eq(&memo.current(&echoed, t).unwrap(), &echoed));
        assert!(
            memo.current(&read, t).is_none(),
            "a cache still at 10 waits again: the answer is no longer kept"
        );
        // A later write keeps its own answer, never an earlier one.
        memo.record("u", "11", "12", t);
        assert!(memo.current(&echoed, t).is_none());
        // Unrecorded objects and expired records pass their copy through.
        let other = claim("v", "3");
        assert!(Arc::ptr_eq(&memo.current(&other, t).unwrap(), &other));
        assert!(Arc::ptr_eq(
            &memo.current(&read, t + RECORD_TTL).unwrap(),
            &read
        ));
    }

    #[test]
    fn a_pass_that_wrote_nothing_records_nothing() {
        let memo = SupersededVersions::default();
        let t = Instant::now();
        memo.record("u", "10", "10", t);
        memo.record("", "10", "11", t);
        memo.record("u", "", "11", t);
        memo.record("u", "10", "", t);
        assert!(memo.is_empty());
    }
}
