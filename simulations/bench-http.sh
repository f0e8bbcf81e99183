#!/usr/bin/env bash
# HTTP load run against one node holding AGENTS local agents (default 10,000 agents, 40,000 capabilities):
#   1. closed loop, wrk, 1,000 connections, the same query (served by the response cache);
#   2. closed loop, wrk, 1,000 connections, every query new to the cache (the full query path);
#   3. fixed rate, oha, 1,000 req/s over 1,000 connections, latency corrected for coordinated omission;
# then the daemon's RSS. Installs wrk (Debian) and oha (crates.io) when missing.
# Usage: simulations/bench-http.sh            (env: AGENTS, PORT, DURATION)
set -euo pipefail
cd "$(dirname "$0")/.."

AGENTS=${AGENTS:-10000}
PORT=${PORT:-18080}
DURATION=${DURATION:-20}
QUERY="/api/v1/discovery/capabilities?limit=100"

if ! command -v wrk >/dev/null; then
  apt-get update -qq && apt-get install -y -qq wrk >/dev/null
fi
if ! command -v oha >/dev/null; then
  cargo install oha --locked
fi
ulimit -n "$(ulimit -Hn)"  # 1,000 connections need more than the usual 1,024 descriptors

cargo build --release --quiet
work=$(mktemp -d)
cargo bench --quiet --bench discovery -- --populate "$work/data" "$AGENTS"

target/release/agentmesh run --data-dir "$work/data" --http "127.0.0.1:$PORT" --no-mdns --log-format json \
  2>"$work/daemon.log" &
pid=$!
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -rf "$work"' EXIT

for _ in $(seq 1 200); do
  curl -sf "127.0.0.1:$PORT/api/v1/health" >/dev/null && break
  sleep 0.05
done
curl -sf "127.0.0.1:$PORT/api/v1/health"; echo

rss() { awk '/VmRSS|VmHWM/ {printf "%s %d MB  ", $1, $2/1024}' "/proc/$pid/status"; echo; }
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%d GiB", $2/1048576}' /proc/meminfo), $(uname -sr)"
echo "rss after start: $(rss)"

echo "== closed loop, cached query, wrk -t1 -c1000 -d${DURATION}s"
wrk -t1 -c1000 -d"${DURATION}s" --latency "http://127.0.0.1:$PORT$QUERY"
echo "rss: $(rss)"

echo "== closed loop, uncached queries, wrk -t1 -c1000 -d${DURATION}s -s simulations/wrk-uncached.lua"
wrk -t1 -c1000 -d"${DURATION}s" --latency -s simulations/wrk-uncached.lua "http://127.0.0.1:$PORT"
echo "rss: $(rss)"

echo "== fixed rate 1000 req/s, oha -c 1000 -q 1000 -z ${DURATION}s --latency-correction"
oha --no-tui -c 1000 -q 1000 -z "${DURATION}s" --latency-correction "http://127.0.0.1:$PORT$QUERY"
echo "rss: $(rss)"
