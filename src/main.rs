//! `karpenter-exoscale`: the Karpenter node autoscaler for Exoscale, in one binary.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

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
    },
    /// Check configuration, credentials, zone, instance types, SKS cluster and templates.
    Doctor,
    /// Serve the simulated Exoscale API v2 on loopback, for tests and local trials.
    Sim {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Crds { output_dir } => write_crds(output_dir),
        Command::Version => {
            println!("karpenter-exoscale {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Command::Run(args) => karpenter_exoscale::operator::run::main(&args),
        Command::Simulate { .. } | Command::Doctor | Command::Sim { .. } => {
            eprintln!("this command is not built yet in this version");
            ExitCode::from(2)
        }
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
