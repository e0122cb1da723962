//! Pod events: records on a NodeClaim (`status.lastPodEventTime`) when a pod was bound to its
//! node, or left it (finished, terminating, deleted). Consolidation counts `consolidateAfter`
//! from that time, so a node with pod churn is not consolidated while the churn goes on.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};

use crate::apis::NodeClaim;

use super::{Context, Shutdown, patch_status};

/// Upstream writes at most one update per NodeClaim in this window.
pub const DEDUPE_WINDOW: Duration = Duration::from_secs(5);

/// What about a pod matters to its node: where it runs and whether it has left.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodPlacement {
    pub node: String,
    pub gone: bool,
}

/// The placement of a pod, `None` while it is not bound.
pub fn placement(pod: &Pod) -> Option<PodPlacement> {
    let node = pod
        .spec
        .as_ref()?
        .node_name
        .clone()
        .filter(|n| !n.is_empty())?;
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    let gone =
        pod.metadata.deletion_timestamp.is_some() || matches!(phase, Some("Succeeded" | "Failed"));
    Some(PodPlacement { node, gone })
}

/// The node whose NodeClaim should record a pod event, given the pod's previous and current
/// placement (`current` is `None` once the pod was deleted).
pub fn event_node(
    previous: Option<&PodPlacement>,
    current: Option<&PodPlacement>,
) -> Option<String> {
    match (previous, current) {
        (None, Some(now)) => Some(now.node.clone()),
        (Some(before), None) if !before.gone => Some(before.node.clone()),
        (Some(before), Some(now)) if before != now => Some(now.node.clone()),
        _ => None,
    }
}

/// Watches pods and stamps `lastPodEventTime` on the NodeClaim of the node concerned.
pub async fn run(ctx: Arc<Context>, shutdown: Shutdown) {
    let pods: Api<Pod> = Api::all(ctx.client.clone());
    let mut events = watcher::watcher(pods, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut known: HashMap<String, PodPlacement> = HashMap::new();
    let mut last_written: HashMap<String, i64> = HashMap::new();
    let mut listing = false;
    loop {
        let event = tokio::select! {
            _ = shutdown.clone() => return,
            next = events.next() => match next {
                Some(Ok(event)) => event,
                Some(Err(error)) => {
                    tracing::debug!(%error, "pod watch error");
                    continue;
                }
                None => return,
            },
        };
        let (uid, current) = match event {
            Event::Init => {
                listing = true;
                continue;
            }
            Event::InitDone => {
                listing = false;
                continue;
            }
            Event::InitApply(pod) => {
                // The initial list only learns where pods are; it is not an event.
                if let (Some(uid), Some(p)) = (pod.metadata.uid.clone(), placement(&pod)) {
                    known.insert(uid, p);
                }
                continue;
            }
            Event::Apply(pod) => (
                pod.metadata.uid.clone().unwrap_or_default(),
                placement(&pod),
            ),
            Event::Delete(pod) => (pod.metadata.uid.clone().unwrap_or_default(), None),
        };
        if listing {
            continue;
        }
        let previous = known.get(&uid).cloned();
        let node = event_node(previous.as_ref(), current.as_ref());
        match current {
            Some(p) => known.insert(uid, p),
            None => known.remove(&uid),
        };
        let Some(node) = node else { continue };
        record(&ctx, &node, &mut last_written).await;
    }
}

async fn record(ctx: &Context, node: &str, last_written: &mut HashMap<String, i64>) {
    let claim = {
        let index = ctx.cluster.read();
        let provider_id = index
            .node(node)
            .and_then(|n| n.spec.as_ref()?.provider_id.clone());
        provider_id.and_then(|p| index.nodeclaim_by_provider_id(&p))
    };
    let Some(claim) = claim else { return };
    let name = claim.metadata.name.clone().unwrap_or_default();
    let now = ctx.clock.now_unix();
    if last_written
        .get(&name)
        .is_some_and(|t| now - t < DEDUPE_WINDOW.as_secs() as i64)
    {
        return;
    }
    let api: Api<NodeClaim> = Api::all(ctx.client.clone());
    let status = serde_json::json!({ "lastPodEventTime": Time(ctx.now()) });
    match patch_status(&api, &name, &status).await {
        Ok(_) => {
            last_written.insert(name, now);
        }
        Err(error) => tracing::debug!(nodeclaim = %name, %error, "cannot record a pod event"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::testing;

    fn at(node: &str, gone: bool) -> PodPlacement {
        PodPlacement {
            node: node.into(),
            gone,
        }
    }

    #[test]
    fn binding_and_leaving_are_events_other_updates_are_not() {
        assert_eq!(
            event_node(None, Some(&at("n1", false))),
            Some("n1".into()),
            "bound"
        );
        assert_eq!(
            event_node(Some(&at("n1", false)), Some(&at("n1", false))),
            None,
            "status update"
        );
        assert_eq!(
            event_node(Some(&at("n1", false)), Some(&at("n1", true))),
            Some("n1".into()),
            "finished"
        );
        assert_eq!(
            event_node(Some(&at("n1", false)), None),
            Some("n1".into()),
            "deleted"
        );
        assert_eq!(
            event_node(Some(&at("n1", true)), None),
            None,
            "already counted when it finished"
        );
        assert_eq!(event_node(None, None), None);
    }

    #[test]
    fn placement_reads_node_and_phase() {
        assert_eq!(placement(&testing::pod("ns", "p", None)), None);
        assert_eq!(
            placement(&testing::pod("ns", "p", Some("n1"))),
            Some(at("n1", false))
        );
        let mut done = testing::pod("ns", "p", Some("n1"));
        done.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        });
        assert_eq!(placement(&done), Some(at("n1", true)));
    }
}
