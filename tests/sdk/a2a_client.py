"""The published A2A SDK (a2a-sdk[signing]) against running daemons.

Usage: a2a_client.py PUBLISHER_API OTHER_API AGENT_ID

Fetches the publisher's well-known card and the agent's card from the other node with
A2ACardResolver, checks the A2A required fields, verifies the signature with the key taken from the
publisher's PeerId (never from the card), and checks that a tampered card fails. Exits non-zero on
any failure; prints one line per check and a closing 'N passed, N failed' line.
"""

import asyncio
import sys

import httpx
from a2a.client import A2ACardResolver
from a2a.utils.proto_utils import validate_proto_required_fields
from a2a.utils.signing import InvalidSignaturesError, create_signature_verifier
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


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


async def main(publisher_api: str, other_api: str, agent_id: str) -> int:
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

    passed = sum(results)
    print(f"{passed} passed, {len(results) - passed} failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(*sys.argv[1:4])))
