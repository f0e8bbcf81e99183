#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each (default 60), one after the other, from the committed
# corpus. Needs cargo-fuzz (`cargo install cargo-fuzz --locked`); the stable toolchain is enough,
# since RUSTC_BOOTSTRAP lets it pass the sanitizer flags. Exits non-zero on the first finding
# (the crashing input is left in fuzz/artifacts/<target>/).
#
#   fuzz/run.sh 600                 # the 10-minute campaign per target
#   fuzz/run.sh 20                  # the short pass .ci/run makes
#   fuzz/run.sh 600 query_parse     # one target
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true
export RUSTC_BOOTSTRAP=1
targets=("$@")
[ "${#targets[@]}" -gt 0 ] || targets=(wire_open card_validate query_parse xml_render)
cargo fuzz build
for t in "${targets[@]}"; do
    # A scratch copy of the corpus: what a run discovers does not pile up in the committed seeds.
    work="$(mktemp -d)"
    cp -r "fuzz/corpus/$t/." "$work/"
    echo "fuzz: $t for ${seconds}s"
    log="$work.log"
    status=0
    cargo fuzz run "$t" "$work" -- -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 >"$log" 2>&1 || status=$?
    grep -E '^(#[0-9]+\s+DONE|stat::number_of_executed_units|stat::peak_rss_mb)' "$log" || true
    rm -rf "$work"
    if [ "$status" -ne 0 ]; then
        tail -n 40 "$log" >&2
        echo "fuzz: $t found a failing input (fuzz/artifacts/$t/)" >&2
        exit 1
    fi
    rm -f "$log"
done
echo "fuzz: all targets clean"
