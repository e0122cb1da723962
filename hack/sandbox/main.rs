//! `hack/sandbox.sh`: a local Kubernetes control plane (etcd, kube-apiserver, kube-scheduler,
//! kube-controller-manager from hack/control-plane.sh), the simulated Exoscale cloud with
//! simulated kubelets, and the real `karpenter-exoscale run` binary against both. Prints the
//! KUBECONFIG to use, then runs until Ctrl-C and tears everything down.

#[allow(unused_imports)]
#[path = "../../tests/support/mod.rs"]
mod support;

use std::process::Stdio;
use std::time::Duration;

use karpenter_exoscale::exoscale;
use karpenter_exoscale::sim::ExoscaleSim;
use karpenter_exoscale::sim::kubelet::{
    self as kubelet_sim, Follower, InstanceShape, KubeletBehaviour,
};

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let bin = std::env::args()
        .nth(1)
        .expect("usage: sandbox <path of the karpenter-exoscale binary>");
    let bin_dir = support::control_plane::find_bin_dir().unwrap_or_else(|e| panic!("{e}"));
    eprintln!("starting the control plane from {}", bin_dir.display());
    let plane = support::control_plane::ControlPlane::start(
        &bin_dir,
        &support::control_plane::Options::full(),
    )
    .await
    .unwrap_or_else(|e| panic!("control plane: {e}"));
    let config = plane.config().await;
    let client = kube::Client::try_from(config.clone()).expect("client");

    support::control_plane::publish_cluster_ca(&client, &config).await;

    let sim = ExoscaleSim::start().await.expect("simulated cloud");
    let exo = exoscale::Client::new(sim.client_config()).expect("sim client");
    let types = exo.list_instance_types().await.expect("instance types");
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

    let credentials = sim.credentials();
    let mut controller = tokio::process::Command::new(&bin)
        .arg("run")
        .env("KUBECONFIG", &plane.kubeconfig_file)
        .env("EXOSCALE_API_ENDPOINT", sim.endpoint())
        .env("EXOSCALE_API_KEY", &credentials.key)
        .env("EXOSCALE_API_SECRET", credentials.secret.expose())
        .env("EXOSCALE_ZONE", sim.zone())
        .env("EXOSCALE_SKS_CLUSTER_ID", sim.cluster_id())
        .env("CLUSTER_ENDPOINT", &plane.apiserver_url)
        .env("DISABLE_LEADER_ELECTION", "true")
        .env("METRICS_PORT", "18080")
        .env("HEALTH_PROBE_PORT", "18081")
        .env("LOG_FORMAT", "text")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start karpenter-exoscale run");

    println!("\nSandbox ready.");
    println!("  export KUBECONFIG={}", plane.kubeconfig_file.display());
    println!("  kubectl apply -f examples/standard.yaml -f examples/workloads/web.yaml");
    println!("  kubectl get nodepools,nodeclaims,nodes,pods -A");
    println!(
        "Metrics: http://127.0.0.1:18080/metrics   Simulated Exoscale API: {}",
        sim.endpoint()
    );
    println!("Ctrl-C stops everything.\n");

    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        status = controller.wait() => eprintln!("karpenter-exoscale exited: {status:?}"),
    }
    let _ = controller.kill().await;
    kubelets.abort();
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(plane);
}
