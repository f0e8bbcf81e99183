#!/usr/bin/env bash
# HTTP load run against one node holding AGENTS local agents (default 10,000 agents, 40,000 capabilities),
# side by side with nginx serving the very same response bytes as a static file:
#   0. start-up: from exec to a health answer that counts every agent, twice (the first after dropping
#      the page cache when run as root), and the RSS then;
#   1. closed loop, wrk, 1,000 connections, the same query (served by the response cache), then the
#      same bytes from nginx;
#   2. closed loop, wrk, 1,000 connections, random pages of 100 (every query new to the cache);
#   3. fixed rate, oha, 1,000 req/s over 1,000 connections, latency corrected for coordinated omission;
# with the daemon's RSS after each. Installs wrk and nginx (Debian) and oha (crates.io) when missing.
# The daemon's page faults (minor, /proc/PID/stat) are printed after each closed-loop run.
# Usage: simulations/bench-http.sh            (env: AGENTS, PORT, DURATION; FIXED_RATE=0 skips step 3
#                                               and the oha install, which builds it from source; BIN, a
#                                               daemon binary to measure instead of building this tree's;
#                                               POPULATE_BIN, the discovery bench's binary to populate with)
set -euo pipefail
cd "$(dirname "$0")/.."

# Exported: `wrk-uncached.lua` reads it for the range of its random offsets.
export AGENTS=${AGENTS:-10000}
PORT=${PORT:-18080}
NGINX_PORT=$((PORT + 1))
DURATION=${DURATION:-20}
QUERY="/api/v1/discovery/capabilities?limit=100"

if ! command -v wrk >/dev/null || ! command -v nginx >/dev/null; then
  apt-get update -qq && apt-get install -y -qq wrk nginx-light >/dev/null
fi
FIXED_RATE=${FIXED_RATE:-1}
if [ "$FIXED_RATE" != 0 ] && ! command -v oha >/dev/null; then
  cargo install oha --locked
fi
ulimit -n "$(ulimit -Hn)"  # 1,000 connections need more than the usual 1,024 descriptors

BIN=${BIN:-}
if [ -z "$BIN" ]; then
  cargo build --release --quiet
  BIN=target/release/agentmesh
fi
work=$(mktemp -d)
if [ -n "${POPULATE_BIN:-}" ]; then
  "$POPULATE_BIN" --populate "$work/data" "$AGENTS"
else
  cargo bench --quiet --bench discovery -- --populate "$work/data" "$AGENTS"
fi
# A node holding more local agents than the default limit is configured for them.
limit=$((AGENTS > 20000 ? AGENTS : 20000))

pid=
nginx_pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  [ -n "$nginx_pid" ] && kill "$nginx_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

start_daemon() {
  local started
  started=$(date +%s%N)
  "$BIN" run --data-dir "$work/data" --http "127.0.0.1:$PORT" --no-mdns \
    --listen /ip4/127.0.0.1/tcp/0 --max-agents-per-publisher "$limit" --log-format json \
    2>>"$work/daemon.log" &
  pid=$!
  local deadline=$((started + 120000000000))  # 120 s
  until curl -sf "127.0.0.1:$PORT/api/v1/health" 2>/dev/null | grep -q "\"agents\":$AGENTS,"; do
    kill -0 "$pid" 2>/dev/null || { tail -5 "$work/daemon.log"; exit 1; }
    [ "$(date +%s%N)" -lt "$deadline" ] || { echo "not ready within 120 s"; tail -5 "$work/daemon.log"; exit 1; }
    sleep 0.005
  done
  echo "ready after $(( ($(date +%s%N) - started) / 1000000 )) ms"
}
stop_daemon() { kill "$pid"; wait "$pid" 2>/dev/null || true; pid=; }

rss() { awk '/VmRSS|VmHWM/ {printf "%s %d MB  ", $1, $2/1024}' "/proc/$pid/status"; echo; }
# The daemon's minor page faults so far (field 10 of /proc/PID/stat; the name in field 2 has no spaces).
faults() { awk '{print $10}' "/proc/$pid/stat"; }
# faulted COMMAND...: runs it, then prints the daemon's page faults meanwhile and its RSS.
faulted() {
  local before
  before=$(faults)
  "$@"
  echo "page faults during the run: $(( $(faults) - before ))"
  echo "rss: $(rss)"
}
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(awk '/MemTotal/ {printf "%d GiB", $2/1048576}' /proc/meminfo), $(uname -sr)"

echo "== start-up with $AGENTS agents"
if [ "$(id -u)" = 0 ] && sync && echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; then
  echo -n "page cache dropped: "
else
  echo -n "page cache as it is: "
fi
start_daemon
stop_daemon
echo -n "again, store files in the page cache: "
start_daemon
echo "rss after start: $(rss)"

echo "== closed loop, cached query, wrk -t1 -c1000 -d${DURATION}s"
faulted wrk -t1 -c1000 -d"${DURATION}s" --latency "http://127.0.0.1:$PORT$QUERY"

echo "== the same bytes from nginx (sendfile, $(nproc) workers), wrk -t1 -c1000 -d${DURATION}s"
mkdir -p "$work/nginx/html" "$work/nginx/logs"
curl -sf "127.0.0.1:$PORT$QUERY" >"$work/nginx/html/page.json"
cat >"$work/nginx/nginx.conf" <<CONF
worker_processes auto;
daemon off;
pid $work/nginx/nginx.pid;
error_log $work/nginx/logs/error.log;
events { worker_connections 4096; }
http {
  access_log off;
  sendfile on; tcp_nopush on; keepalive_requests 1000000;
  server { listen 127.0.0.1:$NGINX_PORT; root $work/nginx/html; default_type application/json; }
}
CONF
# nginx's workers drop root for an unprivileged user, which must be able to read the page.
chmod 755 "$work" "$work/nginx" "$work/nginx/html"
chmod 644 "$work/nginx/html/page.json"
nginx -c "$work/nginx/nginx.conf" -p "$work/nginx" &
nginx_pid=$!
for _ in $(seq 200); do curl -sf "127.0.0.1:$NGINX_PORT/page.json" >/dev/null && break; sleep 0.05; done
curl -sf "127.0.0.1:$NGINX_PORT/page.json" >/dev/null || { echo "nginx does not serve the page"; cat "$work/nginx/logs/error.log"; exit 1; }
echo "nginx serves $(stat -c %s "$work/nginx/html/page.json") bytes"
wrk -t1 -c1000 -d"${DURATION}s" --latency "http://127.0.0.1:$NGINX_PORT/page.json"
kill "$nginx_pid"; wait "$nginx_pid" 2>/dev/null || true; nginx_pid=

echo "== closed loop, uncached queries, wrk -t1 -c1000 -d${DURATION}s -s simulations/wrk-uncached.lua"
faulted wrk -t1 -c1000 -d"${DURATION}s" --latency -s simulations/wrk-uncached.lua \
  "http://127.0.0.1:$PORT"

if [ "$FIXED_RATE" != 0 ]; then
  echo "== fixed rate 1000 req/s, oha -c 1000 -q 1000 -z ${DURATION}s --latency-correction"
  oha --no-tui -c 1000 -q 1000 -z "${DURATION}s" --latency-correction "http://127.0.0.1:$PORT$QUERY"
  echo "rss: $(rss)"
fi
