//! `karpenter-exoscale explain pod`, `explain node` and `plan`: read-only answers about the live cluster, from
//! the code the controller runs — the one state→scheduler adapter (`provisioning::input`), the
//! shared scheduler, the disruption view and methods — over instance types and list prices of
//! the embedded catalogue (the same cloud `simulate` asks). Nothing is written.
//!
//! The JSON output (`-o json`) is a contract: [`PodExplanation`] and [`Plan`] serialised with
//! snake_case fields; new fields may be added, none renamed or removed.

pub mod live;
mod node;
mod render;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use serde::Serialize;
use thiserror::Error;

use crate::controllers::disruption::view::{ViewInputs, build_view};
use crate::disruption::candidates::{DisruptionClass, candidates};
use crate::disruption::methods::decide;
use crate::operator::metrics::Metrics;
use crate::providers::instance_types::{DiscoveredType, usable_in_zone};
use crate::provisioning::input::{
    PodsToPlace, name_left_out_pools, pools_with_types, prepare, scheduler_options,
};
use crate::scheduling::labels::{CAPACITY_TYPE, INSTANCE_TYPE, ZONE};
use crate::scheduling::{InstanceType, NewNodeClaim, Scheduler, SchedulerOptions};
use crate::simulate::{SimulateError, catalogue_cloud, zone_and_currency};
use crate::state::HeldPod as Pod;
use crate::state::pods::is_terminal;

pub use live::Live;
pub use node::{MethodVerdict, NodeExplanation, explain_node};
pub use render::{render_node, render_plan, render_pod};

/// Hours in the 30-day month prices are quoted for.
pub const HOURS_PER_MONTH: f64 = 720.0;

#[derive(Debug, Error)]
pub enum ExplainError {
    #[error("reading {kind} from the cluster: {source}")]
    Read { kind: String, source: kube::Error },
    #[error("the cluster holds more than {limit} {kind} objects; refusing to read them all")]
    TooLarge { kind: String, limit: usize },
    #[error("pod {0} not found")]
    PodNotFound(String),
    #[error("{0} not found")]
    NotFound(String),
    #[error(transparent)]
    Simulate(#[from] SimulateError),
}

/// Where and how to price: the zone (`EXOSCALE_ZONE`), the currency, the scheduler policies,
/// and the instance types the account may use when the Exoscale API was asked.
pub struct Env {
    pub zone: String,
    pub currency: String,
    pub now: DateTime<Utc>,
    pub options: SchedulerOptions,
    /// From the Exoscale API (authorized types of the zone); `None`: the embedded catalogue's.
    pub instance_types: Option<Vec<DiscoveredType>>,
    /// Per ExoscaleNodeClass, the template the API resolved (or why it could not): only when
    /// credentials were given.
    pub templates: BTreeMap<String, Result<String, String>>,
}

impl Env {
    pub fn new(zone: &str, currency: &str) -> Self {
        let defaults = SchedulerOptions::default();
        Env {
            zone: zone.to_string(),
            currency: currency.to_string(),
            now: Utc::now(),
            options: scheduler_options(
                defaults.preference_policy,
                defaults.min_values_policy,
                &defaults.default_topology_spread,
                defaults.ignore_dra_requests,
            ),
            instance_types: None,
            templates: BTreeMap::new(),
        }
    }

    /// Resolves and checks each NodeClass's template through the Exoscale API, as the
    /// NodeClass controller does (the control plane's version from `kube`).
    pub async fn with_api_templates(
        mut self,
        client: &crate::exoscale::Client,
        kube: &kube::Client,
        node_classes: &[crate::apis::ExoscaleNodeClass],
    ) -> Self {
        use crate::providers::template::{ApiServerVersion, TemplateResolver};
        let resolver = TemplateResolver::new(
            client.clone(),
            Arc::new(ApiServerVersion(kube.clone())),
            Arc::new(crate::exoscale::SystemClock),
            std::time::Duration::from_secs(300),
        );
        for class in node_classes {
            let outcome = resolver
                .resolve_and_verify(class)
                .await
                .map(|t| t.id)
                .map_err(|e| e.to_string());
            self.templates.insert(class.name_any(), outcome);
        }
        self
    }

    /// Reads the instance types this account may use in the zone from the Exoscale API.
    pub async fn with_api_instance_types(
        mut self,
        client: &crate::exoscale::Client,
    ) -> Result<Self, crate::exoscale::Error> {
        let types = client.list_instance_types().await?;
        self.instance_types = Some(usable_in_zone(types, &self.zone));
        Ok(self)
    }
}

/// Why a NodePool cannot take a pod.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PoolVerdict {
    pub nodepool: String,
    pub reason: String,
}

/// A node a round would launch.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlannedNode {
    pub nodepool: String,
    /// The cheapest compatible type (the launch may fall back to the next ones).
    pub instance_type: String,
    pub price_per_hour: f64,
    pub pods: usize,
    /// Up to five compatible types, cheapest first.
    pub instance_types: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Verdict {
    /// Bound to a node; whether consolidation of that node is blocked, and by what.
    Bound {
        node: String,
        nodepool: Option<String>,
        instance_type: Option<String>,
        price_per_hour: Option<f64>,
        /// `None`: the node is a consolidation candidate (this pod may be moved).
        consolidation_blocked_by: Option<String>,
        /// This pod itself is what blocks it (its `do-not-disrupt`, or a PDB selecting it).
        this_pod_blocks: bool,
        /// Why it could land there: the node labels its nodeSelector and required node affinity
        /// matched, and the node taints it tolerates.
        landed_because: Vec<String>,
    },
    /// Fits a node that exists or is being launched (kube-scheduler binds it there).
    ExistingNode { node: String },
    /// A node would be launched for it.
    NewNode(PlannedNode),
    /// No node can be launched for it: each NodePool's reason.
    Unschedulable {
        reason: String,
        nodepools: Vec<PoolVerdict>,
    },
    /// The pod cannot be simulated (bad quantities, unsupported selectors, missing volumes).
    Invalid { reason: String },
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PodExplanation {
    pub pod: String,
    pub verdict: Verdict,
    pub currency: String,
    pub warnings: Vec<String>,
}

/// What the cloud knows for this cluster: the catalogue for its NodeClasses, overlays applied,
/// and the instance types of every usable NodePool.
struct Priced {
    pools: Vec<(Arc<crate::apis::NodePool>, Vec<Arc<InstanceType>>)>,
    warnings: Vec<String>,
}

async fn priced(live: &Live, env: &Env) -> Result<Priced, ExplainError> {
    let currency = zone_and_currency(&env.zone, &env.currency)?;
    let mut warnings = vec![if env.instance_types.is_some() {
        "instance types from the Exoscale API (those this account may use), list prices from the embedded catalogue".to_string()
    } else {
        "instance types and list prices come from the embedded catalogue, not the Exoscale API (no credentials)".to_string()
    }];
    let (cloud, _) = catalogue_cloud(
        &live.index,
        &live.node_classes,
        &live.overlays,
        &env.zone,
        currency,
        env.instance_types.clone(),
        &mut warnings,
    )?;
    for (class, outcome) in &env.templates {
        if let Err(why) = outcome {
            warnings.push(format!(
                "ExoscaleNodeClass {class}: its template cannot be used ({why}); launches for its NodePools would fail"
            ));
        }
    }
    let (pools, failed) = pools_with_types(&cloud, &Metrics::new(), live.index.nodepools()).await;
    for (pool, error) in failed {
        warnings.push(format!("NodePool {} skipped: {error}", pool.name_any()));
    }
    Ok(Priced { pools, warnings })
}

fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.namespace().unwrap_or_else(|| "default".into()),
        pod.name_any()
    )
}

fn unbound(pod: &Pod) -> bool {
    pod.spec.as_ref().is_none_or(|s| s.node_name.is_none())
        && pod.metadata.deletion_timestamp.is_none()
        && !is_terminal(pod)
}

fn planned(claim: &NewNodeClaim) -> PlannedNode {
    let cheapest = claim.instance_types.first();
    PlannedNode {
        nodepool: claim.node_pool.clone(),
        instance_type: cheapest.map(|t| t.name.clone()).unwrap_or_default(),
        price_per_hour: cheapest
            .and_then(|t| t.cheapest_price(&claim.requirements))
            .unwrap_or(0.0),
        pods: claim.pods.len(),
        instance_types: claim
            .instance_types
            .iter()
            .take(5)
            .map(|t| t.name.clone())
            .collect(),
    }
}

/// The list price of a node's offering: its type, zone and capacity type among its NodePool's.
fn node_price(
    pools: &[(Arc<crate::apis::NodePool>, Vec<Arc<InstanceType>>)],
    labels: &BTreeMap<String, String>,
) -> Option<f64> {
    let pool = labels.get(crate::apis::labels::NODEPOOL_LABEL)?;
    let type_name = labels.get(INSTANCE_TYPE)?;
    let (_, types) = pools.iter().find(|(p, _)| &p.name_any() == pool)?;
    let it = types.iter().find(|t| &t.name == type_name)?;
    it.offerings
        .iter()
        .filter(|o| labels.get(ZONE).is_none_or(|z| *z == o.zone))
        .filter(|o| {
            labels
                .get(CAPACITY_TYPE)
                .is_none_or(|c| *c == o.capacity_type)
        })
        .map(|o| o.price)
        .min_by(f64::total_cmp)
}

fn view_of(
    live: &Live,
    env: &Env,
    pools: Vec<(Arc<crate::apis::NodePool>, Vec<Arc<InstanceType>>)>,
) -> crate::disruption::model::ClusterView {
    build_view(
        &live.index,
        ViewInputs {
            now: env.now,
            pools,
            nominated: &|_| false,
            queued: HashSet::new(),
            options: env.options.clone(),
        },
    )
}

/// Explains one pod: where a pending pod would go (or why nowhere), or for a bound pod, its
/// node and whether that node's consolidation is blocked.
pub async fn explain_pod(
    live: &Live,
    env: &Env,
    namespace: &str,
    name: &str,
) -> Result<PodExplanation, ExplainError> {
    let key = format!("{namespace}/{name}");
    let target = live
        .index
        .pods()
        .into_iter()
        .find(|p| p.namespace().as_deref() == Some(namespace) && p.name_any() == name)
        .ok_or_else(|| ExplainError::PodNotFound(key.clone()))?;
    let Priced {
        pools,
        mut warnings,
    } = priced(live, env).await?;

    if let Some(node) = target.spec.as_ref().and_then(|s| s.node_name.clone()) {
        let labels = live
            .index
            .node(&node)
            .map(|n| n.labels().clone())
            .unwrap_or_default();
        let price_per_hour = node_price(&pools, &labels);
        let view = view_of(live, env, pools);
        let this_pod = view.node(&node).and_then(|n| {
            n.pods
                .iter()
                .find(|p| format!("{}/{}", p.pod.namespace, p.pod.name) == key)
        });
        let (eligible, rejected) = candidates(&view, DisruptionClass::Graceful);
        let consolidation_blocked_by = if eligible.iter().any(|c| c.name == node) {
            None
        } else {
            Some(
                rejected
                    .iter()
                    .find(|r| r.node == node)
                    .map(|r| r.reason.clone())
                    .unwrap_or_else(|| "the node is not managed by Karpenter".to_string()),
            )
        };
        let landed = live
            .index
            .node(&node)
            .map(|n| landed_because(&target, &n))
            .unwrap_or_default();
        let this_pod_blocks = consolidation_blocked_by.as_ref().is_some_and(|why| {
            why.contains(&format!("Pod={key}"))
                || this_pod.is_some_and(|p| {
                    view.pdbs
                        .iter()
                        .any(|pdb| pdb.matches(p) && why.contains(&pdb.key()))
                })
        });
        return Ok(PodExplanation {
            pod: key,
            verdict: Verdict::Bound {
                this_pod_blocks,
                landed_because: landed,
                nodepool: labels.get(crate::apis::labels::NODEPOOL_LABEL).cloned(),
                instance_type: labels.get(INSTANCE_TYPE).cloned(),
                node,
                price_per_hour,
                consolidation_blocked_by,
            },
            currency: env.currency.clone(),
            warnings,
        });
    }

    // A provisioning round over every unbound pod, as the controller batches them, so the
    // answer accounts for the pods competing for the same capacity.
    let mut objects: Vec<Arc<Pod>> = live
        .index
        .pods()
        .into_iter()
        .filter(|p| unbound(p))
        .collect();
    if !objects.iter().any(|p| Arc::ptr_eq(p, &target)) {
        objects.push(target.clone());
    }
    let prepared = prepare(
        &live.index,
        pools,
        env.options.clone(),
        PodsToPlace::These(objects),
    );
    warnings.extend(prepared.left_out.iter().cloned());
    if let Some((_, reason)) = prepared.invalid.iter().find(|(p, _)| pod_key(p) == key) {
        return Ok(PodExplanation {
            pod: key,
            verdict: Verdict::Invalid {
                reason: reason.clone(),
            },
            currency: env.currency.clone(),
            warnings,
        });
    }
    let position = prepared
        .pods
        .iter()
        .position(|p| pod_key(&p.object) == key)
        .ok_or_else(|| ExplainError::PodNotFound(key.clone()))?;
    let pods: Vec<_> = prepared.pods.iter().map(|p| p.pod.clone()).collect();
    let results = Scheduler::new(prepared.input).solve(&pods);
    let verdict = if let Some(a) = results
        .existing_nodes
        .iter()
        .find(|a| a.pods.contains(&position))
    {
        Verdict::ExistingNode {
            node: a.node_name.clone(),
        }
    } else if let Some(c) = results
        .new_node_claims
        .iter()
        .find(|c| c.pods.contains(&position))
    {
        Verdict::NewNode(planned(c))
    } else if let Some(u) = results.unschedulable.iter().find(|u| u.pod == position) {
        let mut nodepools: Vec<PoolVerdict> = u
            .per_node_pool
            .iter()
            .map(|(nodepool, reason)| PoolVerdict {
                nodepool: nodepool.clone(),
                reason: reason.clone(),
            })
            .collect();
        nodepools.extend(
            prepared
                .skipped_pools
                .iter()
                .map(|(nodepool, reason)| PoolVerdict {
                    nodepool: nodepool.clone(),
                    reason: reason.clone(),
                }),
        );
        Verdict::Unschedulable {
            reason: name_left_out_pools(&u.reason, &prepared.skipped_pools),
            nodepools,
        }
    } else {
        // Every pod of a solve lands in one of the three lists.
        Verdict::Invalid {
            reason: "the scheduler gave no answer for this pod".into(),
        }
    };
    Ok(PodExplanation {
        pod: key,
        verdict,
        currency: env.currency.clone(),
        warnings,
    })
}

/// What on `node` let `pod` land there: its nodeSelector and required node-affinity terms with
/// the node's values, and the node's taints it tolerates. Empty: the pod constrains nothing and
/// kube-scheduler chose by its scoring.
pub fn landed_because(pod: &Pod, node: &Node) -> Vec<String> {
    let labels = node.labels();
    let value = |key: &str| {
        labels
            .get(key)
            .map_or("no such label".to_string(), |v| format!("{key}={v}"))
    };
    let mut out = Vec::new();
    let Some(spec) = pod.spec.as_ref() else {
        return out;
    };
    for (key, wanted) in spec.node_selector.iter().flatten() {
        out.push(format!(
            "nodeSelector {key}={wanted} (node: {})",
            value(key)
        ));
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    for term in required
        .map(|r| r.node_selector_terms.as_slice())
        .unwrap_or_default()
    {
        for e in term.match_expressions.iter().flatten() {
            out.push(format!(
                "node affinity {} {} [{}] (node: {})",
                e.key,
                e.operator,
                e.values.clone().unwrap_or_default().join(", "),
                value(&e.key)
            ));
        }
    }
    for taint in crate::scheduling::convert::tolerated_node_taints(pod, node) {
        out.push(format!("tolerates taint {taint}"));
    }
    out
}

/// A node a disruption command would remove.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlannedRemoval {
    pub node: String,
    pub nodepool: String,
    pub instance_type: Option<String>,
    pub price_per_hour: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DisruptionPlan {
    /// `Emptiness`, `Drift`, `MultiNodeConsolidation`, `SingleNodeConsolidation`, `StaticDrift`.
    pub method: String,
    /// `delete` or `replace`.
    pub decision: String,
    pub remove: Vec<PlannedRemoval>,
    pub launch: Vec<PlannedNode>,
    pub savings_per_hour: f64,
    pub savings_per_month: f64,
}

/// A pod and why it cannot be placed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PodReason {
    pub pod: String,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    /// What a provisioning round would launch now for the provisionable pods.
    pub launch: Vec<PlannedNode>,
    /// Pods that fit nodes that exist or are on their way.
    pub pods_nominated: usize,
    pub unschedulable: Vec<PodReason>,
    /// What the next disruption pass would do; `None`: nothing.
    pub disruption: Option<DisruptionPlan>,
    /// Managed nodes now, at list price.
    pub nodes: usize,
    pub cost_per_hour: f64,
    pub cost_per_month: f64,
    /// After this plan's launches and the disruption command.
    pub cost_per_hour_after: f64,
    pub cost_per_month_after: f64,
    pub currency: String,
    pub warnings: Vec<String>,
}

/// What a provisioning round and the next disruption pass would do now, with the prices before
/// and after.
pub async fn plan(live: &Live, env: &Env) -> Result<Plan, ExplainError> {
    let Priced {
        pools,
        mut warnings,
    } = priced(live, env).await?;

    let managed: Vec<BTreeMap<String, String>> = live
        .index
        .nodes()
        .iter()
        .filter(|n| {
            n.labels().contains_key(crate::apis::labels::NODEPOOL_LABEL)
                && n.metadata.deletion_timestamp.is_none()
        })
        .map(|n| n.labels().clone())
        .collect();
    let mut cost_per_hour = 0.0;
    for labels in &managed {
        match node_price(&pools, labels) {
            Some(price) => cost_per_hour += price,
            None => warnings.push(format!(
                "no list price for a node of type {}",
                labels.get(INSTANCE_TYPE).cloned().unwrap_or_default()
            )),
        }
    }

    let prepared = prepare(
        &live.index,
        pools.clone(),
        env.options.clone(),
        PodsToPlace::Pending,
    );
    warnings.extend(prepared.left_out.iter().cloned());
    let mut unschedulable: Vec<PodReason> = prepared
        .invalid
        .iter()
        .map(|(pod, reason)| PodReason {
            pod: pod_key(pod),
            reason: reason.clone(),
        })
        .collect();
    let pods: Vec<_> = prepared.pods.iter().map(|p| p.pod.clone()).collect();
    let results = Scheduler::new(prepared.input).solve(&pods);
    let launch: Vec<PlannedNode> = results.new_node_claims.iter().map(planned).collect();
    let pods_nominated = results.existing_nodes.iter().map(|a| a.pods.len()).sum();
    unschedulable.extend(results.unschedulable.iter().map(|u| PodReason {
        pod: pod_key(&prepared.pods[u.pod].object),
        reason: name_left_out_pools(&u.reason, &prepared.skipped_pools),
    }));

    let view = view_of(live, env, pools);
    let outcome = decide(&view, &|| false);
    // A command of standby nodes only removes nothing yet.
    let disruption = outcome
        .command
        .filter(|c| !c.candidates.is_empty())
        .map(|command| {
            let remove: Vec<PlannedRemoval> = command
                .candidates
                .iter()
                .map(|c| PlannedRemoval {
                    node: c.name.clone(),
                    nodepool: c.node_pool.clone(),
                    instance_type: c.instance_type.as_ref().map(|t| t.name.clone()),
                    price_per_hour: c.price,
                })
                .collect();
            let savings = command.estimated_savings();
            DisruptionPlan {
                method: format!("{:?}", command.method),
                decision: command.decision().as_str().to_string(),
                remove,
                launch: command.replacements.iter().map(planned).collect(),
                savings_per_hour: savings,
                savings_per_month: savings * HOURS_PER_MONTH,
            }
        });
    let launched: f64 = launch.iter().map(|n| n.price_per_hour).sum();
    let saved = disruption.as_ref().map_or(0.0, |d| d.savings_per_hour);
    let after = cost_per_hour + launched - saved;
    Ok(Plan {
        launch,
        pods_nominated,
        unschedulable,
        disruption,
        nodes: managed.len(),
        cost_per_hour,
        cost_per_month: cost_per_hour * HOURS_PER_MONTH,
        cost_per_hour_after: after,
        cost_per_month_after: after * HOURS_PER_MONTH,
        currency: env.currency.clone(),
        warnings,
    })
}

#[cfg(test)]
mod tests;
