#!/usr/bin/env bash
# The first process of one node of the local cluster. nodes.sh starts it under `tini -s`
# (the subreaper that adopts the containerd shims when they daemonize) in the node's own
# network, mount, cgroup and UTS namespaces. It gives the node its private view of the machine,
# imports the cluster's images into the node's containerd, and then runs and supervises the
# node's containerd, kubelet and kube-proxy: one that exits is started again within a
# second, unless `nodes.sh stop NODE COMPONENT` holds it.
#
#   node-init.sh NODE
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/lib.sh"

node="$1"
dir="$AETHER_NODES_DIR/$node"
RUN="$AETHER_STATE/run"
SOCKET=/run/containerd/containerd.sock

log() { printf '[%s %s] %s\n' "$node" "$(date +%T)" "$*"; }

private_view() {
    # Nothing mounted here reaches the machine, and nothing the machine mounts later
    # reaches the node.
    mount --make-rprivate /
    # The node's own /run: containerd's and the shims' state, the pods' network namespaces
    # (/run/netns), aether's sockets.
    mount -t tmpfs -o mode=755 tmpfs /run
    local path
    for path in "${NODE_PRIVATE_DIRS[@]}" "${NODE_PRIVATE_FILES[@]}"; do
        mount --bind "$dir/fs$path" "$path"
    done
    # kubelet sets machine-wide kernel settings at start; here its writes land in files.
    local file
    for file in "$dir"/sysctl/*; do
        mount --bind "$file" "/proc/sys/$(basename "$file" | tr . /)"
    done
    # The cgroup hierarchies as the node's cgroup namespace sees them: its own cgroup is
    # their root, so kubelet (cgroupRoot /) sees only its own pods. `ip netns exec`
    # mounted a sysfs of the node's network without them. The machine's cgroup2 mount
    # carries no controller and is left out, so runc and kubelet see plain cgroup v1.
    mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup
    local options name
    while read -r _ mountpoint type options _; do
        [ "$type" = cgroup ] || continue
        name="${mountpoint##*/}"
        mkdir -p "/sys/fs/cgroup/$name"
        mount -t cgroup -o "$(cgroup_subsystems "$options")" cgroup "/sys/fs/cgroup/$name"
    done < /proc/1/mounts
    # kubelet's volume mounts must reach the containers (HostToContainer, Bidirectional).
    mount --make-rshared /
}

command_of() {
    case "$1" in
        containerd) echo containerd --config "$dir/containerd.toml" ;;
        kubelet) echo "$AETHER_BIN/kubelet" --config "$dir/kubelet.yaml" \
            --kubeconfig "$AETHER_STATE/$node.kubeconfig" \
            --hostname-override "$node" --node-ip "$(cat "$dir/node-ip")" --v=1 ;;
        # conntrack-max-per-core=0: leave the machine-wide conntrack table alone.
        kube-proxy) echo "$AETHER_BIN/kube-proxy" \
            --kubeconfig "$AETHER_STATE/kube-proxy.kubeconfig" --hostname-override "$node" \
            --proxy-mode nftables --cluster-cidr "$AETHER_POD_CIDR" --conntrack-max-per-core 0 \
            --metrics-bind-address 127.0.0.1:10249 --healthz-bind-address 127.0.0.1:10256 ;;
    esac
}

running() {
    local pid
    pid="$(cat "$RUN/$node-$1.pid" 2>/dev/null)" && readlink "/proc/$pid/exe" >/dev/null 2>&1
}

start() {
    local name="$1"
    # shellcheck disable=SC2046 # command_of prints words without spaces
    $(command_of "$name") </dev/null >>"$AETHER_LOGS/$node-$name.log" 2>&1 &
    echo $! > "$RUN/$node-$name.pid"
    log "started $name (pid $!, log $AETHER_LOGS/$node-$name.log)"
}

import_images() {
    local archive
    for archive in "$AETHER_IMAGES"/*.tar; do
        [ -e "$archive" ] || { log "no images in $AETHER_IMAGES: run tests/cluster/images.sh"; exit 1; }
        ctr --address "$SOCKET" --namespace k8s.io images import "$archive" >/dev/null
    done
    log "images imported: $(ctr --address "$SOCKET" --namespace k8s.io images list --quiet | grep -vc '^sha256:')"
}

private_view
# The node's own name (a host-network pod shares it, as on a real node).
hostname "$node"
start containerd
for _ in $(seq 100); do
    [ -S "$SOCKET" ] && ctr --address "$SOCKET" version >/dev/null 2>&1 && break
    running containerd || { log "containerd exited"; exit 1; }
    sleep 0.1
done
import_images
while :; do
    for component in containerd kubelet kube-proxy; do
        [ -e "$RUN/$node-$component.hold" ] || running "$component" || start "$component"
    done
    sleep 1
done
