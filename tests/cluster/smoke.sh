#!/usr/bin/env bash
# Checks that the control plane of the running local cluster (`up.sh`) really works:
# its controllers and scheduler, ClusterIP allocation, namespace deletion, ServiceAccount
# tokens (with the `aether` audience), CSR signing and streaming list-watches.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/lib.sh"

kubectl() { "$AETHER_BIN/kubectl" --kubeconfig "$AETHER_KUBECONFIG" "$@"; }
NS=aether-smoke
passed=0 failed=0

csr_signed() { test -n "$(kubectl get csr aether-smoke -o jsonpath='{.status.certificate}')"; }

# check NAME COMMAND...: runs COMMAND, counts and reports the result.
check() {
    local name="$1"; shift
    local out
    if out="$("$@" 2>&1)"; then
        passed=$((passed + 1)); echo "ok   $name"
    else
        failed=$((failed + 1)); echo "FAIL $name"; printf '%s\n' "$out" | sed 's/^/     /'
    fi
}

# eventually TIMEOUT COMMAND...: retries COMMAND for up to TIMEOUT seconds.
# COMMAND is run anew each time, so it must not be an expanded "$(...)" value:
# use `equals EXPECTED COMMAND...` for those.
eventually() {
    local deadline=$((SECONDS + $1)); shift
    until "$@"; do
        [ "$SECONDS" -lt "$deadline" ] || return 1
        sleep 0.5
    done
}

count() { kubectl -n "$NS" get "$@" -o name | grep -c . || true; }

# equals EXPECTED COMMAND...: COMMAND prints EXPECTED.
equals() { local want="$1"; shift; test "$("$@")" = "$want"; }

field() { kubectl -n "$NS" get pods -l app=web -o jsonpath="{.items[*].$1}"; }
words() { "$@" | wc -w; }

deployment_makes_pods() {
    kubectl -n "$NS" create deployment web --image=registry.k8s.io/gateway-api/echo-advanced:v1.5.1 --replicas=2
    eventually 60 equals 1 count replicasets -l app=web
    eventually 60 equals 2 count pods -l app=web
    # The scheduler bound both to nodes, whose kubelets run them.
    eventually 60 equals 2 words field spec.nodeName
    eventually 60 equals 'Running Running' field status.phase
}

garbage_collector_removes_dependents() {
    kubectl -n "$NS" delete deployment web --wait=true
    eventually 60 equals 0 count replicasets,pods -l app=web
}

service_gets_cluster_ip() {
    kubectl -n "$NS" create service clusterip web --tcp=80:8080
    local ip
    ip="$(kubectl -n "$NS" get service web -o jsonpath='{.spec.clusterIP}')"
    echo "clusterIP=$ip"
    [[ "$ip" == 10.96.* ]]
}

namespace_deletion_completes() {
    kubectl create namespace aether-smoke-doomed
    kubectl -n aether-smoke-doomed create configmap c --from-literal=k=v
    kubectl delete namespace aether-smoke-doomed --wait=true --timeout=60s
    ! kubectl get namespace aether-smoke-doomed
}

# jwt_payload TOKEN: the JSON payload of a JWT.
jwt_payload() {
    local p
    p="$(cut -d. -f2 <<<"$1" | tr '_-' '/+')"
    while [ $((${#p} % 4)) -ne 0 ]; do p+="="; done
    base64 -d <<<"$p"
}

default_token() {
    local token
    token="$(kubectl -n "$NS" create token default)"
    jwt_payload "$token" | grep -q '"sub":"system:serviceaccount:aether-smoke:default"'
}

aether_audience_token() {
    local token review
    token="$(kubectl -n "$NS" create token default --audience aether)"
    jwt_payload "$token" | grep -q '"aud":\["aether"\]'
    # The API server itself accepts it for that audience.
    review="$(kubectl create -o jsonpath='{.status.authenticated} {.status.audiences}' -f - <<EOF
apiVersion: authentication.k8s.io/v1
kind: TokenReview
spec:
  token: $token
  audiences: [aether]
EOF
)"
    echo "TokenReview: $review"
    [ "$review" = 'true ["aether"]' ]
}

csr_is_signed() {
    local dir
    dir="$(mktemp -d)"
    openssl req -new -newkey rsa:2048 -nodes -keyout "$dir/key" -subj /CN=aether-smoke -out "$dir/csr" 2>/dev/null
    kubectl create -f - <<EOF
apiVersion: certificates.k8s.io/v1
kind: CertificateSigningRequest
metadata:
  name: aether-smoke
spec:
  request: $(base64 -w0 "$dir/csr")
  signerName: kubernetes.io/kube-apiserver-client
  usages: [client auth]
EOF
    rm -rf "$dir"
    kubectl certificate approve aether-smoke
    eventually 60 csr_signed
    kubectl delete csr aether-smoke
}

streaming_list_watch() {
    # What client-go's WatchList and kube-rs's streaming lists send; it needs etcd's
    # watch progress requests, which Debian's etcd 3.4 lacks.
    local events
    events="$(kubectl get --raw '/api/v1/namespaces?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=2')"
    head -n 1 <<<"$events" | cut -c1-300
    head -n 1 <<<"$events" | grep -q '"type":"ADDED"'
}

kubectl delete namespace "$NS" aether-smoke-doomed --ignore-not-found --wait=true >/dev/null
kubectl delete csr aether-smoke --ignore-not-found >/dev/null
kubectl create namespace "$NS" >/dev/null
eventually 60 kubectl -n "$NS" get serviceaccount default >/dev/null 2>&1

check "deployment makes a replicaset and scheduled, running pods" deployment_makes_pods
check "garbage collector removes the replicaset and pods" garbage_collector_removes_dependents
check "service gets a ClusterIP" service_gets_cluster_ip
check "namespace deletion completes" namespace_deletion_completes
check "serviceaccount token" default_token
check "token request with audience aether" aether_audience_token
check "CSR is signed" csr_is_signed
check "streaming list-watch" streaming_list_watch

kubectl delete namespace "$NS" --wait=false >/dev/null
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
