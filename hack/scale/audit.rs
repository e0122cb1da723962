//! Requests a controller made to kube-apiserver, read from the apiserver's audit log and told
//! apart by User-Agent: ours sends `karpenter-exoscale/<version>`, upstream's controller-runtime
//! client `karpenter/<version>`.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::Path;

use chrono::{DateTime, Utc};

use serde::Deserialize;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Event {
    stage: String,
    verb: String,
    #[serde(default)]
    user_agent: String,
    #[serde(default)]
    object_ref: Option<ObjectRef>,
    #[serde(default)]
    request_received_timestamp: Option<DateTime<Utc>>,
    #[serde(default)]
    stage_timestamp: Option<DateTime<Utc>>,
    #[serde(default)]
    response_status: Option<ResponseStatus>,
}

#[derive(Deserialize)]
struct ObjectRef {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    subresource: String,
    #[serde(default)]
    name: String,
}

#[derive(Deserialize)]
struct ResponseStatus {
    #[serde(default)]
    code: u16,
}

/// Every event of the log, read by bytes: one line that is not UTF-8 (a request body's
/// escape) must not end the reading.
fn events(log: &Path) -> impl Iterator<Item = Event> {
    let lines = std::fs::File::open(log)
        .ok()
        .map(|f| std::io::BufReader::new(f).split(b'\n'));
    lines
        .into_iter()
        .flatten()
        .map_while(Result::ok)
        .filter_map(|line| serde_json::from_slice::<Event>(&line).ok())
}

/// Seconds from each Node's creation (by the simulated kubelet or kwok, any agent) to the
/// controller's first accepted write to it (`agent`): its registration (labels synced, the
/// unregistered taint removed), sorted. A write the API server refused (409, 422) registered
/// nothing and is not counted. Nodes the controller never wrote are left out.
pub fn registration_delays(log: &Path, agent: &str) -> Vec<f64> {
    let mut delays: Vec<f64> = registrations(log, agent)
        .values()
        .map(|(born, written)| seconds(*born, *written))
        .collect();
    delays.sort_by(f64::total_cmp);
    delays
}

/// [`registration_delays`] split where the controller's Node watch first delivered each Node:
/// seconds from its creation to then (the watch), and from then to the write (the controller),
/// each sorted. The delivery is the controller's first `a Node change wakes its NodeClaim`
/// line (text logs, with `RUST_LOG` enabling `karpenter_exoscale::controllers::nodeclaim` at
/// debug); `None` when `controller_log` has none.
pub fn registration_split(
    log: &Path,
    controller_log: &Path,
    agent: &str,
) -> Option<(Vec<f64>, Vec<f64>)> {
    let text = std::fs::read(controller_log).ok()?;
    let mut delivered: BTreeMap<&str, DateTime<Utc>> = BTreeMap::new();
    for line in text.split(|b| *b == b'\n') {
        let Ok(line) = std::str::from_utf8(line) else {
            continue;
        };
        if !line.contains("a Node change wakes its NodeClaim") {
            continue;
        }
        let at = line.split(' ').next().and_then(|t| t.parse().ok());
        let node = line
            .split(' ')
            .find_map(|field| field.strip_prefix("node="));
        if let (Some(at), Some(node)) = (at, node) {
            delivered.entry(node).or_insert(at);
        }
    }
    if delivered.is_empty() {
        return None;
    }
    let (mut watch, mut controller) = (Vec::new(), Vec::new());
    for (node, (born, written)) in registrations(log, agent) {
        if let Some(seen) = delivered.get(node.as_str()) {
            watch.push(seconds(born, *seen));
            controller.push(seconds(*seen, written));
        }
    }
    watch.sort_by(f64::total_cmp);
    controller.sort_by(f64::total_cmp);
    Some((watch, controller))
}

fn seconds(from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
    (to - from).num_milliseconds() as f64 / 1000.0
}

/// Each Node the controller (`agent`) wrote: when it was created, and when the API server
/// received the controller's first accepted write to it. By timestamps, not by the log's order:
/// the API server writes an event when its request completes, so a quick write can come in the
/// log before the slower create of the same Node (a Node registered in 0.15 s once read as
/// 3.03 s, from its second write).
fn registrations(log: &Path, agent: &str) -> BTreeMap<String, (DateTime<Utc>, DateTime<Utc>)> {
    let mut created: BTreeMap<String, DateTime<Utc>> = BTreeMap::new();
    let mut written: BTreeMap<String, DateTime<Utc>> = BTreeMap::new();
    for event in events(log) {
        let Some(object) = &event.object_ref else {
            continue;
        };
        if event.stage != "ResponseComplete" || object.resource != "nodes" {
            continue;
        }
        let code = event.response_status.as_ref().map_or(0, |s| s.code);
        if event.verb == "create" && code == 201 {
            if let Some(at) = event.stage_timestamp {
                created.insert(object.name.clone(), at);
            }
        } else if matches!(event.verb.as_str(), "patch" | "update")
            && (200..300).contains(&code)
            && event.user_agent.starts_with(agent)
            && let Some(at) = event.request_received_timestamp
        {
            earliest(&mut written, &object.name, at);
        }
    }
    written
        .into_iter()
        .filter_map(|(name, at)| {
            let born = *created.get(&name)?;
            Some((name, (born, at)))
        })
        .collect()
}

fn earliest(times: &mut BTreeMap<String, DateTime<Utc>>, name: &str, at: DateTime<Utc>) {
    times
        .entry(name.to_string())
        .and_modify(|t| *t = (*t).min(at))
        .or_insert(at);
}

/// When a launch's pods came to exist and became Karpenter's to provision, against when its
/// last NodeClaim was created: seconds after the scenario's Deployment was created. A pod is
/// provisionable once kube-scheduler has marked it unschedulable (its `pods/status` write);
/// a pod kube-scheduler bound first never is.
pub struct LaunchTimeline {
    pub last_pod_created: f64,
    pub last_pod_marked: Option<f64>,
    pub pods_marked: usize,
    pub last_claim_created: Option<f64>,
    /// At the last mark: pods unbound, and how many of them kube-scheduler had never marked
    /// (never tried, or tried and bound later): demand the controller could not yet see.
    pub unbound_at_last_mark: usize,
    pub never_marked_at_last_mark: usize,
}

/// From the events' timestamps, never the log's order (see [`registrations`]).
pub fn launch_timeline(log: &Path) -> Option<LaunchTimeline> {
    let mut start = None;
    let (mut last_pod, mut last_claim) = (None, None);
    let mut marked: BTreeMap<String, DateTime<Utc>> = BTreeMap::new();
    // By count for creates: a pod created from generateName may have no name in the log.
    let mut created: Vec<DateTime<Utc>> = Vec::new();
    let mut bound: BTreeMap<String, DateTime<Utc>> = BTreeMap::new();
    for event in events(log) {
        let (Some(object), Some(at)) = (&event.object_ref, event.stage_timestamp) else {
            continue;
        };
        let code = event.response_status.as_ref().map_or(0, |s| s.code);
        if event.stage != "ResponseComplete" || !(200..300).contains(&code) {
            continue;
        }
        match (
            object.resource.as_str(),
            object.subresource.as_str(),
            event.verb.as_str(),
        ) {
            ("deployments", "", "create") => start = Some(start.map_or(at, |s| at.min(s))),
            ("pods", "", "create") => {
                last_pod = Some(last_pod.map_or(at, |l| at.max(l)));
                created.push(at);
            }
            ("pods", "binding", "create") => earliest(&mut bound, &object.name, at),
            ("pods", "status", _) if event.user_agent.starts_with("kube-scheduler") => {
                earliest(&mut marked, &object.name, at);
            }
            ("nodeclaims", "", "create") => {
                last_claim = Some(last_claim.map_or(at, |l| at.max(l)));
            }
            _ => {}
        }
    }
    let start = start?;
    let after = |at: DateTime<Utc>| (at - start).num_milliseconds() as f64 / 1000.0;
    let last_mark = marked.values().max().copied();
    let (mut unbound, mut never_marked) = (0, 0);
    if let Some(mark) = last_mark {
        let bound_by_then = |name: &String| bound.get(name).is_some_and(|b| *b <= mark);
        unbound = created
            .iter()
            .filter(|c| **c <= mark)
            .count()
            .saturating_sub(bound.values().filter(|b| **b <= mark).count());
        let marked_unbound = marked.keys().filter(|n| !bound_by_then(n)).count();
        never_marked = unbound.saturating_sub(marked_unbound);
    }
    Some(LaunchTimeline {
        last_pod_created: after(last_pod?),
        last_pod_marked: last_mark.map(after),
        pods_marked: marked.len(),
        last_claim_created: last_claim.map(after),
        unbound_at_last_mark: unbound,
        never_marked_at_last_mark: never_marked,
    })
}

/// `p50 / p99 / max` of sorted `values`, in seconds.
pub fn spread(values: &[f64]) -> String {
    if values.is_empty() {
        return "–".into();
    }
    let at = |q: f64| values[((values.len() as f64 * q) as usize).min(values.len() - 1)];
    format!(
        "{:.2} / {:.2} / {:.2} s",
        at(0.5),
        at(0.99),
        values[values.len() - 1]
    )
}

/// Requests by `verb resource[/subresource]`.
#[derive(Clone, Default)]
pub struct Requests(pub BTreeMap<String, u64>);

impl Requests {
    /// Every request whose User-Agent starts with `agent` in the log so far. A watch is
    /// counted when its response starts (it may never complete), anything else when it
    /// completes: each request once.
    pub fn read(log: &Path, agent: &str) -> Requests {
        let mut counts = BTreeMap::new();
        for event in events(log) {
            if !event.user_agent.starts_with(agent) {
                continue;
            }
            let counted = match event.stage.as_str() {
                "ResponseStarted" => event.verb == "watch",
                "ResponseComplete" | "Panic" => event.verb != "watch",
                _ => false,
            };
            if !counted {
                continue;
            }
            let resource = event.object_ref.map_or_else(
                || "(non-resource)".to_string(),
                |o| {
                    if o.subresource.is_empty() {
                        o.resource
                    } else {
                        format!("{}/{}", o.resource, o.subresource)
                    }
                },
            );
            // A conflict is a request the API server refused for a stale resourceVersion.
            let conflict = event
                .response_status
                .as_ref()
                .is_some_and(|s| s.code == 409);
            let key = if conflict {
                format!("{} {resource} (409)", event.verb)
            } else {
                format!("{} {resource}", event.verb)
            };
            *counts.entry(key).or_insert(0) += 1;
        }
        Requests(counts)
    }

    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }

    /// What was made after `before`.
    pub fn since(&self, before: &Requests) -> Requests {
        Requests(
            self.0
                .iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        v.saturating_sub(before.0.get(k).copied().unwrap_or(0)),
                    )
                })
                .filter(|(_, v)| *v > 0)
                .collect(),
        )
    }

    /// The `n` most frequent, `verb resource count` each, most frequent first.
    pub fn top(&self, n: usize) -> String {
        let mut entries: Vec<(&String, &u64)> = self.0.iter().collect();
        entries.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        entries
            .iter()
            .take(n)
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One audit event, as kube-apiserver writes it when the request completes.
    fn event(
        verb: &str,
        resource: &str,
        name: &str,
        agent: &str,
        received: &str,
        done: &str,
    ) -> String {
        let code = if verb == "create" { 201 } else { 200 };
        serde_json::json!({
            "stage": "ResponseComplete", "verb": verb, "userAgent": agent,
            "objectRef": {"resource": resource, "name": name},
            "requestReceivedTimestamp": format!("2026-12-07T10:00:{received}Z"),
            "stageTimestamp": format!("2026-12-07T10:00:{done}Z"),
            "responseStatus": {"code": code},
        })
        .to_string()
    }

    fn log(lines: &[String]) -> tempfile::TempPath {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), lines.join("\n")).unwrap();
        file.into_temp_path()
    }

    #[test]
    fn a_registration_is_timed_from_the_first_write_even_when_the_log_has_it_before_the_create() {
        let ours = "karpenter-exoscale/0.1.0";
        let audit = log(&[
            // A slow create completes after the quick write that followed it.
            event("patch", "nodes", "n1", ours, "01.595", "01.649"),
            event("create", "nodes", "n1", "kubelet", "01.337", "01.443"),
            event("patch", "nodes", "n1", ours, "04.472", "04.886"),
            event("create", "nodes", "n2", "kubelet", "02.000", "02.100"),
            // Another agent's write registers nothing; ours does.
            event(
                "patch",
                "nodes",
                "n2",
                "kube-controller-manager",
                "02.200",
                "02.300",
            ),
            event("patch", "nodes", "n2", ours, "02.500", "03.600"),
        ]);
        let delays = registration_delays(&audit, "karpenter-exoscale");
        assert_eq!(delays, [0.152, 0.4]);
    }

    #[test]
    fn the_launch_timeline_takes_the_last_and_first_instants_not_the_last_lines() {
        let audit = log(&[
            event("create", "deployments", "d", "kubectl", "00.000", "00.000"),
            event("create", "pods", "p2", "kcm", "05.000", "05.000"),
            event("create", "pods", "p1", "kcm", "03.000", "03.000"),
            event(
                "create",
                "nodeclaims",
                "c2",
                "karpenter-exoscale",
                "09.000",
                "09.000",
            ),
            event(
                "create",
                "nodeclaims",
                "c1",
                "karpenter-exoscale",
                "07.000",
                "07.000",
            ),
        ]);
        let timeline = launch_timeline(&audit).unwrap();
        assert_eq!(timeline.last_pod_created, 5.0);
        assert_eq!(timeline.last_claim_created, Some(9.0));
    }
}
