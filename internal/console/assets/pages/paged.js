// A live, paged list of names under a prefix: what the Locks and Elections
// pages share. The server does the filtering and the paging (prefix, after,
// limit), so the page holds one page of rows however many names exist; a
// watch stream on the prefix re-reads the page shown whenever a name on it
// changes.
import { api, setState, conn } from '../api.js';
import { Watch } from '../sse.js';
import { h, fill, since, left, throttle, hashParams } from '../util.js';

export const PAGE_SIZE = 100;

// opts: title, route ('#/locks'), path ('/api/v1/locks'), key (the answer's
// list field), kind (the watch events that count), noun ('locks'),
// placeholder, caption, head ([[label, class]]), row(item) -> <tr>,
// listError(err, prefix) -> text.
export function pagedList(root, opts) {
  let prefix = hashParams().get('prefix') || '';
  // cursors[i] is the "after" of page i (page 0 starts at "").
  let cursors = [''];
  let page = 0;
  let rows = [];
  let more = false;
  let watch = null;
  let alive = true;
  let seq = 0;
  let restarts = 0;
  let retry = null;
  let typing = null;

  const input = h('input', { type: 'search', id: 'prefix', name: 'prefix', value: prefix, placeholder: opts.placeholder, autocomplete: 'off', spellcheck: 'false', 'aria-describedby': 'prefix-help' });
  const summary = h('p', { class: 'summary', id: 'summary', 'aria-live': 'polite' }, 'Loading…');
  const tbody = h('tbody');
  const prev = h('button', { type: 'button', id: 'prev', disabled: true }, '← Previous');
  const next = h('button', { type: 'button', id: 'next', disabled: true }, 'Next →');
  const err = h('p', { class: 'error', role: 'alert' });

  root.append(
    h('h1', { tabindex: '-1' }, opts.title),
    h('form', { class: 'toolbar', role: 'search', onsubmit: (e) => { e.preventDefault(); setPrefix(input.value); } },
      h('label', { for: 'prefix' }, 'Name prefix', input),
      h('button', { type: 'submit' }, 'Filter'),
      h('span', { id: 'prefix-help', class: 'note' }, 'Press / to jump here. Names starting with the prefix, in name order.')),
    err, summary,
    h('table', { class: 'cards', id: opts.noun },
      h('caption', { class: 'sr-only' }, opts.caption),
      h('thead', {}, h('tr', {}, opts.head.map(([label, cls]) => h('th', { scope: 'col', class: cls }, label)))),
      tbody),
    h('nav', { class: 'pager', 'aria-label': `Pages of ${opts.noun}` }, prev, next));

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
    history.replaceState(null, '', p ? `${opts.route}?prefix=${encodeURIComponent(p)}` : opts.route);
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
      const res = await api(`${opts.path}?${q}`);
      // A newer read is on its way: it draws, this one only answers.
      if (!alive || my !== seq) return res;
      err.textContent = '';
      rows = res[opts.key] || [];
      more = !!res.more;
      draw();
      return res;
    } catch (e) {
      if (alive && my === seq) err.textContent = opts.listError(e, prefix);
      throw e;
    }
  }

  // Only the newest restart may open a stream, so two quick filter changes
  // never leave a second stream running.
  async function restart() {
    const mine = ++restarts;
    clearTimeout(retry);
    if (watch) watch.close();
    watch = null;
    let res;
    try { res = await load(); } catch {
      if (alive && mine === restarts) retry = setTimeout(restart, 2000);
      return;
    }
    if (!alive || mine !== restarts) return;
    watch = new Watch({
      prefix,
      from: res.revision + 1,
      onEvent: (ev) => { if (ev.kind === opts.kind && inPage(ev.name)) refresh(); },
      // The node lost the history we need: read the page again and go on
      // from there.
      onReset: async () => (await load()).revision,
      onLive: (up) => { if (up) refresh(); },
    });
  }

  function draw() {
    const first = page * PAGE_SIZE + 1;
    const scope = prefix ? ` under “${prefix}”` : '';
    const Noun = opts.noun[0].toUpperCase() + opts.noun.slice(1);
    summary.textContent = rows.length === 0
      ? (page === 0 ? `${opts.empty}${scope}.` : `No more ${opts.noun}.`)
      : `${Noun} ${first}–${first + rows.length - 1}${scope}${more ? ' (more on the next page)' : ''}.`;
    prev.disabled = page === 0;
    next.disabled = !more;
    fill(tbody, rows.map(opts.row));
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
  // A new prefix typed into the address bar.
  stop.update = () => {
    const p = hashParams().get('prefix') || '';
    if (p !== prefix) { input.value = p; setPrefix(p); }
  };
  return stop;
}
