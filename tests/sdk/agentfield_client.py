"""The published AgentField Python SDK (agentfield) against running daemons.

Usage: agentfield_client.py PUBLISHER_API OTHER_API

Registers an agent through the SDK's own registration call on the publisher's daemon, then finds it
with AgentFieldClient.discover_capabilities in json, compact and xml, with filters, on that node and
(through the mesh) on the other one. Prints one line per check and a closing 'N passed, N failed' line.
"""

import asyncio
import json
import sys
import time
import urllib.request
import xml.etree.ElementTree as ET

from agentfield.client import AgentFieldClient

AGENT = "sdk-trip-planner"
DEADLINE_S = 20


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)


def main(publisher_api: str, other_api: str) -> int:
    results = []

    def check(name, ok, detail=""):
        results.append(bool(ok))
        print(f"{'ok  ' if ok else 'FAIL'} {name} {detail}")

    publisher = AgentFieldClient(base_url=publisher_api)
    ok, payload = asyncio.run(
        publisher.register_agent(
            node_id=AGENT,
            reasoners=[{
                "id": "plan_trip", "description": "Plans a trip", "tags": ["planning", "travel"],
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                                 "required": ["city"]},
                "output_schema": {"type": "object", "properties": {"plan": {"type": "string"}}},
            }],
            skills=[{"id": "lookup_city", "description": "Looks a city up", "tags": ["tools"],
                     "input_schema": {"type": "object", "properties": {"name": {"type": "string"}}}}],
            base_url="http://127.0.0.1:8001",
            tags=["travel"],
            version="1.4.0",
            agent_metadata={"owner_team": "travel-desk", "region": "eu"},
        )
    )
    check("the SDK's register_agent succeeds", ok, payload)

    for label, api in (("publisher", publisher_api), ("other node", other_api)):
        client = AgentFieldClient(base_url=api)
        deadline = time.monotonic() + DEADLINE_S
        while True:
            found = client.discover_capabilities(agent=AGENT, include_input_schema=True)
            if found.json.capabilities or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        caps = found.json.capabilities
        check(f"{label}: json finds the agent", len(caps) == 1 and caps[0].agent_id == AGENT)
        if not caps:
            continue
        reasoner = caps[0].reasoners[0]
        check(f"{label}: json has the reasoner with its input schema",
              reasoner.id == "plan_trip" and reasoner.input_schema["required"] == ["city"]
              and reasoner.invocation_target == f"{AGENT}:plan_trip")
        check(f"{label}: json output schema only when asked", reasoner.output_schema is None)

        filtered = client.discover_capabilities(reasoner="plan_*", tags=["travel"], agent_ids=[AGENT, "nobody"])
        ids = [r.id for a in filtered.json.capabilities for r in a.reasoners]
        check(f"{label}: wildcard reasoner and tag filters", ids == ["plan_trip"], ids)
        none = client.discover_capabilities(agent=AGENT, tags=["no-such-tag"])
        check(f"{label}: a filter that matches nothing", none.json.total_agents == 0)

        compact = client.discover_capabilities(format="compact", agent=AGENT)
        targets = sorted(c.target for c in compact.compact.reasoners + compact.compact.skills)
        check(f"{label}: compact", targets == [f"{AGENT}:plan_trip", f"{AGENT}:skill:lookup_city"], targets)

        xml = client.discover_capabilities(format="xml", agent=AGENT, skill="lookup_*",
                                           include_input_schema=True)
        root = ET.fromstring(xml.xml)
        agent = root.find("capabilities/agent")
        skills = [s.get("id") for s in root.iter("skill")]
        fields = [f.get("name") for f in root.iter("field")]
        check(f"{label}: xml", agent is not None and agent.get("id") == AGENT and skills == ["lookup_city"]
              and "name" in fields, (skills, fields))

        # What the SDK's registration carries beyond the discovery contract: its version and its
        # agent_metadata (metadata.custom) are filterable, and resolve picks the agent by policy.
        raw = get_json(f"{api}/api/v1/discovery/capabilities?metadata.owner_team=travel-*&version=latest")
        check(f"{label}: the SDK's agent_metadata and version filter discovery",
              [(a["agent_id"], a["version"], a.get("metadata", {}).get("region")) for a in raw["capabilities"]]
              == [(AGENT, "1.4.0", "eu")], raw["capabilities"])
        picked = get_json(f"{api}/api/v1/discovery/resolve?capability=plan_trip&metadata.region=eu")
        check(f"{label}: resolve names the SDK's agent", picked.get("target") == f"{AGENT}:plan_trip", picked)

    passed = sum(results)
    print(f"{passed} passed, {len(results) - passed} failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
