#!/usr/bin/env bash
# Builds every image the local cluster's nodes run, as OCI archives in $AETHER_IMAGES, which
# each node imports into its containerd at start (no registry is reachable here):
#   - aether's own (images/build.sh, from the workspace build of $AETHER_PROFILE);
#   - the pod sandbox (pause), from build/pause of the Kubernetes module;
#   - CoreDNS, from the program build.sh builds;
#   - the conformance echo app, Istio's echo server and client as build.sh builds them;
#   - the node shell the tests exec into to look at a node, or to play an attacker's pod.
# An image whose inputs did not change is not built again (ARCHIVE.inputs records them).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/lib.sh"
. "$here/../../images/lib.sh"

log() { printf '[images %3ds] %s\n' "$SECONDS" "$*"; }

# image NAME ARCHIVE CONTAINERFILE FILE...: builds NAME from CONTAINERFILE with FILEs as
# its context, unless the archive was built from the same inputs.
image() {
    local name="$1" archive="$AETHER_IMAGES/$2.tar" containerfile="$3"
    shift 3
    local key context file
    key="$(echo "$name"; sha256sum "$containerfile" "$@" | cut -d' ' -f1)"
    if [ -f "$archive" ] && [ "$(cat "$archive.inputs" 2>/dev/null)" = "$key" ]; then
        return
    fi
    context="$(mktemp -d)"
    for file in "$@"; do cp "$file" "$context/"; done
    build_image "$name" "$context" "$containerfile" "$archive"
    rm -rf "$context"
    echo "$key" > "$archive.inputs"
    log "$name: $(du -h "$archive" | cut -f1)"
}

mkdir -p "$AETHER_IMAGES"
profile_flag=()
[ "$AETHER_PROFILE" = debug ] && profile_flag=(--debug)
"$here/../../images/build.sh" "${profile_flag[@]}" --out "$AETHER_IMAGES" >/dev/null
log "aether's images ($AETHER_PROFILE build) in $AETHER_IMAGES"

k8s_version="$(cd "$here/go" && go list -m -f '{{.Version}}' k8s.io/kubernetes)"
pause_src="$GOMODCACHE/k8s.io/kubernetes@$k8s_version/build/pause/linux/pause.c"
[ -f "$pause_src" ] || { echo "$pause_src is missing: run tests/cluster/build.sh" >&2; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# The flags of build/pause/Makefile.
gcc -Os -Wall -Werror -static -DVERSION="v${PAUSE_IMAGE##*:}-aether" -o "$work/pause" "$pause_src"
image "$PAUSE_IMAGE" pause "$here/images/pause.Containerfile" "$work/pause"
image "$COREDNS_IMAGE" coredns "$here/images/coredns.Containerfile" "$AETHER_BIN/coredns"
istio="$(cd "$here/istio-echo" && go list -m -f '{{.Dir}}' istio.io/istio)"
image "$ECHO_IMAGE" echo "$here/images/echo.Containerfile" /bin/busybox \
    "$AETHER_BIN/istio-echo/client" "$AETHER_BIN/istio-echo/server" \
    "$istio/tests/testdata/certs/cert.crt" "$istio/tests/testdata/certs/cert.key"
gcc -Os -Wall -Werror -static -o "$work/marked-get" "$here/images/marked-get.c"
image "$NODE_SHELL_IMAGE" node-shell "$here/images/node-shell.Containerfile" /bin/busybox \
    "$work/marked-get"
log "done"
