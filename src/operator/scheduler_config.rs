//! `SCHEDULER_CONFIG`: cluster-wide default topology spread for pods that declare none, as
//! upstream's `--scheduler-config` takes it (kube-scheduler's `PodTopologySpread`
//! `defaultConstraints`, YAML or JSON):
//!
//! ```yaml
//! podTopologySpread:
//!   defaultConstraints:
//!     - {maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: ScheduleAnyway}
//! ```
//!
//! Validated like kube-scheduler validates them: `maxSkew` > 0, a `topologyKey`, no
//! `labelSelector` or `matchLabelKeys` (each pod's own labels select its peers), no two
//! constraints with the same key and `whenUnsatisfiable`. Anything else refuses start-up.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::TopologySpreadConstraint as K8sConstraint;
use serde::Deserialize;

use crate::scheduling::{TopologySpreadConstraint, convert};

/// Longest accepted value: a handful of constraints fit in a few hundred bytes.
pub const MAX_BYTES: usize = 64 * 1024;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SchedulerConfig {
    #[serde(default)]
    pod_topology_spread: Option<PodTopologySpread>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PodTopologySpread {
    #[serde(default)]
    default_constraints: Vec<K8sConstraint>,
}

/// The default constraints of `text`; an empty text means none.
pub fn parse(text: &str) -> Result<Vec<TopologySpreadConstraint>, String> {
    if text.len() > MAX_BYTES {
        return Err(format!("longer than {MAX_BYTES} bytes"));
    }
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    let config: SchedulerConfig = serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
    let constraints = config
        .pod_topology_spread
        .map(|p| p.default_constraints)
        .unwrap_or_default();
    let mut seen = BTreeSet::new();
    constraints
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let field = |f: &str| format!("podTopologySpread.defaultConstraints[{i}].{f}");
            if c.topology_key.is_empty() {
                return Err(format!("{}: required", field("topologyKey")));
            }
            if c.label_selector.is_some() {
                return Err(format!(
                    "{}: not allowed in default constraints",
                    field("labelSelector")
                ));
            }
            if c.match_label_keys.as_ref().is_some_and(|k| !k.is_empty()) {
                return Err(format!(
                    "{}: not allowed in default constraints",
                    field("matchLabelKeys")
                ));
            }
            if !seen.insert((c.topology_key.clone(), c.when_unsatisfiable.clone())) {
                return Err(format!(
                    "podTopologySpread.defaultConstraints[{i}]: a second constraint for {} with whenUnsatisfiable {:?}",
                    c.topology_key, c.when_unsatisfiable
                ));
            }
            convert::spread("SCHEDULER_CONFIG", i, c).map_err(|e| e.to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::model::WhenUnsatisfiable;

    #[test]
    fn default_constraints_are_read_from_yaml_and_json() {
        let yaml = "podTopologySpread:\n  defaultConstraints:\n    - {maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: ScheduleAnyway}\n    - {maxSkew: 3, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule}\n";
        let got = parse(yaml).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].topology_key, "topology.kubernetes.io/zone");
        assert_eq!(got[0].when_unsatisfiable, WhenUnsatisfiable::ScheduleAnyway);
        assert_eq!(got[1].max_skew, 3);
        let json = r#"{"podTopologySpread":{"defaultConstraints":[{"maxSkew":2,"topologyKey":"k","whenUnsatisfiable":"DoNotSchedule"}]}}"#;
        assert_eq!(parse(json).unwrap()[0].max_skew, 2);
        assert!(parse("").unwrap().is_empty());
    }

    #[test]
    fn what_kube_scheduler_refuses_is_refused_naming_the_field() {
        let one = |c: &str| {
            parse(&format!(
                "podTopologySpread:\n  defaultConstraints:\n    - {c}\n"
            ))
        };
        let cases = [
            (
                "{maxSkew: 0, topologyKey: k, whenUnsatisfiable: DoNotSchedule}",
                "maxSkew",
            ),
            (
                "{maxSkew: 1, whenUnsatisfiable: DoNotSchedule}",
                "topologyKey",
            ),
            (
                "{maxSkew: 1, topologyKey: k, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {a: b}}}",
                "labelSelector",
            ),
            (
                "{maxSkew: 1, topologyKey: k, whenUnsatisfiable: DoNotSchedule, matchLabelKeys: [app]}",
                "matchLabelKeys",
            ),
            (
                "{maxSkew: 1, topologyKey: k, whenUnsatisfiable: Sometimes}",
                "Sometimes",
            ),
        ];
        for (constraint, named) in cases {
            let error = one(constraint).unwrap_err();
            assert!(error.contains(named), "{constraint}: {error}");
        }
        let twice = "podTopologySpread:\n  defaultConstraints:\n    - {maxSkew: 1, topologyKey: k, whenUnsatisfiable: DoNotSchedule}\n    - {maxSkew: 2, topologyKey: k, whenUnsatisfiable: DoNotSchedule}\n";
        assert!(parse(twice).unwrap_err().contains("second constraint"));
        assert!(parse("podTopologySpread: {defaultConstraint: []}").is_err());
        assert!(
            parse(&"#".repeat(MAX_BYTES + 1))
                .unwrap_err()
                .contains("longer")
        );
    }
}
