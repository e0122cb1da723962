#!/usr/bin/env bash
# Builds, once, the Kubernetes control-plane binaries the integration tests run
# (kube-apiserver, kube-scheduler, kube-controller-manager, etcd) and prints the
# directory that holds them as the only line on stdout.
#
#   BIN_DIR=$(hack/control-plane.sh)
#   export KARPENTER_EXOSCALE_CONTROL_PLANE_BIN_DIR="$BIN_DIR"
#
# Everything is built from Go modules through the Go module proxy, pinned by the
# wrapper modules hack/k8s-bins and hack/etcd-bin (see docs/control-plane.md).
# Binaries live outside the repository, in a directory keyed by the wrapper
# modules' content, so a second run only checks that they exist.
#
# Environment:
#   KARPENTER_EXOSCALE_CACHE  cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/karpenter-exoscale)
#   GOCACHE                   honoured if set; otherwise <cache root>/go-build
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
k8s_module_dir="$here/k8s-bins"
etcd_module_dir="$here/etcd-bin"

# Must agree with hack/k8s-bins/go.mod and hack/etcd-bin/go.mod; checked below.
k8s_version=v1.35.4
etcd_version=v3.6.16

cache_root=${KARPENTER_EXOSCALE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/karpenter-exoscale}
binaries=(kube-apiserver kube-scheduler kube-controller-manager etcd)

log() { echo "control-plane.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

require_pinned() { # module_dir module version
    grep -Eq "^[[:space:]]*$2 $3( |$)" "$1/go.mod" ||
        die "$1/go.mod does not require $2 $3; update the pin in $0 or the wrapper module"
}
require_pinned "$k8s_module_dir" k8s.io/kubernetes "$k8s_version"
require_pinned "$etcd_module_dir" go.etcd.io/etcd/server/v3 "$etcd_version"

# The key covers both wrapper modules, so changing a pin or a replace builds anew.
key=$(cat "$k8s_module_dir/go.mod" "$k8s_module_dir/go.sum" \
    "$etcd_module_dir/go.mod" "$etcd_module_dir/go.sum" | sha256sum | cut -c1-12)
dest="$cache_root/control-plane/k8s-$k8s_version-etcd-$etcd_version-$key"

all_present() {
    local name
    for name in "${binaries[@]}"; do
        [[ -x "$dest/bin/$name" ]] || return 1
    done
}

point_current_at_dest() {
    # A stable path for local `cargo test` runs that do not set the env var.
    ln -sfn "$dest" "$cache_root/control-plane/current"
}

if all_present; then
    point_current_at_dest
    echo "$dest/bin"
    exit 0
fi

command -v go >/dev/null || die "the go command is not on PATH (Go >= 1.26 is needed)"
mkdir -p "$cache_root/control-plane"

# Two concurrent first runs (CI and a developer) would otherwise build twice.
exec 9>"$cache_root/control-plane/.lock"
flock 9
if all_present; then
    point_current_at_dest
    echo "$dest/bin"
    exit 0
fi

export GOTOOLCHAIN=local       # never fetch a toolchain behind our back
export CGO_ENABLED=0           # static binaries, as upstream builds them
export GOFLAGS="${GOFLAGS:-} -mod=readonly -trimpath"
export GOCACHE=${GOCACHE:-$cache_root/go-build}

staging="$dest.partial.$$"
rm -rf "$staging"
mkdir -p "$staging/bin"
trap 'rm -rf "$staging"' EXIT

minor=${k8s_version#v1.}
minor=${minor%%.*}
version_pkg=k8s.io/component-base/version
k8s_ldflags="-s -w -X $version_pkg.gitVersion=$k8s_version -X $version_pkg.gitMajor=1"
k8s_ldflags+=" -X $version_pkg.gitMinor=$minor -X $version_pkg.gitTreeState=clean"

started=$(date +%s)
log "building etcd $etcd_version into $dest (first run only)"
(cd "$etcd_module_dir" &&
    nice -n 5 go build -ldflags "-s -w" -o "$staging/bin/etcd" go.etcd.io/etcd/server/v3)

log "building kube-apiserver, kube-scheduler, kube-controller-manager $k8s_version (first run: ~15 min on 2 cores)"
(cd "$k8s_module_dir" &&
    nice -n 5 go build -ldflags "$k8s_ldflags" -o "$staging/bin/" \
        k8s.io/kubernetes/cmd/kube-apiserver \
        k8s.io/kubernetes/cmd/kube-scheduler \
        k8s.io/kubernetes/cmd/kube-controller-manager)

for name in "${binaries[@]}"; do
    [[ -x "$staging/bin/$name" ]] || die "build finished without $name"
done

rm -rf "$dest"
mv "$staging" "$dest"
trap - EXIT
point_current_at_dest
log "built in $(($(date +%s) - started)) s"
echo "$dest/bin"
