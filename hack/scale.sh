#!/usr/bin/env bash
# Cluster-scale scenarios (hack/scale/main.rs) for our controller and, beside it, upstream
# Karpenter with its KWOK provider (hack/upstream-kwok.sh), one after the other on the same
# machine, one Markdown row each:
#   bash hack/scale.sh                          # pods:1000 pods:5000 anti:500 scaledown:1000:100 dense:1000:100
#   RIGS=ours bash hack/scale.sh dense:1000:100
#   RIGS=ours EXOSCALE_API_QPS=100 EXOSCALE_API_BURST=200 bash hack/scale.sh anti:500
# Columns: time to the first NodeClaim, to the last NodeClaim, to all pods bound, to all
# Running; NodeClaims; Exoscale calls per launched node; apiserver requests the controller
# made (audit log); controller RSS idle / after / peak; controller CPU seconds; /metrics size
# as text / gzipped (what a Prometheus scrape transfers).
# The requests by verb and resource, Exoscale calls by operation, and how long each Node
# waited from its creation to the controller's first write to it (registration), split where
# the controller's watch delivered it, go to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/karpenter-exoscale/target}"
KARPENTER_TEST_BIN_DIR="$(bash hack/control-plane.sh)"
# Our controller logs each Node's delivery by its watch at debug: the harness splits each
# registration's wait there (the watch, then the controller).
export RUST_LOG="${RUST_LOG:-info,kube=warn,hyper=warn,karpenter_exoscale::controllers::nodeclaim=debug}"
export KARPENTER_TEST_BIN_DIR
# The controller with the image's profile (Cargo.toml's dist; built for this host, so glibc and
# jemalloc where the image is musl); the harness as a release build.
cargo build --profile dist --bin karpenter-exoscale >&2
cargo build --release --example scale >&2
rigs=(${RIGS:-ours upstream})
upstream=""
[[ " ${rigs[*]} " == *" upstream "* ]] && upstream="$(bash hack/upstream-kwok.sh)"
scenarios=("$@")
[[ ${#scenarios[@]} -gt 0 ]] || scenarios=(pods:1000 pods:5000 anti:500 scaledown:1000:100 dense:1000:100)
echo "| controller | scenario | first NodeClaim | last NodeClaim | all bound | all Running | NodeClaims | Exoscale calls / node | apiserver requests | RSS idle / after / peak | CPU | /metrics text / gzip |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for s in "${scenarios[@]}"; do
  for rig in "${rigs[@]}"; do
    case "$rig" in
      ours) target="$CARGO_TARGET_DIR/dist/karpenter-exoscale" ;;
      upstream) target="$upstream" ;;
      *) echo "unknown rig $rig (ours, upstream)" >&2; exit 2 ;;
    esac
    label="$rig"
    # The controller inherits the environment: a raised client rate limit is named in the row.
    [[ "$rig" == ours && -n "${EXOSCALE_API_QPS:-}" ]] && label="ours (EXOSCALE_API_QPS=$EXOSCALE_API_QPS)"
    "$CARGO_TARGET_DIR/release/examples/scale" "$rig" "$target" "$s" | sed "s/^| /| $label | /"
  done
done
