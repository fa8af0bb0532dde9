#!/usr/bin/env bash
# The README's first command: aether, working, on this machine.
#
# Builds what is missing and starts the local cluster (up.sh: control plane, 2 nodes, DNS,
# the GAMMA conformance echo workloads), installs aether with `helm install` from
# charts/aether (install.sh), opts the conformance namespace in (aether.io/managed=true)
# with one ServiceAccount per version, applies an HTTPRoute that splits `echo` 70/30
# between echo-v1 and echo-v2, and sends requests from the echo-v1 pod through the mesh:
# each line shows which backend answered, its identity, and the client identity the
# backend saw (verified by mTLS). Idempotent; `tests/cluster/down.sh` stops everything.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/lib.sh"

NS=gateway-conformance-mesh
REQUESTS="${AETHER_DEMO_REQUESTS:-20}"

log() { printf '[demo] %s\n' "$*"; }
kubectl() { "$AETHER_BIN/kubectl" --kubeconfig "$AETHER_KUBECONFIG" "$@"; }

started=$SECONDS
"$here/up.sh"
"$here/install.sh"
kubectl -n aether-system rollout status daemonset/aether-proxy --timeout=120s >/dev/null
log "aether is running: operator (2 replicas) and one proxy per node"

# Pods started before aether was there are not captured: opt the namespace in, give each
# version its own identity, and let the Deployments roll so every pod goes through aether-cni.
kubectl label namespace "$NS" aether.io/managed=true --overwrite >/dev/null
stamp="$(date +%s)"
for version in v1 v2; do
    kubectl -n "$NS" create serviceaccount "echo-$version" --dry-run=client -o yaml |
        kubectl apply --server-side -f - >/dev/null
    # The stamp makes the pods roll even when the ServiceAccount is already set.
    kubectl -n "$NS" patch deployment "echo-$version" --type=merge -p \
        "{\"spec\":{\"template\":{\"metadata\":{\"annotations\":{\"aether.io/demo\":\"$stamp\"}},\"spec\":{\"serviceAccountName\":\"echo-$version\"}}}}" >/dev/null
done
for version in v1 v2; do
    kubectl -n "$NS" rollout status "deployment/echo-$version" --timeout=120s >/dev/null
done

kubectl apply -f - >/dev/null <<EOF
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: echo-split
  namespace: $NS
spec:
  parentRefs:
  - group: ""
    kind: Service
    name: echo
    port: 80
  rules:
  - backendRefs:
    - name: echo-v1
      port: 80
      weight: 70
    - name: echo-v2
      port: 80
      weight: 30
EOF
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

client_pod="$(kubectl -n "$NS" get pods -l app=echo,version=v1 -o jsonpath='{.items[0].metadata.name}')"
uid="$(kubectl -n "$NS" get pod "$client_pod" -o jsonpath='{.metadata.uid}')"
node="$(kubectl -n "$NS" get pod "$client_pod" -o jsonpath='{.spec.nodeName}')"
pid="$(cat "$AETHER_STATE/nodes/$node/pods/$uid/echo.pid")"
log "$REQUESTS requests from pod $client_pod (ServiceAccount echo-v1) to http://echo/:"
# `kubectl exec`, as the node simulator runs it: the pod's network, mount and UTS namespaces.
nsenter -t "$pid" -n -m -u -- "$AETHER_RUST_BIN/aether-echo" client http://echo/ --count="$REQUESTS" |
    awk -F'=' '
        /^\[[0-9]+\] StatusCode=/ { status = $2 }
        /^\[[0-9]+ body\] Hostname=/ { host = $2 }
        /^\[[0-9]+ body\] ServiceAccount=/ { sa = $2 }
        /^\[[0-9]+ body\] Identity=/ { id = $2 }
        /^$/ { if (host != "") show() }
        END { if (host != "") show(); summary() }
        function show() {
            printf "  %s  served by %-28s (sa %s), which saw caller %s\n", status, host, sa, id
            split(host, parts, "-"); count[parts[1] "-" parts[2]]++; total++
            host = ""; sa = ""; id = ""; status = ""
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
Stop everything: tests/cluster/down.sh
EOF
