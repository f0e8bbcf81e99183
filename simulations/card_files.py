#!/usr/bin/env python3
"""A node started with many card files: how soon it serves, what that start cost, and what it holds.

    simulations/card_files.py --bin target/release/agentmesh [--agents 10000]

Writes `--agents` card files (the cards of `mesh_bench.py`, one file each) and starts the daemon on a
fresh data directory with them, then again on the same directory (every card unchanged), then once more
without them (a lone node on its store). For each start it prints the seconds from the process's start
until it logged "node started" (its HTTP port is bound then) and the process's CPU seconds at that
moment; its resident memory 5 s later, and for the last its heap's live bytes too, in MiB (the figures a mesh
member's are compared with in `mesh_memory.py`).
"""

import argparse
import os
import tempfile
import time

from daemon import Daemon, cpu_ticks, rss_mb
from mesh_bench import write_cards


def start(binary, data_dir, extra):
    began = time.monotonic()
    daemon = Daemon(binary, data_dir, extra)
    ready = time.monotonic() - began
    cpu = cpu_ticks(daemon.proc.pid) / os.sysconf("SC_CLK_TCK")
    return daemon, ready, cpu


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--agents", type=int, default=10000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="agentmesh-cards-") as work:
        cards = os.path.join(work, "cards")
        write_cards(cards, [f"steady-{i:05d}" for i in range(args.agents)])
        data = os.path.join(work, "data")
        for what, extra in [("first start, card files", ["--card", cards]),
                            ("second start, the same card files", ["--card", cards])]:
            daemon, ready, cpu = start(args.bin, data, extra)
            held = daemon.get("/api/v1/agents?limit=0")["total"]
            time.sleep(5)
            resident = rss_mb(daemon.proc.pid)
            daemon.stop()
            print(f"{what}: ready after {ready:.2f} s, CPU {cpu:.2f} s, {held} agents; 5 s later resident "
                  f"{resident:.1f} MiB")
        daemon, ready, cpu = start(args.bin, data, [])
        time.sleep(5)
        live, resident = daemon.heap_live_mb(), rss_mb(daemon.proc.pid)
        daemon.stop()
        print(f"start on its store alone: ready after {ready:.2f} s, CPU {cpu:.2f} s; 5 s later heap live "
              f"{live:.1f} MiB, resident {resident:.1f} MiB")


if __name__ == "__main__":
    main()
