"""The published A2A SDK (a2a-sdk[signing]) against running daemons.

Usage: a2a_client.py PUBLISHER_API OTHER_API AGENT_ID [CARDS_DIR]

Fetches the publisher's well-known card (at both well-known paths) and the agent's card from the
other node with A2ACardResolver, checks the A2A required fields, verifies the signature with the key
taken from the publisher's PeerId (never from the card), and checks that a tampered card fails.

With CARDS_DIR (tests/a2a-cards): registers every A2A card there on the publisher, reads each back
from the other node, has the SDK parse it, check its required fields and verify its signature, and
compares it with what it must hold (NAME.expected.json, else the card itself) as the SDK reads both;
then removes them again, and waits until the other node has seen that. Every wait has a deadline.
Exits non-zero on any failure; prints one line per check and a closing 'N passed, N failed' line.
"""

import asyncio
import copy
import json
import os
import sys
import time

import httpx
from a2a.client import A2ACardResolver
from a2a.client.card_resolver import parse_agent_card
from a2a.utils.proto_utils import validate_proto_required_fields
from a2a.utils.signing import InvalidSignaturesError, create_signature_verifier
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
EXTENSION_URI = "urn:agentmesh:capabilities:v1"
DEADLINE_S = 20


def ed25519_key_of(peer_id: str) -> Ed25519PublicKey:
    """An Ed25519 PeerId is an identity multihash of the protobuf public key: the raw key is its tail."""
    n = 0
    for c in peer_id:
        n = n * 58 + B58.index(c)
    zeros = len(peer_id) - len(peer_id.lstrip("1"))  # each leading '1' is a zero byte
    raw = bytes(zeros) + n.to_bytes((n.bit_length() + 7) // 8, "big")
    # identity multihash (0x00, len 36) of protobuf {type: Ed25519 (1), data: 32 bytes}
    if not raw.startswith(bytes([0x00, 0x24, 0x08, 0x01, 0x12, 0x20])) or len(raw) != 38:
        raise ValueError(f"{peer_id} is not an Ed25519 PeerId")
    return Ed25519PublicKey.from_public_bytes(raw[6:])


def fixtures(cards_dir: str):
    """(name, card as registered, the A2A card it must be served as) for each card of CARDS_DIR."""
    out = []
    for file in sorted(os.listdir(cards_dir)):
        if not file.endswith(".json") or file.endswith(".expected.json"):
            continue
        name = file.removesuffix(".json")
        with open(os.path.join(cards_dir, file)) as f:
            card = json.load(f)
        expected_path = os.path.join(cards_dir, f"{name}.expected.json")
        expected = card
        if os.path.exists(expected_path):
            with open(expected_path) as f:
                expected = json.load(f)
        expected = {k: v for k, v in expected.items() if k != "signatures"}
        out.append((name, card, expected))
    return out


async def poll(what, check):
    """Awaits check() until it returns something truthy, for at most DEADLINE_S."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        value = await check()
        if value:
            return value
        await asyncio.sleep(0.1)
    raise SystemExit(f"timed out waiting for {what}")


def without_agentmesh(card):
    """The SDK's card without signatures and without agentmesh's own extension."""
    card = copy.deepcopy(card)
    card.ClearField("signatures")
    kept = [e for e in card.capabilities.extensions if e.uri != EXTENSION_URI]
    del card.capabilities.extensions[:]
    card.capabilities.extensions.extend(kept)
    return card


async def fixture_round_trips(http, publisher_api, other_api, cards_dir, verifier, check):
    cards = fixtures(cards_dir)
    check(f"at least 12 A2A card shapes in {cards_dir}", len(cards) >= 12, str(len(cards)))
    ids = []
    for name, card, _ in cards:
        r = await http.post(f"{publisher_api}/api/v1/agents", json=card)
        check(f"{name}: registers", r.status_code == 201, "" if r.status_code == 201 else r.text[:200])
        ids.append(r.json().get("agent_id"))
    try:
        for (name, _, expected), agent_id in zip(cards, ids):
            path = f"/api/v1/agents/{agent_id}/agent-card.json"

            async def arrived():
                return (await http.get(f"{other_api}{path}")).status_code == 200

            await poll(f"{name} on the other node", arrived)
            try:
                served = await A2ACardResolver(http, other_api).get_agent_card(
                    relative_card_path=path, signature_verifier=verifier
                )
                validate_proto_required_fields(served)
            except Exception as e:  # noqa: BLE001 - reported as a failed check
                check(f"{name}: the SDK parses it, finds every required field and verifies it", False, repr(e))
                continue
            check(f"{name}: the SDK parses it, finds every required field and verifies it", True)
            want = parse_agent_card(copy.deepcopy(expected))
            got = without_agentmesh(served)
            check(f"{name}: every A2A field came back", got == want, "" if got == want else f"\n{got}\n!=\n{want}")
    finally:
        for agent_id in filter(None, ids):
            await http.delete(f"{publisher_api}/api/v1/agents/{agent_id}")
        for agent_id in filter(None, ids):

            async def gone():
                return (await http.get(f"{other_api}/api/v1/agents/{agent_id}")).status_code == 404

            await poll(f"{agent_id} to leave the other node", gone)


async def main(publisher_api: str, other_api: str, agent_id: str, cards_dir: str | None = None) -> int:
    results = []

    def check(name, ok, detail=""):
        results.append(ok)
        print(f"{'ok  ' if ok else 'FAIL'} {name} {detail}")

    async with httpx.AsyncClient(timeout=10) as http:
        health = (await http.get(f"{publisher_api}/api/v1/health")).json()
        publisher = health["peer_id"]
        key = ed25519_key_of(publisher)

        def key_provider(kid, jku):
            # The key comes from our own knowledge of the publisher, never from the card (jku).
            if kid != publisher:
                raise ValueError(f"unexpected kid {kid}")
            return key

        verifier = create_signature_verifier(key_provider, ["EdDSA"])

        well_known = await A2ACardResolver(http, publisher_api).get_agent_card(signature_verifier=verifier)
        validate_proto_required_fields(well_known)
        check("well-known card resolves, has every required field and verifies", True, well_known.name)

        legacy = await A2ACardResolver(http, publisher_api, "/.well-known/agent.json").get_agent_card(
            signature_verifier=verifier
        )
        check("the pre-0.3 well-known path serves the same card", legacy == well_known)

        path = f"/api/v1/agents/{agent_id}/agent-card.json"
        remote = await A2ACardResolver(http, other_api).get_agent_card(
            relative_card_path=path, signature_verifier=verifier
        )
        validate_proto_required_fields(remote)
        check("the other node's copy verifies with the publisher's key", True, remote.name)

        exts = [e for e in remote.capabilities.extensions if e.uri == "urn:agentmesh:capabilities:v1"]
        check("schemas travel in capabilities.extensions[].params", bool(exts) and "skills" in exts[0].params)

        tampered = await A2ACardResolver(http, other_api).get_agent_card(relative_card_path=path)
        tampered.skills[0].description = "something else entirely"
        try:
            verifier(tampered)
            check("a tampered card fails verification", False)
        except InvalidSignaturesError:
            check("a tampered card fails verification", True)

        if cards_dir:
            await fixture_round_trips(http, publisher_api, other_api, cards_dir, verifier, check)

    passed = sum(results)
    print(f"{passed} passed, {len(results) - passed} failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(*sys.argv[1:5])))
