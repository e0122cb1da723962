//! Requests a controller made to kube-apiserver, read from the apiserver's audit log and told
//! apart by User-Agent: ours sends `karpenter-exoscale/<version>`, upstream's controller-runtime
//! client `karpenter/<version>`.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::Path;

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
}

#[derive(Deserialize)]
struct ObjectRef {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    subresource: String,
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
        let Ok(file) = std::fs::File::open(log) else {
            return Requests(counts);
        };
        // By bytes: one line that is not UTF-8 (a request body's escape) must not end the count.
        for line in std::io::BufReader::new(file).split(b'\n') {
            let Ok(line) = line else { break };
            let Ok(event) = serde_json::from_slice::<Event>(&line) else {
                continue;
            };
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
            *counts
                .entry(format!("{} {resource}", event.verb))
                .or_insert(0) += 1;
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
