#!/usr/bin/env bash
# Builds what the scale harness needs to run upstream Karpenter beside ours: upstream's own
# KWOK cloud provider (sigs.k8s.io/karpenter/kwok) and kwok (sigs.k8s.io/kwok/cmd/kwok) at the
# releases upstream's hack/install-kwok.sh pins, from the Go module proxy, into the cache -
# never into the repository. Also copies upstream's CRDs and kwok's "fast" stages (what
# install-kwok.sh applies) beside them. Prints the directory:
#   karpenter-kwok  kwok  crds/*.yaml  kwok.yaml
set -euo pipefail

karpenter="${UPSTREAM_KARPENTER_VERSION:-v1.15.0}"
kwok="${UPSTREAM_KWOK_VERSION:-v0.8.0}"
toolchain="${UPSTREAM_GO_TOOLCHAIN:-go1.26.10}"
cache="${UPSTREAM_BENCH_CACHE:-$HOME/.cache/karpenter-exoscale/upstream}"
out="$cache/kwok-karpenter-$karpenter-kwok-$kwok"

download() {
  (cd "$work" && GOTOOLCHAIN="$toolchain" GOFLAGS=-mod=mod go mod download -json "$1" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
}

if [[ ! -f "$out/complete" ]]; then
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  mkdir -p "$out/crds"
  for module in "sigs.k8s.io/karpenter@$karpenter" "sigs.k8s.io/kwok@$kwok"; do
    dir="$(download "$module")"
    [[ -d "$dir" ]] || { echo "could not download $module" >&2; exit 1; }
    # The module cache is read-only: build from a copy.
    name="${module%@*}"; name="${name##*/}"
    cp -r "$dir" "$work/$name"
    chmod -R u+w "$work/$name"
  done
  (cd "$work/karpenter" && GOTOOLCHAIN="$toolchain" GOFLAGS=-mod=mod \
    go build -o "$out/karpenter-kwok" ./kwok >&2)
  (cd "$work/kwok" && GOTOOLCHAIN="$toolchain" GOFLAGS=-mod=mod \
    go build -o "$out/kwok" ./cmd/kwok >&2)
  cp "$work"/karpenter/kwok/charts/crds/*.yaml \
    "$work"/karpenter/kwok/apis/crds/*.yaml "$out/crds/"
  stages="$work/kwok/kustomize/stage"
  {
    cat <<'EOF'
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  manageAllNodes: false
  manageNodesWithAnnotationSelector: kwok.x-k8s.io/node=fake
  nodeLeaseDurationSeconds: 40
  nodeLeaseParallelism: 4
  podPlayStageParallelism: 4
  nodePlayStageParallelism: 4
  cidr: 10.0.0.0/12
EOF
    for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
      pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
      echo "---"
      cat "$stages/$f"
    done
  } > "$out/kwok.yaml"
  touch "$out/complete"
fi
echo "$out"
