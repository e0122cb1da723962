//! What the scheduler takes and gives: options, input, NodeClaims to create, assignments and
//! unschedulable pods.

use super::*;

/// Upstream's cap on instance types written into one NodeClaim.
pub const MAX_INSTANCE_TYPES: usize = 600;

/// `PREFERENCE_POLICY`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PreferencePolicy {
    /// Treat preferences as requirements, relaxing them one by one when a pod does not fit.
    #[default]
    Respect,
    /// Drop preferred affinities and `ScheduleAnyway` spreads entirely.
    Ignore,
}

/// `MIN_VALUES_POLICY`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MinValuesPolicy {
    #[default]
    Strict,
    BestEffort,
}

#[derive(Debug, Clone)]
pub struct SchedulerOptions {
    pub preference_policy: PreferencePolicy,
    pub min_values_policy: MinValuesPolicy,
    pub well_known_labels: WellKnownLabels,
    /// Nodes to pretend are gone (consolidation: "can these pods go elsewhere?").
    pub excluded_nodes: HashSet<String>,
    pub max_instance_types: usize,
    /// Spread given to each pod that declares none and has labels, selecting pods with its
    /// labels (`SCHEDULER_CONFIG`, as upstream's `--scheduler-config`).
    pub default_topology_spread: Vec<TopologySpreadConstraint>,
    /// `IGNORE_DRA_REQUESTS` (upstream's default, true): while Dynamic Resource Allocation is
    /// not supported, pods that claim devices are refused ([`DRA_NOT_SUPPORTED`]) and DaemonSets
    /// that claim devices add no overhead. False: the claims are ignored and such pods are
    /// placed like any other (upstream would allocate the devices; Exoscale offers none).
    pub ignore_dra_requests: bool,
}

/// Upstream's error for a pod refused because it claims Dynamic Resource Allocation devices.
pub const DRA_NOT_SUPPORTED: &str =
    "pod has Dynamic Resource Allocation requirements that are not yet supported by Karpenter";

impl SchedulerOptions {
    /// Whether something that claims DRA devices (`uses_dynamic_resources`) is left out: the
    /// one rule for pods to place and DaemonSet overhead alike.
    pub(super) fn refuses_dynamic_resources(&self, uses_dynamic_resources: bool) -> bool {
        uses_dynamic_resources && self.ignore_dra_requests
    }
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        Self {
            preference_policy: PreferencePolicy::Respect,
            min_values_policy: MinValuesPolicy::Strict,
            well_known_labels: WellKnownLabels::default(),
            excluded_nodes: HashSet::new(),
            max_instance_types: MAX_INSTANCE_TYPES,
            default_topology_spread: Vec::new(),
            ignore_dra_requests: true,
        }
    }
}

/// Everything the scheduler knows about the cluster, as plain data.
#[derive(Debug, Clone, Default)]
pub struct SchedulerInput {
    pub node_pools: Vec<NodePoolTemplate>,
    /// Instance types offered to each NodePool, by NodePool name.
    pub instance_types: HashMap<String, Vec<Arc<InstanceType>>>,
    /// Nodes and in-flight NodeClaims (with a providerID), with their bound pods.
    pub existing_nodes: Vec<ExistingNode>,
    pub daemonsets: Vec<DaemonSetPod>,
    pub options: SchedulerOptions,
}

/// A NodeClaim the solve wants created.
#[derive(Debug, Clone)]
pub struct NewNodeClaim {
    pub node_pool: String,
    /// Template requirements narrowed by the pods, capacity type narrowed to the offerings left.
    /// The instance-type list is kept in `instance_types`; see [`NewNodeClaim::node_claim_requirements`].
    pub requirements: Requirements,
    /// Compatible instance types, cheapest first, at most `max_instance_types`.
    pub instance_types: Vec<Arc<InstanceType>>,
    /// Indices into the `pods` slice given to `solve`.
    pub pods: Vec<usize>,
    /// Summed pod requests plus the smallest DaemonSet overhead among the instance types.
    pub requests: Resources,
    pub daemon_overhead: Resources,
    /// Set when `MinValuesPolicy::BestEffort` had to lower a `minValues`.
    pub min_values_relaxed: bool,
}

impl NewNodeClaim {
    /// A NodeClaim made from the template alone, for no pod (a static NodePool's replica): the
    /// template's requirements and every compatible instance type with an available offering,
    /// cheapest first, at most [`MAX_INSTANCE_TYPES`]. `None` when no type fits.
    pub fn from_template(
        template: &NodePoolTemplate,
        instance_types: &[Arc<InstanceType>],
    ) -> Option<NewNodeClaim> {
        let reqs = &template.requirements;
        let mut priced: Vec<(f64, Arc<InstanceType>)> = instance_types
            .iter()
            .filter(|it| it.requirements.intersects(reqs).is_ok())
            .filter_map(|it| Some((it.cheapest_price(reqs)?, it.clone())))
            .collect();
        if priced.is_empty() {
            return None;
        }
        priced.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.name.cmp(&b.1.name)));
        priced.truncate(MAX_INSTANCE_TYPES);
        Some(NewNodeClaim {
            node_pool: template.name.clone(),
            requirements: reqs.clone(),
            instance_types: priced.into_iter().map(|(_, it)| it).collect(),
            pods: Vec::new(),
            requests: Resources::new(),
            daemon_overhead: Resources::new(),
            min_values_relaxed: false,
        })
    }

    /// Labels for the NodeClaim: `karpenter.sh/nodepool`, plus one concrete value for every
    /// custom (non-well-known, non-restricted) requirement key — template labels included.
    pub fn labels(&self, well_known: &WellKnownLabels) -> BTreeMap<String, String> {
        let mut labels: BTreeMap<String, String> = self
            .requirements
            .iter()
            .filter(|r| {
                let key = r.key();
                !well_known.contains(key)
                    && key != HOSTNAME
                    && !key.starts_with("karpenter.sh/")
                    && !key.contains(".karpenter.sh/")
            })
            .filter_map(|r| Some((r.key().to_string(), r.any_value()?)))
            .collect();
        labels.insert(NODE_POOL.to_string(), self.node_pool.clone());
        labels
    }

    /// The requirements to write into the NodeClaim spec: `requirements` plus
    /// `node.kubernetes.io/instance-type In [options]` (keeping any `minValues` on that key).
    pub fn node_claim_requirements(&self) -> Requirements {
        let mut reqs = self.requirements.clone();
        let min_values = reqs.get(INSTANCE_TYPE).and_then(Requirement::min_values);
        reqs.set(
            Requirement::in_values(
                INSTANCE_TYPE,
                self.instance_types.iter().map(|it| it.name.clone()),
            )
            .with_min_values(min_values),
        );
        reqs
    }
}

/// Pods placed on an existing node (or in-flight NodeClaim).
#[derive(Debug, Clone)]
pub struct ExistingNodeAssignment {
    pub node_name: String,
    pub pods: Vec<usize>,
}

/// A pod that could not be placed, with an operator-actionable reason.
#[derive(Debug, Clone)]
pub struct UnschedulablePod {
    /// Index into the `pods` slice given to `solve`.
    pub pod: usize,
    pub reason: String,
    /// Why each NodePool rejected the pod.
    pub per_node_pool: Vec<(String, String)>,
}

#[derive(Debug, Clone, Default)]
pub struct Results {
    pub new_node_claims: Vec<NewNodeClaim>,
    pub existing_nodes: Vec<ExistingNodeAssignment>,
    pub unschedulable: Vec<UnschedulablePod>,
    /// Pods skipped without an error (they refuse Karpenter nodes).
    pub ignored: Vec<usize>,
}

impl Results {
    pub fn scheduled_pod_count(&self) -> usize {
        self.new_node_claims
            .iter()
            .map(|c| c.pods.len())
            .sum::<usize>()
            + self
                .existing_nodes
                .iter()
                .map(|n| n.pods.len())
                .sum::<usize>()
    }
}
