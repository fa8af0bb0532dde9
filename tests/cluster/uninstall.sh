#!/usr/bin/env bash
# Removes aether from the running local cluster: `helm uninstall` of the release `aether`
# (each node proxy takes every pod's table and aether-cni's entry out of its node before it
# exits), then waits until no pod of the release is left. Does nothing if it is not installed.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/lib.sh"

NAMESPACE="${AETHER_NAMESPACE:-aether-system}"
helm() { "$AETHER_BIN/helm" --kubeconfig "$AETHER_KUBECONFIG" "$@"; }
kubectl() { "$AETHER_BIN/kubectl" --kubeconfig "$AETHER_KUBECONFIG" "$@"; }

if helm status aether -n "$NAMESPACE" >/dev/null 2>&1; then
    helm uninstall aether -n "$NAMESPACE" --wait --timeout 120s >/dev/null
fi
kubectl -n "$NAMESPACE" wait --for=delete pod -l app.kubernetes.io/part-of=aether --timeout=120s >/dev/null 2>&1 || true
echo "[uninstall] aether is not installed in $NAMESPACE"
