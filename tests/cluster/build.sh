#!/usr/bin/env bash
# Installs the Debian packages and builds the upstream binaries that aether's
# local test cluster runs (see control-plane.sh and nodes.sh):
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy, kubectl
#   (k8s.io/kubernetes, pinned in go/go.mod), etcd (the version Kubernetes pins,
#   see go/cmd/etcd), coredns, helm, and the conformance echo app (istio-echo/go.mod).
# Binaries go to $AETHER_BIN, Go's caches to $AETHER_CACHE/go. A stamp per pinned
# version makes a second run take seconds.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/lib.sh"

HELM_VERSION=v3.22.0

# containerd, runc and tini (each node's subreaper) run the nodes' pods; the CNI plugins,
# nftables, iptables, conntrack and iproute2 are for the node network and kube-proxy;
# openssl makes the cluster's certificates; gcc builds the pause image's program, buildah
# the images (tests/cluster/images.sh); busybox-static is the node shell image's.
DEBIAN_PACKAGES=(containerd runc tini containernetworking-plugins nftables iptables conntrack
    iproute2 openssl gcc libc6-dev buildah binutils busybox-static)

GO_LDFLAGS_BASE="-s -w"

STAMPS="$AETHER_CACHE/stamps"

log() { printf '[build %3ds] %s\n' "$SECONDS" "$*"; }

install_debian_packages() {
    local missing=() pkg
    for pkg in "${DEBIAN_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return
    log "installing Debian packages: ${missing[*]}"
    # Wait for, rather than fail on, another apt or dpkg run.
    local apt=(apt-get -qq -o DPkg::Lock::Timeout=600)
    "${apt[@]}" update
    DEBIAN_FRONTEND=noninteractive DEBCONF_NOWARNINGS=yes \
        "${apt[@]}" install -y --no-install-recommends "${missing[@]}" >/dev/null
}

# stamp_ok NAME KEY: true if NAME was already built with the same KEY and its
# binaries are still there.
stamp_ok() {
    local name="$1" key="$2"; shift 2
    [ -f "$STAMPS/$name" ] && [ "$(cat "$STAMPS/$name")" = "$key" ] || return 1
    local bin
    for bin in "$@"; do [ -x "$AETHER_BIN/$bin" ] || return 1; done
}

# build_kubernetes VERSION: the Kubernetes commands and etcd, from go/go.mod.
build_kubernetes() {
    local version="$1"
    local k8s_cmds=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
    local bins=("${k8s_cmds[@]}" etcd)
    cd "$here/go"
    local staging key
    # The staging modules must be replaced by the tags of the same release (v1.N.P -> v0.N.P).
    staging="$(go list -m -f '{{if .Replace}}{{.Replace.Version}}{{end}}' k8s.io/api)"
    if [ "$staging" != "v0.${version#v1.}" ]; then
        echo "go/go.mod: k8s.io/kubernetes $version needs staging modules at v0.${version#v1.}, found $staging" >&2
        exit 1
    fi
    key="$version $(cat go.mod go.sum | sha256sum | cut -c1-16)"
    if stamp_ok kubernetes "$key" "${bins[@]}"; then
        log "kubernetes $version: up to date"
        return
    fi
    log "building kubernetes $version: ${bins[*]}"
    local major="${version#v}"; major="${major%%.*}"
    local minor="${version#v*.}"; minor="${minor%%.*}"
    # What the upstream release build stamps in (hack/lib/version.sh); without it
    # the binaries report v0.0.0-master and clients' version checks misfire.
    local ldflags="$GO_LDFLAGS_BASE" pkg
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
    done
    local start=$SECONDS
    # One invocation so the commands share the compilation of their packages.
    go build -trimpath -ldflags "$ldflags" -o "$AETHER_BIN/" "${k8s_cmds[@]/#/k8s.io/kubernetes/cmd/}" ./cmd/etcd
    echo "$key" > "$STAMPS/kubernetes"
    log "kubernetes $version built in $((SECONDS - start))s"
}

# build_istio_echo: the conformance echo app's server and client (istio-echo/go.mod),
# static, into $AETHER_BIN/istio-echo.
build_istio_echo() {
    local key
    cd "$here/istio-echo"
    key="$(cat go.mod go.sum | sha256sum | cut -c1-16)"
    if stamp_ok istio-echo "$key" istio-echo/server istio-echo/client; then
        log "istio echo: up to date"
        return
    fi
    log "building istio echo (server, client)"
    local start=$SECONDS
    CGO_ENABLED=0 go build -trimpath -ldflags "$GO_LDFLAGS_BASE" -o "$AETHER_BIN/istio-echo/" \
        istio.io/istio/pkg/test/echo/cmd/server istio.io/istio/pkg/test/echo/cmd/client
    echo "$key" > "$STAMPS/istio-echo"
    log "istio echo built in $((SECONDS - start))s"
}

# go_install NAME VERSION PACKAGE LDFLAGS: builds PACKAGE@VERSION with its own
# module's go.mod (coredns and helm need newer k8s.io libraries than the
# cluster's, so they cannot share go/go.mod).
go_install() {
    local name="$1" version="$2" pkg="$3" ldflags="$4"
    local key="$version${CGO_ENABLED:+ CGO_ENABLED=$CGO_ENABLED}"
    if stamp_ok "$name" "$key" "$name"; then
        log "$name $version: up to date"
        return
    fi
    log "building $name $version"
    local start=$SECONDS
    (cd / && GOBIN="$AETHER_BIN" go install -trimpath -ldflags "$ldflags" "$pkg@$version")
    echo "$key" > "$STAMPS/$name"
    log "$name $version built in $((SECONDS - start))s"
}

main() {
    command -v go >/dev/null || { echo "build.sh needs the Go toolchain (1.26 or newer)" >&2; exit 1; }
    mkdir -p "$AETHER_BIN" "$STAMPS" "$GOCACHE" "$GOMODCACHE"
    install_debian_packages
    local k8s_version
    k8s_version="$(cd "$here/go" && go list -m -f '{{.Version}}' k8s.io/kubernetes)"
    build_kubernetes "$k8s_version"
    # Static: the CoreDNS image holds nothing but this program.
    CGO_ENABLED=0 go_install coredns "$COREDNS_VERSION" github.com/coredns/coredns "$GO_LDFLAGS_BASE"
    build_istio_echo
    # Helm's offline default cluster version (helm template) is set to the cluster's.
    local kube_minor
    kube_minor="$(cut -d. -f2 <<<"$k8s_version")"
    go_install helm "$HELM_VERSION" helm.sh/helm/v3/cmd/helm \
        "$GO_LDFLAGS_BASE -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$kube_minor"
    log "done: binaries in $AETHER_BIN"
}

main "$@"
