#!/usr/bin/env python3
"""agentmesh and HashiCorp Serf side by side: the same convergence and crash-detection scenarios, the
same node count, processes on loopback, one run on one machine.

  Serf:      N `serf agent` processes (LAN profile, its defaults). Convergence: `serf tags -set` on one
             node, the time until every other node ran its member-update handler for that tag.
             Detection: kill -9 one agent, the time until every other node ran its member-failed handler.
  agentmesh: N daemons (defaults: heartbeat 2 s, degraded after 7 s) joined by bootstrap addresses.
             Convergence: a card registered on one node, the time until every other node logged
             "card applied". Detection: kill -9 one daemon, the time until every other node reports
             its agent no longer `active`.

Both sides are timed from the processes' own event records (handler log lines, daemon logs), not by
polling, except agentmesh detection (HTTP polling of each node, 10 ms apart).

Usage: simulations/serf_compare.py [--nodes 30] [--rounds 5]   (needs the Debian package `serf`)
Writes simulations/results/serf-vs-agentmesh-<N>.json and prints a Markdown table.
"""
import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mesh_bench  # noqa: E402  (the agentmesh process machinery)

SERF_BIND = 27946
SERF_RPC = 27373
DEADLINE = 60.0


class SerfNode:
    def __init__(self, index, workdir):
        self.index = index
        self.name = f"serf{index}"
        self.bind = f"127.0.0.1:{SERF_BIND + index}"
        self.rpc = f"127.0.0.1:{SERF_RPC + index}"
        self.log = os.path.join(workdir, f"{self.name}.events")
        self.proc = None

    def start(self, join):
        # Each handler run appends "<epoch seconds> <event> <stdin lines>" to this node's event log.
        handler = f"echo \"$(date +%s.%N) $SERF_EVENT $(cat | tr '\\n' ' ')\" >> {self.log}"
        args = ["serf", "agent", f"-node={self.name}", f"-bind={self.bind}", f"-rpc-addr={self.rpc}",
                "-log-level=warn", f"-event-handler={handler}"]
        if join:
            args.append(f"-join={join}")
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def events(self):
        try:
            with open(self.log) as f:
                return [line.split(" ", 2) for line in f if line.strip()]
        except FileNotFoundError:
            return []

    def first(self, event, needle, after):
        for stamp, ev, rest in self.events():
            if ev == event and needle in rest and float(stamp) >= after:
                return float(stamp)
        return None

    def members_alive(self):
        out = subprocess.run(["serf", "members", f"-rpc-addr={self.rpc}", "-status=alive"],
                             capture_output=True, text=True).stdout
        return len(out.splitlines())


def wait_until(what, check, deadline=DEADLINE):
    start = time.monotonic()
    while time.monotonic() - start < deadline:
        if check():
            return
        time.sleep(0.05)
    raise TimeoutError(what)


def convergence_rounds(nodes, rounds, publish, seen_at):
    """Each round: publish(node, round) on a random node makes a change named by what it returns; the
    round lasts until seen_at(other, name, t0) gives every other node's time of seeing it (from the
    node's own records). Returns each round's duration until the last node saw it."""
    conv = []
    for r in range(rounds):
        pub = random.choice(nodes)
        others = [n for n in nodes if n is not pub]
        t0 = time.time()
        name = publish(pub, r)
        wait_until(f"{name} everywhere", lambda: all(seen_at(n, name, t0) for n in others))
        conv.append(max(seen_at(n, name, t0) for n in others) - t0)
        time.sleep(1)
    return conv


def serf_run(size, rounds, workdir):
    nodes = [SerfNode(i, workdir) for i in range(size)]
    nodes[0].start(None)
    time.sleep(0.5)
    for n in nodes[1:]:
        n.start(nodes[0].bind)
    try:
        wait_until("serf cluster formed", lambda: all(n.members_alive() == size for n in nodes), 120)
        time.sleep(2)

        def publish(pub, r):
            subprocess.run(["serf", "tags", f"-rpc-addr={pub.rpc}", "-set", f"round=r{r}x"], check=True,
                           capture_output=True)
            return f"round=r{r}x"
        conv = convergence_rounds(nodes, rounds, publish, lambda n, needle, t0: n.first("member-update", needle, t0 - 1))
        victim = nodes[-1]
        others = nodes[:-1]
        t0 = time.time()
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait()
        wait_until("serf failure everywhere",
                   lambda: all(n.first("member-failed", victim.name, t0) for n in others), 120)
        detect = [n.first("member-failed", victim.name, t0) - t0 for n in others]
        return {"convergence_s": conv, "detection_s": {"all": max(detect), "p50": mesh_bench.pct(detect, 0.5)}}
    finally:
        for n in nodes:
            if n.proc and n.proc.poll() is None:
                n.proc.kill()
                n.proc.wait()


def agentmesh_run(size, rounds, workdir):
    nodes = [mesh_bench.Node(i, workdir) for i in range(size)]
    nodes[0].start([])
    mesh_bench.wait_until("node 0 up", lambda: mesh_bench.http("GET", nodes[0].http + "/api/v1/health")[0] == 200)
    for i, n in enumerate(nodes[1:], start=1):
        n.start(sorted({nodes[0].addr, nodes[random.randrange(0, i)].addr}))
    try:
        for n in nodes:
            mesh_bench.wait_until(f"node {n.index} meshed", lambda n=n: (mesh_bench.http(
                "GET", n.http + "/api/v1/mesh/status")[1] or {}).get("mesh_peers", {}).get("agentmesh/cards/1", 0) >= 1)
        time.sleep(3)

        def publish(pub, r):
            mesh_bench.http("POST", pub.http + "/api/v1/agents", mesh_bench.card(f"cmp-{r}"))
            return f"cmp-{r}"
        conv = convergence_rounds(nodes, rounds, publish, lambda n, agent_id, t0: n.applied_at(agent_id))
        victim = nodes[-1]
        others = nodes[:-1]
        mesh_bench.http("POST", victim.http + "/api/v1/agents", mesh_bench.card("victim-agent"))
        mesh_bench.wait_until("victim agent everywhere", lambda: all(
            (mesh_bench.http("GET", f"{n.http}/api/v1/agents/victim-agent")[1] or {}).get("health_status") == "active"
            for n in others))

        def not_active(n):
            s, body = mesh_bench.http("GET", f"{n.http}/api/v1/agents/victim-agent", timeout=2)
            return s == 200 and body["health_status"] != "active"
        t0, threads, times = mesh_bench.time_until_all(others, not_active)
        victim.kill()
        mesh_bench.run(threads)
        if None in times:
            raise TimeoutError("some agentmesh nodes never noticed the kill")
        return {"convergence_s": conv, "detection_s": {"all": max(times), "p50": mesh_bench.pct(times, 0.5)}}
    finally:
        for n in nodes:
            n.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if shutil.which("serf") is None:
        sys.exit("serf is not installed (Debian package `serf`)")
    subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=mesh_bench.ROOT, check=True)
    version = subprocess.run(["serf", "version"], capture_output=True, text=True).stdout.splitlines()[0]
    result = {"nodes": args.nodes, "rounds": args.rounds, "machine": f"{os.cpu_count()} cores", "serf_version": version}
    for name, fn in (("serf", serf_run), ("agentmesh", agentmesh_run)):
        workdir = tempfile.mkdtemp(prefix=f"cmp-{name}-")
        try:
            result[name] = fn(args.nodes, args.rounds, workdir)
        finally:
            subprocess.run(["pkill", "-f", workdir], check=False)
            shutil.rmtree(workdir, ignore_errors=True)
    out = os.path.join(mesh_bench.ROOT, "simulations", "results", f"serf-vs-agentmesh-{args.nodes}.json")
    with open(out, "w") as f:
        json.dump(result, f, indent=2)
    s, a = result["serf"], result["agentmesh"]
    sc, ac = statistics.median(s["convergence_s"]), statistics.median(a["convergence_s"])
    print(f"| {args.nodes} nodes | Serf ({version}) | agentmesh | Serf / agentmesh |")
    print("|---|---|---|---|")
    print(f"| change on every node, median of {args.rounds} rounds | {sc*1e3:.0f} ms | {ac*1e3:.0f} ms | {sc/ac:.1f}x |")
    print(f"| change on every node, worst round | {max(s['convergence_s'])*1e3:.0f} ms | "
          f"{max(a['convergence_s'])*1e3:.0f} ms | {max(s['convergence_s'])/max(a['convergence_s']):.1f}x |")
    print(f"| killed node noticed by every node | {s['detection_s']['all']:.2f} s | {a['detection_s']['all']:.2f} s | "
          f"{s['detection_s']['all']/a['detection_s']['all']:.2f}x |")


if __name__ == "__main__":
    main()
