#!/usr/bin/env python3
"""A publisher with many agents, and empty nodes joining it: real daemon processes on loopback.

    simulations/join_big.py --bin target/release/agentmesh --populate-bin PATH_TO_DISCOVERY_BENCH \
        [--agents 10000] [--joiners 3] [--timeout 300]

PATH_TO_DISCOVERY_BENCH is the `discovery` bench binary (`cargo bench --bench discovery --no-run` prints
it); it writes the publisher's data directory (`--populate DIR N`). The script starts the publisher on
it, then the joiners with `--bootstrap` to it, and polls each joiner's `/api/v1/mesh/status` until it
holds every agent `active`. It reports, per joiner, the time to the full view, and for every node the
resident memory, bans and rejections; memory per remote record is a joiner's RSS growth over the agent
count. Exits non-zero if a joiner does not get there, or if anyone was banned or refused anything.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from daemon import Daemon, rss_mb


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--populate-bin", required=True)
    ap.add_argument("--agents", type=int, default=10_000)
    ap.add_argument("--joiners", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=300)
    opts = ap.parse_args()

    work = tempfile.mkdtemp(prefix="agentmesh-join-")
    publisher_dir = os.path.join(work, "publisher")
    subprocess.run([opts.populate_bin, "--populate", publisher_dir, str(opts.agents)], check=True,
                   stdout=subprocess.DEVNULL)
    daemons = []
    try:
        publisher = Daemon(opts.bin, publisher_dir, [])
        daemons.append(publisher)
        addr = publisher.addr()
        joiners = []
        for i in range(opts.joiners):
            j = Daemon(opts.bin, os.path.join(work, f"joiner-{i}"), ["--bootstrap", addr])
            j.rss_start = rss_mb(j.proc.pid)
            j.started = time.time()
            j.done = None
            joiners.append(j)
            daemons.append(j)
        deadline = time.time() + opts.timeout
        while any(j.done is None for j in joiners) and time.time() < deadline:
            for j in joiners:
                if j.done is None and j.status()["records"].get("active", 0) == opts.agents:
                    j.done = time.time() - j.started
            time.sleep(0.05)
        result = {"agents": opts.agents, "joiners": []}
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
            "empty_node_rss_mb": round(bare, 1),
            "kb_per_record": round((loaded - bare) * 1024 / opts.agents, 2),
        }
        ps = publisher.status()
        result["publisher"] = {"rss_mb": round(rss_mb(publisher.proc.pid), 1),
                               "peers_banned": ps["peers_banned"], "rejected": ps["rejected"]}
        ok &= ps["peers_banned"] == 0
        print(json.dumps(result, indent=2))
        sys.exit(0 if ok else 1)
    finally:
        for d in daemons:
            d.stop()


if __name__ == "__main__":
    main()
