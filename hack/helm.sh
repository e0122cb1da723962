#!/usr/bin/env bash
# Builds Helm from its Go module (through the Go module proxy) once, caches it outside the repo,
# and prints the path of the binary. A second run costs nothing.
set -euo pipefail
version="${HELM_VERSION:-v3.22.0}"
dir="${XDG_CACHE_HOME:-$HOME/.cache}/karpenter-exoscale/helm-$version"
if [ ! -x "$dir/helm" ]; then
  mkdir -p "$dir"
  echo "building helm $version into $dir (first run only)" >&2
  GOTOOLCHAIN=local GOBIN="$dir" CGO_ENABLED=0 \
    go install -trimpath -ldflags="-s -w" "helm.sh/helm/v3/cmd/helm@$version" >&2
fi
echo "$dir/helm"
