// One lock: its holders, its wait queue in order, its value, the grants the
// server remembers (GET /api/v1/history/{name}, when the server has it) and
// the events seen live since the page opened. Revoke, when the server
// supports it, asks for a reason and a confirmation.
import { api, ApiError, setState, conn } from '../api.js';
import { Watch } from '../sse.js';
import { h, fill, since, left, clock, holdersOf, pathName, throttle, dur, parseTime } from '../util.js';

const HISTORY_LIMIT = 50;
const LIVE_LIMIT = 100;

export function mount(root, name) {
  let alive = true;
  let watch = null;
  let view = null;
  let history = null; // null: not asked yet; false: the server has no history route
  const live = [];

  const facts = h('dl', { class: 'facts', id: 'facts' });
  const holders = h('tbody');
  const queue = h('ol', { class: 'queue', id: 'queue' });
  const queueNote = h('p', { class: 'note' });
  const histSec = h('section', { id: 'history', 'aria-labelledby': 'hist-h', hidden: true });
  const liveList = h('ul', { class: 'timeline', id: 'live' });
  const err = h('p', { class: 'error', role: 'alert' });
  const revokeBtn = h('button', { type: 'button', class: 'danger', id: 'revoke', hidden: true }, 'Revoke…');
  const revokeOut = h('p', { role: 'status', id: 'revoke-status' });

  root.append(
    h('p', {}, h('a', { href: '#/locks' }, '← All locks')),
    h('h1', { tabindex: '-1', class: 'mono' }, name),
    err, facts,
    h('div', { class: 'toolbar' }, revokeBtn, revokeOut),
    h('h2', { id: 'holders-h' }, 'Holders'),
    h('table', { class: 'cards', 'aria-labelledby': 'holders-h' },
      h('thead', {}, h('tr', {},
        h('th', { scope: 'col' }, 'Client'), h('th', { scope: 'col', class: 'num' }, 'Token'), h('th', { scope: 'col' }, 'Mode'),
        h('th', { scope: 'col' }, 'Granted at'), h('th', { scope: 'col', class: 'num' }, 'Held for'), h('th', { scope: 'col', class: 'num' }, 'Time left'))),
      holders),
    h('h2', { id: 'queue-h' }, 'Waiting, in order'), queue, queueNote,
    histSec,
    h('h2', { id: 'live-h' }, 'Live events'),
    h('p', { class: 'note' }, 'Changes to this lock seen since this page opened, newest first.'),
    liveList);

  const refresh = throttle(() => { load().catch(() => {}); loadHistory(); }, 200);

  let seq = 0;
  async function load() {
    const my = ++seq;
    try {
      const v = await api(`/api/v1/locks/${pathName(name)}`);
      // An older answer arriving after a newer one must not draw over it.
      if (!alive || my !== seq) return v;
      view = v;
      err.textContent = '';
      draw();
      return view;
    } catch (e) {
      if (alive && my === seq) err.textContent = `Could not read the lock: ${e.message}`;
      throw e;
    }
  }

  async function loadHistory() {
    if (history === false) return;
    try {
      const res = await api(`/api/v1/history/${pathName(name)}?limit=${HISTORY_LIMIT}`);
      if (!alive) return;
      history = res;
      drawHistory();
    } catch (e) {
      // A server without grant history answers this route 404.
      if (e instanceof ApiError && e.status === 404) history = false;
      drawHistory();
    }
  }

  function draw() {
    const hs = holdersOf(view);
    const rows = [
      ['State', view.held || hs.length ? `held by ${hs.length === 1 ? hs[0].client_id : hs.length + ' holders'}` : 'free'],
      ['Waiting', String(view.waiters || 0)],
    ];
    if (view.mode) rows.push(['Mode', view.mode]);
    if (view.limit) rows.push(['Holder limit', String(view.limit)]);
    if (view.subtree) rows.push(['Subtree', 'held with every name below it']);
    if (view.value !== undefined && view.value !== '') rows.push(['Value', view.value]);
    if (view.delayed_until && !Number.isNaN(parseTime(view.delayed_until))) rows.push(['Delayed until', clock(view.delayed_until)]);
    rows.push(['Revision', String(view.revision)]);
    fill(facts, rows.map(([k, v]) => [h('dt', {}, k), h('dd', { class: k === 'Value' ? 'mono' : '' }, v)]));
    fill(holders, hs.length === 0
      ? h('tr', {}, h('td', { colspan: 6 }, 'Nobody holds this lock.'))
      : hs.map((x) => h('tr', {},
        h('td', { 'data-label': 'Client', class: 'mono' }, x.client_id),
        h('td', { 'data-label': 'Token', class: 'num' }, String(x.fencing_token)),
        h('td', { 'data-label': 'Mode' }, x.mode || view.mode || 'exclusive', x.subtree ? h('span', { class: 'sub' }, 'with the names below it') : null),
        h('td', { 'data-label': 'Granted at' }, clock(x.granted_at)),
        h('td', { 'data-label': 'Held for', class: 'num' }, h('span', { 'data-since': x.granted_at }, since(x.granted_at))),
        h('td', { 'data-label': 'Time left', class: 'num' }, h('span', { 'data-until': x.expires_at }, left(x.expires_at))))));
    const q = view.queue || [];
    fill(queue, q.map((w) => h('li', { 'data-client': w.client_id },
      h('span', { class: 'mono' }, w.client_id),
      w.mode ? ` (${w.mode})` : '',
      ' · waiting ', h('span', { 'data-since': w.enqueued_at }, since(w.enqueued_at)),
      w.wait_deadline ? [' · gives up in ', h('span', { 'data-until': w.wait_deadline }, left(w.wait_deadline))] : '')));
    const total = view.waiters || 0;
    queueNote.textContent = total === 0 ? 'Nobody is waiting.'
      : view.queue === undefined ? `${total} waiting (this server does not show who).`
        : total > q.length ? `…and ${total - q.length} more.` : '';
    revokeBtn.hidden = !(history && hs.length > 0);
  }

  function drawHistory() {
    if (!history) { histSec.hidden = true; revokeBtn.hidden = true; return; }
    const grants = history.grants || [];
    histSec.hidden = false;
    fill(histSec,
      h('h2', { id: 'hist-h' }, 'Grant timeline'),
      h('p', { class: 'note' }, grants.length === 1 ? 'The one grant the cluster remembers.' : `The last ${grants.length} grants the cluster remembers, newest first.`),
      // Newest first; fencing tokens only grow, so they order the grants
      // whatever order an answer lists them in.
      h('ul', { class: 'timeline' }, [...grants].sort((a, b) => b.fencing_token - a.fencing_token).map((g) => {
        const start = parseTime(g.granted_at), end = parseTime(g.ended_at);
        const held = Number.isNaN(end) ? 'still held' : `held ${dur(end - start)}, ended: ${g.end_cause || 'released'}`;
        return h('li', {},
          h('strong', {}, `token ${g.fencing_token}`), ' ', h('span', { class: 'mono' }, g.client_id),
          h('span', { class: 'sub' }, `${clock(g.granted_at)} · ${held}${g.ttl_ms ? ` · ttl ${dur(g.ttl_ms)}` : ''}${g.lock_delay_ms ? ` · lock delay ${dur(g.lock_delay_ms)}` : ''}${g.reason ? ` · reason: ${g.reason}` : ''}`),
          g.value ? h('span', { class: 'sub mono' }, `value: ${g.value}`) : null);
      })));
    if (view) revokeBtn.hidden = holdersOf(view).length === 0;
  }

  function addLive(ev) {
    live.unshift(ev);
    if (live.length > LIVE_LIMIT) live.length = LIVE_LIMIT;
    fill(liveList, live.map((e) => h('li', {},
      h('strong', {}, e.type), ' ', e.client_id ? h('span', { class: 'mono' }, e.client_id) : '',
      e.fencing_token ? ` · token ${e.fencing_token}` : '', e.cause && e.cause !== e.type ? ` · ${e.cause}` : '',
      e.reason ? ` · reason: ${e.reason}` : '',
      h('span', { class: 'sub' }, `${clock(e.at)} · revision ${e.revision}`))));
  }

  revokeBtn.addEventListener('click', () => openRevoke());

  function openRevoke() {
    const hs = holdersOf(view || {});
    if (!hs.length) return;
    const target = hs[0];
    const reason = h('textarea', { id: 'revoke-reason', name: 'reason', rows: 3, required: true, maxlength: 256 });
    const confirm = h('button', { type: 'submit', class: 'danger', id: 'revoke-confirm' }, 'Revoke');
    const cancel = h('button', { type: 'button', id: 'revoke-cancel' }, 'Cancel');
    const out = h('p', { class: 'error', role: 'alert' });
    const dlg = h('dialog', { 'aria-labelledby': 'revoke-h' },
      h('form', {
        onsubmit: async (e) => {
          e.preventDefault();
          if (!reason.value.trim()) { out.textContent = 'Give a reason: it is recorded with the revocation.'; reason.focus(); return; }
          confirm.disabled = true;
          try {
            await api(`/api/v1/locks/${pathName(name)}/revoke`, { method: 'POST', body: { fencing_token: target.fencing_token, reason: reason.value.trim() } });
            dlg.close();
            revokeOut.textContent = `Revoked token ${target.fencing_token}.`;
            refresh();
          } catch (ex) {
            confirm.disabled = false;
            out.textContent = ex.status === 403 ? `Not allowed: ${ex.message}` : ex.status === 404 && ex.code === 'not_found' && /action/.test(ex.message)
              ? 'This server cannot revoke locks yet.' : `Revoke failed: ${ex.message}`;
          }
        },
      },
      h('h2', { id: 'revoke-h' }, 'Revoke this grant?'),
      h('p', {}, 'The holder ', h('strong', { class: 'mono' }, target.client_id), ` (token ${target.fencing_token}) loses `, h('span', { class: 'mono' }, name),
        ' at once and the next in line gets it. The holder may still be working: its writes to fenced resources will be refused.'),
      h('label', { for: 'revoke-reason' }, 'Reason (recorded)', reason),
      out,
      h('div', { class: 'buttons' }, cancel, confirm)));
    cancel.addEventListener('click', () => dlg.close());
    dlg.addEventListener('close', () => { dlg.remove(); revokeBtn.focus(); });
    document.body.append(dlg);
    dlg.showModal();
    reason.focus();
  }

  const tick = setInterval(() => {
    for (const el of root.querySelectorAll('[data-since]')) el.textContent = since(el.dataset.since);
    for (const el of root.querySelectorAll('[data-until]')) el.textContent = left(el.dataset.until);
  }, 1000);

  let retry = null;
  async function start() {
    let v;
    try { v = await load(); } catch { if (alive) retry = setTimeout(start, 2000); return; }
    loadHistory();
    if (!alive) return;
    // The watch prefix is the name itself, so names below it come too;
    // only this lock's own events count.
    watch = new Watch({
      prefix: name,
      from: v.revision + 1,
      onEvent: (ev) => { if (ev.kind === 'lock' && ev.name === name) { addLive(ev); refresh(); } },
      onReset: async () => (await load()).revision,
      onLive: (up) => { if (up) refresh(); },
    });
  }
  start();

  return () => {
    alive = false;
    clearInterval(tick);
    clearTimeout(retry);
    refresh.cancel();
    if (watch) watch.close();
    if (conn.state === 'live') setState('polling');
  };
}
