#!/usr/bin/env bash
# Runs aether's whole test suite: builds the workspace once, then runs every test.
# The cargo target directory is kept under $AETHER_CACHE so a second run reuses it.
set -euo pipefail
cd "$(dirname "$0")/.."

export AETHER_CACHE="${AETHER_CACHE:-/var/cache/aether}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$AETHER_CACHE/target}"
mkdir -p "$CARGO_TARGET_DIR"

cargo build --workspace --all-targets
cargo test --workspace
