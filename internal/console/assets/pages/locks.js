// Locks: who holds what, a page at a time. The list is read from the server
// by name prefix (GET /api/v1/locks?prefix&after&limit), so 100,000 held
// locks cost the page one screenful of rows; a watch stream on the same
// prefix re-reads the page shown whenever one of its names changes.
import { api, setState, conn } from '../api.js';
import { Watch } from '../sse.js';
import { h, fill, since, left, holdersOf, lockHref, throttle, hashParams } from '../util.js';

export const PAGE_SIZE = 100;

export function mount(root) {
  let prefix = hashParams().get('prefix') || '';
  // cursors[i] is the "after" of page i (page 0 starts at "").
  let cursors = [''];
  let page = 0;
  let rows = [];
  let more = false;
  let watch = null;
  let alive = true;
  let seq = 0;

  const input = h('input', { type: 'search', id: 'prefix', name: 'prefix', value: prefix, placeholder: 'billing/', autocomplete: 'off', spellcheck: 'false', 'aria-describedby': 'prefix-help' });
  const summary = h('p', { class: 'summary', id: 'summary', 'aria-live': 'polite' }, 'Loading…');
  const tbody = h('tbody');
  const prev = h('button', { type: 'button', id: 'prev', disabled: true }, '← Previous');
  const next = h('button', { type: 'button', id: 'next', disabled: true }, 'Next →');
  const err = h('p', { class: 'error', role: 'alert' });

  root.append(
    h('h1', { tabindex: '-1' }, 'Locks'),
    h('form', { class: 'toolbar', role: 'search', onsubmit: (e) => { e.preventDefault(); setPrefix(input.value); } },
      h('label', { for: 'prefix' }, 'Name prefix', input),
      h('button', { type: 'submit' }, 'Filter'),
      h('span', { id: 'prefix-help', class: 'note' }, 'Press / to jump here. Names starting with the prefix, in name order.')),
    err, summary,
    h('table', { class: 'cards', id: 'locks' },
      h('caption', { class: 'sr-only' }, 'Held and waited-for locks'),
      h('thead', {}, h('tr', {},
        h('th', { scope: 'col' }, 'Lock'),
        h('th', { scope: 'col' }, 'Holder'),
        h('th', { scope: 'col', class: 'num' }, 'Token'),
        h('th', { scope: 'col' }, 'Mode'),
        h('th', { scope: 'col', class: 'num' }, 'Held for'),
        h('th', { scope: 'col', class: 'num' }, 'Time left'),
        h('th', { scope: 'col', class: 'num' }, 'Waiting'))),
      tbody),
    h('nav', { class: 'pager', 'aria-label': 'Pages of locks' }, prev, next));

  let typing = null;
  input.addEventListener('input', () => {
    clearTimeout(typing);
    typing = setTimeout(() => setPrefix(input.value), 300);
  });
  prev.addEventListener('click', () => { if (page > 0) { page--; load().catch(() => {}); } });
  next.addEventListener('click', () => {
    if (!more || rows.length === 0) return;
    cursors[page + 1] = rows[rows.length - 1].name;
    page++;
    load().catch(() => {});
  });

  function setPrefix(p) {
    if (p === prefix) return;
    prefix = p;
    history.replaceState(null, '', p ? `#/locks?prefix=${encodeURIComponent(p)}` : '#/locks');
    cursors = [''];
    page = 0;
    restart();
  }

  // inPage: would a change to name show on the page shown?
  function inPage(name) {
    if (!name.startsWith(prefix)) return false;
    const after = cursors[page];
    if (after && name <= after) return false;
    if (more && rows.length && name > rows[rows.length - 1].name) return false;
    return true;
  }

  const refresh = throttle(() => load().catch(() => {}), 250);

  async function load() {
    const my = ++seq;
    const q = new URLSearchParams({ limit: String(PAGE_SIZE) });
    if (prefix) q.set('prefix', prefix);
    if (cursors[page]) q.set('after', cursors[page]);
    try {
      const res = await api(`/api/v1/locks?${q}`);
      // A newer read is on its way: it draws, this one only answers.
      if (!alive || my !== seq) return res;
      err.textContent = '';
      rows = res.locks || [];
      more = !!res.more;
      draw();
      return res;
    } catch (e) {
      if (alive && my === seq) {
        err.textContent = e.status === 403
          ? `Your token may not list ${prefix ? `locks under “${prefix}”` : 'every lock'}: type a prefix it may read. (${e.message})`
          : `Could not list locks: ${e.message}`;
      }
      throw e;
    }
  }

  // restarts counts restart calls: only the newest may open a stream, so
  // two quick filter changes never leave a second stream running.
  let restarts = 0;
  async function restart() {
    const mine = ++restarts;
    clearTimeout(retry);
    if (watch) watch.close();
    watch = null;
    let res;
    try { res = await load(); } catch { if (mine === restarts) retryLater(); return; }
    if (!res || !alive || mine !== restarts) return;
    watch = new Watch({
      prefix,
      from: res.revision + 1,
      onEvent: (ev) => { if (ev.kind === 'lock' && inPage(ev.name)) refresh(); },
      // The node lost the history we need: read the page again and go on
      // from there.
      onReset: async () => (await load()).revision,
      onLive: (up) => { if (up) refresh(); },
    });
  }

  let retry = null;
  function retryLater() {
    clearTimeout(retry);
    if (alive) retry = setTimeout(restart, 2000);
  }

  function draw() {
    const first = page * PAGE_SIZE + 1;
    const scope = prefix ? ` under “${prefix}”` : '';
    summary.textContent = rows.length === 0
      ? (page === 0 ? `No held or waited-for locks${scope}.` : 'No more locks.')
      : `Locks ${first}–${first + rows.length - 1}${scope}${more ? ' (more on the next page)' : ''}.`;
    prev.disabled = page === 0;
    next.disabled = !more;
    fill(tbody, rows.map(row));
  }

  function row(l) {
    const hs = holdersOf(l);
    const cell = (label, cls, f) => h('td', { 'data-label': label, class: cls }, hs.length ? hs.map((x, i) => h('span', { class: i ? 'sub' : '' }, f(x))) : '—');
    const name = h('td', { 'data-label': 'Lock' }, h('a', { href: lockHref(l.name), class: 'mono' }, l.name),
      l.value ? h('span', { class: 'sub' }, `value: ${l.value}`) : null);
    const tr = h('tr', { 'data-name': l.name },
      name,
      cell('Holder', 'mono', (x) => x.client_id),
      cell('Token', 'num', (x) => x.fencing_token),
      cell('Mode', '', (x) => x.mode || l.mode || 'exclusive'),
      cell('Held for', 'num', (x) => h('span', { 'data-since': x.granted_at }, since(x.granted_at))),
      cell('Time left', 'num', (x) => h('span', { 'data-until': x.expires_at }, left(x.expires_at))),
      h('td', { 'data-label': 'Waiting', class: 'num' }, String(l.waiters || 0)));
    if (!l.held && hs.length === 0) tr.classList.add('free');
    return tr;
  }

  // Times held and left move every second without asking the server.
  const tick = setInterval(() => {
    for (const el of tbody.querySelectorAll('[data-since]')) el.textContent = since(el.dataset.since);
    for (const el of tbody.querySelectorAll('[data-until]')) el.textContent = left(el.dataset.until);
  }, 1000);

  restart();
  const stop = () => {
    alive = false;
    clearInterval(tick);
    clearTimeout(retry);
    clearTimeout(typing);
    refresh.cancel();
    if (watch) watch.close();
    if (conn.state === 'live') setState('polling');
  };
  stop.update = () => {
    const p = hashParams().get('prefix') || '';
    if (p !== prefix) { input.value = p; setPrefix(p); }
  };
  return stop;
}
