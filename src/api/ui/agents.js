// The agents of the view, one page at a time: the discovery filters, or a capability search.

import { coalesce, getJson, query } from './api.js';
import { agentHref, ageSpan, badge, count, el, lifecycleTag, put, setAge, setHealth, shortPeer } from './dom.js';

/** Agents per page (the API's `limit`); a page is all the DOM the list ever holds. */
const PAGE = 50;
/** Results of a search (its API's largest `limit`). */
const SEARCH_LIMIT = 50;
/** Capability ids named per row; the rest is a count. */
const IDS_SHOWN = 4;
/** A page is fetched again at most this often while changes stream in. */
const RELOAD_MS = 500;
/** A page is read again this often for its heartbeat times, which no watch event carries. */
const FRESH_MS = 5000;

const FILTERS = ['q', 'reasoner', 'skill', 'tags', 'health_status', 'lifecycle'];
const HEALTHS = ['active', 'degraded', 'inactive', 'unknown'];
const LIFECYCLES = ['ready', 'busy', 'draining'];

/** The list page. `show(params)` with the route's parameters; `onEvent` with each watch event. */
export class AgentsView {
  constructor(root) {
    this.root = root;
    this.params = {};
    this.health = new Map(); // `agent_id publisher` -> the health cells on this page
    this.ages = new Map(); // `agent_id publisher` -> the heartbeat age on this page
    this.shown = null; // the records of the page on screen, to tell an update from a new page
    this.loading = null;
    this.reloadSoon = coalesce(() => this.load(), RELOAD_MS);
    this.fresh = setInterval(() => { if (!this.params.q) this.load(); }, FRESH_MS);
    this.form = this.filterForm();
    this.summary = el('p', { class: 'summary', id: 'summary' });
    this.error = el('p', { class: 'error', id: 'list-error', hidden: true });
    this.table = el('div', { class: 'table-wrap' });
    this.pager = el('nav', { class: 'pager' });
    put(root, el('section', { class: 'panel' }, el('h2', {}, 'Agents'), this.form, this.error,
      el('div', { class: 'list-head' }, this.summary, this.pager), this.table));
  }

  show(params) {
    this.params = params;
    for (const name of FILTERS) this.form.elements[name].value = params[name] || '';
    this.load();
  }

  /** Updates a visible row's health in place; anything that changes which agents match reloads the page. */
  onEvent(kind, event) {
    const cells = this.health.get(`${event.agent_id} ${event.publisher}`);
    if (kind === 'health_changed' && cells) {
      for (const cell of cells) {
        setHealth(cell, event.health_status);
        cell.parentElement.classList.remove('flash');
        void cell.parentElement.offsetWidth; // restart the animation
        cell.parentElement.classList.add('flash');
      }
    }
    if (kind !== 'health_changed' || this.params.health_status) this.reloadSoon();
  }

  refresh() {
    this.load();
  }

  async load() {
    if (this.stopped) return;
    this.loading?.abort();
    const loading = (this.loading = new AbortController());
    const filters = Object.fromEntries(FILTERS.filter((k) => k !== 'q').map((k) => [k, this.params[k]]));
    try {
      if (this.params.q) {
        const answer = await getJson('/api/v1/discovery/search',
          { q: this.params.q, limit: SEARCH_LIMIT, ...filters }, loading.signal);
        this.renderSearch(answer);
      } else {
        const offset = Number(this.params.offset) || 0;
        const page = await getJson('/api/v1/discovery/capabilities',
          { ...filters, limit: PAGE, offset, include_descriptions: false }, loading.signal);
        this.renderPage(page);
      }
      this.error.hidden = true;
    } catch (e) {
      if (loading.signal.aborted) return;
      this.error.hidden = false;
      this.error.textContent = `Cannot load the agents: ${e.message}`;
    }
  }

  filterForm() {
    const input = (name, label, placeholder) =>
      el('label', {}, label, el('input', { name, type: 'search', placeholder, autocomplete: 'off' }));
    const form = el('form', { class: 'filters', id: 'filters', onsubmit: (e) => {
      e.preventDefault();
      const params = Object.fromEntries(FILTERS.map((k) => [k, form.elements[k].value]));
      location.hash = `#/${query(params)}`;
    } },
    input('q', 'Search', 'what should the agent do?'),
    input('reasoner', 'Reasoner', 'e.g. *research*'),
    input('skill', 'Skill', 'e.g. web_*'),
    input('tags', 'Tags', 'e.g. ml,web'),
    el('label', {}, 'Health', el('select', { name: 'health_status' },
      el('option', { value: '' }, 'any'), HEALTHS.map((h) => el('option', { value: h }, h)))),
    el('label', {}, 'Lifecycle', el('select', { name: 'lifecycle' },
      el('option', { value: '' }, 'any'), LIFECYCLES.map((l) => el('option', { value: l }, l)))),
    el('div', { class: 'buttons' },
      el('button', { type: 'submit' }, 'Apply'),
      el('button', { type: 'button', class: 'secondary', onclick: () => { location.hash = '#/'; } }, 'Clear')));
    return form;
  }

  renderPage(page) {
    const { total_agents: total, pagination } = page;
    const shown = page.capabilities.length;
    const range = shown ? `${count(pagination.offset + 1)}–${count(pagination.offset + shown)} of ` : '';
    this.summary.textContent = `${range}${plural(total, 'agent')} · `
      + `${plural(page.total_reasoners, 'reasoner')}, ${plural(page.total_skills, 'skill')} match`;
    if (!shown) {
      const why = total > 0 ? 'This page is past the last agent.'
        : this.filtered() ? 'No agent matches these filters.' : 'No agents in the view yet.';
      put(this.table, el('p', { class: 'empty' }, why));
      this.shown = null;
    } else if (!this.updateInPlace(page.capabilities)) {
      this.health.clear();
      this.ages.clear();
      this.shown = signature(page.capabilities);
      put(this.table, el('table', { class: 'list', id: 'agents' },
        el('thead', {}, el('tr', {}, ['Agent', 'Health', 'Publisher', 'Last heartbeat', 'Capabilities']
          .map((h) => el('th', {}, h)))),
        el('tbody', {}, page.capabilities.map((a) => this.agentRow(a)))));
    }
    this.renderPager(pagination.offset, pagination.has_more);
  }

  /** The same records as on screen (same cards): only health and heartbeat times change. */
  updateInPlace(agents) {
    if (this.shown !== signature(agents)) return false;
    for (const a of agents) {
      const key = `${a.agent_id} ${a.publisher}`;
      for (const cell of this.health.get(key) || []) setHealth(cell, a.health_status, a.lifecycle);
      const age = this.ages.get(key);
      if (age) setAge(age, a.last_heartbeat);
    }
    return true;
  }

  agentRow(a) {
    const health = el('td', { class: 'health' }, badge(a.health_status), lifecycleTag(a.lifecycle));
    const age = ageSpan(a.last_heartbeat);
    this.remember(a.agent_id, a.publisher, health);
    this.ages.set(`${a.agent_id} ${a.publisher}`, age);
    const ids = [...a.reasoners, ...a.skills].map((c) => c.id);
    const more = ids.length > IDS_SHOWN ? ` +${ids.length - IDS_SHOWN}` : '';
    return el('tr', { 'data-agent': a.agent_id, 'data-publisher': a.publisher },
      el('td', {}, el('a', { href: agentHref(a.agent_id, a.publisher) }, a.agent_id),
        el('span', { class: 'muted' }, ` v${a.version}`)),
      health,
      el('td', { title: a.publisher }, shortPeer(a.publisher), a.local && el('span', { class: 'tag' }, 'this node')),
      el('td', {}, age),
      el('td', { class: 'caps' },
        el('span', { class: 'caps-count' }, plural(a.reasoners.length, 'reasoner'), ', ',
          plural(a.skills.length, 'skill')),
        el('span', { class: 'muted ids' }, ids.slice(0, IDS_SHOWN).join(', ') + more)));
  }

  renderSearch(answer) {
    this.health.clear();
    this.shown = null;
    this.summary.textContent = `${plural(answer.results.length, 'capability', 'capabilities')} for “${answer.query}” `
      + `(${answer.ranking}, ${count(answer.total_indexed)} indexed)`;
    put(this.pager);
    if (!answer.results.length) {
      put(this.table, el('p', { class: 'empty' }, 'No capability matches this search.'));
      return;
    }
    put(this.table, el('table', { class: 'list', id: 'results' },
      el('thead', {}, el('tr', {}, ['Capability', 'Relevance', 'Agent', 'Health', 'Description']
        .map((h) => el('th', {}, h)))),
      el('tbody', {}, answer.results.map((r) => {
        const health = el('td', { class: 'health' }, badge(r.health_status));
        this.remember(r.agent_id, r.publisher, health);
        return el('tr', { 'data-agent': r.agent_id, 'data-publisher': r.publisher },
          el('td', {}, el('span', { class: `kind kind-${r.kind}` }, r.kind), ' ', r.id),
          el('td', {}, el('meter', { min: 0, max: 1, value: r.relevance }), ` ${r.relevance.toFixed(2)}`),
          el('td', {}, el('a', { href: agentHref(r.agent_id, r.publisher) }, r.agent_id)),
          health,
          el('td', { class: 'desc', title: r.description || '' }, r.description || ''));
      }))));
  }

  renderPager(offset, hasMore) {
    const go = (to) => () => { location.hash = `#/${query({ ...this.params, offset: to || '' })}`; };
    put(this.pager,
      el('button', { type: 'button', class: 'secondary', disabled: offset === 0, onclick: go(Math.max(0, offset - PAGE)) },
        '← Previous'),
      el('button', { type: 'button', class: 'secondary', disabled: !hasMore, onclick: go(offset + PAGE) }, 'Next →'));
  }

  remember(agentId, publisher, cell) {
    const key = `${agentId} ${publisher}`;
    const cells = this.health.get(key) || [];
    cells.push(cell);
    this.health.set(key, cells);
  }

  filtered() {
    return FILTERS.some((k) => this.params[k]);
  }

  stop() {
    this.stopped = true;
    clearInterval(this.fresh);
    this.loading?.abort();
  }
}

/** Which records a page holds, in which version, showing which capabilities (filters pick them). */
function signature(agents) {
  return agents.map((a) => [a.agent_id, a.publisher, a.seq, ...a.reasoners.map((c) => c.id), '|',
    ...a.skills.map((c) => c.id)].join(' ')).join('\n');
}

function plural(n, word, words = `${word}s`) {
  return `${count(n)} ${n === 1 ? word : words}`;
}
