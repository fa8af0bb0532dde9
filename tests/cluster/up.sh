#!/usr/bin/env bash
# Starts aether's whole local cluster, building what is missing: the control plane
# (control-plane.sh, which builds the upstream programs with build.sh), the images every
# node imports (images.sh: aether's, the pause sandbox, CoreDNS, the conformance echo app),
# the node network and the nodes (nodes.sh: kubelet, containerd and runc per node), and
# cluster DNS. Idempotent; `down.sh` takes it all away.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/lib.sh"

started=$SECONDS
"$here/control-plane.sh" up
"$here/images.sh"
"$here/nodes.sh" up
kubectl() { "$AETHER_BIN/kubectl" --kubeconfig "$AETHER_KUBECONFIG" "$@"; }
kubectl apply --server-side -f "$here/addons/coredns.yaml" >/dev/null
kubectl -n kube-system rollout status deployment/coredns --timeout=120s >/dev/null
echo "[up] local cluster ready in $((SECONDS - started))s: export KUBECONFIG=$AETHER_KUBECONFIG"
