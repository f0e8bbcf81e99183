// The dashboard: routes (`#/` the agents, `#/agent/{id}` one agent), the live watch stream, and the
// mesh panel. It only reads this daemon's own API.

import { follow } from './api.js';
import { AgentView } from './agent.js';
import { AgentsView } from './agents.js';
import { badge, el, tickAges } from './dom.js';
import { Mesh } from './mesh.js';

/** Changes listed in the side panel; older ones drop off. */
const CHANGES_SHOWN = 12;

const $ = (id) => document.getElementById(id);
let view = null;

/** `#/agent/{id}?publisher=…` or `#/?filters…`. */
function parseRoute() {
  const hash = location.hash.replace(/^#/, '') || '/';
  const [path, search] = hash.split('?', 2);
  const params = Object.fromEntries(new URLSearchParams(search || ''));
  const agent = path.match(/^\/agent\/([^/]+)$/);
  if (agent) return { name: 'agent', id: decodeURIComponent(agent[1]), publisher: params.publisher || null };
  return { name: 'agents', params };
}

function route() {
  const r = parseRoute();
  if (r.name === 'agents' && view instanceof AgentsView) {
    view.show(r.params);
    return;
  }
  view?.stop();
  if (r.name === 'agent') {
    view = new AgentView($('main'), r.id, r.publisher);
  } else {
    view = new AgentsView($('main'));
    view.show(r.params);
  }
  window.scrollTo(0, 0);
}

function logChange(kind, event) {
  const list = $('changes');
  list.querySelector('.placeholder')?.remove();
  const time = new Date(event.at || Date.now()).toLocaleTimeString('en-GB');
  const what = kind === 'health_changed' && event.previous_health_status
    ? [badge(event.previous_health_status), ' → ', badge(event.health_status)]
    : [el('span', { class: `change change-${kind}` }, kind.replace('_', ' ')), ' ', badge(event.health_status)];
  list.prepend(el('li', { 'data-kind': kind, 'data-agent': event.agent_id },
    el('span', { class: 'muted' }, time), ' ',
    el('a', { href: `#/agent/${encodeURIComponent(event.agent_id)}?publisher=${encodeURIComponent(event.publisher)}` },
      event.agent_id), ' ', what));
  while (list.children.length > CHANGES_SHOWN) list.lastElementChild.remove();
}

function setLive(state) {
  const live = $('live');
  live.dataset.state = state;
  live.textContent = state === 'live' ? 'live' : 'reconnecting…';
  live.title = state === 'live' ? 'following the watch stream' : 'the watch stream is down; retrying';
}

function main() {
  const mesh = new Mesh({
    node: $('node'), tiles: $('tiles'), topology: $('topology'), peers: $('peers'), peerCount: $('peer-count'),
  });
  mesh.start();
  window.addEventListener('hashchange', route);
  route();
  setInterval(() => tickAges(), 1000);
  follow({
    signal: new AbortController().signal,
    onState: setLive,
    onEvent: (kind, event) => {
      logChange(kind, event);
      view?.onEvent(kind, event);
      mesh.refreshSoon();
    },
    // Changes were missed: read everything again.
    onReset: () => {
      view?.refresh();
      mesh.refreshSoon();
    },
  });
}

main();
