#!/usr/bin/env bash
# Builds upstream Karpenter's scheduling benchmark (the Go test binary of
# pkg/controllers/provisioning/scheduling) at a pinned release, from the Go module proxy, into
# the cache - never into the repository - and prints its path. With arguments, runs it with them
# instead, e.g.:
#   bash hack/bench-upstream.sh -test.run=XXX -test.bench='^BenchmarkScheduling1000$' -test.benchtime=1x
# Needs only Go and the module proxy; the Go toolchain upstream requires is fetched the same way.
set -euo pipefail

version="${UPSTREAM_KARPENTER_VERSION:-v1.15.0}"
# Upstream's go.mod asks for a newer Go than this machine may have: fetch that toolchain.
toolchain="${UPSTREAM_GO_TOOLCHAIN:-go1.26.10}"
cache="${UPSTREAM_BENCH_CACHE:-$HOME/.cache/karpenter-exoscale/upstream}"
# The benchmark files carry the `test_performance` build tag.
out="$cache/karpenter-$version/scheduling.test"

if [[ ! -x "$out" ]]; then
  mkdir -p "$(dirname "$out")"
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  dir="$(cd "$work" && GOTOOLCHAIN="$toolchain" GOFLAGS=-mod=mod \
    go mod download -json "sigs.k8s.io/karpenter@$version" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  [[ -d "$dir" ]] || { echo "could not download sigs.k8s.io/karpenter@$version" >&2; exit 1; }
  # The module cache is read-only: build from a copy.
  cp -r "$dir" "$work/karpenter"
  chmod -R u+w "$work/karpenter"
  (cd "$work/karpenter" && GOTOOLCHAIN="$toolchain" GOFLAGS=-mod=mod \
    go test -tags=test_performance -c -o "$out.tmp" ./pkg/controllers/provisioning/scheduling >&2)
  mv "$out.tmp" "$out"
fi

if [[ $# -eq 0 ]]; then
  echo "$out"
else
  exec "$out" "$@"
fi
