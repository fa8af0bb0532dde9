#!/usr/bin/env bash
# Installs aether into the running local cluster (up.sh) from this repository's chart: the
# experimental-channel Gateway API CRDs of the release tests/gateway-conformance/go.mod pins (the
# operator's watch caches, and so its readiness, need them; HTTPRoute `retry` and `CORS` are
# only in that channel), then `helm upgrade --install` of
# the release `aether` into the namespace aether-system (created if missing); waits until
# the operator Deployment is Available.
# Idempotent: run again, it upgrades the release to the chart as it is now. Arguments go to
# helm (e.g. --set ca.svidTTLSeconds=240).
# Remove with tests/cluster/uninstall.sh (helm uninstall).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/lib.sh"

NAMESPACE="${AETHER_NAMESPACE:-aether-system}"
TIMEOUT=120s

log() { printf '[install] %s\n' "$*"; }
kubectl() { "$AETHER_BIN/kubectl" --kubeconfig "$AETHER_KUBECONFIG" "$@"; }
helm() { "$AETHER_BIN/helm" --kubeconfig "$AETHER_KUBECONFIG" "$@"; }

started=$SECONDS
# The experimental channel (a superset of the standard one) of the Gateway API release the
# project tests against; tests/support's Release::crds names the same directory.
gateway_api="$(gateway_api_dir sigs.k8s.io/gateway-api)"
kubectl apply --server-side --force-conflicts -k "$gateway_api/config/crd/experimental" >/dev/null
# helm installs a chart's CRDs only when they are missing; applying them first also brings an
# upgraded cluster's aether CRDs up to date.
kubectl apply --server-side --force-conflicts -f "$here/../../charts/aether/crds" >/dev/null
# No --wait: helm would also wait for the node proxies, and this script's readiness
# criterion is the operator's own. --take-ownership: the operator's tests apply the
# chart's operator RBAC with kubectl, and the release adopts those objects.
helm upgrade --install aether "$here/../../charts/aether" \
    --namespace "$NAMESPACE" --create-namespace --take-ownership --wait=false "$@" >/dev/null
log "release aether applied in $NAMESPACE; waiting up to $TIMEOUT for the operator"
if ! kubectl -n "$NAMESPACE" wait --for=condition=Available deployment/aether-operator \
    --timeout="$TIMEOUT" >/dev/null; then
    log "the operator is not Available after $TIMEOUT:"
    kubectl -n "$NAMESPACE" get deployment,daemonset,pods -o wide >&2 || true
    kubectl -n "$NAMESPACE" get events --sort-by=.lastTimestamp >&2 || true
    exit 1
fi
log "operator Available in $((SECONDS - started))s"
