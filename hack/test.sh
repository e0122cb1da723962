#!/usr/bin/env bash
# The project's test command (the README's): formatting, lints, then every test target.
# Cluster tests need the control-plane binaries; hack/control-plane.sh builds them (cached).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/karpenter-exoscale/target}"
# Incremental artefacts would double the cache for a build that runs once per change.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

cargo fmt --all --check
cargo clippy --all-targets --locked -- -D warnings

# The Helm chart must lint and render with the minimal required values.
helm="$(bash hack/helm.sh)"
chart_values=(--set settings.zone=ch-gva-2 --set settings.sksClusterId=00000000-0000-4000-8000-000000000000
  --set settings.clusterEndpoint=https://api.example.com:6443 --set credentials.existingSecret=exoscale)
"$helm" lint --strict charts/karpenter-exoscale "${chart_values[@]}"
"$helm" template karpenter charts/karpenter-exoscale --namespace karpenter "${chart_values[@]}" >/dev/null
# Real etcd/kube-apiserver/kube-scheduler/kube-controller-manager for the cluster tests (built
# from Go modules once, then cached; ~13 min on a fresh machine).
KARPENTER_TEST_BIN_DIR="$(bash hack/control-plane.sh)"
export KARPENTER_TEST_BIN_DIR
cargo test --all-targets --locked
# `--all-targets` leaves out doctests; the examples in the docs must compile and pass too.
cargo test --doc --locked
