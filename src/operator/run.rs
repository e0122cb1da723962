//! Wiring of `karpenter-exoscale run`: servers, cluster state, leader election, controllers,
//! graceful shutdown. [`serve`] takes its cloud and clients injected (tests run two replicas
//! in one process against a simulated cloud); [`run`] builds the Exoscale ones from [`Config`].

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use tokio::sync::watch;

use crate::apis::ExoscaleNodeClass;
use crate::clock::{Clock, SystemClock};
use crate::cloudprovider::CloudProvider;
use crate::cloudprovider::exoscale::{
    Dependencies, ExoscaleCloudProvider, ExoscaleSettings as ProviderSettings, KubeNodeBootstrap,
    WatchedNodeClasses,
};
use crate::cloudprovider::metered::Metered;
use crate::cloudprovider::overlay::{OverlaySource, WithOverlays};
use crate::controllers::{self, Context, shutdown_signal};
use crate::exoscale;
use crate::providers::nodeclass_controller::{
    self, ExoscaleResolution, NodeClassWiring, Resolution,
};
use crate::state::{self, Cluster};

use super::config::{self, Config};
use super::events::{self, KubeEvents, QueuedEvents};
use super::fenced_client::fenced;
use super::health::{Readiness, bind_and_serve, health_router, metrics_router};
use super::leader::{Leadership, LeaseTimings, elect};
use super::metrics::{Metrics, labels};
use super::rate_limited_client::rate_limited;
use super::tasks::Tasks;
use super::timed_client::{RequestTimeouts, timed};
use crate::fence::Fence;

/// The User-Agent of every request to the Kubernetes API.
pub const KUBE_USER_AGENT: &str = concat!("karpenter-exoscale/", env!("CARGO_PKG_VERSION"));

#[derive(Debug, Error)]
pub enum RunError {
    #[error("cannot build a Kubernetes client: {0}")]
    Kube(String),
    #[error("cannot build the Exoscale client: {0}")]
    Exoscale(String),
    #[error("cannot load instance types from Exoscale: {0}")]
    InstanceTypes(String),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Leader(#[from] super::leader::LeaderError),
    #[error("cannot read the cluster identity (kube-system Namespace UID): {0}")]
    ClusterIdentity(String),
    #[error("{0}")]
    SksCluster(String),
    #[error("lost the leader Lease; exiting so a fresh replica can take over")]
    LostLeadership,
    #[error("the cluster-state metrics task stopped: {0}")]
    StateMetrics(String),
    #[error(transparent)]
    Controller(#[from] super::tasks::TaskError),
}

pub use crate::controllers::ExtraController;

/// Everything [`serve`] needs.
pub struct Runtime {
    pub config: Config,
    pub client: kube::Client,
    /// The client leader election renews the Lease with: outside `client`'s request budget
    /// (`KUBE_CLIENT_QPS`), so our own burst of requests cannot queue a renewal past the renew
    /// deadline and lose the Lease under load.
    pub lease_client: kube::Client,
    pub cloud: Arc<dyn CloudProvider>,
    /// The provider's NodeClass controller (resolution and NodeClass watch); `None` runs none.
    pub nodeclasses: Option<NodeClassWiring>,
    pub clock: Arc<dyn Clock>,
    /// Address the metrics and health servers bind to.
    pub bind_ip: IpAddr,
    pub extra_controllers: Vec<ExtraController>,
    /// Lease timings (tests shorten them).
    pub lease: LeaseTimings,
    /// What `/metrics` serves; tests keep a handle to read what a replica exported.
    pub metrics: Arc<Metrics>,
    /// The write fence the election drives. The cloud's clients must already check it (build
    /// them with [`Fence`]d clients); `serve` fences the kube client it hands to controllers.
    pub fence: Fence,
}

/// Builds the Exoscale cloud provider from the configuration and runs until `shutdown` turns
/// true (SIGTERM in `main`).
pub async fn run(
    config: Config,
    extra_controllers: Vec<ExtraController>,
    shutdown: watch::Receiver<bool>,
) -> Result<(), RunError> {
    let mut kube_config = kube::Config::infer()
        .await
        .map_err(|e| RunError::Kube(e.to_string()))?;
    // Reconcilers requeue on their own; client-side retries of 429 would hide a PDB refusing
    // an eviction for minutes.
    kube_config.default_retry = false;
    // Names us in the apiserver's audit log and request metrics (kube-client sends none).
    kube_config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(KUBE_USER_AGENT),
    ));
    let cluster_url = kube_config.cluster_url.to_string();
    let client =
        super::kube_connections::client(kube_config, super::kube_connections::MAX_IDLE_CONNECTIONS)
            .map_err(|e| RunError::Kube(e.to_string()))?;
    // No request waits forever on an API server that stopped answering (kube has no read
    // timeout); the elector bounds its renewals itself.
    let lease_client = client.clone();
    let client = timed(client, RequestTimeouts::default());
    let metrics = Arc::new(Metrics::new());
    // Every request, reads and writes alike, shares the KUBE_CLIENT_QPS/BURST budget; only
    // the Lease's renewals (one every retry period) stay outside it.
    let client = rate_limited(
        client,
        config.kube_client_qps,
        config.kube_client_burst,
        metrics.kube_client_rate_limit_wait.clone(),
    );
    let settings = &config.exoscale;
    let endpoint = exoscale::Endpoint::resolve(
        &settings.zone,
        settings.api_endpoint.as_deref(),
        settings.api_environment.as_deref(),
    )
    .map_err(|e| RunError::Exoscale(e.to_string()))?;
    let credentials =
        exoscale::Credentials::new(settings.api_key.expose(), settings.api_secret.expose());
    let exo_config = exoscale::ClientConfig {
        observer: exoscale::Observer(Some(metrics.clone())),
        rate_limit: Some(settings.api_rate_limit),
        ..exoscale::ClientConfig::new(endpoint, credentials)
    };
    let exo = exoscale::Client::new(exo_config).map_err(|e| RunError::Exoscale(e.to_string()))?;
    exo.check_zone(&settings.zone)
        .await
        .map_err(|e| RunError::Exoscale(e.to_string()))?;
    // Every write to Exoscale or the cluster passes this fence at send time.
    let fence = if config.disable_leader_election {
        Fence::open()
    } else {
        Fence::closed()
    };
    let exo = exo.fenced(fence.clone());
    let writer = fenced(client.clone(), fence.clone());

    check_sks_cluster(
        &exo,
        &settings.zone,
        &settings.sks_cluster_id.to_string(),
        settings.cluster_endpoint.as_deref(),
    )
    .await?;
    let cluster_uid = cluster_uid(&client).await?;
    tracing::info!(%cluster_uid, "cluster identity (kube-system Namespace UID) read");

    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let cloud = build_cloud(
        ProviderSettings {
            zone: settings.zone.clone(),
            cluster_id: settings.sks_cluster_id.to_string(),
            cluster_uid,
            instance_prefix: settings.instance_prefix.clone(),
            cluster_endpoint: settings.cluster_endpoint.clone().unwrap_or(cluster_url),
            cluster_domain: settings.cluster_domain.clone(),
            bootstrap_token_ttl: crate::providers::bootstrap_token::token_ttl(
                config.timings.launch_timeout,
                config.timings.registration_ttl,
            ),
        },
        exo,
        writer,
        clock.clone(),
    )
    .await?;
    let bind_ip = config.listen_address;
    let result = serve(
        Runtime {
            config,
            client,
            lease_client,
            cloud: cloud.provider.clone(),
            nodeclasses: Some(cloud.nodeclass_wiring()),
            clock,
            bind_ip,
            extra_controllers,
            lease: LeaseTimings::default(),
            metrics,
            fence,
        },
        shutdown,
    )
    .await;
    drop(cloud);
    result
}

/// The UID of the `kube-system` Namespace: the identity every instance we launch carries, and
/// the only proof garbage collection accepts that an instance is this cluster's.
pub async fn cluster_uid(client: &kube::Client) -> Result<String, RunError> {
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> =
        kube::Api::all(client.clone());
    let namespace = namespaces
        .get("kube-system")
        .await
        .map_err(|e| RunError::ClusterIdentity(e.to_string()))?;
    namespace
        .metadata
        .uid
        .filter(|uid| !uid.is_empty())
        .ok_or_else(|| RunError::ClusterIdentity("the kube-system Namespace has no UID".into()))
}

/// The SKS cluster `EXOSCALE_SKS_CLUSTER_ID` names must exist in the zone: a mistyped ID would
/// label our instances as another cluster's (or none). An endpoint that differs from
/// `CLUSTER_ENDPOINT` is worth a loud warning (nodes would join elsewhere), not a refusal:
/// private endpoints and proxies differ legitimately.
pub async fn check_sks_cluster(
    exo: &exoscale::Client,
    zone: &str,
    cluster_id: &str,
    cluster_endpoint: Option<&str>,
) -> Result<(), RunError> {
    let cluster = exo.get_sks_cluster(cluster_id).await.map_err(|e| {
        RunError::SksCluster(if e.is_not_found() {
            format!("EXOSCALE_SKS_CLUSTER_ID {cluster_id} names no SKS cluster in zone {zone}: {e}")
        } else {
            format!("cannot read SKS cluster {cluster_id}: {e}")
        })
    })?;
    if let (Some(configured), Some(actual)) = (cluster_endpoint, cluster.endpoint.as_deref())
        && !same_endpoint(configured, actual)
    {
        tracing::error!(
            sks_cluster = %cluster_id,
            sks_endpoint = %actual,
            cluster_endpoint = %configured,
            "CLUSTER_ENDPOINT differs from the SKS cluster's endpoint: check that EXOSCALE_SKS_CLUSTER_ID names THIS cluster (new nodes join CLUSTER_ENDPOINT)"
        );
    }
    Ok(())
}

/// Endpoints compared without scheme case, a trailing slash or the default https port.
pub fn same_endpoint(a: &str, b: &str) -> bool {
    fn norm(s: &str) -> String {
        let s = s.trim().trim_end_matches('/').to_ascii_lowercase();
        let s = s.strip_prefix("https://").unwrap_or(&s).to_string();
        s.strip_suffix(":443").unwrap_or(&s).to_string()
    }
    norm(a) == norm(b)
}

/// The Exoscale cloud provider with its background tasks (NodeClass store, instance-type
/// refresh); dropping it stops them.
pub struct ExoscaleCloud {
    pub provider: Arc<ExoscaleCloudProvider>,
    pub resolution: Arc<dyn Resolution>,
    nodeclasses: state::Shared<ExoscaleNodeClass>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl ExoscaleCloud {
    /// What the NodeClass controller needs: the resolution and the provider's NodeClass watch.
    pub fn nodeclass_wiring(&self) -> NodeClassWiring {
        NodeClassWiring {
            resolution: self.resolution.clone(),
            nodeclasses: self.nodeclasses.clone(),
        }
    }
}

impl Drop for ExoscaleCloud {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// A spawned task that is aborted when this is dropped (with the future that owns it).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Builds the Exoscale cloud provider: NodeClasses from a reflector store, tokens and CA from
/// the cluster, instance types loaded once and refreshed hourly.
pub async fn build_cloud(
    settings: ProviderSettings,
    exo: exoscale::Client,
    client: kube::Client,
    clock: Arc<dyn Clock>,
) -> Result<ExoscaleCloud, RunError> {
    let token_ttl = settings.bootstrap_token_ttl;
    // The one ExoscaleNodeClass watch: the provider reads its store, the NodeClass controller
    // is triggered by its changes.
    let (nodeclasses, mut nodeclass_feed_writer) = state::Shared::<ExoscaleNodeClass>::new();
    let reader = Arc::new(WatchedNodeClasses::new(nodeclasses.store()));
    let nodeclass_feed = tokio::spawn({
        let api = kube::Api::<ExoscaleNodeClass>::all(client.clone());
        let reader = reader.clone();
        state::watch_relisting(api, move |event| {
            if let Ok(event) = &event {
                nodeclass_feed_writer.publish(event);
            }
            // Current only once the store holds the completed list: a launch in between
            // would read the old copy as current.
            reader.follow(event.as_ref());
            if let Err(error) = event {
                tracing::warn!(%error, "ExoscaleNodeClass watch failed; NodeClasses are unsynced until re-listed")
            }
        })
    });
    let provider = Arc::new(ExoscaleCloudProvider::new(
        settings,
        Dependencies {
            client: exo,
            nodeclasses: reader,
            bootstrap: Arc::new(KubeNodeBootstrap::new(client.clone(), token_ttl)),
            versions: Arc::new(crate::providers::template::ApiServerVersion(client)),
            clock,
            prices: crate::providers::pricing::PriceBook::new(crate::catalogue::Currency::Eur),
        },
    ));
    if let Err(e) = provider.refresh_instance_types().await {
        nodeclass_feed.abort();
        return Err(RunError::InstanceTypes(e.to_string()));
    }
    let refresh = provider
        .instance_type_provider()
        .catalog()
        .clone()
        .spawn_refresh(Duration::from_secs(3600));
    let resolution: Arc<dyn Resolution> = Arc::new(ExoscaleResolution {
        groups: provider.nodeclass_resolver().clone(),
        templates: provider.templates().clone(),
    });
    Ok(ExoscaleCloud {
        provider,
        resolution,
        nodeclasses,
        tasks: vec![nodeclass_feed, refresh],
    })
}

/// Runs servers, cluster state, leader election and (while leading) every controller until
/// `shutdown` turns true. Losing the Lease ends with [`RunError::LostLeadership`].
pub async fn serve(runtime: Runtime, shutdown: watch::Receiver<bool>) -> Result<(), RunError> {
    let Runtime {
        config,
        client,
        lease_client,
        cloud,
        nodeclasses,
        clock,
        bind_ip,
        extra_controllers,
        lease,
        metrics,
        fence,
    } = runtime;
    let stop = shutdown_signal(shutdown.clone());
    let cluster = Cluster::with_clock(clock.clone());
    // Another Karpenter may share the cluster: only our NodeClass kinds are ours to act on.
    let served: Vec<(String, String)> = cloud
        .supported_node_classes()
        .into_iter()
        .map(|k| (k.group, k.kind))
        .collect();
    cluster.update(|index| index.set_managed_kinds(served));
    // The one watch of each kind: the cluster index and the Controllers share it.
    let feeds = state::feed(
        client.clone(),
        cluster.clone(),
        config.feature_gates.node_overlay,
    );
    let shared = feeds.shared.clone();
    // NodeOverlays act through the provider: provisioning, consolidation, drift all see them.
    let cloud: Arc<dyn CloudProvider> = if config.feature_gates.node_overlay {
        let source: OverlaySource = {
            let cluster = cluster.clone();
            Arc::new(move || cluster.read().overlays())
        };
        Arc::new(WithOverlays::new(cloud, source))
    } else {
        cloud
    };
    let cloud: Arc<dyn CloudProvider> = Arc::new(Metered::new(cloud, metrics.clone()));

    let readiness = Readiness::default().with_check("cluster-state", {
        let cluster = cluster.clone();
        move || {
            if cluster.synced() {
                Ok(())
            } else {
                Err("cluster state not synced".into())
            }
        }
    });
    let metrics_addr = SocketAddr::new(bind_ip, config.metrics_port);
    let health_addr = SocketAddr::new(bind_ip, config.health_probe_port);
    let metrics_server =
        bind_and_serve(metrics_addr, metrics_router(metrics.clone()), stop.clone())
            .await
            .map_err(|source| RunError::Listen {
                addr: metrics_addr,
                source,
            })?;
    let health_server = bind_and_serve(health_addr, health_router(readiness), stop.clone())
        .await
        .map_err(|source| RunError::Listen {
            addr: health_addr,
            source,
        })?;

    let (election, mut leadership) = if config.disable_leader_election {
        fence.open_forever();
        (None, Leadership::always())
    } else {
        let namespace = if config.leader_election_namespace.is_empty() {
            client.default_namespace().to_string()
        } else {
            config.leader_election_namespace.clone()
        };
        let election = elect(
            lease_client,
            &namespace,
            &config.leader_election_name,
            &config.identity,
            lease,
            fence.clone(),
        )
        .await?;
        let leadership = election.leadership.clone();
        (Some(election), leadership)
    };

    // Every write goes through the fence, which is open only while this replica leads.
    let writer = fenced(client.clone(), fence.clone());
    // Queued: no reconcile, provisioning round or watch consumer waits on an event write.
    let events = Arc::new(QueuedEvents::spawn(
        Arc::new(KubeEvents::new(
            writer.clone(),
            Some(config.identity.clone()),
        )),
        events::QUEUE_CAPACITY,
    ));
    // Cache health on every replica; node and pod series only while leading. Its own task: its
    // refreshes (synchronous passes over the whole index) and the transitions it counts on
    // every watched change ran inside the task that polls every Controller, each wake-up of
    // either polling all of them. Aborted with `serve`: it holds a Leadership receiver, and a
    // task outliving an aborted `serve` would keep the Lease watcher from releasing (and so
    // renewing) the Lease forever.
    let mut state_metrics = AbortOnDrop(tokio::spawn(controllers::metrics::run(
        cluster.clone(),
        shared.clone(),
        metrics.clone(),
        events.clone(),
        clock.clone(),
        leadership.clone(),
        controllers::metrics::Options {
            pod_series: config.pod_metrics,
            observability: !config.disable_cluster_state_observability,
        },
    )));
    // Outside `work`, so that every exit, `work` dropped included, stops them before the
    // Lease is released.
    let mut tasks = Tasks::default();
    // 0 until this replica leads: a standby exports the series too, so a sum over replicas
    // reads 0 (not "no data", on which an alert never fires) while nobody leads.
    let leader_gauge = metrics
        .leader
        .get_or_create(&labels([("identity", &config.identity)]))
        .clone();
    leader_gauge.set(0.0);
    let work = async {
        let mut waiting = leadership.clone();
        let mut stop_wait = stop.clone();
        tokio::select! {
            _ = waiting.acquired() => {
                tracing::info!(identity = %config.identity, "acquired leadership; starting controllers");
                leader_gauge.set(1.0);
                let ctx = Arc::new(Context {
                    client: writer.clone(),
                    cluster: cluster.clone(),
                    cloud,
                    events: events.clone(),
                    metrics: metrics.clone(),
                    clock,
                    timings: config.timings.clone(),
                    feature_gates: config.feature_gates.clone(),
                    leadership: leadership.clone(),
                    registration_health: Default::default(),
                    cost: Default::default(),
                    shared,
                    reconcile_concurrency: config::reconcile_concurrency(config.cpu_requests),
                    recent_launches: Default::default(),
                    node_arrivals: Default::default(),
                    nodepool_status_writes: Default::default(),
                    superseded: Default::default(),
                    lost_creates: Default::default(),
                });
                let nodeclass_changes = nodeclasses.as_ref().map(|w| {
                    use futures::StreamExt;
                    w.nodeclasses
                        .changes()
                        .map(|class| nodeclass_controller::reference_to(&class))
                        .boxed()
                });
                controllers::spawn(ctx.clone(), nodeclass_changes, stop.clone(), &mut tasks);
                // The provider's own controller, beside the core's.
                if let Some(wiring) = nodeclasses {
                    tasks.spawn("nodeclass", nodeclass_controller::run(ctx.clone(), wiring, stop.clone()));
                }
                for extra in extra_controllers {
                    tasks.spawn(extra.name, (extra.start)(ctx.clone(), stop.clone()));
                }
                tokio::select! {
                    // A task ending before shutdown stops the replica: its work would stop
                    // while the replica goes on holding the Lease.
                    ended = tasks.until_all_end(|| stop.peek().is_some()) => ended.map_err(RunError::Controller),
                    _ = leadership.lost() => {
                        tracing::error!("lost leadership");
                        Err(RunError::LostLeadership)
                    }
                }
            }
            _ = &mut stop_wait => Ok(()),
        }
    };
    let result = tokio::select! {
        result = work => result,
        // Never ends but by a panic, which stops the replica as it did when not spawned.
        ended = &mut state_metrics.0 => Err(RunError::StateMetrics(match ended {
            Err(error) => error.to_string(),
            Ok(()) => "ended".into(),
        })),
    };
    // Before the Lease is released: no controller acts past this point.
    tasks.stop().await;
    drop(state_metrics);
    drop(leadership);
    if let Some(election) = election {
        election.release().await;
    }
    for feed in feeds.tasks {
        feed.abort();
    }
    metrics_server.abort();
    health_server.abort();
    tracing::info!("stopped");
    result
}

/// `karpenter-exoscale run`: validates configuration (every problem at once, exit 2), then
/// runs until SIGTERM/SIGINT; exits 1 on failure or lost leadership.
pub fn main(args: &super::config::RunArgs) -> std::process::ExitCode {
    use std::process::ExitCode;
    let config = match Config::from_process(args) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("{error}");
            return ExitCode::from(2);
        }
    };
    // ring is the only TLS backend (kube and reqwest both use rustls).
    let _ = rustls::crypto::ring::default_provider().install_default();
    super::logging::init(config.log_level, config.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(error) => {
            eprintln!("cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let (tx, rx) = watch::channel(false);
        tokio::spawn(async move {
            wait_for_signal().await;
            tracing::info!("shutdown requested");
            let _ = tx.send(true);
        });
        tracing::info!(version = env!("CARGO_PKG_VERSION"), identity = %config.identity, "starting operator");
        for notice in config.feature_gates.notices() {
            tracing::warn!("{notice}");
        }
        let controllers = core_controllers(&config);
        match run(config, controllers, rx).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                tracing::error!(%error, "operator failed");
                ExitCode::FAILURE
            }
        }
    })
}

/// The core controllers that plug in beside the built-in ones: provisioning and disruption,
/// sharing node nominations (a node just nominated for pods is not disrupted).
pub fn core_controllers(config: &Config) -> Vec<ExtraController> {
    let nominations = Arc::new(crate::provisioning::controller::Nominations::default());
    vec![
        crate::provisioning::plugin(crate::provisioning::settings(config), nominations.clone()),
        crate::controllers::disruption::plugin(disruption_settings(config), nominations),
    ]
}

/// Disruption paces itself as upstream and simulates scheduling with the provisioner's policies.
pub fn disruption_settings(config: &Config) -> crate::controllers::disruption::Settings {
    crate::controllers::disruption::Settings {
        preference_policy: config.preference_policy,
        min_values_policy: config.min_values_policy,
        default_topology_spread: config.default_topology_spread.clone(),
        ignore_dra_requests: config.ignore_dra_requests,
        ..crate::controllers::disruption::Settings::default()
    }
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::config::RunArgs;
    use crate::scheduling::{MinValuesPolicy, PreferencePolicy};

    fn config(env: &[(&str, &str)]) -> Config {
        let mut vars: std::collections::BTreeMap<String, String> = [
            ("EXOSCALE_API_KEY", "k"),
            ("EXOSCALE_API_SECRET", "s"),
            ("EXOSCALE_ZONE", "ch-gva-2"),
            (
                "EXOSCALE_SKS_CLUSTER_ID",
                "5f0c9a58-1b8c-4a5e-9a43-3b1c1f2b6d11",
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        vars.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        Config::resolve(&RunArgs::default(), &vars).expect("valid configuration")
    }

    #[test]
    fn the_operator_runs_provisioning_and_disruption() {
        assert_eq!(core_controllers(&config(&[])).len(), 2);
    }

    #[test]
    fn disruption_simulates_with_the_configured_scheduling_policies() {
        let settings = disruption_settings(&config(&[
            ("PREFERENCE_POLICY", "Ignore"),
            ("MIN_VALUES_POLICY", "BestEffort"),
            ("IGNORE_DRA_REQUESTS", "false"),
        ]));
        assert_eq!(settings.preference_policy, PreferencePolicy::Ignore);
        assert_eq!(settings.min_values_policy, MinValuesPolicy::BestEffort);
        assert!(!settings.ignore_dra_requests);
        assert!(disruption_settings(&config(&[])).ignore_dra_requests);
    }

    #[test]
    fn provisioning_follows_ignore_dra_requests() {
        let settings = |env: &[(&str, &str)]| crate::provisioning::settings(&config(env));
        assert!(settings(&[]).ignore_dra_requests, "upstream's default");
        assert!(!settings(&[("IGNORE_DRA_REQUESTS", "false")]).ignore_dra_requests);
    }
}
