#!/usr/bin/env python3
"""Mesh measurements with real agentmesh processes on loopback (no containers).

For each mesh size: start N daemons (node 0 first; every other node bootstraps to node 0 and to one
earlier node chosen at random), wait until the mesh is up, then measure
  - convergence: a card registered on one node, the time until every node serves it (repeated);
  - detection: kill -9 a node, the time until every other node reports its agent as no longer active;
  - RSS per node (VmRSS);
  - CPU per node at rest and the machine's idle share, over the same quiet window; connected peers per node;
  - steady-state traffic per node: TCP bytes sent+received by each daemon over a quiet window (from 10 s
    after every node holds every agent, once the heartbeats that carry changed agent lists are past), with
    AGENTS agents registered across the mesh (ss -tinp).
Writes JSON to simulations/results/mesh-<N>.json and prints a Markdown summary.
With --preload it also reports what each node spent until every node held every agent: CPU seconds and
the bytes its system calls read and wrote (/proc/PID/io: sockets, store and card files alike).

Convergence is timed from each node's own log ("card applied", debug level of target agentmesh::apply),
so that no polling loads the machine while it is measured. Detection polls every node's HTTP API.

Usage: [AGENTMESH_BIN=PATH] simulations/mesh_bench.py [--sizes 10,30] [--agents 1000] [--rounds 5]
           [--quiet-seconds 20] [--preload]
(--preload: each node registers its share of the agents from card files at start, and the time until
every node holds every agent is reported; results go to mesh-<N>-<AGENTS>.json.)
Standard library only; needs `ss` (iproute2).
"""
import argparse
import calendar
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request

from daemon import cpu_ticks, machine_ticks, metric, rss_mb

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# AGENTMESH_BIN: a binary built elsewhere (another commit, to compare); unset, this tree's release build.
BIN = os.environ.get("AGENTMESH_BIN") or os.path.join(ROOT, "target", "release", "agentmesh")
HTTP_BASE = 19000
P2P_BASE = 29000
POLL = 0.01
DEADLINE = 60.0


def http(method, url, body=None, timeout=5.0):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, None
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, None


class Node:
    def __init__(self, index, workdir):
        self.index = index
        self.dir = os.path.join(workdir, f"node{index}")
        self.http = f"http://127.0.0.1:{HTTP_BASE + index}"
        self.p2p_port = P2P_BASE + index
        self.peer_id = subprocess.check_output([BIN, "id", "--data-dir", self.dir], text=True).strip()
        self.addr = f"/ip4/127.0.0.1/tcp/{self.p2p_port}/p2p/{self.peer_id}"
        self.proc = None

    def preload(self, agent_ids):
        """Card files this node registers at start (`--card DIR`)."""
        self.cards = os.path.join(self.dir, "cards")
        write_cards(self.cards, agent_ids)

    def start(self, bootstrap):
        args = [BIN, "run", "--data-dir", self.dir, "--http", f"127.0.0.1:{HTTP_BASE + self.index}",
                "--listen", f"/ip4/127.0.0.1/tcp/{self.p2p_port}", "--no-mdns", "--log-format", "json"]
        if getattr(self, "cards", None):
            args += ["--card", self.cards]
        for b in bootstrap:
            args += ["--bootstrap", b]
        log = open(os.path.join(self.dir, "daemon.log"), "w")
        self.log = os.path.join(self.dir, "daemon.log")
        env = {**os.environ, "RUST_LOG": "warn,agentmesh::apply=debug"}
        self.proc = subprocess.Popen(args, stdout=log, stderr=log, env=env)

    def applied_at(self, agent_id):
        """Wall-clock time (s) at which this node applied the card, from its log."""
        with open(self.log) as f:
            for line in f:
                if '"card applied"' in line and f'"agent_id":"{agent_id}"' in line:
                    stamp = json.loads(line)["timestamp"]
                    return parse_rfc3339(stamp)
        return None

    def applied_span(self):
        """Wall-clock times (s) of the first and last card this node applied, from its log."""
        first = last = None
        with open(self.log) as f:
            for line in f:
                if '"card applied"' in line:
                    stamp = parse_rfc3339(json.loads(line)["timestamp"])
                    first = stamp if first is None else first
                    last = stamp
        return first, last

    def rss_mb(self):
        return rss_mb(self.proc.pid)

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def parse_rfc3339(stamp):
    """'2026-11-22T01:02:03.123456Z' -> seconds since the epoch."""
    main, _, frac = stamp.rstrip("Z").partition(".")
    base = calendar.timegm(time.strptime(main, "%Y-%m-%dT%H:%M:%S"))
    return base + (float("0." + frac) if frac else 0.0)


def wait_until(what, check, deadline=DEADLINE):
    start = time.monotonic()
    while time.monotonic() - start < deadline:
        if check():
            return time.monotonic() - start
        time.sleep(0.05)
    raise TimeoutError(what)


def card(agent_id, tag="bench"):
    return {"agent_id": agent_id, "base_url": "http://127.0.0.1:1", "version": "1.0.0",
            "reasoners": [{"id": "work", "tags": [tag],
                           "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}}],
            "skills": [{"id": "lookup", "tags": [tag]}]}


def write_cards(directory, agent_ids):
    """One card file per agent (`card(agent_id)`), for a daemon's `--card DIR`."""
    os.makedirs(directory, exist_ok=True)
    for agent_id in agent_ids:
        with open(os.path.join(directory, agent_id + ".json"), "w") as f:
            json.dump(card(agent_id), f)


def time_until_all(nodes, predicate):
    """Starts one poller per node; returns each node's seconds until predicate(node) held."""
    t0 = time.monotonic()
    times = [None] * len(nodes)

    def poll(i, n):
        while time.monotonic() - t0 < DEADLINE:
            if predicate(n):
                times[i] = time.monotonic() - t0
                return
            time.sleep(POLL)

    threads = [threading.Thread(target=poll, args=(i, n)) for i, n in enumerate(nodes)]
    return t0, threads, times


def run(threads):
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def pct(values, p):
    s = sorted(values)
    return s[min(len(s) - 1, int(round((len(s) - 1) * p)))]


def tcp_bytes(pids):
    """bytes_sent + bytes_received of each pid's TCP sockets, from ss: {pid: {(local, peer): bytes}}."""
    out = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True).stdout
    sockets = {pid: {} for pid in pids}
    current = None
    for line in out.splitlines():
        m = re.search(r"pid=(\d+)", line)
        if m:
            fields = line.split()
            current = (int(m.group(1)), tuple(fields[3:5]))
            continue
        if current and current[0] in sockets:
            for key in ("bytes_sent", "bytes_received"):
                m = re.search(key + r":(\d+)", line)
                if m:
                    by_socket = sockets[current[0]]
                    by_socket[current[1]] = by_socket.get(current[1], 0) + int(m.group(1))
    return sockets


def bytes_between(before, after):
    """What a process's sockets carried between two `tcp_bytes` samples: sockets open at both counted
    from the first, sockets opened since counted whole; a socket closed meanwhile is not counted (a
    connection target trades connections, so sockets come and go)."""
    return sum(n - before.get(key, 0) for key, n in after.items())


def total(n):
    return (http("GET", n.http + "/api/v1/agents?limit=0")[1] or {}).get("total", 0)


def io_bytes(pid):
    """(bytes read, bytes written) by a process's system calls, sockets and files alike (/proc/PID/io:
    `rchar`, `wchar`)."""
    with open(f"/proc/{pid}/io") as f:
        fields = dict(line.split(":") for line in f)
    return int(fields["rchar"]), int(fields["wchar"])


def spread(xs, digits=2):
    """min / median / max of `xs`, rounded to `digits`."""
    r = lambda x: round(x, digits) if digits else int(x)
    return {"min": r(min(xs)), "median": r(statistics.median(xs)), "max": r(max(xs))}


def catch_up(nodes):
    """What each node spent from its start until every node held every agent: CPU seconds, and bytes
    read and written (its sockets, plus its store's files and its card files), min / median / max."""
    cpu = [cpu_ticks(n.proc.pid) / os.sysconf("SC_CLK_TCK") for n in nodes]
    io = [io_bytes(n.proc.pid) for n in nodes]
    return {"cpu_s": spread(cpu), "all_nodes_cpu_s": round(sum(cpu), 1),
            "read_mb": spread([r / 1e6 for r, _ in io]), "written_mb": spread([w / 1e6 for _, w in io])}


def gossip_taken(nodes):
    """What each node's gossip brought until now (its /metrics): messages taken in, and those ignored
    because the node held them already (fetched first), min / median / max over the nodes."""
    taken, ignored = [], []
    for n in nodes:
        try:
            with urllib.request.urlopen(n.http + "/metrics", timeout=5) as r:
                text = r.read().decode()
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            continue
        taken.append(metric(text, 'agentmesh_gossip_messages_total{direction="in"}') or 0)
        ignored.append(metric(text, 'agentmesh_gossip_verdicts_total{verdict="ignored"}') or 0)
    return {"in": spread(taken, 0), "ignored": spread(ignored, 0)} if taken else {}


def timeline(nodes, wall_start):
    """When each node, counted from the first node's start, applied the first and the last card of its
    catch-up (from its log): min / median / max over the nodes. Tells a mesh that converges together
    from one that waits on its last nodes."""
    spans = [n.applied_span() for n in nodes]
    firsts = [f - wall_start for f, _ in spans if f is not None]
    lasts = [l - wall_start for _, l in spans if l is not None]
    return {"first_card_s": spread(firsts, 1), "last_card_s": spread(lasts, 1)} if lasts else {}


def bench(size, agents, rounds, quiet_seconds, workdir, preload):
    nodes = [Node(i, workdir) for i in range(size)]
    if preload:
        for n in nodes:
            n.preload([f"steady-{i:05d}" for i in range(n.index, agents, size)])
    t_start, wall_start = time.monotonic(), time.time()
    nodes[0].start([])
    wait_until("node 0 up", lambda: http("GET", nodes[0].http + "/api/v1/health")[0] == 200)
    for i, n in enumerate(nodes[1:], start=1):
        peers = {nodes[0].addr, nodes[random.randrange(0, i)].addr}
        n.start(sorted(peers))
    for n in nodes:
        wait_until(f"node {n.index} up", lambda n=n: http("GET", n.http + "/api/v1/health")[0] == 200)

    def meshed(n):
        _, s = http("GET", n.http + "/api/v1/mesh/status")
        return bool(s) and s["connected_peers"] >= 1 and s["mesh_peers"].get("agentmesh/cards/1", 0) >= 1
    result = {"nodes": size, "machine": f"{os.cpu_count()} cores", "preload": preload}
    if preload:
        # Every node registered its share from card files at start: the time until every node holds
        # every agent (anti-entropy and list pulls only), counted from the first node's start. A node
        # found holding every agent is not asked again (nothing is removed meanwhile), so that each poll
        # asks one node or a few: asking every node at each poll took a core of this script (and the
        # nodes' HTTP answers) for the last part of a 50-node catch-up, on the machine it measures.
        holding_all = set()

        def everywhere():
            for n in nodes:
                if n.index not in holding_all:
                    if total(n) < agents:
                        return False
                    holding_all.add(n.index)
            return True
        wait_until("preloaded agents everywhere", everywhere, deadline=900)
        result["preload_full_view_s"] = time.monotonic() - t_start
        result["catch_up_per_node"] = catch_up(nodes)
        result["catch_up_timeline"] = timeline(nodes, wall_start)
        result["gossip_until_full_view"] = gossip_taken(nodes)
    for n in nodes:
        wait_until(f"node {n.index} meshed", lambda n=n: meshed(n), deadline=300)
    time.sleep(3)  # let gossipsub fill its meshes (heartbeats every 0.5 s)

    # Convergence: each node logs when it applies a card; no polling load during the measurement.
    samples = []
    for r in range(rounds):
        publisher = nodes[random.randrange(size)]
        agent_id = f"conv-{r}"
        others = [n for n in nodes if n is not publisher]
        t0 = time.time()
        status, _ = http("POST", publisher.http + "/api/v1/agents", card(agent_id))
        assert status in (200, 201), status
        wait_until(f"{agent_id} on every node", lambda: all(n.applied_at(agent_id) for n in others))
        times = [n.applied_at(agent_id) - t0 for n in others]
        samples.append({"all": max(times), "p50": pct(times, 0.5), "p99": pct(times, 0.99)})
        time.sleep(1)
    result["convergence_s"] = samples

    # Steady state: AGENTS agents spread over the mesh, then a quiet window.
    if not preload:
        for i in range(agents):
            n = nodes[i % size]
            http("POST", n.http + "/api/v1/agents", card(f"steady-{i:05d}"))
    wait_until("steady agents everywhere", lambda: all(total(n) >= agents + rounds for n in nodes), deadline=600)
    # Settle: the heartbeats after a change carry the changed agent lists (3 beats of 2 s).
    time.sleep(10)
    pids = [n.proc.pid for n in nodes]
    before = tcp_bytes(pids)
    cpu_before, machine_before = {p: cpu_ticks(p) for p in pids}, machine_ticks()
    t0 = time.monotonic()
    time.sleep(quiet_seconds)
    after = tcp_bytes(pids)
    cpu_after, machine_after = {p: cpu_ticks(p) for p in pids}, machine_ticks()
    elapsed = time.monotonic() - t0
    # What the mesh costs at rest: each daemon's CPU over the quiet window, and the machine's idle share.
    tick = os.sysconf("SC_CLK_TCK")
    cpu = sorted(1000 * (cpu_after[p] - cpu_before[p]) / tick / elapsed for p in pids)
    result["cpu_at_rest"] = {
        "ms_per_s_per_node": {"min": cpu[0], "median": statistics.median(cpu), "max": cpu[-1]},
        "cores_all_nodes": sum(cpu) / 1000,
        "machine_idle": (machine_after[0] - machine_before[0]) / max(1, machine_after[1] - machine_before[1]),
    }
    peers = sorted((http("GET", n.http + "/api/v1/mesh/status")[1] or {}).get("connected_peers", 0) for n in nodes)
    result["connected_peers"] = {"min": peers[0], "median": statistics.median(peers), "max": peers[-1]}
    # Each loopback byte is counted by both ends (sent by one, received by the other), which is what a
    # node's interface would carry: sent + received per node.
    rates = [bytes_between(before[p], after[p]) / elapsed for p in pids]
    result["steady_bytes_per_s_per_node"] = {"mean": statistics.mean(rates), "max": max(rates), "agents": agents}
    result["rss_mb"] = {"mean": statistics.mean(n.rss_mb() for n in nodes), "max": max(n.rss_mb() for n in nodes)}

    # Detection of a killed node (defaults: heartbeat 2 s, degraded after 7 s).
    victim = nodes[-1]
    http("POST", victim.http + "/api/v1/agents", card("victim-agent"))
    others = nodes[:-1]
    wait_until("victim agent everywhere", lambda: all(
        (http("GET", f"{n.http}/api/v1/agents/victim-agent")[1] or {}).get("health_status") == "active"
        for n in others))

    def not_active(n):
        s, body = http("GET", f"{n.http}/api/v1/agents/victim-agent", timeout=2)
        return s == 200 and body["health_status"] != "active"
    t0, threads, times = time_until_all(others, not_active)
    victim.kill()
    run(threads)
    if None in times:
        raise TimeoutError("some nodes never noticed the kill")
    result["detection_s"] = {"all": max(times), "p50": pct(times, 0.5), "min": min(times)}
    # False alarms: no agent of a live node may have left `active`.
    false_alarms = 0
    for n in others:
        _, body = http("GET", n.http + "/api/v1/discovery/capabilities?health_status=degraded&limit=500")
        false_alarms += sum(1 for c in (body or {}).get("capabilities", []) if c["publisher"] != victim.peer_id)
    result["false_alarms"] = false_alarms

    for n in others:
        n.stop()
    return result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10,30")
    ap.add_argument("--agents", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quiet-seconds", type=int, default=20)
    ap.add_argument("--preload", action="store_true",
                    help="register the steady agents from card files at each node's start instead of by HTTP")
    args = ap.parse_args()
    if not os.environ.get("AGENTMESH_BIN"):
        subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT, check=True)
    os.makedirs(os.path.join(ROOT, "simulations", "results"), exist_ok=True)
    for size in [int(s) for s in args.sizes.split(",")]:
        workdir = tempfile.mkdtemp(prefix=f"agentmesh-bench-{size}-")
        try:
            result = bench(size, args.agents, args.rounds, args.quiet_seconds, workdir, args.preload)
        finally:
            subprocess.run(["pkill", "-f", workdir], check=False)
            shutil.rmtree(workdir, ignore_errors=True)
        name = f"mesh-{size}-{args.agents}.json" if args.preload else f"mesh-{size}.json"
        with open(os.path.join(ROOT, "simulations", "results", name), "w") as f:
            json.dump(result, f, indent=2)
        conv = result["convergence_s"]
        print(f"## {size} nodes")
        if "preload_full_view_s" in result:
            print(f"- {args.agents} agents from card files: every node holds all of them "
                  f"{result['preload_full_view_s']:.1f} s after the first node started")
            c = result["catch_up_per_node"]
            print(f"- until then, per node: CPU {c['cpu_s']['median']:.2f} s median ({c['cpu_s']['min']:.2f}-"
                  f"{c['cpu_s']['max']:.2f}; all nodes {c['all_nodes_cpu_s']:.0f} s), read "
                  f"{c['read_mb']['median']:.1f} MB, written {c['written_mb']['median']:.1f} MB (median)")
            t = result["catch_up_timeline"]
            if t:
                print(f"- each node's first card applied at {t['first_card_s']['median']:.1f} s median "
                      f"({t['first_card_s']['min']:.1f}-{t['first_card_s']['max']:.1f}), its last at "
                      f"{t['last_card_s']['median']:.1f} s ({t['last_card_s']['min']:.1f}-"
                      f"{t['last_card_s']['max']:.1f})")
            g = result["gossip_until_full_view"]
            if g:
                print(f"- gossip taken in per node until then: {g['in']['median']} messages median "
                      f"({g['in']['min']}-{g['in']['max']}), of which held already {g['ignored']['median']} "
                      f"({g['ignored']['min']}-{g['ignored']['max']})")
        print(f"- card on every node: max {max(c['all'] for c in conv)*1e3:.0f} ms, "
              f"median of rounds {statistics.median(c['all'] for c in conv)*1e3:.0f} ms "
              f"(per-node p50 {statistics.median(c['p50'] for c in conv)*1e3:.0f} ms), {len(conv)} rounds")
        d = result["detection_s"]
        print(f"- killed node's agent not active on every node after {d['all']:.2f} s "
              f"(first {d['min']:.2f} s, median {d['p50']:.2f} s); false alarms: {result['false_alarms']}")
        print(f"- RSS per node: mean {result['rss_mb']['mean']:.1f} MB, max {result['rss_mb']['max']:.1f} MB")
        rest = result["cpu_at_rest"]
        print(f"- CPU at rest per node: median {rest['ms_per_s_per_node']['median']:.1f} ms/s "
              f"(min {rest['ms_per_s_per_node']['min']:.1f}, max {rest['ms_per_s_per_node']['max']:.1f}); "
              f"all nodes {rest['cores_all_nodes']:.2f} cores; machine idle {100 * rest['machine_idle']:.0f} %")
        print(f"- connected peers per node: min {result['connected_peers']['min']}, "
              f"median {result['connected_peers']['median']}, max {result['connected_peers']['max']}")
        s = result["steady_bytes_per_s_per_node"]
        print(f"- steady traffic with {s['agents']} agents: mean {s['mean']/1e3:.2f} kB/s per node, "
              f"max {s['max']/1e3:.2f} kB/s")


if __name__ == "__main__":
    main()
