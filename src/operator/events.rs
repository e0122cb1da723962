//! Kubernetes events with upstream Karpenter's reasons. Controllers talk to [`EventSink`] so
//! tests can record events in memory; publishing failures are logged, never fatal.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Mutex;
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, Patch, PatchParams, PostParams};

/// Severity of an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    Normal,
    Warning,
}

/// One event about an object.
#[derive(Clone, Debug, PartialEq)]
pub struct Recorded {
    pub object: ObjectReference,
    pub severity: Severity,
    pub reason: String,
    pub message: String,
}

/// Where controllers publish events.
pub trait EventSink: Send + Sync {
    fn publish(&self, event: Recorded) -> BoxFuture<'_, ()>;
}

/// Publishes through the `events.k8s.io` API. A repeat of an event (same object, type, reason
/// and message) within [`SERIES_TTL`] bumps the series of the first one instead of creating
/// another. kube's `Recorder` keys its series without the message, so a later event with the
/// same reason but a new message would only bump the old event and never be seen; hence our own.
pub struct KubeEvents {
    client: kube::Client,
    controller: String,
    instance: String,
    series: tokio::sync::Mutex<SeriesCache>,
}

impl KubeEvents {
    pub fn new(client: kube::Client, instance: Option<String>) -> Self {
        let controller = "karpenter".to_string();
        KubeEvents {
            client,
            instance: instance.unwrap_or_else(|| controller.clone()),
            controller,
            series: tokio::sync::Mutex::new(SeriesCache::default()),
        }
    }

    async fn send(&self, event: &Recorded, note: String) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        // Events are namespaced; one about a cluster-scoped object (Node, NodeClaim, NodePool,
        // ExoscaleNodeClass) goes to `default`, as client-go's recorders put it and where
        // `kubectl describe` and `kubectl get events -A` look, so upstream tooling finds ours.
        let namespace = event
            .object
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_string());
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        let key = SeriesKey::of(event, &note);
        // The lock is not held across API calls: two racing identical events at worst start
        // two series.
        let repeat = self.series.lock().await.repeat(&key, now);
        if let Some(repeat) = repeat {
            let patch = serde_json::json!({"series": {
                "count": repeat.count,
                "lastObservedTime": MicroTime(now),
            }});
            match api
                .patch(&repeat.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return Ok(()),
                // Expired or deleted by someone else: start a new series.
                Err(kube::Error::Api(e)) if e.code == 404 => self.series.lock().await.forget(&key),
                Err(e) => return Err(e),
            }
        }
        let name = format!(
            "{}.{:x}",
            event.object.name.as_deref().unwrap_or(&self.controller),
            now.as_nanosecond()
        );
        let k8s_event = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(now)),
            action: Some(event.reason.clone()),
            reason: Some(event.reason.clone()),
            note: Some(note),
            type_: Some(
                match event.severity {
                    Severity::Normal => "Normal",
                    Severity::Warning => "Warning",
                }
                .to_string(),
            ),
            regarding: Some(event.object.clone()),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            ..Event::default()
        };
        api.create(&PostParams::default(), &k8s_event).await?;
        self.series.lock().await.record(&key, name, now);
        Ok(())
    }
}

impl EventSink for KubeEvents {
    fn publish(&self, event: Recorded) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            // The events API caps notes at 1 kB.
            let note = truncate(&event.message, 1000);
            if let Err(error) = self.send(&event, note).await {
                tracing::warn!(reason = %event.reason, %error, "cannot publish event");
            }
        })
    }
}

/// How long a published event collects repeats (kube's `Recorder` uses the same).
pub const SERIES_TTL: Duration = Duration::from_secs(6 * 60);

/// What makes two events the same: the object, type, reason and message.
/// An involved object: apiVersion, kind, namespace, name, uid.
type ObjectKey = (String, String, String, String, String);

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct SeriesKey {
    object: ObjectKey,
    severity: bool,
    reason: String,
    note: String,
}

impl SeriesKey {
    fn of(event: &Recorded, note: &str) -> Self {
        let o = &event.object;
        let part = |v: &Option<String>| v.clone().unwrap_or_default();
        SeriesKey {
            object: (
                part(&o.api_version),
                part(&o.kind),
                part(&o.namespace),
                part(&o.name),
                part(&o.uid),
            ),
            severity: event.severity == Severity::Warning,
            reason: event.reason.clone(),
            note: note.to_string(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Series {
    name: String,
    count: i32,
    last: Timestamp,
}

/// Published events still collecting repeats; pure, time passed in. Keys are held as two
/// independently keyed 64-bit hashes, not their text (a 1 000-node launch's events with their
/// objects and messages were ~1 MB for the six minutes): two distinct events would have to
/// collide in both, odds about 10⁻³¹ (n²/2 over 2¹²⁸) among 10 000.
#[derive(Debug, Default)]
struct SeriesCache {
    hashers: (std::hash::RandomState, std::hash::RandomState),
    entries: HashMap<(u64, u64), Series>,
}

impl SeriesCache {
    fn id(&self, key: &SeriesKey) -> (u64, u64) {
        (self.hashers.0.hash_one(key), self.hashers.1.hash_one(key))
    }

    fn expire(&mut self, now: Timestamp) {
        let ttl = SignedDuration::try_from(SERIES_TTL).unwrap_or(SignedDuration::MAX);
        self.entries
            .retain(|_, s| s.last.checked_add(ttl).is_ok_and(|until| until > now));
    }

    /// The series to bump for a repeat of `key` (its count already incremented), if any.
    fn repeat(&mut self, key: &SeriesKey, now: Timestamp) -> Option<Series> {
        self.expire(now);
        let id = self.id(key);
        let series = self.entries.get_mut(&id)?;
        series.count += 1;
        series.last = now;
        Some(series.clone())
    }

    fn record(&mut self, key: &SeriesKey, name: String, now: Timestamp) {
        self.entries.insert(
            self.id(key),
            Series {
                name,
                count: 1,
                last: now,
            },
        );
    }

    fn forget(&mut self, key: &SeriesKey) {
        let id = self.id(key);
        self.entries.remove(&id);
    }
}

/// Events waiting to be written, at most; beyond that new ones are dropped (and counted).
pub const QUEUE_CAPACITY: usize = 10_000;
/// An identical event (object, type, reason, message; a pod's `Nominated` by pod alone) within
/// this window is dropped before it reaches the API, as upstream's recorder dedupes.
pub const DEDUPE_WINDOW: Duration = Duration::from_secs(2 * 60);

/// An [`EventSink`] that never makes its caller wait: events go into a bounded queue that a
/// background task drains into the inner sink, one at a time. Provisioning with 1 000 pending
/// pods publishes 1 000 events; through the API directly that was 1 000 sequential calls in
/// front of the NodeClaims.
pub struct QueuedEvents {
    queue: tokio::sync::mpsc::Sender<Recorded>,
    recent: Mutex<RecentEvents>,
    dropped: std::sync::atomic::AtomicU64,
}

impl QueuedEvents {
    /// Starts the publisher task; it ends when the returned sink is dropped and the queue is
    /// drained.
    pub fn spawn(inner: std::sync::Arc<dyn EventSink>, capacity: usize) -> Self {
        let (queue, mut pending) = tokio::sync::mpsc::channel::<Recorded>(capacity.max(1));
        tokio::spawn(async move {
            while let Some(event) = pending.recv().await {
                inner.publish(event).await;
            }
        });
        QueuedEvents {
            queue,
            recent: Mutex::new(RecentEvents::default()),
            dropped: Default::default(),
        }
    }

    /// Events dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl EventSink for QueuedEvents {
    fn publish(&self, event: Recorded) -> BoxFuture<'_, ()> {
        let now = std::time::Instant::now();
        let fresh = self
            .recent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .admit(SeriesKey::of(&event, &event.message), now);
        if fresh && let Err(error) = self.queue.try_send(event) {
            let dropped = self
                .dropped
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                + 1;
            // One line per thousand, not one per event, while the API is slow.
            if dropped % 1000 == 1 {
                tracing::warn!(dropped, %error, "event queue full; dropping events");
            }
        }
        Box::pin(std::future::ready(()))
    }
}

/// Events one object may get in a burst before [`OBJECT_REFILL`] paces it, as client-go's event
/// spam filter (which upstream's recorder goes through) allows per object.
pub const OBJECT_BURST: u32 = 25;
/// One more event per object each this long once its burst is spent.
pub const OBJECT_REFILL: Duration = Duration::from_secs(5 * 60);

/// `Nominated` events, one per pod a round places, share one budget across all pods as
/// upstream's (5 per second, bursts of 10): a round of 1 000 pods writes about ten, not 1 000.
pub const NOMINATION_RATE_PER_SECOND: f64 = 5.0;
pub const NOMINATION_BURST: f64 = 10.0;

/// A pod's `FailedScheduling` event is written at most once in this window, whatever its
/// message, as upstream's (at 10 000 pods that no instance type fits, one event per pod every
/// two minutes with the message in the key was ~80 writes a second; this is ~33).
pub const FAILED_SCHEDULING_DEDUPE: Duration = Duration::from_secs(5 * 60);

/// How an event is recognised as a repeat, and for how long: a pod's scheduling events
/// (`FailedScheduling`, `Nominated`) by their reason and pod alone, as upstream keys them by pod
/// UID (a message that changes between rounds, a count or a NodeClaim's name, would otherwise
/// write again each round); any other by its object, type, reason and message.
fn dedupe_of(key: &SeriesKey) -> (DedupeKey<'_>, Duration) {
    match key.reason.as_str() {
        "FailedScheduling" => (
            DedupeKey::ByObject(&key.reason, &key.object),
            FAILED_SCHEDULING_DEDUPE,
        ),
        "Nominated" => (DedupeKey::ByObject(&key.reason, &key.object), DEDUPE_WINDOW),
        _ => (DedupeKey::Whole(key), DEDUPE_WINDOW),
    }
}

#[derive(Hash)]
enum DedupeKey<'a> {
    ByObject(&'a str, &'a ObjectKey),
    Whole(&'a SeriesKey),
}

/// Events seen within their dedupe window ([`dedupe_of`]), each object's event budget and the
/// shared nomination budget; pure, time passed in. Events and objects are remembered by a
/// 64-bit keyed hash, not their text: up to 10 000 keys with their objects' names and messages
/// were ~6 MB. Two distinct keys sharing a hash (odds about 10⁻¹¹ among 10 000) would only drop
/// an event or share a budget, never write a wrong one.
#[derive(Debug, Default)]
struct RecentEvents {
    hasher: std::hash::RandomState,
    /// Per dedupe key: until when a repeat is dropped.
    seen: HashMap<u64, std::time::Instant>,
    /// Per object: tokens left and when they were counted.
    budgets: HashMap<u64, (f64, std::time::Instant)>,
    nominations: Option<(f64, std::time::Instant)>,
}

impl RecentEvents {
    /// Whether an event with this key should be written: not seen within its dedupe window,
    /// and its object has budget left.
    fn admit(&mut self, key: SeriesKey, now: std::time::Instant) -> bool {
        // Bounded by the windows: expired entries are swept on each full pass of the map.
        if self.seen.len() >= QUEUE_CAPACITY {
            self.seen.retain(|_, until| now < *until);
        }
        let (dedupe, window) = dedupe_of(&key);
        let id = self.hasher.hash_one(&dedupe);
        if self.seen.get(&id).is_some_and(|until| now < *until) {
            return false;
        }
        if key.reason == "Nominated" && !self.take_nomination(now) {
            // Like upstream, a nomination over the budget still counts as seen: the pod's
            // next nomination within the window is not written either.
            self.seen.insert(id, now + window);
            return false;
        }
        if !self.take_token(self.hasher.hash_one(&key.object), now) {
            return false;
        }
        self.seen.insert(id, now + window);
        true
    }

    fn take_nomination(&mut self, now: std::time::Instant) -> bool {
        let (tokens, since) = self.nominations.unwrap_or((NOMINATION_BURST, now));
        let tokens = (tokens
            + now.saturating_duration_since(since).as_secs_f64() * NOMINATION_RATE_PER_SECOND)
            .min(NOMINATION_BURST);
        let admitted = tokens >= 1.0;
        self.nominations = Some((if admitted { tokens - 1.0 } else { tokens }, now));
        admitted
    }

    fn take_token(&mut self, object: u64, now: std::time::Instant) -> bool {
        let burst = f64::from(OBJECT_BURST);
        let refill = |tokens: f64, since: std::time::Instant| {
            let earned =
                now.saturating_duration_since(since).as_secs_f64() / OBJECT_REFILL.as_secs_f64();
            (tokens + earned).min(burst)
        };
        if self.budgets.len() >= QUEUE_CAPACITY {
            // Objects whose budget has refilled completely carry no state worth keeping.
            self.budgets
                .retain(|_, (tokens, since)| refill(*tokens, *since) < burst);
        }
        let (tokens, since) = self.budgets.get(&object).copied().unwrap_or((burst, now));
        let tokens = refill(tokens, since);
        if tokens < 1.0 {
            self.budgets.insert(object, (tokens, now));
            return false;
        }
        self.budgets.insert(object, (tokens - 1.0, now));
        true
    }
}

/// Keeps events in memory (tests, `simulate`).
#[derive(Default)]
pub struct MemoryEvents {
    events: Mutex<Vec<Recorded>>,
}

impl MemoryEvents {
    pub fn all(&self) -> Vec<Recorded> {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn reasons(&self) -> Vec<String> {
        self.all().into_iter().map(|e| e.reason).collect()
    }
}

impl EventSink for MemoryEvents {
    fn publish(&self, event: Recorded) -> BoxFuture<'_, ()> {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(event);
        Box::pin(async {})
    }
}

/// Cuts a message at a character boundary.
pub fn truncate(message: &str, max: usize) -> String {
    if message.len() <= max {
        return message.to_string();
    }
    let mut end = max;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    message[..end].to_string()
}

/// Builds the reference of any Kubernetes object for an event.
pub fn reference_of<K: kube::Resource<DynamicType = ()>>(obj: &K) -> ObjectReference {
    obj.object_ref(&())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn memory_sink_records_in_order() {
        let sink = MemoryEvents::default();
        for reason in ["Evicted", "FailedDraining"] {
            sink.publish(Recorded {
                object: ObjectReference::default(),
                severity: Severity::Normal,
                reason: reason.into(),
                message: String::new(),
            })
            .await;
        }
        assert_eq!(sink.reasons(), vec!["Evicted", "FailedDraining"]);
    }

    fn recorded(reason: &str, message: &str) -> Recorded {
        Recorded {
            object: ObjectReference {
                kind: Some("Node".into()),
                name: Some("n1".into()),
                ..ObjectReference::default()
            },
            severity: Severity::Normal,
            reason: reason.into(),
            message: message.into(),
        }
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).unwrap()
    }

    #[test]
    fn a_repeat_bumps_the_series_but_a_new_message_is_a_new_event() {
        let mut cache = SeriesCache::default();
        let blocked = recorded("DisruptionBlocked", "node is nominated");
        let key = SeriesKey::of(&blocked, &blocked.message);
        assert_eq!(cache.repeat(&key, at(0)), None);
        cache.record(&key, "n1.1".into(), at(0));
        let repeat = cache.repeat(&key, at(10)).unwrap();
        assert_eq!((repeat.name.as_str(), repeat.count), ("n1.1", 2));
        assert_eq!(cache.repeat(&key, at(20)).unwrap().count, 3);
        // Same object and reason, another message: not a repeat (kube's Recorder says it is).
        let pdb = recorded("DisruptionBlocked", "pdb prevents pod evictions");
        assert_eq!(
            cache.repeat(&SeriesKey::of(&pdb, &pdb.message), at(30)),
            None
        );
    }

    #[test]
    fn a_series_ends_after_its_ttl_without_repeats() {
        let mut cache = SeriesCache::default();
        let e = recorded("Unconsolidatable", "x");
        let key = SeriesKey::of(&e, &e.message);
        cache.record(&key, "n1.1".into(), at(0));
        assert!(cache.repeat(&key, at(300)).is_some());
        // The repeat at 300 s extended it; 6 minutes after that it is over.
        assert!(cache.repeat(&key, at(300 + 360)).is_none());
        assert!(cache.entries.is_empty());
    }

    /// A sink whose writes wait until the gate opens (an API server that does not answer).
    struct GatedSink {
        gate: tokio::sync::Semaphore,
        written: MemoryEvents,
    }

    impl EventSink for GatedSink {
        fn publish(&self, event: Recorded) -> BoxFuture<'_, ()> {
            Box::pin(async move {
                let _permit = self.gate.acquire().await.expect("gate open");
                self.written.publish(event).await;
            })
        }
    }

    #[tokio::test]
    async fn publishing_never_waits_for_the_api_and_everything_is_written_in_order() {
        let inner = std::sync::Arc::new(GatedSink {
            gate: tokio::sync::Semaphore::new(0),
            written: MemoryEvents::default(),
        });
        let queued = QueuedEvents::spawn(inner.clone(), QUEUE_CAPACITY);
        for i in 0..1000 {
            // Ready at once although not one write has gone through.
            use futures::FutureExt;
            // One event per pod, as provisioning publishes them (FailedScheduling: Nominated
            // events share a budget of ten).
            let mut event = recorded("FailedScheduling", &format!("pod {i}"));
            event.object.name = Some(format!("pod-{i}"));
            queued
                .publish(event)
                .now_or_never()
                .expect("publish returned without waiting");
        }
        assert!(inner.written.all().is_empty());
        inner.gate.add_permits(usize::MAX >> 4);
        while inner.written.all().len() < 1000 {
            tokio::task::yield_now().await;
        }
        let messages: Vec<String> = inner.written.all().into_iter().map(|e| e.message).collect();
        let expected: Vec<String> = (0..1000).map(|i| format!("pod {i}")).collect();
        assert_eq!(messages, expected);
        assert_eq!(queued.dropped(), 0);
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_instead_of_blocking() {
        let inner = std::sync::Arc::new(GatedSink {
            gate: tokio::sync::Semaphore::new(0),
            written: MemoryEvents::default(),
        });
        let queued = QueuedEvents::spawn(inner.clone(), 5);
        for i in 0..20 {
            use futures::FutureExt;
            // One event per pod, as provisioning publishes them (FailedScheduling: Nominated
            // events share a budget of ten).
            let mut event = recorded("FailedScheduling", &format!("pod {i}"));
            event.object.name = Some(format!("pod-{i}"));
            queued
                .publish(event)
                .now_or_never()
                .expect("publish returned without waiting");
        }
        // 5 queued, and at most one taken by the publisher task: the rest dropped.
        assert!(queued.dropped() >= 14, "{}", queued.dropped());
    }

    #[test]
    fn nominations_of_many_pods_share_upstreams_budget_of_ten_then_five_per_second() {
        let mut recent = RecentEvents::default();
        let start = std::time::Instant::now();
        let nominate = |recent: &mut RecentEvents, pod: usize, at| {
            let mut e = recorded("Nominated", "Pod should schedule on: nodeclaim/a");
            e.object.name = Some(format!("pod-{pod}"));
            recent.admit(SeriesKey::of(&e, &e.message), at)
        };
        let first: usize = (0..1000)
            .filter(|&pod| nominate(&mut recent, pod, start))
            .count();
        assert_eq!(first, 10, "a round of 1 000 nominations writes the burst");
        // One second later, five more pods; pods already nominated stay deduped.
        let later = start + Duration::from_secs(1);
        assert!(!nominate(&mut recent, 0, later));
        let second: usize = (1000..1100)
            .filter(|&pod| nominate(&mut recent, pod, later))
            .count();
        assert_eq!(second, 5);
        // Other reasons are not held by the nomination budget.
        let other = recorded("FailedScheduling", "no instance type fits");
        assert!(recent.admit(SeriesKey::of(&other, &other.message), later));
    }

    #[test]
    fn identical_events_within_the_window_are_written_once() {
        let mut recent = RecentEvents::default();
        let start = std::time::Instant::now();
        let e = recorded("DisruptionBlocked", "node is nominated");
        let key = || SeriesKey::of(&e, &e.message);
        assert!(recent.admit(key(), start));
        assert!(!recent.admit(key(), start + Duration::from_secs(60)));
        let other = recorded("DisruptionBlocked", "pdb prevents pod evictions");
        assert!(recent.admit(SeriesKey::of(&other, &other.message), start));
        assert!(recent.admit(key(), start + DEDUPE_WINDOW + Duration::from_secs(1)));
    }

    #[test]
    fn a_pods_failed_scheduling_is_written_once_per_five_minutes_whatever_its_message() {
        let mut recent = RecentEvents::default();
        let start = std::time::Instant::now();
        let failed = |recent: &mut RecentEvents, pod: &str, message: &str, at| {
            let mut e = recorded("FailedScheduling", message);
            e.object.kind = Some("Pod".into());
            e.object.name = Some(pod.into());
            recent.admit(SeriesKey::of(&e, &e.message), at)
        };
        assert!(failed(
            &mut recent,
            "a",
            "no instance type fits (3 of 9)",
            start
        ));
        // Past the general window, with a message whose count changed: still a repeat.
        let later = start + DEDUPE_WINDOW + Duration::from_secs(60);
        assert!(!failed(
            &mut recent,
            "a",
            "no instance type fits (4 of 9)",
            later
        ));
        // Another pod, and another reason for the same pod, are not held by it.
        assert!(failed(
            &mut recent,
            "b",
            "no instance type fits (3 of 9)",
            later
        ));
        let mut nominated = recorded("Nominated", "Pod should schedule on: nodeclaim/x");
        nominated.object.kind = Some("Pod".into());
        nominated.object.name = Some("a".into());
        assert!(recent.admit(SeriesKey::of(&nominated, &nominated.message), later));
        let after = start + FAILED_SCHEDULING_DEDUPE + Duration::from_secs(1);
        assert!(failed(
            &mut recent,
            "a",
            "no instance type fits (4 of 9)",
            after
        ));
    }

    #[test]
    fn one_object_gets_a_burst_then_one_event_per_refill() {
        let mut recent = RecentEvents::default();
        let start = std::time::Instant::now();
        // Distinct messages: the dedupe does not apply, only the object's budget.
        let admit = |recent: &mut RecentEvents, i: u32, at: std::time::Instant| {
            let e = recorded("FailedDraining", &format!("attempt {i}"));
            recent.admit(SeriesKey::of(&e, &e.message), at)
        };
        for i in 0..OBJECT_BURST {
            assert!(
                admit(&mut recent, i, start),
                "event {i} is within the burst"
            );
        }
        assert!(!admit(&mut recent, 100, start), "the burst is spent");
        // Another object is not affected.
        let mut other = recorded("FailedDraining", "attempt 0");
        other.object.name = Some("another".into());
        assert!(recent.admit(SeriesKey::of(&other, &other.message), start));
        assert!(!admit(&mut recent, 101, start + OBJECT_REFILL / 2));
        assert!(admit(&mut recent, 102, start + OBJECT_REFILL));
        assert!(!admit(&mut recent, 103, start + OBJECT_REFILL));
    }

    #[test]
    fn truncation_respects_char_boundaries() {
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("abc", 10), "abc");
    }
}
