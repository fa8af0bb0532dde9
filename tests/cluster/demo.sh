#!/usr/bin/env bash
# The README's first command: aether, working, on this machine.
#
# Builds what is missing and starts the local cluster (up.sh: control plane, 2 nodes with
# kubelet and containerd, DNS), installs aether with `helm install` from charts/aether
# (install.sh), deploys demo.yaml (a namespace opted in with aether.io/managed=true, echo-v1
# and echo-v2 under ServiceAccounts of their own, an HTTPRoute that splits `echo` 70/30
# between them), and sends requests from the echo-v1 pod through the mesh with `kubectl
# exec`: each line shows which backend answered, its ServiceAccount, and the caller identity
# the backend saw (verified by mTLS). Idempotent; `tests/cluster/down.sh` stops everything.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/lib.sh"

NS=aether-demo
REQUESTS="${AETHER_DEMO_REQUESTS:-20}"

log() { printf '[demo] %s\n' "$*"; }
kubectl() { "$AETHER_BIN/kubectl" --kubeconfig "$AETHER_KUBECONFIG" "$@"; }

started=$SECONDS
"$here/up.sh"
"$here/install.sh"
kubectl -n aether-system rollout status daemonset/aether-proxy --timeout=120s >/dev/null
log "aether is running: operator (2 replicas) and one proxy per node"

kubectl apply --server-side -f "$here/demo.yaml" >/dev/null
for version in v1 v2; do
    kubectl -n "$NS" rollout status "deployment/echo-$version" --timeout=120s >/dev/null
done
# The operator derives the RouteTarget from the route; wait for it, then for it to be Accepted.
for _ in $(seq 120); do
    kubectl -n "$NS" get routetarget echo >/dev/null 2>&1 && break
    sleep 0.5
done
kubectl -n "$NS" wait --for=condition=Accepted routetarget/echo --timeout=60s >/dev/null
# Every node's proxy reports the config generation it applied.
for _ in $(seq 120); do
    pending="$(kubectl get nodeconfigs -o jsonpath='{range .items[*]}{.metadata.generation}={.status.appliedGeneration}{"\n"}{end}' |
        awk -F= '$1 != $2' | wc -l)"
    [ "$pending" = 0 ] && break
    sleep 0.5
done
log "HTTPRoute echo-split: echo:80 -> echo-v1 70%, echo-v2 30%"
kubectl -n "$NS" get routetargets

# The ServiceAccount of every pod, to show which identity served each request.
accounts="$(kubectl -n "$NS" get pods -o jsonpath='{range .items[*]}{.metadata.name}={.spec.serviceAccountName}{"\n"}{end}')"
client_pod="$(kubectl -n "$NS" get pods -l app=echo,version=v1 --field-selector=status.phase=Running \
    -o jsonpath='{.items[0].metadata.name}')"
log "$REQUESTS requests from pod $client_pod (ServiceAccount echo-v1) to http://echo/:"
kubectl -n "$NS" exec "$client_pod" -c echo -- client http://echo/ --count="$REQUESTS" |
    awk -v accounts="$accounts" '
        BEGIN {
            n = split(accounts, lines, "\n")
            for (i = 1; i <= n; i++) { split(lines[i], kv, "="); sa[kv[1]] = kv[2] }
        }
        /^\[[0-9]+\] StatusCode=/ { sub(/^[^=]*=/, ""); status = $0 }
        /^\[[0-9]+ body\] Hostname=/ { sub(/^[^=]*=/, ""); host = $0 }
        /^\[[0-9]+ body\] RequestHeader=X-Aether-Client-Identity:/ { sub(/^[^:]*:/, ""); id = $0 }
        /^$/ { if (host != "") show() }
        END { if (host != "") show(); summary() }
        function show() {
            printf "  %s  served by %-28s (sa %s), which saw caller %s\n", status, host, sa[host], id
            split(host, parts, "-"); count[parts[1] "-" parts[2]]++; total++
            host = ""; id = ""; status = ""
        }
        function summary() {
            printf "split:"
            for (b in count) printf "  %s %d/%d", b, count[b], total
            printf "\n"
        }'

cat <<EOF

aether is running in the local cluster (ready in $((SECONDS - started))s). Use kubectl against it:
  export KUBECONFIG=$AETHER_KUBECONFIG PATH=$AETHER_BIN:\$PATH
  kubectl get routetargets -A          # route targets, their backends and status
  kubectl get nodeconfigs              # what each node's proxy applied
  kubectl -n aether-system get pods    # the operator and the node proxies
  kubectl -n $NS logs deploy/echo-v1  # logs; kubectl exec and port-forward work too
Stop everything: tests/cluster/down.sh
EOF
