// The daemon's own JSON API and watch stream, same origin, read only.

/** An answer other than 2xx, with the API's error message when it sent one. */
export class ApiError extends Error {
  constructor(status, body) {
    super(body?.message || `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

/** `params` as a query string, leaving out empty values. */
export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && String(v).trim() !== '') q.set(k, String(v).trim());
  }
  const s = q.toString();
  return s ? `?${s}` : '';
}

export async function getJson(path, params = {}, signal) {
  const res = await fetch(path + query(params), { headers: { accept: 'application/json' }, signal });
  let body = null;
  try {
    body = await res.json();
  } catch {
    // Not JSON: the status alone says what went wrong.
  }
  if (!res.ok) throw new ApiError(res.status, body);
  return body;
}

const EVENTS = '/api/v1/discovery/events';
/** Waits before reconnecting a stream that ended or failed. */
const RETRY_MS = 1000;

/**
 * Server-sent events over `fetch`, so that the first request can carry `Last-Event-ID` (an
 * `EventSource` sends it only when it reconnects). Yields `{event, data, id}`.
 */
export async function* sse(path, lastId, signal) {
  const headers = { accept: 'text/event-stream' };
  if (lastId) headers['last-event-id'] = lastId;
  const res = await fetch(path, { headers, signal, cache: 'no-store' });
  if (!res.ok || !res.body) throw new ApiError(res.status, null);
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  let frame = { event: 'message', data: null, id: null };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let start = 0;
    for (let end = buffer.indexOf('\n'); end >= 0; end = buffer.indexOf('\n', start)) {
      const line = buffer.slice(start, buffer[end - 1] === '\r' ? end - 1 : end);
      start = end + 1;
      if (line === '') {
        if (frame.data !== null) yield frame;
        frame = { event: 'message', data: null, id: null };
        continue;
      }
      if (line.startsWith(':')) continue; // keep-alive comment
      const colon = line.indexOf(':');
      const field = colon < 0 ? line : line.slice(0, colon);
      let text = colon < 0 ? '' : line.slice(colon + 1);
      if (text.startsWith(' ')) text = text.slice(1);
      if (field === 'event') frame.event = text;
      else if (field === 'data') frame.data = frame.data === null ? text : `${frame.data}\n${text}`;
      else if (field === 'id') frame.id = text;
    }
    buffer = buffer.slice(start);
  }
}

/** An abort signal that follows `parent` and can also be aborted on its own with `close`. */
function child(parent) {
  const controller = new AbortController();
  const stop = () => controller.abort();
  parent.addEventListener('abort', stop, { once: true });
  return {
    signal: controller.signal,
    close() {
      controller.abort();
      parent.removeEventListener('abort', stop);
    },
  };
}

/**
 * The id of the newest change, without the view: a stream filtered on an agent id no card can have
 * (ids never hold `/`) sends no `added` event, only `synced` with that id.
 */
async function head(signal) {
  const probe = child(signal);
  try {
    for await (const frame of sse(`${EVENTS}?agent=%2F`, null, probe.signal)) {
      if (frame.event === 'synced') return frame.id;
    }
    throw new ApiError(0, { message: 'watch stream ended before it synced' });
  } finally {
    probe.close();
  }
}

/**
 * Follows every change after the moment it is called, for as long as `signal` lets it: resumes from
 * the last id after a dropped stream, and calls `onReset` when the node cannot resume (restarted, or
 * too far behind), since changes were then missed. `onState` gets `live` or `offline`.
 */
export async function follow({ onEvent, onReset, onState, signal }) {
  let last = null;
  while (!signal.aborted) {
    const stream = child(signal);
    let reset = false;
    try {
      if (last === null) last = await head(stream.signal);
      onState('live');
      for await (const frame of sse(EVENTS, last, stream.signal)) {
        if (frame.event === 'reset') {
          last = null;
          reset = true;
          onReset();
          break;
        }
        if (frame.id) last = frame.id;
        if (frame.event === 'synced') continue;
        try {
          onEvent(frame.event, JSON.parse(frame.data));
        } catch (e) {
          console.error('watch event not handled', frame.event, e);
        }
      }
    } catch {
      // Refused, dropped or aborted: retried below unless the page is done with it.
    } finally {
      stream.close();
    }
    if (signal.aborted) return;
    if (reset) continue;
    onState('offline');
    await new Promise((resolve) => setTimeout(resolve, RETRY_MS));
  }
}

/**
 * Runs `fn` once, `ms` after the first of a burst of calls: a steady flow of changes still gets
 * one run every `ms`, where a debounce would wait for a quiet moment that may never come.
 */
export function coalesce(fn, ms) {
  let timer = null;
  return () => {
    if (timer !== null) return;
    timer = setTimeout(() => {
      timer = null;
      fn();
    }, ms);
  };
}
