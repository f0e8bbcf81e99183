// This node and its peers: the summary tiles, the topology picture and the peer table.

import { ApiError, coalesce, getJson } from './api.js';
import { count, el, put, shortPeer, svg } from './dom.js';

/** How often status and peers are read (RTTs and mesh membership change without a watch event). */
const POLL_MS = 3000;
/** Counts follow a burst of agent changes at most this often. */
const REFRESH_MS = 1000;
/** Peers drawn around this node; the others are counted. */
const MAX_DRAWN = 16;
const HEALTHS = ['active', 'degraded', 'inactive', 'unknown'];

/** A gossip topic's short name: `agentmesh/cards/1` -> `cards`. */
function topicName(topic) {
  const parts = topic.split('/');
  return parts.length >= 2 ? parts[parts.length - 2] : topic;
}

/** `/ip4/127.0.0.1/tcp/4001/p2p/…` as `127.0.0.1:4001`; other addresses as they are. */
function hostPort(addr) {
  const m = addr.match(/^\/(ip4|ip6|dns4|dns6|dns)\/([^/]+)\/tcp\/(\d+)/);
  if (!m) return addr;
  return m[1] === 'ip6' ? `[${m[2]}]:${m[3]}` : `${m[2]}:${m[3]}`;
}

export class Mesh {
  constructor({ node, tiles, topology, peers, peerCount }) {
    Object.assign(this, { node, tiles, topology, peers, peerCount });
    this.refreshSoon = coalesce(() => this.refresh(), REFRESH_MS);
  }

  start() {
    this.refresh();
    setInterval(() => this.refresh(), POLL_MS);
  }

  async refresh() {
    const [health, status, peers] = await Promise.allSettled([
      getJson('/api/v1/health'),
      getJson('/api/v1/mesh/status'),
      getJson('/api/v1/mesh/peers'),
    ]);
    const h = health.status === 'fulfilled' ? health.value : null;
    const s = status.status === 'fulfilled' ? status.value : null;
    const noMesh = status.status === 'rejected' && status.reason instanceof ApiError && status.reason.status === 404;
    if (h) {
      this.node.textContent = `${shortPeer(h.peer_id)} · v${h.version}`;
      this.node.title = h.peer_id;
      this.node.dataset.peer = h.peer_id;
    }
    this.renderTiles(h, s);
    if (peers.status === 'fulfilled' && s) {
      this.renderTopology(s, peers.value.peers);
      this.renderPeers(s, peers.value.peers);
    } else {
      const text = noMesh ? 'This node runs no mesh.' : 'Cannot read the mesh status.';
      put(this.topology, el('p', { class: 'muted' }, text));
      put(this.peers, el('p', { class: 'muted' }, text));
      this.peerCount.textContent = '';
    }
  }

  renderTiles(health, status) {
    const tile = (label, value, detail, cls) =>
      el('div', { class: `tile ${cls || ''}`, 'data-tile': label.toLowerCase() },
        el('span', { class: 'label' }, label), el('span', { class: 'value' }, value),
        detail && el('span', { class: 'detail' }, detail));
    const records = status?.records || {};
    const topics = Object.entries(status?.mesh_peers || {});
    put(this.tiles,
      tile('Agents', count(health?.agents), health && `${count(health.local_agents)} on this node`),
      status && HEALTHS.map((h) => tile(h[0].toUpperCase() + h.slice(1), count(records[h] || 0), null, `health-${h}`)),
      status && tile('Peers', count(status.connected_peers), `${count(status.routing_table_size)} in routing table`),
      status && tile('Gossip mesh', topics.map(([t, n]) => `${topicName(t)} ${n}`).join(' · ') || '–', 'peers per topic'),
      status && tile('Messages', `${count(status.messages_in)} in`, `${count(status.messages_out)} out`));
  }

  renderTopology(status, peers) {
    const topics = Object.keys(status.mesh_peers || {});
    const drawn = peers.slice(0, MAX_DRAWN);
    // Up to two peers sit level with this node: no need for the whole circle's height.
    const W = 340, H = drawn.length <= 2 ? 120 : 210, cx = W / 2, cy = H / 2 - 4, r = 80;
    const edges = [], nodes = [];
    drawn.forEach((p, i) => {
      // One peer above; more spread evenly, two side by side.
      const start = drawn.length === 1 ? -Math.PI / 2 : -Math.PI / 2 + Math.PI / drawn.length;
      const angle = start + (2 * Math.PI * i) / drawn.length;
      const x = cx + r * Math.cos(angle), y = cy + r * Math.sin(angle);
      const inMesh = p.mesh_topics || [];
      const cls = inMesh.length === 0 ? 'connected' : inMesh.length >= topics.length ? 'mesh-all' : 'mesh-some';
      const tip = `${p.peer_id}\n${p.addresses[0] || ''}\n`
        + (inMesh.length ? `gossip mesh: ${inMesh.map(topicName).join(', ')}` : 'connected, not in the gossip mesh');
      edges.push(svg('line', { x1: cx, y1: cy, x2: x, y2: y, class: `edge ${cls}` }, svg('title', {}, tip)));
      const below = y > cy + 1;
      nodes.push(svg('g', { class: `peer ${cls}`, 'data-peer': p.peer_id },
        svg('title', {}, tip),
        svg('circle', { cx: x, cy: y, r: 9 }),
        svg('text', { x, y: below ? y + 22 : y - 15, 'text-anchor': 'middle' }, shortPeer(p.peer_id))));
    });
    const self = svg('g', { class: 'self' },
      svg('title', {}, status.peer_id),
      svg('circle', { cx, cy, r: 15 }),
      svg('text', { x: cx, y: cy + 4, 'text-anchor': 'middle', class: 'self-label' }, 'me'));
    const note = peers.length === 0 ? 'no peer connected'
      : peers.length > drawn.length ? `${peers.length - drawn.length} more peers not drawn` : null;
    put(this.topology,
      svg('svg', { viewBox: `0 0 ${W} ${H}`, class: 'topology', role: 'img',
        'aria-label': `this node and ${peers.length} connected peers` },
        edges, self, nodes,
        note && svg('text', { x: cx, y: H - 6, 'text-anchor': 'middle', class: 'note' }, note)),
      el('div', { class: 'legend' },
        el('span', { class: 'key mesh-all' }, 'gossip mesh, every topic'),
        el('span', { class: 'key mesh-some' }, 'some topics'),
        el('span', { class: 'key connected' }, 'connected only')));
  }

  renderPeers(status, peers) {
    this.peerCount.textContent = String(peers.length);
    if (!peers.length) {
      put(this.peers, el('p', { class: 'muted' }, 'No peer connected.'));
      return;
    }
    const topics = Object.keys(status.mesh_peers || {});
    put(this.peers, el('div', { class: 'table-wrap' }, el('table', { class: 'list compact', id: 'peer-table' },
      el('thead', {}, el('tr', {}, ['Peer', 'Address', 'RTT', 'Mesh'].map((h) => el('th', {}, h)))),
      el('tbody', {}, peers.map((p) => el('tr', { 'data-peer': p.peer_id },
        el('td', { title: p.peer_id }, shortPeer(p.peer_id)),
        el('td', { class: 'addr', title: p.addresses.join('\n') },
          p.addresses.length ? hostPort(p.addresses[0]) : '–',
          p.addresses.length > 1 && el('span', { class: 'muted' }, ` +${p.addresses.length - 1}`)),
        el('td', {}, p.rtt_ms == null ? '–' : `${p.rtt_ms.toFixed(1)} ms`),
        el('td', { class: 'topics' }, topics.map((t) => el('span', {
          class: `topic ${(p.mesh_topics || []).includes(t) ? 'in' : 'out'}`,
          title: `${t}: ${(p.mesh_topics || []).includes(t) ? 'in this node\'s gossip mesh' : 'not in the mesh'}`,
        }, topicName(t))))))))));
  }
}
