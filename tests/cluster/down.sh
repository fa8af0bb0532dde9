#!/usr/bin/env bash
# Takes the local cluster down completely: node simulators and kube-proxies, every
# pod's processes and network namespace (and so its nft tables), the node
# network, and the control plane with its data. Certificates and builds stay.
# Then checks that none of it is left on the host, and fails naming what is.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/lib.sh"

"$here/nodes.sh" down
"$here/network.sh" down
"$here/control-plane.sh" down
rm -rf "$AETHER_STATE/nodes"

# The cluster's processes still running: the control plane, kube-proxy and CoreDNS (built
# into $AETHER_BIN; kubectl and helm are the user's) and aether's programs that the nodes run
# (the simulator, the pods' containers).
cluster_processes() {
    local exe link pid
    for exe in /proc/[0-9]*/exe; do
        link="$(readlink "$exe" 2>/dev/null)" || continue
        pid="${exe#/proc/}"
        case "${link#"$AETHER_BIN"/}" in
            kube-apiserver | kube-controller-manager | kube-scheduler | kube-proxy | etcd | coredns) ;;
            *) [[ "$link" == "$AETHER_TARGET"/*/aether-* ]] || continue ;;
        esac
        echo "process ${pid%/exe} (${link##*/})"
    done
}

leftovers() {
    ip netns list | awk '$1 ~ /^(pod-|node-)/ {print "network namespace " $1}'
    ip -o link show | awk -F': ' '$2 ~ /^(aether0|vh-node-)/ {print "link " $2}'
    ip route show | awk '$1 ~ /^10\.244\./ {print "route " $1}'
    # Pods' and nodes' tables go with their namespaces; none belongs in the host's.
    nft list tables 2>/dev/null | awk '$3 ~ /^(aether|kube-proxy)$/ {print "nft table " $2 " " $3}'
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
