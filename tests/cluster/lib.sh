# shellcheck shell=bash disable=SC2034 # variables for the scripts that source this file
# Paths and settings shared by aether's local-cluster scripts.
# Source it (`. tests/cluster/lib.sh`); it only sets variables, and each can be
# overridden from the environment before sourcing.

# Built binaries, Go caches and build stamps. Survives `control-plane.sh down`.
AETHER_CACHE="${AETHER_CACHE:-/var/cache/aether}"
AETHER_BIN="$AETHER_CACHE/bin"

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

# aether's own programs (the node simulator, the echo server, the mesh) from the
# workspace build, shared with tests/run.sh.
AETHER_TARGET="${CARGO_TARGET_DIR:-$AETHER_CACHE/target}"
# The cargo profile whose binaries the nodes run (release for benchmarks).
AETHER_PROFILE="${AETHER_PROFILE:-debug}"
AETHER_RUST_BIN="$AETHER_TARGET/$AETHER_PROFILE"
