"""The daemons' /metrics through the Prometheus project's own Python parsers (prometheus-client).

Usage: metrics_client.py PUBLISHER_API OTHER_API

Scrapes each node as Prometheus does (its Accept header: OpenMetrics) and as curl does (the text
format 0.0.4), parses each whole exposition with prometheus_client's parser of that format (the
OpenMetrics one is strict: a family declared twice, a counter without _total, a histogram that is not
cumulative or carries a sum with negative buckets, a missing # EOF each fail the scrape), and checks
the families users rely on with their types, libp2p's families on the node that has a peer, and that
both formats carry the same series. Every wait has a deadline. Prints one line per check and a closing
'N passed, N failed' line.
"""

import sys
import time
import urllib.request

from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

DEADLINE_S = 20
# What Prometheus 2 sends when it scrapes.
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
                     "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")

# Family (as OpenMetrics names it), type, unit.
EXPECTED = [
    ("agentmesh_discovery_requests", "counter", ""),
    ("agentmesh_discovery_request_duration_seconds", "histogram", "seconds"),
    ("agentmesh_discovery_cache_hits", "counter", ""),
    ("agentmesh_discovery_cache_misses", "counter", ""),
    ("agentmesh_discovery_filter_usage", "counter", ""),
    ("agentmesh_agents", "gauge", ""),
    ("agentmesh_local_agents", "gauge", ""),
    ("agentmesh_records", "gauge", ""),
    ("agentmesh_peers", "gauge", ""),
    ("agentmesh_peers_banned", "gauge", ""),
    ("agentmesh_routing_table_size", "gauge", ""),
    ("agentmesh_gossip_messages", "counter", ""),
    ("agentmesh_gossip_verdicts", "counter", ""),
    ("agentmesh_gossip_rejected", "counter", ""),
    ("agentmesh_signature_failures", "counter", ""),
    ("agentmesh_sync_rounds", "counter", ""),
    # A counter whose family name would be the gauge's above: served as unknown in OpenMetrics.
    ("agentmesh_peers_banned_total", "unknown", ""),
    ("agentmesh_connection_errors", "counter", ""),
]
# libp2p's families that count what happens once a node has a peer.
LIBP2P = ["libp2p_swarm_connections_established", "libp2p_gossipsub_messages", "libp2p_kad_routing_updated",
          "libp2p_identify_received", "libp2p_ping_rtt_seconds"]


def fetch(url, accept=None):
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(request, timeout=5) as r:
        return r.headers["Content-Type"], r.read().decode()


def series(families):
    return {(s.name, tuple(sorted(s.labels.items()))) for f in families for s in f.samples}


def main(publisher_api: str, other_api: str) -> int:
    results = []

    def check(name, ok, detail=""):
        results.append(bool(ok))
        print(f"{'ok  ' if ok else 'FAIL'} {name} {detail}")

    for api in (publisher_api, other_api):
        urllib.request.urlopen(f"{api}/api/v1/discovery/capabilities?tags=research", timeout=5).read()

    for name, api in (("publisher", publisher_api), ("other node", other_api)):
        content_type, body = fetch(f"{api}/metrics", PROMETHEUS_ACCEPT)
        check(f"{name}: Prometheus gets OpenMetrics", content_type.startswith("application/openmetrics-text"),
              content_type)
        try:
            openmetrics = list(parse_openmetrics(body))
            check(f"{name}: the OpenMetrics parser reads the whole scrape", True, f"{len(openmetrics)} families")
        except ValueError as e:
            check(f"{name}: the OpenMetrics parser reads the whole scrape", False, repr(e))
            continue
        kinds = {f.name: (f.type, f.unit) for f in openmetrics}
        for family, kind, unit in EXPECTED:
            check(f"{name}: {family} has type {kind}", kinds.get(family) == (kind, unit), kinds.get(family))

        content_type, text_body = fetch(f"{api}/metrics")
        check(f"{name}: others get the text format 0.0.4", content_type.startswith("text/plain; version=0.0.4"),
              content_type)
        try:
            text = list(parse_text(text_body))
            check(f"{name}: the text-format parser reads the whole scrape", True, f"{len(text)} families")
        except ValueError as e:
            check(f"{name}: the text-format parser reads the whole scrape", False, repr(e))
            continue
        # The text scrape came second: it holds every series of the first (and maybe new ones).
        missing = series(openmetrics) - series(text)
        check(f"{name}: both formats carry the same series", not missing, sorted(missing)[:5])

    deadline = time.monotonic() + DEADLINE_S
    while True:
        _, body = fetch(f"{other_api}/metrics", PROMETHEUS_ACCEPT)
        families = {f.name: f for f in parse_openmetrics(body)}
        absent = [f for f in LIBP2P if not any(s.value > 0 for s in getattr(families.get(f), "samples", []))]
        if not absent or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    check("libp2p's connection, gossipsub, Kademlia, identify and ping families count the peer", not absent, absent)

    passed = sum(results)
    print(f"{passed} passed, {len(results) - passed} failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
