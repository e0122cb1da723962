//! Kubernetes events with upstream Karpenter's reasons. Controllers talk to [`EventSink`] so
//! tests can record events in memory; publishing failures are logged, never fatal.

use std::sync::Mutex;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

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

/// Publishes through the `events.k8s.io` API.
pub struct KubeEvents {
    recorder: Recorder,
}

impl KubeEvents {
    pub fn new(client: kube::Client, instance: Option<String>) -> Self {
        let reporter = Reporter {
            controller: "karpenter".into(),
            instance,
        };
        KubeEvents {
            recorder: Recorder::new(client, reporter),
        }
    }
}

impl EventSink for KubeEvents {
    fn publish(&self, event: Recorded) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let ev = Event {
                type_: match event.severity {
                    Severity::Normal => EventType::Normal,
                    Severity::Warning => EventType::Warning,
                },
                reason: event.reason.clone(),
                // The events API caps notes at 1 kB.
                note: Some(truncate(&event.message, 1000)),
                action: event.reason.clone(),
                secondary: None,
            };
            if let Err(error) = self.recorder.publish(&ev, &event.object).await {
                tracing::warn!(reason = %event.reason, %error, "cannot publish event");
            }
        })
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

    #[test]
    fn truncation_respects_char_boundaries() {
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("abc", 10), "abc");
    }
}
