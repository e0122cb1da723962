#!/usr/bin/env bash
# Try it locally: a real control plane on loopback, the simulated Exoscale cloud with simulated
# kubelets, and `karpenter-exoscale run` against both. Prints the KUBECONFIG to use.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/karpenter-exoscale/target}"
KARPENTER_TEST_BIN_DIR="$(bash hack/control-plane.sh)"
export KARPENTER_TEST_BIN_DIR
cargo build --release --bin karpenter-exoscale
cargo run --release --example sandbox -- "$CARGO_TARGET_DIR/release/karpenter-exoscale"
