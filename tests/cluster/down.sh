#!/usr/bin/env bash
# Takes the local cluster down completely: node simulators and kube-proxies, every
# pod's processes and network namespace (and so its nft tables), the node
# network, and the control plane with its data. Certificates and builds stay.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/lib.sh"

"$here/nodes.sh" down
"$here/network.sh" down
"$here/control-plane.sh" down
rm -rf "$AETHER_STATE/nodes"
