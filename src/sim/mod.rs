//! A simulated Exoscale API v2 on loopback: signature-verifying, asynchronous operations,
//! fault injection and inspectable state. Used by integration tests, by `simulate` and by
//! `karpenter-exoscale sim`.
//!
//! Seam for later work: [`ExoscaleSim::subscribe_instance_events`] announces instances that
//! reach `running` (a simulated kubelet registers Nodes for them) and instances that are gone.

mod faults;
mod http;
pub mod kubelet;
pub mod pods;
mod world;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use rand::Rng;
use tokio::sync::{broadcast, oneshot};

pub use faults::{Fault, FaultAction, HoldGate};

/// The standalone sim listens on loopback only unless told otherwise: it prints working
/// credentials, so any address others can reach hands them its simulated cloud.
pub fn check_listen(addr: std::net::SocketAddr, allow_remote: bool) -> Result<(), String> {
    if addr.ip().is_loopback() || allow_remote {
        Ok(())
    } else {
        Err(format!(
            "refusing to listen on {addr}, which is not a loopback address: the sim prints its credentials; pass --allow-remote to do it anyway"
        ))
    }
}
pub use world::decode_user_data;

use crate::exoscale::models::{Instance, SksTemplateVariant};
use crate::exoscale::{
    ApiSecret, ClientConfig, Credentials, Endpoint, PollPolicy, RetryPolicy,
    signer::{Clock, SystemClock},
};
use world::{Deferred, World};

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("simulated cloud server failed: {0}")]
    Serve(std::io::Error),
    #[error("invalid zone {0:?}")]
    InvalidZone(String),
}

/// How the sim authenticates a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthOutcome {
    Valid {
        key: String,
        signature: String,
    },
    /// Allowed without signature (`GET /v2/zone` only).
    Unsigned,
    Rejected(String),
}

/// One request the sim received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallRecord {
    pub method: String,
    pub path: String,
    pub query: Option<String>,
    /// API operation id, e.g. `create-instance`; `unknown` for unrouted paths.
    pub operation: String,
    pub status: u16,
    pub auth: AuthOutcome,
    /// The sim acted but dropped the response (fault `LoseResponse`).
    pub response_lost: bool,
}

/// Lifecycle announcements for listeners such as a simulated kubelet.
#[derive(Debug, Clone, PartialEq)]
pub enum InstanceEvent {
    Running(Box<Instance>),
    Deleted { id: String, name: String },
}

/// An instance as the sim holds it, with its user data decoded for assertions.
#[derive(Debug, Clone, PartialEq)]
pub struct SimInstance {
    pub instance: Instance,
    pub user_data: Option<String>,
}

#[derive(Debug, Clone)]
pub struct SimConfig {
    pub listen: SocketAddr,
    pub zone: String,
    /// Generated when `None`.
    pub api_key: Option<String>,
    pub api_secret: Option<ApiSecret>,
    pub kubernetes_version: String,
    /// How long a mutation's operation stays pending.
    pub operation_delay: Duration,
    /// Used to check signature expiry.
    pub clock: Arc<dyn Clock>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            zone: "ch-gva-2".into(),
            api_key: None,
            api_secret: None,
            kubernetes_version: "1.34.1".into(),
            operation_delay: Duration::from_millis(50),
            clock: Arc::new(SystemClock),
        }
    }
}

pub(crate) struct Shared {
    world: Mutex<World>,
    credentials: Mutex<HashMap<String, String>>,
    faults: Mutex<Vec<faults::FaultSlot>>,
    calls: Mutex<Vec<CallRecord>>,
    exchanges: Mutex<Option<Vec<Exchange>>>,
    events: broadcast::Sender<InstanceEvent>,
    operation_delay: Mutex<Duration>,
    clock: Arc<dyn Clock>,
}

/// The call log keeps the most recent calls only, so a long-running standalone sim stays small.
const MAX_RECORDED_CALLS: usize = 100_000;

/// One request and the sim's answer, kept only while [`ExoscaleSim::record_exchanges`] is on
/// (the OpenAPI conformance checks read them).
#[derive(Clone, Debug, PartialEq)]
pub struct Exchange {
    pub method: String,
    /// Raw path, with `/v2`.
    pub path: String,
    pub query: Option<String>,
    pub request_body: String,
    pub status: u16,
    /// The JSON body sent (`None` when the response was lost or not JSON).
    pub response_body: Option<serde_json::Value>,
    /// A fault decided the answer (a hostile or injected body, not the simulated API's).
    pub injected: bool,
    pub lost: bool,
}

pub(crate) fn record_exchange(shared: &Shared, exchange: Exchange) {
    if let Some(log) = shared.exchanges.lock().expect("lock").as_mut() {
        log.push(exchange);
    }
}

pub(crate) fn record_call(shared: &Shared, record: CallRecord) {
    let mut calls = shared.calls.lock().expect("lock");
    if calls.len() >= MAX_RECORDED_CALLS {
        calls.drain(..MAX_RECORDED_CALLS / 10);
    }
    calls.push(record);
}

/// Finishes a pending operation after the configured delay and announces the result.
pub(crate) fn schedule_completion(shared: Arc<Shared>, deferred: Deferred) {
    let delay = *shared.operation_delay.lock().expect("lock");
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        let outcome = shared.world.lock().expect("lock").complete(&deferred);
        match outcome {
            Some((instance, true)) => {
                let _ = shared
                    .events
                    .send(InstanceEvent::Running(Box::new(instance)));
            }
            Some((instance, false)) => {
                let _ = shared.events.send(InstanceEvent::Deleted {
                    id: instance.id,
                    name: instance.name,
                });
            }
            None => {}
        }
    });
}

/// A running simulated cloud. Dropping it stops the server.
pub struct ExoscaleSim {
    addr: SocketAddr,
    endpoint: String,
    credentials: Credentials,
    zone: String,
    cluster_id: String,
    kubernetes_version: String,
    shared: Arc<Shared>,
    shutdown: Option<oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<Result<(), std::io::Error>>>,
}

impl std::fmt::Debug for ExoscaleSim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExoscaleSim")
            .field("endpoint", &self.endpoint)
            .field("credentials", &self.credentials)
            .field("zone", &self.zone)
            .finish()
    }
}

fn random_token(len: usize) -> String {
    let mut bytes = vec![0u8; len];
    rand::rng().fill(&mut bytes[..]);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

impl ExoscaleSim {
    /// Starts on 127.0.0.1 on a free port, zone ch-gva-2, generated credentials.
    pub async fn start() -> Result<ExoscaleSim, SimError> {
        ExoscaleSim::start_with(SimConfig::default()).await
    }

    pub async fn start_with(config: SimConfig) -> Result<ExoscaleSim, SimError> {
        if Endpoint::resolve(&config.zone, None, None).is_err() {
            return Err(SimError::InvalidZone(config.zone));
        }
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|source| SimError::Bind {
                addr: config.listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(SimError::Serve)?;
        let endpoint = format!("http://{addr}/v2");
        let key = config
            .api_key
            .unwrap_or_else(|| format!("EXO{}", hex_token(12)));
        let secret = config
            .api_secret
            .map(|s| s.expose().to_string())
            .unwrap_or_else(|| random_token(32));
        let world = World::new(&config.zone, &endpoint, &config.kubernetes_version);
        let cluster_id = world.clusters[0].id.clone();
        let (events, _) = broadcast::channel(1024);
        let shared = Arc::new(Shared {
            world: Mutex::new(world),
            credentials: Mutex::new(HashMap::from([(key.clone(), secret.clone())])),
            faults: Mutex::new(Vec::new()),
            calls: Mutex::new(Vec::new()),
            exchanges: Mutex::new(None),
            events,
            operation_delay: Mutex::new(config.operation_delay),
            clock: config.clock,
        });
        let app = axum::Router::new()
            .fallback(http::handle)
            .with_state(shared.clone());
        let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = shutdown_rx.await;
                })
                .await
        });
        Ok(ExoscaleSim {
            addr,
            endpoint,
            credentials: Credentials::new(key, secret),
            zone: config.zone,
            cluster_id,
            kubernetes_version: config.kubernetes_version,
            shared,
            shutdown: Some(shutdown_tx),
            server: Some(server),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Base URL including `/v2`, for `EXOSCALE_API_ENDPOINT`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub fn credentials(&self) -> &Credentials {
        &self.credentials
    }

    pub fn zone(&self) -> &str {
        &self.zone
    }

    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    pub fn kubernetes_version(&self) -> &str {
        &self.kubernetes_version
    }

    /// A client configuration for this sim with short poll intervals and back-off.
    pub fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new(
            Endpoint::parse(&self.endpoint).expect("the sim's own URL is valid"),
            self.credentials.clone(),
        );
        config.poll = PollPolicy::fixed(Duration::from_millis(10), Duration::from_secs(30));
        config.retry = RetryPolicy {
            max_attempts: 4,
            base_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(100),
            max_retry_after: Duration::from_secs(5),
        };
        config.rate_limit = None;
        config.request_timeout = Duration::from_secs(10);
        config
    }

    /// Accepts another key pair (e.g. a second, restricted key).
    pub fn add_credentials(&self, key: &str, secret: &str) {
        self.shared
            .credentials
            .lock()
            .expect("lock")
            .insert(key.to_string(), secret.to_string());
    }

    pub fn inject(&self, fault: Fault) {
        self.shared
            .faults
            .lock()
            .expect("lock")
            .push(faults::FaultSlot::new(fault));
    }

    pub fn clear_faults(&self) {
        self.shared.faults.lock().expect("lock").clear();
    }

    /// The SKS cluster's API endpoint (a sandbox points it at its local apiserver, so the
    /// controller's endpoint check agrees).
    pub fn set_cluster_endpoint(&self, endpoint: &str) {
        let mut world = self.shared.world.lock().expect("lock");
        for cluster in &mut world.clusters {
            cluster.endpoint = Some(endpoint.to_string());
        }
    }

    /// Caps the number of live instances; creates beyond it get a quota error.
    pub fn set_instance_quota(&self, limit: Option<usize>) {
        self.shared.world.lock().expect("lock").instance_quota = limit;
    }

    /// Marks `family.size` as out of capacity (creates of it fail with a 412 capacity error) or
    /// back in stock; false when the type is unknown.
    pub fn set_capacity_exhausted(&self, type_name: &str, exhausted: bool) -> bool {
        let mut world = self.shared.world.lock().expect("lock");
        if !world.instance_types.iter().any(|t| t.name() == type_name) {
            return false;
        }
        if exhausted {
            world.exhausted_types.insert(type_name.to_string());
        } else {
            world.exhausted_types.remove(type_name);
        }
        true
    }

    pub fn set_operation_delay(&self, delay: Duration) {
        *self.shared.operation_delay.lock().expect("lock") = delay;
    }

    /// Sets the `authorized` flag of `family.size`; false when the type is unknown.
    pub fn set_authorized(&self, type_name: &str, authorized: bool) -> bool {
        let mut world = self.shared.world.lock().expect("lock");
        match world
            .instance_types
            .iter_mut()
            .find(|t| t.name() == type_name)
        {
            Some(t) => {
                t.authorized = authorized;
                true
            }
            None => false,
        }
    }

    pub fn add_security_group(&self, name: &str) -> String {
        self.shared
            .world
            .lock()
            .expect("lock")
            .add_security_group(name)
    }

    pub fn add_private_network(&self, name: &str) -> String {
        self.shared
            .world
            .lock()
            .expect("lock")
            .add_private_network(name)
    }

    pub fn add_anti_affinity_group(&self, name: &str) -> String {
        self.shared
            .world
            .lock()
            .expect("lock")
            .add_anti_affinity_group(name)
    }

    /// Publishes node templates for another Kubernetes version.
    pub fn add_kubernetes_version(&self, version: &str) {
        let mut world = self.shared.world.lock().expect("lock");
        if !world.sks_versions.iter().any(|v| v == version) {
            world.sks_versions.push(version.to_string());
        }
        for variant in [SksTemplateVariant::Standard, SksTemplateVariant::Nvidia] {
            world.add_sks_template(version, variant);
        }
    }

    /// Withdraws the active template of a version and variant (the template itself stays).
    pub fn remove_sks_template(&self, version: &str, variant: SksTemplateVariant) -> bool {
        self.shared
            .world
            .lock()
            .expect("lock")
            .sks_templates
            .remove(&(version.to_string(), variant))
            .is_some()
    }

    /// The active template id for a version and variant, if published.
    pub fn sks_template_id(&self, version: &str, variant: SksTemplateVariant) -> Option<String> {
        self.shared
            .world
            .lock()
            .expect("lock")
            .sks_templates
            .get(&(version.to_string(), variant))
            .cloned()
    }

    /// `(id, name)` of the default security groups, private networks and anti-affinity groups.
    pub fn security_groups(&self) -> Vec<(String, String)> {
        let w = self.shared.world.lock().expect("lock");
        w.security_groups
            .iter()
            .map(|g| (g.id.clone(), g.name.clone()))
            .collect()
    }

    pub fn private_networks(&self) -> Vec<(String, String)> {
        let w = self.shared.world.lock().expect("lock");
        w.private_networks
            .iter()
            .map(|g| (g.id.clone(), g.name.clone()))
            .collect()
    }

    pub fn anti_affinity_groups(&self) -> Vec<(String, String)> {
        let w = self.shared.world.lock().expect("lock");
        w.anti_affinity_groups
            .iter()
            .map(|g| (g.id.clone(), g.name.clone()))
            .collect()
    }

    /// Every instance (any state), in creation order.
    pub fn instances(&self) -> Vec<SimInstance> {
        let w = self.shared.world.lock().expect("lock");
        w.instances
            .iter()
            .map(|i| SimInstance {
                instance: i.clone(),
                user_data: i.user_data.as_deref().and_then(decode_user_data),
            })
            .collect()
    }

    pub fn instance(&self, id: &str) -> Option<SimInstance> {
        self.instances().into_iter().find(|i| i.instance.id == id)
    }

    pub fn calls(&self) -> Vec<CallRecord> {
        self.shared.calls.lock().expect("lock").clone()
    }

    /// Starts keeping every request and answer, bodies included, until [`Self::exchanges`] takes them.
    pub fn record_exchanges(&self) {
        self.shared
            .exchanges
            .lock()
            .expect("lock")
            .get_or_insert_with(Vec::new);
    }

    /// The exchanges recorded so far (recording goes on).
    pub fn exchanges(&self) -> Vec<Exchange> {
        self.shared
            .exchanges
            .lock()
            .expect("lock")
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// How many calls of `operation` the sim received.
    pub fn call_count(&self, operation: &str) -> usize {
        self.shared
            .calls
            .lock()
            .expect("lock")
            .iter()
            .filter(|c| c.operation == operation)
            .count()
    }

    /// Signatures of the validly signed calls, in order.
    pub fn signatures_seen(&self) -> Vec<String> {
        self.calls()
            .into_iter()
            .filter_map(|c| match c.auth {
                AuthOutcome::Valid { signature, .. } => Some(signature),
                _ => None,
            })
            .collect()
    }

    pub fn subscribe_instance_events(&self) -> broadcast::Receiver<InstanceEvent> {
        self.shared.events.subscribe()
    }

    /// Stops the server and waits for it.
    pub async fn shutdown(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(server) = self.server.take() {
            let _ = server.await;
        }
    }
}

impl Drop for ExoscaleSim {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

fn hex_token(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    rand::rng().fill(&mut buf[..]);
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// Serves the sim until ctrl-c, after printing its endpoint and credentials as env lines.
pub async fn serve(
    listen: SocketAddr,
    zone: String,
    key: Option<String>,
    secret: Option<String>,
) -> Result<(), SimError> {
    let config = SimConfig {
        listen,
        zone,
        api_key: key,
        api_secret: secret.map(ApiSecret::from),
        operation_delay: Duration::from_secs(2),
        ..SimConfig::default()
    };
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    serve_until(config, ctrl_c, &mut std::io::stdout()).await
}

/// Serves the sim until `stop` completes; writes the env lines to `out` once listening.
pub async fn serve_until(
    config: SimConfig,
    stop: impl std::future::Future<Output = ()>,
    out: &mut impl std::io::Write,
) -> Result<(), SimError> {
    let sim = ExoscaleSim::start_with(config).await?;
    // These are the sim's own throw-away credentials; printing them is the point.
    let lines = [
        "# simulated Exoscale API v2; point the controller or doctor at it with:".to_string(),
        format!("EXOSCALE_API_ENDPOINT={}", sim.endpoint()),
        format!("EXOSCALE_API_KEY={}", sim.credentials().key),
        format!("EXOSCALE_API_SECRET={}", sim.credentials().secret.expose()),
        format!("EXOSCALE_ZONE={}", sim.zone()),
        format!("EXOSCALE_SKS_CLUSTER_ID={}", sim.cluster_id()),
    ];
    for line in lines {
        writeln!(out, "{line}").map_err(SimError::Serve)?;
    }
    out.flush().map_err(SimError::Serve)?;
    stop.await;
    sim.shutdown().await;
    Ok(())
}
