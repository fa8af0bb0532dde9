#!/usr/bin/env bash
# cargo-fuzz at depth: each fuzz target runs RUNS executions (default 10 million) with nightly
# Rust and coverage guidance, from the seeds and tokens of its stable test in the crate's
# tests/fuzz.rs (which writes them when AETHER_FUZZ_SEEDS is set). Prints, per target, the
# executions, the seconds and the corpus size; a crash stops the script, and libFuzzer's
# reproducer is left under $AETHER_FUZZ_DIR/artifacts/TARGET/ to become a regression test.
#
#   tests/fuzz.sh [RUNS] [TARGET...]    targets: config protocol http_routing route_target
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
runs=${1:-10000000}
shift || true
work=${AETHER_FUZZ_DIR:-/var/cache/aether/fuzz}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/cache/aether/target}

rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz > /dev/null || cargo install cargo-fuzz --locked

# TARGET  CRATE  STABLE-TEST (the one holding its seeds)
all=(
    "config cni the_config_parser_survives_mutated_input"
    "protocol cni the_protocol_decoder_survives_mutated_input"
    "http_routing proxy http_routing_survives_mutated_requests"
    "route_target routing route_target_specs_compile_or_are_refused_with_a_message"
)
chosen=("$@")
for entry in "${all[@]}"; do
    read -r target crate test <<< "$entry"
    if [ ${#chosen[@]} -gt 0 ] && [[ ! " ${chosen[*]} " == *" $target "* ]]; then
        continue
    fi
    corpus=$work/corpus/$target
    artifacts=$work/artifacts/$target/
    mkdir -p "$corpus" "$artifacts"
    (cd "$root" && AETHER_FUZZ_SEEDS=$corpus cargo test -q --workspace --test fuzz -- --exact "$test" > /dev/null)
    log=$work/$target.log
    started=$(date +%s)
    # No sanitizer: the code fuzzed is safe Rust, whose memory errors are panics anyway, and
    # AddressSanitizer would cost half the executions.
    (cd "$root/$crate" && cargo +nightly fuzz run -s none --target-dir "$work/target" "$target" "$corpus" -- \
        -runs="$runs" -dict="$corpus.dict" -artifact_prefix="$artifacts" -print_final_stats=1 \
        > "$log" 2>&1) || { tail -40 "$log"; echo "[fuzz] $target: crashed, see $log and $artifacts" >&2; exit 1; }
    done_line=$(grep -E '^Done [0-9]+ runs' "$log" | tail -1)
    echo "[fuzz] $target: ${done_line:-no summary} (wall $(( $(date +%s) - started )) s, corpus $(ls "$corpus" | wc -l) inputs)"
done
