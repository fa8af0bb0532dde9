#!/usr/bin/env bash
# Runs a real Kubernetes control plane on this machine: etcd, kube-apiserver,
# kube-controller-manager and kube-scheduler as background processes (binaries from
# build.sh, which `up` runs first). The nodes are nodes.sh's.
#
#   control-plane.sh up      build if needed, create certs once, start, wait until ready
#   control-plane.sh status  show each process and the API server's /readyz
#   control-plane.sh down    stop every process and delete etcd's data (certs stay)
#   control-plane.sh purge   down, then delete the whole state directory
#
# Everything lives in $AETHER_STATE (see lib.sh): pki/, *.kubeconfig, etcd/,
# logs/<component>.log, run/<component>.pid. The admin kubeconfig is
# $AETHER_STATE/admin.kubeconfig.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/lib.sh"
. "$here/pki.sh"

RUN="$AETHER_STATE/run"
ETCD_DATA="$AETHER_STATE/etcd"
# Not etcd's usual 2379/2380, so that a distribution's own etcd service cannot clash.
ETCD_CLIENT_URL="http://127.0.0.1:2479"
ETCD_PEER_URL="http://127.0.0.1:2480"
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler)
SA_ISSUER="https://kubernetes.default.svc.$AETHER_CLUSTER_DOMAIN"
READY_TIMEOUT=180

# The API server listens on all addresses when bound to 0.0.0.0; clients on this
# host then use loopback.
API_HOST="$AETHER_API_BIND_ADDRESS"
[ "$API_HOST" = 0.0.0.0 ] && API_HOST=127.0.0.1
API_URL="https://$API_HOST:$AETHER_API_PORT"
# The first address of the service range is the ClusterIP of the `kubernetes` Service.
KUBERNETES_SERVICE_IP="${AETHER_SERVICE_CIDR%.*}.1"

log() { printf '[control-plane] %s\n' "$*"; }
kubectl() { "$AETHER_BIN/kubectl" --kubeconfig "$AETHER_KUBECONFIG" "$@"; }

# ---------------------------------------------------------------- certificates

# Creates what is missing; the API server's certificate is re-issued when its
# addresses change (e.g. AETHER_API_ADVERTISE_ADDRESS is set later).
ensure_pki() {
    mkdir -p "$PKI"
    chmod 700 "$PKI"
    if [ ! -f "$PKI/ca.crt" ]; then
        log "creating certificates in $PKI"
        sign ca "/CN=aether-cluster-ca" "$CA_EXT"
        # The API server trusts client certs of this CA only as a proxy for aggregated APIs.
        sign front-proxy-ca "/CN=aether-front-proxy-ca" "$CA_EXT"
        sign front-proxy-client "/CN=front-proxy-client" "$CLIENT_EXT" front-proxy-ca
        sign admin "/O=system:masters/CN=aether-admin" "$CLIENT_EXT" ca
        sign kube-controller-manager "/CN=system:kube-controller-manager" "$CLIENT_EXT" ca
        sign kube-scheduler "/CN=system:kube-scheduler" "$CLIENT_EXT" ca
        # Bound to the system:node-proxier role by the API server's default RBAC.
        sign kube-proxy "/CN=system:kube-proxy" "$CLIENT_EXT" ca
        openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
        openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
    fi
    local sans="DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
    sans+=",DNS:kubernetes.default.svc.$AETHER_CLUSTER_DOMAIN,IP:127.0.0.1,IP:$KUBERNETES_SERVICE_IP"
    local ip
    for ip in "$AETHER_API_BIND_ADDRESS" "$AETHER_API_ADVERTISE_ADDRESS"; do
        case "$ip" in 0.0.0.0|127.0.0.1) ;; *) sans+=",IP:$ip" ;; esac
    done
    if [ "$(cat "$PKI/apiserver.sans" 2>/dev/null)" != "$sans" ]; then
        sign apiserver "/CN=kube-apiserver" "$SERVER_EXT\nsubjectAltName=$sans" ca
        echo "$sans" > "$PKI/apiserver.sans"
    fi
    # The API server's identity towards kubelets (logs, exec, port-forward), bound to
    # system:kubelet-api-admin once the server runs (see cmd_up).
    [ -f "$PKI/apiserver-kubelet-client.crt" ] ||
        sign apiserver-kubelet-client "/CN=kube-apiserver-kubelet-client" "$CLIENT_EXT" ca
    local name
    for name in admin kube-controller-manager kube-scheduler kube-proxy; do
        write_kubeconfig "$name" "$API_URL"
    done
}

# ---------------------------------------------------------------- processes

binary_of() { echo "$AETHER_BIN/$1"; }

args_of() {
    case "$1" in
        etcd) echo \
            --name=aether --data-dir="$ETCD_DATA" \
            --listen-client-urls="$ETCD_CLIENT_URL" --advertise-client-urls="$ETCD_CLIENT_URL" \
            --listen-peer-urls="$ETCD_PEER_URL" --initial-advertise-peer-urls="$ETCD_PEER_URL" \
            --initial-cluster="aether=$ETCD_PEER_URL" \
            --unsafe-no-fsync ;; # the data is thrown away by `down`; fsync only slows tests
        kube-apiserver) echo \
            --etcd-servers="$ETCD_CLIENT_URL" \
            --bind-address="$AETHER_API_BIND_ADDRESS" --secure-port="$AETHER_API_PORT" \
            --advertise-address="$AETHER_API_ADVERTISE_ADDRESS" \
            --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
            --client-ca-file="$PKI/ca.crt" \
            --authorization-mode=Node,RBAC \
            --allow-privileged=true \
            --service-cluster-ip-range="$AETHER_SERVICE_CIDR" \
            --service-account-issuer="$SA_ISSUER" \
            --service-account-key-file="$PKI/sa.pub" \
            --service-account-signing-key-file="$PKI/sa.key" \
            --api-audiences="$SA_ISSUER,aether" \
            --requestheader-client-ca-file="$PKI/front-proxy-ca.crt" \
            --requestheader-allowed-names=front-proxy-client \
            --requestheader-username-headers=X-Remote-User \
            --requestheader-group-headers=X-Remote-Group \
            --requestheader-extra-headers-prefix=X-Remote-Extra- \
            --proxy-client-cert-file="$PKI/front-proxy-client.crt" \
            --proxy-client-key-file="$PKI/front-proxy-client.key" \
            --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" \
            --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
            --kubelet-certificate-authority="$PKI/ca.crt" \
            --kubelet-preferred-address-types=InternalIP ;; # node names do not resolve here
        kube-controller-manager) local kc="$AETHER_STATE/kube-controller-manager.kubeconfig"; echo \
            --kubeconfig="$kc" --authentication-kubeconfig="$kc" --authorization-kubeconfig="$kc" \
            --bind-address=127.0.0.1 \
            --use-service-account-credentials=true \
            --service-account-private-key-file="$PKI/sa.key" \
            --root-ca-file="$PKI/ca.crt" \
            --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
            --node-monitor-grace-period=20s ;; # a stopped kubelet makes its node NotReady in 20 s, not 50
        kube-scheduler) local kc="$AETHER_STATE/kube-scheduler.kubeconfig"; echo \
            --kubeconfig="$kc" --authentication-kubeconfig="$kc" --authorization-kubeconfig="$kc" \
            --bind-address=127.0.0.1 ;;
    esac
}

# pid_of NAME: prints the PID if NAME runs from its PID file (checking the
# executable, so a reused PID is never taken for ours; a rebuild since it
# started leaves the link as "PATH (deleted)").
pid_of() {
    local pid exe
    pid="$(cat "$RUN/$1.pid" 2>/dev/null)" || return 1
    exe="$(readlink "/proc/$pid/exe" 2>/dev/null)" || return 1
    [ "${exe% (deleted)}" = "$(binary_of "$1")" ] || return 1
    echo "$pid"
}

# alive PID: the process exists and is not a zombie (an exited process whose
# parent has not reaped it yet still has a /proc entry, but no executable).
alive() { readlink "/proc/$1/exe" >/dev/null 2>&1; }

start() {
    local name="$1" pid
    if pid="$(pid_of "$name")"; then
        log "$name already running (pid $pid)"
        return
    fi
    local bin
    bin="$(binary_of "$name")"
    # setsid: the process outlives this script and its terminal.
    # shellcheck disable=SC2046 # args_of prints flags whose values hold no spaces
    (cd / && exec setsid "$bin" $(args_of "$name") </dev/null >"$AETHER_LOGS/$name.log" 2>&1) &
    echo $! > "$RUN/$name.pid"
    log "started $name (pid $!, log $AETHER_LOGS/$name.log)"
}

stop() {
    local name="$1" pid i
    if pid="$(pid_of "$name")"; then
        kill -TERM "$pid"
        for i in $(seq 100); do
            alive "$pid" || break
            sleep 0.1
        done
        if alive "$pid"; then
            log "$name did not stop in 10s, killing it"
            kill -KILL "$pid"
            while alive "$pid"; do sleep 0.1; done
        fi
        log "stopped $name"
    fi
    rm -f "$RUN/$name.pid"
}

# wait_for WHAT COMMAND...: retries COMMAND until it succeeds; fails early if a
# started component died, showing the end of its log.
wait_for() {
    local what="$1"; shift
    local deadline=$((SECONDS + READY_TIMEOUT)) name
    until "$@" >/dev/null 2>&1; do
        for name in "${COMPONENTS[@]}"; do
            # `alive`, not `pid_of`: a component started a moment ago may still be the
            # subshell about to exec it, whose executable is the shell's.
            if [ -f "$RUN/$name.pid" ] && ! alive "$(cat "$RUN/$name.pid")"; then
                log "$name exited; last lines of $AETHER_LOGS/$name.log:"
                tail -n 30 "$AETHER_LOGS/$name.log" >&2
                exit 1
            fi
        done
        if [ "$SECONDS" -ge "$deadline" ]; then
            log "timed out after ${READY_TIMEOUT}s waiting for $what"
            exit 1
        fi
        sleep 0.5
    done
}

# leading NAME: NAME's lease was renewed in the last 15 s, so a controller is
# leading now (a lease left by a controller that has exited, e.g. after an API
# server outage, is older).
leading() {
    local renewed
    renewed="$(kubectl -n kube-system get lease "$1" -o 'jsonpath={.spec.renewTime}')" || return 1
    [ -n "$renewed" ] && [ $(($(date +%s) - $(date -d "$renewed" +%s))) -lt 15 ]
}

# ---------------------------------------------------------------- commands

cmd_up() {
    "$here/build.sh"
    # The API server listens on the underlay bridge.
    "$here/network.sh" up
    local started=$SECONDS
    mkdir -p "$AETHER_STATE" "$AETHER_LOGS" "$RUN"
    # A PID file whose process is gone (it exited, or the machine restarted) is forgotten, so
    # that waiting below watches only what runs.
    local name
    for name in "${COMPONENTS[@]}"; do pid_of "$name" >/dev/null || rm -f "$RUN/$name.pid"; done
    ensure_pki
    start etcd
    start kube-apiserver
    # The controllers exit if they start before the API server has created the
    # RBAC rules they need.
    wait_for "the API server's /readyz" kubectl get --raw /readyz
    kubectl apply --server-side -f - >/dev/null <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: aether:apiserver-kubelet-client
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: system:kubelet-api-admin}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: kube-apiserver-kubelet-client}
EOF
    start kube-controller-manager
    start kube-scheduler
    # Freshly renewed leases show both controllers connected and leading; the
    # ServiceAccount shows the controllers (and token minting) at work.
    wait_for "kube-controller-manager to lead" leading kube-controller-manager
    wait_for "kube-scheduler to lead" leading kube-scheduler
    wait_for "the default ServiceAccount" kubectl -n default get serviceaccount default
    log "ready in $((SECONDS - started))s"
    log "export KUBECONFIG=$AETHER_KUBECONFIG"
}

cmd_down() {
    local i
    for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do stop "${COMPONENTS[i]}"; done
    rm -rf "$ETCD_DATA"
}

cmd_status() {
    local name pid ready code=0
    for name in "${COMPONENTS[@]}"; do
        if pid="$(pid_of "$name")"; then
            printf '%-24s running (pid %s)\n' "$name" "$pid"
        else
            printf '%-24s stopped\n' "$name"
            code=1
        fi
    done
    if [ -x "$AETHER_BIN/kubectl" ] && [ -f "$AETHER_KUBECONFIG" ] &&
        ready="$(kubectl --request-timeout=5s get --raw /readyz 2>&1)"; then
        printf '%-24s %s\n' "/readyz" "$ready"
        printf '%-24s %s\n' "kubeconfig" "$AETHER_KUBECONFIG"
    else
        printf '%-24s not ready\n' "/readyz"
        code=1
    fi
    return "$code"
}

case "${1:-}" in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    purge) cmd_down; rm -rf "$AETHER_STATE" ;;
    *) echo "usage: $0 up|status|down|purge" >&2; exit 2 ;;
esac
