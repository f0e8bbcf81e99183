#!/usr/bin/env python3
"""What a lone node at rest costs: CPU and wake-ups of a daemon with local agents and no peer.

    simulations/lone_rest.py --bin target/release/agentmesh [--bin OTHER ...] [--agents 200] \
        [--wait 15] [--seconds 20] [--rounds 2]

For each round and each binary in turn (so that binaries alternate), writes `--agents` card files (the
cards of `mesh_bench.py`), starts the daemon on a fresh data directory with them, waits `--wait` seconds
and then measures over `--seconds`: the CPU time of its threads (from each thread's
`/proc/PID/task/TID/schedstat`, in nanoseconds) and their context switches (voluntary and not, from
`/proc/PID/task/TID/status`), each per second of wall time. A thread that ends inside the window takes
its share of it along (an undercount); at rest a node's threads do not end.
"""

import argparse
import os
import tempfile
import time

from daemon import Daemon
from mesh_bench import write_cards


def per_thread(pid):
    """{thread id: (CPU ns, context switches)} of every thread of `pid` now."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        task = f"/proc/{pid}/task/{tid}"
        try:
            with open(os.path.join(task, "schedstat")) as f:
                cpu = int(f.read().split()[0])
            with open(os.path.join(task, "status")) as f:
                switched = sum(int(line.split()[1]) for line in f if "ctxt_switches:" in line)
        except (FileNotFoundError, ProcessLookupError):
            continue  # ended between the listing and the read
        out[tid] = (cpu, switched)
    return out


def window(before, after):
    """CPU ns and context switches between two samples: a thread started meanwhile counts from zero;
    one that ended meanwhile is missing from the second sample, and what it spent in the window with
    it (an undercount, never a negative)."""
    cpu = sum(c - before.get(tid, (0, 0))[0] for tid, (c, _) in after.items())
    switched = sum(s - before.get(tid, (0, 0))[1] for tid, (_, s) in after.items())
    return cpu, switched


def measure(binary, agents, wait, seconds):
    with tempfile.TemporaryDirectory(prefix="agentmesh-lone-") as work:
        cards = os.path.join(work, "cards")
        write_cards(cards, [f"lone-{i:05d}" for i in range(agents)])
        daemon = Daemon(binary, os.path.join(work, "data"), ["--card", cards])
        try:
            time.sleep(wait)
            pid = daemon.proc.pid
            before, t0 = per_thread(pid), time.monotonic()
            time.sleep(seconds)
            after, t1 = per_thread(pid), time.monotonic()
        finally:
            daemon.stop()
    cpu, switched = window(before, after)
    return cpu / 1e6 / (t1 - t0), switched / (t1 - t0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", action="append", required=True)
    ap.add_argument("--agents", type=int, default=200)
    ap.add_argument("--wait", type=float, default=15)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    print(f"lone node, {args.agents} local agents, {args.seconds:.0f} s from {args.wait:.0f} s after start, "
          f"{os.cpu_count()} cores")
    for r in range(args.rounds):
        for binary in args.bin:
            cpu, sw = measure(binary, args.agents, args.wait, args.seconds)
            print(f"round {r + 1} {binary}: CPU {cpu:.2f} ms/s, {sw:.0f} context switches/s")


if __name__ == "__main__":
    main()
