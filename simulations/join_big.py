#!/usr/bin/env python3
"""Publishers with many agents, and empty nodes joining them: real daemon processes on loopback.

    simulations/join_big.py --bin target/release/agentmesh --populate-bin PATH_TO_DISCOVERY_BENCH \
        [--agents 10000] [--publishers 1] [--joiners 3] [--timeout 300] [--settle 15] \
        [--rest SECONDS] [--restart K] [--joiner-log FILE]

With `--publishers P` the agents are split over P publishers (each its own data directory and key),
the others bootstrapping to the first; the script waits until every publisher holds every agent
`active` (the mesh's full view, timed from the first publisher's start and from the last's), lets the
mesh settle (`--settle` seconds: a late joiner finds the mesh at rest, not in the tail of its own
catch-up, when each publisher reopens its store; the machine's idle share over the last 3 s of that
wait is reported), optionally measures the mesh at rest (`--rest`: each publisher's CPU and the machine's
idle share in 5 s windows) and restarts K publishers on their data directories (`--restart`: their RSS
once they hold every agent again, against the others', so a member's memory is told apart from what its
catch-up left behind), then starts the joiners with `--bootstrap` to the first publisher. The first
joiner's records by health are sampled as it catches up (`first_joiner_timeline`).

PATH_TO_DISCOVERY_BENCH is the `discovery` bench binary (`cargo bench --bench discovery --no-run` prints
it); it writes the publisher's data directory (`--populate DIR N`). The script starts the publisher on
it, then the joiners with `--bootstrap` to it, and polls each joiner's `/api/v1/mesh/status` until it
holds every agent `active`. It reports, per joiner, the time to the full view, and for every node the
resident memory, bans and rejections; memory per remote record is a joiner's RSS growth over the agent
count. Exits non-zero if a joiner does not get there, or if anyone was banned or refused anything.
"""

import argparse
import datetime
import json
import os
import sys
import tempfile
import time

from daemon import (Daemon, active, cpu_ticks, machine_ticks, mesh_arguments, populate, records, rss_mb,
                    status_mb)


# What `--joiner-log` records: the ingest worker's "sync answer applied" lines (`open_us`, `apply_us`)
# and the event loop's "sync answer" lines (records, when each answer came).
JOINER_LOG_FILTER = "warn,agentmesh::node=info,agentmesh::net::ingest=debug,agentmesh::net::sync=debug"


def answers_applied(path, started):
    """The fetch answers (cards asked for by id) the joiner applied, from its `--joiner-log`: how many,
    when the first and the last were applied (seconds after the joiner started), and the median time to
    open (check and decode) and to apply one. Answers to list, heartbeat and reconciliation questions,
    which carry no fetched records, are left out."""
    applied = []
    with open(path) as f:
        for line in f:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("message") == "sync answer applied" and event.get("fetched", 0) > 0:
                at = datetime.datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()
                applied.append((at - started, event["messages"], event["open_us"], event["apply_us"]))
    if not applied:
        return {"answers": 0}
    median = lambda xs: sorted(xs)[len(xs) // 2]
    return {
        "answers": len(applied),
        "messages": sum(a[1] for a in applied),
        "first_applied_s": round(applied[0][0], 3),
        "last_applied_s": round(applied[-1][0], 3),
        "open_ms_median": round(median([a[2] for a in applied]) / 1000, 1),
        "apply_ms_median": round(median([a[3] for a in applied]) / 1000, 1),
    }


def idle_share(seconds):
    """The machine's idle share of CPU time over the next `seconds` (/proc/stat)."""
    idle0, total0 = machine_ticks()
    time.sleep(seconds)
    idle1, total1 = machine_ticks()
    return (idle1 - idle0) / max(1, total1 - total0)


def at_rest(daemons, seconds):
    """Each daemon's CPU (ms/s) and the machine's idle share, in windows of 5 s over `seconds`."""
    windows = []
    for _ in range(max(1, round(seconds / 5))):
        before = [cpu_ticks(d.proc.pid) for d in daemons]
        idle = idle_share(5.0)
        # A tick is 10 ms: ticks over 5 s times 10 / 5 is ms per second.
        per_node = sorted((cpu_ticks(d.proc.pid) - b) * 2 for d, b in zip(daemons, before))
        windows.append({"idle": round(idle, 2), "cores": round(sum(per_node) / 1000, 2),
                        "ms_per_s_min_median_max": [per_node[i] for i in (0, len(per_node) // 2, -1)]})
    return windows


def main():
    ap = argparse.ArgumentParser()
    mesh_arguments(ap, publishers=1, timeout=300)
    ap.add_argument("--joiners", type=int, default=3)
    ap.add_argument("--rest", type=float, default=0,
                    help="seconds of the mesh at rest measured after its full view (publishers > 1)")
    ap.add_argument("--restart", type=int, default=0,
                    help="publishers restarted on their data directories after the full view, their RSS "
                         "then compared with the others' (publishers > 1)")
    ap.add_argument("--settle", type=float, default=15,
                    help="seconds between the publishers' full view and the joiners' start (a late "
                         "joiner finds a mesh at rest: each publisher reopens its store some seconds "
                         "after its own catch-up)")
    ap.add_argument("--joiner-log", help="write the first joiner's log to FILE, with each sync answer it "
                                         "applies (its size, and how long opening and applying it took) "
                                         "and each answer it receives")
    opts = ap.parse_args()

    work = tempfile.mkdtemp(prefix="agentmesh-join-")
    publisher_dirs = populate(opts.populate_bin, work, opts.agents, opts.publishers)
    daemons = []
    result = {"agents": opts.agents, "publishers": opts.publishers, "joiners": []}
    try:
        first_started = time.time()
        publisher = Daemon(opts.bin, publisher_dirs[0], [])
        daemons.append(publisher)
        addr = publisher.addr()
        publishers = [publisher]
        for d in publisher_dirs[1:]:
            p = Daemon(opts.bin, d, ["--bootstrap", addr])
            daemons.append(p)
            publishers.append(p)
        last_started = time.time()
        if opts.publishers > 1:
            deadline = time.time() + opts.timeout
            waiting = list(publishers)
            while waiting and time.time() < deadline:
                waiting = [p for p in waiting if active(p) < opts.agents]
                # Once a second: each status answer costs its daemon and this script CPU, and 50 of them
                # every 0.1 s took a share of the two cores large enough to slow the catch-up measured.
                time.sleep(1.0)
            done = time.time()
            counts = sorted(active(p) for p in publishers)
            result["mesh"] = {
                "full_view_everywhere": not waiting,
                "since_first_publisher_started_s": round(done - first_started, 2),
                "since_last_publisher_started_s": round(done - last_started, 2),
                "publishers_started_in_s": round(last_started - first_started, 2),
                "active_per_publisher_min_median_max": [counts[0], counts[len(counts) // 2], counts[-1]],
            }
            if waiting:
                print(json.dumps(result, indent=2))
                sys.exit(1)
        if opts.publishers > 1 and opts.rest > 0:
            result["mesh_at_rest"] = at_rest(publishers, opts.rest)
        if opts.publishers > 1 and opts.restart > 0:
            # The last K publishers: the first is everyone's bootstrap peer.
            again = list(range(len(publishers) - min(opts.restart, len(publishers) - 1), len(publishers)))
            for k in again:
                publishers[k].stop()
                publishers[k] = Daemon(opts.bin, publisher_dirs[k], ["--bootstrap", addr])
                daemons.append(publishers[k])
            deadline = time.time() + opts.timeout
            while any(active(publishers[k]) < opts.agents for k in again) and time.time() < deadline:
                time.sleep(0.5)
            # As long as the others had between their full view and these measurements.
            time.sleep(max(opts.settle, 30))
            others = sorted(rss_mb(p.proc.pid) for i, p in enumerate(publishers) if i not in again)
            others_live = sorted(p.heap_live_mb() or 0.0 for i, p in enumerate(publishers) if i not in again)
            result["restarted_publishers"] = {
                "rss_mb": [round(rss_mb(publishers[k].proc.pid), 1) for k in again],
                "anonymous_mb": [round(status_mb(publishers[k].proc.pid, "RssAnon"), 1) for k in again],
                "heap_live_mb": [round(publishers[k].heap_live_mb() or 0.0, 1) for k in again],
                "others_heap_live_mb_median": round(others_live[len(others_live) // 2], 1),
                "connected_peers": [publishers[k].status().get("connected_peers") for k in again],
                "active": [active(publishers[k]) for k in again],
                "others_rss_mb_median": round(others[len(others) // 2], 1),
            }
        if opts.publishers > 1 and opts.settle > 0:
            # A mark for profiling the mesh at rest (`perf record -a` in another shell).
            print(f"mesh holds the full view; settling {opts.settle:.0f} s", file=sys.stderr, flush=True)
            time.sleep(max(0.0, opts.settle - 3))
            result["settle_s"] = opts.settle
            result["machine_idle_before_join"] = round(idle_share(3.0), 2)
        joiners = []
        for i in range(opts.joiners):
            log = opts.joiner_log if i == 0 else None
            j = Daemon(opts.bin, os.path.join(work, f"joiner-{i}"), ["--bootstrap", addr], log=log,
                       rust_log=JOINER_LOG_FILTER if log else "warn,agentmesh::node=info")
            j.rss_start = rss_mb(j.proc.pid)
            j.started = time.time()
            j.done = None
            joiners.append(j)
            daemons.append(j)
        deadline = time.time() + opts.timeout
        # The first joiner's records by health as it catches up, one sample every 0.25 s at most.
        timeline, sampled = [], 0.0
        while any(j.done is None for j in joiners) and time.time() < deadline:
            for i, j in enumerate(joiners):
                if j.done is None:
                    held = records(j)
                    at = time.time() - j.started
                    if i == 0 and at - sampled >= 0.25:
                        timeline.append({"s": round(at, 2), **held})
                        sampled = at
                    if held.get("active", 0) == opts.agents:
                        j.done = at
            time.sleep(0.05)
        result["first_joiner_timeline"] = timeline
        ok = True
        for i, j in enumerate(joiners):
            s = j.status()
            rss = rss_mb(j.proc.pid)
            row = {
                "joiner": i,
                "full_view_active_s": None if j.done is None else round(j.done, 2),
                "active": s["records"].get("active", 0),
                "rss_start_mb": round(j.rss_start, 1),
                "rss_mb": round(rss, 1),
                "heap_live_mb": round(j.heap_live_mb() or 0.0, 1),
                "kb_per_record": round((rss - j.rss_start) * 1024 / opts.agents, 2),
                "peers_banned": s["peers_banned"],
                "rejected": s["rejected"],
            }
            result["joiners"].append(row)
            ok &= j.done is not None and s["peers_banned"] == 0 and not s["rejected"]
        # The view's own cost: joiner 0 restarted on its data directory (the view loaded from its store,
        # no catch-up buffers), against an empty node.
        j0 = joiners[0]
        j0.stop()
        if opts.joiner_log:
            # Read once the joiner has stopped and its log is whole.
            result["first_joiner_answers"] = answers_applied(opts.joiner_log, j0.started)
        j0 = Daemon(opts.bin, os.path.join(work, "joiner-0"), [])
        daemons.append(j0)
        deadline = time.time() + 60
        while sum(j0.status()["records"].values()) < opts.agents and time.time() < deadline:
            time.sleep(0.1)
        empty = Daemon(opts.bin, os.path.join(work, "empty"), [])
        daemons.append(empty)
        time.sleep(2)
        loaded, bare = rss_mb(j0.proc.pid), rss_mb(empty.proc.pid)
        result["restarted_joiner"] = {
            "records": sum(j0.status()["records"].values()),
            "rss_mb": round(loaded, 1),
            "heap_live_mb": round(j0.heap_live_mb() or 0.0, 1),
            "empty_node_rss_mb": round(bare, 1),
            "kb_per_record": round((loaded - bare) * 1024 / opts.agents, 2),
        }
        statuses = [p.status() for p in publishers]
        result["publisher"] = {"rss_mb": round(rss_mb(publisher.proc.pid), 1),
                               "peers_banned": sum(s["peers_banned"] for s in statuses),
                               "rejected": [s["rejected"] for s in statuses if s["rejected"]]}
        ok &= result["publisher"]["peers_banned"] == 0
        print(json.dumps(result, indent=2))
        sys.exit(0 if ok else 1)
    finally:
        for d in daemons:
            d.stop()


if __name__ == "__main__":
    main()
