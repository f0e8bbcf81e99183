"""Runs the published client SDKs (and the OpenAPI contract check) against real daemons.

Usage: python tests/sdk/run.py PATH_TO_AGENTMESH_BINARY

Starts two daemons joined by a bootstrap address (each on its own loopback ports and temporary data
directory), registers the sample research card on the first, then runs every client script in this
folder against them. Every wait has a deadline. Exits non-zero when any script fails.
"""

import os
import subprocess
import sys
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
from daemons import Daemon, wait_for  # noqa: E402 - the shared driver lives one folder up

FLAGS = ["--heartbeat-interval", "500ms"]


def main(binary: str) -> int:
    card = os.path.join(ROOT, "config", "cards", "research-agent.json")
    a = Daemon(binary, "a", FLAGS, cards=[card])
    b = Daemon(binary, "b", FLAGS, bootstrap=a.dial_addr())
    failed = []
    try:
        wait_for("the card on the second node",
                 lambda: urllib.request.urlopen(f"{b.api}/api/v1/agents/research-agent", timeout=5).status == 200)
        scripts = [
            ["agentfield_client.py", a.api, b.api],
            ["a2a_client.py", a.api, b.api, "research-agent", os.path.join(ROOT, "tests", "a2a-cards")],
            ["mcp_client.py", binary, a.api, b.api],
            ["metrics_client.py", a.api, b.api],
        ]
        for script, *args in scripts:
            print(f"== {script}", flush=True)
            if subprocess.run([sys.executable, os.path.join(HERE, script), *args], timeout=300).returncode != 0:
                failed.append(script)
    finally:
        a.stop()
        b.stop()
    # The OpenAPI document against the handlers: schemathesis generates requests for every operation
    # (its own daemon: it registers and removes agents at random) and checks every answer's status,
    # content type and body against the document, and that none is a server error. The watch stream
    # never ends, so it is left out here (tests/events.rs covers it).
    c = Daemon(binary, "c", FLAGS, cards=[card])
    try:
        print("== schemathesis (OpenAPI contract)", flush=True)
        st = os.path.join(os.path.dirname(sys.executable), "schemathesis")
        run = subprocess.run([st, "run", f"{c.api}/openapi.json",
                              "--checks", "not_a_server_error,status_code_conformance,content_type_conformance,"
                                          "response_schema_conformance",
                              "--exclude-path", "/api/v1/discovery/events",
                              "--max-examples", "30", "--generation-deterministic", "--request-timeout", "10"],
                             cwd=c.dir)
        if run.returncode != 0:
            failed.append("schemathesis")
    finally:
        c.stop()
    if failed:
        print(f"failed: {', '.join(failed)} (daemon logs in {a.dir}, {b.dir} and {c.dir})")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
