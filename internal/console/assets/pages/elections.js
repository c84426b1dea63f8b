// Elections: each election's leader, its value, since when, and how many
// candidates wait. Listed a page at a time by prefix (GET
// /api/v1/elections), re-read when the watch stream reports a change.
import { api, ApiError, setState, conn } from '../api.js';
import { Watch } from '../sse.js';
import { h, fill, since, clock, throttle, hashParams } from '../util.js';

const PAGE_SIZE = 100;

export function mount(root) {
  let prefix = hashParams().get('prefix') || '';
  let cursors = [''];
  let page = 0;
  let rows = [];
  let more = false;
  let alive = true;
  let watch = null;
  let seq = 0;

  const input = h('input', { type: 'search', id: 'eprefix', value: prefix, placeholder: 'db/', autocomplete: 'off', spellcheck: 'false' });
  const summary = h('p', { class: 'summary', 'aria-live': 'polite' }, 'Loading…');
  const tbody = h('tbody');
  const prev = h('button', { type: 'button', disabled: true }, '← Previous');
  const next = h('button', { type: 'button', disabled: true }, 'Next →');
  const err = h('p', { class: 'error', role: 'alert' });
  root.append(
    h('h1', { tabindex: '-1' }, 'Elections'),
    h('form', { class: 'toolbar', role: 'search', onsubmit: (e) => { e.preventDefault(); setPrefix(input.value); } },
      h('label', { for: 'eprefix' }, 'Name prefix', input), h('button', { type: 'submit' }, 'Filter')),
    err, summary,
    h('table', { class: 'cards', id: 'elections' },
      h('caption', { class: 'sr-only' }, 'Elections and their leaders'),
      h('thead', {}, h('tr', {},
        h('th', { scope: 'col' }, 'Election'), h('th', { scope: 'col' }, 'Leader'), h('th', { scope: 'col' }, 'Value'),
        h('th', { scope: 'col' }, 'Since'), h('th', { scope: 'col', class: 'num' }, 'Token'), h('th', { scope: 'col', class: 'num' }, 'Candidates waiting'))),
      tbody),
    h('nav', { class: 'pager', 'aria-label': 'Pages of elections' }, prev, next));

  let typing = null;
  input.addEventListener('input', () => { clearTimeout(typing); typing = setTimeout(() => setPrefix(input.value), 300); });
  prev.addEventListener('click', () => { if (page > 0) { page--; load().catch(() => {}); } });
  next.addEventListener('click', () => {
    if (!more || !rows.length) return;
    cursors[page + 1] = rows[rows.length - 1].name;
    page++;
    load().catch(() => {});
  });

  function setPrefix(p) {
    if (p === prefix) return;
    prefix = p;
    history.replaceState(null, '', p ? `#/elections?prefix=${encodeURIComponent(p)}` : '#/elections');
    cursors = [''];
    page = 0;
    restart();
  }

  const refresh = throttle(() => load().catch(() => {}), 250);

  async function load() {
    const my = ++seq;
    const q = new URLSearchParams({ limit: String(PAGE_SIZE) });
    if (prefix) q.set('prefix', prefix);
    if (cursors[page]) q.set('after', cursors[page]);
    try {
      const res = await api(`/api/v1/elections?${q}`);
      if (!alive || my !== seq) return res;
      err.textContent = '';
      rows = res.elections || [];
      more = !!res.more;
      draw();
      return res;
    } catch (e) {
      if (alive && my === seq) {
        err.textContent = e instanceof ApiError && e.status === 404
          ? 'This server cannot list elections; upgrade it, or read one with GET /api/v1/elections/{name}.'
          : `Could not list elections: ${e.message}`;
      }
      throw e;
    }
  }

  function draw() {
    const first = page * PAGE_SIZE + 1;
    summary.textContent = rows.length === 0 ? (page === 0 ? 'No elections with a leader or candidates.' : 'No more elections.')
      : `Elections ${first}–${first + rows.length - 1}${more ? ' (more on the next page)' : ''}.`;
    prev.disabled = page === 0;
    next.disabled = !more;
    fill(tbody, rows.map((e) => {
      const l = e.leader;
      return h('tr', { 'data-name': e.name },
        h('td', { 'data-label': 'Election', class: 'mono' }, e.name),
        h('td', { 'data-label': 'Leader', class: 'mono' }, l ? l.candidate_id : '— none —'),
        h('td', { 'data-label': 'Value', class: 'mono' }, l ? l.value : ''),
        h('td', { 'data-label': 'Since' }, l ? [clock(l.since), h('span', { class: 'sub', 'data-since': l.since }, since(l.since))] : '—'),
        h('td', { 'data-label': 'Token', class: 'num' }, l ? String(l.fencing_token) : '—'),
        h('td', { 'data-label': 'Candidates waiting', class: 'num' }, String(e.campaigners || 0)));
    }));
  }

  let restarts = 0;
  async function restart() {
    const mine = ++restarts;
    clearTimeout(retry);
    if (watch) watch.close();
    watch = null;
    let res;
    try { res = await load(); } catch { if (alive && mine === restarts) retry = setTimeout(restart, 3000); return; }
    if (!alive || mine !== restarts) return;
    watch = new Watch({
      prefix,
      from: res.revision + 1,
      onEvent: (ev) => { if (ev.kind === 'election') refresh(); },
      onReset: async () => (await load()).revision,
      onLive: (up) => { if (up) refresh(); },
    });
  }

  let retry = null;
  const tick = setInterval(() => {
    for (const el of tbody.querySelectorAll('[data-since]')) el.textContent = since(el.dataset.since);
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

