#!/usr/bin/env python3
"""What a lone node at rest costs: CPU and wake-ups of a daemon with local agents and no peer.

    simulations/lone_rest.py --bin target/release/agentmesh [--bin OTHER ...] [--agents 200] \
        [--wait 15] [--seconds 20] [--rounds 2]

For each round and each binary in turn (so that binaries alternate), writes `--agents` card files (the
cards of `mesh_bench.py`), starts the daemon on a fresh data directory with them, waits `--wait` seconds
and then measures over `--seconds`: the CPU time of all its threads (from each thread's
`/proc/PID/task/TID/schedstat`, in nanoseconds) and its context switches (voluntary and not, from
`/proc/PID/task/TID/status`), each per second of wall time.
"""

import argparse
import json
import os
import tempfile
import time

from daemon import Daemon
from mesh_bench import card


def threads(pid):
    return [os.path.join(f"/proc/{pid}/task", t) for t in os.listdir(f"/proc/{pid}/task")]


def cpu_ns(pid):
    total = 0
    for task in threads(pid):
        try:
            with open(os.path.join(task, "schedstat")) as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass  # a thread that ended: its time is in no later sample either
    return total


def switches(pid):
    total = 0
    for task in threads(pid):
        try:
            with open(os.path.join(task, "status")) as f:
                total += sum(int(line.split()[1]) for line in f if "ctxt_switches:" in line)
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


def measure(binary, agents, wait, seconds):
    with tempfile.TemporaryDirectory(prefix="agentmesh-lone-") as work:
        cards = os.path.join(work, "cards")
        os.makedirs(cards)
        for i in range(agents):
            agent_id = f"lone-{i:05d}"
            with open(os.path.join(cards, agent_id + ".json"), "w") as f:
                json.dump(card(agent_id), f)
        daemon = Daemon(binary, os.path.join(work, "data"), ["--card", cards])
        try:
            time.sleep(wait)
            pid = daemon.proc.pid
            cpu0, sw0, t0 = cpu_ns(pid), switches(pid), time.monotonic()
            time.sleep(seconds)
            cpu1, sw1, t1 = cpu_ns(pid), switches(pid), time.monotonic()
        finally:
            daemon.stop()
    elapsed = t1 - t0
    return (cpu1 - cpu0) / 1e6 / elapsed, (sw1 - sw0) / elapsed


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
