#!/usr/bin/env python3
"""How fast a dead node's agents leave `active` everywhere: real daemon processes on loopback.

    simulations/detect.py --bin target/release/agentmesh [--nodes 5] [--rounds 5]

Starts a seed and NODES-1 nodes bootstrapped to it, each with one agent, waits until every node shows
every agent active, then kills one node (SIGKILL: no goodbye) and polls every other node until the dead
node's agent is no longer `active` there. Reports, per round, the time until the first and the last
node saw it, and checks that no live node's agent ever left `active` (false alarms). Exits non-zero
on a false alarm or a miss.
"""

import argparse
import json
import os
import signal
import sys
import tempfile
import time

from daemon import Daemon


def card(agent_id):
    return {"agent_id": agent_id, "base_url": "http://127.0.0.1:9", "skills": [{"id": "s"}]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--nodes", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5)
    opts = ap.parse_args()
    work = tempfile.mkdtemp(prefix="agentmesh-detect-")
    seed = Daemon(opts.bin, os.path.join(work, "seed"), [])
    nodes = [seed]
    seed.register(card("agent-seed"))
    rounds, false_alarms = [], 0
    try:
        for i in range(1, opts.nodes):
            n = Daemon(opts.bin, os.path.join(work, f"n{i}"), ["--bootstrap", seed.addr()])
            n.register(card(f"agent-{i}"))
            nodes.append(n)
        names = {n.peer_id: ("agent-seed" if n is seed else f"agent-{nodes.index(n)}") for n in nodes}
        for r in range(opts.rounds):
            deadline = time.time() + 60
            while not all(o.health(names[n.peer_id]) == "active" for o in nodes for n in nodes):
                if time.time() > deadline:
                    raise SystemExit(f"round {r}: the mesh did not converge within 60 s")
                time.sleep(0.05)
            victim = nodes[-1]
            others = nodes[:-1]
            agent = names[victim.peer_id]
            killed = time.time()
            victim.proc.send_signal(signal.SIGKILL)
            victim.proc.wait()
            seen = {}
            while len(seen) < len(others) and time.time() - killed < 30:
                for o in others:
                    if o.peer_id not in seen and o.health(agent) != "active":
                        seen[o.peer_id] = time.time() - killed
                for o in others:
                    for n in others:
                        if o.health(names[n.peer_id]) != "active":
                            false_alarms += 1
                time.sleep(0.01)
            times = sorted(seen.values())
            rounds.append({"round": r, "first_s": round(times[0], 3) if times else None,
                           "last_s": round(times[-1], 3) if times else None, "nodes_seeing": len(times)})
            # The victim comes back, with a new data dir, for the next round.
            nodes[-1] = Daemon(opts.bin, os.path.join(work, f"back{r}"), ["--bootstrap", seed.addr()])
            names[nodes[-1].peer_id] = f"agent-back{r}"
            nodes[-1].register(card(f"agent-back{r}"))
        result = {"nodes": opts.nodes, "rounds": rounds, "false_alarms": false_alarms}
        print(json.dumps(result, indent=2))
        ok = false_alarms == 0 and all(x["nodes_seeing"] == opts.nodes - 1 for x in rounds)
        sys.exit(0 if ok else 1)
    finally:
        for n in nodes:
            if n.proc.poll() is None:
                n.proc.kill()


if __name__ == "__main__":
    main()
