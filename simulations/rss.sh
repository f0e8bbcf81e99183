#!/usr/bin/env bash
# Resident memory of a node, read from /proc/PID/status 3 s after its health answer counts every agent:
#   starts: a node started STARTS times on a store of AGENTS local agents (the first start after
#           dropping the page cache when run as root), each with its time to ready and its RSS;
#           AGENTS=0 starts an empty node; on a store an older version wrote (POPULATE_BIN of that
#           version), also the rows the node writes again after its start, and its RSS then;
#   join:   a publisher of AGENTS agents and one empty node bootstrapping to it: the joiner's RSS once it
#           holds every agent and 15 s later, the publisher's, and the joiner's again after a restart on
#           its own data directory (the same view, loaded instead of caught up); and the CPU each of
#           the two spends at rest, over 10 s from then;
#   collect: as join, and 15 s after the catch-up the joiner's anonymous RSS before and after
#           `mi_collect(true)` is called in every one of its threads (gdb; root, or ptrace allowed):
#           what the allocator still held that collecting gives back; with EACH=1, one thread at a
#           time, the RSS after each.
#   PROFILE=FILE with join or collect: the joiner's catch-up, from its start until it holds every
#           agent, sampled into FILE (`perf record -F 999 --call-graph dwarf,16384`; read it with
#           `perf report -i FILE --children`).
# Usage: simulations/rss.sh starts|join|collect   (env: AGENTS, default 10,000; STARTS, default 6; PORT; EACH;
#        BIN, a daemon binary to measure instead of building this tree's; POPULATE_BIN, the discovery
#        bench's binary to populate with, as simulations/join_big.py takes it)
set -euo pipefail
cd "$(dirname "$0")/.."

MODE=${1:-starts}
AGENTS=${AGENTS:-10000}
STARTS=${STARTS:-6}
PORT=${PORT:-18180}
BIN=${BIN:-}
# A node holding more local agents than the default limit is configured for them.
LIMIT=$((AGENTS > 20000 ? AGENTS : 20000))

if [ -z "$BIN" ]; then
  cargo build --release --quiet
  BIN=target/release/agentmesh
fi
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
if [ "$AGENTS" -gt 0 ]; then
  if [ -n "${POPULATE_BIN:-}" ]; then
    "$POPULATE_BIN" --populate "$work/data" "$AGENTS" >/dev/null
  else
    cargo bench --quiet --bench discovery -- --populate "$work/data" "$AGENTS" >/dev/null
  fi
else
  mkdir -p "$work/data"
fi

# start DIR HTTP_PORT LISTEN_PORT [BOOTSTRAP]: starts a node, sets $pid.
start() {
  local args=(run --data-dir "$1" --http "127.0.0.1:$2" --no-mdns --listen "/ip4/127.0.0.1/tcp/$3"
    --max-agents-per-publisher "$LIMIT")
  [ -n "${4:-}" ] && args+=(--bootstrap "$4")
  "$BIN" "${args[@]}" 2>>"$work/daemon.log" &
  pid=$!
  pids+=("$pid")
}

# ready HTTP_PORT: waits (120 s at most) until the node's health counts every agent; prints the time.
ready() {
  local started deadline
  started=$(date +%s%N)
  deadline=$((started + 120000000000))
  until curl -sf "127.0.0.1:$1/api/v1/health" 2>/dev/null | grep -q "\"agents\":$AGENTS,"; do
    kill -0 "$pid" 2>/dev/null || { tail -5 "$work/daemon.log"; exit 1; }
    [ "$(date +%s%N)" -lt "$deadline" ] || { echo "not ready within 120 s"; exit 1; }
    sleep 0.005
  done
  echo -n "ready after $(( ($(date +%s%N) - started) / 1000000 )) ms"
}

rss() { awk '/VmRSS|RssAnon|RssFile/ {printf "%s %d MB  ", $1, $2/1024}' "/proc/$1/status"; }
stop() { kill "$1"; wait "$1" 2>/dev/null || true; }
# cpu PID...: each process's CPU over the next 10 s, in ms per second (/proc/PID/stat, user + system).
cpu() {
  local ticks=() i=0 tck
  tck=$(getconf CLK_TCK)
  for p in "$@"; do ticks+=("$(awk '{print $14 + $15}' "/proc/$p/stat")"); done
  sleep 10
  for p in "$@"; do
    echo -n "$(( ($(awk '{print $14 + $15}' "/proc/$p/stat") - ticks[i]) * 1000 / tck / 10 )) ms/s  "
    i=$((i + 1))
  done
}

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(uname -sr)"
case "$MODE" in
  starts)
    for i in $(seq "$STARTS"); do
      cold="warm"
      if [ "$i" = 1 ] && [ "$(id -u)" = 0 ] && sync && echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; then
        cold="page cache dropped"
      fi
      logged=$(wc -l <"$work/daemon.log" 2>/dev/null || echo 0)
      start "$work/data" "$PORT" 0
      echo -n "start $i ($cold): "
      ready "$PORT"
      sleep 3
      echo -n ", 3 s later: $(rss "$pid")"
      # Rows of an older form (a store POPULATE_BIN of an earlier version wrote) are written again by
      # the node a few seconds after its start: wait (30 s at most) for that, then read RSS again.
      if tail -n +"$((logged + 1))" "$work/daemon.log" | grep "store opened" | grep -q "rewrite=[1-9]"; then
        for _ in $(seq 300); do
          tail -n +"$((logged + 1))" "$work/daemon.log" | grep -q "written again" && break
          sleep 0.1
        done
        sleep 1
        echo -n "; $(tail -n +"$((logged + 1))" "$work/daemon.log" | grep -o 'written again.*rows=[0-9]* took_ms=[0-9]*' | grep -o 'rows=.*'),"
        echo -n " 1 s later: $(rss "$pid")"
      fi
      echo
      stop "$pid"
    done
    ;;
  join | collect)
    start "$work/data" "$PORT" $((PORT + 1))
    publisher=$pid
    ready "$PORT" >/dev/null
    peer=$(curl -sf "127.0.0.1:$PORT/api/v1/health" | sed 's/.*"peer_id":"\([^"]*\)".*/\1/')
    mkdir -p "$work/joiner"
    start "$work/joiner" $((PORT + 2)) 0 "/ip4/127.0.0.1/tcp/$((PORT + 1))/p2p/$peer"
    if [ -n "${PROFILE:-}" ]; then
      perf record -q -F 999 --call-graph dwarf,16384 -p "$pid" -o "$PROFILE" &
      perf_pid=$!
    fi
    echo -n "joiner: "
    ready $((PORT + 2))
    if [ -n "${PROFILE:-}" ]; then
      kill -INT "$perf_pid"
      wait "$perf_pid" || true
    fi
    echo ", then: $(rss "$pid")"
    sleep 15
    echo "15 s later: joiner $(rss "$pid"); publisher $(rss "$publisher")"
    echo "CPU at rest over the next 10 s: joiner, publisher: $(cpu "$pid" "$publisher")"
    if [ "$MODE" = collect ]; then
      if [ -n "${EACH:-}" ]; then
        # One thread at a time, by its kernel id, so that what each gives back shows.
        for tid in $(ls /proc/"$pid"/task); do
          gdb -p "$pid" -batch \
            -ex "python [t.switch() for t in gdb.selected_inferior().threads() if t.ptid[1] == $tid]" \
            -ex "call (void)mi_collect(1)" >/dev/null 2>&1
          echo "  after thread $tid ($(cat /proc/"$pid"/task/"$tid"/comm 2>/dev/null)): $(rss "$pid")"
        done
      else
        gdb -p "$pid" -batch -ex "thread apply all call (void)mi_collect(1)" >/dev/null 2>&1
      fi
      echo "after mi_collect(true) in each of its $(ls /proc/"$pid"/task | wc -l) threads: $(rss "$pid")"
    fi
    stop "$pid"
    start "$work/joiner" $((PORT + 2)) 0 "/ip4/127.0.0.1/tcp/$((PORT + 1))/p2p/$peer"
    echo -n "joiner restarted on its data: "
    ready $((PORT + 2))
    sleep 3
    echo ", 3 s later: $(rss "$pid")"
    ;;
  *)
    echo "usage: simulations/rss.sh starts|join|collect" >&2
    exit 2
    ;;
esac
