#!/usr/bin/env bash
# Takes the local cluster down completely: every node (its containerd, kubelet, kube-proxy,
# shims and containers, killed through its cgroups; with its mount namespace go the pods'
# network namespaces and mounts), the node network, and the control plane with its data.
# Certificates, builds and images stay. Then checks that none of it is left on the machine,
# and fails naming what is.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/lib.sh"

"$here/nodes.sh" down
"$here/network.sh" down
"$here/control-plane.sh" down
rm -rf "$AETHER_NODES_DIR"

# The cluster's processes still running: the control plane, the nodes' programs (kubelet,
# kube-proxy, containerd and its shims, the subreaper, node-init.sh), CoreDNS and the echo
# app, and aether's programs.
cluster_processes() {
    local exe link pid cmdline
    for exe in /proc/[0-9]*/exe; do
        link="$(readlink "$exe" 2>/dev/null)" || continue
        pid="${exe#/proc/}"
        pid="${pid%/exe}"
        case "${link##*/}" in
            kube-apiserver | kube-controller-manager | kube-scheduler | kubelet | kube-proxy | etcd | \
                containerd | containerd-shim* | runc | tini | coredns | pause | server | client | aether-*) ;;
            bash)
                cmdline="$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null)"
                [[ "$cmdline" == *node-init.sh* ]] || continue ;;
            *) continue ;;
        esac
        # Only ours: the programs of this cluster's builds and packages, not a namesake.
        case "$link" in
            "$AETHER_BIN"/* | "$AETHER_TARGET"/* | /usr/bin/containerd* | /usr/sbin/runc | /usr/bin/runc | \
                /usr/bin/tini | /usr/bin/bash | /bin/bash | /coredns | /pause | /usr/local/bin/*) ;;
            *) continue ;;
        esac
        echo "process $pid (${link##*/})"
    done
}

leftovers() {
    ip netns list | awk '$1 ~ /^node-/ {print "network namespace " $1}'
    ip -o link show | awk -F': ' '$2 ~ /^(aether0|vh-node-)/ {print "link " $2}'
    ip route show | awk '$1 ~ /^10\.244\./ {print "route " $1}'
    # Pods' and nodes' tables go with their namespaces; none belongs in the machine's.
    nft list tables 2>/dev/null | awk '$3 ~ /^(aether|kube-proxy)$/ {print "nft table " $2 " " $3}'
    # Nothing of a node is mounted in the machine's mount namespace.
    awk -v state="$AETHER_STATE" '$2 ~ "^" state || $2 ~ "^/run/(containerd|netns/cni-)" {print "mount " $2}' /proc/mounts
    [ -f "$AETHER_STATE/mountpoints" ] && sed 's/^/mount point (not empty) /' "$AETHER_STATE/mountpoints"
    find /sys/fs/cgroup -maxdepth 6 -type d -name 'aether-node-*' 2>/dev/null | sed 's/^/cgroup /'
    cluster_processes
}

# Killed processes may take a moment to go.
for _ in $(seq 50); do
    left="$(leftovers)"
    [ -z "$left" ] && exit 0
    sleep 0.1
done
echo "tests/cluster/down.sh: left behind after teardown:" >&2
echo "$left" >&2
exit 1
