//! Conversions from Kubernetes objects (`k8s_openapi`) into the engine's domain types.
//! Used by the provisioner, consolidation and `simulate`.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::DaemonSet as K8sDaemonSet;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;

use crate::interner::Interner;
use crate::state::HeldPod;
use crate::state::held_pod as held;

use super::labels::{HOSTNAME, NODE_POOL};
use super::model::{
    BoundPod, DaemonSetPod, ExistingNode, HostPort, InclusionPolicy, LabelSelector, NamespaceScope,
    NodeLabels, Pod, PodAffinityTerm, PodLabels, PodShape, SelectorExpression, SelectorOperator,
    TopologySpreadConstraint, WeightedPodAffinityTerm, WeightedRequirements, WhenUnsatisfiable,
};
use super::quantity::{PODS, Quantity, QuantityError, Resources};
use super::requirements::{Operator, Requirement, RequirementError, Requirements};
use super::taints::{Taint, TaintEffect, Toleration, TolerationOperator};

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConvertError {
    #[error("{object}: {source}")]
    Quantity {
        object: String,
        source: QuantityError,
    },
    #[error("{object}: {source}")]
    Requirement {
        object: String,
        source: RequirementError,
    },
    #[error("{object}: node affinity matchFields {field:?}: only metadata.name In/NotIn exists")]
    MatchFields { object: String, field: String },
    #[error("{object}: unknown taint effect {effect:?}")]
    TaintEffect { object: String, effect: String },
    #[error("{object}: unknown {field} {value:?}")]
    UnknownValue {
        object: String,
        field: &'static str,
        value: String,
    },
    #[error("DaemonSet {0} has no pod template spec")]
    MissingTemplate(String),
    /// A value the API server's validation rejects, with its field path.
    #[error("{object}: {field}: {problem}")]
    Invalid {
        object: String,
        field: String,
        problem: &'static str,
    },
    /// Requests whose sum does not fit (absurd quantities): the pod cannot be placed.
    #[error("{object}: {what} of {resource} overflow")]
    Overflow {
        object: String,
        what: &'static str,
        resource: String,
    },
}

const DAEMONSET_KIND: &str = "DaemonSet";
const NODE_KIND: &str = "Node";
/// Taints a node carries only while starting; ignored on uninitialized Karpenter nodes.
const EPHEMERAL_TAINT_KEYS: [&str; 4] = [
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
    "node.cloudprovider.kubernetes.io/uninitialized",
    "karpenter.sh/unregistered",
];

fn object_name(meta: &meta::ObjectMeta) -> String {
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or(""),
        meta.name.as_deref().unwrap_or("")
    )
}

fn owned_by_kind(meta: &meta::ObjectMeta, kind: &str) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == kind)
}

/// Upstream's provisionable pod: `PodScheduled` is False with reason `Unschedulable`, no
/// `nodeName`, no `nominatedNodeName`, and not owned by a DaemonSet or a Node (mirror pod).
pub fn is_provisionable(pod: &HeldPod) -> bool {
    let unschedulable = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "PodScheduled" && c.reason.as_deref() == Some("Unschedulable"))
        });
    let node_name = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
    let nominated = pod
        .status
        .as_ref()
        .and_then(|s| s.nominated_node_name.as_deref());
    unschedulable
        && node_name.is_none_or(str::is_empty)
        && nominated.is_none_or(str::is_empty)
        && !owned_by_kind(&pod.metadata, DAEMONSET_KIND)
        && !owned_by_kind(&pod.metadata, NODE_KIND)
}

/// A resource list; `field` is its path, for errors (`spec.containers[0].resources.requests`).
/// Negative quantities are refused as the API server refuses them.
fn resource_list<'a>(
    object: &str,
    field: &str,
    list: Option<
        impl IntoIterator<
            Item = (
                &'a String,
                &'a k8s_openapi::apimachinery::pkg::api::resource::Quantity,
            ),
        >,
    >,
) -> Result<Resources, ConvertError> {
    let mut r = Resources::new();
    for (k, v) in list.into_iter().flatten() {
        let q = Quantity::parse(&v.0).map_err(|source| ConvertError::Quantity {
            object: object.to_string(),
            source,
        })?;
        if q.milli() < 0 {
            return Err(ConvertError::Invalid {
                object: object.to_string(),
                field: format!("{field}[{k}]"),
                problem: "must be greater than or equal to 0",
            });
        }
        r.set(k, q);
    }
    Ok(r)
}

/// Requests, with limits standing in for missing requests (as the API server defaults them).
fn container_requests(
    object: &str,
    field: &str,
    c: &held::Container,
) -> Result<Resources, ConvertError> {
    let res = c.resources.as_ref();
    let mut requests = resource_list(
        object,
        &format!("{field}.resources.requests"),
        res.and_then(|r| r.requests.as_ref()),
    )?;
    let limits = resource_list(
        object,
        &format!("{field}.resources.limits"),
        res.and_then(|r| r.limits.as_ref()),
    )?;
    for (k, v) in limits.iter() {
        if !requests.contains(k) {
            requests.set(k, v);
        }
    }
    Ok(requests)
}

fn max_resources(a: &Resources, b: &Resources) -> Resources {
    let mut out = a.clone();
    out.max_with(b);
    out
}

/// The Kubernetes effective-resources rule over one per-container list (requests or limits):
/// max(containers + sidecars, init-container peaks), then the pod-level list overrides.
fn effective_resources(
    object: &str,
    what: &'static str,
    spec: &held::PodSpec,
    per_container: impl Fn(&str, &held::Container) -> Result<Resources, ConvertError>,
    pod_level: Resources,
) -> Result<Resources, ConvertError> {
    let sum = |a: &Resources, b: &Resources| {
        a.checked_plus(b)
            .map_err(|resource| ConvertError::Overflow {
                object: object.to_string(),
                what,
                resource,
            })
    };
    let mut containers = Resources::new();
    for (i, c) in spec.containers.iter().enumerate() {
        containers = sum(
            &containers,
            &per_container(&format!("spec.containers[{i}]"), c)?,
        )?;
    }
    let mut sidecars = Resources::new();
    let mut init_peak = Resources::new();
    for (i, c) in spec.init_containers.iter().flatten().enumerate() {
        let r = per_container(&format!("spec.initContainers[{i}]"), c)?;
        if c.restart_policy.as_deref() == Some("Always") {
            sidecars = sum(&sidecars, &r)?;
            init_peak = max_resources(&init_peak, &sidecars);
        } else {
            init_peak = max_resources(&init_peak, &sum(&sidecars, &r)?);
        }
    }
    let mut total = max_resources(&sum(&containers, &sidecars)?, &init_peak);
    for (k, v) in pod_level.iter() {
        total.set(k, v);
    }
    Ok(total)
}

/// Kubernetes effective pod requests: max(containers + sidecars, init-container peaks),
/// pod-level resources override, plus pod overhead, plus `pods: 1`.
pub fn pod_requests(object: &str, spec: &held::PodSpec) -> Result<Resources, ConvertError> {
    let pod_level = spec.resources.as_ref().and_then(|r| r.requests.as_ref());
    let total = effective_resources(
        object,
        "requests",
        spec,
        |field, c| container_requests(object, field, c),
        resource_list(object, "spec.resources.requests", pod_level)?,
    )?;
    let overhead = resource_list(object, "spec.overhead", spec.overhead.as_ref())?;
    let overflow = |resource| ConvertError::Overflow {
        object: object.to_string(),
        what: "requests",
        resource,
    };
    let mut total = total.checked_plus(&overhead).map_err(overflow)?;
    let mut one_pod = Resources::new();
    one_pod.set(PODS, Quantity::from_units(1));
    total = total.checked_plus(&one_pod).map_err(overflow)?;
    Ok(total)
}

/// Effective pod limits, by the same rule as requests but without defaulting from requests and
/// without a `pods` entry. A resource no container limits is absent.
pub fn pod_limits(object: &str, spec: &held::PodSpec) -> Result<Resources, ConvertError> {
    let pod_level = spec.resources.as_ref().and_then(|r| r.limits.as_ref());
    let total = effective_resources(
        object,
        "limits",
        spec,
        |field, c| {
            resource_list(
                object,
                &format!("{field}.resources.limits"),
                c.resources.as_ref().and_then(|r| r.limits.as_ref()),
            )
        },
        resource_list(object, "spec.resources.limits", pod_level)?,
    )?;
    if total.is_empty() {
        return Ok(total);
    }
    let overhead = resource_list(object, "spec.overhead", spec.overhead.as_ref())?;
    total
        .checked_plus(&overhead)
        .map_err(|resource| ConvertError::Overflow {
            object: object.to_string(),
            what: "limits",
            resource,
        })
}

fn taint(object: &str, t: &core::Taint) -> Result<Taint, ConvertError> {
    Ok(Taint {
        key: t.key.clone(),
        value: t.value.clone().unwrap_or_default(),
        effect: TaintEffect::parse(&t.effect).ok_or_else(|| ConvertError::TaintEffect {
            object: object.to_string(),
            effect: t.effect.clone(),
        })?,
    })
}

fn toleration(object: &str, t: &core::Toleration) -> Result<Toleration, ConvertError> {
    let effect = match t.effect.as_deref() {
        None | Some("") => None,
        Some(e) => Some(
            TaintEffect::parse(e).ok_or_else(|| ConvertError::TaintEffect {
                object: object.to_string(),
                effect: e.to_string(),
            })?,
        ),
    };
    let operator = match t.operator.as_deref() {
        None | Some("") | Some("Equal") => TolerationOperator::Equal,
        Some("Exists") => TolerationOperator::Exists,
        Some(other) => {
            return Err(ConvertError::UnknownValue {
                object: object.to_string(),
                field: "toleration operator",
                value: other.to_string(),
            });
        }
    };
    Ok(Toleration {
        key: t.key.clone().unwrap_or_default(),
        operator,
        value: t.value.clone().unwrap_or_default(),
        effect,
    })
}

/// The first NoSchedule/NoExecute taint of `node` that `pod` does not tolerate (what keeps
/// kube-scheduler from placing it there), if any; unreadable taints or tolerations count as
/// none.
pub fn untolerated_node_taint(pod: &HeldPod, node: &core::Node) -> Option<Taint> {
    let object = pod.metadata.name.as_deref().unwrap_or_default();
    let tolerations = tolerations(object, pod.spec.as_ref()?.tolerations.as_deref()).ok()?;
    let taints: Vec<Taint> = node
        .spec
        .as_ref()?
        .taints
        .iter()
        .flatten()
        .filter_map(|t| taint(object, t).ok())
        .collect();
    crate::scheduling::taints::first_untolerated(&taints, &tolerations, true).cloned()
}

/// The taints of `node` that `pod` tolerates (unreadable ones count as not tolerated).
pub fn tolerated_node_taints(pod: &HeldPod, node: &core::Node) -> Vec<Taint> {
    let object = pod.metadata.name.as_deref().unwrap_or_default();
    let Some(tolerations) = pod
        .spec
        .as_ref()
        .and_then(|s| tolerations(object, s.tolerations.as_deref()).ok())
    else {
        return Vec::new();
    };
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|t| taint(object, t).ok())
        .filter(|t| tolerations.iter().any(|tol| tol.tolerates(t)))
        .collect()
}

fn tolerations(
    object: &str,
    list: Option<&[core::Toleration]>,
) -> Result<Vec<Toleration>, ConvertError> {
    list.into_iter()
        .flatten()
        .map(|t| toleration(object, t))
        .collect()
}

/// The one field a node selector term may match (`matchFields`).
const NODE_NAME_FIELD: &str = "metadata.name";

pub fn node_selector_term(
    object: &str,
    term: &core::NodeSelectorTerm,
) -> Result<Requirements, ConvertError> {
    let err = |source| ConvertError::Requirement {
        object: object.to_string(),
        source,
    };
    let mut reqs = Requirements::new();
    for e in term.match_expressions.iter().flatten() {
        let op = Operator::parse(&e.operator).map_err(err)?;
        reqs.add(Requirement::new(&e.key, op, e.values.clone().unwrap_or_default()).map_err(err)?);
    }
    // The DaemonSet controller pins each of its pods to its node with `metadata.name In
    // [<node>]`, the one field Kubernetes accepts here: every node runs such pods. A node's
    // name is its hostname label on Exoscale (the instance name), which the simulation knows
    // for existing nodes and never gives a new one; where the two differ, the pod fits no node,
    // which keeps it where it is.
    for f in term.match_fields.iter().flatten() {
        let op = Operator::parse(&f.operator).map_err(err)?;
        if f.key != NODE_NAME_FIELD || !matches!(op, Operator::In | Operator::NotIn) {
            return Err(ConvertError::MatchFields {
                object: object.to_string(),
                field: format!("{} {}", f.key, f.operator),
            });
        }
        let values = f.values.clone().unwrap_or_default();
        reqs.add(Requirement::new(HOSTNAME, op, values).map_err(err)?);
    }
    Ok(reqs)
}

pub fn label_selector(
    object: &str,
    s: Option<&meta::LabelSelector>,
) -> Result<LabelSelector, ConvertError> {
    let Some(s) = s else {
        return Ok(LabelSelector::default());
    };
    let mut out = LabelSelector {
        match_labels: s.match_labels.clone().unwrap_or_default(),
        match_expressions: Vec::new(),
    };
    for e in s.match_expressions.iter().flatten() {
        let operator = match e.operator.as_str() {
            "In" => SelectorOperator::In,
            "NotIn" => SelectorOperator::NotIn,
            "Exists" => SelectorOperator::Exists,
            "DoesNotExist" => SelectorOperator::DoesNotExist,
            other => {
                return Err(ConvertError::UnknownValue {
                    object: object.to_string(),
                    field: "label selector operator",
                    value: other.to_string(),
                });
            }
        };
        out.match_expressions.push(SelectorExpression {
            key: e.key.clone(),
            operator,
            values: e.values.clone().unwrap_or_default(),
        });
    }
    Ok(out)
}

fn affinity_term(
    object: &str,
    t: &core::PodAffinityTerm,
    pod_labels: &BTreeMap<String, String>,
) -> Result<PodAffinityTerm, ConvertError> {
    let mut selector = label_selector(object, t.label_selector.as_ref())?;
    for k in t.match_label_keys.iter().flatten() {
        if let Some(v) = pod_labels.get(k) {
            selector.match_labels.insert(k.clone(), v.clone());
        }
    }
    let namespaces = match (&t.namespace_selector, &t.namespaces) {
        (Some(sel), _)
            if sel.match_labels.as_ref().is_none_or(|m| m.is_empty())
                && sel.match_expressions.as_ref().is_none_or(|m| m.is_empty()) =>
        {
            NamespaceScope::All
        }
        (_, Some(list)) => NamespaceScope::Listed(list.clone()),
        _ => NamespaceScope::default(),
    };
    Ok(PodAffinityTerm {
        selector,
        topology_key: t.topology_key.clone(),
        namespaces,
    })
}

fn policy(
    object: &str,
    field: &'static str,
    v: Option<&str>,
    default: InclusionPolicy,
) -> Result<InclusionPolicy, ConvertError> {
    match v {
        None | Some("") => Ok(default),
        Some("Honor") => Ok(InclusionPolicy::Honor),
        Some("Ignore") => Ok(InclusionPolicy::Ignore),
        Some(other) => Err(ConvertError::UnknownValue {
            object: object.to_string(),
            field,
            value: other.to_string(),
        }),
    }
}

/// One topology spread constraint; `object` and `index` name it in errors.
pub fn spread(
    object: &str,
    index: usize,
    c: &core::TopologySpreadConstraint,
) -> Result<TopologySpreadConstraint, ConvertError> {
    let invalid = |field: &str| ConvertError::Invalid {
        object: object.to_string(),
        field: format!("spec.topologySpreadConstraints[{index}].{field}"),
        problem: "must be greater than zero",
    };
    if c.max_skew <= 0 {
        return Err(invalid("maxSkew"));
    }
    if c.min_domains.is_some_and(|m| m <= 0) {
        return Err(invalid("minDomains"));
    }
    let when_unsatisfiable = match c.when_unsatisfiable.as_str() {
        "DoNotSchedule" | "" => WhenUnsatisfiable::DoNotSchedule,
        "ScheduleAnyway" => WhenUnsatisfiable::ScheduleAnyway,
        other => {
            return Err(ConvertError::UnknownValue {
                object: object.to_string(),
                field: "whenUnsatisfiable",
                value: other.to_string(),
            });
        }
    };
    Ok(TopologySpreadConstraint {
        max_skew: c.max_skew as u32,
        topology_key: c.topology_key.clone(),
        when_unsatisfiable,
        selector: label_selector(object, c.label_selector.as_ref())?,
        min_domains: c.min_domains.map(|m| m as u32),
        node_affinity_policy: policy(
            object,
            "nodeAffinityPolicy",
            c.node_affinity_policy.as_deref(),
            InclusionPolicy::Honor,
        )?,
        node_taints_policy: policy(
            object,
            "nodeTaintsPolicy",
            c.node_taints_policy.as_deref(),
            InclusionPolicy::Ignore,
        )?,
        match_label_keys: c.match_label_keys.clone().unwrap_or_default(),
    })
}

/// `hostPort`s of the regular, init and sidecar containers.
fn host_ports(spec: &held::PodSpec) -> Vec<HostPort> {
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            p.host_port.filter(|hp| *hp > 0).map(|port| HostPort {
                ip: p.host_ip.clone().unwrap_or_default(),
                port,
                protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
            })
        })
        .collect()
}

/// Upstream's `HasDRARequirements`: the pod claims Dynamic Resource Allocation devices, in
/// `spec.resourceClaims` or in a container's or init container's `resources.claims`.
fn uses_dynamic_resources(spec: &held::PodSpec) -> bool {
    let claims = |c: &held::Container| {
        c.resources
            .as_ref()
            .and_then(|r| r.claims.as_ref())
            .is_some_and(|claims| !claims.is_empty())
    };
    spec.resource_claims.as_ref().is_some_and(|c| !c.is_empty())
        || spec.init_containers.iter().flatten().any(claims)
        || spec.containers.iter().any(claims)
}

fn node_selector(selector: Option<&BTreeMap<String, String>>) -> Requirements {
    Requirements::from_labels(selector.into_iter().flatten())
}

/// Converts a pending pod.
pub fn pod_from_k8s(pod: &HeldPod) -> Result<Pod, ConvertError> {
    let object = object_name(&pod.metadata);
    let default_spec = held::PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&default_spec);
    let labels = pod.labels().clone();
    let affinity = spec.affinity.as_ref();
    let node_affinity = affinity.and_then(|a| a.node_affinity.as_ref());
    let required_node_affinity = node_affinity
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|s| {
            s.node_selector_terms
                .iter()
                .map(|t| node_selector_term(&object, t))
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?
        .unwrap_or_default();
    let preferred_node_affinity = node_affinity
        .and_then(|n| {
            n.preferred_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .into_iter()
        .flatten()
        .map(|p| {
            Ok(WeightedRequirements {
                weight: p.weight,
                requirements: node_selector_term(&object, &p.preference)?,
            })
        })
        .collect::<Result<Vec<_>, ConvertError>>()?;
    let terms = |list: Option<&Vec<core::PodAffinityTerm>>| {
        list.into_iter()
            .flatten()
            .map(|t| affinity_term(&object, t, &labels))
            .collect::<Result<Vec<_>, _>>()
    };
    let weighted = |list: Option<&Vec<core::WeightedPodAffinityTerm>>| {
        list.into_iter()
            .flatten()
            .map(|t| {
                Ok(WeightedPodAffinityTerm {
                    weight: t.weight,
                    term: affinity_term(&object, &t.pod_affinity_term, &labels)?,
                })
            })
            .collect::<Result<Vec<_>, ConvertError>>()
    };
    let pa = affinity.and_then(|a| a.pod_affinity.as_ref());
    let paa = affinity.and_then(|a| a.pod_anti_affinity.as_ref());
    let shape = PodShape {
        namespace: pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into()),
        requests: pod_requests(&object, spec)?,
        node_selector: node_selector(spec.node_selector.as_ref()),
        required_node_affinity,
        preferred_node_affinity,
        tolerations: tolerations(&object, spec.tolerations.as_deref())?.into(),
        pod_affinity: terms(pa.and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        }))?,
        preferred_pod_affinity: weighted(pa.and_then(|a| {
            a.preferred_during_scheduling_ignored_during_execution
                .as_ref()
        }))?,
        pod_anti_affinity: terms(paa.and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        }))?,
        preferred_pod_anti_affinity: weighted(paa.and_then(|a| {
            a.preferred_during_scheduling_ignored_during_execution
                .as_ref()
        }))?,
        topology_spread: spec
            .topology_spread_constraints
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, c)| spread(&object, i, c))
            .collect::<Result<Vec<_>, _>>()?,
        host_ports: host_ports(spec),
        volume_requirements: None,
        uses_dynamic_resources: uses_dynamic_resources(spec),
        labels,
    };
    Ok(Pod {
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        created_at: pod
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.as_second())
            .unwrap_or_default(),
        moved_by_consolidation: false,
        shape: Arc::new(shape),
    })
}

/// A held pod as the scheduler reads it: as a pod to place, and as a pod bound to a node
/// (counted for resources and topology). Shared, so a disruption pass or a simulation that
/// copies a node copies pointers.
#[derive(Debug)]
pub struct Converted {
    pub pod: Arc<Pod>,
    pub bound: Arc<BoundPod>,
}

/// The scheduler's reading of a held pod, made once per watched version of it (see
/// [`held::ConvertedOnce`]).
pub fn converted(pod: &HeldPod) -> Result<&Converted, ConvertError> {
    pod.converted
        .get_or_init(|| convert(pod).map_err(Box::new))
        .as_ref()
        .map_err(|e| (**e).clone())
}

/// What held pods' readings share: the pods of one workload carry equal labels and read as
/// equal shapes and equal bound pods, and most pods carry the same tolerations.
#[derive(Default)]
struct SharedReadings {
    labels: Interner<BTreeMap<String, String>>,
    tolerations: Interner<Vec<Toleration>>,
    shapes: Interner<PodShape>,
    bound: Interner<BoundPod>,
}

static SHARED_READINGS: std::sync::LazyLock<std::sync::Mutex<SharedReadings>> =
    std::sync::LazyLock::new(Default::default);

fn shared_readings() -> std::sync::MutexGuard<'static, SharedReadings> {
    SHARED_READINGS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The shared copy of a pod's labels (held pods keep this one; their readings point at it).
pub fn shared_labels(labels: BTreeMap<String, String>) -> PodLabels {
    shared_readings().labels.intern_pruning(labels)
}

/// A held pod's reading, its shape and tolerations replaced by the copies shared with every
/// pod alike (its labels are the held pod's, shared already), and its bound reading likewise.
fn shared_reading(mut pod: Pod, daemonset: Option<String>) -> Converted {
    let mut shared = shared_readings();
    // The shape is this pod's alone here: the write copies nothing.
    pod.tolerations = shared
        .tolerations
        .intern_pruning(std::mem::take(&mut pod.tolerations));
    pod.shape = shared.shapes.intern_pruning(std::mem::take(&mut pod.shape));
    let bound = shared.bound.intern_pruning(BoundPod::of(&pod, daemonset));
    Converted {
        pod: Arc::new(pod),
        bound,
    }
}

fn convert(held: &HeldPod) -> Result<Converted, ConvertError> {
    let pod = pod_from_k8s(held)?;
    let daemonset = held
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == DAEMONSET_KIND)
        .map(|o| o.name.clone());
    Ok(shared_reading(pod, daemonset))
}

/// A pod running on a node (counted for resources and topology).
pub fn bound_pod_from_k8s(pod: &HeldPod) -> Result<Arc<BoundPod>, ConvertError> {
    converted(pod).map(|c| c.bound.clone())
}

/// Converts a Node and the (non-terminal) pods bound to it. `startup_taints` are the owning
/// NodeClaim's; they and known ephemeral taints are ignored while a Karpenter node is uninitialized.
pub fn existing_node_from_k8s<'a>(
    node: &core::Node,
    pods: impl IntoIterator<Item = &'a HeldPod>,
    startup_taints: &[Taint],
) -> Result<ExistingNode, ConvertError> {
    let object = node.metadata.name.clone().unwrap_or_default();
    let labels: NodeLabels = Arc::new(node.metadata.labels.clone().unwrap_or_default());
    let node_pool = labels.get(NODE_POOL).cloned();
    let initialized = labels.get("karpenter.sh/initialized").map(String::as_str) == Some("true");
    let mut taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .map(|t| taint(&object, t))
        .collect::<Result<Vec<_>, _>>()?;
    if node_pool.is_some() && !initialized {
        // By key and effect, as the API server identifies a Node's taints: the Node's copy of
        // a value-less startup taint says `true` (the node agent refuses empty values).
        taints.retain(|t| {
            !EPHEMERAL_TAINT_KEYS.contains(&t.key.as_str())
                && !startup_taints
                    .iter()
                    .any(|s| s.key == t.key && s.effect == t.effect)
        });
    }
    let allocatable = resource_list(
        &object,
        "status.allocatable",
        node.status.as_ref().and_then(|s| s.allocatable.as_ref()),
    )?;
    Ok(ExistingNode {
        name: object.clone(),
        hostname: labels
            .get(HOSTNAME)
            .cloned()
            .unwrap_or_else(|| object.clone()),
        labels,
        taints,
        allocatable,
        pods: pods
            .into_iter()
            .map(bound_pod_from_k8s)
            .collect::<Result<Vec<_>, _>>()?,
        node_pool,
        initialized,
        // Disruption's simulation marks the nodes that are settling.
        settling: false,
    })
}

/// Converts a DaemonSet's pod template.
pub fn daemonset_from_k8s(ds: &K8sDaemonSet) -> Result<DaemonSetPod, ConvertError> {
    let object = object_name(&ds.metadata);
    let spec = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .map(held::PodSpec::from_k8s)
        .ok_or_else(|| ConvertError::MissingTemplate(object.clone()))?;
    let spec = &spec;
    let required_node_affinity = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|s| {
            s.node_selector_terms
                .iter()
                .map(|t| node_selector_term(&object, t))
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?
        .unwrap_or_default();
    Ok(DaemonSetPod {
        name: ds.metadata.name.clone().unwrap_or_default(),
        requests: pod_requests(&object, spec)?,
        tolerations: tolerations(&object, spec.tolerations.as_deref())?,
        node_selector: node_selector(spec.node_selector.as_ref()),
        required_node_affinity,
        host_ports: host_ports(spec),
        uses_dynamic_resources: uses_dynamic_resources(spec),
    })
}

impl TryFrom<&HeldPod> for Pod {
    type Error = ConvertError;
    fn try_from(p: &HeldPod) -> Result<Self, Self::Error> {
        pod_from_k8s(p)
    }
}

impl TryFrom<&K8sDaemonSet> for DaemonSetPod {
    type Error = ConvertError;
    fn try_from(d: &K8sDaemonSet) -> Result<Self, Self::Error> {
        daemonset_from_k8s(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn k8s_pod(v: serde_json::Value) -> HeldPod {
        serde_json::from_value(v).expect("valid pod")
    }

    #[test]
    fn a_held_pod_is_read_once_and_an_edited_copy_is_read_again() {
        let held = k8s_pod(json!({
            "metadata": {"name": "p", "namespace": "default", "labels": {"app": "agent"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "1"}]},
            "spec": {"nodeName": "n1", "containers": [{"name": "c",
                "resources": {"requests": {"cpu": "100m"}}}]}
        }));
        let first = converted(&held).unwrap();
        let again = converted(&held).unwrap();
        assert!(Arc::ptr_eq(&first.pod, &again.pod), "converted once");
        assert!(Arc::ptr_eq(
            &first.bound,
            &bound_pod_from_k8s(&held).unwrap()
        ));
        assert_eq!(first.bound.daemonset.as_deref(), Some("agent"));
        assert_eq!(first.bound.requests, first.pod.requests);
        assert_eq!(first.pod.labels["app"], "agent");
        assert!(
            Arc::ptr_eq(&first.pod.labels, &first.bound.labels),
            "one copy of the labels"
        );
        let mut sibling = held.clone();
        sibling.metadata.name = Some("p-2".into());
        let sibling_reading = converted(&sibling).unwrap();
        assert!(
            Arc::ptr_eq(&first.pod.labels, &sibling_reading.pod.labels),
            "pods with equal labels share them"
        );
        assert!(
            Arc::ptr_eq(&first.pod.shape, &sibling_reading.pod.shape),
            "the pods of one workload share one shape"
        );
        assert!(Arc::ptr_eq(&first.bound, &sibling_reading.bound));
        assert_eq!(
            (first.pod.name.as_str(), sibling_reading.pod.name.as_str()),
            ("p", "p-2"),
            "each keeps its name"
        );
        // A pod edited through its shape (a volume's zone, a simulation's change) gets a
        // shape of its own; the workload's shared one is unchanged.
        let mut edited_copy = (*sibling_reading.pod).clone();
        edited_copy.volume_requirements = Some(Requirements::new());
        assert!(!Arc::ptr_eq(&edited_copy.shape, &first.pod.shape));
        assert!(first.pod.volume_requirements.is_none());
        assert!(sibling_reading.pod.volume_requirements.is_none());
        let mut other_shape = held.clone();
        other_shape.metadata.name = Some("p-3".into());
        other_shape.metadata.namespace = Some("elsewhere".into());
        let elsewhere = converted(&other_shape).unwrap();
        assert!(!Arc::ptr_eq(&first.pod.shape, &elsewhere.pod.shape));
        assert_eq!(elsewhere.bound.namespace, "elsewhere");
        assert!(Arc::ptr_eq(
            &first.pod.tolerations,
            &elsewhere.pod.tolerations
        ));
        let mut other = held.clone();
        other.set_labels([("app".to_string(), "other".to_string())].into());
        assert_eq!(converted(&other).unwrap().pod.labels["app"], "other");

        // A copy may be edited before it is read: it must not carry the original's reading.
        let mut edited = held.clone();
        Arc::make_mut(&mut edited.spec.as_mut().unwrap().containers)[0].resources =
            serde_json::from_value(json!({"requests": {"cpu": "300m"}})).unwrap();
        let cpu = |c: &Converted| c.pod.requests.get("cpu");
        assert_eq!(
            cpu(converted(&edited).unwrap()),
            Quantity::parse("300m").unwrap()
        );
        assert_eq!(
            cpu(converted(&held).unwrap()),
            Quantity::parse("100m").unwrap()
        );
        assert_eq!(held, held.clone(), "the reading takes no part in equality");
    }

    #[test]
    fn a_held_pod_that_cannot_be_read_says_why_each_time() {
        let held = k8s_pod(json!({
            "metadata": {"name": "p", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "lots"}}}]}
        }));
        let first = converted(&held).unwrap_err();
        assert!(first.to_string().contains("default/p"), "{first}");
        assert_eq!(converted(&held).unwrap_err(), first);
        assert_eq!(bound_pod_from_k8s(&held).unwrap_err(), first);
    }

    #[test]
    fn provisionable_pods_follow_upstream_rules() {
        // Behaviour 1.
        let pending = json!({
            "metadata": {"name": "p", "namespace": "default"},
            "spec": {"containers": [{"name": "c"}]},
            "status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}
        });
        assert!(is_provisionable(&k8s_pod(pending.clone())));
        let mut bound = pending.clone();
        bound["spec"]["nodeName"] = json!("n1");
        assert!(!is_provisionable(&k8s_pod(bound)));
        let mut nominated = pending.clone();
        nominated["status"]["nominatedNodeName"] = json!("n1");
        assert!(!is_provisionable(&k8s_pod(nominated)));
        let mut daemon = pending.clone();
        daemon["metadata"]["ownerReferences"] =
            json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "1"}]);
        assert!(!is_provisionable(&k8s_pod(daemon)));
        let mut not_yet = pending;
        not_yet["status"]["conditions"][0]["reason"] = json!("SchedulerError");
        assert!(!is_provisionable(&k8s_pod(not_yet)));
    }

    #[test]
    fn pod_requests_include_init_containers_sidecars_and_overhead() {
        let pod = k8s_pod(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "labels": {"app": "web"}},
            "spec": {
                "containers": [
                    {"name": "a", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
                    {"name": "b", "resources": {"limits": {"cpu": "250m", "memory": "256Mi"}}}
                ],
                "initContainers": [
                    {"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"cpu": "100m"}}},
                    {"name": "init", "resources": {"requests": {"cpu": "2", "memory": "64Mi"}}}
                ],
                "overhead": {"cpu": "50m"}
            }
        }));
        let p = pod_from_k8s(&pod).unwrap();
        // max(750m + 100m sidecar, 100m + 2 init) + 50m overhead.
        assert_eq!(p.requests.cpu(), Quantity::parse("2150m").unwrap());
        assert_eq!(p.requests.memory(), Quantity::parse("1280Mi").unwrap());
        assert_eq!(p.requests.pods(), Quantity::from_units(1));
        assert_eq!(p.uid, "u1");
        assert_eq!(p.labels.get("app").map(String::as_str), Some("web"));
    }

    #[test]
    fn pod_scheduling_constraints_convert() {
        let pod = k8s_pod(json!({
            "metadata": {"name": "p", "namespace": "ns", "labels": {"app": "web", "rev": "7"}},
            "spec": {
                "containers": [{"name": "c"}],
                "nodeSelector": {"team": "a"},
                "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "failure-domain.beta.kubernetes.io/zone", "operator": "In", "values": ["z1"]}]},
                            {"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["4"]}]}
                        ]},
                        "preferredDuringSchedulingIgnoredDuringExecution": [
                            {"weight": 5, "preference": {"matchExpressions": [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]}]}}
                        ]
                    },
                    "podAntiAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [
                            {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "kubernetes.io/hostname"}
                        ]
                    }
                },
                "topologySpreadConstraints": [{
                    "maxSkew": 2, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway",
                    "labelSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]}]},
                    "matchLabelKeys": ["rev"], "minDomains": 3, "nodeTaintsPolicy": "Honor"
                }]
            }
        }));
        let p = pod_from_k8s(&pod).unwrap();
        assert_eq!(p.node_selector.get("team").unwrap().values(), ["a"]);
        assert_eq!(p.required_node_affinity.len(), 2);
        assert!(
            p.required_node_affinity[0]
                .get("topology.kubernetes.io/zone")
                .is_some()
        );
        assert!(p.required_node_affinity[1].get("cores").unwrap().has("5"));
        assert_eq!(p.preferred_node_affinity[0].weight, 5);
        assert_eq!(p.tolerations[0].operator, TolerationOperator::Exists);
        assert_eq!(
            p.pod_anti_affinity[0].topology_key,
            "kubernetes.io/hostname"
        );
        let c = &p.topology_spread[0];
        assert_eq!((c.max_skew, c.min_domains), (2, Some(3)));
        assert_eq!(c.when_unsatisfiable, WhenUnsatisfiable::ScheduleAnyway);
        assert_eq!(c.node_taints_policy, InclusionPolicy::Honor);
        assert_eq!(c.node_affinity_policy, InclusionPolicy::Honor);
        assert_eq!(c.match_label_keys, ["rev"]);
    }

    #[test]
    fn values_the_api_server_rejects_are_refused_naming_the_field() {
        let negative = k8s_pod(json!({
            "metadata": {"name": "neg", "namespace": "ns"},
            "spec": {"containers": [{"name": "a"}, {"name": "b", "resources": {"requests": {"cpu": "-1"}}}]}
        }));
        assert_eq!(
            pod_from_k8s(&negative).unwrap_err().to_string(),
            "ns/neg: spec.containers[1].resources.requests[cpu]: must be greater than or equal to 0"
        );
        let skew = |max_skew: i32, min_domains: Option<i32>| {
            k8s_pod(json!({
                "metadata": {"name": "s", "namespace": "ns"},
                "spec": {"containers": [{"name": "c"}], "topologySpreadConstraints": [
                    {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"},
                    {"maxSkew": max_skew, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule", "minDomains": min_domains}
                ]}
            }))
        };
        assert_eq!(
            pod_from_k8s(&skew(0, None)).unwrap_err().to_string(),
            "ns/s: spec.topologySpreadConstraints[1].maxSkew: must be greater than zero"
        );
        assert!(
            pod_from_k8s(&skew(1, Some(0)))
                .unwrap_err()
                .to_string()
                .contains("[1].minDomains: must be greater than zero")
        );
        assert_eq!(
            pod_from_k8s(&skew(3, Some(2))).unwrap().topology_spread[1].max_skew,
            3
        );
    }

    #[test]
    fn requests_that_overflow_make_the_pod_invalid_instead_of_wrapping() {
        // Each fits in the exact representation; their sum does not (it used to wrap to a
        // negative total and fit on the smallest type).
        let huge = "100000000000000000E";
        let pod = k8s_pod(json!({
            "metadata": {"name": "big", "namespace": "ns"},
            "spec": {"containers": [
                {"name": "a", "resources": {"requests": {"cpu": huge}}},
                {"name": "b", "resources": {"requests": {"cpu": huge}}}
            ]}
        }));
        assert_eq!(
            pod_from_k8s(&pod).unwrap_err().to_string(),
            "ns/big: requests of cpu overflow"
        );
        // Sums used elsewhere saturate rather than wrap.
        let one = Resources::from_literals(&[("cpu", huge)]);
        assert!(one.clone().plus(&one).cpu().milli() > one.cpu().milli());
    }

    #[test]
    fn bad_input_is_reported_with_the_object_name() {
        let pod = k8s_pod(json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "lots"}}}]}
        }));
        let err = pod_from_k8s(&pod).unwrap_err().to_string();
        assert!(err.starts_with("ns/p:"), "{err}");
        assert!(err.contains("lots"), "{err}");
        let fields = k8s_pod(json!({
            "metadata": {"name": "q", "namespace": "ns"},
            "spec": {"containers": [{"name": "c"}], "affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
                ]}
            }}}
        }));
        let pinned = pod_from_k8s(&fields).expect("metadata.name is the node's name");
        let term = &pinned.required_node_affinity[0];
        assert_eq!(term.get(HOSTNAME).unwrap().values(), ["n1"]);
        let other_field = k8s_pod(json!({
            "metadata": {"name": "r", "namespace": "ns"},
            "spec": {"containers": [{"name": "c"}], "affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.uid", "operator": "In", "values": ["u"]}]}
                ]}
            }}}
        }));
        let err = pod_from_k8s(&other_field).unwrap_err();
        assert!(matches!(err, ConvertError::MatchFields { .. }), "{err}");
        assert!(err.to_string().contains("metadata.uid In"), "{err}");
    }

    #[test]
    fn nodes_convert_with_bound_pods_and_startup_taints_ignored_until_initialized() {
        let node: core::Node = serde_json::from_value(json!({
            "metadata": {"name": "n1", "labels": {
                "karpenter.sh/nodepool": "default",
                "kubernetes.io/hostname": "host-1",
                "topology.kubernetes.io/zone": "z1"
            }},
            "spec": {"taints": [
                {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"},
                {"key": "cilium", "value": "init", "effect": "NoSchedule"},
                {"key": "node.cilium.io/agent-not-ready", "value": "true", "effect": "NoSchedule"},
                {"key": "dedicated", "value": "db", "effect": "NoSchedule"}
            ]},
            "status": {"allocatable": {"cpu": "3900m", "memory": "7Gi", "pods": "110"}}
        }))
        .unwrap();
        let bound = k8s_pod(json!({
            "metadata": {"name": "ds-pod", "namespace": "kube-system",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "1"}]},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {"requests": {"cpu": "100m"}}}]}
        }));
        // The second as a NodeClaim holds it without a value; its Node's copy, from user data,
        // says `true`.
        let startup = [
            Taint::new("cilium", "init", TaintEffect::NoSchedule),
            Taint::new(
                "node.cilium.io/agent-not-ready",
                "",
                TaintEffect::NoSchedule,
            ),
        ];
        let n = existing_node_from_k8s(&node, &[bound], &startup).unwrap();
        assert_eq!(n.hostname, "host-1");
        assert_eq!(n.node_pool.as_deref(), Some("default"));
        assert!(!n.initialized);
        assert_eq!(
            n.taints,
            vec![Taint::new("dedicated", "db", TaintEffect::NoSchedule)]
        );
        assert_eq!(n.allocatable.cpu(), Quantity::parse("3900m").unwrap());
        assert_eq!(n.pods[0].daemonset.as_deref(), Some("agent"));
        assert_eq!(n.requirements().get(HOSTNAME).unwrap().values(), ["host-1"]);
    }

    #[test]
    fn daemonsets_convert_from_their_template_with_limits_as_requests() {
        let ds: K8sDaemonSet = serde_json::from_value(json!({
            "metadata": {"name": "agent", "namespace": "kube-system"},
            "spec": {
                "selector": {"matchLabels": {"app": "agent"}},
                "template": {"spec": {
                    "containers": [{"name": "c", "resources": {"limits": {"cpu": "200m", "memory": "128Mi"}}}],
                    "tolerations": [{"operator": "Exists"}],
                    "nodeSelector": {"kubernetes.io/os": "linux"}
                }}
            }
        }))
        .unwrap();
        let d = DaemonSetPod::try_from(&ds).unwrap();
        assert_eq!(d.name, "agent");
        assert_eq!(d.requests.cpu(), Quantity::parse("200m").unwrap());
        assert_eq!(d.requests.memory(), Quantity::parse("128Mi").unwrap());
        assert!(d.tolerations[0].tolerates(&Taint::new("x", "y", TaintEffect::NoExecute)));
        assert_eq!(
            d.node_selector.get("kubernetes.io/os").unwrap().values(),
            ["linux"]
        );
        let empty = K8sDaemonSet::default();
        assert!(matches!(
            daemonset_from_k8s(&empty),
            Err(ConvertError::MissingTemplate(_))
        ));
    }

    /// Upstream's `HasDRARequirements`: a claim in `spec.resourceClaims`, a container's or an
    /// init container's `resources.claims`; empty lists claim nothing.
    #[test]
    fn dra_claims_are_read_from_the_pod_and_every_container() {
        let uses = |spec: serde_json::Value| {
            let pod = pod_from_k8s(&k8s_pod(json!({"metadata": {"name": "p"}, "spec": spec})));
            pod.unwrap().uses_dynamic_resources
        };
        let container = |claims: serde_json::Value| json!({"name": "c", "resources": {"requests": {"cpu": "1"}, "claims": claims}});
        assert!(!uses(json!({"containers": [container(json!([]))]})));
        assert!(!uses(
            json!({"resourceClaims": [], "containers": [{"name": "c"}]})
        ));
        assert!(uses(json!({"resourceClaims": [{"name": "gpu",
            "resourceClaimName": "gpu-0"}], "containers": [{"name": "c"}]})));
        assert!(uses(
            json!({"containers": [container(json!([{"name": "gpu"}]))]})
        ));
        assert!(uses(json!({"containers": [{"name": "c"}],
            "initContainers": [container(json!([{"name": "gpu", "request": "one"}]))]})));
    }
}
