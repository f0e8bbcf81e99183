#!/usr/bin/env bash
# Where a mesh at rest spends its CPU: runs simulations/mesh_bench.py (NODES nodes, AGENTS agents from
# card files, a 60 s quiet window) and samples the whole machine with perf inside that window, then
# prints the samples of the daemons' runtime workers and, for each symbol named, its share of all
# samples (as `perf report --no-children` gives it) and the samples whose stack holds it.
#
# Usage: simulations/rest_profile.sh BIN [SYMBOL ...]
#        env: NODES (10), AGENTS (10000), START (38: seconds after the bench starts; the quiet window of
#        10 nodes opens about 25 s in), SECONDS_ (25), FREQ (499)
# Needs perf, run as root. Example, the figures of BENCHMARKS.md "A repeated list beats by its last walk":
#   simulations/rest_profile.sh B agentmesh::registry::Live::last 'Registry>::heard'
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$1
shift
nodes=${NODES:-10}
agents=${AGENTS:-10000}
out=$(mktemp -d)
AGENTMESH_BIN=$bin python3 simulations/mesh_bench.py --sizes "$nodes" --agents "$agents" --rounds 1 \
  --quiet-seconds 60 --preload >"$out/bench.txt" 2>&1 &
bench=$!
sleep "${START:-38}"
perf record -a -F "${FREQ:-499}" -g -o "$out/perf.data" -- sleep "${SECONDS_:-25}" >/dev/null 2>&1
wait "$bench"
grep -E "every node holds|CPU at rest" "$out/bench.txt" || true
perf script -i "$out/perf.data" -F comm,ip,sym 2>/dev/null >"$out/stacks.txt"
python3 - "$out/stacks.txt" "$@" <<'EOF'
import re
import sys

samples = [s for s in re.split(r"\n\s*\n", open(sys.argv[1]).read()) if s.strip()]
workers = sum(1 for s in samples if s.lstrip().startswith("tokio-rt-worker"))
print(f"samples {len(samples)}, of the daemons' runtime workers {workers}")
for symbol in sys.argv[2:]:
    inner = sum(1 for s in samples if len(s.strip().split("\n")) > 1 and symbol in s.strip().split("\n")[1])
    anywhere = sum(1 for s in samples if symbol in s)
    print(f"{symbol}: innermost {100 * inner / len(samples):.2f} % of all samples; in the stack of {anywhere}")
EOF
rm -rf "$out"
