#!/usr/bin/env bash
# Cluster-scale scenarios in the sandbox (hack/scale/main.rs), one Markdown row each:
#   bash hack/scale.sh                          # pods:1000 anti:300 scaledown:1000:100
#   bash hack/scale.sh pods:5000
# Columns: time to the first NodeClaim, to the last NodeClaim, to all pods bound, to all
# Running; NodeClaims; Exoscale calls per launched node; controller RSS idle / after / peak;
# controller CPU seconds; /metrics size.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/karpenter-exoscale/target}"
KARPENTER_TEST_BIN_DIR="$(bash hack/control-plane.sh)"
export KARPENTER_TEST_BIN_DIR
cargo build --release --bin karpenter-exoscale --example scale >&2
scenarios=("$@")
[[ ${#scenarios[@]} -gt 0 ]] || scenarios=(pods:1000 anti:300 scaledown:1000:100)
echo "| scenario | first NodeClaim | last NodeClaim | all bound | all Running | NodeClaims | Exoscale calls / node | RSS idle / after / peak | CPU | /metrics |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for s in "${scenarios[@]}"; do
  "$CARGO_TARGET_DIR/release/examples/scale" "$CARGO_TARGET_DIR/release/karpenter-exoscale" "$s"
done
