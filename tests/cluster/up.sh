#!/usr/bin/env bash
# Starts aether's whole local cluster, building what is missing: the control plane
# (control-plane.sh), the node network (network.sh), the nodes (nodes.sh), cluster
# DNS, and the GAMMA conformance base workloads (echo-v1, echo-v2) from
# ../shared/conformance. Idempotent; `down.sh` takes it all away.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/lib.sh"

started=$SECONDS
profile_flag=()
[ "$AETHER_PROFILE" = release ] && profile_flag=(--release)
(cd "$here/../.." && CARGO_TARGET_DIR="$AETHER_TARGET" cargo build --workspace --bins --quiet "${profile_flag[@]}")
"$here/control-plane.sh" up
"$here/nodes.sh" up
kubectl() { "$AETHER_BIN/kubectl" --kubeconfig "$AETHER_KUBECONFIG" "$@"; }
kubectl apply --server-side -f "$here/addons/coredns.yaml" >/dev/null
kubectl -n kube-system rollout status deployment/coredns --timeout=120s >/dev/null
conformance="${AETHER_SHARED:-$here/../../../shared}/conformance/manifests/manifests.yaml"
if [ -f "$conformance" ]; then
    kubectl apply --server-side -f "$conformance" >/dev/null
    for ns in gateway-conformance-mesh gateway-conformance-mesh-consumer; do
        kubectl -n "$ns" wait --for=condition=Available deployment --all --timeout=120s >/dev/null
    done
fi
echo "[up] local cluster ready in $((SECONDS - started))s: export KUBECONFIG=$AETHER_KUBECONFIG"
