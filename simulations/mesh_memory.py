#!/usr/bin/env python3
"""A mesh of publishers' memory after their catch-up: each member's resident memory and its heap's live
bytes, sampled for a while after the mesh holds the full view.

    simulations/mesh_memory.py --bin target/release/agentmesh --populate-bin PATH_TO_DISCOVERY_BENCH \
        [--publishers 50] [--agents 10000] [--samples 8] [--every 15]

The agents are split over the publishers as `join_big.py` splits them (one data directory each, written
by the discovery bench's `--populate`); all bootstrap to the first. Once every publisher holds every
agent `active`, the script prints one line per sample (`--samples` of them, `--every` seconds apart): the
seconds since the last publisher started, then the minimum, median and maximum over the members of the
heap's live bytes (`agentmesh_heap_live_bytes`) and of the resident memory (VmRSS), in MB; then the
members holding the least and the most live bytes at the last sample, by their start order. Live bytes
that stay while resident memory stays higher still tell the program's memory from the allocator's (see
README, "Metrics"); each sample also gives the anonymous part of the resident memory (RssAnon). Then it
restarts the first member on its data directory and prints the same figures for it 30 s after it holds
every agent again: a member of the same mesh that caught up nothing. Last, it stops the mesh and starts
that data directory alone, with no bootstrap, and prints them 30 s after it holds every agent: the lone
node a member is compared with.
"""

import argparse
import sys
import tempfile
import time

from daemon import Daemon, held, mesh_arguments, populate, rss_mb, status_mb, wait_full_view


def spread(values):
    values = sorted(values)
    return f"{values[0]:.1f} / {values[len(values) // 2]:.1f} / {values[-1]:.1f}"


def figures(daemon):
    """The heap's live bytes, the resident memory and its anonymous part, in MB."""
    pid = daemon.proc.pid
    return (f"heap live {daemon.heap_live_mb() or 0.0:.1f} MB, resident {rss_mb(pid):.1f} MB "
            f"(anonymous {status_mb(pid, 'RssAnon'):.1f})")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mesh_arguments(ap, publishers=50, timeout=400)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--every", type=float, default=15)
    opts = ap.parse_args()

    work = tempfile.mkdtemp(prefix="agentmesh-memory-")
    dirs = populate(opts.populate_bin, work, opts.agents, opts.publishers)
    members = []
    try:
        members.append(Daemon(opts.bin, dirs[0], []))
        addr = members[0].addr()
        for d in dirs[1:]:
            members.append(Daemon(opts.bin, d, ["--bootstrap", addr]))
        started = time.time()
        took = wait_full_view(members, opts.agents, opts.timeout)
        print(f"{opts.publishers} publishers, {opts.agents} agents: full view {took:.1f} s "
              "after the last started", flush=True)
        print("since start | heap live, min / median / max (MB) | resident, min / median / max (MB) "
              "| of it anonymous")
        for _ in range(opts.samples):
            live = [m.heap_live_mb() or 0.0 for m in members]
            resident = [rss_mb(m.proc.pid) for m in members]
            anonymous = [status_mb(m.proc.pid, "RssAnon") for m in members]
            print(f"{time.time() - started:6.0f} s | {spread(live)} | {spread(resident)} | {spread(anonymous)}",
                  flush=True)
            time.sleep(opts.every)
        # Who holds the most and the least, by start order (0 started first).
        order = sorted(range(len(members)), key=lambda i: live[i])
        show = lambda picked: ", ".join(f"#{i} {live[i]:.1f}" for i in picked)
        print(f"least live (start order, MB): {show(order[:5])}; most: {show(reversed(order[-5:]))}", flush=True)
        members[0].stop()
        members[0] = Daemon(opts.bin, dirs[0], ["--bootstrap", members[1].addr()])
        wait_full_view(members[:1], opts.agents, opts.timeout, "the restarted member")
        # As long as the others had between their full view and their first sample, and more.
        time.sleep(30)
        print(f"restarted on its data: {figures(members[0])}", flush=True)
        # The same data directory once more, with the mesh gone: a lone node holding the same view. Alone,
        # the others' agents do not stay `active`: it is waited for until it holds them all.
        for m in members:
            m.stop()
        members[0] = Daemon(opts.bin, dirs[0], [])
        wait_full_view(members[:1], opts.agents, opts.timeout, "the lone node", count=held)
        time.sleep(30)
        print(f"alone on the same data: {figures(members[0])}", flush=True)
    finally:
        for m in members:
            m.stop()


if __name__ == "__main__":
    sys.exit(main())
