//! Run-time configuration: command-line flags win over environment variables, which win over
//! defaults (upstream Karpenter's rule). Every missing or invalid value is collected and reported
//! in one error so an operator fixes a Deployment in one round trip.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use clap::Args;
use thiserror::Error;

/// Every invalid or missing setting, one per line.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("invalid configuration:\n  {}", .0.join("\n  "))]
pub struct ConfigError(pub Vec<String>);

/// A secret string: never printed by `Debug` or `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }
    /// The secret value, for the one place that needs it (request signing).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Json,
    Text,
}

/// Log verbosity (upstream accepts debug, info, error; we also take warn).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
}

impl LogLevel {
    pub fn as_filter(self) -> &'static str {
        match self {
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
        }
    }
}

/// The scheduler's own policy types: configuration parses straight into them.
pub use crate::scheduling::{MinValuesPolicy, PreferencePolicy};

/// Upstream feature gates. Unknown names are ignored (as upstream does: an older or newer gate
/// list must not stop a switch-over) and reported by [`FeatureGates::notices`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeatureGates {
    pub node_repair: bool,
    pub reserved_capacity: bool,
    pub spot_to_spot_consolidation: bool,
    pub node_overlay: bool,
    pub static_capacity: bool,
    pub capacity_buffer: bool,
    /// Gate names this version does not know, in the order given.
    pub unknown: Vec<String>,
    /// Known gate names the operator set (a default is not worth a start-up warning).
    pub named: Vec<String>,
}

impl Default for FeatureGates {
    fn default() -> Self {
        FeatureGates {
            node_repair: false,
            reserved_capacity: true,
            spot_to_spot_consolidation: false,
            node_overlay: false,
            static_capacity: false,
            capacity_buffer: false,
            unknown: Vec::new(),
            named: Vec::new(),
        }
    }
}

/// Go's `strconv.ParseBool`, which upstream reads feature gates with: `True`, `1` and `t` are
/// as good as `true` there, so a setting written for upstream means the same here.
fn go_parse_bool(value: &str) -> Option<bool> {
    // Go takes each word all lowercase, all uppercase or capitalised, nothing else.
    let rest = value.get(1..).unwrap_or_default();
    let one_case = value == value.to_ascii_lowercase()
        || value == value.to_ascii_uppercase()
        || rest == rest.to_ascii_lowercase();
    match value.to_ascii_lowercase().as_str() {
        "1" | "t" => Some(true),
        "0" | "f" => Some(false),
        "true" if one_case => Some(true),
        "false" if one_case => Some(false),
        _ => None,
    }
}

impl FeatureGates {
    /// Parses `Name=bool,Name=bool` over the defaults.
    pub fn parse(value: &str) -> Result<Self, String> {
        let mut gates = FeatureGates::default();
        for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((name, enabled)) = part.split_once('=') else {
                return Err(format!("feature gate {part:?} must look like Name=true"));
            };
            let enabled = go_parse_bool(enabled.trim())
                .ok_or_else(|| format!("feature gate {name}: {enabled:?} is not true or false"))?;
            let slot = match name.trim() {
                "NodeRepair" => &mut gates.node_repair,
                "ReservedCapacity" => &mut gates.reserved_capacity,
                "SpotToSpotConsolidation" => &mut gates.spot_to_spot_consolidation,
                "NodeOverlay" => &mut gates.node_overlay,
                "StaticCapacity" => &mut gates.static_capacity,
                "CapacityBuffer" => &mut gates.capacity_buffer,
                other => {
                    gates.unknown.push(other.to_string());
                    continue;
                }
            };
            *slot = enabled;
            gates.named.push(name.trim().to_string());
        }
        Ok(gates)
    }

    /// What start-up logs about the gates: unknown names (ignored) and gates the operator
    /// enabled that change nothing on Exoscale or in this version (`ReservedCapacity` is on by
    /// default, as upstream's, and only warned about when set).
    pub fn notices(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .unknown
            .iter()
            .map(|name| format!("feature gate {name:?} is unknown to this version and ignored"))
            .collect();
        let no_effect = [
            (
                self.spot_to_spot_consolidation,
                "SpotToSpotConsolidation",
                "Exoscale has no spot capacity",
            ),
            (
                self.reserved_capacity,
                "ReservedCapacity",
                "Exoscale has no capacity reservations",
            ),
            (
                self.capacity_buffer,
                "CapacityBuffer",
                "capacity buffers are not implemented",
            ),
        ];
        for (enabled, name, why) in no_effect {
            if enabled && self.named.iter().any(|n| n == name) {
                out.push(format!("feature gate {name}=true has no effect: {why}"));
            }
        }
        out
    }
}

/// Exoscale provider settings (same variable names as the Go provider).
#[derive(Clone, Debug, PartialEq)]
pub struct ExoscaleSettings {
    pub api_key: Secret,
    pub api_secret: Secret,
    pub zone: String,
    pub sks_cluster_id: uuid::Uuid,
    pub instance_prefix: String,
    pub cluster_domain: String,
    /// API server URL written into user data; the kube client's URL when unset.
    pub cluster_endpoint: Option<String>,
    pub api_endpoint: Option<String>,
    pub api_environment: Option<String>,
    /// The client's token bucket (`EXOSCALE_API_QPS`/`EXOSCALE_API_BURST`). Exoscale documents
    /// no numbers; the default keeps a burst of launches well clear of a 429.
    pub api_rate_limit: crate::exoscale::RateLimit,
}

/// Lifecycle timings; configurable so tests need not wait upstream's 15 minutes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Timings {
    /// A launched NodeClaim whose Node has not registered by then is replaced (upstream 15 min).
    pub registration_ttl: Duration,
    /// A NodeClaim whose Create keeps failing is deleted after this (upstream 5 min).
    pub launch_timeout: Duration,
    /// An instance of our cluster without a NodeClaim for this long is deleted.
    pub instance_gc_grace_period: Duration,
    /// How often instance garbage collection runs.
    pub instance_gc_interval: Duration,
    /// How often NodeClasses are re-resolved.
    pub nodeclass_recheck_interval: Duration,
    /// How often each NodePool is reconciled without a change (no setting: tests lengthen it
    /// to show that a change wakes it).
    pub nodepool_resync: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Timings {
            registration_ttl: Duration::from_secs(15 * 60),
            launch_timeout: Duration::from_secs(5 * 60),
            instance_gc_grace_period: Duration::from_secs(10 * 60),
            instance_gc_interval: Duration::from_secs(2 * 60),
            nodeclass_recheck_interval: Duration::from_secs(5 * 60),
            nodepool_resync: Duration::from_secs(30),
        }
    }
}

/// Reconciles each controller runs at once, from `CPU_REQUESTS` (millicores): 100 per core
/// (rounded up), between 100 and 1 000. Reconciles mostly wait on the API server, so a core
/// serves many; the kube client's QPS budget bounds the calls they make together.
pub fn reconcile_concurrency(cpu_requests_millis: u32) -> u16 {
    let cores = cpu_requests_millis.div_ceil(1000).max(1);
    cores.saturating_mul(100).clamp(100, 1000) as u16
}

/// Everything `karpenter-exoscale run` needs, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub exoscale: ExoscaleSettings,
    pub karpenter_service: String,
    pub metrics_port: u16,
    pub health_probe_port: u16,
    /// The address metrics and health listen on (`0.0.0.0`; `::` for IPv6 clusters,
    /// `127.0.0.1` for a sandbox on a shared machine).
    pub listen_address: std::net::IpAddr,
    pub kube_client_qps: f32,
    pub kube_client_burst: u32,
    pub disable_leader_election: bool,
    pub disable_cluster_state_observability: bool,
    /// `POD_METRICS`: the pod gauges aggregated (default) or one series per pod, as upstream.
    pub pod_metrics: crate::controllers::metrics::PodSeries,
    pub leader_election_name: String,
    /// Empty means the namespace of the kube client (in-cluster: the pod's namespace).
    pub leader_election_namespace: String,
    pub cpu_requests: u32,
    pub log_level: LogLevel,
    pub log_format: LogFormat,
    pub batch_max_duration: Duration,
    pub batch_idle_duration: Duration,
    pub preference_policy: PreferencePolicy,
    pub min_values_policy: MinValuesPolicy,
    /// `SCHEDULER_CONFIG`: topology spread given to pods that declare none.
    pub default_topology_spread: Vec<crate::scheduling::TopologySpreadConstraint>,
    pub ignore_dra_requests: bool,
    pub feature_gates: FeatureGates,
    pub timings: Timings,
    /// Identity of this replica in the Lease (pod name, or hostname + random suffix).
    pub identity: String,
}

/// Flags of `karpenter-exoscale run`; each has an environment variable of the same name in
/// SCREAMING_SNAKE_CASE. Values are kept raw here and validated together in [`Config::resolve`].
#[derive(Args, Clone, Debug, Default)]
pub struct RunArgs {
    #[arg(long)]
    pub exoscale_zone: Option<String>,
    #[arg(long)]
    pub exoscale_sks_cluster_id: Option<String>,
    #[arg(long)]
    pub exoscale_compute_instance_prefix: Option<String>,
    #[arg(long)]
    pub cluster_domain: Option<String>,
    #[arg(long)]
    pub cluster_endpoint: Option<String>,
    #[arg(long)]
    pub exoscale_api_endpoint: Option<String>,
    #[arg(long)]
    pub exoscale_api_environment: Option<String>,
    #[arg(long)]
    pub exoscale_api_qps: Option<String>,
    #[arg(long)]
    pub exoscale_api_burst: Option<String>,
    #[arg(long)]
    pub karpenter_service: Option<String>,
    #[arg(long)]
    pub metrics_port: Option<String>,
    #[arg(long)]
    pub health_probe_port: Option<String>,
    #[arg(long)]
    pub listen_address: Option<String>,
    #[arg(long)]
    pub kube_client_qps: Option<String>,
    #[arg(long)]
    pub kube_client_burst: Option<String>,
    #[arg(long)]
    pub disable_leader_election: Option<String>,
    #[arg(long)]
    pub disable_cluster_state_observability: Option<String>,
    #[arg(long)]
    pub pod_metrics: Option<String>,
    #[arg(long)]
    pub leader_election_name: Option<String>,
    #[arg(long)]
    pub leader_election_namespace: Option<String>,
    #[arg(long)]
    pub cpu_requests: Option<String>,
    #[arg(long)]
    pub log_level: Option<String>,
    #[arg(long)]
    pub log_format: Option<String>,
    #[arg(long)]
    pub batch_max_duration: Option<String>,
    #[arg(long)]
    pub batch_idle_duration: Option<String>,
    #[arg(long)]
    pub preference_policy: Option<String>,
    #[arg(long)]
    pub min_values_policy: Option<String>,
    #[arg(long)]
    pub scheduler_config: Option<String>,
    #[arg(long)]
    pub ignore_dra_requests: Option<String>,
    #[arg(long)]
    pub feature_gates: Option<String>,
    #[arg(long)]
    pub nodeclaim_registration_ttl: Option<String>,
    #[arg(long)]
    pub nodeclaim_launch_timeout: Option<String>,
    #[arg(long)]
    pub instance_gc_grace_period: Option<String>,
    #[arg(long)]
    pub instance_gc_interval: Option<String>,
    #[arg(long)]
    pub nodeclass_recheck_interval: Option<String>,
}

/// Reads flag > env > default, remembering every failure.
struct Resolver<'a> {
    env: &'a BTreeMap<String, String>,
    errors: Vec<String>,
}

impl Resolver<'_> {
    /// The raw value: the flag if given, else the env var; empty strings count as unset.
    fn raw(&self, flag: &Option<String>, env: &str) -> Option<String> {
        flag.clone()
            .or_else(|| self.env.get(env).cloned())
            .filter(|v| !v.is_empty())
    }

    fn required(&mut self, flag: &Option<String>, env: &str) -> String {
        self.raw(flag, env).unwrap_or_else(|| {
            self.errors
                .push(format!("{env} environment variable is required"));
            String::new()
        })
    }

    fn parsed<T>(
        &mut self,
        flag: &Option<String>,
        env: &str,
        default: T,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> T {
        match self.raw(flag, env) {
            None => default,
            Some(raw) => parse(&raw).unwrap_or_else(|reason| {
                self.errors.push(format!("{env}={raw:?}: {reason}"));
                default
            }),
        }
    }
}

/// Boolean settings read as upstream reads them (Go's `strconv.ParseBool`), so `True` set for
/// upstream means the same here; anything else is refused rather than (as upstream) silently
/// read as the default.
fn parse_bool(v: &str) -> Result<bool, String> {
    go_parse_bool(v)
        .ok_or_else(|| "expected true or false (Go's spellings: 1, t, True, TRUE…)".into())
}

fn parse_port(v: &str) -> Result<u16, String> {
    v.parse::<u16>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| "expected a port number 1-65535".into())
}

/// The accepted values of a duration setting, both ends included. Every duration setting has
/// an upper bound: the controllers add them to instants and double them, and a value far past
/// any sensible one is a typo, not an intent.
#[derive(Clone, Copy, Debug)]
struct DurationRange {
    min: Duration,
    max: Duration,
}

impl DurationRange {
    const fn new(min: Duration, max: Duration) -> Self {
        DurationRange { min, max }
    }

    /// A duration too long to represent is out of range like any other beyond `max`.
    fn parse(self, value: &str) -> Result<Duration, String> {
        let out_of_range = || {
            format!(
                "expected a duration from {} to {}",
                format_go_duration(self.min),
                format_go_duration(self.max)
            )
        };
        match go_duration(value) {
            Ok(d) if (self.min..=self.max).contains(&d) => Ok(d),
            Ok(_) | Err(GoDurationError::TooLong) => Err(out_of_range()),
            Err(e @ GoDurationError::Invalid) => Err(e.to_string()),
        }
    }
}

const MINUTE: u64 = 60;
const HOUR: u64 = 60 * MINUTE;

/// A bootstrap token lives TTL + launch timeout + 2 min, so this caps it at about 3 h; a node that takes longer
/// than that to join is broken. An Exoscale VM needs a minute or two to boot and join: a
/// shorter TTL (`15s` typed for `15m`) would delete every NodeClaim before it registers, and
/// launch it again, for good.
const REGISTRATION_TTL_RANGE: DurationRange = DurationRange::new(
    Duration::from_secs(3 * MINUTE),
    Duration::from_secs(2 * HOUR),
);
/// Creates queue behind the API's rate limit and a lookup after an unknown outcome waits up to
/// a minute: a shorter timeout gives launches up that would have succeeded.
const LAUNCH_TIMEOUT_RANGE: DurationRange =
    DurationRange::new(Duration::from_secs(2 * MINUTE), Duration::from_secs(HOUR));
/// Against a simulated cloud on this machine (the e2e tests, a sandbox), where a VM "boots" in
/// milliseconds, the lifecycle timings may be as short as this.
const SIMULATED_CLOUD_MIN: Duration = Duration::from_secs(10);

impl DurationRange {
    /// This range, with its minimum lowered to [`SIMULATED_CLOUD_MIN`] against a simulated
    /// cloud.
    fn for_cloud(self, simulated: bool) -> Self {
        if simulated {
            DurationRange::new(self.min.min(SIMULATED_CLOUD_MIN), self.max)
        } else {
            self
        }
    }
}
const INSTANCE_GC_GRACE_PERIOD_RANGE: DurationRange =
    DurationRange::new(Duration::from_secs(1), Duration::from_secs(24 * HOUR));
const INSTANCE_GC_INTERVAL_RANGE: DurationRange =
    DurationRange::new(Duration::from_secs(1), Duration::from_secs(HOUR));
const NODECLASS_RECHECK_INTERVAL_RANGE: DurationRange =
    DurationRange::new(Duration::from_secs(1), Duration::from_secs(24 * HOUR));
/// Pending pods wait up to a batch, and a nomination lasts two: an hour is already absurd.
const BATCH_DURATION_RANGE: DurationRange =
    DurationRange::new(Duration::from_millis(1), Duration::from_secs(HOUR));

/// Formats a range bound the way it is written (`10s`, `2h`, `1ms`).
fn format_go_duration(d: Duration) -> String {
    let secs = d.as_secs();
    match (secs, d.subsec_nanos()) {
        (0, nanos) if nanos % 1_000_000 == 0 => format!("{}ms", nanos / 1_000_000),
        (0, nanos) => format!("{nanos}ns"),
        (secs, 0) if secs % HOUR == 0 => format!("{}h", secs / HOUR),
        (secs, 0) if secs % MINUTE == 0 => format!("{}m", secs / MINUTE),
        (secs, 0) => format!("{secs}s"),
        _ => format!("{d:?}"),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GoDurationError {
    Invalid,
    TooLong,
}

impl fmt::Display for GoDurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GoDurationError::Invalid => "expected a duration like 500ms, 10s, 1m30s",
            GoDurationError::TooLong => "duration is too long",
        })
    }
}

/// Parses Go duration syntax (`500ms`, `10s`, `1m30s`, `2h`); a total beyond `Duration`'s
/// range is an error, not a panic.
pub fn parse_go_duration(value: &str) -> Result<Duration, String> {
    go_duration(value).map_err(|e| e.to_string())
}

fn go_duration(value: &str) -> Result<Duration, GoDurationError> {
    let invalid = || GoDurationError::Invalid;
    let too_long = || GoDurationError::TooLong;
    if value.is_empty() {
        return Err(invalid());
    }
    let mut rest = value;
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(invalid)?;
        if digits == 0 {
            return Err(invalid());
        }
        let number: f64 = rest[..digits].parse().map_err(|_| invalid())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds_per_unit = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(invalid()),
        };
        let part =
            Duration::try_from_secs_f64(number * seconds_per_unit).map_err(|_| too_long())?;
        total = total.checked_add(part).ok_or_else(too_long)?;
        rest = &rest[unit_len..];
    }
    Ok(total)
}

impl Config {
    /// Builds the configuration from flags and an environment snapshot.
    pub fn resolve(args: &RunArgs, env: &BTreeMap<String, String>) -> Result<Config, ConfigError> {
        let mut r = Resolver {
            env,
            errors: Vec::new(),
        };
        let none = None;
        let api_key = r.required(&none, "EXOSCALE_API_KEY");
        let api_secret = r.required(&none, "EXOSCALE_API_SECRET");
        let zone = r.required(&args.exoscale_zone, "EXOSCALE_ZONE");
        let cluster_id_raw = r.required(&args.exoscale_sks_cluster_id, "EXOSCALE_SKS_CLUSTER_ID");
        let sks_cluster_id = if cluster_id_raw.is_empty() {
            uuid::Uuid::nil()
        } else {
            uuid::Uuid::parse_str(&cluster_id_raw).unwrap_or_else(|_| {
                r.errors.push(
                    "EXOSCALE_SKS_CLUSTER_ID environment variable is not a valid UUID".into(),
                );
                uuid::Uuid::nil()
            })
        };
        let api_environment = r.raw(&args.exoscale_api_environment, "EXOSCALE_API_ENVIRONMENT");
        let api_endpoint = r.raw(&args.exoscale_api_endpoint, "EXOSCALE_API_ENDPOINT");
        let endpoint = if zone.is_empty() {
            None
        } else {
            crate::exoscale::Endpoint::resolve(
                &zone,
                api_endpoint.as_deref(),
                api_environment.as_deref(),
            )
            .map_err(|e| r.errors.push(e.to_string()))
            .ok()
        };
        // Only a simulated cloud is on a loopback address: lifecycle timings shorter than a
        // real VM needs are accepted only there.
        let simulated = endpoint
            .as_ref()
            .is_some_and(crate::exoscale::Endpoint::is_loopback);
        let cluster_endpoint = r.raw(&args.cluster_endpoint, "CLUSTER_ENDPOINT");
        if let Some(endpoint) = &cluster_endpoint {
            // Nodes send their bootstrap token to it: https only.
            match url::Url::parse(endpoint) {
                Err(_) => r
                    .errors
                    .push(format!("CLUSTER_ENDPOINT={endpoint:?}: not a URL")),
                Ok(url) if url.scheme() != "https" => r.errors.push(format!(
                    "CLUSTER_ENDPOINT={endpoint:?}: must be an https URL (nodes send their bootstrap token to it)"
                )),
                Ok(_) => {}
            }
        }
        let exoscale = ExoscaleSettings {
            api_key: Secret::new(api_key),
            api_secret: Secret::new(api_secret),
            zone,
            sks_cluster_id,
            instance_prefix: r
                .raw(
                    &args.exoscale_compute_instance_prefix,
                    "EXOSCALE_COMPUTE_INSTANCE_PREFIX",
                )
                .unwrap_or_default(),
            cluster_domain: r
                .raw(&args.cluster_domain, "CLUSTER_DOMAIN")
                .unwrap_or_else(|| "cluster.local".into()),
            cluster_endpoint,
            api_endpoint,
            api_environment,
            api_rate_limit: crate::exoscale::RateLimit {
                per_second: r.parsed(
                    &args.exoscale_api_qps,
                    "EXOSCALE_API_QPS",
                    crate::exoscale::RateLimit::default().per_second,
                    |v| {
                        v.parse::<f64>()
                            .ok()
                            .filter(|q| q.is_finite() && *q > 0.0 && *q <= 10_000.0)
                            .ok_or_else(|| {
                                "expected a number of requests per second, 0 < QPS <= 10000".into()
                            })
                    },
                ),
                burst: r.parsed(
                    &args.exoscale_api_burst,
                    "EXOSCALE_API_BURST",
                    crate::exoscale::RateLimit::default().burst,
                    |v| {
                        v.parse::<u32>()
                            .ok()
                            .filter(|b| (1..=10_000).contains(b))
                            .ok_or_else(|| "expected a whole number 1-10000".into())
                    },
                ),
            },
        };

        let defaults = Timings::default();
        let timings = Timings {
            registration_ttl: r.parsed(
                &args.nodeclaim_registration_ttl,
                "NODECLAIM_REGISTRATION_TTL",
                defaults.registration_ttl,
                |v| REGISTRATION_TTL_RANGE.for_cloud(simulated).parse(v),
            ),
            launch_timeout: r.parsed(
                &args.nodeclaim_launch_timeout,
                "NODECLAIM_LAUNCH_TIMEOUT",
                defaults.launch_timeout,
                |v| LAUNCH_TIMEOUT_RANGE.for_cloud(simulated).parse(v),
            ),
            instance_gc_grace_period: r.parsed(
                &args.instance_gc_grace_period,
                "INSTANCE_GC_GRACE_PERIOD",
                defaults.instance_gc_grace_period,
                |v| INSTANCE_GC_GRACE_PERIOD_RANGE.parse(v),
            ),
            instance_gc_interval: r.parsed(
                &args.instance_gc_interval,
                "INSTANCE_GC_INTERVAL",
                defaults.instance_gc_interval,
                |v| INSTANCE_GC_INTERVAL_RANGE.parse(v),
            ),
            nodeclass_recheck_interval: r.parsed(
                &args.nodeclass_recheck_interval,
                "NODECLASS_RECHECK_INTERVAL",
                defaults.nodeclass_recheck_interval,
                |v| NODECLASS_RECHECK_INTERVAL_RANGE.parse(v),
            ),
            nodepool_resync: defaults.nodepool_resync,
        };

        let metrics_port = r.parsed(&args.metrics_port, "METRICS_PORT", 8080, parse_port);
        let health_probe_port = r.parsed(
            &args.health_probe_port,
            "HEALTH_PROBE_PORT",
            8081,
            parse_port,
        );
        if metrics_port == health_probe_port {
            r.errors.push(format!(
                "METRICS_PORT and HEALTH_PROBE_PORT must differ (both {metrics_port})"
            ));
        }
        let listen_address = r.parsed(
            &args.listen_address,
            "LISTEN_ADDRESS",
            std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            |v| {
                v.parse::<std::net::IpAddr>()
                    .map_err(|_| "expected an IP address such as 0.0.0.0, :: or 127.0.0.1".into())
            },
        );
        let config = Config {
            exoscale,
            listen_address,
            karpenter_service: r
                .raw(&args.karpenter_service, "KARPENTER_SERVICE")
                .unwrap_or_default(),
            metrics_port,
            health_probe_port,
            kube_client_qps: r.parsed(&args.kube_client_qps, "KUBE_CLIENT_QPS", 200.0, |v| {
                // "inf" and "NaN" parse as f32; neither is a rate the token bucket can use.
                v.parse::<f32>()
                    .ok()
                    .filter(|q| q.is_finite() && *q > 0.0)
                    .ok_or_else(|| "expected a finite positive number".into())
            }),
            kube_client_burst: r.parsed(&args.kube_client_burst, "KUBE_CLIENT_BURST", 300, |v| {
                v.parse::<u32>()
                    .ok()
                    .filter(|b| *b > 0)
                    .ok_or_else(|| "expected a positive integer".into())
            }),
            disable_leader_election: r.parsed(
                &args.disable_leader_election,
                "DISABLE_LEADER_ELECTION",
                false,
                parse_bool,
            ),
            disable_cluster_state_observability: r.parsed(
                &args.disable_cluster_state_observability,
                "DISABLE_CLUSTER_STATE_OBSERVABILITY",
                false,
                parse_bool,
            ),
            pod_metrics: r.parsed(
                &args.pod_metrics,
                "POD_METRICS",
                crate::controllers::metrics::PodSeries::Aggregated,
                |v| match v {
                    "aggregated" => Ok(crate::controllers::metrics::PodSeries::Aggregated),
                    "per-pod" => Ok(crate::controllers::metrics::PodSeries::PerPod),
                    _ => Err("expected aggregated or per-pod".into()),
                },
            ),
            leader_election_name: r
                .raw(&args.leader_election_name, "LEADER_ELECTION_NAME")
                .unwrap_or_else(|| "karpenter-leader-election".into()),
            leader_election_namespace: r
                .raw(&args.leader_election_namespace, "LEADER_ELECTION_NAMESPACE")
                .unwrap_or_default(),
            cpu_requests: r.parsed(&args.cpu_requests, "CPU_REQUESTS", 1000, |v| {
                // Upstream: values <= 0 mean the default.
                v.parse::<i64>()
                    .map(|n| {
                        if n <= 0 {
                            1000
                        } else {
                            n.min(u32::MAX as i64) as u32
                        }
                    })
                    .map_err(|_| "expected millicores as an integer".into())
            }),
            log_level: r.parsed(&args.log_level, "LOG_LEVEL", LogLevel::Info, |v| match v {
                "debug" => Ok(LogLevel::Debug),
                "info" => Ok(LogLevel::Info),
                "warn" => Ok(LogLevel::Warn),
                "error" => Ok(LogLevel::Error),
                _ => Err("expected debug, info, warn or error".into()),
            }),
            log_format: r.parsed(
                &args.log_format,
                "LOG_FORMAT",
                LogFormat::Json,
                |v| match v {
                    "json" => Ok(LogFormat::Json),
                    "text" => Ok(LogFormat::Text),
                    _ => Err("expected json or text".into()),
                },
            ),
            batch_max_duration: r.parsed(
                &args.batch_max_duration,
                "BATCH_MAX_DURATION",
                Duration::from_secs(10),
                |v| BATCH_DURATION_RANGE.parse(v),
            ),
            batch_idle_duration: r.parsed(
                &args.batch_idle_duration,
                "BATCH_IDLE_DURATION",
                Duration::from_secs(1),
                |v| BATCH_DURATION_RANGE.parse(v),
            ),
            preference_policy: r.parsed(
                &args.preference_policy,
                "PREFERENCE_POLICY",
                PreferencePolicy::Respect,
                |v| match v {
                    "Respect" => Ok(PreferencePolicy::Respect),
                    "Ignore" => Ok(PreferencePolicy::Ignore),
                    _ => Err("expected Respect or Ignore".into()),
                },
            ),
            min_values_policy: r.parsed(
                &args.min_values_policy,
                "MIN_VALUES_POLICY",
                MinValuesPolicy::Strict,
                |v| match v {
                    "Strict" => Ok(MinValuesPolicy::Strict),
                    "BestEffort" => Ok(MinValuesPolicy::BestEffort),
                    _ => Err("expected Strict or BestEffort".into()),
                },
            ),
            default_topology_spread: r.parsed(
                &args.scheduler_config,
                "SCHEDULER_CONFIG",
                Vec::new(),
                super::scheduler_config::parse,
            ),
            ignore_dra_requests: r.parsed(
                &args.ignore_dra_requests,
                "IGNORE_DRA_REQUESTS",
                true,
                parse_bool,
            ),
            feature_gates: r.parsed(
                &args.feature_gates,
                "FEATURE_GATES",
                FeatureGates::default(),
                FeatureGates::parse,
            ),
            timings,
            identity: env
                .get("POD_NAME")
                .or_else(|| env.get("HOSTNAME"))
                .filter(|v| !v.is_empty())
                .cloned()
                .unwrap_or_else(|| format!("karpenter-{}", uuid::Uuid::new_v4())),
        };
        if config.batch_idle_duration > config.batch_max_duration {
            r.errors.push(format!(
                "BATCH_IDLE_DURATION ({:?}) must not exceed BATCH_MAX_DURATION ({:?})",
                config.batch_idle_duration, config.batch_max_duration
            ));
        }
        if r.errors.is_empty() {
            Ok(config)
        } else {
            Err(ConfigError(r.errors))
        }
    }

    /// Reads the process environment.
    pub fn from_process(args: &RunArgs) -> Result<Config, ConfigError> {
        let env: BTreeMap<String, String> = std::env::vars().collect();
        Config::resolve(args, &env)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_requests_size_reconcile_concurrency() {
        assert_eq!(reconcile_concurrency(250), 100);
        assert_eq!(reconcile_concurrency(1000), 100);
        assert_eq!(reconcile_concurrency(1001), 200);
        assert_eq!(reconcile_concurrency(4000), 400);
        assert_eq!(reconcile_concurrency(64_000), 1000);
        assert_eq!(reconcile_concurrency(u32::MAX), 1000);
    }

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn minimal() -> BTreeMap<String, String> {
        env(&[
            ("EXOSCALE_API_KEY", "EXOkey"),
            ("EXOSCALE_API_SECRET", "s3cret"),
            ("EXOSCALE_ZONE", "ch-gva-2"),
            (
                "EXOSCALE_SKS_CLUSTER_ID",
                "5f0c9a58-1b8c-4a5e-9a43-3b1c1f2b6d11",
            ),
        ])
    }

    #[test]
    fn defaults_match_upstream() {
        let config = Config::resolve(&RunArgs::default(), &minimal()).unwrap();
        assert_eq!(config.metrics_port, 8080);
        assert_eq!(config.health_probe_port, 8081);
        assert_eq!(config.listen_address.to_string(), "0.0.0.0");
        assert_eq!(
            config.exoscale.api_rate_limit,
            crate::exoscale::RateLimit::default()
        );
        assert_eq!(config.leader_election_name, "karpenter-leader-election");
        assert_eq!(config.batch_max_duration, Duration::from_secs(10));
        assert_eq!(config.batch_idle_duration, Duration::from_secs(1));
        assert_eq!(config.exoscale.cluster_domain, "cluster.local");
        assert_eq!(config.exoscale.instance_prefix, "");
        assert!(!config.feature_gates.node_repair);
        assert!(config.feature_gates.reserved_capacity);
        assert_eq!(config.timings.registration_ttl, Duration::from_secs(900));
        assert_eq!(config.log_level, LogLevel::Info);
        assert!(!config.disable_cluster_state_observability);
        // Not upstream's default: one series per pod is unbounded (see POD_METRICS).
        assert_eq!(
            config.pod_metrics,
            crate::controllers::metrics::PodSeries::Aggregated
        );
        let mut e = minimal();
        e.insert("POD_METRICS".into(), "per-pod".into());
        let config = Config::resolve(&RunArgs::default(), &e).unwrap();
        assert_eq!(
            config.pod_metrics,
            crate::controllers::metrics::PodSeries::PerPod
        );
    }

    #[test]
    fn unknown_gates_are_ignored_and_gates_without_effect_are_named() {
        let gates =
            FeatureGates::parse("NodeRepair=true, FutureThing=true,SpotToSpotConsolidation=true")
                .unwrap();
        assert!(gates.node_repair && gates.spot_to_spot_consolidation);
        assert_eq!(gates.unknown, vec!["FutureThing".to_string()]);
        let notices = gates.notices();
        assert!(
            notices[0].contains("\"FutureThing\" is unknown"),
            "{notices:?}"
        );
        assert!(
            notices
                .iter()
                .any(|n| n.contains("SpotToSpotConsolidation=true has no effect")),
            "{notices:?}"
        );
        // Malformed entries are still refused.
        assert!(FeatureGates::parse("NodeRepair").is_err());
        assert!(FeatureGates::parse("NodeRepair=maybe").is_err());
        // As Go's ParseBool reads them upstream.
        for (text, enabled) in [("True", true), ("1", true), ("t", true), ("F", false)] {
            let gates = FeatureGates::parse(&format!("NodeRepair={text}")).unwrap();
            assert_eq!(gates.node_repair, enabled, "{text}");
        }
        assert!(FeatureGates::parse("NodeRepair=yes").is_err());
        assert!(FeatureGates::parse("NodeRepair=tRuE").is_err());
    }

    #[test]
    fn boolean_settings_read_as_upstream_reads_them() {
        for (text, disabled) in [("True", true), ("T", true), ("1", true), ("FALSE", false)] {
            let mut e = minimal();
            e.insert("DISABLE_LEADER_ELECTION".into(), text.into());
            let config = Config::resolve(&RunArgs::default(), &e).unwrap();
            assert_eq!(config.disable_leader_election, disabled, "{text}");
        }
        for text in ["tRuE", "yes", "on"] {
            let mut e = minimal();
            e.insert("IGNORE_DRA_REQUESTS".into(), text.into());
            let err = Config::resolve(&RunArgs::default(), &e).unwrap_err();
            assert!(
                err.to_string().contains(&format!(
                    "IGNORE_DRA_REQUESTS={text:?}: expected true or false"
                )),
                "{err}"
            );
        }
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let e = env(&[
            ("EXOSCALE_SKS_CLUSTER_ID", "not-a-uuid"),
            ("METRICS_PORT", "eighty"),
            ("LOG_LEVEL", "loud"),
            ("FEATURE_GATES", "NodeRepair=maybe"),
            ("BATCH_MAX_DURATION", "10 seconds"),
            ("LISTEN_ADDRESS", "localhost"),
            ("EXOSCALE_API_QPS", "0"),
            ("POD_METRICS", "all"),
            ("CLUSTER_ENDPOINT", "http://10.0.0.1:6443"),
        ]);
        let err = Config::resolve(&RunArgs::default(), &e).unwrap_err();
        let text = err.to_string();
        for needle in [
            "EXOSCALE_API_KEY environment variable is required",
            "EXOSCALE_API_SECRET environment variable is required",
            "EXOSCALE_ZONE environment variable is required",
            "EXOSCALE_SKS_CLUSTER_ID environment variable is not a valid UUID",
            "METRICS_PORT=\"eighty\"",
            "LOG_LEVEL=\"loud\"",
            "NodeRepair",
            "BATCH_MAX_DURATION=\"10 seconds\"",
            "LISTEN_ADDRESS=\"localhost\"",
            "EXOSCALE_API_QPS=\"0\"",
            "POD_METRICS=\"all\": expected aggregated or per-pod",
            "CLUSTER_ENDPOINT=\"http://10.0.0.1:6443\": must be an https URL",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in {text}");
        }
        assert_eq!(err.0.len(), 12);
    }

    #[test]
    fn flags_win_over_environment_and_empty_env_is_unset() {
        let mut e = minimal();
        e.insert("METRICS_PORT".into(), "9000".into());
        e.insert("CLUSTER_DOMAIN".into(), String::new());
        let args = RunArgs {
            metrics_port: Some("9100".into()),
            ..RunArgs::default()
        };
        let config = Config::resolve(&args, &e).unwrap();
        assert_eq!(config.metrics_port, 9100);
        assert_eq!(config.exoscale.cluster_domain, "cluster.local");
    }

    #[test]
    fn secrets_are_not_in_debug_output() {
        let config = Config::resolve(&RunArgs::default(), &minimal()).unwrap();
        let debug = format!("{config:?}");
        assert!(!debug.contains("s3cret"), "{debug}");
        assert!(!debug.contains("EXOkey"), "{debug}");
        assert_eq!(config.exoscale.api_secret.expose(), "s3cret");
    }

    #[test]
    fn feature_gates_parse_over_defaults() {
        let gates = FeatureGates::parse("NodeRepair=true, SpotToSpotConsolidation=false").unwrap();
        assert!(gates.node_repair);
        assert!(gates.reserved_capacity);
        assert!(gates.unknown.is_empty());
        // On by default (as upstream), so only a gate the operator set is warned about.
        assert!(gates.notices().is_empty(), "{:?}", gates.notices());
        let set = FeatureGates::parse("ReservedCapacity=true").unwrap();
        assert_eq!(
            set.notices(),
            [
                "feature gate ReservedCapacity=true has no effect: Exoscale has no capacity reservations"
            ]
        );
        assert_eq!(
            FeatureGates::parse("Bogus=true").unwrap().unknown,
            vec!["Bogus".to_string()]
        );
    }

    #[test]
    fn go_durations_parse() {
        assert_eq!(
            parse_go_duration("500ms").unwrap(),
            Duration::from_millis(500)
        );
        assert_eq!(parse_go_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_go_duration("2h").unwrap(), Duration::from_secs(7200));
        assert!(parse_go_duration("10").is_err());
        assert!(parse_go_duration("s").is_err());
    }

    #[test]
    fn go_durations_too_long_to_represent_are_errors_not_panics() {
        for too_long in [
            "99999999999999999999h",
            "5000000000000000h5000000000000000h",
            &"9".repeat(400),
        ] {
            let value = format!("{too_long}s");
            let value = if too_long.ends_with('h') {
                too_long
            } else {
                &value
            };
            assert!(parse_go_duration(value).is_err(), "{value}");
        }
    }

    #[test]
    fn duration_settings_out_of_range_name_the_variable_and_the_range() {
        let cases = [
            ("NODECLAIM_REGISTRATION_TTL", "15h", "from 3m to 2h"),
            (
                "NODECLAIM_REGISTRATION_TTL",
                "99999999999999999999h",
                "from 3m to 2h",
            ),
            ("NODECLAIM_REGISTRATION_TTL", "15s", "from 3m to 2h"),
            ("NODECLAIM_LAUNCH_TIMEOUT", "2h", "from 2m to 1h"),
            ("NODECLAIM_LAUNCH_TIMEOUT", "20s", "from 2m to 1h"),
            ("INSTANCE_GC_GRACE_PERIOD", "25h", "from 1s to 24h"),
            ("INSTANCE_GC_INTERVAL", "61m", "from 1s to 1h"),
            ("NODECLASS_RECHECK_INTERVAL", "500ms", "from 1s to 24h"),
            ("BATCH_MAX_DURATION", "2h", "from 1ms to 1h"),
            (
                "BATCH_IDLE_DURATION",
                "5000000000000000h5000000000000000h",
                "from 1ms to 1h",
            ),
        ];
        for (variable, value, range) in cases {
            let mut e = minimal();
            e.insert(variable.into(), value.into());
            let err = Config::resolve(&RunArgs::default(), &e).unwrap_err();
            let expected = format!("{variable}={value:?}: expected a duration {range}");
            assert_eq!(err.0, vec![expected]);
        }
    }

    /// Lifecycle timings too short for a real VM (`15s` typed for `15m`) are refused, unless
    /// the API endpoint is a simulated cloud on a loopback address.
    #[test]
    fn timings_shorter_than_a_real_vm_needs_are_for_a_simulated_cloud_only() {
        for endpoint in [
            None,
            Some("https://api-ch-gva-2.exoscale.com/v2"),
            Some("https://127.example.com/v2"),
        ] {
            let mut e = minimal();
            if let Some(endpoint) = endpoint {
                e.insert("EXOSCALE_API_ENDPOINT".into(), endpoint.into());
            }
            e.insert("NODECLAIM_REGISTRATION_TTL".into(), "15s".into());
            e.insert("NODECLAIM_LAUNCH_TIMEOUT".into(), "20s".into());
            let err = Config::resolve(&RunArgs::default(), &e).unwrap_err();
            assert_eq!(err.0.len(), 2, "{endpoint:?}: {:?}", err.0);
        }
        for endpoint in [
            "https://127.0.0.1:8443/v2",
            "https://[::1]:8443/v2",
            "https://localhost:8443/v2",
        ] {
            let mut e = minimal();
            e.insert("EXOSCALE_API_ENDPOINT".into(), endpoint.into());
            e.insert("NODECLAIM_REGISTRATION_TTL".into(), "15s".into());
            e.insert("NODECLAIM_LAUNCH_TIMEOUT".into(), "20s".into());
            let config = Config::resolve(&RunArgs::default(), &e).unwrap();
            assert_eq!(config.timings.registration_ttl, Duration::from_secs(15));
        }
    }

    #[test]
    fn the_e2e_harness_and_test_timings_stay_valid() {
        let mut e = minimal();
        for (variable, value) in [
            ("EXOSCALE_API_ENDPOINT", "https://127.0.0.1:8443/v2"),
            ("NODECLAIM_REGISTRATION_TTL", "20s"),
            ("NODECLAIM_LAUNCH_TIMEOUT", "20s"),
            ("INSTANCE_GC_GRACE_PERIOD", "5s"),
            ("INSTANCE_GC_INTERVAL", "2s"),
            ("NODECLASS_RECHECK_INTERVAL", "10s"),
            ("KUBE_CLIENT_QPS", "5"),
        ] {
            e.insert(variable.into(), value.into());
        }
        let config = Config::resolve(&RunArgs::default(), &e).unwrap();
        assert_eq!(config.timings.launch_timeout, Duration::from_secs(20));
        assert_eq!(config.timings.instance_gc_interval, Duration::from_secs(2));
        assert_eq!(
            config.timings.nodeclass_recheck_interval,
            Duration::from_secs(10)
        );
        e.insert("INSTANCE_GC_GRACE_PERIOD".into(), "1h".into());
        e.insert("NODECLAIM_REGISTRATION_TTL".into(), "10m".into());
        let config = Config::resolve(&RunArgs::default(), &e).unwrap();
        assert_eq!(config.timings.registration_ttl, Duration::from_secs(600));
        // The range ends are included.
        for (variable, value) in [
            ("NODECLAIM_REGISTRATION_TTL", "2h"),
            ("NODECLAIM_LAUNCH_TIMEOUT", "10s"),
            ("INSTANCE_GC_GRACE_PERIOD", "24h"),
            ("INSTANCE_GC_INTERVAL", "1h"),
            ("NODECLASS_RECHECK_INTERVAL", "1s"),
            ("BATCH_MAX_DURATION", "1h"),
        ] {
            e.insert(variable.into(), value.into());
        }
        assert!(Config::resolve(&RunArgs::default(), &e).is_ok());
    }

    #[test]
    fn kube_client_qps_must_be_finite() {
        for value in ["inf", "NaN", "-1", "0"] {
            let mut e = minimal();
            e.insert("KUBE_CLIENT_QPS".into(), value.into());
            let err = Config::resolve(&RunArgs::default(), &e).unwrap_err();
            assert_eq!(
                err.0,
                vec![format!(
                    "KUBE_CLIENT_QPS={value:?}: expected a finite positive number"
                )]
            );
        }
    }

    #[test]
    fn test_timings_are_configurable() {
        let mut e = minimal();
        e.insert(
            "EXOSCALE_API_ENDPOINT".into(),
            "https://127.0.0.1:8443/v2".into(),
        );
        e.insert("NODECLAIM_REGISTRATION_TTL".into(), "20s".into());
        e.insert("INSTANCE_GC_GRACE_PERIOD".into(), "0s".into());
        let err = Config::resolve(&RunArgs::default(), &e).unwrap_err();
        assert_eq!(err.0.len(), 1, "{err}");
        e.insert("INSTANCE_GC_GRACE_PERIOD".into(), "5s".into());
        let config = Config::resolve(&RunArgs::default(), &e).unwrap();
        assert_eq!(config.timings.registration_ttl, Duration::from_secs(20));
        assert_eq!(
            config.timings.instance_gc_grace_period,
            Duration::from_secs(5)
        );
    }
}
