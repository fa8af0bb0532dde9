# shellcheck shell=bash disable=SC2034 # variables for the scripts that source this file
# Paths and settings shared by aether's local-cluster scripts.
# Source it (`. tests/cluster/lib.sh`); it only sets variables, and each can be
# overridden from the environment before sourcing.

# Built binaries, Go caches and build stamps. Survives `control-plane.sh down`.
AETHER_CACHE="${AETHER_CACHE:-/var/cache/aether}"
AETHER_BIN="$AETHER_CACHE/bin"
export GOCACHE="$AETHER_CACHE/go/build" GOMODCACHE="$AETHER_CACHE/go/mod"

# Certificates, kubeconfigs, etcd data, logs and PID files of the running cluster.
AETHER_STATE="${AETHER_STATE:-/var/lib/aether-cluster}"
AETHER_KUBECONFIG="$AETHER_STATE/admin.kubeconfig"
AETHER_LOGS="$AETHER_STATE/logs"

# The nodes' underlay: the bridge aether0 on this host (AETHER_UNDERLAY_HOST_IP),
# one address per node after it, and a pod CIDR per node (see nodes.sh).
AETHER_UNDERLAY_HOST_IP="10.200.0.1"
AETHER_POD_CIDR="10.244.0.0/16"
AETHER_NODES="${AETHER_NODES:-2}"
AETHER_CLUSTER_DNS="10.96.0.10"

# node_ip I, pod_cidr I: node-I's address on the underlay and the range of its pods.
node_ip() { echo "10.200.0.$((10 + $1))"; }
pod_cidr() { echo "10.244.$1.0/24"; }

# Each node's own files (AETHER_NODES_DIR/node-<i>/fs), bound over these paths of the
# machine in the node's mount namespace (node-init.sh): kubelet's, containerd's and the
# CNI's state and config, pod logs, the proxy's state, /tmp, the machine id.
AETHER_NODES_DIR="$AETHER_STATE/nodes"
NODE_PRIVATE_DIRS=(/etc/cni/net.d /opt/cni/bin /var/lib/cni /var/lib/containerd /var/lib/kubelet
    /var/lib/aether /var/log/pods /var/log/containers /tmp)
NODE_PRIVATE_FILES=(/etc/machine-id)

# gateway_api_dir MODULE: the directory of a Gateway API module (sigs.k8s.io/gateway-api, its
# CRDs; sigs.k8s.io/gateway-api/conformance, the conformance manifests) at the version
# tests/gateway-conformance/go.mod pins, downloaded into the module cache if missing.
gateway_api_dir() {
    local dir
    dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/../gateway-conformance" &&
        go mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
    [ -d "$dir" ] || { echo "cannot download the Go module $1 (see tests/gateway-conformance/go.mod)" >&2; return 1; }
    echo "$dir"
}

# cgroup_subsystems OPTIONS: the controllers (or name=...) of a cgroup v1 mount, from its
# mount options; the same words as in /proc/PID/cgroup.
cgroup_subsystems() {
    tr , '\n' <<<"$1" | grep -vxE 'rw|ro|relatime|noatime|nosuid|nodev|noexec|clone_children' | paste -sd,
}
# OCI archives of every image the nodes run (images.sh), imported into each node's
# containerd at start.
AETHER_IMAGES="$AETHER_CACHE/images"
COREDNS_VERSION=v1.15.0
COREDNS_IMAGE="registry.k8s.io/coredns/coredns:$COREDNS_VERSION"
# What kubeadm pins for Kubernetes 1.36; containerd runs every pod's sandbox from it.
PAUSE_IMAGE=registry.k8s.io/pause:3.10.2
# The echo app of the Gateway API conformance manifests (istio-echo/go.mod says what it is).
ECHO_IMAGE=registry.k8s.io/gateway-api/echo-advanced:v1.5.1
# The tests' shell on a node (tests/e2e: Cluster::on_node).
NODE_SHELL_IMAGE=localhost/aether-test/node-shell:1

# The API server listens on AETHER_API_BIND_ADDRESS:AETHER_API_PORT; clients on
# this host use the same address. It publishes AETHER_API_ADVERTISE_ADDRESS
# as the endpoint of the `kubernetes` Service, which pods reach through the
# ClusterIP. Kubernetes rejects a loopback endpoint, so the server listens on, and
# advertises, this host's address on the nodes' underlay bridge (network.sh makes it).
AETHER_API_BIND_ADDRESS="${AETHER_API_BIND_ADDRESS:-$AETHER_UNDERLAY_HOST_IP}"
AETHER_API_PORT="${AETHER_API_PORT:-6443}"
AETHER_API_ADVERTISE_ADDRESS="${AETHER_API_ADVERTISE_ADDRESS:-$AETHER_UNDERLAY_HOST_IP}"
AETHER_SERVICE_CIDR="10.96.0.0/16"
AETHER_CLUSTER_DOMAIN="cluster.local"

# The Go toolchain is preinstalled in /usr/local/go, which is not always on PATH.
case ":$PATH:" in
    *:/usr/local/go/bin:*) ;;
    *) PATH="$PATH:/usr/local/go/bin" ;;
esac
export PATH

# aether's own programs from the workspace build, shared with tests/run.sh.
AETHER_TARGET="${CARGO_TARGET_DIR:-$AETHER_CACHE/target}"
# The cargo profile whose binaries the nodes run (release for benchmarks).
AETHER_PROFILE="${AETHER_PROFILE:-debug}"
AETHER_RUST_BIN="$AETHER_TARGET/$AETHER_PROFILE"
