#!/usr/bin/env bash
# The local cluster's network, all on this machine:
#   - the underlay: a bridge aether0 with this host at 10.200.0.1/24;
#   - node-<i> (i = 1..AETHER_NODES): a network namespace on the underlay at
#     10.200.0.<10+i>, routing its pod CIDR 10.244.<i>.0/24 (the CNI bridge cni0
#     inside it holds the pods) and reaching the other nodes' pods through them.
# Each node's CNI config (bridge + host-local in its pod CIDR) is one of the node's own
# files, written by nodes.sh.
#
#   network.sh up     create what is missing (idempotent)
#   network.sh down   delete the node namespaces (and so every link and nft table
#                     in them), the bridge and the routes
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/lib.sh"

BRIDGE=aether0

cmd_up() {
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link add "$BRIDGE" type bridge
        ip addr add "$AETHER_UNDERLAY_HOST_IP/24" dev "$BRIDGE"
    fi
    ip link set "$BRIDGE" up
    sysctl -qw net.ipv4.ip_forward=1
    local i j node
    for i in $(seq "$AETHER_NODES"); do
        node="node-$i"
        if ! ip netns list | grep -qx "$node\( (id: [0-9]*)\)\?"; then
            ip netns add "$node"
            ip link add "vh-$node" type veth peer name eth0 netns "$node"
            ip link set "vh-$node" master "$BRIDGE" up
            ip -n "$node" addr add "$(node_ip "$i")/24" dev eth0
            ip -n "$node" link set lo up
            ip -n "$node" link set eth0 up
            ip -n "$node" route add default via "$AETHER_UNDERLAY_HOST_IP"
            ip netns exec "$node" sysctl -qw net.ipv4.ip_forward=1
            for j in $(seq "$AETHER_NODES"); do
                [ "$i" = "$j" ] || ip -n "$node" route add "$(pod_cidr "$j")" via "$(node_ip "$j")"
            done
        fi
        ip route replace "$(pod_cidr "$i")" via "$(node_ip "$i")"
    done
}

cmd_down() {
    local netns
    # The nodes are stopped first (nodes.sh down); what still runs in a node's network is killed.
    for netns in $(ip netns list | awk '$1 ~ /^node-/ {print $1}'); do
        ip netns pids "$netns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
        ip netns delete "$netns"
    done
    local cidr
    for cidr in $(ip route show | awk '$1 ~ /^10\.244\./ {print $1}'); do
        ip route delete "$cidr"
    done
    if ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link delete "$BRIDGE"
    fi
}

case "${1:-}" in
    up) cmd_up ;;
    down) cmd_down ;;
    *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
