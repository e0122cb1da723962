//! `karpenter-exoscale`: the Karpenter node autoscaler for Exoscale, in one binary.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

/// jemalloc on glibc Linux: see `operator::memory`.
#[cfg(all(
    target_os = "linux",
    target_env = "gnu",
    not(feature = "system-allocator")
))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc reads its settings from this symbol (its `malloc_conf`, with the crate's `_rjem_`
/// prefix): a pointer to a NUL-terminated string.
#[cfg(all(
    target_os = "linux",
    target_env = "gnu",
    not(feature = "system-allocator")
))]
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: &u8 = &karpenter_exoscale::operator::memory::MALLOC_CONF[0];

#[derive(Parser)]
#[command(
    name = "karpenter-exoscale",
    version,
    about = "Karpenter node autoscaler and Exoscale cloud provider"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum OutputFormat {
    Table,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the controller against the cluster in KUBECONFIG (or in-cluster) and the Exoscale API.
    Run(Box<karpenter_exoscale::operator::RunArgs>),
    /// Simulate provisioning for manifests (NodePools, NodeClasses, workloads) without a cluster.
    Simulate {
        /// Manifest file or directory of multi-document YAML; repeatable.
        #[arg(short = 'f', long = "filename", required = true)]
        paths: Vec<PathBuf>,
        /// Exoscale zone to simulate.
        #[arg(long, default_value = "ch-gva-2")]
        zone: String,
        /// Currency of the list prices.
        #[arg(long, default_value = "EUR")]
        currency: String,
        /// Output format.
        #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
        output: OutputFormat,
        /// Exit 0 even when some pods are invalid (a negative request, `maxSkew: 0`, …);
        /// without it the report is printed and the exit code is 3.
        #[arg(long)]
        allow_invalid_pods: bool,
    },
    /// Check configuration, credentials, zone, instance types, SKS cluster and templates.
    Doctor,
    /// Explain, read-only against the cluster in KUBECONFIG, where a pod would go or why not.
    Explain {
        #[command(subcommand)]
        what: ExplainWhat,
        #[command(flatten)]
        pricing: Pricing,
    },
    /// What a provisioning round and the next disruption pass would do now, read-only, with
    /// the price per hour and per 30-day month before and after.
    Plan {
        #[command(flatten)]
        pricing: Pricing,
    },
    /// Serve the simulated Exoscale API v2 on loopback, for tests and local trials.
    Sim {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
        /// Allow a non-loopback `--listen` address (the sim prints its credentials and accepts
        /// anyone who has them).
        #[arg(long)]
        allow_remote: bool,
        /// Zone the simulated cloud serves.
        #[arg(long, default_value = "ch-gva-2")]
        zone: String,
    },
    /// Print the CustomResourceDefinitions this binary serves, as YAML.
    Crds {
        /// Write one file per CRD into this directory instead of printing.
        #[arg(long)]
        output_dir: Option<PathBuf>,
    },
    /// Print the version.
    Version,
}

#[derive(Subcommand)]
enum ExplainWhat {
    /// A pod, as NAMESPACE/NAME (or NAME in `default`).
    Pod { pod: String },
    /// A node (or NodeClaim): price, utilisation, each disruption method's verdict, drift.
    Node { node: String },
}

#[derive(clap::Args)]
struct Pricing {
    /// Exoscale zone of the cluster's nodes.
    #[arg(long, env = "EXOSCALE_ZONE", default_value = "ch-gva-2", global = true)]
    zone: String,
    /// Currency of the list prices.
    #[arg(long, default_value = "EUR", global = true)]
    currency: String,
    /// Output format.
    #[arg(
        short = 'o',
        long = "output",
        value_enum,
        default_value = "table",
        global = true
    )]
    output: OutputFormat,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // One TLS crypto backend for kube and reqwest alike, chosen here rather than by features.
    let _ = rustls::crypto::ring::default_provider().install_default();
    match cli.command {
        Command::Crds { output_dir } => write_crds(output_dir),
        Command::Version => {
            println!("karpenter-exoscale {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Command::Doctor => runtime().block_on(doctor()),
        Command::Explain { what, pricing } => runtime().block_on(explain(Some(what), pricing)),
        Command::Plan { pricing } => runtime().block_on(explain(None, pricing)),
        Command::Sim {
            listen,
            zone,
            allow_remote,
        } => runtime().block_on(async move {
            if let Err(error) = karpenter_exoscale::sim::check_listen(listen, allow_remote) {
                eprintln!("sim: {error}");
                return ExitCode::from(2);
            }
            match karpenter_exoscale::sim::serve(listen, zone, None, None).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("sim: {error}");
                    ExitCode::FAILURE
                }
            }
        }),
        Command::Simulate {
            paths,
            zone,
            currency,
            output,
            allow_invalid_pods,
        } => simulate(paths, zone, currency, output, allow_invalid_pods),
        Command::Run(args) => karpenter_exoscale::operator::run::main(&args),
    }
}

/// `simulate`'s exit code when the report was printed but some pods are invalid.
const EXIT_INVALID_PODS: u8 = 3;

fn simulate(
    paths: Vec<PathBuf>,
    zone: String,
    currency: String,
    output: OutputFormat,
    allow_invalid_pods: bool,
) -> ExitCode {
    use karpenter_exoscale::simulate;
    let options = simulate::Options {
        paths,
        zone,
        currency,
    };
    match simulate::run(&options) {
        Ok(report) => {
            print!("{}", formatted(output, &report, simulate::render_table));
            let invalid = report.invalid_pods();
            if invalid > 0 && !allow_invalid_pods {
                eprintln!(
                    "simulate: {invalid} invalid pod(s), listed as unschedulable with the field at fault; pass --allow-invalid-pods to exit 0 regardless"
                );
                return ExitCode::from(EXIT_INVALID_PODS);
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("simulate: {}", simulate::printable(&error.to_string()));
            ExitCode::FAILURE
        }
    }
}

/// `explain pod` (`what` set) or `plan`: exit 0 with the answer (an unschedulable pod is an
/// answer), 1 when the cluster cannot be read or the pod does not exist.
async fn explain(what: Option<ExplainWhat>, pricing: Pricing) -> ExitCode {
    use karpenter_exoscale::explain;
    let client = match kube::Client::try_default().await {
        Ok(client) => client,
        Err(error) => {
            eprintln!("cannot reach the cluster (KUBECONFIG or in-cluster): {error}");
            return ExitCode::FAILURE;
        }
    };
    let live = match explain::live::read(&client).await {
        Ok(live) => live,
        Err(error) => {
            eprintln!("{error}");
            return ExitCode::FAILURE;
        }
    };
    let mut env = explain::Env::new(&pricing.zone, &pricing.currency);
    // With credentials, the instance types this account may use come from the Exoscale API.
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    if let (Some(key), Some(secret)) = (var("EXOSCALE_API_KEY"), var("EXOSCALE_API_SECRET")) {
        let endpoint = karpenter_exoscale::exoscale::Endpoint::resolve(
            &pricing.zone,
            var("EXOSCALE_API_ENDPOINT").as_deref(),
            var("EXOSCALE_API_ENVIRONMENT").as_deref(),
        );
        let exo_client = endpoint.map_err(|e| e.to_string()).and_then(|endpoint| {
            use karpenter_exoscale::exoscale::{ClientConfig, Credentials, RetryPolicy};
            // One bounded attempt: a read-only answer should not wait minutes on the API.
            let config = ClientConfig {
                retry: RetryPolicy::none(),
                request_timeout: std::time::Duration::from_secs(10),
                ..ClientConfig::new(endpoint, Credentials::new(&key, &secret))
            };
            karpenter_exoscale::exoscale::Client::new(config).map_err(|e| e.to_string())
        });
        let with_types = match exo_client {
            Ok(exo) => match explain::Env::new(&pricing.zone, &pricing.currency)
                .with_api_instance_types(&exo)
                .await
            {
                Ok(env) => Ok(env
                    .with_api_templates(&exo, &client, &live.node_classes)
                    .await),
                Err(e) => Err(e.to_string()),
            },
            Err(e) => Err(e),
        };
        match with_types {
            Ok(api_env) => env = api_env,
            Err(error) => eprintln!(
                "warning: the Exoscale API could not be read ({error}); using the embedded catalogue"
            ),
        }
    }
    let output = pricing.output;
    let printed = match what {
        Some(ExplainWhat::Pod { pod }) => {
            let (namespace, name) = pod.split_once('/').unwrap_or(("default", pod.as_str()));
            explain::explain_pod(&live, &env, namespace, name)
                .await
                .map(|e| formatted(output, &e, explain::render_pod))
        }
        Some(ExplainWhat::Node { node }) => explain::explain_node(&live, &env, &node)
            .await
            .map(|e| formatted(output, &e, explain::render_node)),
        None => explain::plan(&live, &env)
            .await
            .map(|p| formatted(output, &p, explain::render_plan)),
    };
    match printed {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("{error}");
            ExitCode::FAILURE
        }
    }
}

/// `value` as pretty JSON (`-o json`) or as its table.
fn formatted<T: serde::Serialize>(
    output: OutputFormat,
    value: &T,
    table: impl Fn(&T) -> String,
) -> String {
    match output {
        OutputFormat::Json => serde_json::to_string_pretty(value).expect("serialises") + "\n",
        OutputFormat::Table => table(value),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime starts")
}

async fn doctor() -> ExitCode {
    use karpenter_exoscale::doctor;
    let mut config = match doctor::DoctorConfig::from_env() {
        Ok(config) => config,
        Err(missing) => {
            eprintln!("✗ configuration: {missing}");
            return ExitCode::FAILURE;
        }
    };
    match doctor::read_nodeclass_refs(std::time::Duration::from_secs(10)).await {
        Ok(refs) => config.nodeclass_refs = Some(refs),
        Err(why) => eprintln!("note: NodeClass references not checked: {why}"),
    }
    let mut out = std::io::stdout();
    if doctor::run(&config, &mut out).await {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn write_crds(output_dir: Option<PathBuf>) -> ExitCode {
    use karpenter_exoscale::apis::crd;
    let Some(dir) = output_dir else {
        print!("{}", crd::render_all());
        return ExitCode::SUCCESS;
    };
    for (file, definition) in crd::all() {
        let path = dir.join(file);
        if let Err(error) = std::fs::write(&path, crd::render(&definition)) {
            eprintln!("cannot write {}: {error}", path.display());
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
