#!/usr/bin/env bash
# The project's test command (the README's): formatting, lints, then every test target.
# Cluster tests need the control-plane binaries; hack/control-plane.sh builds them (cached).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/karpenter-exoscale/target}"

cargo fmt --all --check
cargo clippy --all-targets --locked -- -D warnings
if [ -x hack/control-plane.sh ]; then
  KARPENTER_TEST_BIN_DIR="$(bash hack/control-plane.sh)"
  export KARPENTER_TEST_BIN_DIR
fi
cargo test --all-targets --locked
