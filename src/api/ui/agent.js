// One agent's page: its record and card, its capabilities with their schemas, and its A2A card.

import { ApiError, coalesce, getJson, query } from './api.js';
import { ageSpan, badge, el, json, lifecycleTag, put, setAge, setHealth } from './dom.js';

const RELOAD_MS = 300;
/** The record is read again this often for its heartbeat time, which no watch event carries. */
const FRESH_MS = 5000;
/** Schema keywords shown beside a parameter's description. */
const CONSTRAINTS = ['default', 'enum', 'minimum', 'maximum', 'minLength', 'maxLength', 'pattern', 'format'];

export class AgentView {
  constructor(root, agentId, publisher) {
    this.root = root;
    this.agentId = agentId;
    this.publisher = publisher;
    this.reloadSoon = coalesce(() => this.load(), RELOAD_MS);
    this.fresh = setInterval(() => this.load(), FRESH_MS);
    this.seq = null; // the card version on screen
    put(root, back(), el('section', { class: 'panel' }, el('p', { class: 'muted' }, `Loading ${agentId}…`)));
    this.load();
  }

  /** Follows this agent's changes: a new health or card is read again, a removal says so. */
  onEvent(kind, event) {
    if (event.agent_id !== this.agentId || (this.publisher && event.publisher !== this.publisher)) return;
    if (kind === 'removed') {
      const health = this.root.querySelector('#agent-health');
      if (health) put(health, badge('removed'));
      this.root.querySelector('#agent-removed')?.removeAttribute('hidden');
      this.seq = null;
      return;
    }
    this.reloadSoon();
  }

  refresh() {
    this.load();
  }

  /**
   * Reads the record; the same card as on screen only updates health and heartbeat age, so that what
   * the reader opened stays open. A new card (or none before) renders the page with its A2A card.
   */
  async load() {
    if (this.stopped) return;
    const path = `/api/v1/agents/${encodeURIComponent(this.agentId)}`;
    const params = this.publisher ? { publisher: this.publisher } : {};
    let record;
    try {
      record = await getJson(path, params);
    } catch (e) {
      if (this.stopped) return;
      if (this.seq !== null && !(e instanceof ApiError && e.status === 404)) return; // keep what is shown
      const text = e instanceof ApiError && e.status === 404
        ? `Agent ${this.agentId} is not in this node's view.`
        : `Cannot load agent ${this.agentId}: ${e.message}`;
      put(this.root, back(), el('section', { class: 'panel' }, el('p', { class: 'error' }, text)));
      this.seq = null;
      return;
    }
    if (this.stopped) return;
    if (record.seq === this.seq) {
      setHealth(this.root.querySelector('#agent-health'), record.health_status, record.lifecycle);
      setAge(this.root.querySelector('#agent-heartbeat'), record.last_heartbeat);
      return;
    }
    const [a2a] = await Promise.allSettled([getJson(`${path}/agent-card.json`, params)]);
    if (this.stopped) return;
    this.seq = record.seq;
    put(this.root, back(), this.header(record), this.capabilities(record.card), this.cards(record, a2a));
  }

  header(record) {
    const card = record.card;
    const fact = (term, ...value) => [el('dt', {}, term), el('dd', {}, ...value)];
    return el('section', { class: 'panel', id: 'agent', 'data-agent': record.agent_id },
      el('div', { class: 'title' },
        el('h2', {}, card.name || record.agent_id),
        el('span', { id: 'agent-health' }, badge(record.health_status), lifecycleTag(record.lifecycle))),
      el('p', { class: 'error', id: 'agent-removed', hidden: true }, 'This agent has left the view.'),
      card.description && el('p', { class: 'description' }, card.description),
      el('dl', { class: 'facts' },
        fact('Agent id', record.agent_id),
        fact('Publisher', el('code', {}, record.publisher), record.local && el('span', { class: 'tag' }, 'this node')),
        fact('Version', card.version || '–'),
        fact('Base URL', el('code', {}, card.base_url || '–')),
        fact('Deployment', card.deployment_type || '–'),
        fact('Last heartbeat', setId(ageSpan(record.last_heartbeat), 'agent-heartbeat')),
        fact('Card updated', record.updated_at, el('span', { class: 'muted' }, ` (seq ${record.seq})`)),
        card.category && fact('Category', card.category),
        fact('Tags', tags(card.tags))));
  }

  capabilities(card) {
    const all = [
      ...(card.reasoners || []).map((c) => ['reasoner', c]),
      ...(card.skills || []).map((c) => ['skill', c]),
    ];
    return el('section', { class: 'panel', id: 'capabilities' },
      el('h2', {}, `Capabilities `, el('span', { class: 'count' }, String(all.length))),
      all.map(([kind, c], i) => el('details', { class: 'capability', open: i < 3, 'data-capability': c.id },
        el('summary', {}, el('span', { class: `kind kind-${kind}` }, kind), ' ', el('strong', {}, c.id),
          c.description && el('span', { class: 'muted' }, ` — ${c.description}`)),
        el('div', { class: 'capability-body' },
          c.tags?.length ? el('p', {}, tags(c.tags)) : null,
          el('h4', {}, 'Input schema'), schema(c.input_schema, 'input'),
          (kind === 'reasoner' || c.output_schema) && [el('h4', {}, 'Output schema'), schema(c.output_schema, 'output')],
          c.examples?.length ? [el('h4', {}, 'Examples'), json(c.examples)] : null))));
  }

  cards(record, a2a) {
    const a2aBody = a2a.status === 'fulfilled'
      ? json(a2a.value)
      : el('p', { class: 'muted' }, `No A2A card: ${a2a.reason.message}`);
    const link = `/api/v1/agents/${encodeURIComponent(record.agent_id)}/agent-card.json`
      + query(this.publisher ? { publisher: this.publisher } : {});
    return el('section', { class: 'panel', id: 'cards' },
      el('h2', {}, 'Cards'),
      el('details', { id: 'card-json' }, el('summary', {}, 'Agent card, as this node holds it'), json(record.card)),
      el('details', { id: 'a2a-card' }, el('summary', {}, 'A2A card ', el('code', {}, link)), a2aBody));
  }

  stop() {
    this.stopped = true;
    clearInterval(this.fresh);
  }
}

function setId(node, id) {
  node.id = id;
  return node;
}

function back() {
  return el('nav', { class: 'crumbs' }, el('a', { href: '#/' }, '← All agents'));
}

function tags(list) {
  return list?.length ? list.map((t) => el('span', { class: 'tag' }, t)) : el('span', { class: 'muted' }, 'none');
}

/** A JSON Schema: its top-level parameters as a table when it has them, and the schema itself. */
function schema(value, which) {
  if (!value) return el('p', { class: 'muted' }, 'none');
  const props = value.type === 'object' && value.properties && typeof value.properties === 'object'
    ? Object.entries(value.properties) : [];
  const required = new Set(Array.isArray(value.required) ? value.required : []);
  const table = props.length > 0 && el('table', { class: 'params', 'data-schema': which },
    el('thead', {}, el('tr', {}, el('th', {}, 'Parameter'), el('th', {}, 'Type'), el('th', {}, 'Description'))),
    el('tbody', {}, props.map(([name, p]) => el('tr', {},
      el('td', {}, el('code', {}, name), required.has(name) && el('span', { class: 'required', title: 'required' }, ' *')),
      el('td', {}, typeName(p)),
      el('td', {}, p?.description || '', el('span', { class: 'muted' }, constraints(p)))))));
  return el('div', { class: 'schema' }, table,
    el('details', { open: !table }, el('summary', {}, 'JSON Schema'), json(value)));
}

function typeName(p) {
  if (!p || typeof p !== 'object') return '';
  if (Array.isArray(p.type)) return p.type.join(' | ');
  if (p.type === 'array' && p.items?.type) return `array of ${p.items.type}`;
  return p.type || (p.enum ? 'enum' : p.$ref ? p.$ref.split('/').pop() : 'any');
}

function constraints(p) {
  if (!p || typeof p !== 'object') return '';
  const parts = CONSTRAINTS.filter((k) => k in p).map((k) => `${k} ${JSON.stringify(p[k])}`);
  return parts.length ? ` ${parts.join(' · ')}` : '';
}
