// Building the page: elements are made with text content only, never from markup, so whatever a
// card says is shown as text.

const SVG_NS = 'http://www.w3.org/2000/svg';

/** An element with properties (`class`, `data-*`, attributes, `on*` listeners) and children. */
export function el(tag, props = {}, ...children) {
  return fill(document.createElement(tag), props, children);
}

/** The same for SVG. */
export function svg(tag, props = {}, ...children) {
  return fill(document.createElementNS(SVG_NS, tag), props, children);
}

function fill(node, props, children) {
  for (const [key, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith('on') && typeof value === 'function') {
      node.addEventListener(key.slice(2), value);
    } else {
      node.setAttribute(key, value === true ? '' : String(value));
    }
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

/** Replaces the children of `node`. */
export function put(node, ...children) {
  node.replaceChildren();
  return fill(node, {}, children);
}

/** `health` as a coloured badge. */
export function badge(health) {
  return el('span', { class: `badge health-${health}`, 'data-health': health }, health);
}

/** A PeerId cut to something a person can tell apart: `12D3…4bp8d`. */
export function shortPeer(id) {
  return id && id.length > 14 ? `${id.slice(0, 4)}…${id.slice(-5)}` : id || '';
}

/** How long ago `time` (an RFC 3339 string) was, from `now` (ms). */
export function age(time, now = Date.now()) {
  if (!time) return 'never';
  const then = Date.parse(time);
  if (Number.isNaN(then)) return time;
  const s = Math.max(0, Math.round((now - then) / 1000));
  if (s < 2) return 'just now';
  if (s < 90) return `${s} s ago`;
  if (s < 90 * 60) return `${Math.round(s / 60)} min ago`;
  if (s < 36 * 3600) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} d ago`;
}

/** An element whose text says how long ago `time` was, kept up to date by `tickAges`. */
export function ageSpan(time) {
  return setAge(el('span', { class: 'age' }), time);
}

/** Points an `ageSpan` at a newer time. */
export function setAge(span, time) {
  span.dataset.time = time || '';
  span.title = time || 'no heartbeat yet';
  span.textContent = age(time);
  return span;
}

/** Shows `health` in `cell`, unless it already does. */
export function setHealth(cell, health, lifecycle) {
  const shown = cell.querySelector('.badge')?.dataset.health;
  const busy = cell.querySelector('.lifecycle')?.dataset.lifecycle;
  if (lifecycle === undefined) lifecycle = busy || 'ready';
  if (shown !== health || (busy || 'ready') !== lifecycle) put(cell, badge(health), lifecycleTag(lifecycle));
}

/** `busy` or `draining` beside the health badge (nothing for `ready`): whether the agent takes new work. */
export function lifecycleTag(lifecycle) {
  return lifecycle && lifecycle !== 'ready'
    ? el('span', { class: `tag lifecycle lifecycle-${lifecycle}`, 'data-lifecycle': lifecycle }, lifecycle)
    : null;
}

/** Refreshes every age on the page (a page shows at most one list page of them). */
export function tickAges(root = document) {
  const now = Date.now();
  for (const span of root.querySelectorAll('.age')) {
    span.textContent = age(span.dataset.time, now);
  }
}

/** `1234567` as `1,234,567`. */
export function count(n) {
  return typeof n === 'number' ? n.toLocaleString('en-US') : '–';
}

/** The link to an agent's page. */
export function agentHref(agentId, publisher) {
  const q = publisher ? `?publisher=${encodeURIComponent(publisher)}` : '';
  return `#/agent/${encodeURIComponent(agentId)}${q}`;
}

/** Pretty JSON in a `<pre>`. */
export function json(value) {
  return el('pre', { class: 'json' }, JSON.stringify(value, null, 2));
}
