#!/usr/bin/env bash
# The local cluster's nodes. Each node-<i> runs the upstream kubelet (built by build.sh
# from the control plane's module and version) with containerd and runc (Debian's), and
# kube-proxy in nftables mode, in the node's own
#   - network namespace (network.sh: node-<i> on the underlay),
#   - mount namespace: its own /run, kubelet, containerd and CNI state and config, pod
#     logs, machine id, and files that take kubelet's machine-wide sysctl writes,
#   - cgroup namespace: a cgroup of its own in every hierarchy, under the cgroup this
#     script runs in, which is the root of everything the node runs;
#   - UTS namespace: its hostname is its name.
# node-init.sh is each node's first process (under tini, the subreaper of its shims).
#
#   nodes.sh up                     provision and start every node, wait until Ready (idempotent)
#   nodes.sh down                   kill every process of every node, pods included; remove their
#                                   cgroups and mount points
#   nodes.sh stop NODE COMPONENT    stop containerd, kubelet or kube-proxy of NODE, and keep it
#                                   stopped
#   nodes.sh start NODE COMPONENT   start it again
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/lib.sh"
. "$here/pki.sh"

RUN="$AETHER_STATE/run"
API_URL="https://$AETHER_API_BIND_ADDRESS:$AETHER_API_PORT"
READY_TIMEOUT=180
# The machine's mount points this script made for the nodes' private paths (removed by down).
MOUNTPOINTS="$AETHER_STATE/mountpoints"

log() { printf '[nodes] %s\n' "$*"; }
kubectl() { "$AETHER_BIN/kubectl" --kubeconfig "$AETHER_KUBECONFIG" "$@"; }

# running NAME [PROGRAM]: the process of $RUN/NAME.pid runs PROGRAM (a node's first process
# is tini, see launch_node), so that a PID reused since the machine restarted is not ours.
running() {
    local pid exe
    pid="$(cat "$RUN/$1.pid" 2>/dev/null)" && exe="$(readlink "/proc/$pid/exe" 2>/dev/null)" &&
        [ "${exe##*/}" = "${2:-tini}" ]
}

# ---------------------------------------------------------------- provisioning

# The settings kubelet writes at start (pkg/kubelet/cm: setupKernelTunables), with the
# values it wants, so that it finds them set and the machine keeps its own.
write_sysctls() {
    local dir="$1/sysctl"
    mkdir -p "$dir"
    echo 1 > "$dir/vm.overcommit_memory"
    echo 0 > "$dir/vm.panic_on_oom"
    echo 10 > "$dir/kernel.panic"
    echo 1 > "$dir/kernel.panic_on_oops"
    echo 1000000 > "$dir/kernel.keys.root_maxkeys"
    echo 25000000 > "$dir/kernel.keys.root_maxbytes"
}

# The node's primary network: the bridge plugin with host-local addresses from its pod CIDR.
# Written once, as a node's provisioning would: an installed plugin (aether-cni) chains
# itself into this file, and a second `up` must not take it out again.
write_cni_config() {
    local i="$1" file="$2/fs/etc/cni/net.d/10-aether-node.conflist"
    [ -f "$file" ] && return 0
    # hairpinMode lets a pod reach a Service whose endpoint is itself.
    cat > "$file" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "aether-node",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "hairpinMode": true,
      "ipMasq": false,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$(pod_cidr "$i")"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
}

write_containerd_config() {
    local dir="$1"
    # restrict_oom_score_adj: this machine cannot lower oom_score_adj below 0, which the CRI
    # asks for sandboxes. The opt plugin would write /opt/containerd on the machine.
    cat > "$dir/containerd.toml" <<EOF
version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  restrict_oom_score_adj = true
  tolerate_missing_hugetlb_controller = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/opt/cni/bin"
    conf_dir = "/etc/cni/net.d"
EOF
}

write_kubelet_config() {
    local node="$1" dir="$2"
    # failCgroupV1: the machine's controllers are bound to cgroup v1. oomScoreAdj 0: see
    # containerd's restrict_oom_score_adj. Image GC and disk eviction are off: every image
    # was imported (no registry is reachable) and the disk is the machine's, shared by all
    # nodes. cgroupRoot /: the root of the node's cgroup namespace, its own cgroup.
    cat > "$dir/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /
oomScoreAdj: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $PKI/kubelet-$node.crt
tlsPrivateKeyFile: $PKI/kubelet-$node.key
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
clusterDNS: [$AETHER_CLUSTER_DNS]
clusterDomain: $AETHER_CLUSTER_DOMAIN
resolvConf: /etc/resolv.conf
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: "0%"
  nodefs.inodesFree: "0%"
  imagefs.available: "0%"
serializeImagePulls: false
# Room for the enrolment bench's 100 pods on one node beside the cluster's own.
maxPods: 250
EOF
}

# The machine's paths the node's own are bound over must exist; those made here are
# recorded and removed again by `down`.
ensure_mountpoints() {
    local path
    touch "$MOUNTPOINTS"
    for path in "${NODE_PRIVATE_DIRS[@]}"; do
        if [ ! -d "$path" ]; then
            mkdir -p "$path"
            echo "$path" >> "$MOUNTPOINTS"
        fi
    done
}

provision() {
    local i="$1" node="node-$1" dir="$AETHER_NODES_DIR/node-$1" path
    for path in "${NODE_PRIVATE_DIRS[@]}"; do mkdir -p "$dir/fs$path"; done
    chmod 1777 "$dir/fs/tmp"
    [ -s "$dir/fs/etc/machine-id" ] || od -An -N16 -tx1 /dev/urandom | tr -d ' \n' > "$dir/fs/etc/machine-id"
    # The node's CNI plugins, as a node image ships them; aether's chart adds aether-cni.
    for path in bridge host-local loopback portmap; do
        [ -x "$dir/fs/opt/cni/bin/$path" ] || cp /usr/lib/cni/$path "$dir/fs/opt/cni/bin/"
    done
    node_ip "$i" > "$dir/node-ip"
    write_sysctls "$dir"
    write_cni_config "$i" "$dir"
    write_containerd_config "$dir"
    write_kubelet_config "$node" "$dir"
    # The Node authorizer knows a kubelet by this client certificate; the API server checks
    # the kubelet's serving certificate against the cluster CA.
    [ -f "$PKI/$node.crt" ] || sign "$node" "/O=system:nodes/CN=system:node:$node" "$CLIENT_EXT" ca
    [ -f "$PKI/kubelet-$node.crt" ] ||
        sign "kubelet-$node" "/O=system:nodes/CN=system:node:$node" \
            "$SERVER_EXT\nsubjectAltName=DNS:$node,IP:$(node_ip "$i")" ca
    write_kubeconfig "$node" "$API_URL"
}

# ---------------------------------------------------------------- cgroups

# cgroup_dirs NODE: the node's cgroup in every cgroup v1 hierarchy of the machine, under
# the cgroup this process is in (so the node's memory stays inside this run's accounting).
cgroup_dirs() {
    local mountpoint type options path
    while read -r _ mountpoint type options _; do
        [ "$type" = cgroup ] || continue
        path="$(awk -F: -v s="$(cgroup_subsystems "$options")" '$2 == s {print $3}' /proc/self/cgroup)"
        echo "$mountpoint${path%/}/aether-$1"
    done < /proc/self/mounts
}

make_cgroups() {
    local node="$1" cg parent
    cgroup_dirs "$node" > "$AETHER_NODES_DIR/$node/cgroups"
    while read -r cg; do
        mkdir -p "$cg"
        parent="$(dirname "$cg")"
        # A new cpuset has no CPUs and memory nodes until given its parent's.
        if [ -f "$cg/cpuset.cpus" ]; then
            cat "$parent/cpuset.cpus" > "$cg/cpuset.cpus"
            cat "$parent/cpuset.mems" > "$cg/cpuset.mems"
        fi
    done < "$AETHER_NODES_DIR/$node/cgroups"
}

# kill_node NODE: every process in the node's cgroups (its containerd, kubelet, shims and
# containers), frozen first so that none can fork meanwhile; then the cgroups themselves.
kill_node() {
    local node="$1" list="$AETHER_NODES_DIR/$1/cgroups" cg freezers pid
    [ -f "$list" ] || return 0
    # The list names the cgroups of the node's last start; a start from a shell in another
    # cgroup made them under that one, so earlier starts' cgroups are found by name.
    find /sys/fs/cgroup -maxdepth 6 -type d -name "aether-$node" 2>/dev/null | sort -u - "$list" -o "$list"
    freezers="$(grep '/freezer/' "$list" || true)"
    for cg in $freezers; do [ -d "$cg" ] && echo FROZEN > "$cg/freezer.state"; done
    while read -r cg; do
        [ -d "$cg" ] || continue
        find "$cg" -name tasks -exec cat {} + 2>/dev/null | while read -r pid; do
            kill -KILL "$pid" 2>/dev/null || true
        done
    done < "$list"
    for cg in $freezers; do [ -d "$cg" ] && echo THAWED > "$cg/freezer.state"; done
    local left
    for _ in $(seq 100); do
        left="$(while read -r cg; do [ -d "$cg" ] && find "$cg" -name tasks -exec cat {} + 2>/dev/null; done < "$list")"
        [ -z "$left" ] && break
        sleep 0.1
    done
    # Deepest first: a cgroup with children cannot be removed.
    while read -r cg; do
        [ -d "$cg" ] && find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null
    done < "$list"
    rm -f "$list"
}

# ---------------------------------------------------------------- commands

# import_images NODE: imports the archives made since the node last imported into its
# containerd (node-init.sh imports all of them at start), so a running cluster runs the
# images just built.
import_images() {
    local node="$1" stamp="$RUN/$1.images" archive
    for archive in "$AETHER_IMAGES"/*.tar; do
        [ "$archive" -nt "$stamp" ] || continue
        nsenter --target "$(cat "$RUN/$node.pid")" --mount -- \
            ctr --address /run/containerd/containerd.sock --namespace k8s.io images import "$archive" >/dev/null
        log "imported $(basename "$archive") into $node"
    done
    touch "$stamp"
}

launch_node() {
    local node="$1" cg
    if running "$node"; then
        import_images "$node"
        return
    fi
    touch "$RUN/$node.images"
    make_cgroups "$node"
    (
        while read -r cg; do echo "$BASHPID" > "$cg/cgroup.procs"; done < "$AETHER_NODES_DIR/$node/cgroups"
        cd /
        exec setsid ip netns exec "$node" unshare --mount --cgroup --uts --propagation private \
            tini -s -- "$here/node-init.sh" "$node"
    ) </dev/null >>"$AETHER_LOGS/$node.log" 2>&1 &
    echo $! > "$RUN/$node.pid"
    log "started $node (pid $!, logs $AETHER_LOGS/$node*.log)"
}

cmd_up() {
    if [ ! -x "$AETHER_BIN/kubelet" ]; then
        echo "$AETHER_BIN/kubelet is missing: run tests/cluster/build.sh" >&2
        exit 1
    fi
    mkdir -p "$RUN" "$AETHER_LOGS"
    # One identity for every kube-proxy, bound to system:node-proxier by default RBAC.
    write_kubeconfig kube-proxy "$API_URL"
    ensure_mountpoints
    local i
    for i in $(seq "$AETHER_NODES"); do
        provision "$i"
        launch_node "node-$i"
    done
    local deadline=$((SECONDS + READY_TIMEOUT))
    for i in $(seq "$AETHER_NODES"); do
        until kubectl wait --for=condition=Ready "node/node-$i" --timeout=5s >/dev/null 2>&1; do
            if ! running "node-$i"; then
                log "node-$i exited; last lines of $AETHER_LOGS/node-$i.log:"
                tail -n 30 "$AETHER_LOGS/node-$i.log" >&2
                exit 1
            fi
            if [ "$SECONDS" -ge "$deadline" ]; then
                log "node-$i not Ready after ${READY_TIMEOUT}s; last lines of its kubelet's log:"
                tail -n 30 "$AETHER_LOGS/node-$i-kubelet.log" >&2
                exit 1
            fi
        done
    done
    log "$AETHER_NODES nodes Ready"
}

cmd_down() {
    local dir node
    for dir in "$AETHER_NODES_DIR"/node-*; do
        [ -d "$dir" ] || continue
        node="$(basename "$dir")"
        kill_node "$node"
        rm -f "$RUN/$node".pid "$RUN/$node".images "$RUN/$node"-*.pid "$RUN/$node"-*.hold
    done
    # Cgroups no node's list names any more (a run killed after its state went): those
    # without processes go; one with processes stays, and down.sh names it.
    find /sys/fs/cgroup -maxdepth 6 -type d -name 'aether-node-*' 2>/dev/null | while read -r cg; do
        find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null || true
    done
    # The mount points made for the nodes go too; one that cannot (something wrote into it
    # on the machine) stays listed, and down.sh names it.
    if [ -f "$MOUNTPOINTS" ]; then
        local left
        left="$(tac "$MOUNTPOINTS" | while read -r dir; do rmdir "$dir" 2>/dev/null || echo "$dir"; done)"
        if [ -n "$left" ]; then echo "$left" > "$MOUNTPOINTS"; else rm -f "$MOUNTPOINTS"; fi
    fi
}

check_component() {
    case "$2" in
        containerd | kubelet | kube-proxy) ;;
        *) echo "unknown component '$2': containerd, kubelet or kube-proxy" >&2; exit 2 ;;
    esac
    running "$1" || { echo "$1 is not running" >&2; exit 1; }
}

cmd_stop() {
    local node="$1" component="$2" pid
    check_component "$node" "$component"
    touch "$RUN/$node-$component.hold"
    running "$node-$component" "$component" || return 0
    pid="$(cat "$RUN/$node-$component.pid")"
    kill -TERM "$pid"
    for _ in $(seq 100); do readlink "/proc/$pid/exe" >/dev/null 2>&1 || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    log "stopped $component on $node"
}

cmd_start() {
    local node="$1" component="$2"
    check_component "$node" "$component"
    rm -f "$RUN/$node-$component.hold"
    for _ in $(seq 50); do
        running "$node-$component" "$component" && { log "started $component on $node"; return; }
        sleep 0.1
    done
    echo "$component did not start on $node; see $AETHER_LOGS/$node-$component.log" >&2
    exit 1
}

case "${1:-}" in
    up) cmd_up ;;
    down) cmd_down ;;
    stop) [ $# -eq 3 ] || { echo "usage: $0 stop NODE COMPONENT" >&2; exit 2; }; cmd_stop "$2" "$3" ;;
    start) [ $# -eq 3 ] || { echo "usage: $0 start NODE COMPONENT" >&2; exit 2; }; cmd_start "$2" "$3" ;;
    *) echo "usage: $0 up|down|stop NODE COMPONENT|start NODE COMPONENT" >&2; exit 2 ;;
esac
