// Small DOM and formatting helpers. Everything from the server goes into the
// page as text (textContent), never as markup.

// h builds an element: h('a', {href: '#/x', class: 'y'}, 'text', child...).
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else if (v === true) el.setAttribute(k, '');
    else el.setAttribute(k, String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

// clear removes every child of el and appends children.
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

// The server's clock minus the browser's, from the Date header, so times held
// and left are counted on the server's clock (within a second).
let skewMs = 0;
export function noteServerDate(resp) {
  const d = Date.parse(resp.headers.get('Date') || '');
  if (!Number.isNaN(d)) skewMs = d - Date.now();
}
export function serverNow() { return Date.now() + skewMs; }

// parseTime turns an RFC 3339 time into ms since the epoch (NaN if absent).
export function parseTime(s) {
  if (!s || s.startsWith('0001-')) return NaN;
  return Date.parse(s);
}

// dur formats a duration in ms: 850ms, 12s, 3m 05s, 2h 03m, 4d 02h.
export function dur(ms) {
  if (!Number.isFinite(ms)) return '—';
  const neg = ms < 0;
  ms = Math.abs(ms);
  let out;
  if (ms < 1000) out = `${Math.round(ms)}ms`;
  else if (ms < 60e3) out = `${Math.floor(ms / 1000)}s`;
  else if (ms < 3600e3) out = `${Math.floor(ms / 60e3)}m ${String(Math.floor(ms / 1000) % 60).padStart(2, '0')}s`;
  else if (ms < 86400e3) out = `${Math.floor(ms / 3600e3)}h ${String(Math.floor(ms / 60e3) % 60).padStart(2, '0')}m`;
  else out = `${Math.floor(ms / 86400e3)}d ${String(Math.floor(ms / 3600e3) % 24).padStart(2, '0')}h`;
  return neg ? `-${out}` : out;
}

// since/left: how long ago a time was, how long until it comes.
export function since(t) { const v = parseTime(t); return Number.isNaN(v) ? '—' : dur(serverNow() - v); }
export function left(t) {
  const v = parseTime(t);
  if (Number.isNaN(v)) return '—';
  const d = v - serverNow();
  return d <= 0 ? 'due' : dur(d);
}

export function clock(t) {
  const v = parseTime(t);
  return Number.isNaN(v) ? '—' : new Date(v).toLocaleString();
}

// throttle runs fn at most once per ms, trailing: a burst of calls gives one
// call at once and one after the burst.
export function throttle(fn, ms) {
  let timer = null, pending = false, last = 0;
  const run = () => { timer = null; pending = false; last = Date.now(); fn(); };
  const t = () => {
    if (timer) { pending = true; return; }
    const wait = Math.max(0, last + ms - Date.now());
    timer = setTimeout(run, wait);
  };
  t.cancel = () => { if (timer) clearTimeout(timer); timer = null; pending = false; };
  return t;
}

// holdersOf gives a lock's holders: the list when the server sends one
// (shared modes), else the single holder.
export function holdersOf(lock) {
  if (Array.isArray(lock.holders)) return lock.holders;
  return lock.holder ? [lock.holder] : [];
}

// lockHref is the console's address of one lock's page.
export function lockHref(name) { return '#/lock/' + encodeURIComponent(name); }

// pathName escapes a lock name for an API path.
export function pathName(name) { return encodeURIComponent(name); }

// hashQuery reads "?a=b" from the route part of the URL fragment.
export function hashParams() {
  const i = location.hash.indexOf('?');
  return new URLSearchParams(i >= 0 ? location.hash.slice(i + 1) : '');
}
