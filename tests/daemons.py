"""Real agentmesh daemons for the Python test drivers (tests/sdk/run.py, tests/ui/run.py).

Each daemon runs the binary on its own loopback ports and temporary data directory, with mDNS off and
whatever flags the driver adds. Every wait has a deadline.
"""

import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.request

DEADLINE_S = 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)


def wait_for(what, check, deadline_s=DEADLINE_S):
    """Polls `check` until it returns something true (connection errors count as not yet)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"timed out waiting for {what}")


class Daemon:
    def __init__(self, binary, name, flags=(), bootstrap=None, cards=()):
        self.name = name
        self.dir = tempfile.mkdtemp(prefix=f"agentmesh-{name}-")
        self.api = f"http://127.0.0.1:{free_port()}"
        args = [binary, "run", "--data-dir", self.dir, "--http", self.api.removeprefix("http://"),
                "--listen", "/ip4/127.0.0.1/tcp/0", "--no-mdns", *flags]
        if bootstrap:
            args += ["--bootstrap", bootstrap]
        for card in cards:
            args += ["--card", card]
        self.log = open(os.path.join(self.dir, "daemon.log"), "w")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        self.peer_id = wait_for(f"{name} to serve", lambda: get_json(f"{self.api}/api/v1/health"))["peer_id"]

    def dial_addr(self):
        addrs = wait_for("a listen address", lambda: get_json(f"{self.api}/api/v1/mesh/status")["listen_addrs"])
        return f"{addrs[0]}/p2p/{self.peer_id}"

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.log.close()
