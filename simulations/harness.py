#!/usr/bin/env python3
"""Scenario harness for a docker-compose mesh of agentmesh containers.

Brings up `docker-compose.yml` (one bootstrap node + scaled nodes), waits until every node holds every
agent and has its gossip mesh (then 3 s more: the steps run on a settled mesh, as the simulator's do),
runs the scenario's steps against the containers, and writes
simulations/results/<scenario>-<N>.json and .md with SVG plots. Exits non-zero when a step fails
(a deadline passes, or a live agent is ever reported inactive).

  simulations/build-image.sh
  simulations/harness.py simulations/scenarios/crash.json [--nodes 50] [--keep]

Steps (see simulations/scenarios/):
  convergence  register a card on a random node; time until every other node applied it (from logs)
  crash        kill -9 a node (its daemon, by host pid); time until every other node reports its agents
               degraded, then inactive (polled), and until each marked it down (from its log)
  leave        stop a node (SIGTERM); time until its tombstones removed its agents everywhere
  churn        stop and restart nodes continuously; no live agent may ever be reported inactive
  partition    disconnect nodes from the network, register a card, reconnect; time to reconverge
  netem        delay/loss on every container's link (tc netem from the host; iptables loss only where
               the kernel has no sch_netem), then nested steps

A scenario's "cards_per_node": N has every scaled node register N generated cards instead of the three
samples (scale-50-10000.json: 49 x 204 of them, about 10,000 agents in all).

The daemons log with RUST_LOG=info,agentmesh::apply=debug (the convergence step reads those lines);
HARNESS_RUST_LOG replaces it, e.g. with ",agentmesh::net=debug,libp2p_swarm=debug" added to see why
connections close (with --keep, `docker logs` keeps them after the run).

Standard library only. Needs root (nsenter, tc) for netem.
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
import threading
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "simulations", "results")
API_KEY = "agentmesh-sim-local-key"
HOST_PORT = "18080"
POLL = 0.25
CARDS_TOPIC = "agentmesh/cards/1"
SETTLE_S = 3  # after every gossip mesh formed: three gossipsub heartbeats
CARDS_PER_NODE = 3  # simulations/cards/*.json on every scaled node; the bootstrap node has one
DISCOVERY_PAGE = 500  # the most agents a discovery page holds (`limit`)


class StepFailed(Exception):
    pass


def compose_cmd():
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return ["docker-compose"]


def http(method, url, body=None, timeout=3.0):
    data = json.dumps(body).encode() if body is not None else None
    headers = {"content-type": "application/json", "x-api-key": API_KEY}
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, None
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return 0, None


def pct(values, p):
    s = sorted(values)
    return s[min(len(s) - 1, int(round((len(s) - 1) * p)))] if s else None


def wait_until(what, check, deadline):
    start = time.monotonic()
    while time.monotonic() - start < deadline:
        if check():
            return time.monotonic() - start
        time.sleep(POLL)
    raise StepFailed(f"timed out after {deadline:.0f} s: {what}")


def card(agent_id):
    return {"agent_id": agent_id, "base_url": "http://127.0.0.1:9", "version": "1.0.0",
            "reasoners": [{"id": "probe", "tags": ["sim"]}], "skills": [{"id": "echo", "tags": ["sim"]}]}


def bulk_cards(count, directory):
    """`count` card files in `directory` for every scaled node to register instead of the samples (ids
    `bulk-NNNN-<hostname>`, each with a reasoner, a skill and a schema like a real agent's)."""
    os.makedirs(directory, exist_ok=True)
    for i in range(count):
        card = {"agent_id": f"bulk-{i:04d}-${{HOSTNAME}}", "name": f"Bulk agent {i}",
                "description": "An agent of the 10,000-agent compose run.", "version": "1.0.0",
                "base_url": "http://127.0.0.1:9", "tags": ["bulk", f"group-{i % 10}"],
                "reasoners": [{"id": f"work-{i % 50}", "tags": ["bulk"],
                               "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}}],
                "skills": [{"id": "lookup", "tags": ["bulk"]}]}
        with open(os.path.join(directory, f"bulk-{i:04d}.json"), "w") as f:
            json.dump(card, f)
    return [f"bulk-{i:04d}" for i in range(count)]


class Node:
    # The agent id stems every scaled node registers (with its hostname appended): the sample cards,
    # or those of `bulk_cards` when a scenario asks for `cards_per_node`.
    stems = ["analytics", "research", "translate"]

    def __init__(self, name, network):
        self.name = name
        self.network = network
        self.refresh()

    def refresh(self):
        info = json.loads(subprocess.check_output(["docker", "inspect", self.name]))[0]
        self.host = info["Config"]["Hostname"]
        self.pid = info["State"]["Pid"]
        self.running = info["State"]["Running"]
        nets = info["NetworkSettings"]["Networks"]
        self.ip = nets[self.network]["IPAddress"] if self.network in nets else None
        self.base = f"http://{self.ip}:8080" if self.ip else None
        self.bootstrap = self.host == "bootstrap"

    def agents(self):
        """The agent ids this node publishes."""
        if self.bootstrap:
            return ["research-bootstrap"]
        return [f"{stem}-{self.host}" for stem in Node.stems]

    def get(self, path, timeout=3.0):
        return http("GET", self.base + path, timeout=timeout) if self.base else (0, None)

    def total(self):
        return (self.get("/api/v1/agents?limit=0")[1] or {}).get("total", 0)

    def health_of(self, agent_id):
        status, body = self.get(f"/api/v1/agents/{agent_id}", timeout=2.0)
        if status == 404:
            return "gone"
        return body["health_status"] if status == 200 else None

    def healths(self):
        """Every agent this node holds, with its health: a page of the discovery view at a time, so a
        check of many agents costs a request or a few, not one per agent. None if a page fails."""
        out, offset = {}, 0
        while True:
            status, body = self.get(f"/api/v1/discovery/capabilities?limit={DISCOVERY_PAGE}&offset={offset}",
                                    timeout=3.0)
            if status != 200:
                return None
            agents = body.get("capabilities", [])
            out.update((a["agent_id"], a["health_status"]) for a in agents)
            offset += len(agents)
            if not agents or offset >= body.get("total_agents", 0):
                return out

    def rss_mb(self):
        try:
            with open(f"/proc/{self.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS"):
                        return int(line.split()[1]) / 1024
        except OSError:
            pass
        return None

    def logged_at(self, message, field, value, since):
        """Wall-clock time of this node's first log event `message` with `field` = `value` since `since`."""
        # The daemon logs to stderr; docker keeps the two streams apart.
        out = subprocess.run(["docker", "logs", "--since", str(int(since) - 1), self.name],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout
        for line in out.splitlines():
            if f'"{message}"' in line and f'"{field}":"{value}"' in line:
                return parse_rfc3339(json.loads(line)["timestamp"])
        return None

    def declared_down_at(self, peer_id, since):
        """Wall-clock time at which this node marked `peer_id`'s agents down."""
        return self.logged_at("publisher declared down", "publisher", peer_id, since)

    def applied_at(self, agent_id, since):
        """Wall-clock time at which this node applied the card."""
        return self.logged_at("card applied", "agent_id", agent_id, since)


def parse_rfc3339(stamp):
    import calendar
    main, _, frac = stamp.rstrip("Z").partition(".")
    return calendar.timegm(time.strptime(main, "%Y-%m-%dT%H:%M:%S")) + (float("0." + frac) if frac else 0.0)


NEIGH = "/proc/sys/net/ipv4/neigh/default/gc_thresh{}"


def ensure_neighbour_table(size):
    """The kernel's ARP table is shared by every network namespace; its default hard limit (1024 entries)
    is below what N containers that all talk to each other need (about N^2), and past it new neighbours
    are not resolved and the mesh silently falls apart ("neighbor table overflow"). Raise it (root)."""
    need = 4 * size * size
    try:
        with open(NEIGH.format(3)) as f:
            if int(f.read()) >= need:
                return
        for i, value in ((1, need // 4), (2, need // 2), (3, need)):
            with open(NEIGH.format(i), "w") as f:
                f.write(str(value))
    except OSError as e:
        print(f"warning: cannot raise the ARP table limit to {need} ({e}); large meshes may lose connectivity")


class Mesh:
    def __init__(self, size, project, cards_dir=None):
        self.size = size
        self.project = project
        self.compose = compose_cmd() + ["-p", project, "-f", os.path.join(ROOT, "docker-compose.yml")]
        if cards_dir:
            # The scaled nodes register the generated cards instead of the image's samples.
            override = os.path.join(cards_dir, "compose-cards.yml")
            with open(override, "w") as f:
                f.write(f"services:\n  node:\n    volumes:\n      - {cards_dir}/cards:/cards:ro\n")
            self.compose += ["-f", override]
        self.network = f"{project}_mesh"
        self.env = {**os.environ, "AGENTMESH_API_KEY": API_KEY, "AGENTMESH_HOST_PORT": HOST_PORT,
                    "RUST_LOG": os.environ.get("HARNESS_RUST_LOG", "info,agentmesh::apply=debug")}
        self.nodes = []

    def run(self, *args):
        subprocess.run(self.compose + list(args), env=self.env, check=True, capture_output=True, text=True)

    def up(self):
        self.started = time.monotonic()
        self.run("up", "-d", "--scale", f"node={self.size - 1}")
        self.discover()
        time.sleep(1)
        for n in self.nodes:
            n.refresh()
        down = [n for n in self.nodes if not n.running]
        if down or len(self.nodes) != self.size:
            logs = subprocess.run(["docker", "logs", "--tail", "5", down[0].name], capture_output=True,
                                  text=True) if down else None
            raise StepFailed(f"{len(self.nodes) - len(down)} of {self.size} containers running"
                             + (f"; {down[0].name}: {logs.stdout}{logs.stderr}" if logs else ""))

    def discover(self):
        names = subprocess.check_output(
            ["docker", "ps", "-a", "--filter", f"label=com.docker.compose.project={self.project}",
             "--format", "{{.Names}}"], text=True).split()
        known = {n.name for n in self.nodes}
        self.nodes += [Node(name, self.network) for name in sorted(names) if name not in known]

    def down(self):
        subprocess.run(self.compose + ["down", "-v", "--remove-orphans", "-t", "5"], env=self.env,
                       capture_output=True)

    def live(self):
        return [n for n in self.nodes if n.running and n.ip]

    def expected_agents(self):
        return sum(len(n.agents()) for n in self.live())

    def wait_converged(self, deadline=300):
        want = self.expected_agents()
        return wait_until(f"every node holds all {want} agents",
                          lambda: all(n.total() >= want for n in self.live()), deadline)

    def wait_meshed(self, deadline=120):
        def meshed(n):
            status = n.get("/api/v1/mesh/status")[1] or {}
            return status.get("mesh_peers", {}).get(CARDS_TOPIC, 0) >= 1
        return wait_until("every node's gossip mesh formed", lambda: all(meshed(n) for n in self.live()), deadline)

    def victim(self):
        return random.choice([n for n in self.live() if not n.bootstrap])


def watch(observers, agent_id, done, deadline=90):
    """Polls every observer for agent_id's health until done(health) holds on all of them. Returns
    each observer's timeline [(seconds, health)] of changes, starting at the call."""
    t0 = time.monotonic()
    timelines = {n.name: [] for n in observers}

    def poll(n):
        last = None
        while time.monotonic() - t0 < deadline:
            h = n.health_of(agent_id)
            if h is not None and h != last:
                timelines[n.name].append((round(time.monotonic() - t0, 3), h))
                last = h
            if h is not None and done(h):
                return
            time.sleep(POLL)

    threads = [threading.Thread(target=poll, args=(n,)) for n in observers]
    for t in threads:
        t.start()
    return t0, threads, timelines


def first_time(timeline, states):
    return next((t for t, h in timeline if h in states), None)


# ---------------------------------------------------------------- steps

def step_convergence(mesh, spec, out):
    rounds = spec.get("rounds", 5)
    samples, per_round = [], []
    for r in range(rounds):
        publisher = random.choice(mesh.live())
        others = [n for n in mesh.live() if n is not publisher]
        agent_id = f"conv-{r}-{random.randrange(1 << 30):x}"
        t0 = time.time()
        status, _ = http("POST", publisher.base + "/api/v1/agents", card(agent_id))
        if status not in (200, 201):
            raise StepFailed(f"registration on {publisher.name} answered {status}")
        times = {}

        def all_applied():
            for n in others:
                if n.name not in times:
                    at = n.applied_at(agent_id, t0)
                    if at is not None:
                        times[n.name] = at - t0
            return len(times) == len(others)
        wait_until(f"{agent_id} applied on every node", all_applied, spec.get("deadline", 60))
        samples += list(times.values())
        per_round.append(max(times.values()))
        time.sleep(spec.get("pause", 1))
    out.update({"rounds": rounds, "samples_s": samples, "round_max_s": per_round,
                "p50_s": pct(samples, 0.5), "p99_s": pct(samples, 0.99), "max_s": max(samples)})


def step_crash(mesh, spec, out):
    victim = mesh.victim()
    observers = [n for n in mesh.live() if n is not victim]
    agent_id = victim.agents()[0]
    wait_until(f"{agent_id} active everywhere",
               lambda: all(n.health_of(agent_id) == "active" for n in observers), 60)
    peer_id = (victim.get("/api/v1/mesh/status")[1] or {}).get("peer_id")
    t0, threads, timelines = watch(observers, agent_id, lambda h: h in ("inactive", "gone"))
    # SIGKILL straight to the daemon (the container's first process, by its host pid) at a known instant,
    # rather than through the docker CLI, whose own latency on a loaded machine would count as detection.
    killed_at = time.time()
    killed_after = time.monotonic() - t0
    os.kill(victim.pid, signal.SIGKILL)
    for t in threads:
        t.join()
    victim.refresh()
    degraded = [first_time(tl, ("degraded", "inactive", "gone")) for tl in timelines.values()]
    inactive = [first_time(tl, ("inactive", "gone")) for tl in timelines.values()]
    if None in degraded or None in inactive:
        raise StepFailed("some nodes never noticed the killed node")
    out.update({"victim": victim.name, "agent": agent_id, "timelines": timelines,
                "not_active_s": {"p50": pct(degraded, 0.5), "max": max(degraded)},
                "inactive_s": {"p50": pct(inactive, 0.5), "max": max(inactive)},
                "killed_after_s": round(killed_after, 3)})
    # When each node marked the victim down, from its own log: exact, where the polls above see it at
    # their next poll (every POLL seconds, each a request to a busy node) and count from before the kill.
    declared = [n.declared_down_at(peer_id, killed_at) for n in observers] if peer_id else []
    if declared and None not in declared:
        since = [round(t - killed_at, 3) for t in declared]
        out["declared_down_s"] = {"p50": pct(since, 0.5), "max": max(since), "samples_s": since}


def step_leave(mesh, spec, out):
    victim = mesh.victim()
    observers = [n for n in mesh.live() if n is not victim]
    agent_id = victim.agents()[0]
    t0, threads, timelines = watch(observers, agent_id, lambda h: h == "gone")
    subprocess.run(["docker", "stop", "-t", "10", victim.name], check=True, capture_output=True)
    for t in threads:
        t.join()
    victim.refresh()
    gone = [first_time(tl, ("gone",)) for tl in timelines.values()]
    if None in gone:
        raise StepFailed("some nodes still list the node that left")
    out.update({"victim": victim.name, "gone_s": {"p50": pct(gone, 0.5), "max": max(gone)},
                "timelines": timelines})


def false_inactive(mesh, grace):
    """Agents of nodes running for more than `grace` seconds that some node reports inactive."""
    now = time.monotonic()
    alive = {n.host for n in mesh.live() if now - getattr(n, "started", 0) > grace}
    found = []
    for n in mesh.live():
        _, body = n.get("/api/v1/discovery/capabilities?health_status=inactive&limit=1000", timeout=5)
        for c in (body or {}).get("capabilities", []):
            host = c["agent_id"].split("-", 1)[-1]
            if host in alive:
                found.append({"observer": n.name, "agent": c["agent_id"]})
    return found


def step_churn(mesh, spec, out):
    duration, interval = spec.get("duration_s", 120), spec.get("interval_s", 10)
    grace = spec.get("grace_s", 15)
    memory_every = spec.get("memory_every_s", 60)
    # Only this many nodes (besides the bootstrap) are stopped and restarted; the others stay up and
    # witness the memory of a long-running node.
    pool_size = spec.get("churn_pool")
    candidates = [n for n in mesh.nodes if not n.bootstrap]
    pool = {n.name for n in (candidates[:pool_size] if pool_size else candidates)}
    stopped, events, alarms, checks = [], [], [], 0
    churned, memory = set(), []
    t0 = time.monotonic()
    next_change, next_memory = t0 + interval, t0
    while time.monotonic() - t0 < duration:
        if time.monotonic() >= next_memory:
            # Memory of the nodes never restarted so far: a leak shows as growth over the run.
            rss = {n.name: n.rss_mb() for n in mesh.live() if n.name not in churned}
            rss = {name: round(mb, 2) for name, mb in rss.items() if mb}
            if rss:
                memory.append({"t_s": round(time.monotonic() - t0), "nodes": len(rss),
                               "mean_mb": round(statistics.mean(rss.values()), 1),
                               "max_mb": round(max(rss.values()), 1), "rss_mb": rss})
            next_memory += memory_every
        if time.monotonic() >= next_change:
            if stopped and (random.random() < 0.5 or len(stopped) > 2):
                n = stopped.pop(random.randrange(len(stopped)))
                subprocess.run(["docker", "start", n.name], check=True, capture_output=True)
                n.refresh()
                reapply_link_faults(mesh, n)
                n.started = time.monotonic()
                events.append((round(n.started - t0, 1), "join", n.name))
            else:
                n = random.choice([m for m in mesh.live() if m.name in pool])
                how = random.choice(["stop", "kill"])
                cmd = ["docker", "stop", "-t", "10", n.name] if how == "stop" else ["docker", "kill", n.name]
                subprocess.run(cmd, check=True, capture_output=True)
                n.refresh()
                stopped.append(n)
                churned.add(n.name)
                events.append((round(time.monotonic() - t0, 1), how, n.name))
            next_change += interval
        alarms += false_inactive(mesh, grace)
        checks += 1
        time.sleep(1)
    out.update({"duration_s": duration, "events": events, "checks": checks, "false_inactive": alarms,
                "memory": memory})
    if len(memory) > 1:
        # Growth of each node that ran the whole step, from its first sample to its last.
        first, last = memory[0]["rss_mb"], memory[-1]["rss_mb"]
        growth = {name: round(last[name] - first[name], 2) for name in last if name in first}
        if growth:
            out["memory_growth_mb"] = {"nodes": len(growth), "mean": round(statistics.mean(growth.values()), 2),
                                       "max": max(growth.values()), "first_mean": round(statistics.mean(first[n] for n in growth), 1),
                                       "last_mean": round(statistics.mean(last[n] for n in growth), 1)}
    for n in stopped:
        subprocess.run(["docker", "start", n.name], check=True, capture_output=True)
        n.refresh()
        reapply_link_faults(mesh, n)
        n.started = time.monotonic()
    out["reconverge_s"] = mesh.wait_converged()
    if alarms:
        raise StepFailed(f"{len(alarms)} false inactive reports for live agents")


def step_partition(mesh, spec, out):
    k = spec.get("isolate", max(1, mesh.size // 5))
    declared_before = declared_down(mesh)
    cut = random.sample([n for n in mesh.live() if not n.bootstrap], k)
    for n in cut:
        subprocess.run(["docker", "network", "disconnect", "-f", mesh.network, n.name], check=True,
                       capture_output=True)
        n.refresh()
    boot = next(n for n in mesh.live() if n.bootstrap)
    agent_id = f"during-partition-{random.randrange(1 << 30):x}"
    http("POST", boot.base + "/api/v1/agents", card(agent_id))
    time.sleep(spec.get("partition_s", 30))
    t0 = time.monotonic()
    for n in cut:
        subprocess.run(["docker", "network", "connect", mesh.network, n.name], check=True, capture_output=True)
        n.refresh()

    # One discovery page per node per check (a request per agent and observer, 540 of them, made the
    # last check alone take seconds on a machine running 50 containers). The check that succeeds
    # started after the last change it needed, so the time is given as that check's start and end.
    wanted = [agent_id] + [c.agents()[0] for c in cut]
    check = {}

    def healed():
        check["started"] = time.monotonic()
        for obs in mesh.live():
            held = obs.healths()
            if held is None:
                check["waiting_for"] = f"{obs.name}: no answer"
                return False
            short = [(a, held.get(a)) for a in wanted if a not in obs.agents() and held.get(a) != "active"]
            if short:
                # What the last failed check waited for: the first node short of something, and what.
                check["waiting_for"] = f"{obs.name}: " + ", ".join(f"{a} {h or 'absent'}" for a, h in short)
                check["waiting_since"] = round(check["started"] - t0, 2)
                return False
        return True
    wait_until("partition healed", healed, spec.get("deadline", 180))
    out.update({"isolated": [n.name for n in cut], "partition_s": spec.get("partition_s", 30),
                "reconverge_s": time.monotonic() - t0, "reconverge_check_started_s": check["started"] - t0,
                "last_waited_for": check.get("waiting_for"), "last_waited_at_s": check.get("waiting_since")})
    # Peers declared down meanwhile, counted by every node: a quiet path is left to heartbeat age, so
    # a partition alone declares nobody.
    out["declared_down"] = declared_down(mesh) - declared_before


def declared_down(mesh):
    """Peers the live nodes declared down since they started, summed over them."""
    return sum((n.get("/api/v1/mesh/status")[1] or {}).get("peers_declared_down", 0) for n in mesh.live())


def in_netns(node, cmd, check=True):
    return subprocess.run(["nsenter", "-t", str(node.pid), "-n"] + cmd, check=check, capture_output=True,
                          text=True)


def netem_available(node):
    probe = in_netns(node, ["tc", "qdisc", "replace", "dev", "eth0", "root", "netem", "delay", "1ms"], check=False)
    if probe.returncode == 0:
        in_netns(node, ["tc", "qdisc", "del", "dev", "eth0", "root"], check=False)
    return probe.returncode == 0


def reapply_link_faults(mesh, n):
    """A restarted container has a new network namespace: the link faults of a running netem step
    are applied to it again."""
    rule = getattr(mesh, "link_faults", None)
    if rule and n.running:
        in_netns(n, rule)


def step_netem(mesh, spec, out):
    """Delay and loss on every container's link, applied from the host in the containers' network
    namespaces. Where the kernel lacks sch_netem, loss alone is applied with iptables' statistic match
    and the result says that no delay was applied."""
    delay, jitter, loss = spec.get("delay_ms", 50), spec.get("jitter_ms", 10), spec.get("loss_pct", 1)
    nodes = mesh.live()
    if netem_available(nodes[0]):
        method = "tc netem"
        apply = ["tc", "qdisc", "replace", "dev", "eth0", "root", "netem", "delay", f"{delay}ms", f"{jitter}ms",
                 "loss", f"{loss}%"]
        undo = ["tc", "qdisc", "del", "dev", "eth0", "root"]
    else:
        method = "iptables statistic (this kernel has no sch_netem: loss only, no delay)"
        delay = jitter = 0
        rule = ["INPUT", "-i", "eth0", "-m", "statistic", "--mode", "random", "--probability", f"{loss / 100}",
                "-j", "DROP"]
        apply, undo = ["iptables", "-A"] + rule, ["iptables", "-D"] + rule
    for n in nodes:
        in_netns(n, apply)
    mesh.link_faults = apply
    out.update({"method": method, "delay_ms": delay, "jitter_ms": jitter, "loss_pct": loss, "steps": []})
    try:
        for sub in spec.get("steps", [{"do": "convergence"}]):
            out["steps"].append(run_step(mesh, sub))
    finally:
        mesh.link_faults = None
        for n in mesh.nodes:
            n.refresh()
            if n.running:
                in_netns(n, undo, check=False)


STEPS = {"convergence": step_convergence, "crash": step_crash, "leave": step_leave, "churn": step_churn,
         "partition": step_partition, "netem": step_netem}


def run_step(mesh, spec):
    out = {"do": spec["do"]}
    t = time.monotonic()
    STEPS[spec["do"]](mesh, spec, out)
    out["step_s"] = round(time.monotonic() - t, 1)
    print(f"  {spec['do']}: {summary(out)}", flush=True)
    return out


# ---------------------------------------------------------------- report

def summary(o):
    d = o["do"]
    if d == "convergence":
        return f"p50 {o['p50_s']*1e3:.0f} ms, p99 {o['p99_s']*1e3:.0f} ms, max {o['max_s']*1e3:.0f} ms ({o['rounds']} rounds)"
    if d == "crash":
        declared = o.get("declared_down_s")
        logged = (f"; marked down in every node's log {declared['max']:.3f} s after the kill "
                  f"(p50 {declared['p50']:.3f} s)" if declared else "")
        return (f"not active everywhere after {o['not_active_s']['max']:.2f} s (p50 {o['not_active_s']['p50']:.2f} s), "
                f"inactive everywhere after {o['inactive_s']['max']:.2f} s (polled every {POLL} s){logged}")
    if d == "leave":
        return f"removed everywhere after {o['gone_s']['max']:.2f} s (p50 {o['gone_s']['p50']:.2f} s)"
    if d == "churn":
        g = o.get("memory_growth_mb")
        trend = (f"; RSS of the {g['nodes']} nodes up throughout {g['first_mean']:.1f} -> {g['last_mean']:.1f} MB mean "
                 f"(growth mean {g['mean']:+.2f}, max {g['max']:+.2f} MB)" if g else "")
        return (f"{len(o['events'])} joins/leaves in {o['duration_s']} s, {o['checks']} checks, "
                f"{len(o['false_inactive'])} false inactive, reconverged in {o['reconverge_s']:.1f} s{trend}")
    if d == "partition":
        declared = f", {o['declared_down']} peers declared down" if "declared_down" in o else ""
        return (f"{len(o['isolated'])} nodes cut for {o['partition_s']} s, reconverged {o['reconverge_s']:.1f} s "
                f"after reconnect (the check that passed began at {o['reconverge_check_started_s']:.1f} s){declared}")
    if d == "netem":
        inner = "; ".join(summary(s) for s in o["steps"])
        return f"{o['method']}: delay {o['delay_ms']}±{o['jitter_ms']} ms, loss {o['loss_pct']}%: {inner}"
    return ""


def svg_cdf(samples_ms, title):
    w, h, m = 560, 300, 50
    xs = sorted(samples_ms)
    xmax = max(xs) * 1.05 or 1
    pts = " ".join(f"{m + (x / xmax) * (w - 2 * m):.1f},{h - m - ((i + 1) / len(xs)) * (h - 2 * m):.1f}"
                   for i, x in enumerate(xs))
    digits = 1 if xmax < 20 else 0
    ticks = "".join(
        f'<text x="{m + f * (w - 2 * m):.0f}" y="{h - m + 18}" font-size="11" text-anchor="middle">{f * xmax:.{digits}f}</text>'
        for f in (0, 0.25, 0.5, 0.75, 1))
    yt = "".join(f'<text x="{m - 6}" y="{h - m - f * (h - 2 * m) + 4:.0f}" font-size="11" text-anchor="end">{f:.2f}</text>'
                 for f in (0, 0.25, 0.5, 0.75, 1))
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif">'
            f'<rect width="100%" height="100%" fill="white"/>'
            f'<text x="{w / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>'
            f'<line x1="{m}" y1="{h - m}" x2="{w - m}" y2="{h - m}" stroke="black"/>'
            f'<line x1="{m}" y1="{m}" x2="{m}" y2="{h - m}" stroke="black"/>{ticks}{yt}'
            f'<text x="{w / 2}" y="{h - 12}" text-anchor="middle" font-size="12">ms after registration</text>'
            f'<polyline fill="none" stroke="#1f77b4" stroke-width="2" points="{pts}"/></svg>')


COLORS = {"active": "#2ca02c", "degraded": "#ff7f0e", "inactive": "#d62728", "gone": "#7f7f7f", "unknown": "#bbbbbb"}


def svg_timeline(timelines, title):
    rows = sorted(timelines.items())
    w, m, row = 640, 150, 12
    h = 50 + row * len(rows) + 40
    end = max((tl[-1][0] for _, tl in rows if tl), default=1) * 1.1 or 1
    scale = (w - m - 20) / end
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif">',
             '<rect width="100%" height="100%" fill="white"/>',
             f'<text x="{w / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>']
    for i, (name, tl) in enumerate(rows):
        y = 40 + i * row
        parts.append(f'<text x="{m - 6}" y="{y + row - 3}" font-size="9" text-anchor="end">{name[-24:]}</text>')
        for j, (t, state) in enumerate(tl):
            t_end = tl[j + 1][0] if j + 1 < len(tl) else end
            parts.append(f'<rect x="{m + t * scale:.1f}" y="{y}" width="{max(1, (t_end - t) * scale):.1f}" '
                         f'height="{row - 2}" fill="{COLORS.get(state, "#000")}"/>')
    y = 40 + row * len(rows) + 20
    for k in range(0, int(end) + 1, max(1, int(end) // 8 or 1)):
        parts.append(f'<text x="{m + k * scale:.0f}" y="{y}" font-size="10" text-anchor="middle">{k}s</text>')
    lx = m
    for state, color in COLORS.items():
        parts.append(f'<rect x="{lx}" y="{y + 8}" width="10" height="10" fill="{color}"/>'
                     f'<text x="{lx + 14}" y="{y + 17}" font-size="10">{state}</text>')
        lx += 80
    parts.append("</svg>")
    return "".join(parts)


def write_report(name, result, results):
    os.makedirs(results, exist_ok=True)
    stem = f"{name}-{result['nodes']}"
    with open(os.path.join(results, stem + ".json"), "w") as f:
        json.dump(result, f, indent=1)
    lines = [f"# Scenario `{name}`, {result['nodes']} nodes", "",
             f"Run {result['started']} on {result['machine']}; command: `{result['command']}`.", "",
             f"- from `up` to every node holding all {result['agents']} agents: {result['initial_convergence_s']:.1f} s",
             f"- memory per container (RSS): mean {result['rss_mb']['mean']:.1f} MB, max {result['rss_mb']['max']:.1f} MB",
             ""]
    flat = []
    for s in result["steps"]:
        flat.append(s)
        flat += s.get("steps", [])
    for i, s in enumerate(result["steps"]):
        lines.append(f"- **{s['do']}**: {summary(s)}" if "error" not in s else f"- **{s['do']}**: FAILED: {s['error']}")
    lines.append("")
    for i, s in enumerate(flat):
        if s["do"] == "convergence" and s.get("samples_s"):
            svg = f"{stem}-convergence-{i}.svg"
            with open(os.path.join(results, svg), "w") as f:
                f.write(svg_cdf([x * 1e3 for x in s["samples_s"]], f"Card applied on each node (CDF), {result['nodes']} nodes"))
            lines += [f"![convergence CDF]({svg})", ""]
        if s["do"] in ("crash", "leave") and s.get("timelines"):
            svg = f"{stem}-{s['do']}-{i}.svg"
            with open(os.path.join(results, svg), "w") as f:
                f.write(svg_timeline(s["timelines"], f"{s['agent'] if 'agent' in s else s['victim']} as each node sees it after the {s['do']}"))
            lines += [f"![{s['do']} health timeline]({svg})", ""]
    with open(os.path.join(results, stem + ".md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return os.path.join(results, stem + ".md")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenario")
    ap.add_argument("--nodes", type=int, help="override the scenario's node count")
    ap.add_argument("--keep", action="store_true", help="leave the containers running")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--out", default=RESULTS, help="directory for the JSON, Markdown and SVG results")
    args = ap.parse_args()
    with open(args.scenario) as f:
        scenario = json.load(f)
    name = os.path.splitext(os.path.basename(args.scenario))[0]
    size = args.nodes or scenario.get("nodes", 5)
    random.seed(args.seed)
    if shutil.which("docker") is None:
        sys.exit("docker is not installed")
    ensure_neighbour_table(size)
    cards_dir = None
    if scenario.get("cards_per_node"):
        cards_dir = tempfile.mkdtemp(prefix="agentmesh-cards-")
        Node.stems = bulk_cards(scenario["cards_per_node"], os.path.join(cards_dir, "cards"))
        os.chmod(cards_dir, 0o755)
    mesh = Mesh(size, f"amsim{name.replace('-', '')}", cards_dir)
    mesh.down()
    result = {"scenario": name, "nodes": size, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "machine": f"{os.cpu_count()} cores, {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB",
              "command": "simulations/harness.py " + " ".join(sys.argv[1:]), "steps": []}
    failed = None
    try:
        print(f"{name}: {size} nodes", flush=True)
        mesh.up()
        result["agents"] = mesh.expected_agents()
        mesh.wait_converged()
        result["initial_convergence_s"] = time.monotonic() - mesh.started
        # The steps run on a settled mesh, as the simulator's do: every node's gossip mesh formed on the
        # cards topic, then a few gossip heartbeats more (the simulator's `start` scenario is what
        # measures a card announced while the mesh is still forming).
        mesh.wait_meshed()
        time.sleep(SETTLE_S)
        result["settled_s"] = time.monotonic() - mesh.started
        rss = [r for r in (n.rss_mb() for n in mesh.live()) if r]
        result["rss_mb"] = {"mean": statistics.mean(rss), "max": max(rss)}
        for spec in scenario["steps"]:
            try:
                result["steps"].append(run_step(mesh, spec))
            except StepFailed as e:
                result["steps"].append({"do": spec["do"], "error": str(e)})
                failed = f"{spec['do']}: {e}"
                break
    except (StepFailed, subprocess.CalledProcessError) as e:
        failed = str(e) if not isinstance(e, subprocess.CalledProcessError) else f"{e.cmd}: {e.stderr}"
    finally:
        if not args.keep:
            mesh.down()
    if "initial_convergence_s" in result and "rss_mb" in result:
        print("report:", write_report(name, result, args.out))
    if failed:
        sys.exit(f"FAILED: {failed}")


if __name__ == "__main__":
    main()
