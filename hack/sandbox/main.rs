//! `hack/sandbox.sh`: a local Kubernetes control plane (etcd, kube-apiserver, kube-scheduler,
//! kube-controller-manager with its default controllers, from hack/control-plane.sh), the
//! simulated Exoscale cloud with simulated kubelets that run the pods bound to them, and the
//! real `karpenter-exoscale run` binary against both (`tests/support/sandbox.rs`, which the
//! README walk-through test uses too). Prints the KUBECONFIG to use, then runs until Ctrl-C.

#[allow(unused_imports)]
#[path = "../../tests/support/mod.rs"]
mod support;

use std::path::Path;
use std::time::Duration;

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let bin = std::env::args()
        .nth(1)
        .expect("usage: sandbox <path of the karpenter-exoscale binary>");
    let bin_dir = support::control_plane::find_bin_dir().unwrap_or_else(|e| panic!("{e}"));
    eprintln!("starting the control plane from {}", bin_dir.display());
    let mut sandbox = support::sandbox::Sandbox::start(&bin_dir, Path::new(&bin), None)
        .await
        .unwrap_or_else(|e| panic!("sandbox: {e}"));

    println!("\nSandbox ready.");
    println!("  export KUBECONFIG={}", sandbox.kubeconfig().display());
    println!("  kubectl apply -f examples/standard.yaml -f examples/workloads/web.yaml");
    println!("  kubectl get nodepools,nodeclaims,nodes,pods -A");
    println!(
        "Metrics: {}   Simulated Exoscale API: {}",
        sandbox.metrics_url,
        sandbox.sim.endpoint()
    );
    println!("Ctrl-C stops everything.\n");

    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        status = sandbox.controller.wait() => eprintln!("karpenter-exoscale exited: {status:?}"),
    }
    drop(sandbox);
    tokio::time::sleep(Duration::from_millis(200)).await;
}
