#!/usr/bin/env python3
"""Runs the guide's checked samples against fresh daemons and compares their output with the guide.

Usage: docs/guide-check.py AGENTMESH_BINARY PYTHON

PYTHON is an interpreter with the guide's packages (agentfield, mcp, jsonschema, httpx); `jq` must be
installed. The set-up is the guide's: node a (HTTP 8080, mesh 4001) with the SDK agent translator.py
(8003), node b (HTTP 8081, mesh 4002) with the sample card and probes, and a stand-in answering on 8001.
Those ports must be free.

In docs/GUIDE.md, `<!-- check: NAME -->` before a code block names it, `<!-- run: NAME -->` names it and
runs it at that point, and `<!-- expect: NAME -->` before an output block runs NAME (a .py file with
PYTHON, anything else with bash, from the repository root) and compares: every line of the block but
`...` must appear in the output, in order, once PeerIds, times and sequence numbers are masked. Paths
under /tmp/mesh are moved to a scratch directory. Exits non-zero when a comparison fails.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GUIDE = os.path.join(REPO, "docs", "GUIDE.md")
PORTS = (8080, 8081, 4001, 4002, 8001, 8003)
DEADLINE_S = 60
MARKER = re.compile(r"^\s*<!-- (check|run|expect): (\S+) -->\s*$")
MASKS = [
    (re.compile(r"12D3KooW[1-9A-HJ-NP-Za-km-z]+"), "<peer>"),
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z"), "<time>"),
    (re.compile(r'"seq":\d+'), '"seq":<n>'),
]


def blocks(path):
    """(kind, name, text) for every marked fenced block, in document order."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    found, i = [], 0
    while i < len(lines):
        m = MARKER.match(lines[i])
        i += 1
        if not m:
            continue
        fence = lines[i]
        indent = len(fence) - len(fence.lstrip())
        body = []
        i += 1
        while lines[i].strip() != "```":
            body.append(lines[i][indent:])
            i += 1
        found.append((m.group(1), m.group(2), "\n".join(body) + "\n"))
    return found


def moved(text, work):
    return text.replace("/tmp/mesh", work)


def mask(text, work):
    text = moved(text, work)
    for pattern, replacement in MASKS:
        text = pattern.sub(replacement, text)
    return text


def missing_line(expected, actual):
    """The first expected line (other than `...`) not found in order in the actual output, or None."""
    lines = [line.rstrip() for line in actual.split("\n")]
    at = 0
    for want in expected.rstrip("\n").split("\n"):
        if want.strip() == "...":
            continue
        while at < len(lines) and lines[at] != want.rstrip():
            at += 1
        if at == len(lines):
            return want
        at += 1
    return None


def get(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def wait_for(what, check):
    start = time.monotonic()
    while True:
        try:
            if check():
                return
        except OSError:
            pass
        if time.monotonic() - start > DEADLINE_S:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.2)


def settled():
    """Both nodes hold the same agents, and every one is active on node b."""
    views = [json.loads(get(f"http://127.0.0.1:{p}/api/v1/agents"))["agents"] for p in (8080, 8081)]
    ids = [sorted(a["agent_id"] for a in v) for v in views]
    return ids[0] == ids[1] and all(a["health_status"] == "active" for a in views[1])


def main(binary, python):
    binary = os.path.abspath(binary)
    for port in PORTS:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                raise SystemExit(f"port {port} is in use; the guide's set-up needs it")
    found = blocks(GUIDE)
    code = {name: text for kind, name, text in found if kind in ("check", "run")}
    work = tempfile.mkdtemp(prefix="guide-check-")
    env = dict(os.environ, PATH=os.path.dirname(binary) + os.pathsep + os.environ["PATH"])
    env.pop("RUST_LOG", None)
    children, stop = [], threading.Event()

    def spawn(args, cwd=REPO, log="log"):
        out = open(os.path.join(work, log), "w")
        children.append(subprocess.Popen(args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True))

    def heartbeats():
        while not stop.wait(2):
            try:
                request = urllib.request.Request(
                    "http://127.0.0.1:8080/api/v1/nodes/summarizer/heartbeat", data=b'{"status":"ready"}')
                urllib.request.urlopen(request, timeout=5).close()
            except OSError:
                pass

    failures = 0
    try:
        os.makedirs(os.path.join(work, "www"))
        os.makedirs(os.path.join(work, "py"))
        with open(os.path.join(work, "www", "health"), "w") as f:
            f.write("ok\n")
        spawn([sys.executable, "-m", "http.server", "8001", "--bind", "127.0.0.1", "--directory",
               os.path.join(work, "www")], log="www.log")
        spawn([binary, "run", "--data-dir", f"{work}/a", "--http", "127.0.0.1:8080", "--listen",
               "/ip4/127.0.0.1/tcp/4001", "--no-mdns"], log="a.log")
        wait_for("node a", lambda: get("http://127.0.0.1:8080/api/v1/health"))
        peer_a = subprocess.run([binary, "id", "--data-dir", f"{work}/a"], capture_output=True, text=True,
                                check=True).stdout.strip()
        spawn([binary, "run", "--data-dir", f"{work}/b", "--http", "127.0.0.1:8081", "--listen",
               "/ip4/127.0.0.1/tcp/4002", "--no-mdns", "--bootstrap", f"/ip4/127.0.0.1/tcp/4001/p2p/{peer_a}",
               "--card", "config/cards/research-agent.json", "--probe-interval", "5s"], log="b.log")
        wait_for("node b", lambda: get("http://127.0.0.1:8081/api/v1/health"))
        for name, text in code.items():
            if name.endswith(".py"):
                with open(os.path.join(work, "py", name), "w") as f:
                    f.write(moved(text, work))
        spawn([python, "translator.py"], cwd=os.path.join(work, "py"), log="translator.log")
        wait_for("translator.py to be active on node b",
                 lambda: '"health_status":"active"' in get("http://127.0.0.1:8081/api/v1/agents/translator"))
        threading.Thread(target=heartbeats, daemon=True).start()

        for kind, name, text in found:
            if kind == "check":
                continue
            wait_for("the two views to agree", settled)
            if name not in code:
                raise SystemExit(f"{name}: expected but never named by a check or run marker")
            if name.endswith(".py"):
                args, cwd = [python, name], os.path.join(work, "py")
            else:
                args, cwd = ["bash", "-c", moved(code[name], work)], REPO
            child = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)
            try:
                output, _ = child.communicate(timeout=DEADLINE_S)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                output = child.communicate()[0] + "\n(timed out)"
            if kind == "run":
                continue
            missing = missing_line(mask(text, work), mask(output, work))
            if missing is None:
                print(f"ok   {name}")
            else:
                failures += 1
                print(f"FAIL {name}: the guide shows\n  {missing}\nwhich is not in what it printed:\n{output}")
    finally:
        stop.set()
        for child in reversed(children):
            os.killpg(child.pid, signal.SIGTERM)
        for child in children:
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
        shutil.rmtree(work, ignore_errors=True)
    print(f"{failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
