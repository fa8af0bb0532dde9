#!/usr/bin/env bash
# Runs aether's whole test suite: builds the workspace once, starts the local
# cluster (tests/cluster/up.sh) for the integration tests, runs the upstream Gateway
# API conformance suite (tests/gateway-conformance/run.sh) and every test of the
# workspace, and takes the cluster down again (tests/cluster/down.sh), whether the
# tests passed or not. Needs root: the cluster's nodes run in namespaces of this machine.
# The cargo target directory and the cluster's builds are kept under $AETHER_CACHE
# so a second run reuses them.
set -euo pipefail
cd "$(dirname "$0")/.."

export AETHER_CACHE="${AETHER_CACHE:-/var/cache/aether}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$AETHER_CACHE/target}"
mkdir -p "$CARGO_TARGET_DIR"
# The suite's time is a budget: each phase says when it starts.
phase() { echo "[run.sh $((SECONDS / 60))m$((SECONDS % 60))s] $*"; }

phase "building the workspace"
cargo build --workspace --bins --tests
# The suite starts on a new cluster: whatever a killed run or a restarted machine left goes.
phase "starting the local cluster"
tests/cluster/down.sh
trap 'tests/cluster/down.sh >/dev/null 2>&1 || echo "tests/cluster/down.sh failed" >&2' EXIT
tests/cluster/up.sh
tests/cluster/smoke.sh
# The upstream Gateway API conformance suite, unmodified, against aether installed by Helm.
phase "the upstream Gateway API conformance suite"
tests/cluster/install.sh
tests/gateway-conformance/run.sh
# Each test installs what it needs; the operator's own tests run it in-process, alone.
tests/cluster/uninstall.sh
phase "cargo test --workspace"
cargo test --workspace
# Teardown is part of the suite: down.sh fails naming anything of the cluster left behind.
trap - EXIT
phase "taking the cluster down"
tests/cluster/down.sh
phase "done"
