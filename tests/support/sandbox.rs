//! What `hack/sandbox.sh` runs, shared with the README walk-through test: a control plane like
//! a user's cluster (every default kube-controller-manager controller), the simulated Exoscale
//! cloud serving templates of the control plane's Kubernetes version, simulated kubelets that
//! register Nodes, run the pods bound to them and renew their Leases, and the real
//! `karpenter-exoscale run` binary, listening on loopback ports nobody else holds.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use karpenter_exoscale::exoscale;
use karpenter_exoscale::providers::template::parse_kubernetes_version;
use karpenter_exoscale::sim::kubelet::{
    self as kubelet_sim, Follower, InstanceShape, KubeletBehaviour, KubeletSimError,
};
use karpenter_exoscale::sim::{ExoscaleSim, SimConfig};
use tokio::task::JoinHandle;

use super::control_plane::{ControlPlane, Options, free_ports, publish_cluster_ca};

pub struct Sandbox {
    pub plane: ControlPlane,
    pub client: kube::Client,
    pub sim: ExoscaleSim,
    pub metrics_url: String,
    pub controller: tokio::process::Child,
    kubelets: JoinHandle<Vec<KubeletSimError>>,
    pods: JoinHandle<()>,
}

impl Sandbox {
    /// Starts everything; the controller's output goes to `controller_log` (a file), or to this
    /// process's stdout and stderr.
    pub async fn start(
        bin_dir: &Path,
        binary: &Path,
        controller_log: Option<&Path>,
    ) -> Result<Sandbox, String> {
        Self::start_audited(bin_dir, binary, controller_log, None).await
    }

    /// [`Sandbox::start`], with kube-apiserver writing an audit log to `audit_log`.
    pub async fn start_audited(
        bin_dir: &Path,
        binary: &Path,
        controller_log: Option<&Path>,
        audit_log: Option<&Path>,
    ) -> Result<Sandbox, String> {
        let (stdout, stderr) = match controller_log {
            None => (Stdio::inherit(), Stdio::inherit()),
            Some(path) => {
                let file = std::fs::File::create(path)
                    .map_err(|e| format!("creating {}: {e}", path.display()))?;
                let copy = file.try_clone().map_err(|e| e.to_string())?;
                (Stdio::from(file), Stdio::from(copy))
            }
        };
        let options = Options {
            audit_log: audit_log.map(Path::to_path_buf),
            ..Options::sandbox()
        };
        let plane = ControlPlane::start(bin_dir, &options).await?;
        let config = plane.config().await;
        let client = kube::Client::try_from(config.clone()).map_err(|e| format!("client: {e}"))?;
        publish_cluster_ca(&client, &config).await;
        let version = client
            .apiserver_version()
            .await
            .map_err(|e| format!("reading the apiserver version: {e}"))?;

        let sim = ExoscaleSim::start_with(SimConfig {
            // The SKS template version the controller resolves for this control plane.
            kubernetes_version: parse_kubernetes_version(&version.git_version)
                .map_err(|e| e.to_string())?,
            ..SimConfig::default()
        })
        .await
        .map_err(|e| format!("simulated cloud: {e}"))?;
        sim.set_cluster_endpoint(&plane.apiserver_url);
        let exo = exoscale::Client::new(sim.client_config()).map_err(|e| e.to_string())?;
        let types = exo
            .list_instance_types()
            .await
            .map_err(|e| format!("instance types: {e}"))?;
        let follower = Follower {
            client: client.clone(),
            zone: sim.zone().to_string(),
            shape_of: Box::new(move |instance| {
                let t = types.iter().find(|t| t.id == instance.instance_type.id)?;
                Some(InstanceShape {
                    name: t.name(),
                    cpus: t.cpus,
                    memory_bytes: t.memory,
                    gpus: t.gpus,
                    disk_gib: 50,
                })
            }),
            behaviour_of: Box::new(|_| KubeletBehaviour::default()),
        };
        let kubelets = kubelet_sim::follow(follower, sim.subscribe_instance_events());
        let pods = karpenter_exoscale::sim::pods::run(client.clone());

        let [metrics_port, health_port] = free_ports()?;
        let credentials = sim.credentials();
        let controller = tokio::process::Command::new(binary)
            .arg("run")
            .env("KUBECONFIG", &plane.kubeconfig_file)
            .env("EXOSCALE_API_ENDPOINT", sim.endpoint())
            .env("EXOSCALE_API_KEY", &credentials.key)
            .env("EXOSCALE_API_SECRET", credentials.secret.expose())
            .env("EXOSCALE_ZONE", sim.zone())
            .env("EXOSCALE_SKS_CLUSTER_ID", sim.cluster_id())
            .env("CLUSTER_ENDPOINT", &plane.apiserver_url)
            .env("DISABLE_LEADER_ELECTION", "true")
            .env("LISTEN_ADDRESS", "127.0.0.1")
            .env("METRICS_PORT", metrics_port.to_string())
            .env("HEALTH_PROBE_PORT", health_port.to_string())
            .env("LOG_FORMAT", "text")
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", binary.display()))?;
        Ok(Sandbox {
            plane,
            client,
            sim,
            metrics_url: format!("http://127.0.0.1:{metrics_port}/metrics"),
            controller,
            kubelets,
            pods,
        })
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.plane.kubeconfig_file.clone()
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = self.controller.start_kill();
        self.kubelets.abort();
        self.pods.abort();
    }
}
