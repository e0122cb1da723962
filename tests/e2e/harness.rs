//! One controller world for a cluster test: the shared real control plane, a simulated
//! Exoscale cloud on loopback, simulated kubelets that register a Node for each running
//! instance (a "kubelet" also finishes pod deletions), and controller replicas running
//! in-process through `operator::serve`.

// Each e2e target uses a different subset of these helpers.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use karpenter_exoscale::apis::labels::{
    INSTANCE_NODECLAIM_LABEL, NODECLASS_LABEL, NODEPOOL_LABEL, TERMINATION_FINALIZER,
};
use karpenter_exoscale::apis::{ExoscaleNodeClass, NodeClaim, NodePool};
use karpenter_exoscale::cloudprovider::exoscale::ExoscaleSettings;
use karpenter_exoscale::exoscale::models::SksTemplateVariant;
use karpenter_exoscale::exoscale::{self, Clock, SystemClock};
use karpenter_exoscale::fence::Fence;
use karpenter_exoscale::operator::config::{Config, RunArgs};
use karpenter_exoscale::operator::fenced_client::fenced;
use karpenter_exoscale::operator::leader::LeaseTimings;
use karpenter_exoscale::operator::metrics::Metrics;
use karpenter_exoscale::operator::run::{ExoscaleCloud, Runtime, build_cloud, cluster_uid, serve};
use karpenter_exoscale::operator::timed_client::{RequestTimeouts, timed};
use karpenter_exoscale::sim::kubelet::{
    self as kubelet_sim, InstanceShape, KubeletBehaviour, RunningInstance,
};
use karpenter_exoscale::sim::{ExoscaleSim, InstanceEvent};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::support;

pub const WAIT: Duration = Duration::from_secs(120);
pub const PREFIX: &str = "e2e-";

/// Cluster tests share one control plane and cluster-scoped objects: run them one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Polls `check` until it yields a value, panicking with `what` after `limit`.
pub async fn eventually_within<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let started = Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(started.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// As [`eventually_within`], for a check that says what it saw when it is not satisfied: a
/// timeout's panic names the last of it, so a failure in CI can be read from its log.
pub async fn eventually_within_showing<T, F, Fut>(what: &str, limit: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    match within_showing(limit, check).await {
        Ok(value) => value,
        Err(seen) => panic!("timed out waiting for {what}; the last check saw: {seen}"),
    }
}

/// Polls `check` until it yields a value, or `limit` passes: then the last thing it saw.
/// Never panics, for a test that cleans up before it fails.
pub async fn within_showing<T, F, Fut>(limit: Duration, mut check: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let started = Instant::now();
    loop {
        let seen = match check().await {
            Ok(value) => return Ok(value),
            Err(seen) => seen,
        };
        if started.elapsed() >= limit {
            return Err(seen);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

pub async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    eventually_within(what, WAIT, check).await
}

/// Decides how the kubelet of each instance behaves (by instance name).
pub type KubeletPolicy = Arc<dyn Fn(&str) -> KubeletBehaviour + Send + Sync>;

pub struct World {
    _serial: tokio::sync::MutexGuard<'static, ()>,
    pub client: Client,
    pub sim: Arc<ExoscaleSim>,
    pub exo: exoscale::Client,
    pub namespace: String,
    pub nodeclass: String,
    pub lease: String,
    pub env: BTreeMap<String, String>,
    /// How long an in-process replica's Exoscale requests may take (a test that parks
    /// requests at the sim raises it so they stay parked).
    pub exoscale_request_timeout: Duration,
    /// The control plane's kube-system Namespace UID: this cluster's identity.
    pub cluster_uid: String,
    background: Vec<JoinHandle<()>>,
    replicas: Mutex<Vec<Replica>>,
}

/// One running controller replica.
pub struct Replica {
    pub identity: String,
    stop: watch::Sender<bool>,
    task: JoinHandle<Result<(), karpenter_exoscale::operator::RunError>>,
    _cloud: ExoscaleCloud,
    pub metrics: Arc<Metrics>,
    /// The replica's write fence (driven by its election).
    pub fence: Fence,
}

fn instance_shape(types: &[exoscale::models::InstanceType], id: &str) -> InstanceShape {
    let t = types
        .iter()
        .find(|t| t.id == id)
        .expect("instance type known to the sim");
    InstanceShape {
        name: t.name(),
        cpus: t.cpus,
        memory_bytes: t.memory,
        gpus: t.gpus,
        disk_gib: 50,
    }
}

/// What a simulated kubelet needs of a running instance of the sim.
fn running_instance(
    types: &[exoscale::models::InstanceType],
    instance: &exoscale::models::Instance,
) -> RunningInstance {
    RunningInstance {
        id: instance.id.clone(),
        name: instance.name.clone(),
        zone: "ch-gva-2".into(),
        shape: instance_shape(types, &instance.instance_type.id),
        user_data: instance
            .user_data
            .as_ref()
            .map(|ud| ud.0.clone())
            .unwrap_or_default(),
    }
}

impl World {
    /// Starts the sim, kubelets and pod "kubelet"; `None` when the control plane is not built
    /// (outside CI; see tests/support).
    pub async fn start(test: &str, policy: KubeletPolicy) -> Option<World> {
        let serial = SERIAL.lock().await;
        karpenter_exoscale::operator::logging::init(
            karpenter_exoscale::operator::config::LogLevel::Info,
            karpenter_exoscale::operator::config::LogFormat::Text,
        );
        let plane = support::shared()?;
        let client = plane.client_without_retries().await;
        let namespace = plane.namespace(&client, test).await;
        support::control_plane::publish_cluster_ca(&client, &plane.config().await).await;
        let sim = Arc::new(ExoscaleSim::start().await.expect("simulated cloud starts"));
        sim.record_exchanges();
        let exo = exoscale::Client::new(sim.client_config()).expect("sim client");
        let types = exo.list_instance_types().await.expect("instance types");

        let mut background = Vec::new();
        // Simulated kubelets: a Node for every instance that reaches running.
        let mut events = sim.subscribe_instance_events();
        let kube = client.clone();
        background.push(tokio::spawn(async move {
            while let Ok(event) = events.recv().await {
                if let InstanceEvent::Running(instance) = event {
                    let running = running_instance(&types, &instance);
                    let behaviour = policy(&instance.name);
                    drop(kubelet_sim::spawn(kube.clone(), running, behaviour));
                }
            }
        }));
        // The part of the kubelet that confirms pod termination.
        let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
        background.push(tokio::spawn(async move {
            loop {
                if let Ok(list) = pods.list(&ListParams::default()).await {
                    for pod in list
                        .items
                        .iter()
                        .filter(|p| p.metadata.deletion_timestamp.is_some())
                    {
                        let _ = pods
                            .delete(&pod.name_any(), &DeleteParams::default().grace_period(0))
                            .await;
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }));

        let suffix = &namespace[namespace.len() - 6..];
        let nodeclass = format!("nc-{suffix}");
        let lease = format!("karpenter-{suffix}");
        let sim_endpoint = sim.endpoint().to_string();
        let env: BTreeMap<String, String> = [
            ("EXOSCALE_API_KEY", "unused-by-serve"),
            ("EXOSCALE_API_SECRET", "unused-by-serve"),
            ("EXOSCALE_ZONE", sim.zone()),
            ("EXOSCALE_SKS_CLUSTER_ID", sim.cluster_id()),
            // A simulated cloud: the lifecycle timings below are shorter than a real VM needs.
            ("EXOSCALE_API_ENDPOINT", &sim_endpoint),
            ("LEADER_ELECTION_NAME", &lease),
            ("LEADER_ELECTION_NAMESPACE", &namespace),
            ("NODECLAIM_REGISTRATION_TTL", "20s"),
            ("NODECLAIM_LAUNCH_TIMEOUT", "20s"),
            ("INSTANCE_GC_GRACE_PERIOD", "5s"),
            ("INSTANCE_GC_INTERVAL", "2s"),
            ("NODECLASS_RECHECK_INTERVAL", "10s"),
            ("LOG_FORMAT", "text"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let cluster_uid = cluster_uid(&client).await.expect("kube-system UID");
        Some(World {
            _serial: serial,
            cluster_uid,
            client,
            sim,
            exo,
            namespace,
            nodeclass,
            lease,
            env,
            exoscale_request_timeout: Duration::from_secs(10),
            background,
            replicas: Mutex::new(Vec::new()),
        })
    }

    /// Starts one controller replica named `identity`.
    /// A world with a Ready NodeClass and the real binary running as replica `identity`.
    pub async fn started(
        test: &str,
        policy: KubeletPolicy,
        identity: &str,
    ) -> Option<(World, tokio::process::Child)> {
        let world = World::start(test, policy).await?;
        world.create_nodeclass(serde_json::json!({})).await;
        let controller = world.spawn_controller(identity);
        world.ready_nodeclass().await;
        Some((world, controller))
    }

    pub async fn start_replica(&self, identity: &str) {
        self.start_replica_with(identity, self.client.clone()).await
    }

    /// Starts a replica whose Kubernetes traffic goes through `client` (e.g. via a proxy the
    /// test can cut).
    pub async fn start_replica_with(&self, identity: &str, client: Client) {
        self.start_replica_with_extra(identity, client, Vec::new())
            .await
    }

    /// Starts a replica that also runs `extra` controllers beside the core ones (a test's
    /// fault injected into a controller).
    pub async fn start_replica_with_extra(
        &self,
        identity: &str,
        client: Client,
        extra: Vec<karpenter_exoscale::operator::ExtraController>,
    ) {
        // Provisioning (and the other core controllers) run as in production.
        self.start_replica_with_controllers(identity, client, move |config| {
            let mut controllers = karpenter_exoscale::operator::run::core_controllers(config);
            controllers.extend(extra);
            controllers
        })
        .await
    }

    /// Starts a replica whose configuration `configure` may change, running the controllers it
    /// returns in place of the core ones (a test's own timings or provisioning settings).
    pub async fn start_replica_with_controllers(
        &self,
        identity: &str,
        client: Client,
        configure: impl FnOnce(&mut Config) -> Vec<karpenter_exoscale::operator::ExtraController>,
    ) {
        let mut env = self.env.clone();
        env.insert("POD_NAME".into(), identity.into());
        let mut config =
            Config::resolve(&RunArgs::default(), &env).expect("test configuration is valid");
        // As in `run`: no request of the replica waits forever for an answer. The elector
        // keeps the one client (a partition must cut its renewals too).
        let lease_client = client.clone();
        let client = timed(client, RequestTimeouts::default());
        config.metrics_port = 0;
        config.health_probe_port = 0;
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let extra_controllers = configure(&mut config);
        // Writes pass the replica's fence, as in `run`.
        let fence = Fence::closed();
        let metrics = Arc::new(Metrics::new());
        // The replica's own client, so its Exoscale requests land in its own registry.
        let exo = exoscale::Client::new(exoscale::ClientConfig {
            observer: exoscale::Observer(Some(metrics.clone())),
            request_timeout: self.exoscale_request_timeout,
            ..self.sim.client_config()
        })
        .expect("sim client");
        let cloud = build_cloud(
            ExoscaleSettings {
                zone: self.sim.zone().into(),
                cluster_id: self.sim.cluster_id().into(),
                cluster_uid: self.cluster_uid.clone(),
                instance_prefix: PREFIX.into(),
                cluster_endpoint: "https://127.0.0.1:6443".into(),
                cluster_domain: "cluster.local".into(),
                bootstrap_token_ttl: std::time::Duration::from_secs(600),
            },
            exo.fenced(fence.clone()),
            fenced(client.clone(), fence.clone()),
            clock.clone(),
        )
        .await
        .expect("cloud provider against the sim");
        let (stop, rx) = watch::channel(false);
        let runtime = Runtime {
            config,
            // The replica's one way to the API server: a partition cuts its renewals too.
            lease_client,
            client,
            cloud: cloud.provider.clone(),
            nodeclasses: Some(cloud.nodeclass_wiring()),
            clock,
            bind_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            extra_controllers,
            // Short enough that a killed leader is replaced quickly, with 3 s of slack so a
            // busy machine delaying one renewal does not hand the Lease over.
            lease: LeaseTimings {
                duration: Duration::from_secs(6),
                renew_deadline: Duration::from_secs(4),
                retry_period: Duration::from_secs(1),
            },
            metrics: metrics.clone(),
            fence: fence.clone(),
        };
        let task = tokio::spawn(serve(runtime, rx));
        self.replicas.lock().unwrap().push(Replica {
            identity: identity.into(),
            stop,
            task,
            _cloud: cloud,
            metrics,
            fence,
        });
    }

    /// Starts the real binary (`karpenter-exoscale run`) against this world, as a child
    /// process a test can SIGKILL. Leader election is off (one process at a time) so a
    /// restarted controller acts at once; its log goes to `<tmp>/<namespace>-<identity>.log`.
    pub fn spawn_controller(&self, identity: &str) -> tokio::process::Child {
        self.spawn_controller_serving_metrics(identity, free_port())
    }

    /// [`Self::spawn_controller`], serving `/metrics` on `127.0.0.1:<metrics_port>`.
    pub fn spawn_controller_serving_metrics(
        &self,
        identity: &str,
        metrics_port: u16,
    ) -> tokio::process::Child {
        let plane = support::shared().expect("control plane");
        self.spawn_controller_with(identity, metrics_port, &plane.kubeconfig_file)
    }

    /// [`Self::spawn_controller`], reaching kube-apiserver through `kubeconfig` (a proxy's).
    pub fn spawn_controller_with(
        &self,
        identity: &str,
        metrics_port: u16,
        kubeconfig: &std::path::Path,
    ) -> tokio::process::Child {
        let credentials = self.sim.credentials();
        let log = std::env::temp_dir().join(format!("{}-{identity}.log", self.namespace));
        let log = std::fs::File::create(&log).expect("controller log file");
        tokio::process::Command::new(env!("CARGO_BIN_EXE_karpenter-exoscale"))
            .arg("run")
            .envs(&self.env)
            .env("KUBECONFIG", kubeconfig)
            .env("EXOSCALE_API_ENDPOINT", self.sim.endpoint())
            .env("EXOSCALE_API_KEY", &credentials.key)
            .env("EXOSCALE_API_SECRET", credentials.secret.expose())
            .env(
                "CLUSTER_ENDPOINT",
                format!(
                    "https://{}.sks-{}.exo.io",
                    self.sim.cluster_id(),
                    self.sim.zone()
                ),
            )
            .env("EXOSCALE_COMPUTE_INSTANCE_PREFIX", PREFIX)
            .env("POD_NAME", identity)
            // Alone unless a test asks for an election (its env saying "false").
            .env(
                "DISABLE_LEADER_ELECTION",
                self.env
                    .get("DISABLE_LEADER_ELECTION")
                    .map_or("true", String::as_str),
            )
            .env("METRICS_PORT", metrics_port.to_string())
            .env("HEALTH_PROBE_PORT", free_port().to_string())
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("start karpenter-exoscale run")
    }

    /// The write fence of replica `identity`.
    pub fn replica_fence(&self, identity: &str) -> Fence {
        let replicas = self.replicas.lock().unwrap();
        replicas
            .iter()
            .find(|r| r.identity == identity)
            .expect("replica exists")
            .fence
            .clone()
    }

    /// Waits for replica `identity`'s fence to let writes through, and returns the fence. The
    /// Lease names the holder as soon as its acquiring write lands ([`World::await_leader`]);
    /// the replica opens its fence when it reads that write's answer, a moment later.
    pub async fn await_open_fence(&self, identity: &str) -> Fence {
        let fence = self.replica_fence(identity);
        eventually(&format!("{identity}'s writes pass its fence"), || async {
            fence.allows().then_some(())
        })
        .await;
        fence
    }

    /// Waits (up to `limit`) for replica `identity` to stop by itself and returns how it ended.
    pub async fn replica_outcome(
        &self,
        identity: &str,
        limit: Duration,
    ) -> Result<(), karpenter_exoscale::operator::RunError> {
        let replica = {
            let mut replicas = self.replicas.lock().unwrap();
            let i = replicas
                .iter()
                .position(|r| r.identity == identity)
                .expect("replica exists");
            replicas.remove(i)
        };
        tokio::time::timeout(limit, replica.task)
            .await
            .expect("replica stops by itself")
            .expect("replica task")
    }

    /// What replica `identity` serves on `/metrics` right now.
    pub fn replica_metrics(&self, identity: &str) -> String {
        let replicas = self.replicas.lock().unwrap();
        let replica = replicas
            .iter()
            .find(|r| r.identity == identity)
            .expect("replica exists");
        replica.metrics.render()
    }

    /// Stops a replica gracefully (it releases the Lease) and waits for it.
    pub async fn stop_replica(&self, identity: &str) {
        let replica = {
            let mut replicas = self.replicas.lock().unwrap();
            let i = replicas
                .iter()
                .position(|r| r.identity == identity)
                .expect("replica exists");
            replicas.remove(i)
        };
        let _ = replica.stop.send(true);
        let result = tokio::time::timeout(Duration::from_secs(30), replica.task)
            .await
            .expect("replica stops within 30 s");
        result.expect("replica task").expect("replica ends cleanly");
    }

    /// Aborts a replica without any cleanup (a crash).
    pub fn kill_replica(&self, identity: &str) {
        let mut replicas = self.replicas.lock().unwrap();
        let i = replicas
            .iter()
            .position(|r| r.identity == identity)
            .expect("replica exists");
        replicas.remove(i).task.abort();
    }

    /// The current holder of the test's Lease.
    pub async fn lease_holder(&self) -> Option<String> {
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
            Api::namespaced(self.client.clone(), &self.namespace);
        leases
            .get_opt(&self.lease)
            .await
            .ok()??
            .spec?
            .holder_identity
    }

    /// Waits until replica `identity` holds the leader Lease.
    pub async fn await_leader(&self, identity: &str) {
        eventually(&format!("{identity} leads"), || async {
            (self.lease_holder().await.as_deref() == Some(identity)).then_some(())
        })
        .await
    }

    /// Creates the test's ExoscaleNodeClass (template of the sim's Kubernetes version).
    pub async fn create_nodeclass(&self, extra_spec: serde_json::Value) -> ExoscaleNodeClass {
        let template = self
            .sim
            .sks_template_id(self.sim.kubernetes_version(), SksTemplateVariant::Standard)
            .expect("the sim has a template for its version");
        let mut spec = json!({"templateID": template});
        if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra_spec.as_object()) {
            spec.extend(extra.clone());
        }
        self.create_cluster_scoped(json!({"name": self.nodeclass}), spec)
            .await
    }

    /// Creates NodePool `name` with `spec`; its template refers to this world's NodeClass unless
    /// `spec` names another.
    pub async fn create_nodepool(&self, name: &str, mut spec: serde_json::Value) -> NodePool {
        if let Some(template_spec) = spec
            .pointer_mut("/template/spec")
            .and_then(|s| s.as_object_mut())
        {
            template_spec
                .entry("nodeClassRef")
                .or_insert_with(|| self.nodeclass_ref());
        }
        self.create_cluster_scoped(json!({"name": name}), spec)
            .await
    }

    /// Creates a NodeClaim as provisioning would (labels, smallest instance type).
    pub async fn create_nodeclaim(&self, name: &str, extra_spec: serde_json::Value) -> NodeClaim {
        let mut spec = json!({
            "requirements": [
                {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["standard.small"]},
                {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}
            ],
            "nodeClassRef": self.nodeclass_ref(),
        });
        if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra_spec.as_object()) {
            spec.extend(extra.clone());
        }
        let metadata = json!({
            "name": name,
            "labels": {NODEPOOL_LABEL: "e2e", NODECLASS_LABEL: self.nodeclass},
        });
        self.create_cluster_scoped(metadata, spec).await
    }

    /// Creates a cluster-scoped `K` (apiVersion and kind from its type); panics naming the kind.
    async fn create_cluster_scoped<K>(
        &self,
        metadata: serde_json::Value,
        spec: serde_json::Value,
    ) -> K
    where
        K: kube::Resource<DynamicType = ()>
            + Clone
            + serde::Serialize
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        let kind = K::kind(&());
        let object: K = serde_json::from_value(json!({
            "apiVersion": K::api_version(&()), "kind": kind,
            "metadata": metadata,
            "spec": spec,
        }))
        .unwrap_or_else(|e| panic!("{kind}: {e}"));
        Api::<K>::all(self.client.clone())
            .create(&PostParams::default(), &object)
            .await
            .unwrap_or_else(|e| panic!("create {kind}: {e}"))
    }

    /// The template reference to this world's ExoscaleNodeClass.
    fn nodeclass_ref(&self) -> serde_json::Value {
        json!({"group": "karpenter.exoscale.com", "kind": "ExoscaleNodeClass", "name": self.nodeclass})
    }

    /// Waits until the test's ExoscaleNodeClass reports Ready.
    pub async fn ready_nodeclass(&self) {
        let classes: Api<ExoscaleNodeClass> = Api::all(self.client.clone());
        let name = self.nodeclass.clone();
        eventually("NodeClass Ready", || {
            let classes = classes.clone();
            let name = name.clone();
            async move {
                use karpenter_exoscale::apis::ConditionsExt;
                let nc = classes.get_opt(&name).await.ok()??;
                nc.status?.conditions.is_true("Ready").then_some(())
            }
        })
        .await;
    }

    pub fn nodeclaims(&self) -> Api<NodeClaim> {
        Api::all(self.client.clone())
    }

    /// NodeClaims of the NodePool (including deleting ones); none while the list fails.
    pub async fn claims_of_pool(&self, pool: &str) -> Vec<NodeClaim> {
        self.nodeclaims()
            .list(&ListParams::default().labels(&format!("{NODEPOOL_LABEL}={pool}")))
            .await
            .map(|l| l.items)
            .unwrap_or_default()
    }

    pub fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Live (not deleted) instances in the sim.
    pub fn live_instances(&self) -> Vec<exoscale::models::Instance> {
        self.sim
            .instances()
            .into_iter()
            .map(|i| i.instance)
            .collect()
    }

    /// Starts the simulated kubelet of the live instance whose name contains `name_part` now,
    /// whatever the World's policy said when it started running.
    pub async fn join_now(&self, name_part: &str) {
        let types = self
            .exo
            .list_instance_types()
            .await
            .expect("instance types");
        let instance = self
            .live_instances()
            .into_iter()
            .find(|i| i.name.contains(name_part))
            .unwrap_or_else(|| panic!("no live instance named like {name_part}"));
        drop(kubelet_sim::spawn(
            self.client.clone(),
            running_instance(&types, &instance),
            KubeletBehaviour::default(),
        ));
    }

    /// Waits for a NodeClaim to be Initialized and returns its Node.
    pub async fn initialized_node(&self, claim: &str) -> Node {
        let claims = self.nodeclaims();
        let node_name = eventually(&format!("NodeClaim {claim} initialized"), || {
            let claims = claims.clone();
            async move {
                let c = claims.get_opt(claim).await.ok()??;
                let status = c.status?;
                use karpenter_exoscale::apis::ConditionsExt;
                status
                    .conditions
                    .is_true("Initialized")
                    .then_some(status.node_name?)
            }
        })
        .await;
        self.nodes()
            .get(&node_name)
            .await
            .expect("node of an initialized NodeClaim")
    }

    /// Stops replicas and background tasks, then removes what the test left in the cluster.
    pub async fn finish(self) {
        let identities: Vec<String> = self
            .replicas
            .lock()
            .unwrap()
            .iter()
            .map(|r| r.identity.clone())
            .collect();
        for identity in identities {
            self.kill_replica(&identity);
        }
        for task in &self.background {
            task.abort();
        }
        let release = json!({"metadata": {"finalizers": null}});
        for claim in self
            .nodeclaims()
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
        {
            let _ = self
                .nodeclaims()
                .patch(
                    &claim.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&release),
                )
                .await;
            let _ = self
                .nodeclaims()
                .delete(&claim.name_any(), &DeleteParams::default())
                .await;
        }
        for node in self
            .nodes()
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
        {
            if node.finalizers().iter().any(|f| f == TERMINATION_FINALIZER)
                || node.name_any().starts_with(PREFIX)
            {
                let _ = self
                    .nodes()
                    .patch(
                        &node.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(&release),
                    )
                    .await;
                let _ = self
                    .nodes()
                    .delete(&node.name_any(), &DeleteParams::default())
                    .await;
            }
        }
        let classes: Api<ExoscaleNodeClass> = Api::all(self.client.clone());
        let _ = classes
            .patch(
                &self.nodeclass,
                &PatchParams::default(),
                &Patch::Merge(&release),
            )
            .await;
        let _ = classes
            .delete(&self.nodeclass, &DeleteParams::default())
            .await;
        // The controller's whole conversation with the simulated cloud, against the API's
        // OpenAPI document (after the clean-up, so a finding does not leave objects behind).
        let problems = crate::support::openapi::all_problems(&self.sim.exchanges());
        assert!(
            problems.is_empty(),
            "traffic the Exoscale API would not accept or send:\n{}",
            problems.join("\n")
        );
    }
}

// ---- helpers shared by the e2e targets ----

/// A request as a replica's client sends it, and the answer a test hands back.
pub type Request = http::Request<kube::client::Body>;
pub type Answer =
    Result<http::Response<kube::client::Body>, Box<dyn std::error::Error + Send + Sync>>;

/// `inner`, with each request passed to `around` with a clone of `inner` to send it with: a
/// test's fault between a replica and the API server (a write held, counted or refused).
pub fn intercepted<F, Fut>(inner: Client, around: F) -> Client
where
    F: Fn(Client, Request) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Answer> + Send + 'static,
{
    #[derive(Clone)]
    struct Intercept<F> {
        inner: Client,
        around: F,
    }
    impl<F, Fut> tower_service::Service<Request> for Intercept<F>
    where
        F: Fn(Client, Request) -> Fut + Clone + Send + 'static,
        Fut: Future<Output = Answer> + Send + 'static,
    {
        type Response = http::Response<kube::client::Body>;
        type Error = Box<dyn std::error::Error + Send + Sync>;
        type Future = std::pin::Pin<Box<dyn Future<Output = Answer> + Send>>;

        fn poll_ready(
            &mut self,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), Self::Error>> {
            std::task::Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: Request) -> Self::Future {
            Box::pin((self.around)(self.inner.clone(), request))
        }
    }
    let namespace = inner.default_namespace().to_string();
    Client::new(Intercept { inner, around }, namespace)
}

/// An answer the API server would give for a failure, as kube reads it.
pub fn refused(code: u16) -> Answer {
    let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
        "message": "injected by the test", "reason": "InternalError", "code": code});
    Ok(http::Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(kube::client::Body::from(
            serde_json::to_vec(&status).unwrap(),
        ))
        .unwrap())
}

/// A port nothing listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

pub fn joins() -> KubeletPolicy {
    Arc::new(|_: &str| KubeletBehaviour::default())
}

pub fn suffix(world: &World) -> String {
    world.namespace[world.namespace.len() - 6..].to_string()
}

/// A pod bound straight to `node` (no kubelet runs it; the harness finishes its deletion).
pub async fn bound_pod(world: &World, name: &str, node: &str, labels: serde_json::Value) -> Pod {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}]
        }
    }))
    .unwrap();
    world
        .pods()
        .create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    report_running(world, name).await
}

/// Writes what pod `name`'s kubelet would report: Running and Ready (Pending pods ignore PDBs).
pub async fn report_running(world: &World, name: &str) -> Pod {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let status = json!({"status": {"phase": "Running", "conditions": [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
        {"type": "Ready", "status": "True", "lastTransitionTime": now},
    ]}});
    world
        .pods()
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("pod status")
}

pub async fn gone<K>(api: &Api<K>, name: &str, what: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    eventually(&format!("{what} {name} deleted"), || {
        let api = api.clone();
        async move { matches!(api.get_opt(name).await, Ok(None)).then_some(()) }
    })
    .await
}

pub fn instances_of(world: &World, claim: &str) -> usize {
    world
        .live_instances()
        .iter()
        .filter(|i| i.labels.get(INSTANCE_NODECLAIM_LABEL).map(String::as_str) == Some(claim))
        .count()
}

/// A VolumeAttachment on `node`, as a CSI attacher would leave it (no attach/detach
/// controller runs in the test control plane, so nothing else touches it).
pub async fn volume_attachment(world: &World, name: &str, node: &str) -> Api<VolumeAttachment> {
    let attachments: Api<VolumeAttachment> = Api::all(world.client.clone());
    let va: VolumeAttachment = serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
        "metadata": {"name": name},
        "spec": {
            "attacher": "csi.example.com",
            "nodeName": node,
            "source": {"persistentVolumeName": format!("pv-{name}")}
        }
    }))
    .unwrap();
    attachments
        .create(&PostParams::default(), &va)
        .await
        .expect("create VolumeAttachment");
    attachments
}

/// How a test ends a response stream: as a broken connection does, or as the server's
/// timeout does.
#[derive(Clone, Copy)]
pub enum StreamEnd {
    Failed,
    Clean,
}

/// A response body a test steers (a watch, mostly): its frames wait while `paused` is true, it
/// ends when `end` resolves, and it keeps `guard` alive as long as it lives.
pub struct Steered {
    inner: kube::client::Body,
    paused: Option<watch::Receiver<bool>>,
    resumed: Option<futures::future::BoxFuture<'static, ()>>,
    end: Option<futures::future::BoxFuture<'static, StreamEnd>>,
    ended: bool,
    _guard: Option<Box<dyn Send>>,
}

impl Steered {
    pub fn new(inner: kube::client::Body) -> Steered {
        Steered {
            inner,
            paused: None,
            resumed: None,
            end: None,
            ended: false,
            _guard: None,
        }
    }

    /// Frames wait while `paused` holds true: a watch whose events are late.
    pub fn paused_by(mut self, paused: watch::Receiver<bool>) -> Steered {
        self.paused = Some(paused);
        self
    }

    /// The body ends (failed or clean) once `end` resolves.
    pub fn ended_by(mut self, end: impl Future<Output = StreamEnd> + Send + 'static) -> Steered {
        self.end = Some(Box::pin(end));
        self
    }

    /// `guard` is dropped with the body (e.g. to count open watches).
    pub fn holding(mut self, guard: impl Send + 'static) -> Steered {
        self._guard = Some(Box::new(guard));
        self
    }
}

impl http_body::Body for Steered {
    type Data = bytes::Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        use std::task::Poll;
        if self.ended {
            return Poll::Ready(None);
        }
        if let Some(end) = self.end.as_mut()
            && let Poll::Ready(end) = end.as_mut().poll(cx)
        {
            self.ended = true;
            return Poll::Ready(match end {
                StreamEnd::Failed => Some(Err("stream cut by the test".into())),
                StreamEnd::Clean => None,
            });
        }
        if let Some(paused) = self.paused.clone()
            && *paused.borrow()
        {
            let resumed = self.resumed.get_or_insert_with(|| {
                let mut paused = paused.clone();
                Box::pin(async move {
                    let _ = paused.wait_for(|p| !*p).await;
                })
            });
            if resumed.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
        self.resumed = None;
        std::pin::Pin::new(&mut self.inner)
            .poll_frame(cx)
            .map_err(Into::into)
    }
}

/// A replica's transport: while `armed`, the next NodeClaim create is committed but its answer
/// lost (the connection drops), then it disarms; NodeClaim watch events are late while
/// `claims_late` is set. `creates` counts every create sent.
#[derive(Clone)]
pub struct LostAnswer {
    inner: Client,
    pub claims_late: watch::Sender<bool>,
    pub armed: Arc<std::sync::atomic::AtomicBool>,
    pub creates: Arc<std::sync::atomic::AtomicUsize>,
}

impl LostAnswer {
    /// Armed: the first create's answer is lost.
    pub fn new(inner: Client) -> LostAnswer {
        LostAnswer {
            inner,
            claims_late: watch::channel(false).0,
            armed: Arc::new(true.into()),
            creates: Arc::default(),
        }
    }
}

impl tower_service::Service<http::Request<kube::client::Body>> for LostAnswer {
    type Response = http::Response<Steered>;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<kube::client::Body>) -> Self::Future {
        use std::sync::atomic::Ordering::SeqCst;
        let this = self.clone();
        Box::pin(async move {
            let path = request.uri().path().to_string();
            let claims = path == "/apis/karpenter.sh/v1/nodeclaims";
            let create = claims && request.method() == http::Method::POST;
            let watch = claims
                && request
                    .uri()
                    .query()
                    .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true"));
            let response = this.inner.send(request).await?;
            if create {
                this.creates.fetch_add(1, SeqCst);
                if this.armed.swap(false, SeqCst) {
                    return Err("connection reset by peer (the test lost the answer)".into());
                }
            }
            let late = this.claims_late.subscribe();
            Ok(response.map(|inner| {
                let body = Steered::new(inner);
                if watch { body.paused_by(late) } else { body }
            }))
        })
    }
}
