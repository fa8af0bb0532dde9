#!/usr/bin/env bash
# The local cluster's nodes (their network comes from network.sh): for each
# node-<i>, kube-proxy in nftables mode inside the node's network namespace, and
# aether-node, the node simulator that plays its kubelet and container runtime.
#
#   nodes.sh up     start every node and wait until it is Ready (idempotent)
#   nodes.sh down   stop the simulators and kube-proxies (pods are removed by
#                   network.sh down)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/lib.sh"
. "$here/pki.sh"

RUN="$AETHER_STATE/run"
API_URL="https://$AETHER_API_BIND_ADDRESS:$AETHER_API_PORT"
READY_TIMEOUT=120

log() { printf '[nodes] %s\n' "$*"; }
kubectl() { "$AETHER_BIN/kubectl" --kubeconfig "$AETHER_KUBECONFIG" "$@"; }

node_ip() { echo "10.200.0.$((10 + $1))"; }
pod_cidr() { echo "10.244.$1.0/24"; }

# running NAME: the PID in $RUN/NAME.pid is a live process.
running() {
    local pid
    pid="$(cat "$RUN/$1.pid" 2>/dev/null)" && readlink "/proc/$pid/exe" >/dev/null 2>&1
}

# launch NAME COMMAND...: runs COMMAND in the background with its log and PID file.
launch() {
    local name="$1"; shift
    if running "$name"; then
        return
    fi
    (cd / && exec setsid "$@" </dev/null >"$AETHER_LOGS/$name.log" 2>&1) &
    echo $! > "$RUN/$name.pid"
    log "started $name (pid $!, log $AETHER_LOGS/$name.log)"
}

halt() {
    local pid
    if running "$1"; then
        pid="$(cat "$RUN/$1.pid")"
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 50); do readlink "/proc/$pid/exe" >/dev/null 2>&1 || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$RUN/$1.pid"
}

cmd_up() {
    local simulator="$AETHER_RUST_BIN/aether-node"
    if [ ! -x "$simulator" ]; then
        echo "$simulator is missing: build the workspace first (cargo build --workspace)" >&2
        exit 1
    fi
    mkdir -p "$RUN" "$AETHER_LOGS"
    # One identity for every kube-proxy, bound to system:node-proxier by default RBAC.
    write_kubeconfig kube-proxy "$API_URL"
    local i node
    for i in $(seq "$AETHER_NODES"); do
        node="node-$i"
        # The Node authorizer knows a kubelet by this certificate.
        [ -f "$PKI/$node.crt" ] || sign "$node" "/O=system:nodes/CN=system:node:$node" "$CLIENT_EXT" ca
        write_kubeconfig "$node" "$API_URL"
        launch "$node" "$simulator" --name "$node" --kubeconfig "$AETHER_STATE/$node.kubeconfig" \
            --node-ip "$(node_ip "$i")" --pod-cidr "$(pod_cidr "$i")" --netns "$node" \
            --root "$AETHER_STATE/nodes/$node" \
            --image-bin-dir "$AETHER_RUST_BIN" --image-bin-dir "$AETHER_BIN" \
            --cluster-dns "$AETHER_CLUSTER_DNS" --cluster-domain "$AETHER_CLUSTER_DOMAIN"
        # conntrack-max-per-core=0: leave the machine-wide conntrack table alone.
        launch "kube-proxy-$node" ip netns exec "$node" "$AETHER_BIN/kube-proxy" \
            --kubeconfig "$AETHER_STATE/kube-proxy.kubeconfig" --hostname-override "$node" \
            --proxy-mode nftables --cluster-cidr "$AETHER_POD_CIDR" --conntrack-max-per-core 0 \
            --metrics-bind-address 127.0.0.1:10249 --healthz-bind-address 127.0.0.1:10256
    done
    local deadline=$((SECONDS + READY_TIMEOUT))
    for i in $(seq "$AETHER_NODES"); do
        until kubectl wait --for=condition=Ready "node/node-$i" --timeout=5s >/dev/null 2>&1; do
            if ! running "node-$i"; then
                log "node-$i exited; last lines of $AETHER_LOGS/node-$i.log:"
                tail -n 30 "$AETHER_LOGS/node-$i.log" >&2
                exit 1
            fi
            [ "$SECONDS" -lt "$deadline" ] || { log "node-$i not Ready after ${READY_TIMEOUT}s"; exit 1; }
        done
    done
    log "$AETHER_NODES nodes Ready"
}

cmd_down() {
    local pidfile name
    for pidfile in "$RUN"/node-*.pid "$RUN"/kube-proxy-node-*.pid; do
        [ -e "$pidfile" ] || continue
        name="$(basename "$pidfile" .pid)"
        halt "$name"
    done
}

case "${1:-}" in
    up) cmd_up ;;
    down) cmd_down ;;
    *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
