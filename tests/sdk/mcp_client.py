"""The published MCP Python SDK (pinned in requirements.txt), unchanged, against agentmesh's MCP server.

Usage: python mcp_client.py AGENTMESH_BINARY API_OF_PUBLISHER API_OF_OTHER_NODE

The sample research card is registered on the first node; the SDK's default client connects to the
second node twice, over streamable HTTP (`POST /mcp`) and over stdio (`agentmesh mcp`), and must find
that card's capabilities there and read their exact input schemas. Exits non-zero on any mismatch.
"""

import asyncio
import json
import os
import sys
import urllib.request

from mcp import Client
from mcp.client.stdio import StdioServerParameters

HERE = os.path.dirname(os.path.abspath(__file__))
CARD = os.path.join(HERE, "..", "..", "config", "cards", "research-agent.json")
DEADLINE_S = 60


def check(condition, what):
    if not condition:
        raise SystemExit(f"FAILED: {what}")
    print(f"ok: {what}", flush=True)


async def exercise(client: Client, transport: str, card: dict) -> None:
    check(client.protocol_version == "2025-11-25", f"{transport}: revision 2025-11-25 negotiated "
                                                   f"(got {client.protocol_version})")
    check(client.server_info.name == "agentmesh", f"{transport}: server says it is agentmesh")
    tools = (await client.list_tools()).tools
    names = sorted(t.name for t in tools)
    check(names == ["discover_capabilities", "get_capability"], f"{transport}: both tools listed ({names})")

    found = await client.call_tool("discover_capabilities",
                                   {"query": "research a topic in depth and write a report with citations"})
    check(not found.is_error, f"{transport}: discover_capabilities answers")
    targets = [r["target"] for r in found.structured_content["results"]]
    check(targets and targets[0] == "research-agent:reasoner:deep_research",
          f"{transport}: the reasoner registered on the other node ranks first ({targets})")
    check("research-agent:reasoner:deep_research" in found.content[0].text,
          f"{transport}: the text result names the target")

    skills = await client.call_tool("discover_capabilities", {"query": "web search", "kind": "skill", "limit": 3})
    targets = [r["target"] for r in skills.structured_content["results"]]
    check(targets == ["research-agent:skill:web_search"], f"{transport}: kind=skill keeps skills only ({targets})")

    detail = await client.call_tool("get_capability", {"target": "research-agent:reasoner:deep_research"})
    check(not detail.is_error, f"{transport}: get_capability answers")
    expected = card["reasoners"][0]["input_schema"]
    check(detail.structured_content["input_schema"] == expected,
          f"{transport}: get_capability returns the exact input schema")
    check("- query (string, required)" in detail.content[0].text, f"{transport}: the detail text lists parameters")

    missing = await client.call_tool("get_capability", {"target": "research-agent:skill:nope"})
    check(missing.is_error and "no capability" in missing.content[0].text,
          f"{transport}: an unknown target is a tool error the model can read")


async def main(binary: str, publisher_api: str, api: str) -> None:
    with open(CARD) as f:
        card = json.load(f)
    # The card was registered on the publisher; it must be served here through the mesh.
    with urllib.request.urlopen(f"{api}/api/v1/agents/research-agent", timeout=5) as r:
        check(r.status == 200, "the card reached the other node")
    check(api != publisher_api, "the client talks to the node that did not register the card")

    async with asyncio.timeout(DEADLINE_S):
        async with Client(f"{api}/mcp") as client:
            await exercise(client, "streamable HTTP", card)
        stdio = StdioServerParameters(command=binary, args=["mcp", "--api", api])
        async with Client(stdio) as client:
            await exercise(client, "stdio", card)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
