"""One agentmesh daemon as a child process on loopback, for the measurement scripts in this directory."""

import json
import os
import queue
import subprocess
import threading
import time
import urllib.request

START_DEADLINE = 120


class Daemon:
    def __init__(self, binary, data_dir, extra, log=None, rust_log="warn,agentmesh::node=info"):
        """`log`: a path where the daemon's JSON log lines go (else they are read and dropped), with
        `rust_log` as its filter."""
        args = [binary, "run", "--http", "127.0.0.1:0", "--listen", "/ip4/127.0.0.1/tcp/0", "--no-mdns",
                "--log-format", "json", "--data-dir", data_dir] + extra
        env = dict(os.environ, RUST_LOG=rust_log)
        self._log = open(log, "w") if log else None
        self.proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True, env=env)
        # A reader thread drains stderr for the daemon's whole life, so it never blocks on a full pipe,
        # and the wait for "node started" has a deadline even if the daemon prints nothing.
        lines = queue.Queue()
        threading.Thread(target=lambda: [lines.put(l) for l in self.proc.stderr] + [lines.put(None)],
                         daemon=True).start()
        deadline = time.time() + START_DEADLINE
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.time()))
            except queue.Empty:
                self.proc.kill()
                raise SystemExit("daemon did not start")
            if line is None:
                raise SystemExit(f"daemon exited: {self.proc.wait()}")
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if self._log:
                self._log.write(line)
            if event.get("message") == "node started":
                self.http = "http://" + event["http_addr"]
                self.peer_id = event["peer_id"]
                break
        self._lines = lines
        self._drain = threading.Thread(target=self._discard, daemon=True)
        self._drain.start()

    def _discard(self):
        while (line := self._lines.get()) is not None:
            if self._log:
                self._log.write(line)
        if self._log:
            self._log.close()

    def get(self, path):
        with urllib.request.urlopen(self.http + path, timeout=10) as r:
            return json.load(r)

    def status(self):
        return self.get("/api/v1/mesh/status")

    def heap_live_mb(self):
        """The heap's live bytes in MB (`agentmesh_heap_live_bytes` of `/metrics`), None if not served."""
        with urllib.request.urlopen(self.http + "/metrics", timeout=10) as r:
            live = metric(r.read().decode(), "agentmesh_heap_live_bytes")
        return None if live is None else int(live) / (1024 * 1024)

    def register(self, card):
        req = urllib.request.Request(self.http + "/api/v1/agents", data=json.dumps(card).encode(),
                                     headers={"content-type": "application/json"}, method="POST")
        urllib.request.urlopen(req, timeout=10).read()

    def health(self, agent_id):
        """The agent's health on this node, or None if it does not hold it."""
        try:
            return self.get(f"/api/v1/agents/{agent_id}")["health_status"]
        except (OSError, ValueError, KeyError):
            return None

    def addr(self):
        deadline = time.time() + 30
        while time.time() < deadline:
            addrs = self.status()["listen_addrs"]
            if addrs:
                return f"{addrs[0]}/p2p/{self.peer_id}"
            time.sleep(0.05)
        raise SystemExit("no listen address")

    def stop(self):
        """Stops the daemon; once it returns, its log (`log`) holds every line the daemon wrote."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._drain.join(timeout=10)


def metric(text, sample):
    """The value of one sample (its name with any labels, as written) of a Prometheus text exposition,
    None when absent."""
    for line in text.splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[-1])
    return None


def records(daemon):
    """`daemon`'s records by health; empty while it is too busy to answer its status in time."""
    try:
        return daemon.status()["records"]
    except OSError:
        return {}


def active(daemon):
    """Agents `active` on `daemon`; 0 while it is too busy to answer its status in time."""
    return records(daemon).get("active", 0)


def mesh_arguments(ap, publishers, timeout):
    """The options of a script that starts a mesh of publishers on `populate`d data: the binaries, the
    publishers and agents, and how long to wait for the full view."""
    ap.add_argument("--bin", required=True)
    ap.add_argument("--populate-bin", required=True)
    ap.add_argument("--publishers", type=int, default=publishers)
    ap.add_argument("--agents", type=int, default=10_000)
    ap.add_argument("--timeout", type=float, default=timeout)


def held(daemon):
    """Agents `daemon` holds, whatever their health; 0 while it is too busy to answer its status in time."""
    return sum(records(daemon).values())


def wait_full_view(daemons, agents, timeout, what="the mesh", count=active):
    """Waits until every one of `daemons` holds `agents` agents `active` (or as `count` counts them:
    `held` for every agent whatever its health), polling once a second (each status answer costs its
    daemon CPU); the seconds it took. Exits the script after `timeout` seconds."""
    started = time.time()
    while any(count(d) < agents for d in daemons):
        if time.time() - started > timeout:
            raise SystemExit(f"{what}: no full view within {timeout} s")
        time.sleep(1.0)
    return time.time() - started


def populate(populate_bin, work, agents, publishers):
    """`agents` split over `publishers` data directories under `work` (`publisher-0` takes the first share),
    each written by the discovery bench's `--populate` with a key of its own; returns their paths."""
    shares = [agents // publishers + (1 if i < agents % publishers else 0) for i in range(publishers)]
    dirs = [os.path.join(work, f"publisher-{i}") for i in range(publishers)]
    for d, n in zip(dirs, shares):
        subprocess.run([populate_bin, "--populate", d, str(n)], check=True, stdout=subprocess.DEVNULL)
    return dirs


def status_mb(pid, field):
    """A memory line of /proc/PID/status in MB: `VmRSS` (resident), `RssAnon` (its heap and stacks)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def rss_mb(pid):
    return status_mb(pid, "VmRSS")


def cpu_ticks(pid):
    """User + system CPU of a process, in clock ticks (1/100 s, /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def machine_ticks():
    """(idle + iowait, all) CPU ticks of the machine (/proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return fields[3] + fields[4], sum(fields)
