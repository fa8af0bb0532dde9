#!/usr/bin/env bash
# Runs aether's whole test suite: builds the workspace once, starts the local
# cluster (tests/cluster/up.sh) for the integration tests, runs every test, and
# takes the cluster down again (tests/cluster/down.sh), whether the tests passed
# or not. Needs root: the cluster's nodes and pods are network namespaces.
# The cargo target directory and the cluster's builds are kept under $AETHER_CACHE
# so a second run reuses them.
set -euo pipefail
cd "$(dirname "$0")/.."

export AETHER_CACHE="${AETHER_CACHE:-/var/cache/aether}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$AETHER_CACHE/target}"
mkdir -p "$CARGO_TARGET_DIR"

cargo build --workspace --all-targets
trap 'tests/cluster/down.sh >/dev/null 2>&1 || echo "tests/cluster/down.sh failed" >&2' EXIT
tests/cluster/up.sh
tests/cluster/smoke.sh
cargo test --workspace
# Teardown is part of the suite: down.sh fails naming anything of the cluster left behind.
trap - EXIT
tests/cluster/down.sh
